"""Make the bundled example release: the real ``dpsummary release`` on examples/german_credit.csv.

    python examples/make_example_release.py          # ~1 minute; writes examples/release/

Runs the curator's command end to end (DP count, the default noise-aware mechanism, signing,
ledger) in a throw-away
DPSUMMARY_HOME, with a policy whose schema is PUBLIC: the bounds and category codes below come
from the dataset's published codebook (UCI Statlog German credit), not from the data. It keeps
a few columns so the posterior is small enough to plot (9 parameters). Outputs, committed so the
analyst examples run without the curator's side:

* ``examples/release/german_credit.dpsummary.json``: the signed artifact (epsilon 0.5);
* ``examples/release/curator.pub``: the curator's public key that verifies it;
* ``examples/release/policy.toml``: the public policy used.

The signing key and the ledger stay in the temporary home and are deleted.
"""

from __future__ import annotations

import os
import shutil
import subprocess
import sys
import tempfile
from pathlib import Path

HERE = Path(__file__).resolve().parent
OUT = HERE / "release"

POLICY = """\
# Public policy of the bundled example release (schema from the published codebook).
source_id = "examples/german_credit"
total_epsilon = 1.0
total_delta = 1e-6
max_epsilon_per_release = 0.5
min_records = 200
n_max = 100_000
record_count_public = false
accountant = "rdp"
allowed_models = ["logistic"]

[delta_rule]
max_delta_times_n_max = 0.1

[budget_split]
count = 0.05
preprocessing = 0.15
initialisation = 0.20
optimisation = 0.60

[schema]
target = "credit_risk"

[[schema.columns]]
name = "checking_status"
kind = "categorical"
categories = ["A11", "A12", "A13", "A14"]

[[schema.columns]]
name = "duration_months"
kind = "numeric"
lower = 4
upper = 72
integer = true

[[schema.columns]]
name = "credit_amount"
kind = "numeric"
lower = 250
upper = 20000

[[schema.columns]]
name = "installment_rate"
kind = "numeric"
lower = 1
upper = 4
integer = true

[[schema.columns]]
name = "age"
kind = "numeric"
lower = 18
upper = 80
integer = true

[[schema.columns]]
name = "credit_risk"
kind = "categorical"
categories = ["bad", "good"]
positive = "bad"
"""


def main() -> None:
    OUT.mkdir(exist_ok=True)
    policy = OUT / "policy.toml"
    policy.write_text(POLICY)
    artifact = OUT / "german_credit.dpsummary.json"
    with tempfile.TemporaryDirectory() as home:
        env = {**os.environ, "DPSUMMARY_HOME": home}
        cmd = [sys.executable, "-c", "from dpsummary.cli import main; main()", "release",
               str(HERE / "german_credit.csv"), "--epsilon", "0.5", "--policy", str(policy),
               "--size", "40", "--seed", "0", "--out", str(artifact), "--force"]  # replaces the bundled one
        subprocess.run(cmd, check=True, env=env, cwd=HERE.parent)
        shutil.copy(Path(home) / "keys" / "dpsummary.pub", OUT / "curator.pub")
    print(f"wrote {artifact} and {OUT / 'curator.pub'}")


if __name__ == "__main__":
    main()
