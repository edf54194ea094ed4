"""Streaming encode: one Arrow record batch to model space by the release's total per-record
rules (section "Streaming" of :mod:`dpsummary.data`): a pure function of the batch and the
public transform, so every engine (the local store, Spark executors) encodes identically."""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any, Literal

import numpy as np

from ..header import normalise_text
from .stream import batch_columns, dictionary_codes, text_column, text_numbers
from .transform import (
    Transform,
    _category_index,
    _encode_records,
    _normalised_target,
    _replace,
)


@dataclass(frozen=True)
class EncodedBatch:
    """One batch in model space. ``rows``: the KEPT records (k, point_dim) float64.
    ``indicators`` (one row per record of the batch, columns :data:`QUALITY_RULES`) and
    ``undecodable`` (per record of the batch) are PRIVATE: they go only into the accounted
    quality-count mechanism, summed, never logged or returned by a release."""

    rows: np.ndarray
    indicators: np.ndarray
    undecodable: np.ndarray


def encode_batch(
    batch: Any,
    transform: Transform,
    *,
    missing_numeric: Literal["impute", "drop"] = "impute",
    unseen_category: Literal["other", "drop"] = "other",
) -> EncodedBatch:
    """:meth:`Transform.encode_total` for one Arrow record batch: a pure function of the batch
    and the public transform (no I/O, no randomness, never raises on record content), so every
    engine (the local store, Spark executors) encodes records identically.

    ``batch`` holds the file's columns (binary as read by :func:`stream_batches`, or typed, as a
    Parquet file or a Spark DataFrame gives them); names are matched after
    :func:`normalise_text`; a schema column absent from the batch is all missing. Per record: a
    numeric feature that is missing, unparsable or not finite is imputed at the column's public
    centre or drops the record (``missing_numeric``); values are clipped to the public bounds and
    scaled; a missing or unseen category is the all-zero "other" vector or drops the record
    (``unseen_category``); a missing or invalid target drops the record. Undecodable bytes (in
    any column of the batch) flag the record, which is kept."""
    cols = batch_columns(batch)
    n = batch.num_rows
    undecodable = np.zeros(n, dtype=bool)
    texts: dict[str, Any] = {}
    for name, col in cols.items():
        texts[name], bad = text_column(col)
        undecodable |= bad

    def numbers(name: str) -> tuple[np.ndarray, np.ndarray]:
        text = texts.get(name)
        if text is None:
            return np.full(n, np.nan), np.zeros(n, dtype=bool)
        values, ok, _ = text_numbers(text)
        return values, ok

    def distinct(name: str) -> tuple[np.ndarray, np.ndarray] | None:
        """(normalised distinct values, per-record codes) of a column, or None if absent."""
        text = texts.get(name)
        if text is None:
            return None
        uniq, codes = dictionary_codes(text)
        u = np.empty(len(uniq), dtype=object)
        u[:] = [normalise_text(x) for x in uniq]
        return u, codes

    def categories(name: str, cats: list[str]) -> np.ndarray:
        d = distinct(name)
        if d is None or not len(d[0]):
            return np.full(n, -1, dtype=np.int64)
        return _category_index(d[0], cats)[d[1]]

    def target(name: str) -> tuple[np.ndarray, np.ndarray]:
        d = distinct(name)
        if d is None or not len(d[0]):
            return np.zeros(n), np.zeros(n, dtype=bool)
        uy, uvalid = _replace(transform, invalid_target="drop")._target(_normalised_target(transform, d[0]), True)
        return uy[d[1]], uvalid[d[1]]

    kept, indicators = _encode_records(transform, n, numbers, categories, target, missing_numeric=missing_numeric,
                                       unseen_category=unseen_category)
    return EncodedBatch(kept, indicators, undecodable)
