"""Phase 4's model suite, printed and summed up: the table rows as the suite prints them while it runs, and the summary
per backend (pass rate, geomean speed-ups over passing rows, mean compile time). Read by :mod:`fusion.bench.suite`,
scripts/gpu_suite.py and scripts/suite_table.py."""

from __future__ import annotations

import math
import statistics
from collections.abc import Sequence


def geomean(xs: Sequence[float]) -> float | None:
    xs = [x for x in xs if x and x > 0]
    return math.exp(statistics.fmean(math.log(x) for x in xs)) if xs else None


def summarize(rows: Sequence[dict], backends: Sequence[str]) -> dict:
    """Per backend: pass rate over the models that ran, geomean speed-ups over its passing rows, mean compile time."""
    out = {}
    ran = [r for r in rows if r["status"] not in ("skipped",)]
    for name in backends:
        if name == "eager":
            continue
        # a model that crashed or timed out (scripts/gpu_suite.py) counts as a failure of every backend
        failed = {"status": "fail_to_run"}
        mine = [r["backends"].get(name) or (failed if r["status"] != "ok" else None) for r in ran]
        mine = [m for m in mine if m and m["status"] != "unavailable"]
        passed = [m for m in mine if m["status"] == "pass"]
        out[name] = {
            "models": len(mine),
            "passed": len(passed),
            "pass_rate": len(passed) / len(mine) if mine else None,
            "geomean_vs_eager": geomean([m.get("speedup_vs_eager") for m in passed]),
            "geomean_vs_inductor": geomean([m.get("speedup_vs_inductor") for m in passed]),
            "geomean_paired_vs_inductor": geomean([m.get("paired_vs_inductor") for m in passed]),
            "geomean_vs_reduce_overhead": geomean([m.get("speedup_vs_reduce_overhead") for m in passed]),
            "mean_compile_s": statistics.fmean([m["first_call_s"] for m in passed]) if passed else None,
        }
    return out


def _x(v: float | None) -> str:
    return "-" if v is None else f"{v:.2f}×"


def summary_lines(summary: dict) -> list[str]:
    lines = []
    for name, s in summary.items():
        rate = "-" if s["pass_rate"] is None else f"{100 * s['pass_rate']:.0f}%"
        comp = "-" if s["mean_compile_s"] is None else f"{s['mean_compile_s']:.1f} s"
        lines.append(
            f"  {name}: pass {s['passed']}/{s['models']} ({rate}), geomean {_x(s['geomean_vs_eager'])} eager, "
            f"{_x(s['geomean_vs_inductor'])} inductor, {_x(s['geomean_vs_reduce_overhead'])} reduce-overhead, "
            f"first call {comp} (mean)"
        )
        if s.get("geomean_paired_vs_inductor") is not None:  # the host's drift over the run cancels in these
            lines.append(f"    {name}, paired by round: geomean {_x(s['geomean_paired_vs_inductor'])} inductor")
    return lines


def row_lines(row: dict) -> list[str]:
    """The table rows of one model, as they are printed while the suite runs (each fits in 120 columns)."""
    if row["status"] != "ok" or not row.get("backends"):  # skipped, eager_fail_to_run, timeout, crashed
        return [f"  {row['model']:<16} {row['status']}: {row['reason']}"[:120]]
    out = []
    for name, r in row["backends"].items():
        t = r.get("median_s")
        mem = r.get("peak_memory_bytes")
        cells = (
            f"  {row['model']:<16} {name:<24} {r['status']:<13} {'-' if t is None else f'{t * 1e3:9.3f} ms':>12} "
            f"{_x(r.get('speedup_vs_eager')):>7} {_x(r.get('speedup_vs_inductor')):>7} "
            f"{_x(r.get('speedup_vs_reduce_overhead')):>7} {r.get('first_call_s', 0):7.1f} s "
            f"{'-' if mem is None else f'{mem / 1e6:.3g}':>7}"
        )
        why = r["reason"] or r.get("note", "")
        out.append((cells + (f"  {why}" if why else ""))[:120])
    return out


HEADER = (
    f"  {'model':<16} {'backend':<24} {'status':<13} {'median':>12} {'eager':>7} {'ind.':>7} {'r-o':>7} "
    f"{'compile':>9} {'peak MB':>7}"
)
