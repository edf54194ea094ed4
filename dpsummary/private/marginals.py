"""DP feature marginals for DP-PSVI's initialisation (an accounted warm start).

Why: DP-PSVI starts from synthetic pseudopoints whose features come from a public distribution
(DP-PSVI paper, Section 3.3). Uniform over the public box is a poor start for real tables: a
zero-inflated column (most records at its lower bound) gets pseudopoints spread over its whole
range, and a rare category gets as many pseudopoints as a common one. With noise on every
gradient step, 500 steps do not undo that start (``benchmarks/results/NOTES.md``). Sampling the
initial features from noisy per-column histograms (a product of DP marginals) starts the
pseudopoints where the records are, at the cost of one Gaussian mechanism that is composed with
everything else in the release.

What is released (before post-processing)
-----------------------------------------
For each feature column ``c`` of the public schema (F columns), a histogram over PUBLIC bins of
the column's model-space coordinate(s):

* bounded numeric column (one coordinate in ``[lo, hi]``, the public transform's scaled bounds):
  a point bin "at the lower bound", :data:`NUM_INTERIOR_BINS` equal-width bins over
  ``(lo, hi)`` and a point bin "at the upper bound" (the transform clips to the bounds, so
  values pile up there; the point bins keep a zero-inflated column's zeros at zero);
* categorical column (a one-hot block of k coordinates): one bin per category plus one bin for
  the all-zero vector (missing or unseen category);
* for Poisson regression, the count target too (the clipped raw count in its public bounds), with
  the numeric bins: simulated initial targets start at the prior's scale (counts of about 1-3)
  when the data's are often ten times larger, and the clip-norm reference records inherit that
  (a clip norm far below every real record's norm).

Sensitivity (add/remove one record): a record falls in exactly one bin of every histogram, so it
changes ``K = F`` coordinates of the concatenated count vector by exactly 1 and the L2 distance
is ``sqrt(K)``. The vector is multiplied by ``(1 - slack) / sqrt(K)`` before the noise (``slack``
is OpenDP's rounding slack, :func:`dpsummary.private.noise.rounding_slack`), so the L2
sensitivity is at most 1 and ``noise_std = noise_multiplier`` is exactly the mechanism that
``dp_accounting.GaussianDpEvent(noise_multiplier)`` describes. An unbounded numeric column (no
public bounds) has no public bins; it is left out of the histograms and initialised from the
public sampler, so it spends nothing.

Post-processing (no further privacy cost): bins whose noisy count is below ``z s`` (``s`` the
noise standard deviation on the raw count scale, ``z`` such that an empty bin survives with
probability below 1% over all bins) are zeroed; each column's initial values are drawn from its
remaining mass (uniform inside an interval bin, exactly at the bound for a point bin). A column
with no surviving bin falls back to the public sampler, and the release says so. Initial targets
(and the clip-norm reference records' targets) are drawn from the target's marginal
independently of the features, so they carry the data's scale but no feature-target relation.
The noisy histograms themselves are not written anywhere; the pseudopoints are a function of
them.
"""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass
from typing import Any, Final, Literal

import numpy as np
import torch
from scipy.stats import norm

from ..models import DTYPE
from .noise import count_vector_scale

FeatureSampler = Callable[[int, torch.Generator], torch.Tensor]

#: Equal-width interior bins per bounded numeric column (public; fewer bins = less noise mass).
NUM_INTERIOR_BINS: Final = 8
#: Probability that some empty bin (over all bins) survives the noise threshold.
FALSE_BIN_PROB: Final = 0.01


@dataclass(frozen=True)
class ColumnBins:
    """Public bins of one feature column in model space.

    ``kind="numeric"``: coordinate ``start`` in ``[lower, upper]``; bins are [at lower,
    NUM_INTERIOR_BINS equal-width interior bins, at upper]. ``kind="categorical"``: coordinates
    ``start .. start + width - 1`` (one-hot); bins are the categories in order, then "none".
    """

    name: str
    kind: Literal["numeric", "categorical"]
    start: int
    width: int
    lower: float = 0.0
    upper: float = 0.0
    #: The model-space target (a count with public bounds), not a feature column.
    target: bool = False

    @property
    def num_bins(self) -> int:
        return NUM_INTERIOR_BINS + 2 if self.kind == "numeric" else self.width + 1

    def record_bins(self, points: torch.Tensor) -> np.ndarray:
        """The bin of every record (exactly one each): a per-record function."""
        if self.kind == "categorical":
            block = points[:, self.start : self.start + self.width].numpy()
            hot = block.argmax(axis=1)
            return np.where(block.max(axis=1) > 0.5, hot, self.width)
        v = points[:, self.start].numpy()
        span = self.upper - self.lower
        tol = 1e-9 * span
        interior = np.clip(np.floor((v - self.lower) / span * NUM_INTERIOR_BINS), 0, NUM_INTERIOR_BINS - 1)
        return np.where(v <= self.lower + tol, 0, np.where(v >= self.upper - tol, NUM_INTERIOR_BINS + 1,
                                                            1 + interior.astype(np.int64)))

    def sample(self, mass: np.ndarray, n: int, generator: torch.Generator) -> torch.Tensor:
        """``(n, width)`` values drawn from the (non-negative, non-zero) bin ``mass``."""
        probs = torch.as_tensor(mass / mass.sum(), dtype=DTYPE)
        pick = torch.multinomial(probs, n, replacement=True, generator=generator)
        if self.kind == "categorical":
            out = torch.zeros(n, self.width + 1, dtype=DTYPE)
            out[torch.arange(n), pick] = 1.0
            return out[:, : self.width]  # the "none" bin is the all-zero vector
        u = torch.rand(n, generator=generator, dtype=DTYPE)
        width = (self.upper - self.lower) / NUM_INTERIOR_BINS
        interior = self.lower + (pick - 1).to(DTYPE) * width + u * width
        value = torch.where(pick == 0, torch.full_like(u, self.lower),
                            torch.where(pick == NUM_INTERIOR_BINS + 1, torch.full_like(u, self.upper), interior))
        return value[:, None]


@dataclass(frozen=True)
class HistogramLayout:
    """The public bins of every histogrammed feature column, concatenated in column order."""

    columns: tuple[ColumnBins, ...]
    num_features: int

    @property
    def touches(self) -> int:
        """Coordinates of the count vector one record changes (by exactly 1 each)."""
        return len(self.columns)

    @property
    def num_bins(self) -> int:
        return sum(c.num_bins for c in self.columns)

    @property
    def scale(self) -> float:
        """Multiplier giving the count vector L2 sensitivity at most 1 (rounding slack included)."""
        return count_vector_scale(self.touches, self.num_bins)

    def counts(self, points: torch.Tensor) -> np.ndarray:
        """Raw bin counts of ``points`` (model space). Each record adds 1 to one bin per column."""
        parts = [np.bincount(c.record_bins(points), minlength=c.num_bins).astype(np.float64) for c in self.columns]
        return np.concatenate(parts) if parts else np.zeros(0)

    def split(self, vector: np.ndarray) -> list[np.ndarray]:
        out, at = [], 0
        for c in self.columns:
            out.append(vector[at : at + c.num_bins])
            at += c.num_bins
        return out


def layout_for(transform: Any, *, count_target: bool = False) -> HistogramLayout:
    """Public bins for a schema-based transform (bounds and categories from the schema only).

    Numeric columns without public bounds are left out (see the module docstring). With
    ``count_target`` and a count target with public bounds, the target (the last model-space
    coordinate, the clipped raw count) gets numeric bins too, so initial targets can start at
    the data's scale (:meth:`NoisyMarginals.target_sampler`)."""
    columns: list[ColumnBins] = []
    offset = 0
    for col in transform.schema.feature_columns:
        if col.kind == "numeric":
            if col.lower is not None and col.upper is not None and col.upper > col.lower:
                c, s = transform.centres[col.name], transform.scales[col.name]
                columns.append(ColumnBins(col.name, "numeric", offset, 1, (col.lower - c) / s, (col.upper - c) / s))
            offset += 1
        else:
            k = len(col.categories or [])
            columns.append(ColumnBins(col.name, "categorical", offset, k))
            offset += k
    if count_target and transform.target is not None and transform.target_kind == "count":
        col = transform.schema.column(transform.target)
        if col.lower is not None and col.upper is not None and col.upper > col.lower:
            columns.append(ColumnBins(col.name, "numeric", offset, 1, float(col.lower), float(col.upper), target=True))
            return HistogramLayout(tuple(columns), offset + 1)
    return HistogramLayout(tuple(columns), offset)


@dataclass(frozen=True)
class NoisyMarginals:
    """Released (noisy) histograms and what post-processing made of them."""

    layout: HistogramLayout
    noisy_counts: np.ndarray
    noise_multiplier: float

    @property
    def raw_noise_std(self) -> float:
        """Noise standard deviation on the raw count scale."""
        return self.noise_multiplier / self.layout.scale

    @property
    def threshold(self) -> float:
        z = float(norm.isf(FALSE_BIN_PROB / max(self.layout.num_bins, 1)))
        return z * self.raw_noise_std

    def masses(self) -> list[np.ndarray | None]:
        """Per column, the thresholded bin mass, or None when no bin survived."""
        out: list[np.ndarray | None] = []
        for part in self.layout.split(self.noisy_counts):
            kept = np.where(part > self.threshold, part, 0.0)
            out.append(kept if kept.sum() > 0 else None)
        return out

    def fallback_columns(self) -> list[str]:
        return [c.name for c, m in zip(self.layout.columns, self.masses(), strict=True) if m is None]

    def sampler(self, public: FeatureSampler) -> FeatureSampler:
        """A feature sampler: each histogrammed column from its noisy marginal (independently),
        every other coordinate (and any column with no surviving bin) from ``public``."""
        pairs = [(c, m) for c, m in zip(self.layout.columns, self.masses(), strict=True) if not c.target]

        def sample(n: int, generator: torch.Generator) -> torch.Tensor:
            out = public(n, generator)
            for col, mass in pairs:
                if mass is not None:
                    out[:, col.start : col.start + col.width] = col.sample(mass, n, generator)
            return out

        return sample

    def target_sampler(self) -> FeatureSampler | None:
        """Initial targets, shape (n,), drawn from the target's noisy marginal (independently of
        the features), or None when the layout has no target column or none of its bins
        survived (then targets are simulated from the model as in the uniform start)."""
        found = [(c, m) for c, m in zip(self.layout.columns, self.masses(), strict=True) if c.target and m is not None]
        if not found:
            return None
        col, mass = found[0]

        def sample(n: int, generator: torch.Generator) -> torch.Tensor:
            return col.sample(mass, n, generator)[:, 0]

        return sample

    def describe(self) -> str:
        targets = {c.name for c in self.layout.columns if c.target}
        fallback = [name for name in self.fallback_columns() if name not in targets]
        drawn = "features and targets" if targets else "features"
        text = (f"initial pseudopoint {drawn} drawn from DP per-column histograms ({self.layout.touches} columns, "
                f"{self.layout.num_bins} public bins, noise multiplier {self.noise_multiplier:.4g}, "
                f"bins below {self.threshold:.0f} noisy records dropped)")
        if fallback:
            text += "; from the public box instead (no bin above the noise): " + ", ".join(fallback)
        if targets and self.target_sampler() is None:
            text += "; targets simulated from the model instead (no target bin above the noise)"
        return text


def marginals_event(noise_multiplier: float) -> Any:
    import dp_accounting

    return dp_accounting.GaussianDpEvent(noise_multiplier)

