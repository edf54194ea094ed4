"""The noise-aware release's mechanism: noisy sums of per-record scores and curvatures.

At a public anchor ``theta`` (the prior mean, or a previous round's released estimate), every
record contributes its log-likelihood score ``g_i = grad log p(x_i | theta)`` (d-vector) and its
curvature ``H_i = -hess log p(x_i | theta)`` (d x d). Both are clipped record by record to public
bounds (L2 norm ``score_bound``, Frobenius norm ``curvature_bound``; for logistic regression the
bounds hold for every record of the public feature box, so clipping never biases), summed over
ALL records (no subsampling), and released by two Gaussian mechanisms:

* score sum + N(0, (score_noise_multiplier * score_bound)^2 I_d): adding or removing one record
  moves the clipped sum by at most ``score_bound`` in L2, so this is
  ``GaussianDpEvent(score_noise_multiplier)``;
* the upper triangle (diagonal included) of the curvature sum + N(0, (curvature_noise_multiplier *
  curvature_bound)^2) per entry, mirrored to a symmetric matrix ("Analyze Gauss", Dwork, Talwar,
  Thakurta and Zhang 2014): the upper triangle's L2 norm is at most the full matrix's Frobenius
  norm, so one record moves it by at most ``curvature_bound``: ``GaussianDpEvent(
  curvature_noise_multiplier)``.

This is the statistic Kulkarni, Jaelkoe, Koskela, Kaski and Honkela (2021) privatise for GLMs
(a noisy sum of per-record summary statistics) taken at a local quadratic expansion, and one
round of the DP Newton method of Ganesh, Haghifam, Steinke and Thakurta (2023). The caller
(:mod:`dpsummary.noise_aware`) turns the releases into a posterior by post-processing alone.

Privacy caveats: ``theta``, the bounds and the noise multipliers must be public (functions of
the policy, the schema and earlier DP outputs). Nothing about the records leaves this module
except the two noisy releases; the record count is never returned. Noise comes from the
caller's :class:`~dpsummary.private.mechanism.PrivacyRandomness` (OS entropy in a release).
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import TYPE_CHECKING

import numpy as np
import torch

from ..models import DTYPE, Model
from . import noise

if TYPE_CHECKING:
    from .mechanism import PrivacyRandomness

#: Records per chunk when forming the (n, d, d) curvature tensor (bounds memory at d ~ 100).
CHUNK_ROWS = 8192
#: Relative margin below the curvature bound for float64 summation error of the Gram-matrix sum
#: (the score sum is exact: :func:`~dpsummary.private.mechanism.exact_clipped_sum`). Blocked
#: BLAS summation errs by about log2(n) * 2^-53 relative in practice; the worst-case bound
#: (n * 2^-53 per entry over chunks of 8192 rows) is below 1e-6 of the bound up to ~10^5
#: records per chunk sum. Known limitation: not a proof for arbitrary n (see SECURITY.md).
SUM_MARGIN = 1e-6


@dataclass(frozen=True)
class NoisyStatistics:
    """One round's DP outputs: the noisy score sum (d,) and the noisy symmetric curvature sum."""

    score: torch.Tensor
    curvature: torch.Tensor
    score_noise_std: float
    curvature_noise_std: float


def _clip(values: torch.Tensor, bound: float) -> torch.Tensor:
    """Scale each record's flattened statistic to norm <= bound; non-finite records become 0."""
    flat = values.reshape(values.shape[0], -1)
    finite = torch.isfinite(flat).all(1, keepdim=True)
    flat = torch.where(finite, flat, torch.zeros_like(flat))
    norms = flat.norm(dim=1, keepdim=True)
    factor = torch.clamp(bound / torch.clamp(norms, min=1e-300), max=1.0)
    return (flat * factor).reshape(values.shape)


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


def noisy_score_statistics(
    points: torch.Tensor,
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

    Two Gaussian mechanisms: ``GaussianDpEvent(score_noise_multiplier)`` and
    ``GaussianDpEvent(curvature_noise_multiplier)``; add/remove-one-record adjacency."""
    from .mechanism import MechanismError, exact_clipped_sum

    for name, value in (("score_bound", score_bound), ("curvature_bound", curvature_bound),
                        ("score_noise_multiplier", score_noise_multiplier),
                        ("curvature_noise_multiplier", curvature_noise_multiplier)):
        if not (value > 0 and np.isfinite(value)):
            raise MechanismError(f"{name} must be positive and finite")
    d = model.param_dim
    theta = theta.detach().to(DTYPE)
    tri = d * (d + 1) // 2
    eff_score = score_bound * (1 - SUM_MARGIN) - noise.rounding_slack(score_bound, d)
    eff_curv = curvature_bound * (1 - SUM_MARGIN) - noise.rounding_slack(curvature_bound, tri)
    score_sum = torch.zeros(d, dtype=DTYPE)
    curv_sum = torch.zeros(d, d, dtype=DTYPE)
    with torch.no_grad():
        for start in range(0, points.shape[0], CHUNK_ROWS):
            chunk = points[start:start + CHUNK_ROWS]
            scores = _clip(model.record_scores(chunk, theta), eff_score)
            factors = model.record_curvature_factors(chunk, theta)
            if factors is not None:
                # Rank-one curvatures c_i z_i z_i^T: Frobenius norm |c_i| |z_i|^2, clipped by
                # scaling c_i; the sum is one weighted Gram matrix (no (n, d, d) tensor).
                c, z = factors
                c = torch.where(torch.isfinite(c) & torch.isfinite(z).all(1), c, torch.zeros_like(c))
                z = torch.where(torch.isfinite(z), z, torch.zeros_like(z))
                frob = c.abs() * (z * z).sum(1)
                c = c * torch.clamp(eff_curv / torch.clamp(frob, min=1e-300), max=1.0)
                if bool((c.abs() * (z * z).sum(1) > curvature_bound).any()):
                    raise MechanismError("a clipped statistic exceeds its bound")
                curv_sum += (z.T * c) @ z
            else:
                curvs = model.record_curvatures(chunk, theta)
                # Symmetrise per record first, so the clipped matrix is the one whose triangle is sent.
                curvs = _clip(0.5 * (curvs + curvs.transpose(1, 2)), eff_curv)
                if bool((curvs.flatten(1).norm(dim=1) > curvature_bound).any()):
                    raise MechanismError("a clipped statistic exceeds its bound")
                curv_sum += curvs.sum(0)
            # Re-check the invariant the accountant relies on, after clipping.
            if bool((scores.norm(dim=1) > score_bound).any()):
                raise MechanismError("a clipped statistic exceeds its bound")
            # Exact fixed-point sum (neighbouring sums differ by one rounded row, norm <= bound).
            score_sum += torch.from_numpy(exact_clipped_sum(scores.numpy(), score_bound))
    score_std = score_noise_multiplier * score_bound
    curv_std = curvature_noise_multiplier * curvature_bound
    noisy_score = randomness.gaussian(score_sum.numpy(), noise_std=score_std, clip_norm=score_bound)
    noisy_tri = randomness.gaussian(upper_triangle(curv_sum).numpy(), noise_std=curv_std, clip_norm=curvature_bound)
    return NoisyStatistics(
        score=torch.from_numpy(np.asarray(noisy_score, dtype=np.float64)),
        curvature=symmetric_from_upper(torch.from_numpy(np.asarray(noisy_tri, dtype=np.float64)), d),
        score_noise_std=float(score_std),
        curvature_noise_std=float(curv_std),
    )
