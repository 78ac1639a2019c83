"""Small facts about aten graph nodes that the lesson and its machinery share: views, regions, names."""

from __future__ import annotations

import operator
from typing import TypeVar

import torch
import torch.fx as fx

R = TypeVar("R")

_VIEW_OPS: dict[object, bool] = {}  # OpOverload -> is it a view? (asked once per op)


class MissingMetaError(ValueError):
    """A node has no ``meta["val"]``: bytes cannot be counted. Capture the graph with ``capture_aten``."""


def is_view_node(node: fx.Node) -> bool:
    """A view (or the projection ``getitem`` of a tuple result): metadata only, no kernel, no bytes moved."""
    if node.op != "call_function":
        return False
    target = node.target
    view = _VIEW_OPS.get(target)
    if view is None:
        if target is operator.getitem:
            view = True
        else:
            view = (
                isinstance(target, torch._ops.OpOverload) and target.is_view and target.namespace in ("aten", "prims")
            )
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
