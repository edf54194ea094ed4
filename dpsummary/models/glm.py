"""Generalised linear models: logistic regression and Poisson regression (log link).

A GLM writes only ``log_lik_eta(y, eta)``, the per-record log-likelihood as a function of the
linear predictor eta = [1, x] theta. Because it is elementwise in eta, the first and second
derivatives that Newton's method needs (:meth:`GLM.eta_derivatives`) come from two autograd
passes over the sum, with no hand-written formulas.

Targets are real-valued on purpose: learned pseudopoints carry soft labels in [0, 1] (logistic)
and non-integer counts >= 0 (Poisson). The formulas below are the explicit ones
(y log sigma(eta) + (1 - y) log sigma(-eta); y eta - exp(eta) - lgamma(y + 1)) that accept them.
"""

from __future__ import annotations

import math
from abc import abstractmethod
from collections.abc import Sequence
from typing import Any, ClassVar

import torch

from .base import DTYPE, Model


class GLM(Model):
    has_target: ClassVar[bool] = True

    def __init__(self, num_features: int, *, prior_scale: float = 1.0, intercept: bool = True,
                 prior_mean: Sequence[float] | None = None):
        super().__init__(num_features, prior_scale=prior_scale, prior_mean=prior_mean)
        self.intercept = bool(intercept)

    @property
    def param_dim(self) -> int:
        return self.num_features + int(self.intercept)

    def param_names(self, feature_names=None):
        names = super().param_names(feature_names)
        return (["intercept"] if self.intercept else []) + names

    def design(self, points: torch.Tensor) -> torch.Tensor:
        """The design matrix [1, x] of shape ``(n, d)``."""
        x = points[:, : self.num_features]
        if self.intercept:
            x = torch.cat([torch.ones(x.shape[0], 1, dtype=x.dtype), x], 1)
        return x

    @abstractmethod
    def log_lik_eta(self, y: torch.Tensor, eta: torch.Tensor) -> torch.Tensor:
        """Elementwise log-likelihood of target ``y`` at linear predictor ``eta``."""

    @abstractmethod
    def sample_target(self, eta: torch.Tensor, generator: torch.Generator) -> torch.Tensor:
        """Draw targets given linear predictors (for the simulator)."""

    def log_likelihood(self, points, theta):
        eta = self.design(points) @ theta.T
        return self.log_lik_eta(points[:, -1:], eta)

    def eta_derivatives(self, y: torch.Tensor, eta: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor]:
        """d/d eta and d^2/d eta^2 of the log-likelihood, elementwise, detached."""
        with torch.no_grad():
            d1, d2 = self.eta_derivatives_graph(y.detach(), eta.detach())
        return d1.detach(), d2.detach()

    def eta_derivatives_graph(self, y: torch.Tensor, eta: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor]:
        """The same derivatives, differentiable in ``y`` and ``eta`` (for pseudopoint fits).

        Default: two autograd passes over :meth:`log_lik_eta` (no hand-written formula needed).
        Subclasses may override with closed forms for speed; tests/test_models.py checks every
        override against this autograd path."""
        return self.autograd_eta_derivatives(y, eta)

    def autograd_eta_derivatives(self, y: torch.Tensor, eta: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor]:
        """d/d eta and d^2/d eta^2 through autograd, keeping the graph of ``y`` and ``eta``."""
        with torch.enable_grad():
            e = eta if eta.requires_grad else eta.detach().requires_grad_(True)
            (d1,) = torch.autograd.grad(self.log_lik_eta(y, e).sum(), e, create_graph=True)
            (d2,) = torch.autograd.grad(d1.sum(), e, create_graph=True)
        return d1, d2

    def record_scores(self, points, theta):
        z = self.design(points)
        d1, _ = self.eta_derivatives(points[:, -1], z @ theta.detach())
        return d1[:, None] * z

    def record_curvatures(self, points, theta):
        z = self.design(points)
        _, d2 = self.eta_derivatives(points[:, -1], z @ theta.detach())
        return (-d2)[:, None, None] * z[:, :, None] * z[:, None, :]

    def record_curvature_factors(self, points, theta):
        z = self.design(points)
        _, d2 = self.eta_derivatives(points[:, -1], z @ theta.detach())
        return -d2, z

    def design_norm_bound(self, feature_norm: float) -> float:
        """Bound on ||[1, x]|| for ||x|| <= feature_norm."""
        return math.sqrt(feature_norm**2 + (1.0 if self.intercept else 0.0))

    @staticmethod
    def rank_one_upper_bound(design_norm: float) -> float:
        """Bound on the L2 norm of the upper triangle (diagonal included) of ``z z^T`` for a
        design row with ``||z|| <= design_norm`` and every coordinate in [-1, 1] (the public
        transform's model space: numerics scaled into [-1, 1], one-hot 0/1, the intercept 1).
        That norm is ``sqrt((|z|^4 + sum_k z_k^4) / 2)`` and ``sum_k z_k^4 <= min(|z|^2, |z|^4)``,
        so it is at most ``sqrt((r^4 + min(r^2, r^4)) / 2)``: between ``r^2 / sqrt(2)`` and the
        Frobenius norm ``r^2`` (issue 37: the curvature mechanism releases the upper triangle, so
        its sensitivity is this, not the Frobenius norm; 0.76x it for 6 features, 0.72x for 19).
        A row outside the unit box is clipped by the kernel like any other (privacy holds)."""
        r2 = design_norm * design_norm
        return math.sqrt(0.5 * (r2 * r2 + min(r2, r2 * r2)))

    def simulate(self, theta, num, generator, features=None):
        if features is None:
            features = torch.randn(num, self.num_features, generator=generator, dtype=DTYPE)
        eta = self.design(features) @ theta
        y = self.sample_target(eta, generator)
        return torch.cat([features, y[:, None].to(DTYPE)], 1)

    def spec(self) -> dict[str, Any]:
        return {**super().spec(), "intercept": self.intercept}


class LogisticRegression(GLM):
    name: ClassVar[str] = "logistic"

    def log_lik_eta(self, y, eta):
        # y log s(eta) + (1 - y) log s(-eta), using log s(-eta) = log s(eta) - eta (one transcendental).
        log_s = torch.nn.functional.logsigmoid(eta)
        return log_s - (1 - y) * eta

    def eta_derivatives_graph(self, y, eta):
        # Closed form of the autograd default (issue 15: the Laplace and Newton steps call this
        # every optimisation step): d/d eta = y - s(eta), d^2/d eta^2 = -s(eta) s(-eta).
        s = torch.sigmoid(eta)
        return y - s, -s * torch.sigmoid(-eta)

    def sample_target(self, eta, generator):
        return (torch.rand(eta.shape, generator=generator, dtype=DTYPE) < torch.sigmoid(eta)).to(DTYPE)

    def statistic_bounds(self, theta, *, feature_norm, target_bound):
        # Score (y - s(eta)) z with y in [0, 1]: |y - s| <= 1; curvature s(1 - s) z z^T <= z z^T / 4,
        # whose released upper triangle has norm at most rank_one_upper_bound(r) / 4.
        r = self.design_norm_bound(feature_norm)
        return r, self.rank_one_upper_bound(r) / 4.0

    def project_points(self, points):
        # Soft labels stay probabilities.
        points[:, -1].clamp_(0.0, 1.0)
        return points


class PoissonRegression(GLM):
    name: ClassVar[str] = "poisson"

    #: Linear predictors are clipped here only when *simulating* so synthetic counts stay finite.
    SIMULATION_ETA_MAX: ClassVar[float] = 8.0
    #: Public cap on the curvature weight's linear predictor above the anchor's intercept
    #: (statistic_bounds; benchmarks/poisson.py ``tune``, simulated tables only).
    CURVATURE_ETA_MARGIN: ClassVar[float] = 1.5

    def log_lik_eta(self, y, eta):
        return y * eta - torch.exp(eta) - torch.lgamma(y + 1)

    def eta_derivatives_graph(self, y, eta):
        # Closed form of the autograd default: d/d eta = y - exp(eta), d^2/d eta^2 = -exp(eta).
        rate = torch.exp(eta)
        return y - rate, -rate

    def sample_target(self, eta, generator):
        rate = torch.exp(eta.clamp(max=self.SIMULATION_ETA_MAX))
        return torch.poisson(rate, generator=generator)

    def linear_predictor_bound(self, theta: torch.Tensor, *, feature_norm: float, target_bound: float) -> float:
        """Public upper bound ``eta_max`` on the linear predictor at ``theta`` (issue 25).

        For every record of the public feature box (``||x|| <= feature_norm``) Cauchy-Schwarz
        gives ``eta = theta_0 + x . theta_x <= theta_0 + feature_norm ||theta_x||``; the bound is
        that, capped at ``log(max(target_bound, 1))`` (a rate above the public count bound fits
        no possible count). A function of public values only (``theta`` is the prior mean or an
        earlier DP output), so the curvature weight ``exp(eta)`` has the public bound
        ``exp(eta_max)``: with it, the curvature bound follows the anchor's rates instead of
        the count bound (at the prior mean it is ``r^2``, not ``r^2`` times the count bound)."""
        theta = theta.detach().to(DTYPE)
        slopes = theta[1:] if self.intercept else theta
        base = float(theta[0]) if self.intercept else 0.0
        cap = math.log(max(float(target_bound), 1.0))
        eta_max = base + float(feature_norm) * float(torch.linalg.vector_norm(slopes))
        return min(eta_max, cap) if math.isfinite(eta_max) else cap

    def statistic_bounds(self, theta, *, feature_norm, target_bound):
        # Score (y - exp(eta)) z and curvature exp(eta) z z^T: with counts in [0, B] (the count
        # column's public upper bound) and eta <= eta_max (linear_predictor_bound, public), the
        # residual lies in [-exp(eta_max), B] and the curvature weight in (0, exp(eta_max)]. The
        # kernel clips every record to these norms (a record outside the public box, or whose
        # rate exceeds the cap, has its curvature weight clipped: clipping the released upper
        # triangle of the rank-one c_i z_i z_i^T scales c_i), so the sensitivities hold for
        # every record.
        # The curvature weight is further capped at exp(theta_0 + CURVATURE_ETA_MARGIN) (public):
        # records whose rate at the anchor exceeds it have their curvature weight clipped, which
        # only lowers the released curvature (wider intervals), while the score stays unclipped.
        r = self.design_norm_bound(feature_norm)
        eta_max = self.linear_predictor_bound(theta, feature_norm=feature_norm, target_bound=target_bound)
        curvature_eta = eta_max
        if self.intercept:
            curvature_eta = min(eta_max, float(theta[0]) + self.CURVATURE_ETA_MARGIN)
        return r * max(float(target_bound), 1.0, math.exp(eta_max)), self.rank_one_upper_bound(r) * math.exp(curvature_eta)

    def project_points(self, points):
        points[:, -1].clamp_(min=0.0)
        return points

    def censored(self, bound: float) -> CensoredPoissonRegression:
        """The same model with counts of ``max(floor(bound), 1)`` or more censored
        (:class:`CensoredPoissonRegression`): the statistic model of rounds that clip the count at
        the public ``bound`` (issue 50's thirty-second rule)."""
        return CensoredPoissonRegression(self.num_features, censor_at=bound, prior_scale=self.prior_scale,
                                         intercept=self.intercept, prior_mean=self._prior_centre)


#: Terms of the series for ``P(Y >= K) / P(Y = K)`` (see :func:`_tail_ratio`); its tail beyond
#: them is bounded geometrically.
_SERIES_TERMS = 400
#: The series is used where ``mu / (K + 1)`` is below this (60 terms already reach 1e-18 there)
#: or where the incomplete gamma underflows.
_SERIES_RATIO = 0.5
_TINY_TAIL = 1e-280


def _tail_ratio(eta: torch.Tensor, k: float) -> tuple[torch.Tensor, torch.Tensor]:
    """``(log R, R - 1)`` with ``R = P(Y >= k) / P(Y = k)`` for ``Y ~ Poisson(exp(eta))``,
    elementwise and finite for every finite ``eta``. Where ``mu / (k + 1)`` is small or the
    incomplete gamma underflows, ``R - 1`` is the series ``sum_{m >= 1} prod_{j <= m} mu / (k + j)``
    (so ``R - 1`` keeps its relative precision as ``mu -> 0``, which the curvature needs); else
    ``P(Y >= k) = gammainc(k, mu)``, the regularised lower incomplete gamma."""
    mu = torch.exp(eta)
    log_pk = k * eta - mu - math.lgamma(k + 1.0)
    tail = torch.special.gammainc(torch.full_like(mu, k), mu)
    log_r = torch.log(tail.clamp(min=_TINY_TAIL)) - log_pk
    excess = torch.expm1(log_r)
    use = (tail < _TINY_TAIL) | (mu < _SERIES_RATIO * (k + 1.0))
    if bool(use.any()):
        m = mu[use]
        steps = torch.arange(1, _SERIES_TERMS + 1, dtype=m.dtype)
        ratios = m[:, None] / (k + steps[None, :])
        terms = torch.cumprod(ratios, dim=1)
        last, q = terms[:, -1], ratios[:, -1]
        series = terms.sum(1) + torch.where(q < 1.0, last * q / (1.0 - q).clamp(min=1e-12), torch.zeros_like(q))
        log_r, excess = log_r.clone(), excess.clone()
        log_r[use], excess[use] = torch.log1p(series), series
    return log_r, excess


class CensoredPoissonRegression(PoissonRegression):
    """Poisson regression whose counts at or above ``K = max(floor(censor_at), 1)`` are censored:
    such a record's log-likelihood is ``log P(Y >= K)``, the exact likelihood of ``min(Y, K)``.

    Used only as the statistic model of the noise-aware rounds when the count is clipped at a
    public bound (issue 50's thirty-second rule, benchmarks/notebook/noise_aware_variants.md): the
    rounds then release the score and curvature of the data they actually use, instead of
    clipping a large count's score under a mean model (``exp(eta)``) that ignores the clip. Never
    released: its :meth:`spec` names no registered model, so :func:`~dpsummary.models.from_spec`
    refuses it. With ``h = K P(Y = K) / P(Y >= K)``, a censored record's score weight is ``h``
    (in ``(0, K]``) and its curvature weight ``h (h + mu - K)`` (in ``[0, mu]``), so the
    statistic bounds of :class:`PoissonRegression` hold unchanged."""

    name: ClassVar[str] = "poisson-censored"

    def __init__(self, num_features: int, *, censor_at: float, prior_scale: float = 1.0, intercept: bool = True,
                 prior_mean: Sequence[float] | None = None):
        super().__init__(num_features, prior_scale=prior_scale, intercept=intercept, prior_mean=prior_mean)
        # A clip bound below 1 (the count histogram's bin of 0) still censors at K = 1: the
        # score bound max(B, 1, ...) of PoissonRegression.statistic_bounds covers h <= 1.
        if not (math.isfinite(censor_at) and censor_at >= 0):
            raise ValueError("censor_at must be finite and not negative")
        self.censor_at = float(censor_at)
        self.censor_count = float(max(math.floor(censor_at), 1))

    def log_lik_eta(self, y, eta):
        k = self.censor_count
        censored = y >= k
        out = super().log_lik_eta(torch.clamp(y, max=k), eta)
        if bool(censored.any()):
            e = eta.expand_as(out)[censored.expand_as(out)]
            log_r, _ = _tail_ratio(e, k)
            out = out.masked_scatter(censored.expand_as(out), k * e - torch.exp(e) - math.lgamma(k + 1.0) + log_r)
        return out

    def eta_derivatives_graph(self, y, eta):
        k = self.censor_count
        rate = torch.exp(eta)
        d1, d2 = y - rate, -rate
        censored = (y >= k).expand_as(d1)
        if not bool(censored.any()):
            return d1, d2
        e, mu = eta.expand_as(d1)[censored], rate.expand_as(d1)[censored]
        log_r, excess = _tail_ratio(e, k)
        h = (k * torch.exp(-log_r)).clamp(min=0.0, max=k)
        # h + mu - k = mu - k (R - 1) / R: no cancellation as mu -> 0 (R - 1 ~ mu / (k + 1)).
        curvature = h * (mu - k * excess * torch.exp(-log_r))
        curvature = torch.where(torch.isfinite(curvature), torch.minimum(curvature.clamp(min=0.0), mu),
                                torch.zeros_like(curvature))
        return d1.masked_scatter(censored, h), d2.masked_scatter(censored, -curvature)

    def spec(self) -> dict[str, Any]:
        return {**super().spec(), "censor_at": self.censor_at}
