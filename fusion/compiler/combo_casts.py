"""Phase 9's pass ``combo_casts``: a graph's independent dtype casts as ONE kernel (a combo kernel: Inductor's combo
kernels, horizontal fusion of unrelated pointwise nodes), for training steps that are CPU-bound.

Under ``torch.autocast`` AOTAutograd's forward graph casts every weight and bias to bfloat16 right before its GEMM
(``convert_element_type(primals_10, bfloat16) -> addmm``), and the backward graph casts every weight's gradient back
to float32 (``mm -> permute -> convert_element_type(float32) -> output``). Phase 6 makes each of them a region of one
op, so each runs as its own call: a BERT training step on an H100 makes ~245 of its ~630 library calls for casts
(scripts/results/h100-2026-11-27-train-profile.*), and the step is CPU-bound. The pass finds two kinds of casts
that no kernel would take anyway and replaces each group of them (same source dtype, same target dtype, same device)
by one node of :data:`COMBO_CAST`, ``fusion::combo_cast(Tensor[] xs, ScalarType dtype) -> Tensor[]``, and a
``getitem`` per cast; the op is neither pointwise nor a reduction, so it stays one library call, whose CUDA
implementation is one generated Triton kernel for the whole list (``fusion.kernels.combo``)::

    convert_element_type(primals_10, bf16) -> addmm      combo_cast([primals_10, primals_9, ...], bf16)
    convert_element_type(primals_9, bf16) -> permute     -> getitem 0 -> addmm, getitem 1 -> permute, ...

* **Early casts** (every graph kind): the cast reads a graph input (a parameter: available when the graph starts),
  and every reader of the cast is a library op (:data:`LIBRARY_OPS`: a GEMM, a convolution, attention), the graph's
  output (a forward saving the bfloat16 weight for the backward), or a view whose readers are such. Then no region
  can take the cast: Phase 6 joins a cast only with fusible neighbours, and a view does not make a region. The
  combo node stands before the graph's first op; every input is a graph input, so nothing waits for it. Not where
  the first cast stood: a cast is fusible, the combo node is not, and Phase 6 cuts the run of consecutive fusible
  ops at it, so a region around that spot would split in two (at the top, and before the output below, it cuts
  nothing). The price: the cast weights live from the graph's start (at most the bfloat16 weights' bytes; in a
  training forward they are mostly saved for the backward anyway).
* **Gradient casts** (:data:`GRADIENTS`; in practice a backward graph's weight gradients): a cast whose only
  reader is the graph's output and whose input is a library op's result (a GEMM's, through views nobody else
  reads). The combo node stands just before the output. Decided so because it delays no other work: a graph
  returns its outputs at once, when it ends (AOTAutograd's backward every gradient), so nothing can read a gradient
  before the last op anyway; the casts only move from where each GEMM finished to the end. Memory: while the
  backward runs, a finished gradient waits as bfloat16 (2 bytes an element) instead of float32 (4); at the end,
  when the combo kernel writes the float32 gradients, every bfloat16 one is still alive: 2 bytes more per gradient
  element than before, at a point where the backward's activations are freed already. ``GRADIENTS = False``
  leaves these casts where they are.

What is refused (stays an aten cast): a cast whose input is not dense (a flat copy would misplace it) or whose
output is laid out unlike its input, a cast of a dynamic shape, non-float dtypes, a group of one cast (nothing to
save), a cast read by a pointwise op, a reduction or indexing (it fuses into their kernel: better than a combo),
and a cast of a tensor the graph writes in place (moved across the write, it would read the other value).
Groups over :data:`MAX_TENSORS` casts are cut into several combo nodes (torch's static launcher takes so many).

CUDA only, as ``split_reductions`` (:data:`ON_CPU`, which the tests set, lets it rewrite CPU graphs): on a CPU the
op's implementation is a loop of aten copies, the same copies as before in one call (Triton's interpreter under
``FUSION_RENDERER=triton``: tests), so there is little to gain. Switch it off with ``options={"combo_casts": False}``.
"""

from __future__ import annotations

import operator
from collections.abc import Callable

import torch
import torch.fx as fx

from fusion.aten.nodes import dtype_cast, is_dense, is_view_node, same_layout
from fusion.compiler.passes import Pass, noted
from fusion.compiler.sibling_casts import SIBLING
from fusion.fxutils.finish import relint
from fusion.kernels import combo
from fusion.kernels.combo import COMBO_CAST, NAME  # noqa: F401  (the op, defined with its kernel; NAME: its name)
from fusion.kernels.cudnn import cudnn_conv_bias_add_relu, cudnn_conv_bias_relu

aten = torch.ops.aten

ON_CPU = False  # the gate: graphs on CUDA devices only; tests set it to rewrite CPU graphs
GRADIENTS = True  # backward graphs: the gradients' casts that are graph outputs too (module docstring)
MIN_GROUP = 2  # fewer casts than this in a group: left as they are
# Casts per combo node at most: 2 pointers each, 116 in all, within the 120 arguments of torch's static launcher
# (MAX_ARGS of torch/csrc/inductor/static_cuda_launcher.cpp as we read it; not checked here, no GPU). Past it the
# kernel still runs, through Triton's JIT call (kernels/combo.py falls back): correct, ~100 us more Python a call.
MAX_TENSORS = 58

# Library calls that read a cast's value as it is (never fused with it): GEMMs, convolutions, attention
LIBRARY_OPS = frozenset(
    getattr(getattr(aten, name), overload)
    for name, overload in (
        ("mm", "default"), ("addmm", "default"), ("bmm", "default"), ("baddbmm", "default"),
        ("convolution", "default"), ("convolution_backward", "default"),
        ("_scaled_dot_product_flash_attention", "default"), ("_scaled_dot_product_efficient_attention", "default"),
        ("_scaled_dot_product_cudnn_attention", "default"), ("_scaled_dot_product_flash_attention_for_cpu", "default"),
        ("_scaled_dot_product_flash_attention_backward", "default"),
        ("_scaled_dot_product_efficient_attention_backward", "default"),
        ("_scaled_dot_product_cudnn_attention_backward", "default"),
        ("_scaled_dot_product_flash_attention_for_cpu_backward", "default"),
    )
    if hasattr(aten, name)
) | {cudnn_conv_bias_relu, cudnn_conv_bias_add_relu}  # fmt: skip  # pass "epilogue"'s convolutions (inference)
# On a GPU a gradient cast's root may also be a bias gradient's sum over the batch: there a lone sum over leading
# dims of a few hundred columns is aten's (too few columns to fill the GPU: ``kernels.rows``), so its cast back to
# float32 would be one more library call. On a CPU the C renderer generates that sum, and the cast joins its kernel.
GRADIENT_ROOTS = LIBRARY_OPS | {aten.sum.dim_IntList}


def cast_of(node: fx.Node) -> tuple[fx.Node, torch.dtype] | None:
    """(input, target dtype) of a cast the combo kernel can do, else None: ``convert_element_type`` or a
    ``_to_copy`` that changes only the dtype, floating to floating, of a dense input, its output laid out as its
    input, static shapes."""
    cast = dtype_cast(node)
    if cast is None or SIBLING in node.meta:  # (moved into a kernel that reads its input anyway)
        return None
    x, dtype = cast
    xv, val = (x.meta.get("val") if isinstance(x, fx.Node) else None), node.meta.get("val")
    if not isinstance(xv, torch.Tensor) or not isinstance(val, torch.Tensor):
        return None
    if xv.dtype not in combo.FLOATS or dtype not in combo.FLOATS or xv.dtype == dtype or val.dtype != dtype:
        return None
    if not all(type(s) is int for s in (*xv.shape, *xv.stride(), *val.stride())) or val.shape != xv.shape:
        return None
    if not is_dense(xv) or not same_layout(val, tuple(xv.stride())) or xv.device != val.device:
        return None
    return x, dtype


def _read_as_is(user: fx.Node) -> bool:
    """Does ``user`` read the value without a kernel that could take a cast: the output, a library op, or a view
    whose every reader does?"""
    if user.op == "output":
        return True
    if user.op != "call_function":
        return False
    if user.target in LIBRARY_OPS:
        return True
    mutable = getattr(getattr(user.target, "_schema", None), "is_mutable", False)
    if is_view_node(user, getitem=False) and not mutable:
        return all(_read_as_is(u) for u in user.users)
    return False


def _library_root(x: fx.Node, ops: frozenset = LIBRARY_OPS) -> fx.Node | None:
    """The library op's result (one of ``ops``) ``x`` is, possibly through views that nothing else reads (so no
    region reaches the cast through them), or None."""
    while x.op == "call_function" and is_view_node(x, getitem=False):
        if len(x.users) != 1 or not isinstance(x.args[0], fx.Node):
            return None
        x = x.args[0]
    op = x
    if x.op == "call_function" and x.target is operator.getitem and isinstance(x.args[0], fx.Node):
        op = x.args[0]
    return x if op.op == "call_function" and op.target in ops else None


def _written(x: fx.Node) -> bool:
    """Does an op of the graph write ``x`` (or a view of it) in place? Pass ``reinplace`` makes BatchNorm's running
    statistics such writes, and a compiled step may update a parameter: a cast moved across the write would read
    the other value."""
    for u in x.users:
        if u.op != "call_function":
            continue
        if getattr(getattr(u.target, "_schema", None), "is_mutable", False):
            return True
        if is_view_node(u, getitem=False) and _written(u):
            return True
    return False


def early(node: fx.Node, x: fx.Node) -> bool:
    """A cast of a graph input nothing writes, whose readers read it as it is (module docstring): its group's node
    stands at the top."""
    if x.op not in ("placeholder", "get_attr") or not node.users or _written(x):
        return False
    return all(_read_as_is(u) for u in node.users)


def gradient(node: fx.Node, x: fx.Node) -> bool:
    """A cast read only by the graph's output, of a library op's result nothing writes: a group just before the
    output."""
    if not node.users or any(u.op != "output" for u in node.users):
        return False
    val = x.meta.get("val")
    cuda = isinstance(val, torch.Tensor) and val.device.type == "cuda"
    root = _library_root(x, GRADIENT_ROOTS if cuda else LIBRARY_OPS)
    return root is not None and not _written(root)


def _replace(graph: fx.Graph, members: list[tuple[fx.Node, fx.Node]], dtype: torch.dtype, at: fx.Node) -> fx.Node:
    """One combo node before ``at`` casting every (cast, input) of ``members``; each cast becomes a getitem of it."""
    with graph.inserting_before(at):
        node = graph.call_function(COMBO_CAST, ([x for _, x in members], dtype))
        node.meta["val"] = [cast.meta["val"] for cast, _ in members]
        items = []
        for i, (cast, _) in enumerate(members):
            item = graph.call_function(operator.getitem, (node, i))
            item.meta = dict(cast.meta)
            items.append(item)
    for (cast, _), item in zip(members, items, strict=True):
        cast.replace_all_uses_with(item)
        graph.erase_node(cast)
    return node


def combo_casts(gm: fx.GraphModule, note: Callable[..., None]) -> int:
    """The pass: every group of early casts (and of gradient casts) with the same source
    dtype, target dtype and device becomes one :data:`COMBO_CAST` node (module docstring). ``note(pass, nodes,
    action, why)`` gets one line per combo node. Returns how many casts were grouped."""
    graph = gm.graph
    groups: dict[tuple, list[tuple[fx.Node, fx.Node]]] = {}
    for node in graph.nodes:
        found = cast_of(node)
        if found is None:
            continue
        x, dtype = found
        xv = x.meta["val"]
        if xv.device.type != "cuda" and not ON_CPU:
            continue
        where = "early" if early(node, x) else "gradient" if GRADIENTS and gradient(node, x) else None
        if where is not None:
            groups.setdefault((where, xv.dtype, dtype, xv.device), []).append((node, x))
    output = next(iter(graph.find_nodes(op="output")))
    count, top = 0, None
    for (where, src, dst, device), members in groups.items():
        if len(members) < MIN_GROUP:
            continue
        for start in range(0, len(members), MAX_TENSORS):
            chunk = members[start : start + MAX_TENSORS]
            # early: the graph's first op, or just after the previous chunk's getitems (a cast it replaced may have
            # been the first op, and is gone); gradients: the output
            if where == "early":
                at = top or next(n for n in graph.nodes if n.op not in ("placeholder", "get_attr"))
            node = _replace(graph, chunk, dst, at if where == "early" else output)
            top = list(node.users)[-1].next if where == "early" else top
            place = "at the top" if where == "early" else "before the output"
            note("combo casts", [f"{len(chunk)} casts"], "one kernel",
                 f"{len(chunk)} {where} casts {src} -> {dst} on {device} in one kernel ({node.name}, {place})")  # fmt: skip
            count += len(chunk)
    if count:
        relint(gm)
    return count


COMBO_CASTS = Pass(
    "combo_casts",
    noted(combo_casts),
    doc="a graph's independent casts (autocast's weight casts, gradients' casts back) as one kernel (CUDA)",
)
