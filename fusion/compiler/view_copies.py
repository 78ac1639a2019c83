"""Copies at computed indices as ops both writers take (issue 39: the attention families' fallbacks).

Shifted-window, grid and block attention move data more than they compute: a zero padding before each window
partition, ``split`` for q/k/v, average pools (``torch.roll``, for the shifted windows, is decomposed into two
slices and a cat: ``fusion/aten/roll.py``; q/k/v's stacked gradients are pass ``stack_scatters``'s). AOTAutograd
hands each to the code generator as an op Phase 6's rule keeps out of every region (``constant_pad_nd``) or one the
writers have no expression for (a split's getitem, ``avg_pool2d``),
so each runs as its own aten call where Inductor lowers it as index arithmetic inside the kernel around it. These
passes rewrite them into ops the kernel IR's lowering already takes — views, ``cat`` and
pointwise ops — exactly, and only where the graph's layouts stay what they were traced as:

- ``zero_pads``: ``constant_pad_nd`` with every pad 0 (Swin's windows divide its feature maps) is its input;
- ``splits``: each getitem of ``split`` / ``split_with_sizes`` is one ``slice``, of ``unbind`` one ``select``;
- ``avg_pools`` (inference): ``avg_pool2d`` is a depthwise window sum of weight ``1 / taps`` (pass ``depthwise``'s
  op, which the generator computes inside the kernel around it);
- ``broadcast_fulls``: ``full(size, v)`` is one element expanded to ``size`` (:func:`fulls_as_broadcasts`).
"""

from __future__ import annotations

import operator
from collections.abc import Callable

import torch
import torch.fx as fx

from fusion.aten.nodes import is_view_node
from fusion.compiler import passes
from fusion.compiler.graph_passes import _escaping, _same_tensor_meta, _written
from fusion.fxutils.finish import relint
from fusion.fxutils.meta import call_with_meta, refresh_meta, tensor_val

aten = torch.ops.aten
PAD = aten.constant_pad_nd.default
SPLITS = (aten.split.Tensor, aten.split_with_sizes.default)
UNBIND = aten.unbind.int


def _real():
    """Real tensors inside this block, outside the fake mode a compile may hold (a constant is computed for real)."""
    from torch.utils._python_dispatch import _disable_current_modes

    return _disable_current_modes()


def drop_zero_pads(gm: fx.GraphModule, note: Callable[..., None]) -> int:
    """Pass ``zero_pads``: ``constant_pad_nd(x, [0, ...])`` is ``x`` where ``x`` (an op's value or an input) has the
    same shape, dtype, strides and offset and neither is written in place (the pad's readers only read), and the pad
    is not returned unless ``x`` is a fresh value returned by nothing else (the caller owns each output); elsewhere,
    with a contiguous result, it is ``clone(x)``: a copy, as the pad was, but pointwise, so it fuses with the ops
    around it. Returns how many rewritten."""
    escaping, written = _escaping(gm.graph), _written(gm.graph)
    dropped, copied = [], []
    for node in list(gm.graph.find_nodes(op="call_function", target=PAD)):
        x, pads = node.args[0], node.args[1]
        if (
            not (isinstance(x, fx.Node) and all(p == 0 for p in pads))
            or tensor_val(x) is None
            or tensor_val(node) is None
        ):
            continue
        if node in written or x in written or x.op not in ("call_function", "placeholder"):
            continue
        fresh = x.op == "call_function" and not is_view_node(x) and x not in escaping
        if _same_tensor_meta(tensor_val(x), tensor_val(node)) and (node not in escaping or fresh):
            node.replace_all_uses_with(x)
            gm.graph.erase_node(node)
            dropped.append(node.name)
        elif tensor_val(node).is_contiguous():
            with gm.graph.inserting_before(node):
                copy = call_with_meta(gm.graph, aten.clone.default, (x,), {"memory_format": torch.contiguous_format})
            if not _same_tensor_meta(tensor_val(copy), tensor_val(node)):
                gm.graph.erase_node(copy)
                continue
            node.replace_all_uses_with(copy)
            gm.graph.erase_node(node)
            copied.append(node.name)
    if dropped or copied:
        relint(gm)
    if dropped:
        note("zero pads", dropped, "dropped", "a padding of 0 everywhere is its input (the same layout)")
    if copied:
        note("zero pads", copied, "clone", "a padding of 0 everywhere is a copy: pointwise, it fuses")
    return len(dropped) + len(copied)


def _pieces_as_views(gm: fx.GraphModule, node: fx.Node, view: Callable[[int], tuple]) -> bool:
    """Replace each ``getitem(node, i)`` by the view ``view(i)`` = (target, args) gives where its value is the same
    (sizes, strides, offset); True when ``node`` has no reader left (it is erased)."""
    for u in list(node.users):
        with gm.graph.inserting_before(u):
            new = call_with_meta(gm.graph, *view(u.args[1]))
        if not _same_tensor_meta(tensor_val(new), tensor_val(u)):
            gm.graph.erase_node(new)
            continue
        u.replace_all_uses_with(new)
        gm.graph.erase_node(u)
    if node.users:
        return False
    gm.graph.erase_node(node)
    return True


def splits_as_slices(gm: fx.GraphModule, note: Callable[..., None]) -> int:
    """Pass ``splits``: every getitem of a ``split`` / ``split_with_sizes`` becomes ``slice(x, dim, start, end)``,
    and of an ``unbind`` ``select(x, dim, i)``: the same view (same sizes, strides and offset), which the writers
    read as a load at an offset. Returns how many multi-output views went."""
    done = []
    for node in [n for t in (*SPLITS, UNBIND) for n in gm.graph.find_nodes(op="call_function", target=t)]:
        x, vals = node.args[0], node.meta.get("val")
        at = 2 if node.target in SPLITS else 1
        dim = node.args[at] if len(node.args) > at else node.kwargs.get("dim", 0)
        if not isinstance(vals, (list, tuple)) or any(u.target is not operator.getitem for u in node.users):
            continue
        dim = dim % tensor_val(x).dim()
        if node.target is UNBIND:
            view = lambda i, x=x, dim=dim: (aten.select.int, (x, dim, i))  # noqa: E731
        else:
            starts = [0]
            for v in vals:
                starts.append(starts[-1] + v.shape[dim])
            view = lambda i, x=x, dim=dim, st=starts: (aten.slice.Tensor, (x, dim, st[i], st[i + 1]))  # noqa: E731
        if _pieces_as_views(gm, node, view):
            done.append(node.name)
    if done:
        relint(gm)
        note("splits", done, "views", "each piece of a split (an unbind) is a slice (a select): a view at an offset")
    return len(done)


def _constant(gm: fx.GraphModule, made: dict, top: fx.Node, name: str, value: torch.Tensor, fake) -> fx.Node:
    """A get_attr of ``value`` at the top of the graph (a constant between two fusible ops would cut their run in
    two, as ``hoist_constants`` says), one per distinct value."""
    with _real():
        key = (tuple(value.shape), value.dtype, str(value.device), tuple(value.flatten().tolist()))
    if key not in made:
        gm.register_buffer(name, value)
        with gm.graph.inserting_before(top):
            made[key] = gm.graph.get_attr(name)
        made[key].meta["val"] = fake.from_tensor(value, static_shapes=True)
    return made[key]


def avg_pools_as_window_sums(gm: fx.GraphModule, note: Callable[..., None]) -> int:
    """Pass ``avg_pools``: ``avg_pool2d(x, k, s, p)`` counting the padding (PyTorch's default; MaxViT's downsampling
    branch) is a depthwise window sum with the constant weight ``1 / (kh * kw)`` (``fusion.compiler.depthwise``:
    the generator computes it inside the kernel around it, or runs it as ``torch.convolution``). Not renamed: ceil
    mode, a divisor override, padding not counted, a window over ``depthwise.MAX_TAPS`` taps, integers."""
    from fusion.aten.nodes import bind_args
    from fusion.compiler.depthwise import DEPTHWISE, MAX_TAPS

    done, made = [], {}
    top = next(n for n in gm.graph.nodes if n.op != "placeholder")
    for node in list(gm.graph.find_nodes(op="call_function", target=aten.avg_pool2d.default)):
        x, out = node.args[0], tensor_val(node)
        a = bind_args(node)
        kernel, stride, padding = (list(a.get(k) or []) for k in ("kernel_size", "stride", "padding"))
        ceil, counted, divisor = a.get("ceil_mode", False), a.get("count_include_pad", True), a.get("divisor_override")
        kernel = kernel * (2 // len(kernel))
        stride = (stride or kernel) * (2 // len(stride or kernel))
        padding = (padding or [0]) * (2 // len(padding or [0]))
        if ceil or divisor is not None or not (counted or not any(padding)) or out is None or out.dim() != 4:
            continue
        if kernel[0] * kernel[1] > MAX_TAPS or not out.dtype.is_floating_point or "fake_mode" not in dir(out):
            continue
        c = out.shape[1]
        with _real():
            weight = torch.full((c, 1, *kernel), 1.0 / (kernel[0] * kernel[1]), dtype=out.dtype, device=out.device)
        w = _constant(gm, made, top, f"_window_{node.name}", weight, out.fake_mode)
        with gm.graph.inserting_before(node):
            new = call_with_meta(gm.graph, DEPTHWISE, (x, w, stride, padding, [1, 1]))
        if not _same_tensor_meta(tensor_val(new), out):
            gm.graph.erase_node(new)
            continue
        node.replace_all_uses_with(new)
        gm.graph.erase_node(node)
        done.append(node.name)
    for w in made.values():
        if not w.users:
            gm.graph.erase_node(w)
            delattr(gm, w.target)
    if done:
        relint(gm)
        note("avg pools", done, "window sum", "an average over a window: a depthwise sum the generated kernel takes")
    return len(done)


FULL_MIN = 1024  # elements: a smaller constant fill costs less than the view's bookkeeping


def fulls_as_broadcasts(gm: fx.GraphModule, note: Callable[..., None]) -> list[str]:
    """Pass ``broadcast_fulls``: ``full(size, v)`` as one element expanded to ``size`` (a view: every element is
    ``v``), so a kernel reads one value where it read ``size`` of them, and no call allocates them. SDPA's math path
    gives T5's encoder a zero float32 ``full`` of (batch, heads, q, k), 96 MB at its suite size, alive for the whole
    graph and read by each layer's softmax. Not where the graph returns the tensor or writes into it (itself or
    through a view): those keep their own memory. Returns the nodes changed."""
    kept = _escaping(gm.graph) | _written(gm.graph)
    changed = []
    for node in list(gm.graph.find_nodes(op="call_function", target=aten.full.default)):
        val = node.meta.get("val")
        if not isinstance(val, torch.Tensor) or val.dim() == 0 or val.numel() < FULL_MIN or node in kept:
            continue
        if _reads_storage(node):
            continue
        ones = [1] * val.dim()
        with gm.graph.inserting_before(node):
            one = gm.graph.call_function(aten.full.default, (ones, node.args[1]), dict(node.kwargs))
            one.meta["val"] = val.as_strided(ones, ones)  # shape, strides, dtype and device of a one-element fill
            wide = gm.graph.call_function(aten.expand.default, (one, list(val.shape)))
            wide.meta["val"] = one.meta["val"].expand(val.shape)
        node.replace_all_uses_with(wide)
        if not _restride_views(wide):  # a view that cannot read the expanded element: the fill stays
            wide.replace_all_uses_with(node)
            _restride_views(node)
            gm.graph.erase_node(wide)
            gm.graph.erase_node(one)
            continue
        gm.graph.erase_node(node)
        changed.append(node.name)
    if changed:
        relint(gm)
        note("broadcast_fulls", changed, "expanded", "a constant fill read as one element broadcast: no memory")
    return changed


def _views_of(node: fx.Node) -> list[fx.Node]:
    """Every view reading ``node``, directly or through other views, in graph order."""
    views, stack = [], list(node.users)
    while stack:
        u = stack.pop()
        if u.op == "call_function" and is_view_node(u) and u not in views:
            views.append(u)
            stack += list(u.users)
    order = {n: i for i, n in enumerate(node.graph.nodes)}
    return sorted(views, key=order.__getitem__)


def _restride_views(node: fx.Node) -> bool:
    """Recompute the fake value of every view of ``node`` (``refresh_meta``, in graph order): their strides follow
    their input's (a slice of the expanded fill has strides 0, not the full tensor's; code outside the kernels
    reinterprets a view's base by those strides, Swin-T's shifted-window mask in its training step read a
    one-element fill at strides (56, 1)). False where one of them cannot be computed on the new input."""
    try:
        for u in _views_of(node):
            refresh_meta(u)
    except Exception:  # noqa: BLE001 - a view the expanded element does not allow
        return False
    return True


# Views that need their input's own memory laid out as traced: on an expanded element they fail or read other bytes
STORAGE_VIEWS = frozenset({aten.as_strided.default, aten.view.default, aten._unsafe_view.default})


def _reads_storage(node: fx.Node) -> bool:
    """Does a view of ``node`` (directly or through other views) reinterpret its memory (``as_strided``; a ``view``
    that needs it contiguous)? ConvNeXt's training graph reads a zero ``full`` through ``as_strided``: over one
    element expanded that is out of the storage's bounds."""
    return any(u.target in STORAGE_VIEWS for u in _views_of(node))


# Before pass "constants": folded, the fill is then one element held, not size of them
BROADCAST_FULLS = passes.Pass(
    "broadcast_fulls",
    passes.noted(fulls_as_broadcasts),
    doc="full(size, v) as one element expanded to size (T5's zero mask in math attention)",
)

VIEW_COPY_PASSES = [
    passes.Pass("zero_pads", passes.noted(drop_zero_pads), doc="a constant_pad_nd of zeros only: its input"),
    passes.Pass("splits", passes.noted(splits_as_slices), doc="a split's pieces: slices the writers load"),
    passes.Pass("avg_pools", passes.noted(avg_pools_as_window_sums), kinds=("inference",), requires=("codegen",),
                doc="an avg_pool2d counting its padding: a depthwise window sum in the generated kernel"),
]  # fmt: skip
