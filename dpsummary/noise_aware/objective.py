"""Objective perturbation as the last round of logistic regression's rounds (issue 50's next
design; ``--mechanism noise-aware-objective``, an option, not a default): its public plan, its
privacy events and their calibration, and the last round it releases. Post-processing and
public arithmetic only: the records are reached through the callables a mechanism passes in
(:meth:`dpsummary.private.mechanism.PrivateRecords.perturbed_mode` and ``noisy_curvature``).

The arm the forty-eighth rule judged (``OP-1``, ``benchmarks/notebook/objective_perturbation.md``):

1. today's logistic schedule's first Newton round (its shares) places the anchor;
2. objective perturbation (:func:`dpsummary.private.objective.perturbed_mode`) spends the rest,
   split between its tilt and a curvature sum at its output in the proportions of today's last
   round, with the ridge centred at that anchor and sized so that its Jacobian term is
   :data:`OP_JACOBIAN_SHARE` of the release's epsilon, and output perturbation of multiplier
   :data:`OP_OUTPUT_MULTIPLIER` on the solver's tolerance;
3. the perturbed mode is read as a Newton round at that point (its score is ``ridge (theta -
   centre)`` up to the tilt: :class:`~dpsummary.private.objective.PerturbedMode`), so today's
   released posterior (imputed curvature, trace, relations, support) reads it unchanged.

Privacy: the placement round's two Gaussians, :class:`dpsummary.objective_event.ObjectivePerturbationDpEvent`,
the output perturbation's Gaussian and the curvature's Gaussian (:meth:`ObjectiveSchedule.events`).
Only the RDP accountant composes them, so :func:`calibrate_objective` refuses another.
"""

from __future__ import annotations

import dataclasses
import math
from collections.abc import Callable, Sequence
from dataclasses import dataclass
from typing import Any

import torch

from .. import accounting as acc
from ..models import Model
from ..models.glm import GLM
from ..objective_event import (
    TILT_GRID_RATIO,
    ObjectivePerturbationDpEvent,
    objective_perturbation_jacobian,
)
from .released import BoundsFn, LastRoundFn, RoundRelease
from .schedule import Schedule

#: The share of the release's epsilon the ridge's Jacobian term costs (it sets the ridge; fixed
#: before any run of the forty-sixth rule, never varied).
OP_JACOBIAN_SHARE = 0.05
#: The output perturbation's noise multiplier on its sensitivity ``2 gamma / ridge`` (the solver's
#: tolerance is tiny, so large multipliers cost almost nothing and add almost no noise).
OP_OUTPUT_MULTIPLIER = 1000.0

#: ``(centre, ridge, noise multiplier, output multiplier) -> (theta, score, score noise sd)``:
#: the perturbed mode (PrivateRecords.perturbed_mode's, read as a round).
PerturbFn = Callable[[torch.Tensor, float, float, float], tuple[torch.Tensor, torch.Tensor, float]]
#: ``(theta, curvature bound, noise multiplier) -> noisy curvature sum`` at a public ``theta``.
CurvatureFn = Callable[[torch.Tensor, float, float], torch.Tensor]


@dataclass(frozen=True)
class ObjectiveSchedule:
    """The public plan: ``schedule`` holds the placement round(s) and, as its last pair, the
    (tilt, curvature) shares; ``ridge`` (centred at the last placement anchor) and ``jacobian``
    its Jacobian term; ``dim`` the parameter dimension; ``design_norm`` the score bound ``L``."""

    schedule: Schedule
    ridge: float
    jacobian: float
    dim: int
    design_norm: float

    def events(self, sigma: float) -> list[Any]:
        """The events at single scale ``sigma`` (every part at ``sigma / sqrt(share)``), in the
        order they run."""
        *placement, (tilt, curvature) = self.schedule.noise_multipliers(sigma)
        return [*(acc.gaussian_event(m) for pair in placement for m in pair),
                ObjectivePerturbationDpEvent(noise_multiplier=tilt, jacobian_log_ratio=self.jacobian, dim=self.dim,
                                             grid_ratio=TILT_GRID_RATIO),
                acc.gaussian_event(OP_OUTPUT_MULTIPLIER), acc.gaussian_event(curvature)]

    def as_dict(self) -> dict[str, Any]:
        return {**self.schedule.as_dict(), "objective_perturbation": {
            "ridge": self.ridge, "jacobian_log_ratio": self.jacobian, "jacobian_share": OP_JACOBIAN_SHARE,
            "output_multiplier": OP_OUTPUT_MULTIPLIER, "tilt_grid_ratio": TILT_GRID_RATIO,
            "tilt": "OpenDP discrete Gaussian on a grid of at most 2^-40 sd plus a uniform dither, from OS entropy"}}


def objective_schedule(model: Model, *, epsilon: float, feature_norm: float,
                       jacobian_share: float = OP_JACOBIAN_SHARE) -> ObjectiveSchedule:
    """The plan for logistic ``model`` at the release's ``epsilon`` and the public feature norm
    (see the module docstring); ``jacobian_share`` (public) sets the ridge (:func:`ridge_for`).
    Public arithmetic only."""
    if getattr(model, "name", "") != "logistic":
        raise ValueError("objective perturbation is implemented for logistic regression only")
    if not (epsilon > 0 and math.isfinite(epsilon)):
        raise ValueError("epsilon must be positive and finite")
    base = Schedule.default(model)
    first, last = base.rounds[0], base.rounds[-1]
    rest = 1.0 - sum(first)
    shares = (rest * last[0] / sum(last), rest * last[1] / sum(last))
    schedule = dataclasses.replace(base, rounds=(first, shares))
    assert isinstance(model, GLM)  # logistic, checked above
    design_norm = model.design_norm_bound(feature_norm)
    ridge = ridge_for(design_norm, epsilon, jacobian_share)
    # Derived from the ridge used (one record's curvature bound, s(1 - s) <= 1/4), not stated beside it.
    jacobian = objective_perturbation_jacobian(curvature_bound=design_norm**2 / 4.0, ridge=ridge)
    return ObjectiveSchedule(schedule=schedule, ridge=ridge, jacobian=jacobian, dim=model.param_dim,
                             design_norm=design_norm)


def calibrate_objective(plan: ObjectiveSchedule, *, target_epsilon: float, delta: float,
                        prior_events: Sequence[Any] = (), accountant: acc.Accountant = "rdp",
                        rel_tol: float = 1e-6) -> tuple[float, list[Any]]:
    """The smallest single scale ``sigma`` (to ``rel_tol``) whose events (:meth:`ObjectiveSchedule.events`),
    after ``prior_events``, compose to at most ``target_epsilon`` (:func:`calibrate_rdp_scale`)."""
    return calibrate_rdp_scale(plan.events, target_epsilon=target_epsilon, delta=delta, prior_events=prior_events,
                               accountant=accountant, rel_tol=rel_tol)


def calibrate_rdp_scale(events_of: Callable[[float], list[Any]], *, target_epsilon: float, delta: float,
                        prior_events: Sequence[Any] = (), accountant: acc.Accountant = "rdp",
                        rel_tol: float = 1e-6) -> tuple[float, list[Any]]:
    """The smallest scale ``sigma`` (to ``rel_tol``) with ``events_of(sigma)`` after
    ``prior_events`` composing to at most ``target_epsilon`` under RDP (every event's noise grows
    with ``sigma``), bisected on the vectorised series and confirmed with Opacus's own loop for
    the Gaussian parts (:func:`dpsummary.accounting.epsilon_rdp_opacus`); ``ValueError`` when the
    target cannot be met or the accountant is not RDP (objective perturbation's event is RDP only)."""
    if accountant != "rdp":
        raise ValueError("objective perturbation is accounted by the RDP accountant only")
    prior = list(prior_events)

    def eps(sigma: float, exact: bool = False) -> float:
        events = [*prior, *events_of(sigma)]
        return acc.epsilon_rdp_opacus(events, delta) if exact else acc.epsilon(events, delta, "rdp")

    lo, hi = 1e-3, acc.MAX_SIGMA
    if eps(hi) > target_epsilon:
        raise ValueError(f"objective perturbation cannot meet epsilon {target_epsilon:.6g} at delta {delta:.3g}")
    while hi / lo > 1.0 + rel_tol:
        mid = math.sqrt(lo * hi)
        lo, hi = (mid, hi) if eps(mid) > target_epsilon else (lo, mid)
    for _ in range(50):
        if eps(hi, exact=True) <= target_epsilon:
            return hi, events_of(hi)
        hi *= 1.0 + rel_tol
    raise RuntimeError("the objective perturbation's calibration could not be confirmed by the accountant")


def ridge_for(design_norm: float, epsilon: float, jacobian_share: float = OP_JACOBIAN_SHARE) -> float:
    """The ridge whose Jacobian term is ``jacobian_share`` (default :data:`OP_JACOBIAN_SHARE`) of
    ``epsilon`` for records of design norm at most ``design_norm`` (one record's curvature at most
    ``design_norm^2 / 4``)."""
    if not 0 < jacobian_share < 1:
        raise ValueError("the Jacobian share must lie in (0, 1)")
    return (design_norm**2 / 4.0) / -math.expm1(-jacobian_share * epsilon)


def objective_round(plan: ObjectiveSchedule, perturb: PerturbFn, curvature: CurvatureFn,
                    bounds: BoundsFn) -> LastRoundFn:
    """The last round for :func:`dpsummary.noise_aware.fit`: objective perturbation with the ridge
    centred at the current anchor, then the curvature sum at its output, read as a Newton round
    there (score bound ``L``, score noise the tilt's and the output perturbation's, curvature
    bound the model's at that point)."""

    def last(anchor: torch.Tensor, multipliers: tuple[float, float]) -> RoundRelease:
        tilt_multiplier, curvature_multiplier = multipliers
        theta, score, score_noise_std = perturb(anchor, plan.ridge, tilt_multiplier, OP_OUTPUT_MULTIPLIER)
        curvature_bound = bounds(theta)[1]
        noisy = curvature(theta, curvature_bound, curvature_multiplier)
        return RoundRelease(anchor=theta, score=score, curvature=noisy, score_bound=plan.design_norm,
                            curvature_bound=curvature_bound, score_noise_std=score_noise_std,
                            curvature_noise_std=curvature_multiplier * curvature_bound)

    return last


def records_round(plan: ObjectiveSchedule, records: Any, model: Model, *, feature_norm: float,
                  bounds: BoundsFn) -> LastRoundFn:
    """:func:`objective_round` over a :class:`~dpsummary.private.mechanism.PrivateRecords`
    (``perturbed_mode`` and ``noisy_curvature``, the privacy boundary). The score read at the
    output carries the tilt and, through ``ridge * theta``, the output perturbation's tiny
    noise: both enter its noise sd."""

    def perturb(centre: torch.Tensor, ridge: float, tilt_mult: float, out_mult: float
                ) -> tuple[torch.Tensor, torch.Tensor, float]:
        mode = records.perturbed_mode(model, feature_norm=feature_norm, ridge=ridge, centre=centre,
                                      noise_multiplier=tilt_mult, output_multiplier=out_mult)
        return mode.theta, mode.score, math.hypot(mode.score_noise_std, ridge * mode.output_noise_std)

    def curvature(theta: torch.Tensor, bound: float, mult: float) -> torch.Tensor:
        return records.noisy_curvature(model, theta, curvature_bound=bound, noise_multiplier=mult)

    return objective_round(plan, perturb, curvature, bounds)
