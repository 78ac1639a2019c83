"""Small facts about aten graph nodes that the lesson and its machinery share: views, regions, names."""

from __future__ import annotations

import operator
from typing import TypeVar

import torch
import torch.fx as fx

R = TypeVar("R")

# Inductor's low-memory max-pool prims (values, int8 window offsets): torch 2.11+ names, then older ones.
LOW_MEMORY_MAX_POOLS = frozenset(
    {"prims::_low_memory_max_pool_with_offsets", "prims::_low_memory_max_pool2d_with_offsets"}
)

# A depthwise convolution renamed by Phase 9's pass ``depthwise`` (``fusion.compiler.depthwise``): a window sum with
# weights, which Phase 6 counts among the pooling ops and the code generator computes inside a kernel.
DEPTHWISE_CONV = "fusion::depthwise_conv2d"

_VIEW_OPS: dict[object, bool] = {}  # OpOverload -> is it a view? (asked once per op)


class MissingMetaError(ValueError):
    """A node has no ``meta["val"]``: bytes cannot be counted. Capture the graph with ``capture_aten``."""


# Torch-level views (Phases 2-5 trace with torch.fx's symbolic tracer: functions, methods, modules, not aten ops).
_VIEW_FUNCTIONS = {torch.flatten, torch.reshape, torch.squeeze, torch.unsqueeze, torch.t, torch.transpose}
_VIEW_FUNCTIONS |= {torch.permute, operator.getitem, getattr, torch.narrow, torch.split, torch.chunk, torch.select}
_VIEW_FUNCTIONS |= {torch.tensor_split, torch.unbind, torch.split_with_sizes}
_VIEW_METHODS = {"view", "reshape", "flatten", "squeeze", "unsqueeze", "t", "transpose", "permute", "expand", "size"}
_VIEW_METHODS |= {"narrow", "split", "chunk", "select", "unbind", "tensor_split", "view_as", "expand_as"}
_VIEW_MODULES = (torch.nn.Flatten, torch.nn.Identity, torch.nn.Unflatten)


def is_view_node(node: fx.Node, gm: fx.GraphModule | None = None, *, getitem: bool = True) -> bool:
    """THE view predicate of the course: a node that only reinterprets a tensor (no kernel, no bytes moved).

    aten graphs: an aten/prims view op, and the projection ``getitem`` of a tuple result unless ``getitem=False``
    (the code generator asks that way: a getitem of ``var_mean`` is a computed value it stores). Torch-level graphs
    (pass ``gm`` to look modules up): torch view functions, view methods, ``nn.Flatten``/``Identity``/``Unflatten``.
    """
    if node.op == "call_method":
        return node.target in _VIEW_METHODS
    if node.op == "call_module":
        return gm is not None and isinstance(gm.get_submodule(node.target), _VIEW_MODULES)
    if node.op != "call_function":
        return False
    target = node.target
    if target is operator.getitem:
        return getitem
    if target is reinterpret:  # a compiled graph's view, already as strides
        return True
    view = _VIEW_OPS.get(target)
    if view is None:
        if isinstance(target, torch._ops.OpOverload):
            view = target.is_view and target.namespace in ("aten", "prims")
        else:
            view = target in _VIEW_FUNCTIONS
        _VIEW_OPS[target] = view
    return view


def unique_regions(region_of: dict[fx.Node, R]) -> list[R]:
    """The distinct regions of a ``build_fusion_regions`` result, in graph order."""
    return list({id(r): r for r in region_of.values()}.values())


def short_target(node: fx.Node) -> str:
    """``add.Tensor`` for aten ops, ``prims.<op>`` for prims, the function name otherwise."""
    t = node.target
    if isinstance(t, torch._ops.OpOverload):
        return str(t).removeprefix("aten.")
    return getattr(t, "__name__", str(t))


def kernel_counts(gm: fx.GraphModule, region_of: dict) -> tuple[int, int]:
    """(kernels unfused, kernels fused): one per non-view op, vs one per region plus every op left outside."""
    ops = [n for n in gm.graph.nodes if n.op == "call_function" and not is_view_node(n)]
    outside = sum(1 for n in ops if n not in region_of)
    return len(ops), outside + len(unique_regions(region_of))


def view_root(node: fx.Node) -> fx.Node:
    """The tensor a chain of views reads: ``x`` for ``x.t().view(...)[0]`` (a getitem of ``split``/``unbind`` too)."""
    while node.op == "call_function" and is_view_node(node) and node.args and isinstance(node.args[0], fx.Node):
        node = node.args[0]
    return node


def dtype_cast(node: fx.Node) -> tuple[object, torch.dtype] | None:
    """(input, dtype) of a node that casts and does nothing else: ``prims.convert_element_type(x, dtype)`` or
    ``aten._to_copy(x, dtype=dtype)`` (no layout, device or memory format of its own); else None."""
    if node.op != "call_function":
        return None
    if node.target is torch.ops.prims.convert_element_type.default and len(node.args) == 2 and not node.kwargs:
        return node.args[0], node.args[1]
    if node.target is torch.ops.aten._to_copy.default and len(node.args) == 1 and set(node.kwargs) == {"dtype"}:
        return node.args[0], node.kwargs["dtype"]
    return None


def strided_view(node: fx.Node, base: fx.Node) -> tuple[tuple[int, ...], tuple[int, ...], int] | None:
    """``node``, a view of ``base``, as (size, stride, storage-offset step from base): at run time one
    ``as_strided`` of the base rebuilds it (Inductor's ``reinterpret_tensor``), not the chain of view ops, each a
    dispatch of a few µs. Holds wherever the base has the strides it was traced with, as every tensor inside a
    compiled graph does. None where it cannot: no tensor meta, another dtype (``view.dtype``), symbolic sizes."""
    val, root = node.meta.get("val"), base.meta.get("val")
    if not (isinstance(val, torch.Tensor) and isinstance(root, torch.Tensor)) or val.dtype != root.dtype:
        return None
    try:
        size, stride = tuple(int(s) for s in val.shape), tuple(int(s) for s in val.stride())
        step = int(val.storage_offset()) - int(root.storage_offset())
    except (TypeError, RuntimeError):  # a SymInt that is not a constant
        return None
    return size, stride, step


def reinterpret(base: torch.Tensor, size: tuple, stride: tuple, step: int) -> torch.Tensor:
    """``base`` seen through (size, stride) from ``step`` elements past its own start: the view, in one C++ call."""
    return _reinterpret(base, size, stride, step)


def _as_strided(base: torch.Tensor, size: tuple, stride: tuple, step: int) -> torch.Tensor:
    return base.as_strided(size, stride, base.storage_offset() + step)


try:  # Inductor's own (no autograd bookkeeping); torch.as_strided where this torch has none
    _reinterpret = torch._C._dynamo.guards._reinterpret_tensor
except AttributeError:  # pragma: no cover - older/newer torch
    _reinterpret = _as_strided


def is_dense(t: torch.Tensor) -> bool:
    """Non-overlapping and dense: some order of the dims is contiguous (size-1 dims may have any stride), so its
    ``numel`` elements fill consecutive slots from ``data_ptr()`` on."""
    return dense_strides(t.shape, t.stride())


def dense_strides(sizes, strides) -> bool:
    """:func:`is_dense` of sizes and strides: in stride order, each dimension's stride is the product of the sizes
    before it (dimensions of size 1 aside)."""
    expected = 1
    for stride, size in sorted((st, s) for s, st in zip(sizes, strides, strict=True) if s != 1):
        if stride != expected:
            return False
        expected *= size
    return True


def same_layout(t: torch.Tensor, stride: tuple[int, ...]) -> bool:
    """Strides differ only where they do not matter: a dimension of size 1 is never stepped along (its index is 0)."""
    return all(size == 1 or a == b for size, a, b in zip(t.shape, t.stride(), stride, strict=True))


def as_traced(t: torch.Tensor, stride: tuple[int, ...]) -> torch.Tensor:
    """A library call's output in the layout the graph was traced with (a copy only where ATen's kernel chose
    another layout than its meta function: one stride comparison per call otherwise)."""
    if t.stride() == stride or same_layout(t, stride):
        return t
    return torch.empty_strided(t.shape, stride, dtype=t.dtype, device=t.device).copy_(t)


def bind_args(node: fx.Node) -> dict:
    """The node's arguments by schema name, defaults filled in: {'self': x, 'other': 2.0, 'alpha': 1}."""
    schema = node.target._schema
    bound = {a.name: a.default_value for a in schema.arguments if a.has_default_value()}
    bound.update({a.name: v for a, v in zip(schema.arguments, node.args, strict=False)})
    bound.update(node.kwargs)
    return bound


def reduced_dims(r: fx.Node) -> tuple[tuple[int, ...], list[int]]:
    """(the shape reduction ``r`` reduces, its reduced dims, sorted): ``dim`` a list, an int (``any.dim``) or None
    (all). Reductions with the same answer walk the same rows and can share a kernel."""
    shape = tuple(r.args[0].meta["val"].shape)
    dims = bind_args(r).get("dim")
    dims = [dims] if isinstance(dims, int) else dims or range(len(shape))
    return shape, sorted({d % len(shape) for d in dims}) if shape else []
