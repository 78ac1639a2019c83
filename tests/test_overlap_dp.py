"""Phase 10, issue 40: why the compiled data-parallel step exposed more than Inductor's, and the cost model per size.

What the 2026-11-26 run (4x H200) showed: every all_reduce of the data-parallel step with the pass left ~0.1 ms
"exposed" that Inductor's did not. The profile counted only kernels as compute, and eager funcol's all_reduce copies
its input with a ``cudaMemcpyAsync`` (a ``gpu_memcpy`` event, 63 µs for 128 MiB), where Inductor emits the same copy
as a Triton kernel. The copy is now compute in the profile, and the pass drops it where it buys nothing
(``all_reduce_`` in place). The collectives' cost model follows NCCL's protocol switches with size bands, tested on
the raw files it was fitted to.
"""

import json
import tarfile
from pathlib import Path

import pytest
import torch
import torch.distributed._functional_collectives as funcol
from support import with_and_without_overlap

from fusion import overlap
from fusion.comms import fit, inductor, passes, scale
from fusion.comms.capture import capture_fn, capture_step, ensure_fake_group, is_collective, short
from fusion.comms.cost import CostModel
from fusion.comms.profile import lanes_of_trace, pack_traces

pytestmark = pytest.mark.phase10

RESULTS = Path(__file__).resolve().parents[1] / "scripts" / "results"
RAW = [
    "h200-2026-11-26-overlap-collectives.json",
    "h200-2026-11-23-overlap-x2.json",
    "h100-2026-11-27-overlap-collectives.json",
]  # 4xH200, 2xH200, 4xH100


@pytest.fixture(scope="module", autouse=True)
def fake_group():
    ensure_fake_group(2)


def group():
    return torch.distributed.group.WORLD


# ----------------------------------------------------------------------------------------------------------------------
# The profile: a copy on a compute stream is compute


def test_a_copy_on_a_compute_stream_hides_a_collective_but_one_on_the_nccl_stream_does_not(tmp_path):
    def ev(cat, name, ts, dur, stream):
        return {"ph": "X", "cat": cat, "name": name, "ts": ts, "dur": dur, "args": {"device": 0, "stream": stream}}

    trace = {"traceEvents": [
        ev("kernel", "nvjet_sm90_gemm", 0.0, 100.0, 7),
        ev("gpu_memcpy", "Memcpy DtoD (Device -> Device)", 100.0, 60.0, 7),  # funcol's copy of the next gradient
        ev("kernel", "ncclDevKernel_AllReduce_Sum_bf16_RING_LL(x)", 50.0, 110.0, 19),
        ev("gpu_memset", "Memset (Device)", 170.0, 10.0, 19),  # on NCCL's stream: not compute
    ]}  # fmt: skip
    lanes = lanes_of_trace(trace)
    assert [n for n, _, _ in lanes.compute] == ["nvjet_sm90_gemm", "Memcpy DtoD (Device -> Device)"]
    assert lanes.exposed_us() == pytest.approx(0.0)  # 50-100 under the gemm, 100-160 under the copy
    assert lanes.detail()[0]["hidden_by"] == ["Memcpy DtoD", "nvjet_sm90_gemm"]  # most overlap first


def test_the_kept_trace_of_the_data_parallel_step_shows_the_copy_before_every_all_reduce():
    """The one 2026-11-26 trace kept of the data-parallel step (unscheduled, 2 GPUs): 8 copies of 128 MiB, each
    just before an all_reduce, on the compute stream; the profile now counts them as compute."""
    path = RESULTS / "traces" / "h200-2026-11-26-x2-dp-fusion-rank0.json.gz"
    if not path.exists():
        pytest.skip(f"{path.name} is not kept here")
    from fusion.comms.profile import read_trace

    events = read_trace(path)["traceEvents"]
    copies = [e for e in events if e.get("cat") == "gpu_memcpy" and e["args"].get("bytes") == 2**27]
    assert len(copies) == 8
    lanes = lanes_of_trace(path)
    assert sum(n.startswith("Memcpy DtoD") for n, _, _ in lanes.compute) == 8


def test_traces_are_packed_into_one_archive_per_world_size(tmp_path):
    paths = []
    for rank in range(4):
        p = tmp_path / f"h200-x4-dp-fusion-rank{rank}.json"
        p.write_text(json.dumps({"traceEvents": [{"ph": "X", "cat": "kernel", "name": "k", "ts": 0, "dur": 1}]}))
        paths.append(p)
    archive = pack_traces(paths, tmp_path / "h200-overlap-x4-traces.tar.gz")
    assert not any(p.exists() for p in paths) and list(tmp_path.iterdir()) == [archive]
    with tarfile.open(archive) as tar:
        assert sorted(tar.getnames()) == sorted(p.name for p in paths)
        tar.extractall(tmp_path / "out", filter="data")
    assert len(lanes_of_trace(tmp_path / "out" / paths[0].name).compute) == 1  # Chrome trace JSON, as written


# ----------------------------------------------------------------------------------------------------------------------
# The pass: an all_reduce of a private buffer is reduced in place


def test_only_a_private_contiguous_buffer_is_all_reduced_in_place():
    def step(x, w):
        mine = funcol.all_reduce(x @ w, "sum", group())  # a fresh buffer read by the all_reduce alone: in place
        given = funcol.all_reduce(x, "sum", group())  # the caller's tensor: never written
        shared = x @ w + 1
        both = funcol.all_reduce(shared, "sum", group())  # also read below: the copy is needed
        view = funcol.all_reduce((x @ w).t(), "sum", group())  # a view: not a buffer of its own
        return mine + given + both + shared + view

    gm = capture_fn(step, [torch.randn(4, 4), torch.randn(4, 4)], decompose=False)
    assert passes.all_reduce_in_place(gm) == ["all_reduce"]
    targets = [short(n) for n in gm.graph.nodes if is_collective(n)]
    assert targets == ["all_reduce_", "all_reduce", "all_reduce", "all_reduce"]


def test_the_scheduler_reads_a_graph_with_an_in_place_all_reduce():
    """A graph the pass already rewrote (compiled again, or written with all_reduce_): all_reduce_ is a collective,
    costed as all_reduce, and its result is its input's storage (no second buffer in the memory simulation)."""
    gm = capture_step("dp", layers=2, dim=32, batch=16)
    passes.all_reduce_in_place(gm)
    graph, _ = overlap.build_graph(gm)
    starts = [u for u in graph.units if u.kind == "start"]
    assert [short(u.nodes[0]) for u in starts] == ["all_reduce_", "all_reduce_"]
    assert starts[0].cost == CostModel().collective_of("all_reduce", 32 * 32 * 4)
    assert all(graph.alloc[u.index] == 0 for u in starts)
    order = overlap.schedule_overlap(graph)
    assert graph.timeline(order).exposed_ms <= graph.timeline(graph.original).exposed_ms


def test_the_backend_pass_reduces_in_place_and_answers_as_unscheduled():
    from fusion.comms.capture import _group

    def fn(a, b, w):
        g = funcol.all_reduce(b @ w, "sum", _group())
        return g * 0.5 + (torch.relu(a @ w) * 2.0).sum()

    args = [torch.randn(8, 8, generator=torch.Generator().manual_seed(i)) for i in range(3)]
    outs, notes = with_and_without_overlap(fn, args)
    torch.testing.assert_close(outs[1], outs[0], rtol=0, atol=0)
    assert any(n[2] == "in place" for n in notes[1]), notes[1]


# ----------------------------------------------------------------------------------------------------------------------
# The schedule: the data-parallel step at its real proportions, ours against Inductor's, both on our timeline


@pytest.mark.parametrize("world", [2, 4])
def test_data_parallel_simulated_exposure_is_no_worse_than_inductors_schedule(world):
    measured = fit.load_measurement(RESULTS / RAW[0])
    entry = measured["worlds"][str(world)]
    cost = fit.model_from_fit(world, entry["fit"], fit.measured_compute(entry))
    step = dict(layers=4, dim=8192, batch=1024, dtype=torch.bfloat16)
    with scale.fake_world(world):
        graph, _ = overlap.build_graph(capture_step("dp", **step, world_size=world), cost)
        ours = graph.timeline(overlap.schedule_overlap(graph, overlap.memory_budget(graph)))
        theirs = inductor.compare(capture_step("dp", **step, world_size=world), cost, graph)
    if theirs.skipped:
        pytest.skip(theirs.skipped)
    assert ours.exposed_ms <= theirs.timeline.exposed_ms + 1e-9, (ours.exposed_ms, theirs.timeline.exposed_ms)
    assert ours.step_ms <= theirs.timeline.step_ms + 1e-9


# ----------------------------------------------------------------------------------------------------------------------
# The cost model per size: size bands, within 25 % of every measured size on the raw files


@pytest.mark.parametrize("raw", RAW)
def test_the_banded_model_predicts_every_measured_collective_within_25_percent(raw):
    measured = fit.load_measurement(RESULTS / raw)
    worst_line = 0.0
    for world, entry in measured["worlds"].items():
        model, line = fit.model_from_fit(int(world), entry["fit"]), fit.line_model(int(world), entry["fit"])
        rows = [r for r in entry["rows"] if r["bytes"] >= 2**20]
        assert {r["op"] for r in rows} == set(fit.OPS)
        for p in fit.prediction_rows(rows, model):
            assert abs(p["error"]) <= 0.25, (world, p)
        worst_line = max([worst_line, *(abs(p["error"]) for p in fit.prediction_rows(rows, line))])
        for op in fit.OPS:
            assert 1 <= len(entry["fit"][op]["bands"]) <= fit.MAX_BANDS
    if raw == RAW[0]:
        assert worst_line > 0.25  # one line per collective could not: why the bands


def test_the_least_over_ranks_is_the_measured_time():
    ranks = [[{"op": "all_reduce", "bytes": 2**20, "measured_ms": t}] for t in (0.063, 0.051)]
    (row,) = fit.rows_over_ranks(ranks)
    assert row["measured_ms"] == 0.051 and row["measured_ms_ranks"] == [0.063, 0.051]


def test_a_size_between_bands_takes_the_nearer_band_and_a_flat_band_its_time():
    mib = 2**20
    model = CostModel(world_size=2, bands=(("all_reduce", mib, 4 * mib, 40.0, 0.0),
                                           ("all_reduce", 16 * mib, 1024 * mib, 20.0, 300.0)))  # fmt: skip
    assert model.collective_of("all_reduce", 2 * mib).ms == pytest.approx(0.040)  # inside the flat band
    assert model.collective_of("all_reduce", 7 * mib).ms == pytest.approx(0.040)  # below sqrt(4·16) = 8 MiB
    at_9 = 20e-3 + 9 * mib / 300e9 * 1e3
    assert model.collective_of("all_reduce", 9 * mib).ms == pytest.approx(at_9)
    assert (
        model.collective_of("all_gather_into_tensor", mib).ms
        == CostModel().collective_of("all_gather_into_tensor", mib).ms
    )  # no band for it: the single figures


def test_bands_are_the_fewest_within_ten_percent():
    line = [(x, 20e-6 + x / 300e9) for x in (2.0**p for p in range(20, 31))]
    assert len(fit.fit_bands(line)) == 1
    switch = [(x, t * (2.0 if x == 2**22 else 1.0)) for x, t in line]  # one size twice as slow: a protocol switch
    bands = fit.fit_bands(switch)
    assert len(bands) == 3 and max(b["max_rel_err"] for b in bands) < 0.10


def test_a_schedule_is_said_collective_by_collective():
    """What issue 40 compared: where each all_reduce starts, where it is waited on, the work between, exposure."""
    from fusion.comms.explain import HEADERS, collective_rows

    gm = capture_step("dp", layers=3, dim=32, batch=16)
    graph, _ = overlap.build_graph(gm)
    order = overlap.schedule_overlap(graph)
    rows = collective_rows(graph, order)
    assert [r[0] for r in rows] == ["all_reduce", "all_reduce_1", "all_reduce_2"] and len(rows[0]) == len(HEADERS)
    assert rows[0][1] == f"{32 * 32 * 4 / 2**20:g}"  # the gradient's MiB
    assert int(rows[0][4].split()[0]) > 0  # work between its start and its wait: what can hide it
    unscheduled = collective_rows(graph, graph.original)
    assert all(r[4].startswith("0 ") for r in unscheduled)  # written as a first try: waited at once


def test_the_lesson_explains_both_schedules_from_its_command_line(capsys, monkeypatch):
    from fusion.comms import explain

    text = explain.explain("dp", 2, 2, overlap.schedule_overlap, overlap.build_graph, overlap.memory_budget)
    assert "ours: simulated step" in text and "unscheduled: simulated step" in text and "Inductor's" in text
    seen = []
    monkeypatch.setattr(explain, "explain", lambda *a: seen.append(a[:3]) or "said")
    assert overlap.main(["--explain", "fsdp", "--world", "4"]) == 0 and seen == [("fsdp", 4, 8)]
    assert "said" in capsys.readouterr().out
