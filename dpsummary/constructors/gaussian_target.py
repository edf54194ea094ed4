"""Weighted pseudopoints whose posterior is a given Gaussian (post-processing of a DP target).

The noise-aware release (:mod:`dpsummary.noise_aware`) ends with a Gaussian ``N(m, S)``. Analysts
load releases into samplers as weighted pseudo-data (``prior x prod_j p(u_j | theta)^w_j``), so the
Gaussian is turned into ``size`` weighted pseudopoints whose weighted posterior matches it.

The fit needs no data: at ``theta = m`` the pseudopoints' weighted log-likelihood must have
gradient ``P (m - mu0)`` (so ``m`` is the mode with the prior) and curvature ``S^-1 - P``. The loss
is the symmetric KL between ``N(m, S)`` and the Gaussian of one Newton step of the weighted
posterior from ``m`` (mode and curvature of the quadratic expansion at ``m``), minimised by Adam
over the points (features and soft targets) and log-weights. Points start at public draws
(features from the schema, targets from the model at ``m``), so the release looks like data.

Privacy: a function of the DP target and public values only (costs nothing). It is a
constructor in the sense of :class:`dpsummary.constructors.base.Constructor` whose "data" is the
target Gaussian.
"""

from __future__ import annotations

from dataclasses import dataclass

import torch

from ..gaussian import DTYPE, GaussianPosterior
from ..models import GLM, Model
from ..optim import Adam

#: Adam steps and learning rate (chosen on simulated targets; the loss reaches <1e-3 nats for
#: size >= d on the models here).
DEFAULT_STEPS = 400
DEFAULT_LR = 0.05


@dataclass(frozen=True)
class MatchState:
    features: torch.Tensor  # (size, F)
    target_param: torch.Tensor  # (size,) unconstrained target (if the model has one)
    log_weights: torch.Tensor  # (size,)
    step: int
    opt_state: dict


def _targets(model: Model, raw: torch.Tensor) -> torch.Tensor:
    name = model.name
    if name == "logistic":
        return torch.sigmoid(raw)
    if name == "poisson":
        return torch.nn.functional.softplus(raw)
    return raw


def _inverse_targets(model: Model, y: torch.Tensor) -> torch.Tensor:
    name = model.name
    if name == "logistic":
        y = y.clamp(1e-3, 1 - 1e-3)
        return torch.log(y) - torch.log1p(-y)
    if name == "poisson":
        y = y.clamp(min=1e-3)
        return y + torch.log(-torch.expm1(-y))
    return y


def points_of(model: Model, features: torch.Tensor, target_param: torch.Tensor) -> torch.Tensor:
    if not model.has_target:
        return features
    return torch.cat([features, _targets(model, target_param)[:, None]], 1)


def newton_gaussian(model: Model, points: torch.Tensor, weights: torch.Tensor, at: torch.Tensor
                    ) -> tuple[torch.Tensor, torch.Tensor]:
    """(mean, precision) of one Newton step of the weighted posterior from ``at``; differentiable
    in ``points`` and ``weights`` (uses the model's autograd score and curvature)."""
    d = model.param_dim
    prior_prec = torch.eye(d, dtype=DTYPE) / model.prior_scale**2
    if isinstance(model, GLM):
        # Closed form through the linear predictor, kept on the autograd graph of the points.
        z = model.design(points)
        eta = z @ at
        d1, d2 = model.eta_derivatives_graph(points[:, -1], eta)
        grad = z.T @ (weights * d1) - prior_prec @ (at - model.prior_mean)
        precision = (z.T * (weights * -d2)) @ z + prior_prec
    else:
        # Closed forms (linear, Gaussian mean) keep the points on the graph; the base class's
        # torch.func default does too for any other model.
        scores = model.record_scores(points, at)
        curv = model.record_curvatures(points, at)
        grad = weights @ scores - prior_prec @ (at - model.prior_mean)
        precision = torch.einsum("j,jab->ab", weights, curv) + prior_prec
    precision = 0.5 * (precision + precision.T)
    mean = at + torch.linalg.solve(precision, grad)
    return mean, precision


def _sym_kl(m1: torch.Tensor, prec1: torch.Tensor, target: GaussianPosterior, target_prec: torch.Tensor) -> torch.Tensor:
    d = m1.shape[0]
    cov_t = target.cov
    cov1 = torch.linalg.inv(prec1)
    diff = m1 - target.mean
    # KL(1||t) + KL(t||1): log-determinants cancel.
    return 0.5 * (torch.trace(target_prec @ cov1) + torch.trace(prec1 @ cov_t) - 2 * d
                  + diff @ target_prec @ diff + diff @ prec1 @ diff)


def match_gaussian(
    model: Model,
    target: GaussianPosterior,
    *,
    size: int,
    initial_features: torch.Tensor,
    generator: torch.Generator,
    steps: int = DEFAULT_STEPS,
    lr: float = DEFAULT_LR,
) -> tuple[torch.Tensor, torch.Tensor, float]:
    """Pseudopoints ``(size, point_dim)``, weights ``(size,)`` and the final symmetric KL (nats)
    between ``target`` and the one-Newton-step Gaussian of the weighted pseudopoints.

    ``initial_features`` ``(size, num_features)`` are public draws (the schema's feature
    sampler); ``generator`` drives only the initial soft targets' draws."""
    if size < 1:
        raise ValueError("size must be at least 1")
    m = target.mean.detach()
    target_prec = torch.cholesky_inverse(target.scale_tril)
    target_prec = 0.5 * (target_prec + target_prec.T)
    feats = initial_features.detach().to(DTYPE).clone()
    if model.has_target:
        sim = model.simulate(m, size, generator, features=feats)[:, -1]
        mid = sim if model.name != "logistic" else 0.25 + 0.5 * sim
        tparam = _inverse_targets(model, mid)
    else:
        tparam = torch.zeros(size, dtype=DTYPE)
    # Initial weights: curvature of the pseudopoints at m matched in trace to S^-1 - P.
    d = model.param_dim
    prior_prec = torch.eye(d, dtype=DTYPE) / model.prior_scale**2
    need = float(torch.trace(target_prec - prior_prec).clamp(min=1e-6))
    with torch.no_grad():
        per_point = float(torch.einsum("jaa->", model.record_curvatures(points_of(model, feats, tparam), m)).clamp(min=1e-9))
    log_w = torch.full((size,), torch.log(torch.tensor(need / per_point)).item(), dtype=DTYPE)
    params = [feats.requires_grad_(True), tparam.requires_grad_(True), log_w.requires_grad_(True)]
    opt = Adam(params, lr=lr)
    best = (float("inf"), feats.detach().clone(), tparam.detach().clone(), log_w.detach().clone())
    for _ in range(steps):
        opt.zero_grad()
        pts = points_of(model, feats, tparam)
        mean, prec = newton_gaussian(model, pts, torch.exp(log_w), m)
        loss = _sym_kl(mean, prec, target, target_prec)
        if not torch.isfinite(loss):
            break
        value = float(loss.detach())
        if value < best[0]:
            best = (value, feats.detach().clone(), tparam.detach().clone(), log_w.detach().clone())
        loss.backward()
        opt.step()
    loss_value, f, t, lw = best
    points = points_of(model, f, t).detach()
    points = model.project_points(points.clone())
    return points, torch.exp(lw), loss_value
