"""Where the benchmarks find the shared data sets (adult, german_credit, bike_rentals).

One lookup for every benchmark, the tests' own (``tests/test_benchmark_smoke.py``,
``tests/test_data.py``): ``../shared/data`` beside the repository root, unless the environment
variable ``DPSUMMARY_SHARED_DATA`` names another directory. No machine-specific path.
"""

from __future__ import annotations

import os
from pathlib import Path

#: Environment variable that overrides :data:`SHARED_DATA`.
ENV_VAR = "DPSUMMARY_SHARED_DATA"
REPO_ROOT = Path(__file__).resolve().parents[1]


def shared_data_dir() -> Path:
    """``$DPSUMMARY_SHARED_DATA`` if set, else ``<repository root>/../shared/data``."""
    override = os.environ.get(ENV_VAR)
    return Path(override) if override else REPO_ROOT.parent / "shared" / "data"


SHARED_DATA = shared_data_dir()
