"""The moment-matched GLM pseudocoreset (issue 48, item 5): its exact weighted posterior has the
target Gaussian's means and sds, under a wider carrier prior where the target is as wide as the
model's prior. Reference: importance sampling (``exact_moments``) with a fresh generator, so the
check does not reuse the construction's own draws. Tolerances: 0.05 sd and 3% with IS sd errors
of about 0.3% at 20,000+ effective draws (failure rate far below 1e-6; seeds fixed)."""

from __future__ import annotations

import numpy as np
import pytest
import torch

from dpsummary.constructors.moment_match import carrier_model, exact_moments, match_moments
from dpsummary.gaussian import DTYPE, GaussianPosterior
from dpsummary.models import from_spec

pytest.importorskip("blackjax")


def _target(d: int, sds: list[float], seed: int = 0) -> GaussianPosterior:
    g = torch.Generator().manual_seed(seed)
    q, _ = torch.linalg.qr(torch.randn(d, d, generator=g, dtype=DTYPE))
    cov = q @ torch.diag(torch.tensor(sds, dtype=DTYPE) ** 2) @ q.T
    mean = 0.5 * torch.randn(d, generator=g, dtype=DTYPE)
    return GaussianPosterior(mean=mean, scale_tril=torch.linalg.cholesky(cov))


def test_carrier_prior_only_where_needed():
    model = from_spec({"name": "logistic", "num_features": 2})
    narrow = _target(3, [0.3, 0.5, 0.7])
    assert carrier_model(model, narrow) == (model, None)  # type: ignore[arg-type]
    wide = _target(3, [0.3, 0.5, 1.2])
    carrier, scale = carrier_model(model, wide)  # type: ignore[arg-type]
    assert scale == pytest.approx(np.sqrt(1.25) * 1.2) and carrier.prior_scale == scale


@pytest.mark.parametrize(("name", "sds"), [("logistic", [0.15, 0.3, 0.5, 0.6]), ("poisson", [0.05, 0.1, 0.2, 0.3]),
                                           ("logistic", [0.2, 0.4, 0.6, 1.3])])
def test_exact_posterior_has_the_target_moments(name, sds):
    model = from_spec({"name": name, "num_features": len(sds) - 1})
    target = _target(len(sds), sds, seed=len(sds))
    match = match_moments(model, target, size=30, generator=torch.Generator().manual_seed(1))  # type: ignore[arg-type]
    assert match is not None and match.agrees, match.note()
    assert (match.carrier_prior_scale is not None) == (max(sds) ** 2 * 1.2 >= 1.0)
    est = exact_moments(match.model, match.points, match.weights, target, settings=None,
                        generator=torch.Generator().manual_seed(99))
    assert est.estimator == "importance sampling" and est.draws >= 20000
    mu, sd = est.mean, est.sd
    m = target.mean.numpy()
    s = np.sqrt(np.diagonal(target.cov.numpy()))
    assert np.all(np.abs(mu - m) <= 0.05 * s), (mu - m) / s
    np.testing.assert_allclose(sd, s, rtol=0.03)


def test_tolerances_are_the_fixed_ones_or_what_the_monte_carlo_error_resolves():
    from statistics import NormalDist

    from dpsummary.constructors import moment_match as mm

    sd = np.ones(106)
    noisy = mm.ExactMoments(np.zeros(106), sd, 8000, "NUTS", np.full(106, 0.014), np.full(106, 0.01))
    mean_tol, sd_tol = mm.tolerances(noisy, sd)
    q = NormalDist().inv_cdf(1 - 0.025 / 106)  # about 3.5
    np.testing.assert_allclose(mean_tol, q * 0.014)
    np.testing.assert_allclose(sd_tol, q * 0.01)
    precise = mm.ExactMoments(np.zeros(3), np.ones(3), 10**6, "importance sampling", np.full(3, 1e-3), np.full(3, 1e-3))
    mean_tol, sd_tol = mm.tolerances(precise, np.ones(3))
    assert np.all(mean_tol == mm.MEAN_TOLERANCE) and np.all(sd_tol == mm.SD_TOLERANCE)


def _fake_estimates(monkeypatch, errors):
    """Replace the exact-moment estimate by NUTS-like ones whose mean errors (in target sds) are
    ``errors(call)``; record each call's ``nuts_runs`` and each construction target's mean."""
    from dpsummary.constructors import moment_match as mm

    calls: list[int] = []
    targets: list[np.ndarray] = []
    real_build = mm.exact_glm_pseudopoints

    def build(model, cur, **kw):
        targets.append(cur.mean.numpy().copy())
        return real_build(model, cur, **kw)

    def fake(model, points, weights, target, *, settings, generator, nuts_runs=1):
        calls.append(nuts_runs)
        s = np.sqrt(np.diagonal(target.cov.numpy()))
        mean = target.mean.numpy() + np.asarray(errors(len(calls))) * s
        return mm.ExactMoments(mean, s.copy(), 8000 * nuts_runs, "NUTS", np.full_like(s, 0.016) * s,
                               np.full_like(s, 0.007))

    monkeypatch.setattr(mm, "exact_glm_pseudopoints", build)
    monkeypatch.setattr(mm, "exact_moments", fake)
    return calls, targets


def test_a_match_within_its_monte_carlo_error_stops_at_the_first_iterate_and_records_it(monkeypatch):
    """Errors of 0.035 sd at d = 4 with a Monte Carlo error of 0.016 sd: above the fixed 0.03, within
    q_4 = 2.50 standard errors (0.040). The first iterate pooled VERIFY_RUNS runs; nothing is re-measured."""
    from dpsummary.constructors import moment_match as mm

    calls, _ = _fake_estimates(monkeypatch, lambda k: [0.035, -0.02, 0.0, 0.01])
    model = from_spec({"name": "logistic", "num_features": 3})
    match = mm.match_moments(model, _target(4, [0.15, 0.3, 0.5, 0.6]), size=30,  # type: ignore[arg-type]
                             generator=torch.Generator().manual_seed(1))
    assert match is not None and match.iterations == 1 and match.agrees
    assert calls == [mm.VERIFY_RUNS]
    assert match.max_mean_error_sd == pytest.approx(0.035)


def test_only_coordinates_outside_their_tolerance_move(monkeypatch):
    """A 0.2 sd error on coordinate 0 (systematic) and noise-sized errors elsewhere: the second
    construction target moves coordinate 0 by DAMPING x 0.2 sd and leaves the others."""
    from dpsummary.constructors import moment_match as mm

    calls, targets = _fake_estimates(monkeypatch, lambda k: [0.2, 0.02, -0.02, 0.0] if k == 1 else [0.0] * 4)
    model = from_spec({"name": "logistic", "num_features": 3})
    target = _target(4, [0.15, 0.3, 0.5, 0.6])
    match = mm.match_moments(model, target, size=30, generator=torch.Generator().manual_seed(1))  # type: ignore[arg-type]
    assert match is not None and match.iterations == 2
    assert calls == [mm.VERIFY_RUNS, 1, mm.VERIFY_RUNS]  # iterated: the chosen iterate is measured again
    s = np.sqrt(np.diagonal(target.cov.numpy()))
    step = (targets[1] - targets[0]) / s
    assert step[0] == pytest.approx(-mm.DAMPING * 0.2)
    np.testing.assert_allclose(step[1:], 0.0, atol=1e-12)
