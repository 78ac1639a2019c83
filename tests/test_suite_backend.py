"""Phase 4's model suite run through Phase 9's backend: the suite harness (fusion.bench.suite) timing
``backend="fusion"`` on tiny CPU models. Phase 9's tests: they need its solution, the harness itself is Phase 4's."""

from __future__ import annotations

import contextlib
import io
import statistics

import pytest

from fusion import benchmark as B

pytestmark = pytest.mark.phase9


@pytest.fixture(scope="module")
def tiny_suite():
    """One tiny CPU suite run: two models (a torchvision ViT, HF GPT-2), eager + fusion + fusion+cudagraphs."""
    from fusion.bench import suite as S

    B.register_lessons()  # backend="fusion" is Phase 9's (also when this file runs alone)
    out = io.StringIO()
    with contextlib.redirect_stdout(out):
        result = S.run_suite(
            B.LESSON,
            models=["vit_b_16", "gpt2"],
            backends=["eager", "fusion", "fusion+cudagraphs"],
            device="cpu",
            rounds=1,
        )
    return result, out.getvalue()


def test_tiny_suite_rows_have_pass_and_accuracy(tiny_suite):
    from fusion.bench import suite as S

    result, printed = tiny_suite
    assert result["schema"] == "suite-1" and result["meta"]["sizes"] == "tiny"
    assert [r["model"] for r in result["models"]] == ["vit_b_16", "gpt2"]
    for row in result["models"]:
        if row["status"] == "skipped":
            assert "not installed" in row["reason"]
            continue
        b = row["backends"]
        assert set(b) == {"eager", "fusion", "fusion+cudagraphs"}
        assert b["eager"]["status"] == "pass" and b["eager"]["median_s"] > 0 and b["eager"]["speedup_vs_eager"] == 1
        blocks = b["eager"]["times_s"]  # every timed block is kept, and the spread behind the median with them
        assert blocks and b["eager"]["median_s"] == pytest.approx(
            statistics.median(blocks), rel=1e-6, abs=1e-9
        )  # blocks kept to 1 ns
        assert 0 <= b["eager"]["iqr_s"] <= max(blocks) - min(blocks) + 1e-12
        assert b["fusion"]["status"] == "pass" and b["fusion"]["accuracy"] == "pass", b["fusion"]
        assert b["fusion"]["first_call_s"] > 0
        if S.fusion_timed("cpu"):  # compiled C kernels: timed like eager
            assert b["fusion"]["median_s"] > 0 and "note" not in b["fusion"], b["fusion"]
        else:  # Triton's interpreter would run them: checked, never timed
            assert "interpreter" in b["fusion"]["note"] and "median_s" not in b["fusion"]
        cg = b["fusion+cudagraphs"]  # an option the backend may not have yet: a row either way, never a crash
        assert cg["status"] in ("pass", "fail_to_run") and (cg["status"] == "pass" or cg["reason"])
    s = result["summary"]["fusion"]
    assert s["passed"] == s["models"] and s["pass_rate"] == 1.0
    assert "summary:" in printed and "fusion: pass" in printed
    assert all(len(line) <= 120 for line in printed.splitlines() if not line.startswith("    "))


def test_suite_warms_each_compiler_once_before_timing_a_first_call(tiny_suite, monkeypatch):
    """Each compiler's one-time costs (imports, Dynamo's first use) are paid on a throwaway function, once per
    process: a first call is then the model's own compile, whichever backend runs first."""
    from fusion.bench import suite as S

    assert "fusion" in S._WARMED  # the tiny suite warmed it before its first model
    monkeypatch.setattr(S, "_WARMED", {"fusion"})
    calls = []
    monkeypatch.setattr(S, "compile_with", lambda name, model: calls.append(name) or model)
    every = ["eager", "fusion", "fusion+cudagraphs", "inductor", "inductor+reduce-overhead"]
    S.warm_compilers(every, S.SuiteConfig(device="cpu"))
    S.warm_compilers(every, S.SuiteConfig(device="cpu"))
    assert calls == ["inductor"], calls  # once, and never for eager or a variant of a warmed compiler


def _c_compiler() -> bool:
    from fusion.kernels import c_runtime

    return c_runtime.available()[0]


@pytest.mark.skipif(not _c_compiler(), reason="no C compiler: CPU kernels would run in Triton's interpreter")
def test_cpu_fusion_row_is_timed_when_the_c_renderer_runs_its_kernels(tiny_suite, monkeypatch):
    """With the C renderer (the CPU default where a compiler is found) a CPU ``fusion`` row is timed against eager in
    the same process, and the meta states the threads, the CPU and the renderer; with Triton's interpreter chosen it
    would not be (checked, not timed)."""
    from fusion.bench import suite as S

    monkeypatch.delenv("FUSION_RENDERER", raising=False)
    assert S.fusion_timed("cpu") and S.fusion_timed("cuda")
    result, printed = tiny_suite
    meta = result["meta"]
    assert meta["threads"] >= 1 and meta["cpu_model"] and meta["fusion_renderer"] == "c" and meta["c_compiler"]
    assert f"{meta['threads']} threads" in printed
    ran = [r for r in result["models"] if r["status"] == "ok"]
    for row in ran:
        f = row["backends"]["fusion"]
        assert f["median_s"] > 0 and f["speedup_vs_eager"] > 0 and f["times_s"], f
    monkeypatch.setenv("FUSION_RENDERER", "triton")
    assert not S.fusion_timed("cpu") and S.fusion_timed("cuda")


def test_ratios_paired_by_round_cancel_the_hosts_drift():
    """The suite times one round a call of the lesson's loop, so each backend's blocks are known per round: a host
    that runs at half speed for the later rounds, where one backend happened to get more blocks there, moves the
    ratio of the medians, never the paired one (each round's two blocks see the same host)."""
    from types import SimpleNamespace

    from fusion.bench import suite as S

    calls = []

    def time_variants(fns, *, rounds, min_run_time, warmup, sync, threads):
        i = len(calls)
        calls.append((rounds, warmup))
        slow = 2.0 if i >= 2 else 1.0  # rounds 2 and 3 on a host at half speed
        fast_blocks = 3 if i >= 2 else 1  # the fast backend happens to get three blocks there: its median drifts
        return {
            "eager": SimpleNamespace(times_s=(2e-3 * slow,)),
            "fusion": SimpleNamespace(times_s=(1e-3 * slow,) * fast_blocks),
        }

    lesson = SimpleNamespace(time_variants=time_variants, peak_memory=lambda fn, device: 0)
    row = {"backends": {"eager": {}, "fusion": {}}}
    S._measure(row, {"eager": lambda: None, "fusion": lambda: None}, S.SuiteConfig(rounds=4), lesson, lambda: None)
    assert calls == [(1, 3), (1, 0), (1, 0), (1, 0)]  # four rounds, warmed up once
    f = row["backends"]["fusion"]
    assert f["round_s"] == [1e-3, 1e-3, 2e-3, 2e-3] and len(f["times_s"]) == 8
    assert f["paired_vs_eager"] == pytest.approx(2.0)  # each round: twice as fast as eager
    assert f["speedup_vs_eager"] == pytest.approx(2e-3 * 1.5 / 2e-3)  # the medians: 3 ms against 2 ms, drift kept
    assert row["backends"]["eager"]["paired_vs_eager"] == pytest.approx(1.0)
