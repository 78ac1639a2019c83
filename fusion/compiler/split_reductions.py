"""Phase 9's pass ``split_reductions``: a reduction with too few outputs to fill a GPU and a long reduced extent
becomes two reductions, as Inductor's split reductions, here done on the aten graph.

The generator gives a reduction one program per row (a row walk, ``x.sum(-1)``) or per :data:`COALESCED_ROWS`
neighbouring columns (a column walk, ``x.sum(0)``: :class:`fusion.kernels.rows.Rows`). With 64 rows of 262,144, or
(65536, 1024).sum(0) (64 programs of 16 columns), most of a GPU's 132 SMs idle: the generator refuses and aten's
reduction runs. Split, the reduced extent ``L`` is viewed as ``(S, L / S)``::

    r(x, dims)  ->  p = r(x.view(..., S, L/S, ...).float(), dim of L/S)      stage 1: S times the outputs
                    r(p, dim of S)  [/ L for mean]  [-> result dtype]             stage 2: S partials per output
    (65536, 1024).sum(0)  ->  x.view(S, 65536/S, 1024).float().sum(1)  ->  (S, 1024).sum(0)  ->  bf16
    (64, 262144).sum(-1)  ->  x.view(64, S, 262144/S).float().sum(-1)  ->  (64, S).sum(-1)  ->  bf16

Stage 1 is an ordinary reduction over a view, so Phase 6's region takes the pointwise ops before it, the view and
the reduction: one kernel, as before the split (tests/test_split_reductions.py counts them). Stage 2 reads S small
partials and writes the result, its cast and mean's division in the same kernel. Each stage is marked for a kernel of
its own where no region takes it (:mod:`fusion.compiler.lone_kernels`): a float32 input's stage 1 and a float32
sum's stage 2 are otherwise one op each, which Phase 6 leaves to aten (on an H200, 2026-11-28: 64 float32 rows of
262,144 summed by two aten reductions took 24.8 us, Inductor's two generated kernels 19.6, limit 17.2; a bf16 input
summed in float32, aten's stage 2: 13.6 against 12.7 us with a generated one). No atomics: every partial has one
writer and the result one order of summation, the same on every call (deterministic).

Numerics: a sum (and mean) of float16/bfloat16/float32 accumulates in float32 partials and is rounded to the result
dtype once, at the end, as eager's CUDA reduction does; float64 stays float64. A half input is read through an
explicit ``convert_element_type(view, float32)``, not ``sum(dtype=float32)``: the same values (the upcast is exact),
and a lone reduction (``x.sum(0)``, no pointwise op before it) then has two ops, which Phase 6 makes a region, so
stage 1 is a generated kernel rather than aten's reduction (measured: (65536, 1024).sum(0) of bf16, stage 1 as aten
64.7 us, as the generated kernel 54.5; limit 46). The order of summation changes (as in any parallel reduction:
eager's is not sequential either). Mean is ``sum / L`` in the accumulation dtype, then the cast: eager's CPU mean
(float32 sum, ``div_``, cast); eager's CUDA mean multiplies by ``1/L``, at most one float32 ulp apart before the
cast. amax/amin are exact: a half input's partials are its values in float32, converted back once at the end; NaN
propagates through both stages. ``any`` is an or of ors. Not split:

* var / var_mean (and std): the partials of a variance are (count, mean, M2) combined by Chan's formula, which no
  aten reduction computes; a sum and a sum of squares (``E[x²] - E[x]²``) cancels catastrophically when the mean is
  large against the spread (a float32 row of mean 1e4 and std 1 loses every digit), so we refuse rather than be
  inexact. Inductor splits them with its Welford reduction; we leave them to aten.
* integer sums (exact in any order, but the generator reduces floats only), reductions whose reduced dims are not
  adjacent (after dropping size-1 dims) or cannot be viewed as ``(S, L/S)`` without a copy, layouts the generator
  would read scattered, and extents with no divisor in the table's range. The dims' order is tried twice: the
  tensor's own, then its memory's (a reduction's result does not depend on the order of the dims it reduces): ViT's
  bias gradients ``g.sum([0, 1])`` of a ``(batch, seq, d)`` gradient laid out ``(seq, batch, d)`` (torchvision's
  attention works sequence-first) are one extent of ``seq * batch`` rows once permuted to that order, viewed as
  ``(S, L/S, d)`` without a copy. Only where the kept dims keep their order (the result's shape is then a view).

Where it pays (CUDA only, constants below, measured): a row walk of fewer than :data:`FEW_PROGRAMS` programs over
at least :data:`LONG_EXTENT` elements, or a column walk of fewer than :data:`FEW_COLUMN_PROGRAMS` over at least
:data:`LONG_COLUMN_EXTENT`. On a CPU never (unless :data:`ON_CPU`, which the tests set): the C renderer runs a
kernel on one thread, where a row is walked at memory speed already and a split adds a pass and a kernel (not
measured to help; nothing suggests it would). scripts/gpu_reductions.py measures the pass on a GPU (H100,
2026-11-27: scripts/results/h100-2026-11-27-reductions.json).
"""

from __future__ import annotations

import math
from collections.abc import Callable
from dataclasses import dataclass

import torch
import torch.fx as fx

from fusion.aten.nodes import is_view_node
from fusion.compiler.lone_kernels import OWN_KERNEL
from fusion.compiler.passes import Pass, noted
from fusion.fxutils.finish import relint
from fusion.fxutils.meta import call_with_meta
from fusion.kernels.rows import COALESCED_ROWS, COLUMN_RBLOCK

aten, prims = torch.ops.aten, torch.ops.prims

# The gate: CUDA devices only (default mode and CUDA graphs alike). Tests set ON_CPU = True to check the rewrite on
# CPU (numerics, kernel counts).
ON_CPU = False
# Reduced dims that are one extent in memory order only, split through a permute (False: refused, as before). Off,
# ViT-B/16's step is 0.99x as fast, its LayerNorm sums back to ATen (H200, 2026-11-29, h200-2026-11-29-1028-walks/)
MEMORY_ORDER = True

# When to split. The numbers (H200, bf16 summed in float32, 2026-11-26): x.sum(0) of (65536, 1024), a column
# walk of 64 programs (1024 outputs / 16): aten 290 us, Inductor (split) 41, limit 35; 64 rows of 262,144, 64
# programs: aten 79 us, Inductor 39, limit 8.7. The generator refuses a looped walk of fewer than 128 programs
# (rows.LOOPED_MIN_ROWS), and a column walk of 256 programs is slow too: (8192, 4096).sum(0) unsplit took 128 us
# against a limit of 23 (H100, 2026-11-27, GPU time of the kernels, inputs rotated past L2; split S = 8-16: 29).
FEW_PROGRAMS = 256  # a row walk (reduced dim innermost in memory) of fewer rows than this: split (512 rows of 32768
# unsplit, 512 looped programs: 14.0 us, split S = 2: 17.2, limit 12.8; H100, scripts/results/h100-2026-11-27-reductions.json)
FEW_COLUMN_PROGRAMS = 1024  # a column walk of fewer programs (of COALESCED_ROWS columns each) than this: split
# ...and only over at least this many elements: a row up to 16384 is one block of the generator's (MAX_RBLOCK), read
# by one program in a few microseconds, where a second kernel costs as much as it saves; columns of 4096 gain (a BERT
# bias gradient (4096, 768) of bf16, 23.2 us -> 14.6, a LayerNorm weight gradient (g * x).sum([0, 1]), 20.7 -> 15.9
# (bf16), 25.4 -> 21.6 (fp32); H100, scripts/results/h100-2026-11-27-reductions-short-columns.json). A lone float32
# sum of 4096 rows was left whole then (its stages two aten reductions: 14.3 -> 23.4); with both stages kernels of
# their own (lone_kernels) it is split too: (4096, 768).sum(0) of float32, aten 13.2 us, split 8.4, Inductor 8.7
# (H200, 2026-11-28, scripts/results/h200-2026-11-28-1840-rows/reductions_short_columns.json).
LONG_EXTENT = 16384
LONG_COLUMN_EXTENT = 4096
# S, the number of splits: the smallest divisor of L that gives stage 1 at least TARGET_PROGRAMS rows (a row walk)
# or TARGET_COLUMN_PROGRAMS groups of 16 columns (a column walk), in chunks of at least MIN_CHUNK (MIN_COLUMN_CHUNK)
# elements, with at most MAX_ROW_SPLITS (MAX_COLUMN_SPLITS) partials per output; without such a divisor the largest
# one in range, else none (L prime, say). Measured on an H100 (2026-11-27, kernels' GPU time, bf16 in, inputs rotated
# past L2; limit = half a copy of the input): 64 x 262,144 rows: S = 2: 30 us, S = 8-1024: 13.6-14.6, limit 11.7
# (S = 16: 1024 stage-1 rows); 16 x 1M: S = 8: 31, S = 32-1024: 13.7-13.9 (S = 64). Columns (65536, 1024): S = 16: 74
# us, S = 64: 50, S = 256: 64-71, S = 1024: 100, limit 44.7; (8192, 4096): S = 4: 38, S = 8-16: 29, S = 32: 34, S = 256:
# 83, limit 22.7. A column walk is fastest looped (chunks over COLUMN_RBLOCK = 256), then with the 64-column tile of
# that day ~1024 programs (4096 groups of 16 columns); with today's larger tile, fewer splits (below). Stage 2 of a
# column walk reads at most COLUMN_RBLOCK partials in one block (more would be refused as too few programs).
TARGET_PROGRAMS = 1024
TARGET_COLUMN_PROGRAMS = 4096
# A sum of a half input walks its columns with a wider tile (rows.WIDE_COLUMN_LOOP_ELEMENTS), which wants fewer
# splits: swept on an H200 (2026-11-28), x.sum(0) of (8192, 4096) bf16 at 1.30x the limit with S = 4 (1.46x with the
# narrow tile at S = 16), (65536, 1024) at 1.14x with S = 16; float32 sums and amax stay best with 4096 groups.
TARGET_WIDE_COLUMN_PROGRAMS = 1024
MIN_CHUNK = 1024
MIN_COLUMN_CHUNK = 2 * COLUMN_RBLOCK
MAX_ROW_SPLITS = 1024
MAX_COLUMN_SPLITS = COLUMN_RBLOCK

HALF = (torch.float16, torch.bfloat16)
SUMS = {aten.sum.dim_IntList, aten.sum.default}
MEANS = {aten.mean.dim, aten.mean.default}
EXTREMA = {aten.amax.default, aten.amin.default}
ANYS = {aten.any.dim, aten.any.dims, aten.any.default}
SPLIT = SUMS | MEANS | EXTREMA | ANYS
REFUSED = {  # reductions we see but do not split, and why
    aten.var.correction: "a variance's partials are (count, mean, M2) (Chan's formula), no aten reduction; a sum "
    "and a sum of squares cancels catastrophically: left to aten",
    aten.var_mean.correction: "a variance's partials are (count, mean, M2) (Chan's formula), no aten reduction; a "
    "sum and a sum of squares cancels catastrophically: left to aten",
}


@dataclass(frozen=True)
class Split:
    """How to split one reduction: view its input as ``view_shape`` (the reduced extent as ``(splits, chunk)`` at
    position ``at``, size-1 dims dropped), reduce dim ``at + 1`` (stage 1), then dim ``at`` (stage 2); the result
    is viewed as the original's shape. ``column``: the kept dims after the reduced ones are contiguous (a column walk)."""

    view_shape: tuple[int, ...]
    at: int
    splits: int
    extent: int
    column: bool
    programs: int  # the unsplit kernel's programs (rows, or groups of COALESCED_ROWS columns)
    permute: tuple[int, ...] | None = None  # the input's dims in memory order first (the reduced ones one extent there)


def _dims(node: fx.Node, ndim: int) -> list[int]:
    """The reduced dims, sorted, non-negative (every dim for sum.default, any.default, an empty dim list)."""
    if node.target in (aten.sum.default, aten.mean.default, aten.any.default):
        return list(range(ndim))
    dim = node.args[1] if len(node.args) > 1 else node.kwargs.get("dim")
    dim = [dim] if isinstance(dim, int) else list(dim or [])
    return sorted({d % ndim for d in dim}) if dim and ndim else list(range(ndim))


def splits_for(extent: int, programs: int, column: bool, target: int | None = None) -> int | None:
    """S: a divisor of ``extent`` per the table above (``programs`` the unsplit kernel's), or None."""
    cap = MAX_COLUMN_SPLITS if column else MAX_ROW_SPLITS
    chunk = MIN_COLUMN_CHUNK if column else MIN_CHUNK
    fits = [s for s in range(2, min(cap, extent // chunk) + 1) if extent % s == 0]
    if not fits:
        return None
    target = target or (TARGET_COLUMN_PROGRAMS if column else TARGET_PROGRAMS)
    want = -(-target // max(programs, 1))
    return next((s for s in fits if s >= want), fits[-1])


def _reads_half(x: fx.Node) -> bool:
    """Is ``x`` a half tensor, or one cast up from one through views (``x.float().sum(0)``: stage 1 then reads the
    half input through the cast, the kernel the wide tile of ``rows.WIDE_COLUMN_LOOP_ELEMENTS`` is for)?"""
    while True:
        if x.meta["val"].dtype in HALF:
            return True
        upcast = x.op == "call_function" and x.target in (prims.convert_element_type.default, aten._to_copy.default)
        if not (upcast or (x.op == "call_function" and is_view_node(x, getitem=False))):
            return False
        if not isinstance(x.args[0], fx.Node) or "val" not in x.args[0].meta:
            return False
        x = x.args[0]


def plan_split(node: fx.Node, target: int | None = None) -> Split | str | None:
    """A :class:`Split` for reduction ``node``, a reason it is not split (a string: noted), or None (no candidate:
    enough outputs, or a short extent; nothing to say)."""
    x = node.args[0]
    xv, out = x.meta.get("val") if isinstance(x, fx.Node) else None, node.meta.get("val")
    if not isinstance(xv, torch.Tensor) or not isinstance(out, torch.Tensor) or xv.numel() == 0:
        return None
    dims = _dims(node, xv.dim())
    shape = tuple(xv.shape)
    extent, outputs = math.prod(shape[d] for d in dims), max(out.numel(), 1)
    if extent < min(LONG_EXTENT, LONG_COLUMN_EXTENT) or outputs >= max(
        FEW_PROGRAMS, FEW_COLUMN_PROGRAMS * COALESCED_ROWS
    ):
        return None  # short rows or plenty of outputs: the unsplit kernel fills the GPU
    found, permute = _extent(xv, dims), None
    if isinstance(found, str) and MEMORY_ORDER:  # not one extent in the tensor's own order: in its memory's, perhaps
        order = sorted(range(len(shape)), key=lambda d: (-xv.stride(d), d))  # (a sum's order of dims is free)
        kept = [d for d in order if d not in dims and shape[d] != 1]
        if kept == sorted(kept) and order != sorted(order):  # the kept dims keep their order: the result's shape
            permuted = _extent(xv.permute(order), [order.index(d) for d in dims])
            if not isinstance(permuted, str):
                found, permute = permuted, tuple(order)
    if isinstance(found, str):
        return found
    sizes, at, strides, kept_after = found
    lane = strides[at]
    if lane == 1:
        column, programs = False, outputs  # a row walk: one program a row
    elif kept_after and strides[-1] == 1 and kept_after[-1] >= COALESCED_ROWS:
        column, programs = True, -(-outputs // COALESCED_ROWS)  # a column walk: 16 neighbouring columns a program
    else:
        return f"dims {dims} of {shape} at strides {tuple(xv.stride())}: the generator would read them scattered"
    if programs >= (FEW_COLUMN_PROGRAMS if column else FEW_PROGRAMS):
        return None
    if extent < (LONG_COLUMN_EXTENT if column else LONG_EXTENT):
        return None
    # a candidate: too few programs over a long extent. Reasons not to split it after all:
    if node.target in REFUSED:
        return REFUSED[node.target]
    if xv.device.type != "cuda" and not ON_CPU:
        return f"on {xv.device.type}: the C renderer walks a row on one thread at memory speed; a split adds a pass"
    if node.target not in ANYS and not (xv.dtype.is_floating_point and out.dtype.is_floating_point):
        return f"a reduction of {xv.dtype} to {out.dtype}: the generator reduces floats only (and any)"
    wide = column and node.target in SUMS | MEANS and _reads_half(x)  # stage 1 walks the wide tile
    splits = splits_for(extent, programs, column, target or (TARGET_WIDE_COLUMN_PROGRAMS if wide else None))
    if splits is None:
        cap, chunk = (MAX_COLUMN_SPLITS, MIN_COLUMN_CHUNK) if column else (MAX_ROW_SPLITS, MIN_CHUNK)
        return f"an extent of {extent}: no divisor S in [2, {cap}] with chunks of >= {chunk}"
    view_shape = (*sizes[:at], splits, extent // splits, *kept_after)
    return Split(view_shape, at, splits, extent, column, programs, permute)


def _extent(xv: torch.Tensor, dims: list[int]) -> tuple[list[int], int, tuple[int, ...], list[int]] | str:
    """(the sizes of ``xv`` less its size-1 dims with the reduced ``dims`` as one, where that extent starts, the
    strides of that view, the kept sizes after it), or why there is no such view: the reduced dims not adjacent,
    or not one extent in memory."""
    shape = tuple(xv.shape)
    big = [d for d in range(len(shape)) if shape[d] != 1]  # size-1 dims are dropped by the view
    red = [d for d in big if d in dims]
    pos = [big.index(d) for d in red]
    if pos != list(range(pos[0], pos[0] + len(pos))):
        return f"reduces dims {dims} of {shape}: not adjacent, so not one extent to split"
    at, extent = pos[0], math.prod(shape[d] for d in dims)
    sizes = [shape[d] for d in big]
    kept_after = sizes[at + len(pos) :]
    try:  # the reduced dims as one dim (then every (S, L/S) split of it is a view too)
        strides = xv.view(*sizes[:at], extent, *kept_after).stride()
    except (RuntimeError, ValueError):  # a fake tensor says ValueError
        return f"dims {dims} of {shape} at strides {tuple(xv.stride())}: not one extent without a copy"
    return sizes, at, strides, kept_after


def _accumulator(node: fx.Node, x: torch.Tensor, out: torch.Tensor) -> torch.dtype:
    """The dtype stage 1 reads and its partials hold: float64 for float64 results, float32 for every other float
    (amax/amin of half inputs too: exact both ways), the input's own for any."""
    if node.target in ANYS:
        return x.dtype
    if node.target in EXTREMA:
        return torch.float32 if x.dtype in HALF else x.dtype
    return torch.float64 if out.dtype == torch.float64 else torch.float32


def rewrite(graph: fx.Graph, node: fx.Node, split: Split) -> fx.Node:
    """Replace ``node`` by the two stages of ``split``; returns the node standing for its value."""
    x, out = node.args[0], node.meta["val"]
    acc, inner, outer = _accumulator(node, x.meta["val"], out), [split.at + 1], [split.at]
    with graph.inserting_before(node):
        source = x if split.permute is None else call_with_meta(graph, aten.permute.default, (x, list(split.permute)))
        view = read = call_with_meta(graph, aten.view.default, (source, list(split.view_shape)))
        if x.meta["val"].dtype != acc:  # an exact upcast, as sum(dtype=float32) reads; one op more makes a lone
            read = call_with_meta(graph, prims.convert_element_type.default, (view, acc))  # reduction a region
        if node.target in EXTREMA:
            p = call_with_meta(graph, node.target, (read, inner))
            value = stage2 = call_with_meta(graph, node.target, (p, outer))
        elif node.target in ANYS:
            p = call_with_meta(graph, aten.any.dim, (read, inner[0]))
            value = stage2 = call_with_meta(graph, aten.any.dim, (p, outer[0]))
        else:  # sum, mean: float32 (float64) partials, one rounding to the result at the end
            p = call_with_meta(graph, aten.sum.dim_IntList, (read, inner))
            value = stage2 = call_with_meta(graph, aten.sum.dim_IntList, (p, outer))
            if node.target in MEANS:
                value = call_with_meta(graph, aten.div.Tensor, (value, split.extent))
        if value.meta["val"].dtype != out.dtype:  # the result's rounding, once (amax/amin: exact)
            value = call_with_meta(graph, prims.convert_element_type.default, (value, out.dtype))
        if tuple(value.meta["val"].shape) != tuple(out.shape):  # keepdim, or size-1 dims the view dropped
            value = call_with_meta(graph, aten.view.default, (value, list(out.shape)))
    for n in {source, view, read, p, value} - {x}:  # the split's own nodes (the permute too, if any)
        n.meta["split_reduction"] = node.name
    for n in (p, stage2):  # each stage a generated kernel even alone (a float32 input's stage 1, a bare stage 2)
        n.meta[OWN_KERNEL] = True
    node.replace_all_uses_with(value)
    graph.erase_node(node)
    return value


def split_reductions(gm: fx.GraphModule, note: Callable[..., None], target: int | None = None) -> int:
    """Phase 9's pass ``split_reductions``: every sum, mean, amax, amin or any with too few outputs to fill a GPU
    over a long extent (module docstring) becomes a stage-1 reduction of a ``(S, L/S)`` view to S partials per
    output and a stage-2 reduction of the partials. ``note(pass, nodes, action, why)`` gets every split and every
    candidate refused, with its reason. Returns how many were split."""
    count = 0
    for node in list(gm.graph.nodes):
        if node.op != "call_function" or (node.target not in SPLIT and node.target not in REFUSED):
            continue
        plan = plan_split(node, target)
        if plan is None:
            continue
        if isinstance(plan, str):
            note("split reductions", [node.name], "kept", plan)
            continue
        value = rewrite(gm.graph, node, plan)
        walk = "columns" if plan.column else "rows"
        note("split reductions", [node.name, value.name], "split",
             f"{plan.programs} program(s) of {walk} over {plan.extent}: S = {plan.splits} partials each")  # fmt: skip
        count += 1
    if count:
        relint(gm)
    return count


SPLIT_REDUCTIONS = Pass(
    "split_reductions",
    noted(split_reductions),
    doc="few outputs over a long extent (CUDA): two reductions, float32 partials (fusion.compiler.split_reductions)",
    requires=("codegen",),  # the gain is stage 1 as a generated kernel; without codegen, two aten reductions
)
