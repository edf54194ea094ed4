"""The batched canary designs of the noisy-sum audits (see :mod:`dpsummary.selftest`, "Batching
runs") and their numerical check through the product's own functions, and the histogram
scenario's design."""

from __future__ import annotations

import math
from collections.abc import Sequence
from dataclasses import dataclass

import numpy as np
import torch

from ..models import DTYPE, GaussianMean
from ..private.kernel import effective_clip
from ..private.marginals import ColumnBins, HistogramLayout
from ..private.mechanism import clip_rows
from .config import Design, Scenario


def canary_draws(k: int) -> torch.Tensor:
    """S = 2k posterior draws, interleaved: theta_{2j} = +e_j, theta_{2j+1} = -e_j (all norm 1)."""
    eye = torch.eye(k, dtype=DTYPE)
    return torch.stack([eye, -eye], dim=1).reshape(2 * k, k)


def block_data(
    runs: Sequence[tuple[Scenario, bool]], design: Design
) -> tuple[torch.Tensor, list[tuple[int, int]]]:
    """Records for K batched runs: run j lives in dimension j; returns points and record ranges."""
    k, x = len(runs), design.offset
    rows: list[torch.Tensor] = []
    bounds: list[tuple[int, int]] = []
    start = 0
    for j, (scenario, canary) in enumerate(runs):
        n = design.background + int(canary)
        block = torch.zeros(n, k, dtype=DTYPE)
        if scenario == "swap":
            block[: design.background, j] = -x
        if canary:
            block[-1, j] = x
        rows.append(block)
        bounds.append((start, start + n))
        start += n
    return torch.cat(rows), bounds


def projections(y: np.ndarray, clip_norm: float) -> np.ndarray:
    """u_j = <y_(2j, 2j+1), (1, -1)/sqrt 2> / C for every batched run j."""
    y = np.asarray(y, dtype=np.float64).reshape(-1, 2)
    return (y[:, 0] - y[:, 1]) / (math.sqrt(2.0) * clip_norm)


@dataclass(frozen=True)
class CanaryCheck:
    """Numerical verification of the canary design through the product's own functions."""

    clip_norm: float
    canary_clipped_norm: float
    canary_cosine: float
    dirac_background_max_norm: float
    swap_background_projection: float
    cross_run_leak_max: float
    ok: bool


def check_canary_design(design: Design, k: int = 4) -> CanaryCheck:
    """Compute every record's clipped centred vector exactly as the mechanism does
    (``model.log_likelihood``, centring over the draws, :func:`clip_rows` at the kernel's
    :func:`~dpsummary.private.kernel.effective_clip`: C minus the rounding and float slacks) and check the design: the canary has norm C (within the slack) along (1, -1)/sqrt 2 in
    its own run's coordinates, dirac background vectors vanish, swap background vectors are -C
    along the same direction, and nothing leaks into other runs' coordinates (< 1e-12 C)."""
    c = design.clip_norm
    extra: list[tuple[Scenario, bool]] = [("dirac", False)] * (k - 2)
    runs: list[tuple[Scenario, bool]] = [("dirac", True), ("swap", True), *extra]
    points, bounds = block_data(runs, design)
    model = GaussianMean(k)
    theta = canary_draws(k)
    clip_at = effective_clip(c, 2 * k)
    slack = c - clip_at  # OpenDP's rounding slack plus the float slack (issue 35)
    with torch.no_grad():
        ll = model.log_likelihood(points, theta)
        clipped = clip_rows(ll - ll.mean(1, keepdim=True), clip_at).numpy()
    direction = np.zeros(2 * k)
    leak = 0.0
    norms_canary, cos_canary, bg_dirac, bg_swap = [], [], 0.0, []
    for j, ((scenario, canary), (lo, hi)) in enumerate(zip(runs, bounds, strict=True)):
        direction[:] = 0.0
        direction[2 * j], direction[2 * j + 1] = 1 / math.sqrt(2), -1 / math.sqrt(2)
        own = np.zeros(2 * k, dtype=bool)
        own[2 * j: 2 * j + 2] = True
        block = clipped[lo:hi]
        leak = max(leak, float(np.abs(block[:, ~own]).max(initial=0.0)))
        if canary:
            v = block[-1]
            norms_canary.append(float(np.linalg.norm(v)))
            cos_canary.append(float(v @ direction / np.linalg.norm(v)))
        bg = block[: design.background]
        if scenario == "dirac":
            bg_dirac = max(bg_dirac, float(np.linalg.norm(bg, axis=1).max(initial=0.0)))
        else:
            bg_swap.extend((bg @ direction).tolist())
    canary_norm = min(norms_canary)
    ok = (
        c - 2 * slack - 1e-12 * c <= canary_norm <= c
        and max(norms_canary) <= c
        and min(cos_canary) >= 1 - 1e-12
        and bg_dirac <= 1e-12 * c
        and all(abs(p + c) <= 2 * slack + 1e-12 * c for p in bg_swap)
        and leak <= 1e-12 * c
    )
    return CanaryCheck(
        clip_norm=c, canary_clipped_norm=canary_norm, canary_cosine=min(cos_canary),
        dirac_background_max_norm=bg_dirac, swap_background_projection=float(np.mean(bg_swap)),
        cross_run_leak_max=leak, ok=bool(ok),
    )


def histogram_design(columns: int, background: int) -> tuple[HistogramLayout, torch.Tensor, torch.Tensor]:
    """The "histogram" canary design: a layout of ``columns`` categorical columns with two
    categories each (one-hot, model space); D = ``background`` records in category 0 of every
    column; D' = D + a canary in category 1 of every column. The canary changes ``columns``
    counts by 1, so after the layout's 1/sqrt(columns) scaling it moves the noised vector by
    exactly the sensitivity (1, up to the noise grid's slack): the worst case of add/remove for
    this Gaussian mechanism. Returns (layout, D, D')."""
    layout = HistogramLayout(
        tuple(ColumnBins(f"c{j}", "categorical", 2 * j, 2) for j in range(columns)), 2 * columns
    )
    without = torch.zeros(background, 2 * columns, dtype=DTYPE)
    without[:, 0::2] = 1.0
    canary = torch.zeros(1, 2 * columns, dtype=DTYPE)
    canary[:, 1::2] = 1.0
    return layout, without, torch.cat([without, canary])
