"""White-box audit of ``noise-aware-cells``' one release (``cells``). Registered by
:mod:`dpsummary.mechanisms.noise_aware_cells`."""

from __future__ import annotations

import numpy as np
import torch

from ..accounting import calibrate_gaussian, epsilon, gaussian_event
from ..models import DTYPE
from .audits import gaussian_audit
from .config import AuditResult, Progress, SelfTestConfig
from .randomness import make_mechanism


def cells_design(background: int) -> tuple[torch.Tensor, torch.Tensor]:
    """The "cells" canary design: one integer feature with levels -1, 0, 1 in model space and a
    0/1 target. D = ``background`` records at x = 0, y = 0; D' = D plus a canary at x = 7
    (outside the public box: it goes to the level 1, where ``||[1, x]||`` is largest) with
    y = 5 (above the target's bound 1: only the per-record clip keeps its T contribution at the
    sensitivity). Returns (D, D') as model-space rows (feature, target)."""
    without = torch.zeros(background, 2, dtype=DTYPE)
    canary = torch.tensor([[7.0, 5.0]], dtype=DTYPE)
    return without, torch.cat([without, canary])


def cells_audit(cfg: SelfTestConfig, alpha: float, progress: Progress | None = None) -> AuditResult:
    """White-box Clopper-Pearson audit of
    :meth:`~dpsummary.private.mechanism.PrivateRecords.noisy_cell_statistics`, calibrated on its
    own to ``cfg.epsilon`` at ``cfg.delta`` (one Gaussian mechanism). Score: the release mapped
    back to the unit space the noise is added in (counts times ``sigma / counts_noise_std``, T
    times ``sigma / statistic_noise_std``), its excess over D's exact value, projected on the
    canary's clipped unit contribution (Neyman-Pearson optimal for the mean shift)."""
    from ..cells.domain import CellDomain
    from ..private.cells import cell_indices

    sigma = calibrate_gaussian(target_epsilon=cfg.epsilon, delta=cfg.delta, accountant=cfg.accountant)
    claimed = epsilon([gaussian_event(sigma)], cfg.delta, cfg.accountant)
    domain = CellDomain(("x",), (((-1.0,), (0.0,), (1.0,)),))
    design = np.column_stack([np.ones(3), domain.features()])
    share = 0.3
    without, with_canary = cells_design(cfg.design.background)
    sides = [make_mechanism(rows, inject=cfg.inject, noise_path=cfg.noise) for rows in (without, with_canary)]
    exact_counts = np.bincount(cell_indices(without[:, :1].numpy(), domain), minlength=3).astype(np.float64)
    exact_t = np.zeros(2)
    # The canary's unit-space contribution: sqrt(f) on its cell's count, sqrt(1 - f) z / R y (y
    # clipped to 1, ||z|| = R) on T; its direction is what a correct clip leaves.
    radius = float(np.linalg.norm(design[2]))
    direction = np.concatenate([[0.0, 0.0, np.sqrt(share)], np.sqrt(1 - share) * design[2] / radius])
    direction /= np.linalg.norm(direction)

    def draw(canary: bool) -> float:
        out = sides[int(canary)].noisy_cell_statistics(domain, design, target_bound=1.0, count_share=share,
                                                      noise_multiplier=sigma)
        unit = np.concatenate([(out.counts - exact_counts) * (sigma / out.counts_noise_std),
                               (out.statistic - exact_t) * (sigma / out.statistic_noise_std)])
        return float(unit @ direction)

    return gaussian_audit(cfg, alpha, draw, scenario="cells", mechanism="noisy_cell_statistics",
                          sigma=sigma, claimed=claimed, progress=progress)
