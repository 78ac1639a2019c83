"""What Phase 6's run() prints for one model: its regions, the kernel counts, the collapse check, Inductor's view."""

from __future__ import annotations

import textwrap
from collections.abc import Callable

import torch
import torch.fx as fx

from fusion.aten.bandwidth import BANDWIDTH_PROFILES_GBPS, bandwidth_gbps, measure_bandwidth_gbps
from fusion.aten.capture import aten_inputs, capture_aten
from fusion.aten.collapse import collapse_regions, expand_regions
from fusion.aten.inductor import KNOWN_DIFFERENCES
from fusion.aten.report import op_histogram, region_summary
from fusion.common import heading, max_abs_diff, table


def show_regions(
    title: str,
    model: torch.nn.Module,
    inputs: tuple,
    profile: str,
    build: Callable[[fx.GraphModule], dict],
    compare: Callable[[fx.GraphModule, dict], list[tuple] | None] | None = None,
) -> tuple[fx.GraphModule, dict]:
    """Capture ``model``, build its regions with ``build``, print them costed on ``profile``; check that the
    collapsed and re-expanded graphs compute what the model computes; with ``compare``, Inductor's regions beside.
    Returns the captured graph and its regions."""
    heading(title, "-")
    gm = capture_aten(model, inputs)
    region_of = build(gm)
    shapes = ", ".join(str(tuple(t.shape)) for t in inputs)
    print(f"input {shapes}; " + region_summary(gm, region_of, profile, bandwidth_gbps(profile)))
    collapsed = collapse_regions(gm, region_of)
    real = aten_inputs(model, inputs)
    with torch.no_grad():
        want = model(*inputs)
        diffs = [max_abs_diff(g(*real), want) for g in (gm, collapsed, expand_regions(collapsed))]
    print(
        f"collapse_regions: {len(collapsed.meta['fusion_region_modules'])} call_module nodes; max |Δ| vs eager: "
        "aten graph {:.1e}, collapsed {:.1e}, expanded again {:.1e}".format(*diffs)
    )
    rows = compare(gm, region_of) if compare else None
    if rows is not None:
        print("Our regions vs Inductor's build_fusion_regions on the same graph (region #, node count):")
        rows = [(*row[:3], textwrap.fill(row[3], 84)) for row in rows]  # output lines stay within 120 columns
        print(table(rows, ["verdict", "ours", "Inductor", "why"]))
    return gm, region_of


def histogram_table(plain: fx.GraphModule, decomposed: fx.GraphModule) -> str:
    """How many nodes of each aten op, without and with the decompositions."""
    hist_plain, hist_dec = op_histogram(plain), op_histogram(decomposed)
    ops = sorted(set(hist_plain) | set(hist_dec), key=lambda k: (-(hist_plain[k] + hist_dec[k]), k))
    return table([(op, hist_plain[op], hist_dec[op]) for op in ops], ["aten op", "decompose=False", "decompose=True"])


def show_known_differences(compared: bool) -> None:
    """After the comparisons: the differences from Inductor's rule that are kept on purpose (or how to see them)."""
    if not compared:
        print("\n(--quick skips the comparison with Inductor's regions; run without --quick to see it)")
        return
    print("\nKnown differences from Inductor's rule, kept on purpose:")
    for op, why in KNOWN_DIFFERENCES.items():
        print(textwrap.fill(f"{op}: {why}", 116, initial_indent="  ", subsequent_indent="    "))


def show_bandwidth(quick: bool) -> None:
    """The named bandwidth profiles beside a copy measured on this machine."""
    heading("Bandwidth profiles (GB/s) and this machine", "-")
    measured = measure_bandwidth_gbps(mbytes=16 if quick else 256)
    device = "cuda" if torch.cuda.is_available() else "cpu"
    rows = [(name, f"{gbps:.0f}") for name, gbps in BANDWIDTH_PROFILES_GBPS.items()]
    print(table([*rows, (f"measured here ({device} copy)", f"{measured:.0f}")], ["profile", "GB/s"]))
    print(
        "Predicted µs = bytes / bandwidth: a lower bound for memory-bound kernels (real ones reach ~80–90 %).\n"
        "The saving comes from intermediates that never touch DRAM: every op inside a region reads registers."
    )
