"""Lightweight (poster Algorithm 1) and uniform coresets for mixtures."""

from __future__ import annotations

import numpy as np
import pytest
from scipy.stats import multivariate_normal

from dpsummary.mixtures import (
    importance_sample,
    lightweight_coreset,
    lightweight_probabilities,
    uniform_coreset,
)


def _mixture_log_likelihood(x: np.ndarray) -> np.ndarray:
    """Per-point log-likelihood under a fixed two-component mixture theta (not fitted)."""
    a = multivariate_normal([0.0, 0.0], np.eye(2)).logpdf(x)
    b = multivariate_normal([5.0, 1.0], [[0.5, 0.1], [0.1, 0.3]]).logpdf(x)
    return np.logaddexp(np.log(0.7) + a, np.log(0.3) + b)


def test_proposal_is_algorithm_1(blobs: np.ndarray) -> None:
    q = lightweight_probabilities(blobs)
    sq = ((blobs - blobs.mean(0)) ** 2).sum(1)
    np.testing.assert_allclose(q, 0.5 / blobs.shape[0] + 0.5 * sq / sq.sum(), rtol=1e-12)
    assert q.sum() == pytest.approx(1.0)


def test_lightweight_weighted_log_likelihood_is_unbiased(blobs: np.ndarray) -> None:
    """sum_m w_m ln p(x_m | theta) is unbiased for sum_n ln p(x_n | theta).

    400 coresets of M = 30 (seed 0): the z-score of the mean estimate against the exact full-data
    value must be below 4. Failure rate if the sampler is correct: P(|Z| > 4) ~ 6e-5 under the
    CLT (the estimate is a mean of 400 i.i.d. draws). Negative control: the same draws with the
    uniform weights N/M (a biased estimator) are rejected by the same check (|z| > 4).
    """
    f = _mixture_log_likelihood(blobs)
    exact = f.sum()
    rng = np.random.default_rng(0)
    good, biased = [], []
    for _ in range(400):
        core = lightweight_coreset(blobs, 30, rng)
        good.append(core.weights @ f[core.indices])
        counts = np.round(core.weights * 30 * lightweight_probabilities(blobs)[core.indices])
        biased.append((blobs.shape[0] / 30) * (counts @ f[core.indices]))
    z_good = (np.mean(good) - exact) / (np.std(good, ddof=1) / np.sqrt(len(good)))
    z_biased = (np.mean(biased) - exact) / (np.std(biased, ddof=1) / np.sqrt(len(biased)))
    assert abs(z_good) < 4.0, z_good
    assert abs(z_biased) > 4.0, z_biased


def test_importance_sample_merges_duplicates() -> None:
    """All mass on two rows: M = 10 draws collapse to those two points, weights count / (M q)."""
    q = np.array([0.0, 0.25, 0.0, 0.75])
    idx, w = importance_sample(q, 10, np.random.default_rng(1))
    assert set(idx.tolist()) <= {1, 3} and len(idx) == len(set(idx.tolist()))
    counts = w * 10 * q[idx]
    np.testing.assert_allclose(counts, np.round(counts))
    assert counts.sum() == pytest.approx(10)
    with pytest.raises(ValueError):
        importance_sample(np.array([0.5, 0.6]), 3, np.random.default_rng(0))


def test_uniform_coreset_weights_and_cap(blobs: np.ndarray) -> None:
    core = uniform_coreset(blobs, 54, np.random.default_rng(2))
    assert core.points.shape == (54, 2) and len(set(core.indices.tolist())) == 54
    np.testing.assert_allclose(core.weights, blobs.shape[0] / 54)
    full = uniform_coreset(blobs, 10_000, np.random.default_rng(2))
    assert full.points.shape[0] == blobs.shape[0] and np.all(full.weights == 1.0)
