"""Greedy sparse variational inference coresets (SparseVI; Campbell & Beronov 2019, Algorithm 1).

Each :meth:`SparseVI.step` is one outer iteration m of Algorithm 1:

1. *Greedy selection* (lines 4-9, eq. (10)-(11)). Draw S samples theta_s from the current coreset
   posterior pi_w, form the centred log-likelihood vectors g_hat_n (over the S draws) of a uniform
   candidate subsample U (the paper's Section 3.2 device for large N; ``subsample=None`` uses all
   records) and of the active points, and the residual error vector
   r_s = sum_n g_hat_n(theta_s) - sum_{m in I} w_m g_hat_m(theta_s), with the full-data sum
   estimated by N/|U| times the subsample's sum. Select the record maximising the correlation
   Corr_n = <g_hat_n, r> / (||g_hat_n|| ||r||) (the absolute correlation for already active
   points). A new point enters with weight 0 (line 9); re-selecting an active point adds
   nothing, so the coreset may end with fewer than M distinct points.
2. *Weight update* (lines 11-17, eq. (13)). ``inner_steps`` stochastic gradient steps on the active
   weights with grad_w KL = -Cov_w[g_I, r] estimated from S fresh draws, with the data term from
   a uniform minibatch of B records scaled by N/B (as in PSVI's estimator), each followed by the
   projection w <- max(w, 0).

Departures, documented: the optimiser and schedule are passed in (Adam with a geometric decay by
default instead of SGD with gamma_t ~ 1/t; both restart at every outer step, as the paper's
schedule does); because Adam's step is scale-free, its learning rate is set relative to the
natural weight scale, ``lr = weights_lr * N / k`` with k the number of active points (the
uniform coreset's weight); the posterior draws come from
:func:`dpsummary.inference.coreset_posterior` (exact, or Laplace warm-started from the previous
solution) instead of MCMC, as in the pseudocoreset papers' experiments.

Cost per outer step (N records, dimension d, S draws, k active points): selection
O(|U| S d) for the candidate log-likelihoods; each of the T inner steps O((B + k) S d) plus one
warm-started Newton solve on k points (O(k d^2 + d^3)). With the defaults (S = 100, T = 100,
B = 1000, |U| = 20000) on 48842 x 100-dimensional logistic data we measured 0.6-1.2 s per outer
step up to M = 100 on one (shared) CPU core, i.e. about 2 minutes for M = 100.
"""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import Any

import torch

from ..inference import GaussianPosterior, coreset_posterior, prior_posterior
from ..models import DTYPE, Model
from .psvi import OptimizerFactory, ScheduleFactory, adam, centred_loglik, exponential_decay


@dataclass(frozen=True)
class SparseVIState:
    """Active record indices (selection order), their weights and points, and the last posterior."""

    active: torch.Tensor  # (k,) long
    weights: torch.Tensor  # (k,)
    points: torch.Tensor  # (k, point_dim)
    posterior: GaussianPosterior
    step: int = 0
    info: dict[str, Any] = field(default_factory=dict)


@dataclass(frozen=True)
class SparseVI:
    """Greedy SparseVI (Algorithm 1) with Monte-Carlo covariance gradients (see module docstring)."""

    inner_steps: int = 100
    num_samples: int = 100
    batch_size: int = 1000
    subsample: int | None = 20000
    weights_lr: float = 0.1
    optimizer: OptimizerFactory = adam
    schedule: ScheduleFactory | None = exponential_decay
    diagonal: bool = False
    name: str = "sparsevi"

    def init(self, data: torch.Tensor, model: Model, size: int, generator: torch.Generator) -> SparseVIState:
        return SparseVIState(
            active=torch.zeros(0, dtype=torch.long),
            weights=torch.zeros(0, dtype=DTYPE),
            points=data[:0].detach().to(DTYPE).clone(),
            posterior=prior_posterior(model),
        )

    def num_steps(self, size: int) -> int:
        return size

    def _draws(
        self, model: Model, points: torch.Tensor, weights: torch.Tensor, warm: GaussianPosterior, generator: torch.Generator
    ) -> tuple[GaussianPosterior, torch.Tensor]:
        if points.shape[0] == 0:
            post = prior_posterior(model)
        else:
            post = coreset_posterior(model, points, weights, warm_start=warm, diagonal=self.diagonal)
        return post, post.sample(self.num_samples, generator)

    def select(
        self, state: SparseVIState, data: torch.Tensor, model: Model, generator: torch.Generator
    ) -> tuple[int, GaussianPosterior]:
        """Greedy selection (Algorithm 1, lines 4-8): the index of the record to add."""
        n = data.shape[0]
        post, theta = self._draws(model, state.points, state.weights, state.posterior, generator)
        if self.subsample is not None and self.subsample < n:
            cand = torch.randperm(n, generator=generator)[: self.subsample]
        else:
            cand = torch.arange(n)
        g_cand = centred_loglik(model, data[cand], theta)  # (U, S)
        residual = g_cand.sum(0) * (n / cand.shape[0])
        g_act = centred_loglik(model, state.points, theta)  # (k, S)
        residual = residual - state.weights @ g_act
        r_norm = residual.norm().clamp(min=1e-300)
        corr_cand = (g_cand @ residual) / (g_cand.norm(dim=1).clamp(min=1e-300) * r_norm)
        corr_cand[torch.isin(cand, state.active)] = -torch.inf  # active ones scored below
        corr_act = ((g_act @ residual) / (g_act.norm(dim=1).clamp(min=1e-300) * r_norm)).abs()
        scores = torch.cat([corr_cand, corr_act])
        best = int(torch.argmax(scores))
        index = int(cand[best]) if best < cand.shape[0] else int(state.active[best - cand.shape[0]])
        return index, post

    def step(self, state: SparseVIState, data: torch.Tensor, model: Model, generator: torch.Generator) -> SparseVIState:
        n = data.shape[0]
        index, post = self.select(state, data, model, generator)
        active, weights, points = state.active, state.weights, state.points
        if not bool((active == index).any()):  # line 9: new point, weight 0
            active = torch.cat([active, torch.tensor([index], dtype=torch.long)])
            weights = torch.cat([weights, torch.zeros(1, dtype=DTYPE)])
            points = torch.cat([points, data[index : index + 1].detach().to(DTYPE)])
        # Lines 11-17: projected stochastic gradient steps on the active weights.
        w = weights.detach().clone().requires_grad_(True)
        k = w.shape[0]
        opt = self.optimizer([{"params": [w], "lr": self.weights_lr * n / k}])
        sched = None if self.schedule is None else self.schedule(opt, self.inner_steps)
        b = min(self.batch_size, n)
        for _ in range(self.inner_steps):
            post, theta = self._draws(model, points, w.detach(), post, generator)
            batch = data[torch.randperm(n, generator=generator)[:b]] if b < n else data
            data_term = centred_loglik(model, batch, theta).sum(0) * (n / b)
            g_act = centred_loglik(model, points, theta)  # (k, S)
            residual = data_term - w.detach() @ g_act
            # eq. (13): D = -(1/S) sum_s g_hat_s g_hat_s^T (1 - w), restricted to the active set.
            opt.zero_grad(set_to_none=True)
            w.grad = -(g_act @ residual) / theta.shape[0]
            opt.step()
            if sched is not None:
                sched.step()
            with torch.no_grad():
                w.clamp_(min=0.0)
        return SparseVIState(
            active=active, weights=w.detach().clone(), points=points, posterior=post, step=state.step + 1
        )

    def result(self, state: SparseVIState) -> tuple[torch.Tensor, torch.Tensor]:
        return state.points, state.weights

