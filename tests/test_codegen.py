"""Phase 8: generated kernels against eager PyTorch.

CPU kernels run with the renderer tests/conftest.py picks for the generator's tests (the C renderer where a compiler
is found; FUSION_TEST_RENDERER=triton for Triton's interpreter). Phase 8's own rules (the learner's ``triton_expr``
for every op of ``triton_render.LESSON_OPS`` and ``split_index``, the bounds check, the wrong-solution harness) and
max-pool windows always run in the interpreter (``triton_renderer``): that is where the learner's Triton text runs on
a CPU. The smoke subset (tests taking ``renderer``) runs with both, one fixed small case per kernel kind. ``check``
asserts every kernel ran with the renderer chosen (C, or the interpreter)."""

from __future__ import annotations

import contextlib
import itertools
import re
from unittest import mock

import numpy as np
import pytest
import torch
import torch.nn as nn
import torch.nn.functional as F
from hypothesis import assume, given, settings
from hypothesis import strategies as st
from support import Fn

from fusion import codegen, models
from fusion.codegen import compile_graph, compile_regions, split_index, triton_expr
from fusion.compiler import generate
from fusion.ir import kernel_ir
from fusion.ir.plan import Unsupported
from fusion.kernels import c_runtime, triton_launch, triton_render
from fusion.kernels import rows as kernel_rows
from fusion.kernels import triton_lang as tlang
from fusion.kernels import triton_runtime as rt
from fusion.regions import aten_inputs, build_fusion_regions, capture_aten, unique_regions


@pytest.fixture(autouse=True)
def _strict(monkeypatch):
    """An exception other than Unsupported is a generator bug: here it fails the test instead of falling back."""
    monkeypatch.setenv("FUSION_STRICT", "1")  # fusion.common.strict_compiler


pytestmark = [
    pytest.mark.phase8,
    pytest.mark.skipif(not rt.triton_status()[0], reason="Triton is not installed"),
]


# Ops with no kernel-IR op (no tl./libdevice function; mapping sin/cos to tl.sin/tl.cos must never break a test):
# the tests of cutting and falling back use these.
NO_LINE, NO_LINE_2 = torch.digamma, torch.special.ndtri


def test_the_fallback_ops_really_have_no_triton_line():
    c = check(lambda x: (NO_LINE(x * 2.0) + 1.0, NO_LINE_2(x * 3.0) - 1.0), torch.rand(3) + 0.5)
    assert sorted(d.nodes for d in c.report.skipped) == [("digamma",), ("special_ndtri",)], c.report.table()
    assert all("no kernel-IR op" in d.reason for d in c.report.skipped), c.report.table()


def ir_ops(compiled) -> set[str]:
    """The kernel-IR ops (``fusion.ir.kernel_ir.Op.op``) of every kernel a compiled module launches."""
    kernels = [lch.owner.plan.ir for lch in compiled.compiled.launchers]
    return {s.op for k in kernels for s in k.statements() if isinstance(s, kernel_ir.Op)}


def _rand(shape, seed, dtype=torch.float32):
    return torch.randn(shape, generator=torch.Generator().manual_seed(seed)).to(dtype)


def check(fn, *inputs, kernels=None, atol=None, rtol=None):
    """compile_regions(fn) on ``inputs`` equals fn(*inputs), every kernel run by the renderer chosen (compiled from C,
    or Triton's interpreter; under C a region C does not take runs as aten ops, no kernel); returns the module."""
    model = Fn(fn)
    compiled = compile_regions(model, inputs)
    got, want = compiled(*inputs), fn(*inputs)
    torch.testing.assert_close(got, want, atol=atol, rtol=rtol, equal_nan=True)
    if kernels is not None:
        assert compiled.num_kernels == kernels, (compiled.report.table(), [k.source for k in compiled.kernels])
    ran = {lch.owner.ran for lch in compiled.compiled.launchers if inputs and inputs[0].device.type == "cpu"}
    assert ran <= {"c" if c_runtime.chosen() == "c" else "triton-interpreter"}, (ran, compiled.report.table())
    return compiled


def fewer(n: int):
    """At most ``n`` hypothesis examples under a gate's profile (ci, dev, a workspace's): each is one more kernel to
    generate (and, under C, compile); a soak's profile (thorough, fuzz) keeps its own count."""
    default = settings.default.max_examples
    return settings(max_examples=min(n, default) if default <= 25 else default)


# Shapes: 1–3 dims, odd sizes; the second operand broadcasts (dims dropped from the left, dims set to 1).
dims = st.lists(st.integers(1, 9), min_size=1, max_size=3)


@st.composite
def broadcast_pair(draw):
    shape = draw(dims)
    keep = draw(st.integers(0, len(shape)))
    other = [1 if draw(st.booleans()) else s for s in shape[len(shape) - keep :]]
    return tuple(shape), tuple(other)


# ----------------------------------------------------------------------------------------------------------------------
# Indexing, the learner's second region


def split_values(shape, flat: str = "xindex") -> list[np.ndarray]:
    """Each expression of ``split_index(flat, shape)`` evaluated at every flat index of ``shape`` at once (a vector,
    as Triton evaluates it: any integer expression of the flat index, ``%`` on the outermost dim or not)."""
    parts = split_index(flat, shape)
    assert len(parts) == len(shape), f"split_index({flat!r}, {shape}) = {parts}: one (name, expr) per dimension"
    at = np.arange(int(np.prod(shape)), dtype=np.int64)
    return [np.broadcast_to(np.asarray(eval(expr, {"__builtins__": {}}, {flat: at})), at.shape) for _, expr in parts]


SPLIT_SHAPES = [(7,), (1,), (3, 5), (5, 1), (1, 6), (2, 3, 4), (4, 1, 3), (1, 1, 5), (3, 1, 1), (2, 3, 2, 5), (64, 8)]


@pytest.mark.parametrize("flat", ["xindex", "rindex"])
def test_split_index_gives_every_element_its_coordinates(flat):
    """The value of each dimension's expression at every flat index is numpy's unravel_index (contiguous shapes,
    size-1 dims, 1-d; the outermost dim with or without %): the expressions are evaluated, never read as text."""
    for shape in SPLIT_SHAPES:
        want = np.unravel_index(np.arange(int(np.prod(shape))), shape)
        for d, (got, w) in enumerate(zip(split_values(shape, flat), want, strict=True)):
            bad = np.flatnonzero(got != w)
            assert not bad.size, (
                f"split_index({flat!r}, {shape}) = {split_index(flat, shape)}: dim {d} of element {bad[0]} is "
                f"{got[bad[0]]}, not {w[bad[0]]} (each dim is flat // the sizes inside it, % its size)"
            )


@fewer(10)
@given(st.lists(st.integers(1, 5), min_size=0, max_size=4))
def test_split_index_recovers_every_coordinate(shape):
    values = split_values(tuple(shape))
    coords = list(itertools.product(*(range(s) for s in shape)))
    for flat, coord in enumerate(coords):
        got = tuple(int(v[flat]) for v in values)
        assert got == coord, f"split_index('xindex', {shape}): element {flat} gets {got}, not {coord}"


def test_split_index_names_each_loop_from_the_innermost():
    """The TODO's names (what the lesson prints): prefix0 the innermost dim of size > 1, then prefix1, ...; a size-1
    dim is ('0', '0')."""
    assert [v for v, _ in split_index("xindex", (8, 1, 64))] == ["x1", "0", "x0"]
    assert [v for v, _ in split_index("rindex", (3, 4, 1), "r")] == ["r1", "r0", "0"]
    assert split_index("xindex", (1,)) == [("0", "0")] and split_index("xindex", ()) == []


# ----------------------------------------------------------------------------------------------------------------------
# Every supported pointwise op against eager, in one multi-output region per drawn shape


def unary_ops(x):
    x = x * 1.0  # every op below reads this member: all of them are one region, one kernel with many outputs
    a = x.abs() + 0.5
    return (
        -x, x.abs(), torch.relu(x), torch.exp(x), torch.log(a), torch.sqrt(a), torch.rsqrt(a), torch.sigmoid(x),
        torch.tanh(x), torch.erf(x), F.gelu(x), x.pow(2), x.pow(3), a.pow(0.5), a.pow(1.7), a.pow(-1), x.clamp(-0.5, 0.7),
        x.clamp(min=0.1), x.clamp(max=-0.1), x * 2.5 + 1, 3 - x, x / 4, torch.where(x > 0, x, 0.1 * x),
        x.half().float(), x.to(torch.int32), x.to(torch.bool), torch.reciprocal(a), F.silu(x), F.hardtanh(x),
    )  # fmt: skip


def binary_ops(x, y):
    x, y = x * 1.0, y + 0.0
    return (
        x + y, x - y, x * y, x / (y.abs() + 0.5), torch.maximum(x, y), torch.minimum(x, y), torch.add(x, y, alpha=2),
        x == y, x != y, x < y, x <= y, x > y, x >= y, torch.where(x > y, x, y), torch.sub(x, y, alpha=3),
    )  # fmt: skip


@fewer(8)
@given(shape=dims, seed=st.integers(0, 2**16))
def test_unary_ops_match_eager(shape, seed):
    x = _rand(shape, seed)
    check(unary_ops, x, kernels=1)


@fewer(8)
@given(pair=broadcast_pair(), seed=st.integers(0, 2**16))
def test_binary_ops_broadcast_match_eager(pair, seed):
    x, y = _rand(pair[0], seed), _rand(pair[1], seed + 1)
    y.reshape(-1)[:1] = x.reshape(-1)[0]  # some equal elements, so == and <= see both answers
    check(binary_ops, x, y, kernels=1)
    check(lambda x, y: binary_ops(y, x), x, y, kernels=1)  # the broadcast operand first


@pytest.mark.usefixtures("triton_renderer")
def test_every_pointwise_op_in_the_interpreter():
    """The Triton renderer (with Phase 8's triton_expr) run by Triton's interpreter, every op once: one shape and a
    broadcast operand on either side (the drawn shapes above run with the default renderer)."""
    x, y = _rand((3, 7), 0), _rand((7,), 1)
    y[:1] = x[0, 0]  # some equal elements, so == and <= see both answers
    check(unary_ops, x, kernels=1)
    check(binary_ops, x, y, kernels=1)
    check(lambda x, y: binary_ops(y, x), x, y, kernels=1)


def test_nan_and_inf_propagate_like_torch(renderer):
    x = torch.tensor([float("nan"), float("inf"), -float("inf"), 0.0, -1.0, 2.0])
    check(lambda x: (torch.relu(x) * 1.0, torch.maximum(x, x * 0.5), x.clamp(-1, 1) + 0.0, torch.sigmoid(x)), x)


def test_broadcast_is_index_arithmetic_not_a_copy():
    c = check(lambda x, b: torch.relu(x * b + 1.0), _rand((6, 5), 0), _rand((5,), 1), kernels=1)
    src = c.kernels[0].source
    assert "% 5" in src and "xmask" in src
    assert "expand" not in src


# ----------------------------------------------------------------------------------------------------------------------
# The learner's triton_expr: every op of triton_render.LESSON_OPS in Triton's interpreter, special values, each dtype
# kind that reaches it. Each case is one region (every op reads the members h and k): a kernel or two per dtype.

INF, NAN = float("inf"), float("nan")
SPECIALS = [NAN, INF, -INF, -0.0, 0.0, 1e-30, -1e-6, 5e-4, 0.3, -0.7, 1.0, -2.5, 3.0, 80.0, 2.0, -3.0]


def float_ops(x, y):
    h, k = x * 1.0, y * 1.0  # members every op reads: one region
    return (
        -h, h.abs(), h.exp(), h.log(), h.sqrt(), h.rsqrt(), h.erf(), h.sin(), h.cos(), h.sigmoid(), h.tanh(),
        h.reciprocal(), h.relu(), h.logical_not(), h + k, h - k, h * k, h / k, torch.maximum(h, k),
        torch.minimum(h, k), h**1.5, h**-2.5, h == k, h != k, h < k, h <= k, h > k, h >= k,
        torch.where(h > k, h, k), (h * k).clone(),
    )  # fmt: skip


FLOAT_OPS = ["neg", "abs", "exp", "log", "sqrt", "rsqrt", "erf", "sin", "cos", "sigmoid", "tanh", "reciprocal",
             "relu", "logical_not", "add", "sub", "mul", "truediv", "maximum", "minimum", "pow 1.5", "pow -2.5", "eq",
             "ne", "lt", "le", "gt", "ge", "where", "identity"]  # fmt: skip
# computed by numpy's math in the interpreter, by torch's in eager: a few ulp apart; every other op is exact. sqrt
# too: IEEE-exact in numpy, but not in every eager build (torch 2.15 on an AVX512 CPU: sqrt(2.0) in float64 is
# 1.414213562373095, one ulp below the correctly rounded 1.4142135623730951)
NOT_EXACT = {"exp", "log", "sqrt", "rsqrt", "erf", "sin", "cos", "sigmoid", "tanh", "pow 1.5", "pow -2.5"}
ULPS = {torch.float32: 1e-6, torch.float64: 1e-13, torch.float16: 1e-3, torch.bfloat16: 8e-3}


def int_ops(x, y):
    h, k = x * 1, y * 1
    return (
        -h, h.abs(), h.relu(), h.logical_not(), h + k, h - k, h * k, h / k, torch.maximum(h, k), torch.minimum(h, k),
        h == k, h != k, h < k, h <= k, h > k, h >= k, torch.where(h > k, h, k), h & k, h | k,
    )  # fmt: skip


INT_OPS = ["neg", "abs", "relu", "logical_not", "add", "sub", "mul", "truediv", "maximum", "minimum", "eq", "ne", "lt",
           "le", "gt", "ge", "where", "bitwise_and", "bitwise_or"]  # fmt: skip
INTS = [-7, -1, 0, 1, 2, 5, 100, 127, -128, 3, 0, 64]


def bool_ops(a, b):
    h, k = a.logical_not(), b.logical_not()
    return (
        h + k, h * k, torch.maximum(h, k), torch.minimum(h, k), h & k, h | k, h.logical_not(), h == k, h != k, h < k,
        h >= k, torch.where(h, k, b), (h + k) + (h + b),
    )  # fmt: skip


BOOL_OPS = ["or (add)", "and (mul)", "or (maximum)", "and (minimum)", "bitwise_and", "bitwise_or", "logical_not", "eq",
            "ne", "lt", "ge", "where", "or of ors"]  # fmt: skip
BOOL_A = [True, True, False, False, True, False]
BOOL_B = [True, False, True, False, True, True]


def special_inputs(dtype):
    """(x, y): every special value against every other kind on the other side (y is x rotated), and equal pairs."""
    x = torch.tensor(SPECIALS, dtype=torch.float64)
    y = torch.roll(x, 3)
    y[-2:] = x[-2:]  # equal pairs: == and <= see both answers
    return x.to(dtype), y.to(dtype)


def run_interpreted(compiled, *args):
    """``compiled(*args)`` in Triton's interpreter, whose one extra rule is named: it cannot call a @triton.jit
    helper (tl.sigmoid is one) from a kernel's expression."""
    from triton.runtime.errors import InterpreterError

    try:
        return compiled(*args)
    except InterpreterError as e:
        if "Cannot call @triton.jit" not in str(e):
            raise
        raise AssertionError(
            "triton_expr calls a @triton.jit helper (tl.sigmoid, ...), which Triton's interpreter cannot call on a "
            f"CPU: write it out (sigmoid is 1 / (1 + exp(-x))). {e}"
        ) from None


def compare_ops(names, got, want, exact=(), rtol=0.0, atol=None):
    """Each output against eager with a message naming the op: NaN where eager has NaN, the same infinities, the
    sign of a zero, values to ``rtol`` (0 for the ops in ``exact``; ``atol``: {op: an absolute tolerance})."""
    wrong, atol = [], atol or {}
    for name, g, w in zip(names, got, want, strict=True):
        assert g.dtype == w.dtype, f"{name}: dtype {g.dtype}, eager {w.dtype}"
        if not w.is_floating_point():
            if not torch.equal(g, w):
                wrong.append(f"{name}: got {g.tolist()}, torch gives {w.tolist()}")
            continue
        g64, w64 = g.double(), w.double()
        tol = 0.0 if name in exact else rtol
        close = torch.isclose(g64, w64, rtol=tol, atol=atol.get(name, 0.0), equal_nan=True)
        zero_sign = (w64 != 0) | (torch.signbit(g64) == torch.signbit(w64))
        if not (close & zero_sign).all():
            wrong.append(f"{name}: got {g.tolist()}, torch gives {w.tolist()}")
    assert not wrong, "triton_expr's ops differ from torch (inputs: the special values):\n  " + "\n  ".join(wrong)


@pytest.mark.usefixtures("triton_renderer")
@pytest.mark.filterwarnings("ignore::RuntimeWarning")  # numpy's log(-1), 0/0 in the interpreter: the cases tested
@pytest.mark.parametrize("dtype", [torch.float32, torch.float64, torch.float16, torch.bfloat16], ids=str)
def test_triton_expr_of_every_float_op_on_special_values(dtype):
    """NaN, ±inf, ±0, tiny and negative values through every float op of triton_expr, in the interpreter: NaN
    propagates through maximum/minimum/relu from either side, comparisons with NaN are False, sqrt/log of a negative
    are NaN, -0.0 keeps its sign; half types are computed in float32 and rounded once."""
    x, y = special_inputs(dtype)
    c = compile_regions(Fn(float_ops), (x, y))
    erf = {"erf": 1e-7} if dtype in (torch.float16, torch.bfloat16) else {}  # eager's half erf: 6e-8 off near 0
    compare_ops(FLOAT_OPS, run_interpreted(c, x, y), float_ops(x, y), set(FLOAT_OPS) - NOT_EXACT, ULPS[dtype], erf)


@pytest.mark.usefixtures("triton_renderer")
@pytest.mark.filterwarnings("ignore::RuntimeWarning")  # numpy's 1/0 in the interpreter: the cases tested
@pytest.mark.parametrize("dtype", [torch.int8, torch.int32, torch.int64], ids=str)
def test_triton_expr_of_every_integer_op(dtype):
    """Integer arithmetic, comparisons, where and the bitwise ops (& and | of each bit, negative numbers included);
    int / int is a float32 division (0 / 0 is NaN)."""
    x = torch.tensor(INTS, dtype=dtype)
    y = torch.roll(x, 5)
    c = compile_regions(Fn(int_ops), (x, y))
    compare_ops(INT_OPS, c(x, y), int_ops(x, y), exact=INT_OPS)


@pytest.mark.usefixtures("triton_renderer")
def test_triton_expr_of_every_bool_op():
    """On bools add is or, mul is and (True + True is True: Triton's int1 arithmetic wraps), maximum is or, minimum
    is and; & | not, comparisons and where of bools."""
    a = torch.tensor(BOOL_A).repeat(2)
    b = torch.tensor(BOOL_B).repeat(2)
    c = compile_regions(Fn(bool_ops), (a, b))
    with mistake("bool add must be logical or and bool mul logical and (True + True is True), as torch computes them"):
        compare_ops(BOOL_OPS, c(a, b), bool_ops(a, b))


def test_every_lesson_op_is_tested_in_the_interpreter():
    """The three cases above (and pow's specials below) reach every op of LESSON_OPS: read off their kernels' IR."""
    seen: set[str] = set()
    x, y = special_inputs(torch.float32)
    for fn, args in (
        (float_ops, (x, y)),
        (int_ops, (torch.tensor(INTS), torch.tensor(INTS))),
        (bool_ops, (torch.tensor(BOOL_A), torch.tensor(BOOL_B))),
    ):
        gm = capture_aten(Fn(fn), args)
        regions = unique_regions(build_fusion_regions(gm))
        seen |= {
            s.op for r in regions for s in generate.generate_kernel(r).ir.statements() if isinstance(s, kernel_ir.Op)
        }
    assert triton_render.LESSON_OPS <= seen, sorted(triton_render.LESSON_OPS - seen)


def test_triton_expr_refuses_an_op_it_has_no_spelling_for():
    """Every op of LESSON_OPS has a spelling; any other op (the machinery's, or none at all) is Unsupported."""
    for op in triton_render.LESSON_OPS:
        n = 1 if op in UNARY_IR else 3 if op == "where" else 2
        assert isinstance(triton_expr(op, [f"t{i}" for i in range(n)], "float32"), str), op
    for op in ("digamma", "floordiv", "lgamma", "atan2"):
        with pytest.raises(Unsupported):
            triton_expr(op, ["t0", "t1"], "float32")


UNARY_IR = {"identity", "neg", "abs", "exp", "log", "sqrt", "rsqrt", "erf", "sin", "cos", "sigmoid", "tanh",
            "reciprocal", "relu", "logical_not"}  # fmt: skip


@contextlib.contextmanager
def gpu_division():
    """Triton's interpreter made to divide float32 as a GPU does: ``/`` is ``div.full.f32`` there, an approximation
    (up to 2 ulp off), here x * (1 / y) rounded to float32 (a float64 ``/`` stays exact, as on a GPU);
    ``tl.math.div_rn`` stays IEEE's division (numpy's)."""
    from triton.runtime import interpreter

    def approx(self, lhs, rhs):
        if lhs.data.dtype != np.float32:
            return self.binary_op(lhs, rhs, np.divide)
        return self.binary_op(lhs, rhs, lambda a, b: (a * (np.float32(1.0) / b)).astype(np.float32))

    with mock.patch.object(interpreter.InterpreterBuilder, "create_fdiv", approx):
        yield


@pytest.mark.usefixtures("triton_renderer")
@pytest.mark.filterwarnings("ignore::RuntimeWarning")
def test_means_and_rounded_divisions_are_exact_where_a_gpu_s_division_is_not():
    """A GPU's float32 ``/`` is within 2 ulp (``div.full.f32``; Inductor's, and Phase 8's ``truediv``); a mean must
    still give n equal values back exactly (LayerNorm's ``x - mean`` of a constant row is 0), and a division rounded
    toward zero must not move across an integer. The machinery divides those as IEEE does (``exact_div``:
    ``tl.math.div_rn``): checked in an interpreter whose ``/`` is a GPU-like approximation (:func:`gpu_division`)."""
    g = torch.Generator().manual_seed(3)
    x = torch.randn(6, 7, generator=g) * 100
    x[0], x[1] = 3.0, 0.5  # 7 equal values (exact sums): the mean is the value, x - mean is 0
    y = torch.tensor([3.0, 7.0, 0.3, 49.0, 1.5, 6.0])
    with gpu_division():
        for dtype in (torch.float32, torch.float16, torch.float64):
            a = x.to(dtype)
            fn = lambda a: a - (a * 1.0).mean(-1, keepdim=True)  # noqa: E731
            got = check(fn, a, kernels=1)(a)  # the other rows: eager's summation order differs by an ulp
            assert not got[:2].any(), got[:2]  # x * (1 / 7) of 21.0 is 3.0000002: not 0
        q = (torch.arange(6.0) * y).reshape(6, 1) * torch.ones(1, 4)  # exact multiples: q / y is an integer
        check(lambda q, y: torch.div(q + 0.0, y.reshape(6, 1), rounding_mode="trunc"), q, y, kernels=1, atol=0, rtol=0)


# ----------------------------------------------------------------------------------------------------------------------
# dtypes and memory layouts


@pytest.mark.parametrize("dtype", [torch.float16, torch.bfloat16])
def test_half_inputs_computed_in_float32_stored_in_their_dtype(dtype, renderer):
    m = models.ElementwiseChain(d=24).to(dtype)
    (x,) = models.elementwise_inputs(batch=7, d=24)
    x = x.to(dtype)
    c = compile_regions(m, (x,))
    with torch.no_grad():
        got, want = c(x), m(x)
        ref = m.float()(x.float()).to(dtype)  # computed in float32, rounded once
    assert got.dtype == dtype
    assert ".to(tl.float32)" in c.kernels[0].source
    torch.testing.assert_close(got, ref, atol=1e-2, rtol=1e-2)
    torch.testing.assert_close(got, want, atol=2e-2, rtol=2e-2)


def test_float64_is_exact(renderer):
    x, b = _rand((5, 7), 0, torch.float64), _rand((7,), 1, torch.float64)
    check(lambda x, b: (x * b + b) * 2.0 - x, x, b, kernels=1, atol=0, rtol=0)


@fewer(8)
@given(shape=st.tuples(st.integers(1, 9), st.integers(2, 9)), seed=st.integers(0, 2**16))
def test_non_contiguous_inputs(shape, seed):
    base = _rand((shape[1], shape[0] * 2), seed)
    xt = base.t()[::2]  # transposed and strided: (shape[0], shape[1])
    y = _rand(shape, seed + 1)
    assert not xt.is_contiguous()
    check(lambda a, b: torch.relu(a * 2.0 + b) - a, xt, y, kernels=1)


@fewer(8)
@given(n=st.integers(1, 3), c=st.integers(2, 9), hw=st.integers(1, 5), seed=st.integers(0, 2**16))
def test_channels_last_is_walked_in_memory_order(n, c, hw, seed):
    """A channels_last output is stored in memory order: the innermost index variable is the channel, so
    neighbouring lanes write neighbouring addresses (the logical NCHW order would put them c elements apart)."""
    x = _rand((n, c, hw, c + hw), seed).to(memory_format=torch.channels_last)  # W != C: x0 names the channel
    b = _rand((c, 1, 1), seed + 1)
    compiled = check(lambda x, b: torch.clamp(x * 2.0 + b, 0.0, 6.0), x, b, kernels=1)
    (k,) = compiled.kernels
    assert re.search(r"tl\.store\(out0 \+ \(xindex\)", k.source), k.source  # stored in memory order
    channel = re.search(rf"\b(x\d+) = xindex % {c}\n", k.source)  # the channel: the innermost index
    assert channel and re.search(rf"tl\.load\(in\d \+ \({channel[1]}\)", k.source), k.source  # b read at it


def test_views_inside_a_region_and_escaping_views(renderer):
    x = _rand((4, 6), 0)
    c = check(lambda x: ((x * 2.0).t() + 1.0).relu().reshape(3, 8) * 3.0, x, kernels=1)
    assert c.num_kernels == 1
    check(lambda x: ((x + 1.0) * 2.0).t(), x, kernels=1)  # the region's output is a view of a member
    check(lambda x, b: (x * b.unsqueeze(1)).exp() + 1.0, _rand((3, 5), 1), _rand((3,), 2), kernels=1)
    y = _rand((5, 9), 3)
    check(lambda y: y[1:, ::2].relu() * 2.0 + y[:-1, -5:], y, kernels=1)  # slices of an input
    check(lambda y: (y * 2.0)[:, 1:8:3].t().exp() + 1.0, y, kernels=1)  # slices of a computed value
    check(lambda y: (y * 2.0).select(1, -2).sigmoid() + y[:, 0], y, kernels=1)


def test_views_outside_kernels_are_one_reinterpret_of_their_base():
    """A view between library calls and a kernel's escaping view are rebuilt from the traced (size, stride, offset):
    one C++ call each, no view op dispatched at run time; an input that starts past its storage's first element
    (a slice of a bigger tensor) is still read where it starts."""
    from fusion.aten.nodes import reinterpret
    from fusion.ir.views import Take, ViewOf

    def fn(x, w):
        h = (x * 2.0 + 1.0).relu()  # one kernel; its transpose and a slice escape as views
        return h.t() @ w.t(), h[1:, ::2], h.view(-1)[3:7]

    x, w = _rand((6, 5), 0), _rand((4, 6), 1)
    c = check(fn, x, w, kernels=1)
    gm = c.compiled.graph_module
    views = [n for n in gm.graph.nodes if n.op == "call_function" and getattr(n.target, "is_view", False)]
    assert not views, [n.format_node() for n in views]
    assert any(n.target is reinterpret for n in gm.graph.nodes)
    (launcher,) = c.compiled.launchers
    assert all(  # every escaping value a buffer or a strided view of one: nothing rebuilt op by op
        isinstance(r, (Take, ViewOf)) for r in launcher.owner.plan.results
    ), launcher.owner.plan.results
    big_x, big_w = _rand((7, 5), 2), _rand((5, 6), 3)
    x2, w2 = big_x[1:], big_w[1:]  # same shapes and strides, storage offsets 5 and 6
    for got, want in zip(c(x2, w2), fn(x2, w2), strict=True):
        torch.testing.assert_close(got, want)
        assert got.shape == want.shape and got.stride() == want.stride()


def test_a_reduction_over_dims_that_are_not_innermost_in_memory_runs_as_aten():
    """channels_last, mean over H and W: C is the innermost dim, so a program per (n, c) row would read its row one
    scattered element at a time. That reduction runs as aten (coalesced) and the pointwise work around it still
    fuses; the same model in NCHW reduces contiguous rows in one generated kernel."""

    def f(x):
        h = torch.sigmoid(x * 2.0 + 1.0)
        return h.mean((2, 3), keepdim=True) * 3.0 + 1.0, h

    x = _rand((2, 5, 3, 4), 0)
    c = check(f, x.contiguous(memory_format=torch.channels_last))
    assert any("innermost" in s.reason for s in c.report.skipped), c.report.table()
    assert all(k.kind == "pointwise" for k in c.kernels) and c.num_kernels >= 1
    c = check(f, x)
    assert not c.report.skipped and any(k.kind == "reduction" for k in c.kernels), c.report.table()
    # An SE block's mean over 3x3 of 2048 channels: 16 neighbouring channels a program (a GPU's tile), one kernel.
    c = check(f, _rand((2, 2048, 3, 3), 1).contiguous(memory_format=torch.channels_last), atol=1e-5, rtol=1e-5)
    assert not c.report.skipped and [k.kind for k in c.kernels] == ["reduction"], c.report.table()


def test_contiguous_tensors_are_read_and_written_at_the_flat_index():
    """The walk's own order needs no per-dimension index: a load or store at the contiguous strides of the walk is at
    ``xindex`` (the // and % that split it would only be multiplied back together); a broadcast operand is not."""
    x, b = _rand((3, 5, 7), 0), _rand((7,), 1)
    (k,) = check(lambda x, b: torch.relu(x * 2.0 + b), x, b, kernels=1).kernels
    assert re.search(r"tl\.load\(in\d \+ \(xindex\)", k.source) and "out0 + (xindex)" in k.source, k.source
    inner = re.search(r"\b(x\d+) = xindex % 7\n", k.source)  # the bias, broadcast over rows
    assert inner and re.search(rf"tl\.load\(in\d \+ \({inner[1]}\)", k.source), k.source


def test_a_bfloat16_value_is_never_rounded_twice():
    """A loaded bfloat16 or an already rounded value is used as it is (rounding it again is the identity). GELU in
    bfloat16 rounds twice: x * 2.0 (eager rounds it) and the final convert."""
    x = _rand((4, 33), 0, torch.bfloat16)
    (k,) = check(lambda x: F.gelu(x * 2.0), x, kernels=1).kernels
    assert k.source.count(".to(tl.bfloat16).to(tl.float32)") == 2, k.source


def test_strides_of_size_one_dims_do_not_matter():
    """(1, C, 1, 1) tensors may come back from a library call with other strides in the size-1 dims: same layout."""
    x = _rand((1, 6, 1, 1), 0)
    compiled = check(lambda x: torch.relu(x * 2.0) + 1.0, x, kernels=1)
    odd = torch.empty_strided((1, 6, 1, 1), (6, 1, 6, 6)).copy_(x)
    torch.testing.assert_close(compiled(odd), torch.relu(x * 2.0) + 1.0)


def test_a_call_with_other_shapes_is_a_clear_error():
    x = _rand((4, 6), 0)
    c = compile_regions(Fn(lambda x: torch.relu(x * 2.0)), (x,))
    with pytest.raises(ValueError, match="generated for"):
        c(_rand((5, 6), 0))


# ----------------------------------------------------------------------------------------------------------------------
# Several outputs, matmul boundaries, fallbacks


def test_two_outputs_one_kernel():
    x = _rand((5, 7), 0)

    def siblings(x):
        h = x * 2.0  # read by two consumers: sibling outputs of one kernel (horizontal fusion at the kernel level)
        return torch.relu(h), h + 1.0

    c = check(siblings, x, kernels=1)
    assert c.kernels[0].source.count("tl.store") == 2
    c = check(lambda x: (lambda h: (h, torch.sigmoid(h)))(x * 2.0 + 1.0), x, kernels=1)  # a member used inside too
    assert c.kernels[0].source.count("tl.store") == 2
    assert c.library_calls == 0


def test_matmul_between_two_chains_gives_two_kernels():
    x, w = _rand((6, 5), 0), _rand((5, 3), 1)
    c = check(lambda x, w: torch.sigmoid(torch.relu(x * 2.0 + 1.0) @ w) * 3.0 - 1.0, x, w, kernels=2)
    assert c.library_calls == 1  # the mm
    assert all(k.name.startswith("triton_poi_fused_") for k in c.kernels)
    assert len({k.name for k in c.kernels}) == 2


def test_unsupported_op_falls_back_with_a_reason():
    x = _rand((4, 6), 0)
    c = check(lambda x: (NO_LINE(x * 2.0) + 1.0, torch.relu(x @ x.t()) * 3.0), x, kernels=1)
    (skip,) = c.report.skipped
    assert skip.nodes == ("digamma",) and skip.reason.strip()  # which op fell back; the wording is the solution's
    c = check(lambda x: (x * 2.0).sum(0) + 1.0, x, kernels=0)  # a reduction over the first dimension
    assert c.report.skipped and "dim" in c.report.skipped[0].reason
    c = check(lambda x: torch.div(x * 4.0, 3.0, rounding_mode="floor") + 1.0, x, kernels=1)  # machinery's floordiv
    assert not c.report.skipped, c.report.table()


def test_compile_graph_on_an_aten_graph():
    m = models.ElementwiseChain(d=8)
    (x,) = models.elementwise_inputs(batch=3, d=8)
    gm = capture_aten(m, (x,))
    flat = aten_inputs(m, (x,))
    cg = compile_graph(gm, flat)
    with torch.no_grad():
        torch.testing.assert_close(cg(*flat), gm(*flat))
    (k,) = cg.kernels
    assert cg.num_kernels == 1 and k.region.nodes[0].graph is gm.graph and k.kind == "pointwise"
    assert "tl.store" in k.source and f"def {k.name}(" in k.source
    ops = [f"{n.name} = {n.target}" for n in k.region.nodes if n.op == "call_function"]
    assert k.ops == ops, (k.ops, ops)  # the aten ops it computes, one per node
    assert "pointwise kernel" in cg.report.table() and "triton (ir)" not in cg.report.table(), cg.report.table()


# ----------------------------------------------------------------------------------------------------------------------
# Reductions over the last dimension(s)


@fewer(8)
@given(rows=st.integers(1, 6), n=st.integers(1, 40), seed=st.integers(0, 2**16))
def test_softmax_is_one_kernel(rows, n, seed):
    x = _rand((rows, n), seed) * 4
    check(lambda x: torch.softmax(x, dim=-1), x, kernels=1)


@fewer(8)
@given(shape=st.tuples(st.integers(1, 3), st.integers(1, 4), st.integers(1, 33)), seed=st.integers(0, 2**16))
def test_layernorm_gelu_residual_is_one_kernel(shape, seed):
    m = models.NormGELUResidual(d_model=shape[-1])
    x = _rand(shape, seed)
    c = compile_regions(m, (x,))
    with torch.no_grad():
        torch.testing.assert_close(c(x), m(x), atol=1e-5, rtol=1e-4)
    assert c.num_kernels == 1 and c.kernels[0].name.startswith("triton_per_fused_")


def test_reductions_sum_mean_amax_var_keepdim_or_not(renderer):
    x = _rand((3, 4, 7), 0)

    def rows(x):
        x = x * 1.0  # one region: every reduction reads this member
        return (
            x.sum(-1), x.mean(-1, keepdim=True) * 2.0, x.amax(-1) + 1.0, torch.var(x, -1) * 1.0,
            x - x.mean(-1, keepdim=True), torch.var_mean(x, -1, correction=0)[0] + 0.0, x.amin(-1) * 1.0,
        )  # fmt: skip

    check(rows, x, kernels=1)
    check(lambda x: (x * 2.0).sum((-1, -2)) + 1.0, x, kernels=1)  # a global pool: the row is the last two dims
    check(lambda x: (x * 2.0).sum() + 1.0, x, kernels=1)  # everything is one row
    # two row shapes: the region is cut at the second reduction, the first still fuses with its producer
    c = check(lambda x: (x * 2.0).amax(-1, keepdim=True) - x.sum(1, keepdim=True), x, kernels=1)
    assert [d.nodes for d in c.report.skipped] == [("sum_1",)], c.report.table()
    check(lambda x: torch.softmax(x.half() * 2.0, dim=-1), x, kernels=1, atol=1e-3, rtol=1e-3)


def test_rows_per_program_fills_blocks_but_keeps_the_gpu_busy():
    from fusion.ir.plan import ELEMENTS_PER_PROGRAM, FILL_PROGRAMS, row_warps, rows_per_program

    for rows, rblock in itertools.product((1, 7, 64, 4096, 100352), (1, 2, 128, 1024, 16384)):
        xblock = rows_per_program(rows, rblock)
        assert xblock & (xblock - 1) == 0 and (xblock == 1 or xblock * rblock <= ELEMENTS_PER_PROGRAM)
        assert xblock == 1 or -(-rows // xblock) >= FILL_PROGRAMS  # never fewer programs than the GPU wants
        assert 2 <= row_warps(rows, rblock) <= 8
    assert rows_per_program(100352, 128) == 32  # ConvNeXt's LayerNorm over 96 channels: 32 rows a program
    assert rows_per_program(64, 16384) == 1


@contextlib.contextmanager
def short_blocks(max_rblock=16, min_rows=1):
    """Rows longer than ``max_rblock`` are looped (RBLOCK max_rblock // 4), however few: small tensors take the loop."""
    with (
        mock.patch.object(generate, "MAX_RBLOCK", max_rblock),  # the rows' check
        mock.patch.object(triton_launch, "MAX_RBLOCK", max_rblock),  # the Triton kernel's blocks
        mock.patch.object(kernel_rows, "LOOPED_MIN_ROWS", min_rows),
    ):
        yield


@fewer(8)
@given(rows=st.integers(1, 5), n=st.integers(1, 70), seed=st.integers(0, 2**16), special=st.booleans())
def test_rows_longer_than_a_block_are_reduced_in_a_loop(rows, n, seed, special):
    """A row of more than MAX_RBLOCK elements: each reduction is a loop over blocks (partials folded, then one
    tl.reduce), the whole-row stores one more loop; the same answers as one block, NaN and inf included."""
    x = _rand((rows, n), seed) * 4
    if special:  # (eager's var_mean of a row holding inf is NaN, Welford's artefact: the mean is inf)
        x[0, n // 2], x[-1, 0] = float("nan"), float("inf")

    def rows_(x):
        y = x * 2.0
        return torch.softmax(y, -1), y.amax(-1), y.amin(-1, keepdim=True), y.sum(-1)

    def moments(x):
        y = x * 2.0
        return torch.var_mean(y, -1, correction=0), torch.var(y, -1, keepdim=True), F.layer_norm(y, (n,))

    with short_blocks():
        compiled = check(rows_, x, kernels=1, atol=1e-5, rtol=1e-4)
        check(moments, _rand((rows, n), seed + 1) * 4, kernels=1, atol=1e-5, rtol=1e-4)
    assert compiled.kernels[0].name.startswith("triton_red_fused_" if n > 16 else "triton_per_fused_")
    if n > 16:
        assert "for roffset in range(0, " in compiled.kernels[0].source


@pytest.mark.usefixtures("triton_renderer")
@pytest.mark.parametrize("looped", [False, True])
def test_a_long_sum_keeps_its_small_terms_as_eager_does(looped):
    """1.0 then 4095 terms of 1e-8, in float32: added one by one to the running 1.0 each term is lost (the sum stays
    1.0); eager's cascade, a GPU's tree and Triton's interpreter sum the small terms together first (1.00004095). The
    generator's sums are trees in the interpreter too (Triton's own combine function: numpy's pairwise sum), in one
    block or over a looped row's partials."""
    x = torch.full((2, 4096), 1e-8)
    x[:, 0] = 1.0
    with short_blocks(max_rblock=1024) if looped else contextlib.nullcontext():
        # looped: each lane's partial folds 16 blocks in turn, its 15 small terms lost beside the 1.0 (4 ulp)
        compiled = check(lambda x: (x * 1.0).sum(-1), x, kernels=1, atol=0, rtol=6e-7 if looped else 2e-7)
    assert ("for roffset" in compiled.kernels[0].source) == looped


def test_looped_reductions_of_every_kind(renderer):
    """Loops over one and several reduced dims, float64 exact to the last bits, half rounded where eager rounds, a
    transposed input, a whole tensor as one row, a column (leading dims) reduced in a loop."""
    x = _rand((3, 5, 7), 1)
    with short_blocks():
        check(lambda x: (x * 2.0).sum((-1, -2)) + 1.0, x, kernels=1)  # a row of 35 in blocks of 4
        check(lambda x: (x * 2.0).sum() + 1.0, x, kernels=1)  # everything is one row
        check(lambda x: torch.softmax(x.double() * 3.0, -1), _rand((4, 40), 2, torch.float64), kernels=1)
        check(lambda x: torch.softmax(x.half() * 2.0, -1), _rand((4, 40), 3), kernels=1, atol=1e-3, rtol=1e-3)
        check(lambda x: torch.softmax(x.t() * 2.0, -1), _rand((40, 3), 4), kernels=1)
        check(lambda x: torch.softmax(x.bfloat16() * 2.0, -1), _rand((4, 40), 5), kernels=1, atol=1e-2, rtol=1e-2)
        c = check(lambda x: ((x * 2.0).sum(0), (x * 2.0).var(0)), _rand((20, 17), 6), kernels=2, atol=1e-5, rtol=1e-4)
    assert all("for roffset" in k.source for k in c.kernels), [k.source for k in c.kernels]


def test_few_long_rows_run_as_aten_with_the_reason(renderer):
    """Rows past one block, fewer than LOOPED_MIN_ROWS: one program a row would idle the GPU; aten's reduction spreads
    a row over it. The refusal names the counts; the answer is eager's. The rule is a GPU's: where C runs the kernel
    (a CPU, whose one thread walks the rows anyway) the same rows are one kernel, rows and columns alike."""
    softmax, column = (lambda x: torch.softmax(x * 2.0, -1)), (lambda x: ((x * 2.0).sum(0),))
    with short_blocks(min_rows=kernel_rows.LOOPED_MIN_ROWS):
        c = check(softmax, _rand((3, 40), 0), kernels=1 if renderer == "c" else None)
        cols = check(column, _rand((40, 20), 1), kernels=1 if renderer == "c" else 0)
    if renderer == "c":
        assert not c.report.skipped and not cols.report.skipped, c.report.table()
        return
    reasons = " ".join(d.reason for d in c.report.skipped)
    assert "3 row(s) of 40 elements" in reasons and f"< {kernel_rows.LOOPED_MIN_ROWS}" in reasons, reasons
    assert any("20 row(s) of 40 elements" in s.reason for s in cols.report.skipped), cols.report.table()


@pytest.mark.parametrize(
    "device",
    ["cpu", pytest.param("cuda", marks=pytest.mark.skipif(not torch.cuda.is_available(), reason="needs a GPU"))],
)
def test_a_row_past_max_rblock_at_the_real_sizes(device):
    """No row-length limit: rows of MAX_RBLOCK (16384) + 1 elements, a softmax in one looped kernel (on the CPU one row,
    the interpreter takes ~0.4 s a row; on a GPU LOOPED_MIN_ROWS rows)."""
    rows = kernel_rows.LOOPED_MIN_ROWS if device == "cuda" else 1
    x = _rand((rows, codegen.MAX_RBLOCK + 1), 0).to(device)
    with mock.patch.object(kernel_rows, "LOOPED_MIN_ROWS", rows):
        c = check(lambda x: torch.softmax(x * 2.0, -1), x, kernels=1)
    assert c.kernels[0].name.startswith("triton_red_fused_")


@fewer(8)
@given(shape=st.tuples(st.integers(1, 4), st.integers(1, 5), st.integers(1, 40)), seed=st.integers(0, 2**16))
def test_a_transposed_copy_of_the_rows_is_stored_by_the_reduction_kernel(shape, seed):
    """MultiheadAttention's in-projection reads LayerNorm's output transposed, copied to row order: the LayerNorm
    kernel stores that copy itself (each element from the program holding its row), no separate copy kernel; also
    when the rows are looped, and for a permute of three dims."""
    x = _rand(shape, seed)

    def ln_t(x):
        y = F.layer_norm(x * 2.0, (shape[-1],))
        return y.transpose(0, 1).contiguous(), y.permute(1, 0, 2).contiguous() * 1.0

    # (a, a, n): the permuted copy times 1.0 has the rows' shape but reads other rows: a second kernel reads them;
    # (a, b, n): it has another shape, no row's: a second kernel computes it (kernels.row_splits), nothing runs as
    # aten; a dim of 1 moved keeps the elements' order: the plain copy is a reshape of the rows, stored by the
    # reduction kernel, and the copy times 1.0 a second kernel (with the ops before it no reduction reads) or none
    for blocks in (contextlib.nullcontext, short_blocks):
        with blocks():
            c = check(ln_t, x, atol=1e-5, rtol=1e-4)
        assert c.num_kernels == 2 or (1 in shape[:2] and c.num_kernels == 1), c.report.table()
        assert c.library_calls == 0, c.report.table()  # nothing left to aten
    # the innermost dim moved: lanes would write scattered addresses, the copy runs as aten (the softmax still fuses)
    check(lambda x: torch.softmax(x * 2.0, -1).permute(2, 0, 1).contiguous(), x)


@pytest.mark.parametrize("shift", [0, 2], ids=["window", "shifted window"])
def test_a_window_partition_after_a_layer_norm_is_a_generated_copy(shift):
    """Swin's block: LayerNorm, the shifted window's ``roll`` (slices and a cat per dim), then the window partition, a
    copy of a 6-d permutation no row walk can store. The copy is a second, pointwise kernel with the roll (the roll
    reads other rows) or, unshifted, with the LayerNorm's bias add: two kernels, nothing left to aten."""
    b, h, c, win = 2, 8, 16, 4
    x, w, bias = _rand((b, h, h, c), 0), _rand((c,), 1), _rand((c,), 2)

    def block(x, w, bias):
        y = F.layer_norm(x, (c,), w, bias)
        if shift:
            y = torch.roll(y, shifts=(-shift, -shift), dims=(1, 2))
        y = y.view(b, h // win, win, h // win, win, c).permute(0, 1, 3, 2, 4, 5).contiguous()
        return y.view(-1, win * win, c)

    c_ = check(block, x, w, bias, kernels=2, atol=1e-5, rtol=1e-4)
    assert c_.library_calls == 0, c_.report.table()


@pytest.mark.parametrize("shape", [(2, 2, 5), (3, 3, 1)], ids=str)
def test_a_transposed_copy_of_square_leading_dims_is_a_second_kernel_not_aten(shape):
    """(a, a, n): the permuted copy times 1.0 has the rows' shape but reads other rows: a second kernel reads what the
    reduction kernel stores; nothing runs as aten."""
    x = _rand(shape, 0)

    def ln_t(x):
        y = F.layer_norm(x * 2.0, (shape[-1],))
        return y.transpose(0, 1).contiguous(), y.permute(1, 0, 2).contiguous() * 1.0

    c = check(ln_t, x, kernels=2, atol=1e-5, rtol=1e-4)
    assert c.library_calls == 0 and not c.report.skipped, c.report.table()


@pytest.mark.parametrize("dtype", [torch.bfloat16, torch.float16])
def test_a_transposed_copy_cast_to_another_dtype_is_stored_by_the_reduction_kernel(dtype):
    """Under autocast, MultiheadAttention's in-projection reads LayerNorm's output transposed *and cast*
    (permute -> convert_element_type -> clone: ViT's training forward): the LayerNorm kernel still stores it, each
    element rounded once to the copy's dtype as eager rounds it, and the rows themselves too; was an aten copy."""
    x = _rand((4, 6, 40), 0)

    def fn(x):
        y = F.layer_norm(x * 2.0, (40,))
        return y.permute(1, 0, 2).to(dtype).contiguous(), y.transpose(0, 1).to(dtype), y

    compiled = check(fn, x, kernels=1)
    assert compiled.library_calls == 0, compiled.report.table()


@pytest.mark.parametrize("dtype", [torch.float32, torch.bfloat16])
def test_a_stack_reshaped_to_the_rows_is_stored_by_the_kernel_that_sums_it(dtype):
    """Attention's packed q/k/v gradient: three pieces stacked (a cat), permuted, copied and viewed as the rows whose
    columns the bias gradient sums: one kernel stores the stack and sums it (every element is loads of the inputs at
    its own index: no reduction before it). After a reduction the same reshape stays refused (a second kernel)."""
    a, b, c = (_rand((5, 3, 8), s).to(dtype) for s in (1, 2, 3))

    def fn(a, b, c):
        stack = torch.stack([a, b, c], 0).permute(1, 2, 0, 3).contiguous()  # (5, 3, 3, 8)
        return stack, stack.view(5, 3, 24).sum([0, 1])

    compiled = check(fn, a, b, c, kernels=1)
    assert compiled.library_calls == 0, compiled.report.table()

    def after(a, b, c):  # the stack of a softmax's rows: reads rows the program does not hold
        s = torch.softmax(torch.stack([a, b, c], 0), -1).permute(1, 2, 0, 3).contiguous()
        return s, s.view(5, 3, 24).sum(-1)

    check(after, a, b, c)


# ----------------------------------------------------------------------------------------------------------------------
# cat: selects between masked loads


@st.composite
def cats(draw):
    """(inputs, dim): 1-4 tensors of one rank (1-3) that differ only along ``dim``; some transposed or broadcast."""
    rank = draw(st.integers(1, 3))
    shape = draw(st.lists(st.integers(1, 5), min_size=rank, max_size=rank))
    dim = draw(st.integers(-rank, rank - 1))
    seed, tensors = draw(st.integers(0, 2**16)), []
    for k in range(draw(st.integers(1, 4))):
        size = list(shape)
        size[dim] = draw(st.integers(1, 4))
        t = _rand(size, seed + k)
        if rank > 1 and draw(st.booleans()):  # non-contiguous: a transposed copy, transposed back
            t = t.transpose(0, -1).contiguous().transpose(0, -1)
        tensors.append(t)
    return tensors, dim


@fewer(8)
@given(case=cats())
def test_cat_is_one_kernel_with_its_neighbours(case):
    """cat between pointwise ops: one kernel, each output element one load from the input its index falls in."""
    tensors, dim = case

    def fn(*xs):
        return torch.cat([x * (k + 1.0) for k, x in enumerate(xs)], dim).relu() - 0.5

    check(fn, *tensors, kernels=1)


def test_rotary_embedding_is_one_kernel():
    """Llama's rotate_half (cat of the negated second half and the first half) inside q * cos + rotate_half(q) * sin."""

    def rope(q, cos, sin):
        half = q.shape[-1] // 2
        return q * cos + torch.cat((-q[..., half:], q[..., :half]), -1) * sin

    q, cos, sin = _rand((2, 3, 5, 8), 0), _rand((5, 8), 1), _rand((5, 8), 2)
    check(rope, q, cos, sin, kernels=1)
    check(rope, q.half(), cos.half(), sin.half(), kernels=1, atol=1e-3, rtol=1e-3)


def test_cat_promotes_selects_and_reduces_like_eager(renderer):
    """The cat's dtype is the inputs' promoted dtype; a constant index reads one input; a cat inside a reduction
    kernel (the row crosses inputs); booleans; an input with NaN/inf picked exactly where eager picks it."""
    a, b = _rand((3, 4), 0), _rand((3, 5), 1)
    b[1, 2], b[2, 0] = float("nan"), float("-inf")
    check(lambda a, b: torch.cat([a.half() * 2, b], 1) + 1, a, b, kernels=1)
    check(lambda a, b: (torch.cat([a * 2, b], 1) * 2)[:, 5], a, b, kernels=1)
    check(lambda a, b: torch.softmax(torch.cat([a * 2, b], 1), -1), a, b, kernels=1)
    check(lambda a, b: torch.cat([a > 0, b > 0], 1).logical_not(), a, b, kernels=1)
    check(lambda a, b: torch.cat([a.double() * 3, b.t().double()], 0) - 1, a, _rand((4, 2), 2), kernels=1)


def test_outputs_that_do_not_broadcast_together_are_two_kernels_not_aten():
    """Grouped-query attention's rotary embedding: q (b, 4 heads, s, d) and k (b, 2 heads, s, d) share cos and sin,
    so Phase 6 puts both in one region; no walk covers both shapes. The region becomes two kernels (what q needs, the
    rest), nothing runs as aten, the answer is eager's."""

    def rope(q, k, cos, sin):
        half = q.shape[-1] // 2
        c, s_ = cos * 1.0, sin * 1.0  # shared members of both sides

        def rot(x):
            return torch.cat((-x[..., half:], x[..., :half]), -1)

        return q * c + rot(q) * s_, (k * c + rot(k) * s_)[:, :, None].expand(2, 2, 2, 5, 8).clone()

    q, k, cos, sin = _rand((2, 4, 5, 8), 0), _rand((2, 2, 5, 8), 1), _rand((5, 8), 2), _rand((5, 8), 3)
    c = check(rope, q, k, cos, sin, kernels=2)
    assert not c.report.skipped, c.report.table()


def test_a_repeated_sin_table_gets_its_own_c_kernel(renderer):
    """Llama's rotary tables: sin and cos of positions x frequencies, (s, d), stored (later layers read them) beside
    keys rotated with them, (b, heads, s, d). One C loop over the keys computes each table entry b x heads times over;
    the C renderer splits the tables off into one kernel of their own (sin and cos together), and the keys' kernel
    reads them. Triton keeps one kernel (a GPU's repeats hide under its memory traffic). No split where the table
    repeats fewer than 4 times, or holds nothing costlier than a multiply. Values as eager's, with NaN and inf."""

    def rope(k, pos, freq):
        t = pos[:, None] * freq[None, :]
        cos, sin = torch.cat((t, t), -1).cos(), torch.cat((t, t), -1).sin()
        half = k.shape[-1] // 2
        rot = torch.cat((-k[..., half:], k[..., :half]), -1)
        return k * cos + rot * sin, cos, sin

    pos, freq = torch.arange(5.0), _rand((4,), 1)
    pos[3] = float("inf")
    k = _rand((2, 3, 5, 8), 0)
    k[0, 1, 2, 3] = float("nan")
    split = renderer == "c"
    c = check(rope, k, pos, freq, kernels=2 if split else 1)
    assert not c.report.skipped, c.report.table()
    if split:
        trig = {torch.ops.aten.sin.default, torch.ops.aten.cos.default}
        has = [trig & {n.target for n in k.region.nodes} for k in c.kernels]
        assert sorted(map(len, has)) == [0, 2], [k.name for k in c.kernels]  # sin and cos in one kernel, keys apart
    check(rope, k[:1, :3], pos, freq, kernels=1)  # repeated 3 times: one kernel
    check(lambda k, pos, freq: (k * (pos[:, None] * freq), pos[:, None] * freq), k, pos, _rand((8,), 2), kernels=1)


def test_a_side_that_reads_the_other_is_launched_after_it():
    """The two sides interleave in the graph: b0 (second side) comes before a0 (first side), and b1 reads a0. The
    second kernel's call must sit after the first's (fusion.compiler.partition.place_after_producers)."""

    def interleaved(x, y, c):
        b0 = y * 2.0  # (2, 3): the second side, first in the graph
        a0 = c * 3.0  # (3,): what the first output needs, read by the second side too
        return x + a0, (b0 + a0) * 0.5  # (4, 3) and (2, 3): no broadcast between them

    c = check(interleaved, _rand((4, 3), 0), _rand((2, 3), 1), _rand((3,), 2), kernels=2)
    assert not c.report.skipped, c.report.table()


@pytest.mark.usefixtures("triton_renderer")
@fewer(6)
@given(
    kernel=st.integers(1, 3), stride=st.integers(1, 3), padding=st.integers(0, 1), dilation=st.integers(1, 2),
    ceil=st.booleans(), size=st.tuples(st.integers(1, 2), st.integers(1, 7), st.integers(1, 7)),
    channels_last=st.booleans(), seed=st.integers(0, 2**16),
)  # fmt: skip
def test_max_pool_values_are_one_kernel_with_the_ops_around_them(
    kernel, stride, padding, dilation, ceil, size, channels_last, seed
):
    """A max-pool's values: the max over the window's loads, masked to the input (padding never read), NaN
    propagated as torch's max-pool does, the ReLU before it and the add after it in the same kernel."""
    assume(padding <= kernel // 2 and (size[1] + 2 * padding - dilation * (kernel - 1)) >= 1)
    assume((size[2] + 2 * padding - dilation * (kernel - 1)) >= 1)
    x = _rand((2, *size), seed) * 3
    x[0, 0, 0, 0], x[-1, -1, -1, -1] = float("nan"), float("-inf")
    if channels_last:
        x = x.to(memory_format=torch.channels_last)

    def pool(x):
        return F.max_pool2d(torch.relu(x * 2.0 - 1.0), kernel, stride, padding, dilation, ceil_mode=ceil) + 0.5

    check(pool, x, kernels=1)


@pytest.mark.usefixtures("triton_renderer")
def test_max_pool_in_bfloat16_and_with_its_indices():
    """bfloat16 pooled exactly (a max rounds nothing); where the indices are read (a backward), the pool runs as aten
    and the ops before it still fuse."""
    x = _rand((2, 3, 8, 7), 5)
    check(lambda x: F.max_pool2d(x.bfloat16() * 2.0, 3, 2, 1) * 1.5, x, kernels=1)
    c = check(lambda x: F.max_pool2d(torch.relu(x * 2.0), 2, return_indices=True), x, kernels=1)
    assert any("max_pool" in d.reason or "max_pool" in " ".join(d.nodes) for d in c.report.skipped), c.report.table()


# ----------------------------------------------------------------------------------------------------------------------
# The course's models


@pytest.mark.parametrize(
    "name, make, inputs, kernels",
    [
        ("TinyNet", models.TinyNet, models.tiny_inputs, 1),
        ("MLP", models.MLP, models.mlp_inputs, 1),
        ("TransformerMLP", models.TransformerMLP, models.transformer_inputs, 2),
        ("ElementwiseChain", models.ElementwiseChain, models.elementwise_inputs, 1),
        ("ConvBNNet", lambda: models.ConvBNNet().eval(), lambda: models.conv_inputs(size=6), 3),
        ("NormGELUResidual", models.NormGELUResidual, models.norm_inputs, 1),
        ("ScaledSoftmax", models.ScaledSoftmax, models.norm_inputs, 1),
    ],
)
def test_demo_models_equal_eager(name, make, inputs, kernels):
    model, x = make(), inputs()
    before = {k: v.clone() for k, v in model.state_dict().items()}
    c = compile_regions(model, x)
    with torch.no_grad():
        torch.testing.assert_close(c(*x), model(*x), atol=1e-5, rtol=1e-4)
    assert c.num_kernels == kernels, c.report.table()
    assert not c.report.skipped, c.report.table()
    for k, v in model.state_dict().items():  # the caller's model is untouched
        torch.testing.assert_close(v, before[k])


@pytest.mark.skipif(not torch.cuda.is_available(), reason="needs a GPU: Triton compiles for CUDA")
def test_cuda_kernels_match_eager():
    m = models.NormGELUResidual(d_model=1024).cuda().half()
    x = _rand((4, 32, 1024), 0, torch.float16).cuda()
    c = compile_regions(m, (x,))
    with torch.no_grad():
        torch.testing.assert_close(c(x), m(x), atol=2e-2, rtol=2e-2)
    ln = lambda x, w, b: F.layer_norm(x * 2.0, (96,), w, b)  # noqa: E731  ConvNeXt's rows of 96: several a program
    check(
        ln,
        _rand((2, 37, 41, 96), 3).cuda(),
        _rand((96,), 4).cuda(),
        _rand((96,), 5).cuda(),
        kernels=1,
        atol=1e-5,
        rtol=1e-4,
    )
    se = lambda x: (lambda h: (h.mean((2, 3), keepdim=True) * 3.0, h))(torch.sigmoid(x * 2.0))  # noqa: E731
    x = _rand((8, 960, 7, 7), 6, torch.bfloat16).cuda().contiguous(memory_format=torch.channels_last)
    assert check(se, x, atol=1e-2, rtol=1e-2).kernels[0].kind == "reduction"  # channels_last SE mean: 16 rows a tile
    check(unary_ops, _rand((33, 70), 1).cuda(), kernels=1)
    check(binary_ops, _rand((33, 70), 1).cuda(), _rand((70,), 2).cuda(), kernels=1)


@pytest.mark.usefixtures("triton_renderer")
def test_without_triton_every_region_falls_back_and_the_lesson_still_prints_source(monkeypatch, capsys):
    from fusion import codegen

    monkeypatch.setattr(rt, "triton_status", lambda: (False, "Triton is not installed here"))
    c = check(lambda x: torch.relu(x * 2.0 + 1.0), _rand((3, 4), 0), kernels=0)
    assert "not installed" in c.report.skipped[0].reason
    codegen.run(quick=True)
    out = capsys.readouterr().out
    assert "@triton.jit" in out and "cannot run here" in out


def test_the_inception_blocks_cat_is_generated_with_the_relu_before_it():
    m, x = models.InceptionBlock(), models.inception_inputs(size=4)  # max-pool and cat
    c = compile_regions(m, x)
    with torch.no_grad():
        torch.testing.assert_close(c(*x), m(*x))
    assert any("cat" in [n.name for n in k.region.nodes] for k in c.kernels), [k.name for k in c.kernels]
    assert all(d.reason.startswith("runs as") for d in c.report.skipped)


def _fallback_reasons_are_clean(report):
    for d in report.skipped:
        assert d.reason.startswith("runs as") and "internal error" not in d.reason, d.reason
        assert not any(e in d.reason for e in ("AttributeError", "KeyError", "TypeError", "IndexError")), d.reason


def test_an_unsupported_op_cuts_the_region_and_the_pieces_still_fuse():
    x = _rand((5, 7), 0)
    c = check(lambda x: torch.relu(NO_LINE(torch.relu(x * 2.0)) * 3.0) + 1.0, x, kernels=2)
    assert c.library_calls == 1  # the digamma, between the two kernels
    (cut,) = c.report.skipped
    assert cut.nodes == ("digamma",) and "digamma" in cut.reason
    # the cut op feeds a member before it in graph order: the pieces before/after it stay in dependency order
    c = check(lambda x: (lambda a: a * NO_LINE(a) + 1.0)(torch.relu(x * 2.0)), x, kernels=2)
    _fallback_reasons_are_clean(c.report)
    c = check(lambda x: torch.softmax(NO_LINE(x * 2.0), -1) * 3.0, x, kernels=1)  # the softmax after the cut
    assert c.kernels[0].kind == "reduction"
    c = check(lambda x: torch.relu(NO_LINE_2(NO_LINE(x * 2.0 - 1.0) + 1.0) * 2.0) + x, x, kernels=2)  # two cuts
    assert sorted(d.nodes for d in c.report.skipped) == [("digamma",), ("special_ndtri",)], c.report.table()


@fewer(8)
@given(ops=st.lists(st.sampled_from(["mul", "add", "relu", "cut"]), min_size=1, max_size=8), shape=dims)
def test_a_chain_cut_at_every_unsupported_op_gives_one_kernel_per_run_of_two_or_more(ops, shape):
    """x → op → op → …: each run of >= 2 supported ops between cuts is one kernel; every cut op is one aten call."""
    steps = {"mul": lambda t: t * 1.5, "add": lambda t: t + 0.5, "relu": torch.relu, "cut": NO_LINE}

    def chain(x):
        for op in ops:
            x = steps[op](x)
        return x

    runs = "".join("s" if op == "cut" else "k" for op in ops).split("s")
    c = check(chain, _rand(tuple(shape), 0), kernels=sum(len(r) >= 2 for r in runs))
    assert all(d.nodes[0].startswith("digamma") for d in c.report.skipped)  # only it is cut; the rest is generated
    _fallback_reasons_are_clean(c.report)


def test_max_pool_with_indices_in_a_region_falls_back_with_a_clean_reason():
    from torch.fx.experimental.proxy_tensor import make_fx

    def f(x):  # the ResNet stem: relu → max_pool2d_with_indices → getitem, a pointwise op after it
        p = torch.ops.aten.max_pool2d_with_indices(torch.relu(x * 2.0), [3, 3], [2, 2], [1, 1])
        return p[0] + 1.0, p[1]

    x = _rand((1, 2, 7, 7), 0)
    gm = make_fx(f)(x)
    c = compile_graph(gm, [x])
    torch.testing.assert_close(c(x), f(x))
    _fallback_reasons_are_clean(c.report)
    assert c.num_kernels == 1  # mul → relu still fuses before the pool


def test_every_fallback_on_resnet18_has_an_unsupported_reason():
    torchvision = pytest.importorskip("torchvision")
    m = torchvision.models.resnet18(num_classes=10).eval()
    x = _rand((1, 3, 16, 16), 0)
    c = compile_regions(m, (x,))
    with torch.no_grad():
        torch.testing.assert_close(c(x), m(x), atol=1e-4, rtol=1e-4)
    _fallback_reasons_are_clean(c.report)


def test_a_getitem_of_a_reduction_outside_the_region_is_unsupported_not_a_crash():
    from torch.fx.experimental.proxy_tensor import make_fx

    from fusion.codegen import Unsupported, generate_kernel
    from fusion.regions import FusionRegion

    gm = make_fx(lambda x: torch.ops.aten.var_mean.correction(x, [-1], correction=0)[1] * 2.0 + 1.0)(_rand((3, 4), 0))
    members = [
        n for n in gm.graph.nodes if n.op == "call_function" and n.target is not torch.ops.aten.var_mean.correction
    ]
    with pytest.raises(Unsupported) as info:  # was AttributeError: 'KernelWriter' object has no attribute 'nred'
        generate_kernel(FusionRegion(members))
    assert info.value.node is not None and info.value.node in members


# ----------------------------------------------------------------------------------------------------------------------
# Every rule of Phase 8 for every kind it applies to: NaN, half loads, each dtype's loads and stores, pow


def test_maximum_and_minimum_propagate_nan_from_either_side(renderer):
    """torch.maximum(nan, 0) and torch.maximum(0, nan) are both nan: a plain tl.where(a > b, a, b) loses one."""
    nan = float("nan")
    x, y = torch.tensor([nan, 0.0, nan, 1.0, -2.0]), torch.tensor([0.0, nan, nan, 2.0, -3.0])
    with mistake("maximum(nan, 0) and maximum(0, nan) are nan (minimum too): test a != a first"):
        check(lambda x, y: (torch.maximum(x * 1.0, y) + 0.0, torch.minimum(x * 1.0, y) + 0.0), x, y, kernels=2)
        check(lambda x, y: (torch.maximum(y * 1.0, x) + 0.0, torch.minimum(y * 1.0, x) + 0.0), x, y, kernels=2)


@pytest.mark.parametrize("dtype", [torch.float16, torch.bfloat16])
def test_half_loads_are_computed_in_float32(dtype, renderer):
    """4096 × 30.0 summed in float16 overflows (inf); loaded up to float32 the mean is 30 and the answer 31."""
    x = torch.full((2, 4096), 30.0, dtype=dtype)
    got = check(lambda x: x.mean(-1) + 1, x, kernels=1)(x)
    assert got.tolist() == [31.0, 31.0]


ALL_DTYPES = [torch.float16, torch.bfloat16, torch.float32, torch.float64, torch.int8, torch.uint8, torch.int16]
ALL_DTYPES += [torch.int32, torch.int64, torch.bool]


@pytest.mark.parametrize("dtype", ALL_DTYPES, ids=str)
def test_every_dtype_is_loaded_and_stored_exactly(dtype, renderer):
    """Loads and stores of each dtype (non-contiguous input, odd shape) give eager's bits."""
    base = _rand((7, 10), 0) * 4
    x = (base > 0 if dtype == torch.bool else base.to(dtype))[:, ::2]  # (7, 5), strided
    y = _rand((5,), 1).to(dtype) if dtype != torch.bool else _rand((5,), 1) > 0
    c = check(lambda x, y: torch.minimum(torch.maximum(x, y), x), x, y, kernels=1, atol=0, rtol=0)
    assert c(x, y).dtype == dtype


@pytest.mark.parametrize("dtype", ALL_DTYPES, ids=str)
@pytest.mark.parametrize("source", [torch.float32, torch.float64, torch.int32, torch.bool], ids=str)
def test_every_cast_rounds_once_like_torch(source, dtype):
    """x.to(dtype) in a kernel: half/bf16 rounded to nearest even (once), float → int truncated (through int64, so
    float → uint8 wraps like torch), bool is != 0; stored exactly as eager's."""
    base = (_rand((6, 7), 2) * 37).clamp(-100, 100)
    x = base > 0 if source == torch.bool else base.to(source)
    one = 1 if (x * 1).dtype != dtype else None  # a cast to the same dtype is no op: x * 1 alone is no region
    check(lambda x: (x * 1).to(dtype), x, kernels=one, atol=0, rtol=0)
    check(lambda x: ((x * 1).to(dtype) * 1).to(torch.float64), x, kernels=1, atol=0, rtol=0)


@pytest.mark.parametrize("device", ["cpu", pytest.param("cuda", marks=pytest.mark.skipif(not torch.cuda.is_available(), reason="needs a GPU"))])  # fmt: skip
def test_bfloat16_rounding_of_every_kind_of_float_matches_torch(device, renderer):
    """float32 -> bfloat16 in a kernel gives torch's bits on CPU (the written-out rounding) and on a GPU (the
    hardware conversion): random bit patterns, exact ties (even and odd), subnormals, values that round up to inf,
    ±inf and NaN."""
    g = torch.Generator().manual_seed(5)
    bits = torch.randint(-(2**31), 2**31, (2000,), generator=g, dtype=torch.int64).to(torch.int32)
    x = bits.view(torch.float32)
    ties = torch.tensor([1 + 2**-8, 1 + 3 * 2**-8, -(1 + 2**-8), 2**-130, 3.3895e38, 3.4e38, 1e-45])
    special = torch.tensor([float("inf"), float("-inf"), float("nan"), 0.0, -0.0])
    x = torch.cat([x, ties, special]).to(device)
    check(lambda x: (x * 1).to(torch.bfloat16), x, kernels=1, atol=0, rtol=0)
    y = x.to(torch.bfloat16)  # and back: bfloat16 loads (subnormals too) are exact
    check(lambda y: y.to(torch.float32) * 1, y, kernels=1, atol=0, rtol=0)


@fewer(8)
@given(
    e=st.sampled_from([0, 1, 2, 3, 4, 5, 6, 7, -1, -2, -3, -4, 0.5, 1.5, -0.5, 2.5, 2.0, 4.0, -2.0]),
    seed=st.integers(0, 2**16),
    dtype=st.sampled_from([torch.float32, torch.float64]),
)
def test_pow_by_a_scalar_matches_torch_for_every_sign(e, seed, dtype):
    """Integer exponents keep signs (x**4 of -2 is 16, not NaN) and NaN**0 is 1; NaN/inf as torch."""
    x = torch.cat([_rand((9,), seed, dtype) * 3, torch.tensor([0.0, -0.0, 1.0, -1.0, float("nan"), float("inf"), -float("inf")], dtype=dtype)])  # fmt: skip
    check(lambda x: (x * 1) ** e, x, kernels=1, atol=1e-6, rtol=1e-5)


def test_comparison_constants_are_rounded_to_the_compared_dtype(renderer):
    x = torch.full((3,), 0.1, dtype=torch.float16)  # float16(0.1) == 0.0999755859375: eager compares it with fp16 0.1
    assert check(lambda x: (x * 1) >= 0.1, x, kernels=1)(x).all()


def test_float64_constants_keep_their_bits(renderer):
    x = _rand((9,), 0, torch.float64)
    check(lambda x: (x * 0.1 + 1e-300) * 3.3, x, kernels=1, atol=0, rtol=0)


def test_a_reshape_of_a_reshape_reads_at_the_flat_index_without_div_or_mod():
    """A Linear's 2-D output read as 3-D (ViT's MLP): the re-split flat index is put back together, not divided."""

    def f(x, w):
        return torch.nn.functional.gelu((x.reshape(-1, 6) @ w).reshape(2, 5, 6))

    x, w = torch.randn(2, 5, 6), torch.randn(6, 6)
    from fusion.codegen import generated_sources

    (kernel,) = generated_sources(Fn(f), (x, w))
    loads = [line for line in kernel.source.splitlines() if "tl.load" in line]
    assert loads and not any("//" in line or "%" in line for line in loads), kernel.source
    torch.testing.assert_close(compile_regions(Fn(f), (x, w))(x, w), f(x, w))


class _Block(nn.Module):
    """A transformer-style block: x + gelu(fc(layer_norm(x))); stacked, its regions repeat layer after layer."""

    def __init__(self, d: int) -> None:
        super().__init__()
        self.ln, self.fc = nn.LayerNorm(d), nn.Linear(d, d)

    def forward(self, x):
        return x + F.gelu(self.fc(self.ln(x)))


def test_regions_of_the_same_code_share_one_kernel():
    """A kernel count, tinygrad's way: three identical blocks give four regions, but the middle two compute the same
    code and share one kernel: one name, one source, one loaded module, compiled once; every call still gets its own
    launch (the right answer)."""
    model, x = nn.Sequential(_Block(16), _Block(16), _Block(16)).eval(), _rand((8, 16), 0)
    c = compile_regions(model, (x,))
    torch.testing.assert_close(c(x), model(x))
    names = [k.name for k in c.kernels]
    assert len(names) == 4 and len(set(names)) == 3, names
    first, second = (k for k in c.kernels if names.count(k.name) == 2)
    assert first.region is not second.region and tlang.code_only(first.source) == tlang.code_only(second.source)
    loaded = {id(rt.load_kernel(k.source, k.name, interpret=True)) for k in c.kernels}
    assert len(loaded) == 3
    # another shape is other code: its own kernel, never a kernel specialised to the first shape
    wide = compile_regions(nn.Sequential(_Block(24), _Block(24)).eval(), (_rand((8, 24), 1),))
    assert not {k.name for k in wide.kernels} & set(names)


def test_code_only_drops_comments_but_not_a_hash_inside_a_string():
    source = "def k(a):  # region #3: add\n    # a whole-line comment\n\n    b = '#'  # tail\n    return b\n"
    assert tlang.code_only(source) == "def k(a):\n    b = '#'\n    return b"


# Wrong answers and crashes found by a hunt on 2026-11-25; each test failed before its fix


def test_a_split_side_that_reads_an_op_cut_from_the_other_side():
    """A region split in two (outputs of shapes that do not broadcast) whose first side is cut at an op without a
    Triton line: the second side reads that side's aten ops, so its launch goes after them (it raised ValueError)."""

    def f(x, y):
        b1 = y * 2  # the second side starts before the first
        a3 = NO_LINE(x + 1) * 3
        return a3, b1 + a3[0, :3]

    check(f, _rand((4, 8), 0), _rand((3,), 1))


@pytest.mark.parametrize("case", ["cat", "add", "where", "mul", "sum"])
def test_half_values_are_rounded_before_a_wider_op_reads_them(case, renderer):
    """Eager rounds h * 3 (float16) before a float32 op reads it, by promotion or in a cat: the kernel too. Off by
    2e-3 (bfloat16: 2.4e-2) before, far outside float32's tolerance; a reduction of it too."""
    h, y = _rand((4, 8), 0).half(), _rand((4, 8), 1)
    fn = {
        "cat": lambda h, y: torch.cat([h * 3, y], -1),
        "add": lambda h, y: (h * 3) + y,
        "where": lambda h, y: torch.where(y > 0, h * 3, y),
        "mul": lambda h, y: (h.bfloat16() * 3) * y,
        "sum": lambda h, y: (h * 100).sum(-1) * 2,
    }[case]
    check(fn, h, y, atol=0, rtol=0 if case != "sum" else 1e-3)


def test_an_input_written_in_place_is_returned_itself_and_never_read_through_an_alias():
    """compile_regions traces separate tensors: a call with two inputs that share memory, where the graph writes one,
    is a clear error (it returned 2.0 where eager gives 3.0); `return x.add_(1)` returns x itself, as eager does."""

    class Scale(nn.Module):
        def forward(self, x, y):
            x.mul_(2)
            return y + 1

    c = compile_regions(Scale(), (torch.ones(4), torch.ones(4)))
    torch.testing.assert_close(c(torch.ones(4), torch.ones(4)), torch.full((4,), 2.0))  # separate: fine
    e = torch.ones(8)
    torch.testing.assert_close(c(e[:4], e[4:]), torch.full((4,), 2.0))  # one storage, no common bytes: fine
    with pytest.raises(rt.ShapeMismatchError, match="share memory"):
        c(e[:4], e[:4])
    with pytest.raises(rt.ShapeMismatchError, match="share memory"):
        c(e[2:6], e[:4])  # overlapping views

    x = torch.zeros(3)
    out = compile_regions(Fn(lambda t: t.add_(1)), (torch.zeros(3),))(x)
    assert out is x and torch.equal(x, torch.ones(3))


# Wrong answers found by an extended fuzz grammar on 2026-11-26; each test failed before its fix


class _Rows(nn.Module):
    """v = x - x.sum(0) / 5 (the sum runs as aten), then a reader of v that needs eager's rounded value, beside an
    elementwise use of v: eager holds v rounded to its dtype, so every reader sees the same number."""

    def __init__(self, reader):
        super().__init__()
        self.reader = reader

    def forward(self, x):
        v = x - x.sum(0, keepdim=True) / 5
        if self.reader == "mean":
            return (v - v.mean(-1, keepdim=True),)
        if self.reader == "view":  # the reduction reads a view of v
            return (v - v.reshape(-1, v.shape[-1]).mean(-1, keepdim=True).reshape(*v.shape[:-1], 1),)
        if self.reader == "amax":
            return (v - v.amax(-1, keepdim=True),)
        if self.reader == "compare":  # v == its row's first entry: True everywhere, as in eager
            return (v == v[..., :1],)
        if self.reader == "cast":
            return (v.float() - v,)
        h = x + v  # "layernorm": a hand-written LayerNorm after a residual add
        mu = h.mean(-1, keepdim=True)
        var = ((h - mu) ** 2).mean(-1, keepdim=True)
        return ((h - mu) / torch.sqrt(var + 1e-5),)


DEVICES = ["cpu", pytest.param("cuda", marks=pytest.mark.skipif(not torch.cuda.is_available(), reason="needs a GPU"))]


@pytest.mark.parametrize("device", DEVICES)
@pytest.mark.parametrize("dtype", [torch.float16, torch.bfloat16], ids=str)
@pytest.mark.parametrize("reader", ["mean", "view", "amax", "compare", "cast", "layernorm"])
def test_a_value_has_one_rounding_whichever_op_reads_it(reader, dtype, device):
    """Every row of x holds three equal entries, so v's rows are constant and eager gives exactly 0 (True). Before the
    fix a reduction read v rounded to float16 and the subtraction read it unrounded: 0.44 off (LayerNorm: -1.0)."""
    base = _rand((5, 17, 1), 0).to(dtype)
    base[3, 2, 0] = -10000.0
    x = base.to(device).expand(5, 17, 3)
    model = _Rows(reader)
    got, want = compile_regions(model, [x])(x)[0], model(x)[0]
    torch.testing.assert_close(got, want, atol=0, rtol=0)


def test_a_constant_minus_zero_and_a_constant_zero_stay_two_values(renderer):
    """-0.0 == 0.0 in Python (and they hash alike), but x / -0.0 is -inf where x / 0.0 is inf. Found by the fuzzer's
    long profile: the kernel's constants were shared by value, so clamp(x, -0.0, 0.5).abs() / 0.0 divided by the
    clamp's -0.0 and gave -inf. Each constant of the kernel now keeps its sign, in both renderers."""
    x = torch.tensor([1.541, -2.0, 0.25, 0.0])
    model = Fn(lambda a: (a.clamp(-0.0, 0.5).abs() / 0.0, a * -0.0 + 0.0, (a * 0.0).neg()))
    got = compile_regions(model, [x])(x)
    for g, w in zip(got, model(x), strict=True):
        torch.testing.assert_close(g, w, atol=0, rtol=0, equal_nan=True)
        real = ~torch.isnan(w)  # a NaN's sign bit means nothing
        assert torch.equal(torch.signbit(g[real]), torch.signbit(w[real])), (g, w)  # -0.0 and 0.0 told apart too


@pytest.mark.parametrize("device", DEVICES)
@pytest.mark.parametrize("dtype", [torch.float16, torch.bfloat16], ids=str)
@pytest.mark.parametrize("scalar", [torch.float32, torch.float64], ids=str)
@pytest.mark.parametrize("op", ["mul", "rmul", "div", "rdiv", "add", "sub", "rsub", "eq", "lt", "ge"])
def test_a_zero_dim_operand_is_used_at_the_precision_eager_uses_it(op, scalar, dtype, device):
    """A 0-d float32/float64 tensor in a half op: eager reads it at float32 for some ops and positions and rounds it
    to the half dtype for others. GradScaler's 65536 times a float16 gave inf (rounded first) where eager gives the
    product; a 1/3 shows the rounding on the ops that do round. A comparison rounds it to the half dtype (the common
    dtype): ``abs(x) == s`` holds where x is s's half (a fuzzer find)."""
    near = torch.tensor([65536.0, 1 / 3 + 1e-5]).to(dtype).float()  # each scalar as the half dtype holds it
    x = torch.cat([torch.tensor([0.0, 0.001, 0.5]), near, _rand((61,), 3) * 100]).to(device, dtype)
    fn = {
        "mul": lambda x, s: torch.relu(x * s), "rmul": lambda x, s: torch.relu(s * x), "div": lambda x, s: x / s,
        "rdiv": lambda x, s: s / x, "add": lambda x, s: x + s, "sub": lambda x, s: x - s,
        "rsub": lambda x, s: s - x, "eq": lambda x, s: torch.abs(x) == s, "lt": lambda x, s: x < s,
        "ge": lambda x, s: s >= x,
    }[op]  # fmt: skip
    for s in (65536.0, 1 / 3 + 1e-5):  # a constant of the traced function: a 0-d tensor in its graph
        check(lambda x, s=s: fn(x, torch.tensor(s, dtype=scalar, device=x.device)), x, atol=0, rtol=0)


@pytest.mark.parametrize(
    "rows",
    [(4, 7), (3, 1), (2, 0), (5, 33)],
    ids=lambda s: "x".join(map(str, s)),
)
def test_any_is_a_row_reduction_in_the_kernel_of_a_masked_softmax(rows):
    """A masked softmax (T5's, Swin's): ``where(mask.any(-1), softmax(x), 0)``. ``any`` reduces in the softmax's
    kernel, not as an aten call beside it: one kernel, a row of all False (and a row of no entries) gives 0.
    A float row's any is ``!= 0`` (NaN counts)."""
    x = _rand(rows, 1)
    mask = _rand(rows, 2) > 0.3
    if rows[0] > 1 and rows[1]:
        mask[1] = False

    def masked_softmax(x, m):
        p = torch.softmax(x.masked_fill(m.logical_not(), float("-inf")), -1)
        return torch.where(m.any(-1, keepdim=True), p, 0.0)

    check(masked_softmax, x, mask, kernels=1 if rows[1] else None)
    y = x.clone()
    if rows[1]:
        y[0, 0], y[-1] = float("nan"), 0.0
    check(lambda y: y.any(-1), y)
    check(lambda y: (y * 2).any(-1, keepdim=True), y)


# ----------------------------------------------------------------------------------------------------------------------
# Rules the task states, each tested with a message naming the mistake (issue 41: wrong solutions passed these)


@contextlib.contextmanager
def mistake(why: str):
    """A failed comparison inside is re-raised with ``why`` (the rule it breaks) in front of assert_close's report."""
    try:
        yield
    except AssertionError as e:
        raise AssertionError(f"{why}\n{e}") from None


INDEXING = (
    "the kernel read or wrote other elements than eager's: check each dimension's index (split_index returns them "
    "outermost first; each is the flat index // the sizes inside it, % its size but the outermost)"
)


@pytest.mark.usefixtures("triton_renderer")
def test_loads_and_stores_stay_inside_their_tensors():
    """Lanes past a tensor's end (the last block's tail, a row shorter than RBLOCK) must be masked. The interpreter
    would read there and the masked store throws the lane away (bit-equal outputs): fusion.kernels.interp_check
    stops any access outside the launch's tensors with OutOfBounds, naming the line."""
    with mistake(INDEXING):
        check(lambda x, b: torch.relu(x * 2.0 + b), _rand((5, 7), 0), _rand((7,), 1), kernels=1)  # 35 of 1024 lanes
        check(lambda x: torch.softmax(x * 2.0, -1), _rand((3, 5), 2), kernels=1)  # rows of 5 in blocks of 8
        x = _rand((2, 3, 4), 3)
        check(lambda x: (x * 2.0).permute(2, 0, 1).contiguous() + x.sum(-1)[None] + 1.0, x)  # a 3-d walk, permuted


def test_the_bounds_check_stops_an_unmasked_load_and_a_stray_store():
    """The check itself, on hand-written kernels: an unmasked load past the end (harmless-looking in the interpreter)
    and a store a billion elements away (a segfault of the whole test run without the check) are errors."""
    from fusion.kernels.interp_check import OutOfBounds

    src = (
        "import triton\nimport triton.language as tl\n\n\n@triton.jit\n"
        "def stray(in_ptr0, out_ptr0, XBLOCK: tl.constexpr):\n"
        "    xindex = tl.arange(0, XBLOCK)\n"
        "    tmp0 = tl.load(in_ptr0 + (xindex))\n"
        "    tl.store(out_ptr0 + (xindex * FAR), tmp0, xindex < 5)\n"
    )
    x, out = torch.ones(5), torch.empty(5)
    unmasked = rt.load_kernel(src.replace("FAR", "1"), "stray", interpret=True)
    with pytest.raises(OutOfBounds, match=r"(?s)tl\.load\(in_ptr0 \+ \(xindex\)\)`.*load of in_ptr0 .*no mask"):
        unmasked[(1,)](x, out, XBLOCK=8)
    far = rt.load_kernel(src.replace("FAR", "1000000000").replace("(xindex))\n", "(xindex), xindex < 5)\n"), "stray", interpret=True)  # fmt: skip
    with pytest.raises(OutOfBounds, match=r"(?s)store of out_ptr0 .*offsets are wrong"):
        far[(1,)](x, out, XBLOCK=8)


def test_bool_add_and_mul_are_logical_or_and(renderer):
    """On bools torch's add is or and mul is and (True + True is True): Triton's int1 arithmetic wraps (1 + 1 = 0)."""
    a = torch.tensor([[True, True, False, False]]).expand(3, 4).contiguous()
    b = torch.tensor([[True, False, True, False]]).expand(3, 4).contiguous()
    c = torch.tensor([[True], [False], [True]]).expand(3, 4).contiguous()
    with mistake("bool add must be logical or and bool mul logical and (True + True is True), as torch computes them"):
        check(lambda a, b, c: (torch.logical_not((a + b) * c), a + b, a * b, (a + b) + (a + c)), a, b, c)
        check(lambda a, b: torch.maximum(a, b) * torch.minimum(a, ~b), a, b)


@pytest.mark.parametrize("dtype", [torch.float32, torch.float64], ids=str)
def test_tanh_is_accurate_near_zero(dtype, renderer):
    """tanh(x) near 0 is x - x³/3: 2*sigmoid(2x) - 1 and (1 - e^-2x) / (1 + e^-2x) cancel every digit there
    (tanh(5e-7) * 1e6 gives 0.477 for 0.5), which a default absolute tolerance hides."""
    x = torch.cat([_rand((40,), 0, dtype), torch.tensor([0.5, -0.3, 1e-30, 0.0], dtype=dtype)])
    with mistake("tanh must keep its relative accuracy near 0 (tlang.tanh: its series there), not 2*sigmoid(2x)-1"):
        check(lambda x: (torch.tanh(x * 1e-6) * 1e6, torch.tanh(x * 3.0)), x, atol=0, rtol=1e-5)


def test_a_where_condition_of_size_one_dims_is_broadcast(renderer):
    """The condition of ``where`` is read at its own broadcast index, like every operand: a (4, 1) condition selects
    whole rows of a (4, 5) result, a (5,) one whole columns."""
    rows, cols = torch.tensor([[True], [False], [False], [True]]), torch.tensor([True, False, True, True, False])
    x, y = _rand((4, 5), 0), _rand((5,), 1)
    with mistake("where's condition must be read at its broadcast index (a size-1 dimension at 0)"):
        check(lambda c, x, y: torch.where(c, x, y) * 2.0, rows, x, y)
        check(lambda c, x, y: torch.where(c, x * 2.0, y), cols, x, y)
        check(lambda c, x: torch.where(c.t(), x.t() + 1.0, 0.0), rows, x)


POW_SPECIAL = [float("-inf"), -2.0, -1.0, -0.0, 0.0, 0.25, 1.0, 4.0, float("inf"), float("nan")]


@pytest.mark.filterwarnings("ignore::RuntimeWarning")  # numpy's log(-1), 1/0 in the interpreter: the cases tested
@pytest.mark.parametrize("dtype", [torch.float32, torch.float64], ids=str)
def test_pow_of_special_values_follows_torch(dtype, renderer):
    """torch's pow by a scalar: an integer exponent multiplies (x**3 of -2 is -8, nan**0 is 1); 0.5 and -0.5 are sqrt
    and rsqrt ((-0.0)**-0.5 is -inf, (-inf)**0.5 nan); another exponent e is exp(e*log(x)), except (-inf)**e, which
    is inf for e > 0 and 0 for e < 0 (log(-inf) is nan); a negative finite base gives nan."""
    x = torch.tensor(POW_SPECIAL, dtype=dtype)
    wrong = []
    for e in (0, 1, 2, 3, -1, -2, 0.5, -0.5, 1.5, -1.5, 2.5, 0.3):
        got, want = compile_regions(Fn(lambda x, e=e: (x * 1) ** e), (x,))(x), (x * 1) ** e
        ok = torch.isclose(got, want, rtol=1e-6, atol=0, equal_nan=True) & (
            (torch.signbit(got) == torch.signbit(want)) | want.isnan()
        )  # -0.0
        wrong += [f"({v})**{e}: got {g}, torch gives {w}" for v, g, w, k in zip(POW_SPECIAL, got.tolist(), want.tolist(), ok.tolist(), strict=True) if not k]  # fmt: skip
    assert not wrong, "pow by a scalar differs from torch:\n  " + "\n  ".join(wrong)


def test_an_overload_without_a_rule_is_named_as_such():
    """x.mean() is aten.mean.default: a mean, but not the overload the generator reduces with (mean.dim): the reason
    says that, not that it is no mean (issue 41)."""
    c = check(lambda x: (x * 2.0).mean() + 1.0, _rand((3, 4), 0))
    (skip,) = c.report.skipped
    assert "aten.mean.dim, not for this overload" in skip.reason and "neither" not in skip.reason, skip.reason


def unread_index_lines(source: str) -> list[str]:
    """The lines ``x1 = ...`` / ``r0 = ...`` defining a loop variable no other line reads."""
    defined = re.findall(r"^\s*([xr]\d+) = ", source, re.M)
    return [v for v in defined if len(re.findall(rf"\b{v}\b", source)) == 1]


def test_a_kernel_has_no_index_line_it_does_not_read():
    """A LayerNorm reads its rows at the flat index: the leading dims are one loop, no index line goes unread (nor
    a looped reduction's r0); a walk in memory order reads at xindex itself."""
    (k,) = check(lambda x: F.layer_norm(x, (8,)) * 2.0, _rand((3, 4, 8), 0), kernels=1, atol=1e-5, rtol=1e-5).kernels
    assert not unread_index_lines(k.source) and "x0 = " not in k.source, k.source
    with short_blocks():
        (k,) = check(lambda x: torch.softmax(x, -1), _rand((2, 40), 1), kernels=1).kernels
    assert "for roffset" in k.source and not unread_index_lines(k.source), k.source
    (k,) = check(lambda x: torch.relu(x * 2.0) + 1.0, _rand((3, 4, 5), 2), kernels=1).kernels
    assert not re.search(r"^\s*x\d+ = ", k.source, re.M), k.source


# ----------------------------------------------------------------------------------------------------------------------
# Wrong solutions a learner could write: each must fail a test above with a message naming its mistake, never pass and
# never crash the test run. Each is the reference's function with one piece of its text replaced (issue 41).

WRONG_SOLUTIONS = {  # name: (learner's function, reference text, wrong text, the test that must fail, its message)
    "maximum without the NaN test": (
        "triton_expr", """return NAN_WINS.format(a[0], ">" if op == "maximum" else "<", a[1])""",
        """return f"tl.where({a[0]} {'>' if op == 'maximum' else '<'} {a[1]}, {a[0]}, {a[1]})\"""", "nan",
        r"maximum\(nan, 0\) and maximum\(0, nan\) are nan",
    ),
    "maximum as tl.maximum": (
        "triton_expr", """return NAN_WINS.format(a[0], ">" if op == "maximum" else "<", a[1])""",
        """return f"tl.{op}({a[0]}, {a[1]})\"""", "nan", r"maximum\(nan, 0\) and maximum\(0, nan\) are nan",
    ),
    "relu as tl.maximum(x, 0)": (
        "triton_expr", '"relu": "tl.where({0} < 0, 0, {0})"', '"relu": "tl.maximum({0}, 0.0)"', "floats",
        r"relu: got \[0\.0,",
    ),
    "relu as where(x > 0, x, 0)": (
        "triton_expr", '"relu": "tl.where({0} < 0, 0, {0})"', '"relu": "tl.where({0} > 0, {0}, 0)"', "floats",
        r"relu: got \[0\.0,",
    ),
    "tanh as 2*sigmoid(2x)-1": (
        "triton_expr", "return tanh(a[0], dtype)", 'return f"(2.0 / (1.0 + tl.exp(-2.0 * {a[0]})) - 1.0)"', "tanh",
        "tanh must keep its relative accuracy",
    ),
    "and/or on int1 as * and +": (
        "triton_expr", """return f"(({a[0]}.to(tl.int32) {'&' if op == 'and' else '|'} {a[1]}.to(tl.int32)) != 0)\"""",
        """return f"({a[0]} {'*' if op == 'and' else '+'} {a[1]})\"""", "bool", "bool add must be logical or",
    ),
    "pow of -inf as exp(e*log(x))": (
        "triton_expr", """return f'tl.where({x} == float("-inf"), tl.where({e} < 0, 0.0, float("inf")), tl.exp(tl.log({x}) * {e}))'""",
        "return f'tl.exp(tl.log({x}) * {e})'", "pow", r"\(-inf\)\*\*1\.5: got nan, torch gives inf",
    ),
    "bitwise_or as a logical or": (
        "triton_expr", '"bitwise_or": "({0} | {1})"', '"bitwise_or": "(({0} != 0) | ({1} != 0))"', "ints",
        r"bitwise_or: got",
    ),
    "abs as where(x < 0, -x, x)": (
        "triton_expr", '"abs": "tl.abs({0})"', '"abs": "tl.where({0} < 0, -{0}, {0})"', "floats", r"abs: got \[nan, inf, inf, -0\.0",
    ),
    "sigmoid as tl.sigmoid": (
        "triton_expr", '"sigmoid": "(1.0 / (1.0 + tl.exp(-{0})))"', '"sigmoid": "tl.sigmoid({0})"', "floats",
        r"calls a @triton\.jit helper \(tl\.sigmoid",
    ),
    "(-inf)**e as inf for every e": (
        "triton_expr", 'tl.where({e} < 0, 0.0, float("inf"))', 'float("inf")', "floats", r"pow -2\.5: got",
    ),
    "split_index without % on middle dims": (
        "split_index", 'expr = f"({expr}) % {size}" if inner != 1 else f"{expr} % {size}"',
        'expr = expr if inner != 1 else f"{expr} % {size}"', "split", r"split_index\('xindex', \(2, 3, 4\)\)",
    ),
    "split_index innermost first": (
        "split_index", "return out[::-1]", "return out", "split", r"split_index\('xindex', \(3, 5\)\)",
    ),
    "split_index innermost first, end to end": (
        "split_index", "return out[::-1]", "return out", "loads_and_stores", "(?s)other elements than eager's.*split_index",
    ),
}  # fmt: skip
RULE_TESTS = {
    "loads_and_stores": test_loads_and_stores_stay_inside_their_tensors,
    "nan": lambda: test_maximum_and_minimum_propagate_nan_from_either_side("triton"),
    "floats": lambda: test_triton_expr_of_every_float_op_on_special_values(torch.float32),
    "ints": lambda: test_triton_expr_of_every_integer_op(torch.int32),
    "bool": test_triton_expr_of_every_bool_op,
    "tanh": lambda: test_tanh_is_accurate_near_zero(torch.float32, "triton"),
    "pow": lambda: test_pow_of_special_values_follows_torch(torch.float32, "triton"),
    "split": lambda: test_split_index_gives_every_element_its_coordinates("xindex"),
}


def wrong_solution(monkeypatch, name: str, right: str, wrong: str) -> None:
    """Register as Phase 8's ``name`` ("triton_expr", "split_index") the reference's function with the text ``right``
    replaced by ``wrong``, compiled in fusion.codegen's namespace (what the renderer gets from the registry)."""
    import __future__

    import inspect
    import textwrap

    from fusion.compiler import registry

    source = textwrap.dedent(inspect.getsource(getattr(codegen, name)))
    assert source.count(right) == 1, f"the reference's {name} no longer reads {right!r}: update WRONG_SOLUTIONS"
    scope: dict = {}
    code = compile(source.replace(right, wrong), f"<{name}, wrong>", "exec", __future__.annotations.compiler_flag)
    exec(code, vars(codegen), scope)
    monkeypatch.setattr(codegen, name, scope[name])
    monkeypatch.setitem(registry._functions, name, scope[name])
    monkeypatch.setitem(globals(), name, scope[name])  # this file's own import (the split_index tests call it)


@pytest.mark.usefixtures("triton_renderer")
@pytest.mark.filterwarnings("ignore::RuntimeWarning")
@pytest.mark.parametrize("mistake_name", list(WRONG_SOLUTIONS))
def test_a_wrong_solution_fails_with_a_message_naming_its_mistake(mistake_name, monkeypatch):
    from fusion import practice
    from fusion.kernels.interp_check import OutOfBounds

    if practice.is_workspace():
        pytest.skip("checks the tests against the reference's solutions, which a practice workspace does not hold")
    where, right, wrong, test, message = WRONG_SOLUTIONS[mistake_name]
    wrong_solution(monkeypatch, where, right, wrong)
    with pytest.raises((AssertionError, OutOfBounds), match=message):
        RULE_TESTS[test]()


# ----------------------------------------------------------------------------------------------------------------------
# Issue 39: reductions over leading and middle dims (Inductor's OUTER reductions), walked kept dims first

OUTER_TOL = {torch.float16: dict(rtol=2e-3, atol=1e-3), torch.bfloat16: dict(rtol=1.6e-2, atol=1e-2)}


@st.composite
def outer_case(draw):
    """A shape of 2-3 dims whose last (kept, contiguous) dim is >= 16 and leading dims 0-5 (size 0 and 1 included),
    a non-empty set of leading dims to reduce, the op, keepdim, the dtype and the input's layout."""
    lead = draw(st.lists(st.integers(0, 5), min_size=1, max_size=2))
    shape = (*lead, draw(st.integers(16, 33)))
    dims = draw(st.lists(st.sampled_from(range(len(lead))), min_size=1, max_size=len(lead), unique=True))
    op = draw(st.sampled_from(["sum", "mean", "amax", "amin"]))
    dtype = draw(st.sampled_from([torch.float32, torch.float64, torch.float16, torch.bfloat16]))
    return shape, sorted(dims), op, draw(st.booleans()), dtype, draw(st.sampled_from(["contiguous", "strided", "nan"]))


@fewer(8)
@given(case=outer_case(), seed=st.integers(0, 2**16))
def test_reductions_over_leading_dims_are_one_generated_kernel(case, seed):
    """``(x * 2).sum/mean/amax/amin(leading dims, keepdim)``: one kernel, each program a block of the kept (contiguous)
    dim, the reduced dims walked at their strides; eager's values in every dtype (half ones summed in float32 and
    rounded once), NaN and inf through every op, a strided input read in place. An empty input runs as aten."""
    shape, dims, op, keepdim, dtype, layout = case
    assume(op in ("sum", "mean") or all(shape[d] for d in dims))  # eager: no max over an empty dim
    x = _rand((*shape[:-1], 2 * shape[-1]), seed, dtype)[..., ::2] if layout == "strided" else _rand(shape, seed, dtype)
    if layout == "nan" and x.numel():
        x.view(-1)[seed % x.numel()], x.view(-1)[(seed // 7) % x.numel()] = float("nan"), float("inf")
    fn = lambda x: getattr(x * 2.0, op)(dims, keepdim=keepdim)  # noqa: E731
    c = check(fn, x, kernels=0 if 0 in shape else 1, **OUTER_TOL.get(dtype, {}))
    if c.kernels:
        (k,) = c.kernels
        assert k.kind == "reduction", k.source


def test_a_bias_gradient_sum_of_a_product_is_one_kernel_read_along_its_kept_dim(renderer):
    """A bias/LayerNorm weight gradient, ``(g * x).sum([0, 1])`` of (2, 16, 64): one persistent kernel; XBLOCK
    neighbouring outputs a program (``x0``, the contiguous dim, the innermost index of every load), the reduced dims
    the row. keepdim stores at its own strides; a full-shape store beside the reduction shares the kernel."""
    g, x = _rand((2, 16, 64), 0), _rand((2, 16, 64), 1)
    (k,) = check(lambda g, x: ((g * x).sum([0, 1]),), g, x, kernels=1).kernels
    assert k.name.startswith("triton_per_fused_mul_sum"), k.source  # dims 0 and 1 walked as one range of 32
    assert re.search(r"tl\.load\(in0 \+ \(x\d+ \+ 64\*r\d+\)", k.source), k.source

    def keep_and_not(g, x):
        p = g * x
        return p.sum([0, 1], keepdim=True), p.amax([0, 1]) + 1.0

    def full_and_column(g, x):
        p = g * x
        return p - p.mean(0, keepdim=True), p.amax(0)

    (k,) = check(keep_and_not, g, x, kernels=1).kernels
    assert re.search(r"tl\.store\(out0 \+ \(x(index|\d+)\), ", k.source), k.source
    assert re.search(r"tl\.store\(out1 \+ \(x(index|\d+)\), ", k.source), k.source
    check(full_and_column, g, x, kernels=1)
    check(lambda g: ((g * 2.0).sum(1),), _rand((3, 5, 20), 2), kernels=1)  # a middle dim: kept dims 0 and 2
    z = -torch.zeros(7, 20)
    got = compile_regions(Fn(lambda z: (z * 1.0).sum(0)), [z])(z)
    assert not torch.signbit(got).any(), got  # eager's sum starts at +0.0: a column of -0.0 sums to +0.0


@fewer(8)
@given(rows=st.integers(1, 40), n=st.integers(17, 70), seed=st.integers(0, 2**16))
def test_a_long_column_is_reduced_in_a_loop_over_blocks(rows, n, seed):
    """More reduced elements than one block: each program loops over the reduced dims RBLOCK at a time, partials
    folded then reduced once (var: a second loop for the squares about the mean); a full-shape output one more loop."""
    x = _rand((n, 2, 16 + rows), seed)
    with short_blocks():
        c = check(lambda x: ((x * 2.0).sum([0, 1]), (x * 2.0).var(0)), x, kernels=2, atol=1e-5, rtol=1e-4)
        check(lambda x: (x - (x * 2.0).sum(0, keepdim=True),), x, kernels=1, atol=1e-5, rtol=1e-4)
    assert all(k.name.startswith("triton_red_fused_") and "for roffset in range(0, " in k.source for k in c.kernels)


def test_row_and_column_reductions_of_one_region_are_one_kernel_per_walk():
    """LayerNorm's backward: the input gradient needs sums over the last dim, the weight and bias gradients sums over
    the leading ones. The region is split, one kernel per walk (the column sums first, storing the gradient both
    read), nothing left to aten."""

    def ln_backward(g, xhat, w):
        g = g * 2.0  # (ReLU's gradient in a transformer: computed in the region, read by all three)
        gw = g * w
        dx = gw - gw.mean(-1, keepdim=True) - xhat * (gw * xhat).mean(-1, keepdim=True)
        return dx, (g * xhat).sum([0, 1]), g.sum([0, 1]) + 0.0

    g, xhat, w = _rand((2, 6, 24), 0), _rand((2, 6, 24), 1), _rand((24,), 2)
    c = check(ln_backward, g, xhat, w, kernels=2)
    assert not c.report.skipped, c.report.table()
    column = r"tl\.load\(in\d \+ \(x\d+ \+ 24\*r\d+\)"  # the sums over dims 0 and 1: a column walk at stride 24
    assert [k.kind for k in c.kernels] == ["reduction"] * 2, [k.source for k in c.kernels]
    assert any(re.search(column, k.source) for k in c.kernels), [k.source for k in c.kernels]


def test_outer_reductions_the_generator_leaves_to_aten_say_why():
    """Fewer than 16 contiguous kept elements (a program could not read whole sectors) run as aten with the reason;
    Rows.of takes any dims only with outer=True (the Triton generator's walks)."""
    c = check(lambda x: ((x * 2.0).sum(0),), _rand((30, 8), 0), kernels=0)
    assert any("innermost" in s.reason for s in c.report.skipped), c.report.table()
    # (a long column with too few rows: test_few_long_rows_run_as_aten_with_the_reason, on each renderer)
    gm = capture_aten(Fn(lambda x: (x * 2.0).sum(0)), [_rand((5, 20), 2)])
    red = [n for n in gm.graph.nodes if n.target is torch.ops.aten.sum.dim_IntList]
    with pytest.raises(codegen.Unsupported, match="only the trailing dimensions"):
        kernel_rows.Rows.of(red, red, 1 << 62)
    assert kernel_rows.Rows.of(red, red, 1 << 62, outer=True).kept == (1,)


def test_a_column_walk_takes_whole_sectors_a_program_on_a_gpu():
    """XBLOCK of a column walk never drops below COALESCED_ROWS to fill the GPU (a bias gradient over 768 channels
    would otherwise take 2 a program: 8-byte reads); a row walk's table is unchanged."""
    from fusion.ir.plan import rows_per_program
    from fusion.regions import build_fusion_regions, unique_regions

    gm = capture_aten(Fn(lambda x: (x * 2.0).sum(0)), [_rand((64, 768), 0)])
    (plan,) = [codegen.generate_kernel(r) for r in unique_regions(build_fusion_regions(gm))]
    assert plan.min_xblock == kernel_rows.COALESCED_ROWS and plan.constexprs["RBLOCK"] == 64, plan
    programs, config = plan.launch_config(torch.device("cuda"))
    assert config["XBLOCK"] == kernel_rows.COALESCED_ROWS and programs == 768 // kernel_rows.COALESCED_ROWS
    assert rows_per_program(768, 64, least=16) == 16 and rows_per_program(768, 64) == 2


def test_a_looped_column_walk_takes_the_swept_tiles():
    """Columns longer than one block loop with COLUMN_LOOP_WARPS warps: a sum of a half input over a tile of
    WIDE_COLUMN_LOOP_ELEMENTS (128 x 128 on a GPU), a float32 sum and a max of a half input over 64 x 64 (swept on an
    H200); XBLOCK still halves to fill the GPU, never below COALESCED_ROWS; a row walk's budget is unchanged."""
    from fusion.ir.plan import ELEMENTS_PER_PROGRAM, rows_per_program
    from fusion.regions import build_fusion_regions, unique_regions

    def plan_of(shape, dtype=torch.bfloat16, fold=lambda y: y.sum(0)):
        gm = capture_aten(Fn(lambda x: fold(x.float() * 2.0)), [torch.zeros(shape, dtype=dtype)])
        (plan,) = [codegen.generate_kernel(r) for r in unique_regions(build_fusion_regions(gm))]
        return plan

    gpu = torch.device("cuda")
    wide, narrow = plan_of((300, 32768)), plan_of((300, 768))
    for plan in (wide, narrow):
        assert plan.constexprs["RBLOCK"] == kernel_rows.WIDE_COLUMN_LOOP_RBLOCK == 128, plan.constexprs
        assert (
            plan.elements == kernel_rows.WIDE_COLUMN_LOOP_ELEMENTS and plan.num_warps == kernel_rows.COLUMN_LOOP_WARPS
        )
    assert wide.launch_config(gpu) == (256, {"XBLOCK": 128, "RBLOCK": 128})  # 32768 columns, 128 a program
    assert narrow.launch_config(gpu) == (48, {"XBLOCK": 16, "RBLOCK": 128})  # 768: halved to 16, no further
    for plan in (plan_of((300, 32768), torch.float32), plan_of((300, 32768), fold=lambda y: y.amax(0))):
        assert plan.constexprs["RBLOCK"] == kernel_rows.COLUMN_LOOP_RBLOCK == 64 and plan.elements == 0, plan
        assert plan.num_warps == kernel_rows.COLUMN_LOOP_WARPS
        assert plan.launch_config(gpu) == (512, {"XBLOCK": 64, "RBLOCK": 64})
    assert rows_per_program(1 << 20, 1024) == ELEMENTS_PER_PROGRAM // 1024  # a row walk: the default budget


@pytest.mark.parametrize("device", DEVICES)
@pytest.mark.parametrize("dtype", [torch.float32, torch.bfloat16], ids=str)
def test_outer_reductions_on_each_device(dtype, device):
    """A bias gradient, a column mean with keepdim and a column amax on the device: eager's values (on a GPU larger
    shapes: long columns looped, XBLOCK >= 16 neighbouring outputs a program, enough programs to fill the GPU)."""
    n, h = (4096, 2048) if device == "cuda" else (40, 48)
    g, x = _rand((n, h), 0, dtype).to(device), _rand((n, h), 1, dtype).to(device)
    tol = OUTER_TOL.get(dtype, dict(rtol=1e-4, atol=1e-4))
    c = check(lambda g, x: ((g * x).sum(0), (g * 2.0).mean(0, keepdim=True), (x * 2.0).amax(0)), g, x, **tol)
    assert c.num_kernels >= 1 and not c.report.skipped, c.report.table()


def test_a_long_column_walk_needs_enough_programs_to_fill_the_gpu():
    """A looped column walk takes 16 neighbouring columns a program: 1024 columns are 64 programs, which left most of
    an H200 idle (x.sum(0) of (65536, 1024): 1015 us against aten's 290); 4096 columns are 256 programs."""
    for cols, ok in ((1024, False), (4096, True)):
        gm = capture_aten(Fn(lambda x: x.sum(0)), [torch.empty(4096, cols)])
        red = [n for n in gm.graph.nodes if n.target is torch.ops.aten.sum.dim_IntList]
        if ok:
            assert kernel_rows.Rows.of(red, red, codegen.MAX_RBLOCK, outer=True).looped
        else:
            with pytest.raises(codegen.Unsupported, match=r"64 program\(s\) < 128"):
                kernel_rows.Rows.of(red, red, codegen.MAX_RBLOCK, outer=True)
