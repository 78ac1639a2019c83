"""Inductor's overlap scheduler on the same graph, with our cost model, for comparison.

``torch._inductor.fx_passes.overlap_scheduling.schedule_overlap_bucketing`` (torch >= 2.9 or so; its keyword
arguments change between releases) takes ``custom_runtime_estimation(node, override_size) -> ms | None``. We hand
it our :class:`~fusion.comms.cost.CostModel`, so both schedulers see the same numbers; then both orders are run
on our timeline. Where the signature lacks what we need, the comparison is skipped with the reason, never a crash.
"""

from __future__ import annotations

import inspect
import logging
from dataclasses import dataclass, field

import torch.fx as fx

from fusion.comms.capture import is_collective
from fusion.comms.cost import CostModel
from fusion.comms.units import OverlapGraph, Timeline, Unit

NEEDED = ("custom_runtime_estimation",)
WANTED = {  # keyword -> value, passed only where this torch's signature has it
    "compute_estimator": "analytical",  # no benchmarking: fake tensors, and every rank must agree
    "collective_estimator": "analytical",
    "collective_bucketing": False,  # compare orders, not bucketing
    "pre_bucketing_fsdp_collectives": False,
    "enable_fusion_regions": True,  # Inductor collapses its own regions, as we collapse Phase 6's
    "max_memory_increase_ratio": 0.10,  # the same memory slack as our default budget
    "max_memory_increase_gb": None,
}


@dataclass
class Comparison:
    skipped: str = ""  # why Inductor's scheduler did not run
    timeline: Timeline | None = None
    order: list[Unit] | None = None  # Inductor's order of our units (each region at its last node)
    collective_order: list[str] = field(default_factory=list)  # start names in Inductor's order
    split_regions: list[str] = field(default_factory=list)  # our regions Inductor interleaved with other nodes

    def text(self, ours: Timeline) -> str:
        if self.skipped:
            return f"Inductor's overlap scheduler: skipped ({self.skipped})"
        t = self.timeline
        lines = [f"Inductor's schedule_overlap_bucketing with our estimates: exposed {t.exposed_ms * 1e3:.1f} µs "
                 f"(ours {ours.exposed_ms * 1e3:.1f} µs), step {t.step_ms * 1e3:.1f} µs (ours {ours.step_ms * 1e3:.1f})"]  # fmt: skip
        for a, b in zip(ours.collectives, t.collectives, strict=True):
            if abs(a.exposed_ms - b.exposed_ms) > 1e-9:
                lines.append(f"  {a.start.name}: ours {a.exposed_ms * 1e3:.1f} µs exposed, Inductor's "
                             f"{b.exposed_ms * 1e3:.1f} µs")  # fmt: skip
        if self.split_regions:
            lines.append(f"  Inductor's order puts other nodes inside {len(self.split_regions)} of our regions "
                         "(its regions differ from Phase 6's; scored here with each region at its last node)")  # fmt: skip
        return "\n".join(lines)


def unavailable() -> str:
    """'' when Inductor's overlap scheduler can run here, else the reason it cannot."""
    try:
        from torch._inductor.fx_passes.overlap_scheduling import schedule_overlap_bucketing
    except Exception as e:  # older torch, or a build without Inductor
        return f"torch._inductor.fx_passes.overlap_scheduling is not importable here ({type(e).__name__}: {e})"
    params = inspect.signature(schedule_overlap_bucketing).parameters
    missing = [p for p in NEEDED if p not in params]
    if missing:
        return f"this torch's schedule_overlap_bucketing has no {missing} argument"
    return ""


def inductor_schedule(gm: fx.GraphModule, cost: CostModel) -> fx.GraphModule:
    """Run Inductor's scheduler on ``gm`` (it reorders in place) with our estimates; return the result."""
    from torch._inductor.fx_passes.overlap_scheduling import schedule_overlap_bucketing

    params = inspect.signature(schedule_overlap_bucketing).parameters

    def estimate(node: fx.Node, override_size: int | None = None) -> float | None:
        if is_collective(node):
            return cost.collective(node, override_size).ms
        return cost.node(node).ms

    kwargs = {k: v for k, v in WANTED.items() if k in params}
    quiet = logging.getLogger("torch._inductor.utils")  # "No accelerator available for … estimation", per node
    level = quiet.level
    quiet.setLevel(logging.ERROR)
    try:
        return schedule_overlap_bucketing(gm, custom_runtime_estimation=estimate, **kwargs)
    finally:
        quiet.setLevel(level)


def compare(gm: fx.GraphModule, cost: CostModel, graph: OverlapGraph) -> Comparison:
    """Schedule ``gm`` (a fresh capture of the graph ``graph`` was built on: node names match) with Inductor and
    score its order on ``graph``'s timeline. ``gm`` is reordered in place."""
    why = unavailable()
    if why:
        return Comparison(skipped=why)
    try:
        out = inductor_schedule(gm, cost)
    except Exception as e:  # a signature that accepts our arguments but a graph it cannot take
        return Comparison(skipped=f"Inductor's scheduler raised {type(e).__name__}: {str(e)[:200]}")
    position = {n.name: i for i, n in enumerate(out.graph.nodes)}
    missing = [n.name for u in graph.units for n in u.nodes if n.name not in position]
    if missing:
        return Comparison(skipped=f"Inductor's graph lacks our nodes {missing[:3]} (it rewrote them)")
    split = []
    for u in graph.units:
        where = sorted(position[n.name] for n in u.nodes)
        if u.region and where[-1] - where[0] + 1 != len(where):
            split.append(u.name)

    def key(u: Unit) -> tuple[int, int]:
        return max(position[n.name] for n in u.nodes), u.index

    order = sorted(graph.units, key=key)
    starts = [u.name for u in order if u.kind == "start"]
    return Comparison(timeline=graph.timeline(order), order=order, collective_order=starts, split_regions=split)
