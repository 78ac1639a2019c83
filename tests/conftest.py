import os

from hypothesis import HealthCheck, Phase, settings

# Hypothesis draws shapes for every equivalence test. "dev" is the default; CI=true selects "ci" (fewer examples,
# 2 cores); HYPOTHESIS_PROFILE=thorough for a long local soak.
settings.register_profile("dev", max_examples=25, deadline=None, suppress_health_check=[HealthCheck.too_slow])
settings.register_profile("ci", max_examples=15, deadline=None, suppress_health_check=[HealthCheck.too_slow])
settings.register_profile("thorough", max_examples=300, deadline=None, suppress_health_check=[HealthCheck.too_slow])
# "practice-stubs": the practice round trip (tests/test_practice.py) runs a workspace whose exercises are stubs; a stub
# fails at the first example, so shrinking it is wasted time.
settings.register_profile(
    "practice-stubs",
    max_examples=5,
    deadline=None,
    database=None,
    phases=[Phase.explicit, Phase.reuse, Phase.generate],
    suppress_health_check=[HealthCheck.too_slow],
)
settings.load_profile(os.environ.get("HYPOTHESIS_PROFILE", "ci" if os.environ.get("CI") else "dev"))


# ----------------------------------------------------------------------------------------------------------------------
# Practice workspaces (python -m fusion.practice start DIR): an unsolved exercise raises
# NotImplementedError("TODO(human) Phase N: ...") (or, through a lesson's command line, prints it and exits 1).
# A test of phase M stopped by the TODO of ANOTHER phase N is not wrong, it is waiting for Phase N: it is reported as
# skipped "needs Phase N", so that pytest fails exactly in the tests of the unsolved phases. A TODO of the test's own
# phase stays a failure. In the reference no TODO is ever raised or printed, so this hook changes nothing there.

import pytest  # noqa: E402

from fusion.practice import blocked_by  # noqa: E402


@pytest.hookimpl(wrapper=True)
def pytest_runtest_makereport(item, call):
    report = yield
    needs = blocked_by(item, call, report)
    if needs is not None and report.failed:
        _, lineno, _ = item.location
        report.outcome = "skipped"
        report.longrepr = (str(item.path), (lineno or 0) + 1, f"Skipped: {needs[1]}")
    return report
