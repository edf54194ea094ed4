"""The data-quality counts a release publishes: their public names and order, and what the
release makes of them (post-processing of noisy counts). The counts are released by
:meth:`dpsummary.private.source.EncodedSource.noisy_quality_counts` (one Gaussian mechanism over
per-record 0/1 indicators, :func:`dpsummary.private.mechanism.noisy_indicator_totals`); nothing
here reads a record or draws noise."""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any

#: Public names of the quality counts, in the order they are released.
QUALITY_COUNTS = ("ragged_or_unreadable", "imputed_numeric", "other_category", "dropped")


@dataclass(frozen=True)
class QualityCounts:
    """Noisy counts (DP outputs) of the records each public rule touched, and of records read."""

    noisy: dict[str, float]
    noise_multiplier: float

    def dropped_fraction(self, noisy_records_read: float) -> float:
        """Noisy share of records dropped by the rules (post-processing of DP outputs)."""
        return max(self.noisy["dropped"], 0.0) / max(noisy_records_read, 1.0)

    def as_dict(self) -> dict[str, Any]:
        return {
            "noise_multiplier": self.noise_multiplier,
            "noisy_counts": {k: round(v, 1) for k, v in self.noisy.items()},
            "meaning": ("records touched by each public per-record rule (ragged_or_unreadable: rows "
                        "dropped as ragged or holding undecodable bytes; imputed_numeric: records with a "
                        "missing or non-finite numeric imputed; other_category: records with an unseen "
                        "category; dropped: records removed by the rules); Gaussian noise, one mechanism"),
        }
