"""One variant's row of Phase 4's benchmark: the :class:`Variant` record (its fields are the JSON's, per variant)
and the numbers that fill it — median and IQR, speedup and % of the roofline limit (:func:`row_metrics`), the
output's difference from eager (measured and judged by :mod:`fusion.bench.accuracy`, the one rule), and Phase 8's
kernels, predicted beside measured (:func:`generated_kernels`). The run that measures them is ``fusion.bench.harness``.
"""

from __future__ import annotations

import statistics
from dataclasses import dataclass, field

import numpy as np

from fusion.bench.profile import Peaks


def summarize(times: list[float] | tuple[float, ...]) -> tuple[float, float]:
    """(median, IQR) of a list of times."""
    p25, p50, p75 = np.percentile(np.asarray(times, dtype=float), [25, 50, 75])
    return float(p50), float(p75 - p25)


def ratios_vs(r: dict, other: dict) -> tuple[float | None, float | None]:
    """(``other``'s median ÷ ``r``'s, the same paired by round: the median over the rounds of one round's ratio) for
    two backends' rows of one suite row (``median_s``, ``round_s``: one median block a round, the rounds in order);
    None where ``other`` has no time. A round's blocks run back to back, so a drift of the host over the run cancels
    in the paired ratio, where a ratio of two medians keeps it."""
    median = other["median_s"] / r["median_s"] if other.get("median_s") else None
    rounds = zip(other.get("round_s") or [], r.get("round_s") or [], strict=False)
    paired = statistics.median(o / m for o, m in rounds) if other.get("round_s") and r.get("round_s") else None
    return median, paired


@dataclass(frozen=True)
class RowMetrics:
    speedup_vs_eager: float  # eager median / this median
    pct_of_limit: float  # roofline bound / this median, in percent (100 = at the ceiling)
    gbps: float  # effective bandwidth: the workload's minimum bytes / this median, in GB/s
    tflops: float  # achieved: the workload's FLOPs / this median, in TFLOP/s
    predicted_speedup: float | None  # roofline bound of eager's kernels / that of this variant's kernels


def row_metrics(
    median_s: float,
    eager_median_s: float,
    workload: object,
    eager_kernels_s: float | None,
    variant_kernels_s: float | None,
) -> RowMetrics:
    """What one table row says about one variant: measured speedup, % of the roofline limit, and the prediction.

    ``workload`` is the roofline of the whole workload (its FLOPs and *minimum* bytes); the kernels bounds are
    :func:`~fusion.bench.counting.kernels_bound` of the eager graph and of this variant's graph (None: unknown).
    """
    predicted = eager_kernels_s / variant_kernels_s if eager_kernels_s and variant_kernels_s else None
    return RowMetrics(
        speedup_vs_eager=eager_median_s / median_s,
        pct_of_limit=100.0 * workload.bound_s / median_s,
        gbps=workload.nbytes / median_s / 1e9,
        tflops=workload.flops / median_s / 1e12,
        predicted_speedup=predicted,
    )


@dataclass
class Variant:
    name: str  # "eager" | "fx" | "fx_epilogue" | "codegen" | "fusion_backend" | "compile"
    label: str
    available: bool = True
    reason: str = ""
    timed: bool = True  # False: built and checked, not timed (the reason says why)
    times_s: list[float] = field(default_factory=list)
    median_s: float | None = None
    iqr_s: float | None = None
    speedup_vs_eager: float | None = None
    predicted_speedup: float | None = None
    pct_of_limit: float | None = None
    gbps: float | None = None
    tflops: float | None = None
    peak_memory_bytes: int | None = None
    intermediate_bytes: int | None = None
    bytes_removed: int | None = None
    kernels_bound_s: float | None = None
    kernels: int | None = None  # kernels of its graph (one per node, as eager runs them); None: not an FX graph
    max_rel_diff: float | None = None
    max_abs_diff: float | None = None
    outputs_match: bool | None = None
    first_call_s: float | None = None  # the first call: for compiled variants, the compilation
    compile_s: float | None = None  # the same, for the torch.compile row (schema 1's name)
    fusion_report: list[dict] | None = None
    kernel_paths: list[str] = field(default_factory=list)
    gpu: dict | None = None  # CUDA: gpu_profile() of one call (kernel time, kernels per call, top kernels)
    gpu_speedup: float | None = None  # eager's GPU kernel time / this one's: what the roofline's bytes predict
    overhead_s: float | None = None  # median wall time - GPU kernel time: the part of a call the GPU did not work
    gpu_vs_bound: float | None = None  # GPU kernel time / the workload's roofline bound (1.0: at the ceiling)
    generated: list[dict] | None = None  # Phase 8's kernels: name, region bytes, predicted and measured GPU time


def generated_kernels(mod: object, gpu: dict | None, peaks: Peaks) -> list[dict] | None:
    """Phase 8's kernels of ``mod`` (``mod.kernels``): Phase 6's prediction (region bytes ÷ measured copy
    bandwidth) beside the kernel's measured GPU time (profiler events matched by the kernel's name)."""
    kernels = getattr(mod, "kernels", None)
    if not kernels:
        return None
    by_name = (gpu or {}).get("by_name") or {}
    rows = []
    for k in kernels:
        name = str(getattr(k, "name", ""))
        region = getattr(k, "region", None)
        nbytes = getattr(region, "total_bytes", None)
        predicted = nbytes / peaks.bytes_per_s if nbytes else None
        us = by_name.get(name)
        if us is None:  # some Triton versions decorate the name: match on the function's name as a prefix
            us = sum(v for n, v in by_name.items() if name and n.startswith(name)) or None
        measured = us / 1e6 if us is not None else None
        ratio = measured / predicted if measured and predicted else None
        rows.append({"name": name, "bytes": nbytes, "predicted_s": predicted, "measured_s": measured, "ratio": ratio})
    return rows
