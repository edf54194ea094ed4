"""Agreement with scikit-learn's BayesianGaussianMixture on full, unweighted data."""

from __future__ import annotations

import numpy as np
import pytest

from dpsummary.mixtures import (
    PROCESSES,
    MixturePrior,
    expected_log_density,
    fit_cavi,
    log_predictive_density,
)
from dpsummary.mixtures.reference import (
    posterior_from_sklearn,
    sklearn_estimator,
    sklearn_initial_responsibilities,
)


@pytest.mark.parametrize("process", PROCESSES)
def test_components_and_heldout_density_agree_with_sklearn(blobs: np.ndarray, process: str) -> None:
    """Same prior (mapping in docs/MIXTURES.md), same k-means start: the fitted weights, means
    and covariances agree to 1e-6, sklearn's ``score_samples`` equals our E-step normaliser on
    held-out points, and the Student-t log predictive density of both fits agrees to 1e-6."""
    heldout = np.random.default_rng(11).normal([2.0, 2.0], 3.0, (200, 2))
    k, seed = 4, 3
    prior = MixturePrior.default(process, k, blobs)  # type: ignore[arg-type]
    resp = sklearn_initial_responsibilities(blobs, k, seed)
    ours = fit_cavi(blobs, None, prior, np.random.default_rng(0), resp=resp, max_iter=2000, tol=1e-14).posterior
    sk = sklearn_estimator(prior, seed=seed, max_iter=2000, tol=1e-12).fit(blobs)
    assert sk.converged_
    np.testing.assert_allclose(ours.expected_weights(), sk.weights_, atol=1e-6)
    np.testing.assert_allclose(ours.means, sk.means_, atol=1e-6)
    np.testing.assert_allclose(ours.covariances(), sk.covariances_, atol=1e-6)
    np.testing.assert_allclose(expected_log_density(ours, heldout), sk.score_samples(heldout), atol=1e-6)
    theirs = posterior_from_sklearn(sk)
    np.testing.assert_allclose(log_predictive_density(ours, heldout), log_predictive_density(theirs, heldout),
                               atol=1e-6)
    # Sanity of the comparison itself: a different prior gives a measurably different fit.
    other = MixturePrior.default(process, k, blobs, weight_concentration=50.0)  # type: ignore[arg-type]
    moved = fit_cavi(blobs, None, other, np.random.default_rng(0), resp=resp, max_iter=2000, tol=1e-14).posterior
    assert np.abs(moved.expected_weights() - sk.weights_).max() > 1e-3
