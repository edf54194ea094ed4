"""Tests for dpsummary.policy."""

from __future__ import annotations

import shutil
from pathlib import Path

import pytest

from dpsummary import policy as P

ROOT = Path(__file__).resolve().parents[1]

BASE = """
total_epsilon = 1.0
total_delta = 1e-6
max_epsilon_per_release = 0.5
n_max = 100000
"""


def write(tmp_path, text):
    p = tmp_path / "p.toml"
    p.write_text(text)
    return p


def test_shipped_policies_load_and_packaged_copy_matches():
    d = P.load_policy(ROOT / "policies" / "default.toml")
    s = P.load_policy(ROOT / "policies" / "strict.toml")
    assert d.accountant == "rdp" and d.data_schema is None
    assert s.allowed_models == ["gaussian_mean", "logistic"]
    assert s.max_delta() == pytest.approx(1e-9)
    packaged = ROOT / "dpsummary" / "resources" / "default_policy.toml"
    assert packaged.read_text() == (ROOT / "policies" / "default.toml").read_text()


def test_default_policy_fallback(tmp_path, monkeypatch):
    monkeypatch.chdir(tmp_path)
    assert P.default_policy().total_epsilon > 0
    (tmp_path / "policies").mkdir()
    shutil.copy(ROOT / "policies" / "strict.toml", tmp_path / "policies" / "default.toml")
    # The packaged default, whatever the working directory holds (issue 13: no silent budget change).
    assert P.default_policy().source_id is None


def test_delta_rule_and_split(tmp_path):
    pol = P.load_policy(write(tmp_path, BASE))
    assert pol.resolve_delta() == pytest.approx(1e-6)  # min(total 1e-6, 0.1/1e5)
    assert pol.resolve_delta(1e-7) == 1e-7
    with pytest.raises(P.PolicyError, match="exceeds"):
        pol.resolve_delta(1e-5)
    n = pol.budget_split.normalised(count=False)
    assert n["count"] == 0 and sum(n.values()) == pytest.approx(1)
    assert n["initialisation"] == 0  # absent from the file: the uniform public start
    d = P.default_policy().budget_split
    assert d.initialisation > 0
    n = d.normalised(count=False, preprocessing=False, quality=False)
    assert n["initialisation"] == pytest.approx(d.initialisation / (d.initialisation + d.optimisation))
    n = d.normalised(initialisation=False)
    assert n["initialisation"] == 0 and sum(n.values()) == pytest.approx(1)
    pol.check_model("linear")
    assert pol.public_inputs()["n_max"] == 100000


@pytest.mark.parametrize(
    ("extra", "match"),
    [
        ("bogus = 1\n", "unknown key"),
        ("allowed_models = ['linear', 'nope']\n", "unknown model 'nope'"),
        ("accountant = 'gdp'\n", "accountant"),
        ("record_count_public = true\n", "record_count"),
        ("record_count = 10\n", "record_count_public"),
        ("[budget_split]\ncount = 0.5\npreprocessing = 0.5\noptimisation = 0.5\n", "sum to 1"),
        ("[budget_split]\ncount = 0.05\npreprocessing = 0.15\ninitialisation = 0.2\noptimisation = 0.8\n",
         "sum to 1"),
        ("[delta_rule]\nmax_delta = 0.1\n", "unknown key"),
        ("[schema]\ncolumns = []\n", "schema"),
    ],
)
def test_invalid_policies(tmp_path, extra, match):
    text = BASE + extra if extra.startswith("[") else extra + BASE
    with pytest.raises(P.PolicyError, match=match) as ei:
        P.load_policy(write(tmp_path, text))
    assert "\n" not in str(ei.value)


def test_malformed_toml_and_missing(tmp_path):
    with pytest.raises(P.PolicyError, match="malformed TOML"):
        P.load_policy(write(tmp_path, "total_epsilon = = 1"))
    with pytest.raises(P.PolicyError, match="not found"):
        P.load_policy(tmp_path / "missing.toml")
    with pytest.raises(P.PolicyError, match="max_epsilon_per_release exceeds"):
        P.load_policy(write(tmp_path, BASE.replace("0.5", "2.0")))
    with pytest.raises(P.PolicyError, match="n_max"):
        P.load_policy(write(tmp_path, BASE.replace("n_max = 100000", "")))


def test_disallowed_model(tmp_path):
    pol = P.load_policy(write(tmp_path, "allowed_models = ['logistic']\n" + BASE))
    with pytest.raises(P.PolicyError, match="not allowed"):
        pol.check_model("linear")


def test_public_schema_and_ledger_path(tmp_path):
    text = (
        "ledger = 'l.jsonl'\nrecord_count_public = true\nrecord_count = 500\n"
        + BASE
        + """
[schema]
target = "y"
[[schema.columns]]
name = "x"
kind = "numeric"
lower = 0
upper = 1
[[schema.columns]]
name = "y"
kind = "categorical"
categories = ["a", "b"]
"""
    )
    pol = P.load_policy(write(tmp_path, text))
    from dpsummary.data import Schema

    assert isinstance(pol.data_schema, Schema) and pol.data_schema.target == "y"
    assert pol.ledger_path() == tmp_path / "l.jsonl"
    assert pol.public_inputs()["record_count"] == 500
    assert P.source_id_from_path("/a/b/data.csv") == "file:data.csv"


def test_policy_with_a_schema_validates_without_torch(tmp_path):
    """Issue 30: the schema lives in the light dpsummary.data.schema, so loading a policy with a
    [schema] (and reading its Schema through dpsummary.data) imports neither torch nor numpy."""
    import subprocess
    import sys

    path = write(tmp_path, BASE + '[schema]\n[[schema.columns]]\nname = "x"\nkind = "numeric"\n'
                 'lower = 0\nupper = 1\n')
    code = (
        "import sys; import dpsummary.policy as P; from dpsummary.data import Schema; "
        f"pol = P.load_policy({str(path)!r}); assert isinstance(pol.data_schema, Schema); "
        "print(sorted(m for m in ('torch', 'numpy') if m in sys.modules))"
    )
    out = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, check=True)
    assert out.stdout.strip() == "[]"


def test_packaged_default_serves_big_tables():
    """Issue 29: a zero-configuration release of a 10^7-row table never meets n_max (it is judged
    on the noisy count: refusal probability Phi((N - n_max) / sigma)), and per-release and
    lifetime delta stay far below 1/N for any table up to 10^9 records."""
    from scipy.stats import norm

    from dpsummary import accounting as acc

    pol = P.default_policy()
    assert pol.max_delta() <= 0.1 / 1e9 and pol.total_delta <= 0.1 / 1e9
    split = pol.budget_split.normalised(count=True, preprocessing=True)
    # The smallest epsilon a zero-configuration release plans at (benchmarks/results/default_policy.md):
    # there the count noise is largest, and the accountant of record must still calibrate it.
    sigma = acc.calibrate_gaussian(target_epsilon=split["count"] * 0.1, delta=pol.max_delta() * 0.9, accountant="rdp")
    assert pol.n_max is not None
    assert norm.cdf((10**7 - pol.n_max) / sigma) < 1e-12


def test_light_model_names_match_registry() -> None:
    """Policy validation checks ``allowed_models`` against the light name list (no torch import);
    it must be exactly the registry's keys."""
    from dpsummary.model_names import MODEL_NAMES
    from dpsummary.models import REGISTRY

    assert set(REGISTRY) == MODEL_NAMES
