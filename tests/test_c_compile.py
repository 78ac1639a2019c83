"""A compiled graph's C kernels compile together (fusion.kernels.c_bundle, called by precompile_c when the graph is
built): the missing kernels in one compiler process per worker, each kernel cached on disk under its own key."""

from __future__ import annotations

import json
import pickle
import subprocess
import sys
import textwrap
from pathlib import Path

import pytest
import torch
from support import Fn

from fusion.codegen import compile_regions
from fusion.kernels import c_bundle, c_runtime

pytestmark = [pytest.mark.phase8, pytest.mark.skipif(not c_runtime.available()[0], reason="no C compiler here")]


def f(x, w):
    """Four kernels: three elementwise chains and a row sum, separated by matmuls (aten)."""
    a = torch.relu(x * 2.0 + 1.0)
    b = torch.sigmoid(a @ w) * 3.0
    c = b @ w
    return torch.tanh(c) - 0.5, (c * c).sum(-1)


def inputs():
    g = torch.Generator().manual_seed(0)
    return torch.randn(8, 16, generator=g), torch.randn(16, 16, generator=g) / 4


def compiled(monkeypatch, cache: Path, workers: str = "1"):
    monkeypatch.setenv("FUSION_CACHE_DIR", str(cache))
    monkeypatch.setenv("FUSION_COMPILE_WORKERS", workers)
    with c_runtime.use("c"):
        return compile_regions(Fn(f), inputs())


def delta(before: dict) -> dict:
    return {k: c_runtime.STATS[k] - before[k] for k in ("compiled", "disk_hits", "compiler_runs")}


def check_values(model) -> None:
    got = model(*inputs())
    assert all(lch.owner.ran == "c" for lch in model.compiled.launchers)
    for g, w in zip(got, f(*inputs()), strict=True):
        torch.testing.assert_close(g, w)


def test_a_graphs_kernels_compile_in_one_compiler_process(tmp_path, monkeypatch):
    before = dict(c_runtime.STATS)
    model = compiled(monkeypatch, tmp_path)
    summary = model.compiled.c_precompiled
    n = len(model.compiled.launchers)
    assert n >= 3 and summary["kernels"] == summary["compiled"] >= 3 and not summary["failed"], summary
    assert delta(before) == {"compiled": summary["compiled"], "disk_hits": 0, "compiler_runs": 1}, summary
    assert len(list(tmp_path.glob("c/k_*.so"))) == summary["kernels"]  # each kernel cached under its own key
    assert not list(tmp_path.glob("c/bundle_*")), "the bundle's own files are removed once placed"
    check_values(model)
    assert delta(before)["compiler_runs"] == 1, "the first call compiled nothing more"


def test_two_workers_compile_two_bundles_side_by_side(tmp_path, monkeypatch):
    monkeypatch.setattr(c_bundle, "MIN_PER_BUNDLE", 1)
    before = dict(c_runtime.STATS)
    model = compiled(monkeypatch, tmp_path, workers="2")
    summary = model.compiled.c_precompiled
    assert summary["bundles"] == 2 and summary["compiled"] == summary["kernels"], summary
    assert delta(before)["compiler_runs"] == 2
    check_values(model)


def test_a_second_graph_with_the_same_kernels_hits_the_disk_cache(tmp_path, monkeypatch):
    first = compiled(monkeypatch, tmp_path)
    c_runtime._LIBS.clear()  # a new process: only the disk cache is left
    before = dict(c_runtime.STATS)
    second = compiled(monkeypatch, tmp_path)
    kernels = first.compiled.c_precompiled["kernels"]
    assert delta(before) == {"compiled": 0, "disk_hits": kernels, "compiler_runs": 0}
    assert second.compiled.c_precompiled["compiled"] == 0
    check_values(second)


SCRIPT = textwrap.dedent(
    """
    import json, pickle, sys
    from fusion.kernels import c_bundle, c_runtime
    with open(sys.argv[1], "rb") as f:
        kernels = pickle.load(f)
    print("ready", flush=True)
    sys.stdin.readline()
    made, summary = c_bundle.compile_kernels(kernels, workers=1)
    assert all(k is not None for k in made), summary
    print(json.dumps({k: c_runtime.STATS[k] for k in ("compiled", "disk_hits")}))
    """
)


def test_two_processes_compiling_the_same_kernels_compile_each_once(tmp_path, monkeypatch):
    """This process and another compile the same kernels at the same moment on a cold cache: each kernel is compiled
    by one of them (its file lock, taken without waiting: the other loads it once it is there), and a graph built
    afterwards finds them all."""
    model = compiled(monkeypatch, tmp_path / "first")
    kernels = [lch.owner.plan.ir for lch in model.compiled.launchers]
    pickled = tmp_path / "kernels.pkl"
    pickled.write_bytes(pickle.dumps(kernels))  # the kernel IR is data
    shared = tmp_path / "shared"
    monkeypatch.setenv("FUSION_CACHE_DIR", str(shared))
    other = subprocess.Popen([sys.executable, "-c", SCRIPT, str(pickled)], stdin=subprocess.PIPE,
                             stdout=subprocess.PIPE, text=True)  # fmt: skip
    assert other.stdout.readline().strip() == "ready"
    before = dict(c_runtime.STATS)
    other.stdin.write("go\n")
    other.stdin.flush()
    made, _ = c_bundle.compile_kernels(kernels, workers=1)
    mine = delta(before)
    theirs = json.loads(other.communicate(timeout=120)[0].strip().splitlines()[-1])
    assert other.returncode == 0 and all(k is not None for k in made), theirs
    n = len(list(shared.glob("c/k_*.so")))
    assert n == model.compiled.c_precompiled["kernels"] >= 3 and mine["compiled"] + theirs["compiled"] == n, (
        mine,
        theirs,
    )
    assert mine["compiled"] + mine["disk_hits"] == n == theirs["compiled"] + theirs["disk_hits"], (mine, theirs)
    c_runtime._LIBS.clear()
    before = dict(c_runtime.STATS)
    again = compiled(monkeypatch, shared)
    assert delta(before) == {"compiled": 0, "disk_hits": n, "compiler_runs": 0}
    check_values(again)


def test_a_kernel_the_compiler_refuses_leaves_the_others_compiled_and_is_named(tmp_path, monkeypatch):
    model = compiled(monkeypatch, tmp_path / "first")
    kernels = [lch.owner.plan.ir for lch in model.compiled.launchers]
    bad = kernels[1]
    named = c_runtime.named

    def broken(kernel):
        code, source, renamed = named(kernel)
        if kernel is bad:
            renamed += "this is not C;\n"
        return code, source, renamed

    monkeypatch.setattr(c_runtime, "named", broken)
    monkeypatch.setenv("FUSION_CACHE_DIR", str(tmp_path / "second"))
    made, summary = c_bundle.compile_kernels(kernels, workers=1)
    assert made[1] is None and all(k is not None for i, k in enumerate(made) if i != 1), summary
    assert summary["compiled"] == len(kernels) - 1 and len(summary["failed"]) == 2, summary  # the bundle, then it
    with pytest.raises(RuntimeError, match=f"kernel {bad.name}: .* failed on"):
        c_runtime.compile_kernel(bad)  # alone, at its first call: one error naming the kernel


def test_a_kernel_that_fails_to_render_is_left_to_its_first_call(tmp_path, monkeypatch):
    """A renderer bug in one kernel costs only that kernel's bundling: the others compile, and it is named."""
    model = compiled(monkeypatch, tmp_path / "first")
    kernels = [lch.owner.plan.ir for lch in model.compiled.launchers]
    named = c_runtime.named

    def broken(kernel):
        if kernel is kernels[0]:
            raise ValueError("a renderer bug")
        return named(kernel)

    monkeypatch.setattr(c_runtime, "named", broken)
    monkeypatch.setenv("FUSION_CACHE_DIR", str(tmp_path / "second"))
    made, summary = c_bundle.compile_kernels(kernels, workers=1)
    assert made[0] is None and all(k is not None for k in made[1:]), summary
    assert summary["failed"] == [f"{kernels[0].name}: rendering: ValueError: a renderer bug"], summary
