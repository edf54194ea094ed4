"""The noise-aware posterior of ``noise-aware-cells`` (post-processing of its two DP outputs).

Kulkarni, Jaelkoe, Koskela, Kaski and Honkela (2021) release a GLM's sufficient statistics once
and integrate their noise with a model of the features (``../shared/notes/noise-aware-glm.md``).
Here the features' model is the histogram itself: over the public domain's cells with counts
``n_c`` and design rows ``z_c``, ``T = sum_c z_c k_c`` with ``k_c`` the sum of the targets of the
cell's records, so by the CLT

    ``T | theta, n ~ N(mu(theta, n), H(theta, n))``, ``mu = sum_c n_c m(eta_c) z_c``,
    ``H = sum_c n_c v(eta_c) z_c z_c^T``, ``eta_c = z_c theta``,

with ``m`` and ``v`` the target's mean and variance given the linear predictor (canonical link:
``m = -d/d eta log p(0 | eta)``, ``v = -d^2/d eta^2 log p(0 | eta)``; for logistic regression
``p`` and ``p (1 - p)``), and ``H`` the data's Fisher information. The released
``T_hat = T + N(0, s_T^2 I)``, so ``T_hat | theta, n ~ N(mu, H + s_T^2 I)``.

The counts are latent: :data:`IMPUTATIONS` draws of ``n`` from their flat-prior posterior given
the release, ``n_hat + N(0, s_n^2 I)`` (negative draws are kept: only ``mu`` and ``H`` read them,
and clamping would bias both), and for each the MAP of ``N(T_hat | mu, V) x prior`` by
Gauss-Newton with ``V = H + s_T^2 I`` frozen per step, with its Laplace precision
``H V^-1 H + P`` (``P`` the prior's precision); the released Gaussian is their moment-matched
mixture. Without noise (``s_n = s_T = 0``) every draw is the same and the MAP and precision are
the full-data posterior's mode and Laplace precision (``H V^-1 H = H``; the score equations
``T = mu(theta) + P (theta - mu0)``), up to the CLT's Gaussian form of T. No anchors, no rounds,
no curvature release, and no expansion error: ``mu(theta)`` is exact for every theta up to the
counts' noise.

A Poisson release clips each record's count at ``B`` (the count histogram's bound, public), so
``m`` and ``v`` are the clipped count's, ``min(Y, B)``, and the Gauss-Newton Jacobian of ``mu`` is
``J = sum_c n_c m'(eta_c) z_c z_c^T`` (``H`` without a clip; issue 50's thirty-third rule,
:func:`clipped_poisson_moments`). Exact under the Poisson model; on an overdispersed count the
clipped tail is read through the Poisson's shape.

Randomness: the imputations draw from the caller's NON-private generator (``--seed``), so a
release is reproducible given the DP outputs and the seed. Non-finite results raise
:class:`~dpsummary.noise_aware.NonFiniteFit` (decided on DP outputs only; the release turns it
into a charged refusal).
"""

from __future__ import annotations

import math

import torch

from ..gaussian import DTYPE, GaussianPosterior
from ..models import Model
from ..noise_aware.posterior import prior_precision
from ..noise_aware.released import NonFiniteFit, _checked

#: Imputations of the latent counts (the prototype's 50: benchmarks/notebook/feature_cells.md).
IMPUTATIONS = 50
#: Gauss-Newton steps per imputation at most (converged when the largest step is below 1e-9).
ITERATIONS = 30
#: The counts' share of the one Gaussian mechanism's budget (multiplier ``sigma / sqrt(f)`` for
#: the counts, ``sigma / sqrt(1 - f)`` for T). 0.3 was first measured on the NAPSU-MQ problem (a
#: real table; 0.3 against 0.5 there), then kept by a rule written before its run on the two
#: small-domain simulations: neither 0.15 nor 0.5 narrowed them (benchmarks/notebook/
#: feature_cells.md, "The counts' share ... applied"; results/cells_share_sweep.csv).
COUNT_SHARE = 0.3


def target_moments(model: Model, eta: torch.Tensor, target_bound: float | None = None
                   ) -> tuple[torch.Tensor, torch.Tensor, torch.Tensor]:
    """The released target's mean, the mean's derivative in ``eta`` and its variance, given the
    linear predictor. For a canonical-link GLM ``(-d1, -d2, -d2)`` of the log-likelihood at
    ``y = 0`` (logistic: ``p``, ``p (1 - p)``, ``p (1 - p)``). For Poisson regression with the
    count clipped at ``target_bound`` (the mechanism's ``min(y, B)``), the clipped count's
    moments (:func:`clipped_poisson_moments`; issue 50's thirty-third rule)."""
    from ..models.glm import PoissonRegression

    if target_bound is not None and isinstance(model, PoissonRegression):
        return clipped_poisson_moments(eta, target_bound)
    d1, d2 = model.eta_derivatives(torch.zeros_like(eta), eta)  # type: ignore[attr-defined]
    return -d1, -d2, -d2


def clipped_poisson_moments(eta: torch.Tensor, bound: float) -> tuple[torch.Tensor, torch.Tensor, torch.Tensor]:
    """Mean, ``d mean / d eta`` and variance of ``min(Y, bound)`` for ``Y ~ Poisson(exp(eta))``,
    elementwise. With ``K = floor(bound)``, ``F(j) = P(Y <= j)`` (the regularised upper incomplete
    gamma ``Q(j + 1, mu)``, 0 for ``j < 0``) and ``p`` the pmf:
    ``E min(Y, B) = mu F(K - 1) + B (1 - F(K))`` (``E Y 1{Y <= K} = mu F(K - 1)``),
    ``d/d eta = mu (F(K - 1) + (B - K) p(K))`` (``d/d mu P(Y > t) = p(floor t)``) and
    ``E min(Y, B)^2 = mu^2 F(K - 2) + mu F(K - 1) + B^2 (1 - F(K))``. As ``B`` grows they tend to
    the Poisson's ``(mu, mu, mu)``."""
    if not (math.isfinite(bound) and bound >= 0):
        raise ValueError("the count's clip bound must be finite and not negative")
    k = float(math.floor(bound))
    mu = torch.exp(eta)

    def cdf(j: float) -> torch.Tensor:
        if j < 0:
            return torch.zeros_like(mu)
        return torch.special.gammaincc(torch.full_like(mu, j + 1.0), mu)

    f_k1, f_k2, f_k = cdf(k - 1.0), cdf(k - 2.0), cdf(k)
    above = 1.0 - f_k
    pmf_k = torch.exp(k * eta - mu - math.lgamma(k + 1.0))
    mean = mu * f_k1 + bound * above
    slope = mu * (f_k1 + (bound - k) * pmf_k)
    second = mu * mu * f_k2 + mu * f_k1 + bound * bound * above
    var = (second - mean * mean).clamp(min=0.0)
    return mean, slope, var


def start(model: Model, t_hat: torch.Tensor, total: float) -> torch.Tensor:
    """The Gauss-Newton start: the prior mean with the intercept at the canonical link of the
    noisy mean target ``T_0 / N`` (logit for logistic, log for Poisson), clamped into
    ``[1e-4, 1 - 1e-4]`` (logistic) or above 1e-4 (Poisson). Post-processing of DP outputs."""
    from ..models.glm import LogisticRegression, PoissonRegression

    theta = model.prior_mean.detach().to(DTYPE).clone()
    share = float(t_hat[0]) / max(total, 1.0)
    if isinstance(model, LogisticRegression) and model.intercept:
        share = min(max(share, 1e-4), 1 - 1e-4)
        theta[0] = math.log(share / (1 - share))
    elif isinstance(model, PoissonRegression) and model.intercept:
        theta[0] = math.log(max(share, 1e-4))
    return theta


def map_and_precision(model: Model, design: torch.Tensor, counts: torch.Tensor, t_hat: torch.Tensor, *,
                      statistic_noise_std: float, iterations: int = ITERATIONS,
                      target_bound: float | None = None) -> tuple[torch.Tensor, torch.Tensor]:
    """One imputation's MAP and Laplace (Gauss-Newton) precision ``J V^-1 J + P`` (module
    docstring), ``J = sum_c n_c m'(eta_c) z_c z_c^T`` the mean's Jacobian; ``J = H`` without a
    clip. ``target_bound``: the count's clip (Poisson; :func:`target_moments`)."""
    d = design.shape[1]
    prior_prec = prior_precision(model)
    mu0 = model.prior_mean.detach().to(DTYPE)
    noise_var = statistic_noise_std**2 * torch.eye(d, dtype=DTYPE)
    theta = start(model, t_hat, float(counts.sum()))

    def linearised(at: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor, torch.Tensor]:
        m, slope, v = target_moments(model, design @ at, target_bound)
        h = (design.T * (counts * v)) @ design
        jac = (design.T * (counts * slope)) @ design
        jv = torch.linalg.solve(h + noise_var, jac).T  # J V^-1 (J, V symmetric)
        prec = 0.5 * (jv @ jac + prior_prec + (jv @ jac + prior_prec).T)
        return design.T @ (counts * m), jv, prec

    for _ in range(iterations):
        mu, jv, prec = linearised(theta)
        step = torch.linalg.solve(prec, jv @ (t_hat - mu) - prior_prec @ (theta - mu0))
        if not bool(torch.isfinite(step).all()):
            raise NonFiniteFit("the cells' posterior did not converge to a finite mode")
        theta = theta + step
        if float(step.abs().max()) < 1e-9:
            break
    # The precision at the final mode.
    _, _, prec = linearised(theta)
    return theta, prec


def cells_posterior(model: Model, design: torch.Tensor, counts_hat: torch.Tensor, t_hat: torch.Tensor, *,
                    counts_noise_std: float, statistic_noise_std: float, generator: torch.Generator,
                    imputations: int = IMPUTATIONS, target_bound: float | None = None) -> GaussianPosterior:
    """The moment-matched mixture over ``imputations`` draws of the latent counts (module
    docstring). ``design``: (C, d) cell design rows; ``counts_hat`` (C,), ``t_hat`` (d,): the
    DP outputs; the noise sds are the mechanism's (public). ``target_bound``: the bound the
    mechanism clipped each record's target at (public); a Poisson posterior then models the
    clipped count (:func:`target_moments`). Raises :class:`NonFiniteFit`."""
    design = design.detach().to(DTYPE)
    counts_hat, t_hat = counts_hat.detach().to(DTYPE), t_hat.detach().to(DTYPE)
    if not (bool(torch.isfinite(counts_hat).all()) and bool(torch.isfinite(t_hat).all())):
        raise NonFiniteFit("the released cell statistics are not finite")
    means, covs = [], []
    try:
        for _ in range(max(int(imputations), 1)):
            noise = torch.randn(counts_hat.shape, generator=generator, dtype=DTYPE)
            theta, prec = map_and_precision(model, design, counts_hat + counts_noise_std * noise, t_hat,
                                            statistic_noise_std=statistic_noise_std, target_bound=target_bound)
            cov = torch.linalg.inv(prec)
            means.append(theta)
            covs.append(0.5 * (cov + cov.T))
        stacked = torch.stack(means)
        mean = stacked.mean(0)
        cov = torch.stack(covs).mean(0) + torch.cov(stacked.T, correction=0).reshape(mean.shape[0], -1)
        post = GaussianPosterior(mean, torch.linalg.cholesky(0.5 * (cov + cov.T)))
    except (RuntimeError, ValueError) as exc:  # torch.linalg.LinAlgError is a RuntimeError
        raise NonFiniteFit("the cells' posterior is numerically singular") from exc
    return _checked(post)
