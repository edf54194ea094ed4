"""Linear regression with sigma estimated: the noise-aware posterior of the noisy moment matrix
(issue 51). Post-processing of DP outputs (:mod:`dpsummary.private.moments`).

The release is ``R = M + E``: ``M = sum_i z_i z_i^T`` with ``z_i = [1, x_i, r_i]`` (the record
count, ``X^T X``, ``X^T r`` and ``r^T r`` of the design with its intercept column; ``r = y``; the
anchored round releases ``X^T r`` and ``r^T r`` of the residual at a public anchor as a vector
instead, :func:`residual_posterior`) and ``E`` symmetric Gaussian noise of per-entry sd ``tau`` on
the upper triangle. Bernstein and Sheldon (2019) show that plugging ``R`` in as if it were ``M``
gives miscalibrated posteriors at realistic N; here the noise is integrated out:

1. the design block (count, ``X^T 1``, ``X^T X``) by multiple imputation (the pattern of
   :func:`~dpsummary.noise_aware.posterior.imputed_posterior`): draws of the true block from its
   flat-prior posterior given the release, projected off the public one-hot relations the release
   cannot tell from exact (:func:`exact_relations`), PSD part;
2. given each draw, ``X^T r`` and ``r^T r`` through their noise-aware likelihood
   (:func:`_noise_aware_grid`; the score form of module docstring 2. with sigma among the
   parameters): in a direction the design does not resolve the released ``X^T r`` is noise and
   carries no information, and ``r^T r``, about ``sigma^2 n`` plus the fit's sum of squares,
   identifies sigma within its own noise (a first version imputed ``y^T y`` truncated at the
   regression's sum of squares ``xy^T XX^-1 xy``; where the design is noise-dominated that floor
   exploded and sigma with it: wooldridge/gpa2, AER/CPS1988);
3. the moment-matched mixture: mean of the means, mean of the covariances plus the means'
   covariance.

Noise is post-processing randomness (the release's non-private generator).
"""

from __future__ import annotations

import math

import torch

from ..gaussian import DTYPE, GaussianPosterior
from ..models.glm import GLM
from ..models.linear import LOG_SIGMA_RANGE as _LOG_SIGMA_RANGE
from ..models.linear import LinearRegression
from .posterior import symmetric_noise
from .relations import relation_projector
from .released import NonFiniteFit
from .support import CurvatureSupport, support_draw

#: Imputations of the true moment matrix (each one quadrature posterior: a few ms).
LINEAR_IMPUTATIONS = 100


def moment_bound(*, feature_norm: float, target_bound: float) -> float:
    """The public L2 bound on one record's released upper triangle of ``z z^T``, ``z = [1, x,
    y]``: :meth:`GLM.rank_one_upper_bound` of ``||z||^2 <= 1 + feature_norm^2 + target_bound^2``
    (every coordinate of the public box in [-1, 1]); the sensitivity SECURITY.md states."""
    return GLM.rank_one_upper_bound(math.sqrt(1.0 + feature_norm**2 + target_bound**2))


def square_scale(*, feature_norm: float, residual_clip: float, residual_range: float) -> float:
    """The public scale ``s`` of the anchored round's ``r^T r / s`` entry: ``R^2 / (sqrt(1 + F^2)
    c_r)``, so that entry's share of one record's squared norm equals the ``X^T r`` block's
    (``(R^2 / s)^2 = (1 + F^2) c_r^2``). Why equal: ``r^T r`` sets sigma, which scales the
    coefficients' widths wherever the data dominate the noise; ``X^T r`` sets them where the noise
    dominates; which regime a table is in is not known before the release, so neither gets more."""
    return residual_range**2 / (math.sqrt(1.0 + feature_norm**2) * residual_clip)


def residual_bound(*, feature_norm: float, residual_clip: float, residual_range: float, scale: float) -> float:
    """The public L2 bound on one record's anchored-round vector ``[w clip(r, c_r), min(r^2, R^2)
    / s]``, ``w = [1, x]``: ``sqrt((1 + F^2) c_r^2 + R^4 / s^2)`` (the sensitivity SECURITY.md
    states; every feature of the public box in [-1, 1], ``||x|| <= F``)."""
    return math.sqrt((1.0 + feature_norm**2) * residual_clip**2 + residual_range**4 / scale**2)


def _noise_aware_grid(xx: torch.Tensor, xr: torch.Tensor, rr: float, count: float, tau_r: float, tau_rr: float,
                      centre: torch.Tensor, s0: float) -> tuple[torch.Tensor, torch.Tensor]:
    """Mean and covariance of ``(delta, log sigma)`` given a design block ``xx`` taken as known
    and the noisy ``xr = X^T r + N(0, tau_r^2 I)`` and ``rr = r^T r + N(0, tau_rr^2)`` (module
    docstring, 2.): in the eigenbasis of ``xx`` the released ``xr`` is, given ``sigma`` and the
    coefficients ``delta`` of ``r`` on the design, ``N(lam delta, sigma^2 lam + tau_r^2)`` per
    direction (the data's least-squares fit ``N(delta, sigma^2 xx^-1)``, then the noise), so a
    direction the design does not resolve carries no information instead of an exploding inverse;
    ``rr`` is ``N(sigma^2 (n - d) + E F, 2 sigma^4 (n - d) + tau_rr^2 + Var F)``: ``r^T r`` is the
    residual sum of squares, ``sigma^2 chi^2_(n - d)``, plus the fit ``F`` (the squared norm of the
    data's projection on the design), whose mean and variance are taken given ``xr``. Quadrature over ``g = log sigma``.
    Eigenvalues at the round-off level of the largest count as 0 (a block projected off an exact
    relation: that direction gets the prior)."""
    lam, vecs = torch.linalg.eigh(0.5 * (xx + xx.T))
    tiny = 1e-10 * float(lam.abs().max()) if lam.numel() else 0.0
    lam = torch.where(lam <= tiny, torch.zeros_like(lam), lam)
    xt = vecs.T @ xr
    mu = vecs.T @ centre[:-1]
    mu_ls = float(centre[-1])

    def parts(g: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor, torch.Tensor]:
        s2 = torch.exp(2 * g)[:, None]
        v = s2 * lam + tau_r**2  # (G, d)
        prec = 1.0 / s0**2 + lam**2 / v
        mean = (mu / s0**2 + lam * xt / v) / prec
        marg_var = lam**2 * s0**2 + v
        lp = -0.5 * ((xt - lam * mu) ** 2 / marg_var + torch.log(marg_var)).sum(1)
        # r^T r = RSS + F: RSS ~ sigma^2 chi^2_(n - d), and the fit F = sum_j u_j^2 with u_j =
        # sqrt(lam_j) delta_j + sigma z_j the data's own projection (xt_j = sqrt(lam_j) u_j + noise):
        # mean and variance of F under u's posterior given xt. Without F's variance, where the
        # design leaves delta to the prior (many rare columns), r^T r minus its expected fit was
        # read as a precise sigma^2 n and pulled sigma far below the full data's (ISLR/Wage public:
        # log sigma -2.9 +- 0.5 against -1.48); with noise-free xt the variance is 0 (exact).
        root = torch.sqrt(lam)
        su = lam * s0**2 + s2
        prec_u = 1.0 / su + lam / tau_r**2
        m_u = (root * mu / su + root * xt / tau_r**2) / prec_u
        v_u = 1.0 / prec_u
        fit = (m_u**2 + v_u).sum(1)
        dof = max(count - lam.shape[0], 1.0)
        rr_var = 2.0 * s2[:, 0] ** 2 * dof + tau_rr**2 + (2.0 * v_u**2 + 4.0 * m_u**2 * v_u).sum(1)
        lp = lp - 0.5 * ((rr - s2[:, 0] * dof - fit) ** 2 / rr_var + torch.log(rr_var))
        return lp - 0.5 * ((g - mu_ls) / s0) ** 2, mean, 1.0 / prec

    lo, hi = _LOG_SIGMA_RANGE
    grid = torch.linspace(lo, hi, 401, dtype=DTYPE)
    for _ in range(5):  # zoom in on the mode
        grid = torch.linspace(lo, hi, 401, dtype=DTYPE)
        k = int(torch.argmax(parts(grid)[0]))
        lo, hi = float(grid[max(k - 2, 0)]), float(grid[min(k + 2, 400)])
    mode = float(grid[k])
    h = 1e-3
    f = parts(torch.tensor([mode - h, mode, mode + h], dtype=DTYPE))[0]
    curv = -float(f[0] - 2 * f[1] + f[2]) / h**2
    sd = 1.0 / math.sqrt(curv) if curv > 0 and math.isfinite(curv) else 1.0
    grid = torch.linspace(mode - 12.0 * sd, mode + 12.0 * sd, 801, dtype=DTYPE)
    lp, m_rot, v_rot = parts(grid)
    w = torch.softmax(torch.where(torch.isfinite(lp), lp, torch.full_like(lp, -math.inf)), 0)
    e_m = (w[:, None] * m_rot).sum(0)
    e_g = float((w * grid).sum())
    cov_rot = torch.diag((w[:, None] * v_rot).sum(0)) + (w[:, None, None] * m_rot[:, :, None] * m_rot[:, None, :]).sum(0)
    cov_rot = cov_rot - e_m[:, None] * e_m[None, :]
    cross = (w[:, None] * m_rot * (grid - e_g)[:, None]).sum(0)
    d = lam.shape[0]
    mean = torch.cat([vecs @ e_m, torch.tensor([e_g], dtype=DTYPE)])
    cov = torch.zeros(d + 1, d + 1, dtype=DTYPE)
    cov[:d, :d] = vecs @ cov_rot @ vecs.T
    cov[:d, d] = cov[d, :d] = vecs @ cross
    cov[d, d] = float((w * (grid - e_g) ** 2).sum())
    return mean, 0.5 * (cov + cov.T)


def linear_posterior(model: LinearRegression, noisy: torch.Tensor, tau: float | torch.Tensor, *,
                     generator: torch.Generator, draws: int = LINEAR_IMPUTATIONS,
                     anchor: torch.Tensor | None = None, relations: torch.Tensor | None = None,
                     support: CurvatureSupport | None = None) -> GaussianPosterior:
    """The noise-aware Gaussian of ``(beta, log sigma)`` from one noisy moment matrix (module
    docstring). The design block's noise is integrated out by imputation (draws of the true block,
    PSD part, projected off the exact ``relations``: :func:`exact_relations`); ``X^T y``
    and ``y^T y`` enter through their noise-aware likelihood (:func:`_noise_aware_grid`). With an
    ``anchor`` the release's target column is the residual ``y - [1, x] . anchor``. ``support``
    (:func:`~dpsummary.noise_aware.design_support`; needs one noise sd for the whole block): each
    imputed block is drawn on the one-hot support of the design (:func:`support_draw`). Raises
    :class:`NonFiniteFit` when fewer than half the imputations give finite moments."""
    tau_min = float(tau.min()) if isinstance(tau, torch.Tensor) else float(tau)
    if not bool(torch.isfinite(noisy).all()) or not (tau_min > 0 and math.isfinite(tau_min)):
        raise NonFiniteFit("the released moment matrix is not finite")
    dim = noisy.shape[0]
    tau_m = torch.full((dim, dim), float(tau), dtype=DTYPE) if not isinstance(tau, torch.Tensor) else tau.to(DTYPE)
    sym = 0.5 * (noisy + noisy.T).to(DTYPE)
    return _imputed(model, sym[:-1, :-1], tau_m[:-1, :-1], sym[:-1, -1], float(sym[-1, -1]), float(tau_m[0, -1]),
                    float(tau_m[-1, -1]), generator=generator, draws=draws, anchor=anchor, relations=relations,
                    support=support)


def residual_posterior(model: LinearRegression, design: torch.Tensor, design_tau: float, residuals: torch.Tensor,
                       residual_tau: float, square_scale: float, anchor: torch.Tensor, *, generator: torch.Generator,
                       draws: int = LINEAR_IMPUTATIONS, relations: torch.Tensor | None = None,
                       support: CurvatureSupport | None = None) -> GaussianPosterior:
    """The noise-aware Gaussian of ``(beta, log sigma)`` from the two rounds of
    :mod:`dpsummary.mechanisms.noise_aware_linear`: the design block (count, ``X^T 1``,
    ``X^T X``) of the first round's noisy moment matrix ``design`` (per-entry noise sd
    ``design_tau``) and the anchored round's noisy vector ``residuals = [X^T r, r^T r / s]``
    (per-entry sd ``residual_tau``; ``s = square_scale``), ``r`` the residual at ``anchor``.
    The clipped residuals are read as if unclipped (the clip is set beyond the residuals' likely
    range; ``sigma^2`` is the unclipped residuals' variance, so the likelihood of ``X^T r`` is no
    narrower than the clipped sum's). ``support`` as for :func:`linear_posterior`. Raises
    :class:`NonFiniteFit` as :func:`linear_posterior`."""
    if not (bool(torch.isfinite(design).all()) and bool(torch.isfinite(residuals).all())):
        raise NonFiniteFit("the released statistics are not finite")
    if not all(v > 0 and math.isfinite(v) for v in (design_tau, residual_tau, square_scale)):
        raise NonFiniteFit("the released statistics' noise is not finite")
    sym = 0.5 * (design + design.T).to(DTYPE)
    dim = sym.shape[0]
    tau_m = torch.full((dim - 1, dim - 1), float(design_tau), dtype=DTYPE)
    res = residuals.to(DTYPE)
    return _imputed(model, sym[:-1, :-1], tau_m, res[:-1], float(res[-1]) * square_scale, residual_tau,
                    residual_tau * square_scale, generator=generator, draws=draws, anchor=anchor,
                    relations=relations, support=support)


def _imputed(model: LinearRegression, block_noisy: torch.Tensor, block_tau: torch.Tensor, xr_full: torch.Tensor,
             rr: float, tau_r: float, tau_rr: float, *, generator: torch.Generator, draws: int,
             anchor: torch.Tensor | None, relations: torch.Tensor | None,
             support: CurvatureSupport | None = None) -> GaussianPosterior:
    """The imputation mixture shared by :func:`linear_posterior` and :func:`residual_posterior`:
    each imputed block (on the one-hot ``support`` when given: :func:`support_draw`, the design
    block being a GLM curvature with every weight 1) is projected off the exact ``relations``
    (:func:`exact_relations`), so along them the block is exactly 0 (the prior, as in the full
    data's posterior) and the other directions are not rotated into them."""
    p = model.num_coefficients
    k0 = 0 if model.intercept else 1
    centre = model.prior_mean.clone()
    shift = torch.zeros_like(centre)
    if anchor is not None:
        shift[:p] = anchor.detach().to(DTYPE)
        centre = centre - shift
    xr = xr_full[k0:]
    size = block_noisy.shape[0]
    proj = relation_projector(relations, size)
    if support is not None:
        if support.dim != size or not support.intercept:
            raise ValueError("the support is not the design block's (design_support)")
        support_tau = float(block_tau[0, 0])
        if not bool((block_tau == support_tau).all()):
            raise ValueError("the design block's support needs one noise sd for the whole block")
    means, covs = [], []
    for _ in range(draws):
        if support is None:
            block = block_noisy - symmetric_noise(size, 1.0, generator) * block_tau
        else:
            block = support_draw(block_noisy, support_tau, support, generator)
        count = max(float(block[0, 0]), 1.0)
        if proj is not None:
            block = proj @ block @ proj
        lam, vec = torch.linalg.eigh(0.5 * (block + block.T))
        block = (vec * torch.clamp(lam, min=0.0)) @ vec.T
        mean, cov = _noise_aware_grid(block[k0:, k0:], xr, rr, count, tau_r, tau_rr, centre, model.prior_scale)
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
