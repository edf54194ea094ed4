"""Lightweight (poster Algorithm 1) and uniform coresets for mixtures, built by the shared GLM
constructors through ``constructors.fit`` on the mixture model (issue 17)."""

from __future__ import annotations

import numpy as np
import pytest
import torch
from scipy.stats import multivariate_normal

from dpsummary.constructors import REGISTRY, Lightweight, Summary, applies, fit
from dpsummary.constructors.lightweight import importance_sample
from dpsummary.mixtures import CORESET_METHODS, build_coreset, lightweight_probabilities
from dpsummary.models import DTYPE
from dpsummary.models.gmm import GaussianMixture


def _mixture_log_likelihood(x: np.ndarray) -> np.ndarray:
    """Per-point log-likelihood under a fixed two-component mixture theta (not fitted)."""
    a = multivariate_normal([0.0, 0.0], np.eye(2)).logpdf(x)
    b = multivariate_normal([5.0, 1.0], [[0.5, 0.1], [0.1, 0.3]]).logpdf(x)
    return np.logaddexp(np.log(0.7) + a, np.log(0.3) + b)


def _theta_for_reference(model: GaussianMixture) -> torch.Tensor:
    """The flat theta of the mixture in :func:`_mixture_log_likelihood` (K = 2, D = 2)."""
    logits = torch.log(torch.tensor([0.7, 0.3], dtype=DTYPE))
    means = torch.tensor([0.0, 0.0, 5.0, 1.0], dtype=DTYPE)
    chols = []
    for cov in (np.eye(2), np.array([[0.5, 0.1], [0.1, 0.3]])):
        chol = np.linalg.cholesky(np.linalg.inv(cov))  # precision = L L^T
        chols.append([np.log(chol[0, 0]), chol[1, 0], np.log(chol[1, 1])])
    return torch.cat([logits, means, torch.tensor(chols, dtype=DTYPE).reshape(-1)])[None]


def test_mixture_model_log_likelihood_is_the_mixture_density(blobs: np.ndarray) -> None:
    model = GaussianMixture(2, n_components=2)
    theta = _theta_for_reference(model)
    assert theta.shape == (1, model.param_dim)
    ll = model.log_likelihood(torch.from_numpy(blobs), theta)[:, 0].numpy()
    np.testing.assert_allclose(ll, _mixture_log_likelihood(blobs), rtol=1e-10, atol=1e-10)


def test_proposal_is_algorithm_1(blobs: np.ndarray) -> None:
    q = lightweight_probabilities(blobs)
    sq = ((blobs - blobs.mean(0)) ** 2).sum(1)
    np.testing.assert_allclose(q, 0.5 / blobs.shape[0] + 0.5 * sq / sq.sum(), rtol=1e-12)
    assert q.sum() == pytest.approx(1.0)


def test_capabilities_select_the_model_free_constructors() -> None:
    """Only model-free constructors apply to the mixture (declared capability, not names); every
    constructor applies to a GLM."""
    gmm = GaussianMixture(2)
    assert set(CORESET_METHODS) == {name for name, f in REGISTRY.items() if getattr(f(), "model_free", False)}
    assert set(CORESET_METHODS) == {"lightweight", "uniform"}
    from dpsummary.models import LogisticRegression

    assert all(applies(f(), LogisticRegression(2)) for f in REGISTRY.values())
    assert not applies(REGISTRY["psvi"](), gmm) and applies(Lightweight(), gmm)
    with pytest.raises(ValueError, match="does not apply"):
        build_coreset("giga", np.zeros((5, 2)), 3, torch.Generator().manual_seed(0))


@pytest.mark.parametrize("method", ["lightweight", "uniform"])
def test_shared_constructors_run_on_the_mixture_model_through_fit(blobs: np.ndarray, method: str) -> None:
    """``constructors.fit`` on the mixture model returns a Summary of records with positive
    weights that sum to about N, and weighted CAVI fits it."""
    from dpsummary.mixtures import MixturePrior, fit_cavi

    model = GaussianMixture(2, n_components=3)
    summary = fit(REGISTRY[method](), torch.from_numpy(blobs), model, 100, generator=torch.Generator().manual_seed(4))
    assert isinstance(summary, Summary) and summary.model == model and summary.method == method
    assert summary.points.shape[1] == 2 and (summary.weights > 0).all()
    match = (summary.points[:, None, :] == torch.from_numpy(blobs)[None]).all(-1)
    assert match.any(1).all()  # every point is a record
    if method == "uniform":
        assert float(summary.weights.sum()) == pytest.approx(blobs.shape[0])
    prior = MixturePrior.default("dirichlet_distribution", 3, blobs)
    post = fit_cavi(summary.points.numpy(), summary.weights.numpy(), prior, np.random.default_rng(0)).posterior
    assert np.isclose(post.expected_weights().sum(), 1.0) and np.all(np.isfinite(post.means))


def test_lightweight_weighted_log_likelihood_is_unbiased(blobs: np.ndarray) -> None:
    """sum_m w_m ln p(x_m | theta) is unbiased for sum_n ln p(x_n | theta), the log-likelihood
    being the mixture MODEL's (``GaussianMixture.log_likelihood``) and the coreset the shared
    ``Lightweight`` constructor run through ``constructors.fit``.

    400 coresets of M = 30 (generator seeds 0..399): the z-score of the mean estimate against the
    exact full-data value must be below 4. Failure rate if the sampler is correct: P(|Z| > 4) ~
    6e-5 under the CLT (a mean of 400 i.i.d. draws). Negative control: the same draws with the
    uniform weights N/M (a biased estimator) are rejected by the same check (|z| > 4).
    """
    model = GaussianMixture(2, n_components=2)
    theta = _theta_for_reference(model)
    data = torch.from_numpy(blobs)
    exact = float(model.log_likelihood(data, theta).sum())
    q = lightweight_probabilities(blobs)
    good, biased = [], []
    for seed in range(400):
        s = fit(Lightweight(), data, model, 30, generator=torch.Generator().manual_seed(seed))
        f = model.log_likelihood(s.points, theta)[:, 0].numpy()
        w = s.weights.numpy()
        good.append(w @ f)
        rows = (s.points[:, None, :] == data[None]).all(-1).to(torch.int64).argmax(1).numpy()
        counts = np.round(w * 30 * q[rows])
        biased.append((blobs.shape[0] / 30) * (counts @ f))
    z_good = (np.mean(good) - exact) / (np.std(good, ddof=1) / np.sqrt(len(good)))
    z_biased = (np.mean(biased) - exact) / (np.std(biased, ddof=1) / np.sqrt(len(biased)))
    assert abs(z_good) < 4.0, z_good
    assert abs(z_biased) > 4.0, z_biased


def test_importance_sample_merges_duplicates() -> None:
    """All mass on two rows: M = 10 draws collapse to those two points, weights count / (M q)."""
    q = torch.tensor([0.0, 0.25, 0.0, 0.75], dtype=DTYPE)
    idx, w = importance_sample(q, 10, torch.Generator().manual_seed(1))
    assert set(idx.tolist()) <= {1, 3} and len(idx) == len(set(idx.tolist()))
    counts = (w * 10 * q[idx]).numpy()
    np.testing.assert_allclose(counts, np.round(counts))
    assert counts.sum() == pytest.approx(10)
    with pytest.raises(ValueError):
        importance_sample(torch.tensor([0.5, 0.6], dtype=DTYPE), 3, torch.Generator().manual_seed(0))


def test_uniform_coreset_weights_and_cap(blobs: np.ndarray) -> None:
    core = build_coreset("uniform", blobs, 54, torch.Generator().manual_seed(2))
    assert core.points.shape == (54, 2) and np.unique(core.points, axis=0).shape[0] == 54
    np.testing.assert_allclose(core.weights, blobs.shape[0] / 54)
    full = build_coreset("uniform", blobs, 10_000, torch.Generator().manual_seed(2))
    assert full.points.shape[0] == blobs.shape[0] and np.all(full.weights == 1.0)
