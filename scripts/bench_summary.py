"""A short summary of fusion.benchmark JSON files: `python3 scripts/bench_summary.py bench_cuda.json [more.json]`.

Standard library only (it runs last in scripts/gpu_run.sh, whatever else failed). A missing file is reported, not
fatal.
"""

from __future__ import annotations

import json
import sys


def _t(s: float | None) -> str:
    if s is None:
        return "-"
    return f"{s * 1e6:.1f} µs" if s < 1e-3 else f"{s * 1e3:.2f} ms"


def _x(v: float | None) -> str:
    return "-" if v is None else f"{v:.2f}×"


def summarize(path: str) -> None:
    try:
        with open(path) as f:
            r = json.load(f)
    except (OSError, ValueError) as e:
        print(f"{path}: no result ({e})")
        return
    m, p = r["meta"], r.get("peaks", {})
    state = "" if r.get("complete") else "  [INCOMPLETE: the run stopped early]"
    print(
        f"{path}: {m['device_name']} ({m['device']}), torch {m['torch_version']}, {m['dtype']}, "
        f"{m['threads']} threads, {m['date']}{state}"
    )
    if p:
        print(f"  peaks: {p['bytes_per_s'] / 1e9:.0f} GB/s copy, {p['flops_per_s'] / 1e12:.3g} TFLOP/s matmul")
    for w in r["workloads"]:
        v = {x["name"]: x for x in w["variants"]}
        parts = []
        for name, x in v.items():
            if name == "eager":
                continue
            if x["median_s"] is None:
                parts.append(
                    f"{name}: {'skipped' if not x.get('available', True) else 'not timed'} ({x['reason'][:60]})"
                )
            else:
                bad = "" if x["outputs_match"] else " MISMATCH"
                gpu = f", GPU {_x(x['gpu_speedup'])}" if x.get("gpu_speedup") else ""
                parts.append(f"{name} {_x(x['speedup_vs_eager'])} (pred {_x(x['predicted_speedup'])}{gpu}){bad}")
        print(f"  {w['title'][:27]:<27} eager {_t(v['eager']['median_s']):>10} | " + " | ".join(parts))
        for name, x in v.items():  # CUDA: GPU kernel time per call and what the wall clock adds on top
            g = x.get("gpu") or {}
            if g.get("gpu_s") and x["median_s"]:
                print(
                    f"    {name:<14} GPU {_t(g['gpu_s']):>10} in {g['kernels_per_call']:.3g} kernels, "
                    f"wall - GPU {_t(max(x['median_s'] - g['gpu_s'], 0.0))}"
                    + (f", max |diff| {x['max_abs_diff']:.2e}" if x.get("max_abs_diff") is not None else "")
                )
            for k in x.get("generated") or []:
                print(
                    f"    {name:<14} kernel {k['name'][:48]}: predicted {_t(k['predicted_s'])}, "
                    f"measured {_t(k['measured_s'])}, ratio {_x(k['ratio'])}"
                )
    for s in r.get("skipped") or []:
        print(f"  skipped {s['workload']}: {s['reason'][:100]}")
    for e in r.get("errors") or []:
        print(f"  FAILED {e['workload']}: {e['error'][:200]}")
    for t in r.get("targets") or []:
        vs = f" vs {t['vs']} ({t.get('clock', 'wall')})" if "vs" in t else ""
        print(f"  target {t['workload']}{vs} >= {t['need']:.2f}x: {t['status']}")


if __name__ == "__main__":
    for arg in sys.argv[1:]:
        summarize(arg)
