"""The private mixture summaries' runs around their mechanisms, and their post-processing.

* :func:`release_mixture_summary`: the stage function of ``dpsummary release --model
  gmm|dpgmm`` (``dp-kd-tree``): the noisy tree (:func:`dpsummary.private.mixture.noisy_tree`),
  optionally the leaf moments (:func:`dpsummary.private.mixture.leaf_moments`), then
  pseudo-points (post-processing); :func:`fit_release` fits weighted CAVI on them.
* :func:`private_mixture`: the DP-EM baseline's driver (public start, ``rounds`` releases of
  :func:`dpsummary.private.mixture.noisy_statistics`, :func:`repair` and the M-step, then
  :func:`pseudo_points`).

Nothing here reads a record or draws privacy noise except through those mechanisms; design and
privacy argument in :mod:`dpsummary.private.mixture`.
"""

from __future__ import annotations

import math
from dataclasses import dataclass

import dp_accounting as dpa
import numpy as np

from ..accounting import calibrate_noise_multiplier, gaussian_event
from ..private.mechanism import PrivacyRandomness, PrivateRecords, SystemRandomness
from ..private.mixture import (
    STATISTICS_SENSITIVITY,
    leaf_moments,
    noisy_statistics,
    noisy_tree,
    project_to_ball,
)
from .kdtree import TreePlan, tree_pseudo_points
from .vi import MixturePosterior, MixturePrior, Statistics, posterior_from_statistics


def calibrate(epsilon: float, delta: float, rounds: int) -> float:
    """The noise multiplier sigma for ``rounds`` Gaussian rounds at (epsilon, delta) (Opacus RDP,
    the accountant of record)."""
    return calibrate_noise_multiplier(target_epsilon=epsilon, delta=delta, sample_rate=1.0, steps=rounds)


def privacy_event(noise_multiplier: float, rounds: int) -> dpa.DpEvent:
    """The ``DpEvent`` of one run (for the ledger and :func:`dpsummary.accounting.epsilon`)."""
    return gaussian_event(noise_multiplier, rounds)


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


@dataclass(frozen=True)
class MixtureRelease:
    """What :func:`release_mixture_summary` returns: the weighted pseudo-points (the releasable
    summary, in the public standardised space), and public notes (the plan, the accountant
    event, leaf and node numbers; all functions of noisy counts or public values)."""

    points: np.ndarray
    weights: np.ndarray
    event: dpa.DpEvent
    notes: dict[str, object]


def release_mixture_summary(records: PrivateRecords, *, plan: TreePlan) -> MixtureRelease:
    """THE stage function of ``dpsummary release --model gmm|dpgmm`` (:mod:`dpsummary.release`).

    Contract: ``records`` hold the private rows already mapped to the PUBLIC standardised space
    (a public affine map per column, from the policy's bounds or schema; never from the data),
    shape (n, plan.dim); ``plan`` comes from :func:`plan_tree` with the release's (epsilon, delta)
    share, and its :meth:`TreePlan.event` has been charged to the ledger before this call. The
    output ``points``/``weights`` are safe to publish (post-processing of the Gaussian
    mechanisms); weighted CAVI on them (:func:`fit_release`) costs no further privacy."""
    tree = noisy_tree(records, plan)
    points, weights = tree_pseudo_points(tree)
    if plan.leaf_moments and tree.leaf_counts.shape[0]:
        means, variances = leaf_moments(records, tree)
        m, d = means.shape
        offsets = np.sqrt(d * variances)  # 2D points at mean +- sqrt(D var_j) e_j: the leaf's mean and variances
        eye = np.eye(d)
        points = np.concatenate([means[:, None, :] + offsets[:, None, :] * eye[None],
                                 means[:, None, :] - offsets[:, None, :] * eye[None]], axis=1).reshape(m * 2 * d, d)
    notes: dict[str, object] = {**plan.to_dict(), "leaves": int(tree.leaf_counts.shape[0]),
                                "released_per_depth": list(tree.released_per_depth)}
    return MixtureRelease(points, weights, plan.event(), notes)


def fit_release(release: MixtureRelease, prior: MixturePrior, rng: np.random.Generator, *,
                max_iter: int = 500, tol: float = 1e-7) -> MixturePosterior:
    """Weighted CAVI on the released pseudo-points (post-processing; ``prior`` and ``rng`` must be
    public). Raises ``ValueError`` if nothing was released (all leaves below the keep threshold)."""
    from ..mixtures.vi import fit_cavi

    if release.weights.shape[0] == 0:
        raise ValueError("the release holds no pseudo-point (every leaf was below the keep threshold)")
    return fit_cavi(release.points, release.weights, prior, rng, max_iter=max_iter, tol=tol).posterior
