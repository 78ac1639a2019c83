"""Machinery behind Phase 8 (``fusion.codegen``): where a view's element lives in the tensor it views.

A view moves no data: element ``index`` of ``permute(x)``, ``x[2:]`` or ``x.view(…)`` is some other element of ``x``.
:func:`view_index` rewrites one index (one source expression per dimension) into the index into the view's input.
The lesson passes its own index helpers in (a reshape re-splits the flat position), so this file
never imports ``fusion.codegen``.
"""

from __future__ import annotations

from collections.abc import Callable

import torch
import torch.fx as fx

from fusion.ir.plan import Unsupported
from fusion.kernels.rows import bind_args

aten = torch.ops.aten


def view_index(node: fx.Node, index: list[str], split_index: Callable, offset_expr: Callable, broadcast: Callable):
    """For a view: the index into its input that holds the element at ``index`` of the view (no data moves).

    ``split_index``, ``offset_expr`` and ``broadcast`` are the lesson's (``broadcast_index``)."""
    if node.target is aten.view.dtype:  # the same bytes read as another dtype: not an index change
        raise Unsupported(f"{node.name} reinterprets the bits as {node.args[1]} (view(dtype))", node=node)
    packet, bound = node.target.overloadpacket, bind_args(node)
    src_shape = tuple(node.args[0].meta["val"].shape)
    if packet in (aten.alias, aten.expand):
        return broadcast(index, src_shape)
    if packet is aten.permute:
        out = [""] * len(index)
        for i, d in enumerate(bound["dims"]):
            out[d % len(index)] = index[i]
        return out
    if packet in (aten.t, aten.transpose) and len(index) > 1:
        d0, d1 = (0, 1) if packet is aten.t else (bound["dim0"] % len(index), bound["dim1"] % len(index))
        out = list(index)
        out[d0], out[d1] = index[d1], index[d0]
        return out
    if packet is aten.unsqueeze:
        return [i for d, i in enumerate(index) if d != bound["dim"] % len(index)]
    if packet is aten.t:  # of a 1-D tensor: nothing to swap
        return list(index)
    if packet is aten.slice:  # element i of x[start::step] along dim is element start + step * i of x
        dim = bound["dim"] % len(index)
        size, start = src_shape[dim], bound["start"] or 0
        start = min(max(start + size if start < 0 else start, 0), size)
        out = list(index)
        step, i = bound["step"], index[dim]
        scaled = i if step == 1 else f"{step}*{i}" if i.isidentifier() else f"{step}*({i})"
        out[dim] = str(start) if i == "0" else scaled if start == 0 else f"{start} + {scaled}"
        return out
    if packet is aten.select:
        out = list(index)
        out.insert(bound["dim"] % len(src_shape), str(bound["index"] % src_shape[bound["dim"]]))
        return out
    if packet in (aten.view, aten.reshape, aten._unsafe_view, aten.squeeze):
        # Any reshape of a contiguous order: the flat position in the view, split again over the input's shape.
        strides = torch.empty(tuple(node.meta["val"].shape), device="meta").stride()
        flat = offset_expr(index, strides)
        if flat == "0":
            return ["0"] * len(src_shape)
        return [e for _, e in split_index(f"({flat})" if " " in flat else flat, src_shape)]
    raise Unsupported(f"view {node.target} of a value computed in the kernel", node=node)


def unsplit(index: list[str], stride: tuple[int, ...], split_index: Callable) -> str | None:
    """``F`` when ``index`` is ``split_index(F, shape)`` over a contiguous ``shape`` whose strides are ``stride``:
    then the offset ``sum(index_d * stride_d)`` is ``F`` itself (a mixed-radix number put back together), and the
    ``//`` and ``%`` per element cancel. A reshape of a reshape (a Linear's 2-D output read as 3-D) is the common
    case: ``64*((320*x2 + 64*x1 + x0) // 64) + (320*x2 + 64*x1 + x0) % 64`` is ``320*x2 + 64*x1 + x0``. None otherwise.
    """
    pairs = [(i, s) for i, s in zip(index, stride, strict=True) if i != "0"]
    if len(pairs) < 2 or pairs[-1][1] != 1:
        return None
    inner, _, size = pairs[-1][0].rpartition(" % ")
    if not inner or not size.isdigit():
        return None
    flat = inner  # the innermost index is F % size0: F is what was split
    shape = [1 << 40]  # the outermost size: never written out (the mask bounds it)
    for (_, outer), (_, inner_stride) in zip(pairs, pairs[1:], strict=False):
        if outer % inner_stride or outer // inner_stride < 2:
            return None
        shape.append(outer // inner_stride)
    expected = [e for _, e in split_index(flat, shape)]
    return flat if expected == [i for i, _ in pairs] else None
