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

Reading streams (:class:`dpsummary.data.BatchStream`: pyarrow's CSV and Parquet readers, the
stdlib ``csv`` reader only as the total-rule fallback for files pyarrow cannot parse), so the raw
table is never held in memory; the encoded records live in a memory-bounded
:class:`~dpsummary.private.store.RecordStore` (see its docstring for the private temporary file).

Counts that are not released through a mechanism (the exact number of rows, of ragged rows, of
records each rule touched) never leave this module: they are not logged, not returned and never
put in an error message.
"""

from __future__ import annotations

from pathlib import Path
from typing import Any

import numpy as np
import torch

from ..data import Transform
from ..postprocess.quality import QUALITY_COUNTS, QualityCounts
from .mechanism import PrivateRecords
from .store import RecordStore


class _Stage1Scan:
    """Consumer of one streaming pass for stage 1: exact row count and, if asked, the schema
    estimation counts (PRIVATE, kept inside this module)."""

    def __init__(self, header: list[str], schema: bool) -> None:
        from .preprocess import SchemaCounts

        self.rows = 0
        self.counts = SchemaCounts(header) if schema else None

    def add(self, batch: Any) -> None:
        from ..data import batch_columns, text_column

        self.rows += batch.num_rows
        if self.counts is not None:
            for name, col in batch_columns(batch).items():
                self.counts.add(name, text_column(col)[0])

    def discard(self) -> None:
        self.counts = None


class _EncodePass:
    """Consumer of the stage-2 streaming pass: encodes every batch into a :class:`RecordStore`
    and sums the quality indicators (PRIVATE, kept inside this module)."""

    def __init__(self, transform: Transform, missing_numeric: str, unseen_category: str) -> None:
        self.transform = transform
        self.rules = (missing_numeric, unseen_category)
        self.store = RecordStore(transform.point_dim)
        self.rows = 0
        # Per record each indicator is 0/1: [undecodable, imputed, other, dropped (any rule)].
        self.quality = np.zeros(len(QUALITY_COUNTS), dtype=np.int64)

    def add(self, batch: Any) -> None:
        from ..data import QUALITY_RULES, encode_batch

        enc = encode_batch(batch, self.transform, missing_numeric=self.rules[0],  # type: ignore[arg-type]
                           unseen_category=self.rules[1])  # type: ignore[arg-type]
        ind = np.asarray(enc.indicators, dtype=bool)
        names = list(QUALITY_RULES)
        dropped = ind[:, [names.index(r) for r in ("dropped_target", "dropped_numeric", "dropped_category")]].any(1)
        self.quality += np.array([int(enc.undecodable.sum()), int(ind[:, names.index("imputed_numeric")].sum()),
                                  int(ind[:, names.index("other_category")].sum()), int(dropped.sum())])
        self.rows += batch.num_rows
        self.store.append(enc.rows)

    def discard(self) -> None:
        self.store.close()


def release_schema(counts: Any, *, noise_multiplier: float, target: str | None, delta: float,
                   target_classes: int | None, public_target: Any = None, count_target: bool = False) -> Any:
    """DP schema estimation on exact :class:`~dpsummary.private.preprocess.SchemaCounts` (any
    engine's pass): the one Gaussian mechanism and partition selection of
    :func:`~dpsummary.private.preprocess.estimate_schema`, with the release's target rule
    (the target left out when its spec is public, ``public_target``; else an even noise share
    when ``target_classes`` is given: a numeric target is then read as 0/1, a categorical one
    keeps its ``target_classes`` largest values; ``count_target``: the model is a count
    regression, whose numeric target is a count by a public rule when its grid shows too little)."""
    from .preprocess import estimate_schema

    if public_target is not None:
        return estimate_schema(counts, noise_multiplier=noise_multiplier, target=target, delta=delta,
                               public_target=public_target)
    if target_classes is not None:
        return estimate_schema(counts, noise_multiplier=noise_multiplier, target=target, delta=delta,
                               target_classes=target_classes, target_share=None)
    return estimate_schema(counts, noise_multiplier=noise_multiplier, target=target, delta=delta,
                           count_target=count_target)


class PrivateSource:
    """A private file, read only in streaming passes. Construct with :meth:`open` after the
    reservation; :meth:`close` (or the context manager) releases everything it holds.

    Passes (one streaming read each, never the raw table in memory, see
    :class:`dpsummary.data.BatchStream`): stage 1 (the row count, plus the schema estimation
    counts when the schema is not public) and stage 2 (:meth:`encode`: every record encoded into
    a memory-bounded :class:`~dpsummary.private.store.RecordStore`, quality indicators summed).
    With a public schema, :meth:`prepare` lets stage 1 encode at once, so one pass serves both
    stages."""

    __slots__ = ("_encoded", "_header", "_path", "_ragged", "_rows", "_schema_counts")

    def __init__(self, path: Path, header: list[str]) -> None:
        self._path = path
        self._header = header
        self._rows: int | None = None  # PRIVATE exact count of rows read (ragged rows excluded)
        self._ragged: int | None = None  # PRIVATE
        self._schema_counts: Any = None
        self._encoded: tuple[Any, EncodedSource] | None = None

    @classmethod
    def open(cls, path: Path) -> PrivateSource:
        """Check the public header; no record is read until a mechanism asks. Never refuses on
        record content; only public facts (the file vanished, it cannot be read) raise."""
        from ..data import read_header

        return cls(Path(path), read_header(path))

    def close(self) -> None:
        if self._encoded is not None:
            self._encoded[1].close()
            self._encoded = None

    def __enter__(self) -> PrivateSource:
        return self

    def __exit__(self, *exc: object) -> None:
        self.close()

    def _scan_stage1(self, *, schema: bool) -> None:
        from ..data import stream_pass

        if self._rows is not None and (not schema or self._schema_counts is not None):
            return
        scan, ragged = stream_pass(self._path, lambda: _Stage1Scan(self._header, schema), header=self._header)
        self._rows, self._ragged = scan.rows, ragged
        if schema:
            self._schema_counts = scan.counts

    # ---- stage 1: count and schema ----------------------------------------------------------
    def prepare(self, transform: Transform, *, missing_numeric: str, unseen_category: str) -> None:
        """With a PUBLIC transform known before stage 1 (a public schema), encode now: the one
        pass also gives stage 1's row count. Nothing is released here."""
        self.encode(transform, missing_numeric=missing_numeric, unseen_category=unseen_category)

    def noisy_record_count(self, *, noise_multiplier: float) -> float:
        """Number of records read plus N(0, noise_multiplier^2): the Gaussian mechanism with
        sensitivity 1 (one record adds one row, or one ragged row that is dropped: 0)."""
        from .mechanism import SystemRandomness

        if self._rows is None:
            self._scan_stage1(schema=False)
        assert self._rows is not None
        count = np.array([float(self._rows)])
        return float(SystemRandomness().gaussian(count, noise_std=noise_multiplier, clip_norm=1.0)[0])

    def estimate_schema(self, *, noise_multiplier: float, target: str | None, delta: float,
                        target_classes: int | None = None, public_target: Any = None,
                        count_target: bool = False) -> Any:
        """DP schema estimation (one Gaussian mechanism plus partition selection at ``delta``),
        on counts accumulated in one streaming pass (:class:`~dpsummary.private.preprocess.SchemaCounts`).
        ``target_classes`` (public: 2 when the requested model is logistic) gives the target an
        even noise share and its classes by a public rule (numeric: 0/1; categorical: the two
        largest noisy values; benchmarks/results/schema_refusal_rate.md);
        otherwise the target gets its own share of the noise budget. ``public_target``: the
        target's public spec (``--positive-class``); its column is then not estimated at all.
        ``count_target`` (public: the requested model is Poisson): a numeric target whose noisy
        grid shows nothing usable is a count in ``[0, 1e9]`` instead of a refusal
        (:mod:`dpsummary.postprocess.schema`)."""
        self._scan_stage1(schema=True)
        return release_schema(self._schema_counts, noise_multiplier=noise_multiplier, target=target, delta=delta,
                              target_classes=target_classes, public_target=public_target,
                              count_target=count_target)

    # ---- stage 2: records in model space ----------------------------------------------------
    def encode(self, transform: Transform, *, missing_numeric: str, unseen_category: str) -> EncodedSource:
        """Map every record to model space by the public total rules
        (:func:`dpsummary.data.encode_batch`) in one streaming pass into a record store; the
        exact quality counts stay inside the returned object."""
        from ..data import stream_pass

        key = (transform.to_dict(), missing_numeric, unseen_category)
        if self._encoded is not None:
            if self._encoded[0] == key:
                return self._encoded[1]
            self._encoded[1].close()
            self._encoded = None
        enc, ragged = stream_pass(self._path, lambda: _EncodePass(transform, missing_numeric, unseen_category),
                                  header=self._header)
        self._rows, self._ragged = enc.rows, ragged
        quality = enc.quality.copy()
        quality[0] += ragged  # each ragged row: one record of the file, dropped, first indicator only
        encoded = EncodedSource(PrivateRecords(enc.store.seal()), quality)
        self._encoded = (key, encoded)
        return encoded


class EncodedSource:
    """Private records in model space plus their (private) summed quality indicators."""

    __slots__ = ("_quality", "records")

    def __init__(self, records: PrivateRecords, quality: np.ndarray) -> None:
        self.records = records
        self._quality = quality

    def close(self) -> None:
        self.records.close()

    def noisy_score_statistics(self, model: Any, theta: torch.Tensor, **mechanism: float) -> Any:
        """The noise-aware mechanism's two Gaussian releases at public ``theta``
        (:meth:`PrivateRecords.noisy_score_statistics`)."""
        return self.records.noisy_score_statistics(model, theta, **mechanism)

    def noisy_quality_counts(self, *, noise_multiplier: float) -> QualityCounts:
        """One Gaussian mechanism over the quality indicators (see :data:`QUALITY_COUNTS`).

        Per record read, each indicator is 0 or 1 (undecodable bytes; a numeric imputed; a
        category sent to "other"; dropped by any rule), so one record changes each count by at
        most 1: L2 sensitivity sqrt(4) before the shared scaling rule brings it to 1
        (:func:`~dpsummary.private.mechanism.noisy_indicator_totals`). A ragged row is one record
        of the file that was dropped before becoming a row, so it counts once, in the first
        indicator."""
        from .mechanism import SystemRandomness, noisy_indicator_totals

        noisy = noisy_indicator_totals(SystemRandomness(), self._quality.astype(np.float64),
                                       noise_multiplier=noise_multiplier)
        return QualityCounts(dict(zip(QUALITY_COUNTS, (float(v) for v in noisy), strict=True)), noise_multiplier)
