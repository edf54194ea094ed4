"""DP-PSVI: differentially private pseudocoreset variational inference (Section 3.3).

Identical to :class:`dpsummary.constructors.PSVI` except in the two places where the data enter.
Nothing here reads a record or draws privacy noise: the mechanism is
:meth:`dpsummary.private.mechanism.PrivateRecords.noisy_clipped_sum` (in the privacy boundary,
:mod:`dpsummary.private`); this constructor chooses its public inputs (the draws theta and the
clip norm C) and post-processes its noisy outputs.

* initialisation: pseudopoints are *simulated* from the model — a prior draw of theta, features
  from ``feature_sampler``, targets simulated (or, for count targets in a release, drawn from the
  released target marginal, ``target_sampler``) — with weights ``count / M`` where ``count`` is
  public or a DP estimate (never the exact N). The sampler is public (the schema's box, no
  privacy cost) or a post-processing of already released DP histograms
  (:mod:`dpsummary.private.marginals`, accounted by the caller; post-processing in
  :mod:`dpsummary.postprocess.marginals`); the clip-norm reference records
  use ``reference_feature_sampler`` (the public one in a release);
* the data term of the gradient: the Poisson-subsampled, clipped, noised sum of centred
  record log-likelihood vectors from :meth:`PrivateRecords.noisy_clipped_sum`, scaled by 1/q.

The clip norm C at each step is the median L2 norm of the pseudopoints' centred log-likelihood
vectors at that step (the paper's choice): a function of already-public quantities only.
Everything else (posterior draws, pseudopoint log-likelihoods, optimiser) is post-processing.
"""

from __future__ import annotations

import math
from collections.abc import Callable
from dataclasses import dataclass
from typing import Literal

import torch

from ..models import DTYPE, Model
from ..private.mechanism import PrivateRecords
from .psvi import (
    OptimizerFactory,
    PSVIState,
    ScheduleFactory,
    adam,
    apply_gradient,
    centred_loglik,
    exponential_decay,
    init_state,
    posterior_draws,
)

FeatureSampler = Callable[[int, torch.Generator], torch.Tensor]
#: ``(n, generator) -> (n,)`` initial targets (a public or already released marginal).
TargetSampler = Callable[[int, torch.Generator], torch.Tensor]

#: A public floor for the clip norm so that a degenerate pseudocoreset (all vectors zero)
#: never asks for a zero-sensitivity mechanism.
MIN_CLIP_NORM = 1e-6


def simulate_initial_points(
    model: Model,
    size: int,
    generator: torch.Generator,
    feature_sampler: FeatureSampler | None,
    *,
    theta_scale: float,
    target_sampler: TargetSampler | None = None,
) -> torch.Tensor:
    """Synthetic pseudopoints: theta0 ~ prior (scaled by ``theta_scale``), features public;
    targets simulated at theta0, or drawn from ``target_sampler`` (independently of the
    features) when given."""
    theta0 = model.prior_mean + theta_scale * (model.sample_prior(1, generator)[0] - model.prior_mean)
    features = None if feature_sampler is None else feature_sampler(size, generator)
    points = model.simulate(theta0, size, generator, features=features)
    if target_sampler is not None and model.has_target:
        points[:, -1] = target_sampler(size, generator).to(points.dtype)
    return points


@dataclass(frozen=True)
class DPPSVI:
    """The private constructor. All privacy parameters are fixed before any data is touched.

    ``sample_rate`` must already be quantised (:func:`dpsummary.private.noise.quantize_sample_rate`)
    so that the coins realise exactly the rate the accountant is told. ``record_count`` is a
    public or DP count used only for the initial weights.
    """

    noise_multiplier: float
    sample_rate: float
    record_count: float
    steps: int = 500
    num_samples: int = 100
    points_lr: float = 0.2
    weights_lr: float = 0.2
    optimizer: OptimizerFactory = adam
    schedule: ScheduleFactory | None = exponential_decay
    feature_sampler: FeatureSampler | None = None
    reference_feature_sampler: FeatureSampler | None = None
    #: Initial targets of the pseudopoints AND of the clip-norm reference records from this
    #: marginal (a post-processing of released histograms) instead of simulated; see
    #: :mod:`dpsummary.private.marginals` for why count targets need it.
    target_sampler: TargetSampler | None = None
    theta_scale: float = 1.0
    clip_multiplier: float = 1.0
    point_scale: tuple[float, ...] | None = None
    point_bounds: tuple[tuple[float, ...], tuple[float, ...]] | None = None
    fix_total_weight: bool = False
    clip_rule: Literal["pseudopoints", "synthetic"] = "pseudopoints"
    clip_quantile: float = 0.5
    num_reference: int = 1000
    reference_theta_scale: float = 0.0
    diagonal: bool = False
    name: str = "dp-psvi"

    def init(self, data: PrivateRecords, model: Model, size: int, generator: torch.Generator) -> PSVIState:
        points = simulate_initial_points(model, size, generator, self.feature_sampler, theta_scale=self.theta_scale,
                                         target_sampler=self.target_sampler)
        count = max(float(self.record_count), 1.0)
        weights = torch.full((size,), count / size, dtype=DTYPE)
        reference = None
        if self.clip_rule == "synthetic":
            # Public synthetic records spread over the public domain: the clip norm is a quantile
            # of THEIR vectors, so it tracks the scale of data-like records without reading any.
            # Their targets are simulated at reference_theta_scale x a prior draw; at the default
            # 0 (the prior mean) targets carry no relation to the features, so no pseudocoreset
            # posterior can come to "explain" the reference. With a random relation (the earlier
            # default, 0.3) a posterior that happened to agree with it shrank the reference norms,
            # hence C, until most real records were clipped and the data signal vanished: a trap
            # DP-PSVI could not leave (benchmarks/results/dp_diagnostics.md).
            reference = simulate_initial_points(
                model, self.num_reference, generator, self.reference_feature_sampler or self.feature_sampler,
                theta_scale=self.reference_theta_scale, target_sampler=self.target_sampler,
            )
        state = init_state(
            points,
            weights,
            model,
            optimizer=self.optimizer,
            points_lr=self.points_lr,
            weights_lr=self.weights_lr,
            schedule=self.schedule,
            steps=self.steps,
            point_scale=None if self.point_scale is None else torch.tensor(self.point_scale, dtype=DTYPE),
            point_bounds=None
            if self.point_bounds is None
            else (torch.tensor(self.point_bounds[0], dtype=DTYPE), torch.tensor(self.point_bounds[1], dtype=DTYPE)),
            total_weight=count if self.fix_total_weight else None,
        )
        if reference is not None:
            state.info["clip_reference"] = reference
        # Every step is the same unit mechanism (S draws, noise multiplier z): let the privacy
        # randomness draw the steps' noise ahead of use (public T, S, z; issue 15).
        expect = getattr(data, "expect_clipped_sums", None)
        if expect is not None:
            expect(num_draws=self.num_samples, noise_multiplier=self.noise_multiplier, count=self.steps)
        return state

    def num_steps(self, size: int) -> int:
        return self.steps

    def clip_norm(self, model: Model, state: PSVIState, theta: torch.Tensor) -> float:
        """C_t = clip_multiplier x the ``clip_quantile`` of the L2 norms of centred log-likelihood
        vectors at this step, over the pseudopoints (``clip_rule="pseudopoints"``; the paper's
        choice with the median and multiplier 1) or over a fixed set of public synthetic records
        (``"synthetic"``). Public either way: it depends only on released or simulated points and
        on the posterior draws."""
        ref = state.info.get("clip_reference") if self.clip_rule == "synthetic" else None
        pts = state.points.detach() if ref is None else ref
        with torch.no_grad():
            norms = centred_loglik(model, pts, theta).norm(dim=1)
        c = self.clip_multiplier * float(torch.quantile(norms, self.clip_quantile))
        return c if math.isfinite(c) and c > MIN_CLIP_NORM else MIN_CLIP_NORM

    def step(self, state: PSVIState, data: PrivateRecords, model: Model, generator: torch.Generator) -> PSVIState:
        posterior, theta = posterior_draws(state, model, self.num_samples, generator, diagonal=self.diagonal)
        clip = self.clip_norm(model, state, theta)
        noisy_sum = data.noisy_clipped_sum(
            model, theta, sample_rate=self.sample_rate, clip_norm=clip, noise_multiplier=self.noise_multiplier
        )
        return apply_gradient(state, model, theta, noisy_sum / self.sample_rate, posterior)

    def result(self, state: PSVIState) -> tuple[torch.Tensor, torch.Tensor]:
        return state.points.detach(), state.weights.detach()
