"""Where backend="fusion" loses on a model: wall time against GPU time (CPU-bound or GPU-bound?), the launches per
call, the top GPU kernels (torch.profiler) of eager, of the backend and of Inductor, and the library calls the
backend left outside its generated kernels (issue 23's "why"). Inference models and training steps alike: each runs
exactly as the suite runs it (``fusion.bench.suite._runner``: bf16 or AMP, channels_last images).

    PYTHONPATH=. python3 scripts/gpu_profile_models.py bert_train vit_b_16     (on the lent GPU; full suite sizes)
    python3 scripts/gpu_profile_models.py --dry-run resnet18                  (CPU, tiny shapes: rehearse it)
    ... --backends=eager,fusion                                               (a subset of the backends)
    ... --cudnn-benchmark                 (cuDNN times its algorithms on each shape's first call, as the suite does)
"""

from __future__ import annotations

import os
import re
import sys
import time
from collections import Counter

import torch
from suite_steps import fresh_steps
from torch.profiler import ProfilerActivity, profile

from fusion import backend
from fusion.bench.results import save_json
from fusion.bench.suite import SuiteConfig


def wall_ms(step, n: int) -> float:
    """Median wall time of one call over ``n`` calls (synchronised each call: what a user's loop sees)."""
    times = []
    for _ in range(n):
        if torch.cuda.is_available():
            torch.cuda.synchronize()
        t0 = time.perf_counter()
        step()
        if torch.cuda.is_available():
            torch.cuda.synchronize()
        times.append(time.perf_counter() - t0)
    return sorted(times)[n // 2] * 1e3


def kernels(step, n: int, top: int) -> dict:
    """GPU kernel time and launches per call, and the ``top`` kernels by time."""
    acts = [ProfilerActivity.CPU] + ([ProfilerActivity.CUDA] if torch.cuda.is_available() else [])
    with profile(activities=acts) as prof:
        for _ in range(n):
            step()
        if torch.cuda.is_available():
            torch.cuda.synchronize()
    rows = [
        (e.key, e.device_time_total / n, e.count / n)
        for e in prof.key_averages()
        if e.device_time_total > 0 and e.device_type == torch.autograd.DeviceType.CUDA
    ]
    rows.sort(key=lambda r: -r[1])
    groups: dict[str, list[float]] = {}  # a generated kernel's name without its index, an aten kernel's short name
    for k, us, c in rows:
        g = groups.setdefault(kernel_group(k), [0.0, 0.0])
        g[0], g[1] = g[0] + us, g[1] + c
    grouped = sorted(groups.items(), key=lambda kv: -kv[1][0])
    return {
        "gpu_ms": sum(r[1] for r in rows) / 1e3,
        "launches": sum(r[2] for r in rows),
        "top": [{"kernel": k[:140], "us": round(us, 1), "count": c} for k, us, c in rows[:top]],
        "groups": [{"group": k, "us": round(v[0], 1), "count": v[1]} for k, v in grouped[: 2 * top]],
        # by launches: in a CPU-bound call the many small kernels cost more than their GPU time says
        "by_count": [
            {"group": k, "us": round(v[0], 1), "count": v[1]}
            for k, v in sorted(grouped, key=lambda kv: -kv[1][1])[:top]
        ],
    }


def kernel_group(name: str) -> str:
    """triton_poi_fused_add_erf_mul_31 -> triton_poi_fused_add_erf_mul; a templated aten kernel -> its function."""
    if name.startswith("triton_"):
        return re.sub(r"_\d+$", "", name)
    names = re.findall(r"at::native::(?:\(anonymous namespace\)::)?([A-Za-z_0-9]+)", name)
    if len(names) > 1 and "elementwise_kernel" in names[0]:  # the functor says what it computes
        return f"{names[0]}<{names[1]}>"[:80]
    return (names[0] if names else name)[:80]


def main(argv: list[str]) -> None:
    dry = "--dry-run" in argv
    names = [a for a in argv if not a.startswith("--")] or ["bert", "vit_b_16"]
    cfg = SuiteConfig(device="cpu" if dry else "cuda", sizes="tiny" if dry else "full")
    torch.backends.cudnn.benchmark = "--cudnn-benchmark" in argv
    picked = next((a.split("=", 1)[1] for a in argv if a.startswith("--backends=")), "")
    backends = tuple(picked.split(",")) if picked else ("eager", "fusion") if dry else ("eager", "fusion", "inductor")
    out = os.environ.get("OUT")
    results = []
    for name, label, step in fresh_steps(names, backends, cfg):
        t0 = time.perf_counter()
        step()
        first = time.perf_counter() - t0
        for _ in range(2 if dry else 5):
            step()
        row = {"model": name, "backend": label, "first_call_s": round(first, 2)}
        row["wall_ms"] = round(wall_ms(step, 3 if dry else 30), 3)
        row.update(kernels(step, 1 if dry else 5, 15))
        if label == "fusion":
            calls, refused, falls = Counter(), Counter(), Counter()
            for r in backend.reports:
                for p in r.parts:
                    calls.update(p.library_calls)
                    falls.update(f"{p.kind}: {why[:110]}" for _, why in p.fallbacks)
                for k in getattr(r, "refusals", []) or []:
                    refused[str(k)[:100]] += 1
            row["library_calls"] = dict(calls.most_common(20))
            row["graphs"] = len(backend.reports)
            row["fallbacks"] = dict(falls.most_common(25))
        print(
            f"\n{name} {label}: wall {row['wall_ms']:.2f} ms, GPU kernels {row['gpu_ms']:.2f} ms, "
            f"{row['launches']:.0f} launches, first call {first:.1f} s",
            flush=True,
        )
        for k in row["groups"]:
            print(f"  {k['us']:8.1f} µs ×{k['count']:<5.0f} {k['group'][:110]}")
        print("  most launches:", ", ".join(f"{k['group'][:60]} ×{k['count']:.0f}" for k in row["by_count"]))
        if "library_calls" in row:
            print(f"  graphs {row['graphs']}; library calls: {row['library_calls']}")
            for why, c in row["fallbacks"].items():
                print(f"  fallback ×{c}: {why}")
        results.append(row)
        del step
        torch.cuda.empty_cache() if torch.cuda.is_available() else None
    if out:
        save_json(os.path.join(out, "profile_models.json"), {"rows": results}, device=cfg.device)


if __name__ == "__main__":
    main(sys.argv[1:])
