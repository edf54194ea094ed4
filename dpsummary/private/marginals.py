"""DP feature marginals for DP-PSVI's initialisation (an accounted warm start): the public bins'
per-record rule and the count vector's sensitivity. The release itself (one Gaussian mechanism) is
:meth:`dpsummary.private.mechanism.PrivateRecords.noisy_marginals`; the public layout of a schema
(:func:`dpsummary.postprocess.marginals.layout_for`) and the post-processing of the noisy counts
(:class:`dpsummary.postprocess.marginals.NoisyMarginals`) live outside the privacy boundary.

Why: DP-PSVI starts from synthetic pseudopoints whose features come from a public distribution
(DP-PSVI paper, Section 3.3). Uniform over the public box is a poor start for real tables: a
zero-inflated column (most records at its lower bound) gets pseudopoints spread over its whole
range, and a rare category gets as many pseudopoints as a common one. With noise on every
gradient step, 500 steps do not undo that start (``benchmarks/notebook/NOTES.md``). Sampling the
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

The same release serves the count target's clip bound of the default mechanism
(:mod:`dpsummary.postprocess.count_range`): one column of kind ``"edges"``, the count's public
1-2-5 grid edges, a record in exactly one bin, so ``K = 1`` and the same argument holds. So does
the feature norm's clip bound (issue 37's thirteenth rule): one column of kind ``"norm"``, the L2
norm of the record's model-space feature coordinates over public edges, a record in exactly one
bin; both ranges together are one histogram with ``K = 2``.

"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Final, Literal

import numpy as np
import torch

from .noise import count_vector_scale

#: Equal-width interior bins per bounded numeric column (public; fewer bins = less noise mass).
NUM_INTERIOR_BINS: Final = 8


@dataclass(frozen=True)
class ColumnBins:
    """Public bins of one feature column in model space.

    ``kind="numeric"``: coordinate ``start`` in ``[lower, upper]``; bins are [at lower,
    NUM_INTERIOR_BINS equal-width interior bins, at upper]. ``kind="categorical"``: coordinates
    ``start .. start + width - 1`` (one-hot); bins are the categories in order, then "none".
    ``kind="edges"``: coordinate ``start``; bins ``(-inf, e_0], (e_0, e_1], ..., (e_last, inf)``
    over the public, increasing ``edges`` (a value that is not a number falls in the last bin).
    ``kind="norm"``: the same bins over the L2 norm of coordinates ``start .. start + width - 1``
    (a record's feature block).
    """

    name: str
    kind: Literal["numeric", "categorical", "edges", "norm"]
    start: int
    width: int
    lower: float = 0.0
    upper: float = 0.0
    #: The model-space target (a count with public bounds), not a feature column.
    target: bool = False
    #: ``kind="edges"``: the public bin edges, increasing.
    edges: tuple[float, ...] = ()

    def __post_init__(self) -> None:
        if self.kind in ("edges", "norm") and (not self.edges or bool(np.any(np.diff(self.edges) <= 0))):
            raise ValueError("edges must be non-empty and increasing")

    @property
    def num_bins(self) -> int:
        if self.kind in ("edges", "norm"):
            return len(self.edges) + 1
        return NUM_INTERIOR_BINS + 2 if self.kind == "numeric" else self.width + 1

    def record_bins(self, points: torch.Tensor) -> np.ndarray:
        """The bin of every record (exactly one each): a per-record function."""
        if self.kind == "edges":
            # searchsorted puts NaN after every edge: the last bin, still exactly one bin.
            return np.searchsorted(np.asarray(self.edges), points[:, self.start].numpy(), side="left")
        if self.kind == "norm":
            block = points[:, self.start : self.start + self.width].numpy()
            return np.searchsorted(np.asarray(self.edges), np.linalg.norm(block, axis=1), side="left")
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
