"""White-box audit of the data-range histogram (``ranges``): the count's and the feature norm's
bins that set the default mechanisms' clip bounds (:mod:`dpsummary.postprocess.count_range`).
Registered by :mod:`dpsummary.mechanisms.noise_aware_newton`; ``noise-aware-cells`` releases its
count histogram through the same call."""

from __future__ import annotations

import numpy as np
import torch

from ..accounting import calibrate_gaussian, epsilon, gaussian_event
from ..models import DTYPE
from ..private.marginals import HistogramLayout
from .audits import gaussian_audit
from .config import AuditResult, Progress, SelfTestConfig
from .randomness import NoScaleLayout, make_mechanism

#: The design's public bounds: the feature norm's (model space) and the count's.
RANGE_FEATURE_BOUND = 2.0
RANGE_COUNT_BOUND = 100.0


def range_design(background: int) -> tuple[HistogramLayout, torch.Tensor, torch.Tensor]:
    """The "ranges" canary design: the release's own layout
    (:func:`~dpsummary.postprocess.count_range.range_layout`: the L2 norm of two model-space
    features over its public geometric bins, and a count over the 1-2-5 grid), D = ``background``
    records with features 0 and count 0; D' = D plus a canary whose features are ``(inf, -inf)``
    and whose count is not a number: the values the per-record rule must still put in exactly
    one bin of each column (the last). It then moves the two columns' counts by 1 each, the
    sensitivity after the layout's 1/sqrt(2) scaling. Returns (layout, D, D')."""
    from ..postprocess.count_range import range_layout

    layout = range_layout(2, feature_bound=RANGE_FEATURE_BOUND, count=("count", RANGE_COUNT_BOUND))
    without = torch.zeros(background, 3, dtype=DTYPE)
    canary = torch.tensor([[float("inf"), float("-inf"), float("nan")]], dtype=DTYPE)
    return layout, without, torch.cat([without, canary])


def ranges_audit(cfg: SelfTestConfig, alpha: float, progress: Progress | None = None) -> AuditResult:
    """White-box Clopper-Pearson audit of
    :meth:`~dpsummary.private.mechanism.PrivateRecords.noisy_marginals` on the data-range layout
    (:func:`range_design`), calibrated on its own to ``cfg.epsilon`` at ``cfg.delta`` (one
    Gaussian mechanism). Score: the noisy counts' excess over D's exact counts on the canary's
    bins (their sum, Neyman-Pearson optimal for the mean shift). ``inject="no-scale"``: the
    counts are not divided by sqrt(2) before the noise."""
    sigma = calibrate_gaussian(target_epsilon=cfg.epsilon, delta=cfg.delta, accountant=cfg.accountant)
    claimed = epsilon([gaussian_event(sigma)], cfg.delta, cfg.accountant)
    layout, without, with_canary = range_design(cfg.design.background)
    if cfg.inject == "no-scale":
        layout = NoScaleLayout(layout.columns, layout.num_features)
    expected = layout.counts(without)
    direction = layout.counts(with_canary) - expected  # 1 on the canary's bin of each column
    sides = [make_mechanism(rows, inject=cfg.inject, noise_path=cfg.noise) for rows in (without, with_canary)]

    def draw(canary: bool) -> float:
        noisy = sides[int(canary)].noisy_marginals(layout, noise_multiplier=sigma).noisy_counts
        return float(np.asarray(noisy - expected) @ direction)

    return gaussian_audit(cfg, alpha, draw, scenario="ranges", mechanism="noisy_marginals",
                          sigma=sigma, claimed=claimed, progress=progress)
