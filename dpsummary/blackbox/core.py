"""Shared state and outer step of the black-box constructors (BB-PSVI, BB-SparseVI).

Every black-box constructor keeps explicit state (:class:`BBState`): the coreset parameters as
optimiser leaves, the variational parameters ``psi = (mu, rho)`` warm-started from one outer
step to the next, and the inner Adam moments. One outer step (:func:`outer_step`):

1. draws a minibatch of B records and all the standard-normal noise it needs from the caller's
   ``torch.Generator`` (inner ``(T, S, d)``, outer ``(K, d)``);
2. computes the gradient of ``-ELBO_PSVI-IS-BB`` through ``T`` unrolled inner VI steps with
   ``torch.func`` (:func:`dpsummary.blackbox.objective.outer_gradient`);
3. chains it into the coreset parameters (autograd through the weight parameterisation),
   takes one Adam step, projects (labels onto their support, weights >= 0), and keeps ``psi*``
   (detached) as the next warm start (truncated iterative differentiation, Section 3.4).

The private path (``dpsummary release --model bnn``, :mod:`dpsummary.private.bnn`) takes the
same step from a gradient statistic instead of a minibatch (:func:`statistic_step`): the same
loss (:func:`~dpsummary.blackbox.objective.coreset_loss`, data term
:func:`~dpsummary.blackbox.objective.statistic_data_fit`) and the same update
(:func:`apply_outer_gradient`); :mod:`dpsummary.private.bnn` keeps only the statistic's release
(sampling, clipping, noise).
"""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass, field, replace
from typing import Any

import torch

from ..models import DTYPE, Model
from ..models.bnn import MeanFieldGaussian
from .objective import (
    AdamMoments,
    InnerConfig,
    coreset_loss,
    inner_fit,
    outer_gradient,
    statistic_data_fit,
)


@dataclass
class WeightParam:
    """How the coreset weights v are parameterised (Section 3.2).

    ``kind="softmax"``: ``v = alpha * softmax(beta)`` with ``log alpha`` learned when
    ``learn_total`` (initialised at N: pseudo-evidence equal to the data's), or, without
    ``log_total`` (:meth:`softmax_fixed`), ``alpha = scale`` fixed (a public total, e.g. the
    released record count on the private path); ``kind="projected"``:
    ``v = scale * c`` with ``c >= 0`` projected after every step (Algorithms 3-5, ``max(v, 0)``),
    ``scale = N / M`` so one learning rate fits every N.
    """

    kind: str
    raw: torch.Tensor
    log_total: torch.Tensor | None = None
    scale: float = 1.0

    def weights(self) -> torch.Tensor:
        if self.kind == "softmax":
            if self.log_total is None:
                return self.scale * torch.softmax(self.raw, 0)
            return self.log_total.exp() * torch.softmax(self.raw, 0)
        return self.scale * self.raw

    def leaves(self) -> list[torch.Tensor]:
        return [self.raw] + ([self.log_total] if self.log_total is not None and self.log_total.requires_grad else [])

    def project(self) -> None:
        with torch.no_grad():
            if self.kind == "projected":
                self.raw.clamp_(min=0.0)
            else:
                self.raw.clamp_(-30.0, 30.0)

    @classmethod
    def softmax(cls, m: int, total: float, *, learn_total: bool, dtype: torch.dtype = DTYPE) -> WeightParam:
        raw = torch.zeros(m, dtype=dtype, requires_grad=True)
        log_total = torch.tensor(float(total), dtype=dtype).log().requires_grad_(learn_total)
        return cls("softmax", raw, log_total)

    @classmethod
    def softmax_fixed(cls, m: int, total: float, *, dtype: torch.dtype = DTYPE) -> WeightParam:
        """``v = total * softmax(beta)`` with the total fixed (not learned)."""
        return cls("softmax", torch.zeros(m, dtype=dtype, requires_grad=True), None, float(total))

    @classmethod
    def projected(cls, initial: torch.Tensor, scale: float) -> WeightParam:
        return cls("projected", (initial.detach().to(DTYPE) / scale).clone().requires_grad_(True), None, scale)


@dataclass
class BBState:
    """Explicit optimisation state of one black-box coreset."""

    points: torch.Tensor  # (M, point_dim); a leaf with requires_grad when locations/labels are learned
    weight: WeightParam
    mu: torch.Tensor
    rho: torch.Tensor
    moments: AdamMoments
    optimizer: torch.optim.Optimizer
    num_records: int
    learn_points: bool
    learn_labels: bool
    schedule: torch.optim.lr_scheduler.LRScheduler | None = None
    step: int = 0
    losses: list[float] = field(default_factory=list)
    info: dict[str, Any] = field(default_factory=dict)

    @property
    def weights(self) -> torch.Tensor:
        return self.weight.weights()


def warm_up(model: Model, points: torch.Tensor, weights: torch.Tensor, mu: torch.Tensor, rho: torch.Tensor,
            config: InnerConfig, steps: int, generator: torch.Generator,
            moments: AdamMoments | None = None) -> tuple[torch.Tensor, torch.Tensor, AdamMoments]:
    """``steps`` plain (not differentiated) inner VI steps on fixed weighted points, in chunks."""
    family = MeanFieldGaussian(model.prior_scale)
    mom = moments
    done = 0
    with torch.no_grad():
        pts, w = points.detach(), weights.detach()
    while done < steps:
        chunk = min(config.steps, steps - done)
        cfg = replace(config, steps=chunk)
        eps = torch.randn(chunk, config.num_samples, model.param_dim, generator=generator, dtype=mu.dtype)
        mu, rho, mom = inner_fit(mu, rho, pts, w, eps, model, family, cfg, mom)
        mu, rho, mom = mu.detach(), rho.detach(), mom.detached()
        done += chunk
    if mom is None:
        mom = AdamMoments.zeros(mu.shape[0], mu)
    return mu, rho, mom


def make_state(
    model: Model,
    points: torch.Tensor,
    weight: WeightParam,
    num_records: int,
    generator: torch.Generator,
    *,
    learn_points: bool,
    learn_labels: bool,
    points_lr: float,
    weights_lr: float,
    total_lr: float,
    inner: InnerConfig,
    init_sd: float,
    warmup_steps: int,
    lr_decay: float | None = None,
    steps: int = 1,
    init_scheme: str = "he",
) -> BBState:
    """Initial state: random ``psi_0`` (He-scaled means, sd ``init_sd``), then ``warmup_steps``
    plain inner steps on the initial coreset so the first outer gradient starts near psi*.

    ``lr_decay`` (e.g. 0.01), when given, decays the outer learning rates geometrically to that
    fraction of their start over ``steps`` outer steps (as dpsummary's PSVI does).

    Everything runs in the dtype of ``points`` (float64 by default; float32 when the caller's
    data are float32, as in the authors' code); ``init_scheme`` is passed to
    :meth:`MeanFieldGaussian.init`."""
    pts = model.project_points(points.detach().clone())
    pts.requires_grad_(learn_points)
    mu, rho = MeanFieldGaussian.init(model, generator, init_sd=init_sd, dtype=pts.dtype, scheme=init_scheme)
    mu, rho, mom = warm_up(model, pts, weight.weights(), mu, rho, inner, warmup_steps, generator)
    groups: list[dict[str, Any]] = [{"params": [weight.raw], "lr": weights_lr}]
    if weight.log_total is not None and weight.log_total.requires_grad:
        groups.append({"params": [weight.log_total], "lr": total_lr})
    if learn_points:
        groups.append({"params": [pts], "lr": points_lr})
    opt = torch.optim.Adam(groups)
    sched = None
    if lr_decay is not None:
        if not 0 < lr_decay <= 1:
            raise ValueError("lr_decay must lie in (0, 1]")
        sched = torch.optim.lr_scheduler.ExponentialLR(opt, gamma=lr_decay ** (1.0 / max(steps, 1)))
    return BBState(pts, weight, mu, rho, mom, opt, num_records, learn_points, learn_labels, sched)


def step_noise(model: Model, inner: InnerConfig, outer_samples: int, generator: torch.Generator,
               dtype: torch.dtype) -> tuple[torch.Tensor, torch.Tensor]:
    """The standard-normal noise of one outer step, in this order: the inner loop's
    ``(steps, num_samples, d)`` and the outer draws' ``(outer_samples, d)``."""
    d = model.param_dim
    inner_eps = torch.randn(inner.steps, inner.num_samples, d, generator=generator, dtype=dtype)
    outer_eps = torch.randn(outer_samples, d, generator=generator, dtype=dtype)
    return inner_eps, outer_eps


def outer_step(state: BBState, data: torch.Tensor, model: Model, generator: torch.Generator, *,
               inner: InnerConfig, batch_size: int, outer_samples: int, reset_moments: bool = False) -> BBState:
    """One outer iteration of Algorithm 1 (BB-PSVI) / Algorithm 4 (batch BB-SparseVI).

    ``data`` is the ``(N, point_dim)`` training set; only a minibatch of ``batch_size`` records
    enters the gradient. ``reset_moments``: the inner Adam starts every outer step from zero
    moments (the authors' code does: its differentiable optimiser copies the state of an
    optimiser that never steps) instead of continuing the previous step's moments.
    """
    n = data.shape[0]
    b = min(batch_size, n)
    batch = data[torch.randperm(n, generator=generator)[:b]] if b < n else data
    inner_eps, outer_eps = step_noise(model, inner, outer_samples, generator, state.mu.dtype)
    family = MeanFieldGaussian(model.prior_scale)
    weights = state.weight.weights()
    g_points, g_weights, loss, (mu, rho, mom) = outer_gradient(
        state.points.detach(), weights.detach(), state.mu, state.rho, batch, state.num_records,
        inner_eps, outer_eps, model, family, inner, None if reset_moments else state.moments)
    return apply_outer_gradient(state, model, g_points, g_weights, mu=mu, rho=rho, moments=mom, loss=float(loss))


def apply_outer_gradient(state: BBState, model: Model, g_points: torch.Tensor, g_weights: torch.Tensor, *,
                         mu: torch.Tensor, rho: torch.Tensor, moments: AdamMoments | None = None,
                         loss: float | None = None) -> BBState:
    """THE update of a BB-PSVI outer step, shared by the non-private and the private path (on the
    private path, post-processing of the noisy statistic): the gradients of the outer loss in
    the points and the weights, chained into the coreset parameters (autograd through the weight
    parameterisation; label columns zeroed unless labels are learned), one optimiser step (and
    learning-rate schedule step), projection of the points onto their support and of the
    weights, and ``psi* = (mu, rho)`` (with ``moments``, when given) as the next warm start."""
    weights = state.weight.weights()
    state.optimizer.zero_grad(set_to_none=True)
    if state.learn_points:
        if not state.learn_labels:
            g_points = g_points.clone()
            g_points[:, model.num_features:] = 0.0
        state.points.grad = g_points
    torch.autograd.backward([weights], [g_weights])
    state.optimizer.step()
    if state.schedule is not None:
        state.schedule.step()
    with torch.no_grad():
        if state.learn_points:
            model.project_points(state.points)
    state.weight.project()
    state.mu, state.rho = mu, rho
    if moments is not None:
        state.moments = moments
    state.step += 1
    if loss is not None:
        state.losses.append(loss)
    return state


#: ``theta (K, d) -> (L (K,), G (K, d))``: the sums over a (Poisson) sample of records of
#: ``log p(x | theta_k)`` and of its gradient in ``theta_k``, exact or noisy (the private path's
#: only contact with records, :func:`dpsummary.private.bnn.statistic`).
GradientStatistic = Callable[[torch.Tensor], tuple[torch.Tensor, torch.Tensor]]


def statistic_outer_gradient(state: BBState, statistic: GradientStatistic, model: Model, generator: torch.Generator,
                             *, inner: InnerConfig, outer_samples: int, sample_rate: float
                             ) -> tuple[torch.Tensor, torch.Tensor, tuple[torch.Tensor, torch.Tensor]]:
    """Gradients of :func:`~dpsummary.blackbox.objective.coreset_loss` in the state's points and
    weights with the data term from a gradient statistic (:func:`statistic_data_fit`), and the
    new ``psi* = (mu, rho)`` (detached).

    Pass 1 (no records): the unrolled inner fit from zero inner-Adam moments gives the draws
    ``theta_k``. ``statistic(theta)``: the sums over the records sampled at rate
    ``sample_rate``, called exactly once. Pass 2 (no records): the surrogate differentiated
    through the same inner fit (same noise, so the same draws). ``generator`` drives only the
    variational draws; everything after ``statistic`` is post-processing of its output."""
    family = MeanFieldGaussian(model.prior_scale)
    inner_eps, outer_eps = step_noise(model, inner, outer_samples, generator, state.mu.dtype)
    points, weights = state.points.detach(), state.weights.detach()
    with torch.no_grad():
        mu, rho, _ = inner_fit(state.mu, state.rho, points, weights, inner_eps, model, family, inner)
        theta = family.sample(mu, rho, outer_eps)
    stat_l, stat_g = statistic(theta)
    fn = torch.func.grad(coreset_loss, argnums=(0, 1), has_aux=True)
    (g_p, g_w), aux = fn(points, weights, state.mu, state.rho, statistic_data_fit(stat_l, stat_g, theta, sample_rate),
                         state.num_records, inner_eps, outer_eps, model, family, inner)
    return g_p, g_w, (aux[0].detach(), aux[1].detach())


def statistic_step(state: BBState, statistic: GradientStatistic, model: Model, generator: torch.Generator, *,
                   inner: InnerConfig, outer_samples: int, sample_rate: float) -> BBState:
    """One BB-PSVI outer step from a gradient statistic (the private path's step; exact sums give
    the non-private gradient): :func:`statistic_outer_gradient`, then
    :func:`apply_outer_gradient`. The inner Adam restarts from zero moments every step (both
    passes must see the same inner trajectory), so ``state.moments`` is left as it is."""
    g_p, g_w, (mu, rho) = statistic_outer_gradient(state, statistic, model, generator, inner=inner,
                                                   outer_samples=outer_samples, sample_rate=sample_rate)
    return apply_outer_gradient(state, model, g_p, g_w, mu=mu, rho=rho)
