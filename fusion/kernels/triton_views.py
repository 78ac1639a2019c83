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
from fusion.kernels.rows import bind_args, row_permutation

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
        if tuple(node.meta["val"].shape) == src_shape:  # view(-1, s, d) of (b, s, d): the identity
            return list(index)
        flat = offset_expr(index, contiguous(node.meta["val"].shape))
        if flat == "0":
            return ["0"] * len(src_shape)
        return digits(flat, src_shape) or [e for _, e in split_index(f"({flat})" if " " in flat else flat, src_shape)]
    raise Unsupported(f"view {node.target} of a value computed in the kernel", node=node)


def contiguous(shape) -> tuple[int, ...]:
    """The strides of a contiguous tensor of ``shape``."""
    return torch.empty(tuple(shape), device="meta").stride()


def digits(flat: str, shape: tuple[int, ...]) -> list[str] | None:
    """``[i0, i1, ...]`` where ``flat`` is ``i0*s0 + i1*s1 + ...`` over the contiguous strides ``s`` of ``shape``, one
    loop variable (a name) per dim of size > 1, nothing else: the flat position of a reshape taken apart with no
    ``//`` or ``%``. A reduction kernel's rows come back as its own row index (``x1, x0, r0``), read at the row its
    program reduces. Exact: each name indexes a dim of a contiguous shape whose strides are these, so it lies inside
    that dim (a stride the next outer dim's divides). None for anything else (the caller splits ``flat``)."""
    body = flat[1:-1] if flat.startswith("(") and flat.endswith(")") else flat
    terms: dict[int, str] = {}
    for term in body.split(" + "):
        k, _, name = term.rpartition("*")
        if not name.isidentifier() or not (k.isdigit() or not k) or int(k or 1) in terms:
            return None
        terms[int(k or 1)] = name
    out = ["0" if size == 1 else terms.pop(st, "") for size, st in zip(shape, contiguous(shape), strict=True)]
    return out if all(out) and not terms else None


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


def stored_index(node: fx.Node, rows, index: list[str], split_index: Callable, offset_expr: Callable):
    """``(source, at, own)`` for a reduction kernel storing member ``node``: it stores ``source``'s element at index
    ``at`` to ``node``'s element at ``own``, from the program that holds row element ``index`` (``rows``'s shape).
    A whole row, one element per row (a reduction's value: the kept dims' indices), a transposed copy of the rows
    (``row_permutation``: its dim d is the rows' dim ``perm[d]``) or a reshape of them (``Rows.reshaped``: the row's flat
    position split over the member's shape, which a view of the rows reads back as ``index`` itself: ``digits``)."""
    shape, val = rows.shape, node.meta["val"]
    if node.name in rows.reshaped:
        flat = offset_expr(index, contiguous(shape))
        at = [e for _, e in split_index(f"({flat})" if " " in flat else flat, tuple(val.shape))]
        return node, at, at
    per_row = len(val.shape) == len(rows.kept) < len(shape)  # (a reduction without keepdim)
    at = [index[d] for d in rows.kept] if per_row else index
    if moved := row_permutation(node, shape):  # a transposed copy of the rows: its dim d is row dim perm[d]; its
        own = [index[p] for p in moved[0]]  # element there reads the row's (its views map the index back)
        return node, own, own
    return node, at, at
