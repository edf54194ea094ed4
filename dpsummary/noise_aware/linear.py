"""Linear regression with sigma estimated: the noise-aware posterior of the noisy moment matrix
(issue 51). Post-processing of one DP output (:mod:`dpsummary.private.moments`).

The release is ``R = M + E``: ``M = sum_i z_i z_i^T`` with ``z_i = [1, x_i, y_i]`` (the record
count, ``X^T X``, ``X^T y`` and ``y^T y`` of the design with its intercept column) and ``E``
symmetric Gaussian noise of per-entry sd ``tau`` on the upper triangle. Bernstein and Sheldon
(2019) show that plugging ``R`` in as if it were ``M`` gives miscalibrated posteriors at realistic
N; their remedy treats ``M`` as latent. Here ``M`` is integrated out by multiple imputation
(the pattern of :func:`~dpsummary.noise_aware.posterior.imputed_posterior`):

1. draws of ``M`` from its posterior given ``R`` under a flat prior on the PSD cone: ``R``
   minus fresh noise of the mechanism's structure, the design block (count, ``X^T 1``,
   ``X^T X``) replaced by its PSD part with eigenvalues floored at :data:`EIGEN_FLOOR` times the
   count (so it is invertible), and ``y^T y`` drawn from its truncated Gaussian given the rest
   (``N(R_yy, tau^2)`` restricted to ``y^T y >= xy^T XX^-1 xy``, the PSD constraint: a residual
   sum of squares is never negative). That truncation is what keeps sigma honest where the
   noise hides the residuals (an exact linear relation, or noise that dwarfs ``y^T y``);
2. the exact posterior of ``(beta, log sigma)`` given each draw
   (:func:`~dpsummary.models.linear.suffstat_posterior`, quadrature over log sigma);
3. the moment-matched mixture: mean of the means, mean of the covariances plus the means'
   covariance.

Noise is post-processing randomness (the release's non-private generator).
"""

from __future__ import annotations

import math

import torch

from ..gaussian import DTYPE, GaussianPosterior
from ..models.glm import GLM
from ..models.linear import LinearRegression, SuffStats, suffstat_posterior
from .posterior import symmetric_noise
from .released import NonFiniteFit

#: Imputations of the true moment matrix (each one quadrature posterior: a few ms).
LINEAR_IMPUTATIONS = 100
#: The design block's eigenvalue floor, relative to the (imputed) record count.
EIGEN_FLOOR = 1e-6


def moment_bound(*, feature_norm: float, target_bound: float) -> float:
    """The public L2 bound on one record's released upper triangle of ``z z^T``, ``z = [1, x,
    y]``: :meth:`GLM.rank_one_upper_bound` of ``||z||^2 <= 1 + feature_norm^2 + target_bound^2``
    (every coordinate of the public box in [-1, 1]); the sensitivity SECURITY.md states."""
    return GLM.rank_one_upper_bound(math.sqrt(1.0 + feature_norm**2 + target_bound**2))


def _upper_tail_normal(mean: float, sd: float, lower: float, generator: torch.Generator) -> float:
    """One draw of ``N(mean, sd^2)`` truncated to ``[lower, inf)`` (inverse CDF; beyond 8 sds
    the exponential tail approximation ``lower + Exp(1) sd / a``)."""
    a = (lower - mean) / sd
    u = float(torch.rand(1, generator=generator, dtype=DTYPE))
    u = min(max(u, 1e-300), 1.0 - 1e-16)
    if a > 8.0:
        return lower - sd * math.log(u) / a
    tail = float(torch.special.ndtr(torch.tensor(-a, dtype=DTYPE)))  # P(Z >= a)
    q = float(torch.special.ndtri(torch.tensor(u * tail, dtype=DTYPE)))
    return max(mean - sd * q, lower)


#: Redraws of the design block per imputation while the PSD constraint on y^T y is implausible
#: (the floor above the released y^T y by more than PLAUSIBLE_SDS noise sds): rejection sampling
#: of the flat-prior posterior restricted to PSD matrices.
MAX_REDRAWS = 50
PLAUSIBLE_SDS = 4.0


def impute_moments(noisy: torch.Tensor, tau: float | torch.Tensor, generator: torch.Generator) -> torch.Tensor:
    """One draw of the true moment matrix given the release (step 1 of the module docstring);
    ``tau`` the per-entry noise sd (a number, or a symmetric matrix for pooled releases). The
    design block and ``X^T y`` are redrawn (at most :data:`MAX_REDRAWS` times, else the draw with
    the lowest floor is kept) while ``xy^T XX^-1 xy`` exceeds the released ``y^T y`` by more than
    :data:`PLAUSIBLE_SDS` noise sds: a PSD moment matrix could not have produced the release."""
    dim = noisy.shape[0]
    tau_m = torch.full((dim, dim), float(tau), dtype=DTYPE) if not isinstance(tau, torch.Tensor) else tau.to(DTYPE)
    sym = 0.5 * (noisy + noisy.T)
    tau_yy = float(tau_m[-1, -1])
    best: tuple[float, torch.Tensor, torch.Tensor] | None = None
    for _ in range(MAX_REDRAWS):
        m = sym - symmetric_noise(dim, 1.0, generator) * tau_m
        lam, vec = torch.linalg.eigh(m[:-1, :-1])
        count = max(float(m[0, 0]), 1.0)
        xx = (vec * torch.clamp(lam, min=EIGEN_FLOOR * count)) @ vec.T
        xy = m[:-1, -1]
        floor = float(xy @ torch.linalg.solve(xx, xy))
        if best is None or floor < best[0]:
            best = (floor, xx, xy)
        if floor <= float(sym[-1, -1]) + PLAUSIBLE_SDS * tau_yy:
            break
    assert best is not None
    floor, xx, xy = best
    yy = _upper_tail_normal(float(sym[-1, -1]), tau_yy, floor, generator)
    out = torch.zeros(dim, dim, dtype=DTYPE)
    out[:-1, :-1] = 0.5 * (xx + xx.T)
    out[:-1, -1] = out[-1, :-1] = xy
    out[-1, -1] = yy
    return out


def pooled_moments(first: torch.Tensor, first_std: float, second: torch.Tensor, second_std: float
                   ) -> tuple[torch.Tensor, torch.Tensor]:
    """Two releases of the same design block (count, ``X^T 1``, ``X^T X``) averaged by inverse
    noise variance; the target's row and column from ``second`` (the anchored release). Returns the
    matrix and its per-entry noise sd (post-processing)."""
    w1, w2 = first_std**-2, second_std**-2
    out = second.clone().to(DTYPE)
    out[:-1, :-1] = (w1 * first[:-1, :-1] + w2 * second[:-1, :-1]) / (w1 + w2)
    tau = torch.full_like(out, second_std)
    tau[:-1, :-1] = (w1 + w2) ** -0.5
    return out, tau


def linear_posterior(model: LinearRegression, noisy: torch.Tensor, tau: float | torch.Tensor, *,
                     generator: torch.Generator, draws: int = LINEAR_IMPUTATIONS,
                     anchor: torch.Tensor | None = None) -> GaussianPosterior:
    """The noise-aware Gaussian of ``(beta, log sigma)`` (module docstring). With an ``anchor``
    the release's target column is the residual ``y - [1, x] . anchor``: the posterior of
    ``beta - anchor`` is computed (the prior's centre moved by ``-anchor``) and shifted back.
    Raises :class:`NonFiniteFit` when fewer than half the imputations give finite moments."""
    tau_min = float(tau.min()) if isinstance(tau, torch.Tensor) else float(tau)
    if not bool(torch.isfinite(noisy).all()) or not (tau_min > 0 and math.isfinite(tau_min)):
        raise NonFiniteFit("the released moment matrix is not finite")
    p = model.num_coefficients
    centre = model.prior_mean.clone()
    shift = torch.zeros_like(centre)
    if anchor is not None:
        shift[:p] = anchor.detach().to(DTYPE)
        centre = centre - shift
    means, covs = [], []
    for _ in range(draws):
        stats = SuffStats.from_moment_matrix(impute_moments(noisy.to(DTYPE), tau, generator), intercept=model.intercept)
        mean, cov = suffstat_posterior(stats, centre, model.prior_scale)
        mean = mean + shift
        if bool(torch.isfinite(mean).all()) and bool(torch.isfinite(cov).all()):
            means.append(mean)
            covs.append(cov)
    if len(means) < max(draws // 2, 1):
        raise NonFiniteFit("too few imputations gave a finite posterior")
    mu = torch.stack(means)
    centre = mu.mean(0)
    spread = (mu - centre).T @ (mu - centre) / mu.shape[0]
    cov = torch.stack(covs).mean(0) + spread
    cov = 0.5 * (cov + cov.T)
    try:
        return GaussianPosterior(mean=centre, scale_tril=torch.linalg.cholesky(cov))
    except RuntimeError:
        raise NonFiniteFit("the imputed mixture's covariance is not positive definite") from None
