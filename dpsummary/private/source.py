"""The private data source of a release: the only object through which a release reads records.

A :class:`PrivateSource` is opened only after the ledger has reserved the budget of the mechanism
that is about to read it. Reading is *total*: every record is mapped by public per-record rules
(see :mod:`dpsummary.data`: Unicode normalisation, ragged rows dropped, undecodable bytes
replaced, non-finite or unparsable numerics missing, then imputed or dropped, unseen categories
bucketed or dropped, invalid targets dropped), so no single record can make a release refuse.
Everything that leaves this object is the output of an accounted Gaussian mechanism:

* :meth:`noisy_record_count` — the number of records read (sensitivity 1);
* :meth:`estimate_schema` — DP schema estimation (:mod:`dpsummary.private.preprocess`);
* :meth:`encode` — the records in model space, wrapped in :class:`PrivateRecords` (which answers
  only through mechanisms), together with :meth:`EncodedSource.noisy_quality_counts`, how many
  records each data-quality rule touched (one Gaussian mechanism over per-record indicators).

Counts that are not released through a mechanism (the exact number of rows, of ragged rows, of
records each rule touched) never leave this module: they are not logged, not returned and never
put in an error message.
"""

from __future__ import annotations

from dataclasses import dataclass
from pathlib import Path
from typing import Any

import numpy as np
import torch

from ..data import RawTable, Transform, read_table
from .mechanism import PrivateRecords

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


class PrivateSource:
    """Records read from a private file. Construct with :meth:`open` after the reservation."""

    __slots__ = ("_report", "_table")

    def __init__(self, table: RawTable, report: Any) -> None:
        self._table = table
        # What the reader's total rules did (ragged rows dropped, rows with undecodable bytes):
        # private, used only inside the quality-count mechanism.
        self._report = report

    @classmethod
    def open(cls, path: Path) -> PrivateSource:
        """Read ``path`` through the total per-record rules. Never refuses on record content;
        only public facts (the file vanished, it cannot be read) raise here."""
        table, report = read_table(path, private=True)
        return cls(table, report)

    # ---- stage 1: count and schema ----------------------------------------------------------
    def noisy_record_count(self, *, noise_multiplier: float) -> float:
        """Number of records read plus N(0, noise_multiplier^2): the Gaussian mechanism with
        sensitivity 1 (one record adds one row, or one ragged row that is dropped: 0)."""
        return PrivateRecords(torch.zeros(self._table.num_rows, 1)).noisy_count(noise_multiplier=noise_multiplier)

    def estimate_schema(self, *, noise_multiplier: float, target: str | None, delta: float,
                        target_classes: int | None = None) -> Any:
        """DP schema estimation (one Gaussian mechanism plus partition selection at ``delta``).
        ``target_classes`` (public: 2 when the requested model is logistic) selects the target's
        classes by noisy top-k with an even noise share (benchmarks/results/schema_refusal_rate.md);
        otherwise the target gets its own share of the noise budget."""
        from .preprocess import estimate_schema

        if target_classes is not None:
            return estimate_schema(self._table, noise_multiplier=noise_multiplier, target=target, delta=delta,
                                   target_classes=target_classes, target_share=None)
        return estimate_schema(self._table, noise_multiplier=noise_multiplier, target=target, delta=delta)

    # ---- stage 2: records in model space ----------------------------------------------------
    def encode(self, transform: Transform, *, missing_numeric: str, unseen_category: str) -> EncodedSource:
        """Map every record to model space by the public total rules; the exact quality
        indicators stay inside the returned object."""
        points, quality = transform.encode_total(
            self._table, missing_numeric=missing_numeric, unseen_category=unseen_category  # type: ignore[arg-type]
        )
        return EncodedSource(PrivateRecords(points), quality, self._report)


class EncodedSource:
    """Private records in model space plus their (private) per-record quality indicators."""

    __slots__ = ("_quality", "_read_report", "records")

    def __init__(self, records: PrivateRecords, quality: Any, read_report: Any) -> None:
        self.records = records
        self._quality = quality
        self._read_report = read_report

    def noisy_score_statistics(self, model: Any, theta: torch.Tensor, **mechanism: float) -> Any:
        """The noise-aware mechanism's two Gaussian releases at public ``theta``
        (:meth:`PrivateRecords.noisy_score_statistics`)."""
        return self.records.noisy_score_statistics(model, theta, **mechanism)

    def noisy_quality_counts(self, *, noise_multiplier: float) -> QualityCounts:
        """One Gaussian mechanism over the quality indicators (see :data:`QUALITY_COUNTS`).

        Per record read, each indicator is 0 or 1, so one record changes each count by at most 1:
        L2 sensitivity sqrt(4) before the shared scaling rule brings it to 1
        (:meth:`PrivateRecords.noisy_indicator_counts`). A ragged row is one record of the file
        that was dropped before becoming a row, so it counts once, in the first indicator."""
        q = self._quality
        names = list(q.names)
        ind = np.asarray(q.indicators, dtype=bool)

        def column(*rules: str) -> np.ndarray:
            cols = [ind[:, names.index(r)] for r in rules if r in names]
            return np.logical_or.reduce(cols) if cols else np.zeros(ind.shape[0], dtype=bool)

        undecodable = np.asarray(getattr(self._read_report, "undecodable", np.zeros(ind.shape[0], bool)), dtype=bool)
        matrix = np.stack([
            undecodable,
            column("imputed_numeric"),
            column("other_category"),
            column("dropped_target", "dropped_numeric", "dropped_category"),
        ], axis=1)
        # Each ragged row was one record of the file, dropped before it became a row: it adds one
        # row touching only the first indicator.
        ragged = int(getattr(self._read_report, "ragged_rows", 0))
        if ragged:
            extra = np.zeros((ragged, matrix.shape[1]), dtype=bool)
            extra[:, 0] = True
            matrix = np.concatenate([matrix, extra])
        noisy = self.records.noisy_indicator_counts(matrix, noise_multiplier=noise_multiplier)
        return QualityCounts(dict(zip(QUALITY_COUNTS, (float(v) for v in noisy), strict=True)), noise_multiplier)
