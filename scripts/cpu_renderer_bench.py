"""CPU kernels, four ways, in one process (issue 38): eager, backend="fusion" with the C renderer, backend="fusion"
with Triton's interpreter, and Inductor's C++ backend.

    uv run python scripts/cpu_renderer_bench.py [--threads 2] [--quick] [--json scripts/results/cpu-DATE-renderer.json]

Workloads: an elementwise chain over 8M float32 elements (``relu(x*a + b)*c + x``, models.ElementwiseChain) beside
the copy of those 8M floats (the bandwidth bound), and a Linear-GELU-Linear-LayerNorm block (256x512, hidden 2048).
Timings: torch.utils.benchmark, the variants interleaved round by round, medians; ratios are to eager of the same
round set. First-call times (compile + first run) are stated too. Triton's interpreter runs once per round (it is a
correctness tool: seconds per call).
"""

from __future__ import annotations

import argparse
import os
import statistics
import sys
import time
from pathlib import Path

import torch
import torch.utils.benchmark as tb

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))

from fusion import backend, models  # noqa: E402  (registers backend="fusion")
from fusion.bench.results import run_meta, save_json  # noqa: E402
from fusion.kernels import c_runtime  # noqa: E402


def block(d: int = 512, hidden: int = 2048) -> torch.nn.Module:
    torch.manual_seed(0)
    return torch.nn.Sequential(
        torch.nn.Linear(d, hidden), torch.nn.GELU(), torch.nn.Linear(hidden, d), torch.nn.LayerNorm(d)
    ).eval()


def timed(fn, x, seconds: float) -> float:
    """Median seconds per call (torch.utils.benchmark's blocked_autorange)."""
    return tb.Timer("fn(x)", globals={"fn": fn, "x": x}).blocked_autorange(min_run_time=seconds).median


def variants(model: torch.nn.Module, x: torch.Tensor, skip_interp: bool) -> dict:
    out = {"eager": {"fn": model}}
    compiled = {
        "fusion[c]": lambda: torch.compile(model, backend="fusion", options={"renderer": "c"}),
        "fusion[triton-interp]": lambda: torch.compile(model, backend="fusion", options={"renderer": "triton"}),
        "inductor": lambda: torch.compile(model),
    }
    if skip_interp:
        compiled.pop("fusion[triton-interp]")
    ref = model(x)
    for name, make in compiled.items():
        torch._dynamo.reset()
        fn = make()
        start = time.perf_counter()
        got = fn(x)
        first = time.perf_counter() - start
        err = (got - ref).abs().max().item()
        out[name] = {"fn": fn, "first_call_s": first, "max_abs_diff": err}
        print(f"  {name}: first call {first:.2f} s, max |diff| vs eager {err:.2e}", flush=True)
    return out


def measure(title: str, model, x, rounds: int, seconds: float, skip_interp: bool, extra: dict | None = None) -> dict:
    print(f"{title}: input {tuple(x.shape)} {x.dtype}", flush=True)
    with torch.no_grad():
        vs = variants(model, x, skip_interp)
        vs.update(extra or {})
        times: dict[str, list[float]] = {k: [] for k in vs}
        for _ in range(rounds):  # interleaved: each round times every variant once
            for name, v in vs.items():
                slow = name == "fusion[triton-interp]"
                times[name].append(timed(v["fn"], x, 0.0 if slow else seconds))
    eager = statistics.median(times["eager"])
    result = {}
    for name, ts in times.items():
        med = statistics.median(ts)
        result[name] = {"median_ms": med * 1e3, "rounds_ms": [t * 1e3 for t in ts], "speedup_vs_eager": eager / med}
        result[name].update({k: v for k, v in vs[name].items() if k != "fn"})
        print(f"  {name:24s} {med * 1e3:10.3f} ms   {eager / med:6.2f}x eager", flush=True)
    return result


def main(argv: list[str] | None = None) -> int:
    p = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    p.add_argument("--threads", type=int, default=2)
    p.add_argument("--quick", action="store_true", help="smaller inputs, one round")
    p.add_argument("--no-interp", action="store_true", help="leave Triton's interpreter out")
    p.add_argument("--json", default="")
    args = p.parse_args(argv)
    torch.set_num_threads(args.threads)
    rounds, seconds = (1, 0.2) if args.quick else (3, 1.0)
    ok, cc = c_runtime.available()
    meta = {
        **run_meta("cpu"),
        "cores_visible": os.cpu_count(),
        "threads": torch.get_num_threads(),
        "compiler": cc,
        "openmp": ok and c_runtime.openmp(),
        "rounds": rounds,
    }
    print(f"threads {meta['threads']} of {meta['cores_visible']} cores; C compiler: {cc}")
    backend.reset()
    rows, d = (1024, 1024) if args.quick else (8192, 1024)  # 8M float32 = 32 MiB per tensor
    chain = models.ElementwiseChain(d=d).eval()
    x = torch.randn(rows, d)
    dst = torch.empty_like(x)
    copy = {"copy (bandwidth bound)": {"fn": lambda t: dst.copy_(t)}, "clone (allocate + copy)": {"fn": torch.clone}}
    results = {"meta": meta}
    results["elementwise_chain"] = measure("elementwise chain relu(x*a+b)*c+x", chain, x, rounds, seconds,
                                           args.no_interp, copy)  # fmt: skip
    r = results["elementwise_chain"]
    r["c_vs_copy"] = r["fusion[c]"]["median_ms"] / r["copy (bandwidth bound)"]["median_ms"]
    r["c_vs_clone"] = r["fusion[c]"]["median_ms"] / r["clone (allocate + copy)"]["median_ms"]
    print(
        f"  fusion[c] / copy: {r['c_vs_copy']:.2f}x the copy's time, {r['c_vs_clone']:.2f}x the clone's (a new "
        "output: its pages are first touched by the kernel)"
    )
    results["linear_gelu_linear_layernorm"] = measure(
        "Linear-GELU-Linear-LayerNorm", block(), torch.randn(64 if args.quick else 256, 512), rounds, seconds,
        args.no_interp,
    )  # fmt: skip
    if args.json:
        save_json(args.json, results)
        print(f"wrote {args.json}")
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
