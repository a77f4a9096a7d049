"""Shared pytest setup.

Hypothesis profiles: "dev" (default, 200 examples per property, fast enough
for every run) and "ci" (5,000 examples, no deadline): select with
HYPOTHESIS_PROFILE=ci.
"""

import os

from hypothesis import HealthCheck, settings

settings.register_profile("dev", max_examples=200, deadline=None)
settings.register_profile("ci", max_examples=5000, deadline=None,
                          suppress_health_check=[HealthCheck.too_slow])
settings.load_profile(os.environ.get("HYPOTHESIS_PROFILE", "dev"))
