import gc
import os
import sys

# Threads. pyproject runs the suite in two pytest-xdist workers. torch's default is a thread per core in each, so on a
# machine with as many cores as workers (CI's 2) four busy threads share two cores, and torch's and the C kernels'
# OpenMP threads spin waiting for each other: measured there, the suite took 190 s (274 s of CPU in the workers) with
# the default and 165 s (226 s) with one thread each. A worker gets its share of the cores (at least one), before
# torch is imported; the subprocesses the tests start inherit it. OMP_NUM_THREADS set by the caller wins. That the C
# kernels give the same values on any number of threads is a test of its own (test_c_renderer.py), which sets them.
_workers = int(os.environ.get("PYTEST_XDIST_WORKER_COUNT", "0") or 0)
if _workers and "OMP_NUM_THREADS" not in os.environ:
    # fusion.kernels.c_runtime.cores(), written out: importing that module would import torch before the variable
    _cores = len(os.sched_getaffinity(0)) if hasattr(os, "sched_getaffinity") else (os.cpu_count() or 1)
    os.environ["OMP_NUM_THREADS"] = str(max(1, _cores // _workers))
    if "torch" in sys.modules:  # a plugin imported it first: torch read the variable then
        sys.modules["torch"].set_num_threads(int(os.environ["OMP_NUM_THREADS"]))

import pytest  # noqa: E402
from hypothesis import HealthCheck, settings  # noqa: E402

from fusion import practice  # noqa: E402

# Hypothesis draws shapes for every equivalence test. "dev" is the default; CI=true selects "ci" (fewer examples,
# 2 cores, the same ones every run); HYPOTHESIS_PROFILE=thorough for a long local soak,
# HYPOTHESIS_PROFILE=fuzz for the differential fuzzer's long run (2,000 programs per entry point).
# Each profile derives from hypothesis' own defaults (parent=): without it a profile inherits whatever profile is loaded
# at registration, e.g. a workspace's no-shrink profile when a test runs this conftest again inside a workspace.
_base = dict(parent=settings.get_profile("default"), deadline=None, suppress_health_check=[HealthCheck.too_slow])
settings.register_profile("dev", max_examples=25, **_base)
# CI is a gate, not a search: its examples are derived from each test (derandomize), so a red run reproduces and a
# green one stays green. The search for new failures is the random profiles: dev (every local run), thorough, fuzz.
settings.register_profile("ci", max_examples=15, derandomize=True, **_base)
settings.register_profile("thorough", max_examples=300, **_base)
settings.register_profile("fuzz", max_examples=2000, **_base)  # tests/test_fuzz.py's long run
_profile = os.environ.get("HYPOTHESIS_PROFILE", "ci" if os.environ.get("CI") else "dev")
# In a practice workspace a wrong solution fails at its first failing example, without shrinking (fast feedback:
# shrinking a learner's bug cost minutes per phase). The reference keeps shrinking, to find minimal examples.
settings.load_profile(practice.practice_profile(_profile) if practice.is_workspace() else _profile)

# A test process holds half a million long-lived objects and more (torch, Dynamo, sympy, transformers, the test modules,
# what the tests keep), and a full collection scans them all: at Python's default, one full collection per 10
# collections of the middle generation, the collector took up to a quarter of a worker's time. One per 100: the young
# generations, where most cycles die, are collected as often as before.
gc.set_threshold(*gc.get_threshold()[:2], 100)


# ----------------------------------------------------------------------------------------------------------------------
# Practice workspaces (python -m fusion.practice start DIR): an unsolved exercise raises
# NotImplementedError("TODO(human) Phase N: ...") (or, through a lesson's command line, prints it and exits 1).
# * A test of phase M stopped by the TODO of ANOTHER phase N is not wrong, it is waiting for Phase N: it is reported
#   as skipped "needs Phase N", so that pytest fails exactly in the tests of the unsolved phases. A TODO of the test's
#   own phase stays a failure.
# * A hypothesis test that hits a TODO stops at its first example instead of shrinking a failure that every input
#   reproduces (that shrinking costs minutes per phase in a fresh workspace).
# In the reference no TODO is ever raised or printed, so neither hook changes anything there.


def pytest_collection_modifyitems(items):
    practice.stop_hypothesis_at_todo(items)


@pytest.hookimpl(wrapper=True)
def pytest_runtest_makereport(item, call):
    report = yield
    practice.adjust_report(item, call, report)
    return report


# The generator's tests (test_codegen, test_fuzz, test_opinfo) run their CPU kernels with the renderer of
# $FUSION_TEST_RENDERER: by default the C renderer (fusion.kernels.c_runtime) where a compiler is found, else Triton's
# interpreter. FUSION_TEST_RENDERER=triton runs every one of them in the interpreter (the learner's Triton code end to
# end). Whatever it says, three kinds of test choose for themselves:
# * ``@pytest.mark.usefixtures("triton_renderer")``: Phase 8's own rules (the learner's Triton expressions, split_index,
#   the interpreter's bounds check, the wrong-solution harness) and windows C does not lower (max-pool): always Triton.
# * a test that takes the ``renderer`` fixture: the interpreter's smoke subset, run with both renderers (one fixed
#   small case per kernel kind: pointwise, cat, views, row/looped/column reductions, half rounding), so a regression
#   of either path fails on any CPU.
# * everything else: the default above (each new kernel costs a C compile, ~0.2 s, once: kernels are cached on disk).
GENERATOR_TESTS = ("test_codegen", "test_fuzz", "test_opinfo")


def generator_renderer() -> str:
    """The renderer of the generator's tests: $FUSION_TEST_RENDERER, else C where a compiler is found, else Triton."""
    from fusion.kernels import c_runtime

    name = os.environ.get("FUSION_TEST_RENDERER", "").strip().lower()
    if name:
        return c_runtime.check_renderer(name, "FUSION_TEST_RENDERER")
    return "c" if c_runtime.available()[0] else "triton"


@pytest.fixture(autouse=True, scope="module")
def _generator_tests_renderer(request):
    name = request.module.__name__.rpartition(".")[2]
    if not name.startswith(GENERATOR_TESTS):
        yield
        return
    old = os.environ.get("FUSION_RENDERER")
    os.environ["FUSION_RENDERER"] = generator_renderer()
    try:
        yield
    finally:
        if old is None:
            os.environ.pop("FUSION_RENDERER", None)
        else:
            os.environ["FUSION_RENDERER"] = old


@pytest.fixture(params=["c", "triton"])
def renderer(request, monkeypatch):
    """The test runs twice: its CPU kernels compiled from C, then in Triton's interpreter (the smoke subset)."""
    from fusion.kernels import c_runtime

    if request.param == "c" and not c_runtime.available()[0]:
        pytest.skip("no C compiler here")
    monkeypatch.setenv("FUSION_RENDERER", request.param)
    return request.param


@pytest.fixture
def triton_renderer(monkeypatch):
    """A test of the Triton generator's own kernels (Phase 8's rules, windows, depthwise sums) that runs on a CPU: its
    kernels run in Triton's interpreter. Under the default C renderer a kernel C does not take runs as aten ops instead."""
    monkeypatch.setenv("FUSION_RENDERER", "triton")
