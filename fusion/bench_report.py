"""The report of Phase 4's benchmark: the tables, the verdicts, the issue's targets, the GPU-profile and kernel-path
lines, and the roofline picture.

Plumbing, not a lesson: there is no exercise here. The lesson — what to count, the roofline, how to time — is
``fusion.benchmark``; it measures, returns every number as a dict (the JSON's schema), and prints it with these
functions, which only read that dict. Every public name here is also importable from ``fusion.benchmark``.
"""

from __future__ import annotations

import importlib.util
import math
from typing import TYPE_CHECKING

import numpy as np

from fusion.common import heading, shorten, table
from fusion.conv_bn_fusion import CONV_PATHS

if TYPE_CHECKING:
    from fusion.benchmark import Peaks


# ----------------------------------------------------------------------------------------------------------------------
# The targets on an H100 (bf16): checked, never asserted. A miss is reported with its size and a likely reason.

TARGETS = (  # (workload key, minimum fx speedup vs eager)
    ("linear_relu_memory", 1.3),
    ("linear_relu_compute", 1.3),
    ("conv_bn_relu", 1.2),
)
EXTRA_TARGETS = {"conv_bn_relu": "fx_epilogue"}  # also judged: the fold + cuDNN epilogue (reported as key+name)


def _variant(w: dict, name: str) -> dict | None:
    return next((v for v in w["variants"] if v["name"] == name and v["median_s"] is not None), None)


def check_targets(result: dict) -> list[dict]:
    if result["meta"]["device"] != "cuda" or result["meta"]["sizes"] == "tiny":
        return []
    out = []
    by_key = {w["key"]: w for w in result["workloads"]}
    jobs = []
    for key, need in TARGETS:
        jobs.append((key, need, "fx"))
        w = by_key.get(key)
        if key in EXTRA_TARGETS and w and _variant(w, EXTRA_TARGETS[key]) is not None:
            jobs.append((key, need, EXTRA_TARGETS[key]))
    for key, need, name in jobs:
        w = by_key.get(key)
        fx_v = _variant(w, name) if w else None
        if fx_v is None:
            out.append({"workload": key, "need": need, "status": "not run (no FX-fused variant)"})
            continue
        if name != "fx":
            key = f"{key}+{name}"
        comp = _variant(w, "compile")
        entry = {
            "workload": key,
            "need": need,
            "speedup": fx_v["speedup_vs_eager"],
            "predicted": fx_v["predicted_speedup"],
            "vs_compile": None,
        }
        misses = []
        if fx_v["speedup_vs_eager"] < need:
            misses.append(
                f"{fx_v['speedup_vs_eager']:.2f}× < {need}× (short by {need - fx_v['speedup_vs_eager']:.2f}×)"
            )
        if comp is not None:
            entry["vs_compile"] = comp["median_s"] / fx_v["median_s"]
            if fx_v["median_s"] > comp["median_s"]:
                misses.append(f"{entry['vs_compile']:.2f}× of torch.compile's speed (slower)")
        entry["status"] = "met" if not misses else "missed: " + "; ".join(misses)
        out.append(entry)
    return out


# ----------------------------------------------------------------------------------------------------------------------
# Printing


def fmt_time(s: float | None) -> str:
    if s is None:
        return "-"
    if s < 1e-3:
        return f"{s * 1e6:.1f} µs"
    if s < 1:
        return f"{s * 1e3:.2f} ms"
    return f"{s:.2f} s"


def _x(v: float | None) -> str:
    return "-" if v is None else f"{v:.2f}×"


def _mb(v: int | None) -> str:
    return "-" if v is None else f"{v / 1e6:.3g}"


def results_table(result: dict) -> str:
    """The one table: a row per (workload, variant). Skipped variants get a dash here and a line in skipped_lines."""
    rows = []
    for w in result["workloads"]:
        for v in w["variants"]:
            name = w["title"] if v["name"] == "eager" else ""
            if not v["available"] or v["median_s"] is None:
                rows.append((name, v["label"], "skipped", *["-"] * 8))
                continue
            flag = "" if v["outputs_match"] else " (!)"
            rows.append(
                (
                    name,
                    v["label"] + flag,
                    fmt_time(v["median_s"]),
                    fmt_time(v["iqr_s"]),
                    _x(v["speedup_vs_eager"]),
                    _x(v["predicted_speedup"]),
                    f"{v['gbps']:.1f}",
                    f"{v['pct_of_limit']:.0f}%",
                    _mb(v["peak_memory_bytes"]),
                    _mb(v["intermediate_bytes"]),
                    _mb(v["bytes_removed"]),
                )
            )
    headers = ["workload", "variant", "median", "IQR", "vs eager", "predicted", "eff. GB/s", "% of limit"]
    return table(rows, [*headers, "peak MB", "interm. MB", "removed MB"])


def skipped_lines(result: dict) -> list[str]:
    return [
        f"  skipped: {w['title']} / {v['label']}: {v['reason']}"
        for w in result["workloads"]
        for v in w["variants"]
        if not v["available"] or v["median_s"] is None
    ]


def workloads_table(result: dict) -> str:
    rows = [
        (
            w["title"],
            w["shape"],
            w["dtype"],
            f"{w['flops'] / 1e9:.3g}",
            f"{w['min_bytes'] / 1e6:.3g}",
            f"{w['intensity']:.3g}",
            w["bound_by"],
            fmt_time(w["bound_s"]),
            fmt_time(w["eager_kernels_bound_s"]),
            f"{w['eager_intermediate_bytes'] / 1e6:.3g}",
        )
        for w in result["workloads"]
    ]
    headers = [
        "workload",
        "shape",
        "dtype",
        "GFLOP",
        "min MB",
        "FLOP/byte",
        "bound by",
        "limit",
        "eager kernels",
        "interm. MB",
    ]
    return table(rows, headers)


NOTES = """\
How to read it
  median, IQR   blocked_autorange over all interleaved rounds; IQR = 75th - 25th percentile of the blocks.
  vs eager      eager median / this median (measured). predicted: the roofline's bound for eager's kernels (one
                per graph node, each paying its own bytes) / the same for this variant; for torch.compile, whose
                kernels we cannot see, the ideal of the whole workload in one kernel (an upper bound).
  eff. GB/s     the workload's *minimum* bytes (inputs, weights, outputs once) / median: bytes that had to move.
  % of limit    roofline limit / median, limit = max(FLOPs / peak FLOP/s, min bytes / peak bytes/s). Above
                100%: the working set stayed in cache (L2 on a GPU, L2/L3 on a CPU), beating the DRAM ceiling.
  peak MB       CUDA only: peak bytes allocated during one call, above what was already resident.
  interm. MB    intermediate tensors the graph writes and reads back (ShapeProp); removed MB = eager's minus this.
  (!)           the output differs from eager beyond the dtype's tolerance: that row's speed is not a result.
  kernel paths  a node whose kernels differ from "one per node": on cuDNN a conv's bias is its own add_ kernel
                (so folding BN into it swaps one pass for another); the cuDNN epilogue runs conv+bias+ReLU as one.
  GPU (CUDA)    torch.profiler's kernel time per call; wall − GPU is time the GPU waited for the CPU."""


HOLDS_WITHIN = 1.15  # the roofline "holds" when measured and predicted speedups agree within 15%
OVERHEAD_SHARE = 0.2  # CUDA: a call whose wall time exceeds its GPU kernel time by over 20% is overhead-bound


def overhead_bound(row: dict | None) -> bool:
    """CUDA: did the GPU sit idle for a good part of the call (wall − GPU time > 20% of wall)? Then the CPU side
    (Python, dispatch, launches) sets the pace, and bytes, which the roofline counts, do not."""
    gpu = (row or {}).get("gpu") or {}
    return bool(gpu.get("gpu_s")) and row["median_s"] - gpu["gpu_s"] > OVERHEAD_SHARE * row["median_s"]


def verdict(result: dict, w: dict, v: dict) -> str:
    """Does the roofline's predicted speedup explain the measured one, and if not, the likeliest reason."""
    eager = _variant(w, "eager")
    pred, meas = v["predicted_speedup"], v["speedup_vs_eager"]
    holds = abs(math.log(meas / pred)) < math.log(HOLDS_WITHIN)
    gpu_x = v.get("gpu_speedup")
    if overhead_bound(eager) or overhead_bound(v):
        busy = " / ".join(
            f"{r['name']} {100 * r['gpu']['gpu_s'] / r['median_s']:.0f}%" for r in (eager, v) if r and r.get("gpu")
        )
        gpu_part = ""
        if gpu_x:
            agrees = abs(math.log(gpu_x / pred)) < math.log(HOLDS_WITHIN)
            gpu_part = f"; GPU kernel time alone: {gpu_x:.2f}× ({'agrees' if agrees else 'disagrees'} with the bytes)"
        gaps = " / ".join(f"{r['name']} {fmt_time(r['overhead_s'])}" for r in (eager, v) if r and r.get("overhead_s"))
        return (
            f"overhead-bound, so the match or mismatch is not about bytes: the GPU is busy only {busy} of the wall "
            f"time{gpu_part}; the rest is per-call CPU time (Python, dispatch, launch; wall − GPU: {gaps})"
        )
    if holds:
        return "holds" + (f" (GPU kernel time alone: {gpu_x:.2f}×)" if gpu_x else "")
    noisy = [r["name"] for r in (eager, v) if r and r["iqr_s"] > 0.25 * r["median_s"]]
    if noisy:
        why = f"too noisy to tell ({' and '.join(noisy)}: IQR over 25% of the median); rerun on a quiet machine"
    elif eager and eager["pct_of_limit"] > 100:
        why = "the working set fits in cache, so bytes cost less than the DRAM ceiling says"
    elif (
        eager and not eager.get("gpu") and eager["median_s"] < (20e-6 if result["meta"]["device"] == "cuda" else 200e-6)
    ):
        why = "the calls are so short that per-op launch/dispatch overhead, not bytes, sets the time"
    elif meas < pred:
        why = "the variants' kernels reach their ceilings unequally (compare % of limit)"
    else:
        why = "the fused kernel is also better than the eager ones at what it does (not only fewer bytes)"
    if gpu_x:
        why += f"; GPU kernel time alone: {gpu_x:.2f}×"
    return f"does not hold: {why}"


def closing_note(result: dict, peaks: Peaks | None = None) -> list[str]:
    """One line per fused variant: predicted vs measured speedup and the verdict (``peaks`` is not needed)."""
    lines = []
    for w in result["workloads"]:
        for v in w["variants"]:
            if v["name"] == "eager" or v["median_s"] is None or v["predicted_speedup"] is None:
                continue
            pred, meas = v["predicted_speedup"], v["speedup_vs_eager"]
            lines.append(
                f"  {w['title']:<28} {v['name']:<11} predicted {pred:.2f}×, measured {meas:.2f}× → {verdict(result, w, v)}"
            )
    return lines


def gpu_lines(result: dict) -> list[str]:
    """CUDA: per variant, GPU kernel time per call, kernels per call, wall − GPU (overhead), the top kernels."""
    lines = []
    for w in result["workloads"]:
        for v in w["variants"]:
            gpu = v.get("gpu")
            if not gpu or v["median_s"] is None:
                continue
            if "gpu_s" not in gpu:
                lines.append(f"  {w['title']} / {v['label']}: profiler failed: {gpu.get('error')}")
                continue
            over = v["median_s"] - gpu["gpu_s"]
            top = ", ".join(f"{shorten(k['name'], 38)} {k['us_per_call']:.1f} µs" for k in gpu["top"][:3])
            lines.append(
                f"  {w['title'][:26]:<26} {v['name']:<11} GPU {fmt_time(gpu['gpu_s']):>9} in "
                f"{gpu['kernels_per_call']:.3g} kernels | wall − GPU = {fmt_time(max(over, 0.0)):>9} "
                f"({100 * max(over, 0.0) / v['median_s']:.0f}% overhead) | {top}"
            )
    return lines


def kernel_path_lines(result: dict) -> list[str]:
    """What the fused modules say they really run (phase 2's FusedLinearReLU differs between CPU and CUDA)."""
    try:
        from fusion.manual_fusion import KERNEL_PATHS  # phase 2's paths, where that phase is there
    except ImportError:
        KERNEL_PATHS = {}
    described = dict(KERNEL_PATHS)
    described.update(CONV_PATHS)
    lines = []
    for w in result["workloads"]:
        for v in w["variants"]:
            for path in v.get("kernel_paths") or ():
                lines.append(f"  {w['title']} / {v['label']} runs {path}: {described.get(path, '')}".rstrip(": "))
    return lines


def print_report(result: dict) -> None:
    meta = result["meta"]
    flops_per_s, bytes_per_s = result["peaks"]["flops_per_s"], result["peaks"]["bytes_per_s"]
    heading(f"Phase 4 — fusion benchmark on {meta['device_name']} ({meta['device']})")
    print(
        f"torch {meta['torch_version']}, {meta['dtype']}, {meta['threads']} threads, seed {meta['seed']}, "
        f"sizes '{meta['sizes']}', {meta['date']}, inference under torch.no_grad()"
    )
    print(
        f"measured peaks: {bytes_per_s / 1e9:.1f} GB/s (copy), {flops_per_s / 1e12:.3g} TFLOP/s "
        f"(matmul, {meta['dtype']}); ridge point {flops_per_s / bytes_per_s:.1f} FLOP/byte: below it a kernel is "
        "memory-bound"
    )
    heading("The workloads and their roofline", "-")
    print(workloads_table(result))
    heading("Results (variants of one workload interleaved in one process)", "-")
    print(results_table(result))
    skipped = skipped_lines(result) + kernel_path_lines(result)
    print("\n".join(skipped) + "\n" if skipped else "")
    print(NOTES)
    for e in result.get("errors") or ():
        print(f"  FAILED: {e['workload']}: {e['error']}")
    if any(v.get("gpu") for w in result["workloads"] for v in w["variants"]):
        heading("What the GPU did per call (torch.profiler): kernel time, kernels, wall − GPU = overhead", "-")
        print("\n".join(gpu_lines(result)))
        print(
            "  Kernels launch asynchronously: a call costs max(CPU time, GPU time). Where wall − GPU is large, the GPU\n"
            "  waited for Python/dispatch/launch: fusion there pays by launching fewer ops, not by moving fewer bytes."
        )
    heading("Where the roofline holds", "-")
    print("\n".join(closing_note(result)) or "  (no fused variant ran)")
    if result.get("targets"):
        heading("The issue's targets (H100, bf16): FX-fused ≥ N× eager and not slower than torch.compile", "-")
        for t in result["targets"]:
            extra = "" if t.get("predicted") is None else f" (roofline predicted {t['predicted']:.2f}×)"
            print(f"  {t['workload']:<22} ≥{t['need']}×: {t['status']}{extra}")


# ----------------------------------------------------------------------------------------------------------------------
# The roofline picture (optional: matplotlib)

PLOT_HINT = "--plot needs matplotlib. Fix: uv run --extra plot python -m fusion.benchmark --plot roofline.png"


def have_matplotlib() -> bool:
    return importlib.util.find_spec("matplotlib") is not None


def plot_roofline(result: dict, path: str) -> None:
    """Log-log roofline: the bandwidth slope and the compute ceiling, one point per (workload, variant)."""
    try:
        import matplotlib

        matplotlib.use("Agg")
        import matplotlib.pyplot as plt
    except ImportError as e:
        raise RuntimeError(PLOT_HINT) from e
    bw, peak = result["peaks"]["bytes_per_s"], result["peaks"]["flops_per_s"]
    xs = [w["intensity"] for w in result["workloads"]] + [peak / bw]
    lo, hi = min(xs) / 10, max(xs) * 10
    grid = np.logspace(math.log10(lo), math.log10(hi), 200)
    fig, ax = plt.subplots(figsize=(9, 5.5))
    ax.loglog(grid, np.minimum(peak, bw * grid), "k-", lw=2)
    ax.annotate(f"{bw / 1e9:.3g} GB/s", (grid[0], bw * grid[0]), textcoords="offset points", xytext=(4, 8), fontsize=8)
    ax.annotate(f"{peak / 1e12:.3g} TFLOP/s", (grid[-1], peak), textcoords="offset points", xytext=(-70, 6), fontsize=8)
    markers = {"eager": "o", "fx": "s", "fx_epilogue": "D", "compile": "^"}
    for i, w in enumerate(result["workloads"]):
        for v in w["variants"]:
            if v["median_s"] is not None:
                ax.loglog(w["intensity"], w["flops"] / v["median_s"], markers.get(v["name"], "x"), color=f"C{i}", ms=8)
    from matplotlib.lines import Line2D

    handles = [Line2D([], [], color="k", lw=2, label="roofline (measured peaks)")]
    handles += [
        Line2D([], [], color=f"C{i}", marker="o", ls="", label=w["title"]) for i, w in enumerate(result["workloads"])
    ]
    handles += [Line2D([], [], color="gray", marker=m, ls="", label=n) for n, m in markers.items()]
    meta = result["meta"]
    ax.set_xlabel("arithmetic intensity (FLOP / minimum byte)")
    ax.set_ylabel("achieved FLOP/s")
    ax.set_title(
        f"{meta['device_name']}, torch {meta['torch_version']}, {meta['dtype']}, {meta['date'][:10]}", fontsize=9
    )
    ax.grid(True, which="both", alpha=0.3)
    ax.legend(handles=handles, fontsize=8, loc="center left", bbox_to_anchor=(1.01, 0.5))
    fig.savefig(path, dpi=120, bbox_inches="tight")
    plt.close(fig)
