import os

from hypothesis import HealthCheck, settings

# Hypothesis draws shapes for every equivalence test. "dev" is the default; CI=true selects "ci" (fewer examples,
# 2 cores); HYPOTHESIS_PROFILE=thorough for a long local soak.
settings.register_profile("dev", max_examples=25, deadline=None, suppress_health_check=[HealthCheck.too_slow])
settings.register_profile("ci", max_examples=15, deadline=None, suppress_health_check=[HealthCheck.too_slow])
settings.register_profile("thorough", max_examples=300, deadline=None, suppress_health_check=[HealthCheck.too_slow])
settings.load_profile(os.environ.get("HYPOTHESIS_PROFILE", "ci" if os.environ.get("CI") else "dev"))
