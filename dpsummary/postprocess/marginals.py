"""Public planning and post-processing of DP-PSVI's initialisation histograms.

The public bins of a schema (:func:`layout_for`: bounds and categories from the schema only),
the accountant's event (:func:`marginals_event`), and what the release makes of the noisy counts
(:class:`NoisyMarginals`). Nothing here reads a record or draws privacy noise: the per-record
bins and the sensitivity argument are in :mod:`dpsummary.private.marginals`, the one Gaussian
mechanism in :meth:`dpsummary.private.mechanism.PrivateRecords.noisy_marginals`.

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
from typing import Any, Final

import numpy as np
import torch
from scipy.special import ndtri  # norm.isf(q) is -ndtri(q); scipy.stats costs 0.3 s (issue 29)

from ..models import DTYPE
from ..private.marginals import NUM_INTERIOR_BINS, ColumnBins, HistogramLayout

FeatureSampler = Callable[[int, torch.Generator], torch.Tensor]

#: Probability that some empty bin (over all bins) survives the noise threshold.
FALSE_BIN_PROB: Final = 0.01


def sample_bins(col: ColumnBins, mass: np.ndarray, n: int, generator: torch.Generator) -> torch.Tensor:
    """``(n, col.width)`` values of column ``col`` drawn from the (non-negative, non-zero) bin
    ``mass``: uniform inside an interval bin, exactly at the bound for a point bin, the one-hot
    vector of a category (the "none" bin is the all-zero vector)."""
    probs = torch.as_tensor(mass / mass.sum(), dtype=DTYPE)
    pick = torch.multinomial(probs, n, replacement=True, generator=generator)
    if col.kind == "categorical":
        out = torch.zeros(n, col.width + 1, dtype=DTYPE)
        out[torch.arange(n), pick] = 1.0
        return out[:, : col.width]  # the "none" bin is the all-zero vector
    u = torch.rand(n, generator=generator, dtype=DTYPE)
    width = (col.upper - col.lower) / NUM_INTERIOR_BINS
    interior = col.lower + (pick - 1).to(DTYPE) * width + u * width
    value = torch.where(pick == 0, torch.full_like(u, col.lower),
                        torch.where(pick == NUM_INTERIOR_BINS + 1, torch.full_like(u, col.upper), interior))
    return value[:, None]


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
        z = float(-ndtri(FALSE_BIN_PROB / max(self.layout.num_bins, 1)))
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
                    out[:, col.start : col.start + col.width] = sample_bins(col, mass, n, generator)
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
            return sample_bins(col, mass, n, generator)[:, 0]

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
