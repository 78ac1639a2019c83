"""Pass ``copy_kernels`` (``fusion.compiler.copy_kernels``): a layout copy no region takes (a clone of a permuted
view, alone between two GEMMs, or a one-op piece of a region cut by its outputs' shapes) runs as a generated kernel
of its own, not as aten's copy.

The pass is CUDA-gated; ``ON_CPU`` lets it mark CPU copies, so these tests run its kernels from C and in Triton's
interpreter. Tests: every lone copy of an attention block becomes a kernel (no aten ``clone`` left) and gives eager's
bits, for drawn shapes (size-1 and empty dims, a non-contiguous input, NaN and inf); a copy cut out of a region by
its outputs' shapes keeps its kernel; a dense copy, a CPU graph without ``ON_CPU`` and ``options={"copy_kernels":
False}`` leave aten's copy; a training step keeps eager's gradients.
"""

from __future__ import annotations

import pytest
import torch
from hypothesis import HealthCheck, example, given, settings
from hypothesis import strategies as st
from support import library_calls

from fusion import backend
from fusion.compiler import copy_kernels, driver, lone_kernels

pytestmark = pytest.mark.phase9


class HeadsAttention(torch.nn.Module):
    """q, k, v split from one projection into heads (a permuted view each), and the heads merged back: the copies
    before and after the batched GEMMs have no pointwise op beside them."""

    def __init__(self, c: int, heads: int, dtype=torch.float64) -> None:
        super().__init__()
        g = torch.Generator().manual_seed(0)
        self.w = torch.nn.Parameter(torch.randn(3 * c, c, generator=g, dtype=dtype) / c**0.5)
        self.heads = heads

    def forward(self, x):
        b, n, c = x.shape
        q, k, v = (x @ self.w.t()).view(b, n, 3, self.heads, c // self.heads).permute(2, 0, 3, 1, 4)
        o = torch.matmul(q, k.transpose(-1, -2)) @ v  # no softmax: every copy is alone between two GEMMs
        return o.transpose(1, 2).reshape(b, n, c)


def _compile(model, *args, options=None):
    backend.reset()
    out = torch.compile(model, backend="fusion", options=options or {})(*args)
    calls = library_calls()
    kernels = [k for r in driver.reports for p in r.parts for k in p.kernels]
    return out, calls, kernels


def _copy_kernels(kernels) -> int:
    """Kernels that compute one clone and nothing else (views aside)."""
    return sum(len(k.ops) == 1 and "aten.clone" in k.ops[0] for k in kernels)


@settings(max_examples=6, deadline=None, suppress_health_check=[HealthCheck.function_scoped_fixture])  # renderer: one
@given(
    b=st.integers(0, 3),
    n=st.integers(1, 7),
    heads=st.integers(1, 3),
    d=st.integers(1, 4),
    special=st.sampled_from([None, float("nan"), float("inf")]),
    strided=st.booleans(),
)
@example(b=2, n=5, heads=2, d=3, special=float("nan"), strided=True)
@example(b=1, n=1, heads=1, d=1, special=None, strided=False)
@example(b=1, n=1, heads=2, d=3, special=None, strided=False)
def test_each_lone_copy_of_an_attention_block_is_a_kernel_with_eagers_bits(renderer, b, n, heads, d, special, strided):
    monkeypatch = pytest.MonkeyPatch()
    try:
        monkeypatch.setattr(copy_kernels, "ON_CPU", True)
        c = heads * d
        model = HeadsAttention(c, heads)
        x = torch.randn(n, b, c, dtype=torch.float64, generator=torch.Generator().manual_seed(n + b))
        x = x.transpose(0, 1) if strided else x.transpose(0, 1).contiguous()  # a non-contiguous input, or not
        if special is not None and x.numel():
            x[0, 0, 0] = special
        want, aten_copies, _ = _compile(model, x, options={"copy_kernels": False})
        out, calls, kernels = _compile(model, x)
        # a copy moves bits: the same GEMMs on the same layouts give aten's copies' bits exactly; eager's matmul of the
        # strided views may take another BLAS path (an ulp apart in float64: b=1, n=1, heads=2, d=3)
        torch.testing.assert_close(out, want, rtol=0, atol=0, equal_nan=True)
        torch.testing.assert_close(out, model(x), equal_nan=True)
        if b:  # each copy aten ran is a kernel now (an empty batch copies nothing: aten's copy stays)
            assert calls["clone"] == 0, calls
            assert _copy_kernels(kernels) == aten_copies["clone"], [k.ops for k in kernels]
        else:
            assert calls["clone"] == aten_copies["clone"]
    finally:
        monkeypatch.undo()


def test_without_the_pass_or_on_a_cpu_graph_the_copies_stay_aten():
    model, x = HeadsAttention(6, 2), torch.randn(2, 5, 6, dtype=torch.float64)
    _, calls, _ = _compile(model, x)  # ON_CPU off: a CPU graph keeps aten's copies
    assert calls["clone"] >= 3, calls
    with pytest.MonkeyPatch.context() as mp:
        mp.setattr(copy_kernels, "ON_CPU", True)
        _, calls, _ = _compile(model, x, options={"copy_kernels": False})
        assert calls["clone"] >= 3, calls
        _, calls, _ = _compile(model, x)
        assert calls["clone"] == 0, calls


def test_a_dense_copy_stays_a_copy_and_the_refusals_say_why(monkeypatch):
    monkeypatch.setattr(copy_kernels, "ON_CPU", True)
    gm = torch.fx.experimental.proxy_tensor.make_fx(
        lambda x: (
            x.clone() @ x,
            x.t().clone(),
            x.t().contiguous() @ x,
            x[:0].t().clone(memory_format=torch.contiguous_format),
        ),
        tracing_mode="fake",
    )(torch.randn(3, 3))
    why = {n.name: copy_kernels.copy_refusal(n) for n in gm.graph.nodes if n.target is torch.ops.aten.clone.default}
    assert list(why.values()) == [
        "its input is laid out as its output: a memcpy, aten's copy is as fast",
        "its input is laid out as its output: a memcpy, aten's copy is as fast",  # preserve_format keeps x.t()'s
        None,
        "no elements",
    ], why
    monkeypatch.setattr(copy_kernels, "ON_CPU", False)
    assert "aten's copy loop" in copy_kernels.copy_refusal(next(n for n in gm.graph.nodes if n.name == "clone_2"))


def test_a_copy_cut_out_of_a_region_by_its_shape_keeps_a_kernel(renderer, monkeypatch):
    """q scaled (b, h, n, d) and k copied transposed (b, h, d, n) from one pointwise op: shapes that do not
    broadcast, so the region is cut in two and the copy's piece is one op; it stays a kernel."""
    monkeypatch.setattr(copy_kernels, "ON_CPU", True)

    def f(x):
        y = (x + 1.0).view(2, 5, 2, 3)
        q = y.permute(0, 2, 1, 3) * 0.5
        kt = y.permute(0, 2, 3, 1).contiguous()
        return q @ kt

    x = torch.randn(2, 5, 6, dtype=torch.float64)
    for options, clones in (({}, 0), ({"copy_kernels": False}, 1)):
        out, calls, kernels = _compile(f, x, options=options)
        torch.testing.assert_close(out, f(x), rtol=0, atol=0)
        assert calls["clone"] == clones, (options, calls, [k.ops for k in kernels])


def test_a_training_step_through_the_copies_keeps_eagers_gradients(monkeypatch):
    monkeypatch.setattr(copy_kernels, "ON_CPU", True)
    model = HeadsAttention(6, 2)
    ref = HeadsAttention(6, 2)
    x = torch.randn(2, 5, 6, dtype=torch.float64, requires_grad=True)
    xr = x.detach().clone().requires_grad_(True)
    out, calls, _ = _compile(model, x)
    out.square().sum().backward()
    ref(xr).square().sum().backward()
    torch.testing.assert_close(model.w.grad, ref.w.grad)
    torch.testing.assert_close(x.grad, xr.grad)
    calls = library_calls()
    assert calls["clone"] == 0, calls


def test_a_copy_s_kernel_takes_no_view_from_before_a_write(monkeypatch):
    """The kernel's call sits at its first member: a view made before an in-place write and copied after it stays
    outside the kernel (the kernel reads it where the copy was, after the write, as eager's copy does)."""
    monkeypatch.setattr(copy_kernels, "ON_CPU", True)

    def f(x, buf):
        early = buf.t()
        buf.add_(1.0)  # a write between the view and its copy
        late = x.t()
        return early.contiguous() @ x, late.contiguous() @ x

    gm = torch.fx.experimental.proxy_tensor.make_fx(f, tracing_mode="fake")(torch.randn(3, 3), torch.randn(3, 3))
    copy_kernels.mark_copy_kernels(gm, lambda *a: None)
    regions = lone_kernels.lone_kernel_regions(gm, [])
    assert [[n.target for n in r.nodes] for r in regions] == [
        [torch.ops.aten.clone.default],  # early's: its view comes before the write
        [torch.ops.aten.t.default, torch.ops.aten.clone.default],
    ], regions
