"""Log densities of weighted (pseudocoreset) posteriors in JAX, for the NUTS sampler.

The weighted posterior of a release is ``prior(theta) prod_m p(u_m | theta)^{w_m}``
(:func:`dpsummary.inference.weighted_log_posterior`, the torch definition every other part of
the package uses). NUTS needs it as a JAX function, compiled once per shape:

* **GLMs with a closed-form likelihood** (logistic, Poisson, linear; linear regression's
  ``log_sigma``, the last coordinate of theta, is family ``"linear_sigma"``): the design matrix is built
  by the model in torch (:meth:`GLM.design`, the one definition of it) and only the elementwise
  log-likelihood in the linear predictor is written here, one line per family, as the exporters
  write it (explicit formulas that accept soft labels and non-integer counts). The whole program
  is JAX, so it is jit-compiled with the data as arguments and reused across releases of the
  same shape.
* **Every other model** (a BNN, a future model): the torch log density and its autograd gradient
  are called from JAX through ``jax.pure_callback`` (slower: one host call per gradient, no
  compilation of the density), so no model needs a second implementation to be sampled.

``tests/sampling/test_densities.py`` checks both routes against the torch log density for every
model the registry knows, to 1e-9.
"""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass
from typing import Any

import numpy as np
import torch

from ..inference import weighted_log_posterior
from ..models import DTYPE, GLM, Model
from ..models.linear import LinearRegression

#: GLM families with a JAX log-likelihood (model.name -> family key of :func:`glm_log_lik`).
JAX_FAMILIES = ("logistic", "poisson", "linear")


def glm_log_lik(family: str, y: Any, eta: Any, noise_scale: Any = 1.0) -> Any:
    """Elementwise log-likelihood of a GLM family in JAX, as :meth:`GLM.log_lik_eta` in torch."""
    import jax
    import jax.numpy as jnp

    if family == "logistic":
        # y log s(eta) + (1 - y) log s(-eta) = log s(eta) - (1 - y) eta
        return jax.nn.log_sigmoid(eta) - (1.0 - y) * eta
    if family == "poisson":
        return y * eta - jnp.exp(eta) - jax.scipy.special.gammaln(y + 1.0)
    if family in ("linear", "linear_sigma"):
        r = (y - eta) / noise_scale
        return -0.5 * r * r - jnp.log(noise_scale) - 0.5 * jnp.log(2.0 * jnp.pi)
    raise ValueError(f"no JAX log-likelihood for family {family!r}")


@dataclass(frozen=True)
class GlmData:
    """The arrays of a weighted GLM posterior (numpy float64): design ``(M, d)``, targets,
    weights, the prior's mean and scale, and the linear model's noise scale."""

    family: str
    design: np.ndarray
    target: np.ndarray
    weights: np.ndarray
    prior_mean: np.ndarray
    prior_scale: float
    noise_scale: float = 1.0

    def arrays(self) -> tuple[np.ndarray, ...]:
        return (self.design, self.target, self.weights, self.prior_mean,
                np.asarray(self.prior_scale, dtype=np.float64), np.asarray(self.noise_scale, dtype=np.float64))


def glm_data(model: Model, points: torch.Tensor, weights: torch.Tensor) -> GlmData | None:
    """The weighted posterior's arrays when ``model`` is a GLM with a JAX family, else None."""
    # Linear regression is not a GLM subclass (it is conjugate) but has the same design.
    if model.name not in JAX_FAMILIES or not isinstance(model, GLM | LinearRegression):
        return None
    pts = points.detach().to(DTYPE)
    sigma_estimated = isinstance(model, LinearRegression) and model.estimates_sigma
    return GlmData(
        family="linear_sigma" if sigma_estimated else model.name,
        design=model.design(pts).numpy().astype(np.float64),
        target=pts[:, -1].numpy().astype(np.float64),
        weights=weights.detach().to(DTYPE).numpy().astype(np.float64),
        prior_mean=model.prior_mean.numpy().astype(np.float64),
        prior_scale=float(model.prior_scale),
        noise_scale=float(getattr(model, "noise_scale", None) or 1.0),
    )


def glm_log_density(family: str, design: Any, target: Any, weights: Any, prior_mean: Any, prior_scale: Any,
                    noise_scale: Any) -> Callable[[Any], Any]:
    """``theta (d,) -> log posterior`` (up to a constant) of a weighted GLM, in JAX."""
    import jax.numpy as jnp

    k = design.shape[1]

    def log_density(theta: Any) -> Any:
        eta = design @ theta[:k]
        # "linear_sigma": theta's last coordinate is log sigma (issue 51).
        noise = jnp.exp(theta[k]) if family == "linear_sigma" else noise_scale
        z = (theta - prior_mean) / prior_scale
        return jnp.dot(weights, glm_log_lik(family, target, eta, noise)) - 0.5 * jnp.dot(z, z)

    return log_density


def torch_log_density(model: Model, points: torch.Tensor, weights: torch.Tensor) -> Callable[[Any], Any]:
    """``theta (d,) -> log posterior`` in JAX for any model, by calling the torch definition
    (:func:`weighted_log_posterior`) and its autograd gradient from the host. Differentiable in
    JAX (a custom VJP returns the torch gradient); vectorised maps call it once per chain."""
    import jax
    import jax.numpy as jnp

    pts = points.detach().to(DTYPE)
    wts = weights.detach().to(DTYPE)

    def value_and_grad(theta: np.ndarray) -> tuple[np.ndarray, np.ndarray]:
        th = torch.as_tensor(np.asarray(theta, dtype=np.float64)).clone().requires_grad_(True)
        with torch.enable_grad():
            lp = weighted_log_posterior(model, pts, wts, th[None])[0]
            (grad,) = torch.autograd.grad(lp, th)
        return np.asarray(lp.detach().numpy(), dtype=np.float64), grad.numpy().astype(np.float64)

    def call(theta: Any) -> tuple[Any, Any]:
        shapes = (jax.ShapeDtypeStruct((), jnp.float64), jax.ShapeDtypeStruct(theta.shape, jnp.float64))
        return jax.pure_callback(value_and_grad, shapes, theta, vmap_method="sequential")

    @jax.custom_vjp
    def log_density(theta: Any) -> Any:
        return call(theta)[0]

    def fwd(theta: Any) -> tuple[Any, Any]:
        value, grad = call(theta)
        return value, grad

    def bwd(grad: Any, cotangent: Any) -> tuple[Any]:
        return (cotangent * grad,)

    log_density.defvjp(fwd, bwd)
    return log_density
