"""Windows in the kernel IR (``fusion.compiler.lowering``): a max-pool's values and a depthwise convolution (pass
``depthwise``, ``fusion.compiler.depthwise``) as their taps unrolled, with no record kind of their own.

For each offset of the window the input is read at the shifted index ``out * stride - padding + offset *
dilation`` under a guard, the tap's position inside the input (an :class:`~fusion.ir.kernel_ir.Index` per shifted
dim compared with 0 and the dim's size: only the bounds a tap can cross are tested). Every load of the shifted index
is masked by it (a ``cat``'s guarded loads: ``Lowering.guards``), so a tap in the padding reads nothing, and the
value there is replaced: ``-inf`` for a max-pool (it never wins), 0 for a depthwise convolution (it adds nothing).
What a tap reads at the window's own leading index (a BatchNorm's per-channel parameters before a depthwise
convolution, its weights) is unmasked and computed once for all the taps (``Lowering.safe``). A tap whose shifted
index is a constant outside the input (a size-1 output dim) is left out when the kernel is built.

The values: a max-pool
folds its taps with ``maximum`` in the window's order (NaN propagates, as aten's max-pool); a depthwise convolution
sums ``value * weight[c, 0, a, b]`` in the window's order from +0.0, in float32 for half types, rounded once. The
legality rules and their reasons (``fusion.kernels.window_rules``): not inside a
reduction kernel, not over another window's values in the same kernel, and what a tap computes again at most
:data:`~fusion.kernels.window_rules.MAX_OPS_PER_TAP` ops, none of them costly.

Both renderers take the record (``fusion.kernels.c_render``, ``fusion.kernels.triton_render``). On a CPU the C
kernel of a window measured slower than aten's (scripts/results/cpu-2026-11-27-windows-ir.log: a stride-2 tap's
masked loads do not vectorize, a 7x7 or 14x14 map's rows are shorter than the SIMD width), so there a max-pool is
left to aten (:func:`c_refusal`) and the pass ``depthwise`` does not rename (``fusion.compiler.driver``) unless asked.
"""

from __future__ import annotations

import itertools
from collections.abc import Iterator

import torch
import torch.fx as fx

from fusion.aten.nodes import bind_args, is_view_node
from fusion.compiler.index_algebra import add, const, maxval, scale
from fusion.compiler.lower_reductions import HALF, compute, dtype_name
from fusion.ir import kernel_ir as ir
from fusion.ir.plan import Unsupported
from fusion.kernels import c_runtime
from fusion.kernels.rows import pooled_values
from fusion.kernels.window_rules import cheap_per_tap, window_here

# A max-pool's window from C on a CPU: measured slower than aten's max-pool there (ResNet-18 at the CPU suite's sizes,
# one thread: 0.95-0.99x eager with its pool in C, 1.00-1.08x with aten's; a stride-2 tap's masked loads do not
# vectorize; scripts/results/cpu-2026-11-27-windows-ir.log), so :func:`c_refusal` leaves it to aten unless this is
# True (the IR's Triton source takes it whatever this says).
POOLS_IN_C = False


def c_refusal(region) -> Unsupported | None:
    """Why the C renderer should not take ``region``, or None: a max-pool's window, on a CPU whose kernels C renders,
    unless :data:`POOLS_IN_C` (aten's max-pool is faster there: the region is cut at the pool)."""
    if POOLS_IN_C or not c_runtime.runs_as_c(region):
        return None
    values = next((n for n in region.nodes if pooled_values(n)), None)  # getitem 0 of the pool
    if values is None:
        return None
    pool = values.args[0]
    why = "on CPU aten's max-pool beats the C window kernel (fusion.compiler.lower_windows.POOLS_IN_C)"
    return Unsupported(f"{pool.name}: {why}", pool)


def window(low, node: fx.Node, index: list[ir.Affine]) -> tuple[str, torch.dtype]:
    """(value, compute dtype) of window ``node`` (:func:`is_window`) at ``index``, rounded once to a half dtype."""
    dtype = node.meta["val"].dtype
    out = window_max(low, node, index) if pooled_values(node) else window_sum(low, node, index)
    if dtype in HALF:
        out = low.op(f"round_{dtype_name(dtype)}", [out], torch.float32)
    return out, compute(dtype)


def _ints(v, nd: int) -> list[int]:
    return [v] * nd if isinstance(v, int) else list(v) * (nd if len(v) == 1 else 1)


def window_max(low, node: fx.Node, index: list[ir.Affine]) -> str:
    """A max-pool's values at ``index``: the taps folded by a NaN-propagating ``maximum``; a tap in the padding is
    -inf (never read). No tap inside the input: -inf, as torch's max-pool gives."""
    pool = node.args[0]
    bound = bind_args(pool)
    x, kernel = bound["self"], list(bound["kernel_size"])
    nd = len(kernel)
    stride = _ints(bound["stride"], nd) if bound["stride"] else kernel
    padding, dilation = _ints(bound["padding"], nd), _ints(bound["dilation"], nd)
    dtype = compute(node.meta["val"].dtype)
    acc = None
    for _, value in _taps(low, pool, x, index, (kernel, stride, padding, dilation), dtype, float("-inf")):
        acc = value if acc is None else low.op("maximum", [acc, value], dtype)
    return low.const(float("-inf"), dtype) if acc is None else acc


def window_sum(low, node: fx.Node, index: list[ir.Affine]) -> str:
    """A depthwise convolution (``fusion::depthwise_conv2d(x, w, stride, padding, dilation)``) at ``index`` = (n, c,
    i, j): from +0.0, each tap ``(a, b)`` adds ``x_tap * w[c, 0, a, b]`` (a tap in the padding: 0), in the window's
    order, in the compute dtype (float32 for half types)."""
    x, w, stride, padding, dilation = node.args
    dtype = compute(node.meta["val"].dtype)
    shape = tuple(w.meta["val"].shape[2:])
    acc = low.const(0.0, dtype)
    for offsets, value in _taps(low, node, x, index, (shape, list(stride), list(padding), list(dilation)), dtype, 0.0):
        weight = low.operand(w, [index[1], const(0), *map(const, offsets)], dtype)
        acc = low.op("add", [acc, low.op("mul", [value, weight], dtype)], dtype)
    return acc


def _taps(low, node: fx.Node, x: fx.Node, index: list[ir.Affine], win: tuple, dtype, outside: float) -> Iterator:
    """``(offsets, value)`` per tap of ``win`` = (kernel, stride, padding, dilation) over the last dims of ``x``
    (the input of window op ``node``), its value ``outside`` where the tap lies outside ``x``."""
    window_here(bool(low.rows), low.members, node, x)
    kernel, stride, padding, dilation = win
    shape, nd = tuple(x.meta["val"].shape), len(kernel)
    lead, own = list(index[:-nd]), list(index[-nd:])
    for i, offsets in enumerate(itertools.product(*(range(k) for k in kernel))):
        src, bounds, skip = list(lead), [], False
        for o, k, s, p, d, size in zip(own, offsets, stride, padding, dilation, shape[-nd:], strict=True):
            at = add(scale(o, s), const(k * d - p))
            if not at.terms:  # a constant index (a size-1 output dim): inside or left out now
                skip |= not 0 <= at.const < size
            elif at.const < 0 or maxval(at, low.sizes) >= size:  # every coefficient >= 0: its least value is const
                bounds.append((at, at.const < 0, maxval(at, low.sizes) >= size, size))
            src.append(at)
        if skip:
            continue
        again: list[fx.Node] = []
        low.trace = again if i == 1 else None  # what the second tap computes again (the first: what all share)
        try:
            value = _tap(low, x, src, bounds, lead, dtype, outside)
        finally:
            low.trace = None
        if i == 1:
            cheap_per_tap(node, x, [n for n in again if n in low.members and not is_view_node(n)])
        yield offsets, value


def _tap(low, x: fx.Node, src: list[ir.Affine], bounds: list, lead: list[ir.Affine], dtype, outside: float) -> str:
    """``x`` at the tap's index ``src``; its loads masked by the tap's guard (``bounds``: (index, test >= 0, test <
    size, size) per shifted dim) and the value ``outside`` where the guard is false."""
    if not bounds:
        return low.operand(x, src, dtype)
    inside = None
    for at, low_side, high_side, size in bounds:
        for test, bound in (("ge", 0),) * low_side + (("lt", size),) * high_side:
            cond = _bound(low, at, test, bound)
            inside = cond if inside is None else _cached(low, ("and", inside, cond), "and", [inside, cond])
    mask = low.op("and", [low.guards[-1], inside], torch.bool) if low.guards else inside
    low.guards.append(mask)
    low.safe[mask] = frozenset(lead)  # the window's own leading index: read unmasked, once for every tap
    try:
        value = low.operand(x, src, dtype)
    finally:
        low.guards.pop()
    return low.op("where", [inside, value, low.const(outside, dtype)], dtype)


def _cached(low, key: tuple, op: str, args: list[str]) -> str:
    """``op(*args)`` as a bool, once per kernel (the taps of a window share their rows' and columns' tests)."""
    scope = low.scopes[0]
    if ("tap",) + key not in scope:
        scope[("tap",) + key] = low.op(op, args, torch.bool)
    return scope[("tap",) + key]


def _bound(low, at: ir.Affine, test: str, bound: int) -> str:
    """``at >= 0`` or ``at < size`` as a bool, once per kernel."""
    scope = low.scopes[0]
    if ("tap-index", at) not in scope:
        scope[("tap-index", at)] = low.index_value(at)
    return _cached(low, (test, at, bound), test, [scope[("tap-index", at)], low.const(bound, torch.int64)])
