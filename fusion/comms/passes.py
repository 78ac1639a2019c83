"""``overlap_pass``: the backend option ``torch.compile(step, backend="fusion", options={"overlap": True})``.

The backend hands the pass its aten graph and a ``note(pass_name, node_names, verdict, why)`` callback for its
report. The pass builds the units (regions from the ``regions`` builder it is given), schedules them with the
``schedule`` it is given (the Phase 10 lesson passes its own), checks the order, and rewrites ``gm.graph`` in
place. A graph without collectives, or one the pass cannot take, is left as it is with a note saying why: never a
crash, never a wrong answer (the order is checked before anything moves).
"""

from __future__ import annotations

from collections.abc import Callable

import torch.fx as fx

from fusion.comms.bucket import apply_buckets, plan_buckets
from fusion.comms.capture import is_collective
from fusion.comms.cost import CostModel
from fusion.comms.units import OverlapGraph, ScheduleError, apply_order, check_regions, check_schedule

PASS = "overlap"
measured: CostModel | None = None  # set_cost_model(): a host's measured figures, for every rank's pass alike


def set_cost_model(model: CostModel | None) -> None:
    """The cost model the backend's pass uses from now on in this process (None: the stated defaults). Every rank
    must set the same one (e.g. rank 0's fit, broadcast), or ranks may choose different orders."""
    global measured
    measured = model


def overlap_pass(gm: fx.GraphModule, note: Callable[[str, list[str], str, str], None], *,
                 schedule: Callable, regions: Callable[[fx.GraphModule], dict] | None = None,
                 cost: CostModel | None = None, slack: float = 0.10) -> None:  # fmt: skip
    """Reorder ``gm.graph`` in place so that compute hides communication; one ``note`` per collective."""
    starts = [n for n in gm.graph.nodes if is_collective(n)]
    if not starts:
        note(PASS, [], "skipped", "no collectives in this graph: nothing to overlap")
        return
    try:
        import torch.distributed as dist

        world = dist.get_world_size() if dist.is_available() and dist.is_initialized() else 2
        region_of = regions(gm) if regions is not None else {}
        if cost is None:
            cost = measured if measured is not None and measured.world_size == world else CostModel(world_size=world)
        graph = OverlapGraph(gm, cost, region_of)
        budget = int(graph.peak_memory(graph.original) * (1 + slack))
        order = schedule(graph, budget)
        check_schedule(graph, order, budget)
    except (ScheduleError, ValueError, KeyError, TypeError) as e:  # leave the graph as it is, say why
        note(PASS, [n.name for n in starts], "skipped", f"graph left unscheduled: {type(e).__name__}: {e}")
        return
    before, after = graph.timeline(graph.original), graph.timeline(order)
    apply_order(gm, graph, order)
    check_regions(gm, region_of)
    plan = plan_buckets(graph, order)
    apply_buckets(gm, plan)
    for group in plan.groups:
        note(PASS, [u.name for u in group], "bucketed", "started back to back: one latency instead of "
             f"{len(group)}, exposed time not increased")  # fmt: skip
    for b, a in zip(before.collectives, after.collectives, strict=True):
        hiders = ", ".join(name for name, _ in sorted(a.hidden_by, key=lambda h: -h[1])[:3]) or "nothing"
        why = (f"exposed {b.exposed_ms * 1e3:.1f} -> {a.exposed_ms * 1e3:.1f} µs (cost {a.start.cost.ms * 1e3:.1f} µs);"
               f" hidden by {hiders}")  # fmt: skip
        note(PASS, [a.start.nodes[0].name, a.wait.nodes[0].name], "hidden" if a.exposed_ms == 0 else "partly", why)
