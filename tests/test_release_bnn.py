"""``dpsummary release --model bnn`` (issue 16, "Private release for BNNs"), end to end, and the
shared privacy tests on its path: sensitivity bound, Binomial batches, neighbouring replay, noise
scale, accountant reproduction from the ledger; the analyst side (load, sample, predict, export
to NumPyro) and the refusals.

Statistical tolerances (privacy noise and coins come from OS entropy): the Binomial batch test
allows 5 standard errors on the mean and a variance ratio within [0.7, 1.35] at 400 draws (false
failure below 1e-5 together); the noise-scale check allows 6 standard errors (below 2e-9). The
replays use recorded, seeded randomness and are deterministic.
"""

from __future__ import annotations

import json
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import numpy as np
import pytest
import torch
from release_support import ledger_lines, write_csv, write_policy
from typer.testing import CliRunner

import dpsummary.cli.release  # noqa: F401  (registers the commands)
from dpsummary import selftest as st
from dpsummary.cli import app
from dpsummary.models import DTYPE
from dpsummary.models.bnn import BNN
from dpsummary.private import bnn as pb
from dpsummary.private.mechanism import PrivateRecords, SystemRandomness
from dpsummary.private.noise import quantize_sample_rate

runner = CliRunner()
ALLOW = 'allowed_models = ["logistic", "linear", "bnn"]'
STEPS, SIZE = 6, 6


@pytest.fixture(scope="module")
def released(tmp_path_factory: pytest.TempPathFactory) -> Iterator[dict[str, Any]]:
    """One real CLI release with --model bnn (public schema and count), shared by the tests."""
    tmp = tmp_path_factory.mktemp("bnn")
    home = tmp / "home"
    with pytest.MonkeyPatch.context() as mp:
        mp.setenv("DPSUMMARY_HOME", str(home))
        data = write_csv(tmp / "d.csv", 600, seed=0)
        pol = write_policy(tmp / "p.toml", n=600, extra=ALLOW)
        out = tmp / "r.dpsummary.json"
        res = runner.invoke(app, ["release", str(data), "--epsilon", "1.0", "--model", "bnn", "--policy", str(pol),
                                  "--out", str(out), "--steps", str(STEPS), "--size", str(SIZE), "--bnn-widths", "5",
                                  "--seed", "0", "--json"])
        yield {"tmp": tmp, "home": home, "out": out, "res": res, "data": data, "policy": pol}


def test_cli_release_verifies_loads_and_predicts(released: dict[str, Any]) -> None:
    import dpsummary

    res, out, home = released["res"], released["out"], released["home"]
    assert res.exit_code == 0, res.output
    result = json.loads(res.stdout)
    assert result["mechanism"] == "dp-bb-psvi" and result["steps"] == STEPS and result["size"] == SIZE
    assert result["epsilon"]["rdp"] <= 1.0 + 1e-9
    verify = runner.invoke(app, ["verify", str(out), "--key", str(home / "keys" / "dpsummary.pub")])
    assert verify.exit_code == 0, verify.output
    rel = dpsummary.load(out, key=home / "keys" / "dpsummary.pub")
    assert rel.verified and isinstance(rel.model, BNN)
    spec = rel.model.spec()
    assert spec["widths"] == [5] and spec["activation"] == "relu" and spec["likelihood"] == "bernoulli"
    assert spec["prior_scale"] == 1.0
    mech = rel.claim["mechanism"]
    assert mech["name"] == "dp-bb-psvi" and mech["network"]["widths"] == [5]
    assert mech["statistic_dimension"] == mech["outer_samples"] * (rel.dim + 1)
    assert rel.points.shape == (SIZE, rel.model.point_dim)
    assert float(rel.weights.sum()) == pytest.approx(600.0)  # total weight = the (public) count
    draws = rel.sample(200, seed=0, vi_steps=50)
    assert draws.shape == (200, rel.dim) and np.isfinite(draws).all()
    np.testing.assert_array_equal(draws, rel.sample(200, seed=0, vi_steps=50))  # deterministic per seed
    p = rel.posterior_predictive([{"x1": "2.0", "x2": "a"}, {"x1": "9.5", "x2": "b"}], draws)
    assert p.shape == (200, 2) and bool(((p >= 0) & (p <= 1)).all())
    ll = rel.posterior_predictive(rel.points[:3], draws[:4], kind="log_likelihood")
    assert ll.shape == (4, 3) and bool((ll <= 0).all())
    assert np.isfinite(rel.log_density(draws[:3])).all()
    # NUTS through the torch log density (a BNN has no JAX form); short: a smoke test of the route.
    from dpsummary.sampling import SamplingWarning

    with pytest.warns(SamplingWarning, match="one chain"):
        nuts = rel.sample(20, seed=1, method="nuts", chains=1, num_warmup=100)
    assert nuts.shape == (20, rel.dim) and np.isfinite(nuts).all()
    with pytest.raises(ValueError, match="vi"):
        rel.sample(5, method="laplace")


def test_ledger_reserves_before_and_reproduces_with_opacus(released: dict[str, Any]) -> None:
    """The ledger has the reservation (stage dp-bb-psvi) and the commit; its events, replayed
    step by step in Opacus's own RDPAccountant, give the claimed epsilon."""
    from opacus.accountants import RDPAccountant

    from dpsummary.accounting import RDP_ORDERS, events_from_json
    from dpsummary.artifact import read_artifact

    assert released["res"].exit_code == 0
    entries = ledger_lines(released["home"])
    assert [(e["kind"], e["stage"]) for e in entries] == [("reserve", "dp-bb-psvi"), ("commit", "dp-bb-psvi")]
    _, claim, _ = read_artifact(released["out"], allow_unsigned=True)
    assert entries[1]["artifact_digest"] is not None
    events = events_from_json(entries[0]["events"])
    assert len(events) == 1  # public count and schema, no quality share: only the optimisation
    ev = events[0]
    sigma, q, steps = ev.event.event.noise_multiplier, ev.event.sampling_probability, ev.count
    mech = claim["mechanism"]
    assert (sigma, q, steps) == (mech["noise_multiplier"], mech["sample_rate"], mech["steps"])
    assert q == quantize_sample_rate(q)
    acc = RDPAccountant()
    for _ in range(steps):
        acc.step(noise_multiplier=sigma, sample_rate=q)
    opacus_eps = acc.get_epsilon(claim["delta_accounting"], alphas=RDP_ORDERS)
    assert opacus_eps == pytest.approx(claim["epsilon"]["rdp"], abs=1e-9)
    assert opacus_eps <= 1.0
    # Judged against the release's own policy (its total_delta), not the packaged default's.
    audit = runner.invoke(app, ["audit", str(released["home"] / "ledger.jsonl"), "--key",
                                str(released["home"] / "keys" / "dpsummary.pub"), "--policy", str(released["policy"])])
    assert audit.exit_code == 0, audit.output


def test_export_numpyro_runs_and_matches_our_log_density(released: dict[str, Any], tmp_path: Path) -> None:
    import importlib.util

    import dpsummary

    pytest.importorskip("numpyro")
    assert released["res"].exit_code == 0
    key = released["home"] / "keys" / "dpsummary.pub"
    out = tmp_path / "np"
    res = runner.invoke(app, ["export", str(released["out"]), "--to", "numpyro", "--out", str(out), "--key", str(key)])
    assert res.exit_code == 0, res.output
    spec = importlib.util.spec_from_file_location("bnn_numpyro_model", out / "numpyro_model.py")
    assert spec is not None and spec.loader is not None
    nm = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(nm)
    data = nm.load(out / "release.json")
    assert nm.check(data) <= 1e-6  # the shipped checks (prior mean, released VI mean, prior draws)
    rel = dpsummary.load(released["out"], key=key)
    thetas = rel.model.sample_prior(3, torch.Generator().manual_seed(4)) * 0.7
    for th in thetas:
        ours = float(rel.log_density(th))
        theirs = nm.log_density(data, th.numpy())
        assert theirs == pytest.approx(ours, rel=1e-9, abs=1e-9)
    mcmc = nm.run_nuts(data, num_warmup=10, num_samples=10, num_chains=1, seed=0)
    samples = np.asarray(mcmc.get_samples()["theta"])
    assert samples.shape == (10, rel.dim) and np.isfinite(samples).all()
    # The NumPy reference (--to json) expresses the network too.
    ref = runner.invoke(app, ["export", str(released["out"]), "--to", "json", "--out", str(tmp_path / "js"),
                              "--key", str(key)])
    assert ref.exit_code == 0, ref.output


@pytest.mark.parametrize("to", ["stan", "pymc"])
def test_exporters_that_cannot_express_a_bnn_refuse(released: dict[str, Any], tmp_path: Path, to: str) -> None:
    assert released["res"].exit_code == 0
    res = runner.invoke(app, ["export", str(released["out"]), "--to", to, "--out", str(tmp_path / to), "--key",
                              str(released["home"] / "keys" / "dpsummary.pub")])
    assert res.exit_code == 2
    lines = res.output.strip().splitlines()
    assert len(lines) == 1 and lines[0].startswith("error:") and "BNN" in lines[0]
    assert not (tmp_path / to).exists()


# --------------------------------------------------------------------------- privacy, release path
def _design(n: int = 60) -> tuple[BNN, torch.Tensor, torch.Tensor]:
    model = BNN(3, widths=(4,))
    g = torch.Generator().manual_seed(0)
    data = model.simulate(model.sample_prior(1, g)[0], n, g)
    return model, data, model.sample_prior(3, torch.Generator().manual_seed(1))


def test_sensitivity_neighbouring_clipped_sums_differ_by_at_most_c() -> None:
    """D and D + an extreme record through the release path (records_statistic on PrivateRecords)
    with identical coins (the extra record always included) and zero noise: the released sums
    differ by at most C, although the record's raw statistic is far above C."""
    model, data, theta = _design()
    canary = torch.tensor([[60.0, -60.0, 60.0, 0.0]], dtype=DTYPE)
    c = 0.5
    assert float(pb.record_statistics(model, canary, theta).norm()) > 20 * c
    for seed in range(3):
        outs = []
        for rows in (data, torch.cat([data, canary])):
            rnd = st.ReplayRandomness(seed, shared=data.shape[0], zero_noise=True)
            recs = PrivateRecords(rows, randomness=rnd)
            s = pb.records_statistic(recs, model, theta, sample_rate=0.5, clip_norm=c, noise_multiplier=1.0)
            outs.append(torch.cat([s.L, s.G.flatten()]))
        assert float((outs[1] - outs[0]).norm()) <= c * (1 + 1e-12)
        assert float((outs[1] - outs[0]).norm()) > 0.9 * c  # the canary is clipped, not dropped


class _Counting:
    """Delegates to the product's SystemRandomness and records each step's batch size."""

    def __init__(self) -> None:
        self.base = SystemRandomness()
        self.sizes: list[int] = []

    def coins(self, num_records: int, sample_rate: float) -> np.ndarray:  # pragma: no cover - not used
        raise AssertionError("the release path must draw indices with the exact sampler")

    def sample_indices(self, num_records: int, sample_rate: float) -> np.ndarray:
        idx = self.base.sample_indices(num_records, sample_rate)
        self.sizes.append(int(idx.size))
        return idx

    def gaussian(self, values: np.ndarray, *, noise_std: float, clip_norm: float) -> np.ndarray:
        return values  # batch sizes only


def test_poisson_batches_are_binomial_through_the_exact_sampler(monkeypatch: pytest.MonkeyPatch) -> None:
    import dpsummary.private.sampling as sampling

    calls: list[int] = []
    real = sampling.poisson_indices

    def spy(n: int, q: float) -> np.ndarray:
        calls.append(n)
        return real(n, q)

    monkeypatch.setattr(sampling, "poisson_indices", spy)
    model, data, theta = _design(300)
    rnd = _Counting()
    recs = PrivateRecords(data, randomness=rnd)
    q = quantize_sample_rate(0.1)
    for _ in range(400):
        pb.records_statistic(recs, model, theta, sample_rate=q, clip_norm=1.0, noise_multiplier=1.0)
    sizes = np.array(rnd.sizes)
    assert len(calls) == 400 and set(calls) == {300}  # the exact O(qN) sampler drew every batch
    n = 300
    assert abs(sizes.mean() - n * q) < 5 * np.sqrt(n * q * (1 - q) / sizes.size)
    assert 0.7 < sizes.var(ddof=1) / (n * q * (1 - q)) < 1.35


def test_neighbouring_replay_in_sensitivity_units() -> None:
    ok = st.bnn_gray_box_replay()
    assert ok.ok and ok.calls == (4, 4) and ok.shapes_equal and ok.first_step_clip_equal
    assert ok.first_step_delta <= ok.first_step_clip + 1e-9 and ok.lockstep_max_ratio <= 1 + 1e-9
    assert ok.lockstep_max_ratio > 0.9  # the canary reaches the bound: the check has power
    bad = st.bnn_gray_box_replay(inject="no-clip")
    assert not bad.ok and bad.lockstep_max_ratio > 10


def test_noise_scale_matches_the_analytic_value() -> None:
    ratio, n, tol = st.bnn_noise_check()
    assert n >= 1000 and abs(ratio - 1) <= tol, (ratio, tol)
    half, _, _ = st.bnn_noise_check(inject="half-noise")
    assert abs(half - 1) > tol and abs(half - 0.5) <= tol


def test_selftest_reports_the_bnn_checks() -> None:
    r = st.bnn_checks()
    assert r.ok and r.failed == [] and r.accountant_ok
    assert r.accountant_epsilon == pytest.approx(r.opacus_epsilon, rel=1e-6)


# --------------------------------------------------------------------------- settlement and refusals
def test_failure_after_the_reservation_stays_charged(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    from dpsummary.plan import ReleaseRequest
    from dpsummary.release import run_release

    monkeypatch.setenv("DPSUMMARY_HOME", str(tmp_path / "home"))
    data = write_csv(tmp_path / "d.csv", 600, seed=2)
    pol = write_policy(tmp_path / "p.toml", n=600, extra=ALLOW)
    req = ReleaseRequest(data=data, epsilon=1.0, model="bnn", policy=pol, out=tmp_path / "o.json", steps=2, size=3,
                         seed=0, bnn_widths=(3,))

    class Injected(RuntimeError):
        pass

    def fail(name: str) -> None:
        if name == "initialised":
            raise Injected(name)

    with pytest.raises(Injected):
        run_release(req, checkpoint=fail)
    assert not (tmp_path / "o.json").exists()
    entries = ledger_lines(tmp_path / "home")
    assert [(e["kind"], e["stage"]) for e in entries] == [("reserve", "dp-bb-psvi"), ("abort", "dp-bb-psvi")]
    assert entries[0]["epsilon"]["rdp"] > 0.9  # the reserved events stay charged


def _release(tmp: Path, *args: str) -> Any:
    data = write_csv(tmp / "d.csv", 600, seed=0)
    return runner.invoke(app, ["release", str(data), "--epsilon", "0.5", *args])


@pytest.mark.parametrize("args, fragment", [
    (["--model", "bnn", "--mechanism", "dp-psvi"], "uses dp-bb-psvi"),
    (["--model", "logistic", "--mechanism", "dp-bb-psvi"], "only for --model bnn"),
    (["--bnn-widths", "4"], "needs --model bnn"),
    (["--model", "bnn", "--bnn-widths", "0"], "--bnn-widths"),
    (["--model", "bnn", "--bnn-widths", "a,b"], "--bnn-widths"),
])
def test_public_refusals(tmp_path: Path, monkeypatch: pytest.MonkeyPatch, args: list[str], fragment: str) -> None:
    home = tmp_path / "home"
    monkeypatch.setenv("DPSUMMARY_HOME", str(home))
    pol = write_policy(tmp_path / "p.toml", n=600, extra=ALLOW)
    res = _release(tmp_path, *args, "--policy", str(pol))
    assert res.exit_code == 2, res.output
    lines = res.output.strip().splitlines()
    assert lines[-1].startswith("error:") and fragment in lines[-1]
    assert ledger_lines(home) == []


def test_count_target_is_refused_before_the_reservation(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    home = tmp_path / "home"
    monkeypatch.setenv("DPSUMMARY_HOME", str(home))
    data = write_csv(tmp_path / "c.csv", 600, target="count")
    pol = write_policy(tmp_path / "p.toml", n=600, target_kind="count", extra=ALLOW)
    res = runner.invoke(app, ["release", str(data), "--epsilon", "0.5", "--model", "bnn", "--policy", str(pol)])
    assert res.exit_code == 2 and "binary or real target" in res.output
    assert ledger_lines(home) == []


def test_real_target_gives_a_gaussian_bnn(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    import dpsummary
    from dpsummary.plan import ReleaseRequest
    from dpsummary.release import run_release

    monkeypatch.setenv("DPSUMMARY_HOME", str(tmp_path / "home"))
    data = write_csv(tmp_path / "r.csv", 600, target="real")
    pol = write_policy(tmp_path / "p.toml", n=600, target_kind="real", extra=ALLOW)
    res = run_release(ReleaseRequest(data=data, epsilon=1.0, model="bnn", policy=pol, out=tmp_path / "o.json",
                                     steps=2, size=4, seed=0, bnn_widths=(3,)))
    assert res.mechanism == "dp-bb-psvi"
    rel = dpsummary.load(tmp_path / "o.json", allow_unsigned=True)
    assert isinstance(rel.model, BNN) and rel.model.likelihood == "gaussian"
    draws = rel.sample(10, seed=0, vi_steps=20)
    y = rel.posterior_predictive([{"x1": "5", "x2": "a"}], draws)
    assert y.shape == (10, 1) and np.isfinite(y).all()
