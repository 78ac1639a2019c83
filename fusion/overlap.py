"""Phase 10 — regions meet communication: schedule collectives so that compute hides them.

Run it:   uv run python -m fusion.overlap          (``--quick`` for the small version CI runs)
Test it:  uv run pytest -m phase10
GPU:      uv run python scripts/gpu_overlap.py     (NCCL on >= 2 GPUs; ``--dry-run`` runs its steps on CPU/gloo)
Picture:  uv run --extra plot python -m fusion.overlap --plot schedule.png [--trace T.json.gz ...]
          (the simulated schedules, before and after; each ``--trace`` a kept GPU profiler trace beside them)

What you learn
--------------
* Data-parallel training all-reduces every gradient; FSDP all-gathers each layer's weights before use and
  reduce-scatters their gradients; tensor parallelism all-reduces partial sums. ``torch.distributed``'s functional
  collectives trace into an aten graph as two nodes each: the collective (it *starts* the transfer) and its
  ``wait_tensor`` (compute blocks there until the result has arrived). The fake process group traces a world of
  2 ranks in one process (machinery: ``fusion/comms/capture.py``).
* Between start and wait, the network works while the GPU computes. Whatever compute runs there *hides* the
  collective; what is left over is *exposed*: ``exposed = max(0, end of the collective − time the wait is reached)``.
* An overlap scheduler moves starts early (``raise_comms`` in Inductor's ``comms.py``) and waits late
  (``sink_waits``), then orders the rest so that independent compute sits between them. Two rules bind it: a fusion
  region of Phase 6 is one kernel and moves as one unit (a wait inside it would cut it in two), and every early start
  keeps its buffer alive longer (an all_gather's or reduce_scatter's input, which NCCL reads until the end; not
  an all_reduce's, which funcol copies into its output as it starts), so memory is simulated and kept within a budget.
* Every rank must choose the same order (the collectives must match across ranks), so the scheduler is deterministic
  and its costs are estimates every rank shares: roofline compute, region bytes / bandwidth, and NCCL's
  ``latency + bytes · factor / bus bandwidth``, one line per size band where NCCL switches protocol
  (machinery: ``fusion/comms/cost.py``, ``fit.py``).
* What the schedule cannot see, the profile shows: funcol's ``all_reduce`` first *copies* its input (a full read and
  write of every gradient on the compute stream). Where nothing else reads the input, the backend's pass reduces it
  in place (``all_reduce_``): the same numbers, no copy (``fusion/comms/passes.py``).
* Two GPUs are not a cluster. The model's latency and bandwidth are fitted to collectives measured on one host
  (``fusion/comms/fit.py``); a stated algorithm (ring, or NCCL's tree for all_reduce) says how they grow with the
  GPU count, and the same scheduler runs on the step at 8 to 1,024 GPUs: *simulated*, not measured
  (``fusion/comms/scale.py``).

The idea in one picture (data parallel, 2 layers, backward then gradient all-reduces)::

    unscheduled  compute: [bwd 2][bwd 1]    .     .  [update]      each all_reduce starts after all of backward
                 network:                [ar 2][ar 1]              and its wait follows at once: all exposed
    scheduled    compute: [dW2][bwd 1 ........][update]            ar 2 starts as soon as dW2 exists; bwd 1
                 network:      [ar 2]    [ar 1]                    hides it; only ar 1 is left exposed
"""

from __future__ import annotations

from pathlib import Path

import torch
import torch.fx as fx

from fusion.common import heading, run_lesson, table
from fusion.comms import bucket, fit, gloo, inductor, passes, scale
from fusion.comms.capture import capture_step
from fusion.comms.cost import CostModel
from fusion.comms.units import OverlapGraph, ScheduleError, Timeline, Unit, apply_order, check_regions, check_schedule
from fusion.compiler import registry
from fusion.regions import build_fusion_regions

__all__ = [  # the lesson's API, and what it re-exports from its machinery in fusion/comms/
    "CostModel", "OverlapGraph", "ScheduleError", "Unit", "apply_order", "capture_step", "check_regions",
    "check_schedule", "build_graph", "pick_next", "schedule_overlap", "overlap_pass", "memory_budget",
]  # fmt: skip


def build_graph(gm: fx.GraphModule, cost: CostModel | None = None) -> tuple[OverlapGraph, dict]:
    """The scheduler's view of ``gm``: Phase 6's regions collapsed into units, every unit costed."""
    region_of = build_fusion_regions(gm)
    return OverlapGraph(gm, cost or CostModel(), region_of), region_of


def memory_budget(graph: OverlapGraph, slack: float = 0.10) -> int:
    """The unscheduled order's peak memory plus ``slack`` (10 %): what early starts may add."""
    return int(graph.peak_memory(graph.original) * (1 + slack))


# ----------------------------------------------------------------------------------------------------------------------
# The scheduler


def schedule_overlap(graph: OverlapGraph, budget: int | None = None) -> list[Unit]:
    """A list scheduler: repeatedly run the unit :func:`pick_next` chooses among those whose inputs have all run.

    Returns every unit of ``graph`` once, in a topological order whose simulated peak memory is at most ``budget``
    (default :func:`memory_budget`). Deterministic: the same graph gives the same order on every rank.
    """
    budget = memory_budget(graph) if budget is None else budget
    floor = graph.peak_memory(graph.original)
    if budget < floor:
        raise ValueError(
            f"a memory budget of {budget} B is below the unscheduled order's own peak of {floor} B: no order is "
            "guaranteed to fit. Fix: pass budget >= that peak, e.g. memory_budget(graph)"
        )
    # TODO(human): the list scheduler: keep the ready units (all inputs scheduled), let pick_next choose one, append it, run it on the memory state, and make its successors ready when their last input has run. Hint: unit.preds and unit.succs are unit indices, graph.units[i] is a unit, graph.memory_state() starts the simulation. More: this is Kahn's topological sort with pick_next choosing among the ready units: a count of the unscheduled inputs of each unit says when it becomes ready; the memory state's run(unit) advances the simulation, and done holds the indices scheduled so far (pick_next reads both)
    # BEGIN SOLUTION
    left = {u.index: len(u.preds) for u in graph.units}  # inputs not yet scheduled
    ready = [u for u in graph.units if not u.preds]
    state, done, order = graph.memory_state(), set(), []
    while ready:
        unit = pick_next(graph, ready, state, done, budget)
        ready.remove(unit)
        order.append(unit)
        state.run(unit)
        done.add(unit.index)
        for i in unit.succs:
            left[i] -= 1
            if left[i] == 0:
                ready.append(graph.units[i])
    return order
    # END SOLUTION


def pick_next(graph: OverlapGraph, ready: list[Unit], state, done: set[int], budget: int) -> Unit:
    """Which ready unit runs next. ``state`` is the memory so far, ``done`` the indices scheduled.

    In order of preference, taking only a unit after which the rest still fits the budget
    (``graph.projected_peak(state, unit, done) <= budget``), ties broken by original position (``unit.index``):

    1. a collective start (``kind == "start"``): start communication as early as its inputs allow;
    2. work that a collective still to start depends on (``unit.index in graph.feeds_collective``, not a wait):
       it brings the next start closer;
    3. any other work that is not a wait (``"compute"``, ``"input"``): it needs no result still in flight;
    4. a wait: only when nothing else can run, so it is reached as late as its users allow.

    If no unit fits, the ready unit earliest in the original order: it always fits (see the tests), because the
    rest in the original order is what the budget was measured on.
    """
    # TODO(human): choose the next unit: a fitting collective start first, then fitting non-wait work that feeds a collective, then any fitting non-wait work, then a fitting wait, each time the earliest in original order; else the earliest ready unit. Hint: sort ready by unit.index once; graph.projected_peak(state, unit, done) <= budget says a unit fits. More: one preference at a time over the ready units in original order, each returning the first unit that fits, reads more simply than one combined sort key; unit.kind tells start, wait, compute and input apart
    # BEGIN SOLUTION
    ready = sorted(ready, key=lambda u: u.index)

    def fits(unit: Unit) -> bool:
        return graph.projected_peak(state, unit, done) <= budget

    feeds = graph.feeds_collective
    preferences = (
        lambda u: u.kind == "start",
        lambda u: u.kind != "wait" and u.index in feeds,
        lambda u: u.kind != "wait",
        lambda u: u.kind == "wait",
    )
    for wanted in preferences:
        for unit in ready:
            if wanted(unit) and fits(unit):
                return unit
    return ready[0]
    # END SOLUTION


def overlap_pass(gm: fx.GraphModule, note) -> None:
    """The backend option ``options={"overlap": True}``: reorder ``gm.graph`` in place with this lesson's scheduler.
    ``note(pass_name, node_names, verdict, why)`` receives one line per collective (``fusion/comms/passes.py``)."""
    passes.overlap_pass(gm, note, schedule=schedule_overlap, regions=build_fusion_regions)


# ----------------------------------------------------------------------------------------------------------------------
# The lesson


def show_timeline(title: str, graph: OverlapGraph, order: list[Unit]) -> Timeline:
    t = graph.timeline(order)
    peak = graph.peak_memory(order)
    print(f"{title}: step {t.step_ms * 1e3:.1f} µs, exposed communication {t.exposed_ms * 1e3:.1f} µs, "
          f"peak memory {peak / 2**20:.2f} MiB")  # fmt: skip
    return t


def hiding_table(before: Timeline, after: Timeline) -> str:
    rows = []
    for b, a in zip(before.collectives, after.collectives, strict=True):
        hidden = sorted((h for h in a.hidden_by if h[1] >= 5e-5), key=lambda h: -h[1])  # >= 0.05 µs
        who = ", ".join(f"{name} {ms * 1e3:.1f}" for name, ms in hidden[:3]) + (" …" if len(hidden) > 3 else "")
        rows.append((a.start.name, f"{a.start.cost.ms * 1e3:.1f}", f"{b.exposed_ms * 1e3:.1f}",
                     f"{a.exposed_ms * 1e3:.1f}", who or "-"))  # fmt: skip
    return table(rows, ["collective", "cost µs", "exposed before", "exposed after", "hidden by (µs of overlap)"])


def run(quick: bool = False) -> None:
    heading("Phase 10 — overlap scheduling of collectives")
    layers, dim, batch = (2, 512, 4096) if quick else (4, 1024, 8192)  # fake tensors: sizes cost nothing here
    cost = CostModel()
    print("The cost model (stated defaults; scripts/gpu_overlap.py measures them on GPUs):")
    print(table(cost.rows(), ["figure", "value"]))

    for kind, what in (("dp", "data parallel: all_reduce of every gradient"),
                       ("fsdp", "FSDP-style: all_gather weights, reduce_scatter gradients"),
                       ("tp", "tensor-parallel MLP: all_reduce of partial sums")):  # fmt: skip
        heading(f"{what}  ({layers} layers, dim {dim}, batch {batch}, world 2)", "-")
        gm = capture_step(kind, layers=layers, dim=dim, batch=batch)
        graph, region_of = build_graph(gm, cost)
        kinds = [u.kind for u in graph.units]
        print(f"{len(gm.graph.nodes)} nodes -> {len(graph.units)} units ({sum(u.region for u in graph.units)} "
              f"regions, {kinds.count('start')} collectives)")  # fmt: skip
        shown = [u for u in graph.units if u.kind == "start"][:1] + [u for u in graph.units if u.region][:1]
        shown += [u for u in graph.units if u.kind == "compute" and not u.region and u.cost.ms > 0][:1]
        print(table([(u.name, f"{u.cost.ms * 1e3:.2f}", u.cost.formula) for u in shown], ["unit", "µs", "formula"]))
        budget = memory_budget(graph)
        order = schedule_overlap(graph, budget)
        check_schedule(graph, order, budget)
        before = show_timeline("unscheduled", graph, graph.original)
        after = show_timeline("scheduled  ", graph, order)
        print(hiding_table(before, after))
        tight = schedule_overlap(graph, graph.peak_memory(graph.original))  # no memory to spare at all
        t = graph.timeline(tight)
        same = " (the same order: early starts add nothing at the peak)" if tight == order else ""
        print(f"with a budget of exactly the unscheduled peak: exposed {t.exposed_ms * 1e3:.1f} µs, "
              f"peak {graph.peak_memory(tight) / 2**20:.2f} MiB{same}")  # fmt: skip
        plan = bucket.plan_buckets(graph, order)
        print(f"bucketing: {plan.summary() if plan.groups else 'no all_reduces start back to back: nothing to merge'}")
        scheduled = bucket.apply_buckets(apply_order(gm, graph, order), plan)
        check_regions(scheduled, region_of)
        if kind == "tp":
            print("Tensor parallelism: each block needs the all-reduced sum before the next can start; one micro-batch\n"
                  "has no independent compute to hide it. (Megatron splits the batch into micro-batches to make some.)")  # fmt: skip
        if not quick:  # importing Inductor's scheduler takes seconds: --quick leaves it out
            print(inductor.compare(capture_step(kind, layers=layers, dim=dim, batch=batch), cost, graph).text(after))
    if not quick:
        print(
            "\nWhy the two orders differ when both see the same costs: Inductor ranks ready nodes by the compute node\n"
            "they precede (domination index) and prefetches a collective only within its limits (max_compute_pre_fetch,\n"
            "max_in_flight_gb, a memory increase cap); ours starts every collective as soon as the budget allows and\n"
            "runs work that feeds a collective first. Inductor also builds its own regions, not Phase 6's."
        )

    measured = gloo.measured_rows()
    if measured:  # what scripts/gpu_overlap.py measured (NCCL): the README says where and when
        heading("Measured with NCCL, compiled steps (the newest run in scripts/results; the README says where)", "-")
        print(table(measured, ["step", "variant", "step ms", "NCCL ms", "exposed ms"]))

    measured_fit = cost_model_per_size()
    beyond_the_host(measured_fit, quick)

    heading("Run it for real: gloo, 2 processes, CPU", "-")
    if quick:
        print("left out in --quick (two processes take ~20 s): uv run python -m fusion.overlap, or pytest -m phase10")
        return
    result = gloo.run_on_gloo(schedule_overlap, build_fusion_regions)
    print(str(result).replace("; ", "\n"))


def cost_model_per_size() -> dict | None:
    """The newest measured collectives (scripts/results), refitted: latency and bus bandwidth per collective, and
    how far the fit and the stated defaults are from each measured size."""
    measurement = fit.newest_measurement()
    heading("The cost model against measured collectives, 1 MiB to 1 GiB", "-")
    if measurement is None:
        print("nothing measured yet (scripts/gpu_overlap.py writes *-overlap-collectives.json): stated defaults only")
        return None
    timing = measurement.get("timing", "back to back, CUDA events (nccl-tests' convention)")
    print(f"{measurement['device']}, torch {measurement['torch']}, {measurement['date']} ({measurement['file']};\n"
          f"{timing}; the least over ranks). NCCL switches protocol with the size, so the fit cuts the sizes into\n"
          f"at most {fit.MAX_BANDS} bands, each its own time = latency + bytes · factor / bus bandwidth (least squares "
          "of relative error);\none line through every size, the model before bands, beside it:")  # fmt: skip
    print(table(*fit.fit_table(measurement)))
    print("Every size: measured / predicted µs, error = predicted / measured − 1:")
    print(table(*fit.size_table(measurement)))
    return measurement


def beyond_the_host(measurement: dict | None, quick: bool) -> None:
    """The exposed communication of both steps at 8 to 1,024 GPUs: SIMULATED with the fitted figures."""
    heading("Beyond the host, on paper: 8 to 1,024 GPUs (SIMULATED, not measured)", "-")
    if measurement:
        world = max(measurement["worlds"], key=int)
        fitted, source = measurement["worlds"][world]["fit"], f"fitted on {world} x {measurement['device']}"
        base = fit.measured_compute(measurement["worlds"][world])
    else:
        world, fitted, source, base = "2", {}, "stated defaults (nothing measured yet)", CostModel()
    sizes, layers = ((8, 1024), 2) if quick else (scale.SIZES, 8)
    step = dict(layers=layers, dim=8192, batch=1024, dtype=torch.bfloat16)
    rows = scale.simulate(("dp", "fsdp"), sizes, fitted, int(world), base, step, schedule_overlap,
                          build_graph, memory_budget)  # fmt: skip
    print(f"Collectives: {source}; growth with GPU count: ring / tree after NCCL's tuning model, "
          f"{scale.GPUS_PER_NODE} GPUs a node, {scale.NET_GBPS:g} GB/s network per GPU; compute as on one GPU "
          f"({base.matmul_tflops:.0f} TFLOP/s, {base.bandwidth_gbps:.0f} GB/s) "
          f"(weak scaling: {step['batch']} tokens a rank; {layers} layers of {step['dim']}², bf16). See fusion/comms/scale.py.")  # fmt: skip
    print(table([(r["gpus"], r["step"], r["algorithm"], f"{r['comm_ms']:.2f}", f"{r['exposed_before_ms']:.2f}",
                  f"{r['exposed_after_ms']:.2f}", f"{r['step_after_ms']:.2f}") for r in rows],
                ["GPUs", "step", "all_reduce", "comm ms", "exposed, unscheduled", "exposed, ours", "step ms, ours"]))  # fmt: skip
    print("A ring's latency grows with every GPU it passes (2(n−1) hops for an all-reduce); a tree's with log2 of "
          "the nodes. Across nodes the network, not NVLink, sets the bandwidth: communication outgrows the compute "
          "that could hide it. All of this table is simulation.")  # fmt: skip


def plot_schedule(path: str, traces: list[str], quick: bool = False) -> str:
    """The picture: simulated before/after lanes of both steps, and each kept trace's GPU kernels."""
    layers = 2 if quick else 4
    from fusion.comms.plot import draw_lanes, lanes_of_timeline
    from fusion.comms.profile import lanes_of_trace

    panels = []
    for kind in ("dp", "fsdp"):
        gm = capture_step(kind, layers=layers, dim=8192, batch=1024, dtype=torch.bfloat16)
        graph, _ = build_graph(gm, CostModel())
        order = schedule_overlap(graph, memory_budget(graph))
        for label, o in (("unscheduled", graph.original), ("after the pass", order)):
            panels.append((f"{kind}, {label} (simulated, {layers} layers)", lanes_of_timeline(graph.timeline(o))))
    for trace in traces:
        panels.append((f"trace {Path(trace).name}", lanes_of_trace(trace)))
    return str(draw_lanes(panels, path))


def main(argv: list[str] | None = None) -> int:
    import argparse

    p = argparse.ArgumentParser(prog="python -m fusion.overlap", description=__doc__.splitlines()[0])
    p.add_argument("--quick", action="store_true", help="smaller sizes and fewer examples (what CI runs)")
    p.add_argument("--plot", metavar="PNG", help="draw the schedules as timelines (needs the 'plot' extra)")
    p.add_argument("--trace", metavar="TRACE", action="append", default=[],
                   help="with --plot: a kept torch.profiler trace (.json or .json.gz) drawn beside them")  # fmt: skip
    p.add_argument("--explain", choices=("dp", "fsdp"), help="ours and Inductor's schedule of a step, collective by "
                   "collective (8 layers of 8192², the measured cost model: fusion/comms/explain.py)")  # fmt: skip
    p.add_argument("--world", type=int, default=2, help="with --explain: GPUs")
    p.add_argument("--gloo", action="store_true", help="with --explain: also run the step for real, gloo, 2 processes")
    args = p.parse_args(argv)
    if args.explain:
        from fusion.comms.explain import explain

        regions = build_fusion_regions if args.gloo else None
        text = lambda: explain(args.explain, args.world, 8, schedule_overlap, build_graph, memory_budget, regions)  # noqa: E731
        return run_lesson(lambda: print(text()))
    if args.plot:
        from fusion.comms.plot import PLOT_HINT, have_matplotlib

        if not have_matplotlib():
            print(PLOT_HINT)
            return 2
        # an unsolved TODO(human) in the scheduler: its message, as the lesson gives it
        return run_lesson(lambda: print(f"wrote {plot_schedule(args.plot, args.trace, args.quick)}"))
    return run_lesson(lambda: run(quick=args.quick))


registry.register(10, overlap_pass=overlap_pass)  # the backend's pass overlap (fusion/compiler/driver.py)
if __name__ == "__main__":
    raise SystemExit(main())
