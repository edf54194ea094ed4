"""White-box audit of the noise-aware mechanism's score release (``newton``). Registered by
:mod:`dpsummary.mechanisms.noise_aware_newton`."""

from __future__ import annotations

import math

import numpy as np
import torch

from ..accounting import calibrate_gaussian, epsilon, gaussian_event
from ..models import DTYPE
from .audits import gaussian_audit
from .config import AuditResult, Progress, SelfTestConfig
from .randomness import make_mechanism


def newton_design(background: int) -> tuple[torch.Tensor, torch.Tensor, float]:
    """The "newton" canary design for the noise-aware mechanism's score release: logistic
    regression with one feature, public feature bound 1 (score bound sqrt(2) at theta = 0).
    D = ``background`` records at x = 0, y = 0 (score (-1/2, 0) each); D' = D plus a canary at
    x = 10 (outside the public box), y = 1: its raw score (1/2, 5) is 3.5x the bound, so only
    clipping keeps the shift at the sensitivity. Returns (D, D', score bound)."""
    without = torch.zeros(background, 2, dtype=DTYPE)
    canary = torch.tensor([[10.0, 1.0]], dtype=DTYPE)
    return without, torch.cat([without, canary]), math.sqrt(2.0)


def newton_audit(cfg: SelfTestConfig, alpha: float, progress: Progress | None = None) -> AuditResult:
    """White-box Clopper-Pearson audit of the noise-aware mechanism's score release
    (:func:`dpsummary.private.score_stats.noisy_score_statistics`), calibrated on its own: the
    score sum is one Gaussian mechanism whose accountant reports ``cfg.epsilon`` at
    ``cfg.delta`` (the curvature release is drawn too, at a large multiplier, and ignored: a test
    on the score alone is bounded by the score event). Score: the noisy sum's excess over D's,
    projected on the canary's clipped direction (Neyman-Pearson optimal for the mean shift).
    ``inject="no-clip"`` (:class:`NoClipRecords`): clipping disabled at unchanged noise, so the
    canary moves the release by 3.5x the sensitivity."""
    from ..models import LogisticRegression

    sigma = calibrate_gaussian(target_epsilon=cfg.epsilon, delta=cfg.delta, accountant=cfg.accountant)
    claimed = epsilon([gaussian_event(sigma)], cfg.delta, cfg.accountant)
    model = LogisticRegression(1)
    without, with_canary, bound = newton_design(cfg.design.background)
    theta = torch.zeros(2, dtype=DTYPE)
    expected = model.record_scores(without, theta).sum(0).numpy()
    canary_score = model.record_scores(with_canary[-1:], theta)[0].numpy()
    direction = canary_score / np.linalg.norm(canary_score)
    sides = [make_mechanism(rows, inject=cfg.inject, noise_path=cfg.noise) for rows in (without, with_canary)]

    def draw(canary: bool) -> float:
        st = sides[int(canary)].noisy_score_statistics(model, theta, score_bound=bound, curvature_bound=1.0,
                                                       score_noise_multiplier=sigma, curvature_noise_multiplier=1e3)
        return float((st.score.numpy() - expected) @ direction)

    return gaussian_audit(cfg, alpha, draw, scenario="newton", mechanism="noisy_score_statistics",
                           sigma=sigma, claimed=claimed, progress=progress)
