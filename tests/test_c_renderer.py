"""The C renderer of CPU kernels (issue 38): kernel IR -> C -> a shared library called through ctypes, against eager.

Phase 8's generator builds the region's KernelPlan; the kernel IR is lowered from it (fusion.compiler.lowering),
rendered to C (fusion.kernels.c_render), compiled and cached (fusion.kernels.c_runtime)."""

from __future__ import annotations

import dataclasses
import pickle
import re

import pytest
import torch
import torch.fx as fx
import torch.nn.functional as F
from hypothesis import given, settings
from hypothesis import strategies as st
from support import Fn

from fusion.codegen import compile_regions
from fusion.compiler.lowering import Lowering
from fusion.ir import kernel_ir as ir
from fusion.kernels import c_probes, c_runtime
from fusion.kernels.c_render import one_walk, render
from fusion.kernels.ir_loops import cse
from fusion.regions import build_fusion_regions, capture_aten, unique_regions

pytestmark = pytest.mark.phase8

HAS_CC = c_runtime.available()[0]
needs_cc = pytest.mark.skipif(not HAS_CC, reason="no C compiler here")
FLOATS = [torch.float32, torch.float64, torch.float16, torch.bfloat16]
FEW = settings(max_examples=6)  # each new shape is one more compile (~0.2 s)


def compiled_in_c(fn, *inputs, kernels: int | None = None):
    """compile_regions with the C renderer; every kernel must have run from C (``kernels`` of them, if given)."""
    with c_runtime.use("c"):
        model = compile_regions(Fn(fn), inputs)
    out = model(*inputs)
    ran = {lch.owner.kernel.name: (lch.owner.ran, lch.owner.c_refused) for lch in model.compiled.launchers}
    assert ran and all(r == "c" for r, _ in ran.values()), ran
    assert kernels is None or len(ran) == kernels, ran
    return out


def special(x: torch.Tensor) -> torch.Tensor:
    """``x`` with a NaN, an inf and a -inf where it has room (eager and the kernel must agree on them too)."""
    flat = x.reshape(-1)
    for i, v in enumerate((float("nan"), float("inf"), float("-inf"))):
        if flat.numel() > 3 * i + 2:
            flat[3 * i + 1] = v
    return x


@st.composite
def tensors(draw, max_dims: int = 3, dtypes=FLOATS, non_contiguous: bool = True):
    shape = tuple(draw(st.lists(st.sampled_from([1, 2, 3, 5, 7, 17, 33]), min_size=0, max_size=max_dims)))
    dtype = draw(st.sampled_from(dtypes))
    g = torch.Generator().manual_seed(draw(st.integers(0, 2**16)))  # an example is the same tensor every time
    x = torch.randn(shape, dtype=torch.float64, generator=g).to(dtype)
    if non_contiguous and len(shape) >= 2 and draw(st.booleans()):
        x = x.transpose(0, 1).contiguous().transpose(0, 1)  # same shape, other strides
    return x


def close(got, want) -> None:
    torch.testing.assert_close(got, want, equal_nan=True)


# ----------------------------------------------------------------------------------------------------------------------
# The kernel IR is data


def _walk(value, seen: list) -> None:
    if dataclasses.is_dataclass(value):
        assert type(value).__module__ == ir.__name__, type(value)
        for f in dataclasses.fields(value):
            _walk(getattr(value, f.name), seen)
    elif isinstance(value, tuple):
        for v in value:
            _walk(v, seen)
    else:
        seen.append(type(value))
        assert isinstance(value, (str, int, float, bool, type(None))), f"{type(value)} in the kernel IR: {value!r}"


def lowered(fn, *inputs) -> list[tuple[Lowering, ir.Kernel]]:
    gm = capture_aten(Fn(fn), inputs)
    out = []
    for r in unique_regions(build_fusion_regions(gm)):
        lowering = Lowering(r)
        out.append((lowering, lowering.kernel(f"k{r.index}")))
    return out


def test_kernel_ir_records_hold_no_torch_or_fx_objects():
    x, w = torch.randn(6, 40).half(), torch.randn(40)
    cases = [
        lowered(lambda a: (a * 2 + 1).relu().t().contiguous(), x),
        lowered(lambda a, b: torch.nn.functional.layer_norm(a.float(), (40,), b) * torch.softmax(a.float(), -1), x, w),
    ]
    for lowerings in cases:
        for _, kernel in lowerings:
            seen: list = []
            _walk(kernel, seen)
            assert not any(t.__module__.startswith(("torch", "fusion")) for t in seen)
            assert pickle.loads(pickle.dumps(kernel)) == kernel and hash(kernel) == hash(
                pickle.loads(pickle.dumps(kernel))
            )
            assert all(isinstance(s, ir.Statement.__args__) for s in kernel.statements())
    kinds = [k.kind for lowerings in cases for _, k in lowerings]
    assert "pointwise" in kinds and "reduction" in kinds


def test_reshapes_cost_no_division_where_the_ranges_prove_it():
    # a Linear's 2-D output read as 3-D: the flat position put back together, no // or %
    ((_, kernel),) = lowered(lambda a, b: (a * 2).reshape(4, 6, 10) + b, torch.randn(24, 10), torch.randn(4, 6, 1))
    assert "//" not in kernel.describe() and "%" not in kernel.describe(), kernel.describe()
    # a permuted copy read flat: x0 spans two dims of the source, x1 one: x0 // 10 and x0 % 10, nothing on x1
    ((_, kernel),) = lowered(
        lambda a: (a * 2).reshape(4, 6, 10).permute(0, 2, 1).reshape(40, 6) + 1, torch.randn(24, 10)
    )
    (load,) = [s for s in kernel.statements() if isinstance(s, ir.Load)]
    assert ir.index_text(load.offset) == "(x0 % 10) + 10*x1 + 60*(x0 // 10)", ir.index_text(load.offset)


# ----------------------------------------------------------------------------------------------------------------------
# C kernels against eager


@needs_cc
@FEW
@given(tensors(), st.sampled_from(["chain", "minmax", "cast", "compare"]))
def test_pointwise_matches_eager(x, which):
    x = x.clone() if which == "cast" else special(x.clone())  # NaN -> integer is undefined (torch's too)
    fn = {
        "chain": lambda a: torch.sigmoid(a * 2.5 - 1).exp() + torch.tanh(a).abs().sqrt(),
        "minmax": lambda a: torch.maximum(a, a * 0.5).clamp(-1.5, 2) * torch.relu(a) + torch.minimum(a, -a),
        "cast": lambda a: (a.float() * 3).to(a.dtype) + (a.to(torch.int32) * 2).to(a.dtype),
        "compare": lambda a: torch.where(a > 0.1, a * 2, -a) + (a != a).to(a.dtype),
    }[which]
    close(compiled_in_c(fn, x), fn(x))


@needs_cc
@FEW
@given(st.sampled_from([1, 3, 8, 33]), st.sampled_from([1, 2, 7, 65, 300]), st.sampled_from(FLOATS))
def test_row_reductions_match_eager(rows, cols, dtype):
    g = torch.Generator().manual_seed(rows * 1000 + cols)
    x = torch.randn(rows, cols, dtype=torch.float64, generator=g).to(dtype)
    x[0, 0] = float("nan") if rows > 1 else x[0, 0]
    w, b = torch.randn(cols, generator=g).to(dtype), torch.randn(cols, generator=g).to(dtype)

    def fn(a, w, b):
        soft = torch.softmax(a.float(), -1)
        norm = torch.nn.functional.layer_norm(a, (cols,), w, b)
        return soft * 2, norm + 1, a.amax(-1) - a.amin(-1), a.sum(-1) * 2, a.mean(-1, keepdim=True) + a

    for got, want in zip(compiled_in_c(fn, x, w, b), fn(x, w, b), strict=True):
        if dtype in (torch.float16, torch.bfloat16):  # a half value computed from a float32 one an ulp apart
            half = dict(atol=1e-3, rtol=2e-3) if dtype == torch.float16 else dict(atol=1e-2, rtol=1.6e-2)
            torch.testing.assert_close(got, want, equal_nan=True, **half)  # (eager's own order) may round the other way
        else:
            close(got, want)


@needs_cc
def test_a_non_contiguous_input_and_a_broadcast():
    x = torch.randn(9, 13, 5)[:, 1:12:2, :].permute(2, 0, 1)  # strided, permuted
    y = torch.randn(6)
    close(compiled_in_c(lambda a, b: (a * b + 1).relu() * a, x, y), (x * y + 1).relu() * x)


@needs_cc
def test_a_sum_of_negative_zeros_is_positive_zero():
    x = torch.full((4, 7), -0.0)
    got = compiled_in_c(lambda a: (a * 1.0).sum(-1), x)
    assert torch.equal(1 / got, torch.full((4,), float("inf")))


@needs_cc
@pytest.mark.parametrize("n", [1, 2, 3, 4, 5, 8, 13, 40, 1000])
def test_a_float64_value_rounded_to_float32_keeps_its_rounding(n):
    """gcc 12.2 with AVX-512VL folded (double)(float)x into x where its SLP vectorizer packed a few elements (the
    fuzzer's long run: ``x.abs().to(torch.float32) == x`` True for a float64 x float32 cannot hold); the compiler's
    probe (``c_probes.ROUND_TRIP_PROBE``, run by ``c_runtime``) turns that vectorizer off where it does so. Every loop length, eager's
    bits."""
    g = torch.Generator().manual_seed(n)
    x = torch.randn(n, dtype=torch.float64, generator=g) + 2.0**-40  # no element a float32 holds
    got = compiled_in_c(lambda a: (a.abs().to(torch.float32) == a, a.to(torch.float32).to(torch.float64) - a), x)
    want = (x.abs().to(torch.float32) == x, x.to(torch.float32).to(torch.float64) - x)
    assert torch.equal(got[0], want[0]) and torch.equal(got[1], want[1]), (got, want)


@needs_cc
def test_the_chosen_flags_keep_a_float32_rounding():
    """The probe itself: the flags the renderer compiles with keep the rounding (run, not read from a version)."""
    import tempfile

    cc, flags, _ = c_runtime.compiler()
    with tempfile.TemporaryDirectory() as tmp:
        assert c_runtime.probe_kept(cc, list(flags), tmp, c_probes.ROUND_TRIP_PROBE, c_probes.round_trip_kept), flags


@needs_cc
@pytest.mark.parametrize("k", [3, 5, 6, 7, 8])
def test_a_clamp_backward_under_a_where_over_short_rows_selects_each_elements_own_gradient(k):
    """gcc 12.2 with AVX sank a load into a select's branch, unrolled a loop of 3 to 7 steps and vectorized the rows
    with the wrong lanes' masks: the gradient of ``clamp(where(m, x, 0) + 0.1, min=0.1)`` was 0 at 0.40 where eager
    gives the upstream gradient (the fuzzer's long run, 2026-11-28). The compiler's probe
    (``c_probes.SUNK_SELECT_PROBE``, run by ``c_runtime``) turns tree sinking off where it does so."""
    g = torch.Generator().manual_seed(k)
    mask, x, up = torch.ones(k, dtype=torch.bool), torch.randn(64, k, generator=g), torch.randn(64, k, generator=g)

    def backward(m, x, up):  # what the kernel of clamp_min's and where's backward computes, as the trace has it
        w = torch.where(m, x, torch.zeros_like(x)) + 0.1
        return (torch.where(m, torch.where(w > 0.1, up, 0.0), 0.0),)

    (got,) = compiled_in_c(backward, mask, x, up)
    assert torch.equal(got, backward(mask, x, up)[0])


@needs_cc
def test_the_chosen_flags_select_by_each_elements_own_compare():
    """The probe itself: the flags the renderer compiles with pass it (run, not read from a version)."""
    import tempfile

    cc, flags, _ = c_runtime.compiler()
    with tempfile.TemporaryDirectory() as tmp:
        assert c_runtime.probe_kept(cc, list(flags), tmp, c_probes.SUNK_SELECT_PROBE, c_probes.sunk_select_kept), flags


@needs_cc
@pytest.mark.parametrize("dtype", [torch.float16, torch.bfloat16])
def test_half_values_round_once_to_nearest_even(dtype):
    # float32 values at and around the half-way points of the half dtype, subnormals, overflow and NaN
    g = torch.Generator().manual_seed(0)
    x = torch.cat([torch.randn(1000, generator=g) * 10 ** torch.randint(-8, 6, (1000,), generator=g).float(),
                   torch.tensor([65519.0, 65520.0, 1e-7, -6e-8, 3.4e38, float("nan"), float("-inf")])])  # fmt: skip
    close(compiled_in_c(lambda a: (a * 1.0).to(dtype) * 3, x), (x * 1.0).to(dtype) * 3)


def run_lowered(fn, *inputs):
    """Lower each region of ``fn`` (as the Triton generator would not: these ops have no Triton line), run it from C."""
    gm = capture_aten(Fn(fn), inputs)
    env: dict = {}

    class Record(fx.Interpreter):
        def run_node(self, n):
            env[n] = super().run_node(n)
            return env[n]

    Record(gm).run(*inputs)
    regions = unique_regions(build_fusion_regions(gm))
    assert regions
    for r in regions:
        low = Lowering(r)
        kernel = low.kernel(f"divisions_{r.index}")
        source = render(kernel)
        ck = c_runtime.CKernel(c_runtime.load(source, kernel.name), kernel.name, source, len(kernel.buffers))
        outs = [torch.empty_strided(env[n].shape, env[n].stride(), dtype=env[n].dtype) for n in low.stored]
        ck(*[env[n] for n in low.inputs], *outs)
        for n, got in zip(low.stored, outs, strict=True):
            close(got, env[n])


@needs_cc
@pytest.mark.parametrize("dtype", [torch.int64, torch.int32, torch.int8, torch.float32, torch.float64])
def test_division_and_remainder_follow_torch_signs(dtype):
    g = torch.Generator().manual_seed(1)
    a = torch.randint(-60, 60, (97,), generator=g).to(dtype)
    b = torch.randint(1, 9, (97,), generator=g).to(dtype) * (torch.randint(0, 2, (97,), generator=g) * 2 - 1).to(dtype)
    if dtype.is_floating_point:
        a = a + 0.25

    def fn(a, b):
        return (torch.remainder(a, b) * 1, torch.div(a, b, rounding_mode="floor") * 1,
                torch.div(a, b, rounding_mode="trunc") * 1, torch.floor_divide(a, b) + 0)  # fmt: skip

    run_lowered(fn, a, b)


# ----------------------------------------------------------------------------------------------------------------------
# The runtime: cache, compiler, options


@needs_cc
def test_a_second_compile_is_a_cache_hit(tmp_path, monkeypatch):
    monkeypatch.setenv("FUSION_CACHE_DIR", str(tmp_path))
    source = "void k_cache_test(float *restrict x, int n) { (void)n; x[0] = 2.0f; }\n"
    before = dict(c_runtime.STATS)
    c_runtime.load(source, "k_cache_test")
    assert c_runtime.STATS["compiled"] == before["compiled"] + 1
    c_runtime._LIBS.clear()  # a new process: only the disk cache is left
    fn = c_runtime.load(source, "k_cache_test")
    assert (
        c_runtime.STATS["compiled"] == before["compiled"] + 1
        and c_runtime.STATS["disk_hits"] == before["disk_hits"] + 1
    )
    x = torch.zeros(1)
    fn.argtypes = None
    fn(__import__("ctypes").c_void_p(x.data_ptr()), 1)
    assert x.item() == 2.0
    assert len(list(tmp_path.glob("c/*.so"))) == 1


def test_no_compiler_is_one_message_naming_the_fix(monkeypatch):
    monkeypatch.setenv("CC", "/nonexistent/cc-for-a-test")
    c_runtime.forget_compiler()
    try:
        ok, why = c_runtime.available()
        assert not ok and "Fix:" in why and "FUSION_RENDERER=triton" in why
        with pytest.raises(c_runtime.CompilerMissing, match="xcode-select --install"):
            c_runtime.compiler()
    finally:
        monkeypatch.delenv("CC")
        c_runtime.forget_compiler()


def test_renderer_option_and_variable_are_checked(monkeypatch):
    from fusion.backend import Options

    assert Options.parse({"renderer": "c"}).renderer == "c"
    with pytest.raises(ValueError, match="unknown renderer 'fortran'"):
        Options.parse({"renderer": "fortran"})
    monkeypatch.setenv("FUSION_RENDERER", "C ")
    assert c_runtime.chosen() == "c"
    with c_runtime.use("triton"):
        assert c_runtime.chosen() == "triton"
    monkeypatch.setenv("FUSION_RENDERER", "cuda")
    with pytest.raises(ValueError, match="FUSION_RENDERER"):
        c_runtime.chosen()


@needs_cc
def test_c_is_the_default_on_cpu_where_a_compiler_is_found(monkeypatch):
    monkeypatch.delenv("FUSION_RENDERER", raising=False)  # (tests/conftest.py sets it for the generator's tests)
    assert c_runtime.chosen() == "c"


@needs_cc
def test_a_kernel_the_ir_does_not_take_runs_as_aten_with_the_reason():
    """Under the C renderer a CPU region C does not take (a max-pool window) is cut at the pool, which runs as its
    aten op with the reason in the report, never in Triton's interpreter behind the user's back."""
    x = torch.randn(1, 3, 8, 8)

    def fn(a):
        return torch.nn.functional.max_pool2d(a * 2, 2) + 1

    with c_runtime.use("c"):
        model = compile_regions(Fn(fn), (x,))
    close(model(x), fn(x))
    owners = [lch.owner for lch in model.compiled.launchers]
    assert all(o.ran == "c" for o in owners), [(o.ran, o.c_refused) for o in owners]
    reasons = " ".join(s.reason for s in model.report.skipped)
    assert "window" in reasons and "POOLS_IN_C" in reasons, model.report.table()


@needs_cc
@pytest.mark.parametrize("case", ["rows", "columns", "half", "in_softmax"])
def test_cat_reads_each_input_masked_to_its_range(case):
    a, b = torch.randn(4, 6), torch.randn(5, 2)
    fn, inputs = {
        "rows": (lambda a, b: torch.cat([a * 2, b[:3].repeat(1, 3) + 1]) * 3, (a, b)),
        "columns": (lambda a, b: torch.cat([a.exp(), b[:4], a * b[:4, :1]], 1).relu() + 1, (a, b)),
        "half": (lambda a, b: torch.cat([a, b], -1).half() * 3, (torch.randn(2, 3, 5), torch.randn(2, 3, 7))),
        "in_softmax": (lambda a, b: torch.softmax(torch.cat([a * 2, b[:4]], -1), -1), (a, b)),
    }[case]
    close(compiled_in_c(fn, *inputs), fn(*inputs))


def rotate_half(q):
    """Llama's rotary ``rotate_half`` of a GEMM output reshaped into heads: a cat of the two negated-swapped halves."""
    x = q.view(2, 5, 3, 8).permute(0, 2, 1, 3)
    return torch.cat([-x[..., 4:], x[..., :4]], -1) * 2


def test_a_cat_of_slices_of_a_reshape_reads_each_half_without_division():
    # each input's index ranges over its own part of the cat only (its mask says so), so the reshape's // and %
    # cancel: the rotary halves are read at plain strides (Llama's rotate_half; measured 10 % of a CUDA-graph step)
    ((_, kernel),) = lowered(rotate_half, torch.randn(10, 24))
    loads = [s for s in kernel.statements() if isinstance(s, ir.Load)]
    assert len(loads) == 2 and not any("//" in ir.index_text(s.offset) or "%" in ir.index_text(s.offset)
                                       for s in loads), [ir.index_text(s.offset) for s in loads]  # fmt: skip


def class_token(cls, maps):
    """ViT's input: a class token before the patches, a conv's (b, c, h, w) output flattened and transposed."""
    return torch.cat([cls.expand(maps.shape[0], 1, -1), maps.flatten(2).transpose(1, 2)], 1) + 1


def test_a_flattened_feature_map_behind_a_class_token_is_read_at_its_strides():
    # (196*c + w) // 14 is 14*c + w // 14, and 14*(w // 14) + w % 14 is w again: one plain offset per load
    ((_, kernel),) = lowered(class_token, torch.randn(1, 1, 6), torch.randn(2, 6, 3, 5))
    texts = [ir.index_text(s.offset) for s in kernel.statements() if isinstance(s, ir.Load)]
    assert len(texts) == 2 and not any("//" in t or "%" in t for t in texts), texts


@needs_cc
@pytest.mark.parametrize("dtype", [torch.float32, torch.bfloat16])
def test_a_cat_of_slices_of_a_reshape_matches_eager(dtype):
    q = special(torch.randn(10, 24)).to(dtype)
    close(compiled_in_c(rotate_half, q, kernels=1), rotate_half(q))
    uneven = lambda q: torch.cat([q.view(2, 5, 24)[..., 7:] * 3, q.view(2, 5, 24)[..., :7]], -1)  # noqa: E731
    close(compiled_in_c(uneven, q), uneven(q))
    cls, maps = torch.randn(1, 1, 6).to(dtype), special(torch.randn(2, 6, 3, 5)).to(dtype)
    close(compiled_in_c(class_token, cls, maps), class_token(cls, maps))


@needs_cc
def test_a_long_sum_adds_its_small_terms_together_first():
    """1.0 then 4095 terms of 1e-8: added one by one to the running 1.0 each is lost (1.0, 4e-5 off); summed in
    blocks of SIMD lanes whose sums are added pairwise, as eager's cascade does, they are kept (a few ulp)."""
    x = torch.full((2, 4096), 1e-8)
    x[:, 0] = 1.0
    close_enough = dict(atol=0, rtol=5e-7)
    torch.testing.assert_close(compiled_in_c(lambda a: (a * 1.0).sum(-1), x), x.sum(-1), **close_enough)
    y = torch.randn(3, 70, 130, dtype=torch.float64)  # two reduced dims, blocks with a tail, float64 near exact
    torch.testing.assert_close(compiled_in_c(lambda a: (a * 2.0).sum((-1, -2)), y), (y * 2.0).sum((-1, -2)))


@needs_cc
def test_the_lesson_shows_one_region_rendered_as_triton_and_as_c(capsys):
    """Phase 8's lesson prints a region's Triton kernel, then the same region's kernel IR and its C: one IR."""
    from fusion import models
    from fusion.codegen import generated_sources
    from fusion.compiler.lowering import lower_region
    from fusion.kernels import triton_demo

    chain = generated_sources(models.ElementwiseChain(), models.elementwise_inputs(batch=8, d=64))[0]
    triton_demo.show_c(chain, lower_region(chain.region, name=chain.name))
    out = capsys.readouterr().out
    assert f"kernel {chain.name} (pointwise)" in out and f"void {chain.name}(" in out and "#pragma omp" in out
    assert "@triton.jit" in chain.source and "tl.load" in chain.source


# ----------------------------------------------------------------------------------------------------------------------
# any as a row reduction (a masked softmax in one kernel)


def masked_softmax(a, m):
    s = torch.softmax(a.masked_fill(~m, float("-inf")), -1)
    return torch.where(m.any(-1, keepdim=True), s, 0.0)


@needs_cc
@pytest.mark.parametrize("n", [7, 1, 33])
def test_a_masked_softmax_is_one_kernel_in_c(n):
    g = torch.Generator().manual_seed(n)
    a, m = torch.randn(5, n, generator=g), torch.rand(5, n, generator=g) > 0.5
    m[1], m[2] = False, True  # a row of all False (no entry: 0, not NaN) and a row of all True
    got = compiled_in_c(masked_softmax, a, m, kernels=1)
    close(got, masked_softmax(a, m))
    assert not got[1].any() and not got.isnan().any()


@needs_cc
@pytest.mark.parametrize("dtype", [torch.float32, torch.float16])
@pytest.mark.parametrize("dims", ["dim", "dims", "all", "keepdim"])
def test_any_of_float_rows_counts_nan_as_true_and_zeros_as_false(dtype, dims):
    x = torch.randn(6, 9).to(dtype)
    x[0, 3], x[1], x[2], x[3] = float("nan"), 0.0, -0.0, 0.0  # NaN alone: True; zeros of both signs: False
    x[2, 4], x[3, 8] = float("nan"), float("inf")
    fn = {
        "dim": lambda a: (a * 1).any(-1),
        "dims": lambda a: (a * 1).any((0, 1)),
        "all": lambda a: (a * 1).any(),
        "keepdim": lambda a: (a * 1).any(1, keepdim=True),
    }[dims]
    got = compiled_in_c(fn, x, kernels=1)
    assert got.dtype == torch.bool
    close(got, fn(x))


# ----------------------------------------------------------------------------------------------------------------------
# Reductions over leading and middle dims (column walks, Inductor's OUTER reductions)


@st.composite
def column_sums(draw):
    """(x, dims, op, keepdim): dims reduced among all but the last (a kept dim of >= 16 neighbouring elements, which
    the Triton plan the C kernel comes from asks of a column walk); x maybe a strided slice, NaN/inf in it."""
    lead = draw(st.lists(st.sampled_from([1, 2, 3, 5, 7]), min_size=1, max_size=2))
    last, dtype = draw(st.sampled_from([16, 17, 33])), draw(st.sampled_from(FLOATS))
    dims = draw(st.lists(st.sampled_from(range(len(lead))), min_size=1, max_size=len(lead), unique=True))
    g = torch.Generator().manual_seed(draw(st.integers(0, 2**16)))
    x = torch.randn(*lead, last + 3, dtype=torch.float64, generator=g).to(dtype)
    x = x[..., 2 : last + 2] if draw(st.booleans()) else x[..., :last].contiguous()  # strided rows, or not
    if draw(st.booleans()):
        special(x)
    return x, dims, draw(st.sampled_from(["sum", "mean", "amax", "amin"])), draw(st.booleans())


@needs_cc
@FEW  # (test_codegen.py draws more of them, with the C renderer too)
@given(column_sums())
def test_reductions_over_leading_dims_match_eager(case):
    x, dims, op, keepdim = case

    def fn(a):
        return getattr(a * 2, op)(dims, keepdim=keepdim)

    close(compiled_in_c(fn, x, kernels=1), fn(x))


@needs_cc
@pytest.mark.parametrize("dtype", FLOATS)
def test_a_bias_and_a_layer_norm_weight_gradient(dtype):
    g = torch.Generator().manual_seed(0)
    grad, x = (torch.randn(3, 5, 32, generator=g).to(dtype) for _ in range(2))

    def fn(dy, a):  # a LayerNorm weight gradient's fused product, a bias gradient's sum over [0, 1]
        return (dy * a).sum([0, 1]), dy.sum([0, 1], keepdim=True) + 1

    for got, want in zip(compiled_in_c(fn, grad, x), fn(grad, x), strict=True):
        close(got, want)


@needs_cc
def test_a_sum_over_a_middle_dim_and_a_column_sum_of_a_transposed_input():
    x = torch.randn(4, 7, 20, dtype=torch.float64)
    close(compiled_in_c(lambda a: (a + 1).sum(1), x, kernels=1), (x + 1).sum(1))
    y = torch.randn(20, 17, dtype=torch.float64).t()  # (17, 20) of strides (1, 17): a row sum reading a column
    close(compiled_in_c(lambda a: (a * 3).mean(-1, keepdim=True), y, kernels=1), (y * 3).mean(-1, keepdim=True))


@needs_cc
def test_a_column_walk_runs_in_tiles_along_the_contiguous_dim_and_sums_pairwise():
    """x.sum(0): the reduced dim outside, a tile of neighbouring columns inside (SIMD); kept dims past one tile (a
    tail), columns past one block of SUM_BLOCK; 1.0 then 4095 terms of 1e-8 down each column keep their small terms
    (blocks' sums added pairwise: within 8 ulp of the exact sum; here eager's own is 13 ulp off), float64 near exact."""
    ((_, kernel),) = lowered(lambda a: (a * 2.0).sum(0), torch.randn(7, 40))
    assert "#pragma omp simd\n" in render(kernel) and "_w = 256" in render(kernel)
    y = torch.randn(130, 300, dtype=torch.float64)
    close(compiled_in_c(lambda a: (a * 2.0).sum(0), y, kernels=1), (y * 2.0).sum(0))
    x = torch.full((4096, 2048), 1e-8)
    x[0] = 1.0
    got = compiled_in_c(lambda a: (a * 1.0).sum(0), x, kernels=1)
    torch.testing.assert_close(got, x.double().sum(0).float(), atol=0, rtol=1e-6)  # one by one: 4e-5 off


@needs_cc
@pytest.mark.parametrize("columns", [16, 32, 96, 672, 1000])
def test_a_column_walk_shares_few_columns_over_the_threads_with_the_same_values(columns):
    """A squeeze-excitation's mean over an image's pixels in channels-last memory: few columns (32 channels) and many
    rows. Tiles of 256 columns made it one tile, one busy thread; the tile narrows to give every thread one (672
    columns: four tiles, not three). Each column is summed alone, in the same order, so the values are the same bits
    for 1 to 5 threads, and eager's within rounding, NaN and inf included."""
    x = special(torch.randn(4100 // columns * 40 + 7, columns))
    fn = lambda a: (a * 2.0).mean(0)  # noqa: E731
    ((_, kernel),) = lowered(fn, x)
    assert "% nthreads" in render(kernel)  # the width follows the threads of the call
    threads, outs = torch.get_num_threads(), []
    try:
        for n in range(1, 6):
            torch.set_num_threads(n)
            outs.append(compiled_in_c(fn, x, kernels=1))
    finally:
        torch.set_num_threads(threads)
    for o in outs[1:]:
        torch.testing.assert_close(o, outs[0], rtol=0, atol=0, equal_nan=True)
    close(outs[0], fn(x))


_THREADED = {  # each above PARALLEL_MIN's work, so that its loops are split over the threads
    "pointwise": (lambda a: (a * 2 + 1).relu(), lambda: (special(torch.randn(300, 257)),)),
    "transposed copy": (lambda a: (a * 2).t().contiguous(), lambda: (special(torch.randn(300, 257)),)),
    "rows": (lambda a: torch.softmax(a * 2, -1), lambda: (special(torch.randn(401, 257)),)),
    "middle dim": (lambda a: (a * 2).sum(1), lambda: (special(torch.randn(41, 300, 33, dtype=torch.float64)),)),
    "gather": (lambda w, i: F.embedding(i, w) * 2, lambda: (torch.randn(1000, 64), torch.randint(0, 1000, (41, 50)))),
    "window": (lambda a: F.max_pool2d(a * 2, 3, 1, 1), lambda: (special(torch.randn(2, 16, 41, 40)),)),
}


@needs_cc
@pytest.mark.parametrize("kind", list(_THREADED))
def test_each_kind_of_kernel_gives_the_same_bits_on_one_two_and_three_threads(kind, monkeypatch):
    """The test suite's workers run on one thread each where the cores are few (tests/conftest.py): the OpenMP split
    of each kind of loop is checked here, through the backend on the threads it sets (1-3: an odd count leaves a
    remainder), the same bits for each, eager's values within rounding, NaN and inf included."""
    from fusion import backend
    from fusion.compiler import lower_windows

    monkeypatch.setattr(lower_windows, "POOLS_IN_C", True)  # a max-pool in C (aten's on a CPU by default)
    fn, make = _THREADED[kind]
    inputs = make()
    threads, outs = torch.get_num_threads(), []
    try:
        for n in (1, 2, 3):
            torch.set_num_threads(n)
            backend.reset()
            outs.append(torch.compile(fn, backend="fusion", options={"renderer": "c"})(*inputs))
            (report,) = backend.reports
            part = report.part("inference")
            ran = part.renderers()
            assert ran and set(ran.values()) == {"c"} and not part.library_calls, report.table()
    finally:
        torch.set_num_threads(threads)
        backend.reset()
    for o in outs[1:]:
        torch.testing.assert_close(o, outs[0], rtol=0, atol=0, equal_nan=True)
    close(outs[0], fn(*inputs))


@needs_cc
@pytest.mark.parametrize("dtype", [torch.float32, torch.bfloat16])
def test_a_transposed_copy_of_rows_is_stored_by_the_row_kernel(dtype):
    """MultiheadAttention's x.transpose(0, 1) after a row op: the kernel holding row i stores it at the copy's
    strides (the innermost dim stays innermost)."""
    x = torch.randn(4, 6, 17).to(dtype)

    def fn(a):
        s = torch.softmax(a * 2, -1)
        return s.transpose(0, 1).contiguous(), s.sum(-1)

    for got, want in zip(compiled_in_c(fn, x, kernels=1), fn(x), strict=True):
        close(got, want)


@needs_cc
@pytest.mark.parametrize("dtype", [torch.float64, torch.bfloat16])
def test_a_normalization_over_a_leading_dim_stores_whole_columns(dtype):
    """Mean, variance about it and whole normalized columns from one column-walk kernel: row-level values are arrays
    over the tile, read again by the later folds and the stores (a tile tail: 300 columns)."""
    x = special(torch.randn(9, 300, dtype=torch.float64)).to(dtype)

    def fn(a):
        return (a - a.mean(0, keepdim=True)) * torch.rsqrt(a.var(0, keepdim=True) + 1e-5), a.amax(0)

    for got, want in zip(compiled_in_c(fn, x, kernels=1), fn(x), strict=True):
        close(got, want)


@needs_cc
def test_a_contiguous_feature_map_is_one_inner_loop_and_a_permuted_one_is_not():
    """EfficientNet-B0's BatchNorm+SiLU and squeeze-excite mean over a 7x7 map: H and W are one loop of 49 (a loop
    of 7 never reaches gcc's vector body), kept and reduced dims alike; the mean's blocks span the whole row, and
    the stored ``y`` and its mean are one walk of the row (``y`` computed once). A permuted read keeps its loops
    apart. Results as eager's."""
    x, s, b = torch.randn(1, 24, 7, 7), torch.rand(24, 1, 1) + 0.5, torch.randn(24, 1, 1)

    def bn_silu(a, w, c):
        return torch.nn.functional.silu(a * w + c)

    ((_, kernel),) = lowered(bn_silu, x, s, b)
    assert [lp.size for lp in kernel.loops][-1] == 7, kernel.describe()  # the IR keeps the tensor's dims
    src = render(kernel)
    assert "< 49;" in src and "< 7;" not in src, src[src.index("void ") :]
    close(compiled_in_c(bn_silu, x, s, b, kernels=1), bn_silu(x, s, b))

    def se_mean(a, w, c):
        y = torch.nn.functional.silu(a * w + c)
        return y, y.mean((2, 3), keepdim=True)

    ((_, kernel),) = lowered(se_mean, x, s, b)
    walks = [t for t in kernel.body if isinstance(t, ir.ReduceLoop)]
    assert len(walks) == 2 and len([t for t in one_walk(kernel).body if isinstance(t, ir.ReduceLoop)]) == 1
    ((_, softmax),) = lowered(lambda a: torch.softmax(a, -1), x)  # each walk reads the fold before it: kept apart
    assert one_walk(softmax) == softmax
    src = render(kernel)
    assert "< 49;" in src and "< 7;" not in src and "< 7 ?" not in src, src[src.index("void ") :]
    assert src[src.index("void k") :].count("fusion_expf(") == 1, src  # the joined walk computes y once
    for got, want in zip(compiled_in_c(se_mean, x, s, b, kernels=1), se_mean(x, s, b), strict=True):
        close(got, want)

    y = torch.randn(1, 24, 7, 7).transpose(2, 3)  # W before H in memory: no single walk of both
    ((_, kernel),) = lowered(lambda a, c: a * 2 + c, y, x)
    assert "< 49;" not in render(kernel)
    close(compiled_in_c(lambda a, c: a * 2 + c, y, x, kernels=1), y * 2 + x)


@needs_cc
def test_sibling_sums_and_the_stores_beside_them_are_one_walk():
    """A LayerNorm's weight and bias gradients and its input gradient (two sums of the same rows, one store): one walk
    of the row after ``one_walk``, each sum folded as before, eager's values. A
    max beside a sum stays a walk of its own (a walk of sums only is folded in blocks)."""
    x, g, w = torch.randn(300, 20, dtype=torch.float64), torch.randn(300, 20, dtype=torch.float64), torch.randn(20)

    def ln_grads(a, b, c):
        d = b * c
        return (d * a).sum(0), d.sum(0), d + a

    ((_, kernel),) = lowered(ln_grads, x, g, w)
    walks = lambda k: [t for t in k.body if isinstance(t, ir.ReduceLoop)]  # noqa: E731
    assert len(walks(kernel)) == 3 and len(walks(one_walk(kernel))) == 1, kernel.describe()
    for got, want in zip(compiled_in_c(ln_grads, x, g, w, kernels=1), ln_grads(x, g, w), strict=True):
        close(got, want)

    def max_and_sum(a):
        y = a * 2
        return y.amax(0), y.sum(0)

    ((_, kernel),) = lowered(max_and_sum, x)
    assert len(walks(one_walk(kernel))) == len(walks(kernel)) == 2, kernel.describe()


@needs_cc
@pytest.mark.parametrize("dtype", [torch.float32, torch.float64])
def test_what_a_loop_computes_the_same_at_every_step_is_computed_once_before_it(dtype):
    """A BatchNorm's per-channel scale (rsqrt of the variance) under a row sum, and a squeeze-excite gate
    (sigmoid of a per-channel value) over a pointwise map: computed once per row / per channel, before the inner
    loop (gcc does not hoist them out of a blocked omp simd sum), with the same values; rows of 600 elements (past
    one block of ROW_SUM_BLOCK, with a tail)."""
    x, m, v = torch.randn(1, 5, 20, 30, dtype=dtype), torch.randn(5, dtype=dtype), torch.rand(5, dtype=dtype) + 0.5

    def bn_silu_mean(a, mean, var):
        y = torch.nn.functional.silu((a - mean[:, None, None]) * torch.rsqrt(var[:, None, None] + 1e-5))
        return y, y.mean((2, 3))

    ((_, kernel),) = lowered(bn_silu_mean, x, m, v)
    src = render(kernel)
    body = src[src.index("void ") :]
    assert body.index("sqrt") < body.index("omp simd reduction"), body
    for got, want in zip(compiled_in_c(bn_silu_mean, x, m, v, kernels=1), bn_silu_mean(x, m, v), strict=True):
        close(got, want)

    def gate(a, s):
        return a * torch.sigmoid(s)[:, :, None, None]

    s = torch.randn(1, 5, dtype=dtype)
    ((_, kernel),) = lowered(gate, x, s)
    body = render(kernel)[render(kernel).index("void ") :]
    inner = body.rindex("for (int64_t")
    assert body.index("exp") < inner, body
    close(compiled_in_c(gate, x, s, kernels=1), gate(x, s))


@needs_cc
def test_exp_of_float32_is_within_one_ulp_and_sigmoid_tanh_within_eager_s_reach():
    """fusion_expf's polynomial runs in fused multiply-adds where the CPU has them (``__FMA__``), two roundings a
    step elsewhere: either way exp stays within 1 ulp of the float64 value over its whole finite range, sigmoid and
    tanh (which call it) within 2.5 ulp (eager's sigmoid is 2.35 ulp off here); erf within 1.5 ulp (eager's within 1),
    dense where ``1 + erf(x)`` is small (GELU's cancellation: an error of erf near -1 is a large one of GELU)."""
    assert "__builtin_fmaf" in render(lowered(lambda a: a.exp() * 2, torch.randn(4))[0][1])
    x = torch.cat([torch.linspace(-104, 89, 1 << 20), torch.randn(1 << 16) * 5])
    for fn, most in ((torch.exp, 1.0), (torch.sigmoid, 2.5), (torch.tanh, 2.5)):
        got = compiled_in_c(lambda a, fn=fn: fn(a).abs(), x, kernels=1).double()
        want = fn(x.double()).abs()
        ok = (want > 1e-30) & (want < 3e38)
        spacing = (torch.nextafter(want.float(), torch.tensor(float("inf"))) - want.float()).double()
        ulps = ((got - want).abs() / spacing)[ok]
        assert ulps.max() <= most, (fn.__name__, ulps.max().item())
    x = torch.cat([torch.linspace(-6, 6, 1 << 20), torch.linspace(-4, -0.9, 1 << 18), torch.randn(1 << 16) * 2])
    got = compiled_in_c(lambda a: torch.erf(a) * 1.0, x, kernels=1).double()
    want = torch.erf(x.double())
    spacing = (torch.nextafter(want.abs().float(), torch.tensor(float("inf"))) - want.abs().float()).double()
    ulps = ((got - want).abs() / spacing)[want.abs() > 1e-30]
    assert ulps.max() <= 1.5, ulps.max().item()


@needs_cc
def test_exp_erf_tanh_where_they_saturate_are_eager_s_values():
    """exp below -104 is 0 (computed from 0 and replaced: the subnormal it made from -104 cost an assist a lane),
    erf past |x| = 4 and tanh past 20 are exactly +-1 (exp's argument stops there: a subnormal exp(-x^2) made GELU over
    activations of std 8 six times slower); NaN stays NaN, -inf gives 0 and -1, inf overflows as expf. The same
    values as eager, bit for bit, from the edges of the ranges to the largest floats."""
    edges = [-104.5, -104.0, -103.98, -103.97, -100.0, -88.0, -87.3, -20.5, -20.0, -9.5, -4.0, -3.92, 3.92, 4.0, 4.01,
             9.4, 20.0, 20.5, 88.7, 89.0, 1e4, -1e4, 3e38, -3e38]  # fmt: skip
    x = torch.tensor([*edges, float("nan"), float("inf"), float("-inf"), 0.0, -0.0])
    for fn in (torch.exp, torch.erf, torch.tanh):
        got = compiled_in_c(lambda a, fn=fn: fn(a) * 1.0, x, kernels=1)
        want = fn(x)
        saturated = (want == 0) | (want.abs() == 1) | want.isnan() | want.isinf()
        torch.testing.assert_close(got[saturated], want[saturated], rtol=0, atol=0, equal_nan=True)
        close(got, want)  # the rest within the kernels' accuracy (the test above bounds it)


@pytest.mark.parametrize("renderer", ["c", pytest.param("triton", marks=pytest.mark.skipif(
    not __import__("importlib").util.find_spec("triton"), reason="no Triton here"))])  # fmt: skip
def test_sign_of_nan_is_zero_as_torch_s(renderer):
    # torch.sign is (x > 0) - (x < 0): 0 for NaN (numpy's is NaN); abs's gradient is grad * sign (a fuzzer find)
    x = torch.tensor([float("nan"), -0.0, 0.0, -2.5, 3.0, float("inf"), float("-inf")])
    for dtype in (torch.float32, torch.float16, torch.float64):
        a = x.to(dtype)
        with c_runtime.use(renderer):
            model = compile_regions(Fn(lambda a: torch.sign(a * 1.0)), (a,))
        torch.testing.assert_close(model(a), torch.sign(a), atol=0, rtol=0)


@needs_cc
def test_a_cat_of_slices_of_a_cat_is_read_at_loop_variables():
    # a cat input's own index variable, inside another cat's input: written in the loop's variables all the way down
    # (a fuzzer find: the inner cat's variable stood for the outer's, which no renderer knows)
    def swap(t):
        h = t.shape[-1] // 2
        return torch.cat([t[..., h:], t[..., :h]], -1)

    for n in (3, 8):
        x = torch.randn(2, n)
        close(compiled_in_c(lambda a: swap(swap(a * 2)) + 1, x), swap(swap(x * 2)) + 1)
        ((_, kernel),) = lowered(lambda a: swap(swap(a * 2)) + 1, x)
        used = set().union(*(s.offset.variables() for s in kernel.statements() if isinstance(s, ir.Load)))
        assert used <= {lp.var for lp in kernel.loops}, used


@needs_cc
@FEW
@given(c=st.sampled_from([16, 48, 144]), hw=st.sampled_from([1, 3, 7]), dtype=st.sampled_from(FLOATS[:2]))
def test_a_channels_last_squeeze_excite_mean_is_one_column_walk(c, hw, dtype):
    """A channels-last (N, C, H, W) image's BatchNorm + SiLU stored and averaged over H, W (EfficientNet's squeeze-
    excitation at 7x7): a column walk, in C one kernel, one walk of the map storing the values and summing them,
    each channel's scale computed once per tile before the walk (not once per element), eager's values."""
    g = torch.Generator().manual_seed(c * 100 + hw)  # (a chain of half ops: eager rounds each, a kernel once)
    x = special(torch.randn(1, c, hw, hw, dtype=dtype, generator=g)).contiguous(memory_format=torch.channels_last)
    scale, shift = torch.rand(c, dtype=dtype, generator=g) + 0.5, torch.randn(c, dtype=dtype, generator=g)

    def fn(a, s, b):
        y = F.silu(a * torch.rsqrt(s[:, None, None] + 1e-5) + b[:, None, None])
        return y, y.mean((2, 3))

    for got, want in zip(compiled_in_c(fn, x, scale, shift, kernels=1), fn(x, scale, shift), strict=True):
        close(got, want)
    if hw == 1:  # one element a row: no walk to look at
        return
    ((_, kernel),) = lowered(fn, x, scale, shift)
    src = render(kernel)
    walks = re.findall(r"for \(int64_t (r\d+) = (?:0|\1_b);", src)  # each walk of the map (a blocked one: its block)
    assert len(walks) == 1, src  # the values stored and their mean: one walk
    body = src[src.index(f"for (int64_t {walks[0]} = ") :]
    assert "sqrtf" not in body.split("fusion_expf")[0], src  # each channel's scale computed before the walk
    assert len(re.findall(r"\b(?:fusion_expf|exp)\(", src[src.index("void k") :])) == 1, src  # y once: store, mean


@needs_cc
@pytest.mark.parametrize("op", ["amax", "sum"])
def test_a_column_walk_over_a_value_the_walk_does_not_change(op):
    """A fuzzer find: an input expanded along the reduced dim is the same at every step of a column walk, so it is
    computed once per tile, an array over the tile; the fold reads that array's element, not the array."""
    x = torch.randn(2, 1, 16)

    def fn(a):
        return getattr(a.expand(2, 40, 16).abs(), op)(1, keepdim=True)

    close(compiled_in_c(fn, x, kernels=1), fn(x))


@needs_cc
@pytest.mark.parametrize("dtype", [torch.float32, torch.float64])
def test_a_float_made_an_integer_and_back_has_no_negative_zero(dtype):
    """A fuzzer find: -0.29 -> int64 0 -> float is +0.0 (1 / it: inf); gcc folds the two conversions into trunc,
    which keeps the sign (-0.0, 1 / it: -inf) unless the renderer stops it."""
    x = torch.tensor([1.541, -0.2934, -0.0, -3.7, 1e6], dtype=dtype)

    def fn(a):
        return torch.reciprocal(a.to(torch.int64)), a.to(torch.int32).to(dtype) * -1.0

    for got, want in zip(compiled_in_c(fn, x), fn(x), strict=True):  # (two regions: the outputs do not share a walk)
        close(got, want)
        assert torch.equal(torch.signbit(got), torch.signbit(want))


def test_cse_computes_a_repeated_value_once_and_never_reads_past_a_store():
    """``ir_loops.cse``: an op of the same values, a constant, a load of the same element computed once, uses
    renamed; a load after a store is read again (the store may be to the same memory: an in-place pair); -0.0 and
    0.0 stay two constants; a walk of the row sees the values before it, not another walk's."""
    x = ir.Affine(((1, ir.Var("x0")),))
    buffers = (ir.Buffer("in0", (4,), (1,), "float32"), ir.Buffer("out0", (4,), (1,), "float32", output=True),
               ir.Buffer("out1", (4,), (1,), "float32", output=True))  # fmt: skip
    body = (
        ir.Load("t0", "in0", x, "float32"),
        ir.Load("t1", "in0", x, "float32"),  # the same element: t0
        ir.Const("t2", 0.0, "float32"),
        ir.Const("t3", -0.0, "float32"),  # another constant
        ir.Op("t4", "add", ("t0", "t2"), "float32"),
        ir.Op("t5", "add", ("t1", "t2"), "float32"),  # t4 once t1 is t0
        ir.Op("t6", "add", ("t1", "t3"), "float32"),
        ir.Store("out0", x, "t5"),
        ir.Load("t7", "in0", x, "float32"),  # after a store: read again
        ir.Op("t8", "mul", ("t7", "t6"), "float32"),
        ir.Store("out1", x, "t8"),
    )
    k = ir.Kernel("k", "pointwise", buffers, (ir.Loop("x0", 4),), (), body)
    got = cse(k).body
    assert [s.out for s in got if hasattr(s, "out")] == ["t0", "t2", "t3", "t4", "t6", "t7", "t8"]
    assert got[4] == ir.Op("t6", "add", ("t0", "t3"), "float32") and got[5] == ir.Store("out0", x, "t4")
    assert cse(cse(k)) == cse(k)

    walk = ir.ReduceLoop((ir.Load("t1", "in0", x, "float32"), ir.Reduce("t2", "sum", "t1", "float32")))
    again = ir.ReduceLoop((ir.Load("t3", "in0", x, "float32"), ir.Reduce("t4", "max", "t3", "float32")))
    k = dataclasses.replace(k, kind="reduction", body=(walk, again))
    assert cse(k) == k  # each walk's load is its own
    k = dataclasses.replace(k, body=(ir.Load("t0", "in0", x, "float32"), walk))
    assert cse(k).body[1] == ir.ReduceLoop((ir.Reduce("t2", "sum", "t0", "float32"),))  # the value before the walk


def test_sin_and_cos_stay_within_two_ulps_of_float64():
    """A rotary embedding's sin and cos of one angle: on x86-64 Linux the C kernel calls glibc's vector sinf and
    cosf (libmvec: the prelude declares them simd, and the compiler must not fold the pair into one scalar sincosf).
    Over the float32 range, signed zeros, inf and NaN, both stay within 2 ulp of float64, as eager's (<= 1 ulp)."""
    torch.manual_seed(0)
    x = torch.cat([
        torch.linspace(-20.0, 20.0, 4001), torch.randn(2000) * 1e4, torch.randn(500) * 1e9,
        torch.tensor([0.0, -0.0, 1e-30, 3.0e38, -3.0e38, float("inf"), float("-inf"), float("nan")]),
    ])  # fmt: skip
    out = compiled_in_c(lambda t: (lambda u: (torch.sin(u), torch.cos(u)))(t.neg()), x, kernels=1)
    x64 = -x.double()
    for got, want in ((out[0], torch.sin(x64)), (out[1], torch.cos(x64))):
        finite = torch.isfinite(x)
        ulp = torch.finfo(torch.float32).eps * want[finite].abs().clamp_min(torch.finfo(torch.float32).tiny)
        err = (got[finite].double() - want[finite]).abs()
        assert (err <= 2 * ulp).all(), (x[finite][err > 2 * ulp][:5], err.max())
        assert got[~finite].isnan().all()
    if "-DFUSION_LIBMVEC" in c_runtime.compiler()[1]:
        assert c_runtime.libraries(c_runtime.compiler()[1])[0] == "-lmvec"


def test_a_rotary_tables_sin_and_cos_over_two_loops_match_eager():
    """Llama's rotary tables: positions times frequencies (two loops, a broadcast), then cos and sin of each angle,
    as one kernel (the vector calls in its innermost loop), equal to eager's within float32 tolerances."""
    pos, freq = torch.arange(131, dtype=torch.float32), 1.0 / (10000 ** (torch.arange(0, 34, 2) / 34.0))

    def f(p, w):
        angle = p[:, None] * w[None, :]
        return angle.cos() * 2.0, angle.sin() * 2.0

    out = compiled_in_c(f, pos, freq, kernels=1)
    for got, want in zip(out, f(pos, freq), strict=True):
        torch.testing.assert_close(got, want)


def test_a_gathered_read_along_the_innermost_loop_is_read_from_a_prologue_array():
    """Llama's rotary tables repeat the frequencies along a head (``cat([f, f])``: ``f[x % 32]`` in the innermost
    loop). A read under ``%`` or ``//`` of the innermost variable needs vector gathers, which gcc's tuning for recent
    Intel CPUs leaves out (the loop, libm calls included, then ran scalar: 210 µs against 70): the C kernel gathers
    it once into a prologue array before the loops and the innermost loop reads it at consecutive addresses, through
    a ``restrict`` pointer (gcc does not vectorize a read of an array shared into the OpenMP region by name)."""
    pos, freq = torch.arange(131, dtype=torch.float32), 1.0 / (10000 ** (torch.arange(0, 34, 2) / 34.0))

    def f(p, w):
        angle = p[:, None] * torch.cat([w, w])[None, :]
        return angle.cos() * 2.0, angle.sin() * 2.0

    ((_, kernel),) = lowered(f, pos, freq)
    source = render(kernel)
    simd = source[source.index("#pragma omp simd") :]
    inner = simd[: simd.index("}")]
    assert "%" not in inner and "_a[" in inner, source  # the gathered frequencies: read back from the prologue
    assert re.search(r"const float \*restrict t\d+_a = t\d+_s;", source), source
    out = compiled_in_c(f, pos, freq, kernels=1)
    for got, want in zip(out, f(pos, freq), strict=True):
        torch.testing.assert_close(got, want)
