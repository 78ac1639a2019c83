"""The C renderer's table: an IR op -> a C expression of its operands (tinygrad's ``code_for_op``), the C types of the
IR's dtypes, constants as C literals, an index in C, and the folds of a reduction. ``fusion.kernels.c_render`` writes
the loops around these expressions. Adding a pointwise op is one line here (and one in the lowering).

Numerics as the Triton path: integer floor division and remainder with torch's signs (Python's), a zero divisor
gives 0 instead of a crash (torch raises); NaN propagates through maximum/minimum/max/min; exp, erf and tanh of
float32 are the prelude's inline, branch-free functions (they vectorize); no fast-math anywhere.
"""

from __future__ import annotations

import math

from fusion.ir import kernel_ir as ir

# The flag of a kernel with indexed reads, declared first in its function (``c_render``): the kernel returns it, and
# the runtime (``c_runtime.CKernel``) knows such a kernel by this line in its source
RANGE_FLAG = "int fusion_bad = 0;"

C_TYPES = {"bool": "int32_t", "uint8": "uint8_t", "int8": "int8_t", "int16": "int16_t", "int32": "int32_t",
           "int64": "int64_t", "float16": "float", "bfloat16": "float", "float32": "float", "float64": "double"}  # fmt: skip
STORAGE = {**C_TYPES, "bool": "uint8_t", "float16": "uint16_t", "bfloat16": "uint16_t"}
# A bool value is held as an int32_t 0/1 (a comparison's, ``!=``'s and ``&&``'s own type in C): a float32 loop that
# tests a window tap's guard or clamps (ReLU6) then vectorizes, where gcc 12 finds no vector type for C's _Bool
# beside float lanes (measured: a 3x3 depthwise window's loop ran scalar with bool guards, in SIMD with int32 ones).


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
    if _floating(d) and not _floating(ad[0]):  # gcc folds float -> int -> float into trunc, which keeps -0.0
        v, zero = f"(({C_TYPES[d]}){a[0]})", "0.0" if d == "float64" else "0.0f"  # (it drops a "+ 0.0")
        return f"({v} == {zero} ? {zero} : {v})"
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
    "tanh": _unary_math("tanh"), "sin": _unary_math("sin"), "cos": _unary_math("cos"),
    "ceil": lambda a, d, ad: f"{_math('ceil', d)}({a[0]})" if _floating(d) else a[0],
    "floor": lambda a, d, ad: f"{_math('floor', d)}({a[0]})" if _floating(d) else a[0],
    "trunc": lambda a, d, ad: f"{_math('trunc', d)}({a[0]})" if _floating(d) else a[0],
    "rsqrt": lambda a, d, ad: f"({_one(d)} / {_math('sqrt', d)}({a[0]}))",
    "sigmoid": lambda a, d, ad: f"({_one(d)} / ({_one(d)} + {_unary_math('exp')([f'-{a[0]}'], d, ad)}))",
    "reciprocal": lambda a, d, ad: f"({_one(d)} / {a[0]})",
    "relu": lambda a, d, ad: f"({a[0]} < 0 ? ({C_TYPES[d]})0 : {a[0]})",  # NaN < 0 is false: NaN stays
    "sign": lambda a, d, ad: f"(({C_TYPES[d]})(({a[0]} > 0) - ({a[0]} < 0)))",  # torch's: sign(nan) is 0
    "logical_not": lambda a, d, ad: f"(!{a[0]})",
    "to": _to,
    "round_float16": lambda a, d, ad: f"fusion_round_f16({a[0]})",
    "round_bfloat16": lambda a, d, ad: f"fusion_round_bf16({a[0]})",
    "add": lambda a, d, ad: f"({a[0]} + {a[1]})",
    "sub": lambda a, d, ad: f"({a[0]} - {a[1]})",
    "mul": lambda a, d, ad: f"({a[0]} * {a[1]})",
    "truediv": _div,
    "exact_div": _div,
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
    "bitwise_and": lambda a, d, ad: f"(({C_TYPES[d]})({a[0]} & {a[1]}))",  # bool or integer operands of dtype d
    "bitwise_or": lambda a, d, ad: f"(({C_TYPES[d]})({a[0]} | {a[1]}))",
    "where": lambda a, d, ad: f"({a[0]} ? {a[1]} : {a[2]})",
    "fma": lambda a, d, ad: f"{_math('fma', d)}({a[0]}, {a[1]}, {a[2]})",  # one rounding (-ffp-contract=off elsewhere)
    "rand": lambda a, d, ad: f"fusion_rand({a[0]}, {a[1]})",  # Philox4x32-10: tl.rand's bits (c_prelude)
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
