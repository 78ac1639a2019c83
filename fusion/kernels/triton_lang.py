"""What the code generator (Phase 8, ``fusion.codegen``) writes besides the op lines: Triton spellings of dtypes and
constants, the combine functions of reductions, kernel names, index setup and memory order. What a kernel takes and
how it walks its region (the rule check, the rows of a reduction) is ``fusion.kernels.rows``. Machinery: a learner
reads ``fusion/codegen.py``."""

from __future__ import annotations

import io
import itertools
import math
import tokenize
from collections.abc import Sequence
from dataclasses import dataclass

import torch
import torch.fx as fx

from fusion.aten.nodes import is_view_node
from fusion.ir.plan import Unsupported

# Re-exported: the C lowering (fusion/compiler/lowering.py) and older readers name these ``triton_lang.<name>``; they
# live in ``fusion.kernels.rows`` (what a kernel takes and how it walks its region).
from fusion.kernels.rows import (  # noqa: F401
    CAT,
    Rows,
    bind_args,
    check_region,
    is_depthwise,
    is_max_pool,
    per_row_shapes,
    pooled_values,
    stored_members,
)

# Elements a program of a pointwise kernel takes on a GPU: 1024, and 512 where the kernel computes a depthwise
# convolution (9 or 25 loads an element, the ops before the window again at each): 1.04-1.7x faster on MobileNetV2's
# layers on an H200 (scripts/gpu_probe_depthwise.py, results h200-2026-11-25-aq2-probe_depthwise.json).
POINTWISE_BLOCK, WINDOW_BLOCK = 1024, 512


def pointwise_block(region) -> int:
    return WINDOW_BLOCK if any(is_depthwise(n) for n in region.nodes) else POINTWISE_BLOCK


_names = itertools.count()


def next_kernel_index() -> int:
    """A process-wide counter: kernel names are unique per process, as Inductor's are (``..._0``, ``..._1``)."""
    return next(_names)


@dataclass(frozen=True)
class Line:
    """One line of a kernel body, ``tmp = expr``: a load of the input ``node``, one op computing member ``node``,
    or a helper step (``node`` None); with ``tmp`` empty, a statement (a store, a loop's header). ``depth``: inside
    how many loops. The generator writes the source and the kernel's op list from these records."""

    tmp: str
    expr: str
    dtype: torch.dtype | None  # the dtype the tmp holds (half/bf16 values are held in float32)
    node: fx.Node | None = None
    depth: int = 0

    def source(self) -> str:
        return "    " * self.depth + (f"{self.tmp} = {self.expr}" if self.tmp else self.expr)


def const_source(value: object) -> str:
    """A Python scalar as Triton source: 2.0, 1e-05, float('inf')."""
    if isinstance(value, bool):
        return "1" if value else "0"
    if isinstance(value, float) and not math.isfinite(value):
        return f'float("{value}")'
    if isinstance(value, (int, float)):
        return repr(value)
    raise Unsupported(f"argument {value!r} of type {type(value).__name__} is not a scalar")


# Ops the generators take outside the learner's op table (``triton_values.machinery_rule``, ``compiler.lowering``):
# ``prims.fma`` (Inductor's prim: one rounding, ``tl.fma``, C's ``fma``) and ``fusion.philox_rand``
# (``fusion.compiler.random_ops``: Philox from a seed tensor and the element's position, ``tl.rand``), each
# recognised by its schema name: kernels/ imports neither torch._inductor nor the compiler that defines them.
FMA, PHILOX_RAND = "prims::fma", "fusion::philox_rand"


def schema_name(node: fx.Node) -> str:
    return getattr(getattr(node.target, "_schema", None), "name", "") if node.op == "call_function" else ""


def is_philox_rand(node: fx.Node) -> bool:
    return schema_name(node) == PHILOX_RAND


def is_fma(node: fx.Node) -> bool:
    return schema_name(node) == FMA


def contiguous_strides(shape: Sequence[int]) -> tuple[int, ...]:
    return tuple(math.prod(shape[d + 1 :]) for d in range(len(shape)))


def tl_dtype(dtype: torch.dtype) -> str:
    names = {torch.bool: "int1", torch.bfloat16: "bfloat16", torch.float16: "float16"}
    return "tl." + names.get(dtype, str(dtype).removeprefix("torch."))


def compute_dtype(dtype: torch.dtype) -> torch.dtype:
    """Half and bfloat16 compute in float32 (loaded up, rounded once at the store), like Inductor."""
    return torch.float32 if dtype in (torch.float16, torch.bfloat16) else dtype


class Bf16Values:
    """Which tmps of a kernel hold a bfloat16 value already (a load of a bfloat16 tensor, a :func:`round_bf16`, a
    copy of either): rounding one of them again is the identity, so the writer reuses it instead."""

    def __init__(self) -> None:
        self.rounded: dict[str, str] = {}  # round_bf16 source of such a tmp -> the tmp

    def reuse(self, expr: str) -> str:
        return self.rounded.get(expr, expr)

    def note(self, tmp: str, expr: str, loaded: object) -> None:
        """``tmp = expr`` was written; ``loaded`` is the dtype of the input it loads (or a false value)."""
        if loaded == torch.bfloat16 or expr in self.rounded.values() or rounds_to_bf16(expr):
            self.rounded[round_bf16(tmp)] = tmp


def rounds_to_bf16(expr: str) -> bool:
    """Is ``expr`` what :func:`round_bf16` writes (its value is a bfloat16, held in a float32)?"""
    inner = expr.removesuffix(_TO_BF16)
    return inner != expr and (inner.isidentifier() or _one_parenthesis(inner))


_TO_BF16 = ".to(tl.bfloat16).to(tl.float32)"


def round_bf16(x: str) -> str:
    """float32 ``x`` rounded to the nearest bfloat16 (ties to even), still a float32: on a GPU one conversion
    instruction each way. (Triton's interpreter truncates and mishandles subnormals there: the runtime gives it exact
    conversions, ``triton_runtime.exact_bfloat16_in_the_interpreter``.)"""
    return f"{x if x.isidentifier() or _one_parenthesis(x) else f'({x})'}{_TO_BF16}"


def _one_parenthesis(s: str) -> bool:
    """Is ``s`` one parenthesised expression, "(" … ")" with the first parenthesis closed by the last character?"""
    depth = 0
    for i, ch in enumerate(s):
        depth += (ch == "(") - (ch == ")")
        if depth == 0:
            return s[0] == "(" and i == len(s) - 1
    return False


def cast(x: str, src: torch.dtype, dst: torch.dtype) -> str:
    """Source converting ``x`` (a tmp holding a value of compute dtype ``src``) to ``dst`` with torch's semantics,
    kept in ``compute_dtype(dst)``: half/bf16 rounded once and correctly (float64 via float32, as c10 does), float →
    integer truncated through int64 (float → uint8 wraps like torch), anything → bool is ``!= 0`` (NaN is True)."""
    if dst == torch.bool:
        return x if src == torch.bool else f"{x} != 0"
    if src == torch.bool:
        x, src = f"tl.where({x}, 1, 0)", torch.int32
    if dst in (torch.float16, torch.bfloat16):
        x32 = x if src == torch.float32 else f"{x}.to(tl.float32)"
        return f"{x32}.to(tl.float16).to(tl.float32)" if dst == torch.float16 else round_bf16(x32)
    if src == dst:
        return x
    if src.is_floating_point and not dst.is_floating_point and dst != torch.int64:
        return f"{x}.to(tl.int64).to({tl_dtype(dst)})"
    return f"{x}.to({tl_dtype(dst)})"


def divide(x: str, n: int, dtype: torch.dtype) -> str:
    """``x / n`` rounded as torch rounds it. Triton's float32 ``/`` is ``div.full.f32`` on NVIDIA GPUs (up to 2 ulp
    off: 3v / 3 need not be v), so a float32 quotient is ``tl.math.div_rn``; float64's ``/`` is already IEEE."""
    return f"tl.math.div_rn({x}, {float(n)})" if dtype == torch.float32 else f"{x} / {n}"


def int_power(x: str, e: int, floating: bool) -> str:
    """``x ** e`` for an integer ``e`` by repeated squaring, as torch (and Inductor) do: signs stay exact (x**4 of a
    negative x is positive), NaN ** 0 and inf ** 0 are 1, a negative exponent is one reciprocal."""
    if e == 0:
        return f"tl.where({x} != {x}, 1.0, 1.0).to({x}.dtype)" if floating else f"({x} * 0 + 1)"  # float64 stays
    if e < 0:
        return f"1.0 / ({int_power(x, -e, floating)})"
    if e == 1:
        return x
    half = int_power(x, e // 2, floating)
    square = f"({half}) * ({half})" if e // 2 > 1 else f"{x} * {x}"
    return square if e % 2 == 0 else f"{square} * {x}"


def rounded(value: object, dtype: torch.dtype) -> object:
    """A Python float as ``dtype`` holds it (0.1 in float16 is 0.0999755859375); anything else unchanged."""
    if isinstance(value, float) and dtype.is_floating_point and math.isfinite(value):
        return torch.tensor(value, dtype=dtype).item()
    return value


TANH_SERIES = (-1 / 3, 2 / 15, -17 / 315, 62 / 2835, -1382 / 155925, 21844 / 6081075, -929569 / 638512875)


def tanh(x: str, dtype: torch.dtype) -> str:
    """tanh as source: (1 - e) / (1 + e) with e = exp(-2|x|), and near 0, where 1 - e cancels every digit, its
    Taylor series (x - x³/3 + …, 8 terms, Horner in x²). Triton has no portable tl.tanh (the interpreter lacks it)."""
    big = f"tl.where({x} < 0, -1.0, 1.0) * (1.0 - tl.exp(-2.0 * tl.abs({x}))) / (1.0 + tl.exp(-2.0 * tl.abs({x})))"
    series = "0.0"
    for c in reversed(TANH_SERIES):
        series = f"({c!r} + {x} * {x} * {series})"
    small = f"{x} * (1.0 + {x} * {x} * {series})"
    return f"tl.where(tl.abs({x}) < {0.05 if dtype == torch.float64 else 0.55}, {small}, {big})"


def constant(value: object, dtype: torch.dtype) -> str:
    """A Python scalar operand of an op computed in ``dtype``, as torch would use it: float64 keeps every bit
    (a bare literal is a float32 in Triton), an integer must fit ``dtype`` (else refused: torch wraps it)."""
    if isinstance(value, bool) or not isinstance(value, (int, float)):
        return const_source(value)
    if dtype == torch.float64 and isinstance(value, float) and math.isfinite(value):
        return f"tl.full([], {value!r}, tl.float64)"
    if not dtype.is_floating_point and dtype != torch.bool:
        if isinstance(value, float):
            raise Unsupported(f"float constant {value!r} in an op computed in {dtype}")
        info = torch.iinfo(dtype)
        if not info.min <= value <= info.max:
            raise Unsupported(f"constant {value} does not fit {dtype} (torch wraps it around)")
        if dtype == torch.int64 and not -(2**31) <= value < 2**31:
            return f"tl.full([], {value}, tl.int64)"
    return const_source(value)


COMBINE_FUNCTIONS = [
    "@triton.jit", "def _add(a, b):", "    return a + b", "", "",
    "@triton.jit", "def _maximum(a, b):", "    return tl.where(a != a, a, tl.where(a > b, a, b))", "", "",
    "@triton.jit", "def _minimum(a, b):", "    return tl.where(a != a, a, tl.where(a < b, a, b))", "",
]  # fmt: skip


# Philox4x32-10, counter (offset, 0, 0, 0), key (seed low, seed high), then Triton's uint_to_uniform_float: bit for
# bit ``tl.rand(seed, offset)`` (triton/language/random.py), written out because the interpreter cannot call
# Triton's own @jit helpers; ``fusion.compiler.random_ops`` has the same in torch, ``c_prelude`` in C.
RAND_FUNCTION = [
    "@triton.jit", "def _philox_rand(seed, offset):",
    "    seed = seed.to(tl.uint64)",
    "    k0 = (seed & 0xFFFFFFFF).to(tl.uint32)",
    "    k1 = ((seed >> 32) & 0xFFFFFFFF).to(tl.uint32)",
    "    c0 = offset.to(tl.uint32)",
    "    c1 = c0 * 0",
    "    c2 = c1",
    "    c3 = c1",
    "    for _ in tl.static_range(10):",
    "        _c0, _c2 = c0, c2",
    "        c0 = tl.umulhi(0xCD9E8D57, _c2) ^ c1 ^ k0",
    "        c2 = tl.umulhi(0xD2511F53, _c0) ^ c3 ^ k1",
    "        c1 = _c2 * 0xCD9E8D57",
    "        c3 = _c0 * 0xD2511F53",
    "        k0 = k0 + 0x9E3779B9",
    "        k1 = k1 + 0xBB67AE85",
    "    x = c0.to(tl.int32, bitcast=True)",
    "    x = tl.where(x < 0, ~x, x)",
    "    return x * 4.6566127342e-10", "", "",
]  # fmt: skip


def ops(body: Sequence[Line], members) -> list[str]:
    """The aten ops a kernel computes, in body order, read off its lines (loads and helpers left out)."""
    return list(dict.fromkeys(f"{ln.node.name} = {ln.node.target}" for ln in body if ln.node in members))


def index_setup(shape: tuple[int, ...], rows: Rows | None) -> list[str]:
    """The lines before a kernel's body: this program's lanes (``xindex``) and the mask of the last block's tail; a
    reduction's XBLOCK rows as a column and its RBLOCK lanes as a row (a looped one sets those in each loop)."""
    if rows is None:
        return [f"# elementwise over {shape}: {(n := math.prod(shape))} elements",
                "xindex = tl.program_id(0) * XBLOCK + tl.arange(0, XBLOCK)", f"xmask = xindex < {n}"]  # fmt: skip
    count, walk = (
        rows.count,
        "" if rows.order is None else f" (dims {list(rows.walk_dims[len(rows.kept) :])} of {shape})",
    )
    lines = [f"# XBLOCK rows per program: {count} rows of {rows.rnumel}{walk}" + (", RBLOCK lanes at a time" if rows.looped else ""),
             "xindex = tl.program_id(0) * XBLOCK + tl.arange(0, XBLOCK)[:, None]", f"xmask = xindex < {count}"]  # fmt: skip
    return lines + (
        [] if rows.looped else ["rindex = tl.arange(0, RBLOCK)[None, :]", f"rmask = rindex < {rows.rnumel}"]
    )


def module_source(head: str, body: list[str], reduction: bool) -> str:
    """A kernel's module: the imports, the combine functions a reduction's tl.reduce may call (NaN-propagating max
    and min; a sum where Triton lacks its own), then ``@triton.jit``, the signature ``head`` and the ``body``
    indented under it."""
    lines = ["import triton", "import triton.language as tl", "", ""] + ([*COMBINE_FUNCTIONS, ""] if reduction else [])
    lines += RAND_FUNCTION if any("_philox_rand(" in b for b in body) else []
    return "\n".join([*lines, "@triton.jit", head] + ["    " + b for b in body]) + "\n"


def memory_order(val: torch.Tensor, shape: Sequence[int]) -> list[int]:
    """The dims of ``shape`` from outermost to innermost *in memory* for an output laid out like ``val`` (largest
    stride first; size-1 dims anywhere): (N, C, H, W) channels_last → [0, 2, 3, 1]. Logical order otherwise."""
    order = list(range(len(shape)))
    if tuple(val.shape) == tuple(shape):
        order.sort(key=lambda d: -val.stride()[d] if shape[d] != 1 else 0)
    return order


UNNAMED = "KERNEL_NAME"  # the name a kernel's draft source is written with; kernel_name() puts the real one in
_named: dict[tuple[str, str], str] = {}  # (prefix, code without comments) -> the name that code was first given


def kernel_name(region, rows: Rows | None, draft: str) -> tuple[str, str]:
    """(name, source) for a kernel whose ``draft`` source calls it :data:`UNNAMED`. Inductor's naming:
    triton_poi_fused_<ops>_<n> for pointwise, triton_per_fused_… for a persistent reduction (a row in one block),
    triton_red_fused_… for a looped one. A kernel whose code is an earlier kernel's, comments aside (a transformer's
    layers, ResNet's repeated blocks), gets that kernel's name: the runtime loads one module for both, and Triton
    compiles it once (Inductor's ``src_to_kernel`` does the same). Its source keeps the comments of its own region."""
    ops = sorted({n.target.overloadpacket.__name__.strip("_") for n in region.nodes if hasattr(n.target, "overloadpacket") and not is_view_node(n, getitem=False)})  # fmt: skip
    prefix = f"triton_{'poi' if rows is None else 'red' if rows.looped else 'per'}_fused_{'_'.join(ops[:8])}"
    key = (prefix, code_only(draft))
    if key not in _named:
        _named[key] = f"{prefix}_{next_kernel_index()}"
    return _named[key], draft.replace(f"def {UNNAMED}(", f"def {_named[key]}(", 1)


def code_only(source: str) -> str:
    """``source`` without its comments and blank lines (read by ``tokenize``: a '#' inside a string stays): two
    kernels with the same code compile to the same binary, whatever nodes their comments name."""
    cut = {}
    for tok in tokenize.generate_tokens(io.StringIO(source).readline):
        if tok.type == tokenize.COMMENT:
            cut[tok.start[0]] = tok.start[1]
    lines = (ln[: cut[i]].rstrip() if i in cut else ln for i, ln in enumerate(source.splitlines(), 1))
    return "\n".join(ln for ln in lines if ln.strip())
