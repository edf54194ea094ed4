"""End-to-end tests of ``dpsummary release`` (CliRunner) and its refusals.

Every refusal must be a one-line error with a non-zero exit that writes no artifact; refusals
before any data touch must also leave the ledger without a reservation.
"""

from __future__ import annotations

import json
import re
from pathlib import Path

import numpy as np
import pytest
from release_support import ledger_lines as _ledger_lines
from release_support import mentions_number, seeded_privacy_randomness
from release_support import write_csv as _write_csv
from release_support import write_policy as _policy
from typer.testing import CliRunner

from dpsummary.cli import app

runner = CliRunner()


@pytest.fixture()
def home(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> Path:
    h = tmp_path / "home"
    monkeypatch.setenv("DPSUMMARY_HOME", str(h))
    return h


def _release(*args: str) -> object:
    return runner.invoke(app, ["release", *args])


def test_release_with_public_schema_end_to_end(tmp_path: Path, home: Path) -> None:
    data = _write_csv(tmp_path / "d.csv", 600)
    pol = _policy(tmp_path / "p.toml", n=600)
    out = tmp_path / "r.json"
    res = _release(str(data), "--epsilon", "1", "--policy", str(pol), "--out", str(out), "--steps", "30",
                   "--size", "5", "--json", "--seed", "1")
    assert res.exit_code == 0, res.output
    payload = json.loads(res.stdout[res.stdout.index("{"):])
    assert payload["epsilon"]["rdp"] <= 1.0 + 1e-12
    assert payload["epsilon"]["pld"] <= payload["epsilon"]["rdp"]
    assert out.exists()
    # Nothing data-derived in what was printed: no exact record count, no batch size.
    assert not mentions_number(res.stdout, 600)
    entries = _ledger_lines(home)
    assert [e["kind"] for e in entries] == ["reserve", "commit"]  # N and schema public: one stage
    # The artifact verifies and inspect shows its claim.
    pub = home / "keys" / "dpsummary.pub"
    assert runner.invoke(app, ["verify", str(out), "--key", str(pub)]).exit_code == 0
    audit = runner.invoke(app, ["audit", str(home / "ledger.jsonl"), "--key", str(pub), "--policy", str(pol)])
    assert audit.exit_code == 0, audit.output


def test_release_recorded_mechanism_reproduces_opacus(tmp_path: Path, home: Path) -> None:
    from opacus.accountants import RDPAccountant

    from dpsummary.accounting import RDP_ORDERS
    from dpsummary.artifact import read_artifact

    data = _write_csv(tmp_path / "d.csv", 600)
    pol = _policy(tmp_path / "p.toml", n=600)
    out = tmp_path / "r.json"
    res = _release(str(data), "--epsilon", "0.7", "--policy", str(pol), "--out", str(out), "--steps", "25", "--size", "4",
                   "--mechanism", "dp-psvi")
    assert res.exit_code == 0, res.output
    _, claim, _ = read_artifact(out, allow_unsigned=True)
    mech = claim["mechanism"]
    acc = RDPAccountant()
    for _ in range(mech["steps"]):
        acc.step(noise_multiplier=mech["noise_multiplier"], sample_rate=mech["sample_rate"])
    opacus_eps = acc.get_epsilon(claim["delta_accounting"], alphas=RDP_ORDERS)
    assert opacus_eps == pytest.approx(claim["epsilon"]["rdp"], abs=1e-9)
    # Opacus itself (not only dpsummary's vectorised evaluation) finds the target met.
    assert opacus_eps <= 0.7


SPLIT_WITH_INIT = "[budget_split]\ncount = 0.05\npreprocessing = 0.15\ninitialisation = 0.2\noptimisation = 0.6\n"


def test_dp_initialisation_is_accounted_and_reproduces_opacus(tmp_path: Path, home: Path) -> None:
    """With an initialisation share (logistic model), the release runs one extra Gaussian
    mechanism (the DP histograms) before DP-PSVI: it is in the ledger, the claim and the budget
    split, and Opacus composes the recorded mechanisms to the claimed epsilon, within target."""
    from opacus.accountants import RDPAccountant

    from dpsummary.accounting import RDP_ORDERS, events_from_json
    from dpsummary.artifact import read_artifact

    data = _write_csv(tmp_path / "d.csv", 3000)
    pol = tmp_path / "p.toml"
    # TOML tables must come after the top-level keys: put the split after the schema.
    _policy(pol, n=3000)
    pol.write_text(pol.read_text() + "\n" + SPLIT_WITH_INIT)
    out = tmp_path / "r.json"
    res = _release(str(data), "--epsilon", "0.5", "--policy", str(pol), "--out", str(out), "--steps", "25",
                   "--size", "6", "--json", "--mechanism", "dp-psvi")
    assert res.exit_code == 0, res.output
    _, claim, _ = read_artifact(out, allow_unsigned=True)
    init = claim["mechanism"]["initialisation"]
    assert init is not None and init["columns"] == ["x1", "x2"]
    events = events_from_json(claim["events"])
    assert len(events) == 2  # the histograms (Gaussian) and DP-PSVI (Poisson-subsampled Gaussian, T steps)
    split = claim["budget_split"]
    assert split["initialisation"] > 0 and split["count"] == split["preprocessing"] == 0
    acc = RDPAccountant()
    acc.step(noise_multiplier=init["noise_multiplier"], sample_rate=1.0)  # a plain Gaussian mechanism
    for _ in range(claim["mechanism"]["steps"]):
        acc.step(noise_multiplier=claim["mechanism"]["noise_multiplier"], sample_rate=claim["mechanism"]["sample_rate"])
    opacus_eps = acc.get_epsilon(claim["delta_accounting"], alphas=RDP_ORDERS)
    assert opacus_eps == pytest.approx(claim["epsilon"]["rdp"], abs=1e-9)
    assert opacus_eps <= 0.5
    # The histogram event is charged in the same reservation as DP-PSVI.
    reserve = [e for e in _ledger_lines(home) if e["kind"] == "reserve"]
    assert len(reserve) == 1 and len(reserve[0]["events"]) == 2
    assert "DP per-column histograms" in res.output
    assert not mentions_number(res.stdout, 3000)
    # The auditor recomputes the two-event charge from the ledger alone.
    pub = home / "keys" / "dpsummary.pub"
    audit = runner.invoke(app, ["audit", str(home / "ledger.jsonl"), "--key", str(pub), "--policy", str(pol)])
    assert audit.exit_code == 0, audit.output


def test_poisson_release_starts_from_dp_histograms_of_the_features_and_the_count(tmp_path: Path, home: Path) -> None:
    """Issue 28: Poisson DP-PSVI takes the initialisation share too (the bootstrap then draws
    synthetic features from the histograms, not the public box); the count target is
    histogrammed with the features, and the two events compose to the claimed epsilon."""
    data = _write_csv(tmp_path / "c.csv", 3000, target="count")
    pol = tmp_path / "p.toml"
    _policy(pol, n=3000, target_kind="count")
    pol.write_text(pol.read_text() + "\n" + SPLIT_WITH_INIT)
    out = tmp_path / "r.json"
    res = _release(str(data), "--epsilon", "0.5", "--policy", str(pol), "--out", str(out), "--steps", "10",
                   "--size", "4", "--mechanism", "dp-psvi")
    assert res.exit_code == 0, res.output
    from dpsummary import accounting as A
    from dpsummary.artifact import read_artifact

    _, claim, _ = read_artifact(out, allow_unsigned=True)
    init = claim["mechanism"]["initialisation"]
    assert init is not None and init["columns"] == ["x1", "x2", "y"]
    assert claim["budget_split"]["initialisation"] > 0
    assert len(claim["events"]) == 2
    eps = A.epsilon_rdp(A.events_from_json(claim["events"]), claim["delta_accounting"])
    assert eps == pytest.approx(claim["epsilon"]["rdp"], abs=1e-9) and eps <= 0.5
    assert "DP per-column histograms" in " ".join(res.output.split())  # the console wraps lines


def test_default_poisson_release_clips_the_count_at_a_dp_quantile(tmp_path: Path, home: Path) -> None:
    """Issue 37's twelfth rule: the default mechanism's Poisson release spends a declared share on
    one Gaussian histogram of the count, whose noisy 99.9% quantile's bin edge (at most the
    schema's bound) is the clip bound every round uses; the claim and the console say so, and
    the events (the histogram's first) compose to the claimed epsilon."""
    from dpsummary import accounting as A
    from dpsummary import noise_aware
    from dpsummary.artifact import read_artifact

    data = _write_csv(tmp_path / "c.csv", 3000, target="count")
    pol = tmp_path / "p.toml"
    _policy(pol, n=3000, target_kind="count")
    out = tmp_path / "r.json"
    res = _release(str(data), "--epsilon", "0.5", "--policy", str(pol), "--out", str(out), "--size", "4")
    assert res.exit_code == 0, res.output
    _, claim, _ = read_artifact(out, allow_unsigned=True)
    mech = claim["mechanism"]
    assert mech["name"] == "noise-aware-newton"
    cr = mech["count_range"]
    sigma = mech["single_gaussian_noise_multiplier"]
    assert cr["noise_multiplier"] == pytest.approx(sigma / noise_aware.COUNT_RANGE_SHARE ** 0.5)
    assert 0.0 <= cr["clip_bound"] <= cr["schema_bound"] and mech["bounds"]["target_bound"] == cr["clip_bound"]
    assert mech["schedule"]["count_range_share"] == noise_aware.COUNT_RANGE_SHARE
    events = A.events_from_json(claim["events"])
    eps = A.epsilon_rdp(events, claim["delta_accounting"])
    assert eps == pytest.approx(claim["epsilon"]["rdp"], abs=1e-9) and eps <= 0.5
    assert "count target" in " ".join(res.output.split())
    shown = runner.invoke(app, ["inspect", str(out), "--key", str(home / "keys" / "dpsummary.pub")])
    flat = " ".join(shown.output.split())
    assert shown.exit_code == 0 and "count clip: 1 Gaussian histogram of the count" in flat
    assert f"the {2 * len(mech['rounds']) + 1} releases compose to one Gaussian" in flat


def test_linear_release_keeps_the_uniform_start_and_gives_the_share_to_optimisation(
    tmp_path: Path, home: Path
) -> None:
    """A model outside DP_INITIALISATION_MODELS (linear regression) starts uniformly over the
    public box, and its initialisation share goes to the optimisation."""
    data = _write_csv(tmp_path / "r.csv", 3000, target="real")
    pol = tmp_path / "p.toml"
    _policy(pol, n=3000, target_kind="real")
    pol.write_text(pol.read_text() + "\n" + SPLIT_WITH_INIT)
    out = tmp_path / "r.json"
    res = _release(str(data), "--epsilon", "0.5", "--policy", str(pol), "--out", str(out), "--steps", "10",
                   "--size", "4", "--mechanism", "dp-psvi", "--model", "linear")
    assert res.exit_code == 0, res.output
    from dpsummary import accounting as A
    from dpsummary.artifact import read_artifact

    _, claim, _ = read_artifact(out, allow_unsigned=True)
    assert claim["mechanism"]["initialisation"] is None
    assert claim["budget_split"]["initialisation"] == 0
    assert len(claim["events"]) == 1
    # All of the target went to the optimisation: its epsilon is the target (to calibration tolerance).
    assert A.epsilon_rdp(A.events_from_json(claim["events"]), claim["delta_accounting"]) == pytest.approx(0.5, rel=1e-3)


def test_zero_configuration_release_is_private_end_to_end(tmp_path: Path, home: Path) -> None:
    data = _write_csv(tmp_path / "big.csv", 30000, seed=3)
    out = tmp_path / "z.json"
    res = _release(str(data), "--epsilon", "0.5", "--out", str(out), "--steps", "20", "--size", "5",
                   "--mechanism", "dp-psvi")
    assert res.exit_code == 0, res.output
    entries = _ledger_lines(home)
    stages = [(e["kind"], e["stage"]) for e in entries]
    assert stages == [("reserve", "count-and-schema"), ("commit", "count-and-schema"),
                      ("reserve", "dp-psvi"), ("commit", "dp-psvi")]
    assert entries[0]["hold_epsilon"] == pytest.approx(0.5)
    assert entries[0]["extra_delta"] > 0  # partition selection of the DP schema
    assert "schema estimated privately" in res.output
    assert not mentions_number(res.output, 30000)
    # The default policy gives the quality counts and the DP initialisation a share (binary target:
    # logistic model): three events in stage 2.
    assert len(entries[2]["events"]) == 3
    assert "DP per-column histograms" in res.output


def test_zero_configuration_default_mechanism_is_noise_aware(tmp_path: Path, home: Path) -> None:
    """The README's main job in miniature: zero configuration, the default (noise-aware)
    mechanism, a noise-aware summary by default and the raw one on request."""
    import dpsummary

    data = _write_csv(tmp_path / "big.csv", 20000, seed=4)
    out = tmp_path / "z.json"
    res = _release(str(data), "--epsilon", "0.5", "--out", str(out), "--size", "8")
    assert res.exit_code == 0, res.output
    entries = _ledger_lines(home)
    assert [(e["kind"], e["stage"]) for e in entries] == [
        ("reserve", "count-and-schema"), ("commit", "count-and-schema"),
        ("reserve", "noise-aware-newton"), ("commit", "noise-aware-newton")]
    assert len(entries[2]["events"]) == 2  # quality counts; the noise-aware rounds (composed)
    assert len({e["time"] for e in entries}) == 1  # every entry carries the release's start
    rel = dpsummary.load(out, key=home / "keys" / "dpsummary.pub")
    assert rel.noise_aware
    assert rel.claim["mechanism"]["name"] == "noise-aware-newton"
    assert rel.body["created"] == entries[0]["time"]
    # Issue 25: no raw (noise-unaware) summary any more; asking for it is a one-line error.
    assert "raw_summary" not in rel.body and set(rel.body["posterior"]["gaussians"]) == {"noise_aware"}
    from dpsummary.analyst import ReleaseFormatError

    with pytest.raises(ReleaseFormatError, match="no raw summary"):
        dpsummary.load(out, key=home / "keys" / "dpsummary.pub", posterior="raw")
    assert np.all(np.isfinite(np.array(rel.body["posterior"]["gaussians"]["noise_aware"]["cov"])))


def test_default_release_is_the_prior_along_the_one_hot_relation(tmp_path: Path, home: Path,
                                                                   monkeypatch: pytest.MonkeyPatch) -> None:
    """Issue 50's thirty-ninth rule: the default logistic release projects its imputed curvature
    off the exact one-hot relation of the categorical ``x2`` (every record has one of a, b, c), says
    so in its notes and lists the relation in its claim; along it the signed Gaussian is the
    prior's (variance 1, mean 0), as the full data's posterior is. The privacy noise is seeded
    (tests only): with OS noise, an exact relation is missed whenever its noise exceeds 3 sds
    (``RELATION_Z``), one release in 740, so unseeded this test would fail that often."""
    import dpsummary

    seeded_privacy_randomness(monkeypatch, 50)

    data = _write_csv(tmp_path / "d.csv", 3000, seed=2)
    pol = _policy(tmp_path / "p.toml", n=3000)
    out = tmp_path / "r.json"
    res = _release(str(data), "--epsilon", "1", "--policy", str(pol), "--out", str(out), "--seed", "1", "--json")
    assert res.exit_code == 0, res.output
    payload = json.loads(res.stdout[res.stdout.index("{"):])
    rel = dpsummary.load(out, key=home / "keys" / "dpsummary.pub")
    mech = rel.claim["mechanism"]
    assert mech["name"] == "noise-aware-newton" and mech["schedule"]["relations"]
    assert mech["exact_relations"] == [[1.0, 0.0, -1.0, -1.0, -1.0]]
    assert mech["schedule"]["curvature_support"] and mech["curvature_support"] is True  # the fortieth rule
    assert any("exact relation" in note for note in payload["notes"])
    gauss = rel.body["posterior"]["gaussians"]["noise_aware"]
    v = np.array([1.0, 0.0, -1.0, -1.0, -1.0]) / 2.0
    assert float(v @ np.array(gauss["cov"]) @ v) == pytest.approx(1.0, rel=1e-6)
    assert float(v @ np.array(gauss["mean"])) == pytest.approx(0.0, abs=1e-6)


def test_noise_aware_pseudocoreset_has_a_point_per_parameter(tmp_path: Path, home: Path) -> None:
    """--size below the parameter count is a floor for the noise-aware mechanism (fewer points
    cannot carry a full-rank posterior), said in the notes; the pseudocoreset then carries its
    signed Gaussian exactly (the closed form)."""
    import dpsummary
    from dpsummary.gaussian import GaussianPosterior
    from dpsummary.inference import coreset_posterior
    from dpsummary.metrics import gaussian_kl

    data = _write_csv(tmp_path / "d.csv", 3000, seed=3)
    pol = _policy(tmp_path / "p.toml", n=3000)
    out = tmp_path / "r.json"
    res = _release(str(data), "--epsilon", "1", "--policy", str(pol), "--out", str(out), "--size", "2", "--json")
    assert res.exit_code == 0, res.output
    payload = json.loads(res.stdout[res.stdout.index("{"):])
    rel = dpsummary.load(out, key=home / "keys" / "dpsummary.pub")
    d = rel.model.param_dim
    assert d > 2 and rel.summary.size == d == payload["size"]
    notes = " ".join(payload["notes"])
    assert f"pseudocoreset of {d} points" in notes and "--size 2" in notes
    info = rel.body["summary"]["info"]
    # The public schema's three-level x2 is one-hot beside the intercept, a direction only the prior
    # identifies; the privacy noise (OS entropy, not seedable) sometimes makes the imputed Gaussian
    # a little wider than the prior there, which no pseudocoreset can carry: then the release must
    # say so (and may keep the Adam fit), otherwise the closed form carries the Gaussian exactly.
    if info["directions_wider_than_prior"] > 0:
        assert "wider than the prior" in notes
        return
    if info["match_method"] == "exact-posterior moments":
        # Issue 48: the pseudocoreset's exact posterior carries the signed Gaussian's moments.
        match = rel.body["posterior"]["pseudocoreset_match"]
        assert match["agrees"] is True and "matched to the noise-aware Gaussian's moments" in notes
        return
    assert info["match_method"] == "closed form" and "closed form" in notes
    import torch

    g = rel.body["posterior"]["gaussians"]["noise_aware"]
    cov = torch.tensor(g["cov"], dtype=torch.float64)
    target = GaussianPosterior(torch.tensor(g["mean"], dtype=torch.float64), torch.linalg.cholesky(cov))
    post = coreset_posterior(rel.model, rel.summary.points, rel.summary.weights)
    assert gaussian_kl(post, target) < 1e-3 and gaussian_kl(target, post) < 1e-3


@pytest.mark.parametrize(
    ("content", "message"),
    [
        (None, "not found"),
        ("", "empty"),
        ("x1,,y\n1,a,yes\n", "empty column name"),
    ],
)
def test_public_file_problems_refused_before_touching_budget(
    tmp_path: Path, home: Path, content: str | None, message: str
) -> None:
    data = tmp_path / "bad.csv"
    if content is not None:
        data.write_text(content)
    pol = _policy(tmp_path / "p.toml", n=600)
    out = tmp_path / "o.json"
    res = _release(str(data), "--epsilon", "0.5", "--policy", str(pol), "--out", str(out))
    assert res.exit_code == 2
    lines = [x for x in res.output.strip().splitlines() if x.startswith("error:")]
    assert len(lines) == 1 and "Traceback" not in res.output
    assert message.lower() in lines[0].lower()
    assert not re.search(r"\brow \d+|line \d+", lines[0])  # no data-derived positions
    assert not out.exists()
    assert _ledger_lines(home) == []


@pytest.mark.parametrize(
    "content",
    [
        "x1,x2,y\n1,a,yes\n2,b\n",  # a ragged row: dropped
        "x1,x2,y\nnan,a,yes\n2,b,no\n",  # non-finite numerics: imputed
        "x1,x2,y\ninf,a,yes\n2,b,no\n",
        "x1,x2,y\nabc,a,yes\n2,b,no\n",  # non-numeric numeric: imputed
        "x1,x2,y\n1,a,\n2,b,no\n",  # missing target: dropped
        "x1,x2,y\n",  # a header and no records: the public count says 600; nothing refuses
    ],
)
def test_record_content_never_refuses(tmp_path: Path, home: Path, content: str) -> None:
    data = tmp_path / "d.csv"
    data.write_text(content)
    pol = _policy(tmp_path / "p.toml", n=600)
    out = tmp_path / "o.json"
    res = _release(str(data), "--epsilon", "0.5", "--policy", str(pol), "--out", str(out), "--steps", "5",
                   "--size", "3")
    assert res.exit_code == 0, res.output
    assert out.exists()


@pytest.mark.parametrize(
    ("args", "message"),
    [
        (["--epsilon", "0"], "epsilon"),
        (["--epsilon", "-1"], "epsilon"),
        (["--epsilon", "nan"], "epsilon"),
        (["--epsilon", "5"], "cap"),
        (["--epsilon", "0.5", "--calibrate-to", "pld"], "accountant"),
        (["--epsilon", "0.5", "--delta", "0.5"], "delta"),
        (["--epsilon", "0.5", "--model", "nosuch"], "model"),
        (["--epsilon", "0.5", "--size", "0"], "size"),
    ],
)
def test_bad_options_refused(tmp_path: Path, home: Path, args: list[str], message: str) -> None:
    data = _write_csv(tmp_path / "d.csv", 300)
    pol = _policy(tmp_path / "p.toml", n=300)
    out = tmp_path / "o.json"
    res = _release(str(data), *args, "--policy", str(pol), "--out", str(out))
    assert res.exit_code != 0
    assert "Traceback" not in res.output
    assert message in res.output.lower()
    assert not out.exists()
    assert _ledger_lines(home) == []


def test_non_binary_target_for_logistic_refused(tmp_path: Path, home: Path) -> None:
    data = _write_csv(tmp_path / "d.csv", 300, target="count")
    pol = _policy(tmp_path / "p.toml", n=300, target_kind="count")
    out = tmp_path / "o.json"
    res = _release(str(data), "--epsilon", "0.5", "--policy", str(pol), "--out", str(out), "--model", "logistic")
    assert res.exit_code != 0 and "binary" in res.output
    assert not out.exists()


def test_too_few_records_judged_on_public_count(tmp_path: Path, home: Path) -> None:
    data = _write_csv(tmp_path / "d.csv", 40)
    pol = _policy(tmp_path / "p.toml", n=40)
    out = tmp_path / "o.json"
    res = _release(str(data), "--epsilon", "0.5", "--policy", str(pol), "--out", str(out))
    assert res.exit_code != 0 and "too few records" in res.output
    assert not out.exists()


def test_budget_exhaustion_refuses_before_touching_data(tmp_path: Path, home: Path) -> None:
    from dpsummary import keys
    from dpsummary.audit import audit
    from dpsummary.policy import load_policy

    data = _write_csv(tmp_path / "d.csv", 600)
    pol = _policy(tmp_path / "p.toml", n=600)
    outcomes = []
    for i in range(5):
        before = len(_ledger_lines(home))
        res = _release(str(data), "--epsilon", "1.5", "--policy", str(pol), "--out", str(tmp_path / f"o{i}.json"),
                       "--steps", "10", "--size", "3")
        outcomes.append(res.exit_code == 0)
        if res.exit_code != 0:
            assert "budget" in res.output and not (tmp_path / f"o{i}.json").exists()
            assert len(_ledger_lines(home)) == before  # refused under the lock: nothing reserved
    assert outcomes[0] and not outcomes[-1]
    report = audit(home / "ledger.jsonl", keys.load_public_key(home / "keys" / "dpsummary.pub"), load_policy(pol))
    assert report.ok
    (src,) = report.sources
    assert src.composed_rdp <= 3.0 < src.naive_sum_rdp + 1.5  # within budget; composition beats the naive sum


@pytest.mark.parametrize(
    ("policy_text", "message"),
    [
        ("total_epsilon = [1\n", "policy"),
        ("total_epsilon = 1.0\ntotal_delta = 1e-6\nmax_epsilon_per_release = 0.5\nn_max = 1000\nbogus = 1\n", "bogus"),
        ("total_epsilon = 1.0\ntotal_delta = 1e-6\nmax_epsilon_per_release = 0.5\nn_max = 1000\n"
         "allowed_models = [\"nosuch\"]\n", "nosuch"),
    ],
)
def test_bad_policy_is_one_line_and_writes_nothing(tmp_path: Path, home: Path, policy_text: str, message: str) -> None:
    data = _write_csv(tmp_path / "d.csv", 300)
    pol = tmp_path / "bad.toml"
    pol.write_text(policy_text)
    out = tmp_path / "o.json"
    res = _release(str(data), "--epsilon", "0.5", "--policy", str(pol), "--out", str(out))
    assert res.exit_code != 0 and "Traceback" not in res.output
    errors = [x for x in res.output.splitlines() if x.startswith("error:")]
    assert len(errors) == 1 and message in errors[0]
    assert not out.exists() and not (home / "ledger.jsonl").exists()


def test_missing_key_file_and_foreign_ledger(tmp_path: Path, home: Path) -> None:
    data = _write_csv(tmp_path / "d.csv", 600)
    pol = _policy(tmp_path / "p.toml", n=600)
    out = tmp_path / "o.json"
    res = _release(str(data), "--epsilon", "0.5", "--policy", str(pol), "--out", str(out), "--key", str(tmp_path / "nokey.key"))
    assert res.exit_code != 0 and "Traceback" not in res.output and not out.exists()
    assert not (home / "ledger.jsonl").exists()
    # A release, then an audit of its ledger with somebody else's public key: refused.
    assert _release(str(data), "--epsilon", "0.5", "--policy", str(pol), "--out", str(out), "--steps", "5",
                    "--size", "3").exit_code == 0
    other = runner.invoke(app, ["keygen", "--dir", str(tmp_path / "other")])
    assert other.exit_code == 0
    res = runner.invoke(app, ["audit", str(home / "ledger.jsonl"), "--key", str(tmp_path / "other" / "dpsummary.pub"),
                              "--policy", str(pol)])
    assert res.exit_code != 0
    res = runner.invoke(app, ["verify", str(out), "--key", str(tmp_path / "other" / "dpsummary.pub")])
    assert res.exit_code != 0 and "Traceback" not in res.output


def test_one_vs_rest_target_releases_end_to_end(tmp_path: Path, home: Path) -> None:
    """A categorical target declared (or estimated, tests/test_preprocess.py) as one class against
    every other value (``other_class``) releases a logistic summary whose transform names the
    positive class as the rest; values outside the listed class, 'maybe' included, are 1."""
    import dpsummary

    data = _write_csv(tmp_path / "d.csv", 800, extra_rows=["4.000,a,maybe"])
    pol = _policy(tmp_path / "p.toml", n=801)
    pol.write_text(pol.read_text().replace('categories = ["no", "yes"]', 'categories = ["no"]\nother_class = true'))
    out = tmp_path / "r.json"
    res = _release(str(data), "--epsilon", "1", "--policy", str(pol), "--out", str(out), "--size", "5")
    assert res.exit_code == 0, res.output
    rel = dpsummary.load(out, key=home / "keys" / "dpsummary.pub")
    assert rel.transform.positive_class == "any value other than 'no'"
    assert rel.claim["mechanism"]["name"] == "noise-aware-newton"
    assert np.all(np.isfinite(np.array(rel.body["posterior"]["gaussians"]["noise_aware"]["mean"])))


def test_positive_class_releases_whatever_the_target_holds(tmp_path: Path, home: Path) -> None:
    """``--positive-class``: the target is public, so zero configuration does not estimate it and
    its content cannot make the release refuse: a target that never holds the named class
    (every value 'yes', 'no' named) still releases, every record encoded 0."""
    import dpsummary

    data = _write_csv(tmp_path / "c.csv", 6000, seed=5, target="constant")
    out = tmp_path / "c.json"
    res = _release(str(data), "--epsilon", "0.5", "--out", str(out), "--size", "5", "--positive-class", "no")
    assert res.exit_code == 0, res.output
    flat = " ".join(res.output.split())
    assert "target 'y': binary, public (--positive-class): 1 = 'no'" in flat
    assert "one record touches 4 of them" in flat  # x1 and x2 only: the target is not counted
    rel = dpsummary.load(out, key=home / "keys" / "dpsummary.pub")
    assert rel.transform.positive_class == "no"
    target = rel.transform.schema.column("y")
    assert target.categories == ["no"] and target.other_class and target.positive == "no"
    # The claim's public inputs say the target was public, and inspect shows it.
    assert rel.claim["public_inputs"]["target"] == {"name": "y", "kind": "categorical", "categories": ["no"],
                                                    "positive": "no", "other_class": True}
    shown = runner.invoke(app, ["inspect", str(out), "--key", str(home / "keys" / "dpsummary.pub")])
    assert shown.exit_code == 0 and "public (--positive-class): y, 1 = no" in " ".join(shown.output.split())
    assert rel.claim["mechanism"]["name"] == "noise-aware-newton"
    assert [(e["kind"], e["stage"]) for e in _ledger_lines(home)] == [
        ("reserve", "count-and-schema"), ("commit", "count-and-schema"),
        ("reserve", "noise-aware-newton"), ("commit", "noise-aware-newton")]


def _numeric_target_csv(path: Path, n: int, codes: tuple[str, str], share: float, seed: int) -> Path:
    rng = np.random.default_rng(seed)
    x = rng.normal(size=n)
    y = np.where(rng.uniform(size=n) < share, codes[1], codes[0])
    path.write_text("x1,y\n" + "".join(f"{a:.4f},{b}\n" for a, b in zip(x, y, strict=True)))
    return path


def test_zero_config_logistic_reads_a_numeric_target_as_zero_one(tmp_path: Path, home: Path) -> None:
    """--model logistic reads a numeric target's classes as 0 and 1 (a public rule), so a rare
    positive class at a small epsilon releases instead of refusing on a noise bin; a 1/2 coding
    (other integers far above the noise of the released grid) is a charged refusal naming
    --positive-class. Failure rate: the 1/2 case fails to refuse only if the grid's noisy count
    of the 8,000 2s (noise sd about 1,000 here) falls 4 sds short: about 1e-5."""
    rare = _numeric_target_csv(tmp_path / "rare.csv", 20000, ("0", "1"), 0.005, seed=7)
    out = tmp_path / "rare.json"
    res = _release(str(rare), "--epsilon", "0.5", "--model", "logistic", "--out", str(out), "--size", "4")
    assert res.exit_code == 0, res.output
    assert "numeric target read as the classes 0 and 1" in " ".join(res.output.split())
    coded = _numeric_target_csv(tmp_path / "coded.csv", 20000, ("1", "2"), 0.4, seed=8)
    res = _release(str(coded), "--epsilon", "0.5", "--model", "logistic", "--out", str(tmp_path / "c.json"))
    assert res.exit_code != 0 and not (tmp_path / "c.json").exists()
    lines = [x for x in res.output.strip().splitlines() if x.startswith("error:")]
    assert len(lines) == 1 and "--positive-class" in lines[0] and "other integers" in lines[0]


def test_zero_config_poisson_reads_a_thin_count_grid_as_the_public_count_range(tmp_path: Path, home: Path) -> None:
    """--model poisson reads a numeric target whose noisy grid shows only the bin of zero as the
    count [0, 1e9] (a public rule) instead of refusing it as constant; the count stage then clips it
    at a DP quantile. Failure rate: the twenty 1s' grid bin (noise sd about 80 here) must stay
    below the target's floor (about 270), missed with probability below 1e-3."""
    thin = _numeric_target_csv(tmp_path / "thin.csv", 20000, ("0", "1"), 0.001, seed=9)
    out = tmp_path / "thin.json"
    res = _release(str(thin), "--epsilon", "0.5", "--model", "poisson", "--out", str(out), "--size", "4")
    assert res.exit_code == 0, res.output
    shown = " ".join(res.output.split())
    assert "count target, bounds [0, 1e+09]" in shown and "count target clipped at" in shown


@pytest.mark.parametrize(
    ("args", "message"),
    [
        (["--positive-class", "yes", "--model", "poisson"], "--positive-class needs a binary target"),
        (["--positive-class", " yes"], "without surrounding whitespace"),
        (["--positive-class", "yes", "--policy", "SCHEMA"], "declares one; name the class there"),
    ],
)
def test_positive_class_public_refusals(tmp_path: Path, home: Path, args: list[str], message: str) -> None:
    """Bad uses of ``--positive-class`` are public facts: refused before any budget is charged."""
    data = _write_csv(tmp_path / "d.csv", 300)
    pol = _policy(tmp_path / "p.toml", n=300)
    args = [str(pol) if a == "SCHEMA" else a for a in args]
    res = _release(str(data), "--epsilon", "1", "--out", str(tmp_path / "r.json"), *args)
    assert res.exit_code != 0
    assert res.output.count("error:") == 1 and message in " ".join(res.output.split())
    assert _ledger_lines(home) == [] and not (tmp_path / "r.json").exists()
