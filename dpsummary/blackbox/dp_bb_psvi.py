"""DP BB-PSVI's run around its mechanism (``dpsummary release --model bnn``, ``dp-bb-psvi``):
public defaults, public initial pseudopoints, the accountant's events, and the T outer steps.

Nothing here reads a record or draws privacy randomness. Each step asks the mechanism,
:func:`dpsummary.private.bnn.statistic` (Poisson sample, per-record statistic clipped to C, exact
sum, Gaussian noise once; derivation in :mod:`dpsummary.private.bnn`), for its noisy statistic
at public draws, and hands it to the shared BB-PSVI step
(:func:`dpsummary.blackbox.core.statistic_step`): post-processing. ``records`` is passed through
untouched (a :class:`~dpsummary.private.mechanism.PrivateRecords`, a tensor in tests and
benchmarks, or the self-test's lockstep double). ``generator`` drives only non-private
randomness (initial pseudopoints, variational draws).
"""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass
from typing import Any

import numpy as np
import torch

from ..models import DTYPE, Model
from ..models.bnn import BNN
from ..private import noise as noise_mod
from ..private.bnn import NoisyStatistic, statistic
from ..private.fixed_point import MechanismError
from .core import BBState, WeightParam, make_state, statistic_outer_gradient, statistic_step
from .objective import InnerConfig

#: Public defaults of ``dpsummary release --model bnn`` (chosen on synthetic halfmoon data in
#: benchmarks/results/bnn.md, "Private BNN coresets"; never on private data). Width 20 instead of
#: the benchmark's 100 keeps a default release to about a minute on this machine.
DEFAULT_WIDTHS: tuple[int, ...] = (20,)
DEFAULT_STEPS = 100
DEFAULT_CLIP_NORM = 5.0
DEFAULT_OUTER_SAMPLES = 10
DEFAULT_INNER_STEPS = 10
DEFAULT_WARMUP_STEPS = 200
DEFAULT_POINTS_LR = 0.01
DEFAULT_WEIGHTS_LR = 0.1
DEFAULT_INIT_SD = 1e-3
MECHANISM = "dp-bb-psvi"


def private_outer_gradient(state: BBState, records: Any, model: Model, generator: torch.Generator, *,
                           inner: InnerConfig, outer_samples: int, sample_rate: float, clip_norm: float,
                           noise_multiplier: float, mask: np.ndarray | None = None
                           ) -> tuple[torch.Tensor, torch.Tensor, NoisyStatistic, tuple[torch.Tensor, torch.Tensor]]:
    """Gradients of the private surrogate w.r.t. the state's points and weights: the shared
    :func:`dpsummary.blackbox.core.statistic_outer_gradient` with this module's mechanism
    (:func:`statistic`, released once, at the draws of the step's first pass) as the gradient
    statistic. Returns the released :class:`NoisyStatistic` too. ``generator`` drives only
    non-private randomness."""
    released: list[NoisyStatistic] = []

    def mechanism(theta: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor]:
        stat = statistic(records, model, theta, sample_rate=sample_rate, clip_norm=clip_norm,
                         noise_multiplier=noise_multiplier, mask=mask)
        released.append(stat)
        return stat.L, stat.G

    g_p, g_w, psi = statistic_outer_gradient(state, mechanism, model, generator, inner=inner,
                                             outer_samples=outer_samples, sample_rate=sample_rate)
    return g_p, g_w, released[0], psi


def public_init(model: BNN, size: int, generator: torch.Generator) -> torch.Tensor:
    """Initial pseudopoints from public information only: standard-normal features (the public
    transform standardises) and uniformly random hard labels (or targets 0 for regression)."""
    x = torch.randn(size, model.num_features, generator=generator, dtype=DTYPE)
    if model.likelihood == "softmax":
        idx = torch.randint(model.num_classes, (size,), generator=generator)
        y = torch.nn.functional.one_hot(idx, model.num_classes).to(DTYPE)
    elif model.likelihood == "bernoulli":
        y = torch.randint(2, (size, 1), generator=generator).to(DTYPE)
    else:
        y = torch.zeros(size, 1, dtype=DTYPE)
    return torch.cat([x, y], 1)


def privacy_events(noise_multiplier: float, sample_rate: float, steps: int) -> list:
    """The accountant's events for ``steps`` releases of :func:`noisy_statistic`."""
    from ..accounting import subsampled_gaussian_event

    return [subsampled_gaussian_event(noise_multiplier, noise_mod.quantize_sample_rate(sample_rate), steps)]


def private_step(state: BBState, records: Any, model: Model, generator: torch.Generator, *,
                 inner: InnerConfig, outer_samples: int, sample_rate: float, clip_norm: float,
                 noise_multiplier: float) -> BBState:
    """One DP outer step: the mechanism (:func:`statistic`), then the shared BB-PSVI step on the
    coreset (:func:`dpsummary.blackbox.core.statistic_step`: post-processing)."""

    def mechanism(theta: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor]:
        stat = statistic(records, model, theta, sample_rate=sample_rate, clip_norm=clip_norm,
                         noise_multiplier=noise_multiplier)
        return stat.L, stat.G

    return statistic_step(state, mechanism, model, generator, inner=inner, outer_samples=outer_samples,
                          sample_rate=sample_rate)


# ---------------------------------------------------------------------------------------------
# The release's private BB-PSVI run (dpsummary release --model bnn)
# ---------------------------------------------------------------------------------------------
def public_init_from_schema(model: BNN, size: int, generator: torch.Generator,
                            feature_sampler: Callable[[int, torch.Generator], torch.Tensor]) -> torch.Tensor:
    """Initial pseudopoints from public information only: features from ``feature_sampler``
    (the public transform's :meth:`~dpsummary.data.Transform.sample_public_features`: uniform
    over the policy's bounds, uniform categories), labels uniform on {0, 1} (Bernoulli) or
    targets 0, the centre of the public scaled range (Gaussian)."""
    x = feature_sampler(size, generator).to(DTYPE)
    if x.shape != (size, model.num_features):
        raise MechanismError("public feature sampler returned the wrong shape")
    if model.likelihood == "bernoulli":
        y = torch.randint(2, (size, 1), generator=generator).to(DTYPE)
    elif model.likelihood == "gaussian":
        y = torch.zeros(size, 1, dtype=DTYPE)
    else:
        idx = torch.randint(model.num_classes, (size,), generator=generator)
        y = torch.nn.functional.one_hot(idx, model.num_classes).to(DTYPE)
    return torch.cat([x, y], 1)


@dataclass(frozen=True)
class PrivateFit:
    """What :func:`fit_private` returns: the released coreset and the variational posterior of
    its last inner fit (all post-processing of the noisy sums and of public inputs)."""

    points: torch.Tensor
    weights: torch.Tensor
    mu: torch.Tensor
    rho: torch.Tensor


def fit_private(records: Any, model: BNN, *, size: int, steps: int, sample_rate: float, noise_multiplier: float,
                clip_norm: float, record_count: float, initial_points: torch.Tensor, generator: torch.Generator,
                inner: InnerConfig | None = None, outer_samples: int = DEFAULT_OUTER_SAMPLES,
                warmup_steps: int = DEFAULT_WARMUP_STEPS, points_lr: float = DEFAULT_POINTS_LR,
                weights_lr: float = DEFAULT_WEIGHTS_LR, init_sd: float = DEFAULT_INIT_SD,
                progress: Callable[[int, int], None] | None = None) -> PrivateFit:
    """DP BB-PSVI: ``steps`` accounted releases of :func:`statistic` (each a Poisson-subsampled
    Gaussian mechanism, noise multiplier ``noise_multiplier``, sensitivity ``clip_norm``:
    :func:`privacy_events`), each followed by one Adam step on the coreset (post-processing).

    ``records``: a :class:`PrivateRecords` (the release) or the self-test's lockstep double.
    ``initial_points`` and every argument except ``records`` must be public. ``generator``
    drives only non-private randomness (the variational draws); privacy coins and noise come
    from the records' privacy randomness."""
    if size < 1 or steps < 1:
        raise ValueError("size and steps must be positive")
    if initial_points.shape != (size, model.point_dim):
        raise ValueError("initial_points must have shape (size, point_dim)")
    cfg = inner if inner is not None else InnerConfig(steps=DEFAULT_INNER_STEPS)
    q = noise_mod.quantize_sample_rate(sample_rate)
    # Public start (no records): psi warmed up on the initial coreset, weights total * softmax.
    weight = WeightParam.softmax_fixed(size, max(float(record_count), 1.0))
    state = make_state(model, initial_points.to(DTYPE), weight, max(int(round(record_count)), 1), generator,
                       learn_points=True, learn_labels=True, points_lr=points_lr, weights_lr=weights_lr,
                       total_lr=0.0, inner=cfg, init_sd=init_sd, warmup_steps=warmup_steps)
    announce = getattr(records, "expect_clipped_sums", None)
    if announce is not None:
        # Public: T releases of K (d + 1) coordinates at noise multiplier sigma (unit mechanism).
        announce(num_draws=outer_samples * (model.param_dim + 1), noise_multiplier=noise_multiplier, count=steps)
    for t in range(steps):
        state = private_step(state, records, model, generator, inner=cfg, outer_samples=outer_samples,
                             sample_rate=q, clip_norm=clip_norm, noise_multiplier=noise_multiplier)
        if progress is not None:
            progress(t + 1, steps)
    with torch.no_grad():
        return PrivateFit(state.points.detach().clone(), state.weights.detach().clone(), state.mu.clone(),
                          state.rho.clone())
