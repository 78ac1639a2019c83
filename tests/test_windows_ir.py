"""Windows in the kernel IR (issues 37 and 38): a max-pool's values and a depthwise convolution (pass ``depthwise``)
lowered to their taps (``fusion.compiler.lower_windows``), run from C on the CPU and, for a few, from the Triton
source rendered from the same IR in Triton's interpreter, each against eager. The backend's report must show the window inside a
generated kernel (no aten max-pool or convolution left), and a window the lowering refuses (inside a reduction
kernel) must still give eager's values, with its reason."""

from __future__ import annotations

import pytest
import torch
import torch.nn as nn
import torch.nn.functional as F
from hypothesis import given, settings
from hypothesis import strategies as st
from support import Fn

from fusion import backend
from fusion.codegen import compile_regions
from fusion.compiler import lower_windows
from fusion.compiler.lowering import Lowering
from fusion.ir import kernel_ir as ir
from fusion.ir.plan import Unsupported
from fusion.kernels import c_runtime, triton_launch
from fusion.kernels import triton_runtime as rt
from fusion.kernels.c_render import render
from fusion.regions import build_fusion_regions, capture_aten, unique_regions

pytestmark = pytest.mark.phase8

HAS_CC = c_runtime.available()[0]
needs_cc = pytest.mark.skipif(not HAS_CC, reason="no C compiler here")
needs_triton = pytest.mark.skipif(not rt.triton_status()[0], reason="Triton is not installed")
HALVES = [torch.float32, torch.float16, torch.bfloat16]
WINDOW_CALLS = ("max_pool", "convolution", "depthwise")
C_DEPTHWISE = {"renderer": "c", "depthwise": True}  # on CPU the pass is off unless asked (aten's convolution wins)


@pytest.fixture(autouse=True)
def fresh(monkeypatch):
    """A fresh backend, and max-pools from C (off by default on a CPU: aten's is faster; tested as the default below)."""
    monkeypatch.setattr(lower_windows, "POOLS_IN_C", True)
    backend.reset()
    yield
    backend.reset()


def _r(*shape, seed: int = 0, dtype=torch.float32) -> torch.Tensor:
    g = torch.Generator().manual_seed(seed)
    return torch.randn(shape, generator=g, dtype=torch.float64).to(dtype)


def close(got, want, dtype=torch.float32) -> None:
    tol = {torch.float16: dict(atol=2e-3, rtol=2e-3), torch.bfloat16: dict(atol=2e-2, rtol=2e-2)}.get(dtype, {})
    torch.testing.assert_close(got, want, equal_nan=True, **tol)


def compiled(fn, *inputs, options: dict | None = None, dtype=torch.float32):
    """``torch.compile(fn, backend="fusion")`` against eager; the report must show every window inside a kernel
    that ran (no aten max-pool or convolution, no fallback). Returns {kernel: what ran it}."""
    want = fn(*inputs)
    got = torch.compile(fn, backend="fusion", options=options or {"renderer": "c"})(*inputs)
    close(got, want, dtype)
    (report,) = backend.reports
    part = report.part("inference")
    calls = [op for op in part.library_calls if any(w in op for w in WINDOW_CALLS)]
    assert not calls and not part.fallbacks, report.table()
    windows = [k for k in part.kernels if any(any(w in str(n.target) for w in WINDOW_CALLS) for n in k.region.nodes)]
    ran = part.renderers()
    assert windows and all(k.name in ran for k in windows), report.table()
    return {k.name: ran[k.name] for k in windows}


# ----------------------------------------------------------------------------------------------------------------------
# Max-pool values, from C


@needs_cc
@pytest.mark.parametrize(
    "k, s, p, d, ceil",
    [(2, 2, 0, 1, False), (3, 2, 1, 1, False), (3, 1, 1, 1, False), (3, 2, 1, 2, True), (2, 1, 1, 1, True),
     (3, 2, 0, 1, True)],
)  # fmt: skip
def test_max_pool_values_from_c_match_eager(k, s, p, d, ceil):
    x = _r(2, 3, 11, 9)

    def fn(a):
        return F.max_pool2d(a * 1.5 - 0.25, k, s, p, d, ceil_mode=ceil).relu() + 1

    ran = compiled(fn, x)
    assert set(ran.values()) == {"c"}, ran


@needs_cc
@pytest.mark.parametrize("dtype", HALVES)
def test_max_pool_propagates_nan_and_keeps_minus_inf(dtype):
    x = _r(1, 2, 7, 7, dtype=dtype)
    x[0, 0, 1, 1], x[0, 1, 3, 4] = float("nan"), float("nan")
    x[0, 0, 4:7, 4:7] = float("-inf")  # a whole window of -inf: -inf, not the padding's value
    x[0, 1, 0, 0] = float("inf")

    def fn(a):
        return F.max_pool2d(a, 3, 2, 1) * 2

    compiled(fn, x, dtype=dtype)


@needs_cc
@pytest.mark.parametrize("dtype", HALVES)
def test_max_pool_of_a_channels_last_input(dtype):
    x = _r(2, 8, 9, 10, dtype=dtype).to(memory_format=torch.channels_last)

    def fn(a):
        return F.max_pool2d((a * 2).relu(), 3, 2, 1) - 1

    compiled(fn, x, dtype=dtype)


@needs_cc
@settings(max_examples=8, deadline=None)
@given(
    shape=st.tuples(st.sampled_from([1, 2]), st.sampled_from([1, 3, 5]), st.integers(3, 13), st.integers(3, 13)),
    k=st.integers(1, 3),
    s=st.integers(1, 3),
    d=st.integers(1, 2),
    ceil=st.booleans(),
    seed=st.integers(0, 2**16),
)
def test_max_pool_of_drawn_odd_shapes(shape, k, s, d, ceil, seed):
    p = k // 2
    if d * (k - 1) + 1 > shape[2] + 2 * p or d * (k - 1) + 1 > shape[3] + 2 * p:
        return  # torch refuses a window larger than the padded input
    x = _r(*shape, seed=seed)
    backend.reset()
    compiled(lambda a: F.max_pool2d(a + 1, k, s, p, d, ceil_mode=ceil) * 3, x)


WINDOW_CASES = {  # a tap's guard inside a cat's, a cat's inside a tap's, per-channel reads, views, other ranks
    "pool_of_cat": (lambda a, b, s: F.max_pool2d(torch.cat([a * 2, b.relu()], 1), 3, 2, 1) + 1),
    "cat_of_pools": (lambda a, b, s: torch.cat([F.max_pool2d(a, 2), F.max_pool2d(b * 3, 2)], 1) * 2),
    "cat_along_h": (lambda a, b, s: torch.cat([F.max_pool2d(a, 3, 1, 1), a], 2) - 1),
    "per_channel": (lambda a, b, s: F.max_pool2d(a * s + s.exp(), 3, 2, 1, ceil_mode=True)),
    "of_a_reshape": (lambda a, b, s: F.max_pool2d((a * 2).reshape(1, 3, 8, 9), 3, 2, 1)),
    "of_a_permute": (lambda a, b, s: F.max_pool2d((a + 1).permute(0, 1, 3, 2), 3, 2, 1)),
    "pool3d": (lambda a, b, s: F.max_pool3d(a.unsqueeze(0) * 2, 2, 2, 1)),
    "pool1d": (lambda a, b, s: F.max_pool1d(a.flatten(2) * 2, 3, 2, 1)),
}


@needs_cc
@pytest.mark.parametrize("case", list(WINDOW_CASES))
def test_windows_among_cats_views_and_other_ranks(case):
    fn, inputs = WINDOW_CASES[case], (_r(1, 3, 9, 8), _r(1, 2, 9, 8, seed=1), _r(3, 1, 1, seed=2))
    with c_runtime.use("c"):
        model = compile_regions(Fn(fn), inputs)
    close(model(*inputs), fn(*inputs))
    owners = [lch.owner for lch in model.compiled.launchers]
    assert owners and all(o.ran == "c" for o in owners) and not model.report.skipped, model.report.table()


# ----------------------------------------------------------------------------------------------------------------------
# Depthwise convolutions, from C


class InvertedResidual(nn.Module):
    """MobileNetV2's block around its depthwise convolution: BatchNorm + ReLU6, the window, BatchNorm + ReLU6."""

    def __init__(self, c: int, k: int = 3, stride: int = 1, dilation: int = 1, padding: int | None = None):
        super().__init__()
        pad = dilation * (k // 2) if padding is None else padding
        self.bn0, self.bn1 = nn.BatchNorm2d(c), nn.BatchNorm2d(c)
        self.dw = nn.Conv2d(c, c, k, stride, pad, dilation, groups=c, bias=False)
        g = torch.Generator().manual_seed(1)
        for bn in (self.bn0, self.bn1):
            bn.running_mean.copy_(torch.randn(c, generator=g) * 0.1)
            bn.running_var.copy_(torch.rand(c, generator=g) + 0.5)
            bn.weight.data.copy_(torch.rand(c, generator=g) + 0.5)
            bn.bias.data.copy_(torch.randn(c, generator=g) * 0.1)

    def forward(self, x):
        return F.relu6(self.bn1(self.dw(F.relu6(self.bn0(x)))))


@needs_cc
@pytest.mark.parametrize(
    "k, stride, dilation, padding", [(3, 1, 1, None), (3, 2, 1, None), (5, 1, 1, None), (5, 2, 1, 1), (3, 1, 2, None),
                                     (3, 2, 1, 0)],
)  # fmt: skip
def test_depthwise_block_from_c_matches_eager(k, stride, dilation, padding):
    block = InvertedResidual(6, k, stride, dilation, padding).eval()
    x = _r(2, 6, 13, 11)
    with torch.no_grad():
        ran = compiled(block, x, options=C_DEPTHWISE)
    assert set(ran.values()) == {"c"}, ran


@needs_cc
@pytest.mark.parametrize("dtype", HALVES)
def test_depthwise_in_half_types_and_channels_last(dtype):
    block = InvertedResidual(8, 3, 2).eval().to(dtype).to(memory_format=torch.channels_last)
    x = _r(1, 8, 9, 9, dtype=dtype).to(memory_format=torch.channels_last)
    with torch.no_grad():
        compiled(block, x, options=C_DEPTHWISE, dtype=dtype)


@needs_cc
@settings(max_examples=6, deadline=None)
@given(
    c=st.sampled_from([1, 3, 5]),
    hw=st.tuples(st.integers(3, 15), st.integers(3, 15)),
    k=st.sampled_from([3, 5]),
    stride=st.integers(1, 2),
    seed=st.integers(0, 2**16),
)
def test_depthwise_of_drawn_odd_shapes(c, hw, k, stride, seed):
    conv = nn.Conv2d(c, c, k, stride, k // 2, groups=c, bias=False).eval()
    x = _r(1, c, *hw, seed=seed)
    backend.reset()
    with torch.no_grad():
        compiled(lambda a: (conv(a * 2) + 1).relu(), x, options=C_DEPTHWISE)


@needs_cc
def test_on_cpu_with_c_a_max_pool_runs_as_aten_unless_asked(monkeypatch):
    """aten's max-pool beats the C window kernel on a CPU (measured, lower_windows.POOLS_IN_C): by default the pool is
    an aten call with the reason in the report, the ops around it a C kernel; the values are eager's."""
    monkeypatch.setattr(lower_windows, "POOLS_IN_C", False)
    x = _r(1, 3, 9, 8)

    def fn(a):
        return F.max_pool2d(torch.relu(a * 2), 3, 2, 1) + 1

    with c_runtime.use("c"):
        model = compile_regions(Fn(fn), (x,))
    close(model(x), fn(x))
    owners = [lch.owner for lch in model.compiled.launchers]
    assert owners and all(o.ran == "c" for o in owners), [(o.ran, o.c_refused) for o in owners]
    reasons = " ".join(s.reason for s in model.report.skipped)
    assert "max-pool beats the C window kernel" in reasons, model.report.table()


@needs_cc
def test_on_cpu_with_c_the_depthwise_pass_is_off_unless_asked():
    """aten's depthwise convolution beats the C window kernel on a CPU (measured, fusion.compiler.driver): by default
    the convolution stays a library call, the pass says why; the values are eager's either way."""
    block = InvertedResidual(4, 3, 1).eval()
    x = _r(1, 4, 7, 9)
    with torch.no_grad():
        got = torch.compile(block, backend="fusion", options={"renderer": "c"})(x)
    close(got, block(x))
    part = backend.reports[-1].part("inference")
    assert part.library_calls.get("convolution") == 1, part.library_calls
    notes = [p for p in part.passes if p[0] == "depthwise conv"]
    assert notes and notes[0][2] == "skipped" and "C window kernel" in notes[0][3], notes


# ----------------------------------------------------------------------------------------------------------------------
# The IR: no read outside the input, the per-channel values once


def _reads(kernel: ir.Kernel, buffer: ir.Buffer) -> list[tuple[ir.Load, int, int]]:
    """Each load of ``buffer`` with the least and largest offset it takes where its mask holds (every loop point
    evaluated: small kernels only)."""
    import itertools

    loops = kernel.loops
    env_ops = {"ge": lambda a, b: a >= b, "lt": lambda a, b: a < b, "and": lambda a, b: a and b}
    out = []
    for s in kernel.statements():
        if isinstance(s, ir.Load) and s.buffer == buffer.name:
            lo, hi = None, None
            for point in itertools.product(*(range(lp.size) for lp in loops)):
                env = {lp.var: v for lp, v in zip(loops, point, strict=True)}
                vals = _evaluate(kernel, env, env_ops)
                if s.mask is None or vals[s.mask]:
                    at = _affine(s.offset, env)
                    lo, hi = at if lo is None else min(lo, at), at if hi is None else max(hi, at)
            out.append((s, lo, hi))
    return out


def _affine(e: ir.Affine, env: dict) -> int:
    total = e.const
    for c, a in e.terms:
        v = env[a.name] if isinstance(a, ir.Var) else _affine(a.of, env)
        total += c * (v if isinstance(a, ir.Var) else v // a.by if isinstance(a, ir.FloorDiv) else v % a.by)
    return total


def _evaluate(kernel: ir.Kernel, env: dict, ops: dict) -> dict:
    vals: dict = {}
    for s in kernel.statements():
        if isinstance(s, ir.Index):
            vals[s.out] = _affine(s.expr, env)
        elif isinstance(s, ir.Const):
            vals[s.out] = s.value
        elif isinstance(s, ir.Op) and s.op in ops and all(a in vals for a in s.args):  # the index arithmetic
            vals[s.out] = ops[s.op](*(vals[a] for a in s.args))
    return vals


@pytest.mark.parametrize("case", ["pool", "pool_ceil_dilated", "depthwise"])
def test_no_tap_reads_outside_its_input(case):
    """Guard-zone safety: every masked load of the input reads, where its mask holds, inside the input's elements."""
    fn, inputs = {
        "pool": (lambda a: F.max_pool2d(a * 2, 3, 2, 1), (_r(1, 3, 7, 6),)),
        "pool_ceil_dilated": (lambda a: F.max_pool2d(a.abs(), 3, 2, 1, 2, ceil_mode=True), (_r(1, 2, 8, 9),)),
        "depthwise": (lambda a, w, m: F.relu6(F.conv2d((a - m).relu(), w, None, 2, 1, 1, 3)),
                      (_r(1, 3, 7, 9), _r(3, 1, 3, 3, seed=1), _r(3, 1, 1, seed=2))),
    }[case]  # fmt: skip
    gm = capture_aten(Fn(fn), inputs)
    if case == "depthwise":
        from fusion.compiler import depthwise

        assert depthwise.depthwise_as_window_sums(gm, lambda *a: None) == 1
    lowered = [(low, low.kernel("k")) for low in map(Lowering, unique_regions(build_fusion_regions(gm)))]
    (low, kernel), *_ = [(lw, k) for lw, k in lowered if any(isinstance(s, ir.Load) and s.mask for s in k.body)]
    source = render(kernel)
    assert "?" in source  # the guarded loads
    for b in kernel.buffers:
        if b.output:
            continue
        top = sum((n - 1) * st for n, st in zip(b.sizes, b.strides, strict=True))
        for load, lo, hi in _reads(kernel, b):
            assert lo is None or (0 <= lo and hi <= top), (load, lo, hi, top)
    masked = [s for s in kernel.statements() if isinstance(s, ir.Load) and s.mask]
    assert masked and all(len(s.offset.terms) >= 2 for s in masked), kernel.describe()  # the input's taps only
    xblock = triton_launch.launch_facts(kernel).xblock  # a GPU program's elements: 512 for a depthwise window's taps
    assert xblock == (512 if case == "depthwise" else 1024), xblock
    if case == "depthwise":  # the weights and the per-channel values: unmasked, each element loaded once
        params = [s for s in kernel.statements() if isinstance(s, ir.Load) and len(s.offset.terms) < 2]
        assert len(params) == 9 + 1 and not any(s.mask for s in params), kernel.describe()


# ----------------------------------------------------------------------------------------------------------------------
# Refusals, and Triton's interpreter


@needs_cc
def test_a_window_inside_a_reduction_kernel_is_refused_with_eager_s_values():
    """A max-pool read by a softmax over its rows: not lowered (the row walk would compute the window in each pass),
    the reason in the report, eager's values all the same."""
    x = _r(2, 3, 8, 8)

    def fn(a):
        return torch.softmax(F.max_pool2d(a * 2, 2).flatten(2), -1)

    with c_runtime.use("c"):
        model = compile_regions(Fn(fn), (x,))
    close(model(x), fn(x))
    reasons = " ".join(s.reason for s in model.report.skipped)
    assert "read by a reduction in this kernel" in reasons, model.report.table()


REFUSED = {  # windows the lowering refuses (lower_windows: one window deep, a cheap chain per tap, no reduction)
    "window_of_a_window": lambda a: F.max_pool2d(F.max_pool2d(a * 2, 3, 1, 1), 3, 1, 1) + 1,
    "costly_chain": lambda a: F.max_pool2d((a * 2).exp() + 1, 3, 1, 1) * 2,
    "in_a_reduction": lambda a: torch.softmax(F.max_pool2d(a * 2, 2).flatten(2), -1),
    "long_chain": lambda a: F.max_pool2d(((((a * 2 + 1) * 3 - 1) * 2 + 1) * 3 - 1).abs().neg().abs().neg().abs(), 3),
}


@pytest.mark.parametrize("case", list(REFUSED))
def test_code_generation_refuses_such_windows_naming_the_node(case):
    """A region with such a window is refused by code generation (``generate_kernel``) with an ``Unsupported`` naming
    the node where the partition cuts it; the values are eager's all the same."""
    from fusion.codegen import generate_kernel

    x = _r(1, 2, 8, 8)
    refused = []
    for r in unique_regions(build_fusion_regions(capture_aten(Fn(REFUSED[case]), (x,)))):
        try:
            generate_kernel(r)
        except Unsupported as e:
            refused.append(e)
    assert refused and all(e.node is not None and str(e) for e in refused), refused
    if HAS_CC:
        with c_runtime.use("c"):
            model = compile_regions(Fn(REFUSED[case]), (x,))
        close(model(x), REFUSED[case](x))  # cut at the node: an aten call, or two kernels around it


@needs_cc
def test_a_costly_chain_before_a_window_is_left_to_aten_with_its_reason():
    x = _r(1, 2, 6, 6)

    def fn(a):
        return F.max_pool2d((a * 2).exp() + 1, 3, 1, 1) * 2

    gm = capture_aten(Fn(fn), (x,))
    (region,) = [
        r for r in unique_regions(build_fusion_regions(gm)) if any("max_pool" in str(n.target) for n in r.nodes)
    ]
    with pytest.raises(Exception, match="at every tap"):
        Lowering(region).kernel()
    with c_runtime.use("c"):
        model = compile_regions(Fn(fn), (x,))
    close(model(x), fn(x))


@needs_triton
@pytest.mark.parametrize("case", ["pool", "depthwise", "cat_along_h"])
def test_windows_from_the_ir_s_triton_source_in_the_interpreter(case):
    options = {"renderer": "triton"}
    if case == "cat_along_h":  # a tap's guard under a cat's
        ran = compiled(lambda a: WINDOW_CASES[case](a, None, None), _r(1, 3, 9, 8), options=options)
    elif case == "pool":
        x = _r(1, 3, 9, 7)
        ran = compiled(lambda a: F.max_pool2d(a * 2 - 1, 3, 2, 1, ceil_mode=True) + 1, x, options=options)
    else:
        block = InvertedResidual(4, 3, 2).eval()
        with torch.no_grad():
            ran = compiled(block, _r(1, 4, 7, 9), options=options)
    assert set(ran.values()) == {"triton-interpreter"}, ran


@needs_triton
def test_compile_regions_takes_a_window_into_a_triton_kernel():
    x = _r(1, 2, 6, 6)
    with c_runtime.use("triton"):
        model = compile_regions(Fn(lambda a: F.max_pool2d(a.relu(), 3, 1, 1) * 2), (x,))
    close(model(x), F.max_pool2d(x.relu(), 3, 1, 1) * 2)
    owners = [lch.owner for lch in model.compiled.launchers]
    assert owners and all(o.ran == "triton-interpreter" and o.plan.ir is not None for o in owners), owners
    assert not model.report.skipped, model.report.table()
