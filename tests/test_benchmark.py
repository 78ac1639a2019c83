"""Phase 4: the benchmark harness — counting, roofline arithmetic, interleaved timing, JSON. Never timings."""

import importlib.util
import json

import pytest
import torch
import torch.nn as nn
from hypothesis import given
from hypothesis import strategies as st

from fusion import bench_report as R
from fusion import benchmark as B
from fusion import models
from fusion.common import is_todo, trace_module

pytestmark = pytest.mark.phase4

PEAKS = B.Peaks(flops_per_s=1e12, bytes_per_s=1e11)  # ridge: 10 FLOP/byte


# ----------------------------------------------------------------------------------------------------------------------
# Roofline arithmetic on hand-computed cases


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


@given(flops=st.integers(1, 10**13), nbytes=st.integers(1, 10**12))
def test_roofline_is_the_larger_ceiling(flops, nbytes):
    r = B.roofline(flops, nbytes, PEAKS)
    assert r.bound_s == pytest.approx(max(flops / 1e12, nbytes / 1e11))
    assert r.intensity == pytest.approx(flops / nbytes)
    assert r.bound_by == ("compute" if flops / nbytes >= PEAKS.ridge else "memory")


def test_row_metrics_hand_computed():
    w = B.Roofline(flops=3_000_000, nbytes=8_000_000, intensity=0.375, bound_s=80e-6, bound_by="memory")
    m = B.row_metrics(200e-6, 500e-6, w, eager_kernels_s=240e-6, variant_kernels_s=80e-6)
    assert m.speedup_vs_eager == pytest.approx(2.5)  # 500 / 200
    assert m.pct_of_limit == pytest.approx(40.0)  # 80 / 200
    assert m.gbps == pytest.approx(40.0)  # 8e6 B / 200e-6 s = 4e10 B/s
    assert m.tflops == pytest.approx(0.015)  # 3e6 / 200e-6 = 1.5e10
    assert m.predicted_speedup == pytest.approx(3.0)  # 240 / 80


def test_row_metrics_eager_row_and_unknown_prediction():
    w = B.Roofline(flops=1, nbytes=1000, intensity=1e-3, bound_s=1e-8, bound_by="memory")
    m = B.row_metrics(1e-6, 1e-6, w, eager_kernels_s=5e-8, variant_kernels_s=None)
    assert m.speedup_vs_eager == 1.0
    assert m.pct_of_limit == pytest.approx(1.0)
    assert m.predicted_speedup is None


def test_kernels_bound_adds_one_roofline_per_node():
    costs = [
        B.NodeCost("mm", flops=2_000_000_000, bytes_read=50_000_000, bytes_written=50_000_000, intermediate=True),
        B.NodeCost("relu", flops=1000, bytes_read=4_000_000, bytes_written=4_000_000, intermediate=False),
    ]
    # mm: max(2 ms, 1 ms) = 2 ms; relu: max(1 ns, 80 µs) = 80 µs
    assert B.kernels_bound(costs, PEAKS) == pytest.approx(2e-3 + 80e-6)
    # the same matmul with relu_ as an extra in-place pass over its 50 MB output: 2 ms + 100 MB / 1e11 B/s
    fused = B.NodeCost("mm_relu_", 2_000_000_000, 100_000_000, 100_000_000, False, "addmm+relu_", extra_passes=1)
    assert fused.extra_pass_bytes == 100_000_000
    assert B.kernels_bound([fused], PEAKS) == pytest.approx(2e-3 + 1e-3)


# ----------------------------------------------------------------------------------------------------------------------
# FLOP and byte counts from the graph


@given(m=st.integers(1, 9), k=st.integers(1, 9), n=st.integers(1, 9))
def test_costs_of_linear_relu(m, k, n):
    model = nn.Sequential(nn.Linear(k, n), nn.ReLU())
    x = torch.randn(m, k)
    costs = {c.name: c for c in B.graph_costs(trace_module(model), x)}
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
    assert B.min_bytes(model, (x,), y) == 4 * (m * k + k * n + n + m * n)


@given(rows=st.integers(1, 6), d=st.integers(1, 9))
def test_costs_of_elementwise_chain(rows, d):
    model = models.ElementwiseChain(d)
    (x,) = models.elementwise_inputs(rows, d)
    costs = B.graph_costs(trace_module(model), x)
    t, p = 4 * rows * d, 4 * d  # bytes of one (rows, d) tensor and of one per-feature parameter
    # mul(x, a), add(., b), relu, mul(., c), add(., x): five kernels, one FLOP per element each
    assert [c.flops for c in costs] == [rows * d] * 5
    assert [c.bytes_read for c in costs] == [t + p, t + p, t, t + p, 2 * t]
    assert [c.bytes_written for c in costs] == [t] * 5
    assert [c.intermediate for c in costs] == [True] * 4 + [False]
    with torch.no_grad():
        y = model(x)
    assert B.min_bytes(model, (x,), y) == 2 * t + 3 * p  # read x, a, b, c once; write y once


def test_costs_skip_views_and_count_conv():
    model = models.ConvBNNet(3, 4).eval()
    (x,) = models.conv_inputs(2, 3, 8)
    costs = {c.name: c for c in B.graph_costs(trace_module(model), x)}
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
        B.NodeCost("a", 0, 10, 100, intermediate=True),  # written, read back by b: 100
        B.NodeCost("b", 0, 100, 2 * 40, intermediate=False, kernel_path="x+relu_", extra_passes=1),  # 40 read back
        B.NodeCost("c", 0, 100, 7, intermediate=False),  # a graph output: 0
    ]
    assert B.intermediate_bytes(costs) == 140


def test_fused_linear_relu_declares_its_kernel_path():
    manual = pytest.importorskip("fusion.manual_fusion")
    model = nn.Sequential(nn.Linear(6, 5), nn.ReLU())
    x = torch.randn(3, 6)
    gm = manual.fuse_linear_relu(model)
    (cost,) = B.graph_costs(gm, x)
    path = manual.FusedLinearReLU(model[0]).kernel_path(x)
    assert cost.kernel_path == path
    if path == "addmm+relu_":  # CPU: addmm writes the output, relu_ reads and rewrites it
        assert cost.extra_passes == 1 and cost.bytes_written == 2 * 4 * 3 * 5
        assert B.intermediate_bytes([cost]) == 4 * 3 * 5


@given(rows=st.integers(1, 6), d=st.integers(1, 9))
def test_hand_fused_chain_is_exact_and_has_three_kernels(rows, d):
    chain = models.ElementwiseChain(d).double()
    (x,) = models.elementwise_inputs(rows, d)
    x = x.double()
    fused = B.hand_fuse_chain(chain)
    with torch.no_grad():
        torch.testing.assert_close(fused(x), chain(x))
    costs = B.graph_costs(trace_module(fused), x)
    assert len(costs) == 3
    eager_inter = sum(c.bytes_written for c in B.graph_costs(trace_module(chain), x) if c.intermediate)
    assert eager_inter - sum(c.bytes_written for c in costs if c.intermediate) == 2 * 8 * rows * d
    assert fused.a is not chain.a  # a copy: the model it was made from is not shared or changed


# ----------------------------------------------------------------------------------------------------------------------
# Timing harness (its mechanics, never its numbers)


def test_time_interleaved_round_robin():
    calls = []
    fns = {"a": lambda: calls.append("a"), "b": lambda: calls.append("b"), "c": lambda: calls.append("c")}
    times = B.time_interleaved(fns, rounds=3, min_run_time=1e-4, threads=1)
    assert set(times) == {"a", "b", "c"}
    assert all(len(t) >= 3 and all(s > 0 for s in t) for t in times.values())  # at least one block per round
    runs = [calls[0]] + [c for prev, c in zip(calls, calls[1:], strict=False) if c != prev]  # a a b b c ... -> a b c
    assert runs == ["a", "b", "c"] * 3  # interleaved round by round, in the given order


def test_summarize_median_and_iqr():
    assert B.summarize([5.0, 1.0, 3.0, 2.0, 4.0]) == pytest.approx((3.0, 2.0))
    assert B.summarize([7.0]) == (7.0, 0.0)


# ----------------------------------------------------------------------------------------------------------------------
# End to end on toy shapes: the CLI, the table, the JSON


@pytest.fixture(scope="module")
def tiny_json(tmp_path_factory):
    """(exit status, the JSON it wrote or None, the TODO(human) error if a learner region stopped it) of one CLI run
    on toy shapes; the tests assert on it."""
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

    with pytest.MonkeyPatch.context() as mp:
        mp.setattr(B, "run_lesson", keep_todo)
        rc = B.main(["--device", "cpu", "--tiny", "--no-compile", "--threads", "1", "--json", str(path)])
    if not path.exists():
        return rc, None, todo
    with open(path) as f:
        return rc, json.load(f), todo


def ok(tiny_json) -> dict:
    """The run's JSON, asserted in the test itself (so an unsolved region is a failure, not a fixture error)."""
    rc, result, todo = tiny_json
    if todo is not None:
        raise todo
    assert rc == 0 and result is not None, "python -m fusion.benchmark --tiny failed: see the captured output"
    return result


def _phase_written(module: str) -> bool:
    return importlib.util.find_spec(f"fusion.{module}") is not None


def test_tiny_run_json_schema(tiny_json):
    r = ok(tiny_json)
    assert r["schema"] == B.SCHEMA_VERSION and r["complete"] is True
    meta = r["meta"]
    for key in ("device", "device_name", "torch_version", "threads", "seed", "date", "dtype", "sizes", "compile"):
        assert key in meta
    assert meta["device"] == "cpu" and meta["threads"] == 1 and meta["torch_version"] == torch.__version__
    assert meta["sizes"] == "tiny" and meta["compile"] is False and meta["dtype"] == "float32"
    assert r["peaks"]["flops_per_s"] > 0 and r["peaks"]["bytes_per_s"] > 0 and r["peaks"]["copy_times_s"]
    assert [w["key"] for w in r["workloads"]] == [
        "linear_relu_memory",
        "linear_relu_compute",
        "matmul_add_relu",
        "conv_bn_relu",
        "elementwise_chain",
    ]
    assert r["targets"] == [] and r["errors"] == []  # the H100 targets are checked on CUDA only


def test_tiny_run_every_variant(tiny_json):
    tiny_run = ok(tiny_json)
    phase_of = {"linear_relu_memory": "manual_fusion", "linear_relu_compute": "manual_fusion"}
    phase_of |= {"matmul_add_relu": "pattern_rewriter", "conv_bn_relu": "conv_bn_fusion"}
    for w in tiny_run["workloads"]:
        assert w["flops"] > 0 and w["min_bytes"] > 0 and w["bound_s"] > 0 and w["eager_intermediate_bytes"] > 0
        variants = {v["name"]: v for v in w["variants"]}
        extras = ["fx_epilogue"] if w["key"] == "conv_bn_relu" else []
        assert list(variants) == ["eager", "fx", *extras]  # --no-compile: no compile variant
        for name in extras:  # the cuDNN epilogue needs CUDA: on CPU the row is there and says why it is skipped
            assert not variants[name]["available"]
            # ... because of CUDA, or (in a practice workspace with Phase 5 unsolved) because the folded model is missing
            assert "CUDA" in variants[name]["reason"] or not variants["fx"]["available"]
            assert variants[name]["median_s"] is None
        eager, fused = variants["eager"], variants["fx"]
        assert eager["speedup_vs_eager"] == 1.0 and eager["bytes_removed"] == 0 and eager["outputs_match"]
        assert eager["predicted_speedup"] == pytest.approx(1.0)
        written = w["key"] not in phase_of or _phase_written(phase_of[w["key"]])
        if not fused["available"]:  # a phase not written yet, or (in a practice workspace) not solved yet
            assert "not available" in fused["reason"] if not written else "not solved yet" in fused["reason"]
            continue
        assert written
        assert fused["outputs_match"], (w["key"], fused["max_rel_diff"])
        if "addmm+relu_" in fused["kernel_paths"]:  # phase 2 on CPU: still a second pass (relu_ in place)
            assert fused["bytes_removed"] == 0 and fused["predicted_speedup"] == pytest.approx(1.0, rel=0.1)
        else:
            assert fused["bytes_removed"] > 0, w["key"]  # every truly fused variant removes an intermediate
            assert fused["predicted_speedup"] > 1.0
        for v in (eager, fused):
            assert len(v["times_s"]) >= 2 and v["median_s"] > 0 and v["iqr_s"] >= 0
            assert v["median_s"] == pytest.approx(B.summarize(v["times_s"])[0])
            assert v["speedup_vs_eager"] == pytest.approx(eager["median_s"] / v["median_s"])
            assert v["pct_of_limit"] == pytest.approx(100 * w["bound_s"] / v["median_s"])
            assert v["peak_memory_bytes"] is None  # CUDA only


def test_tables_print(tiny_json):
    tiny_run = ok(tiny_json)
    text = R.results_table(tiny_run)
    assert "% of limit" in text and "eager" in text and "Conv+BN+ReLU net" in text
    assert "relu(x*a+b)*c + x" in R.workloads_table(tiny_run)


def test_check_targets_reports_a_miss():
    w = {
        "key": "linear_relu_memory",
        "variants": [
            {"name": "eager", "median_s": 2.0, "speedup_vs_eager": 1.0, "predicted_speedup": 1.0},
            {"name": "fx", "median_s": 1.6, "speedup_vs_eager": 1.25, "predicted_speedup": 1.9},
            {"name": "compile", "median_s": 1.0, "speedup_vs_eager": 2.0, "predicted_speedup": 3.0},
        ],
    }
    result = {"meta": {"device": "cuda", "sizes": "cuda"}, "workloads": [w]}
    t = {e["workload"]: e for e in B.check_targets(result)}
    assert t["linear_relu_memory"]["status"].startswith("missed: 1.25× < 1.3× (short by 0.05×)")
    assert "slower" in t["linear_relu_memory"]["status"]
    assert t["conv_bn_relu"]["status"].startswith("not run")
    assert B.check_targets({"meta": {"device": "cpu", "sizes": "cpu"}, "workloads": [w]}) == []


def test_a_failing_workload_is_recorded_and_the_others_still_run(monkeypatch):
    def broken():
        raise RuntimeError("boom")

    real = B.workloads

    def two(config):
        chain = next(w for w in real(config) if w.key == "elementwise_chain")
        return [B.Workload("broken", "broken", "-", broken, B.hand_fuse_chain, "-"), chain]

    monkeypatch.setattr(B, "workloads", two)
    config = B.Config(device="cpu", sizes="tiny", compile=False, threads=1)
    result = B.benchmark(config, log=lambda msg: None)
    assert [w["key"] for w in result["workloads"]] == ["elementwise_chain"]
    assert result["errors"][0]["workload"] == "broken" and "boom" in result["errors"][0]["error"]
    with pytest.raises(RuntimeError, match="1 workload"):
        B.run(device="cpu", sizes="tiny", compile=False, threads=1)


def test_missing_phase_is_reported_not_raised():
    with pytest.raises(B.VariantUnavailable, match="phase 9 not available"):
        B.load_phase("no_such_phase_module", 9)


def test_plot_without_matplotlib_says_how(monkeypatch, capsys):
    monkeypatch.setattr(B, "have_matplotlib", lambda: False)
    assert B.main(["--tiny", "--device", "cpu", "--plot", "x.png"]) == 2
    assert "uv run --extra plot" in capsys.readouterr().err


def test_plot_writes_a_png(tiny_json, tmp_path):
    pytest.importorskip("matplotlib")
    tiny_run = ok(tiny_json)
    B.plot_roofline(tiny_run, str(tmp_path / "r.png"))
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
# The conv bias on cuDNN and the cuDNN epilogue's costs (the pass itself: tests/test_conv_bn_fusion.py)


def test_conv_bias_is_a_separate_pass_on_cudnn(monkeypatch):
    model = models.ConvBNNet(3, 4).eval()
    (x,) = models.conv_inputs(2, 3, 8)
    gm = trace_module(model)
    plain = {c.name: c for c in B.graph_costs(gm, x)}
    assert all(c.extra_passes == 0 for c in plain.values())  # CPU: no cuDNN, the bias rides in the conv kernel
    monkeypatch.setattr(B, "conv_backend", lambda conv, node, device: "Cudnn")
    costs = {c.name: c for c in B.graph_costs(gm, x)}
    out = 4 * 2 * 4 * 8 * 8  # bytes of one (B, width, H, W) float32 output
    assert costs["conv1"].kernel_path == B.CUDNN_CONV_THEN_BIAS and costs["conv1"].extra_passes == 1
    assert costs["conv1"].bytes_written == 2 * out and costs["conv1"].bytes_read == plain["conv1"].bytes_read + out
    assert costs["stem_0"].extra_passes == 0 and costs["conv2"].extra_passes == 0  # no bias: nothing to add
    assert B.kernels_bound(list(costs.values()), PEAKS) > B.kernels_bound(list(plain.values()), PEAKS)


def test_cudnn_epilogue_unavailable_says_why():
    assert "CUDA" in B.cudnn_epilogue_unavailable("cpu", torch.float32)
    with pytest.raises(B.VariantUnavailable, match="CUDA"):
        B.cudnn_epilogue_after_fold(nn.Identity(), B.Config(device="cpu"))


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

    gm = B.fuse_conv_relu_epilogue(Net())
    (cost,) = B.graph_costs(gm, x)
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

    assert B._event_device_us(New()) == 7.0 and B._event_device_us(Old()) == 3.0
    assert B._event_device_us(object()) == 0.0


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
    t = {e["workload"]: e for e in B.check_targets({"meta": {"device": "cuda", "sizes": "cuda"}, "workloads": [w]})}
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
