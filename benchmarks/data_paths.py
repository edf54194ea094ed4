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


#: The only changes a benchmark's epsilon sweep makes to the packaged default policy: a lifetime
#: budget and a per-release cap large enough for the sweep (everything else as shipped).
SWEEP_POLICY_OVERRIDES = {"total_epsilon": "1000.0", "max_epsilon_per_release": "10.0"}


def write_sweep_policy(directory: Path) -> Path:
    """``directory/policy.toml``: the packaged default policy with :data:`SWEEP_POLICY_OVERRIDES`."""
    policy = (REPO_ROOT / "dpsummary" / "resources" / "default_policy.toml").read_text()
    lines = []
    for line in policy.splitlines():
        key = line.split("=")[0].strip()
        lines.append(f"{key} = {SWEEP_POLICY_OVERRIDES[key]}" if key in SWEEP_POLICY_OVERRIDES else line)
    path = directory / "policy.toml"
    path.write_text("\n".join(lines) + "\n")
    return path
