"""Randomness inside generated kernels (issue 39): dropout's mask computed in the kernel that reads it, and fma.

``fusion.compiler.random_ops`` rewrites ``aten.rand`` into ``fusion.philox_rand(seeds[i], shape)`` over one seeds
draw per call; Phase 8's generator computes it in the kernel (Triton: ``_philox_rand``, ``tl.rand``'s bits; C: the
same Philox). Against eager the tests are statistical (eager's CPU generator is another algorithm): the mask's mean,
independence of two masks, new masks per call, the same masks after ``torch.manual_seed``, eager's scale, and
gradients equal to eager's computed from the same mask. Bit for bit only between our own implementations of one
algorithm: the torch reference, the Triton kernel and the C kernel."""

from __future__ import annotations

import math
import os
import subprocess
import sys

import pytest
import torch
import torch.nn.functional as F
from support import Fn

from fusion.codegen import compile_regions
from fusion.compiler import random_ops
from fusion.kernels import c_runtime

torch._dynamo.config.cache_size_limit = max(torch._dynamo.config.cache_size_limit, 64)
RENDERERS = ["triton"] + (["c"] if c_runtime.available()[0] else [])
P = 0.3


def run_in(renderer: str, fn, *inputs):
    """compile_regions under ``renderer``; returns the outputs and the compiled model."""
    with c_runtime.use(renderer):
        model = compile_regions(Fn(fn), inputs)
    return model(*inputs), model


def binomial_ok(mean: float, p_keep: float, n: int, sds: float = 6.0) -> bool:
    return abs(mean - p_keep) <= sds * math.sqrt(p_keep * (1 - p_keep) / n) + 1e-12


@pytest.fixture
def with_random_pass(monkeypatch):
    """``backend="fusion"`` with the pass ``random`` (inserted here until the integrator lists it in PASSES)."""
    from fusion import backend

    names = [p.name for p in backend.PASSES]
    if "random" not in names:  # where it belongs: before "reorder" (an aten.rand is impure: nothing sinks past it)
        at = names.index("reorder") if "reorder" in names else len(names)
        monkeypatch.setattr(backend, "PASSES", [*backend.PASSES[:at], random_ops.RANDOM, *backend.PASSES[at:]])
    backend.reset()
    torch._dynamo.reset()
    yield backend
    torch._dynamo.reset()


# ----------------------------------------------------------------------------------------------------------------------
# One algorithm, three implementations: bit for bit


SEEDS = torch.tensor([3, 2**62 + 987654321, 2**63 - 2], dtype=torch.int64)


TL_RAND = """
import torch, triton, triton.language as tl
@triton.jit
def k(seeds, out, N, XBLOCK: tl.constexpr):
    x = tl.program_id(0) * XBLOCK + tl.arange(0, XBLOCK)
    tl.store(out + x, tl.rand(tl.load(seeds + 1), x), x < N)
out = torch.empty(300)
k[(3,)](torch.tensor([3, 2**62 + 987654321, 2**63 - 2]), out, 300, XBLOCK=128)
print(" ".join(v.hex() for v in out.tolist()))
"""


@pytest.mark.phase8
def test_philox_reference_is_triton_rand_bit_for_bit():
    """The torch reference gives ``tl.rand(seed, offset)``'s bits: Triton's own helper, run in its interpreter in a
    process that sets TRITON_INTERPRET before importing Triton (its @jit helpers are defined at import)."""
    pytest.importorskip("triton")
    env = {**os.environ, "TRITON_INTERPRET": "1"}
    done = subprocess.run([sys.executable, "-c", TL_RAND], env=env, capture_output=True, text=True, timeout=120)
    assert done.returncode == 0, done.stderr[-2000:]
    got = torch.tensor([float.fromhex(v) for v in done.stdout.split()])
    assert torch.equal(got, random_ops.philox_rand_reference(SEEDS[1:2], [300]))


@pytest.mark.phase8
@pytest.mark.parametrize("renderer", RENDERERS)
@pytest.mark.parametrize("sliced", [True, False])
def test_generated_rand_is_the_reference_bit_for_bit(renderer, sliced):
    """The kernel's rand at every position (a pointwise walk, and a column sum's permuted walk) is the reference's,
    its seed an input of the kernel (one element) or a slice of the seeds inside the region."""
    shape = (6, 37)

    def fn(seeds, x):
        r = torch.ops.fusion.philox_rand(seeds[1:2] if sliced else seeds, list(shape))
        return r + x, (r + x).sum(0)

    x = torch.zeros(shape)
    (got, col), model = run_in(renderer, fn, SEEDS if sliced else SEEDS[1:2].clone(), x)
    assert model.compiled.num_kernels >= 1 and not model.compiled.report.skipped, model.compiled.report.table()
    want = random_ops.philox_rand_reference(SEEDS[1:2], list(shape))
    assert torch.equal(got, want)
    torch.testing.assert_close(col, want.sum(0))
    assert 0 <= got.min() and got.max() < 1


@pytest.mark.phase8
@pytest.mark.parametrize("renderer", RENDERERS)
def test_generated_fma_rounds_once(renderer):
    """fma(a, b, c) is a * b + c rounded once: (1 + 2**-12)**2 - 1 keeps its 2**-24 (two roundings lose it)."""
    from torch._inductor import inductor_prims  # noqa: F401  (registers prims.fma)

    def fn(a, b, c):
        return torch.ops.prims.fma(a, b, c) * 2.0

    g = torch.Generator().manual_seed(0)
    a, b, c = (torch.randn(64, generator=g) for _ in range(3))
    a[0] = b[0] = 1 + 2**-12
    c[0] = -1.0
    for dtype in (torch.float32, torch.float64):
        x, y, z = (t.to(dtype) for t in (a, b, c))
        got, model = run_in(renderer, fn, x, y, z)
        assert not model.compiled.report.skipped, model.compiled.report.table()
        if dtype == torch.float32:
            want = (x.double() * y.double() + z.double()).float() * 2  # exact in float64, rounded once
            assert got[0].item() == (2**-11 + 2**-24) * 2 != ((x * y + z) * 2)[0].item()
        else:
            want = (x * y + z) * 2
            torch.testing.assert_close(got, want, rtol=1e-15, atol=1e-15)
            continue
        assert torch.equal(got, want)


# ----------------------------------------------------------------------------------------------------------------------
# Dropout through backend="fusion": statistics, reproducibility, gradients


class TwoDropouts(torch.nn.Module):
    def __init__(self, p: float) -> None:
        super().__init__()
        self.a, self.b = torch.nn.Dropout(p), torch.nn.Dropout(p)

    def forward(self, x):
        return self.a(x), self.b(x)


def _compiled(backend, model, renderer):
    return torch.compile(model, backend="fusion", options={"renderer": renderer})


def _forward_parts(backend):
    return [p for r in backend.reports for p in r.parts if p.kind in ("forward", "inference")]


@pytest.mark.phase9
@pytest.mark.parametrize("renderer", RENDERERS)
def test_dropout_mask_in_kernel_statistics_and_seeding(with_random_pass, renderer):
    """Two dropouts of one graph: each keeps ~1-p (binomial bound), scales by eager's 1/(1-p), the two masks are
    independent, a second call draws new masks, torch.manual_seed(s) twice gives the same ones."""
    backend = with_random_pass
    x = torch.ones(64, 256, requires_grad=True)
    model = _compiled(backend, TwoDropouts(P), renderer)
    torch.manual_seed(1)
    y1, y2 = model(x)
    (part,) = _forward_parts(backend)
    code = part.graph.graph_module.code
    assert "aten.rand.default" not in code and "randint" in code, code  # one seeds draw, no rand call
    assert any("philox_rand" in op for k in part.kernels for op in k.ops), [k.ops for k in part.kernels]
    assert not [f for f in part.fallbacks if "philox" in f[0]], part.fallbacks
    assert len({k.name for k in part.kernels}) == 1, [k.name for k in part.kernels]  # one source for both
    n, keep = x.numel(), 1 - P
    scale = F.dropout(torch.ones(8), P, training=True).max()  # eager's 1/(1-p), as a float32
    for y in (y1, y2):
        m = y != 0
        assert binomial_ok(m.float().mean().item(), keep, n), m.float().mean()
        assert torch.equal(y[m], scale.expand(int(m.sum()))), y[m].unique()
    m1, m2 = y1 != 0, y2 != 0
    assert not torch.equal(m1, m2)
    assert binomial_ok((m1 & m2).float().mean().item(), keep * keep, n)  # independent: P(both) = P(a) P(b)
    again1, _ = model(x)
    assert not torch.equal(again1 != 0, m1)  # a new draw per call
    assert binomial_ok(((again1 != 0) & m1).float().mean().item(), keep * keep, n)
    torch.manual_seed(1)
    same1, same2 = model(x)
    assert torch.equal(same1, y1) and torch.equal(same2, y2)  # torch's generator seeds it


class DropLinear(torch.nn.Module):
    def __init__(self, p: float) -> None:
        super().__init__()
        self.drop, self.lin = torch.nn.Dropout(p), torch.nn.Linear(32, 16)

    def forward(self, x):
        h = self.drop(x)
        return h, torch.tanh(self.lin(h))


@pytest.mark.phase9
@pytest.mark.parametrize("renderer", RENDERERS)
@pytest.mark.parametrize("p", [P, 0.0, 1.0])
def test_dropout_gradient_uses_the_forward_mask(with_random_pass, renderer, p):
    """The backward reads the mask the forward drew (saved, never drawn again): the gradients are eager's computed
    from that mask (read off the forward's zeros). p = 0 and p = 1: the identity and zeros, as eager."""
    backend = with_random_pass
    torch.manual_seed(0)
    ref = DropLinear(p)
    model = DropLinear(p)
    model.load_state_dict(ref.state_dict())
    x = (torch.rand(8, 32) + 0.5).requires_grad_()  # never 0: a zero of h is a dropped element
    h, out = _compiled(backend, model, renderer)(x)
    (out * torch.linspace(-1, 1, 16)).sum().backward()
    mask = h.detach() != 0
    if p == 0.0:
        assert mask.all()
    elif p == 1.0:
        assert not mask.any()
    else:
        assert binomial_ok(mask.float().mean().item(), 1 - p, mask.numel())
    xr = x.detach().clone().requires_grad_()
    scale = 0.0 if p == 1.0 else 1.0 / (1.0 - p)
    hr = xr * mask * scale
    outr = torch.tanh(ref.lin(hr))
    (outr * torch.linspace(-1, 1, 16)).sum().backward()
    torch.testing.assert_close(h, hr)
    torch.testing.assert_close(out, outr)
    torch.testing.assert_close(x.grad, xr.grad)
    for got, want in zip(model.parameters(), ref.parameters(), strict=True):
        torch.testing.assert_close(got.grad, want.grad)


@pytest.mark.phase9
def test_a_half_dropout_and_softmax_backward_fma(with_random_pass):
    """A bfloat16 dropout (the float32 draw rounded) keeps ~1-p; softmax's backward (Inductor's decomposition: an
    fma) is generated, and its gradient is eager's."""
    backend = with_random_pass
    renderer = RENDERERS[-1]
    x = torch.randn(16, 128, dtype=torch.bfloat16)
    y = _compiled(backend, torch.nn.Dropout(P), renderer)(x)
    assert binomial_ok((y != 0).float().mean().item(), 1 - P, x.numel())
    backend.reset()
    s = torch.randn(8, 40, requires_grad=True)
    w = torch.randn(8, 40)
    (
        torch.compile(lambda t: torch.softmax(t * 1.5, -1), backend="fusion", options={"renderer": renderer})(s) * w
    ).sum().backward()
    sr = s.detach().clone().requires_grad_()
    (torch.softmax(sr * 1.5, -1) * w).sum().backward()
    torch.testing.assert_close(s.grad, sr.grad)
    parts = [p for r in backend.reports for p in r.parts if p.kind == "backward"]
    ops = [op for p in parts for k in p.kernels for op in k.ops]
    assert any("fma" in op for op in ops), ops
    assert not [f for p in parts for f in p.fallbacks if "fma" in f[0]]


@pytest.mark.phase9
def test_the_pass_is_a_switch_and_says_what_it_did(with_random_pass):
    """options={'random': False}: rand stays a library call; on, the report names the rand nodes it rewrote."""
    backend = with_random_pass
    x = torch.ones(16, 64)
    for on in (False, True):
        backend.reset()
        torch._dynamo.reset()
        opts = {"renderer": RENDERERS[-1], "random": on}
        y = torch.compile(torch.nn.Dropout(P), backend="fusion", options=opts)(x)
        assert binomial_ok((y != 0).float().mean().item(), 1 - P, x.numel())
        (part,) = _forward_parts(backend)
        code = part.graph.graph_module.code
        assert ("aten.rand.default" in code) is not on, code
        notes = [p for p in part.passes if p[0] == "random"]
        assert bool(notes) is on and (not on or notes[0][2] == "rewritten"), part.passes


@pytest.mark.phase9
def test_channel_dropout_bernoulli_is_generated_too(with_random_pass):
    """nn.Dropout2d's bernoulli(empty(N, C, 1, 1), 1 - p) becomes philox_rand < 1 - p: one draw per channel, kept
    ~1-p, eager's scale, and the backward reads the same channel mask."""
    backend = with_random_pass
    x = (torch.rand(64, 64, 2, 2) + 0.5).requires_grad_()
    y = torch.compile(torch.nn.Dropout2d(P), backend="fusion", options={"renderer": RENDERERS[-1]})(x)
    y.sum().backward()
    (part,) = _forward_parts(backend)
    assert "bernoulli" not in part.graph.graph_module.code and "philox" in str([k.ops for k in part.kernels])
    kept = (y != 0).flatten(2)
    assert torch.equal(kept.all(-1), kept.any(-1))  # whole channels kept or dropped
    assert binomial_ok(kept.all(-1).float().mean().item(), 1 - P, 64 * 64)
    scale = F.dropout(torch.ones(8), P, training=True).max()
    torch.testing.assert_close(y, x.detach() * (y != 0) * scale)
    torch.testing.assert_close(x.grad, (y != 0).float() * scale)
