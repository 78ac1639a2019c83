"""The C renderer: a kernel IR record (``fusion.ir.kernel_ir``) -> one C function, compiled by the system
compiler (``fusion.kernels.c_runtime``) and called through ctypes on CPU tensors.

* One table, ``fusion.kernels.c_ops.CODE_FOR_OP``: an IR op -> a C expression of its operands (tinygrad's
  ``code_for_op``), with the C types and literals; this module writes the loops around them.
* Loops: a pointwise kernel nests its loops outermost first, the innermost contiguous in memory (gcc vectorizes it:
  ``restrict`` pointers, no calls that alias); the outer loops are shared by OpenMP threads (``collapse``; a 1-D
  kernel is cut into blocks of :data:`BLOCK`); what reads no innermost variable (a per-channel gate) is computed
  once per step of the outer loops (``ir_loops.invariant``). A reduction kernel shares its rows; each row runs its reduce loops in
  order (softmax: max, then sum, then the stores), what reads no reduce variable computed once before the walk
  (``ir_loops.hoist``): a sum from +0.0 in blocks of :data:`ROW_SUM_BLOCK`, each in SIMD
  lanes of partial sums, the blocks' sums added pairwise (``omp simd reduction``: the one reassociation allowed, deterministic for a given binary),
  max/min sequentially from -inf/+inf. A column walk (``x.sum(0)``: strided rows, the innermost kept dim contiguous)
  runs in tiles of :data:`TILE` neighbouring columns, the reduced dims outside and the tile innermost (SIMD), with
  the same block sums down each column (:class:`_Columns`).
* exp, erf and tanh of float32 are inline, branch-free functions (within 1, 6 and 2 ulp; erf as at::vec's), so the
  loops that call them still vectorize; float64 calls libm.
* Numerics as the Triton path: float16/bfloat16 loaded and stored by bit conversion, rounding to nearest even (NaN to
  0x7E00 / 0x7FC0 as c10 does); the ops' own (integer division's signs, NaN through max/min) in ``c_ops``.
"""

from __future__ import annotations

import math

from fusion.ir import kernel_ir as ir
from fusion.kernels.c_ops import (
    C_TYPES,
    CODE_FOR_OP,
    RANGE_FLAG,
    REDUCE_INIT,
    REDUCE_STEP,
    STORAGE,
    index_source,
    literal,
)
from fusion.kernels.c_prelude import PRELUDE
from fusion.kernels.ir_loops import coalesce, cse, hoist, invariant, one_walk, prologue

BLOCK = 4096  # elements of a 1-D pointwise kernel per OpenMP chunk
SUM_BLOCK = 64  # elements down a column a sum folds one by one; the blocks' sums are then added pairwise
ROW_SUM_BLOCK = 256  # elements of a row a sum folds in SIMD lanes (16 a lane with AVX-512): fewer lane reductions
TILE = 256  # kept elements along the contiguous dim a column walk reduces together (a row of partial sums)
TILE_VAR = "cj"  # a column walk's position inside its tile
# Elements below which a kernel runs on one thread (forking costs more than it saves). A kernel that small gets no
# parallel region at all, rather than one whose if() is false: gcc outlines a parallel loop into a function of its
# own even so, which doubled the compile of a small kernel (-O3, gcc 12: 80 against 41 ms), and the call still
# entered libgomp.
PARALLEL_MIN = 32768
# float32 ops whose libm calls have vector versions (c_prelude.VECTOR_LIBM_DECLARATIONS)
VECTOR_LIBM_OPS = ("sin", "cos")


class _Writer:
    def __init__(self, kernel: ir.Kernel) -> None:
        self.k = kernel
        self.buffers = {b.name: b for b in kernel.buffers}
        self.dtypes: dict[str, str] = {}
        self.lines: list[str] = []
        self.tiled: set[str] = set()  # row-level values held as arrays over a column tile (_Columns)
        self.checked = kernel.checks_indices()
        self.bad = " reduction(|:fusion_bad)" if self.checked else ""  # every parallel or SIMD loop ORs its checks
        self.vector_libm = any(  # calls a libm function glibc's vector library has: see simd()
            isinstance(st, ir.Op) and st.op in VECTOR_LIBM_OPS and st.dtype == "float32" for st in kernel.body
        )

    def emit(self, line: str, depth: int) -> None:
        self.lines.append("    " * depth + line)

    def load(self, s: ir.Load) -> str:
        b = self.buffers[s.buffer]
        at = index_source(s.offset) + "".join(  # a computed index: read at 0 where it is outside (then reported)
            f" + {st}*((uint64_t){self.ref(v)} < {n}ULL ? {self.ref(v)} : 0)" for v, n, st in s.indirect
        )
        at = f"{s.buffer}[{at}]"
        raw = {"float16": f"fusion_h2f({at})", "bfloat16": f"fusion_bf2f({at})", "bool": f"({at} != 0)"}.get(
            b.dtype, at
        )
        return raw if C_TYPES[b.dtype] == C_TYPES[s.dtype] else f"(({C_TYPES[s.dtype]}){raw})"

    def ref(self, name: str) -> str:
        """A value as an operand: a row-level value of a column walk is an array over the tile (:class:`_Columns`)."""
        return f"{name}[{TILE_VAR}]" if name in self.tiled else name

    def define(self, out: str, dtype: str) -> str:
        return f"{out}[{TILE_VAR}]" if out in self.tiled else f"const {C_TYPES[dtype]} {out}"

    def statement(self, s, depth: int) -> None:
        if isinstance(s, ir.Load):
            self.dtypes[s.out] = s.dtype
            for v, n, _ in s.indirect:  # an index outside its dim: the kernel returns 1 (c_runtime raises IndexError)
                bad = f"((uint64_t){self.ref(v)} >= {n}ULL)"
                self.emit(f"fusion_bad |= {f'{self.ref(s.mask)} & ' if s.mask else ''}{bad};", depth)
            value = f"({self.ref(s.mask)} ? {self.load(s)} : ({C_TYPES[s.dtype]})0)" if s.mask else self.load(s)
            self.emit(f"{self.define(s.out, s.dtype)} = {value};", depth)  # (masked: not read)
        elif isinstance(s, ir.Index):
            self.dtypes[s.out] = "int64"
            self.emit(f"{self.define(s.out, 'int64')} = {index_source(s.expr)};", depth)
        elif isinstance(s, ir.Const):
            self.dtypes[s.out] = s.dtype
            self.emit(f"const {C_TYPES[s.dtype]} {s.out} = {literal(s.value, s.dtype)};", depth)
        elif isinstance(s, ir.Op):
            self.dtypes[s.out] = s.dtype
            expr = CODE_FOR_OP[s.op]([self.ref(a) for a in s.args], s.dtype, [self.dtypes[a] for a in s.args])
            self.emit(f"{self.define(s.out, s.dtype)} = {expr};", depth)
        elif isinstance(s, ir.Store):
            b = self.buffers[s.buffer]
            v = self.ref(s.value)
            conv = {"float16": f"fusion_f2h({v})", "bfloat16": f"fusion_f2bf({v})", "bool": f"(uint8_t)({v} != 0)"}
            self.emit(f"{s.buffer}[{index_source(s.offset)}] = {conv.get(b.dtype, f'({STORAGE[b.dtype]}){v}')};", depth)
        elif isinstance(s, ir.ReduceLoop):
            self.reduce_loop(s, depth)
        else:
            raise TypeError(f"not a statement of the kernel IR: {s!r}")

    def fold_levels(self, v: str, size: int, folds: list, d: int, at: str, line, block: int = SUM_BLOCK) -> None:
        """Close a block of a blocked sum and carry its partial ``<out>_p`` into the levels, a binary counter (level k
        holds the sum of 2^k blocks), then, after the last block, add the levels into ``<out>``. ``at``: a column
        walk's tile index (``[j]``, its lines written through ``line``: :meth:`_Columns.each`)."""
        self.emit("}", d + 1)
        self.emit(f"int64_t {v}_c = {v}_b / {block}, {v}_k = 0;", d + 1)
        self.emit(f"for (; {v}_c & 1; {v}_c >>= 1, {v}_k++) {{", d + 1)
        for f in folds:
            line(f"{f.out}_p{at} = {f.out}_l[{v}_k]{at} + {f.out}_p{at};", d + 2)
        self.emit("}", d + 1)
        for f in folds:
            line(f"{f.out}_l[{v}_k]{at} = {f.out}_p{at};", d + 1)
        self.emit("}", d)
        self.emit(f"for (int64_t {v}_k = 0, {v}_c = ({size} + {block - 1}) / {block}; {v}_c; {v}_k++, "
                  f"{v}_c >>= 1) {{", d)  # fmt: skip
        self.emit(f"if ({v}_c & 1) {{", d + 1)
        for f in folds:
            line(f"{f.out}{at} = {f.out}_l[{v}_k]{at} + {f.out}{at};", d + 2)
        self.emit("}", d + 1)
        self.emit("}", d)

    def reduce_loop(self, loop: ir.ReduceLoop, depth: int) -> None:
        """The loop over a row's elements. A sum folds blocks of :data:`ROW_SUM_BLOCK` elements of the innermost dim in
        SIMD lanes of partial sums and adds the blocks' sums pairwise (a binary counter of levels): small terms
        beside a large one are summed together first, as eager's cascade and a GPU's tree sum them. Max and min fold
        one by one."""
        folds = [s for s in loop.body if isinstance(s, ir.Reduce)]
        for f in folds:
            self.dtypes[f.out] = f.dtype
            self.emit(f"{C_TYPES[f.dtype]} {f.out} = {REDUCE_INIT[f.op]};", depth)
        self.emit("{", depth)
        d = depth + 1
        rloops = list(self.k.reduce_loops)
        blocked = bool(folds and rloops and all(f.op == "sum" for f in folds))
        for lp in rloops[:-1] if blocked else rloops:
            self.emit(f"for (int64_t {lp.var} = 0; {lp.var} < {lp.size}; {lp.var}++)", d)
        self.emit("{", d)
        d, acc = d + 1, {f.out: f.out for f in folds}
        if blocked:
            v, size = rloops[-1].var, rloops[-1].size
            for f in folds:  # block sums combined pairwise: level k holds the sum of 2^k blocks
                self.emit(f"{C_TYPES[f.dtype]} {f.out}_l[64];", d)
            self.emit(f"for (int64_t {v}_b = 0; {v}_b < {size}; {v}_b += {ROW_SUM_BLOCK}) {{", d)
            acc = {f.out: f"{f.out}_p" for f in folds}
            for f in folds:
                self.emit(f"{C_TYPES[f.dtype]} {acc[f.out]} = 0;", d + 1)
            self.emit(f"#pragma omp simd reduction(+:{', '.join(acc.values())}){self.bad}", d + 1)
            end = f"{v}_b + {ROW_SUM_BLOCK} < {size} ? {v}_b + {ROW_SUM_BLOCK} : {size}"
            self.emit(f"for (int64_t {v} = {v}_b; {v} < ({end}); {v}++) {{", d + 1)
        for s in loop.body:
            if isinstance(s, ir.Reduce):
                self.emit(REDUCE_STEP[s.op].format(acc=acc[s.out], v=s.value), d + 2 * blocked)
            else:
                self.statement(s, d + 2 * blocked)
        if blocked:
            self.fold_levels(v, size, folds, d, "", self.emit, ROW_SUM_BLOCK)
        self.emit("}", d - 1)
        self.emit("}", depth)

    def signature(self) -> int:
        """Open ``void <name>(buffers..., int nthreads) {`` (``int``: a kernel with indexed reads returns whether an
        index was outside its dim); the kernel's work (elements of all its loops)."""
        k = self.k
        shared = {name for pair in k.in_place for name in pair}  # one memory, two names: neither is restrict
        params = [f"{'' if b.output else 'const '}{STORAGE[b.dtype]} *{'' if b.name in shared else 'restrict '}{b.name}"
                  for b in k.buffers]  # fmt: skip
        self.emit(f"{'int' if self.checked else 'void'} {k.name}({', '.join([*params, 'int nthreads'])}) {{", 0)
        self.emit("(void)nthreads;", 1)
        if self.checked:
            self.emit(RANGE_FLAG, 1)
        return math.prod(lp.size for lp in (*k.loops, *k.reduce_loops))

    def prologue(self, body: list, loops: list[ir.Loop]) -> list:
        """Emit ``ir_loops.prologue``'s loop (values varying along the innermost loop only, into arrays
        ``<name>_s``); returns the body that reads them back through ``<name>_a``, a ``restrict`` pointer to the
        array (an array shared into an OpenMP region is read through the region's data record, where gcc stopped
        vectorizing a loop of 64 lanes that reads it: Llama's rotary ``sin``/``cos``)."""
        pre, arrays, rest = prologue(body, tuple(loops))
        if not arrays:
            return body
        inner = loops[-1]
        for s in arrays:
            dtype = getattr(s, "dtype", "int64")
            self.buffers[f"{s.out}_a"] = ir.Buffer(f"{s.out}_a", (inner.size,), (1,), dtype)
            self.emit(f"{C_TYPES[dtype]} {s.out}_s[{inner.size}];", 1)
        self.emit(f"for (int64_t {inner.var} = 0; {inner.var} < {inner.size}; {inner.var}++) {{", 1)
        for s in pre:
            self.statement(s, 2)
        for s in arrays:
            self.emit(f"{s.out}_s[{inner.var}] = {s.out};", 2)
        self.emit("}", 1)
        for s in arrays:
            ctype = C_TYPES[getattr(s, "dtype", "int64")]
            self.emit(f"const {ctype} *restrict {s.out}_a = {s.out}_s;", 1)
        return rest

    def parallel_for(self, loops: int, work: int) -> None:
        """The OpenMP pragma sharing the next ``loops`` loops (collapsed) over the threads, for a kernel of ``work``
        elements; none below :data:`PARALLEL_MIN` (that kernel runs on one thread)."""
        if work >= PARALLEL_MIN:
            collapse = f" collapse({loops})" if loops > 1 else ""
            self.emit(f"#pragma omp parallel for{collapse} num_threads(nthreads) if(nthreads > 1) schedule(static)"
                      f"{self.bad}", 1)  # fmt: skip

    def source(self) -> str:
        k, work = self.k, self.signature()
        loops, depth = list(k.loops), 1
        if k.kind == "pointwise" and len(loops) == 1:  # one loop: blocks of BLOCK elements shared by the threads
            (lp,) = loops
            self.parallel_for(1, work)
            self.emit(f"for (int64_t {lp.var}_o = 0; {lp.var}_o < {lp.size}; {lp.var}_o += {BLOCK}) {{", 1)
            self.emit(
                f"const int64_t {lp.var}_e = {lp.var}_o + {BLOCK} < {lp.size} ? {lp.var}_o + {BLOCK} : {lp.size};", 2
            )
            self.simd(2)
            self.emit(f"for (int64_t {lp.var} = {lp.var}_o; {lp.var} < {lp.var}_e; {lp.var}++) {{", 2)
            depth, closers, body = 3, [2, 1], list(k.body)
        else:
            shared = loops[:-1] if k.kind == "pointwise" else loops  # a pointwise kernel's innermost loop: SIMD
            body = self.prologue(list(k.body), loops) if k.kind == "pointwise" else list(k.body)
            if shared:
                self.parallel_for(len(shared), work)
            hoisted = []
            if k.kind == "pointwise" and shared and loops[-1].size > 0:  # once per step of the shared loops
                hoisted, body = invariant(body, {loops[-1].var})
            for i, lp in enumerate(loops[:-1] if hoisted else loops):
                if k.kind == "pointwise" and i == len(loops) - 1:
                    self.simd(1)
                self.emit(f"for (int64_t {lp.var} = 0; {lp.var} < {lp.size}; {lp.var}++)", 1)
            self.emit("{", 1)
            depth, closers = 2, [1]
            if hoisted:
                for s in hoisted:
                    self.statement(s, 2)
                inner = loops[-1]
                self.simd(2)
                self.emit(f"for (int64_t {inner.var} = 0; {inner.var} < {inner.size}; {inner.var}++) {{", 2)
                depth, closers = 3, [2, 1]
        for s in body:
            self.statement(s, depth)
        for d in closers:
            self.emit("}", d)
        return self.finish()

    def simd(self, depth: int) -> None:
        """``#pragma omp simd`` before a pointwise kernel's innermost loop where it calls a libm function that
        glibc's vector library has (float32 ``sin``, ``cos``: ``c_prelude.VECTOR_LIBM_DECLARATIONS``): gcc's
        auto-vectorizer does not call the vector versions by itself; the pragma asks it to (only where the
        compiler probe found libmvec, ``-DFUSION_LIBMVEC``: elsewhere the pragma changes nothing)."""
        if self.vector_libm:
            self.emit(f"#pragma omp simd{self.bad}", depth)

    def finish(self) -> str:
        """Close the function (a checked kernel returns its flag) and return the whole source."""
        if self.checked:
            self.emit("return fusion_bad;", 1)
        self.emit("}", 0)
        return PRELUDE + "\n" + "\n".join(self.lines) + "\n"


class _Columns(_Writer):
    """A column walk (``x.sum(0)``, a bias gradient: the innermost kept dim ``c`` is contiguous, a row is not): the
    kept dims but ``c`` and tiles of :data:`TILE` along ``c`` are shared by the threads; each tile folds its
    columns together, the reduced dims outside and ``c`` innermost (SIMD over neighbouring addresses). Every
    row-level value is an array over the tile. The numerics are the row walk's: a sum from +0.0 of blocks of
    :data:`SUM_BLOCK` elements of the innermost reduced dim, the blocks' sums added pairwise; max/min one by one."""

    @staticmethod
    def takes(k: ir.Kernel) -> bool:
        if k.kind != "reduction" or not k.loops or not k.reduce_loops:
            return False
        c, r = ir.Var(k.loops[-1].var), ir.Var(k.reduce_loops[-1].var)
        loads = [s for s in k.statements() if isinstance(s, ir.Load)]
        return any((1, c) in s.offset.terms for s in loads) and not any((1, r) in s.offset.terms for s in loads)

    def tile_loop(self, depth: int) -> None:
        self.emit(f"#pragma omp simd{self.bad}", depth)
        self.emit(f"for (int64_t {TILE_VAR} = 0; {TILE_VAR} < {self.c}_n; {TILE_VAR}++) {{", depth)
        self.emit(f"const int64_t {self.c} = {self.c}_o + {TILE_VAR};", depth + 1)

    def each(self, line: str, depth: int) -> None:
        self.emit(f"for (int64_t {TILE_VAR} = 0; {TILE_VAR} < {self.c}_n; {TILE_VAR}++) {line}", depth)

    def reduce_loop(self, loop: ir.ReduceLoop, depth: int) -> None:
        folds = [s for s in loop.body if isinstance(s, ir.Reduce)]
        for f in folds:
            self.dtypes[f.out] = f.dtype
            self.tiled.add(f.out)
            self.emit(f"{C_TYPES[f.dtype]} {f.out}[{TILE}];", depth)
            self.each(f"{f.out}[{TILE_VAR}] = {REDUCE_INIT[f.op]};", depth)
        rloops = list(self.k.reduce_loops)
        blocked = bool(folds and all(f.op == "sum" for f in folds))
        self.emit("{", depth)
        d = depth + 1
        for lp in rloops[:-1] if blocked else rloops:
            self.emit(f"for (int64_t {lp.var} = 0; {lp.var} < {lp.size}; {lp.var}++) {{", d)
            d += 1
        acc = {f.out: f"{f.out}[{TILE_VAR}]" for f in folds}
        if blocked:
            v, size = rloops[-1].var, rloops[-1].size
            levels = max(1, (-(-size // SUM_BLOCK)).bit_length())  # level k: 2^k blocks (small stacks: macOS's 512 KiB)
            for f in folds:
                self.emit(f"{C_TYPES[f.dtype]} {f.out}_l[{levels}][{TILE}];", d)
            self.emit(f"for (int64_t {v}_b = 0; {v}_b < {size}; {v}_b += {SUM_BLOCK}) {{", d)
            for f in folds:
                self.emit(f"{C_TYPES[f.dtype]} {f.out}_p[{TILE}];", d + 1)
                self.each(f"{f.out}_p[{TILE_VAR}] = 0;", d + 1)
            acc = {f.out: f"{f.out}_p[{TILE_VAR}]" for f in folds}
            end = f"{v}_b + {SUM_BLOCK} < {size} ? {v}_b + {SUM_BLOCK} : {size}"
            self.emit(f"for (int64_t {v} = {v}_b; {v} < ({end}); {v}++) {{", d + 1)
            d += 2
        self.tile_loop(d)
        for s in loop.body:
            if isinstance(s, ir.Reduce):
                self.emit(REDUCE_STEP[s.op].format(acc=acc[s.out], v=self.ref(s.value)), d + 1)
            else:
                self.statement(s, d + 1)
        self.emit("}", d)
        if blocked:
            d -= 2
            self.fold_levels(v, size, folds, d, f"[{TILE_VAR}]", self.each)
        for _ in rloops[:-1] if blocked else rloops:
            d -= 1
            self.emit("}", d)
        self.emit("}", depth)

    def source(self) -> str:
        k, work = self.k, self.signature()
        *outer, last = k.loops
        self.c = c = last.var
        # The tile's width: TILE, or narrower (a multiple of 8) where few tiles would not share out evenly over the
        # threads: a squeeze-excitation's mean over 112 x 112 pixels of 32 channels was one tile, one thread of two
        # busy; 672 channels three tiles, two on one thread. Then as many tiles as the next multiple of the threads.
        # Each column still sums its rows alone, in the same order: the same values for any width.
        n_outer, size = math.prod(lp.size for lp in outer), last.size
        self.emit(f"int64_t {c}_w = {TILE}, {c}_t = ({size}LL + {TILE - 1}) / {TILE};", 1)
        self.emit(
            f"if (nthreads > 1 && {n_outer}LL * {c}_t < 8LL * nthreads && ({n_outer}LL * {c}_t) % nthreads) {{", 1
        )
        self.emit(f"while (({n_outer}LL * {c}_t) % nthreads) {c}_t++;", 2)
        self.emit(f"{c}_w = (({size}LL + {c}_t - 1) / {c}_t + 7) / 8 * 8;", 2)
        self.emit(f"{c}_w = {c}_w < 8 ? 8 : {c}_w > {TILE} ? {TILE} : {c}_w;", 2)
        self.emit("}", 1)
        self.parallel_for(len(outer) + 1, work)
        for lp in outer:
            self.emit(f"for (int64_t {lp.var} = 0; {lp.var} < {lp.size}; {lp.var}++)", 1)
        self.emit(f"for (int64_t {c}_o = 0; {c}_o < {last.size}; {c}_o += {c}_w) {{", 1)
        self.emit(f"const int64_t {c}_n = {c}_o + {c}_w < {last.size} ? {c}_w : {last.size} - {c}_o;", 2)
        body, i = list(k.body), 0
        while i < len(body):
            s = body[i]
            if isinstance(s, ir.ReduceLoop):
                self.reduce_loop(s, 2)
            elif isinstance(s, ir.Const):
                self.statement(s, 2)
            else:  # consecutive row-level statements: one loop over the tile
                run = []
                while i < len(body) and not isinstance(body[i], (ir.ReduceLoop, ir.Const)):
                    run.append(body[i])
                    i += 1
                i -= 1
                for t in run:
                    if not isinstance(t, ir.Store):
                        dtype = "int64" if isinstance(t, ir.Index) else t.dtype
                        self.tiled.add(t.out)
                        self.emit(f"{C_TYPES[dtype]} {t.out}[{TILE}];", 2)
                self.tile_loop(2)
                for t in run:
                    self.statement(t, 3)
                self.emit("}", 2)
            i += 1
        self.emit("}", 1)
        return self.finish()


def render(kernel: ir.Kernel) -> str:
    """The C source of ``kernel``: the helpers, then ``void <name>(buffers..., int nthreads)``. Contiguous
    neighbouring loops are merged first (:func:`coalesce`). A column walk (a reduction whose rows are strided and
    whose innermost kept dim is contiguous) in tiles (:class:`_Columns`)."""
    kernel = hoist(cse(one_walk(coalesce(kernel))))
    return (_Columns if _Columns.takes(kernel) else _Writer)(kernel).source()
