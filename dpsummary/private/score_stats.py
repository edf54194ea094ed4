"""The noise-aware release's mechanism: noisy sums of per-record scores and curvatures.

At a public anchor ``theta`` (the prior mean, or a previous round's released estimate), every
record contributes its log-likelihood score ``g_i = grad log p(x_i | theta)`` (d-vector) and its
curvature ``H_i = -hess log p(x_i | theta)`` (d x d). Both are clipped record by record to public
bounds (L2 norm ``score_bound``; the L2 norm of the curvature's upper triangle, diagonal included,
``curvature_bound``; for logistic regression the bounds hold for every record of the public feature
box, so clipping never biases), summed over ALL records (no subsampling), and released by two
Gaussian mechanisms:

* score sum + N(0, (score_noise_multiplier * score_bound)^2 I_d): adding or removing one record
  moves the clipped sum by at most ``score_bound`` in L2, so this is
  ``GaussianDpEvent(score_noise_multiplier)``;
* the upper triangle (diagonal included) of the curvature sum + N(0, (curvature_noise_multiplier *
  curvature_bound)^2) per entry, mirrored to a symmetric matrix ("Analyze Gauss", Dwork, Talwar,
  Thakurta and Zhang 2014): one record moves the released upper triangle by its own clipped upper
  triangle, of L2 norm at most ``curvature_bound``: ``GaussianDpEvent(curvature_noise_multiplier)``.
  (Until issue 37 the clip and the bound were the full matrix's Frobenius norm, which counts each
  off-diagonal entry twice: a valid but looser sensitivity, up to sqrt(2) larger for a GLM.)

This is the statistic Kulkarni, Jaelkoe, Koskela, Kaski and Honkela (2021) privatise for GLMs
(a noisy sum of per-record summary statistics) taken at a local quadratic expansion, and one
round of the DP Newton method of Ganesh, Haghifam, Steinke and Thakurta (2023). The caller
(:mod:`dpsummary.noise_aware`) turns the releases into a posterior by post-processing alone.

Exactness: every record's clipped score and clipped curvature upper triangle are rounded toward
zero onto the public fixed-point grid of their bound and summed as integers
(:mod:`dpsummary.private.kernel`, the kernel every engine shares), so neighbouring sums differ by
exactly one rounded record whatever the order or partitioning of the sum; no float summation
margin is needed.

Privacy caveats: ``theta``, the bounds and the noise multipliers must be public (functions of
the policy, the schema and earlier DP outputs). Nothing about the records leaves this module
except the two noisy releases; the record count is never returned. Noise comes from the
caller's :class:`~dpsummary.private.mechanism.PrivacyRandomness` (OS entropy in a release).
"""

from __future__ import annotations

from collections.abc import Iterable
from dataclasses import dataclass
from typing import TYPE_CHECKING, Any

import numpy as np
import torch

from ..models import DTYPE, Model

if TYPE_CHECKING:
    from .randomness import PrivacyRandomness
    from .store import RecordStore

@dataclass(frozen=True)
class NoisyStatistics:
    """One round's DP outputs: the noisy score sum (d,) and the noisy symmetric curvature sum."""

    score: torch.Tensor
    curvature: torch.Tensor
    score_noise_std: float
    curvature_noise_std: float


def upper_triangle(matrix: torch.Tensor) -> torch.Tensor:
    """The upper triangle (diagonal included) of a (d, d) matrix, row-major, as a vector."""
    rows, cols = torch.triu_indices(matrix.shape[0], matrix.shape[1])
    return matrix[rows, cols]


def symmetric_from_upper(values: torch.Tensor, dim: int) -> torch.Tensor:
    """Inverse of :func:`upper_triangle` for symmetric matrices."""
    out = torch.zeros(dim, dim, dtype=DTYPE)
    rows, cols = torch.triu_indices(dim, dim)
    out[rows, cols] = values
    out[cols, rows] = values
    return out


def _check_positive(**values: float) -> None:
    """Every public mechanism parameter must be positive and finite (else a bug: abort)."""
    from .fixed_point import MechanismError

    for name, value in values.items():
        if not (value > 0 and np.isfinite(value)):
            raise MechanismError(f"{name} must be positive and finite")


def noisy_score_statistics(
    points: torch.Tensor | np.ndarray | RecordStore,
    randomness: PrivacyRandomness,
    model: Model,
    theta: torch.Tensor,
    *,
    score_bound: float,
    curvature_bound: float,
    score_noise_multiplier: float,
    curvature_noise_multiplier: float,
) -> NoisyStatistics:
    """Release the clipped score and curvature sums at ``theta`` (see module docstring).

    ``points``: the records (a store read in one full pass, or an in-memory array). The
    per-record rules and the exact sums are :func:`dpsummary.private.kernel.score_partial`.
    Two Gaussian mechanisms: ``GaussianDpEvent(score_noise_multiplier)`` and
    ``GaussianDpEvent(curvature_noise_multiplier)``; add/remove-one-record adjacency."""
    from . import kernel
    from .store import RecordStore

    _check_positive(score_bound=score_bound, curvature_bound=curvature_bound,
                    score_noise_multiplier=score_noise_multiplier,
                    curvature_noise_multiplier=curvature_noise_multiplier)
    d = model.param_dim
    theta = theta.detach().to(DTYPE)
    if isinstance(points, RecordStore):
        chunks: Iterable[np.ndarray] = points.chunks()
    else:
        arr = points.detach().to(DTYPE).numpy() if isinstance(points, torch.Tensor) else np.asarray(points)
        chunks = [np.ascontiguousarray(arr, dtype=np.float64)]
    total = kernel.ScorePartial.zero(d)
    for chunk in chunks:
        total = total + kernel.score_partial(chunk, model, theta, score_bound=score_bound,
                                             curvature_bound=curvature_bound)
    return release_statistics(total, randomness, d, score_bound=score_bound, curvature_bound=curvature_bound,
                              score_noise_multiplier=score_noise_multiplier,
                              curvature_noise_multiplier=curvature_noise_multiplier)


def release_statistics(
    total: Any,
    randomness: PrivacyRandomness,
    dim: int,
    *,
    score_bound: float,
    curvature_bound: float,
    score_noise_multiplier: float,
    curvature_noise_multiplier: float,
) -> NoisyStatistics:
    """The two Gaussian releases from a round's EXACT integer totals (``kernel.ScorePartial``
    summed over every record by any engine: local passes or Spark partitions). The one place
    the noise-aware mechanism adds its noise; the totals never leave it."""
    from . import kernel
    from .fixed_point import MechanismError

    _check_positive(score_bound=score_bound, curvature_bound=curvature_bound,
                    score_noise_multiplier=score_noise_multiplier,
                    curvature_noise_multiplier=curvature_noise_multiplier)
    d = int(dim)
    if len(total.score) != d or len(total.curvature) != d * (d + 1) // 2:
        raise MechanismError("totals do not match the model's dimension")
    score_sum = kernel.finish(total.score, score_bound)
    tri_sum = kernel.finish(total.curvature, curvature_bound)
    score_std = score_noise_multiplier * score_bound
    curv_std = curvature_noise_multiplier * curvature_bound
    noisy_score = randomness.gaussian(score_sum, noise_std=score_std, clip_norm=score_bound)
    noisy_tri = randomness.gaussian(tri_sum, noise_std=curv_std, clip_norm=curvature_bound)
    return NoisyStatistics(
        score=torch.from_numpy(np.asarray(noisy_score, dtype=np.float64)),
        curvature=symmetric_from_upper(torch.from_numpy(np.asarray(noisy_tri, dtype=np.float64)), d),
        score_noise_std=float(score_std),
        curvature_noise_std=float(curv_std),
    )
