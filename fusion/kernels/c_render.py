"""The C renderer: a kernel IR record (``fusion.compiler.kernel_ir``) -> one C function, compiled by the system
compiler (``fusion.kernels.c_runtime``) and called through ctypes on CPU tensors.

* One table, :data:`CODE_FOR_OP`: an IR op -> a C expression of its operands (tinygrad's ``code_for_op``). Adding a
  pointwise op is one line here (and one in the lowering).
* Loops: a pointwise kernel nests its loops outermost first, the innermost contiguous in memory (gcc vectorizes it:
  ``restrict`` pointers, no calls that alias); the outer loops are shared by OpenMP threads (``collapse``; a 1-D
  kernel is cut into blocks of :data:`BLOCK`). A reduction kernel shares its rows; each row runs its reduce loops in
  order (softmax: max, then sum, then the stores): a sum from +0.0 in blocks of :data:`SUM_BLOCK`, each in SIMD
  lanes of partial sums, the blocks' sums added pairwise (``omp simd reduction``: the one reassociation allowed, deterministic for a given binary),
  max/min sequentially from -inf/+inf.
* exp, erf and tanh of float32 are inline, branch-free functions (within 1, 6 and 2 ulp; erf as at::vec's), so the
  loops that call them still vectorize; float64 calls libm.
* Numerics as the Triton path: float16/bfloat16 loaded and stored by bit conversion, rounding to nearest even (NaN to
  0x7E00 / 0x7FC0 as c10 does); integer floor division and remainder with torch's signs (Python's), a zero divisor
  gives 0 instead of a crash (torch raises); NaN propagates through maximum/minimum/max/min; no fast-math anywhere.
"""

from __future__ import annotations

import math

from fusion.compiler import kernel_ir as ir

BLOCK = 4096  # elements of a 1-D pointwise kernel per OpenMP chunk
SUM_BLOCK = 64  # elements of a row a sum folds in SIMD lanes; the blocks' sums are then added pairwise
PARALLEL_MIN = 32768  # elements below which a kernel runs on one thread (forking costs more than it saves)

C_TYPES = {"bool": "bool", "uint8": "uint8_t", "int8": "int8_t", "int16": "int16_t", "int32": "int32_t",
           "int64": "int64_t", "float16": "float", "bfloat16": "float", "float32": "float", "float64": "double"}  # fmt: skip
STORAGE = {**C_TYPES, "bool": "uint8_t", "float16": "uint16_t", "bfloat16": "uint16_t"}

PRELUDE = r"""#include <stdint.h>
#include <stdbool.h>
#include <math.h>

typedef union { uint32_t u; float f; } fusion_bits;

/* float16 <-> float32, exact (F. Giesen's conversions): subnormals, inf and NaN included, ties to even. */
static inline float fusion_h2f(uint16_t h) {
    fusion_bits o, magic = {.u = 113u << 23};
    const uint32_t shifted = 0x7c00u << 13;
    o.u = (uint32_t)(h & 0x7fff) << 13;
    uint32_t exp = shifted & o.u;
    o.u += (uint32_t)(127 - 15) << 23;
    if (exp == shifted) o.u += (uint32_t)(128 - 16) << 23;
    else if (exp == 0) { o.u += 1u << 23; o.f -= magic.f; }
    o.u |= (uint32_t)(h & 0x8000) << 16;
    return o.f;
}
static inline uint16_t fusion_f2h(float f) {
    fusion_bits in = {.f = f}, infty = {.u = 255u << 23}, f16max = {.u = (127u + 16u) << 23};
    fusion_bits denorm = {.u = ((127u - 15u) + (23u - 10u) + 1u) << 23};
    uint32_t sign = in.u & 0x80000000u;
    uint16_t o;
    in.u ^= sign;
    if (in.u >= f16max.u) o = in.u > infty.u ? 0x7e00 : 0x7c00;
    else if (in.u < (113u << 23)) { in.f += denorm.f; o = (uint16_t)(in.u - denorm.u); }
    else { uint32_t odd = (in.u >> 13) & 1u; in.u += ((uint32_t)(15 - 127) << 23) + 0xfffu; in.u += odd; o = (uint16_t)(in.u >> 13); }
    return (uint16_t)(o | (sign >> 16));
}
/* bfloat16 <-> float32: the upper half of the bits, rounded to nearest even; NaN is 0x7FC0 (c10's). */
static inline float fusion_bf2f(uint16_t b) { fusion_bits o = {.u = (uint32_t)b << 16}; return o.f; }
static inline uint16_t fusion_f2bf(float f) {
    fusion_bits in = {.f = f};
    if (f != f) return 0x7fc0;
    return (uint16_t)((in.u + 0x7fffu + ((in.u >> 16) & 1u)) >> 16);
}
static inline float fusion_round_f16(float f) { return fusion_h2f(fusion_f2h(f)); }
static inline float fusion_round_bf16(float f) { return fusion_bf2f(fusion_f2bf(f)); }

/* exp for float32, vectorizable (within 1 ulp): n = round(x / ln 2) by the 1.5 * 2^23 trick (no float -> int
   conversion, NaN included), Cody-Waite reduction, Cephes' polynomial, 2^n applied in two halves (subnormal results
   rounded once); NaN in, NaN out; +-inf and overflow as expf. */
static inline float fusion_expf(float x) {
    float xx = x < -104.0f ? -104.0f : (x > 89.0f ? 89.0f : x);
    fusion_bits m = {.f = xx * 1.44269504088896341f + 12582912.0f};  /* n = round(x / ln 2) in the low bits */
    float n = m.f - 12582912.0f;
    float r = xx - n * 0.693359375f;
    r = r + n * 2.12194440e-4f;
    float p = 1.9875691500E-4f;
    p = p * r + 1.3981999507E-3f;
    p = p * r + 8.3334519073E-3f;
    p = p * r + 4.1665795894E-2f;
    p = p * r + 1.6666665459E-1f;
    p = p * r + 5.0000001201E-1f;
    float y = p * r * r + r + 1.0f;
    int32_t ni = (int32_t)(m.u - 0x4B400000u), n1 = ni >> 1, n2 = ni - n1;
    fusion_bits s1 = {.u = (uint32_t)(n1 + 127) << 23}, s2 = {.u = (uint32_t)(n2 + 127) << 23};
    return y * s1.f * s2.f;
}
/* erf for float32, vectorizable: its Taylor series below 0.5, Abramowitz & Stegun 7.1.26 above (|error| < 1.5e-7,
   the approximation at::vec's float erf uses). */
static inline float fusion_erff(float x) {
    float a = fabsf(x), z = x * x;
    float s = -1.0f / 75600.0f;
    s = s * z + 1.0f / 9360.0f;
    s = s * z - 1.0f / 1320.0f;
    s = s * z + 1.0f / 216.0f;
    s = s * z - 1.0f / 42.0f;
    s = s * z + 1.0f / 10.0f;
    s = s * z - 1.0f / 3.0f;
    s = s * z + 1.0f;
    float small = 1.1283791670955126f * x * s;
    float t = 1.0f / (1.0f + 0.3275911f * a);
    float p = 1.061405429f;
    p = p * t - 1.453152027f;
    p = p * t + 1.421413741f;
    p = p * t - 0.284496736f;
    p = p * t + 0.254829592f;
    float big = 1.0f - p * t * fusion_expf(-z);
    big = x < 0 ? -big : big;
    return a < 0.5f ? small : big;
}
/* tanh for float32, vectorizable: (1 - e) / (1 + e) with e = exp(-2|x|), and below 0.55 its Taylor series. */
static inline float fusion_tanhf(float x) {
    float a = fabsf(x), z = x * x;
    float s = -929569.0f / 638512875.0f;
    s = s * z + 21844.0f / 6081075.0f;
    s = s * z - 1382.0f / 155925.0f;
    s = s * z + 62.0f / 2835.0f;
    s = s * z - 17.0f / 315.0f;
    s = s * z + 2.0f / 15.0f;
    s = s * z - 1.0f / 3.0f;
    float small = x * (1.0f + z * s);  /* -0 stays -0 */
    float e = fusion_expf(-2.0f * a);
    float big = (1.0f - e) / (1.0f + e);
    big = x < 0 ? -big : big;
    return a < 0.55f ? small : big;
}
/* Integer division with torch's (Python's) signs; a zero divisor gives 0 (torch raises; a kernel cannot). */
static inline int64_t fusion_floordiv(int64_t a, int64_t b) {
    if (b == 0) return 0;
    if (b == -1) return (int64_t)(0 - (uint64_t)a);
    int64_t q = a / b;
    return (a % b != 0 && ((a < 0) != (b < 0))) ? q - 1 : q;
}
static inline int64_t fusion_truncdiv(int64_t a, int64_t b) {
    if (b == 0) return 0;
    if (b == -1) return (int64_t)(0 - (uint64_t)a);
    return a / b;
}
static inline int64_t fusion_remainder(int64_t a, int64_t b) {
    if (b == 0 || b == -1) return 0;
    int64_t r = a % b;
    return (r != 0 && ((r < 0) != (b < 0))) ? r + b : r;
}
/* Floating floor division and remainder as c10's div_floor_floating / remainder. */
static inline double fusion_floordiv_d(double a, double b) {
    if (b == 0) return a / b;
    double m = fmod(a, b), d = (a - m) / b;
    if (m != 0 && ((b < 0) != (m < 0))) d -= 1;
    if (d != 0) { double f = floor(d); if (d - f > 0.5) f += 1.0; return f; }
    return copysign(0.0, a / b);
}
static inline float fusion_floordiv_f(float a, float b) {
    if (b == 0) return a / b;
    float m = fmodf(a, b), d = (a - m) / b;
    if (m != 0 && ((b < 0) != (m < 0))) d -= 1;
    if (d != 0) { float f = floorf(d); if (d - f > 0.5f) f += 1.0f; return f; }
    return copysignf(0.0f, a / b);
}
static inline double fusion_remainder_d(double a, double b) {
    double m = fmod(a, b);
    return (m != 0 && ((b < 0) != (m < 0))) ? m + b : m;
}
static inline float fusion_remainder_f(float a, float b) {
    float m = fmodf(a, b);
    return (m != 0 && ((b < 0) != (m < 0))) ? m + b : m;
}
"""


def _floating(d: str) -> bool:
    return d in ("float32", "float64", "float16", "bfloat16")


def _math(name: str, d: str) -> str:
    return name + ("f" if d != "float64" else "")


def _one(d: str) -> str:
    return "1.0" if d == "float64" else "1.0f"


def _div(a, d, ad):
    if _floating(d):
        return f"({a[0]} / {a[1]})"
    return f"(({C_TYPES[d]})fusion_truncdiv({a[0]}, {a[1]}))"


def _floordiv(a, d, ad):
    if _floating(d):
        return f"fusion_floordiv_{'d' if d == 'float64' else 'f'}({a[0]}, {a[1]})"
    return f"(({C_TYPES[d]})fusion_floordiv({a[0]}, {a[1]}))"


def _remainder(a, d, ad):
    if _floating(d):
        return f"fusion_remainder_{'d' if d == 'float64' else 'f'}({a[0]}, {a[1]})"
    return f"(({C_TYPES[d]})fusion_remainder({a[0]}, {a[1]}))"


def _to(a, d, ad):
    if d == "bool":
        return f"({a[0]} != 0)"
    return f"(({C_TYPES[d]}){a[0]})"


VECTOR_MATH = {"exp": "fusion_expf", "erf": "fusion_erff", "tanh": "fusion_tanhf"}  # float32: no libm call, SIMD


def _unary_math(name):
    def code(a, d, ad):
        if d == "float32" and name in VECTOR_MATH:
            return f"{VECTOR_MATH[name]}({a[0]})"
        return f"{_math(name, d)}({a[0]})" if _floating(d) else f"(({C_TYPES[d]}){_math(name, 'float64')}({a[0]}))"

    return code


# IR op -> C expression: (operands, the op's dtype, the operands' dtypes) -> source.
CODE_FOR_OP = {
    "identity": lambda a, d, ad: a[0],
    "neg": lambda a, d, ad: f"(-{a[0]})",
    "abs": lambda a, d, ad: f"{_math('fabs', d)}({a[0]})" if _floating(d) else f"({a[0]} < 0 ? -{a[0]} : {a[0]})",
    "exp": _unary_math("exp"), "log": _unary_math("log"), "sqrt": _unary_math("sqrt"), "erf": _unary_math("erf"),
    "tanh": _unary_math("tanh"), "ceil": lambda a, d, ad: f"{_math('ceil', d)}({a[0]})" if _floating(d) else a[0],
    "floor": lambda a, d, ad: f"{_math('floor', d)}({a[0]})" if _floating(d) else a[0],
    "trunc": lambda a, d, ad: f"{_math('trunc', d)}({a[0]})" if _floating(d) else a[0],
    "rsqrt": lambda a, d, ad: f"({_one(d)} / {_math('sqrt', d)}({a[0]}))",
    "sigmoid": lambda a, d, ad: f"({_one(d)} / ({_one(d)} + {_unary_math('exp')([f'-{a[0]}'], d, ad)}))",
    "reciprocal": lambda a, d, ad: f"({_one(d)} / {a[0]})",
    "relu": lambda a, d, ad: f"({a[0]} < 0 ? ({C_TYPES[d]})0 : {a[0]})",  # NaN < 0 is false: NaN stays
    "sign": lambda a, d, ad: (f"({a[0]} != {a[0]} ? {a[0]} : ({C_TYPES[d]})(({a[0]} > 0) - ({a[0]} < 0)))"
                              if _floating(d) else f"(({C_TYPES[d]})(({a[0]} > 0) - ({a[0]} < 0)))"),  # fmt: skip
    "logical_not": lambda a, d, ad: f"(!{a[0]})",
    "to": _to,
    "round_float16": lambda a, d, ad: f"fusion_round_f16({a[0]})",
    "round_bfloat16": lambda a, d, ad: f"fusion_round_bf16({a[0]})",
    "add": lambda a, d, ad: f"({a[0]} + {a[1]})",
    "sub": lambda a, d, ad: f"({a[0]} - {a[1]})",
    "mul": lambda a, d, ad: f"({a[0]} * {a[1]})",
    "truediv": _div,
    "truncdiv": _div,
    "floordiv": _floordiv,
    "remainder": _remainder,
    "maximum": lambda a, d, ad: f"(({a[0]} != {a[0]} || {a[0]} > {a[1]}) ? {a[0]} : {a[1]})",  # NaN wins
    "minimum": lambda a, d, ad: f"(({a[0]} != {a[0]} || {a[0]} < {a[1]}) ? {a[0]} : {a[1]})",
    "pow": lambda a, d, ad: f"{_math('pow', d)}({a[0]}, {a[1]})",
    "eq": lambda a, d, ad: f"({a[0]} == {a[1]})",
    "ne": lambda a, d, ad: f"({a[0]} != {a[1]})",
    "lt": lambda a, d, ad: f"({a[0]} < {a[1]})",
    "le": lambda a, d, ad: f"({a[0]} <= {a[1]})",
    "gt": lambda a, d, ad: f"({a[0]} > {a[1]})",
    "ge": lambda a, d, ad: f"({a[0]} >= {a[1]})",
    "and": lambda a, d, ad: f"({a[0]} && {a[1]})",
    "or": lambda a, d, ad: f"({a[0]} || {a[1]})",
    "where": lambda a, d, ad: f"({a[0]} ? {a[1]} : {a[2]})",
}  # fmt: skip
assert set(CODE_FOR_OP) == ir.OPS, sorted(set(CODE_FOR_OP) ^ ir.OPS)

REDUCE_INIT = {"sum": "0", "max": "-INFINITY", "min": "INFINITY"}  # sum starts at +0.0
REDUCE_STEP = {
    "sum": "{acc} = {acc} + {v};",
    "max": "{acc} = ({acc} != {acc} || {acc} >= {v}) ? {acc} : {v};",  # NaN stays, a NaN value wins
    "min": "{acc} = ({acc} != {acc} || {acc} <= {v}) ? {acc} : {v};",
}


def literal(value: object, dtype: str) -> str:
    """A constant as C source of its compute type: hex floats (exact), INFINITY/NAN, sized integers."""
    if dtype == "bool":
        return "true" if value else "false"
    if _floating(dtype):
        v = float(value)
        suffix = "" if dtype == "float64" else "f"
        if math.isnan(v):
            return "NAN" if suffix else "((double)NAN)"
        if math.isinf(v):
            return ("" if v > 0 else "-") + ("INFINITY" if suffix else "((double)INFINITY)")
        return f"({v.hex()}{suffix})"
    v = int(value)
    if dtype == "int64" and v == -(2**63):
        return "((int64_t)(-9223372036854775807LL - 1))"
    return f"(({C_TYPES[dtype]}){v}LL)"


def index_source(e: ir.Affine) -> str:
    """An index in C (every value >= 0: ``/`` and ``%`` are Python's ``//`` and ``%``)."""
    terms = []
    for coef, atom in e.terms:
        if isinstance(atom, ir.Var):
            a = atom.name
        else:
            a = f"(({index_source(atom.of)}) {'/' if isinstance(atom, ir.FloorDiv) else '%'} {atom.by})"
        terms.append(a if coef == 1 else f"{coef}*{a}")
    if e.const or not terms:
        terms.append(str(e.const))
    return " + ".join(terms)


class _Writer:
    def __init__(self, kernel: ir.Kernel) -> None:
        self.k = kernel
        self.buffers = {b.name: b for b in kernel.buffers}
        self.dtypes: dict[str, str] = {}
        self.lines: list[str] = []

    def emit(self, line: str, depth: int) -> None:
        self.lines.append("    " * depth + line)

    def load(self, s: ir.Load) -> str:
        b = self.buffers[s.buffer]
        at = f"{s.buffer}[{index_source(s.offset)}]"
        raw = {"float16": f"fusion_h2f({at})", "bfloat16": f"fusion_bf2f({at})", "bool": f"({at} != 0)"}.get(
            b.dtype, at
        )
        return raw if C_TYPES[b.dtype] == C_TYPES[s.dtype] else f"(({C_TYPES[s.dtype]}){raw})"

    def statement(self, s, depth: int) -> None:
        if isinstance(s, ir.Load):
            self.dtypes[s.out] = s.dtype
            value = f"({s.mask} ? {self.load(s)} : ({C_TYPES[s.dtype]})0)" if s.mask else self.load(s)  # not read
            self.emit(f"const {C_TYPES[s.dtype]} {s.out} = {value};", depth)
        elif isinstance(s, ir.Index):
            self.dtypes[s.out] = "int64"
            self.emit(f"const int64_t {s.out} = {index_source(s.expr)};", depth)
        elif isinstance(s, ir.Const):
            self.dtypes[s.out] = s.dtype
            self.emit(f"const {C_TYPES[s.dtype]} {s.out} = {literal(s.value, s.dtype)};", depth)
        elif isinstance(s, ir.Op):
            self.dtypes[s.out] = s.dtype
            expr = CODE_FOR_OP[s.op](list(s.args), s.dtype, [self.dtypes[a] for a in s.args])
            self.emit(f"const {C_TYPES[s.dtype]} {s.out} = {expr};", depth)
        elif isinstance(s, ir.Store):
            b = self.buffers[s.buffer]
            v = s.value
            conv = {"float16": f"fusion_f2h({v})", "bfloat16": f"fusion_f2bf({v})", "bool": f"(uint8_t)({v} != 0)"}
            self.emit(f"{s.buffer}[{index_source(s.offset)}] = {conv.get(b.dtype, f'({STORAGE[b.dtype]}){v}')};", depth)
        elif isinstance(s, ir.ReduceLoop):
            self.reduce_loop(s, depth)
        else:
            raise TypeError(f"not a statement of the kernel IR: {s!r}")

    def reduce_loop(self, loop: ir.ReduceLoop, depth: int) -> None:
        """The loop over a row's elements. A sum folds blocks of :data:`SUM_BLOCK` elements of the innermost dim in
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
            self.emit(f"for (int64_t {v}_b = 0; {v}_b < {size}; {v}_b += {SUM_BLOCK}) {{", d)
            acc = {f.out: f"{f.out}_p" for f in folds}
            for f in folds:
                self.emit(f"{C_TYPES[f.dtype]} {acc[f.out]} = 0;", d + 1)
            self.emit(f"#pragma omp simd reduction(+:{', '.join(acc.values())})", d + 1)
            end = f"{v}_b + {SUM_BLOCK} < {size} ? {v}_b + {SUM_BLOCK} : {size}"
            self.emit(f"for (int64_t {v} = {v}_b; {v} < ({end}); {v}++) {{", d + 1)
        for s in loop.body:
            if isinstance(s, ir.Reduce):
                self.emit(REDUCE_STEP[s.op].format(acc=acc[s.out], v=s.value), d + 2 * blocked)
            else:
                self.statement(s, d + 2 * blocked)
        if blocked:
            self.emit("}", d + 1)
            self.emit(f"int64_t {v}_c = {v}_b / {SUM_BLOCK}, {v}_k = 0;", d + 1)
            self.emit(f"for (; {v}_c & 1; {v}_c >>= 1, {v}_k++) {{", d + 1)
            for f in folds:
                self.emit(f"{acc[f.out]} = {f.out}_l[{v}_k] + {acc[f.out]};", d + 2)
            self.emit("}", d + 1)
            for f in folds:
                self.emit(f"{f.out}_l[{v}_k] = {acc[f.out]};", d + 1)
            self.emit("}", d)
            self.emit(f"for (int64_t {v}_k = 0, {v}_c = ({size} + {SUM_BLOCK - 1}) / {SUM_BLOCK}; {v}_c; {v}_k++, "
                      f"{v}_c >>= 1) {{", d)  # fmt: skip
            self.emit(f"if ({v}_c & 1) {{", d + 1)
            for f in folds:
                self.emit(f"{f.out} = {f.out}_l[{v}_k] + {f.out};", d + 2)
            self.emit("}", d + 1)
            self.emit("}", d)
        self.emit("}", d - 1)
        self.emit("}", depth)

    def source(self) -> str:
        k = self.k
        params = [f"{'' if b.output else 'const '}{STORAGE[b.dtype]} *restrict {b.name}" for b in k.buffers]
        self.emit(f"void {k.name}({', '.join([*params, 'int nthreads'])}) {{", 0)
        work = math.prod(lp.size for lp in (*k.loops, *k.reduce_loops))
        omp = f"num_threads(nthreads) if(nthreads > 1 && {work}LL >= {PARALLEL_MIN}LL) schedule(static)"
        loops, depth = list(k.loops), 1
        self.emit("(void)nthreads;", 1)
        if k.kind == "pointwise" and len(loops) == 1:  # one loop: blocks of BLOCK elements shared by the threads
            (lp,) = loops
            self.emit(f"#pragma omp parallel for {omp}", 1)
            self.emit(f"for (int64_t {lp.var}_o = 0; {lp.var}_o < {lp.size}; {lp.var}_o += {BLOCK}) {{", 1)
            self.emit(
                f"const int64_t {lp.var}_e = {lp.var}_o + {BLOCK} < {lp.size} ? {lp.var}_o + {BLOCK} : {lp.size};", 2
            )
            self.emit(f"for (int64_t {lp.var} = {lp.var}_o; {lp.var} < {lp.var}_e; {lp.var}++) {{", 2)
            depth, closers = 3, [2, 1]
        else:
            shared = loops[:-1] if k.kind == "pointwise" else loops  # a pointwise kernel's innermost loop: SIMD
            if shared:
                collapse = f" collapse({len(shared)})" if len(shared) > 1 else ""
                self.emit(f"#pragma omp parallel for{collapse} {omp}", 1)
            for lp in loops:
                self.emit(f"for (int64_t {lp.var} = 0; {lp.var} < {lp.size}; {lp.var}++)", 1)
            self.emit("{", 1)
            depth, closers = 2, [1]
        for s in k.body:
            self.statement(s, depth)
        for d in closers:
            self.emit("}", d)
        self.emit("}", 0)
        return PRELUDE + "\n" + "\n".join(self.lines) + "\n"


def render(kernel: ir.Kernel) -> str:
    """The C source of ``kernel``: the helpers, then ``void <name>(buffers..., int nthreads)``."""
    return _Writer(kernel).source()
