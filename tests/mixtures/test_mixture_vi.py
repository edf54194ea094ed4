"""Weighted CAVI/SVI for BGMM and DPGMM: weights, monotone ELBO, exact ELBO constants."""

from __future__ import annotations

import math

import numpy as np
import pytest
import torch
from scipy.special import betaln, multigammaln

from dpsummary.mixtures import (
    PROCESSES,
    MixturePrior,
    build_coreset,
    cavi_init,
    cavi_step,
    fit_cavi,
    fit_svi,
    full_elbo,
    kmeans_responsibilities,
    match_components,
    svi_init,
    svi_step,
)


@pytest.mark.parametrize("process", PROCESSES)
def test_integer_weights_equal_repeated_rows(blobs: np.ndarray, process: str) -> None:
    """Weighted CAVI with integer weights w_n is CAVI on the data with row n repeated w_n times,
    sweep by sweep (same initial responsibilities, repeated alongside the rows)."""
    rng = np.random.default_rng(1)
    weights = rng.integers(1, 5, blobs.shape[0]).astype(float)
    repeats = weights.astype(int)
    repeated = np.repeat(blobs, repeats, axis=0)
    prior = MixturePrior.default(process, 5, blobs, weights)  # type: ignore[arg-type]
    resp = kmeans_responsibilities(blobs, weights, 5, np.random.default_rng(2))
    weighted = cavi_init(blobs, weights, prior, rng, resp=resp)
    plain = cavi_init(repeated, None, prior, rng, resp=np.repeat(resp, repeats, axis=0))
    for _ in range(15):
        weighted = cavi_step(weighted, blobs, weights, prior)
        plain = cavi_step(plain, repeated, None, prior)
        assert weighted.elbo == pytest.approx(plain.elbo, rel=1e-10)
    for name in ("weight_concentration", "mean_precision", "means", "degrees_of_freedom", "scale_inv"):
        np.testing.assert_allclose(getattr(weighted.posterior, name), getattr(plain.posterior, name),
                                   rtol=1e-9, atol=1e-9)


@pytest.mark.parametrize("process", PROCESSES)
def test_unit_weights_are_the_unweighted_fit(blobs: np.ndarray, process: str) -> None:
    """All weights 1 gives exactly the fit without weights (same seed), and weights 2 do not."""
    prior = MixturePrior.default(process, 4, blobs)  # type: ignore[arg-type]
    unweighted = fit_cavi(blobs, None, prior, np.random.default_rng(5), max_iter=50)
    ones = fit_cavi(blobs, np.ones(blobs.shape[0]), prior, np.random.default_rng(5), max_iter=50)
    twos = fit_cavi(blobs, np.full(blobs.shape[0], 2.0), prior, np.random.default_rng(5), max_iter=50)
    np.testing.assert_array_equal(unweighted.elbo_trace, ones.elbo_trace)
    np.testing.assert_array_equal(unweighted.posterior.means, ones.posterior.means)
    assert not np.allclose(twos.posterior.degrees_of_freedom, ones.posterior.degrees_of_freedom)


@pytest.mark.parametrize("process", PROCESSES)
@pytest.mark.parametrize("weighting", ["none", "coreset"])
def test_elbo_increases_monotonically(blobs: np.ndarray, process: str, weighting: str) -> None:
    """Coordinate ascent never lowers the ELBO (up to float rounding, 1e-10 relative), with and
    without (non-integer) lightweight-coreset weights, and it does climb from the start."""
    x, w = blobs, None
    if weighting == "coreset":
        core = build_coreset("lightweight", blobs, 150, torch.Generator().manual_seed(3))
        x, w = core.points, core.weights
    prior = MixturePrior.default(process, 6, x, w)  # type: ignore[arg-type]
    fit = fit_cavi(x, w, prior, np.random.default_rng(4), max_iter=300, tol=1e-12)
    steps = np.diff(fit.elbo_trace)
    assert steps.min() >= -1e-10 * abs(fit.elbo), steps.min()
    assert fit.elbo_trace[-1] > fit.elbo_trace[0]
    assert fit.converged


def _log_evidence_one_component(x: np.ndarray, w: np.ndarray, prior: MixturePrior) -> float:
    """Exact ln of  int prior(theta) prod_n N(x_n | mu, Lambda^-1)^{w_n} dtheta  for one
    Normal-Wishart component (Murphy 2007, "Conjugate Bayesian analysis of the Gaussian
    distribution", eq. 266, with N = sum_n w_n and weighted statistics), plus the weight term:
    0 for a one-component Dirichlet, ln B(1 + N, gamma) - ln B(1, gamma) for one stick."""
    n, d = w.sum(), x.shape[1]
    b0, m0, nu0, t0 = prior.mean_precision, prior.mean, prior.degrees_of_freedom, prior.covariance
    xbar = w @ x / n
    s = ((x - xbar) * w[:, None]).T @ (x - xbar)
    bn, nun = b0 + n, nu0 + n
    tn = t0 + s + b0 * n / bn * np.outer(xbar - m0, xbar - m0)
    log_ml = (-0.5 * n * d * math.log(math.pi) + multigammaln(nun / 2, d) - multigammaln(nu0 / 2, d)
              + 0.5 * nu0 * np.linalg.slogdet(t0)[1] - 0.5 * nun * np.linalg.slogdet(tn)[1]
              + 0.5 * d * math.log(b0 / bn))
    if prior.process == "dirichlet_process":
        g = prior.weight_concentration
        log_ml += betaln(1 + n, g) - betaln(1, g)
    return float(log_ml)


@pytest.mark.parametrize("process", PROCESSES)
def test_elbo_equals_log_evidence_for_one_component(blobs: np.ndarray, process: str) -> None:
    """With K = 1 the mean-field family contains the exact (conjugate) posterior, so the ELBO
    after one sweep must equal the closed-form log evidence: this pins every constant of the
    ELBO, with non-integer weights."""
    w = np.random.default_rng(6).uniform(0.2, 3.0, blobs.shape[0])
    prior = MixturePrior.default(process, 1, blobs, w, weight_concentration=0.7)  # type: ignore[arg-type]
    state = cavi_step(cavi_init(blobs, w, prior, np.random.default_rng(0)), blobs, w, prior)
    assert state.elbo == pytest.approx(_log_evidence_one_component(blobs, w, prior), rel=1e-10)
    assert full_elbo(prior, state.posterior, blobs, w) == pytest.approx(state.elbo, rel=1e-12)


@pytest.mark.parametrize("process", PROCESSES)
def test_full_batch_unit_step_svi_is_cavi(blobs: np.ndarray, process: str) -> None:
    """With the whole (weighted) data as batch and step size 1, an SVI step is a CAVI sweep."""
    core = build_coreset("lightweight", blobs, 150, torch.Generator().manual_seed(9))
    x, w = core.points, core.weights
    prior = MixturePrior.default(process, 4, x, w)  # type: ignore[arg-type]
    resp = kmeans_responsibilities(x, w, 4, np.random.default_rng(1))
    svi = svi_init(x, w, prior, np.random.default_rng(0), resp=resp)
    cavi = cavi_init(x, w, prior, np.random.default_rng(0), resp=resp)
    for _ in range(5):
        svi = svi_step(svi, x, w, prior, np.random.default_rng(0), batch_size=x.shape[0], delay=0.0, forgetting=0.0)
        cavi = cavi_step(cavi, x, w, prior)
    np.testing.assert_allclose(svi.posterior.means, cavi.posterior.means, rtol=1e-10, atol=1e-12)
    np.testing.assert_allclose(svi.posterior.scale_inv, cavi.posterior.scale_inv, rtol=1e-10, atol=1e-12)


@pytest.mark.parametrize("process", PROCESSES)
def test_weighted_svi_reaches_the_cavi_optimum(blobs: np.ndarray, process: str) -> None:
    """Weighted SVI (mini-batches of 64) on a lightweight coreset, K = 3, ends within 0.1% of
    CAVI's ELBO on the same coreset with every component mean within 0.15 of CAVI's.
    (With K above the true count both methods reach different local optima; not tested.)"""
    core = build_coreset("lightweight", blobs, 200, torch.Generator().manual_seed(7))
    prior = MixturePrior.default(process, 3, core.points, core.weights)  # type: ignore[arg-type]
    cavi = fit_cavi(core.points, core.weights, prior, np.random.default_rng(8))
    svi = fit_svi(core.points, core.weights, prior, np.random.default_rng(8), steps=600, batch_size=64)
    assert svi.elbo == pytest.approx(cavi.elbo, rel=1e-3)
    match = match_components(cavi.posterior.means, svi.posterior.means)
    assert np.abs(svi.posterior.means[match] - cavi.posterior.means).max() < 0.15


def test_bad_inputs_are_rejected(blobs: np.ndarray) -> None:
    prior = MixturePrior.default("dirichlet_distribution", 3, blobs)
    with pytest.raises(ValueError, match="weights"):
        cavi_init(blobs, -np.ones(blobs.shape[0]), prior, np.random.default_rng(0))
    with pytest.raises(ValueError, match="finite"):
        cavi_init(np.full((4, 2), np.nan), None, prior, np.random.default_rng(0))
    with pytest.raises(ValueError, match="degrees_of_freedom"):
        MixturePrior("dirichlet_process", 2, 1.0, 1.0, np.zeros(2), 0.5, np.eye(2))
