"""Pseudocoreset variational inference (PSVI; Manousakas et al. 2020, Algorithm 1).

Pseudopoint locations u and weights w are both learned by minimising KL(pi_{u,w} || pi). The
gradients (Section 3.1, eq. (5)) are covariances under the pseudocoreset posterior,

    grad_w KL   = -Cov[f_hat, f^T 1 - f_hat^T w],
    grad_u_m KL = -w_m Cov[h(u_m), f^T 1 - f_hat^T w],

estimated (Section 3.2) from S draws theta_s of the current pseudocoreset posterior with a
minibatch standing in for the full-data term ``f^T 1``. We realise both estimators at once with
the surrogate loss

    L(u, w) = -(1/S) sum_s r_s * (w . g_hat_s(u)),    r_s = D_s - w . g_hat_s   (r_s held fixed)

whose autograd gradients are exactly the Monte-Carlo gradients of eq. (5), where g_hat_s is the
pseudopoints' log-likelihood vector at theta_s centred over the S draws and D_s is the data term
(N/B times the centred minibatch log-likelihood sum; DP-PSVI substitutes its noisy clipped sum
scaled by 1/q, Section 3.3 eq. (6)).

Departures from Algorithm 1, all standard and documented: the optimiser is passed in (Adam by
default, not the paper's t^-1 SGD schedule, because its scale invariance lets one learning rate
serve data sets whose N spans orders of magnitude); weights are optimised on the log scale, which
keeps them strictly positive (samplers reject zero weights) in place of the paper's projection
``max(w, 0)``; the posterior draws come from :func:`dpsummary.inference.coreset_posterior`
(exact, or Laplace warm-started from the previous step, as in the papers' experiments).
"""

from __future__ import annotations

from collections.abc import Callable, Iterable
from dataclasses import dataclass, field, replace
from typing import Any

import torch

from ..inference import GaussianPosterior, coreset_posterior
from ..models import DTYPE, Model
from ..optim import Adam, ExponentialDecay, Schedule, StepOptimizer

OptimizerFactory = Callable[[Iterable[dict[str, Any]]], StepOptimizer]
ScheduleFactory = Callable[[StepOptimizer, int], Schedule]


def exponential_decay(optimizer: StepOptimizer, steps: int) -> Schedule:
    """The default schedule: learning rates decay geometrically to 1% of their start over ``steps``.

    A decaying step size is what lets stochastic gradients settle (the paper uses t^-1); a
    geometric decay keeps the early steps large enough to move synthetic initial points far.
    """
    return ExponentialDecay(optimizer, gamma=0.01 ** (1.0 / max(steps, 1)))


def adam(param_groups: Iterable[dict[str, Any]]) -> StepOptimizer:
    """The default optimiser: Adam with the per-group learning rates PSVI sets (torch's
    arithmetic without torch.optim's import of torch._dynamo: :mod:`dpsummary.optim`)."""
    return Adam(param_groups)


@dataclass
class PSVIState:
    """Explicit optimisation state.

    The optimiser's leaves are ``latent`` (pseudopoints divided by the public per-column
    ``point_scale``) and ``log_weights``. Scaling lets one learning rate move a count target of
    order 100 as readily as a standardised feature of order 1.
    """

    latent: torch.Tensor
    point_scale: torch.Tensor
    log_weights: torch.Tensor
    optimizer: StepOptimizer
    schedule: Schedule | None
    posterior: GaussianPosterior
    point_bounds: tuple[torch.Tensor, torch.Tensor] | None = None
    total_weight: float | None = None
    step: int = 0
    info: dict[str, Any] = field(default_factory=dict)

    @property
    def points(self) -> torch.Tensor:
        """Pseudopoints in model space (differentiable in ``latent``)."""
        return self.latent * self.point_scale

    @property
    def weights(self) -> torch.Tensor:
        """Weights (differentiable in ``log_weights``): exp(log w), or, with a fixed
        ``total_weight``, total_weight * softmax(log w)."""
        if self.total_weight is None:
            return self.log_weights.exp()
        return self.total_weight * torch.softmax(self.log_weights, 0)


def init_state(
    points: torch.Tensor,
    weights: torch.Tensor,
    model: Model,
    *,
    optimizer: OptimizerFactory,
    points_lr: float,
    weights_lr: float,
    schedule: ScheduleFactory | None,
    steps: int,
    point_scale: torch.Tensor | None = None,
    point_bounds: tuple[torch.Tensor, torch.Tensor] | None = None,
    total_weight: float | None = None,
) -> PSVIState:
    """Wrap initial pseudopoints and weights into an optimisation state.

    ``point_scale`` (public, per column, default all ones) sets the units in which the optimiser
    moves each coordinate. ``point_bounds`` (lower, upper per column), when given, is the domain
    pseudopoints are projected back into after every step: pseudodata stay data-like, and a
    pseudopoint cannot random-walk to a far-away location whose log-likelihood is so curved that
    it over-concentrates the posterior (observed with noisy DP gradients). ``total_weight``, when
    given, fixes the sum of the weights (weights = total * softmax): the full-data posterior has
    total weight N, and fixing it stops noisy gradients from inflating the weights.
    """
    pts = model.project_points(points.detach().clone().to(DTYPE))
    if point_bounds is not None:
        lo, hi = (b.detach().to(DTYPE) for b in point_bounds)
        if lo.shape != (pts.shape[1],) or hi.shape != lo.shape or not bool((lo <= hi).all()):
            raise ValueError("point_bounds must be (lower, upper) with one entry per point column")
        point_bounds = (lo, hi)
        pts = torch.clamp(pts, lo, hi)
    scale = torch.ones(pts.shape[1], dtype=DTYPE) if point_scale is None else point_scale.detach().to(DTYPE)
    if scale.shape != (pts.shape[1],) or not bool((scale > 0).all()):
        raise ValueError("point_scale must be positive, one entry per point column")
    latent = (pts / scale).requires_grad_(True)
    logw = torch.log(weights.detach().clone().to(DTYPE)).requires_grad_(True)
    opt = optimizer([{"params": [latent], "lr": points_lr}, {"params": [logw], "lr": weights_lr}])
    if total_weight is not None and not total_weight > 0:
        raise ValueError("total_weight must be positive")
    init_weights = logw.detach().exp() if total_weight is None else total_weight * torch.softmax(logw.detach(), 0)
    posterior = coreset_posterior(model, pts, init_weights)
    sched = None if schedule is None else schedule(opt, steps)
    return PSVIState(
        latent=latent, point_scale=scale, log_weights=logw, optimizer=opt, schedule=sched, posterior=posterior,
        point_bounds=point_bounds, total_weight=total_weight,
    )


def posterior_draws(
    state: PSVIState, model: Model, num_samples: int, generator: torch.Generator, *, diagonal: bool = False
) -> tuple[GaussianPosterior, torch.Tensor]:
    """S draws from the current pseudocoreset posterior (no privacy cost: pseudopoints only)."""
    posterior = coreset_posterior(
        model, state.points.detach(), state.weights.detach(), warm_start=state.posterior, diagonal=diagonal
    )
    return posterior, posterior.sample(num_samples, generator)


def centred_loglik(model: Model, points: torch.Tensor, theta: torch.Tensor) -> torch.Tensor:
    """Log-likelihood vectors over the S draws, each centred over its own S values: (n, S)."""
    ll = model.log_likelihood(points, theta)
    return ll - ll.mean(1, keepdim=True)


def apply_gradient(
    state: PSVIState,
    model: Model,
    theta: torch.Tensor,
    data_term: torch.Tensor,
    posterior: GaussianPosterior,
) -> PSVIState:
    """One optimiser step given draws ``theta`` (S, d) and the data term D (S,).

    ``data_term`` is the only place data enters: an unbiased estimate of sum_n g_n(theta_s)
    (centred full-data log-likelihood sum), private or not.
    """
    theta = theta.detach()
    data_term = data_term.detach()
    num_samples = theta.shape[0]
    weights = state.weights
    g_hat = centred_loglik(model, state.points, theta)  # (M, S), differentiable in points
    residual = data_term - weights.detach() @ g_hat.detach()  # r_s, held fixed
    loss = -(weights @ (g_hat @ residual)) / num_samples
    state.optimizer.zero_grad(set_to_none=True)
    loss.backward()
    state.optimizer.step()
    if state.schedule is not None:
        state.schedule.step()
    with torch.no_grad():
        pts = model.project_points(state.points)
        if state.point_bounds is not None:
            pts = torch.clamp(pts, *state.point_bounds)
        state.latent.copy_(pts / state.point_scale)
        # Keep log-weights finite: exp overflow or underflow would make the posterior singular.
        state.log_weights.clamp_(min=-30.0, max=30.0)
    return replace(state, posterior=posterior, step=state.step + 1)


@dataclass(frozen=True)
class PSVI:
    """Non-private batch PSVI (Algorithm 1), the utility baseline for DP-PSVI.

    Initialised, as in the paper, from M records chosen uniformly with weights N/M.
    """

    steps: int = 500
    num_samples: int = 100
    batch_size: int = 200
    points_lr: float = 0.05
    weights_lr: float = 0.05
    optimizer: OptimizerFactory = adam
    schedule: ScheduleFactory | None = exponential_decay
    diagonal: bool = False
    point_scale: tuple[float, ...] | None = None
    name: str = "psvi"

    def init(self, data: torch.Tensor, model: Model, size: int, generator: torch.Generator) -> PSVIState:
        n = data.shape[0]
        m = min(size, n)
        idx = torch.randperm(n, generator=generator)[:m]
        weights = torch.full((m,), n / m, dtype=DTYPE)
        return init_state(
            data[idx],
            weights,
            model,
            optimizer=self.optimizer,
            points_lr=self.points_lr,
            weights_lr=self.weights_lr,
            schedule=self.schedule,
            steps=self.steps,
            point_scale=None if self.point_scale is None else torch.tensor(self.point_scale, dtype=DTYPE),
        )

    def num_steps(self, size: int) -> int:
        return self.steps

    def step(self, state: PSVIState, data: torch.Tensor, model: Model, generator: torch.Generator) -> PSVIState:
        posterior, theta = posterior_draws(state, model, self.num_samples, generator, diagonal=self.diagonal)
        n = data.shape[0]
        b = min(self.batch_size, n)
        batch = data[torch.randperm(n, generator=generator)[:b]] if b < n else data
        data_term = centred_loglik(model, batch, theta).sum(0) * (n / b)
        return apply_gradient(state, model, theta, data_term, posterior)

    def result(self, state: PSVIState) -> tuple[torch.Tensor, torch.Tensor]:
        return state.points.detach(), state.weights.detach()

