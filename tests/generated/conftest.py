"""Hypothesis profiles for the generated-loop properties, and this folder on sys.path.

`ci` (the default) is reproducible (`derandomize=True`) and sized to the suite's CPU budget;
`bench` (`bench/generated_loops.py`) draws many more examples with fresh randomness. No example
database is kept: a failure is reproduced by its printed `Loop(...)`, then made a fixture.
"""

from __future__ import annotations

import os
import sys
from pathlib import Path

from hypothesis import HealthCheck, settings

sys.path.insert(0, str(Path(__file__).resolve().parent))

_COMMON = dict(deadline=None, database=None, suppress_health_check=[HealthCheck.too_slow])
settings.register_profile("ci", derandomize=True, print_blob=False, **_COMMON)
settings.register_profile("bench", derandomize=False, **_COMMON)
settings.load_profile(os.environ.get("ACCEL_GENERATED_PROFILE", "ci"))
