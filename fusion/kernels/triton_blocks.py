"""Blocks of lines a kernel body holds besides one line per op (Phase 8, ``fusion.codegen``): a looped reduction's
loops over blocks of a row, and loads masked to where they may read (a ``cat``'s inputs, the window of a max-pool or
of a depthwise convolution). Each function takes the code generator's ``KernelWriter`` and writes through its
``emit``/``operand``/``body``. Machinery: a learner reads ``fusion/codegen.py``."""

from __future__ import annotations

import functools
import itertools
import re
from collections.abc import Callable
from contextlib import contextmanager

import torch
import torch.fx as fx

from fusion.kernels.rows import CAT, bind_args, cat_parts, is_depthwise, pooled_values
from fusion.kernels.triton_lang import Line, compute_dtype, tl_dtype
from fusion.kernels.window_rules import cheap_per_tap, window_here

aten = torch.ops.aten


# How a reduction starts (masked lanes hold it) and how a looped one folds a block into its XBLOCK x RBLOCK partials.
IDENTITY = {"_add": "0.0", "_maximum": 'float("-inf")', "_minimum": 'float("inf")'}
STEP = {"_add": "{0} + {1}", "_maximum": "tl.where({0} != {0}, {0}, tl.where({0} > {1}, {0}, {1}))",
        "_minimum": "tl.where({0} != {0}, {0}, tl.where({0} < {1}, {0}, {1}))"}  # fmt: skip


@contextmanager
def _block_scope(writer, shifted: tuple[str, ...] = ()):
    """Values the writer computes inside are forgotten on leaving (they belong to one loop's block, or to loads masked
    for one cat input or window offset); what was cached before stays. With ``shifted`` (a guarded scope's shifted
    index expressions), a value whose index mentions none of them is kept: no load of it was masked."""
    saved = dict(writer.cache)
    try:
        yield
    finally:
        kept = {key: v for key, v in writer.cache.items() if shifted and key not in saved and isinstance(key[1], tuple)
                and not any(s in i for i in key[1] for s in shifted)}  # fmt: skip
        writer.cache.clear()
        writer.cache.update(saved)
        writer.cache.update(kept)


def used_splits(writer) -> list[tuple[str, str]]:
    """The split indices (``x0 = xindex % 64``) some line of the writer's body reads; a loop header's lines of the
    others are dropped from the body (a LayerNorm reads its rows at the flat index: no ``x1``/``x0`` line is left)."""
    defs = {f"{v} = {e}" for v, e in writer.splits if v != "0"}
    code = " ".join(ln.expr for ln in writer.body if ln.tmp or ln.expr.strip() not in defs)
    used = set(re.findall(r"\b[xr]\d+\b", code))
    writer.body = [ln for ln in writer.body if ln.tmp or ln.expr.strip() not in defs or ln.expr.split()[0] in used]
    return [(v, e) for v, e in writer.splits if v in used]


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
def guarded(writer, condition: str, shifted: tuple[str, ...]):
    """Loads emitted inside whose address mentions one of the ``shifted`` index expressions (a cat input's index
    along the cat dim, a window offset's input index) are masked by ``condition`` as well: they may lie outside the
    tensor. The values computed at those indices are forgotten on leaving (elsewhere the same load is not masked);
    the others (a BatchNorm's per-channel parameters read at the output's own index) are loaded unmasked and kept."""
    writer.guards.append((condition, shifted))
    try:
        with _block_scope(writer, shifted):
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
    parts = cat_parts(node, dim)
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
        with guarded(writer, inside, (shifted[dim],)):
            picks.append((inside, writer.operand(t, shifted, dtype, op_dtype=val.dtype)))
    expr = picks[-1][1]
    for inside, value in reversed(picks[:-1]):
        expr = f"tl.where({inside}, {value}, {expr})"
    return writer.emit(expr, dtype, node)


def rule(node: fx.Node, members) -> Callable | None:
    """The function here that computes member ``node`` (a cat, a max-pool's values, a depthwise convolution), or
    None: one line per op."""
    if node not in members:
        return None
    if node.target is CAT:
        return concatenation
    return window_max if pooled_values(node) else window_sum if is_depthwise(node) else None


def window_taps(writer, index: list[str], shape, kernel, stride, padding, dilation):
    """For each offset of a window (``kernel`` sizes over the last ``len(kernel)`` dims of an input of ``shape``),
    ``(offsets, src, inside, shifted)``: the input index ``out * stride - padding + offset * dilation`` of the output
    element at ``index``, the tmp of the mask where it lies inside the input (None: always inside) and the index
    expressions it shifted. An offset outside the input for a constant index (a size-1 dim) is left out at generation
    time."""
    nd = len(kernel)
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
        if not outside:
            shifted = tuple(i for i in src[-nd:] if not i.isdigit())
            yield offsets, src, writer.emit(" & ".join(conds), torch.bool)[0] if conds else None, shifted


def _one_window_deep(writer, node: fx.Node, x: fx.Node) -> None:
    """Where a window is generated: ``window_rules.window_here`` (the lowering of the kernel IR applies the same)."""
    window_here(bool(writer.rows), writer.members, node, x)


def _cheap_per_tap(writer, node: fx.Node, x: fx.Node, start: int) -> None:
    """After a window's second tap (the first also computes what every tap shares: a BatchNorm's per-channel scale):
    ``window_rules.cheap_per_tap`` over what the tap computed again (the lines from ``start``)."""
    cheap_per_tap(node, x, [ln.node for ln in writer.body[start:] if ln.node in writer.members])


def _window_values(writer, node: fx.Node, x: fx.Node, index: list[str], window: tuple, dtype, outside: str):
    """For each tap of ``window`` = (kernel, stride, padding, dilation) over ``x`` (the input of window op ``node``):
    ``(offsets, value)``, the input at the tap (``outside`` where it lies outside the input), once the window is
    legal here (:func:`_one_window_deep`) and cheap to recompute per tap (:func:`_cheap_per_tap`, on the second)."""
    _one_window_deep(writer, node, x)
    for i, tap in enumerate(window_taps(writer, index, x.meta["val"].shape, *window)):
        start = len(writer.body)
        value = _window_load(writer, x, tap, dtype, outside)
        if i == 1:
            _cheap_per_tap(writer, node, x, start)
        yield tap[0], value


def _window_load(writer, x: fx.Node, tap: tuple, dtype: torch.dtype, outside: str) -> str:
    """``x`` at a window tap's index, its loads masked to where it lies inside the input, ``outside`` elsewhere."""
    _, src, inside, shifted = tap
    if inside is None:
        return writer.operand(x, src, dtype)
    with guarded(writer, inside, shifted):
        value = writer.operand(x, src, dtype)
    return writer.emit(f"tl.where({inside}, {value}, {outside})", dtype)[0]


def window_max(writer, node: fx.Node, index: list[str]) -> tuple[str, torch.dtype]:
    """(tmp, dtype) of a max-pool's values (``node`` = getitem 0) at ``index``: for each offset of the window
    (:func:`window_taps`), the input there (outside it: -inf, never read), folded by a NaN-propagating max as torch's
    max-pool does."""
    pool, bound = node.args[0], bind_args(node.args[0])
    x, kernel, stride, padding, dilation = (bound[k] for k in ("self", "kernel_size", "stride", "padding", "dilation"))
    nd = len(kernel)
    stride = list(stride) or list(kernel)
    padding, dilation = ([v] * nd if isinstance(v, int) else list(v) for v in (padding, dilation))
    dtype, acc = compute_dtype(node.meta["val"].dtype), None
    for _, value in _window_values(writer, pool, x, index, (kernel, stride, padding, dilation), dtype, 'float("-inf")'):
        acc = value if acc is None else writer.emit(STEP["_maximum"].format(acc, value), dtype)[0]
    if acc is None:  # every offset of the window lies in the padding: torch's max-pool gives -inf
        acc = f'tl.full(xindex.shape, float("-inf"), {tl_dtype(dtype)})'
    return writer.emit(acc, dtype, pool)  # recorded as the pool's line: the kernel's op list names the max-pool


def window_sum(writer, node: fx.Node, index: list[str]) -> tuple[str, torch.dtype]:
    """(tmp, dtype) of a depthwise convolution (``fusion::depthwise_conv2d(x, w, stride, padding, dilation)``) at
    ``index`` = (n, c, i, j): for each offset (a, b) of the window (:func:`window_taps`), the input there (outside
    it: 0, the zero padding, never read) times ``w[c, 0, a, b]``, summed in the compute dtype (float32 for half and
    bfloat16, as cuDNN accumulates) in the window's order."""
    x, w, stride, padding, dilation = node.args
    dtype, acc = compute_dtype(node.meta["val"].dtype), None
    window = (tuple(w.meta["val"].shape[2:]), stride, padding, dilation)
    for offsets, value in _window_values(writer, node, x, index, window, dtype, "0.0"):
        weight = writer.operand(w, [index[1], "0", *map(str, offsets)], dtype)
        term = writer.emit(f"{value} * {weight}", dtype)[0]
        acc = term if acc is None else writer.emit(f"{acc} + {term}", dtype)[0]
    if acc is None:  # every offset of the window lies in the padding
        acc = f"tl.full(xindex.shape, 0.0, {tl_dtype(dtype)})"
    return writer.emit(f"{acc} + 0.0", dtype, node)  # eager's sum starts at +0.0: -0.0 terms give +0.0


@functools.cache
def _sum_combine() -> str:
    """The combine function a sum's last fold names: Triton's own where it has one (see :func:`_last_fold`), else
    ours. Asked when a sum is first generated, not at import: importing Triton takes ~0.2 s."""
    try:
        import triton.language as tl
    except ImportError:  # no Triton: the source is only printed (Phase 8's lesson), ours reads the same
        return "_add"
    return "tl.standard._sum_combine" if hasattr(tl.standard, "_sum_combine") else "_add"


def _last_fold(values: str, combine: str) -> str:
    """Each row of ``values`` folded to one column by ``combine``. A sum's combine function is Triton's own, the one
    tl.sum reduces with (tl.sum itself cannot be called from a kernel loaded for the interpreter): on a GPU the same
    tree of adds as our a + b (the same PTX), and Triton's interpreter then sums with numpy's pairwise sum, where a
    function of ours is called lane by lane, a float32 fold from left to right (slow, and far from eager's sum on long
    rows). A sum ends ``+ 0.0``: eager's sum starts at +0.0, so a row of -0.0 sums to +0.0, where a tree of adds over a
    row that fills its block (no masked +0.0 lane) keeps -0.0 (and 1 / it is -inf); any other sum is unchanged. Max
    and min propagate NaN: our combine functions."""
    if combine == "_add":
        return f"tl.reduce({values}, 1, {_sum_combine()})[:, None] + 0.0"
    return f"tl.reduce({values}, 1, {combine})[:, None]"


def row_reduction(writer, operand: Callable[[], str], combine: str, dtype: torch.dtype, node=None) -> tuple:
    """(tmp, dtype): each row reduced with ``combine`` over the values ``operand()`` emits (masked lanes hold the
    identity). One block: one ``tl.reduce`` over the row in registers. Looped: partials of XBLOCK x RBLOCK folded block
    by block in a loop, then one ``tl.reduce`` of the partials."""
    identity = IDENTITY[combine]
    if not writer.rows.looped:
        return writer.emit(_last_fold(f"tl.where(rmask, {operand()}, {identity})", combine), dtype, node)
    acc = writer.emit(f"tl.full([XBLOCK, RBLOCK], {identity}, {tl_dtype(dtype)})", dtype)[0]
    with row_loop(writer):
        block = writer.emit(f"tl.where(rmask, {operand()}, {identity})", dtype)[0]
        writer.body.append(Line(acc, STEP[combine].format(acc, block), dtype, None, writer.depth))
    return writer.emit(_last_fold(acc, combine), dtype, node)
