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
"""

from __future__ import annotations

from dataclasses import dataclass, field, replace
from typing import Any

import torch

from ..models import DTYPE, Model
from ..models.bnn import MeanFieldGaussian
from .objective import AdamMoments, InnerConfig, inner_fit, outer_gradient


@dataclass
class WeightParam:
    """How the coreset weights v are parameterised (Section 3.2).

    ``kind="softmax"``: ``v = alpha * softmax(beta)`` with ``log alpha`` learned when
    ``learn_total`` (initialised at N: pseudo-evidence equal to the data's); ``kind="projected"``:
    ``v = scale * c`` with ``c >= 0`` projected after every step (Algorithms 3-5, ``max(v, 0)``),
    ``scale = N / M`` so one learning rate fits every N.
    """

    kind: str
    raw: torch.Tensor
    log_total: torch.Tensor | None = None
    scale: float = 1.0

    def weights(self) -> torch.Tensor:
        if self.kind == "softmax":
            assert self.log_total is not None
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
    d = model.param_dim
    dtype = state.mu.dtype
    inner_eps = torch.randn(inner.steps, inner.num_samples, d, generator=generator, dtype=dtype)
    outer_eps = torch.randn(outer_samples, d, generator=generator, dtype=dtype)
    family = MeanFieldGaussian(model.prior_scale)
    weights = state.weight.weights()
    g_points, g_weights, loss, (mu, rho, mom) = outer_gradient(
        state.points.detach(), weights.detach(), state.mu, state.rho, batch, state.num_records,
        inner_eps, outer_eps, model, family, inner, None if reset_moments else state.moments)
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
    state.mu, state.rho, state.moments = mu, rho, mom
    state.step += 1
    state.losses.append(float(loss))
    return state
