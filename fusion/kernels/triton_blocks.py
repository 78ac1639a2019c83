"""Blocks of lines a kernel body holds besides one line per op (Phase 8, ``fusion.codegen``): a looped reduction's
loops over blocks of a row, and loads masked to where they may read (a ``cat``'s inputs, a max-pool's window).
Each function takes the code generator's ``KernelWriter`` and writes through its ``emit``/``operand``/``body``.
Machinery: a learner reads ``fusion/codegen.py``."""

from __future__ import annotations

import itertools
from collections.abc import Callable
from contextlib import contextmanager

import torch
import torch.fx as fx

from fusion.kernels.triton_lang import CAT, Line, bind_args, compute_dtype, pooled_values, tl_dtype

# How a reduction starts (masked lanes hold it) and how a looped one folds a block into its XBLOCK x RBLOCK partials.
IDENTITY = {"_add": "0.0", "_maximum": 'float("-inf")', "_minimum": 'float("inf")'}
STEP = {"_add": "{0} + {1}", "_maximum": "tl.where({0} != {0}, {0}, tl.where({0} > {1}, {0}, {1}))",
        "_minimum": "tl.where({0} != {0}, {0}, tl.where({0} < {1}, {0}, {1}))"}  # fmt: skip


@contextmanager
def _block_scope(writer):
    """Values the writer computes inside are forgotten on leaving (they belong to one loop's block, or to loads masked
    for one cat input or window offset); what was cached before stays."""
    saved = dict(writer.cache)
    try:
        yield
    finally:
        writer.cache.clear()
        writer.cache.update(saved)


@contextmanager
def row_loop(writer):
    """The lines ``writer`` emits inside are the body of ``for roffset in range(0, rnumel, RBLOCK)``, with ``rindex``,
    ``rmask`` and the row's split indices of that block. Values computed inside belong to one block: on leaving, the
    writer's cache forgets them (a later loop computes them again, as Inductor's looped reductions do)."""
    rows, depth = writer.rows, writer.depth
    header = [f"for roffset in range(0, {rows.rnumel}, RBLOCK):", "    rindex = roffset + tl.arange(0, RBLOCK)[None, :]",
              f"    rmask = rindex < {rows.rnumel}", *(f"    {v} = {e}" for v, e in writer.splits if v[0] == "r")]  # fmt: skip
    writer.body += [Line("", text, None, None, depth) for text in header]
    writer.depth += 1
    try:
        with _block_scope(writer):
            yield
    finally:
        writer.depth = depth


@contextmanager
def guarded(writer, condition: str):
    """Loads emitted inside are masked by ``condition`` as well (a cat's input read only where its index falls in
    that input); the values computed inside are forgotten on leaving: elsewhere the same load is not masked."""
    writer.guards.append(condition)
    try:
        with _block_scope(writer):
            yield
    finally:
        writer.guards.pop()


def concatenation(writer, node: fx.Node, index: list[str]) -> tuple[str, torch.dtype]:
    """(tmp, dtype) of ``cat(tensors, dim)`` at ``index``: along ``dim`` each input owns a range of indices [lo, hi);
    each is read at ``index[dim] - lo``, its loads masked to its range (never out of its bounds), and a chain of
    ``tl.where`` picks the one the index falls in, as Inductor's pointwise cat does. Inputs are converted to the cat's
    (promoted) dtype first."""
    val = node.meta["val"]
    dim = bind_args(node).get("dim", 0) % val.dim()
    dtype, i = compute_dtype(val.dtype), index[dim]
    parts, lo = [], 0
    for t in node.args[0]:
        size = t.meta["val"].shape[dim]
        if size:
            parts.append((t, lo, lo + size))
        lo += size
    if i.isdigit():  # a constant index (a select of the cat): the input it falls in, no select
        t, lo, _ = next(p for p in parts if p[1] <= int(i) < p[2])
        return writer.operand(
            t, [str(int(i) - lo) if d == dim else j for d, j in enumerate(index)], dtype, op_dtype=val.dtype
        ), dtype
    picks = []
    for k, (t, lo, hi) in enumerate(parts):
        bounds = [f"({i} >= {lo})" if k else "", f"({i} < {hi})" if k < len(parts) - 1 else ""]
        if not (cond := " & ".join(filter(None, bounds))):  # the only input: no select
            return writer.operand(t, index, dtype, op_dtype=val.dtype), dtype
        inside = writer.emit(cond, torch.bool)[0]
        shifted = [f"({j} - {lo})" if d == dim and lo else j for d, j in enumerate(index)]
        with guarded(writer, inside):
            picks.append((inside, writer.operand(t, shifted, dtype, op_dtype=val.dtype)))
    expr = picks[-1][1]
    for inside, value in reversed(picks[:-1]):
        expr = f"tl.where({inside}, {value}, {expr})"
    return writer.emit(expr, dtype, node)


def rule(node: fx.Node, members) -> Callable | None:
    """The function here that computes member ``node`` (a cat, a max-pool's values), or None: one line per op."""
    if node not in members:
        return None
    return concatenation if node.target is CAT else window_max if pooled_values(node) else None


def window_max(writer, node: fx.Node, index: list[str]) -> tuple[str, torch.dtype]:
    """(tmp, dtype) of a max-pool's values (``node`` = getitem 0) at ``index``: for each offset of the window, the
    input at ``out * stride - padding + offset * dilation`` in every pooled dim, its loads masked to the input's
    bounds (outside: -inf, never read), folded by a NaN-propagating max as torch's max-pool does. An offset outside
    the input for a constant index (a size-1 dim) is left out at generation time."""
    pool, bound = node.args[0], bind_args(node.args[0])
    x, kernel, stride, padding, dilation = (bound[k] for k in ("self", "kernel_size", "stride", "padding", "dilation"))
    nd, shape = len(kernel), tuple(x.meta["val"].shape)
    stride = list(stride) or list(kernel)
    padding, dilation = ([v] * nd if isinstance(v, int) else list(v) for v in (padding, dilation))
    dtype, acc = compute_dtype(node.meta["val"].dtype), None
    for offsets in itertools.product(*(range(k) for k in kernel)):
        src, conds, outside = list(index[:-nd]), [], False
        for o, k, s, p, d, size in zip(index[-nd:], offsets, stride, padding, dilation, shape[-nd:], strict=True):
            shift = k * d - p
            if o.isdigit():  # a constant output index: the input index is known now
                at = int(o) * s + shift
                outside |= not 0 <= at < size
                src.append(str(at))
                continue
            at = o if o.isidentifier() else f"({o})"
            at = f"({at if s == 1 else f'{s}*{at}'}{f' - {-shift}' if shift < 0 else f' + {shift}' if shift else ''})"
            src.append(at)
            conds += [f"({at} >= 0)"] * (shift < 0) + [f"({at} < {size})"]
        if outside:
            continue
        if conds:
            inside = writer.emit(" & ".join(conds), torch.bool)[0]
            with guarded(writer, inside):
                value = writer.operand(x, src, dtype)
            value = writer.emit(f'tl.where({inside}, {value}, float("-inf"))', dtype)[0]
        else:
            value = writer.operand(x, src, dtype)
        acc = value if acc is None else writer.emit(STEP["_maximum"].format(acc, value), dtype)[0]
    if acc is None:  # every offset of the window lies in the padding: torch's max-pool gives -inf
        acc = f'tl.full(xindex.shape, float("-inf"), {tl_dtype(dtype)})'
    return writer.emit(acc, dtype, pool)  # recorded as the pool's line: the kernel's op list names the max-pool


def row_reduction(writer, operand: Callable[[], str], combine: str, dtype: torch.dtype, node=None) -> tuple:
    """(tmp, dtype): each row reduced with ``combine`` over the values ``operand()`` emits (masked lanes hold the
    identity). One block: one ``tl.reduce`` over the row in registers. Looped: partials of XBLOCK x RBLOCK folded block
    by block in a loop, then one ``tl.reduce`` of the partials."""
    identity = IDENTITY[combine]
    if not writer.rows.looped:
        return writer.emit(f"tl.reduce(tl.where(rmask, {operand()}, {identity}), 1, {combine})[:, None]", dtype, node)
    acc = writer.emit(f"tl.full([XBLOCK, RBLOCK], {identity}, {tl_dtype(dtype)})", dtype)[0]
    with row_loop(writer):
        block = writer.emit(f"tl.where(rmask, {operand()}, {identity})", dtype)[0]
        writer.body.append(Line(acc, STEP[combine].format(acc, block), dtype, None, writer.depth))
    return writer.emit(f"tl.reduce({acc}, 1, {combine})[:, None]", dtype, node)
