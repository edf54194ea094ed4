"""The noise-aware posterior (dpsummary.noise_aware): accounting, limits and calibration."""

from __future__ import annotations

import dataclasses
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
    model = LinearRegression(2, noise_scale=1.0)
    pts, _ = _table(model, 500, 1)
    pts[:, -1].clamp_(-1, 1)
    full = full_posterior(model, pts)
    release = _release_fn(pts, model, np.random.default_rng(1))
    bounds = na.public_bounds(model, feature_norm=math.sqrt(2), target_bound=1.0)
    res = na.fit(model, release, bounds, schedule=na.Schedule.default(model), sigma=1e-7, generator=torch.Generator().manual_seed(0))
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
        res = na.fit(model, release, bounds, schedule=sched, sigma=sigma, feature_norm=2.0,
                     generator=torch.Generator().manual_seed(0))
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


# ---- issue 25: Poisson anchors, public eta bound, totality ----------------------------------
def _poisson_table(n, seed, intercept=5.0, k=4):
    from dpsummary.models import PoissonRegression

    model = PoissonRegression(k)
    g = torch.Generator().manual_seed(seed)
    x = torch.rand(n, k, generator=g, dtype=torch.float64) * 2 - 1
    theta = torch.randn(model.param_dim, generator=g, dtype=torch.float64) * 0.3
    theta[0] = intercept
    pts = model.simulate(theta, n, g, features=x)
    pts[:, -1].clamp_(max=1000.0)
    return model, pts, theta, math.sqrt(k)


def test_poisson_bounds_hold_for_every_record_in_the_public_box():
    """The public bound on the linear predictor makes exp(eta) bounded: at an anchor whose
    bound is below the count cap, no record of the box is clipped (score and curvature)."""
    model, pts, theta, fnorm = _poisson_table(2000, 1)
    anchor = theta * 0.8
    eta_max = model.linear_predictor_bound(anchor, feature_norm=fnorm, target_bound=1000.0)
    assert float((model.design(pts) @ anchor).max()) <= eta_max
    sb, cb = model.statistic_bounds(anchor, feature_norm=fnorm, target_bound=1000.0)
    assert float(model.record_scores(pts, anchor).norm(dim=1).max()) <= sb
    c, z = model.record_curvature_factors(pts, anchor)
    from dpsummary.private.kernel import upper_triangle_norm

    released = upper_triangle_norm(c, z)  # the norm of what the mechanism releases
    # The curvature weight is capped at exp(theta_0 + margin); records above it are clipped.
    above = (model.design(pts) @ anchor) > float(anchor[0]) + model.CURVATURE_ETA_MARGIN
    assert float(released[~above].max()) <= cb
    # At the prior mean the curvature bound is the design's rank-one upper-triangle bound (below
    # its squared norm, the Frobenius bound), not the count bound.
    _, cb0 = model.statistic_bounds(torch.zeros(model.param_dim, dtype=torch.float64), feature_norm=fnorm,
                                    target_bound=1000.0)
    r = model.design_norm_bound(fnorm)
    assert cb0 == pytest.approx(model.rank_one_upper_bound(r)) and cb0 < r**2


def test_log_mean_anchor_is_the_log_of_the_mean_count():
    model, pts, _, fnorm = _poisson_table(5000, 2)
    release = _release_fn(pts, model, np.random.default_rng(0))
    a = torch.zeros(model.param_dim, dtype=torch.float64)
    sb, cb = model.statistic_bounds(a, feature_norm=fnorm, target_bound=1000.0)
    s, h = release(a, sb, cb, 1e-6, 1e-6)
    rel = na.RoundRelease(anchor=a, score=s, curvature=h, score_bound=sb, curvature_bound=cb,
                          score_noise_std=1e-6 * sb, curvature_noise_std=1e-6 * cb)
    nxt = na.log_mean_anchor(model, rel, target_bound=1000.0)
    assert float(nxt[0]) == pytest.approx(math.log(float(pts[:, -1].mean())), abs=1e-6)
    assert bool((nxt[1:] == 0).all())
    # Noise far above the signal: the anchor stays (public rule on DP outputs).
    loud = na.RoundRelease(anchor=a, score=s, curvature=h, score_bound=sb, curvature_bound=cb,
                           score_noise_std=1e9, curvature_noise_std=1e9)
    assert bool((na.log_mean_anchor(model, loud, target_bound=1000.0) == a).all())


def test_trust_region_limits_the_change_of_the_linear_predictor():
    model = LogisticRegression(3)
    a = torch.zeros(4, dtype=torch.float64)
    far = torch.tensor([5.0, 3.0, -2.0, 1.0], dtype=torch.float64)
    out = na.trust_region(model, a, far, trust_eta=1.0, feature_norm=2.0)
    assert na.eta_change(model, out - a, 2.0) == pytest.approx(1.0)
    near = torch.tensor([0.1, 0.0, 0.0, 0.0], dtype=torch.float64)
    assert torch.equal(na.trust_region(model, a, near, trust_eta=1.0, feature_norm=2.0), near)


def test_poisson_with_large_counts_converges_and_covers():
    """Intercept 5 (mean count ~150), N = 2e4, epsilon 1: the default schedule reaches the
    intercept (anchors near log mean count) and the noise-aware intervals cover the full-data
    mean. Tolerance: coverage >= 0.8 of 5 coordinates in each of 3 seeded runs (the noise is
    seeded, so the test is deterministic). Failure rate over noise draws, measured on these three
    tables with 40 other noise seeds each (120 fits): the anchor check never failed, the coverage
    check failed once (about 1% per fit, so about 2.5% per choice of the 3 seeds)."""
    for seed in range(3):
        model, pts, _, fnorm = _poisson_table(20_000, 10 + seed)
        full = full_posterior(model, pts)
        sched = na.Schedule.default(model)
        sigma, _ = na.calibrate(sched, target_epsilon=1.0, delta=1e-6)
        bounds = na.public_bounds(model, feature_norm=fnorm, target_bound=1000.0)
        res = na.fit(model, _release_fn(pts, model, np.random.default_rng(seed)), bounds, schedule=sched,
                     sigma=sigma, feature_norm=fnorm, target_bound=1000.0, generator=torch.Generator().manual_seed(0))
        assert abs(float(res.rounds[1].anchor[0]) - float(full.mean[0])) < 0.5
        assert trust_report(res.posterior, full, prior_posterior(model)).coverage >= 0.8


def test_poisson_prior_is_centred_at_the_log_mean_anchor():
    """The default Poisson schedule re-centres the prior at round 1's log-mean anchor
    (noise_aware 5.): the fit returns that model, its prior centre is the second round's anchor,
    and the released posterior equals the noise-aware posterior under that prior."""
    model, pts, _, fnorm = _poisson_table(5_000, 3)
    sched = na.Schedule.default(model)
    assert sched.prior_centre == "log-mean" and sched.as_dict()["prior_centre"] == "log-mean"
    sigma, _ = na.calibrate(sched, target_epsilon=1.0, delta=1e-6)
    bounds = na.public_bounds(model, feature_norm=fnorm, target_bound=1000.0)
    res = na.fit(model, _release_fn(pts, model, np.random.default_rng(0)), bounds, schedule=sched,
                 sigma=sigma, feature_norm=fnorm, target_bound=1000.0, generator=torch.Generator().manual_seed(0))
    assert res.model is not None and res.model != model
    assert torch.equal(res.model.prior_mean, res.rounds[1].anchor)
    assert bool((res.model.prior_mean[1:] == 0).all()) and float(res.model.prior_mean[0]) > 3.0
    # The released posterior is the imputed one under that prior (the fit's generator is used
    # for the imputations only, so the same seed reproduces it).
    again = na.imputed_posterior(res.model, res.rounds[-1], generator=torch.Generator().manual_seed(0))
    assert torch.allclose(again.mean, res.posterior.mean)
    # Without the rule the model (and so the prior) is the caller's.
    plain = dataclasses.replace(sched, prior_centre=None)
    res0 = na.fit(model, _release_fn(pts, model, np.random.default_rng(0)), bounds, schedule=plain,
                  sigma=sigma, feature_norm=fnorm, target_bound=1000.0, generator=torch.Generator().manual_seed(0))
    assert res0.model == model
    with pytest.raises(ValueError):
        dataclasses.replace(sched, anchor=None)


def test_logistic_prior_centred_at_the_log_odds_anchor_option():
    """The tenth rule's option (not a default): the prior re-centred at round 1's log-odds anchor
    (intercept at the logit of the noisy positive share, slopes 0), which must be the anchor rule too."""
    model = LogisticRegression(3)
    g = torch.Generator().manual_seed(11)
    x = torch.rand(20_000, 3, generator=g, dtype=torch.float64) * 2 - 1
    pts = model.simulate(torch.tensor([-2.5, 1.0, -0.5, 0.0], dtype=torch.float64), 20_000, g, features=x)
    sched = na.Schedule(na.DEFAULT_ROUNDS, posterior="imputed", anchor="log-odds", prior_centre="log-odds")
    sigma, _ = na.calibrate(sched, target_epsilon=2.0, delta=1e-6)
    bounds = na.public_bounds(model, feature_norm=math.sqrt(3), target_bound=1.0)
    res = na.fit(model, _release_fn(pts, model, np.random.default_rng(1)), bounds, schedule=sched, sigma=sigma,
                 feature_norm=math.sqrt(3), target_bound=1.0, generator=torch.Generator().manual_seed(0))
    assert res.model is not None and torch.equal(res.model.prior_mean, res.rounds[1].anchor)
    share = float(pts[:, -1].mean())
    assert bool((res.model.prior_mean[1:] == 0).all())
    assert abs(float(res.model.prior_mean[0]) - math.log(share / (1 - share))) < 0.2
    with pytest.raises(ValueError):
        na.Schedule(na.DEFAULT_ROUNDS, prior_centre="log-odds")  # needs the log-odds anchor


@pytest.mark.parametrize("bad", [float("inf"), float("nan")])
def test_non_finite_statistics_raise_non_finite_fit(bad):
    model = LogisticRegression(2)
    a = torch.zeros(3, dtype=torch.float64)
    rel = na.RoundRelease(anchor=a, score=torch.tensor([bad, 0.0, 0.0], dtype=torch.float64),
                          curvature=torch.eye(3, dtype=torch.float64) * 100, score_bound=1.0, curvature_bound=1.0,
                          score_noise_std=1.0, curvature_noise_std=1.0)
    with pytest.raises(na.NonFiniteFit):
        na.noise_aware_posterior(model, rel)


def test_huge_noise_still_gives_a_finite_posterior():
    """Whatever the noise draws, the posterior is finite (or NonFiniteFit): draws of 1e150."""
    model = LogisticRegression(3)
    a = torch.zeros(4, dtype=torch.float64)
    rng = np.random.default_rng(3)
    for _ in range(20):
        h = torch.from_numpy(rng.standard_normal((4, 4)) * 1e150)
        rel = na.RoundRelease(anchor=a, score=torch.from_numpy(rng.standard_normal(4) * 1e150), curvature=h + h.T,
                              score_bound=1.0, curvature_bound=1.0, score_noise_std=1e150, curvature_noise_std=1e150)
        try:
            post, _ = na.noise_aware_posterior(model, rel)
        except na.NonFiniteFit:
            continue
        assert bool(torch.isfinite(post.mean).all()) and bool(torch.isfinite(post.cov).all())


def test_old_artifact_bodies_with_a_raw_summary_still_load():
    """Noise-aware artifacts written before issue 25 carry ``raw_summary``: it still loads; a
    body without one refuses ``posterior="raw"`` in one line."""
    from dpsummary.analyst import Release, ReleaseFormatError
    from dpsummary.constructors.base import Summary

    model = LogisticRegression(2)
    pts = torch.tensor([[0.1, 0.2, 1.0], [0.3, -0.1, 0.0]], dtype=torch.float64)
    s = Summary(pts, torch.ones(2, dtype=torch.float64), model, na.MECHANISM, None, {"posterior": "noise_aware"})
    raw = Summary(pts, 2 * torch.ones(2, dtype=torch.float64), model, na.MECHANISM, None, {"posterior": "raw"})
    body = {"format": "dpsummary.release/v1", "summary": s.to_dict(), "posterior": {"default": "noise_aware"}}
    old = Release.from_body({**body, "raw_summary": raw.to_dict()}, posterior="raw")
    assert float(old.summary.weights.sum()) == pytest.approx(4.0)
    with pytest.raises(ReleaseFormatError, match="no raw summary"):
        Release.from_body(body, posterior="raw")


def test_expansion_error_bounds_the_poisson_step_error():
    """The convergence rule's bound (na.expansion_error): for a Poisson table, the score released
    at an anchor, read through the anchor's curvature, gives a step whose relative error is at
    most expansion_error(eta*), eta* the step's largest change of the linear predictor over the
    public box. Checked without noise on steps of growing size (deterministic)."""
    model, pts, theta, fnorm = _poisson_table(5000, 4)

    def newton_step(anchor):
        s = model.record_scores(pts, anchor).sum(0)
        c, z = model.record_curvature_factors(pts, anchor)
        return torch.linalg.solve((c[:, None] * z).T @ z, s)

    mle = theta.clone()
    for _ in range(30):  # the likelihood's maximiser (no prior): what the released score solves
        mle = mle + newton_step(mle)
    assert float(torch.linalg.vector_norm(newton_step(mle))) < 1e-10
    assert na.expansion_error(0.0) == 0.0
    assert na.expansion_error(0.1) == pytest.approx(math.expm1(0.1) / 0.1 - 1)
    for scale in (0.01, 0.05, 0.2):
        anchor = mle + scale * torch.linspace(-1, 1, model.param_dim, dtype=torch.float64)
        true_step = mle - anchor
        err = float(torch.linalg.vector_norm(newton_step(anchor) - true_step) / torch.linalg.vector_norm(true_step))
        assert 0 < err <= na.expansion_error(na.eta_change(model, true_step, fnorm))


def test_step_prior_anchor_centres_the_step_at_the_anchor():
    """Schedule.step_prior="anchor": the anchor step uses the model's prior scale centred at the
    current anchor (a damped noise-aware Newton step); the last posterior keeps the model's prior."""
    model = LogisticRegression(2)
    a = torch.tensor([3.0, 0.0, 0.0], dtype=torch.float64)
    rel = na.RoundRelease(anchor=a, score=torch.zeros(3, dtype=torch.float64),
                          curvature=torch.eye(3, dtype=torch.float64) * 1e-6, score_bound=1.0, curvature_bound=1.0,
                          score_noise_std=1.0, curvature_noise_std=1.0)
    centred, _ = na.noise_aware_posterior(model, rel, prior_mean=a)
    at_model, _ = na.noise_aware_posterior(model, rel)
    assert torch.allclose(centred.mean, a, atol=1e-3)  # no information: stays at the anchor
    assert torch.allclose(at_model.mean, model.prior_mean, atol=1e-3)  # shrinks to the prior mean
    with pytest.raises(ValueError):
        na.Schedule(((0.5, 0.5),), step_prior="elsewhere")


def _one_round(model, pts, rng, sigma):
    release = _release_fn(pts, model, rng)
    bounds = na.public_bounds(model, feature_norm=math.sqrt(model.num_features), target_bound=1.0)
    return na.fit(model, release, bounds, schedule=na.Schedule(((0.5, 0.5),)), sigma=sigma).rounds[-1]


def test_imputed_posterior_equals_plug_in_without_curvature_noise():
    """With the curvature known (no curvature noise) every imputation is the same matrix, so the
    mixture is the plug-in posterior."""
    model = LogisticRegression(3)
    pts, _ = _table(model, 3000, 1)
    rel = dataclasses.replace(_one_round(model, pts, np.random.default_rng(1), 0.5), curvature_noise_std=0.0)
    plug, _ = na.noise_aware_posterior(model, rel)
    imp = na.imputed_posterior(model, rel, generator=torch.Generator().manual_seed(0), draws=20)
    assert torch.allclose(imp.mean, plug.mean, atol=1e-9)
    assert torch.allclose(imp.cov, plug.cov, atol=1e-9)


def test_imputed_schedule_needs_a_generator_and_is_recorded():
    sched = na.Schedule(((0.5, 0.5),), posterior="imputed")
    assert sched.as_dict()["posterior"] == "imputed" and sched.as_dict()["imputations"] == na.IMPUTATIONS
    with pytest.raises(ValueError, match="posterior"):
        na.Schedule(((0.5, 0.5),), posterior="exact")
    model = LogisticRegression(2)
    pts, _ = _table(model, 500, 5)
    bounds = na.public_bounds(model, feature_norm=math.sqrt(2), target_bound=1.0)
    with pytest.raises(ValueError, match="generator"):
        na.fit(model, _release_fn(pts, model, np.random.default_rng(5)), bounds, schedule=sched, sigma=1.0)
    res = na.fit(model, _release_fn(pts, model, np.random.default_rng(5)), bounds, schedule=sched, sigma=1.0,
                 generator=torch.Generator().manual_seed(5))
    assert bool(torch.isfinite(res.posterior.cov).all())


def test_imputed_posterior_is_the_mixture_of_per_draw_noise_aware_posteriors():
    """The eigenbasis shortcut in imputed_posterior is exact: the same draws through the general
    formula (noise_aware_posterior with the curvature known) give the same mixture."""
    d = 5
    rel = _random_release(d, 7, 300)
    model = LogisticRegression(d - 1)
    fast = na.imputed_posterior(model, rel, generator=torch.Generator().manual_seed(1), draws=30)
    mean, cov = _per_draw_mixture(model, rel, seed=1, draws=30)
    assert torch.allclose(fast.mean, mean, atol=1e-12) and torch.allclose(fast.cov, cov, atol=1e-12)


def _random_release(d: int, seed: int, rows: int) -> na.RoundRelease:
    """A round's release with a random PSD curvature (``rows`` random design rows) and noise."""
    g = torch.Generator().manual_seed(seed)
    a = torch.randn(rows, d, generator=g, dtype=torch.float64)
    return na.RoundRelease(anchor=torch.randn(d, generator=g, dtype=torch.float64) * 0.3,
                           score=torch.randn(d, generator=g, dtype=torch.float64) * 10, curvature=a.T @ a * 0.05,
                           score_bound=3.0, curvature_bound=2.0, score_noise_std=5.0, curvature_noise_std=3.0)


def _per_draw_mixture(model, rel: na.RoundRelease, *, seed: int, draws: int) -> tuple[torch.Tensor, torch.Tensor]:
    """The imputed posterior by the general formula: the same curvature draws as
    :func:`noise_aware.imputed_posterior` with ``seed``, each through noise_aware_posterior with the
    curvature known, moment-matched."""
    d = rel.curvature.shape[0]
    g = torch.Generator().manual_seed(seed)
    means, covs = [], []
    for _ in range(draws):
        h = na.psd_part(rel.curvature + na.symmetric_noise(d, rel.curvature_noise_std, g))
        post, _ = na.noise_aware_posterior(model, dataclasses.replace(rel, curvature=h, curvature_noise_std=0.0))
        means.append(post.mean)
        covs.append(post.cov)
    stacked = torch.stack(means)
    return stacked.mean(0), torch.stack(covs).mean(0) + torch.cov(stacked.T)


# ---- issue 37, seventh rule: the expansion's error integrated out ------------------------------
def test_expansion_range_is_the_curvature_ratio_bound():
    """``1 / c`` lies in [eta / (e^eta - 1), eta / (1 - e^-eta)]: the path-averaged curvature
    weight over a linear-predictor change eta, relative to the start's, when |d log w / d eta|
    <= 1 (the two ends are w = exp(-eta t) and exp(eta t) averaged over t in [0, 1])."""
    assert na.expansion_range(0.0) == (1.0, 1.0)
    for eta in (0.01, 0.5, 2.0, 8.0):
        lo, hi = na.expansion_range(eta)
        t = torch.linspace(0, 1, 200001, dtype=torch.float64)
        up, down = float(torch.exp(eta * t).mean()), float(torch.exp(-eta * t).mean())
        assert lo == pytest.approx(1 / up, rel=1e-4) and hi == pytest.approx(1 / down, rel=1e-4)
        assert lo < 1 < hi


def _gaussian(mean, cov):
    from dpsummary.gaussian import GaussianPosterior

    return GaussianPosterior(torch.tensor(mean, dtype=torch.float64),
                             torch.linalg.cholesky(torch.tensor(cov, dtype=torch.float64)))


def test_expansion_aware_moments_are_the_log_uniform_mixture():
    """Mean a + E[1/c] d and covariance S + Var(1/c) d d^T, ``1 / c`` log-uniform on the range;
    checked against a Monte Carlo mixture (200,000 draws; tolerance 5 Monte Carlo sds: failure
    rate below 1e-6 per check)."""
    model = LogisticRegression(2)
    post = _gaussian([0.5, 1.0, -0.5], [[0.04, 0.0, 0.0], [0.0, 0.09, 0.01], [0.0, 0.01, 0.05]])
    rel = na.RoundRelease(anchor=torch.zeros(3, dtype=torch.float64), score=torch.zeros(3, dtype=torch.float64),
                          curvature=torch.eye(3, dtype=torch.float64) * 100.0, score_bound=1.0, curvature_bound=1.0,
                          score_noise_std=1.0, curvature_noise_std=1.0)
    out = na.expansion_aware(model, post, rel, feature_norm=1.0, eta_rule="box")
    eta = na.eta_change(model, post.mean, 1.0)
    lo, hi = na.expansion_range(eta)
    g = torch.Generator().manual_seed(0)
    inv_c = torch.exp(math.log(lo) + torch.rand(200_000, generator=g, dtype=torch.float64) * math.log(hi / lo))
    d = post.mean
    assert torch.allclose(out.mean, inv_c.mean() * d, atol=5 * float(inv_c.std()) / math.sqrt(2e5) * float(d.abs().max()))
    want = post.cov + float(inv_c.var()) * torch.outer(d, d)
    assert torch.allclose(out.cov, want, rtol=0.02)
    # A zero step leaves the posterior unchanged.
    still = na.expansion_aware(model, post, dataclasses.replace(rel, anchor=post.mean.clone()), feature_norm=1.0)
    assert torch.allclose(still.mean, post.mean) and torch.allclose(still.cov, post.cov)


def test_expansion_data_rule_uses_the_released_curvature():
    """``eta_rule="data"``: eta is at most 3 curvature-weighted rms changes sqrt(d^T H d / H_00)
    (never more than the public box's bound); with H_00 inside its noise, the box bound."""
    model = LogisticRegression(2)
    post = _gaussian([0.0, 0.3, 0.0], [[0.01, 0.0, 0.0], [0.0, 0.01, 0.0], [0.0, 0.0, 0.01]])
    h = torch.diag(torch.tensor([400.0, 4.0, 4.0], dtype=torch.float64))  # the data sit near the centre
    rel = na.RoundRelease(anchor=torch.zeros(3, dtype=torch.float64), score=torch.zeros(3, dtype=torch.float64),
                          curvature=h, score_bound=1.0, curvature_bound=1.0, score_noise_std=1.0,
                          curvature_noise_std=1.0)
    box = na.expansion_aware(model, post, rel, feature_norm=10.0, eta_rule="box")  # a box 10x wider than the data
    data = na.expansion_aware(model, post, rel, feature_norm=10.0, eta_rule="data")
    eta_data = 3.0 * math.sqrt(0.3**2 * 4.0 / 400.0)
    lo, hi = na.expansion_range(eta_data)
    span = math.log(hi / lo)
    assert float(data.mean[1]) == pytest.approx(0.3 * (hi - lo) / span)
    assert float(box.cov[1, 1]) > float(data.cov[1, 1]) > float(post.cov[1, 1])
    noisy = dataclasses.replace(rel, curvature_noise_std=300.0)  # H_00 not clearly above its noise
    assert torch.allclose(na.expansion_aware(model, post, noisy, feature_norm=10.0, eta_rule="data").cov, box.cov)
    with pytest.raises(ValueError, match="eta_rule"):
        na.expansion_aware(model, post, rel, feature_norm=1.0, eta_rule="nowhere")


def test_expansion_aware_covers_where_newton_stops_short():
    """A logistic table with a large effect (4 model units, 9% positives): three rounds from the
    prior mean stop short even without noise (last anchor -2.4 / 1.7 against the mode's -3.9 /
    3.9), and the imputed posterior alone puts the full-data mean 25-29 of its sds away; with the
    expansion's error integrated out (``expansion="data"``) within 3 (measured 2.55: the log-uniform
    factor puts little mass at the range's far end, so this is a reduction, not full coverage,
    when the rounds stop this far short). Noise 1e-4 of a real release's (deterministic)."""
    model = LogisticRegression(2)
    g = torch.Generator().manual_seed(3)
    x = torch.rand(20000, 2, generator=g, dtype=torch.float64) * 2 - 1
    pts = model.simulate(torch.tensor([-4.0, 4.0, 0.5], dtype=torch.float64), 20000, g, features=x)
    full = full_posterior(model, pts)
    bounds = na.public_bounds(model, feature_norm=math.sqrt(2), target_bound=1.0)
    rounds = ((0.1, 0.1), (0.1, 0.1), (0.4, 0.2))
    z = {}
    for expansion in (None, "data"):
        sched = na.Schedule(rounds, posterior="imputed", expansion=expansion)
        res = na.fit(model, _release_fn(pts, model, np.random.default_rng(0)), bounds, schedule=sched, sigma=1e-4,
                     feature_norm=math.sqrt(2), generator=torch.Generator().manual_seed(0))
        z[expansion] = float(((res.posterior.mean - full.mean).abs() / res.posterior.cov.diagonal().sqrt()).max())
    assert z[None] > 20.0 and z["data"] < 3.0


def test_expansion_gate_applies_only_to_an_unconverged_release():
    """``Schedule.expansion_gate`` (after issue 50's forty-second rule): the expansion-aware
    posterior only where the convergence check fails. Where the rounds stop short (the table
    above, unconverged) the gated posterior is the ungated one; on a small effect (converged) it
    is the posterior without the expansion, which the ungated one is not (the expansion widens
    along any last step). Declared in the schedule; needs an expansion."""
    with pytest.raises(ValueError, match="expansion_gate"):
        na.Schedule(((0.5, 0.5),), posterior="imputed", expansion_gate=True)
    gated = na.Schedule(((0.1, 0.1), (0.1, 0.1), (0.4, 0.2)), posterior="imputed", expansion="data",
                        expansion_gate=True)
    assert gated.as_dict()["expansion_only_unconverged"] is True
    assert "expansion_only_unconverged" not in dataclasses.replace(gated, expansion_gate=False).as_dict()
    model = LogisticRegression(2)
    bounds = na.public_bounds(model, feature_norm=math.sqrt(2), target_bound=1.0)
    for effect, sigma, converged in ((4.0, 1e-4, False), (0.3, 1.0, True)):
        g = torch.Generator().manual_seed(3)
        x = torch.rand(20000, 2, generator=g, dtype=torch.float64) * 2 - 1
        pts = model.simulate(torch.tensor([-1.0, effect, 0.5], dtype=torch.float64), 20000, g, features=x)
        fits = {}
        for name, sched in (("none", dataclasses.replace(gated, expansion=None, expansion_gate=False)),
                            ("always", dataclasses.replace(gated, expansion_gate=False)), ("gated", gated)):
            fits[name] = na.fit(model, _release_fn(pts, model, np.random.default_rng(0)), bounds, schedule=sched,
                                sigma=sigma, feature_norm=math.sqrt(2), generator=torch.Generator().manual_seed(0))
        assert fits["gated"].converged is converged
        same = fits["none"] if converged else fits["always"]
        assert torch.equal(fits["gated"].posterior.mean, same.posterior.mean)
        assert torch.equal(fits["gated"].posterior.cov, same.posterior.cov)
        assert not torch.equal(fits["always"].posterior.cov, fits["none"].posterior.cov)


def test_expansion_schedule_option_is_recorded_and_needs_the_feature_norm():
    """``Schedule.expansion`` (an option; the seventh rule did not make it a default)."""
    for model in (LogisticRegression(2), LinearRegression(2, noise_scale=1.0)):
        assert na.Schedule.default(model).expansion is None
    sched = na.Schedule(na.DEFAULT_ROUNDS, posterior="imputed", expansion="data")
    assert sched.as_dict()["expansion"] == "data"
    assert sched.as_dict()["expansion_rms_factor"] == na.EXPANSION_RMS_FACTOR
    with pytest.raises(ValueError, match="expansion"):
        na.Schedule(((0.5, 0.5),), expansion="always")
    model = LogisticRegression(2)
    pts, _ = _table(model, 500, 5)
    bounds = na.public_bounds(model, feature_norm=math.sqrt(2), target_bound=1.0)
    with pytest.raises(ValueError, match="feature norm"):
        na.fit(model, _release_fn(pts, model, np.random.default_rng(5)), bounds, schedule=sched,
               sigma=1.0, generator=torch.Generator().manual_seed(5))


# ---- issue 37, eighth rule: the rounds pooled ---------------------------------------------------
def _round(anchor, score, curvature, sn, cn):
    t = lambda v: torch.tensor(v, dtype=torch.float64)  # noqa: E731
    return na.RoundRelease(anchor=t(anchor), score=t(score), curvature=t(curvature), score_bound=1.0,
                           curvature_bound=1.0, score_noise_std=sn, curvature_noise_std=cn)


def test_pooled_release_is_the_inverse_variance_average_near_the_last_anchor():
    model = LogisticRegression(1)
    h1, h2 = [[10.0, 1.0], [1.0, 4.0]], [[12.0, 2.0], [2.0, 6.0]]
    r1 = _round([0.0, 0.0], [1.0, 2.0], h1, 2.0, 1.0)
    r2 = _round([0.0, 0.0], [3.0, -1.0], h2, 1.0, 2.0)
    p = na.pooled_release(model, [r1, r2], feature_norm=1.0)
    want_h = (torch.tensor(h1) / 1.0 + torch.tensor(h2) / 4.0) / (1.0 + 0.25)
    assert torch.allclose(p.curvature, want_h.to(torch.float64))
    assert torch.allclose(p.score, torch.tensor([(1.0 / 4 + 3.0) / 1.25, (2.0 / 4 - 1.0) / 1.25], dtype=torch.float64))
    assert p.score_noise_std == pytest.approx(1.25**-0.5) and p.curvature_noise_std == pytest.approx(1.25**-0.5)
    # An anchor further than POOL_ETA (linear-predictor change over the box) is left out.
    far = _round([0.3, 0.0], [1.0, 2.0], h1, 2.0, 1.0)
    assert na.pooled_release(model, [far, r2], feature_norm=1.0) is r2
    near = _round([0.1, 0.05], [1.0, 2.0], h1, 2.0, 1.0)
    assert na.eta_change(model, r2.anchor - near.anchor, 1.0) <= na.POOL_ETA
    assert na.pooled_release(model, [near, r2], feature_norm=1.0) is not r2


def test_pooled_scores_move_to_the_last_anchor_exactly_for_a_quadratic_likelihood():
    """Linear regression (a quadratic log-likelihood, constant curvature): exact statistics at
    two nearby anchors pool to exactly the last anchor's score."""
    model = LinearRegression(2, noise_scale=1.0)
    pts, _ = _table(model, 400, 2)
    pts[:, -1].clamp_(-1, 1)

    def exact(anchor):
        a = torch.tensor(anchor, dtype=torch.float64)
        c, z = model.record_curvature_factors(pts, a)
        return _round(anchor, model.record_scores(pts, a).sum(0).tolist(), ((c[:, None] * z).T @ z).tolist(), 1.0, 1.0)

    r1, r2 = exact([0.05, 0.0, 0.02]), exact([0.0, 0.03, 0.0])
    p = na.pooled_release(model, [r1, r2], feature_norm=math.sqrt(2))
    assert torch.allclose(p.score, r2.score, atol=1e-9) and torch.allclose(p.curvature, r2.curvature)


def test_pool_schedule_option():
    sched = na.Schedule(na.DEFAULT_ROUNDS, posterior="imputed", pool=True)
    assert sched.as_dict()["pool_eta"] == na.POOL_ETA
    model = LogisticRegression(2)
    pts, _ = _table(model, 2000, 6)
    bounds = na.public_bounds(model, feature_norm=math.sqrt(2), target_bound=1.0)
    with pytest.raises(ValueError, match="feature norm"):
        na.fit(model, _release_fn(pts, model, np.random.default_rng(6)), bounds, schedule=sched, sigma=1.0,
               generator=torch.Generator().manual_seed(6))
    res = na.fit(model, _release_fn(pts, model, np.random.default_rng(6)), bounds, schedule=sched, sigma=1.0,
                 feature_norm=math.sqrt(2), generator=torch.Generator().manual_seed(6))
    assert bool(torch.isfinite(res.posterior.cov).all())


# ---- issue 37, ninth rule: the curvatures pooled ------------------------------------------------
def test_pooled_curvature_averages_the_curvatures_of_nearby_anchors_only():
    model = LogisticRegression(1)
    h_last, h_near, h_far = [[100.0, 10.0], [10.0, 40.0]], [[110.0, 12.0], [12.0, 44.0]], [[300.0, 0.0], [0.0, 90.0]]
    last = _round([0.5, 0.2], [1.0, 2.0], h_last, 2.0, 4.0)
    near = _round([0.5, 0.3], [9.0, 9.0], h_near, 3.0, 2.0)  # rms change sqrt(0.01 * 40 / 100) = 0.063
    far = _round([0.0, 0.0], [5.0, 5.0], h_far, 3.0, 1.0)  # rms change sqrt((0.25*100+0.2*0.5*10*2+0.04*40)/100) > 0.25
    assert na.rms_eta(last, last.anchor - near.anchor) == pytest.approx(math.sqrt(0.01 * 40.0 / 100.0))
    assert na.rms_eta(last, last.anchor - far.anchor) > na.POOL_RMS_ETA
    p = na.pooled_curvature_release(model, [far, near, last])
    want = (torch.tensor(h_last) / 16.0 + torch.tensor(h_near) / 4.0) / (1 / 16 + 1 / 4)
    assert torch.allclose(p.curvature, want.to(torch.float64))
    assert p.curvature_noise_std == pytest.approx((1 / 16 + 1 / 4) ** -0.5)
    assert torch.equal(p.score, last.score) and p.score_noise_std == last.score_noise_std
    assert torch.equal(p.anchor, last.anchor)
    assert na.pooled_curvature_release(model, [far, last]) is last
    # H_00 within two noise sds of zero: nothing is read off it.
    weak = dataclasses.replace(last, curvature_noise_std=60.0)
    assert na.rms_eta(weak, last.anchor - near.anchor) is None
    assert na.pooled_curvature_release(model, [near, weak]) is weak


def test_pool_curvature_schedule_option():
    sched = na.Schedule(na.DEFAULT_ROUNDS, posterior="imputed", pool_curvature=True)
    assert sched.as_dict()["pool_curvature_rms_eta"] == na.POOL_RMS_ETA
    model = LogisticRegression(2)
    pts, _ = _table(model, 2000, 7)
    bounds = na.public_bounds(model, feature_norm=math.sqrt(2), target_bound=1.0)
    res = na.fit(model, _release_fn(pts, model, np.random.default_rng(7)), bounds, schedule=sched, sigma=1.0,
                 feature_norm=math.sqrt(2), generator=torch.Generator().manual_seed(7))
    assert bool(torch.isfinite(res.posterior.cov).all())


def test_poisson_default_spends_a_share_on_the_count_range_and_declares_it():
    """The Poisson default's count histogram (module docstring 11.) is one more Gaussian event, at
    noise multiplier sigma / sqrt(share), first in the event list; the rounds keep their
    proportions of the rest, and the shares still sum to 1 (a single Gaussian of multiplier sigma)."""
    from dpsummary.models import PoissonRegression

    sched = na.Schedule.default(PoissonRegression(3))
    assert sched.count_range == na.COUNT_RANGE_SHARE
    flat = [w for pair in sched.rounds for w in pair]
    assert sum(flat) + sched.count_range == pytest.approx(1.0)
    assert [r[0] / sched.rounds[0][0] for r in sched.rounds] == pytest.approx(
        [r[0] / na.POISSON_ROUNDS[0][0] for r in na.POISSON_ROUNDS])
    events = sched.events(2.0)
    assert len(events) == 1 + 2 * len(sched.rounds)
    assert events[0].noise_multiplier == pytest.approx(2.0 / math.sqrt(na.COUNT_RANGE_SHARE))
    assert acc.epsilon(events, 1e-6, "rdp") == pytest.approx(acc.epsilon([acc.gaussian_event(2.0)], 1e-6, "rdp"))
    assert sched.as_dict()["count_range_share"] == na.COUNT_RANGE_SHARE
    assert na.Schedule.default(LogisticRegression(3)).count_range == 0.0
    with pytest.raises(ValueError, match="sum to 1"):
        na.Schedule(na.POISSON_ROUNDS, count_range=0.05)


def test_feature_range_option_shares_one_histogram_with_the_count_range():
    """The thirteenth rule's option (not a default): the feature norm's histogram joins the count's
    in one Gaussian event at sigma / sqrt(both shares), first in the event list, and the shares
    still compose to the single Gaussian of multiplier sigma."""
    import dataclasses

    from dpsummary.models import PoissonRegression

    base = na.Schedule.default(PoissonRegression(3))
    factor = (1.0 - base.count_range - 0.05) / (1.0 - base.count_range)
    sched = dataclasses.replace(base, rounds=tuple((s * factor, c * factor) for s, c in base.rounds),
                                feature_range=0.05)
    events = sched.events(2.0)
    assert len(events) == 1 + 2 * len(sched.rounds)
    assert events[0].noise_multiplier == pytest.approx(2.0 / math.sqrt(na.COUNT_RANGE_SHARE + 0.05))
    assert acc.epsilon(events, 1e-6, "rdp") == pytest.approx(acc.epsilon([acc.gaussian_event(2.0)], 1e-6, "rdp"))
    assert sched.as_dict()["feature_range_share"] == 0.05
    assert na.Schedule.default(LogisticRegression(3)).feature_range == 0.0
    with pytest.raises(ValueError, match="sum to 1"):
        dataclasses.replace(base, feature_range=0.05)


def test_range_clips_reads_both_bounds_from_one_histogram():
    """:func:`noise_aware.range_clips` hands the caller's mechanism one layout holding the norm's and
    the count's bins and reads each clip from it; None when the schedule spends nothing."""
    import dataclasses

    from dpsummary.models import PoissonRegression
    from dpsummary.postprocess.marginals import NoisyMarginals

    sched = na.Schedule.default(PoissonRegression(2))
    factor = (1.0 - sched.count_range - 0.05) / (1.0 - sched.count_range)
    sched = dataclasses.replace(sched, rounds=tuple((s * factor, c * factor) for s, c in sched.rounds),
                                feature_range=0.05)
    rng = np.random.default_rng(0)
    pts = torch.tensor(np.c_[rng.uniform(-0.1, 0.1, (2000, 2)), rng.poisson(3.0, 2000)], dtype=torch.float64)
    seen = []

    def exact(layout, multiplier):
        seen.append((layout, multiplier))
        return NoisyMarginals(layout, layout.counts(pts), multiplier)

    clips = na.range_clips(sched, sigma=1e-3, num_features=2, feature_norm=math.sqrt(2), target_name="y",
                           target_bound=1000.0, histogram=exact)
    (layout, multiplier), = seen
    assert [c.kind for c in layout.columns] == ["norm", "edges"] and layout.touches == 2
    assert multiplier == pytest.approx(sched.range_multiplier(1e-3))
    assert 0.1 < clips.feature.bound <= 0.2 and clips.count.bound in (10.0, 20.0)
    assert len(clips.notes()) == 2
    assert na.range_clips(na.Schedule.default(LogisticRegression(2)), sigma=1.0, num_features=2,
                          feature_norm=1.0, target_name="y", target_bound=1.0, histogram=exact) is None


def test_a_non_isotropic_prior_gives_the_same_posteriors_as_the_isotropic_path():
    """``prior_precision_matrix`` (a model attribute; the working-frame prototype's prior): equal
    to ``I / s^2`` it reproduces the isotropic fast path exactly; a general one matches the
    per-draw general formula (noise_aware_posterior with the curvature known) draw by draw."""
    d = 4
    rel = _random_release(d, 3, 200)
    iso = LogisticRegression(d - 1)
    same = LogisticRegression(d - 1)
    same.prior_precision_matrix = torch.eye(d, dtype=torch.float64)
    for fn in (lambda m: na.noise_aware_posterior(m, rel)[0],
               lambda m: na.imputed_posterior(m, rel, generator=torch.Generator().manual_seed(2), draws=25)):
        x, y = fn(iso), fn(same)
        assert torch.allclose(x.mean, y.mean, atol=1e-10) and torch.allclose(x.cov, y.cov, atol=1e-10)
    t = torch.eye(d, dtype=torch.float64)
    t[0, 1:] = -1.0
    full = LogisticRegression(d - 1)
    full.prior_precision_matrix = torch.linalg.inv(t @ t.T)
    assert torch.allclose(na.prior_precision(full), full.prior_precision_matrix)
    mixed = na.imputed_posterior(full, rel, generator=torch.Generator().manual_seed(4), draws=25)
    mean, cov = _per_draw_mixture(full, rel, seed=4, draws=25)
    assert torch.allclose(mixed.mean, mean, atol=1e-9) and torch.allclose(mixed.cov, cov, atol=1e-9)
    assert not torch.allclose(mixed.mean, na.imputed_posterior(iso, rel, generator=torch.Generator().manual_seed(4),
                                                               draws=25).mean, atol=1e-3)


@pytest.mark.parametrize("accountant", ["rdp", "pld"])
def test_a_chosen_last_split_is_declared_as_the_one_gaussian_every_candidate_composes_to(accountant):
    """Module docstring 13.: with ``last_split`` the last round is declared as one Gaussian event
    at sigma / sqrt(its total share), and every candidate split's two Gaussians compose to exactly
    that privacy loss, so the ledger does not depend on the choice."""
    import dataclasses

    base = na.Schedule.default(LogisticRegression(3))
    sched = dataclasses.replace(base, last_split="preposterior")
    events = sched.events(2.0)
    assert len(events) == 2 * (len(sched.rounds) - 1) + 1
    assert events[-1].noise_multiplier == pytest.approx(2.0 / math.sqrt(sum(sched.rounds[-1])))
    target = acc.epsilon(events, 1e-6, accountant)
    assert target == pytest.approx(acc.epsilon([acc.gaussian_event(2.0)], 1e-6, accountant), rel=1e-4)
    candidates = sched.split_candidates(2.0, sched.rounds[-1])
    assert len(candidates) == len(na.LAST_SPLITS)
    for s_mult, c_mult in candidates:
        fixed = [acc.gaussian_event(m) for pair in [*base.noise_multipliers(2.0)[:-1], (s_mult, c_mult)] for m in pair]
        assert acc.epsilon(fixed, 1e-6, accountant) == pytest.approx(target, rel=1e-4)
    assert sched.as_dict()["last_split"] == "preposterior"
    with pytest.raises(ValueError, match="last_split"):
        na.Schedule(((0.5, 0.5),), last_split="preposterior")


def test_preposterior_split_gives_the_curvature_more_where_its_noise_is_the_bottleneck():
    """Where the previous round's curvature dwarfs its noise the score's noise sets the width and
    the default split (the first candidate) is kept; where two directions' curvature is of the
    noise's size, a split with more curvature budget is chosen. Deterministic (fixed public seed)."""
    import dataclasses

    model = LogisticRegression(2)
    sched = dataclasses.replace(na.Schedule.default(model), last_split="preposterior")
    candidates = sched.split_candidates(1.0, sched.rounds[-1])
    zero = torch.zeros(3, dtype=torch.float64)

    def previous(diag):
        return na.RoundRelease(anchor=zero, score=zero, curvature=torch.diag(torch.tensor(diag, dtype=torch.float64)),
                               score_bound=1.8, curvature_bound=2.0, score_noise_std=1.8 / math.sqrt(0.05),
                               curvature_noise_std=2.0 / math.sqrt(0.1))

    clear, values = na.preposterior_split(model, previous([5000.0, 5000.0, 5000.0]), anchor=zero, bounds=(1.8, 2.0),
                                          candidates=candidates)
    assert clear == 0 and all(math.isfinite(v) for v in values)
    buried, _ = na.preposterior_split(model, previous([5000.0, 30.0, 30.0]), anchor=zero, bounds=(1.8, 2.0),
                                      candidates=candidates)
    assert buried > 0
    again, values_again = na.preposterior_split(model, previous([5000.0, 5000.0, 5000.0]), anchor=zero,
                                                bounds=(1.8, 2.0), candidates=candidates)
    assert (again, values_again) == (clear, values)


def test_fit_with_a_chosen_last_split_uses_a_candidate_and_says_so():
    import dataclasses

    model = LogisticRegression(2)
    sched = dataclasses.replace(na.Schedule.default(model), last_split="preposterior")
    pts, _ = _table(model, 3000, 11)
    bounds = na.public_bounds(model, feature_norm=math.sqrt(2), target_bound=1.0)
    res = na.fit(model, _release_fn(pts, model, np.random.default_rng(11)), bounds, schedule=sched, sigma=0.5,
                 feature_norm=math.sqrt(2), generator=torch.Generator().manual_seed(11))
    assert tuple(res.noise_multipliers[-1]) in [tuple(c) for c in sched.split_candidates(0.5, sched.rounds[-1])]
    assert res.noise_multipliers[:-1] == sched.noise_multipliers(0.5)[:-1]
    assert any("last round's share split" in n for n in res.notes)
    assert res.schedule is not None and sum(res.schedule.rounds[-1]) == pytest.approx(sum(sched.rounds[-1]))
    assert res.schedule.noise_multipliers(0.5)[-1] == pytest.approx(res.noise_multipliers[-1])
    assert bool(torch.isfinite(res.posterior.cov).all())


@pytest.mark.parametrize("accountant", ["rdp", "pld"])
def test_merged_rounds_are_declared_as_the_one_gaussian_every_path_composes_to(accountant):
    """Module docstring 14.: with ``merge_rounds`` rounds 2.. are declared as one Gaussian at sigma
    / sqrt(their total share), whichever rounds are merged at run time; the whole still composes to
    the schedule's single Gaussian."""
    import dataclasses

    sched = dataclasses.replace(na.Schedule.default(LogisticRegression(3)), merge_rounds=True)
    events = sched.events(2.0)
    assert len(events) == 3
    assert events[-1].noise_multiplier == pytest.approx(2.0 / math.sqrt(sum(sum(r) for r in sched.rounds[1:])))
    assert acc.epsilon(events, 1e-6, accountant) == pytest.approx(
        acc.epsilon([acc.gaussian_event(2.0)], 1e-6, accountant), rel=1e-4)
    assert sched.as_dict()["merge_rounds"] is True


def test_fit_merges_the_rounds_left_once_the_anchor_has_settled():
    """A table with no effects and a balanced class: the prior mean is the mode, so round 1's step
    is tiny and the four rounds left run as one with the sum of their shares; the schedule as run
    says so and its shares still sum to 1. Without the option every round runs."""
    import dataclasses

    model = LogisticRegression(2)
    g = torch.Generator().manual_seed(5)
    pts = model.simulate(torch.zeros(3, dtype=torch.float64), 20_000, g,
                         features=torch.rand(20_000, 2, generator=g, dtype=torch.float64) * 2 - 1)
    bounds = na.public_bounds(model, feature_norm=math.sqrt(2), target_bound=1.0)
    base = na.Schedule.default(model)
    sched = dataclasses.replace(base, merge_rounds=True)
    res = na.fit(model, _release_fn(pts, model, np.random.default_rng(5)), bounds, schedule=sched, sigma=0.5,
                 feature_norm=math.sqrt(2), generator=torch.Generator().manual_seed(5))
    assert len(res.rounds) == 2
    assert res.schedule is not None and res.schedule.rounds[0] == base.rounds[0]
    assert res.schedule.rounds[1] == pytest.approx((sum(s for s, _ in base.rounds[1:]), sum(c for _, c in base.rounds[1:])))
    assert res.noise_multipliers[1] == pytest.approx(res.schedule.noise_multipliers(0.5)[1])
    assert any("anchor settled after round 1" in n for n in res.notes)
    plain = na.fit(model, _release_fn(pts, model, np.random.default_rng(5)), bounds, schedule=base, sigma=0.5,
                   feature_norm=math.sqrt(2), generator=torch.Generator().manual_seed(5))
    assert len(plain.rounds) == len(base.rounds) and plain.schedule == base


def test_trace_kept_spectrum_is_the_nearest_psd_spectrum_with_the_same_trace():
    """Soft-thresholded eigenvalues: non-negative, summing to the input's trace (0 when it is not
    positive), equal to the plain PSD part when that already has no more, and closer (Euclidean,
    which for a common eigenbasis is Frobenius) than any other non-negative spectrum of that sum
    tried."""
    gen = torch.Generator().manual_seed(3)
    for vals in ([3.0, 1.0, -1.0], [5.0, -1.0, -1.0, -1.0], [2.0, 1.0, 0.5], [1.0, -2.0]):
        v = torch.tensor(vals, dtype=torch.float64)
        out = na.trace_kept_spectrum(v)
        assert bool((out >= 0).all())
        assert float(out.sum()) == pytest.approx(max(float(v.sum()), 0.0))
        if float(v.clamp(min=0).sum()) <= float(v.sum()):
            assert torch.equal(out, v.clamp(min=0))
        if float(v.sum()) > 0:
            for _ in range(200):
                other = torch.rand(len(vals), generator=gen, dtype=torch.float64)
                other = other / other.sum() * float(v.sum())
                assert float((out - v).norm()) <= float((other - v).norm()) + 1e-12
    assert torch.equal(na.trace_kept_spectrum(torch.tensor([3.0, 1.0, -1.0], dtype=torch.float64)),
                       torch.tensor([2.5, 0.5, 0.0], dtype=torch.float64))


def test_keeping_each_draws_trace_widens_only_where_the_noise_dominates():
    """A release whose curvature is pure noise in two of three directions: with each imputation
    draw kept at its own trace the posterior there is wider (less of the noise credited as
    information) and never narrower than the prior; in the well-identified direction the sd is
    unchanged to a few per cent."""
    model = LogisticRegression(2)
    zero = torch.zeros(3, dtype=torch.float64)
    rel = na.RoundRelease(anchor=zero, score=zero, curvature=torch.diag(torch.tensor([1e5, 0.0, 0.0], dtype=torch.float64)),
                          score_bound=1.8, curvature_bound=2.0, score_noise_std=30.0, curvature_noise_std=200.0)
    plain = na.imputed_posterior(model, rel, generator=torch.Generator().manual_seed(1))
    kept = na.imputed_posterior(model, rel, generator=torch.Generator().manual_seed(1),
                                spectrum=na.trace_kept_spectrum)
    sd_plain, sd_kept = plain.cov.diagonal().sqrt(), kept.cov.diagonal().sqrt()
    assert float(sd_kept[0]) == pytest.approx(float(sd_plain[0]), rel=0.05)
    assert bool((sd_kept[1:] > sd_plain[1:]).all())
    assert bool((sd_kept <= model.prior_scale * 1.05).all())


def test_default_glm_schedules_keep_each_draws_trace_and_fit_uses_it():
    """Issue 50's thirty-seventh rule: the logistic and Poisson defaults impute the curvature at
    each draw's own trace and declare it; the option needs the imputed posterior; ``fit`` with
    it gives exactly imputed_posterior(spectrum=trace_kept_spectrum) of the last round, from the
    same post-processing generator state."""
    from dpsummary.models import PoissonRegression

    for model in (LogisticRegression(2), PoissonRegression(2)):
        sched = na.Schedule.default(model)
        assert sched.spectrum == "trace" and sched.as_dict()["imputed_spectrum"] == "trace"
    assert "imputed_spectrum" not in na.Schedule(((0.5, 0.5),), posterior="imputed").as_dict()
    with pytest.raises(ValueError, match="spectrum"):
        na.Schedule(((0.5, 0.5),), spectrum="trace")
    with pytest.raises(ValueError, match="spectrum"):
        na.Schedule(((0.5, 0.5),), posterior="imputed", spectrum="soft")
    model = LogisticRegression(2)
    pts, _ = _table(model, 500, 5)
    bounds = na.public_bounds(model, feature_norm=math.sqrt(2), target_bound=1.0)
    runs = {}
    for spectrum in ("psd", "trace"):
        sched = na.Schedule(((0.5, 0.5),), posterior="imputed", spectrum=spectrum)
        runs[spectrum] = na.fit(model, _release_fn(pts, model, np.random.default_rng(5)), bounds, schedule=sched,
                                sigma=40.0, generator=torch.Generator().manual_seed(5))
    last = runs["trace"].rounds[-1]
    again = na.imputed_posterior(model, last, generator=torch.Generator().manual_seed(5),
                                 spectrum=na.trace_kept_spectrum)
    assert torch.allclose(runs["trace"].posterior.cov, again.cov) and torch.allclose(runs["trace"].posterior.mean, again.mean)
    assert not torch.allclose(runs["trace"].posterior.cov, runs["psd"].posterior.cov)


def test_censor_counts_needs_the_count_range_and_swaps_only_the_statistic_model():
    """Issue 50's thirty-second rule: Schedule.censor_counts needs the count's clip; the rounds'
    statistic model is then the Poisson model censored at the clip bound (K = floor), declared in
    the schedule's dict; without it (or for logistic regression's default) the model itself."""
    from dpsummary.models import PoissonRegression
    from dpsummary.models.glm import CensoredPoissonRegression

    model = PoissonRegression(3)
    sched = na.Schedule.default(model)
    with pytest.raises(ValueError, match="count_range"):
        na.Schedule(na.POISSON_ROUNDS, censor_counts=True)
    assert na.statistic_model(model, dataclasses.replace(sched, censor_counts=False), 2.0) is model
    on = dataclasses.replace(sched, censor_counts=True)
    assert on.as_dict()["censored_counts"] is True
    stat = na.statistic_model(model, on, 5.0)
    assert isinstance(stat, CensoredPoissonRegression) and stat.censor_count == 5.0
    assert stat.param_dim == model.param_dim and stat.prior_scale == model.prior_scale
    logistic = LogisticRegression(3)
    with pytest.raises(ValueError, match="count model"):
        na.statistic_model(logistic, on, 5.0)


def test_censored_rounds_remove_the_clip_bias_on_poisson_counts():
    """Counts Poisson(exp(-1.2 + x b)) (mean about 0.3) clipped at the public bound 1, N 20,000,
    near-zero noise: the plain rounds' intercept sits low by the clip's bias (their mean model
    ``exp(eta)`` ignores it), the censored rounds' posterior mean is the full data's within a
    fraction of a full-data sd. Deterministic (seeded data and noise). Measured over data seeds
    0-2: plain intercept error -0.047 / -0.048 / -0.047 (full-data sd 0.013), censored largest
    error over the coordinates 0.016 / 0.014 / 0.009."""
    from dpsummary.models import PoissonRegression

    model = PoissonRegression(3)
    g = torch.Generator().manual_seed(0)
    x = torch.rand(20_000, 3, generator=g, dtype=torch.float64) * 2 - 1
    theta = torch.tensor([-1.2, 0.4, -0.3, 0.2], dtype=torch.float64)
    pts = model.simulate(theta, 20_000, g, features=x)
    full = full_posterior(model, pts)
    fnorm, bound = math.sqrt(3.0), 1.0
    errors = {}
    for censor in (False, True):
        sched = dataclasses.replace(na.Schedule.default(model), censor_counts=censor)
        stat = na.statistic_model(model, sched, bound)
        bounds = na.public_bounds(model, feature_norm=fnorm, target_bound=bound)
        res = na.fit(model, _release_fn(pts, stat, np.random.default_rng(1)), bounds, schedule=sched,
                     sigma=1e-4, feature_norm=fnorm, target_bound=bound, generator=torch.Generator().manual_seed(0))
        errors[censor] = res.posterior.mean - full.mean
    full_sd = float(full.cov[0, 0]) ** 0.5
    assert float(errors[False][0]) < -2.5 * full_sd
    assert float(errors[True].abs().max()) < 0.025
    assert abs(float(errors[True][0])) < full_sd


def _one_hot_table(n: int, seed: int, *, broken: int = 0):
    """A logistic table whose features are a yes/no column one-hot over both levels (``no``,
    ``yes``: with the intercept, the exact relation ``v = e_0 - e_no - e_yes``) and one numeric;
    ``broken`` records have neither level (the all-zero "other" vector), which breaks it."""
    model = LogisticRegression(3)
    g = torch.Generator().manual_seed(seed)
    yes = (torch.rand(n, generator=g, dtype=torch.float64) < 0.3).double()
    x = torch.stack([1.0 - yes, yes, torch.rand(n, generator=g, dtype=torch.float64) * 2 - 1], dim=1)
    x[:broken, :2] = 0.0
    theta = torch.tensor([-0.5, 0.3, -0.7, 1.0], dtype=torch.float64)
    return model, model.simulate(theta, n, g, features=x)


ONE_HOT_RELATION = torch.tensor([[1.0, -1.0, -1.0, 0.0]], dtype=torch.float64)


def test_relations_option_needs_the_imputed_posterior_and_is_the_default():
    """Issue 50's thirty-eighth and thirty-ninth rules: ``Schedule.relations`` needs the imputed
    posterior, is declared in the schedule's dict with its threshold and is the logistic and
    Poisson default; with no candidate (an empty set, or None: no categorical column) it is the
    plain imputed posterior, draw for draw."""
    from dpsummary.models import PoissonRegression

    with pytest.raises(ValueError, match="imputed"):
        na.Schedule(((0.5, 0.5),), relations=True)
    for default_model in (LogisticRegression(2), PoissonRegression(2)):
        assert na.Schedule.default(default_model).relations
    sched = na.Schedule(((0.5, 0.5),), posterior="imputed", spectrum="trace", relations=True)
    assert sched.as_dict()["relation_z"] == na.RELATION_Z and "relations" in sched.as_dict()
    assert "relations" not in dataclasses.replace(sched, relations=False).as_dict()
    model, pts = _one_hot_table(2000, 1)
    bounds = na.public_bounds(model, feature_norm=math.sqrt(3), target_bound=1.0)
    fits = {arm: na.fit(model, _release_fn(pts, model, np.random.default_rng(1)), bounds,
                        schedule=dataclasses.replace(sched, relations=arm != "off"), sigma=20.0,
                        generator=torch.Generator().manual_seed(1),
                        relations=torch.zeros(0, 4, dtype=torch.float64) if arm == "empty" else None)
            for arm in ("off", "empty", "none")}
    for arm in ("empty", "none"):
        assert torch.equal(fits[arm].posterior.mean, fits["off"].posterior.mean)
        assert torch.equal(fits[arm].posterior.cov, fits["off"].posterior.cov)
        assert fits[arm].exact_relations is not None and fits[arm].exact_relations.shape == (0, 4)
    assert fits["off"].exact_relations is None


def test_released_posterior_is_the_prior_along_an_exact_relation():
    """Along an exact one-hot relation the data's score and curvature are 0, so the full data's
    posterior there is the prior's. With ``relations`` the released posterior's variance and mean
    along it are the prior's exactly; without, the imputed curvature's noise is credited there as
    information (variance below the prior's). The relation is decided from the release, so one
    broken by a tenth of the records is not projected off. Deterministic (seeded)."""
    model, pts = _one_hot_table(4000, 2)
    bounds = na.public_bounds(model, feature_norm=math.sqrt(3), target_bound=1.0)
    unit = ONE_HOT_RELATION[0] / ONE_HOT_RELATION[0].norm()
    along = {}
    for on in (False, True):
        sched = na.Schedule(((0.5, 0.5),), posterior="imputed", spectrum="trace", relations=on)
        res = na.fit(model, _release_fn(pts, model, np.random.default_rng(2)), bounds, schedule=sched, sigma=2.0,
                     generator=torch.Generator().manual_seed(2), relations=ONE_HOT_RELATION if on else None)
        along[on] = (float(unit @ res.posterior.cov @ unit), float(unit @ res.posterior.mean))
        if on:
            assert res.exact_relations is not None and res.exact_relations.shape[0] == 1
            assert any("exact relation" in note for note in res.notes)
    assert along[True][0] == pytest.approx(model.prior_scale**2, rel=1e-6)
    assert along[True][1] == pytest.approx(float(unit @ model.prior_mean), abs=1e-6)
    assert along[False][0] < 0.95 * model.prior_scale**2
    model, pts = _one_hot_table(4000, 2, broken=400)
    sched = na.Schedule(((0.5, 0.5),), posterior="imputed", spectrum="trace", relations=True)
    res = na.fit(model, _release_fn(pts, model, np.random.default_rng(2)), bounds, schedule=sched, sigma=2.0,
                 generator=torch.Generator().manual_seed(2), relations=ONE_HOT_RELATION)
    assert res.exact_relations is not None and res.exact_relations.shape[0] == 0


def test_model_relations_are_the_schemas_one_hot_relations_in_parameter_space():
    """The GLM release's candidates (thirty-eighth rule): the schema's one-hot relations over
    ``[intercept, x]``; without an intercept the intercept's column is dropped (its entry is 0)."""
    from dpsummary.data import ColumnSpec, Schema, Transform

    schema = Schema(columns=[ColumnSpec(name="a", kind="numeric", lower=0.0, upper=1.0),
                             ColumnSpec(name="c", kind="categorical", categories=["p", "q", "r"]),
                             ColumnSpec(name="y", kind="numeric", lower=0.0, upper=1.0)], target="y")
    tf = Transform.from_schema(schema)
    rel = na.model_relations(tf, LogisticRegression(tf.num_features))
    torch.testing.assert_close(rel, torch.tensor([[1.0, 0.0, -1.0, -1.0, -1.0]], dtype=torch.float64))
    without = na.model_relations(tf, LogisticRegression(tf.num_features, intercept=False))
    assert without.shape == (0, tf.num_features)  # one group and no intercept: no relation


# ---- the curvature's one-hot support (module docstring, 18.; issue 50's fortieth rule) ----------

def test_truncated_normal_matches_the_analytic_truncated_moments():
    """``truncated_normal`` against closed forms: N(0, 1) on [1, 2] has mean (phi(1) - phi(2)) /
    (Phi(2) - Phi(1)); on [-inf, inf] it is N(0, 1); an empty interval gives its lower end, an
    interval far in the tail (probability below float64's range) its point nearest the mean, and
    every draw lies in its interval. 200,000 seeded draws (the mean's standard error is 6e-4; the
    tolerance 5e-3 is about 8 standard errors)."""
    g = torch.Generator().manual_seed(0)
    n = 200_000
    zero = torch.zeros(n, dtype=torch.float64)
    x = na.truncated_normal(zero, 1.0, zero + 1.0, zero + 2.0, g)
    phi = lambda t: math.exp(-t * t / 2) / math.sqrt(2 * math.pi)  # noqa: E731
    big_phi = lambda t: 0.5 * (1 + math.erf(t / math.sqrt(2)))  # noqa: E731
    assert float(x.mean()) == pytest.approx((phi(1) - phi(2)) / (big_phi(2) - big_phi(1)), abs=5e-3)
    assert float(x.min()) >= 1.0 and float(x.max()) <= 2.0
    y = na.truncated_normal(zero + 3.0, 2.0, zero - math.inf, zero + math.inf, g)
    assert float(y.mean()) == pytest.approx(3.0, abs=2e-2) and float(y.std()) == pytest.approx(2.0, abs=2e-2)
    assert torch.equal(na.truncated_normal(zero[:3], 1.0, zero[:3] + 1.0, zero[:3] + 1.0, g), zero[:3] + 1.0)
    assert torch.equal(na.truncated_normal(zero[:3], 1.0, zero[:3] + 40.0, zero[:3] + 41.0, g), zero[:3] + 40.0)
    assert torch.equal(na.truncated_normal(zero[:3], 1.0, zero[:3] - 41.0, zero[:3] - 40.0, g), zero[:3] - 40.0)


def _two_categoricals_transform():
    from dpsummary.data import ColumnSpec, Schema, Transform

    schema = Schema(columns=[ColumnSpec(name="a", kind="numeric", lower=0.0, upper=1.0),
                             ColumnSpec(name="c", kind="categorical", categories=["p", "q", "r"]),
                             ColumnSpec(name="d", kind="categorical", categories=["s", "t"]),
                             ColumnSpec(name="y", kind="numeric", lower=0.0, upper=1.0)], target="y")
    return Transform.from_schema(schema)


def test_curvature_support_reads_the_schemas_one_hot_groups():
    """The support's groups over ``[intercept, x]`` (-1 for the intercept and numerics, else the
    categorical column's index); None for a schema without a categorical column."""
    from dpsummary.data import ColumnSpec, Schema, Transform

    tf = _two_categoricals_transform()
    sup = na.curvature_support(tf, LogisticRegression(tf.num_features))
    assert sup is not None and sup.intercept and sup.dim == 7
    assert sup.group.tolist() == [-1, -1, 1, 1, 1, 2, 2]
    bare = na.curvature_support(tf, LogisticRegression(tf.num_features, intercept=False))
    assert bare is not None and not bare.intercept and bare.group.tolist() == [-1, 1, 1, 1, 2, 2]
    numeric = Transform.from_schema(Schema(columns=[ColumnSpec(name="a", kind="numeric", lower=0.0, upper=1.0),
                                                    ColumnSpec(name="y", kind="numeric", lower=0.0, upper=1.0)],
                                           target="y"))
    assert na.curvature_support(numeric, LogisticRegression(1)) is None
    with pytest.raises(ValueError, match="parameters"):
        na.curvature_support(tf, LogisticRegression(2))


def _one_hot_curvature(n: int, seed: int) -> tuple[torch.Tensor, torch.Tensor]:
    """``[1, a, c (3 levels, some records in none), d (2 levels)]`` rows and their curvature
    ``sum w x x^T`` with positive weights."""
    g = torch.Generator().manual_seed(seed)
    x = torch.zeros(n, 7, dtype=torch.float64)
    x[:, 0] = 1.0
    x[:, 1] = torch.rand(n, generator=g, dtype=torch.float64) * 2 - 1
    c = torch.randint(0, 4, (n,), generator=g)  # 3: the "other" bucket, all zeros
    rows = torch.nonzero(c < 3).flatten()
    x[rows, 2 + c[rows]] = 1.0
    d = torch.randint(0, 2, (n,), generator=g)
    x[torch.arange(n), 5 + d] = 1.0
    w = torch.rand(n, generator=g, dtype=torch.float64) * 0.25
    return x, (x * w[:, None]).T @ x


def test_support_draws_keep_the_one_hot_facts_and_tend_to_the_truth():
    """Every draw keeps the facts of any data set's curvature (0 within a column, a level's
    diagonal equal to its intercept-row entry and within [0, H_00], entries across columns within
    [0, the smaller diagonal]), whatever the noise; with negligible noise a draw is the curvature."""
    tf = _two_categoricals_transform()
    sup = na.curvature_support(tf, LogisticRegression(tf.num_features))
    assert sup is not None
    _, truth = _one_hot_curvature(500, 3)
    g = torch.Generator().manual_seed(4)
    tau = 30.0
    noise = na.symmetric_noise(7, tau, g)
    for _ in range(50):
        draw = na.support_draw(truth + noise, tau, sup, g)
        torch.testing.assert_close(draw, draw.T)
        for j, k in ((2, 3), (2, 4), (3, 4), (5, 6)):
            assert float(draw[j, k]) == 0.0
        for j in range(2, 7):
            assert float(draw[j, j]) == float(draw[0, j])
            assert 0.0 <= float(draw[j, j]) <= float(draw[0, 0])
        for j in (2, 3, 4):
            for k in (5, 6):
                assert 0.0 <= float(draw[j, k]) <= min(float(draw[j, j]), float(draw[k, k])) + 1e-12
    exact = na.support_draw(truth, 1e-9, sup, g)
    torch.testing.assert_close(exact, truth, atol=1e-6, rtol=0.0)


def test_support_option_is_today_draw_for_draw_without_levels_and_narrows_many_levels():
    """``Schedule.support`` needs the imputed posterior, is the logistic and Poisson default
    (issue 50's fortieth rule) and is declared in the schedule's dict;
    with no support (None: no categorical column) the fit is the one without it, draw for draw.
    On a 20-level column whose off-diagonal curvature entries the noise buries, the support
    narrows the released posterior (seeded, deterministic: the median width ratio, 0.69 on this
    seed at noise multiplier 20, must be below 0.8; where the noise is small against the data,
    multiplier 1, the two are within 2%)."""
    from dpsummary.data import ColumnSpec, Schema, Transform
    from dpsummary.models import PoissonRegression

    with pytest.raises(ValueError, match="imputed"):
        na.Schedule(((0.5, 0.5),), support=True)
    for default_model in (LogisticRegression(2), PoissonRegression(2)):
        assert na.Schedule.default(default_model).support
    sched = na.Schedule(((0.5, 0.5),), posterior="imputed", spectrum="trace", support=True)
    assert "curvature_support" in sched.as_dict()
    assert "curvature_support" not in dataclasses.replace(sched, support=False).as_dict()
    assert sched.events(2.0) == dataclasses.replace(sched, support=False).events(2.0)
    model, pts = _one_hot_table(2000, 1)
    bounds = na.public_bounds(model, feature_norm=math.sqrt(3), target_bound=1.0)
    fits = [na.fit(model, _release_fn(pts, model, np.random.default_rng(1)), bounds,
                   schedule=dataclasses.replace(sched, support=on), sigma=20.0,
                   generator=torch.Generator().manual_seed(1), support=None) for on in (False, True)]
    assert torch.equal(fits[0].posterior.mean, fits[1].posterior.mean)
    assert torch.equal(fits[0].posterior.cov, fits[1].posterior.cov)
    levels = [f"l{j}" for j in range(20)]
    tf = Transform.from_schema(Schema(columns=[ColumnSpec(name="c", kind="categorical", categories=levels),
                                               ColumnSpec(name="y", kind="numeric", lower=0.0, upper=1.0)],
                                      target="y"))
    model = LogisticRegression(tf.num_features)
    g = torch.Generator().manual_seed(5)
    n = 20_000
    code = torch.multinomial(torch.tensor([0.5] + [0.5 / 19] * 19, dtype=torch.float64), n, replacement=True,
                             generator=g)
    x = torch.zeros(n, 20, dtype=torch.float64)
    x[torch.arange(n), code] = 1.0
    theta = torch.cat([torch.tensor([-1.0], dtype=torch.float64), torch.randn(20, generator=g, dtype=torch.float64) * 0.5])
    theta[1] = 0.0
    pts = model.simulate(theta, n, g, features=x)
    support = na.curvature_support(tf, model)
    bounds = na.public_bounds(model, feature_norm=1.0, target_bound=1.0)
    widths = []
    for on in (False, True):
        res = na.fit(model, _release_fn(pts, model, np.random.default_rng(6)), bounds,
                     schedule=dataclasses.replace(sched, support=on), sigma=20.0,
                     generator=torch.Generator().manual_seed(6), support=support)
        assert bool(torch.isfinite(res.posterior.cov).all())
        widths.append(float(torch.diagonal(res.posterior.cov).sqrt().median()))
    assert widths[1] / widths[0] < 0.8
