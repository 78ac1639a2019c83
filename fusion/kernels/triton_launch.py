"""The launch facts of a Triton kernel rendered from the kernel IR (``fusion.kernels.triton_render``): block sizes
and warps from a table, read off the IR alone.

A pointwise program takes ``triton_lang.POINTWISE_BLOCK`` (1024) elements on a GPU and 4 warps (512 for a depthwise
window's many loads); a transposed walk (``ir_loops.transposed``: a copy of ``k.mT``) takes tiles of XBLOCK rows by
``ir_loops.TILE_LANES`` lanes, placed as a reduction's rows are. A reduction's RBLOCK is the row's power of two up to
:data:`MAX_RBLOCK` (a column walk's up to ``rows.COLUMN_RBLOCK``; longer rows loop in steps of MAX_RBLOCK / 4, a
longer column walk over the tile ``rows`` sets: wider for a sum of a half input, one fold a walk, 8 warps), XBLOCK
``ir.plan.rows_per_program`` and the warps ``ir.plan.row_warps``; the interpreter takes larger blocks (each program
costs it ~1 ms of Python); ``ir.plan.launch_grid`` makes the grid (the runtime's plan and :class:`Launch` alike).
"""

from __future__ import annotations

import math
import os
from dataclasses import dataclass

from fusion.ir import kernel_ir as ir
from fusion.ir.plan import launch_grid, next_power_of_2, row_warps
from fusion.kernels.ir_loops import TILE_MIN, coalesce, coef, one_walk, tile, transposed
from fusion.kernels.rows import (
    COALESCED_ROWS,
    COLUMN_LOOP_RBLOCK,
    COLUMN_LOOP_WARPS,
    COLUMN_RBLOCK,
    WIDE_COLUMN_LOOP_ELEMENTS,
    WIDE_COLUMN_LOOP_RBLOCK,
)
from fusion.kernels.triton_lang import POINTWISE_BLOCK, WINDOW_BLOCK

MAX_RBLOCK = 16384  # the longest row held in registers whole (Triton's softmax tutorial); longer rows loop
# Transposed walks as tiles (ir_loops.transposed); $FUSION_TILE_TRANSPOSES=0 walks them flat (the A/B on a GPU)
TILE_TRANSPOSES = os.environ.get("FUSION_TILE_TRANSPOSES", "1") != "0"
# A column whose innermost kept loop is contiguous through a ``%`` (a cat's inputs side by side) walked as columns;
# False: only through plain terms, as before. Off, steps are slower (H200, 2026-11-29): ViT-B/16 0.85x, BERT 0.88x,
# GPT-2 0.95x, MaxViT-T 0.96x, Swin-T level (scripts/results/h200-2026-11-29-1028-walks/)
COLUMNS_THROUGH_MOD = True
# A looped reduction's independent walks joined into one loop (``ir_loops.one_walk``, done by the Triton renderer; its
# launch facts count the folds a joined walk holds). False: one loop a walk, as before. Off, steps are slower (H200,
# 2026-11-29): GPT-2 0.90x, MaxViT-T 0.89x, BERT 0.93x, ViT-B/16 and Swin-T level (h200-2026-11-29-1028-walks/)
JOIN_WALKS = True
# A column walk that stores row values beside its sum (GELU's backward with its bias gradient) takes the 64 x 64 tile,
# not the wide one swept for plain sums: GPT-2's tanh GELU kernel compiles to 167 registers a thread with the wide
# tile (one block of 8 warps an SM) and to 73 with 64 x 64 (three); ptxas, sm_90. Off until a GPU measures it
# (bash scripts/gpu_measure.sh tiles); the wide tile's kernel took 47 us a layer against Inductor's 28 in two
NARROW_STORING_WALKS = False


@dataclass(frozen=True)
class Launch:
    """What a launch of the rendered kernel needs besides its tensors (the IR's buffers, in call order): the
    elements (``numel``, pointwise) or rows (``numel``, reduction) the grid covers, a row's ``rnumel`` lanes in
    blocks of ``rblock`` (``looped``: a loop over blocks), a pointwise program's ``xblock`` elements on a GPU, the
    fewest rows a reduction program takes (``min_xblock``: a column walk's), and ``num_warps``. A ``tiled``
    pointwise kernel (a transposed walk) is launched as a reduction's rows are: ``numel`` rows of ``rnumel`` lanes."""

    name: str
    kind: str
    numel: int
    rnumel: int = 1
    rblock: int = 0
    looped: bool = False
    column: bool = False
    xblock: int = POINTWISE_BLOCK
    min_xblock: int = 1
    num_warps: int = 4
    elements: int = 0  # a reduction program's XBLOCK x RBLOCK on a GPU (0: plan.ELEMENTS_PER_PROGRAM)
    tiled: bool = False  # a transposed pointwise walk: rows by lanes (ir_loops.tile)

    def launch_config(self, cuda: bool) -> tuple[int, dict[str, int]]:
        """(programs, constexprs) on a GPU (``cuda``) or in the interpreter (see the module's docstring)."""
        return launch_grid(self.numel, self.rblock, cuda, self.xblock, self.min_xblock, self.elements)


def _step(e: ir.Affine, var: str) -> int:
    """How far offset ``e`` moves when loop variable ``var`` steps by one, away from the edges of its ``//`` and
    ``%`` runs: a plain term's coefficient; ``c * (a*var + ...) % n`` moves ``c * a`` (for ``n // a`` steps in a
    row, then wraps), ``(a*var + ...) // n`` moves 0 between its steps. A cat's ``x % 768`` along a column of 2304
    (three inputs' columns, side by side) is contiguous for 768 columns at a time."""
    mods = [(c, atom.of) for c, atom in e.terms if isinstance(atom, ir.Mod)] if COLUMNS_THROUGH_MOD else []
    return coef(e, var) + sum(c * coef(of, var) for c, of in mods)


def _column(k: ir.Kernel) -> bool:
    """``rows.Rows.of``'s column walk read off the IR: a row's elements scattered (a reduce loop's step above a
    kept loop's, the reduced dims not trailing or not contiguous) while the innermost kept loop is contiguous (steps
    by one, :func:`_step`: through a ``%`` too, runs of at least :data:`~fusion.kernels.rows.COALESCED_ROWS`) and
    at least COALESCED_ROWS long. The steps are the first load that walks the row."""
    loads = [t for s in k.body if isinstance(s, ir.ReduceLoop) for t in s.body if isinstance(t, ir.Load)]
    red = {lp.var for lp in k.reduce_loops}
    load = next((t for t in loads if t.offset.variables() & red), None)
    if load is None or not k.loops:
        return False
    rows_st = [(_step(load.offset, lp.var), lp.size) for lp in k.loops]
    lanes_st = [_step(load.offset, lp.var) for lp in k.reduce_loops]
    dims = [int(v[1:]) if v[1:].isdigit() else -1 for v in (lp.var for lp in (*k.loops, *k.reduce_loops))]
    trailing = max(dims[: len(k.loops)]) < min(dims[len(k.loops) :]) if k.reduce_loops else True
    if not (lanes_st and max(lanes_st) > min(st for st, _ in rows_st) and (trailing or lanes_st[-1] != 1)):
        return False
    inner = k.loops[-1].var
    runs = [a.by for _, a in load.offset.terms if isinstance(a, ir.Mod) and inner in a.of.variables()]
    return (
        rows_st[-1][0] == 1 and rows_st[-1][1] >= COALESCED_ROWS and min(runs, default=COALESCED_ROWS) >= COALESCED_ROWS
    )


def _half_sum(k: ir.Kernel) -> bool:
    """Does every fold of ``k`` sum, every tensor it reads hold 2-byte floats (a bf16 column sum, a bias gradient of
    a half GEMM's output), and each walk of the row as rendered (joined: :data:`JOIN_WALKS`) hold one fold (and, with
    :data:`NARROW_STORING_WALKS`, store no row values)? The wide tile keeps a float32 tile of 64 values a thread per
    fold in registers: swept on single sums, where a float32 sum's heavier tile already slowed it (``rows.py``); two
    sibling sums in one walk (a LayerNorm's weight and bias gradients) took all 255 registers of a thread and spilled
    (Swin-T's, compiled for sm_90 by ptxas)."""
    walks = [s for s in (one_walk(k) if JOIN_WALKS else k).body if isinstance(s, ir.ReduceLoop)]
    folds = [t for w in walks for t in w.body if isinstance(t, ir.Reduce)]  # joined or not, the same folds
    read = {t.buffer for t in k.statements() if isinstance(t, ir.Load)}
    dtypes = {b.dtype for b in k.buffers if b.name in read}
    one_fold = all(sum(isinstance(t, ir.Reduce) for t in w.body) <= 1 for w in walks)
    stores = NARROW_STORING_WALKS and any(isinstance(t, ir.Store) for w in walks for t in w.body)
    half = dtypes <= {"float16", "bfloat16"}
    return bool(folds and read) and all(f.op == "sum" for f in folds) and half and one_fold and not stores


def launch_facts(k: ir.Kernel) -> Launch:
    """The block sizes and warps of the table in the module's docstring for kernel ``k``."""
    numel = math.prod(lp.size for lp in k.loops)
    # a transposed walk: tiles of rows (along which its load reads neighbouring addresses) by lanes
    if k.kind != "reduction" and TILE_TRANSPOSES and transposed(walk := coalesce(k)):
        walk = tile(walk)
        rows, lanes = math.prod(lp.size for lp in walk.loops[:-1]), walk.loops[-1].size
        rblock = next_power_of_2(lanes)
        warps = row_warps(rows, rblock, TILE_MIN)
        return Launch(k.name, "pointwise", rows, lanes, rblock, min_xblock=TILE_MIN, num_warps=warps, tiled=True)
    if k.kind != "reduction":  # a depthwise window's many loads: 512 a program (triton_lang.pointwise_block)
        window = any(op.endswith("depthwise_conv2d.default") for op in k.ops)
        return Launch(k.name, "pointwise", numel, xblock=WINDOW_BLOCK if window else POINTWISE_BLOCK)
    rnumel, column = math.prod(lp.size for lp in k.reduce_loops), _column(k)
    rblock, block = next_power_of_2(rnumel), min(COLUMN_RBLOCK, MAX_RBLOCK) if column else MAX_RBLOCK
    looped, elements = rblock > block, 0
    if looped and column:  # the swept tiles of rows.py: 128 x 128 for a sum of a half input, else 64 x 64
        wide = _half_sum(k)
        rblock = WIDE_COLUMN_LOOP_RBLOCK if wide else COLUMN_LOOP_RBLOCK
        elements = WIDE_COLUMN_LOOP_ELEMENTS if wide else 0
    elif looped:
        rblock = max(MAX_RBLOCK // 4, 1)
    least = COALESCED_ROWS if column else 1
    warps = COLUMN_LOOP_WARPS if column and looped else row_warps(numel, rblock, least)
    return Launch(k.name, "reduction", numel, rnumel, rblock, looped, column, min_xblock=least, num_warps=warps,
                  elements=elements)  # fmt: skip
