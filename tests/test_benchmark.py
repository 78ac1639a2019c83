"""Phase 4: the lesson's three measurements (timing loop, peak memory, roofline), the harness's counting, the
report's labels and widths, the JSON of a toy run, the GPU run script's dry run. Never timings."""

import ast
import contextlib
import importlib.util
import io
import itertools
import json
import os
import random
import statistics
import subprocess
import sys
from pathlib import Path

import pytest
import torch
import torch.nn as nn
import torch.nn.functional as F
from hypothesis import given
from hypothesis import strategies as st

from fusion import benchmark as B
from fusion import models
from fusion.bench import counting as C
from fusion.bench import harness as H
from fusion.bench import profile as P
from fusion.bench import report as R
from fusion.bench import workloads as W
from fusion.bench.config import SIZES, Config
from fusion.bench.rows import row_metrics, summarize
from fusion.common import is_todo, trace_module
from fusion.conv_bn_fusion import CUDNN_CONV_THEN_BIAS, cudnn_epilogue_unavailable, fuse_conv_relu_epilogue

pytestmark = pytest.mark.phase4

ROOT = Path(__file__).resolve().parent.parent
PEAKS = B.Peaks(flops_per_s=1e12, bytes_per_s=1e11)  # ridge: 10 FLOP/byte


# ----------------------------------------------------------------------------------------------------------------------
# 1. The timing loop, against a fake clock: fns advance fake time, so every property is exact and nothing is timed


class FakeDevice:
    """A clock and a device queue. ``work(s)`` returns a fn that costs ``s`` of device time per call, launched
    asynchronously (the host spends ``launch`` s; the work runs on the queue); ``sync()`` waits for the queue."""

    def __init__(self, launch: float = 1e-6):
        self.now, self.queue, self.launch = 0.0, 0.0, launch
        self.calls: list[str] = []
        self.reads: list[int] = []  # len(calls) at each clock read

    def clock(self) -> float:
        self.reads.append(len(self.calls))
        return self.now

    def sync(self) -> None:
        self.now += self.queue
        self.queue = 0.0

    def work(self, name: str, costs) -> callable:
        fixed = costs if isinstance(costs, float) else None
        costs = None if fixed is not None else iter(costs)

        def fn():
            self.calls.append(name)
            self.now += self.launch
            self.queue += next(costs) if costs is not None else fixed

        return fn


def _time(dev: FakeDevice, fns: dict, rounds: int = 3, warmup: int = 3, min_run_time: float = 0.02):
    return B.time_variants(
        fns, rounds=rounds, min_run_time=min_run_time, warmup=warmup, sync=dev.sync, clock=dev.clock, threads=1
    )


def _cold_then(cold: float, warm: float, n_cold: int):
    def costs():
        for _ in range(n_cold):
            yield cold
        while True:
            yield warm

    return costs()


def test_timing_warms_up_before_it_times():
    dev = FakeDevice()
    # the first 3 calls are cold (1 s each: caches, autotuning, lazy init); every later call costs 1 ms
    fn = dev.work("a", _cold_then(1.0, 1e-3, 3))
    timing = _time(dev, {"a": fn}, warmup=3)["a"]
    assert max(timing.times_s) < 2e-3, "a block holds a cold call: warm up `warmup` times before timing"
    assert timing.median_s == pytest.approx(1e-3 + dev.launch)


def test_timing_waits_for_the_device():
    dev = FakeDevice(launch=1e-6)  # launching costs 1 µs; the kernel runs 1 ms on the device queue
    timing = _time(dev, {"a": dev.work("a", 1e-3)})["a"]
    assert timing.median_s == pytest.approx(1e-3 + 1e-6, rel=1e-3), "sync() before every clock read"
    assert all(t == pytest.approx(1e-3 + 1e-6, rel=1e-3) for t in timing.times_s)


def test_timing_interleaves_rounds_and_times_every_fn_every_round():
    dev = FakeDevice()
    fns = {name: dev.work(name, 1e-3) for name in "abc"}
    timings = _time(dev, fns, rounds=3, warmup=2)
    assert set(timings) == {"a", "b", "c"}
    assert all(len(t.times_s) >= 3 and all(s > 0 for s in t.times_s) for t in timings.values())
    runs = [(name, len(list(calls))) for name, calls in itertools.groupby(dev.calls)]  # (fn, consecutive calls)
    timed, before = runs[-9:], runs[:-9]
    assert [name for name, _ in timed] == ["a", "b", "c"] * 3  # the timed calls go round by round
    # what precedes them is warm-up (in any order: fn by fn, or interleaved), or the warm-up is within the rounds
    assert sum(n for _, n in before) <= 2 * 3, runs


def test_timing_reports_the_median_block():
    dev = FakeDevice()
    rng = random.Random(0)

    def costs():  # random per call, so blocks of any number of calls differ from each other
        while True:
            yield rng.choice((1e-3, 2e-3, 3e-3, 40e-3))

    timing = _time(dev, {"a": dev.work("a", costs())}, rounds=3, warmup=0, min_run_time=0.05)["a"]
    ts = timing.times_s
    assert len(set(round(t, 9) for t in ts)) > 2  # the blocks differ: median, mean and minimum all differ
    assert timing.median_s == pytest.approx(statistics.median(ts))
    assert timing.median_s != pytest.approx(statistics.mean(ts)) and timing.median_s != pytest.approx(min(ts))


def test_timing_real_functions_run():
    t = B.time_variants({"noop": lambda: None, "add": lambda: torch.ones(4) + 1}, rounds=2, min_run_time=1e-3)
    assert all(len(x.times_s) >= 2 and x.median_s > 0 for x in t.values())


# ----------------------------------------------------------------------------------------------------------------------
# 2. Peak memory


@given(rows=st.integers(1, 40), d=st.integers(1, 40))
def test_peak_memory_on_cpu_is_the_largest_live_total(rows, d):
    chain = models.ElementwiseChain(d)
    (x,) = models.elementwise_inputs(rows, d)
    out = 4 * rows * d  # bytes of one (rows, d) float32 tensor
    with torch.no_grad():
        # x*a, +b, relu, *c, +x: five tensors allocated, but each dies when the next exists: two alive at most
        assert B.peak_memory(lambda: chain(x), "cpu") == 2 * out
        # addcmul, relu_ in place, addcmul: the same peak, one allocation fewer
        fused = W.hand_fuse_chain(chain)
        assert B.peak_memory(lambda: fused(x), "cpu") == 2 * out
        lin = nn.Linear(d, d)
        assert B.peak_memory(lambda: F.relu(lin(x)), "cpu") == 2 * out  # the Linear's output is an intermediate
        assert B.peak_memory(lambda: torch.relu_(lin(x)), "cpu") == out  # fused: written once, rewritten in place
        assert B.peak_memory(lambda: x.view(-1), "cpu") == 0  # a view allocates nothing


class FakeCudaAllocator:
    """torch.cuda's allocator statistics, faked: 1 MB resident, a stale peak of 9 MB from earlier work."""

    def __init__(self):
        self.allocated, self.peak, self.log = 1_000_000, 9_000_000, []

    def install(self, monkeypatch):
        # every spelling of the same statistics: torch.cuda.X and torch.cuda.memory.X, and memory_stats() itself
        stats = lambda *a, **k: {"allocated_bytes.all.current": self.allocated, "allocated_bytes.all.peak": self.peak}  # noqa: E731
        for module in (torch.cuda, torch.cuda.memory):
            monkeypatch.setattr(module, "reset_peak_memory_stats", lambda *a, **k: self._reset())
            monkeypatch.setattr(module, "memory_allocated", lambda *a, **k: self.allocated)
            monkeypatch.setattr(module, "max_memory_allocated", lambda *a, **k: self.peak)
            monkeypatch.setattr(module, "memory_stats", stats)
        monkeypatch.setattr(torch.cuda, "synchronize", lambda *a, **k: self.log.append("sync"))

    def _reset(self):
        self.log.append("reset")
        self.peak = self.allocated

    def alloc(self, n: int):
        self.allocated += n
        self.peak = max(self.peak, self.allocated)

    def call(self):  # allocates 300 kB and 200 kB, frees the first: the peak is 500 kB above resident
        self.log.append("call")
        self.alloc(300_000)
        self.alloc(200_000)
        self.alloc(-300_000)
        return "out"


def test_peak_memory_on_cuda_reads_the_allocator(monkeypatch):
    fake = FakeCudaAllocator()
    fake.install(monkeypatch)
    assert B.peak_memory(fake.call, "cuda") == 500_000  # not the stale 9 MB, not counting the resident 1 MB
    assert fake.log.index("reset") < fake.log.index("call")
    assert "sync" in fake.log[fake.log.index("call") :], "wait for the GPU before reading the peak"


# ----------------------------------------------------------------------------------------------------------------------
# 3. The roofline


def test_roofline_compute_bound():
    r = B.roofline(flops=2e9, nbytes=1e8, peaks=PEAKS)  # 2 ms of compute, 1 ms of memory
    assert r.intensity == pytest.approx(20.0)
    assert r.bound_s == pytest.approx(2e-3)
    assert r.bound_by == "compute"


def test_roofline_memory_bound():
    r = B.roofline(flops=1e6, nbytes=4e6, peaks=PEAKS)  # 1 µs of compute, 40 µs of memory
    assert r.intensity == pytest.approx(0.25)
    assert r.bound_s == pytest.approx(40e-6)
    assert r.bound_by == "memory"
    assert (r.flops, r.nbytes) == (1_000_000, 4_000_000)


def test_roofline_of_work_that_moves_no_byte():
    r = B.roofline(flops=1e6, nbytes=0, peaks=PEAKS)  # 1 µs of compute, no memory traffic
    assert r.intensity == float("inf")
    assert r.bound_s == pytest.approx(1e-6)
    assert r.bound_by == "compute"


@given(flops=st.integers(1, 10**13), nbytes=st.integers(1, 10**12))
def test_roofline_is_the_larger_ceiling(flops, nbytes):
    r = B.roofline(flops, nbytes, PEAKS)
    assert r.bound_s == pytest.approx(max(flops / 1e12, nbytes / 1e11))
    assert r.intensity == pytest.approx(flops / nbytes)
    assert r.bound_by == ("compute" if flops / nbytes >= PEAKS.ridge else "memory")


def test_kernels_bound_adds_one_roofline_per_node():
    costs = [
        C.NodeCost("mm", flops=2_000_000_000, bytes_read=50_000_000, bytes_written=50_000_000, intermediate=True),
        C.NodeCost("relu", flops=1000, bytes_read=4_000_000, bytes_written=4_000_000, intermediate=False),
    ]
    # mm: max(2 ms, 1 ms) = 2 ms; relu: max(1 ns, 80 µs) = 80 µs
    assert B.kernels_bound(costs, PEAKS) == pytest.approx(2e-3 + 80e-6)
    # the same matmul with relu_ as an extra in-place pass over its 50 MB output: 2 ms + 100 MB / 1e11 B/s
    fused = C.NodeCost("mm_relu_", 2_000_000_000, 100_000_000, 100_000_000, False, "addmm+relu_", extra_passes=1)
    assert fused.extra_pass_bytes == 100_000_000
    assert B.kernels_bound([fused], PEAKS) == pytest.approx(2e-3 + 1e-3)


def test_row_metrics_hand_computed():
    w = B.Roofline(flops=3_000_000, nbytes=8_000_000, intensity=0.375, bound_s=80e-6, bound_by="memory")
    m = row_metrics(200e-6, 500e-6, w, eager_kernels_s=240e-6, variant_kernels_s=80e-6)
    assert m.speedup_vs_eager == pytest.approx(2.5)  # 500 / 200
    assert m.pct_of_limit == pytest.approx(40.0)  # 80 / 200
    assert m.gbps == pytest.approx(40.0)  # 8e6 B / 200e-6 s = 4e10 B/s
    assert m.tflops == pytest.approx(0.015)  # 3e6 / 200e-6 = 1.5e10
    assert m.predicted_speedup == pytest.approx(3.0)  # 240 / 80
    assert row_metrics(1e-6, 1e-6, w, 5e-8, None).predicted_speedup is None


def test_summarize_median_and_iqr():
    assert summarize([5.0, 1.0, 3.0, 2.0, 4.0]) == pytest.approx((3.0, 2.0))
    assert summarize([7.0]) == (7.0, 0.0)


# ----------------------------------------------------------------------------------------------------------------------
# # FLOP and byte counts from the graph


@given(m=st.integers(1, 9), k=st.integers(1, 9), n=st.integers(1, 9))
def test_costs_of_linear_relu(m, k, n):
    model = nn.Sequential(nn.Linear(k, n), nn.ReLU())
    x = torch.randn(m, k)
    costs = {c.name: c for c in C.graph_costs(trace_module(model), x)}
    assert set(costs) == {"_0", "_1"}
    lin, relu = costs["_0"], costs["_1"]
    assert lin.flops == 2 * m * k * n + m * n  # multiply-adds + bias
    assert lin.bytes_read == 4 * (m * k + k * n + n)  # x, W, b in float32
    assert lin.bytes_written == 4 * m * n
    assert lin.intermediate and not relu.intermediate
    assert relu.flops == m * n
    assert (relu.bytes_read, relu.bytes_written) == (4 * m * n, 4 * m * n)
    with torch.no_grad():
        y = model(x)
    assert C.min_bytes(model, (x,), y) == 4 * (m * k + k * n + n + m * n)


@given(rows=st.integers(1, 6), d=st.integers(1, 9))
def test_costs_of_elementwise_chain(rows, d):
    model = models.ElementwiseChain(d)
    (x,) = models.elementwise_inputs(rows, d)
    costs = C.graph_costs(trace_module(model), x)
    t, p = 4 * rows * d, 4 * d  # bytes of one (rows, d) tensor and of one per-feature parameter
    # mul(x, a), add(., b), relu, mul(., c), add(., x): five kernels, one FLOP per element each
    assert [c.flops for c in costs] == [rows * d] * 5
    assert [c.bytes_read for c in costs] == [t + p, t + p, t, t + p, 2 * t]
    assert [c.bytes_written for c in costs] == [t] * 5
    assert [c.intermediate for c in costs] == [True] * 4 + [False]
    with torch.no_grad():
        y = model(x)
    assert C.min_bytes(model, (x,), y) == 2 * t + 3 * p  # read x, a, b, c once; write y once


def test_costs_skip_views_and_count_conv():
    model = models.ConvBNNet(3, 4).eval()
    (x,) = models.conv_inputs(2, 3, 8)
    costs = {c.name: c for c in C.graph_costs(trace_module(model), x)}
    assert "flatten" not in costs  # a view: no kernel, no bytes
    out = 2 * 4 * 8 * 8  # (B, width, H, W) elements
    assert costs["stem_0"].flops == 2 * out * 3 * 9  # bias-less 3x3 conv from 3 channels
    assert costs["conv1"].flops == 2 * out * 4 * 9 + out  # 3x3 conv from 4 channels, with bias
    assert costs["conv2"].flops == 2 * out * 1 * 9  # depthwise: one input channel per group
    assert costs["bn1"].flops == 2 * out
    assert costs["pool"].flops == out and costs["pool"].bytes_written == 4 * 2 * 4
    assert not costs["fc"].intermediate and costs["pool"].intermediate  # pool feeds fc through the flatten view


def test_intermediate_bytes_counts_extra_passes():
    costs = [
        C.NodeCost("a", 0, 10, 100, intermediate=True),  # written, read back by b: 100
        C.NodeCost("b", 0, 100, 2 * 40, intermediate=False, kernel_path="x+relu_", extra_passes=1),  # 40 read back
        C.NodeCost("c", 0, 100, 7, intermediate=False),  # a graph output: 0
    ]
    assert C.intermediate_bytes(costs) == 140


def test_fused_linear_relu_declares_its_kernel_path():
    manual = pytest.importorskip("fusion.manual_fusion")
    model = nn.Sequential(nn.Linear(6, 5), nn.ReLU())
    x = torch.randn(3, 6)
    gm = manual.fuse_linear_relu(model)
    (cost,) = C.graph_costs(gm, x)
    path = manual.FusedLinearReLU(model[0]).kernel_path(x)
    assert cost.kernel_path == path
    if path == "addmm+relu_":  # CPU: addmm writes the output, relu_ reads and rewrites it
        assert cost.extra_passes == 1 and cost.bytes_written == 2 * 4 * 3 * 5
        assert C.intermediate_bytes([cost]) == 4 * 3 * 5


@given(rows=st.integers(1, 6), d=st.integers(1, 9))
def test_hand_fused_chain_is_exact_and_has_three_kernels(rows, d):
    chain = models.ElementwiseChain(d).double()
    (x,) = models.elementwise_inputs(rows, d)
    x = x.double()
    fused = W.hand_fuse_chain(chain)
    with torch.no_grad():
        torch.testing.assert_close(fused(x), chain(x))
    costs = C.graph_costs(trace_module(fused), x)
    assert len(costs) == 3
    eager_inter = sum(c.bytes_written for c in C.graph_costs(trace_module(chain), x) if c.intermediate)
    assert eager_inter - sum(c.bytes_written for c in costs if c.intermediate) == 2 * 8 * rows * d
    assert fused.a is not chain.a  # a copy: the model it was made from is not shared or changed


# ----------------------------------------------------------------------------------------------------------------------
# Timing harness end to end on toy shapes: the CLI, the tables, the JSON


@pytest.fixture(scope="module")
def tiny_json(tmp_path_factory):
    """(exit status, the JSON it wrote or None, the TODO(human) error if a learner region stopped it, stdout) of one
    CLI run on toy shapes; the tests assert on it."""
    path = tmp_path_factory.mktemp("bench") / "bench.json"
    todo = None

    def keep_todo(fn):  # the CLI turns an unsolved TODO into exit status 1; keep the error so tests can re-raise it
        nonlocal todo
        try:
            fn()
        except NotImplementedError as e:
            if not is_todo(e):
                raise
            todo = e
            return 1
        return 0

    out = io.StringIO()
    with pytest.MonkeyPatch.context() as mp, contextlib.redirect_stdout(out):
        mp.setattr(B, "run_lesson", keep_todo)
        rc = B.main(["--device", "cpu", "--tiny", "--no-compile", "--threads", "1", "--json", str(path)])
    if not path.exists():
        return rc, None, todo, out.getvalue()
    with open(path) as f:
        return rc, json.load(f), todo, out.getvalue()


def ok(tiny_json) -> dict:
    """The run's JSON, asserted in the test itself (so an unsolved region is a failure, not a fixture error)."""
    rc, result, todo, _ = tiny_json
    if todo is not None:
        raise todo
    assert rc == 0 and result is not None, "python -m fusion.benchmark --tiny failed: see the captured output"
    return result


CORE = ["linear_relu_memory", "linear_relu_compute", "matmul_add_relu", "conv_bn_relu", "elementwise_chain"]
NEW = ["layernorm_gelu_residual", "qkv_decode", "qkv_prefill", "resnet50", "e2e_resnet18"]


def test_tiny_run_json_schema(tiny_json):
    r = ok(tiny_json)
    assert r["schema"] == B.SCHEMA_VERSION and r["complete"] is True
    meta = r["meta"]
    for key in ("device", "device_name", "torch_version", "threads", "seed", "date", "dtype", "sizes", "compile"):
        assert key in meta
    assert meta["device"] == "cpu" and meta["threads"] == 1 and meta["torch_version"] == torch.__version__
    assert meta["sizes"] == "tiny" and meta["compile"] is False and meta["dtype"] == "float32"
    assert r["peaks"]["flops_per_s"] > 0 and r["peaks"]["bytes_per_s"] > 0 and r["peaks"]["copy_times_s"]
    keys = [w["key"] for w in r["workloads"]]
    assert keys[: len(CORE)] == CORE
    assert set(NEW) <= set(keys) and "e2e_transformer" in keys  # untraceable: FLOPs from torch's FlopCounterMode
    assert next(w for w in r["workloads"] if w["key"] == "e2e_transformer")["flops"] > 0
    assert r["targets"] == [] and r["errors"] == []  # the GPU targets are checked on CUDA only


def _phase_written(module: str, attr: str) -> bool:
    try:
        return hasattr(__import__(f"fusion.{module}", fromlist=[attr]), attr)
    except ImportError:
        return False


def test_tiny_run_every_variant(tiny_json):
    tiny_run = ok(tiny_json)
    phase_of = {"linear_relu_memory": ("manual_fusion", "fuse_linear_relu")}
    phase_of |= {"linear_relu_compute": phase_of["linear_relu_memory"]}
    phase_of |= {"matmul_add_relu": ("pattern_rewriter", "fuse_matmul_add_relu")}
    phase_of |= {"conv_bn_relu": ("conv_bn_fusion", "fuse_conv_bn"), "resnet50": ("conv_bn_fusion", "fuse_conv_bn")}
    phase_of |= {"qkv_decode": ("horizontal_fusion", "fuse_horizontal")}
    for w in tiny_run["workloads"]:
        assert w["flops"] > 0 and w["min_bytes"] > 0 and w["bound_s"] > 0
        variants = {v["name"]: v for v in w["variants"]}
        assert "compile" not in variants  # --no-compile
        eager = variants["eager"]
        assert eager["speedup_vs_eager"] == 1.0 and eager["outputs_match"] and eager["max_abs_diff"] == 0.0
        for name in ("fx_epilogue", "fusion_backend"):  # CUDA only: on CPU the row is there and says why
            if name in variants:
                assert not variants[name]["available"] and variants[name]["median_s"] is None
                assert "CUDA" in variants[name]["reason"] or not variants["fx"]["available"]
        for v in variants.values():  # never a speed of Triton's interpreter
            if v["name"] in ("codegen", "fusion_backend"):
                assert v["median_s"] is None and not v["times_s"]
                if v["available"]:
                    assert v["reason"] == W.TRITON_INTERPRETER and v["timed"] is False and v["outputs_match"]
            elif v["available"]:
                assert v["outputs_match"], (w["key"], v["name"], v["max_rel_diff"])
                assert len(v["times_s"]) >= 2 and v["median_s"] > 0 and v["iqr_s"] >= 0
                assert v["speedup_vs_eager"] == pytest.approx(eager["median_s"] / v["median_s"])
                assert v["pct_of_limit"] == pytest.approx(100 * w["bound_s"] / v["median_s"])
                assert v["peak_memory_bytes"] is not None and v["peak_memory_bytes"] >= 0
        fused = variants.get("fx")
        if fused is None:
            continue
        module, attr = phase_of.get(w["key"], ("benchmark", "time_variants"))
        if not fused["available"]:  # a phase not written yet, or (in a practice workspace) not solved yet
            assert "not available" in fused["reason"] or "not solved yet" in fused["reason"], fused["reason"]
            continue
        assert _phase_written(module, attr)
        if w["key"] in ("linear_relu_memory", "linear_relu_compute") and "addmm+relu_" in fused["kernel_paths"]:
            assert fused["bytes_removed"] == 0 and fused["predicted_speedup"] == pytest.approx(1.0, rel=0.1)
        elif w["key"] in CORE:
            assert fused["bytes_removed"] > 0, w["key"]  # every truly fused variant removes an intermediate
            assert fused["predicted_speedup"] > 1.0


def test_tiny_run_labels_never_contradict_the_roofline(tiny_json):
    r = ok(tiny_json)
    assert R.label_contradictions(r) == []
    for w in r["workloads"]:
        ridge = r["peaks"]["flops_per_s"] / r["peaks"]["bytes_per_s"]
        assert w["bound_by"] == ("compute" if w["intensity"] >= ridge else "memory")
        assert "-bound" not in w["title"]  # the label comes from the roofline, not the name


def test_the_label_check_catches_a_name_that_contradicts_the_roofline():
    """The recorded CPU run of 2026-11-21 (16 threads, ridge 6.2) called a workload at 7.9 FLOP/byte memory-bound."""
    with open(ROOT / "scripts/results/h100host-2026-11-21-bench_cpu.json") as f:
        old = json.load(f)
    bad = R.label_contradictions(old)
    assert any("linear_relu_memory" in b and "title" in b for b in bad)
    for w in old["workloads"]:  # with the titles of today, the same numbers contradict nothing
        w["title"] = "x"
    assert R.label_contradictions(old) == []


@pytest.mark.parametrize("sizes", ["cpu", "cpu-quick"])
def test_cpu_shapes_show_both_sides_of_the_ridge(sizes):
    """On CPU the small-batch Linear sits below any CPU's ridge (measured 1.4-6.2 FLOP/byte), the large-batch one far
    above it: the contrast the phase teaches shows on the machine it runs on."""
    s = SIZES[sizes]
    for (m, k, n), lo, hi in ((s.linear_memory, 0, 1.0), (s.linear_compute, 30, 1e9)):
        model, x = W._linear_relu(k, n, 0), torch.randn(m, k)
        costs = C.graph_costs(trace_module(model), x)
        with torch.no_grad():
            intensity = sum(c.flops for c in costs) / C.min_bytes(model, (x,), model(x))
        assert lo < intensity < hi, (sizes, (m, k, n), intensity)


def test_no_printed_line_is_wider_than_120(tiny_json):
    ok(tiny_json)
    lines = tiny_json[3].splitlines()
    assert lines and max(len(line) for line in lines) <= R.WIDTH, max(lines, key=len)


def _cuda_like(result: dict) -> dict:
    """The toy run dressed as a CUDA run: a GPU profile on every timed row, generated kernels on one."""
    r = json.loads(json.dumps(result))
    r["meta"].update(device="cuda", sizes="cuda", device_name="NVIDIA H100 80GB HBM3 with a long marketing name")
    long = "void cutlass::Kernel2<cutlass_80_wmma_tensorop_bf16_s161616gemm_bf16_32x32_128x2_tn_align8>(Params)"
    for w in r["workloads"]:
        for v in w["variants"]:
            if v["median_s"] is None:
                continue
            gpu_s = 0.6 * v["median_s"]
            v["gpu"] = {"gpu_s": gpu_s, "kernels_per_call": 3, "top": [{"name": long, "us_per_call": 1.0}] * 3}
            v["overhead_s"], v["gpu_speedup"], v["gpu_vs_bound"] = v["median_s"] - gpu_s, 1.1, 12.345
            v["generated"] = [{"name": "triton_poi_fused_add_mul_relu_" + "x" * 60, "bytes": 10**6,
                               "predicted_s": 1e-6, "measured_s": 1.2e-6, "ratio": 1.2}]  # fmt: skip
    r["targets"] = R.check_targets(r)
    return r


def test_cuda_report_fits_in_120_columns(tiny_json, capsys):
    r = _cuda_like(ok(tiny_json))
    R.print_report(r)
    out = capsys.readouterr().out
    assert "What the GPU did per call" in out and "cost model" in out and "targets" in out
    assert max(len(line) for line in out.splitlines()) <= R.WIDTH


def test_tables_print(tiny_json):
    tiny_run = ok(tiny_json)
    text = R.results_table(tiny_run)
    assert "% of limit" in text and "eager" in text and "Conv+BN+ReLU net" in text
    table = R.workloads_table(tiny_run)
    assert "relu(x*a+b)*c + x" in table and "kernels" in table
    row = next(line for line in table.splitlines() if line.startswith("relu(x*a+b)*c + x"))
    assert row.split()[-2] == "5"  # the eager-kernels column is a count: five elementwise kernels


def test_check_targets_reports_a_miss():
    w = {
        "key": "linear_relu_memory",
        "bound_s": 1.0,
        "variants": [
            {"name": "eager", "median_s": 2.0, "speedup_vs_eager": 1.0, "predicted_speedup": 1.0},
            {"name": "fx", "median_s": 1.6, "speedup_vs_eager": 1.25, "predicted_speedup": 1.9},
            {"name": "compile", "median_s": 1.0, "speedup_vs_eager": 2.0, "predicted_speedup": 3.0},
        ],
    }
    result = {"meta": {"device": "cuda", "sizes": "cuda"}, "workloads": [w]}
    t = {e["workload"]: e for e in R.check_targets(result)}
    assert t["linear_relu_memory"]["status"].startswith("missed: 1.25× < 1.30×")
    assert t["linear_relu_memory"]["vs_compile"] == pytest.approx(1.0 / 1.6)
    assert t["conv_bn_relu"]["status"].startswith("not run")
    assert R.check_targets({"meta": {"device": "cpu", "sizes": "cpu"}, "workloads": [w]}) == []


def test_check_targets_judges_gpu_time_and_the_roofline():
    def v(name, wall, gpu):
        return {"name": name, "median_s": wall, "gpu": {"gpu_s": gpu}, "predicted_speedup": None}

    w = {
        "key": "elementwise_chain",
        "bound_s": 30e-6,
        "variants": [v("codegen", 50e-6, 33e-6), v("compile", 60e-6, 35e-6)],
    }
    t = R.check_targets({"meta": {"device": "cuda", "sizes": "cuda"}, "workloads": [w]})
    by = {(e["workload"], e["vs"]): e for e in t}
    assert by[("elementwise_chain+codegen", "roofline")]["status"] == "met"  # 33 µs ≤ 1.15 × 30 µs
    assert by[("elementwise_chain+codegen", "compile")]["status"] == "met"
    w["variants"][0]["gpu"]["gpu_s"] = 40e-6
    t = R.check_targets({"meta": {"device": "cuda", "sizes": "cuda"}, "workloads": [w]})
    assert next(e for e in t if e["vs"] == "roofline")["status"].startswith("missed")


def test_a_failing_workload_is_recorded_and_the_others_still_run(monkeypatch):
    def broken():
        raise RuntimeError("boom")

    real = W.workloads

    def two(config):
        chain = next(w for w in real(config) if w.key == "elementwise_chain")
        return [W.Workload("broken", "broken", "-", broken), chain]

    monkeypatch.setattr(H, "workloads", two)
    config = Config(device="cpu", sizes="tiny", compile=False, threads=1)
    result = H.benchmark(config, B.LESSON, log=lambda msg: None)
    assert [w["key"] for w in result["workloads"]] == ["elementwise_chain"]
    assert result["errors"][0]["workload"] == "broken" and "boom" in result["errors"][0]["error"]
    with pytest.raises(RuntimeError, match="1 workload"), contextlib.redirect_stdout(io.StringIO()):
        B.run(device="cpu", sizes="tiny", compile=False, threads=1)


def test_missing_or_unfinished_phases_are_reported_not_raised(monkeypatch):
    from fusion.compiler import registry

    monkeypatch.delitem(registry._functions, "lower")  # as if fusion.backend were never imported
    with pytest.raises(
        W.VariantUnavailable,
        match=r"phase 9 not available \(Phase 9's lower is not registered: import fusion.backend\)",
    ):
        W.compile_fusion_backend(nn.Identity())

    def todo(*args):
        raise NotImplementedError("TODO(human) Phase 7: merge the siblings. Hint: ...")

    with pytest.raises(W.VariantUnavailable, match="not solved yet"):
        W.call_pass(todo, 7, nn.Identity())


def test_a_variant_whose_phase_is_missing_unsolved_or_broken_is_a_row_with_its_reason(monkeypatch):
    from fusion.compiler import registry

    monkeypatch.delitem(registry._functions, "fuse_horizontal")  # Phase 7's lesson not imported

    def missing(model, inputs, config):
        return W.fuse_horizontal(model)

    def todo(model):
        raise NotImplementedError("TODO(human) Phase 8: generate the kernel. Hint: ...")

    def broken(model, inputs, config):
        raise ValueError("a bug in the pass")

    def same(model, inputs, config):  # stands in for generated kernels: the harness must not time them on CPU
        return model

    specs = (
        W.VariantSpec("fx", "missing", missing),
        W.VariantSpec("codegen", "unsolved", lambda m, i, c: W.call_pass(todo, 8, m), stage="device"),
        W.VariantSpec("broken", "broken", broken),
        W.VariantSpec("generated", "interpreted", same, stage="device", triton=True),
    )
    small = W.Workload("qkv", "QKV", "-", lambda: (models.QKVProjections(8), (torch.randn(2, 8),)), specs)
    big = W.Workload("big", "big", "-", lambda: (nn.ReLU(), (torch.randn(1024, 1024),)), specs[3:])
    monkeypatch.setattr(H, "workloads", lambda config: [small, big])
    config = Config(device="cpu", sizes="tiny", compile=False, threads=1)
    result = H.benchmark(config, B.LESSON, log=lambda msg: None)
    assert result["errors"] == []
    v = {x["name"]: x for x in result["workloads"][0]["variants"]}
    assert "phase 7 not available" in v["fx"]["reason"] and not v["fx"]["available"]
    assert "phase 8 exercise not solved yet" in v["codegen"]["reason"]
    assert v["broken"]["reason"].startswith("failed: ValueError")
    assert v["eager"]["median_s"] > 0
    interpreted = v["generated"]  # small inputs: built and checked, never timed
    assert interpreted["available"] and not interpreted["timed"] and interpreted["median_s"] is None
    assert interpreted["reason"] == W.TRITON_INTERPRETER and interpreted["outputs_match"]
    large = {x["name"]: x for x in result["workloads"][1]["variants"]}["generated"]
    assert not large["available"] and large["reason"].startswith(W.TRITON_INTERPRETER)


def test_only_names_the_workloads_it_knows():
    with pytest.raises(ValueError, match="no workload.*Fix: pick from"):
        H.benchmark(Config(device="cpu", sizes="tiny", only=("no_such",)), B.LESSON, log=lambda msg: None)
    keys = [w.key for w in W.workloads(Config(sizes="tiny", only=("qkv_decode", "resnet50")))]
    assert keys == ["qkv_decode", "resnet50"]


def test_plot_without_matplotlib_says_how(monkeypatch, capsys):
    monkeypatch.setattr(B, "have_matplotlib", lambda: False)
    assert B.main(["--tiny", "--device", "cpu", "--plot", "x.png"]) == 2
    assert "uv run --extra plot" in capsys.readouterr().err


def test_plot_writes_a_png(tiny_json, tmp_path):
    pytest.importorskip("matplotlib")
    from fusion.bench.plot import plot_roofline

    plot_roofline(ok(tiny_json), str(tmp_path / "r.png"))
    assert (tmp_path / "r.png").stat().st_size > 1000


@pytest.mark.skipif(torch.cuda.is_available(), reason="checks the message shown where there is no GPU")
def test_cuda_without_gpu_is_refused(capsys):
    assert B.main(["--device", "cuda", "--tiny"]) == 2
    assert "--device cpu" in capsys.readouterr().err


def test_quick_config_skips_compile():
    assert B.default_config("cpu", quick=True).compile is False
    assert B.default_config("cpu", quick=False, compile=False).compile is False
    assert B.default_config("cpu").sizes == "cpu" and B.default_config("cpu", quick=True).sizes == "cpu-quick"


# ----------------------------------------------------------------------------------------------------------------------
# Layout: the lesson imports the machinery, never the other way round; the GPU script rehearses on CPU


def test_the_harness_never_imports_the_lesson():
    for path in sorted((ROOT / "fusion/bench").glob("*.py")):
        tree = ast.parse(path.read_text())
        for node in ast.walk(tree):
            names = []
            if isinstance(node, ast.Import):
                names = [a.name for a in node.names]
            elif isinstance(node, ast.ImportFrom):
                names = [node.module or ""] + [f"{node.module}.{a.name}" for a in node.names]
            assert not any(n == "fusion.benchmark" or n.startswith("fusion.benchmark.") for n in names), path
    assert not (ROOT / "fusion/bench_report.py").exists()


def test_the_lesson_file_is_short():
    assert len((ROOT / "fusion/benchmark.py").read_text().splitlines()) <= 450


# ----------------------------------------------------------------------------------------------------------------------
# The conv bias on cuDNN and the cuDNN epilogue's costs (the pass itself: tests/test_conv_bn_fusion.py)


def test_conv_bias_is_a_separate_pass_on_cudnn(monkeypatch):
    model = models.ConvBNNet(3, 4).eval()
    (x,) = models.conv_inputs(2, 3, 8)
    gm = trace_module(model)
    plain = {c.name: c for c in C.graph_costs(gm, x)}
    assert all(c.extra_passes == 0 for c in plain.values())  # CPU: no cuDNN, the bias rides in the conv kernel
    monkeypatch.setattr(C, "conv_backend", lambda conv, node, device: "Cudnn")
    costs = {c.name: c for c in C.graph_costs(gm, x)}
    out = 4 * 2 * 4 * 8 * 8  # bytes of one (B, width, H, W) float32 output
    assert costs["conv1"].kernel_path == CUDNN_CONV_THEN_BIAS and costs["conv1"].extra_passes == 1
    assert costs["conv1"].bytes_written == 2 * out and costs["conv1"].bytes_read == plain["conv1"].bytes_read + out
    assert costs["stem_0"].extra_passes == 0 and costs["conv2"].extra_passes == 0  # no bias: nothing to add
    assert B.kernels_bound(list(costs.values()), PEAKS) > B.kernels_bound(list(plain.values()), PEAKS)


def test_cudnn_epilogue_unavailable_says_why():
    assert "CUDA" in cudnn_epilogue_unavailable("cpu", torch.float32)
    with pytest.raises(W.VariantUnavailable, match="CUDA"):
        W.cudnn_epilogue_after_fold(nn.Identity(), None, Config(device="cpu"))


def test_flops_of_the_fused_conv_module():
    conv = nn.Conv2d(3, 4, 3, padding=1)
    x = torch.randn(2, 3, 5, 5)
    out = 2 * 4 * 5 * 5

    class Net(nn.Module):
        def __init__(self):
            super().__init__()
            self.conv = conv

        def forward(self, x):
            return torch.relu(self.conv(x))

    gm = fuse_conv_relu_epilogue(Net())
    (cost,) = C.graph_costs(gm, x)
    assert cost.flops == 2 * out * 3 * 9 + out + out  # multiply-adds, bias, ReLU
    assert cost.bytes_written == 2 * 4 * out and cost.extra_passes == 1  # CPU: the unfused fallback, conv then ReLU


# ----------------------------------------------------------------------------------------------------------------------
# The GPU breakdown and the verdicts that read it (hand-made results: the profiler itself needs a GPU)


def test_event_device_time_reads_either_spelling():
    class Range:
        def elapsed_us(self):
            return 7.0

    class New:
        time_range = Range()

    class Old:
        time_range = None
        cuda_time_total = 3.0

    assert P.event_device_us(New()) == 7.0 and P.event_device_us(Old()) == 3.0
    assert P.event_device_us(object()) == 0.0


def _row(name, median, gpu_s, speedup, predicted, overhead=None, gpu_speedup=None):
    return {
        "name": name,
        "label": name,
        "median_s": median,
        "iqr_s": 0.0,
        "speedup_vs_eager": speedup,
        "predicted_speedup": predicted,
        "pct_of_limit": 50.0,
        "gpu": {"gpu_s": gpu_s, "kernels_per_call": 1, "top": []} if gpu_s else None,
        "overhead_s": overhead,
        "gpu_speedup": gpu_speedup,
    }


def test_verdict_calls_an_overhead_bound_row_what_it_is():
    result = {"meta": {"device": "cuda"}}
    # the H100's memory-bound Linear+ReLU: eager 31.7 µs wall but ~18 µs of kernels; fused 26.0 µs, ~16 µs
    eager = _row("eager", 31.7e-6, 18e-6, 1.0, 1.0, overhead=13.7e-6, gpu_speedup=1.0)
    fx_row = _row("fx", 26.0e-6, 16e-6, 1.22, 1.03, overhead=10e-6, gpu_speedup=18 / 16)
    w = {"variants": [eager, fx_row]}
    text = R.verdict(result, w, fx_row)
    assert text.startswith("overhead-bound") and "holds" not in text
    assert "1.12×" in text and "agrees" in text  # the kernels alone do what the bytes predict
    assert R.overhead_bound(eager) and R.overhead_bound(fx_row)
    # GPU-bound rows are judged by the roofline, with the tighter tolerance
    g_eager = _row("eager", 100e-6, 99e-6, 1.0, 1.0)
    assert R.verdict(result, {"variants": [g_eager]}, _row("fx", 80e-6, 79e-6, 1.25, 1.2)) == "holds"
    far = R.verdict(result, {"variants": [g_eager]}, _row("fx", 80e-6, 79e-6, 1.25, 1.05))
    assert far.startswith("does not hold")  # 19% apart: beyond HOLDS_WITHIN


def test_check_targets_judges_the_epilogue_variant_too():
    w = {
        "key": "conv_bn_relu",
        "variants": [
            {"name": "eager", "median_s": 2.0, "speedup_vs_eager": 1.0, "predicted_speedup": 1.0},
            {"name": "fx", "median_s": 2.0, "speedup_vs_eager": 1.0, "predicted_speedup": 1.05},
            {"name": "fx_epilogue", "median_s": 1.0, "speedup_vs_eager": 2.0, "predicted_speedup": 3.0},
        ],
    }
    result = {"meta": {"device": "cuda", "sizes": "cuda"}, "workloads": [w]}
    t = {e["workload"]: e for e in R.check_targets(result)}
    assert t["conv_bn_relu"]["status"].startswith("missed")
    assert t["conv_bn_relu+fx_epilogue"]["status"] == "met"


def test_fused_linear_relu_hot_path_keeps_a_parametrized_weight():
    """FusedLinearReLU.forward reads its Parameters from a dict (Phase 4 trimmed its Python overhead): a weight
    parametrized after fusing is not in that dict, and must still be the one used."""
    manual = pytest.importorskip("fusion.manual_fusion")
    from torch.nn.utils import parametrize

    class Double(nn.Module):
        def forward(self, w):
            return 2 * w

    linear = nn.Linear(5, 3)
    fused = manual.FusedLinearReLU(nn.Linear(5, 3))
    fused.load_state_dict(linear.state_dict())
    parametrize.register_parametrization(fused, "weight", Double())
    x = torch.randn(4, 5)
    with torch.no_grad():
        want = torch.relu(nn.functional.linear(x, 2 * linear.weight, linear.bias))
        torch.testing.assert_close(fused(x), want)


# ----------------------------------------------------------------------------------------------------------------------
# The model suite (--suite): Inductor's accuracy rule, rows per model and backend, failures and missing packages


def _noisy(fp64: torch.Tensor, scale: float, seed: int, dtype=torch.float32) -> torch.Tensor:
    g = torch.Generator().manual_seed(seed)
    return (fp64 + scale * torch.randn(fp64.shape, generator=g, dtype=torch.float64)).to(dtype)


def test_accuracy_rule_rmse_within_a_multiple_of_eagers():
    from fusion.bench import accuracy as A

    fp64 = torch.randn(4000, dtype=torch.float64, generator=torch.Generator().manual_seed(0))
    eager = _noisy(fp64, 0.01, 1)  # eager's own error: RMSE ~0.01 against float64, far above tol 1e-4
    for k, ok in ((1.0, True), (1.9, True), (2.1, False), (5.0, False)):  # float32, 4000 elements: multiplier 2
        res = _noisy(fp64, 0.01 * k, 2)
        a = A.accuracy([eager], [res], [fp64], tol=1e-4)
        assert a.ok is ok, (k, a)
        assert a.multiplier == 2.0 and a.res_rmse == pytest.approx(A.rmse(fp64, res))
        assert a.eager_rmse == pytest.approx(A.rmse(fp64, eager)) and (a.reason == "") is ok
    assert A.accuracy([eager], [eager.clone()], [fp64], tol=1e-4).ok  # allclose decides first
    # bfloat16 outputs: multiplier 3
    eb = _noisy(fp64, 0.01, 1, torch.bfloat16)
    assert A.accuracy([eb], [_noisy(fp64, 0.025, 2, torch.bfloat16)], [fp64], tol=1e-4).ok
    assert not A.accuracy([eb], [_noisy(fp64, 0.04, 2, torch.bfloat16)], [fp64], tol=1e-4).ok


@pytest.mark.parametrize(
    "shape,dtype,tol,larger,want",
    [
        ((4000,), torch.float32, 1e-4, False, 2.0),
        ((4000,), torch.bfloat16, 1e-2, False, 3.0),
        ((999,), torch.float32, 1e-4, False, 3.0),  # small tensors: noise dominates
        ((8, 500, 1, 1), torch.float32, 1e-4, False, 3.0),  # 1x1 maps
        ((4000,), torch.float32, 2e-2, False, 3.0),  # a large tolerance
        ((10,), torch.float32, 1e-4, True, 10.0),  # use_larger_multiplier_for_smaller_tensor
        ((999,), torch.float32, 1e-4, True, 8.0),
        ((4000,), torch.float32, 1e-4, True, 2.0),
    ],
)
def test_accuracy_multiplier_is_inductors(shape, dtype, tol, larger, want):
    from fusion.bench import accuracy as A

    t = torch.zeros(shape, dtype=dtype)
    assert A.multiplier_for(t, t.double(), tol, larger) == want


def test_accuracy_rule_edge_cases():
    from fusion.bench import accuracy as A

    x = torch.tensor([1.0, float("nan"), 3.0])
    assert A.accuracy([x], [x.clone()], [x.double()], tol=1e-4).ok  # NaN where eager has NaN
    finite = torch.tensor([1.0, 2.0, 3.0])
    assert not A.accuracy([finite], [x], [finite.double()], tol=1e-4).ok  # a NaN eager does not have
    assert not A.accuracy([x], [x[:2]], [x.double()], tol=1e-4).ok  # shape
    assert not A.accuracy([x], [x.double()], [x.double()], tol=1e-4).ok  # dtype
    assert not A.accuracy([x], [x, x], [x.double()], tol=1e-4).ok  # number of outputs
    i = torch.tensor([1, 2, 3])
    assert A.accuracy([i], [i.clone()], [i], tol=1e-4).ok and not A.accuracy([i], [i + 1], [i], tol=1e-4).ok
    y = torch.ones(3)
    a = A.accuracy([y], [y + 1], None, tol=1e-4)  # not allclose, no float64 reference: fail, saying why
    assert not a.ok and "float64" in a.reason
    a = A.accuracy([y, y], [y, y + 1], [y.double(), y.double()], tol=1e-4)
    assert not a.ok and a.reason.startswith("output 1")


@pytest.mark.parametrize("name", ["swin_t", "maxvit_t", "densenet121", "t5_encoder", "mistral", "opt"])
def test_the_suite_s_attention_and_concatenation_families_build_tiny_and_run(name):
    """The families the suite widened to (shifted-window, block/grid, relative-position, sliding-window GQA and
    learned-position attention; dense concatenation) build at their tiny configs and give a finite, non-zero output
    (the GPU suite compiles them at full size and checks accuracy)."""
    from fusion.bench import suite as S
    from fusion.bench.counting import flat_tensors

    if S.MODELS[name].package == "transformers":
        pytest.importorskip("transformers")
    model, inputs = S.MODELS[name].build("tiny")
    with torch.no_grad():
        out = [t for t in flat_tensors(model(*inputs)) if t.is_floating_point()]
    assert out and all(t.isfinite().all() for t in out) and any(t.abs().max() > 0 for t in out)


def test_suite_records_a_backend_that_raises(monkeypatch):
    from fusion.bench import suite as S

    def broken(backend, model):
        if backend == "eager":
            return model
        return lambda *a: (_ for _ in ()).throw(RuntimeError("no kernel for aten.frobnicate\nsecond line"))

    monkeypatch.setattr(S, "compile_with", broken)
    row = S.run_model(S.MODELS["vit_b_16"], ["eager", "fusion"], S.SuiteConfig(rounds=0), B.LESSON, log=lambda m: None)
    assert row["backends"]["eager"]["status"] == "pass"
    r = row["backends"]["fusion"]
    assert r["status"] == "fail_to_run" and r["reason"] == "RuntimeError: no kernel for aten.frobnicate"
    assert S.summarize([row], ["eager", "fusion"])["fusion"]["passed"] == 0


def test_suite_flags_a_wrong_answer(monkeypatch):
    from fusion.bench import suite as S

    model, inputs = S.MODELS["vit_b_16"].build("tiny")
    assert model(*inputs).abs().max() > 0  # its head is randomised: an all-zero output would make any answer right

    def wrong(backend, model):
        return model if backend == "eager" else (lambda *a: model(*a) * 1.5 + 0.1)

    monkeypatch.setattr(S, "compile_with", wrong)
    row = S.run_model(S.MODELS["vit_b_16"], ["eager", "fusion"], S.SuiteConfig(rounds=0), B.LESSON, log=print)
    r = row["backends"]["fusion"]
    assert r["status"] == "fail_accuracy" and r["accuracy"] == "fail" and "RMSE" in r["reason"]


def test_suite_skips_a_model_whose_package_is_missing(monkeypatch):
    import importlib.util

    from fusion.bench import suite as S

    real = importlib.util.find_spec
    monkeypatch.setattr(
        importlib.util, "find_spec", lambda name, *a: None if name == "transformers" else real(name, *a)
    )
    row = S.run_model(S.MODELS["bert"], ["eager", "fusion"], S.SuiteConfig(rounds=0), B.LESSON)
    assert row["status"] == "skipped" and "transformers is not installed" in row["reason"] and "Fix" in row["reason"]
    assert S.summarize([row], ["eager", "fusion"])["fusion"]["models"] == 0
    assert S.row_lines(row)[0].split()[:2] == ["bert", "skipped:"]


def test_suite_summary_geomeans_over_passing_rows():
    from fusion.bench import suite as S

    def row(model, fusion):
        return {"model": model, "status": "ok", "backends": {"eager": {"status": "pass"}, "fusion": fusion}}

    rows = [
        row("a", {"status": "pass", "speedup_vs_eager": 2.0, "speedup_vs_inductor": 0.5, "first_call_s": 1.0}),
        row("b", {"status": "pass", "speedup_vs_eager": 0.5, "speedup_vs_inductor": 2.0, "first_call_s": 3.0}),
        row("c", {"status": "fail_accuracy", "speedup_vs_eager": 100.0, "first_call_s": 9.0}),
        {"model": "d", "status": "skipped", "reason": "x", "backends": {}},
    ]
    s = S.summarize(rows, ["eager", "fusion"])["fusion"]
    assert (s["models"], s["passed"]) == (3, 2) and s["pass_rate"] == pytest.approx(2 / 3)
    assert s["geomean_vs_eager"] == pytest.approx(1.0) and s["geomean_vs_inductor"] == pytest.approx(1.0)
    assert s["mean_compile_s"] == pytest.approx(2.0) and s["geomean_vs_reduce_overhead"] is None
    assert "fusion: pass 2/3 (67%), geomean 1.00× eager, 1.00× inductor" in S.summary_lines({"fusion": s})[0]


def test_suite_cli_and_unknown_names(tmp_path, capsys):
    from fusion.bench import suite as S

    path = tmp_path / "suite.json"
    assert B.main(["--suite", "--device", "cpu", "--models", "gpt2", "--backends", "eager", "--json", str(path)]) == 0
    r = json.loads(path.read_text())
    assert r["models"][0]["model"] == "gpt2" and r["models"][0]["backends"]["eager"]["status"] == "pass"
    assert "model suite on cpu" in capsys.readouterr().out
    with pytest.raises(ValueError, match="Fix: models"):
        S.run_suite(B.LESSON, models=["resnet7"], device="cpu")
    with pytest.raises(ValueError, match="Fix: models"):
        S.run_suite(B.LESSON, backends=["tvm"], device="cpu")


def test_a_fusion_ablation_turns_one_pass_off(monkeypatch):
    """``fusion+no-<pass>``: the backend with that pass off (``fusion+no-conv1x1``: options {"conv1x1": False}),
    ``fusion+with-<pass>`` with an opt-in pass on, both accepted by the suite's name check;
    ``fusion+fold+cudagraphs`` still turns both on, ``fusion+cudagraphs+with-depthwise`` a pass that CUDA graphs
    turn off by default."""
    from fusion.bench import suite as S

    B.register_lessons()  # backend="fusion" is Phase 9's (also when this test runs alone)
    seen = []
    monkeypatch.setattr(S.torch, "compile", lambda model, **kw: seen.append(kw.get("options")) or model)
    S.compile_with("fusion+no-conv1x1", nn.Identity())
    S.compile_with("fusion+with-conv1x1_forward", nn.Identity())
    S.compile_with("fusion+fold+cudagraphs", nn.Identity())
    S.compile_with("fusion", nn.Identity())
    S.compile_with("fusion+cudagraphs+with-depthwise", nn.Identity())
    assert seen == [{"conv1x1": False}, {"conv1x1_forward": True}, {"fold_bn": True, "cudagraphs": True}, None,
                    {"cudagraphs": True, "depthwise": True}]  # fmt: skip
    assert S.is_ablation("fusion+cudagraphs") and not S.is_ablation("fusion") and not S.is_ablation("fusion+bogus")
    with pytest.raises(ValueError, match="fusion\\+no-<pass>"):
        S.run_suite(B.LESSON, models=["gpt2"], backends=["fusion+conv1x1"], device="cpu")
    with pytest.raises(ValueError, match="fusion\\+no-<pass>"):
        S.run_suite(B.LESSON, models=["gpt2"], backends=["fusion+cudagraphs+conv1x1"], device="cpu")


def test_suite_table_joins_a_model_measured_in_two_files(tmp_path):
    """scripts/suite_table.py: a model in two files is one row, the first file's backends kept, the ones it lacks
    joined from the later file with their own ratios and the row marked †; a model in one file is unmarked."""

    def row(model, **speedups):
        backends = {"eager": {"median_s": 0.004, "speedup_vs_eager": 1.0}}
        backends |= {k.replace("_", "+"): {"median_s": 0.004 / v, "speedup_vs_eager": v} for k, v in speedups.items()}
        return {"model": model, "status": "ok", "backends": backends}

    new, old = tmp_path / "new.json", tmp_path / "old.json"
    new.write_text(
        json.dumps({"models": [row("resnet50", fusion=2.0, inductor=1.5), row("bert", fusion_cudagraphs=3.0)]})
    )
    old.write_text(json.dumps({"models": [row("resnet50", fusion=9.0), row("bert", fusion=1.25, inductor=1.1)]}))
    proc = subprocess.run([sys.executable, str(ROOT / "scripts/suite_table.py"), str(new), str(old)],
                          capture_output=True, text=True, timeout=60, check=True)  # fmt: skip
    lines = {ln.split("|")[1].strip(): ln for ln in proc.stdout.splitlines() if ln.startswith("| ")}
    assert "2.00×" in lines["resnet50"] and "9.00×" not in lines["resnet50"]  # the first file wins
    assert "bert †" in lines and "1.25×" in lines["bert †"] and "3.00×" in lines["bert †"]
    assert "(2 models)" in proc.stdout


def test_gpu_suite_gives_each_model_process_cold_caches_of_its_own(tmp_path, monkeypatch):
    """Every compiler's on-disk cache (Inductor's, Triton's, ours) starts empty in each model's process: a first call
    is a cold compile, never a hit left by an earlier model or an earlier call on the same host."""
    spec = importlib.util.spec_from_file_location("gpu_suite", ROOT / "scripts/gpu_suite.py")
    G = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(G)
    envs = []

    class Proc:
        pid = 0

        def __init__(self, cmd, env=None, **kw):
            envs.append(env or {})

        def wait(self, timeout=None):
            return 1

    monkeypatch.setattr(G.subprocess, "Popen", Proc)
    monkeypatch.setenv("TORCHINDUCTOR_CACHE_DIR", str(tmp_path / "warm"))
    for model in ("gpt2", "bert"):
        G.run_one(model, ["eager", "inductor"], True, 10, tmp_path)
    assert set(G.CACHES) == {"TORCHINDUCTOR_CACHE_DIR", "TRITON_CACHE_DIR", "FUSION_CACHE_DIR"}
    for var in G.CACHES:
        dirs = [env.get(var) for env in envs]
        assert all(dirs) and len(set(dirs)) == 2 and str(tmp_path / "warm") not in dirs, (var, dirs)
        assert not any(os.path.exists(d) and os.listdir(d) for d in dirs)


# ----------------------------------------------------------------------------------------------------------------------
# The GPU scripts rehearsed on the CPU: scripts/gpu_run.sh (every step it takes on the lent GPU, at tiny sizes) and
# scripts/gpu_suite.py (tiny shapes, one process per model). Here, in a file of many tests, rather than in files of
# one test each: pytest-xdist's --dist loadfile hands out files with the fewest tests last, and queues the next file
# on a worker while its current one still runs, so two such files ended the test step one after the other on one
# worker (20 and 25 s) while the other worker idled (2026-11-28: the workers ended 25 s apart).


@pytest.mark.skipif(os.name != "posix", reason="bash script")
def test_gpu_run_script_dry_run(tmp_path):
    env = dict(os.environ, GPU_RUN_DRY="1", GPU_RUN_GROUPS="core", OUT=str(tmp_path), PYTHON=sys.executable)
    env["PYTHONPATH"] = str(ROOT)
    env.pop("CUDA_VISIBLE_DEVICES", None)
    proc = subprocess.run(
        ["bash", str(ROOT / "scripts/gpu_run.sh")], env=env, capture_output=True, text=True, timeout=600
    )
    assert proc.returncode == 0, proc.stdout[-3000:] + proc.stderr[-3000:]
    r = json.loads((tmp_path / "bench_core.json").read_text())
    assert r["complete"] and r["meta"]["sizes"] == "tiny" and r["errors"] == []
    assert "=== summary" in proc.stdout and "exit codes: core=0" in proc.stdout


def test_gpu_suite_script_dry_run(tmp_path):
    """scripts/gpu_suite.py on CPU (tiny shapes): a row per model, a model that fails costs only its own row."""
    proc = subprocess.run(
        [sys.executable, str(ROOT / "scripts/gpu_suite.py"), "--dry-run", "--models", "gpt2,nosuch"]
        + ["--backends", "eager", "--out", str(tmp_path)],
        capture_output=True,
        text=True,
        timeout=600,
    )
    assert proc.returncode == 0, proc.stdout[-3000:] + proc.stderr[-3000:]
    r = json.loads((tmp_path / "suite.json").read_text())
    rows = {row["model"]: row for row in r["models"]}
    if "TODO(human)" in rows["gpt2"]["reason"]:  # a practice workspace: the phase it waits for, named by its TODO
        raise NotImplementedError(rows["gpt2"]["reason"][rows["gpt2"]["reason"].index("TODO(human)") :])
    assert rows["gpt2"]["status"] in ("ok", "skipped") and rows["nosuch"]["status"] == "crashed"
    assert "unknown model" in rows["nosuch"]["reason"] and "summary:" in proc.stdout
