"""The data file's header: the one public check of a data file before any reservation.

Deliberately light (the standard library only; pyarrow for a Parquet schema, imported when one
is read): ``dpsummary release`` refuses a missing file, an unreadable or malformed header or a
target column absent from it before torch, scipy, opacus, dp_accounting or opendp are
imported, so such a refusal costs about as much as ``--help``. :mod:`dpsummary.data` re-exports
everything here (``dpsummary.data.DataError`` is this module's class).
"""

from __future__ import annotations

import csv
import io
import unicodedata
from pathlib import Path

from .errors import DATA_NOT_FOUND_FIX, NOT_A_FILE_FIX, FixedError

__all__ = ["MAX_HEADER_BYTES", "DataError", "normalise_text", "read_header"]


class DataError(FixedError, ValueError):
    """A problem with the input data or schema, phrased for the user in one line (its ``fix``,
    when set, is the advice the CLI prints after it)."""


#: Bytes of the first line read by the public header check (a header longer than this is refused).
MAX_HEADER_BYTES = 1 << 20
_BOM = b"\xef\xbb\xbf"


def normalise_text(value: str) -> str:
    """THE public normalisation of every field, header name and schema category: Unicode NFKC,
    then leading/trailing Unicode whitespace (non-breaking and other spaces included) removed."""
    return unicodedata.normalize("NFKC", value).strip()


def _is_parquet(path: Path) -> bool:
    return path.suffix.lower() in (".parquet", ".pq")


def read_header(path: str | Path) -> list[str]:
    """The header of a CSV (first line) or Parquet file (schema names), normalised.

    The only check of a data file that runs before a privacy reservation, so it refuses
    (:class:`DataError`, one line with the fix) only on public facts: the file is missing, not a
    file, unreadable, empty, or its header is not a CSV line of distinct non-empty names. No data
    row is read: a header without rows passes (the release decides on noisy counts)."""
    p = Path(path)
    if not p.exists():
        raise DataError(f"data file not found: {p}", fix=DATA_NOT_FOUND_FIX)
    if not p.is_file():
        raise DataError(f"not a file: {p}", fix=NOT_A_FILE_FIX)
    if _is_parquet(p):
        try:
            import pyarrow.parquet as pq

            names = list(pq.read_schema(p).names)
        except (OSError, ValueError) as exc:  # pyarrow raises ArrowInvalid (a ValueError)
            raise DataError(f"cannot read the Parquet file {p}: {type(exc).__name__}; is it Parquet?") from None
    else:
        try:
            with open(p, "rb") as fh:
                first = fh.readline(MAX_HEADER_BYTES + 1)
        except OSError as exc:
            raise DataError(f"cannot read data file {p}: {exc.strerror}") from None
        if first.startswith(_BOM):
            first = first[len(_BOM):]
        if not first.strip():
            raise DataError(f"data file is empty or its first line is blank: {p}; put the header on the first line")
        if len(first) > MAX_HEADER_BYTES:
            raise DataError(f"the header line of {p} is longer than {MAX_HEADER_BYTES} bytes; is it a CSV?")
        try:
            text = first.decode("utf-8")
        except UnicodeDecodeError:
            raise DataError(f"the header line of {p} is not UTF-8 text; save the file as UTF-8 CSV") from None
        try:
            rows = list(csv.reader(io.StringIO(text, newline="")))
        except csv.Error:
            raise DataError(f"the header line of {p} is not a CSV line; check its quoting") from None
        if len(rows) != 1:
            raise DataError(f"the header line of {p} is not a CSV line; check its quoting")
        names = rows[0]
    header = [normalise_text(str(h)) for h in names]
    if any(not h for h in header):
        raise DataError(f"the header of {p} has an empty column name; name every column")
    if len(set(header)) != len(header):
        dup = next(h for h in header if header.count(h) > 1)
        raise DataError(f"duplicate column name in the header of {p}: {dup!r}; rename one")
    return header
