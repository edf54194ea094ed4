"""Raw tables: a whole file as Python strings, for non-private tools and tests (section "Raw
tables" of :mod:`dpsummary.data`; the release never holds the raw table, it streams,
:mod:`dpsummary.data.stream`)."""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import numpy as np

from ..header import DataError, normalise_text, read_header
from .stream import batch_columns, stream_pass, text_column


@dataclass(frozen=True)
class RawTable:
    """Raw string columns in header order. ``private`` makes error messages data-free."""

    header: list[str]
    columns: dict[str, list[str]]
    private: bool = field(default=False, compare=False)

    @property
    def num_rows(self) -> int:
        """Exact row count. Private information: never print it for a private table."""
        return len(self.columns[self.header[0]]) if self.header else 0

    def array(self, name: str) -> np.ndarray:
        """One column as a numpy object array of ``str`` (fast to build and to compare)."""
        try:
            values = self.columns[name]
        except KeyError:
            raise DataError(f"column {name!r} is not in the data") from None
        out = np.empty(len(values), dtype=object)
        out[:] = values
        return out

    @classmethod
    def from_rows(
        cls, rows: Sequence[Mapping[str, str]], header: Sequence[str], *, private: bool = False
    ) -> RawTable:
        """Build a table from dict rows; absent keys are missing values."""
        cols = {h: [normalise_text(str(r.get(h, "") or "")) for r in rows] for h in header}
        return cls(header=list(header), columns=cols, private=private)


def _err(private: bool, message: str, detail: str = "") -> DataError:
    """A DataError whose ``detail`` (row numbers, values) is kept only for non-private data."""
    if detail and not private:
        return DataError(f"{message} ({detail})")
    return DataError(message)


@dataclass(frozen=True)
class ReadReport:
    """What the reader's total rules did. PRIVATE: ``undecodable`` (one bool per row kept: the
    row held bytes that are not UTF-8) and ``ragged_rows`` (rows dropped for a wrong field
    count) go only into an accounted noisy-count mechanism, never into a message or a log."""

    undecodable: np.ndarray
    ragged_rows: int


def read_table(path: str | Path, *, private: bool = False) -> tuple[RawTable, ReadReport]:
    """Read a CSV (or Parquet) file by public, total per-record rules (never refuses on record
    content; only the public facts of :func:`read_header` raise):

    * every field and header name is normalised by :func:`normalise_text`; an empty field is
      missing; blank lines are skipped; a UTF-8 byte order mark is removed;
    * a CSV record is one physical line (see :class:`BatchStream`);
    * a line whose field count differs from the header's, or that ends inside a quoted field
      (ragged), is dropped;
    * bytes that are not UTF-8 become U+FFFD (a numeric field holding one is then non-numeric).

    Returns the whole table and a private :class:`ReadReport` (see its caveat). The same
    streaming pass as the release (:func:`stream_pass`, pyarrow's readers with the stdlib
    per-line parser for the blocks pyarrow cannot read by the per-line rule), collected into Python lists: for non-private tools and tests only (the release
    never holds the raw table)."""

    class _Collect:
        def __init__(self) -> None:
            self.columns: dict[str, list[str]] = {}
            self.bad: list[np.ndarray] = []

        def add(self, batch: Any) -> None:
            flags = np.zeros(batch.num_rows, dtype=bool)
            for name, col in batch_columns(batch).items():
                text, bad = text_column(col)
                self.columns.setdefault(name, []).extend(text.to_pylist())
                flags |= bad
            self.bad.append(flags)

        def discard(self) -> None:
            self.columns, self.bad = {}, []

    header = read_header(path)
    got, ragged = stream_pass(path, _Collect, header=header)
    cols = {h: got.columns.get(h, []) for h in header}
    bad = np.concatenate(got.bad) if got.bad else np.zeros(0, dtype=bool)
    return RawTable(header=header, columns=cols, private=private), ReadReport(bad, ragged)


def read_csv(path: str | Path, *, private: bool = False) -> RawTable:
    """The table of :func:`read_table` (for non-private callers and tools that need no report)."""
    return read_table(path, private=private)[0]
