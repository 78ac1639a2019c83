"""New nodes with their fake values: what a pass that adds aten nodes needs so the stages after it (regions, code
generation) read shapes, strides and dtypes off every node as they do off AOTAutograd's."""

from __future__ import annotations

import torch
import torch.fx as fx


def tensor_val(node: object) -> torch.Tensor | None:
    """``node.meta["val"]`` where ``node`` is a node whose value is a tensor, else None."""
    val = node.meta.get("val") if isinstance(node, fx.Node) else None
    return val if isinstance(val, torch.Tensor) else None


def call_with_meta(graph: fx.Graph, target, args: tuple, kwargs: dict | None = None) -> fx.Node:
    """A new call node whose ``meta["val"]`` is ``target`` run on its arguments' fake values."""
    node = graph.call_function(target, args, kwargs or {})
    refresh_meta(node)
    return node


def refresh_meta(node: fx.Node) -> None:
    """Set ``node.meta["val"]``: its target run on its arguments' fake values (shape, strides, dtype), as after one
    of its inputs was replaced by a tensor of another layout or storage."""
    vals = fx.node.map_arg(node.args, lambda x: x.meta["val"])
    node.meta["val"] = node.target(*vals, **node.kwargs)
