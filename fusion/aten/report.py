"""Phase 6's printed tables: the regions of a graph with their bytes and predicted times, and op histograms."""

from __future__ import annotations

from collections import Counter

import torch.fx as fx

from fusion.aten.nodes import kernel_counts, short_target, unique_regions
from fusion.common import table


def fmt_bytes(n: int) -> str:
    """1234567 → '1.2 MB' (1 MB = 1e6 bytes)."""
    for unit, scale in (("MB", 1e6), ("kB", 1e3)):
        if n >= scale:
            return f"{n / scale:.1f} {unit}"
    return f"{n} B"


def region_table(region_of: dict, bandwidth: float) -> str:
    """One row per region: its ops, external inputs/outputs, fused vs unfused bytes and predicted µs."""
    rows = []
    for i, r in enumerate(unique_regions(region_of)):
        saved = 1 - r.total_bytes / r.unfused_bytes if r.unfused_bytes else 0.0
        rows.append(
            (
                f"#{i}",
                r.summary(26),
                len(r.external_inputs),
                len(r.external_outputs),
                fmt_bytes(r.total_bytes),
                fmt_bytes(r.unfused_bytes),
                f"{saved:.0%}",
                f"{r.cost_ms(bandwidth) * 1e3:.3g}",
                f"{r.unfused_cost_ms(bandwidth) * 1e3:.3g}",
            )
        )
    return table(rows, ["region", "ops", "in", "out", "bytes fused", "unfused", "saved", "µs fused", "unfused"])


def op_histogram(gm: fx.GraphModule) -> Counter[str]:
    """How many call_function nodes of each op."""
    return Counter(short_target(n) for n in gm.graph.nodes if n.op == "call_function")


def region_summary(gm: fx.GraphModule, region_of: dict, profile: str, bandwidth: float) -> str:
    """The region table, then the kernel counts and the predicted memory traffic of the regions, fused vs unfused."""
    before, after = kernel_counts(gm, region_of)
    regions = unique_regions(region_of)
    fused = sum(r.total_bytes for r in regions)
    unfused = sum(r.unfused_bytes for r in regions)
    return (
        f"aten graph: {sum(n.op == 'call_function' for n in gm.graph.nodes)} ops\n"
        f"{region_table(region_of, bandwidth)}\n"
        f"kernels: {before} unfused (one per non-view op) → {after} fused "
        f"({len(regions)} regions + {after - len(regions)} ops outside any region)\n"
        f"memory traffic in the regions: {fmt_bytes(unfused)} → {fmt_bytes(fused)}; predicted on {profile} "
        f"({bandwidth:.0f} GB/s): {unfused / bandwidth / 1e3:.3g} µs → {fused / bandwidth / 1e3:.3g} µs"
    )
