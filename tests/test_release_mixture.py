"""``dpsummary release --model gmm|dpgmm`` (mechanism ``dp-kd-tree``) end to end: the noisy
kd-tree of :mod:`dpsummary.private.mixture` through the shared release pipeline (ledger
reservation before any record is read, signing, claim, accountant reproduction, settlement),
the analyst's view, and the zero-configuration path (DP schema without a target).

The mechanism's own privacy tests (sensitivity of every released count vector under add/remove
of an extreme record, decisions on noisy counts only, noise scale, total per-record rule) are in
tests/mixtures/test_private_mixture_tree.py. Noise here comes from OS entropy (not seedable):
every statistical assertion below holds with a margin of at least 5 standard deviations of its
statistic, measured by simulation of the mechanism on this table (40 runs: total weight
3003 ± 174 for N = 3000), so the failure rate is below about 1e-6 per assertion.
"""

from __future__ import annotations

import json
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import numpy as np
import pytest
from release_support import ledger_lines
from typer.testing import CliRunner

import dpsummary
from dpsummary.cli import app

runner = CliRunner()
N = 3000
#: Two numeric columns, bounds [-6, 6]; a categorical column a mixture leaves out.
POLICY = """source_id = "mix-source"
total_epsilon = 5.0
total_delta = 1e-6
max_epsilon_per_release = 2.0
min_records = 50
n_max = 100000
allowed_models = ["gmm", "dpgmm", "logistic"]
{count}
[schema]
target = "group"
[[schema.columns]]
name = "a"
kind = "numeric"
lower = -6
upper = 6
[[schema.columns]]
name = "b"
kind = "numeric"
lower = -6
upper = 6
[[schema.columns]]
name = "group"
kind = "categorical"
categories = ["x", "y", "z"]
"""
#: Component weights, means (the CSV's units) and sds of the synthetic table.
WEIGHTS, MEANS, SDS = [0.6, 0.4], np.array([[-2.0, -2.0], [2.5, 2.0]]), [0.6, 0.5]


def _blobs(path: Path, n: int = N, seed: int = 0) -> Path:
    rng = np.random.default_rng(seed)
    comp = rng.choice(2, size=n, p=WEIGHTS)
    x = MEANS[comp] + rng.normal(size=(n, 2)) * np.array(SDS)[comp, None]
    lines = ["a,b,group"] + [f"{r[0]:.4f},{r[1]:.4f},{'xyz'[c]}" for r, c in zip(x, comp, strict=True)]
    path.write_text("\n".join(lines) + "\n")
    return path


@pytest.fixture(scope="module")
def released(tmp_path_factory: pytest.TempPathFactory) -> Iterator[dict[str, Any]]:
    tmp = tmp_path_factory.mktemp("mixture")
    home = tmp / "home"
    mp = pytest.MonkeyPatch()
    mp.setenv("DPSUMMARY_HOME", str(home))
    data = _blobs(tmp / "blobs.csv")
    pol = tmp / "p.toml"
    pol.write_text(POLICY.format(count=f"record_count_public = true\nrecord_count = {N}\n"))
    out = tmp / "mix.json"
    res = runner.invoke(app, ["release", str(data), "--model", "gmm", "--components", "3", "--epsilon", "1.0",
                              "--policy", str(pol), "--out", str(out), "--seed", "3", "--json"])
    yield {"res": res, "out": out, "home": home, "tmp": tmp, "data": data, "policy": pol}
    mp.undo()


def _payload(path: Path) -> dict[str, Any]:
    import base64

    return json.loads(base64.b64decode(json.loads(path.read_text())["payload"]))


def test_release_signs_a_mixture_summary_of_the_numeric_columns(released: dict[str, Any]) -> None:
    res = released["res"]
    assert res.exit_code == 0, res.output
    assert json.loads(res.stdout)["mechanism"] == "dp-kd-tree"
    rel = dpsummary.load(released["out"], key=released["home"] / "keys" / "dpsummary.pub")
    assert rel.model.name == "gmm" and rel.model.n_components == 3 and rel.model.process == "dirichlet_distribution"
    assert rel.feature_names == ["a", "b"]  # the categorical column is left out
    pts, w = rel.points, rel.weights
    assert pts.shape[1] == 2 and bool((pts.abs() <= 4.0 + 1e-9).all())  # the kd-tree's public box
    assert bool((w > 0).all())
    # Kept leaves carry noisy counts: their total is N up to the noise of the kept leaves, the
    # mass of dropped (below 2 sigma) leaves and the selection of leaves above the threshold;
    # simulated: 3003 ± 174 at this table's sigma (about 18 records). 6.9 sd either side.
    assert 0.6 * N < float(w.sum()) < 1.4 * N
    mix = rel.mixture
    assert mix is not None and mix["columns"] == ["a", "b"]
    heavy = np.argsort(mix["weights"])[::-1][:2]
    found = sorted((np.array(mix["means"])[heavy]).tolist())
    # Both components, in the CSV's units (their sds are 0.5-0.6; the cells are 0.19 wide).
    assert np.allclose(found, sorted(MEANS.tolist()), atol=0.5)
    # The weight near each true component (K = 3 may split one): simulated over 15 releases, the
    # largest deviation was 0.082 (sd about 0.035), so 0.2 is more than 5 sd.
    means, weights = np.array(mix["means"]), np.array(mix["weights"])
    nearest = np.argmin(np.linalg.norm(means[:, None, :] - MEANS[None], axis=2), axis=1)
    assert [float(weights[nearest == k].sum()) for k in range(2)] == pytest.approx(WEIGHTS, abs=0.2)


def test_claim_ledger_and_accountant_agree(released: dict[str, Any]) -> None:
    from dp_accounting import dp_event as dpe
    from opacus.accountants import RDPAccountant

    from dpsummary import accounting as acc

    payload = _payload(released["out"])
    claim = payload["predicate"]["claim"]
    mech = claim["mechanism"]
    assert mech["name"] == "dp-kd-tree" and mech["levels"] == mech["max_depth"] + 1 == 13  # min(6 x 2, 36) + 1
    sigma = mech["noise_multiplier"]
    tree_event = dpe.SelfComposedDpEvent(dpe.GaussianDpEvent(sigma), mech["levels"])
    events = acc.events_from_json(claim["events"])
    assert tree_event in events
    eps = acc.epsilon(events, claim["delta"], "rdp")
    assert eps == pytest.approx(claim["epsilon"]["rdp"], rel=1e-9) and eps <= 1.0 + 1e-6
    # The tree alone, by Opacus's own accountant (sample rate 1: plain Gaussian composition).
    opacus = RDPAccountant()
    opacus.history = [(sigma, 1.0, mech["levels"])]
    ours = acc.epsilon([tree_event], claim["delta"], "rdp")
    assert ours == pytest.approx(opacus.get_epsilon(claim["delta"], alphas=list(acc.RDP_ORDERS)), rel=1e-6)
    entries = [e for e in ledger_lines(released["home"]) if e.get("source_id") == "mix-source"]
    kinds = [(e["kind"], e.get("stage")) for e in entries]
    assert ("reserve", "dp-kd-tree") in kinds and any(k == "commit" for k, _ in kinds)


def test_analyst_refits_but_does_not_sample_a_mixture(released: dict[str, Any]) -> None:
    rel = dpsummary.load(released["out"], key=released["home"] / "keys" / "dpsummary.pub")
    with pytest.raises(ValueError, match="fit_mixture"):
        rel.sample(10)
    fit = rel.fit_mixture(n_components=2, seed=0)
    weights = np.sort(fit.posterior.expected_weights())
    assert weights == pytest.approx(sorted(WEIGHTS), abs=0.2)


def test_zero_configuration_dpgmm_needs_no_target(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    """No schema and no count in the policy: the DP schema is estimated without a target (the
    three-category column would refuse as a GLM target) and the categorical column is left out."""
    home = tmp_path / "home"
    monkeypatch.setenv("DPSUMMARY_HOME", str(home))
    data = _blobs(tmp_path / "blobs.csv", n=4000, seed=1)
    pol = tmp_path / "p.toml"
    pol.write_text(POLICY.split("[schema]")[0].format(count=""))
    out = tmp_path / "z.json"
    res = runner.invoke(app, ["release", str(data), "--model", "dpgmm", "--epsilon", "1.5", "--policy", str(pol),
                              "--out", str(out), "--json"])
    assert res.exit_code == 0, res.output
    rel = dpsummary.load(out, key=home / "keys" / "dpsummary.pub")
    assert rel.model.name == "dpgmm" and rel.feature_names == ["a", "b"]
    assert rel.mixture is not None and len(rel.mixture["weights"]) >= 2


def test_a_failure_after_the_reservation_leaves_it_charged_and_writes_nothing(
        tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    from dpsummary.plan import ReleaseRequest
    from dpsummary.release import run_release

    home = tmp_path / "home"
    monkeypatch.setenv("DPSUMMARY_HOME", str(home))
    data = _blobs(tmp_path / "blobs.csv", n=500)
    pol = tmp_path / "p.toml"
    pol.write_text(POLICY.format(count="record_count_public = true\nrecord_count = 500\n"))
    out = tmp_path / "never.json"

    def crash(name: str) -> None:
        if name == "initialised":
            raise RuntimeError("injected")

    with pytest.raises(RuntimeError, match="injected"):
        run_release(ReleaseRequest(data=data, epsilon=0.5, model="gmm", policy=pol, out=out), checkpoint=crash)
    assert not out.exists()
    kinds = [e["kind"] for e in ledger_lines(home) if e.get("source_id") == "mix-source"]
    assert "reserve" in kinds and "abort" in kinds and "commit" not in kinds


@pytest.mark.parametrize(("args", "fragment"), [
    (["--model", "gmm", "--target", "a"], "--target"),
    (["--model", "gmm", "--components", "0"], "--components"),
    (["--model", "gmm", "--mechanism", "dp-psvi"], "dp-kd-tree"),
    (["--model", "logistic", "--mechanism", "dp-kd-tree"], "gmm"),
    (["--model", "dpgmm", "--engine", "spark"], "--engine local"),
])
def test_public_refusals_reserve_nothing(args: list[str], fragment: str, tmp_path: Path,
                                         monkeypatch: pytest.MonkeyPatch) -> None:
    home = tmp_path / "home"
    monkeypatch.setenv("DPSUMMARY_HOME", str(home))
    data = _blobs(tmp_path / "blobs.csv", n=200)
    pol = tmp_path / "p.toml"
    pol.write_text(POLICY.format(count="record_count_public = true\nrecord_count = 200\n"))
    res = runner.invoke(app, ["release", str(data), "--epsilon", "0.5", "--policy", str(pol), *args])
    errors = [x for x in res.output.splitlines() if x.startswith("error:")]
    assert res.exit_code == 2 and len(errors) == 1 and fragment in errors[0], res.output
    assert not [e for e in ledger_lines(home) if e["kind"] == "reserve"]


def test_selftest_mixture_checks_pass_and_catch_injected_bugs(monkeypatch: pytest.MonkeyPatch) -> None:
    """``dpsummary selftest``'s mixture block: ok on the product; a halved noise fails the noise
    check (6 standard errors: false alarm below 2e-9); a count that weighs a record twice (a
    sensitivity bug) fails the coupled replay (its move is exactly 2 > 1)."""
    from dpsummary import selftest as st
    from dpsummary.private import mixture as pm

    good = st.mixture_checks()
    # One record moves the counts by the sensitivity less the float slack (issue 35: ~4.9e-4).
    assert good.ok and good.replay_max_move == pytest.approx(1.0, rel=1e-3) and good.replay_max_move <= 1.0
    assert good.replay_same_output
    assert good.accountant_epsilon == pytest.approx(good.opacus_epsilon, rel=1e-6)
    half = st.mixture_checks(inject="half-noise", noise_path="numpy")
    assert not half.ok and half.failed == ["noise scale"]
    real = pm.exact_node_counts
    monkeypatch.setattr(pm, "exact_node_counts", lambda *a, **k: 2.0 * real(*a, **k))
    bug = st.mixture_checks(noise_path="numpy")
    assert not bug.ok and "coupled replay" in bug.failed and bug.replay_max_move == pytest.approx(2.0, rel=1e-3)


def test_samplers_and_the_report_refuse_a_mixture_in_one_line(released: dict[str, Any]) -> None:
    """Stan/PyMC/NumPyro/JSON cannot express a mixture summary and the curator's report compares
    parameter posteriors: both refuse with one ``error:`` line (exit 2), never an internal error."""
    key = str(released["home"] / "keys" / "dpsummary.pub")
    for to in ("stan", "numpyro", "json"):
        res = runner.invoke(app, ["export", str(released["out"]), "--to", to, "--out", str(released["tmp"] / to),
                                  "--key", key])
        assert res.exit_code == 2 and "fit_mixture" in res.output and "internal error" not in res.output
    res = runner.invoke(app, ["report", str(released["out"]), str(released["data"]), "--key", key,
                              "--out", str(released["tmp"] / "r.html")])
    assert res.exit_code != 0 and "benchmarks/mixtures.py" in res.output and "internal error" not in res.output
    res = runner.invoke(app, ["inspect", str(released["out"]), "--key", key])
    assert res.exit_code == 0 and "3 components over 2 numeric columns" in res.output and "dp-kd-tree" in res.output
    claim = _payload(released["out"])["predicate"]["claim"]
    assert claim["sampling"] == "none (every record)"
