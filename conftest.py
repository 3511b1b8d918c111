"""Settings shared by every test suite in the repository.

Hypothesis profiles: `ci` (more examples, no deadline, derandomized so CI is repeatable) and
`dev` (fewer examples for quick runs). `HYPOTHESIS_PROFILE` picks one; `CI=true` implies `ci`.
Deadlines are off in both: tests never assert on wall time, and this machine has 2 cores.
"""

from __future__ import annotations

import os

from hypothesis import HealthCheck, settings

settings.register_profile(
    "ci",
    max_examples=200,
    deadline=None,
    derandomize=True,
    suppress_health_check=[HealthCheck.too_slow],
    print_blob=True,
)
settings.register_profile("dev", max_examples=50, deadline=None, suppress_health_check=[HealthCheck.too_slow])
settings.load_profile(os.environ.get("HYPOTHESIS_PROFILE") or ("ci" if os.environ.get("CI") else "dev"))
