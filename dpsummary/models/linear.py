"""Bayesian linear regression: y = [1, x] beta + e, e ~ N(0, sigma^2), sigma a parameter (issue 51).

Parameters (model space): ``theta = (intercept, coefficients..., log_sigma)``; the last one is
named ``log_sigma`` everywhere (``param_names``, ``inspect``, ``Release.parameter_names``, the
exporters); an analyst's ``sigma`` is ``exp`` of its draws, in model-space target units (the
target is scaled into [-1, 1] by its public bounds, so sigma <= 1 for any residuals in range).

Prior: the protocol's ``N(prior_mean, prior_scale^2 I)`` over all of theta, with the default
centre ``(0, ..., 0, LOG_SIGMA_CENTRE)``: ``log_sigma ~ N(-1, 1)`` at the default prior scale, a
weakly informative prior whose central 95% interval is sigma in [0.05, 2.6], i.e. from residuals
5% of the target's public half-range to wider than the range itself.

The exact weighted posterior is not Gaussian in ``log_sigma``; given sigma the coefficients are
Gaussian (conjugate), so :func:`suffstat_posterior` computes its exact mean and covariance by
one-dimensional quadrature over ``log_sigma`` from the weighted sufficient statistics
``(sum w, X^T W X, X^T W y, y^T W y)``; :meth:`LinearRegression.exact_posterior` returns that
moment-matched Gaussian (``exact_moments``), and samplers draw the exact posterior by NUTS.

``noise_scale=<float>`` keeps the older known-noise model (theta without ``log_sigma``; the
posterior Gaussian and conjugate): artifacts written before issue 51 declare it and still load.
"""

from __future__ import annotations

import math
from dataclasses import dataclass
from typing import Any, ClassVar

import torch

from .base import DTYPE, Model

#: Default prior centre of log sigma in model space (see the module docstring).
LOG_SIGMA_CENTRE = -1.0
#: Quadrature: the search range of log sigma, and the grid's points and half-width in posterior sds.
LOG_SIGMA_RANGE = (-60.0, 10.0)
GRID_POINTS = 801
GRID_HALF_WIDTH_SD = 12.0


@dataclass(frozen=True)
class SuffStats:
    """Weighted sufficient statistics of linear regression: ``count = sum w``, ``xx = X^T W X``
    (design with the intercept column), ``xy = X^T W y``, ``yy = y^T W y``."""

    count: float
    xx: torch.Tensor
    xy: torch.Tensor
    yy: float

    @classmethod
    def from_moment_matrix(cls, m: torch.Tensor, *, intercept: bool = True) -> SuffStats:
        """From ``sum w z z^T`` with ``z = [1, x, y]`` (``count`` is ``m[0, 0]``; without an
        intercept the design drops the first column)."""
        k = 0 if intercept else 1
        return cls(float(m[0, 0]), m[k:-1, k:-1], m[k:-1, -1], float(m[-1, -1]))


def _log_marginal(g: torch.Tensor, lam: torch.Tensor, a: torch.Tensor, b: torch.Tensor, stats: SuffStats,
                  s0: float, mu_ls: float) -> torch.Tensor:
    """log p(log_sigma = g | stats) up to a constant, shape of ``g``: the coefficients integrated
    out in the eigenbasis of ``xx`` (``lam`` eigenvalues, ``a = Q^T xy``, ``b = Q^T mu_beta``).
    ``Q(t) = min_beta RSS(beta) + t |beta - mu|^2`` with ``t = sigma^2 / s0^2`` is computed in the
    form that has no cancellation between huge terms, floored at 1e-12 (yy + 1) (an exact fit
    would otherwise send the mode to where only the prior stops it)."""
    d = lam.shape[0]
    s2 = torch.exp(2 * g)[:, None]
    t = s2 / s0**2
    q = stats.yy + t[:, 0] * (b * b).sum() - ((a + t * b) ** 2 / (lam + t)).sum(1)
    q = torch.clamp(q, min=1e-12 * (abs(stats.yy) + 1.0))
    out = (-stats.count + d) * g - 0.5 * torch.log(lam + t).sum(1) - 0.5 * q * torch.exp(-2 * g)
    return out - 0.5 * ((g - mu_ls) / s0) ** 2


@dataclass(frozen=True)
class SigmaGrid:
    """The exact posterior as a grid over ``g = log sigma`` (weights ``w``) with the coefficients
    Gaussian given ``g``: in the eigenbasis ``vecs`` of ``xx``, mean ``(a + t b) / (lam + t)`` and
    variance ``sigma^2 / (lam + t)``, ``t = sigma^2 / s0^2``."""

    grid: torch.Tensor
    w: torch.Tensor
    lam: torch.Tensor
    vecs: torch.Tensor
    a: torch.Tensor
    b: torch.Tensor
    s0: float

    def conditional(self, g: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor]:
        """Rotated conditional means and variances of the coefficients at ``g`` (G,): (G, d) each."""
        s2 = torch.exp(2 * g)[:, None]
        t = s2 / self.s0**2
        return (self.a + t * self.b) / (self.lam + t), s2 / (self.lam + t)

    def moments(self) -> tuple[torch.Tensor, torch.Tensor]:
        """Mean (d+1,) and covariance of ``(beta, log sigma)``."""
        w, grid, vecs = self.w, self.grid, self.vecs
        m_rot, v_rot = self.conditional(grid)
        e_m = (w[:, None] * m_rot).sum(0)
        e_g = float((w * grid).sum())
        cov_rot = torch.diag((w[:, None] * v_rot).sum(0)) + (w[:, None, None] * m_rot[:, :, None] * m_rot[:, None, :]).sum(0)
        cov_rot = cov_rot - e_m[:, None] * e_m[None, :]
        cross_rot = (w[:, None] * m_rot * (grid - e_g)[:, None]).sum(0)
        var_g = float((w * (grid - e_g) ** 2).sum())
        d = self.lam.shape[0]
        mean = torch.cat([vecs @ e_m, torch.tensor([e_g], dtype=DTYPE)])
        cov = torch.zeros(d + 1, d + 1, dtype=DTYPE)
        cov[:d, :d] = vecs @ cov_rot @ vecs.T
        cov[:d, d] = cov[d, :d] = vecs @ cross_rot
        cov[d, d] = var_g
        return mean, 0.5 * (cov + cov.T)

    def sample(self, num: int, generator: torch.Generator) -> torch.Tensor:
        """``num`` independent draws of ``(beta, log sigma)``: a grid cell by its weight, ``g``
        uniform within it (the cell is 1/33 of a posterior sd wide), the coefficients given ``g``."""
        idx = torch.multinomial(self.w, num, replacement=True, generator=generator)
        step = float(self.grid[1] - self.grid[0])
        g = self.grid[idx] + (torch.rand(num, generator=generator, dtype=DTYPE) - 0.5) * step
        m_rot, v_rot = self.conditional(g)
        eps = torch.randn(m_rot.shape, generator=generator, dtype=DTYPE)
        beta = (m_rot + torch.sqrt(v_rot) * eps) @ self.vecs.T
        return torch.cat([beta, g[:, None]], 1)


def suffstat_grid(stats: SuffStats, prior_mean: torch.Tensor, prior_scale: float) -> SigmaGrid:
    """The exact posterior of ``(beta, log_sigma)`` given weighted sufficient statistics, prior
    ``N(prior_mean, prior_scale^2 I)``, on a grid over ``g = log sigma`` (a zoomed search for the
    mode over :data:`LOG_SIGMA_RANGE`, then :data:`GRID_POINTS` points over
    +-:data:`GRID_HALF_WIDTH_SD` sds). Deterministic; total for any finite statistics (a non-PSD
    ``xx`` has its eigenvalues floored at 0)."""
    xx = 0.5 * (stats.xx + stats.xx.T).to(DTYPE)
    lam, vecs = torch.linalg.eigh(xx)
    lam = torch.clamp(lam, min=0.0)
    mu_b = prior_mean[:-1].to(DTYPE)
    mu_ls = float(prior_mean[-1])
    a, b = vecs.T @ stats.xy.to(DTYPE), vecs.T @ mu_b
    s0 = float(prior_scale)

    def logp(g: torch.Tensor) -> torch.Tensor:
        return _log_marginal(g, lam, a, b, stats, s0, mu_ls)

    lo, hi = LOG_SIGMA_RANGE
    for _ in range(5):  # zoom in on the mode
        grid = torch.linspace(lo, hi, 401, dtype=DTYPE)
        k = int(torch.argmax(logp(grid)))
        step = float(grid[1] - grid[0])
        lo, hi = float(grid[max(k - 2, 0)]), float(grid[min(k + 2, 400)])
        if step < 1e-6:
            break
    mode = float(grid[k])
    h = 1e-3
    f = logp(torch.tensor([mode - h, mode, mode + h], dtype=DTYPE))
    curv = -float(f[0] - 2 * f[1] + f[2]) / h**2
    sd = 1.0 / math.sqrt(curv) if curv > 0 and math.isfinite(curv) else 1.0
    grid = torch.linspace(mode - GRID_HALF_WIDTH_SD * sd, mode + GRID_HALF_WIDTH_SD * sd, GRID_POINTS, dtype=DTYPE)
    lp = logp(grid)
    w = torch.softmax(torch.where(torch.isfinite(lp), lp, torch.full_like(lp, -math.inf)), 0)
    return SigmaGrid(grid, w, lam, vecs, a, b, s0)


def suffstat_posterior(stats: SuffStats, prior_mean: torch.Tensor, prior_scale: float) -> tuple[torch.Tensor, torch.Tensor]:
    """Exact mean (d+1,) and covariance of the posterior of ``(beta, log_sigma)`` given weighted
    sufficient statistics (:func:`suffstat_grid`'s grid-weighted mixture moments)."""
    return suffstat_grid(stats, prior_mean, prior_scale).moments()


def _psd_cholesky(cov: torch.Tensor) -> torch.Tensor:
    """Cholesky factor of a mixture covariance whose cancellation (a very narrow or a degenerate
    grid) left it a hair from PD: eigenvalues floored at 1e-12 of the largest."""
    cov = 0.5 * (cov + cov.T)
    chol, info = torch.linalg.cholesky_ex(cov)
    if int(info) == 0:
        return chol
    lam, vec = torch.linalg.eigh(cov)
    floor = 1e-12 * max(float(lam.abs().max()), 1e-300)
    return torch.linalg.cholesky((vec * torch.clamp(lam, min=floor)) @ vec.T)


class LinearRegression(Model):
    name: ClassVar[str] = "linear"
    conjugate: ClassVar[bool] = False
    exact_moments: ClassVar[bool] = True
    has_target: ClassVar[bool] = True

    def __init__(
        self,
        num_features: int,
        *,
        prior_scale: float = 1.0,
        noise_scale: float | None = None,
        intercept: bool = True,
        prior_mean: list[float] | None = None,
    ):
        super().__init__(num_features, prior_scale=prior_scale, prior_mean=prior_mean)
        if noise_scale is not None and not noise_scale > 0:
            raise ValueError("noise_scale must be positive (or None: sigma estimated)")
        self.noise_scale = None if noise_scale is None else float(noise_scale)
        self.intercept = bool(intercept)

    @property
    def estimates_sigma(self) -> bool:
        """True when log sigma is the last parameter (the default since issue 51)."""
        return self.noise_scale is None

    @property
    def num_coefficients(self) -> int:
        """Coefficients in theta (intercept included), i.e. the design's columns."""
        return self.num_features + int(self.intercept)

    @property
    def param_dim(self) -> int:
        return self.num_coefficients + int(self.estimates_sigma)

    def param_names(self, feature_names=None):
        names = super().param_names(feature_names)
        return (["intercept"] if self.intercept else []) + names + (["log_sigma"] if self.estimates_sigma else [])

    @property
    def prior_mean(self) -> torch.Tensor:
        if self._prior_centre is None and self.estimates_sigma:
            out = torch.zeros(self.param_dim, dtype=DTYPE)
            out[-1] = LOG_SIGMA_CENTRE
            return out
        return super().prior_mean

    def design(self, points: torch.Tensor) -> torch.Tensor:
        x = points[:, : self.num_features]
        if self.intercept:
            x = torch.cat([torch.ones(x.shape[0], 1, dtype=x.dtype), x], 1)
        return x

    def split(self, theta: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor]:
        """``(coefficients (S, p), log sigma (S, 1))`` of draws ``theta`` (S, d)."""
        k = self.num_coefficients
        if self.estimates_sigma:
            return theta[:, :k], theta[:, k:k + 1]
        assert self.noise_scale is not None
        return theta, torch.full((theta.shape[0], 1), math.log(self.noise_scale), dtype=theta.dtype)

    def log_likelihood(self, points, theta):
        beta, log_s = self.split(theta)
        eta = self.design(points) @ beta.T
        resid = (points[:, -1:] - eta) * torch.exp(-log_s.T)
        return -0.5 * resid**2 - log_s.T - 0.5 * math.log(2 * math.pi)

    def record_scores(self, points, theta):
        beta, log_s = self.split(theta.detach()[None])
        z = self.design(points)
        s2 = torch.exp(2 * log_s[0, 0])
        resid = points[:, -1] - z @ beta[0]
        out = (resid / s2)[:, None] * z
        if self.estimates_sigma:  # d/d log sigma of -0.5 r^2/sigma^2 - log sigma
            out = torch.cat([out, (resid * resid / s2 - 1.0)[:, None]], 1)
        return out

    def record_curvatures(self, points, theta):
        beta, log_s = self.split(theta.detach()[None])
        z = self.design(points)
        s2 = torch.exp(2 * log_s[0, 0])
        zz = z[:, :, None] * z[:, None, :] / s2
        if not self.estimates_sigma:
            return zz
        resid = points[:, -1] - z @ beta[0]
        n, p = z.shape
        out = torch.zeros(n, p + 1, p + 1, dtype=DTYPE)
        out[:, :p, :p] = zz
        out[:, :p, p] = out[:, p, :p] = 2.0 * (resid / s2)[:, None] * z
        out[:, p, p] = 2.0 * resid * resid / s2
        return out

    def record_curvature_factors(self, points, theta):
        if self.estimates_sigma:
            return None  # the curvature in log sigma is not rank one
        assert self.noise_scale is not None
        z = self.design(points)
        return torch.full((z.shape[0],), 1.0 / self.noise_scale**2, dtype=DTYPE), z

    def statistic_bounds(self, theta, *, feature_norm, target_bound):
        if self.estimates_sigma:
            raise NotImplementedError("linear regression with sigma estimated releases its moment matrix "
                                      "(dpsummary.private.moments), not scores")
        assert self.noise_scale is not None
        # |y - z.theta| <= |y| + ||z|| ||theta||; theta is public (the mechanism's anchor).
        r = math.sqrt(feature_norm**2 + (1.0 if self.intercept else 0.0))
        resid = float(target_bound) + r * float(theta.norm())
        return r * resid / self.noise_scale**2, r * r / self.noise_scale**2

    def simulate(self, theta, num, generator, features=None):
        if features is None:
            features = torch.randn(num, self.num_features, generator=generator, dtype=DTYPE)
        beta, log_s = self.split(theta[None])
        eta = self.design(torch.cat([features, torch.zeros(num, 1, dtype=DTYPE)], 1)) @ beta[0]
        y = eta + torch.exp(log_s[0, 0]) * torch.randn(num, generator=generator, dtype=DTYPE)
        return torch.cat([features, y[:, None]], 1)

    def suffstats(self, points: torch.Tensor, weights: torch.Tensor) -> SuffStats:
        """The weighted sufficient statistics of ``points``."""
        x = self.design(points)
        y = points[:, -1]
        return SuffStats(float(weights.sum()), (x.T * weights) @ x, x.T @ (weights * y), float((weights * y * y).sum()))

    def exact_posterior(self, points, weights):
        """The exact weighted posterior's moments as a Gaussian (:func:`suffstat_posterior`); with
        a known noise scale, the exact (Gaussian) posterior."""
        from ..gaussian import GaussianPosterior

        stats = self.suffstats(points.detach().to(DTYPE), weights.detach().to(DTYPE))
        if self.estimates_sigma:
            mean, cov = suffstat_posterior(stats, self.prior_mean, self.prior_scale)
            return GaussianPosterior(mean=mean, scale_tril=_psd_cholesky(cov))
        assert self.noise_scale is not None
        d = self.param_dim
        precision = torch.eye(d, dtype=DTYPE) / self.prior_scale**2 + stats.xx / self.noise_scale**2
        rhs = self.prior_mean / self.prior_scale**2 + stats.xy / self.noise_scale**2
        return GaussianPosterior.from_precision(precision, rhs)

    def exact_draws(self, points: torch.Tensor, weights: torch.Tensor, num: int, generator: torch.Generator
                    ) -> torch.Tensor:
        """``num`` independent draws of the exact weighted posterior (sigma estimated:
        :meth:`SigmaGrid.sample`; known noise: the Gaussian posterior)."""
        if not self.estimates_sigma:
            return self.exact_posterior(points, weights).sample(num, generator)
        stats = self.suffstats(points.detach().to(DTYPE), weights.detach().to(DTYPE))
        return suffstat_grid(stats, self.prior_mean, self.prior_scale).sample(num, generator)

    def spec(self) -> dict[str, Any]:
        out = {**super().spec(), "noise_scale": self.noise_scale, "intercept": self.intercept}
        if self.estimates_sigma:
            # The default centre is written out: every reader (inspect, exporters) sees log sigma's prior.
            out["prior_mean"] = [float(v) for v in self.prior_mean]
        return out
