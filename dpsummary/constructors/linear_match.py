"""A linear-regression pseudocoreset whose exact weighted posterior has a target Gaussian's
moments, sigma estimated (issue 51). Post-processing of the DP target and public values.

The weighted posterior of linear regression depends on the pseudocoreset only through its
weighted sufficient statistics ``T = sum_m w_m z_m z_m^T``, ``z = [1, x, y]``
(:class:`~dpsummary.models.linear.SuffStats`), and its exact moments are a quadrature
(:func:`~dpsummary.models.linear.suffstat_posterior`), deterministic and cheap. So:

1. **Statistics from a Gaussian** (:func:`statistics_for`). At ``sigma = exp(m_ls)``: the
   coefficients' likelihood precision ``S_beta^-1 - I/s0^2`` (eigenvalues floored) times
   ``sigma^2`` is ``X^T W X``; ``X^T W y`` puts the conditional mean at ``m_beta``; ``y^T W y``
   makes the residual sum of squares ``sigma^2 (W - p)`` (the mode of log sigma with the ``p``
   coefficients integrated out). The total weight ``W`` is ``X^T W X``'s intercept entry, and
   log sigma's posterior variance is about ``1 / (2 (W - p))``: one number sets both. Where the
   target's sigma is wider than the coefficients' ``W`` allows (the noise on ``y^T y`` dominates
   sigma's uncertainty) ``W`` is lowered to ``p + 1 / (2 var_ls)`` along ``X^T W X``'s intercept
   row (``xx - c u u^T``, ``u = xx e0 / xx_00``): only the intercept's variance grows (its
   interval wider than the target's: conservative), every other moment is kept; the recorded sd
   ratios (``pseudocoreset_match``) say by how much.
2. **Moment matching.** The target handed to step 1 is moved until the exact moments equal the
   signed ones (means additively, sds multiplicatively, correlations kept; as
   :mod:`dpsummary.constructors.moment_match` does for GLMs, but with exact moments instead of
   NUTS), at most :data:`MAX_ITERATIONS`; the best iterate is kept.
3. **Points** (:func:`points_for`): ``size`` equally weighted points whose weighted second
   moments are exactly ``T``: the mean ``T[0, 1:] / W`` plus the symmetric square root of the
   covariance times an orthonormal frame orthogonal to the ones vector (needs ``size >=
   param_dim``; the frame is drawn from the release's non-private generator).
"""

from __future__ import annotations

import math

import numpy as np
import torch

from ..gaussian import DTYPE, GaussianPosterior
from ..models.linear import LinearRegression, SuffStats, suffstat_posterior
from .moment_match import MIN_RELATIVE_VARIANCE, MomentMatch, carrier_model

MAX_ITERATIONS = 40
#: Stop when every mean is within this many sds and every sd within this relative error.
MEAN_TOLERANCE = 0.005
SD_TOLERANCE = 0.005
DAMPING = 0.8
#: Eigenvalue floor of the coefficients' likelihood precision, relative to its largest, but never
#: above ABSOLUTE_FLOOR prior precisions: a floor relative to the largest alone bound on a large
#: table whose posterior is the prior along some directions (cps1988: largest 4e7, the prior-like
#: directions' 0.2 raised to 0.43, the pseudocoreset 0.9x the target's sd there).
PRECISION_FLOOR = 1e-8
ABSOLUTE_FLOOR = 1e-3


def statistics_for(model: LinearRegression, mean: torch.Tensor, cov: torch.Tensor) -> tuple[torch.Tensor, float]:
    """The statistics ``T`` (p+1, p+1: design columns, then y) of step 1 for the target
    ``N(mean, cov)``, and the total weight."""
    p = model.num_coefficients
    s0 = model.prior_scale
    mu_b = model.prior_mean[:p]
    s2 = math.exp(2.0 * float(mean[-1]))
    prec = torch.linalg.inv(0.5 * (cov[:p, :p] + cov[:p, :p].T)) - torch.eye(p, dtype=DTYPE) / s0**2
    lam, vec = torch.linalg.eigh(0.5 * (prec + prec.T))
    lam = torch.clamp(lam, min=min(PRECISION_FLOOR * max(float(lam.max()), 1e-300), ABSOLUTE_FLOOR / s0**2))
    xx = s2 * (vec * lam) @ vec.T
    xx = 0.5 * (xx + xx.T)
    if model.intercept:
        w_sigma = p + 1.0 / (2.0 * max(float(cov[-1, -1]), 1e-300))
        if w_sigma < float(xx[0, 0]):
            # Lower the total weight by c = xx_00 - w_sigma along u = xx e0 / xx_00 (not along
            # e0): xx - c u u^T keeps xx_00 - c on the diagonal and, by Sherman-Morrison, changes the
            # covariance xx^-1 only by a multiple of e0 e0^T: the intercept's variance grows, every
            # other variance and covariance stays (c < xx_00 keeps it PD). Lowering along e0
            # hit the PD limit where a column is nearly collinear with the intercept, and
            # shrinking the intercept's row decorrelated it from one-hot columns (their intervals
            # then 0.05x the target's; first suite run).
            u = xx[:, 0] / float(xx[0, 0])
            xx = xx - (float(xx[0, 0]) - w_sigma) * u[:, None] * u[None, :]
            xx = 0.5 * (xx + xx.T)
        count = float(xx[0, 0])
    else:
        count = p + 1.0 / (2.0 * max(float(cov[-1, -1]), 1e-300))
    t = s2 / s0**2
    xy = (xx + t * torch.eye(p, dtype=DTYPE)) @ mean[:p].to(DTYPE) - t * mu_b
    yy = float(xy @ torch.linalg.solve(xx, xy)) + s2 * max(count - p, 1.0)
    out = torch.zeros(p + 1, p + 1, dtype=DTYPE)
    out[:p, :p] = xx
    out[:p, p] = out[p, :p] = xy
    out[p, p] = yy
    return out, count


def _lowered(model: LinearRegression, mean: torch.Tensor, cov: torch.Tensor) -> bool:
    """Whether step 1 lowers the total weight below the coefficients' for this target."""
    p = model.num_coefficients
    prec = torch.linalg.inv(0.5 * (cov[:p, :p] + cov[:p, :p].T)) - torch.eye(p, dtype=DTYPE) / model.prior_scale**2
    w_beta = math.exp(2.0 * float(mean[-1])) * float(prec[0, 0])
    return p + 1.0 / (2.0 * max(float(cov[-1, -1]), 1e-300)) < w_beta


def _stats(model: LinearRegression, t: torch.Tensor, count: float) -> SuffStats:
    p = model.num_coefficients
    return SuffStats(count, t[:p, :p], t[:p, p], float(t[p, p]))


def points_for(model: LinearRegression, t: torch.Tensor, count: float, size: int, generator: torch.Generator
               ) -> tuple[torch.Tensor, torch.Tensor]:
    """``size`` points of weight ``count / size`` with weighted sufficient statistics ``t`` (step 3)."""
    f = model.num_features
    if model.intercept:
        full = t  # rows/cols: [1, x..., y]
    else:
        full = torch.zeros(f + 2, f + 2, dtype=DTYPE)
        full[0, 0] = count
        full[1:, 1:] = t
    w = count
    mu = full[0, 1:] / w
    c = full[1:, 1:] / w - mu[:, None] * mu[None, :]
    lam, vec = torch.linalg.eigh(0.5 * (c + c.T))
    root = (vec * torch.sqrt(torch.clamp(lam, min=0.0))) @ vec.T
    q = f + 1
    g = torch.randn(size, q, generator=generator, dtype=DTYPE)
    g = g - g.mean(0, keepdim=True)
    frame, _ = torch.linalg.qr(g)
    u = math.sqrt(size) * frame
    points = mu[None, :] + u @ root
    return points, torch.full((size,), w / size, dtype=DTYPE)


def match_linear(model: LinearRegression, target: GaussianPosterior, *, size: int, generator: torch.Generator
                 ) -> MomentMatch:
    """The pseudocoreset of ``target`` (module docstring); its agreement is exact (quadrature)."""
    if size < model.param_dim:
        raise ValueError("a linear pseudocoreset needs at least param_dim points")
    carrier, widened = carrier_model(model, target)
    m = target.mean.detach().to(DTYPE)
    s_cov = target.cov.detach().to(DTYPE)
    s_cov = 0.5 * (s_cov + s_cov.T)
    sd = torch.sqrt(torch.diagonal(s_cov))
    chol = torch.linalg.cholesky(s_cov)
    inv_chol = torch.linalg.inv(chol)
    cap = 0.99 * carrier.prior_scale**2 / float(torch.linalg.eigvalsh(s_cov).max())
    cur_m, cur_c = m.clone(), s_cov.clone()
    best: tuple[float, torch.Tensor, float, float, float, float, int] | None = None
    for it in range(1, MAX_ITERATIONS + 1):
        t, count = statistics_for(carrier, cur_m, cur_c)
        mu, cov = suffstat_posterior(_stats(carrier, t, count), carrier.prior_mean, carrier.prior_scale)
        sd_e = torch.sqrt(torch.diagonal(cov))
        err = float(((mu - m).abs() / sd).max())
        ratio = sd_e / sd
        # Where the total weight was lowered for sigma (step 1) the intercept's sd cannot reach
        # the target's (it is wider: conservative); the other coordinates are still matched.
        # Only while it IS wider: where the target's intercept is prior-like (cps1988's one-hot
        # relations include it) the lowered weight leaves it matched, and holding it out let the
        # other coordinates' updates pull it to 0.46x.
        free = torch.ones_like(ratio, dtype=torch.bool)
        if carrier.intercept and _lowered(carrier, cur_m, cur_c) and float(ratio[0]) > 1.0:
            free[0] = False
        score = max(err / MEAN_TOLERANCE, float((ratio[free] - 1).abs().max()) / SD_TOLERANCE)
        if not math.isfinite(score):
            break
        if best is None or score < best[0]:
            best = (score, t, count, err, float(ratio.min()), float(ratio.max()), it)
        if score <= 1.0:
            break
        cur_m = cur_m + DAMPING * (m - mu)
        scale = torch.clamp(torch.where(free, ratio, torch.ones_like(ratio)) ** -DAMPING, 0.5, 2.0)
        cur_c = cur_c * (scale[:, None] * scale[None, :])
        lam, vec = torch.linalg.eigh(inv_chol @ cur_c @ inv_chol.T)
        cur_c = chol @ ((vec * torch.clamp(lam, MIN_RELATIVE_VARIANCE, cap)) @ vec.T) @ chol.T
        cur_c = 0.5 * (cur_c + cur_c.T)
    if best is None:
        raise ArithmeticError("no finite linear pseudocoreset")
    _score, t, count, err, rmin, rmax, it = best
    points, weights = points_for(carrier, t, count, size, generator)
    if not (bool(torch.isfinite(points).all()) and np.isfinite(count)):
        raise ArithmeticError("no finite linear pseudocoreset")
    return MomentMatch(points=points, weights=weights, model=carrier, iterations=it, max_mean_error_sd=err,
                       sd_ratio_min=rmin, sd_ratio_max=rmax, draws=0, carrier_prior_scale=widened,
                       estimator="quadrature (exact)", method="moments (quadrature)")
