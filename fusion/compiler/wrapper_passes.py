"""The wrapper passes: rewrites of the graph rebuilt around the generated kernels (the Python a compiled call runs).

After :func:`~fusion.compiler.partition.build_compiled_graph` replaced each region by one launch, everything else
in the graph is a library call, a view or a ``prims`` op run eagerly. Each rewrite here makes those calls cheaper
or safe, and each is a :class:`~fusion.compiler.pass_base.Pass` of stage ``"wrapper"`` in :data:`WRAPPER_PASSES`,
switched off by its name (``options={"views_as_strides": False}``):

* ``prims_to_aten`` (:func:`prims_to_aten`) — a ``prims`` op outside kernels as the aten op that does the same;
* ``max_pool_as_aten`` (:func:`max_pools_as_aten`) — Inductor's low-memory max-pool prim as one aten max-pool call;
* ``embedding_grads`` (:mod:`~fusion.compiler.embedding_grads`, opt-in) — an embedding's weight gradient as zeros and
  one ``index_add_``;
* ``traced_layouts`` (:func:`traced_layouts`) — a library output read at its traced strides: through ``as_traced``;
* ``views_as_strides`` (:func:`views_as_strides`) — a view outside the kernels as one ``reinterpret`` of its base;
* ``python_bindings`` (:func:`~fusion.compiler.bindings.python_bindings`) — library calls through torch's bindings.

Each keeps what it changed in ``gm.meta[<name>]`` (the prims and max pools mapped both under ``"prims_to_aten"``).
"""

from __future__ import annotations

import contextlib
import operator

import torch
import torch.fx as fx

from fusion.aten.nodes import (
    LOW_MEMORY_MAX_POOLS,
    as_traced,
    is_dense,
    is_view_node,
    reinterpret,
    same_layout,
    strided_view,
)
from fusion.compiler import memory_plan
from fusion.compiler.bindings import python_bindings
from fusion.compiler.embedding_grads import embedding_grads
from fusion.compiler.pass_base import Pass, run_stage
from fusion.fxutils.finish import relint
from fusion.kernels import triton_runtime as rt

prims = torch.ops.prims
aten = torch.ops.aten


def _iota(length, *, start, step, dtype, device, requires_grad):
    return aten.arange.start_step(start, start + length * step, step, dtype=dtype, device=device)


# prims ops that Inductor's decompositions emit and Inductor lowers itself: run eagerly, each is a Python reference
# implementation (~10-20 µs of CPU per call). Outside a generated kernel they become the aten op that does the same:
# prims.convert_element_type(x, dtype) -> aten._to_copy(x, dtype=dtype) (below), and these.
PRIMS_TO_ATEN = {prims.iota.default: _iota}


def _same_strides_as_input(node: fx.Node) -> bool:
    """aten._to_copy keeps a dense input's strides; the graph was traced with prims' strides: they must agree (but
    for dims of size 1, never stepped along: a GEMM's (K, C) gradient viewed as (K, C, 1, 1) has strides (C, 1, 1, 1)
    where prims traced (C, 1, C, C))."""
    x, out = node.args[0], node.meta.get("val")
    xv = x.meta.get("val") if isinstance(x, fx.Node) else None
    if not isinstance(xv, torch.Tensor) or not isinstance(out, torch.Tensor):
        return False
    return is_dense(xv) and same_layout(xv, tuple(out.stride()))


def _max_pool_values(op, channels_last: bool = False):
    """``max_pool(x, ...) -> (values, None)``. ``channels_last``: aten's CPU max-pool of an image whose channels are
    not innermost takes 3-7 ms for ResNet-18's (1, 64, 112, 112) stem on two threads, the same pool of the image in
    channels-last 0.5 ms: the copy there and the values' copy back cost 1.4 ms together. The values are the same
    (a maximum is a maximum in any order, NaN in a window propagating in both kernels), in the traced layout."""

    def max_pool(x, kernel_size, stride, padding, dilation, ceil_mode):
        return op(x, kernel_size, stride, padding, dilation, ceil_mode)[0], None  # (values, offsets nobody reads)

    def max_pool_nhwc(x, kernel_size, stride, padding, dilation, ceil_mode):
        values = op(x.contiguous(memory_format=torch.channels_last), kernel_size, stride, padding, dilation, ceil_mode)
        # a clone, not .contiguous(): a (n, c, 1, 1) result of the channels-last pool counts as contiguous with its
        # strides (c, 1, c, c), where the graph was traced with (c, 1, 1, 1) (a hypothesis find)
        return values[0].clone(memory_format=torch.contiguous_format), None

    fn = max_pool_nhwc if channels_last else max_pool
    fn.__name__ = f"{op.__name__.split('.')[0]}_values{'_nhwc' if channels_last else ''}"
    return fn


def _slow_layout_on_cpu(x: torch.Tensor) -> bool:
    """A CPU image (N, C, H, W) with several channels stored channels-first: aten's slow max-pool layout."""
    return x.device.type == "cpu" and x.dim() == 4 and x.shape[1] > 1 and x.is_contiguous() and x.numel() > 0


def _max_pool_as_aten(node: fx.Node) -> bool:
    """Inductor's low-memory max-pool prim (values + int8 window offsets) as one aten max-pool call, where no one
    reads the offsets (inference) and aten's result has the strides the graph was traced with; else left as it is."""
    if any(u.target is not operator.getitem or u.args[1] != 0 for u in node.users):
        return False  # the offsets feed the backward: keep the prim
    x, rest = node.args[0], node.args[1:6]
    xv, want = x.meta.get("val"), node.meta.get("val")
    if not isinstance(xv, torch.Tensor) or not isinstance(want, (tuple, list)) or len(node.args[1]) not in (2, 3):
        return False
    op = aten.max_pool2d_with_indices.default if len(node.args[1]) == 2 else aten.max_pool3d_with_indices.default
    from torch._guards import detect_fake_mode

    try:
        with detect_fake_mode([xv]) or contextlib.nullcontext():
            ref = op(xv, *rest)[0]
    except Exception:  # noqa: BLE001 - aten does not take these arguments: keep the prim
        return False
    if ref.shape != want[0].shape or ref.stride() != want[0].stride() or ref.dtype != want[0].dtype:
        return False  # a kernel downstream reads the values at the traced strides: they must be aten's
    node.target = _max_pool_values(op, channels_last=len(node.args[1]) == 2 and _slow_layout_on_cpu(xv))
    return True


def prims_to_aten(gm: fx.GraphModule) -> list[str]:
    """Replace every ``prims`` call of ``gm`` (outside generated kernels: they are launcher calls by now) by its aten
    op. Returns the nodes changed; a prims op without an entry in :data:`PRIMS_TO_ATEN` is left as it is (the max
    pools: :func:`max_pools_as_aten`)."""
    changed = []
    for node in list(gm.graph.nodes):
        target = node.target
        if node.op != "call_function" or not isinstance(target, torch._ops.OpOverload) or target.namespace != "prims":
            continue
        if target is prims.convert_element_type.default and _same_strides_as_input(node):
            x, dtype = node.args
            node.target, node.args, node.kwargs = aten._to_copy.default, (x,), {"dtype": dtype}
        elif target in PRIMS_TO_ATEN:
            node.target = PRIMS_TO_ATEN[target]
        else:
            continue
        changed.append(f"{node.name}: {target}")
    if changed:
        relint(gm)
    return changed


def max_pools_as_aten(gm: fx.GraphModule) -> list[str]:
    """Every low-memory max-pool prim of ``gm`` outside kernels that :func:`_max_pool_as_aten` can replace, as one
    aten max-pool call. Returns the nodes changed."""
    changed = []
    for node in list(gm.graph.nodes):
        target = node.target
        if node.op != "call_function" or not isinstance(target, torch._ops.OpOverload) or target.namespace != "prims":
            continue
        if target._schema.name in LOW_MEMORY_MAX_POOLS and _max_pool_as_aten(node):
            changed.append(f"{node.name}: {target}")
    if changed:
        relint(gm)
    return changed


# Library ops whose ATen kernels always return a new contiguous tensor (cuBLAS and the CPU BLAS path alike allocate
# the result row-major), so their output needs no layout check: ~1 µs of CPU a call each (GPT-2: 48 a call).
FRESH_CONTIGUOUS = frozenset({aten.mm.default, aten.addmm.default, aten.bmm.default, aten.baddbmm.default})


def _fresh_contiguous(node: fx.Node) -> bool:
    """A :data:`FRESH_CONTIGUOUS` op traced contiguous: its output holds the traced strides with no check."""
    val = node.meta.get("val")
    return node.target in FRESH_CONTIGUOUS and isinstance(val, torch.Tensor) and val.is_contiguous()


def _library_value(node: fx.Node) -> bool:
    """A tensor a library call computed (its output, or one item of its tuple): its strides are ATen's choice."""
    if node.op != "call_function" or isinstance(node.target, rt.Launcher) or is_view_node(node, getitem=False):
        return False
    if node.target in (reinterpret, as_traced):
        return False
    if node.target is operator.getitem:  # an item of a library call's tuple (not of a split: a view, see below)
        src = node.args[0]
        return (isinstance(src, fx.Node) and src.op == "call_function" and not isinstance(src.target, rt.Launcher)
                and not is_view_node(src, getitem=False))  # fmt: skip
    return True


def traced_layouts(gm: fx.GraphModule) -> int:
    """Every library output that a generated kernel or a view reads, or that the graph returns (a forward graph's
    saved tensors are the backward graph's inputs), goes through :func:`as_traced`: all of them trust the traced
    strides, and ATen's kernels need not keep them. (Seen: the BatchNorm family on CPU returns a contiguous output
    for a transposed input, where its meta function keeps the input's strides: ``bn(x.transpose(1, 2))`` in
    training gave values off by 3.7 through a view's strides.) Returns how many."""
    count = 0
    for node in list(gm.graph.nodes):
        val = node.meta.get("val")
        if not _library_value(node) or not isinstance(val, torch.Tensor):
            continue
        try:
            stride = tuple(int(s) for s in val.stride())
        except (TypeError, RuntimeError):
            continue
        if _fresh_contiguous(node):  # ATen allocates it so: nothing to check
            continue
        # a kernel or a view here, or the output: a saved tensor the backward graph's kernels read at these strides
        readers = [u for u in node.users
                   if u.op == "output" or isinstance(u.target, rt.Launcher) or is_view_node(u, getitem=False)]  # fmt: skip
        if not readers:
            continue
        with gm.graph.inserting_after(node):
            fixed = gm.graph.call_function(as_traced, (node, stride))
        fixed.meta = dict(node.meta)
        for u in readers:
            u.replace_input_with(node, fixed)
        count += 1
    if count:
        relint(gm)
    return count


def _traced_layout(node: fx.Node) -> bool:
    """Does ``node`` hold its traced strides at run time? A graph input (checked at the entry, or guarded by Dynamo),
    a generated kernel's output (allocated at the traced strides), what :func:`as_traced` returns, or a GEMM's output
    traced contiguous (:func:`_fresh_contiguous`). Another library call's own output need not (see
    :func:`traced_layouts`)."""
    if node.op == "placeholder" or node.target is as_traced or _fresh_contiguous(node):
        return True
    if node.op == "call_function" and node.target is operator.getitem and isinstance(node.args[0], fx.Node):
        return isinstance(node.args[0].target, rt.Launcher)
    return False


def views_as_strides(gm: fx.GraphModule) -> int:
    """Every view op outside the kernels (a weight's ``t`` before a matmul, a ``view`` between two library calls)
    becomes one ``reinterpret`` of its base at the traced size, stride and offset, as Inductor's wrapper does: one
    C++ call instead of a view op's dispatch. A chain of views is one call: each reinterprets the chain's root, and
    the links nothing else reads are dropped (MultiheadAttention's q: view, permute, view; three calls, now one).
    An item of a ``split``/``unbind`` is a view of what the split reads (GPT-2's q, k, v: one ``split`` and three
    ``getitem`` calls, now three ``reinterpret``). Returns how many views became strides; a view that is not plain
    strides is left alone."""
    count = 0
    for node in list(gm.graph.nodes):
        if node.op != "call_function" or not is_view_node(node) or not node.args:
            continue
        base = node.args[0]
        if node.target is operator.getitem:  # an item of split/unbind/chunk: a view of what the split reads
            if not (isinstance(base, fx.Node) and base.op == "call_function" and is_view_node(base, getitem=False)):
                continue
            base = base.args[0]
        while isinstance(base, fx.Node) and base.target is reinterpret:  # earlier in graph order: already strides
            base = base.args[0]
        view = strided_view(node, base) if isinstance(base, fx.Node) and _traced_layout(base) else None
        if view is None:
            continue
        node.target, node.args, node.kwargs = reinterpret, (base, *view), {}
        count += 1
    for node in reversed(gm.graph.nodes):  # a link of a chain (a split whose items are strides), read by nothing now
        mutable = getattr(getattr(node.target, "_schema", None), "is_mutable", False)
        pure = node.target is reinterpret or (is_view_node(node, getitem=False) and not mutable)
        if node.op == "call_function" and not node.users and pure:  # an in-place view (transpose_) changes its input
            gm.graph.erase_node(node)
    if count:
        relint(gm)
    return count


def _kept(key: str, rewrite):
    """``rewrite(gm)`` as a wrapper pass's ``run(gm, part)``: what it changed goes to ``gm.meta[key]`` (a list of
    changes adds to the list there, a count replaces it)."""

    def run(gm: fx.GraphModule, part: object = None) -> None:
        out = rewrite(gm)
        if isinstance(out, list):
            gm.meta.setdefault(key, []).extend(out)
        else:
            gm.meta[key] = out

    run.__name__ = run.__qualname__ = rewrite.__name__
    return run


# In run order: prims and max pools become aten ops first, so traced_layouts sees them as the library calls they are
WRAPPER_PASSES = [
    Pass("prims_to_aten", _kept("prims_to_aten", prims_to_aten), stage="wrapper",
         doc="a prims op outside kernels (a Python reference, ~10-20 us of CPU) as its aten op"),
    Pass("max_pool_as_aten", _kept("prims_to_aten", max_pools_as_aten), stage="wrapper",
         doc="Inductor's low-memory max-pool prim (inference) as one aten max-pool call"),
    Pass("embedding_grads", _kept("embedding_grads", embedding_grads), stage="wrapper", default=False,
         doc="an embedding's weight gradient as zeros and one index_add_ (CUDA; ~3 launches, not ATen's ~15)"),
    Pass("traced_layouts", _kept("traced_layouts", traced_layouts), stage="wrapper",
         doc="a library output a kernel, a view or the caller reads: as_traced holds its traced strides"),
    Pass("views_as_strides", _kept("views_as_strides", views_as_strides), stage="wrapper",
         doc="a view outside the kernels (or a chain of them) as one reinterpret of its base"),
    Pass("python_bindings", _kept("python_bindings", python_bindings), stage="wrapper",
         doc="library calls through torch's Python bindings (torch.convolution): less CPU a call"),
    Pass("reuse_buffers", _kept("reuse_buffers", memory_plan.reuse_buffers), stage="wrapper",
         doc="a kernel's output over its dying input (a lower peak), or on a CPU in a dead buffer of its size (no page faults)"),
]  # fmt: skip

PRIMS_PASSES = ("prims_to_aten", "max_pool_as_aten")  # the wrapper passes that map prims ops to aten ops


def map_prims(gm: fx.GraphModule) -> list[str]:
    """For a graph that runs without generated kernels (``options={"codegen": False}``, a whole-graph fallback): the
    :data:`PRIMS_PASSES` that are on, in place. Returns the nodes changed."""
    gm.meta["prims_to_aten"] = []
    run_stage([p for p in WRAPPER_PASSES if p.name in PRIMS_PASSES], gm)
    return gm.meta.pop("prims_to_aten")
