"""White-box audit of the data-range histogram (``ranges``): the count's and the feature norm's
bins that set the default mechanisms' clip bounds (:mod:`dpsummary.postprocess.count_range`).
Registered by :mod:`dpsummary.mechanisms.noise_aware_newton`; ``noise-aware-cells`` releases its
count histogram through the same call."""

from __future__ import annotations

import torch

from ..models import DTYPE
from ..private.marginals import HistogramLayout
from .config import AuditResult, Progress, SelfTestConfig
from .noisy_sum import layout_audit

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
    (:func:`range_design`; the machinery of :func:`~dpsummary.selftest.noisy_sum.layout_audit`,
    calibrated on its own to ``cfg.epsilon`` at ``cfg.delta``)."""
    layout, without, with_canary = range_design(cfg.design.background)
    return layout_audit(cfg, alpha, layout, without, with_canary, scenario="ranges", progress=progress)
