"""The Triton renderer: a kernel IR record (``fusion.ir.kernel_ir``) -> one ``@triton.jit`` kernel and the facts its
launch needs (``triton_launch.Launch``), the renderer of GPU kernels beside ``fusion.kernels.c_render`` (CPU kernels). The
runtime (``fusion.kernels.triton_runtime``) launches the source from data alone.

* The ops: Phase 8's learner spells :data:`LESSON_OPS` (``fusion/codegen.py``'s ``triton_expr``, handed to
  :func:`render` by the compiler); :data:`CODE_FOR_OP` holds the rest: conversions (anything -> bool is ``!= 0``),
  an exactly rounded division (``exact_div``: a mean, a variance; ``tl.math.div_rn`` for float32, where a GPU's
  ``/`` is within 2 ulp), roundings to a half type by ``.to(tl.float16/bfloat16).to(tl.float32)`` (the runtime makes the interpreter's
  bfloat16 conversion exact), integer floor division and remainder with torch's signs whatever ``//`` and ``%``
  round to (the GPU truncates, the interpreter's numpy floors: both corrected), ``rand`` as
  ``triton_lang.RAND_FUNCTION`` (bit for bit ``tl.rand``), ``fma`` as ``tl.fma``.
* A pointwise kernel: XBLOCK lanes of a flat index over the kernel's loops (already in the output's memory order,
  the innermost contiguous), split into the loop variables with ``//`` and ``%`` (Phase 8's ``split_index``),
  masked by ``xindex < numel``; an offset that is the walk itself is ``xindex``. A transposed walk (a copy of
  ``k.mT``: ``ir_loops.transposed``) is a tile instead: XBLOCK rows (``xindex``) along which its load reads
  neighbouring addresses by RBLOCK lanes (``rindex``, at most ``ir_loops.TILE_LANES``) along which the stores write
  them, the innermost loop split into blocks of lanes by ``ir_loops.tile``; Triton moves the tile between the two
  layouts through shared memory (Inductor tiles such copies the same way). Loaded in the output's order, each
  lane of a warp read its own sector: T5's key transposes took 20 us alone on an H200, its other copies 9.
* A reduction kernel: XBLOCK rows a program (``xindex``, a column) by RBLOCK lanes of a row (``rindex``). A row that
  fits one block is reduced in registers (one ``tl.reduce``); a longer one in a loop over blocks per
  :class:`~fusion.ir.kernel_ir.ReduceLoop`, folding XBLOCK x RBLOCK partials (sum from +0.0, max/min propagating
  NaN), then one ``tl.reduce``; what a row needs after a fold is computed again in the next loop (the IR says so).
  Walks that need nothing of each other are one loop (``ir_loops.one_walk``): a bias gradient's sum and the values
  it sums stored (GELU's backward) read the inputs once, not once a walk.
  A column walk (``x.sum(0)``: the innermost kept loop contiguous in memory) is the same tile with the rows as the
  neighbouring addresses: XBLOCK >= 16 of them a program, short blocks of a row.
* Block sizes and warps: :func:`~fusion.kernels.triton_launch.launch_facts` (the table of ``triton_launch``).
* Offsets are int32 unless some index can reach 2**31 (then the flat index is int64, so every product is).
"""

from __future__ import annotations

import functools
import math
import os
import re
from collections import Counter

from fusion.ir import kernel_ir as ir
from fusion.kernels import triton_launch
from fusion.kernels.ir_loops import coalesce, cse, one_walk, tile
from fusion.kernels.triton_lang import COMBINE_FUNCTIONS, RAND_FUNCTION, TANH_SERIES
from fusion.kernels.triton_launch import Launch, launch_facts

TL = {"bool": "tl.int1", "uint8": "tl.uint8", "int8": "tl.int8", "int16": "tl.int16", "int32": "tl.int32",
      "int64": "tl.int64", "float16": "tl.float16", "bfloat16": "tl.bfloat16", "float32": "tl.float32",
      "float64": "tl.float64"}  # fmt: skip


def _floating(d: str) -> bool:
    return d in ("float16", "bfloat16", "float32", "float64")


def divide(a: str, b: str, d: str) -> str:
    """``a / b`` rounded as IEEE (and eager) round it: Triton's ``/`` of float32 is an approximation on a GPU."""
    return f"tl.math.div_rn({a}, {b})" if d == "float32" else f"({a} / {b})"


def tanh(x: str, d: str) -> str:
    """tanh of ``x`` (dtype ``d``) to its relative accuracy everywhere: 1 - 2e / (1 + e), e = exp(-2|x|), and near 0
    its Taylor series (``1 - e`` cancels there: 2 * sigmoid(2x) - 1 loses every digit of tanh(1e-6)). Not (1 - e) /
    (1 + e): near saturation ``1 - e`` rounds to 1 and the quotient is 1.0 where tanh is one ulp below it."""
    e = f"tl.exp(-2.0 * tl.abs({x}))"
    big = f"tl.where({x} < 0, -1.0, 1.0) * (1.0 - 2.0 * {e} / (1.0 + {e}))"
    series = "0.0"
    for c in reversed(TANH_SERIES):
        series = f"({c!r} + {x} * {x} * {series})"
    return f"tl.where(tl.abs({x}) < {0.05 if d == 'float64' else 0.55}, {x} * (1.0 + {x} * {x} * {series}), {big})"


def _to(a, d, ad):
    if d == "bool":
        return a[0] if ad[0] == "bool" else f"({a[0]} != 0)"
    x = f"tl.where({a[0]}, 1, 0)" if ad[0] == "bool" else a[0]
    return f"{x}.to({TL['float32' if d in ('float16', 'bfloat16') else d]})"


def _floordiv(a, d, ad):
    x, y = a
    if not _floating(d):  # q rounded either way by //: one step down where the remainder's sign is not y's
        return f"({x} // {y} - tl.where(({x} % {y} != 0) & (({x} % {y} < 0) != ({y} < 0)), 1, 0)).to({TL[d]})"
    m = f"({x} % {y})"  # fmod; then c10's div_floor_floating
    q = f"({divide(f'({x} - {m})', y, d)} - tl.where(({m} != 0) & (({y} < 0) != ({m} < 0)), 1.0, 0.0))"
    f = f"(tl.floor({q}) + tl.where({q} - tl.floor({q}) > 0.5, 1.0, 0.0))"
    return f"tl.where({y} == 0, {divide(x, y, d)}, tl.where({q} != 0, {f}, {divide(x, y, d)} * 0.0))"


def _truncdiv(a, d, ad):
    if _floating(d):
        return _trunc([divide(a[0], a[1], d)], d, ad)
    x, y = a
    return f"({x} // {y} + tl.where(({x} % {y} != 0) & (({x} % {y} < 0) != ({x} < 0)), 1, 0)).to({TL[d]})"


def _remainder(a, d, ad):
    m = f"({a[0]} % {a[1]})"  # C's (and fmod's) sign on a GPU, numpy's in the interpreter: moved to the divisor's
    return f"tl.where(({m} != 0) & (({m} < 0) != ({a[1]} < 0)), {m} + {a[1]}, {m})"


def _trunc(a, d, ad):
    return f"tl.where({a[0]} < 0, tl.ceil({a[0]}), tl.floor({a[0]}))" if _floating(d) else a[0]


def _sign(a, d, ad):
    x = a[0]
    return f"(tl.where({x} > 0, 1, 0) - tl.where({x} < 0, 1, 0)).to({TL[d]})"  # torch's: sign(nan) is 0


def _f(fmt: str):
    return lambda a, d, ad: fmt.format(*a)


# The ops Phase 8's learner spells (``fusion/codegen.py``'s ``triton_expr``, handed to :func:`render`): arithmetic,
# math, comparisons, logic, where. The machinery spells the rest: conversions and roundings, integer division with
# torch's signs, the Philox counter, fma.
LESSON_OPS = frozenset({
    "identity", "neg", "abs", "exp", "log", "sqrt", "rsqrt", "erf", "sin", "cos", "sigmoid", "tanh", "reciprocal",
    "relu", "logical_not", "add", "sub", "mul", "truediv", "maximum", "minimum", "pow", "eq", "ne", "lt", "le", "gt",
    "ge", "and", "or", "bitwise_and", "bitwise_or", "where",
})  # fmt: skip
# IR op -> Triton expression: (operands, the op's dtype, the operands' dtypes) -> source.
CODE_FOR_OP = {
    "ceil": lambda a, d, ad: f"tl.ceil({a[0]})" if _floating(d) else a[0],
    "floor": lambda a, d, ad: f"tl.floor({a[0]})" if _floating(d) else a[0],
    "trunc": _trunc, "sign": _sign, "to": _to,
    "round_float16": _f("{0}.to(tl.float16).to(tl.float32)"), "round_bfloat16": _f("{0}.to(tl.bfloat16).to(tl.float32)"),
    "truncdiv": _truncdiv, "floordiv": _floordiv, "remainder": _remainder,
    "fma": _f("tl.fma({0}, {1}, {2})"),
    "exact_div": lambda a, d, ad: divide(a[0], a[1], d),  # a mean of equal values is the value, as eager's
    "rand": _f("_philox_rand({0}, {1})"),  # tl.rand's bits (triton_lang.RAND_FUNCTION)
}  # fmt: skip
assert set(CODE_FOR_OP) | LESSON_OPS == ir.OPS and not set(CODE_FOR_OP) & LESSON_OPS, sorted(ir.OPS)

MAXIMUM = "tl.where({0} != {0}, {0}, tl.where({0} > {1}, {0}, {1}))"  # a fold's step: NaN wins
MINIMUM = "tl.where({0} != {0}, {0}, tl.where({0} < {1}, {0}, {1}))"
IDENTITY = {"sum": "0.0", "max": 'float("-inf")', "min": 'float("inf")'}  # what masked lanes hold
STEP = {"sum": "{0} + {1}", "max": MAXIMUM, "min": MINIMUM}  # a looped fold's partials, block by block


@functools.cache
def _combine(op: str) -> str:
    """The function a fold's last ``tl.reduce`` names: a sum Triton's own ``_sum_combine`` where it has one (the
    interpreter then sums with numpy's pairwise sum, as eager's CPU sum), max/min ours (NaN propagates)."""
    if op != "sum":
        return {"max": "_maximum", "min": "_minimum"}[op]
    try:
        import triton.language as tl
    except ImportError:
        return "_add"
    return "tl.standard._sum_combine" if hasattr(tl.standard, "_sum_combine") else "_add"


def literal(value: object, dtype: str) -> str:
    """A constant as a 0-d Triton value of its dtype (a bare literal would be a float32 or an int32)."""
    if dtype == "bool":
        return f"tl.full([], {int(bool(value))}, tl.int1)"
    if _floating(dtype):
        v = float(value)
        return f"tl.full([], {repr(v) if math.isfinite(v) else f'float({str(v)!r})'}, {TL[dtype]})"
    return f"tl.full([], {int(value)}, {TL[dtype]})"


def index_source(e: ir.Affine) -> str:
    """An index in Triton, every ``//`` and ``%`` of its own operand parenthesised (every value >= 0: they round
    alike on a GPU and in the interpreter's numpy)."""

    def atom(a) -> str:
        if isinstance(a, ir.Var):
            return a.name
        return f"(({index_source(a.of)}) {'//' if isinstance(a, ir.FloorDiv) else '%'} {a.by})"

    terms = [atom(a) if c == 1 else f"{c}*{atom(a)}" for c, a in e.terms]
    return " + ".join(terms + [str(e.const)] * bool(e.const or not terms))


def _top(e: ir.Affine, sizes: dict[str, int]) -> int:
    """The largest value of ``e`` over the loops (every coefficient and index >= 0)."""
    out = e.const
    for k, a in e.terms:
        out += k * (sizes[a.name] - 1 if isinstance(a, ir.Var) else _top(a.of, sizes) // a.by if
                    isinstance(a, ir.FloorDiv) else min(a.by - 1, _top(a.of, sizes)))  # fmt: skip
    return out


def walked(loops: tuple[ir.Loop, ...]) -> frozenset:
    """The terms of the flat position over ``loops`` (outermost first) at their contiguous strides."""
    terms, inner = set(), 1
    for lp in reversed(loops):
        terms.add((inner, ir.Var(lp.var)))
        inner *= lp.size
    return frozenset(terms)


# Streaming loads marked evict_first (Writer.eviction); $FUSION_EVICT_FIRST=0 renders every load with the default
# policy (an A/B on a GPU: scripts/gpu_reductions.py, scripts/gpu_profile_models.py in two processes)
EVICT_FIRST = os.environ.get("FUSION_EVICT_FIRST", "1") != "0"


class _Writer:
    def __init__(self, k: ir.Kernel, launch: Launch, expr, split) -> None:
        self.k, self.launch, self.expr, self.split = k, launch, expr, split
        self.buffers = {b.name: b for b in k.buffers}
        self.reduction, self.tiled = k.kind == "reduction", launch.tiled
        rows, lanes = (k.loops[:-1], k.loops[-1:]) if self.tiled else (k.loops, k.reduce_loops)
        self.rows, self.lanes = rows, lanes  # the loops a program's rows (x) and lanes (r) walk
        self.kept, self.red = {lp.var for lp in rows}, {lp.var for lp in lanes}
        self.dtypes: dict[str, str] = {}
        self.level: dict[str, frozenset[str]] = {}  # value -> the axes it varies along: "x" (rows/lanes), "r"
        self.alias: dict[str, str] = {}  # a value computed again -> the value it repeats (one load, one op)
        self.seen: list[dict] = [{}]  # statement key -> value, per scope (a looped reduction's loop: its own)
        self.lines: list[str] = []
        self.split_lines: dict[int, str] = {}  # line number -> the loop variable it defines
        # the flat indices themselves: an offset that walks the loops at their own contiguous strides is xindex
        self.flats = {walked(rows): "xindex", walked(lanes): "rindex"}
        self.flats.pop(frozenset(), None)
        self.loads = Counter(s.buffer for s in k.statements() if isinstance(s, ir.Load))  # buffer -> its loads

    def index(self, e: ir.Affine) -> str:
        """``e`` in Triton: ``xindex`` (``rindex``) where it is the walk's own flat position, else its terms."""
        flat = self.flats.get(frozenset(e.terms))
        return index_source(e) if flat is None else flat + (f" + {e.const}" if e.const else "")

    def emit(self, line: str, depth: int) -> None:
        self.lines.append("    " * depth + line)

    def ref(self, name: str) -> str:
        return self.alias.get(name, name)

    def axes(self, e: ir.Affine) -> frozenset[str]:
        v = e.variables()
        return frozenset(("x",) * bool(v & self.kept) + ("r",) * bool(v & self.red))

    def address(self, buf: str, offset: ir.Affine, need: frozenset[str], guard: str | None) -> tuple[str, str]:
        """(pointer, mask) of a load or store: the pointer spans the axes its offset, its value or its guard vary
        along (a constant offset: every lane the one element), masked to the rows and lanes that exist."""
        have = self.axes(offset)
        need = need | have or frozenset("x")
        text = f"{buf} + ({self.index(offset)})" + "".join(f" + 0 * {a}index" for a in "xr" if a in need - have)
        mask = "xmask & rmask" if need == {"x", "r"} else "rmask" if need == {"r"} else "xmask"
        return text, mask + (f" & {guard}" if guard else "")

    def eviction(self, s: ir.Load) -> str:
        """Inductor's rule, its streaming half: in a reduction kernel, a coalesced load that varies along every axis
        the kernel walks (each program its own elements), of a buffer this kernel loads nowhere else, reads each
        element once; ``evict_first`` lets those lines leave L2 first. A long-row sum of 64 x 262,144 bf16 on an
        H200: 12.7 -> 12.0 us a call, column sums 2-10 % faster, three models' GPU time unchanged
        (docs/measurements.md). A load every program repeats (a LayerNorm's weight: broadcast along the rows), a
        gathered one, or a buffer a later loop reads again keeps the default policy."""
        if not EVICT_FIRST or not self.reduction or s.indirect or self.loads[s.buffer] > 1:
            return ""
        if self.axes(s.offset) != (frozenset("xr") if self.kept else frozenset("r")):
            return ""
        loops = self.kept | self.red
        coalesced = any(c == 1 and isinstance(a, ir.Var) and a.name in loops for c, a in s.offset.terms)
        return ", eviction_policy='evict_first'" if coalesced else ""

    def define(self, s, out: str, dtype: str, expr: str, level: frozenset[str], key: tuple, depth: int) -> None:
        self.dtypes[out], self.level[out] = dtype, level
        for scope in reversed(self.seen):
            if key in scope:
                self.alias[out] = scope[key]
                return
        self.seen[-1][key] = out
        self.emit(f"{out} = {expr}", depth)

    def statement(self, s, depth: int) -> None:
        if isinstance(s, ir.Load):
            b, guard = self.buffers[s.buffer], s.mask and self.ref(s.mask)
            at = [(self.ref(v), n, st) for v, n, st in s.indirect]
            need = self.axes(s.offset) | (self.level[guard] if guard else frozenset())
            need = need.union(*(self.level[v] for v, _, _ in at))
            ptr, mask = self.address(s.buffer, s.offset, need, guard)
            for v, n, st in at:  # a computed index: checked (eager's IndexError), read at 0 where it is outside
                inside = f"({v} >= 0) & ({v} < {n})"
                self.emit(f'tl.device_assert(({inside}) | ~({mask}), "index out of range")', depth)
                ptr += f" + tl.where({inside}, {v}, 0) * {st}"
            load = f"tl.load({ptr}, mask={mask}{', other=0' if guard else ''}{self.eviction(s)})"
            if TL[b.dtype] != TL[s.dtype]:
                load += f".to({TL[s.dtype]})"
            level = (need or frozenset("x")) if self.reduction or self.tiled else frozenset("x")
            key = ("load", s.buffer, s.offset, s.dtype, guard, tuple(at))
            self.define(s, s.out, s.dtype, load, level, key, depth)
        elif isinstance(s, ir.Index):
            level = self.axes(s.expr)
            expr = self.index(s.expr) if level else f"tl.full([1], {s.expr.const}, tl.int64)"
            self.define(s, s.out, "int64", expr, level, ("index", s.expr), depth)
        elif isinstance(s, ir.Const):
            key = ("const", repr(s.value), type(s.value), s.dtype)
            self.define(s, s.out, s.dtype, literal(s.value, s.dtype), frozenset(), key, depth)
        elif isinstance(s, ir.Op):
            args = [self.ref(a) for a in s.args]
            if s.op in LESSON_OPS:
                expr = self.expr(s.op, args, s.dtype)
            else:
                expr = CODE_FOR_OP[s.op](args, s.dtype, [self.dtypes[a] for a in args])
            level = frozenset().union(*(self.level[a] for a in args))
            self.define(s, s.out, s.dtype, expr, level, ("op", s.op, tuple(args), s.dtype), depth)
        elif isinstance(s, ir.Store):
            b, v = self.buffers[s.buffer], self.ref(s.value)
            vd = self.dtypes[v]
            if b.dtype == "bool" and vd != "bool":
                v = f"({v} != 0)"
            elif TL[b.dtype] != TL[vd]:
                v = f"{v}.to({TL[b.dtype]})"
            ptr, mask = self.address(s.buffer, s.offset, self.level[self.ref(s.value)], None)
            self.emit(f"tl.store({ptr}, {v}, mask={mask})", depth)
        elif isinstance(s, ir.ReduceLoop):
            self.reduce_loop(s, depth)
        else:
            raise TypeError(f"not a statement the Triton renderer takes: {s!r}")

    def splits(self, flat: str, loops: tuple[ir.Loop, ...], depth: int) -> None:
        """``x1 = xindex // 64``, ``x0 = xindex % 64``: one variable per loop (outermost first) of the flat index,
        as Phase 8's ``split_index`` splits it."""
        if not loops:
            return
        exprs = [e for _, e in self.split(flat, [lp.size for lp in loops])]
        for lp, expr in zip(loops, exprs, strict=True):
            self.emit(f"{lp.var} = {expr}", depth)
            self.split_lines[len(self.lines) - 1] = lp.var

    def used_lines(self) -> list[str]:
        """The lines, less the loop variables no other line reads (an offset that is the flat index itself)."""
        text = "\n".join(ln for i, ln in enumerate(self.lines) if i not in self.split_lines)
        used = set(re.findall(r"\b[xr]\d+\b", text))
        return [ln for i, ln in enumerate(self.lines) if i not in self.split_lines or self.split_lines[i] in used]

    def fold(self, f: ir.Reduce, value: str) -> str:
        return f"tl.where(rmask, {value}, {IDENTITY[f.op]})"

    def reduce_out(self, f: ir.Reduce, values: str, depth: int) -> None:
        self.dtypes[f.out], self.level[f.out] = f.dtype, frozenset("x")
        plus = " + 0.0" if f.op == "sum" else ""  # eager's sum starts at +0.0: a row of -0.0 sums to +0.0
        self.emit(f"{f.out} = tl.reduce({values}, 1, {_combine(f.op)})[:, None]{plus}", depth)

    def reduce_loop(self, loop: ir.ReduceLoop, depth: int) -> None:
        folds = [s for s in loop.body if isinstance(s, ir.Reduce)]
        if not self.launch.looped:  # the row in registers: the body once over the whole block
            for s in loop.body:
                if isinstance(s, ir.Reduce):
                    self.reduce_out(s, self.fold(s, self.ref(s.value)), depth)
                else:
                    self.statement(s, depth)
            return
        n = self.launch.rnumel
        for f in folds:
            self.emit(f"{f.out}_acc = tl.full([XBLOCK, RBLOCK], {IDENTITY[f.op]}, {TL[f.dtype]})", depth)
        self.emit(f"for roffset in range(0, {n}, RBLOCK):", depth)
        self.emit("rindex = roffset + tl.arange(0, RBLOCK)[None, :]", depth + 1)
        self.emit(f"rmask = rindex < {n}", depth + 1)
        self.splits("rindex", self.k.reduce_loops, depth + 1)
        self.seen.append({})
        for s in loop.body:
            if isinstance(s, ir.Reduce):
                acc = f"{s.out}_acc"
                self.emit(f"{s.out}_block = {self.fold(s, self.ref(s.value))}", depth + 1)
                self.emit(f"{acc} = {STEP[s.op].format(acc, f'{s.out}_block')}", depth + 1)
            else:
                self.statement(s, depth + 1)
        self.seen.pop()
        for f in folds:
            self.reduce_out(f, f"{f.out}_acc", depth)

    def source(self) -> str:
        k, launch = self.k, self.launch
        sizes = {lp.var: lp.size for lp in (*k.loops, *k.reduce_loops)}
        exprs = [s.offset for s in k.statements() if isinstance(s, (ir.Load, ir.Store))]
        exprs += [s.expr for s in k.statements() if isinstance(s, ir.Index)]
        wide = max([launch.numel * launch.rnumel, *(_top(e, sizes) for e in exprs)]) >= 2**31 - 1
        pid = "tl.program_id(0).to(tl.int64)" if wide else "tl.program_id(0)"
        two_d = self.reduction or self.tiled
        params = [b.name for b in k.buffers] + ["XBLOCK: tl.constexpr"] + ["RBLOCK: tl.constexpr"] * two_d
        self.emit(f"def {k.name}({', '.join(params)}):", 0)
        if self.tiled:
            n = launch.numel * launch.rnumel
            self.emit(f"# a transposed walk of {n} elements: XBLOCK rows of {launch.numel} (loads along them) by", 1)
            self.emit(f"# RBLOCK lanes of {launch.rnumel} (stores along them)", 1)
            self.emit(f"xindex = {pid} * XBLOCK + tl.arange(0, XBLOCK)[:, None]", 1)
        elif not self.reduction:
            self.emit(f"# pointwise over {[lp.size for lp in k.loops]}: {launch.numel} elements", 1)
            self.emit(f"xindex = {pid} * XBLOCK + tl.arange(0, XBLOCK)", 1)
        else:
            walk = f"{launch.numel} rows of {launch.rnumel}" + (" (a column walk)" if launch.column else "")
            self.emit(f"# XBLOCK rows per program: {walk}" + (", RBLOCK lanes at a time" if launch.looped else ""), 1)
            self.emit(f"xindex = {pid} * XBLOCK + tl.arange(0, XBLOCK)[:, None]", 1)
        self.emit(f"xmask = xindex < {launch.numel}", 1)
        self.splits("xindex", self.rows, 1)
        if two_d and not launch.looped:
            self.emit("rindex = tl.arange(0, RBLOCK)[None, :]", 1)
            self.emit(f"rmask = rindex < {launch.rnumel}", 1)
            self.splits("rindex", self.lanes, 1)
        for s in k.body:
            self.statement(s, 1)
        head = ["import triton", "import triton.language as tl", "", ""]
        head += [*COMBINE_FUNCTIONS, "", ""] if self.reduction else []
        head += RAND_FUNCTION if any(isinstance(s, ir.Op) and s.op == "rand" for s in k.statements()) else []
        jit = "@triton.jit(debug=True)" if k.checks_indices() else "@triton.jit"  # device_assert needs debug
        return "\n".join([*head, jit, *self.used_lines()]) + "\n"


def render(kernel: ir.Kernel, expr, split) -> tuple[str, Launch]:
    """(the Triton source of ``kernel``, the facts of its launch). ``expr(op, operands, dtype)`` spells the ops of
    :data:`LESSON_OPS` and ``split(flat, sizes)`` splits a flat index into one per loop (Phase 8's ``triton_expr``
    and ``split_index``, handed in by the compiler). Neighbouring loops every index walks as one range are merged
    first (``ir_loops.coalesce``: fewer ``//`` and ``%``), and a looped reduction's independent walks joined
    (``ir_loops.one_walk``, then ``ir_loops.cse``: a joined walk loads each element once, so its streaming loads
    are ``evict_first``); the launch facts are read before."""
    launch = launch_facts(kernel)
    walk = tile(coalesce(kernel)) if launch.tiled else coalesce(kernel)
    walk = cse(one_walk(walk)) if launch.looped and triton_launch.JOIN_WALKS else walk  # a walk reads memory again
    return _Writer(walk, launch, expr, split).source(), launch
