"""A short CUDA check of dropout's mask generated in the kernel (issue 39, ``fusion.compiler.random_ops``).

    PYTHONPATH=. python3 scripts/gpu_random.py            (on the device machine; ~1-2 minutes)
    PYTHONPATH=. python3 scripts/gpu_random.py --dry-run  (CPU, small sizes, no Inductor, no timings: the script runs)

1. Bits: the generated kernel's rand (``_philox_rand``), Triton's own ``tl.rand`` and the torch reference, bit for
   bit for the same seed and positions (the compiled Triton, not the interpreter).
2. Statistics through ``backend="fusion"``: the kept fraction of a (4096, 1024) mask within a binomial bound,
   eager's 1/(1-p) scale, two masks of one graph independent, a new mask per call, the same after manual_seed.
3. Time: ``LayerNorm(dropout(x) + residual)`` forward + backward, bf16 (8*512, 768) as in BERT: eager,
   ``fusion`` with the pass ``random``, ``fusion`` without it (rand as a library call), Inductor. Interleaved rounds,
   median per variant; the fusion report's launches per step.
"""

from __future__ import annotations

import argparse
import math
import statistics
import sys
import time

import torch
import torch.nn as nn

import fusion.backend as fb
from fusion.codegen import compile_regions
from fusion.compiler import random_ops

bad: list[str] = []


def check(ok: bool, what: str) -> None:
    print(f"  {'ok ' if ok else 'BAD'} {what}")
    if not ok:
        bad.append(what)


def within(mean: float, p: float, n: int, sds: float = 6.0) -> bool:
    return abs(mean - p) <= sds * math.sqrt(p * (1 - p) / n)


class Fn(nn.Module):
    def __init__(self, fn) -> None:
        super().__init__()
        self.fn = fn

    def forward(self, *args):
        return self.fn(*args)


def bits(dev: str, n: int) -> None:
    print("\n== 1. bits: generated kernel vs torch reference (vs tl.rand on a GPU)")
    seeds = torch.tensor([3, 2**62 + 987654321, 2**63 - 2], dtype=torch.int64, device=dev)
    x = torch.zeros(n, 257, device=dev)

    def fn(s, x):
        return torch.ops.fusion.philox_rand(s, [n, 257]) + x

    model = compile_regions(Fn(fn), (seeds[2:].clone(), x))
    got = model(seeds[2:].clone(), x)
    want = random_ops.philox_rand_reference(seeds[2:], [n, 257])
    check(model.compiled.num_kernels == 1, f"one generated kernel ({model.compiled.num_kernels})")
    check(torch.equal(got, want), "generated rand == torch reference, bit for bit")
    if dev == "cuda":
        import triton
        import triton.language as tl

        @triton.jit
        def k(seeds, out, N, XBLOCK: tl.constexpr):
            i = tl.program_id(0) * XBLOCK + tl.arange(0, XBLOCK)
            tl.store(out + i, tl.rand(tl.load(seeds + 2), i), i < N)

        out = torch.empty(n * 257, device=dev)
        k[(triton.cdiv(out.numel(), 1024),)](seeds, out, out.numel(), XBLOCK=1024)
        check(
            torch.equal(out.view(n, 257), want),
            f"tl.rand == torch reference, bit for bit (Triton {triton.__version__})",
        )


class TwoDropouts(nn.Module):
    def __init__(self, p: float) -> None:
        super().__init__()
        self.a, self.b = nn.Dropout(p), nn.Dropout(p)

    def forward(self, x):
        return self.a(x), self.b(x)


def stats(dev: str, shape: tuple[int, int], p: float = 0.1) -> None:
    print(f"\n== 2. statistics of nn.Dropout({p}) through backend='fusion' on {dev}, {shape}")
    for dtype in (torch.float32, torch.bfloat16):
        fb.reset()
        torch._dynamo.reset()
        x = torch.ones(shape, device=dev, dtype=dtype, requires_grad=True)
        model = torch.compile(TwoDropouts(p), backend="fusion")
        torch.manual_seed(7)
        y1, y2 = model(x)
        fwd = [q for r in fb.reports for q in r.parts if q.kind == "forward"]
        code = fwd[0].graph.graph_module.code if fwd and fwd[0].graph else ""
        check("aten.rand.default" not in code and "philox" in code + str([k.ops for k in fwd[0].kernels]),
              f"{dtype}: rand generated in the kernels")  # fmt: skip
        n, keep = x.numel(), 1 - p
        m1, m2 = y1 != 0, y2 != 0
        check(within(m1.float().mean().item(), keep, n), f"{dtype}: kept {m1.float().mean().item():.5f} ~ {keep}")
        scale = torch.nn.functional.dropout(torch.ones(8, device=dev, dtype=dtype), p).max()
        check(bool((y1[m1] == scale).all()), f"{dtype}: kept values are eager's 1/(1-p) = {scale.item()}")
        check(within((m1 & m2).float().mean().item(), keep * keep, n), f"{dtype}: two masks independent")
        a1, _ = model(x)
        check(not torch.equal(a1 != 0, m1), f"{dtype}: a new mask per call")
        torch.manual_seed(7)
        b1, b2 = model(x)
        check(torch.equal(b1, y1) and torch.equal(b2, y2), f"{dtype}: manual_seed reproduces both masks")
        (y1.float().sum() + y2.float().sum()).backward()
        want = (m1.to(dtype) * scale + m2.to(dtype) * scale).to(dtype)
        check(torch.equal(x.grad, want), f"{dtype}: the gradient reads the forward's masks")


class DropAddNorm(nn.Module):
    def __init__(self, d: int, p: float = 0.1) -> None:
        super().__init__()
        self.drop, self.norm = nn.Dropout(p), nn.LayerNorm(d)

    def forward(self, x, res):
        return self.norm(self.drop(x) + res)


def timing(dev: str, rows: int, d: int, rounds: int, iters: int) -> None:
    print(f"\n== 3. LayerNorm(dropout(x) + residual), forward + backward, bf16 ({rows}, {d}) on {dev}")
    dtype = torch.bfloat16
    x = torch.randn(rows, d, device=dev, dtype=dtype, requires_grad=True)
    res = torch.randn(rows, d, device=dev, dtype=dtype, requires_grad=True)
    g = torch.randn(rows, d, device=dev, dtype=dtype)
    base = DropAddNorm(d).to(dev, dtype)
    variants = {"eager": base}
    torch._dynamo.reset()
    fb.reset()
    variants["fusion"] = torch.compile(base, backend="fusion")
    variants["fusion, random off"] = torch.compile(base, backend="fusion", options={"random": False})
    if dev == "cuda":
        variants["inductor"] = torch.compile(base)

    def step(m):
        out = m(x, res)
        out.backward(g)
        x.grad = res.grad = None
        for q in base.parameters():
            q.grad = None

    for name, m in list(variants.items()):
        try:
            for _ in range(3):
                step(m)
        except Exception as e:  # "random" not an option before the integrator lists the pass: say so
            print(f"  {name}: {type(e).__name__}: {str(e)[:160]}")
            del variants[name]
    if dev == "cuda":
        torch.cuda.synchronize()
    per = {name: [] for name in variants}
    for _ in range(rounds):
        for name, m in variants.items():
            if dev == "cuda":
                torch.cuda.synchronize()
            t0 = time.perf_counter()
            for _ in range(iters):
                step(m)
            if dev == "cuda":
                torch.cuda.synchronize()
            per[name].append((time.perf_counter() - t0) / iters * 1e6)
    for r in fb.reports:
        for q in r.parts:
            print(f"  fusion graph {r.index} {q.kind}: {len(q.kernels)} kernels, passes {[p[0] for p in q.passes]}")
    if dev != "cuda":
        print("  (no timings on a CPU)")
        return
    eager = statistics.median(per["eager"])
    for name, ts in per.items():
        med = statistics.median(ts)
        print(f"  {name:22s} {med:9.1f} us/step  ({eager / med:.2f}x eager)")


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--dry-run", action="store_true", help="CPU, small sizes: check that the script runs")
    args = ap.parse_args(argv)
    names = [p.name for p in fb.PASSES]
    if "random" not in names:  # before the integrator lists the pass: inserted before "reorder" here
        fb.PASSES.insert(names.index("reorder") if "reorder" in names else len(names), random_ops.RANDOM)
        print("(the pass 'random' is not in fusion.backend.PASSES: inserted for this run)")
    dev = "cpu" if args.dry_run or not torch.cuda.is_available() else "cuda"
    if dev == "cuda":
        print(f"torch {torch.__version__}, {torch.cuda.get_device_name()}")
    bits(dev, 64 if dev == "cpu" else 4096)
    stats(dev, (64, 256) if dev == "cpu" else (4096, 1024))
    timing(dev, *((64, 128, 1, 1) if dev == "cpu" else (8 * 512, 768, 7, 20)))
    print("\n" + ("all checks passed" if not bad else f"{len(bad)} check(s) failed: {bad}"))
    return 1 if bad else 0


if __name__ == "__main__":
    sys.exit(main())
