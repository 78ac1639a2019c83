"""Index arithmetic of the kernel IR (``fusion.ir.kernel_ir``): exact integer algebra on
:class:`~fusion.ir.kernel_ir.Affine` expressions, and where a view's element lives in the tensor it views.

Every index is >= 0 and every loop variable has a known range (``sizes``), so a reshape's ``//`` and ``%`` cancel
wherever the ranges prove it: ``(60*x0 + 10*x1 + x2) // 10`` is ``6*x0 + x1``; ``(6*x0 + x1) // 60`` with
``x1 < 6`` is ``x0 // 10``. What cannot be proven stays a :class:`~fusion.ir.kernel_ir.FloorDiv` or
:class:`~fusion.ir.kernel_ir.Mod` atom. Used by ``fusion.compiler.lowering``.
"""

from __future__ import annotations

from collections.abc import Sequence

import torch
import torch.fx as fx

from fusion.aten.nodes import bind_args
from fusion.ir import kernel_ir as ir
from fusion.ir.plan import Unsupported

aten = torch.ops.aten


def var(name: str) -> ir.Affine:
    return ir.Affine(((1, ir.Var(name)),))


def const(c: int) -> ir.Affine:
    return ir.Affine((), c)


def _make(terms: dict, c: int) -> ir.Affine:
    return ir.Affine(tuple(sorted(((k, a) for a, k in terms.items() if k), key=repr)), c)


def add(*exprs: ir.Affine) -> ir.Affine:
    terms: dict = {}
    for e in exprs:
        for k, a in e.terms:
            terms[a] = terms.get(a, 0) + k
    return _make(terms, sum(e.const for e in exprs))


def scale(e: ir.Affine, k: int) -> ir.Affine:
    return _make({a: c * k for c, a in e.terms}, e.const * k)


def maxval(e: ir.Affine, sizes: dict[str, int]) -> int:
    """The largest value ``e`` takes over the loop ranges ``sizes`` (every coefficient is >= 0)."""
    top = e.const
    for k, a in e.terms:
        if isinstance(a, ir.Var):
            top += k * (sizes[a.name] - 1)
        elif isinstance(a, ir.FloorDiv):
            top += k * (maxval(a.of, sizes) // a.by)
        else:
            top += k * min(a.by - 1, maxval(a.of, sizes))
    return top


def _parts(e: ir.Affine, g: int) -> tuple[ir.Affine, ir.Affine]:
    """(high, low) with ``e == g * high + low``: the terms whose coefficient ``g`` divides, divided; the rest."""
    high = _make({a: c // g for c, a in e.terms if c % g == 0}, e.const // g)
    return high, ir.Affine(tuple((c, a) for c, a in e.terms if c % g), e.const % g)


def _steps(e: ir.Affine, k: int) -> list[int]:
    """Divisors ``g`` of ``k`` to split ``e`` at: ``k`` itself, then its coefficients that divide ``k``, largest first."""
    return [k, *sorted({c for c, _ in e.terms if 1 < c < k and k % c == 0}, reverse=True)]


def floordiv(e: ir.Affine, k: int, sizes: dict[str, int]) -> ir.Affine:
    """``e // k``, exactly: where ``e == g * high + low`` with ``0 <= low < g`` and ``g`` dividing ``k``, it is
    ``high // (k / g)`` (``high`` itself for ``g == k``); where no such ``g`` is found, the multiples of ``k`` come
    out and the rest is a :class:`FloorDiv` atom (``(196*x + w) // 14`` is ``14*x + w // 14``)."""
    if k == 1:
        return e
    if maxval(e, sizes) < k:
        return const(0)
    for g in _steps(e, k):
        high, low = _parts(e, g)
        if maxval(low, sizes) < g:
            return high if g == k else floordiv(high, k // g, sizes)
    high, low = _parts(e, k)  # (k*high + low) // k is high + low // k: the multiples of k leave the atom
    return add(high, ir.Affine(((1, ir.FloorDiv(low, k)),)))


def mod(e: ir.Affine, k: int, sizes: dict[str, int]) -> ir.Affine:
    """``e % k``, exactly: multiples of ``k`` dropped; where ``e == g * high + low`` as in :func:`floordiv`, it is
    ``g * (high % (k / g)) + low``; a :class:`Mod` atom otherwise."""
    if k == 1:
        return const(0)
    for g in _steps(e, k):
        high, low = _parts(e, g)
        if maxval(low, sizes) < g:
            if g == k:
                return low
            return add(scale(mod(high, k // g, sizes), g), low)
    _, low = _parts(e, k)
    return ir.Affine(((1, ir.Mod(low, k)),))


def substitute(e: ir.Affine, values: dict[str, ir.Affine]) -> ir.Affine:
    """``e`` with each variable named in ``values`` replaced by its expression (inside ``//`` and ``%`` too)."""
    if not values or not e.variables() & values.keys():
        return e
    parts = [const(e.const)]
    for k, a in e.terms:
        if isinstance(a, ir.Var):
            parts.append(scale(values.get(a.name, var(a.name)), k))
        else:
            inner = substitute(a.of, values)
            parts.append(
                ir.Affine(((k, ir.FloorDiv(inner, a.by) if isinstance(a, ir.FloorDiv) else ir.Mod(inner, a.by)),))
            )
    return add(*parts)


def offset(index: Sequence[ir.Affine], strides: Sequence[int]) -> ir.Affine:
    return add(*(scale(i, s) for i, s in zip(index, strides, strict=True)))


def split(flat: ir.Affine, shape: Sequence[int], sizes: dict[str, int]) -> list[ir.Affine]:
    """One index per dim of a contiguous ``shape`` from a flat position."""
    out, inner = [], 1
    for size in reversed(shape):
        out.append(const(0) if size == 1 else mod(floordiv(flat, inner, sizes), size, sizes))
        inner *= size
    return out[::-1]


def broadcast(index: Sequence[ir.Affine], shape: Sequence[int]) -> tuple[ir.Affine, ...]:
    tail = list(index[len(index) - len(shape) :]) if shape else []
    return tuple(const(0) if size == 1 else i for i, size in zip(tail, shape, strict=True))


def view_index(node: fx.Node, index: list[ir.Affine], sizes: dict[str, int]) -> list[ir.Affine]:
    """The index into the view's input holding the view's element at ``index``."""
    if node.target is aten.view.dtype:
        raise Unsupported(f"{node.name} reinterprets the bits as {node.args[1]} (view(dtype))", node)
    packet, bound = node.target.overloadpacket, bind_args(node)
    src_shape = tuple(node.args[0].meta["val"].shape)
    if packet in (aten.alias, aten.expand):
        return list(broadcast(index, src_shape))
    if packet is aten.permute:
        out = [const(0)] * len(index)
        for i, d in enumerate(bound["dims"]):
            out[d % len(index)] = index[i]
        return out
    if packet in (aten.t, aten.transpose) and len(index) > 1:
        d0, d1 = (0, 1) if packet is aten.t else (bound["dim0"] % len(index), bound["dim1"] % len(index))
        out = list(index)
        out[d0], out[d1] = index[d1], index[d0]
        return out
    if packet is aten.t:
        return list(index)
    if packet is aten.unsqueeze:
        return [i for d, i in enumerate(index) if d != bound["dim"] % len(index)]
    if packet is aten.slice:
        dim = bound["dim"] % len(index)
        size, start = src_shape[dim], bound["start"] or 0
        start = min(max(start + size if start < 0 else start, 0), size)
        out = list(index)
        out[dim] = add(scale(index[dim], bound["step"]), const(start))
        return out
    if packet is aten.select:
        out = list(index)
        out.insert(bound["dim"] % len(src_shape), const(bound["index"] % src_shape[bound["dim"]]))
        return out
    if packet in (aten.view, aten.reshape, aten._unsafe_view, aten.squeeze):
        strides = torch.empty(tuple(node.meta["val"].shape), device="meta").stride()
        return split(offset(index, strides), src_shape, sizes)
    raise Unsupported(f"view {node.target} of a value computed in the kernel", node)
