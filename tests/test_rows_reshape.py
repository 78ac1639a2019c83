"""Issue 39: a reduction kernel stores a member that is a reshape of its rows, at the row's own position.

HF GPT-2 runs its LayerNorm on (batch, seq, d) and feeds the next Linear ``h.view(-1, d)``: under autocast the cast to
bfloat16 comes after that view, so the LayerNorm's kernel stores a (batch * seq, d) member. Its elements are the rows'
elements in the same order, so the program holding row ``i`` stores them at ``i``'s flat position split over the
member's shape: no copy, no second kernel. Both code paths: Triton's (the interpreter here) and the C renderer's.
"""

from __future__ import annotations

import pytest
import torch
import torch.nn as nn
import torch.nn.functional as F
from hypothesis import given
from hypothesis import strategies as st
from support import Fn

from fusion import backend
from fusion.codegen import compile_regions
from fusion.compiler import generate
from fusion.kernels import c_runtime, triton_launch
from fusion.kernels import triton_runtime as rt

pytestmark = pytest.mark.phase8

HAVE = {"triton": rt.triton_status()[0], "c": c_runtime.available()[0]}  # Triton's interpreter, a C compiler
RENDERERS = [pytest.param(r, marks=pytest.mark.skipif(not ok, reason=f"no {r} here")) for r, ok in HAVE.items()]
DTYPES = [torch.float32, torch.float16, torch.bfloat16]
TOL = {torch.float32: {}, torch.float16: dict(atol=2e-3, rtol=2e-3), torch.bfloat16: dict(atol=2e-2, rtol=2e-2)}


@pytest.fixture(autouse=True)
def _strict(monkeypatch):
    monkeypatch.setenv("FUSION_STRICT", "1")  # a generator bug fails the test instead of falling back


def _rand(shape, seed, dtype=torch.float32):
    return torch.randn(shape, generator=torch.Generator().manual_seed(seed)).to(dtype)


def other(dtype: torch.dtype) -> torch.dtype:
    """The dtype autocast would cast to: float32 values to bfloat16, half ones to float32."""
    return torch.bfloat16 if dtype == torch.float32 else torch.float32


def check(fn, *inputs, renderer: str, kernels: int | None = 1, **tol):
    """``fn`` compiled equals eager, in ``kernels`` kernels (None: any) that all ran on ``renderer``, nothing left to
    aten."""
    with c_runtime.use(renderer):
        model = compile_regions(Fn(fn), inputs)
    got, want = model(*inputs), fn(*inputs)
    assert not model.compiled.report.skipped, model.compiled.report.table()
    ran = [lch.owner.ran for lch in model.compiled.launchers]
    want_ran = renderer if renderer == "c" else "triton-interpreter"
    assert ran == [want_ran] * (kernels or len(ran)) and ran, (ran, model.compiled.report)
    torch.testing.assert_close(got, want, equal_nan=True, **tol)
    return model


def ln(x, w, b):
    return F.layer_norm(x, x.shape[-1:], w, b, 1e-5)


# ----------------------------------------------------------------------------------------------------------------------
# The forward: LayerNorm, then the Linear's input view, cast


@pytest.mark.parametrize("renderer", RENDERERS)
@pytest.mark.parametrize("dtype", DTYPES)
def test_a_layer_norm_stores_its_output_flattened_for_the_next_linear(renderer, dtype):
    """GPT-2's ``ln_1(x).view(-1, d)`` then autocast's cast: the (b * s, d) cast is stored by the LayerNorm's kernel."""
    x, w, b = _rand((2, 7, 32), 0, dtype), _rand(32, 1, dtype), _rand(32, 2, dtype)

    def f(x, w, b):
        h = ln(x, w, b)
        return h, h.view(-1, x.shape[-1]).to(other(dtype))

    check(f, x, w, b, renderer=renderer, **TOL[dtype])


@pytest.mark.parametrize("renderer", RENDERERS)
def test_an_identity_view_between_the_rows_and_a_stored_cast(renderer):
    """GPT-2's final LayerNorm: ``view(-1, s, d)`` (the same shape), an alias, the cast, then ``view(-1, d)``: the
    reduction is read at its own row through the identity view."""
    x, w, b = _rand((2, 7, 32), 0), _rand(32, 1), _rand(32, 2)

    def f(x, w, b):
        return (torch.ops.aten.alias(ln(x, w, b).view(-1, 7, 32)).to(torch.bfloat16).view(-1, 32),)

    check(f, x, w, b, renderer=renderer, **TOL[torch.bfloat16])


@pytest.mark.parametrize("renderer", RENDERERS)
@pytest.mark.parametrize("dtype", DTYPES)
def test_rows_of_a_flat_input_stored_in_three_dims(renderer, dtype):
    """The other way round: rows of (b * s, d), a cast of their (b, s, d) view stored."""
    x, w, b = _rand((14, 32), 0, dtype), _rand(32, 1, dtype), _rand(32, 2, dtype)

    def f(x, w, b):
        return (ln(x, w, b).view(2, 7, 32).to(other(dtype)),)

    check(f, x, w, b, renderer=renderer, **TOL[dtype])


@pytest.mark.parametrize("renderer", RENDERERS)
def test_a_reshape_across_the_reduced_dim_is_stored_at_the_flat_position(renderer):
    """A reshape that merges the reduced dim with a kept one, (b, s, d) -> (b, s * d): still the rows' elements in
    their order, stored at the row's flat position."""
    x, w, b = _rand((2, 7, 32), 0), _rand(32, 1), _rand(32, 2)

    def f(x, w, b):
        return (ln(x, w, b).reshape(2, 7 * 32) * 2.0,)

    check(f, x, w, b, renderer=renderer)


# ----------------------------------------------------------------------------------------------------------------------
# The backward: the input gradient of a Linear viewed back to (b, s, d)


@pytest.mark.parametrize("renderer", RENDERERS)
@pytest.mark.parametrize("dtype", [torch.bfloat16, torch.float16])
def test_layer_norm_weight_and_bias_gradients_store_the_flat_upcast_gradient(renderer, dtype):
    """GPT-2's backward: the mm's (b * s, d) gradient cast to float32, viewed (b, s, d) and kept for the input
    gradient, the weight and bias gradients summed over (b, s) in the same kernel: the stored member is the cast,
    (b * s, d), a reshape of the column walk's rows."""
    g, x = _rand((14, 32), 0, dtype), _rand((2, 7, 32), 1)
    mean, rstd = x.mean(-1, keepdim=True), x.var(-1, keepdim=True).add(1e-5).rsqrt()

    def f(g, x, mean, rstd):
        gv = g.float().view(2, 7, 32)
        return gv, (gv * ((x - mean) * rstd)).sum([0, 1]), gv.sum([0, 1])

    check(f, g, x, mean, rstd, renderer=renderer, atol=1e-5, rtol=1e-5)


@pytest.mark.parametrize("renderer", RENDERERS)
def test_a_row_sum_of_a_viewed_gradient_stores_the_flat_cast(renderer):
    """The input gradient's row sums over a viewed (b * s, d) cast that is stored too (trailing rows)."""
    g, x = _rand((14, 32), 0, torch.bfloat16), _rand((2, 7, 32), 1)

    def f(g, x):
        gv = g.float().view(2, 7, 32)
        return gv, x * (gv * x).sum(-1, keepdim=True)

    check(f, g, x, renderer=renderer, atol=1e-5, rtol=1e-5)


@pytest.mark.parametrize("renderer", RENDERERS)
def test_a_looped_row_stores_its_reshaped_member_in_the_last_loop(renderer, monkeypatch):
    """Rows longer than one block (MAX_RBLOCK lowered to 16): the reshaped member is stored block by block."""
    monkeypatch.setattr(generate, "MAX_RBLOCK", 16)  # the rows code generation checks
    monkeypatch.setattr(triton_launch, "MAX_RBLOCK", 16)  # the Triton renderer's blocks
    x, w, b = _rand((4, 32, 40), 0), _rand(40, 1), _rand(40, 2)

    def f(x, w, b):
        h = ln(x, w, b)
        return h.view(-1, 40).to(torch.bfloat16), h.mean(-1)

    model = check(f, x, w, b, renderer=renderer, **TOL[torch.bfloat16])
    if renderer == "triton":
        kernels = model.compiled.kernels
        assert kernels and all("for roffset in range(0, 40, RBLOCK):" in k.source for k in kernels), kernels


@given(
    b=st.integers(1, 3),
    s=st.integers(1, 6),
    d=st.sampled_from([1, 3, 8, 17]),
    dtype=st.sampled_from(DTYPES),
)
def test_reshaped_members_of_random_shapes_match_eager(b, s, d, dtype):
    x, w = _rand((b, s, d), b * 100 + s * 10 + d, dtype), _rand(d, 1, dtype)

    def f(x, w):
        h = F.layer_norm(x, (d,), w, None, 1e-5)
        return h.view(-1, d).to(other(dtype)), h.softmax(-1).reshape(b, s * d)

    for renderer in [r for r, ok in HAVE.items() if ok]:
        with c_runtime.use(renderer):
            model = compile_regions(Fn(f), (x, w))
        for got, want in zip(model(x, w), f(x, w), strict=True):
            torch.testing.assert_close(got, want, **TOL[dtype])
        assert not [s_ for s_ in model.compiled.report.skipped if "neither the rows" in s_.reason]


def gqa_key_gradient(kv: int, rep: int, cast: torch.dtype | None = None):
    """Grouped-query attention's key gradient: the attention call's (b, kv * rep, s, d) gradient summed over the
    repeated heads, then copied to (b, s, kv, d) (optionally cast, as autocast does) for the projection's GEMM."""

    def f(g):
        b, _, s, d = g.shape
        k = g.view(b, kv, rep, s, d).sum(2).permute(0, 2, 1, 3).contiguous()
        return k.to(cast) if cast is not None else k

    return f


@pytest.mark.parametrize("renderer", RENDERERS)
@pytest.mark.parametrize("dtype", DTYPES)
def test_a_transposed_copy_of_a_middle_dim_sum_is_stored_by_its_kernel(renderer, dtype):
    """The sum over a middle dim (the repeated heads) and its transposed copy are one kernel: the copy's element
    [b, s, h, d] is the sum's [b, h, s, d], stored at the copy's address by the program that computes it. Before,
    the copy (neither the rows nor one element per row) was an aten call: 16 a Llama step."""
    g = _rand((2, 6, 5, 16), 3, dtype)
    check(gqa_key_gradient(3, 2), g, renderer=renderer, **TOL[dtype])
    check(gqa_key_gradient(3, 2, other(dtype)), g, renderer=renderer, **TOL[dtype])


@given(
    b=st.integers(1, 3), kv=st.integers(1, 3), rep=st.integers(1, 3), s=st.integers(1, 7), d=st.sampled_from([1, 4, 17])
)
def test_transposed_copies_of_middle_dim_sums_of_random_shapes_match_eager(b, kv, rep, s, d):
    g = _rand((b, kv * rep, s, d), b * 1000 + kv * 100 + rep * 10 + s, torch.float64)
    f = gqa_key_gradient(kv, rep)
    for renderer in [r for r, ok in HAVE.items() if ok]:
        with c_runtime.use(renderer):
            model = compile_regions(Fn(f), (g,))
        torch.testing.assert_close(model(g), f(g))
        assert not [s_ for s_ in model.compiled.report.skipped if "neither the rows" in s_.reason]


# ----------------------------------------------------------------------------------------------------------------------
# Training through the backend: no region cut at the Linear's input view


class Block(nn.Module):
    """GPT-2's pattern: LayerNorm, the Linear on its flattened output, the residual."""

    def __init__(self, d: int = 16):
        super().__init__()
        self.ln, self.fc = nn.LayerNorm(d), nn.Linear(d, d)

    def forward(self, x):
        h = self.ln(x)
        return x + self.fc(h.view(-1, x.shape[-1])).view(x.shape)


@pytest.mark.parametrize("renderer", RENDERERS)
def test_training_a_layer_norm_before_a_linear_under_autocast_cuts_nothing(renderer):
    torch.manual_seed(0)
    model, x = Block(), torch.randn(2, 5, 16)
    with torch.autocast("cpu", dtype=torch.bfloat16):
        want = model(x)
    want.float().square().mean().backward()
    want_grads = {n: p.grad.clone() for n, p in model.named_parameters()}
    model.zero_grad(set_to_none=True)
    torch._dynamo.reset()
    backend.reset()
    compiled = torch.compile(model, backend="fusion", options={"renderer": renderer})
    with torch.autocast("cpu", dtype=torch.bfloat16):
        got = compiled(x)
    got.float().square().mean().backward()
    falls = [why for r in backend.reports for p in r.parts for _, why in p.fallbacks]
    assert not [w for w in falls if "neither the rows" in w or "another row" in w], falls
    torch.testing.assert_close(got, want, atol=2e-2, rtol=2e-2)
    for n, p in model.named_parameters():
        torch.testing.assert_close(p.grad, want_grads[n], atol=2e-2, rtol=2e-2, msg=lambda m, n=n: f"{n}: {m}")


@pytest.mark.parametrize("renderer", RENDERERS)
def test_a_transposed_member_is_no_reshape_and_runs_in_a_second_kernel(renderer):
    """Same number of elements, but through a transpose that moves the innermost dim: not the rows' elements in their
    order. The region splits before the member's own ops (``row_splits.misfit_store``, issue 39): the LayerNorm keeps
    its kernel, a second kernel computes the transposed product, nothing runs as aten, the values are eager's."""
    x, w, b = _rand((2, 7, 32), 0), _rand(32, 1), _rand(32, 2)

    def f(x, w, b):
        h = ln(x, w, b)
        return h, (h.transpose(1, 2) * 2.0).reshape(2, 7, 32)

    with c_runtime.use(renderer):
        model = compile_regions(Fn(f), (x, w, b))
    for got, want in zip(model(x, w, b), f(x, w, b), strict=True):
        torch.testing.assert_close(got, want)
    assert not model.compiled.report.skipped, model.compiled.report.skipped
    assert len(model.compiled.kernels) == 2


# ----------------------------------------------------------------------------------------------------------------------
# The pointwise ops the training profile found missing: sin and cos (Llama's rotary embedding), bitwise_and (masks)


def _specials(x: torch.Tensor) -> torch.Tensor:
    flat = x.reshape(-1)
    flat[:6] = torch.tensor([float("nan"), float("inf"), float("-inf"), 0.0, -0.0, 1e4])
    return x


@pytest.mark.parametrize("renderer", RENDERERS)
@pytest.mark.parametrize("dtype", [*DTYPES, torch.float64])
def test_sin_and_cos_match_eager(renderer, dtype):
    """The rotary embedding's table: cos and sin of positions times frequencies, a residual after. (A half angle
    computed in the kernel is not rounded to its dtype before the cos, as Inductor: half inputs go straight in.)"""
    x, pos = _specials(_rand((3, 17), 0, torch.float64) * 10).to(dtype), torch.arange(17.0).to(dtype)

    def f(x, pos):
        angle = x * pos if dtype in (torch.float32, torch.float64) else x
        return angle.cos() + 1, angle.sin() * 2, torch.sin(x) - torch.cos(x)

    tol = {torch.float32: dict(atol=2e-6, rtol=2e-6), torch.float64: {}}.get(dtype, TOL.get(dtype))
    check(f, x, pos, renderer=renderer, kernels=None, **tol)


@pytest.mark.parametrize("renderer", RENDERERS)
@pytest.mark.parametrize("dtype", [torch.bool, torch.uint8, torch.int32, torch.int64])
@pytest.mark.parametrize("op", ["and", "or"])
def test_bitwise_and_or_of_bools_and_integers_matches_eager(renderer, dtype, op):
    """GPT-2's and Llama's masks: a causal mask & a padding mask (bools); ReLU6's backward: (x <= 0) | (x >= 6);
    integers: & and | of each bit, negatives too."""
    g = torch.Generator().manual_seed(0)
    lo = 0 if dtype in (torch.bool, torch.uint8) else -100
    a, b = (torch.randint(lo, 100 if dtype != torch.bool else 2, (4, 9), generator=g).to(dtype) for _ in range(2))
    bits = torch.bitwise_and if op == "and" else torch.bitwise_or

    def f(a, b):
        return (bits(torch.maximum(a, a), b), bits(a, b[:1]) == a)

    check(f, a, b, renderer=renderer, kernels=None)
    if dtype != torch.bool:
        check(lambda a: (bits(torch.maximum(a, a), 6),), a, renderer=renderer)  # a Python scalar operand


@pytest.mark.parametrize("renderer", RENDERERS)
def test_a_causal_and_padding_mask_is_one_kernel(renderer):
    """transformers' mask: (q >= kv) & padding[kv], then where into a large negative bias."""
    pad = torch.ones(2, 7, dtype=torch.bool)
    pad[1, -2:] = False

    def f(pad, q, kv):
        mask = (q[:, None] >= kv[None, :])[None] & pad[:, None, :]
        return (torch.where(mask, 0.0, torch.finfo(torch.float32).min),)

    check(f, pad, torch.arange(7), torch.arange(7), renderer=renderer)


# ----------------------------------------------------------------------------------------------------------------------
# Llama's backward: a reduction read at another row than its program's


@pytest.mark.parametrize("renderer", RENDERERS)
def test_a_sum_read_at_other_rows_is_stored_by_a_first_kernel_and_read_by_a_second(renderer):
    """Grouped-query attention's backward sums k's gradient over the repeated heads (a column walk over dim 2), then
    the rotary embedding's backward reads the other half of each row (``rotate_half``'s transpose): another row than
    the program's. The sum and its upcast are one kernel, the rotation a second: nothing runs as aten."""
    g, cos, sin = _rand((2, 2, 2, 8, 32), 0, torch.bfloat16), _rand((8, 32), 1), _rand((8, 32), 2)

    def f(g, cos, sin):
        gk = g.float().sum(2)
        gs = gk * sin
        return (gk * cos + torch.cat([gs[..., 16:], -gs[..., :16]], -1),)

    model = check(f, g, cos, sin, renderer=renderer, kernels=2, atol=1e-5, rtol=1e-5)
    assert [k.kind for k in model.compiled.kernels] == ["reduction", "pointwise"]


@pytest.mark.parametrize("renderer", RENDERERS)
def test_two_sums_read_at_other_rows_are_stored_together_by_a_first_kernel(renderer):
    """A LayerNorm backward's two row sums (the second over the first's operand times x-hat), then Swin's reverse roll
    reads them at other rows: the first kernel computes and stores both sums, the second reads them anywhere. (Split
    at the later sum alone, its kernel would take the earlier sum's operand and leave that sum a lone aten call.)"""
    g, w, xh = _rand((2, 8, 16), 0), _rand((16,), 1), _rand((2, 8, 16), 2)

    def f(g, w, xh):
        a = g * w
        b = a * xh
        out = a - a.sum(-1, keepdim=True) - xh * b.sum(-1, keepdim=True)
        return (torch.roll(out, 2, 1) * 2,)

    model = check(f, g, w, xh, renderer=renderer, kernels=2, atol=1e-5, rtol=1e-5)
    assert [k.kind for k in model.compiled.kernels] == ["reduction", "pointwise"]


def test_a_lone_sum_read_at_other_rows_still_runs_as_aten():
    """Without the upcast the first kernel would be the sum alone (a lone op is no kernel): aten's sum, as before."""
    g, sin = _rand((2, 2, 2, 8, 32), 0), _rand((8, 32), 2)

    def f(g, sin):
        gs = g.sum(2) * sin
        return (torch.cat([gs[..., 16:], -gs[..., :16]], -1),)

    model = compile_regions(Fn(f), (g, sin))
    torch.testing.assert_close(model(g, sin), f(g, sin))
    assert [d.nodes for d in model.compiled.report.skipped] == [("sum_1",)], model.compiled.report.table()


# ----------------------------------------------------------------------------------------------------------------------
# The index rule behind it: a flat position of names taken apart without // or % (the IR's index algebra)


def _at(e, env: dict) -> int:
    """The value of an IR index expression for loop values ``env``."""
    from fusion.ir import kernel_ir as ir

    total = e.const
    for c, a in e.terms:
        if isinstance(a, ir.Var):
            total += c * env[a.name]
        else:
            v = _at(a.of, env)
            total += c * (v // a.by if isinstance(a, ir.FloorDiv) else v % a.by)
    return total


@given(
    view=st.lists(st.sampled_from([1, 2, 3, 4, 6]), min_size=1, max_size=4),
    regroup=st.randoms(use_true_random=False),
)
def test_split_takes_a_flat_position_apart_exactly_and_without_division_where_each_name_fits_a_dim(view, regroup):
    """``index_algebra.split(F, shape)`` for ``F`` the flat position of an index of names over ``view``, ``shape``
    another factorisation of its elements: every index lands inside its dim and they recombine to ``F``, for every
    value the names take; the round trip (``shape == view``) gives the names back, and where each name's stride is a
    dim of ``shape`` at least its range long, no ``//`` or ``%`` is left."""
    import itertools
    import math

    from fusion.compiler.index_algebra import const, offset, split, var
    from fusion.ir import kernel_ir as ir
    from fusion.kernels.triton_lang import contiguous_strides

    numel, shape = math.prod(view), []
    rest = numel
    while rest > 1:  # another factorisation of the same number of elements
        f = regroup.choice([d for d in range(2, rest + 1) if rest % d == 0])
        shape.append(f)
        rest //= f
    shape = tuple(regroup.sample(shape, len(shape))) or (1,)
    sizes = {f"x{d}": s for d, s in enumerate(view) if s > 1}
    names = [var(f"x{d}") if s > 1 else const(0) for d, s in enumerate(view)]
    flat = offset(names, contiguous_strides(view))
    assert split(flat, view, sizes) == names
    got = split(flat, shape, sizes)
    for values in itertools.product(*(range(s) for s in sizes.values())):
        env = dict(zip(sizes, values, strict=True))
        at = [_at(e, env) for e in got]
        assert all(0 <= a < s for a, s in zip(at, shape, strict=True)), (view, shape, got)
        assert sum(a * st_ for a, st_ in zip(at, contiguous_strides(shape), strict=True)) == _at(flat, env)
    dims = dict(zip(contiguous_strides(shape), shape, strict=True))
    strides = {st_: n for st_, n in zip(contiguous_strides(view), view, strict=True) if n > 1}
    if all(dims.get(st_, 0) >= n for st_, n in strides.items()):
        assert all(isinstance(a, ir.Var) for e in got for _, a in e.terms), (view, shape, got)
