import os

import pytest
from hypothesis import HealthCheck, settings

from fusion import practice

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


# Phase 8's own tests run the generated Triton kernels (the learner's exercise is the Triton expressions): on a CPU in
# Triton's interpreter, whatever renderer CPU kernels use by default (the C renderer, fusion.kernels.c_runtime).
TRITON_PINNED = ("test_codegen", "test_fuzz", "test_opinfo")


@pytest.fixture(autouse=True, scope="module")
def _phase8_tests_run_triton(request):
    name = request.module.__name__.rpartition(".")[2]
    if not name.startswith(TRITON_PINNED):
        yield
        return
    old = os.environ.get("FUSION_RENDERER")
    os.environ["FUSION_RENDERER"] = "triton"
    try:
        yield
    finally:
        if old is None:
            os.environ.pop("FUSION_RENDERER", None)
        else:
            os.environ["FUSION_RENDERER"] = old


@pytest.fixture
def triton_renderer(monkeypatch):
    """A test of the Triton generator's own kernels (windows, depthwise sums) that runs on a CPU: its kernels run in
    Triton's interpreter. Under the default C renderer a kernel C does not take runs as aten ops instead."""
    monkeypatch.setenv("FUSION_RENDERER", "triton")
