"""The black-box coreset objective and its differentiable inner VI loop (Manousakas, Ritter and
Karaletsos 2022, Sections 3.1 and 3.4).

Notation (paper -> code): pseudopoints ``(u, z)`` -> ``points`` (features, then soft-label
columns), weights ``v`` -> ``weights``, variational parameters ``psi`` -> ``(mu, rho)`` of
:class:`dpsummary.models.bnn.MeanFieldGaussian`, Monte Carlo draws ``theta_k`` -> rows of
``mu + softplus(rho) * eps``.

* Inner problem (eq. 16): ``psi*(v, u, z) = argmax ELBO_IP(psi)``, the weighted-coreset ELBO
  ``E_r[v . log p(z | u, theta)] - KL(r || prior)`` (KL in closed form). Solved by
  ``inner_steps`` Adam steps written as pure tensor arithmetic on ``torch.func.grad`` outputs, so
  that the whole unrolled loop is differentiable in the coreset parameters (iterative
  differentiation, Section 3.4), with no monkey-patching library and no anomaly detection.
* Outer objective (eq. 9, ELBO_PSVI-IS-BB), maximised in the coreset parameters::

      sum_k wt_k [log p(y | x, theta_k) - v . log p(z | u, theta_k)]
        + (1/K) sum_k [v . log p(z | u, theta_k) + log p(theta_k) - log r(theta_k; psi*)]

  with self-normalised importance weights ``wt = softmax_k(v . log p(z|u,theta_k) +
  log p(theta_k) - log r(theta_k))`` (eq. 6), and the full-data log-likelihood estimated from a
  minibatch scaled by N/B. Gradients flow through ``wt``, through ``theta_k`` and through
  ``psi*`` (the unrolled inner loop).

Log-likelihood matrices come from one batched call over the Monte Carlo draws (the model
protocol's ``theta`` is ``(S, d)``), or from ``torch.func.vmap`` of a per-draw function
(:data:`USE_VMAP`); any :class:`~dpsummary.models.base.Model` (BNN or GLM) takes the same path.
"""

from __future__ import annotations

from dataclasses import dataclass

import torch
from torch.func import grad, vmap

from ..models import Model
from ..models.bnn import MeanFieldGaussian

#: ``True``: :func:`loglik_matrix` vmaps a per-draw function over the Monte Carlo draws;
#: ``False`` (default): it calls the model once with all S draws, which the model protocol
#: guarantees is batched (``theta`` is ``(S, d)``). Both give identical values
#: (tests/blackbox/test_objective.py); measured on the 2-core machine, a 100-unit BNN inner
#: step costs 5.5 ms vmapped and 3.5 ms batched, so vmap is kept for models that are not.
USE_VMAP = False


def loglik_matrix(model: Model, points: torch.Tensor, theta: torch.Tensor, *, use_vmap: bool | None = None
                  ) -> torch.Tensor:
    """``log p(points_n | theta_s)`` as an ``(S, n)`` matrix over the Monte Carlo draws."""
    if not (USE_VMAP if use_vmap is None else use_vmap):
        return model.log_likelihood(points, theta).T

    def one_draw(th: torch.Tensor) -> torch.Tensor:
        return model.log_likelihood(points, th[None])[:, 0]

    out: torch.Tensor = vmap(one_draw)(theta)
    return out


@dataclass(frozen=True)
class InnerConfig:
    """The inner VI loop: ``steps`` Adam steps of size ``lr`` with ``num_samples`` draws each."""

    steps: int = 20
    lr: float = 0.01
    num_samples: int = 10
    beta1: float = 0.9
    beta2: float = 0.999
    eps: float = 1e-8


def neg_inner_elbo(mu: torch.Tensor, rho: torch.Tensor, points: torch.Tensor, weights: torch.Tensor,
                   eps: torch.Tensor, model: Model, family: MeanFieldGaussian) -> torch.Tensor:
    """``-ELBO_IP`` (eq. 8/16) for draws ``mu + sd * eps``; closed-form KL to the prior."""
    theta = family.sample(mu, rho, eps)
    expected = (loglik_matrix(model, points, theta) @ weights).mean()
    return family.kl_to_prior(mu, rho) - expected


@dataclass
class AdamMoments:
    """Inner Adam state carried between outer steps (detached): moments and step count."""

    m_mu: torch.Tensor
    v_mu: torch.Tensor
    m_rho: torch.Tensor
    v_rho: torch.Tensor
    count: int = 0

    @classmethod
    def zeros(cls, d: int, like: torch.Tensor) -> AdamMoments:
        z = torch.zeros(d, dtype=like.dtype)
        return cls(z, z.clone(), z.clone(), z.clone(), 0)

    def detached(self) -> AdamMoments:
        return AdamMoments(self.m_mu.detach(), self.v_mu.detach(), self.m_rho.detach(), self.v_rho.detach(),
                           self.count)


def inner_fit(
    mu: torch.Tensor,
    rho: torch.Tensor,
    points: torch.Tensor,
    weights: torch.Tensor,
    eps: torch.Tensor,
    model: Model,
    family: MeanFieldGaussian,
    config: InnerConfig,
    moments: AdamMoments | None = None,
) -> tuple[torch.Tensor, torch.Tensor, AdamMoments]:
    """Unrolled inner VI (Section 3.4): ``config.steps`` Adam steps on ``-ELBO_IP``.

    ``eps`` is ``(steps, num_samples, d)`` standard-normal noise owned by the caller. The result
    is differentiable in ``points`` and ``weights`` (and in ``mu``, ``rho``) by ordinary autograd
    or by an enclosing ``torch.func`` transform. Adam is written out (bias-corrected moments,
    ``sqrt(v + eps^2)`` so its derivative stays finite where a gradient is exactly zero, e.g. a
    dead ReLU unit).
    """
    if eps.shape[0] != config.steps:
        raise ValueError("eps must have one slice of draws per inner step")
    mom = moments if moments is not None else AdamMoments.zeros(mu.shape[0], mu)
    m_mu, v_mu, m_rho, v_rho, count = mom.m_mu, mom.v_mu, mom.m_rho, mom.v_rho, mom.count
    g_fn = grad(neg_inner_elbo, argnums=(0, 1))
    b1, b2, lr, tiny = config.beta1, config.beta2, config.lr, config.eps**2
    for t in range(config.steps):
        g_mu, g_rho = g_fn(mu, rho, points, weights, eps[t], model, family)
        count += 1
        m_mu = b1 * m_mu + (1 - b1) * g_mu
        v_mu = b2 * v_mu + (1 - b2) * g_mu * g_mu
        m_rho = b1 * m_rho + (1 - b1) * g_rho
        v_rho = b2 * v_rho + (1 - b2) * g_rho * g_rho
        c1, c2 = 1 - b1**count, 1 - b2**count
        mu = mu - lr * (m_mu / c1) / torch.sqrt(v_mu / c2 + tiny)
        rho = rho - lr * (m_rho / c1) / torch.sqrt(v_rho / c2 + tiny)
    return mu, rho, AdamMoments(m_mu, v_mu, m_rho, v_rho, count)


def importance_log_weights(mu: torch.Tensor, rho: torch.Tensor, theta: torch.Tensor, coreset_ll: torch.Tensor,
                           model: Model, family: MeanFieldGaussian) -> torch.Tensor:
    """Unnormalised log importance weights ``v . log p(z|u,theta_k) + log p(theta_k) - log r(theta_k)``
    (eq. 6; supplement's "correction for sampling under coreset"), shape ``(K,)``."""
    return coreset_ll + model.log_prior(theta) - family.log_prob(mu, rho, theta)


def outer_elbo(
    mu: torch.Tensor,
    rho: torch.Tensor,
    points: torch.Tensor,
    weights: torch.Tensor,
    batch: torch.Tensor,
    num_records: int,
    eps: torch.Tensor,
    model: Model,
    family: MeanFieldGaussian,
) -> torch.Tensor:
    """``ELBO_PSVI-IS-BB`` (eq. 9; eq. 13 for BB-SparseVI) with the data term from ``batch``.

    ``(mu, rho)`` should be the inner loop's output ``psi*``; ``eps`` is ``(K, d)``. Returns a
    scalar estimate of a lower bound on ``log p(y | x)`` (up to the minibatch estimate).
    """
    theta = family.sample(mu, rho, eps)
    coreset_ll = loglik_matrix(model, points, theta) @ weights  # (K,)
    data_ll = loglik_matrix(model, batch, theta).sum(1) * (num_records / batch.shape[0])  # (K,)
    log_iw = importance_log_weights(mu, rho, theta, coreset_ll, model, family)
    wt = torch.softmax(log_iw, 0)
    return (wt * (data_ll - coreset_ll)).sum() + log_iw.mean()


def bilevel_loss(
    points: torch.Tensor,
    weights: torch.Tensor,
    mu0: torch.Tensor,
    rho0: torch.Tensor,
    batch: torch.Tensor,
    num_records: int,
    inner_eps: torch.Tensor,
    outer_eps: torch.Tensor,
    model: Model,
    family: MeanFieldGaussian,
    config: InnerConfig,
    moments: AdamMoments | None = None,
) -> tuple[torch.Tensor, tuple[torch.Tensor, ...]]:
    """``-ELBO_PSVI-IS-BB / N`` after the unrolled inner loop from ``(mu0, rho0)``.

    Returns ``(loss, (mu*, rho*, m_mu, v_mu, m_rho, v_rho))`` (a pytree of tensors, as
    ``torch.func`` requires of auxiliary outputs); differentiate ``loss`` in ``points``/``weights``
    with ``torch.func.grad(..., has_aux=True)`` (see :func:`outer_gradient`). Dividing by N only
    rescales (Adam is invariant to it) and keeps the value readable per record.
    """
    mu, rho, mom = inner_fit(mu0, rho0, points, weights, inner_eps, model, family, config, moments)
    elbo = outer_elbo(mu, rho, points, weights, batch, num_records, outer_eps, model, family)
    return -elbo / num_records, (mu, rho, mom.m_mu, mom.v_mu, mom.m_rho, mom.v_rho)


def outer_gradient(
    points: torch.Tensor,
    weights: torch.Tensor,
    mu0: torch.Tensor,
    rho0: torch.Tensor,
    batch: torch.Tensor,
    num_records: int,
    inner_eps: torch.Tensor,
    outer_eps: torch.Tensor,
    model: Model,
    family: MeanFieldGaussian,
    config: InnerConfig,
    moments: AdamMoments | None = None,
) -> tuple[torch.Tensor, torch.Tensor, torch.Tensor, tuple[torch.Tensor, torch.Tensor, AdamMoments]]:
    """``(d loss / d points, d loss / d weights, loss, (mu*, rho*, moments))`` via ``torch.func``."""
    fn = torch.func.grad_and_value(bilevel_loss, argnums=(0, 1), has_aux=True)
    (g_points, g_weights), (loss, aux) = fn(points, weights, mu0, rho0, batch, num_records, inner_eps, outer_eps,
                                            model, family, config, moments)
    count = (moments.count if moments is not None else 0) + config.steps
    mu, rho, m_mu, v_mu, m_rho, v_rho = (a.detach() for a in aux)
    return g_points, g_weights, loss.detach(), (mu, rho, AdamMoments(m_mu, v_mu, m_rho, v_rho, count))
