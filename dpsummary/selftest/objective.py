"""White-box audit of objective perturbation's perturbed mode (``objective``). Registered by
:mod:`dpsummary.mechanisms.noise_aware_objective`."""

from __future__ import annotations

import math

import numpy as np
import torch

from .. import accounting as acc
from ..models import DTYPE
from .audits import gaussian_audit
from .config import AuditResult, Progress, SelfTestConfig
from .newton import newton_design
from .randomness import make_mechanism


def objective_audit(cfg: SelfTestConfig, alpha: float, progress: Progress | None = None) -> AuditResult:
    """White-box Clopper-Pearson audit of :meth:`~dpsummary.private.mechanism.PrivateRecords.perturbed_mode`
    (the release's tilt and output perturbation), calibrated on its own: its two events (the
    objective-perturbation event at the release's Jacobian share of ``cfg.epsilon``, and the
    output perturbation's Gaussian) compose under RDP to ``cfg.epsilon`` at ``cfg.delta``.
    Design: the newton canary (:func:`~dpsummary.selftest.newton.newton_design`: logistic
    regression with one feature, public bound 1; the canary at x = 10, y = 1, ten times outside
    the box, so only the projection keeps its pull on the mode bounded). Score: the released mode
    projected on the canary's projected design direction. ``inject="no-clip"``: the projection
    disabled at unchanged noise (:class:`~dpsummary.selftest.randomness.NoClipRecords`);
    ``"half-noise"``: the tilt's and output's sds halved. RDP only: a configuration with another
    accountant does not select it (:mod:`dpsummary.mechanisms.noise_aware_objective`)."""
    from ..models import LogisticRegression
    from ..noise_aware.objective import (
        OP_OUTPUT_MULTIPLIER,
        TILT_GRID_RATIO,
        calibrate_rdp_scale,
        ridge_for,
    )
    from ..objective_event import ObjectivePerturbationDpEvent, objective_perturbation_jacobian

    model = LogisticRegression(1)
    feature_norm = 1.0
    design_norm = model.design_norm_bound(feature_norm)
    ridge = ridge_for(design_norm, cfg.epsilon)
    jacobian = objective_perturbation_jacobian(curvature_bound=design_norm**2 / 4.0, ridge=ridge)

    def events(z: float) -> list:
        return [ObjectivePerturbationDpEvent(noise_multiplier=z, jacobian_log_ratio=jacobian, dim=model.param_dim,
                                             grid_ratio=TILT_GRID_RATIO), acc.gaussian_event(OP_OUTPUT_MULTIPLIER)]

    z, planned = calibrate_rdp_scale(events, target_epsilon=cfg.epsilon, delta=cfg.delta)
    claimed = acc.epsilon(planned, cfg.delta, "rdp")
    without, with_canary, _ = newton_design(cfg.design.background)
    direction = np.array([1.0, 1.0]) / math.sqrt(2.0)  # the canary's design [1, x] projected to norm sqrt(2)
    sides = [make_mechanism(rows, inject=cfg.inject, noise_path=cfg.noise) for rows in (without, with_canary)]
    centre = torch.zeros(model.param_dim, dtype=DTYPE)

    def draw(canary: bool) -> float:
        mode = sides[int(canary)].perturbed_mode(model, feature_norm=feature_norm, ridge=ridge, centre=centre,
                                                 noise_multiplier=z, output_multiplier=OP_OUTPUT_MULTIPLIER)
        return float(mode.theta.numpy() @ direction)

    return gaussian_audit(cfg, alpha, draw, scenario="objective", mechanism="perturbed_mode",
                          sigma=z, claimed=claimed, progress=progress)
