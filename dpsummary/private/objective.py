"""Objective perturbation for logistic regression: the perturbed mode, and a curvature at it.

Issue 50's next design (``benchmarks/notebook/objective_perturbation.md``): the Newton rounds'
last expansion is read at an anchor the rounds leave short of the mode; objective perturbation
(Chaudhuri, Monteleoni and Sarwate 2011; Kifer, Smith and Thakurta 2012, Gaussian noise) releases
the minimiser of a randomly tilted objective instead, so the anchor is the mode up to the noise.
Called by the release option ``--mechanism noise-aware-objective`` (through
:class:`~dpsummary.private.mechanism.PrivateRecords`) and by the arms of
``benchmarks/noise_aware_variants.py``; the ledger accounts for it
(:class:`dpsummary.objective_event.ObjectivePerturbationDpEvent`, RDP only).

The mechanism (:func:`perturbed_mode`). With the records' design rows ``z_i = [1, x_i]`` projected
to ``||x_i|| <= feature_norm`` (so ``||z_i|| <= L``), targets clamped to [0, 1] and non-finite
entries set to 0 (a total per-record function), a public ridge ``lam > 0`` centred at a public
``centre`` and ``b ~ N(0, (z L)^2 I_d)`` from the caller's privacy randomness, it minimises

    J(theta) = - sum_i log p(y_i | z_i, theta) + lam / 2 ||theta - centre||^2 + b^T theta

by damped Newton until the gradient's norm is at most ``GRADIENT_TOLERANCE * L``,
then adds ``N(0, (output_multiplier * 2 gamma / lam)^2 I_d)`` to the iterate (``gamma`` that
tolerance plus the tilt's float rounding, below): approximate minima
perturbation (Iyengar, Near, Song, Thakkar, Thakurta and Wang 2019). ``J`` is ``lam``-strongly
convex, so the iterate is within ``gamma / lam`` of the exact minimiser ``theta_P``; given
``theta_P``, neighbours' iterates differ by at most ``2 gamma / lam``, so the released point is
an adaptive composition of objective perturbation (releasing ``theta_P``) and a Gaussian mechanism
of sensitivity ``2 gamma / lam`` and multiplier ``output_multiplier``, then post-processing.

Privacy of ``theta_P`` (add/remove-one adjacency; :func:`dpsummary.rdp_curves.objective_perturbation_rdp`).
``b -> theta_P`` is a bijection (``b = -grad J_0(theta_P)`` for the strongly convex untilted ``J_0``),
so ``theta_P`` has density ``phi(b_D(theta)) det(Hess J_0,D(theta))``. For ``D = D' + {z}`` at any
``theta``: ``b_D' = b_D + c z`` with ``c = y - s(z^T theta)``, ``|c| <= 1``, and the Hessians differ by
``s(1 - s) z z^T``, whose determinant ratio lies in ``[1, 1 + L^2 / (4 lam)]`` (every eigenvalue of
the smaller Hessian is at least ``lam``). The privacy loss is therefore at most
``log(1 + beta / lam) + (L |w| + L^2 / 2) / sigma^2`` with ``w = b^T z / ||z||`` ~ N(0, sigma^2) and
``beta = L^2 / 4``; the other direction has the same bound without the determinant term. With
``E exp(t |w|) = 2 exp(t^2 sigma^2 / 2) Phi(t sigma)`` the Renyi divergence of order ``alpha`` is at most

    -log(1 - beta / lam) + alpha / (2 z^2) + log(2 Phi((alpha - 1) / z)) / (alpha - 1),   z = sigma / L,

(``-log(1 - beta / lam) >= log(1 + beta / lam)``; the form of Redberg, Koskela and Wang 2023),
checked against the exact divergence of a one-dimensional instance by numerical integration
(``tests/private/test_objective_perturbation.py``).

**The tilt the release draws** (:meth:`~dpsummary.private.randomness.TiltRandomness.tilt`).
The proof is a change of variables, so ``b`` needs a density; the release's discrete Gaussian has
none (the tilt that maps a neighbour to the same ``theta`` lies off its grid), and a textbook float
Gaussian has one only in exact arithmetic. :class:`~dpsummary.private.mechanism.SystemRandomness`
draws ``g (K + U)`` instead (:func:`dpsummary.private.noise.dithered_gaussian`: OpenDP's exact
discrete Gaussian on a grid ``g <= 2^-40 sigma``, plus a uniform dither from OS entropy), whose
density is piecewise constant; :func:`dpsummary.objective_event.dithered_objective_perturbation_rdp`
is the bound above proved for it (``L`` grows by ``g sqrt(d)`` and ``log(2 Phi)`` becomes
``log 2``; the calibrated multipliers agree to about 1e-6). The float value differs from the ideal
draw by at most :func:`dpsummary.private.noise.tilt_rounding_bound` (on an event of probability
at least ``1 - exp(-991 d)``, which the conversion's delta absorbs), so the iterate is a
``gamma``-approximate minimiser of the ideal tilt's objective with ``gamma`` = the solver's
tolerance plus that bound, and the output perturbation is sized on that ``gamma`` (and on
OpenDP's input rounding, :func:`dpsummary.private.noise.rounding_slack`). Seeded benchmark doubles
draw a continuous Gaussian and account it with the same dithered curve.

Privacy caveats: ``feature_norm``, ``lam``, ``centre`` and the multipliers must be public
(functions of the policy, the schema and earlier DP outputs). Nothing leaves this module but the
released point (and :func:`noisy_curvature`'s matrix); the record count is never returned. The
solver cannot fail in exact arithmetic (a strongly convex, smooth objective); if floating point
stops it above its tolerance it raises :class:`~dpsummary.private.fixed_point.MechanismError`
(a bug: the privacy argument needs the tolerance), never a silent result.
"""

from __future__ import annotations

import math
from collections.abc import Iterator
from dataclasses import dataclass
from typing import TYPE_CHECKING

import numpy as np
import torch

from ..models import DTYPE, Model
from ..models.glm import GLM

if TYPE_CHECKING:
    from .randomness import PrivacyRandomness, TiltRandomness
    from .store import RecordStore

#: The solver's stopping tolerance on the objective's gradient norm, as a fraction of the design
#: norm bound ``L`` (public). Float64 sums of up to 10^8 records err far below it.
GRADIENT_TOLERANCE = 1e-7
#: Newton iterations before the solver gives up (a bug; see the module docstring).
MAX_ITERATIONS = 500


@dataclass(frozen=True)
class PerturbedMode:
    """The DP output of :func:`perturbed_mode` and the public values that read it.

    ``score`` is ``lam (theta - centre)``: the log-likelihood's score at ``theta`` up to the noise
    ``-b`` (sd ``score_noise_std``) and the output perturbation's tiny shift (sd
    ``output_noise_std`` in ``theta``), i.e. what a Newton round at ``theta`` would release."""

    theta: torch.Tensor
    score: torch.Tensor
    score_noise_std: float
    output_noise_std: float


def _design_and_target(points: torch.Tensor | np.ndarray, model: GLM, feature_norm: float) -> tuple[torch.Tensor, torch.Tensor]:
    """The total per-record map: non-finite entries to 0, features projected into the public
    ball, targets clamped to [0, 1]."""
    pts = torch.as_tensor(np.asarray(points, dtype=np.float64) if not isinstance(points, torch.Tensor) else points,
                          dtype=DTYPE).clone()
    pts = torch.where(torch.isfinite(pts), pts, torch.zeros_like(pts))
    k = model.num_features
    x = pts[:, :k]
    norms = torch.linalg.vector_norm(x, dim=1, keepdim=True)
    x = x * torch.clamp(feature_norm / torch.clamp(norms, min=1e-300), max=1.0)
    y = pts[:, -1].clamp(0.0, 1.0)
    return model.design(torch.cat([x, y[:, None]], 1)), y


def _chunks(points: torch.Tensor | np.ndarray | RecordStore) -> Iterator[torch.Tensor | np.ndarray]:
    """Every record, in passes of bounded memory: a store's chunks, or the whole array at once."""
    from .store import RecordStore

    if isinstance(points, RecordStore):
        yield from points.chunks()
    else:
        yield points


def perturbed_mode(points: torch.Tensor | np.ndarray | RecordStore, randomness: TiltRandomness, model: GLM, *,
                   feature_norm: float, ridge: float, centre: torch.Tensor, noise_multiplier: float,
                   output_multiplier: float) -> PerturbedMode:
    """Release the perturbed mode of logistic regression (see the module docstring).

    Two mechanisms, composed adaptively: objective perturbation with multiplier
    ``noise_multiplier`` (noise sd ``noise_multiplier * L``) and ridge ``ridge``
    (:class:`dpsummary.objective_event.ObjectivePerturbationDpEvent` with the release's tilt), then
    a Gaussian of multiplier ``output_multiplier`` on sensitivity ``2 gamma / ridge`` (plus
    OpenDP's rounding slack). ``points``: the records (a :class:`~dpsummary.private.store.RecordStore`
    is read in passes of bounded memory, one per gradient or Hessian the solver needs)."""
    from .fixed_point import MechanismError
    from .noise import rounding_slack, tilt_rounding_bound

    if getattr(randomness, "tilt", None) is None:
        raise MechanismError("objective perturbation needs a tilt with a density (TiltRandomness.tilt)")
    if getattr(model, "name", "") != "logistic":
        raise MechanismError("objective perturbation is implemented for logistic regression only")
    for name, value in (("feature_norm", feature_norm), ("ridge", ridge), ("noise_multiplier", noise_multiplier),
                        ("output_multiplier", output_multiplier)):
        if not (value > 0 and math.isfinite(value)):
            raise MechanismError(f"{name} must be positive and finite")
    design_norm = model.design_norm_bound(feature_norm)
    d = model.param_dim
    centre = centre.detach().to(DTYPE)
    tilt_sd = noise_multiplier * design_norm
    b = torch.from_numpy(np.asarray(randomness.tilt(d, noise_std=tilt_sd), dtype=np.float64))
    if b.shape != (d,) or not bool(torch.isfinite(b).all()):
        raise MechanismError("the tilt has the wrong shape or is not finite")
    tolerance = GRADIENT_TOLERANCE * design_norm
    # gamma bounds the gradient of the IDEAL tilt's objective at the iterate: the solver's
    # tolerance plus the float tilt's distance from the ideal draw (module docstring).
    gamma = tolerance + tilt_rounding_bound(d, tilt_sd)

    def gradient(theta: torch.Tensor, *, hessian: bool) -> tuple[torch.Tensor, torch.Tensor | None]:
        """The objective's gradient (and Hessian) at ``theta``: one pass over the records."""
        grad = ridge * (theta - centre) + b
        hess = ridge * torch.eye(d, dtype=DTYPE) if hessian else None
        for chunk in _chunks(points):
            z, y = _design_and_target(chunk, model, feature_norm)
            eta = z @ theta
            grad = grad - z.T @ (y - torch.sigmoid(eta))
            if hess is not None:
                hess = hess + (z.T * (torch.sigmoid(eta) * torch.sigmoid(-eta))) @ z
        return grad, hess

    theta = centre.clone()
    grad, hess = gradient(theta, hessian=True)
    norm = float(torch.linalg.vector_norm(grad))
    # The iteration count depends on the records: it is counted here and never returned.
    iterations = 0
    while norm > tolerance:
        if iterations == MAX_ITERATIONS:
            raise MechanismError("objective perturbation's solver did not reach its tolerance")
        iterations += 1
        assert hess is not None
        direction = -torch.linalg.solve(hess, grad)
        # Damped Newton on the merit ||grad J||: the Newton direction descends it wherever the
        # Hessian (>= ridge I) is nonsingular, and its level sets are bounded (J is strongly
        # convex), so backtracking converges globally (Dennis and Schnabel 1996, 6.5); unlike the
        # objective's value, the gradient stays accurate in float64 near the minimiser.
        step = 1.0
        while True:
            trial = theta + step * direction
            trial_grad, _ = gradient(trial, hessian=False)
            trial_norm = float(torch.linalg.vector_norm(trial_grad))
            if trial_norm <= (1.0 - 1e-4 * step) * norm or step < 1e-10:
                break
            step *= 0.5
        theta, grad, norm = trial, trial_grad, trial_norm
        if norm > tolerance:
            _, hess = gradient(theta, hessian=True)
    # Neighbours' iterates lie within gamma / ridge of the same exact minimiser; OpenDP rounds
    # its input to a grid, which can add rounding_slack more (noise.add_gaussian_noise).
    spread = 2.0 * gamma / ridge
    sensitivity = spread + rounding_slack(spread, d)
    output_sd = output_multiplier * sensitivity
    released = torch.from_numpy(np.asarray(randomness.gaussian(theta.numpy(), noise_std=output_sd,
                                                               clip_norm=sensitivity), dtype=np.float64))
    return PerturbedMode(theta=released, score=ridge * (released - centre),
                         score_noise_std=tilt_sd, output_noise_std=output_sd)


def noisy_curvature(points: torch.Tensor | np.ndarray | RecordStore, randomness: PrivacyRandomness, model: Model,
                    theta: torch.Tensor, *, curvature_bound: float, noise_multiplier: float) -> torch.Tensor:
    """The noisy curvature sum at a public ``theta`` alone: the curvature half of
    :func:`~dpsummary.private.score_stats.noisy_score_statistics` (the same kernel, clip, exact
    sum and mirrored upper triangle), ``GaussianDpEvent(noise_multiplier)``."""
    from . import kernel
    from .score_stats import _check_positive, symmetric_from_upper

    _check_positive(curvature_bound=curvature_bound, noise_multiplier=noise_multiplier)
    d = model.param_dim
    total = kernel.ScorePartial.zero(d)
    for chunk in _chunks(points):
        arr = chunk.detach().to(DTYPE).numpy() if isinstance(chunk, torch.Tensor) else np.asarray(chunk, dtype=np.float64)
        # The score half is computed and discarded (its bound only sizes its own clip).
        total = total + kernel.score_partial(np.ascontiguousarray(arr), model, theta.detach().to(DTYPE), score_bound=1.0,
                                             curvature_bound=curvature_bound)
    tri_sum = kernel.finish(total.curvature, curvature_bound)
    noisy = randomness.gaussian(tri_sum, noise_std=noise_multiplier * curvature_bound, clip_norm=curvature_bound)
    return symmetric_from_upper(torch.from_numpy(np.asarray(noisy, dtype=np.float64)), d)
