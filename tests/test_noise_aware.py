"""The noise-aware posterior (dpsummary.noise_aware): accounting, limits and calibration."""

from __future__ import annotations

import math

import numpy as np
import pytest
import torch

from dpsummary import accounting as acc
from dpsummary import noise_aware as na
from dpsummary.inference import prior_posterior
from dpsummary.metrics import full_posterior, trust_report
from dpsummary.models import LinearRegression, LogisticRegression
from dpsummary.private.score_stats import noisy_score_statistics


def _release_fn(pts, model, rng):
    class Rand:
        def gaussian(self, values, *, noise_std, clip_norm):
            return values + noise_std * rng.standard_normal(len(values))

        def coins(self, n, q):  # pragma: no cover - unused
            raise AssertionError

    def release(theta, sb, cb, sm, cm):
        st = noisy_score_statistics(pts, Rand(), model, theta, score_bound=sb, curvature_bound=cb,
                                    score_noise_multiplier=sm, curvature_noise_multiplier=cm)
        return st.score, st.curvature

    return release


def _table(model, n, seed):
    g = torch.Generator().manual_seed(seed)
    x = torch.rand(n, model.num_features, generator=g, dtype=torch.float64) * 2 - 1
    theta = torch.randn(model.param_dim, generator=g, dtype=torch.float64) * 0.7
    return model.simulate(theta, n, g, features=x), theta


@pytest.mark.parametrize("accountant", ["rdp", "pld"])
def test_schedule_events_compose_to_the_target(accountant):
    sched = na.Schedule(na.DEFAULT_ROUNDS)
    sigma, events = na.calibrate(sched, target_epsilon=0.5, delta=1e-6, accountant=accountant)
    assert len(events) == 2 * len(na.DEFAULT_ROUNDS)
    eps = acc.epsilon(events, 1e-6, accountant)
    assert eps <= 0.5 * (1 + 1e-6)
    # The schedule composes exactly like one Gaussian of multiplier sigma.
    assert eps == pytest.approx(acc.epsilon([acc.gaussian_event(sigma)], 1e-6, accountant), rel=1e-3)
    mult = sched.noise_multipliers(sigma)
    assert sum(1 / s**2 + 1 / c**2 for s, c in mult) == pytest.approx(1 / sigma**2)


def test_schedule_rejects_bad_shares():
    with pytest.raises(ValueError):
        na.Schedule(((0.5, 0.6),))


def test_negligible_noise_recovers_the_full_posterior():
    """With tiny noise the noise-aware and raw posteriors equal the full-data Laplace posterior
    (within Newton's convergence after the schedule's rounds)."""
    model = LogisticRegression(3)
    pts, _ = _table(model, 2000, 0)
    full = full_posterior(model, pts)
    release = _release_fn(pts, model, np.random.default_rng(0))
    bounds = na.public_bounds(model, feature_norm=math.sqrt(3), target_bound=1.0)
    res = na.fit(model, release, bounds, schedule=na.Schedule(((0.2, 0.2), (0.2, 0.2), (0.1, 0.1))), sigma=1e-6)
    for post in (res.posterior, res.raw_posterior):
        rep = trust_report(post, full, prior_posterior(model))
        # Three Newton steps from the prior mean: within a few hundredths of a posterior sd.
        assert rep.mean_error_sd_max < 0.05 and abs(rep.width_ratio - 1) < 0.05


def test_linear_regression_one_round_is_exact():
    model = LinearRegression(2)
    pts, _ = _table(model, 500, 1)
    pts[:, -1].clamp_(-1, 1)
    full = full_posterior(model, pts)
    release = _release_fn(pts, model, np.random.default_rng(1))
    bounds = na.public_bounds(model, feature_norm=math.sqrt(2), target_bound=1.0)
    res = na.fit(model, release, bounds, schedule=na.Schedule.default(model), sigma=1e-7)
    assert torch.allclose(res.posterior.mean, full.mean, atol=1e-5)


def test_intervals_cover_at_epsilon_0_2():
    """Calibration on simulated logistic tables (deterministic noise, 8 seeds): the noise-aware
    intervals contain the full-data mean at >= 90% of coordinates in the median, the raw ones
    do not. Failure rate: the seeds are fixed, so the test is deterministic."""
    model = LogisticRegression(4)
    na_cov, raw_cov = [], []
    for seed in range(8):
        pts, _ = _table(model, 3000, seed)
        full = full_posterior(model, pts)
        sched = na.Schedule.default(model)
        sigma, _ = na.calibrate(sched, target_epsilon=0.2, delta=1e-5)
        release = _release_fn(pts, model, np.random.default_rng(100 + seed))
        bounds = na.public_bounds(model, feature_norm=2.0, target_bound=1.0)
        res = na.fit(model, release, bounds, schedule=sched, sigma=sigma)
        na_cov.append(trust_report(res.posterior, full, prior_posterior(model)).coverage)
        raw_cov.append(trust_report(res.raw_posterior, full, prior_posterior(model)).coverage)
    assert np.median(na_cov) >= 0.9
    assert np.median(raw_cov) < np.median(na_cov)


def test_unconverged_rounds_are_reported():
    """A Poisson table with a large intercept: one round from the prior mean cannot reach it,
    and the release says so (post-processing of released values)."""
    from dpsummary.models import PoissonRegression

    model = PoissonRegression(2)
    g = torch.Generator().manual_seed(0)
    x = torch.rand(3000, 2, generator=g, dtype=torch.float64) * 2 - 1
    pts = model.simulate(torch.tensor([4.0, 0.3, -0.2], dtype=torch.float64), 3000, g, features=x)
    release = _release_fn(pts, model, np.random.default_rng(0))
    bounds = na.public_bounds(model, feature_norm=math.sqrt(2), target_bound=200.0)
    res = na.fit(model, release, bounds, schedule=na.Schedule(((0.5, 0.5),)), sigma=0.5)
    assert any("had not converged" in n for n in res.notes)
    model2 = LogisticRegression(3)
    pts2, _ = _table(model2, 2000, 0)
    ok = na.fit(model2, _release_fn(pts2, model2, np.random.default_rng(0)),
                na.public_bounds(model2, feature_norm=math.sqrt(3), target_bound=1.0),
                schedule=na.Schedule(((0.2, 0.2), (0.2, 0.2), (0.1, 0.1))), sigma=1e-6)
    assert not any("had not converged" in n for n in ok.notes)
