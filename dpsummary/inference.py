"""Posterior inference on a weighted (pseudo)coreset.

Called once per optimisation step by every constructor, so it is built for speed:

* conjugate models (Gaussian mean, linear regression): the exact Gaussian posterior;
* GLMs: a Laplace approximation found by Newton's method, warm-started from the previous
  solution (one or two Newton steps per call once the optimiser is moving slowly), with a full
  covariance or, for large d, a diagonal one;
* anything else: Newton on the autograd Hessian of the weighted log posterior.

MCMC (NUTS, with diagnostics) to check Laplace and to serve analysts lives in :mod:`dpsummary.sampling`.
"""

from __future__ import annotations

import math

import torch

from .gaussian import GaussianPosterior, _precision_chol_to_scale_tril
from .models import DTYPE, GLM, Model

__all__ = ["GaussianPosterior", "NewtonFailure", "coreset_posterior", "laplace", "prior_posterior",
           "weighted_log_posterior"]


def weighted_log_posterior(
    model: Model, points: torch.Tensor, weights: torch.Tensor, theta: torch.Tensor
) -> torch.Tensor:
    """Unnormalised log density sum_m w_m log p(x_m | theta) + log p(theta), shape (S,)."""
    return weights @ model.log_likelihood(points, theta) + model.log_prior(theta)


class NewtonFailure(RuntimeError):
    """Newton's method did not converge (non-finite values or too many iterations)."""


def laplace(
    model: Model,
    points: torch.Tensor,
    weights: torch.Tensor,
    *,
    init: torch.Tensor | None = None,
    diagonal: bool = False,
    max_iter: int = 100,
    tol: float = 1e-7,
    strict: bool = True,
) -> GaussianPosterior:
    """Laplace approximation of the weighted posterior by damped Newton's method.

    ``init`` warm-starts Newton (pass the previous mode; inside an optimiser the mode moves a
    little per step, so one or two iterations suffice). Log-concave models (all GLMs here) have
    a unique mode; a backtracking line search keeps Poisson's exp(eta) from overshooting.
    ``diagonal=True`` returns the diagonal of the inverse Hessian's Gaussian (mean-field Laplace).
    ``strict=False`` returns the Gaussian at the last iterate after ``max_iter`` iterations instead
    of raising (inside an optimiser, warm-started, two Newton steps from a nearby mode already
    agree with the exact mode to far below the posterior's scale).
    """
    theta = model.prior_mean.clone() if init is None else init.detach().clone()
    points = points.detach()
    weights = weights.detach()
    prior_prec = 1.0 / model.prior_scale**2
    d = model.param_dim
    eye = torch.eye(d, dtype=DTYPE)

    def logpost(th: torch.Tensor) -> torch.Tensor:
        return weighted_log_posterior(model, points, weights, th[None, :])[0]

    if isinstance(model, GLM):
        x = model.design(points)
        y = points[:, -1]

        def grad_hess(th: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor, torch.Tensor]:
            eta = x @ th
            d1, d2 = model.eta_derivatives(y, eta)
            value = weights @ model.log_lik_eta(y, eta) - 0.5 * prior_prec * ((th - model.prior_mean) ** 2).sum()
            grad = x.T @ (weights * d1) - prior_prec * (th - model.prior_mean)
            neg_hess = (x.T * (weights * (-d2))) @ x + prior_prec * eye
            return value, grad, neg_hess

    else:

        def grad_hess(th: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor, torch.Tensor]:
            th = th.detach().requires_grad_(True)
            with torch.enable_grad():
                value = logpost(th)
                grad = torch.autograd.grad(value, th)[0]
            hess = torch.autograd.functional.hessian(logpost, th.detach())
            return value.detach(), grad.detach(), -hess

    value, grad, neg_hess = grad_hess(theta)
    for _ in range(max_iter):
        chol = torch.linalg.cholesky_ex(neg_hess)
        if chol.info != 0:
            raise NewtonFailure("negative Hessian is not positive definite")
        step = torch.cholesky_solve(grad[:, None], chol.L)[:, 0]
        decrement = float(grad @ step)  # Newton decrement squared
        if not math.isfinite(decrement):
            raise NewtonFailure("non-finite Newton step")
        if decrement / 2 <= tol:
            break
        t = 1.0
        converged = False
        while True:
            cand = theta + t * step
            cvalue, cgrad, cneg_hess = grad_hess(cand)
            if torch.isfinite(cvalue) and cvalue >= value + 0.25 * t * decrement:
                break
            t *= 0.5
            if t < 1e-10:
                # With large weights the log density is large and its rounding error can exceed
                # a tiny remaining Newton decrement: that is convergence to working precision.
                if decrement / 2 <= 1e-9 * max(1.0, abs(float(value))):
                    converged = True
                    break
                raise NewtonFailure("line search failed")
        if converged:
            break
        theta, value, grad, neg_hess = cand, cvalue, cgrad, cneg_hess
    else:
        if strict:
            raise NewtonFailure(f"Newton did not converge in {max_iter} iterations")

    chol = torch.linalg.cholesky(neg_hess)
    if diagonal:
        var = torch.diagonal(torch.cholesky_inverse(chol))
        return GaussianPosterior(mean=theta, scale_tril=torch.diag(torch.sqrt(var)))
    return GaussianPosterior(mean=theta, scale_tril=_precision_chol_to_scale_tril(chol))


#: Newton steps per call when warm-started from the previous optimisation step's mode.
WARM_NEWTON_STEPS = 2


def coreset_posterior(
    model: Model,
    points: torch.Tensor,
    weights: torch.Tensor,
    *,
    warm_start: GaussianPosterior | None = None,
    diagonal: bool = False,
) -> GaussianPosterior:
    """The posterior (exact or Laplace) given weighted points; the workhorse of every constructor."""
    if model.conjugate or model.exact_moments:
        return model.exact_posterior(points.detach(), weights.detach())
    if warm_start is None:
        return laplace(model, points, weights, diagonal=diagonal)
    return laplace(model, points, weights, init=warm_start.mean, diagonal=diagonal,
                   max_iter=WARM_NEWTON_STEPS, strict=False)


def prior_posterior(model: Model) -> GaussianPosterior:
    """The prior as a GaussianPosterior (the empty coreset's posterior)."""
    d = model.param_dim
    return GaussianPosterior(mean=model.prior_mean, scale_tril=model.prior_scale * torch.eye(d, dtype=DTYPE))
