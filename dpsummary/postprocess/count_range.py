"""The count target's and the feature norm's clip bounds from one DP histogram (the default
mechanism's data ranges; :mod:`dpsummary.noise_aware`, module docstring 11. and 12.).

Public planning and post-processing only: the bins (:func:`count_layout`: the 1-2-5 grid edges
below the schema's upper bound ``B``, all public) and what the noisy histogram makes of the bound
(:func:`clip_bound`). The histogram is one Gaussian mechanism,
:meth:`dpsummary.private.mechanism.PrivateRecords.noisy_marginals` on a layout of one column of
kind ``"edges"`` (a record in exactly one bin: L2 sensitivity 1; :mod:`dpsummary.private.marginals`).

Rule (issue 37's twelfth, written before its run, benchmarks/notebook/noise_aware_variants.md):
bins below the noise threshold of :class:`~dpsummary.postprocess.marginals.NoisyMarginals` (an
empty bin survives with probability 1% over all bins) are zeroed; the bound is the upper edge of
the bin holding the :data:`CLIP_QUANTILE` quantile of what remains, capped at ``B``; ``B`` itself
when no bin survives. Records above the bound are not dropped: their scores are clipped by the
statistic bounds the bound implies, like any record outside the public box.

The feature norm (issue 37's thirteenth rule, written before its run): the L2 norm of a record's
model-space feature coordinates over public geometric bins below the schema's norm bound ``F``
(:func:`norm_edges`: ``F 2^(-k/4)``, ``k = 32 .. 1``); the same threshold; the clip is the upper
edge of the bin holding the :data:`NORM_QUANTILE` quantile of what remains, ``F`` when no bin
survives. A record whose features' norm exceeds it has its score and curvature clipped by the
statistic bounds the smaller norm implies. Both histograms, when a release has both, are one
Gaussian mechanism (a record in one bin of each: ``K = 2``, :func:`range_layout`).
"""

from __future__ import annotations

import math
from dataclasses import dataclass
from typing import Final, Literal

import numpy as np

from ..private.marginals import ColumnBins, HistogramLayout
from .marginals import NoisyMarginals

#: The noisy quantile of the count whose bin's upper edge is the clip bound (public).
CLIP_QUANTILE: Final = 0.999
#: The noisy quantile of the feature norm whose bin's upper edge is its clip bound (public).
NORM_QUANTILE: Final = 0.999
#: The feature norm's public bins: NORM_STEPS per halving, NORM_OCTAVES halvings below the bound.
NORM_STEPS: Final = 4
NORM_OCTAVES: Final = 8


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


def norm_edges(bound: float) -> tuple[float, ...]:
    """Public, increasing bin edges of the feature norm: ``bound 2^(-k / NORM_STEPS)`` for ``k =
    NORM_STEPS * NORM_OCTAVES .. 1`` (bins ``(-inf, e_0], ..., (e_last, inf)``; the last bin's upper
    edge is ``bound``). ``bound`` must be positive and finite."""
    if not (bound > 0 and math.isfinite(bound)):
        raise ValueError("the feature norm's bound must be positive and finite")
    top = NORM_STEPS * NORM_OCTAVES
    return tuple(float(bound) * 2.0 ** (-k / NORM_STEPS) for k in range(top, 0, -1))


FEATURE_NORM: Final = "feature norm"


def range_layout(num_features: int, *, feature_bound: float | None = None,
                 count: tuple[str, float] | None = None) -> HistogramLayout:
    """One histogram of the data ranges a release clips at: the feature norm (coordinates
    ``0 .. num_features - 1``, when ``feature_bound`` is given) and the count target (coordinate
    ``num_features``, the raw count, when ``count = (name, bound)`` is given)."""
    columns = []
    if feature_bound is not None:
        columns.append(ColumnBins(FEATURE_NORM, "norm", 0, num_features, edges=norm_edges(feature_bound)))
    if count is not None:
        name, bound = count
        columns.append(ColumnBins(name, "edges", num_features, 1, target=True, edges=count_edges(bound)))
    if not columns:
        raise ValueError("a range layout needs the feature norm or a count target")
    return HistogramLayout(tuple(columns), num_features + (1 if count is not None else 0))


def count_layout(num_features: int, name: str, bound: float) -> HistogramLayout:
    """The histogram of the count target alone (model-space coordinate ``num_features``)."""
    return range_layout(num_features, count=(name, bound))


@dataclass(frozen=True)
class Clip:
    """One clip bound a release used (``kind``: ``"count"``, the count target's, or ``"norm"``, the
    features' L2 norm), the schema's bound, and whether any bin of its histogram rose above the noise."""

    kind: Literal["count", "norm"]
    bound: float
    schema_bound: float
    surviving: bool
    noise_multiplier: float

    def claim(self) -> dict[str, float | bool]:
        """The claim's record of this clip (docs/FORMAT.md: ``count_range`` / ``feature_range``)."""
        return {"noise_multiplier": self.noise_multiplier, "schema_bound": self.schema_bound,
                "clip_bound": self.bound, "bin_above_noise": self.surviving}

    def note(self) -> str:
        count = self.kind == "count"
        if not self.surviving:
            schema = f"{self.schema_bound:g}" if count else f"{self.schema_bound:.4g}"
            return (f"{'count target' if count else 'feature norm'}: no bin of its DP histogram rose above the noise "
                    f"(noise multiplier {self.noise_multiplier:.4g}); its clip bound is the schema's {schema}")
        if count:
            return (f"count target clipped at {self.bound:g} (the upper edge of the public grid bin holding its noisy "
                    f"{CLIP_QUANTILE:.1%} quantile, one Gaussian mechanism, noise multiplier {self.noise_multiplier:.4g}; "
                    f"the schema's bound is {self.schema_bound:g}): a record with a larger count has its score clipped")
        return (f"features clipped at L2 norm {self.bound:.4g} in model space (the upper edge of the public bin "
                f"holding their norm's noisy {NORM_QUANTILE:.1%} quantile, noise multiplier {self.noise_multiplier:.4g}; "
                f"the schema's box allows {self.schema_bound:.4g}): a record with a larger norm has its score and "
                "curvature clipped")


def _clip(noisy: NoisyMarginals, schema_bound: float, kind: Literal["count", "norm"]) -> Clip:
    """The ``kind`` clip from the released histogram of :func:`range_layout` (post-processing): the
    upper edge of the bin holding the noisy quantile of what survived the threshold, capped at
    ``schema_bound``; ``schema_bound`` itself when no bin survived."""
    want = "edges" if kind == "count" else "norm"
    ((column, mass),) = [(c, m) for c, m in zip(noisy.layout.columns, noisy.masses(), strict=True) if c.kind == want]
    top = float(schema_bound)
    if mass is None:
        return Clip(kind, top, top, False, noisy.noise_multiplier)
    cumulative = np.cumsum(mass) / mass.sum()
    k = int(np.searchsorted(cumulative, CLIP_QUANTILE if kind == "count" else NORM_QUANTILE, side="left"))
    upper = float(column.edges[k]) if k < len(column.edges) else top
    return Clip(kind, min(upper, top), top, True, noisy.noise_multiplier)


def clip_bound(noisy: NoisyMarginals, schema_bound: float) -> Clip:
    """The count's clip bound from the released histogram of :func:`range_layout`."""
    return _clip(noisy, schema_bound, "count")


def norm_clip(noisy: NoisyMarginals, schema_bound: float) -> Clip:
    """The feature norm's clip bound from the released histogram of :func:`range_layout`."""
    return _clip(noisy, schema_bound, "norm")


@dataclass(frozen=True)
class RangeClips:
    """What a release's data-range stage decided: the feature norm's clip (or None) and the
    count's (or None)."""

    feature: Clip | None
    count: Clip | None

    def notes(self) -> list[str]:
        return [c.note() for c in (self.feature, self.count) if c is not None]
