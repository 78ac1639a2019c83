"""The roofline picture of Phase 4's benchmark (optional: needs matplotlib, ``uv run --extra plot``)."""

from __future__ import annotations

import importlib.util
import math

import numpy as np

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
    markers = {"eager": "o", "fx": "s", "fx_epilogue": "D", "codegen": "P", "fusion_backend": "*", "compile": "^"}
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
