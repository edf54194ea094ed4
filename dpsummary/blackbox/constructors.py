"""Black-box coreset constructors behind dpsummary's one constructor interface.

Each class has ``init(data, model, size, generator) -> state``, ``num_steps(size)``,
``step(state, data, model, generator) -> state`` and ``result(state) -> (points, weights)``,
so :func:`dpsummary.constructors.fit` runs them unchanged. In addition ``variational(state)``
returns the fitted ``psi* = (mu, rho)`` of the mean-field family on the coreset, which the
predictive (eq. 18: draws from r corrected by importance weights) uses.

* :class:`BBPSVI` — black-box PSVI (Section 3.1, Algorithm 1 with eq. 9): learned pseudopoint
  locations, soft labels and weights ``v = alpha softmax(beta)`` (Section 3.2).
* :class:`BBSparseVI` — batch black-box Sparse VI (supplement Algorithm 4): locations fixed at
  M random records, weights learned with eq. 13, projected to ``v >= 0``.
* :class:`BBSparseVIIncremental` — incremental black-box Sparse VI (Algorithm 3): greedy
  selection by importance-weighted correlation with the residual, then weight refinement.
* :class:`BBPruning` — batch BB-SparseVI pruning (Algorithm 5): rounds of decreasing size,
  survivors drawn from Multinomial(v), weights and psi re-initialised every round.
* :class:`RandomSubsetVI` and :class:`FullDataVI` — the baselines: mean-field VI on M uniform
  records weighted N/M, and on the full data (minibatches, weights N/B). They share the model,
  the network and the variational family with the coreset methods.
"""

from __future__ import annotations

from dataclasses import dataclass, field, replace

import torch

from ..models import DTYPE, Model
from ..models.bnn import MeanFieldGaussian
from .core import BBState, WeightParam, make_state, outer_step, warm_up
from .objective import AdamMoments, InnerConfig, importance_log_weights, loglik_matrix


def _random_records(data: torch.Tensor, size: int, generator: torch.Generator) -> torch.Tensor:
    n = data.shape[0]
    return torch.randperm(n, generator=generator)[: min(size, n)]


class _OuterLoop:
    """The outer loop BB-PSVI and batch BB-SparseVI share: ``steps`` outer iterations of
    :func:`outer_step` (they differ only in what ``init`` makes learnable)."""

    steps: int
    inner: InnerConfig
    batch_size: int
    outer_samples: int

    def num_steps(self, size: int) -> int:
        return self.steps

    def step(self, state: BBState, data: torch.Tensor, model: Model, generator: torch.Generator) -> BBState:
        return outer_step(state, data, model, generator, inner=self.inner, batch_size=self.batch_size,
                          outer_samples=self.outer_samples, reset_moments=getattr(self, "reset_inner_moments", False))

    def result(self, state: BBState) -> tuple[torch.Tensor, torch.Tensor]:
        return state.points.detach().clone(), state.weights.detach().clone()

    def variational(self, state: BBState) -> tuple[torch.Tensor, torch.Tensor]:
        return state.mu, state.rho


@dataclass(frozen=True)
class BBPSVI(_OuterLoop):
    """Black-box PSVI. Defaults: 100 outer steps of 20 unrolled inner steps, minibatch 128."""

    steps: int = 100
    inner: InnerConfig = field(default_factory=InnerConfig)
    batch_size: int = 128
    outer_samples: int = 10
    points_lr: float = 0.01
    weights_lr: float = 0.1
    total_lr: float = 0.001
    learn_labels: bool = True
    learn_total: bool = True
    init_sd: float = 1e-3
    warmup_steps: int = 200
    lr_decay: float | None = None
    #: Start the inner Adam from zero moments at every outer step (the authors' code), instead
    #: of carrying them over (the default).
    reset_inner_moments: bool = False
    #: Initial variational means: ``"he"`` (default) or ``"uniform"`` (torch.nn.Linear's, as in
    #: the authors' code); see :meth:`MeanFieldGaussian.init`.
    init_scheme: str = "he"
    name: str = "bb-psvi"

    def init(self, data: torch.Tensor, model: Model, size: int, generator: torch.Generator) -> BBState:
        n = data.shape[0]
        idx = _random_records(data, size, generator)
        weight = WeightParam.softmax(idx.numel(), float(n), learn_total=self.learn_total, dtype=data.dtype)
        return make_state(model, data[idx], weight, n, generator, learn_points=True, learn_labels=self.learn_labels,
                          points_lr=self.points_lr, weights_lr=self.weights_lr, total_lr=self.total_lr,
                          inner=self.inner, init_sd=self.init_sd, warmup_steps=self.warmup_steps,
                          lr_decay=self.lr_decay, steps=self.steps, init_scheme=self.init_scheme)


@dataclass(frozen=True)
class BBSparseVI(_OuterLoop):
    """Batch black-box Sparse VI (Algorithm 4): weights on M fixed random records."""

    steps: int = 100
    inner: InnerConfig = field(default_factory=InnerConfig)
    batch_size: int = 128
    outer_samples: int = 10
    weights_lr: float = 0.05
    init_sd: float = 1e-3
    warmup_steps: int = 200
    name: str = "bb-sparsevi"

    def init(self, data: torch.Tensor, model: Model, size: int, generator: torch.Generator) -> BBState:
        n = data.shape[0]
        idx = _random_records(data, size, generator)
        m = idx.numel()
        weight = WeightParam.projected(torch.full((m,), n / m, dtype=DTYPE), n / m)
        return make_state(model, data[idx], weight, n, generator, learn_points=False, learn_labels=False,
                          points_lr=0.0, weights_lr=self.weights_lr, total_lr=0.0, inner=self.inner,
                          init_sd=self.init_sd, warmup_steps=self.warmup_steps)


@dataclass
class IncrementalState:
    """State of :class:`BBSparseVIIncremental`: selected record indices and their BB state."""

    indices: list[int]
    bb: BBState | None
    mu: torch.Tensor
    rho: torch.Tensor
    moments: AdamMoments | None = None


@dataclass(frozen=True)
class BBSparseVIIncremental:
    """Incremental black-box Sparse VI (Algorithm 3). One step adds (at most) one record.

    Selection: with S draws from r(psi) corrected by importance weights ``wt`` (eq. 6), the
    log-likelihood vectors are centred with ``wt``; the next record maximises the
    ``wt``-weighted correlation of its vector with the residual ``(N/B) 1^T g'_s - v^T g_s``
    (absolute value for records already in the coreset). Then ``weight_steps`` outer steps of
    eq. 13 refine the weights (new weight starts at 0, ``v >= 0`` projected).
    """

    inner: InnerConfig = field(default_factory=InnerConfig)
    weight_steps: int = 20
    batch_size: int = 128
    num_samples: int = 64
    outer_samples: int = 10
    weights_lr: float = 0.1
    init_sd: float = 1e-3
    warmup_steps: int = 100
    name: str = "bb-sparsevi-incremental"

    def init(self, data: torch.Tensor, model: Model, size: int, generator: torch.Generator) -> IncrementalState:
        mu, rho = MeanFieldGaussian.init(model, generator, init_sd=self.init_sd)
        return IncrementalState([], None, mu, rho)

    def num_steps(self, size: int) -> int:
        return size

    def _draws(self, state: IncrementalState, model: Model, generator: torch.Generator
               ) -> tuple[torch.Tensor, torch.Tensor]:
        d = model.param_dim
        if state.bb is None:  # empty coreset: its posterior is the prior, exactly
            theta = model.sample_prior(self.num_samples, generator)
            return theta, torch.full((self.num_samples,), 1.0 / self.num_samples, dtype=DTYPE)
        family = MeanFieldGaussian(model.prior_scale)
        eps = torch.randn(self.num_samples, d, generator=generator, dtype=DTYPE)
        mu, rho = state.bb.mu, state.bb.rho
        theta = family.sample(mu, rho, eps)
        w = state.bb.weights.detach()
        core_ll = loglik_matrix(model, state.bb.points.detach(), theta) @ w
        return theta, torch.softmax(importance_log_weights(mu, rho, theta, core_ll, model, family), 0)

    def step(self, state: IncrementalState, data: torch.Tensor, model: Model, generator: torch.Generator
             ) -> IncrementalState:
        n = data.shape[0]
        b = min(self.batch_size, n)
        bidx = torch.randperm(n, generator=generator)[:b]
        with torch.no_grad():
            theta, wt = self._draws(state, model, generator)
            def centred(points: torch.Tensor) -> torch.Tensor:
                ll = loglik_matrix(model, points, theta)  # (S, n)
                return ll - wt @ ll
            gb = centred(data[bidx])
            if state.bb is not None:
                gc = centred(state.bb.points.detach())
                resid = gb.sum(1) * (n / b) - gc @ state.bb.weights.detach()
            else:
                gc = torch.zeros(self.num_samples, 0, dtype=DTYPE)
                resid = gb.sum(1) * (n / b)

            def corr(g: torch.Tensor) -> torch.Tensor:
                sd = (wt @ (g * g)).sqrt().clamp(min=1e-12)
                return (wt @ (g * resid[:, None])) / sd
            scores = torch.cat([corr(gc).abs(), corr(gb)])
            best = int(scores.argmax())
        if best < gc.shape[1]:
            new_index = state.indices[best]
        else:
            new_index = int(bidx[best - gc.shape[1]])
        indices = state.indices if new_index in state.indices else [*state.indices, new_index]
        old = {i: float(w) for i, w in zip(state.indices, state.bb.weights.detach(), strict=True)} if state.bb else {}
        scale = n / max(len(indices), 1)
        init_w = torch.tensor([old.get(i, 0.0) for i in indices], dtype=DTYPE)
        if state.bb is None:
            # Algorithm 3 starts the new weight at 0; for the first point that would leave the
            # ELBO without data, so it starts at N (the full-data evidence).
            init_w = torch.full_like(init_w, float(n))
        weight = WeightParam.projected(init_w, scale)
        points = data[torch.tensor(indices)]
        if state.bb is None:
            mu, rho, mom = warm_up(model, points, weight.weights(), state.mu, state.rho, self.inner,
                                   self.warmup_steps, generator)
        else:
            mu, rho, mom = state.bb.mu, state.bb.rho, state.bb.moments
        opt = torch.optim.Adam([{"params": [weight.raw], "lr": self.weights_lr}])
        bb = BBState(points.clone(), weight, mu, rho, mom, opt, n, learn_points=False, learn_labels=False)
        for _ in range(self.weight_steps):
            bb = outer_step(bb, data, model, generator, inner=self.inner, batch_size=self.batch_size,
                            outer_samples=self.outer_samples)
        return IncrementalState(indices, bb, bb.mu, bb.rho, bb.moments)

    def result(self, state: IncrementalState) -> tuple[torch.Tensor, torch.Tensor]:
        if state.bb is None:
            raise ValueError("no step taken yet")
        return state.bb.points.detach().clone(), state.bb.weights.detach().clone()

    def variational(self, state: IncrementalState) -> tuple[torch.Tensor, torch.Tensor]:
        return state.mu, state.rho


@dataclass
class PruningState:
    round: int
    round_step: int
    bb: BBState
    sizes: tuple[int, ...]


@dataclass(frozen=True)
class BBPruning:
    """Batch BB-SparseVI with pruning (Algorithm 5): sizes ``factors * M`` down to M.

    Every round starts from ``C_i`` distinct records drawn from Multinomial(v) over the current
    coreset (without replacement, so exactly ``C_i`` survive), weights reset to ``N / C_i`` and
    psi re-initialised; ``round_steps`` outer steps per round.
    """

    factors: tuple[float, ...] = (5.0, 2.0)
    round_steps: int = 50
    inner: InnerConfig = field(default_factory=InnerConfig)
    batch_size: int = 128
    outer_samples: int = 10
    weights_lr: float = 0.05
    init_sd: float = 1e-3
    warmup_steps: int = 100
    name: str = "bb-sparsevi-pruning"

    def _sizes(self, size: int, n: int) -> tuple[int, ...]:
        sizes = [min(n, max(size, int(round(f * size)))) for f in self.factors] + [min(size, n)]
        return tuple(sorted(set(sizes), reverse=True))

    def _batch(self) -> BBSparseVI:
        return BBSparseVI(inner=self.inner, batch_size=self.batch_size, outer_samples=self.outer_samples,
                          weights_lr=self.weights_lr, init_sd=self.init_sd, warmup_steps=self.warmup_steps)

    def init(self, data: torch.Tensor, model: Model, size: int, generator: torch.Generator) -> PruningState:
        sizes = self._sizes(size, data.shape[0])
        return PruningState(0, 0, self._batch().init(data, model, sizes[0], generator), sizes)

    def num_steps(self, size: int) -> int:
        return self.round_steps * len(self.factors) + self.round_steps

    def step(self, state: PruningState, data: torch.Tensor, model: Model, generator: torch.Generator) -> PruningState:
        bb = state.bb
        rnd, rstep = state.round, state.round_step
        if rstep == self.round_steps and rnd + 1 < len(state.sizes):
            rnd, rstep = rnd + 1, 0
            c = state.sizes[rnd]
            w = bb.weights.detach()
            keep = torch.multinomial(w / w.sum(), min(c, int((w > 0).sum())), replacement=False, generator=generator)
            n = data.shape[0]
            m = keep.numel()
            weight = WeightParam.projected(torch.full((m,), n / m, dtype=DTYPE), n / m)
            bb = make_state(model, bb.points.detach()[keep], weight, n, generator, learn_points=False,
                            learn_labels=False, points_lr=0.0, weights_lr=self.weights_lr, total_lr=0.0,
                            inner=self.inner, init_sd=self.init_sd, warmup_steps=self.warmup_steps)
        bb = outer_step(bb, data, model, generator, inner=self.inner, batch_size=self.batch_size,
                        outer_samples=self.outer_samples)
        return replace(state, round=rnd, round_step=rstep + 1, bb=bb)

    def result(self, state: PruningState) -> tuple[torch.Tensor, torch.Tensor]:
        return state.bb.points.detach().clone(), state.bb.weights.detach().clone()

    def variational(self, state: PruningState) -> tuple[torch.Tensor, torch.Tensor]:
        return state.bb.mu, state.bb.rho


# ---------------------------------------------------------------------------------------------
# Baselines: plain mean-field VI (no bilevel gradient), same model and family
# ---------------------------------------------------------------------------------------------
@dataclass
class VIState:
    points: torch.Tensor
    weights: torch.Tensor
    mu: torch.Tensor
    rho: torch.Tensor
    moments: AdamMoments | None


@dataclass(frozen=True)
class RandomSubsetVI:
    """Random subset of M records with uniform weights N/M, then mean-field VI on it.

    ``steps`` chunks of ``inner.steps`` VI steps each (so one step costs what one BB-PSVI
    inner loop costs, without the outer gradient)."""

    steps: int = 100
    inner: InnerConfig = field(default_factory=InnerConfig)
    init_sd: float = 1e-3
    init_scheme: str = "he"
    name: str = "random-subset-vi"

    def init(self, data: torch.Tensor, model: Model, size: int, generator: torch.Generator) -> VIState:
        n = data.shape[0]
        idx = _random_records(data, size, generator)
        mu, rho = MeanFieldGaussian.init(model, generator, init_sd=self.init_sd, dtype=data.dtype,
                                         scheme=self.init_scheme)
        return VIState(data[idx].clone(), torch.full((idx.numel(),), n / idx.numel(), dtype=data.dtype), mu, rho,
                       None)

    def num_steps(self, size: int) -> int:
        return self.steps

    def step(self, state: VIState, data: torch.Tensor, model: Model, generator: torch.Generator) -> VIState:
        mu, rho, mom = warm_up(model, state.points, state.weights, state.mu, state.rho, self.inner, self.inner.steps,
                               generator, state.moments)
        return replace(state, mu=mu, rho=rho, moments=mom)

    def result(self, state: VIState) -> tuple[torch.Tensor, torch.Tensor]:
        return state.points, state.weights

    def variational(self, state: VIState) -> tuple[torch.Tensor, torch.Tensor]:
        return state.mu, state.rho


@dataclass(frozen=True)
class FullDataVI:
    """Mean-field VI on the full data: each step is ``inner.steps`` Adam steps, each on a fresh
    minibatch of ``batch_size`` records weighted N/B. ``result`` is the data itself (weights 1);
    its predictive uses r(psi) without importance correction (there is no coreset)."""

    steps: int = 100
    inner: InnerConfig = field(default_factory=InnerConfig)
    batch_size: int = 128
    init_sd: float = 1e-3
    init_scheme: str = "he"
    name: str = "full-data-vi"

    def init(self, data: torch.Tensor, model: Model, size: int, generator: torch.Generator) -> VIState:
        mu, rho = MeanFieldGaussian.init(model, generator, init_sd=self.init_sd, dtype=data.dtype,
                                         scheme=self.init_scheme)
        return VIState(data, torch.ones(data.shape[0], dtype=data.dtype), mu, rho, None)

    def num_steps(self, size: int) -> int:
        return self.steps

    def step(self, state: VIState, data: torch.Tensor, model: Model, generator: torch.Generator) -> VIState:
        n = data.shape[0]
        b = min(self.batch_size, n)
        mu, rho, mom = state.mu, state.rho, state.moments
        one = replace(self.inner, steps=1)
        for _ in range(self.inner.steps):
            idx = torch.randperm(n, generator=generator)[:b]
            mu, rho, mom = warm_up(model, data[idx], torch.full((b,), n / b, dtype=data.dtype), mu, rho, one, 1,
                                   generator, mom)
        return replace(state, mu=mu, rho=rho, moments=mom)

    def result(self, state: VIState) -> tuple[torch.Tensor, torch.Tensor]:
        return state.points, state.weights

    def variational(self, state: VIState) -> tuple[torch.Tensor, torch.Tensor]:
        return state.mu, state.rho
