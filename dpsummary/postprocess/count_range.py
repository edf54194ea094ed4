"""The count target's clip bound from a DP histogram (the default mechanism's Poisson releases;
:mod:`dpsummary.noise_aware`, module docstring 11.).

Public planning and post-processing only: the bins (:func:`count_layout`: the 1-2-5 grid edges
below the schema's upper bound ``B``, all public) and what the noisy histogram makes of the bound
(:func:`clip_bound`). The histogram is one Gaussian mechanism,
:meth:`dpsummary.private.mechanism.PrivateRecords.noisy_marginals` on a layout of one column of
kind ``"edges"`` (a record in exactly one bin: L2 sensitivity 1; :mod:`dpsummary.private.marginals`).

Rule (issue 37's twelfth, written before its run, benchmarks/results/noise_aware_variants.md):
bins below the noise threshold of :class:`~dpsummary.postprocess.marginals.NoisyMarginals` (an
empty bin survives with probability 1% over all bins) are zeroed; the bound is the upper edge of
the bin holding the :data:`CLIP_QUANTILE` quantile of what remains, capped at ``B``; ``B`` itself
when no bin survives. Records above the bound are not dropped: their scores are clipped by the
statistic bounds the bound implies, like any record outside the public box.
"""

from __future__ import annotations

import math
from dataclasses import dataclass
from typing import Final

import numpy as np

from ..private.marginals import ColumnBins, HistogramLayout
from .marginals import NoisyMarginals

#: The noisy quantile of the count whose bin's upper edge is the clip bound (public).
CLIP_QUANTILE: Final = 0.999


def count_edges(bound: float) -> tuple[float, ...]:
    """Public bin edges: 0, then the 1-2-5 steps strictly below ``bound`` (bins ``(-inf, 0]``,
    ``(0, 1]``, ``(1, 2]``, ``(2, 5]``, ..., and everything above the last edge). ``bound`` must be
    finite (a schema's bounds are; a zero-configuration schema caps them at 1e9)."""
    if not math.isfinite(bound):
        raise ValueError("the count's bound must be finite")
    edges = [0.0]
    step = 1.0
    while True:
        for m in (1.0, 2.0, 5.0):
            if m * step >= bound:
                return tuple(edges)
            edges.append(m * step)
        step *= 10.0


def count_layout(num_features: int, name: str, bound: float) -> HistogramLayout:
    """The histogram of the count target (model-space coordinate ``num_features``, the raw count)."""
    column = ColumnBins(name, "edges", num_features, 1, target=True, edges=count_edges(bound))
    return HistogramLayout((column,), num_features + 1)


@dataclass(frozen=True)
class CountClip:
    """The clip bound a release used, the schema's bound, and whether any bin rose above the noise."""

    bound: float
    schema_bound: float
    surviving: bool
    noise_multiplier: float

    def note(self) -> str:
        if not self.surviving:
            return (f"count target: no bin of its DP histogram rose above the noise (noise multiplier "
                    f"{self.noise_multiplier:.4g}); its clip bound is the schema's {self.schema_bound:g}")
        return (f"count target clipped at {self.bound:g} (the upper edge of the public grid bin holding its noisy "
                f"{CLIP_QUANTILE:.1%} quantile, one Gaussian mechanism, noise multiplier {self.noise_multiplier:.4g}; the "
                f"schema's bound is {self.schema_bound:g}): a record with a larger count has its score clipped")


def clip_bound(noisy: NoisyMarginals, schema_bound: float) -> CountClip:
    """The clip bound from the released histogram of :func:`count_layout` (post-processing)."""
    (mass,) = noisy.masses()
    (column,) = noisy.layout.columns
    if mass is None:
        return CountClip(float(schema_bound), float(schema_bound), False, noisy.noise_multiplier)
    cumulative = np.cumsum(mass) / mass.sum()
    k = int(np.searchsorted(cumulative, CLIP_QUANTILE, side="left"))
    upper = column.edges[k] if k < len(column.edges) else float(schema_bound)
    return CountClip(min(float(upper), float(schema_bound)), float(schema_bound), True, noisy.noise_multiplier)
