"""Property test of issue 25: once charged, every release ends in a finite signed artifact or a
one-line refusal with a documented exit code, never a crash.

A seeded generator (numpy, fixed seed: the same cases every run) draws small random tables for
logistic, Poisson (counts up to 10^4, intercepts up to 8), linear and Gaussian-mean releases at
epsilon 0.05 to 5, under zero configuration (DP count and schema) and under a public schema and
count. Every case runs the whole release through the CLI (typer's CliRunner) and asserts:

* exit 0: the artifact is signed, ``dpsummary.load`` reads it, and every number in it (summary
  points and weights, Gaussians, claim) is finite;
* otherwise: exactly one ``error:`` line, an exit code listed in docs/REFUSALS.md, and never
  "internal error" or a traceback.

The outcome of a case depends on OS-entropy noise (releases are never seeded for privacy), so a
case may pass through either branch; both are checked, and neither can crash silently.
"""

from __future__ import annotations

import json
import math
import re
from pathlib import Path
from typing import Any

import numpy as np
import pytest
from release_support import finite
from typer.testing import CliRunner

import dpsummary
from dpsummary.cli import app

runner = CliRunner()
DOC = Path(__file__).resolve().parents[1] / "docs" / "REFUSALS.md"
MODELS = ("logistic", "poisson", "linear", "gaussian_mean")
#: 28 cases: 7 per model, alternating zero configuration and public schema.
CASES_PER_MODEL = 7


def _listed_exit_codes() -> set[int]:
    codes = {int(m.group(1)) for m in re.finditer(r"^\| [a-z0-9-]+ \| (?:before|after) \| \w+ \| (\d) \|",
                                                  DOC.read_text(), re.M)}
    assert codes, "docs/REFUSALS.md lists no exit code"
    return codes


def _table(model: str, rng: np.random.Generator) -> tuple[list[str], list[list[str]], dict[str, Any]]:
    """A random small table: header, rows and the public facts a schema would declare."""
    n = int(rng.integers(300, 1200))
    k = int(rng.integers(1, 4))
    x = rng.uniform(-1, 1, (n, k)) * rng.uniform(0.5, 20, k)
    cat = rng.choice(["a", "b", "c"], n)
    header = [f"x{j}" for j in range(k)] + ["g"]
    scale = x / np.abs(x).max(axis=0)
    slopes = rng.normal(0, 1, k)
    facts: dict[str, Any] = {"n": n, "bounds": [(float(x[:, j].min()) - 1, float(x[:, j].max()) + 1) for j in range(k)]}
    if model == "gaussian_mean":
        cols = [[f"{v:.4f}" for v in row] + [c] for row, c in zip(x, cat, strict=True)]
        return header, cols, facts
    if model == "logistic":
        eta = rng.normal(0, 2) + scale @ slopes
        y = [str(v) for v in (rng.random(n) < 1 / (1 + np.exp(-eta))).astype(int)]
    elif model == "poisson":
        intercept = float(rng.uniform(0, 8))
        eta = np.minimum(intercept + 0.3 * scale @ slopes, math.log(1e4))
        y = [str(v) for v in np.minimum(rng.poisson(np.exp(eta)), 10_000)]
        facts["upper"] = 10_000
    else:
        y_val = rng.normal(0, 5) + scale @ slopes * rng.uniform(0.1, 10) + rng.normal(0, rng.uniform(0.1, 5), n)
        y = [f"{v:.4f}" for v in y_val]
        facts["target_bounds"] = (float(y_val.min()) - 1, float(y_val.max()) + 1)
    cols = [[f"{v:.4f}" for v in row] + [c, t] for row, c, t in zip(x, cat, y, strict=True)]
    return [*header, "y"], cols, facts


def _policy(path: Path, model: str, facts: dict[str, Any], public: bool) -> Path:
    text = f"""source_id = "property"
total_epsilon = 1000
total_delta = 1e-6
max_epsilon_per_release = 10
min_records = 50
n_max = 100000
allowed_models = ["{model}"]
"""
    if not public:
        return _write(path, text)
    text += f"record_count_public = true\nrecord_count = {facts['n']}\n\n[schema]\n"
    if model != "gaussian_mean":
        text += 'target = "y"\n'
    for j, (lo, hi) in enumerate(facts["bounds"]):
        text += f'[[schema.columns]]\nname = "x{j}"\nkind = "numeric"\nlower = {lo:.4f}\nupper = {hi:.4f}\n'
    text += '[[schema.columns]]\nname = "g"\nkind = "categorical"\ncategories = ["a", "b", "c"]\n'
    if model == "logistic":
        text += '[[schema.columns]]\nname = "y"\nkind = "categorical"\ncategories = ["0", "1"]\n'
    elif model == "poisson":
        text += f'[[schema.columns]]\nname = "y"\nkind = "numeric"\ninteger = true\nlower = 0\nupper = {facts["upper"]}\n'
    elif model == "linear":
        lo, hi = facts["target_bounds"]
        text += f'[[schema.columns]]\nname = "y"\nkind = "numeric"\nlower = {lo:.4f}\nupper = {hi:.4f}\n'
    return _write(path, text)


def _write(path: Path, text: str) -> Path:
    path.write_text(text)
    return path


def _cases() -> list[tuple[str, int, bool, float]]:
    rng = np.random.default_rng(25)
    out = []
    for model in MODELS:
        for i in range(CASES_PER_MODEL):
            epsilon = float(np.exp(rng.uniform(math.log(0.05), math.log(5.0))))
            out.append((model, int(rng.integers(0, 2**31)), i % 2 == 1, round(epsilon, 3)))
    return out



@pytest.mark.parametrize(("model", "seed", "public", "epsilon"), _cases())
def test_release_is_a_finite_artifact_or_a_one_line_refusal(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch, model: str, seed: int, public: bool, epsilon: float
) -> None:
    home = tmp_path / "home"
    monkeypatch.setenv("DPSUMMARY_HOME", str(home))
    header, rows, facts = _table(model, np.random.default_rng(seed))
    data = tmp_path / "t.csv"
    data.write_text("\n".join([",".join(header), *(",".join(r) for r in rows)]) + "\n")
    policy = _policy(tmp_path / "p.toml", model, facts, public)
    out = tmp_path / "t.dpsummary.json"
    args = ["release", str(data), "--epsilon", str(epsilon), "--model", model, "--policy", str(policy),
            "--out", str(out), "--size", "10"]
    if model != "gaussian_mean":
        args += ["--target", "y"]
    res = runner.invoke(app, args)
    assert "internal error" not in res.output and "Traceback" not in res.output, res.output
    if res.exit_code == 0:
        rel = dpsummary.load(out, key=home / "keys" / "dpsummary.pub")
        assert rel.verified
        envelope = json.loads(out.read_text())
        assert finite(envelope), "a non-finite number in the artifact"
        assert np.all(np.isfinite(rel.summary.points.numpy())) and np.all(np.isfinite(rel.summary.weights.numpy()))
    else:
        errors = [x for x in res.output.splitlines() if x.startswith("error:")]
        assert len(errors) == 1, res.output
        assert res.exit_code in _listed_exit_codes(), res.output
        assert not out.exists()
