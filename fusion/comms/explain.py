"""A schedule of collectives, said in words: per collective, where it starts, where it is waited on, what runs between.

    uv run python -m fusion.overlap --explain dp --world 2     # the data-parallel step, 8 layers, measured costs
    uv run python -m fusion.overlap --explain dp --gloo        # and the step run for real: gloo, 2 CPU processes

Ours (the scheduler it is given: the Phase 10 lesson's from its command line) and Inductor's
``schedule_overlap_bucketing`` order the same captured step with the same estimates; both are scored on our
simulated timeline (:mod:`fusion.comms.units`). Issue 40 used it to compare the two data-parallel schedules.
"""

from __future__ import annotations

from fusion.comms.units import OverlapGraph, Timeline, Unit


def collective_rows(graph: OverlapGraph, order: list[Unit], timeline: Timeline | None = None) -> list[tuple]:
    """Per collective, in start order: name, MiB, the work just before its start, the work just after its wait,
    the work between start and wait (units, simulated µs), when it runs on the network (µs), µs exposed."""
    t = timeline or graph.timeline(order)
    where = {u.index: i for i, u in enumerate(order)}
    work = [i for i, u in enumerate(order) if u.kind in ("compute",) and u.cost.ms > 0]
    rows = []
    for c in sorted(t.collectives, key=lambda c: c.began_ms):
        s, w = where[c.start.index], where[c.wait.index]
        before = next((order[i].name for i in reversed(work) if i < s), "(nothing)")
        after = next((order[i].name for i in work if i > w), "(nothing: the step ends)")
        between = [order[i] for i in work if s < i < w]
        mib = c.start.nodes[0].args[0].meta["val"].nbytes / 2**20 if c.start.nodes[0].args else 0.0
        rows.append((c.start.name, f"{mib:g}", before[:28], after[:28],
                     f"{len(between)} ({sum(u.cost.ms for u in between) * 1e3:.0f} µs)",
                     f"{c.began_ms * 1e3:.0f}–{c.ended_ms * 1e3:.0f}", f"{c.exposed_ms * 1e3:.1f}"))  # fmt: skip
    return rows


HEADERS = ["collective", "MiB", "starts after", "waited, then", "work between (sim.)", "network µs", "exposed µs"]


def explain(kind: str, world: int, layers: int, schedule, build, budget, gloo_regions=None) -> str:
    """Both schedules of the step ``kind`` at ``world`` GPUs (dim 8192, 1024 tokens a rank, bf16: the README's
    step), with the newest measured cost model (stated defaults where none)."""
    import torch

    from fusion.common import table
    from fusion.comms import fit, inductor, scale
    from fusion.comms.bucket import plan_buckets
    from fusion.comms.capture import capture_step
    from fusion.comms.cost import CostModel

    measured = fit.newest_measurement()
    entry = (measured or {}).get("worlds", {}).get(str(world))
    cost = fit.model_from_fit(world, entry["fit"], fit.measured_compute(entry)) if entry else CostModel(world)
    step = dict(layers=layers, dim=8192, batch=1024, dtype=torch.bfloat16, world_size=world)
    out = [f"{kind}, {layers} layers, {world} GPUs; costs: {cost.source}" + (f" ({measured['file']})" if entry else "")]
    with scale.fake_world(world):
        graph, _ = build(capture_step(kind, **step), cost)
        order = schedule(graph, budget(graph))
        theirs = inductor.compare(capture_step(kind, **step), cost, graph)
    for name, o in (("unscheduled", graph.original), ("ours", order), ("Inductor's", theirs.order)):
        if o is None:
            out.append(f"Inductor's: skipped ({theirs.skipped})")
            continue
        t = graph.timeline(o)
        out.append(f"\n{name}: simulated step {t.step_ms * 1e3:.0f} µs, exposed {t.exposed_ms * 1e3:.0f} µs")
        out.append(table(collective_rows(graph, o, t), HEADERS))
        plan = plan_buckets(graph, o)
        out.append("buckets: " + (plan.summary() if plan.groups else "none (no all_reduces start back to back)"))
    if gloo_regions is not None:
        from fusion.comms import gloo

        cfg = gloo.GlooConfig(kinds=(kind,), world_size=2, layers=2, dim=64, batch=32, decompose=False)
        out.append(f"\ngloo, 2 CPU processes: {gloo.run_on_gloo(schedule, gloo_regions, cfg)}")
    return "\n".join(out)
