"""A private mixture summary: DP variational EM on noisy sufficient statistics, released as a
weighted pseudo-data summary (issue 17, beyond the poster). EXPERIMENTAL: not wired into
``dpsummary release``; ``benchmarks/results/mixtures_private.md`` measures it.

Why not a coreset: the lightweight coreset (poster, Algorithm 1) is made of private records and
cannot be released. What is released here is a post-processing of Gaussian mechanisms only.

Mechanism (DP-EM, Park, Foulds, Chaudhuri & Welling 2017, with the variational M-step of
:mod:`dpsummary.mixtures.vi`). Records are points in a *public* standardised space, each scaled
into the L2 ball of public radius ``B`` (a per-record map). For ``T`` rounds, given the current
(public) variational factors:

1. every record computes its responsibilities r_n (K,) and the vector
   ``v_n = concat_k r_nk (1, x_n / B, triu(x_n x_n^T) / B^2)``; since ``sum_k r_nk^2 <= 1``
   and ``||x_n|| <= B``, ``||v_n||_2 <= sqrt(3)``; rows are clipped to ``sqrt(3) - slack``
   anyway (:func:`dpsummary.private.mechanism.clip_rows`, the OpenDP rounding slack kept aside)
   so the invariant does not depend on the algebra;
2. the rows are summed exactly on the fixed-point grid
   (:func:`dpsummary.private.mechanism.exact_clipped_sum`) and ONE Gaussian mechanism adds noise
   of standard deviation ``sigma * sqrt(3)`` from the privacy randomness (OpenDP, OS entropy):
   add/remove one record moves the sum by at most ``sqrt(3)`` in L2, so the round is
   ``GaussianDpEvent(sigma)``;
3. the noisy statistics are repaired (counts floored at 0, the implied Wishart scale projected
   onto the positive-definite cone) and the M-step gives the next factors.

The T rounds compose to ``SelfComposedDpEvent(GaussianDpEvent(sigma), T)``;
:func:`calibrate` chooses sigma with :func:`dpsummary.accounting.calibrate_noise_multiplier`.
The summary: for each component with expected weight above ``min_weight``, P pseudopoints
whose weighted count, mean and covariance equal the component's released ones
(:func:`pseudo_points`), so weighted VI on them (any analyst, no further privacy cost) sees the
released mixture as data.
"""

from __future__ import annotations

import math
from dataclasses import dataclass

import dp_accounting as dpa
import numpy as np
import torch

from ..accounting import calibrate_noise_multiplier, gaussian_event
from ..mixtures.vi import (
    MixturePosterior,
    MixturePrior,
    Statistics,
    posterior_from_statistics,
    responsibilities,
)
from . import noise
from .mechanism import PrivacyRandomness, SystemRandomness, clip_rows, exact_clipped_sum

#: L2 bound of one record's statistics vector (see module docstring).
STATISTICS_SENSITIVITY = math.sqrt(3.0)


def calibrate(epsilon: float, delta: float, rounds: int) -> float:
    """The noise multiplier sigma for ``rounds`` Gaussian rounds at (epsilon, delta) (Opacus RDP,
    the accountant of record)."""
    return calibrate_noise_multiplier(target_epsilon=epsilon, delta=delta, sample_rate=1.0, steps=rounds)


def privacy_event(noise_multiplier: float, rounds: int) -> dpa.DpEvent:
    """The ``DpEvent`` of one run (for the ledger and :func:`dpsummary.accounting.epsilon`)."""
    return gaussian_event(noise_multiplier, rounds)


def project_to_ball(x: np.ndarray, radius: float) -> np.ndarray:
    """Scale every row with norm above ``radius`` onto the sphere (a per-record map)."""
    norms = np.linalg.norm(x, axis=1, keepdims=True)
    return np.asarray(x * np.minimum(1.0, radius / np.maximum(norms, 1e-300)))


def _layout(d: int) -> tuple[int, np.ndarray, np.ndarray]:
    """Length of one component's block (count, sum, upper triangle of the outer product)."""
    iu = np.triu_indices(d)
    return 1 + d + iu[0].shape[0], iu[0], iu[1]


def noisy_statistics(
    records: np.ndarray,
    posterior: MixturePosterior,
    *,
    radius: float,
    noise_multiplier: float,
    randomness: PrivacyRandomness,
) -> Statistics:
    """One DP-EM round (module docstring, steps 1-2): the Gaussian-noised weighted statistics of
    ``records`` (already projected into the public ball of ``radius``) under ``posterior``.
    Costs ``GaussianDpEvent(noise_multiplier)``."""
    n, d = records.shape
    k = posterior.n_components
    block, iu, ju = _layout(d)
    resp, _ = responsibilities(posterior, records)
    x = records / radius
    per_record = np.concatenate([np.ones((n, 1)), x, x[:, iu] * x[:, ju]], axis=1)  # (n, block)
    rows = (resp[:, :, None] * per_record[:, None, :]).reshape(n, k * block)
    slack = noise.rounding_slack(STATISTICS_SENSITIVITY, k * block)
    clipped = clip_rows(torch.from_numpy(rows), STATISTICS_SENSITIVITY - slack).numpy()
    total = exact_clipped_sum(clipped, STATISTICS_SENSITIVITY)
    noisy = randomness.gaussian(total, noise_std=noise_multiplier * STATISTICS_SENSITIVITY,
                                clip_norm=STATISTICS_SENSITIVITY)
    parts = np.asarray(noisy, dtype=np.float64).reshape(k, block)
    counts = parts[:, 0]
    sums = parts[:, 1:1 + d] * radius
    outer = np.zeros((k, d, d))
    outer[:, iu, ju] = parts[:, 1 + d:] * radius**2
    outer[:, ju, iu] = parts[:, 1 + d:] * radius**2
    return Statistics(counts, sums, outer)


def repair(
    prior: MixturePrior,
    stats: Statistics,
    *,
    min_count: float = 0.0,
    max_variance: float = math.inf,
    floor: float = 1e-3,
) -> Statistics:
    """Post-processing of noisy statistics (public thresholds only).

    Components whose noisy count is below ``min_count`` (callers pass a multiple of the count's
    noise sd: such a count is indistinguishable from noise) get all-zero statistics, i.e. the
    prior. For the others the implied W_k^-1 is projected so that its eigenvalues lie in
    ``[floor * lambda_min(W0^-1), nu_k * max_variance]`` (the data lie in a public ball, so no
    component variance can exceed its squared radius), which makes it positive definite."""
    keep = stats.counts >= max(min_count, 0.0)
    counts = np.where(keep, np.maximum(stats.counts, 0.0), 0.0)
    sums = np.where(keep[:, None], stats.sums, 0.0)
    beta = prior.mean_precision + counts
    means = (prior.mean_precision * prior.mean + sums) / beta[:, None]
    base = prior.covariance + prior.mean_precision * np.outer(prior.mean, prior.mean) \
        - beta[:, None, None] * np.einsum("ki,kj->kij", means, means)
    outer = np.where(keep[:, None, None], 0.5 * (stats.outer + np.swapaxes(stats.outer, 1, 2)), 0.0)
    scale_inv = base + outer
    lo = floor * float(np.linalg.eigvalsh(prior.covariance).min())
    hi = (prior.degrees_of_freedom + counts) * max_variance
    vals, vecs = np.linalg.eigh(scale_inv)
    clipped = np.minimum(np.maximum(vals, lo), np.maximum(hi, lo)[:, None])
    fixed = np.einsum("kij,kj,klj->kil", vecs, clipped, vecs)
    return Statistics(counts, sums, fixed - base)


@dataclass(frozen=True)
class PrivateMixtureSummary:
    """What the mechanism releases: the final (public) factors, the pseudo-data summary and the
    privacy cost. Everything here is a post-processing of the noisy statistics."""

    posterior: MixturePosterior
    points: np.ndarray
    weights: np.ndarray
    noise_multiplier: float
    rounds: int
    event: dpa.DpEvent


def pseudo_points(
    posterior: MixturePosterior,
    prior: MixturePrior,
    *,
    per_component: int,
    min_weight: float,
    rng: np.random.Generator,
) -> tuple[np.ndarray, np.ndarray]:
    """``per_component`` (>= D + 1) pseudopoints per component with expected weight at least
    ``min_weight``: a public standard-normal draw, re-centred and whitened so that its empirical
    mean is exactly 0 and covariance exactly I, then mapped to ``m_k + L_k z`` with
    ``L_k L_k^T = W_k^-1 / nu_k``. Weights ``N_k / per_component`` with ``N_k = nu_k - nu0``, so
    each component's weighted count, mean and covariance are reproduced exactly (up to the
    M-step's shrinkage towards the prior, negligible when N_k >> beta0, nu0)."""
    d = posterior.dim
    if per_component < d + 1:
        raise ValueError("per_component must be at least D + 1")
    weights = posterior.expected_weights()
    counts = np.maximum(posterior.degrees_of_freedom - prior.degrees_of_freedom, 0.0)
    covs = posterior.covariances()
    pts, wts = [], []
    for k in np.flatnonzero(weights >= min_weight):
        z = rng.normal(size=(per_component, d))
        z -= z.mean(0)
        z = z @ np.linalg.inv(np.linalg.cholesky(z.T @ z / per_component)).T
        pts.append(posterior.means[k] + z @ np.linalg.cholesky(covs[k]).T)
        wts.append(np.full(per_component, counts[k] / per_component))
    return np.concatenate(pts), np.concatenate(wts)


def private_mixture(
    records: np.ndarray,
    prior: MixturePrior,
    *,
    epsilon: float,
    delta: float,
    radius: float,
    rounds: int = 10,
    min_weight: float = 0.005,
    per_component: int = 64,
    init_rng: np.random.Generator,
    randomness: PrivacyRandomness | None = None,
) -> PrivateMixtureSummary:
    """Run DP-EM for ``rounds`` rounds at total (epsilon, delta) and release the summary.

    ``records`` are in the public standardised space (they are projected into the ball of public
    ``radius`` here); ``prior`` must be public (e.g. built from public bounds, never from the
    records). ``init_rng`` drives only public randomness: the initial component centres, drawn
    uniformly in the ball, each with a unit pseudo-count, and the pseudopoints' base draw. Privacy randomness comes from
    ``randomness`` (default: OS entropy).
    """
    rand = randomness if randomness is not None else SystemRandomness()
    sigma = calibrate(epsilon, delta, rounds)
    x = project_to_ball(np.asarray(records, dtype=np.float64), radius)
    k, d = prior.n_components, prior.dim
    direction = init_rng.normal(size=(k, d))
    radii = radius * init_rng.uniform(size=(k, 1)) ** (1 / d)
    centres = direction / np.linalg.norm(direction, axis=1, keepdims=True) * radii
    spread = (radius / 3.0) ** 2
    init = Statistics(np.ones(k), centres, np.einsum("ki,kj->kij", centres, centres) + spread * np.eye(d)[None])
    post = posterior_from_statistics(prior, init)
    for _ in range(rounds):
        stats = noisy_statistics(x, post, radius=radius, noise_multiplier=sigma, randomness=rand)
        # A count below 3 noise sd is noise; no variance exceeds radius^2 (public bounds).
        min_count = 3.0 * sigma * STATISTICS_SENSITIVITY
        post = posterior_from_statistics(prior, repair(prior, stats, min_count=min_count, max_variance=radius**2))
    points, weights = pseudo_points(post, prior, per_component=per_component, min_weight=min_weight,
                                    rng=init_rng)
    return PrivateMixtureSummary(post, points, weights, sigma, rounds, privacy_event(sigma, rounds))
