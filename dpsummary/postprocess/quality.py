"""The data-quality counts a release publishes: their public names and order, and what the
release makes of them (post-processing of noisy counts). The counts are released by
:meth:`dpsummary.private.source.EncodedSource.noisy_quality_counts` (one Gaussian mechanism over
per-record 0/1 indicators, :func:`dpsummary.private.mechanism.noisy_indicator_totals`); nothing
here reads a record or draws noise."""

from __future__ import annotations

import math
from dataclasses import dataclass
from typing import Any

#: Public names of the quality counts, in the order they are released.
QUALITY_COUNTS = ("ragged_or_unreadable", "imputed_numeric", "other_category", "dropped")
#: The data-quality refusal fires only when the noisy dropped count exceeds the policy's
#: ``max_dropped_fraction`` of the noisy record count by more than this many noise sds (public):
#: a table whose true share sits at the threshold is refused with probability about 2%, one far
#: below it essentially never; without the margin, on a small table at a small epsilon the noise
#: alone refused (german_credit at epsilon 0.1: "about 62-79% unusable" on a table with none,
#: benchmarks/notebook/noise_aware_variants.md).
QUALITY_REFUSAL_SDS = 2.0


@dataclass(frozen=True)
class QualityCounts:
    """Noisy counts (DP outputs) of the records each public rule touched, and of records read."""

    noisy: dict[str, float]
    noise_multiplier: float

    def dropped_fraction(self, noisy_records_read: float) -> float:
        """Noisy share of records dropped by the rules (post-processing of DP outputs)."""
        return max(self.noisy["dropped"], 0.0) / max(noisy_records_read, 1.0)

    @property
    def count_noise_std(self) -> float:
        """Each count's noise sd in records (public): the mechanism's multiplier over the shared
        scaling of the ``len(QUALITY_COUNTS)`` indicators (:func:`dpsummary.private.noise.count_vector_scale`)."""
        from ..private.noise import count_vector_scale

        k = len(QUALITY_COUNTS)
        return self.noise_multiplier / count_vector_scale(k, k)

    def dropped_excess_sds(self, noisy_records_read: float, record_count_noise_std: float, fraction: float) -> float:
        """How many noise sds the noisy dropped count lies above ``fraction`` of the noisy record
        count: ``(dropped - fraction n) / sqrt(sd_dropped^2 + (fraction sd_n)^2)`` (both counts
        noisy and independent; ``record_count_noise_std`` 0 for a public count). Post-processing."""
        sd = math.hypot(self.count_noise_std, fraction * record_count_noise_std)
        return (self.noisy["dropped"] - fraction * noisy_records_read) / max(sd, 1e-12)

    def as_dict(self) -> dict[str, Any]:
        return {
            "noise_multiplier": self.noise_multiplier,
            "noisy_counts": {k: round(v, 1) for k, v in self.noisy.items()},
            "meaning": ("records touched by each public per-record rule (ragged_or_unreadable: rows "
                        "dropped as ragged or holding undecodable bytes; imputed_numeric: records with a "
                        "missing or non-finite numeric imputed; other_category: records with an unseen "
                        "category; dropped: records removed by the rules); Gaussian noise, one mechanism"),
        }
