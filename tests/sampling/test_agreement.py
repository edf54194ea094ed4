"""Issue 48, items 3 and 5: the draws ``Release.sample()`` returns agree with an independent
reference of the release's exact weighted posterior, for every mechanism and the models it
serves, and (the default mechanism) that exact posterior is the Gaussian the release signs.

The reference is importance sampling from a multivariate t (5 degrees of freedom) centred at the
pseudocoreset's Laplace approximation, its scale 1.3x the Laplace's, with at least
``MIN_REFERENCE_ESS`` effective draws (checked). Tolerances and failure rates: with NUTS's bulk
ESS above 2,000 and the reference's above 4,000, a mean's Monte Carlo error is at most about
0.027 sd, so 0.1 sd is 3.7 standard errors (two-sided failure rate about 2e-4 per coordinate,
and the seeds are fixed, so the test is deterministic); an sd's relative error is about 1.8%, so
10% is over 5 standard errors. The signed-Gaussian agreement (0.05 sd and 3%, item 5) is checked
against the same reference with 12,000 NUTS draws (mean error about 0.013 sd: 0.05 is 3.8
standard errors; sd error about 0.9%: 3% is 3.3).
"""

from __future__ import annotations

from pathlib import Path

import numpy as np
import pytest
import torch
from release_support import seeded_privacy_randomness, write_csv, write_policy

import dpsummary
from dpsummary.inference import coreset_posterior
from dpsummary.release import ReleaseRequest, run_release
from dpsummary.sampling.reference import importance_moments

pytest.importorskip("blackjax")

MIN_REFERENCE_ESS = 4000.0


def reference_moments(rel: dpsummary.Release, draws: int = 60000, seed: int = 0) -> tuple[np.ndarray, np.ndarray, float]:
    """Mean, sd and ESS of the release's exact weighted posterior by importance sampling
    (:func:`dpsummary.sampling.reference.importance_moments`, proposal on the Laplace posterior)."""
    points, weights = rel.nonzero()
    est = importance_moments(rel.model, points, weights, coreset_posterior(rel.model, points, weights), draws=draws,
                             generator=torch.Generator().manual_seed(seed))
    return est.mean.numpy(), est.sd.numpy(), est.ess


def _release(tmp: Path, *, target: str, model: str | None, mechanism: str | None, n: int = 2000,
             epsilon: float = 1.0, seed: int = 0) -> dpsummary.Release:
    data = write_csv(tmp / f"{target}.csv", n, seed=seed, target=target)
    kind = {"binary": "binary", "count": "count", "real": "real"}[target]
    pol = write_policy(tmp / "p.toml", n=n, target_kind=kind)
    out = tmp / "r.json"
    run_release(ReleaseRequest(data=data, epsilon=epsilon, model=model, target="y", policy=pol, out=out,
                               ledger=tmp / "l.jsonl", seed=seed, mechanism=mechanism, force=True, steps=60, size=20))
    return dpsummary.load(out, allow_unsigned=True)


# Every mechanism in REGISTRY and each model it serves whose releases are sampled: the default
# mechanism's GLMs (linear: sigma estimated, NUTS against the quadrature moments), DP-PSVI's logistic regression. BNNs are
# sampled by VI (multimodal posterior; NUTS on them is a smoke test in test_release_bnn) and
# mixtures are fitted, not sampled (dp-kd-tree).
CASES = [
    ("noise-aware-newton", "binary", "logistic"),
    ("noise-aware-newton", "count", "poisson"),
    ("noise-aware-newton", "real", "linear"),
    ("dp-psvi", "binary", "logistic"),
]


@pytest.mark.parametrize(("mechanism", "target", "model"), CASES)
def test_sample_agrees_with_the_exact_posterior(tmp_path, monkeypatch, mechanism, target, model):
    # The release's privacy noise and Poisson samples from a seeded stand-in: with OS entropy the
    # dp-psvi release differed run to run, and one in some tens of them gave NUTS one divergent
    # transition in 8,000 draws (CI of 2026-11-28), which fails the sampler check below.
    seeded_privacy_randomness(monkeypatch, 48)
    monkeypatch.setenv("DPSUMMARY_HOME", str(tmp_path / "home"))
    rel = _release(tmp_path, target=target, model=model, mechanism=mechanism)
    assert rel.model.name == model
    if rel.model.exact_moments and not rel.model.conjugate:
        # Linear regression with sigma estimated (issue 51): the exact moments by quadrature over
        # log sigma (checked against importance sampling in tests/export/test_exporters.py); a t
        # proposal does not reach MIN_REFERENCE_ESS on its skewed log-sigma marginal.
        post = rel.model.exact_posterior(*rel.nonzero())
        mean, sd = post.mean.numpy(), np.sqrt(np.diagonal(post.cov.numpy()))
        assert rel.param_names[-1] == "log_sigma"
    else:
        mean, sd, ess = reference_moments(rel)
        assert ess >= MIN_REFERENCE_ESS
    exact = rel.model.conjugate or hasattr(rel.model, "exact_draws")
    out = rel.sample(8000, seed=1, return_draws=True) if not exact else None
    draws = rel.sample(8000, seed=1) if out is None else out.flat()
    if out is not None:
        assert out.problems() == [], out.diagnostics.summary()
        assert float(out.diagnostics.ess_bulk.min()) > 2000
    assert np.all(np.abs(draws.mean(0) - mean) <= 0.1 * sd), (draws.mean(0), mean, sd)
    np.testing.assert_allclose(draws.std(0), sd, rtol=0.1)


@pytest.mark.parametrize(("target", "model"), [("binary", "logistic"), ("count", "poisson")])
def test_the_exact_posterior_is_the_signed_gaussian(tmp_path, monkeypatch, target, model):
    """Item 5: the pseudocoreset's exact posterior (what every sampler draws) and the Gaussian the
    release signs agree to 0.05 sd and 3%, and the artifact records the agreement it measured."""
    monkeypatch.setenv("DPSUMMARY_HOME", str(tmp_path / "home"))
    rel = _release(tmp_path, target=target, model=model, mechanism=None, epsilon=0.5)
    match = rel.body["posterior"]["pseudocoreset_match"]
    assert match["method"] == "exact-posterior moments" and match["agrees"] is True
    signed = rel.signed_gaussian()
    assert signed is not None
    m, s = signed.mean.numpy(), np.sqrt(np.diagonal(signed.cov.numpy()))
    mean, sd, ess = reference_moments(rel, draws=100000)
    assert ess >= MIN_REFERENCE_ESS
    assert np.all(np.abs(mean - m) <= 0.05 * s), ((mean - m) / s)
    np.testing.assert_allclose(sd, s, rtol=0.03)
    draws = rel.sample(12000, seed=2)
    assert np.all(np.abs(draws.mean(0) - m) <= 0.05 * s)
    np.testing.assert_allclose(draws.std(0), s, rtol=0.03)


def test_a_failed_moment_match_keeps_the_closed_form_and_says_so(tmp_path, monkeypatch):
    """Moment matching runs after the charge, so it must be total: if it fails (here: the sampler
    raises), the release still ends in a signed artifact carrying the closed-form pseudocoreset,
    and its notes say the exact posterior was not matched."""
    import dpsummary.constructors.moment_match as mm

    def broken(*args, **kwargs):
        raise RuntimeError("sampler unavailable")

    monkeypatch.setattr(mm, "match_moments", broken)
    monkeypatch.setenv("DPSUMMARY_HOME", str(tmp_path / "home"))
    data = write_csv(tmp_path / "d.csv", 2000, target="binary")
    pol = write_policy(tmp_path / "p.toml", n=2000, target_kind="binary")
    res = run_release(ReleaseRequest(data=data, epsilon=0.5, target="y", policy=pol, out=tmp_path / "r.json",
                                     ledger=tmp_path / "l.jsonl", seed=0, force=True))
    assert any("moment matching failed: RuntimeError" in n for n in res.notes), res.notes
    rel = dpsummary.load(tmp_path / "r.json", allow_unsigned=True)
    assert rel.body["posterior"]["pseudocoreset_match"] is None
    assert np.isfinite(rel.points.numpy()).all() and rel.weights.sum() > 0
