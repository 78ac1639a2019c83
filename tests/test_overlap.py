"""Phase 10: overlap scheduling of collectives (fusion.overlap and its machinery in fusion/comms/).

The rules every schedule keeps (a topological order: every wait after its collective and before its users, no
collective before its input; regions whole; peak memory within the budget; deterministic), the exposed-time
formula on hand-computed cases, the scheduler's choices (start early, wait late, the budget binds), Inductor's
scheduler on the same graph, the backend pass, and gloo: scheduled == unscheduled bit for bit in 2 processes.
"""

import pytest
import torch
import torch.distributed._functional_collectives as funcol
from hypothesis import given
from hypothesis import strategies as st
from support import with_and_without_overlap

from fusion import overlap
from fusion.comms import bucket, gloo, inductor, passes
from fusion.comms.capture import capture_fn, capture_step, ensure_fake_group, is_collective, is_wait, short
from fusion.comms.cost import Cost, CostModel
from fusion.comms.units import OverlapGraph, ScheduleError, apply_order, check_regions, check_schedule
from fusion.regions import build_fusion_regions

pytestmark = pytest.mark.phase10

SMALL = dict(layers=2, dim=32, batch=16)
GATHER = getattr(funcol, "all_gather_single", None) or funcol.all_gather_tensor  # renamed in torch 2.12+
SCATTER = getattr(funcol, "reduce_scatter_single", None) or funcol.reduce_scatter_tensor


@pytest.fixture(scope="module", autouse=True)
def fake_group():
    ensure_fake_group(2)


@pytest.fixture(scope="module")
def steps(fake_group):
    return {kind: capture_step(kind, **SMALL) for kind in ("dp", "fsdp", "tp")}


def group():
    return torch.distributed.group.WORLD


def graph_of(gm, cost=None, regions=True):
    """The overlap graph of ``gm``: Phase 6's regions as units, or (regions=False) every node its own unit, so that
    a test of the scheduler alone needs no other phase."""
    region_of = build_fusion_regions(gm) if regions else {}
    return OverlapGraph(gm, cost or CostModel(), region_of), region_of


def set_costs(graph, **ms):
    """Hand-set unit costs by unit name (e.g. mm=2.0); every other unit costs 0."""
    for u in graph.units:
        u.cost = Cost(ms.get(u.name, 0.0), "hand")


def by_name(order):
    return [u.name for u in order]


# ----------------------------------------------------------------------------------------------------------------------
# Capture and cost model


@pytest.mark.parametrize(
    "kind, ops",
    [("dp", {"all_reduce"}), ("fsdp", {"all_gather_into_tensor", "reduce_scatter_tensor"}), ("tp", {"all_reduce"})],
)
def test_capture_shows_collectives_and_their_waits(steps, kind, ops):
    gm = steps[kind]
    starts = [n for n in gm.graph.nodes if is_collective(n)]
    waits = [n for n in gm.graph.nodes if is_wait(n)]
    assert {short(n) for n in starts} == ops
    assert len(starts) == len(waits) >= 2
    assert all(w.args[0] in starts for w in waits)
    assert all(isinstance(n.meta.get("val"), torch.Tensor) for n in starts)  # fake tensors: shapes, no storage


def test_collective_formula_is_latency_plus_ring_bytes_over_bus_bandwidth(steps):
    for n in (2, 4, 8):
        cost = CostModel(world_size=n, bus_gbps=100.0, latency_us=5.0)
        for node in (x for x in steps["fsdp"].graph.nodes if is_collective(x)):
            full = node if short(node) == "all_gather_into_tensor" else node.args[0]
            size = full.meta["val"].numel() * 4
            want = 5e-3 + size * (n - 1) / n / 100e9 * 1e3
            assert cost.collective(node).ms == pytest.approx(want)
            assert f"({n}−1)/{n}" in cost.collective(node).formula and str(size) in cost.collective(node).formula
        ar = next(x for x in steps["dp"].graph.nodes if is_collective(x))
        size = ar.args[0].meta["val"].numel() * 4
        assert cost.collective(ar).ms == pytest.approx(5e-3 + size * 2 * (n - 1) / n / 100e9 * 1e3)


def test_matmul_cost_is_the_roofline(steps):
    cost = CostModel(matmul_tflops=1.0, bandwidth_gbps=1e6)  # compute-bound: FLOPs / peak
    mm = next(n for n in steps["dp"].graph.nodes if n.op == "call_function" and short(n) == "mm")
    (m, k), (_, n) = mm.args[0].meta["val"].shape, mm.args[1].meta["val"].shape
    assert cost.node(mm).ms == pytest.approx(2 * m * n * k / 1e12 * 1e3)
    slow_memory = CostModel(matmul_tflops=1e9, bandwidth_gbps=1.0)  # memory-bound: bytes / bandwidth
    assert cost.node(mm).ms < slow_memory.node(mm).ms and "memory-bound" in slow_memory.node(mm).formula


# ----------------------------------------------------------------------------------------------------------------------
# The timeline: exposed communication on hand-computed cases


def one_collective(x, w1, w2):
    a = x @ w1
    r = funcol.all_reduce(a, "sum", group())  # traced: all_reduce, then wait_tensor at once
    b = x @ w2  # independent of the collective
    return r + b


@pytest.fixture(scope="module")
def tiny(fake_group):
    gm = capture_fn(one_collective, [torch.randn(8, 8) for _ in range(3)], decompose=False)
    return gm


def test_exposed_time_by_hand(tiny):
    graph, _ = graph_of(tiny)
    assert by_name(u for u in graph.units if u.kind != "input") == ["mm", "all_reduce", "wait_tensor", "mm_1", "add"]
    set_costs(graph, mm=2.0, all_reduce=5.0, mm_1=4.0, add=1.0)
    t = graph.timeline(graph.original)  # mm 0-2 | ar 2-7, waited at 2: 5 exposed | mm_1 7-11 | add 11-12
    assert (t.step_ms, t.exposed_ms) == (12.0, 5.0)
    order = overlap.schedule_overlap(graph, budget=10**9)
    assert by_name(u for u in order if u.kind != "input") == ["mm", "all_reduce", "mm_1", "wait_tensor", "add"]
    t = graph.timeline(order)  # mm 0-2 | ar 2-7 while mm_1 2-6 | wait at 6: 1 exposed | add 7-8
    assert (t.step_ms, t.exposed_ms) == (8.0, 1.0)
    assert t.collectives[0].hidden_by == [("mm_1", 4.0)]
    set_costs(graph, mm=2.0, all_reduce=5.0, mm_1=6.0, add=1.0)
    t = graph.timeline(order)  # mm_1 2-8 covers the whole collective
    assert t.exposed_ms == 0.0 and t.step_ms == 9.0


def feeder_later(x, w1, w2):
    a = x @ w1  # first in the original order, feeds no collective
    r = funcol.all_reduce(x @ w2, "sum", group())  # mm_1 feeds the collective
    return a + r


def test_work_that_feeds_a_collective_runs_before_other_work(fake_group):
    """Preference 2: ready work that a collective still to start depends on (mm_1) runs before earlier work that
    feeds none (mm), so that the collective starts sooner and mm hides it."""
    gm = capture_fn(feeder_later, [torch.randn(8, 8) for _ in range(3)], decompose=False)
    graph, _ = graph_of(gm, regions=False)
    assert by_name(u for u in graph.original if u.kind != "input") == ["mm", "mm_1", "all_reduce", "wait_tensor", "add"]
    order = overlap.schedule_overlap(graph, budget=10**9)
    assert by_name(u for u in order if u.kind != "input") == ["mm_1", "all_reduce", "mm", "wait_tensor", "add"]


def test_pick_next_breaks_ties_by_original_position(tiny):
    """The ready list comes in any order: among the units of the preferred kind that fit, the earliest in the original
    order wins."""
    graph, _ = graph_of(tiny)
    ready = [u for u in graph.units if not u.preds]
    feeding = [u for u in ready if u.kind != "wait" and u.index in graph.feeds_collective]
    assert len(feeding) >= 2  # x and w1 feed the all_reduce
    want = min(feeding, key=lambda u: u.index)
    for shuffled in (ready, ready[::-1], ready[1:] + ready[:1]):
        assert overlap.pick_next(graph, shuffled, graph.memory_state(), set(), 10**9) is want


def two_collectives(x, w1, w2, w3):
    r1 = funcol.all_reduce(x @ w1, "sum", group())
    r2 = funcol.all_reduce(x @ w2, "sum", group())
    return r1 + r2 + x @ w3


def test_collectives_share_one_network(fake_group):
    gm = capture_fn(two_collectives, [torch.randn(8, 8) for _ in range(4)], decompose=False)
    graph, _ = graph_of(gm, CostModel(latency_us=3000.0, bus_gbps=1e9), regions=False)  # 3 ms per collective
    set_costs(graph, all_reduce=3.0, all_reduce_1=3.0)
    t = graph.timeline(overlap.schedule_overlap(graph, budget=10**9))
    assert [(c.began_ms, c.ended_ms) for c in t.collectives] == [(0.0, 3.0), (3.0, 6.0)]  # one after the other
    assert t.exposed_ms == 6.0 and t.step_ms == 6.0


def two_inputs_reduced(x, y):
    return funcol.all_reduce(x, "sum", group()) + funcol.all_reduce(y, "sum", group())


def test_back_to_back_all_reduces_are_bucketed_when_that_saves_latency(fake_group):
    gm = capture_fn(two_inputs_reduced, [torch.randn(8, 8), torch.randn(8, 8)], decompose=False)
    graph, _ = graph_of(gm, CostModel(latency_us=3000.0, bus_gbps=1e9), regions=False)  # 3 ms latency
    order = overlap.schedule_overlap(graph, budget=10**9)
    plan = bucket.plan_buckets(graph, order)
    assert [by_name(g) for g in plan.groups] == [["all_reduce", "all_reduce_1"]]
    assert plan.exposed_before_ms == pytest.approx(6.0) and plan.exposed_after_ms == pytest.approx(3.0)
    unscheduled = bucket.plan_buckets(graph, graph.original)  # each start followed by its wait: nothing to merge
    assert unscheduled.groups == []
    apply_order(gm, graph, order)
    bucket.apply_buckets(gm, plan)
    assert [short(n) for n in gm.graph.nodes if is_collective(n)] == ["all_reduce"]  # one collective for both
    x, y = torch.randn(8, 8), torch.randn(8, 16)[:, ::2]  # y not contiguous
    plain = capture_fn(two_inputs_reduced, [x, y], decompose=False)
    torch.testing.assert_close(gm(x, y), plain(x, y), rtol=0, atol=0)  # the fake group sums nothing: plumbing only


# ----------------------------------------------------------------------------------------------------------------------
# The rules: each one broken on purpose must be caught, with a message naming it


def test_check_schedule_names_each_broken_rule(tiny):
    graph, _ = graph_of(tiny)
    units = {u.name: u for u in graph.units}
    inputs = [u for u in graph.units if u.kind == "input"]
    mm, ar, wait, mm_1, add = (units[k] for k in ("mm", "all_reduce", "wait_tensor", "mm_1", "add"))
    check_schedule(graph, [*inputs, mm, ar, mm_1, wait, add])
    cases = {
        "a wait sunk past its first user": [*inputs, mm, ar, mm_1, add, wait],
        "a wait before its collective starts": [*inputs, mm, wait, ar, mm_1, add],
        "a collective started before its input": [*inputs, ar, mm, wait, mm_1, add],
        "scheduled twice": [*inputs, mm, ar, wait, mm_1, add, add],
        "never scheduled": [*inputs, mm, ar, wait, add],
    }
    for why, order in cases.items():
        with pytest.raises(ScheduleError, match=why):
            check_schedule(graph, order)
    with pytest.raises(ScheduleError, match="exceeds the budget"):
        check_schedule(graph, graph.original, budget=graph.peak_memory(graph.original) - 1)


def test_check_regions_catches_a_split_region():
    gm = capture_step("dp", **SMALL)
    graph, region_of = graph_of(gm)
    apply_order(gm, graph, overlap.schedule_overlap(graph))
    check_regions(gm, region_of)  # scheduled by units: every region whole
    region = next(r for r in region_of.values() if len(r.nodes) >= 3)
    outsider = gm.graph.call_function(torch.ops.aten.clone.default, (next(iter(gm.graph.nodes)),))
    region.nodes[0].append(outsider)  # an unrelated node inside the region: one kernel cut in two
    with pytest.raises(ScheduleError, match="is split"):
        check_regions(gm, region_of)


# ----------------------------------------------------------------------------------------------------------------------
# The scheduler: properties over random graphs


@st.composite
def programs(draw):
    """A random program: ops on [8, 8] tensors, some collectives, some pointwise chains (fusion regions)."""
    n = draw(st.integers(3, 9))
    ops = []
    for i in range(n):
        op = draw(st.sampled_from(["mm", "chain", "all_reduce", "all_gather", "reduce_scatter"]))
        ops.append((op, draw(st.integers(0, i)), draw(st.integers(2, 4))))
    return ops


def run_program(ops):
    def fn(x, w):
        values = [x]
        for op, src, k in ops:
            v = values[src]
            if op == "mm":
                v = v[:8] @ w
            elif op == "chain":
                for _ in range(k):
                    v = torch.relu(v * 1.5 + 1)
            elif op == "all_reduce":
                v = funcol.all_reduce(v, "sum", group())
            elif op == "all_gather":
                v = GATHER(v, 0, group())[:8]
            else:
                v = SCATTER(torch.cat([v, v]), "sum", 0, group())
            values.append(v)
        return tuple(values[1:])

    return fn


@given(programs(), st.floats(1.0, 1.5))
def test_schedules_keep_every_rule_on_random_graphs(ops, slack):
    inputs = [torch.randn(8, 8), torch.randn(8, 8)]
    gm = capture_fn(run_program(ops), inputs, decompose=False)
    graph, region_of = graph_of(gm)
    budget = int(graph.peak_memory(graph.original) * slack)
    order = overlap.schedule_overlap(graph, budget)
    check_schedule(graph, order, budget)  # topological (waits after starts, before users), all once, within budget
    again, _ = graph_of(capture_fn(run_program(ops), inputs, decompose=False))
    assert by_name(overlap.schedule_overlap(again, budget)) == by_name(order)  # deterministic: every rank agrees
    apply_order(gm, graph, order)
    check_regions(gm, region_of)
    assert [n.name for n in gm.graph.nodes if n.op != "placeholder"][-1] == "output"
    t = graph.timeline(order)  # exposed time never exceeds the communication itself
    assert 0 <= t.exposed_ms <= sum(u.cost.ms for u in graph.units if u.kind == "start") + 1e-12


def test_a_budget_below_the_unscheduled_peak_is_refused(tiny):
    graph, _ = graph_of(tiny)
    with pytest.raises(ValueError, match="below the unscheduled order's own peak"):
        overlap.schedule_overlap(graph, budget=graph.peak_memory(graph.original) - 1)


def test_regions_of_another_graph_are_refused(steps, tiny):
    with pytest.raises(ScheduleError, match="not in this graph. Fix: pass the region_of"):
        OverlapGraph(tiny, CostModel(), build_fusion_regions(steps["dp"]))


def late_gather(x, shard):
    t1 = x @ x  # [64, 64]: 16 KiB each
    t2 = t1 @ t1
    t3 = t2.sum()
    g = GATHER(shard, 0, group())  # [32, 64] -> [64, 64], 16 KiB
    return t3 + g.sum()


def test_the_budget_stops_an_early_start(fake_group):
    gm = capture_fn(late_gather, [torch.randn(64, 64), torch.randn(32, 64)], decompose=False)
    graph, _ = graph_of(gm)
    floor = graph.peak_memory(graph.original)
    roomy = overlap.schedule_overlap(graph, budget=10 * floor)
    assert by_name(roomy).index("all_gather_into_tensor") < by_name(roomy).index("mm")  # raised to the start
    assert graph.peak_memory(roomy) > floor  # ... which holds 16 KiB more while t1 and t2 are alive
    tight = overlap.schedule_overlap(graph, budget=floor)
    assert graph.peak_memory(tight) <= floor
    assert by_name(tight).index("all_gather_into_tensor") > by_name(tight).index("mm_1")


def test_scheduling_hides_communication_in_data_parallel_and_fsdp(steps):
    for kind in ("dp", "fsdp"):
        graph, _ = graph_of(steps[kind])
        order = overlap.schedule_overlap(graph)
        before, after = graph.timeline(graph.original), graph.timeline(order)
        assert after.exposed_ms < before.exposed_ms and after.step_ms < before.step_ms
        assert any(c.hidden_by for c in after.collectives)


# ----------------------------------------------------------------------------------------------------------------------
# Inductor, the backend pass, the lesson


def test_inductor_scheduler_on_the_same_graph_or_a_clear_skip(steps):
    why = inductor.unavailable()
    if why:
        pytest.skip(why)
    graph, _ = graph_of(steps["dp"])
    ours = graph.timeline(overlap.schedule_overlap(graph))
    result = inductor.compare(capture_step("dp", **SMALL), CostModel(), graph)
    assert not result.skipped, result.skipped
    assert sorted(result.collective_order) == sorted(u.name for u in graph.units if u.kind == "start")
    assert "Inductor" in result.text(ours) and result.timeline.exposed_ms >= 0


def test_a_torch_without_the_inductor_scheduler_gives_a_reason_not_a_crash(steps, monkeypatch):
    monkeypatch.setattr(inductor, "NEEDED", ("custom_runtime_estimation", "an_argument_this_torch_lacks"))
    graph, _ = graph_of(steps["dp"])
    result = inductor.compare(capture_step("dp", **SMALL), CostModel(), graph)
    assert result.skipped and ("an_argument_this_torch_lacks" in result.skipped or "not importable" in result.skipped)
    assert "skipped" in result.text(graph.timeline(graph.original))


def test_overlap_pass_reorders_in_place_and_notes_every_collective():
    gm = capture_step("dp", **SMALL)
    before = [n.name for n in gm.graph.nodes]
    notes = []
    overlap.overlap_pass(gm, lambda *a: notes.append(a))
    after = [n.name for n in gm.graph.nodes]
    assert sorted(after) == sorted(before) and after != before
    per_collective = [n for n in notes if n[2] != "in place"]  # and one note for the all_reduces reduced in place
    assert [n[0] for n in per_collective] == ["overlap", "overlap"] and all(len(n[1]) == 2 for n in per_collective)
    assert [n[1] for n in notes if n[2] == "in place"] == [["all_reduce", "all_reduce_1"]]
    check_regions(gm, build_fusion_regions(gm))
    plain = capture_fn(lambda x: (x * 2,), [torch.randn(4)])
    notes.clear()
    passes.overlap_pass(plain, lambda *a: notes.append(a), schedule=overlap.schedule_overlap)
    assert notes[0][2] == "skipped" and "no collectives" in notes[0][3]


def test_lesson_runs_quick(capsys):
    overlap.run(quick=True)
    out = capsys.readouterr().out
    assert "exposed communication" in out and "hidden by" in out
    assert "SIMULATED, not measured" in out and "1,024 GPUs" in out  # beyond the host: said plainly


# ----------------------------------------------------------------------------------------------------------------------
# For real: gloo, 2 processes


def test_gloo_scheduled_equals_unscheduled_bit_for_bit_and_a_mismatch_is_caught():
    cfg = gloo.GlooConfig(kinds=("dp", "fsdp"), mismatch=True, timeout_s=60, decompose=False)
    with pytest.raises(gloo.CollectiveMismatch, match="disagree at collective #2") as caught:
        gloo.run_on_gloo(overlap.schedule_overlap, build_fusion_regions, cfg)
    per_rank = caught.value.per_rank
    assert len(per_rank) == 2
    for rank in per_rank:
        for kind in ("dp", "fsdp"):
            assert rank[kind]["bitwise"], (kind, rank)
            assert rank[kind]["units_moved"] > 0 and rank[kind]["max_diff_vs_eager"] < 1e-4
        assert rank["dp"]["in_place"] == 2  # every gradient all-reduced where it is: equal to eager all the same


def test_backend_option_overlap_schedules_a_compiled_distributed_function():
    """torch.compile(fn, backend="fusion", options={"overlap": True}): the pass runs on Dynamo's graph, notes every
    collective, and the answers equal the unscheduled compile."""
    import torch.distributed._functional_collectives as funcol

    from fusion.comms.capture import _group, ensure_fake_group

    ensure_fake_group(2)

    def fn(a, b, w):
        r = funcol.all_reduce(a, "sum", _group())  # the collective ...
        h = torch.relu(b @ w) * 2.0 + 1.0  # ... and compute that does not need it
        return r * 0.5 + h.sum()

    args = [torch.randn(8, 8, generator=torch.Generator().manual_seed(i)) for i in range(3)]
    outs, notes = with_and_without_overlap(fn, args)
    torch.testing.assert_close(outs[1], outs[0])
    assert not notes[0] and notes[1] and all(n[2] != "skipped" for n in notes[1]), notes


@pytest.mark.phase10
def test_the_lesson_reads_the_measured_rows_it_quotes(tmp_path):
    from fusion.comms.gloo import measured_rows

    assert measured_rows(str(tmp_path)) == []  # nothing measured: nothing quoted
    (tmp_path / "h200-2026-11-23-overlap-x2-compiled.jsonl").write_text(
        '{"note": "how it was run"}\n'
        '{"step": "dp", "variant": "fusion", "step_ms": 10.47, "comm_ms": 4.04, "exposed_ms": 4.04}\n'
    )
    assert measured_rows(str(tmp_path)) == [("dp", "fusion", "10.47", "4.04", "4.04")]
    (tmp_path / "h100-2026-11-26-overlap-steps.jsonl").write_text(  # issue 40's script: preferred, GPUs said
        '{"world": 4, "step": "fsdp", "variant": "fusion+overlap", "step_ms": 9.0, "comm_ms": 7.0, "exposed_ms": 1.0}\n'
        '{"world": 4, "step": "fsdp", "variant": "inductor", "skipped": "time budget: 20 s left"}\n'
    )
    assert measured_rows(str(tmp_path)) == [("fsdp, 4 GPUs", "fusion+overlap", "9.00", "7.00", "1.00")]


# ----------------------------------------------------------------------------------------------------------------------
# Issue 40: the data-parallel step, at the proportions of a real one (weights much larger than a layer's activations)

# The README's step (fake tensors: sizes cost nothing): a weight is 8x a layer's activations, and one layer's backward
# takes about as long as its gradient's all_reduce under the default costs.
DP_REAL = dict(layers=4, dim=8192, batch=1024, dtype=torch.bfloat16)


def backward_mms(order):
    """The matmuls of the backward half, in schedule order (every mm after the forward's last one)."""
    mms = [u for u in order if u.kind == "compute" and not u.region and short(u.nodes[0]) == "mm"]
    return mms[DP_REAL["layers"] :]


def test_an_all_reduce_lets_its_input_die_at_the_start_but_a_gather_holds_it_to_the_wait(fake_group):
    """funcol's all_reduce copies its input into its output when it starts; all_gather and reduce_scatter read their
    input until the collective ends. Counting the all_reduce's input alive to the wait doubled every early gradient
    in the memory simulation, and the budget then held data parallelism's all_reduces back (issue 40)."""

    def both(x, w):
        return funcol.all_reduce(x @ w, "sum", group()), GATHER(x @ w, 0, group())

    gm = capture_fn(both, [torch.randn(8, 8), torch.randn(8, 8)], decompose=False)
    graph, _ = graph_of(gm, regions=False)
    for start in (u for u in graph.units if u.kind == "start"):
        (source,) = start.nodes[0].all_input_nodes
        freed_at = [graph.units[i] for i, ns in enumerate(graph.frees_at) if source in ns]
        wait = graph.units[start.partner]
        if short(start.nodes[0]) == "all_reduce":
            assert freed_at == [start], freed_at  # its last user is the start: the copy is made there
        else:
            assert wait in freed_at, freed_at  # NCCL reads it until the wait


def test_data_parallel_all_reduces_start_during_backward_within_the_default_budget(fake_group):
    """The schedule property behind the compiled step's exposure (README: 4.05 ms exposed on 2 GPUs): every gradient's
    all_reduce starts before the last backward matmul runs, except the last gradient's (it *is* that matmul's
    output), so backward hides all of them but one; and the memory budget is not what moved them."""
    gm = capture_step("dp", **DP_REAL)
    graph, _ = graph_of(gm)
    budget = overlap.memory_budget(graph)
    order = overlap.schedule_overlap(graph, budget)
    position = {u.index: i for i, u in enumerate(order)}
    last_mm = backward_mms(order)[-1]
    starts = [u for u in order if u.kind == "start"]
    early = [u for u in starts if position[u.index] < position[last_mm.index]]
    assert len(early) == len(starts) - 1, [u.name for u in starts]
    assert graph.peak_memory(order) <= graph.peak_memory(graph.original)  # no memory spent on it at all
    before, after = graph.timeline(graph.original), graph.timeline(order)
    assert after.exposed_ms < 0.1 * before.exposed_ms


def test_overlap_pass_on_the_data_parallel_step_issues_all_reduces_inside_backward(fake_group):
    """The same property on the graph the backend compiles (options={"overlap": True}): in the rewritten fx graph the
    first all_reduce comes before the last backward mm, and all waits after it."""
    gm = capture_step("dp", **DP_REAL)
    overlap.overlap_pass(gm, lambda *a: None)
    nodes = [n for n in gm.graph.nodes if n.op == "call_function"]
    kinds = [("ar" if is_collective(n) else "wait" if is_wait(n) else short(n)) for n in nodes]
    last_mm = max(i for i, k in enumerate(kinds) if k == "mm")
    assert kinds.index("ar") < last_mm and sum(k == "ar" for k in kinds[:last_mm]) == DP_REAL["layers"] - 1
    assert min(i for i, k in enumerate(kinds) if k == "wait") > last_mm


# ----------------------------------------------------------------------------------------------------------------------
# Issue 40: traces, the fitted cost model, beyond the host, the picture


def chrome_trace(path, kernels):
    """A Chrome trace as torch.profiler writes it: kernels (name, ts µs, dur µs) plus a CPU op to ignore."""
    import gzip
    import json

    events = [{"ph": "X", "cat": "cpu_op", "name": "aten::mm", "ts": 0.0, "dur": 50.0, "pid": 1, "tid": 1}]
    events += [{"ph": "X", "cat": "kernel", "name": n, "ts": ts, "dur": dur, "pid": 0, "tid": 7 if "nccl" in n else 9,
                "args": {"device": 0}} for n, ts, dur in kernels]  # fmt: skip
    with gzip.open(path, "wt") as f:
        json.dump({"traceEvents": events}, f)
    return path


def test_a_trace_gives_compute_and_network_lanes_and_what_hid_each_collective(tmp_path):
    from fusion.comms.profile import lanes_of_trace

    path = chrome_trace(tmp_path / "t.json.gz", [("sm90_gemm_bf16", 100.0, 40.0), ("triton_poi_fused_add_0", 140.0,
                        10.0), ("ncclDevKernel_AllReduce_Sum_bf16_RING_LL(x)", 120.0, 50.0)])  # fmt: skip
    lanes = lanes_of_trace(path)
    assert [n for n, _, _ in lanes.compute] == ["sm90_gemm_bf16", "triton_poi_fused_add_0"] and len(lanes.comm) == 1
    assert lanes.comm_us() == 50.0 and lanes.exposed_us() == pytest.approx(20.0)  # 120-150 hidden, 150-170 not
    (d,) = lanes.detail()
    assert d["kernel"] == "AllReduce_Sum_bf16_RING_LL" and d["start_us"] == 20.0 and d["exposed_us"] == 20.0
    assert d["hidden_by"] == ["sm90_gemm_bf16", "triton_poi_fused_add_0"]  # most overlap first
    assert lanes_of_trace({"traceEvents": []}).notes  # a CPU run's trace: no kernels, said so


def test_the_fit_minimises_relative_error_and_the_model_uses_it_per_collective():
    from fusion.comms.fit import fit_alpha_beta, fit_rows, model_from_fit, prediction_rows

    true = {"all_reduce": (20.0, 300.0), "all_gather_into_tensor": (15.0, 250.0)}
    rows = []
    for op, (lat, bw) in true.items():
        for i, mib in enumerate(2**p for p in range(0, 11, 2)):
            size = mib * 2**20
            t = lat * 1e-6 + size * CostModel(world_size=4).bus_factor(op) / (bw * 1e9)
            rows.append({"op": op, "bytes": size, "measured_ms": t * 1e3 * (1.1 if i == 0 else 1.0)})  # noisy 1 MiB
    fit = fit_rows(rows, world=4)
    model = model_from_fit(4, fit)
    for r in prediction_rows(rows, model):
        assert abs(r["error"]) < 0.10, r  # every size within 10 %, the noisy smallest included
    plain = CostModel(world_size=4, latency_us=1e4, bus_gbps=1.0)  # nothing like the fit: per-op figures win
    assert model_from_fit(4, fit, plain).collective_of("all_gather_into_tensor", 2**20).ms < 1.0
    with pytest.raises(ValueError, match="at least 2 sizes"):
        fit_alpha_beta([(1.0, 1.0)])


def test_ring_and_tree_grow_as_stated_beyond_the_host():
    from fusion.comms import scale

    assert scale.ring_hops("all_reduce", 4) == (6, 0) and scale.ring_hops("all_gather_into_tensor", 4) == (3, 0)
    assert scale.ring_hops("all_reduce", 16) == (26, 4)  # 2 nodes: 2·15 steps, 4 of them between nodes
    assert scale.tree_hops(1024) == (14, 14)  # 8 GPUs a node: a chain of 7 up and down; 128 nodes: 2·log2(128)
    fitted = {"all_reduce": {"latency_us": 30.0, "busbw_gbps": 300.0}}
    at = {(n, a): scale.scaled_model(fitted, 4, n, a, CostModel()).collective_of("all_reduce", 2**27).ms
          for n in (4, 8, 1024) for a in ("ring", "tree")}  # fmt: skip
    measured = 30e-3 + 2**27 * 1.5 / 300e9 * 1e3
    assert at[(4, "ring")] == pytest.approx(measured)  # at the measured size: the fit itself
    assert at[(1024, "tree")] < at[(1024, "ring")] and at[(8, "ring")] < at[(1024, "tree")]  # network bandwidth


def test_beyond_the_host_simulates_both_steps_and_restores_the_fake_group(fake_group):
    from fusion.comms import scale

    step = dict(layers=2, dim=64, batch=16)
    rows = scale.simulate(("dp", "fsdp"), (8, 16), {}, 2, CostModel(), step, overlap.schedule_overlap,
                          overlap.build_graph, overlap.memory_budget)  # fmt: skip
    assert {(r["gpus"], r["step"], r["algorithm"]) for r in rows} == {
        (n, k, a) for n in (8, 16) for k, a in (("dp", "ring"), ("dp", "tree"), ("fsdp", "ring"))}  # fmt: skip
    assert all(r["exposed_after_ms"] <= r["exposed_before_ms"] + 1e-12 for r in rows)
    assert torch.distributed.get_world_size() == 2  # the tests' fake group is back


def test_plot_writes_a_png_from_the_simulation_and_a_kept_trace(tmp_path, capsys):
    pytest.importorskip("matplotlib")
    trace = chrome_trace(tmp_path / "t.json.gz", [("sm90_gemm", 0.0, 30.0), ("ncclDevKernel_AllGather", 10.0, 40.0)])
    out = tmp_path / "schedule.png"
    assert overlap.main(["--plot", str(out), "--trace", str(trace), "--quick"]) == 0
    assert out.read_bytes()[:8] == b"\x89PNG\r\n\x1a\n" and out.stat().st_size > 10_000


def test_plot_without_matplotlib_says_how_to_get_it(tmp_path, capsys, monkeypatch):
    from fusion.comms import plot

    monkeypatch.setattr(plot, "have_matplotlib", lambda: False)
    assert overlap.main(["--plot", str(tmp_path / "x.png")]) == 2
    assert "uv run --extra plot" in capsys.readouterr().out and not (tmp_path / "x.png").exists()


def test_the_lesson_refits_the_newest_measured_collectives(tmp_path):
    import json

    from fusion.comms.fit import fit_table, newest_measurement

    assert newest_measurement(str(tmp_path)) is None
    worlds = {}
    for world in (2, 4):
        rows = [{"op": "all_reduce", "bytes": 2**p, "measured_ms": (25e-6 + 2**p * 2 * (world - 1) / world / 300e9)
                 * 1e3} for p in range(20, 31, 2)]  # fmt: skip
        worlds[str(world)] = {"rows": rows, "fit": {"stale": "refitted on reading"}, "calibration": {}}
    (tmp_path / "h100-2026-11-26-overlap-collectives.json").write_text(
        json.dumps({"device": "NVIDIA H100", "torch": "2.11", "date": "2026-11-26", "worlds": worlds})
    )
    found = newest_measurement(str(tmp_path))
    assert found["file"].startswith("h100") and found["worlds"]["4"]["fit"]["all_reduce"]["latency_us"] == (
        pytest.approx(25.0)
    )
    rows, headers = fit_table(found)
    assert [r[:3] for r in rows] == [(w, "all-reduce", "up to 1024 MiB: 25 µs + 300 GB/s") for w in (2, 4)]  # one band
    assert rows[0][3].startswith(("+0%", "-0%")) and "worst" in headers[-1]
