"""The experimental private mixture summary (dpsummary/private/mixture.py): sensitivity,
accounting, and the algorithm without noise."""

from __future__ import annotations

import numpy as np
import pytest

from dpsummary.accounting import epsilon
from dpsummary.mixtures import (
    MixturePrior,
    component_errors,
    posterior_from_statistics,
    weighted_statistics,
)
from dpsummary.mixtures.dp_summary import calibrate, privacy_event, private_mixture, pseudo_points
from dpsummary.mixtures.vi import responsibilities
from dpsummary.private.mixture import STATISTICS_SENSITIVITY, noisy_statistics, project_to_ball


class Recording:
    """Privacy randomness that adds no noise and records what the mechanism would noise."""

    def __init__(self) -> None:
        self.released: list[np.ndarray] = []

    def coins(self, num_records: int, sample_rate: float) -> np.ndarray:
        return np.ones(num_records, dtype=bool)

    def sample_indices(self, num_records: int, sample_rate: float) -> np.ndarray:
        return np.arange(num_records, dtype=np.int64)

    def gaussian(self, values: np.ndarray, *, noise_std: float, clip_norm: float) -> np.ndarray:
        assert clip_norm == STATISTICS_SENSITIVITY
        self.released.append(np.array(values))
        return np.asarray(values, dtype=np.float64)


def _standardised(blobs: np.ndarray) -> np.ndarray:
    return (blobs - blobs.mean(0)) / blobs.std(0)


def _prior(k: int) -> MixturePrior:
    return MixturePrior("dirichlet_process", k, 1.0 / k, 1.0, np.zeros(2), 2.0, 0.01 * np.eye(2))


def test_statistics_are_exact_before_noise_and_neighbours_differ_by_at_most_the_sensitivity(
    blobs: np.ndarray,
) -> None:
    """Without noise the mechanism returns the weighted statistics of the ball-projected records
    (up to the fixed-point grid); removing any one record moves the noised vector by at most
    sqrt(3) in L2 (checked for the 20 records with the largest norms, where the bound is tightest)."""
    x = project_to_ball(_standardised(blobs), 2.0)
    prior = _prior(4)
    rng = np.random.default_rng(0)
    resp = np.eye(4)[rng.integers(0, 4, x.shape[0])]
    post = posterior_from_statistics(prior, weighted_statistics(x, np.ones(x.shape[0]), resp))
    rec = Recording()
    stats = noisy_statistics(x, post, radius=2.0, noise_multiplier=1.0, randomness=rec)
    exact = weighted_statistics(x, np.ones(x.shape[0]), responsibilities(post, x)[0])
    np.testing.assert_allclose(stats.counts, exact.counts, atol=1e-6)
    np.testing.assert_allclose(stats.sums, exact.sums, atol=1e-6)
    np.testing.assert_allclose(stats.outer, exact.outer, atol=1e-6)
    full = rec.released[0]
    for i in np.argsort(-np.linalg.norm(x, axis=1))[:20]:
        noisy_statistics(np.delete(x, i, axis=0), post, radius=2.0, noise_multiplier=1.0, randomness=rec)
        assert np.linalg.norm(full - rec.released[-1]) <= STATISTICS_SENSITIVITY


def test_calibrated_rounds_meet_the_budget() -> None:
    sigma = calibrate(2.0, 1e-6, 10)
    assert epsilon([privacy_event(sigma, 10)], 1e-6) <= 2.0
    assert epsilon([privacy_event(0.95 * sigma, 10)], 1e-6) > 2.0  # calibration is tight


def test_noise_free_dp_em_recovers_the_blobs_and_pseudopoints_match_moments(blobs: np.ndarray) -> None:
    """The algorithm itself (privacy randomness replaced by no noise; epsilon = 50 only sets the
    public count threshold, 3 noise sd, to about one record): DP-EM with 30 rounds from a public
    random start finds all three blobs, and the pseudopoints reproduce each released
    component's count, mean and covariance."""
    x = _standardised(blobs)
    prior = _prior(6)
    summary = private_mixture(x, prior, epsilon=50.0, delta=1e-5, radius=4.0, rounds=30,
                              init_rng=np.random.default_rng(1), randomness=Recording())
    post = summary.posterior
    truth_means = (np.array([[0.0, 0.0], [6.0, 0.0], [0.0, 7.0]]) - blobs.mean(0)) / blobs.std(0)
    truth_covs = np.array([np.diag(np.square(s)) for s in ([1.0, 1.0], [0.5, 0.5], [1.0, 0.3])]) / np.outer(
        blobs.std(0), blobs.std(0))
    err = component_errors(np.array([300, 200, 40]) / 540, truth_means, truth_covs, post.expected_weights(),
                           post.means, post.covariances())
    assert err.recovered.all(), err
    pts, wts = pseudo_points(post, prior, per_component=16, min_weight=0.05, rng=np.random.default_rng(2))
    keep = np.flatnonzero(post.expected_weights() >= 0.05)
    for j, k in enumerate(keep):
        block, w = pts[16 * j:16 * (j + 1)], wts[16 * j:16 * (j + 1)]
        assert w.sum() == pytest.approx(post.degrees_of_freedom[k] - prior.degrees_of_freedom)
        np.testing.assert_allclose(block.mean(0), post.means[k], atol=1e-12)
        np.testing.assert_allclose(np.cov(block.T, bias=True), post.covariances()[k], atol=1e-12)
