"""Tabular data as an explicit, serialisable transform into model space.

Pipeline: :func:`read_csv` gives a :class:`RawTable` of raw strings; a :class:`Schema` says what
each column is (from a policy file, from :func:`infer_schema` for non-private baselines, or from
:func:`dpsummary.private.preprocess.estimate_schema` for a zero-configuration private release);
a :class:`Transform` built from the schema maps raw rows to *model space*: scaled numerics and
one-hot categories, with the encoded target, if any, as the last column.

Documented handling choices
---------------------------
* Reading is total (:func:`read_table`): every field and header name is normalised by one
  public rule (Unicode NFKC, then leading/trailing Unicode whitespace removed, non-breaking
  spaces included); an empty field is *missing*; blank lines are skipped; a UTF-8 byte order
  mark is removed; ragged rows are dropped; undecodable bytes become U+FFFD. Only
  :func:`read_header`'s public checks refuse.
* Numeric features: public transform (:meth:`Transform.from_schema`) uses centre
  ``(lower+upper)/2`` and scale ``(upper-lower)/2``, and values outside ``[lower, upper]`` are
  **clipped** to the bounds first, so every numeric feature lies in ``[-1, 1]``. Clipping is a
  per-record operation, so it never couples records (unlike data-fitted standardisation).
* :meth:`Transform.fit` (non-private baselines only, ``data_fitted=True``) uses the data mean and
  standard deviation; a constant (or entirely missing) column gets scale 1, so it maps to 0.
  Schema bounds, when present, still clip.
* A missing numeric value is imputed at the centre (0 after scaling).
* Categorical features are one-hot over the schema's categories (all levels, none dropped: the
  model's Gaussian prior keeps the coefficients identifiable). A missing or unseen category is the
  all-zero vector.
* A value that does not parse as a finite number in a numeric column is a :class:`DataError`
  by default (``invalid_numeric="error"``); with ``invalid_numeric="missing"`` it is treated as
  missing. ``nan``/``inf`` strings count as non-numeric.
* Target: a missing, unseen (categorical), non-{0,1} (numeric binary) or negative / non-integer
  (count) target is a :class:`DataError` by default (``invalid_target="error"``); with
  ``invalid_target="drop"`` such rows are removed (a per-record filter, which keeps the
  add/remove-one sensitivity of everything downstream).
* Numeric and count targets are clipped to the schema bounds when bounds are given. Binary targets
  are 0/1 with the *positive class* recorded: ``ColumnSpec.positive`` if given, else the second of
  the two categories in sorted order (for a numeric binary target, 1).
* Columns of the table not named in the schema are ignored.
* The release path uses :meth:`Transform.encode_total`, which never raises on record content:
  a numeric value that is missing, unparsable or not finite (``nan``/``inf``/``infinity`` in any
  case) is missing and is imputed at the centre (default) or drops its record; a missing or
  unseen category is the all-zero "other" vector (default) or drops its record; a missing or
  invalid target drops its record. It returns per-record :class:`QualityIndicators` (PRIVATE:
  only for an accounted noisy-count mechanism, L2 sensitivity ``sqrt(k)`` for ``k`` rules). The
  ``"error"`` options above remain for non-private baselines only.
* If pyarrow cannot parse a CSV at all (for example a quote never closed makes one field longer
  than its block), the same rules are applied by the stdlib ``csv`` reader instead of refusing.
  This fallback is the only hand-written parsing left, and exists only so that no record can make
  a release refuse.
* The release streams (:class:`BatchStream`, :func:`stream_pass`): pyarrow's ``open_csv`` /
  ``ParquetFile.iter_batches`` yield Arrow record batches, :func:`encode_batch` applies exactly
  the rules of :meth:`Transform.encode_total` to one batch (a pure function of the batch and the
  public transform, so Spark executors run it too), and nothing holds the raw table as Python
  objects. :func:`read_table` (the whole table as a :class:`RawTable`) remains for non-private
  tools and tests.

Error messages never contain a data value, a row number or a row count when the table was read
with ``private=True``: only the column name and the kind of problem.
"""

from __future__ import annotations

import csv
import io
import math
import unicodedata
from collections import defaultdict
from collections.abc import Iterable, Mapping, Sequence
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any, Final, Literal

import numpy as np
import torch
from pydantic import BaseModel, ConfigDict, model_validator

__all__ = [
    "NO_TARGET",
    "QUALITY_RULES",
    "ColumnSpec",
    "DataError",
    "QualityIndicators",
    "RawTable",
    "ReadReport",
    "Schema",
    "TargetKind",
    "Transform",
    "default_model_name",
    "infer_schema",
    "factorize",
    "parse_floats",
    "normalise_text",
    "read_csv",
    "read_header",
    "read_table",
    "target_kind",
]

#: Pass as ``target`` to :func:`infer_schema` / ``estimate_schema`` for "no target" (a Gaussian
#: mean model). ``None`` there means the default: the last column. Column names are never empty.
NO_TARGET: Final = ""

TargetKind = Literal["binary", "count", "real", "none"]
DTYPE = torch.float64
TRANSFORM_FORMAT: Final = "dpsummary.transform/1"


class DataError(ValueError):
    """A problem with the input data or schema, phrased for the user in one line."""


# ---------------------------------------------------------------------------------------------
# Schema
# ---------------------------------------------------------------------------------------------
class ColumnSpec(BaseModel):
    """One column: numeric with (public) bounds, or categorical with its category list."""

    model_config = ConfigDict(extra="forbid", frozen=True)

    name: str
    kind: Literal["numeric", "categorical"]
    lower: float | None = None
    upper: float | None = None
    categories: list[str] | None = None
    integer: bool = False
    #: For a binary categorical target: the class encoded as 1 (default: second in sorted order).
    positive: str | None = None

    @model_validator(mode="after")
    def _check(self) -> ColumnSpec:
        if not self.name or self.name != self.name.strip():
            raise ValueError("column names must be non-empty and carry no surrounding whitespace")
        if self.kind == "numeric":
            if self.categories is not None:
                raise ValueError(f"numeric column {self.name!r} cannot list categories")
            if self.positive is not None:
                raise ValueError(f"numeric column {self.name!r} cannot name a positive class")
            if (self.lower is None) != (self.upper is None):
                raise ValueError(f"column {self.name!r}: give both lower and upper, or neither")
            if self.lower is not None and self.upper is not None:
                if not (math.isfinite(self.lower) and math.isfinite(self.upper)):
                    raise ValueError(f"column {self.name!r}: bounds must be finite")
                if not self.lower < self.upper:
                    raise ValueError(f"column {self.name!r}: lower must be below upper")
        else:
            if self.lower is not None or self.upper is not None:
                raise ValueError(f"categorical column {self.name!r} cannot have bounds")
            if self.integer:
                raise ValueError(f"categorical column {self.name!r} cannot be integer")
            if not self.categories:
                raise ValueError(f"categorical column {self.name!r} needs at least one category")
            if len(set(self.categories)) != len(self.categories):
                raise ValueError(f"categorical column {self.name!r} lists a category twice")
            if any(c == "" or c != c.strip() for c in self.categories):
                raise ValueError(
                    f"categorical column {self.name!r}: categories must be non-empty and "
                    "carry no surrounding whitespace (an empty field means missing)"
                )
            if self.positive is not None and self.positive not in self.categories:
                raise ValueError(f"column {self.name!r}: positive class is not a category")
        return self

    @property
    def centre(self) -> float | None:
        if self.lower is None or self.upper is None:
            return None
        return (self.lower + self.upper) / 2.0

    @property
    def half_range(self) -> float | None:
        if self.lower is None or self.upper is None:
            return None
        return (self.upper - self.lower) / 2.0


class Schema(BaseModel):
    """Columns in order, and the target column (``None``: no target, a Gaussian mean model)."""

    model_config = ConfigDict(extra="forbid", frozen=True)

    columns: list[ColumnSpec]
    target: str | None = None

    @model_validator(mode="after")
    def _check(self) -> Schema:
        if not self.columns:
            raise ValueError("a schema needs at least one column")
        names = [c.name for c in self.columns]
        if len(set(names)) != len(names):
            dup = sorted({n for n in names if names.count(n) > 1})
            raise ValueError(f"duplicate column names in schema: {', '.join(dup)}")
        if self.target is not None:
            if self.target not in names:
                raise ValueError(f"target {self.target!r} is not a column of the schema")
            if len(self.columns) < 2:
                raise ValueError("a schema with a target needs at least one feature column")
        else:
            for c in self.columns:
                if c.positive is not None:
                    raise ValueError(f"column {c.name!r} names a positive class but is no target")
        return self

    @property
    def names(self) -> list[str]:
        return [c.name for c in self.columns]

    def column(self, name: str) -> ColumnSpec:
        for c in self.columns:
            if c.name == name:
                return c
        raise KeyError(name)

    @property
    def feature_columns(self) -> list[ColumnSpec]:
        return [c for c in self.columns if c.name != self.target]

    @property
    def target_column(self) -> ColumnSpec | None:
        return None if self.target is None else self.column(self.target)


def target_kind(schema: Schema) -> TargetKind:
    """binary / count / real / none, from the schema alone (public information).

    Categorical with two categories, or numeric integer with bounds exactly [0, 1]: binary.
    Numeric integer with ``lower >= 0``: count. Other numeric: real. One class: DataError.
    """
    col = schema.target_column
    if col is None:
        return "none"
    if col.kind == "categorical":
        cats = col.categories or []
        if len(cats) == 1:
            raise DataError(f"target {col.name!r} has a single class; nothing to predict")
        if len(cats) > 2:
            raise DataError(
                f"target {col.name!r} has more than two categories; only binary categorical "
                "targets are supported"
            )
        return "binary"
    if col.lower is not None and col.upper is not None:
        if col.integer and col.lower == 0.0 and col.upper == 1.0:
            return "binary"
        if col.integer and col.lower >= 0.0:
            return "count"
        return "real"
    # Unbounded numeric target: only a data-fitted transform can use it.
    return "count" if col.integer else "real"


_DEFAULT_MODELS: Final[dict[str, str]] = {
    "binary": "logistic",
    "count": "poisson",
    "real": "linear",
    "none": "gaussian_mean",
}


def default_model_name(kind: TargetKind) -> str:
    """The model registry name that suits a target kind."""
    try:
        return _DEFAULT_MODELS[kind]
    except KeyError:
        raise ValueError(f"unknown target kind {kind!r}") from None


# ---------------------------------------------------------------------------------------------
# Raw tables
# ---------------------------------------------------------------------------------------------
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
        raise DataError(f"data file not found: {p}")
    if not p.is_file():
        raise DataError(f"not a file: {p}")
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
    * a row whose field count differs from the header's (ragged) is dropped;
    * bytes that are not UTF-8 become U+FFFD (a numeric field holding one is then non-numeric).

    Returns the whole table and a private :class:`ReadReport` (see its caveat). The same
    streaming pass as the release (:func:`stream_pass`, pyarrow's readers with the stdlib
    fallback), collected into Python lists: for non-private tools and tests only (the release
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


# ---------------------------------------------------------------------------------------------
# Parsing helpers (vectorised)
# ---------------------------------------------------------------------------------------------
def parse_floats(arr: np.ndarray) -> tuple[np.ndarray, np.ndarray]:
    """Parse a string array: ``(values, ok)`` with ``values`` NaN where ``ok`` is false.

    ``ok`` is true where the string is non-empty and parses as a *finite* float. One vectorised
    conversion in the common case; per distinct value otherwise.
    """
    n = arr.shape[0]
    missing = arr == ""
    try:
        values = np.where(missing, "nan", arr).astype(np.float64)
    except (ValueError, TypeError):
        uniq, codes = factorize(arr.tolist())
        parsed = np.fromiter((_to_float(u) for u in uniq), dtype=np.float64, count=len(uniq))
        values = parsed[codes] if n else np.zeros(0)
    ok = np.isfinite(values) & ~missing
    values = np.where(ok, values, np.nan)
    return values, ok


def _is_integral(values: np.ndarray) -> np.ndarray:
    return (values == np.round(values)) & (np.abs(values) < 2.0**53)


def factorize(values: Sequence[str]) -> tuple[list[str], np.ndarray]:
    """Distinct values in order of first appearance, and each value's index among them."""
    lookup = {v: i for i, v in enumerate(dict.fromkeys(values))}
    codes = np.fromiter(map(lookup.__getitem__, values), dtype=np.int64, count=len(values))
    return list(lookup), codes


def _to_float(s: str) -> float:
    try:
        return float(s)
    except ValueError:
        return math.nan


def _parses(s: str) -> bool:
    try:
        float(s)
    except ValueError:
        return False
    return True


def _first_index(mask: np.ndarray) -> int:
    return int(np.flatnonzero(mask)[0])


# ---------------------------------------------------------------------------------------------
# Non-private schema inference
# ---------------------------------------------------------------------------------------------
def infer_schema(table: RawTable, target: str | None = None) -> Schema:
    """Infer a schema from the data itself. NOT private: for non-private baselines only.

    A column is numeric if every non-missing value parses as a float (a ``nan``/``inf`` string
    in an otherwise numeric column is a DataError naming the column), else categorical. Numeric
    columns get ``integer`` if every value is integral and bounds = min/max; a constant feature
    column gets ``[v, v + 1]`` so that ``lower < upper``. Categories are sorted.
    ``target=None``: the last column; ``target=NO_TARGET``: no target; else the named column.
    A constant target, a target with a single class, and a column with no values at all are
    DataErrors.
    """
    if not table.header:
        raise DataError("the table has no columns")
    if target is None:
        tgt: str | None = table.header[-1]
    elif target == NO_TARGET:
        tgt = None
    else:
        if target not in table.columns:
            raise DataError(f"target column {target!r} is not in the data")
        tgt = target
    specs: list[ColumnSpec] = []
    for name in table.header:
        present = [v for v in table.columns[name] if v]
        if not present:
            raise DataError(f"column {name!r} has no values")
        uniq = list(dict.fromkeys(present))
        parsed = np.fromiter(map(_to_float, uniq), dtype=np.float64, count=len(uniq))
        failed = [u for u, x in zip(uniq, parsed.tolist(), strict=True) if not math.isfinite(x)]
        if failed and all(_parses(u) for u in failed):
            raise _err(
                table.private, f"column {name!r} contains a NaN or infinite value", repr(failed[0])
            )
        if not failed:
            lo, hi = float(parsed.min()), float(parsed.max())
            integer = bool(np.all(_is_integral(parsed)))
            if lo == hi:
                if name == tgt:
                    raise DataError(f"target {name!r} is constant; nothing to predict")
                hi = lo + 1.0
            specs.append(ColumnSpec(name=name, kind="numeric", lower=lo, upper=hi, integer=integer))
        else:
            cats = sorted(uniq)
            if name == tgt and len(cats) < 2:
                raise DataError(f"target {name!r} has a single class; nothing to predict")
            specs.append(ColumnSpec(name=name, kind="categorical", categories=cats))
    schema = Schema(columns=specs, target=tgt)
    target_kind(schema)  # surface unsupported targets early
    return schema


# ---------------------------------------------------------------------------------------------
# The transform
# ---------------------------------------------------------------------------------------------
@dataclass(frozen=True)
class Transform:
    """Raw rows -> model space; serialisable with :meth:`to_dict` / :meth:`from_dict`.

    ``centres``/``scales`` hold the affine map of every numeric feature and of a real target.
    Build with :meth:`from_schema` (public) or :meth:`fit` (data-fitted, non-private only).
    """

    schema: Schema
    centres: dict[str, float]
    scales: dict[str, float]
    positive_class: str | None = None
    data_fitted: bool = False
    invalid_numeric: Literal["error", "missing"] = "error"
    invalid_target: Literal["error", "drop"] = "error"

    # ---- construction ---------------------------------------------------------------------
    @classmethod
    def from_schema(
        cls,
        schema: Schema,
        *,
        invalid_numeric: Literal["error", "missing"] = "error",
        invalid_target: Literal["error", "drop"] = "error",
    ) -> Transform:
        """Public transform: everything comes from the schema, nothing from the data."""
        kind = target_kind(schema)
        centres: dict[str, float] = {}
        scales: dict[str, float] = {}
        for col in schema.columns:
            is_target = col.name == schema.target
            if col.kind != "numeric" or (is_target and kind != "real"):
                continue
            if col.centre is None or col.half_range is None:
                raise DataError(
                    f"numeric column {col.name!r} has no public bounds; give lower and upper in "
                    "the schema (or use Transform.fit for a non-private baseline)"
                )
            centres[col.name] = col.centre
            scales[col.name] = col.half_range
        return cls(
            schema=schema,
            centres=centres,
            scales=scales,
            positive_class=_positive_class(schema, kind),
            data_fitted=False,
            invalid_numeric=invalid_numeric,
            invalid_target=invalid_target,
        )

    @classmethod
    def fit(
        cls,
        table: RawTable,
        schema: Schema,
        *,
        invalid_numeric: Literal["error", "missing"] = "error",
        invalid_target: Literal["error", "drop"] = "error",
    ) -> Transform:
        """Data-fitted standardisation (mean / population sd). NOT private: baselines only.

        Values are clipped to schema bounds (if any) before the mean and sd are taken. A column
        with zero spread, or with no values, gets scale 1 (and centre = its value, the schema
        centre, or 0), so it maps to a constant instead of dividing by zero.
        """
        kind = target_kind(schema)
        centres: dict[str, float] = {}
        scales: dict[str, float] = {}
        for col in schema.columns:
            is_target = col.name == schema.target
            if col.kind != "numeric" or (is_target and kind != "real"):
                continue
            values, ok = parse_floats(table.array(col.name))
            if not np.all(ok | (table.array(col.name) == "")) and invalid_numeric == "error":
                raise _err(table.private, f"column {col.name!r} has a non-numeric value")
            vals = values[ok]
            if col.lower is not None and col.upper is not None:
                vals = np.clip(vals, col.lower, col.upper)
            if vals.size:
                centre = float(vals.mean())
                sd = float(vals.std())
            else:
                centre = col.centre if col.centre is not None else 0.0
                sd = 0.0
            centres[col.name] = centre
            scales[col.name] = sd if sd > 0 and math.isfinite(sd) else 1.0
        return cls(
            schema=schema,
            centres=centres,
            scales=scales,
            positive_class=_positive_class(schema, kind),
            data_fitted=True,
            invalid_numeric=invalid_numeric,
            invalid_target=invalid_target,
        )

    # ---- serialisation --------------------------------------------------------------------
    def to_dict(self) -> dict[str, Any]:
        """A JSON-able dict (only str, float, bool, None, lists and dicts)."""
        return {
            "format": TRANSFORM_FORMAT,
            "schema": self.schema.model_dump(mode="json"),
            "centres": {k: float(v) for k, v in self.centres.items()},
            "scales": {k: float(v) for k, v in self.scales.items()},
            "positive_class": self.positive_class,
            "data_fitted": self.data_fitted,
            "invalid_numeric": self.invalid_numeric,
            "invalid_target": self.invalid_target,
        }

    @classmethod
    def from_dict(cls, d: Mapping[str, Any]) -> Transform:
        if d.get("format") != TRANSFORM_FORMAT:
            raise DataError(f"not a transform description (expected format {TRANSFORM_FORMAT})")
        schema = Schema.model_validate(d["schema"])
        out = cls(
            schema=schema,
            centres={str(k): float(v) for k, v in d["centres"].items()},
            scales={str(k): float(v) for k, v in d["scales"].items()},
            positive_class=d.get("positive_class"),
            data_fitted=bool(d.get("data_fitted", False)),
            invalid_numeric=d.get("invalid_numeric", "error"),
            invalid_target=d.get("invalid_target", "error"),
        )
        out._validate()
        return out

    def _validate(self) -> None:
        kind = self.target_kind
        for col in self.schema.columns:
            needs = col.kind == "numeric" and (col.name != self.schema.target or kind == "real")
            if needs and col.name not in self.centres:
                raise DataError(f"transform has no centre for numeric column {col.name!r}")
            if needs and not self.scales.get(col.name, 0.0) > 0:
                raise DataError(f"transform scale of column {col.name!r} must be positive")
        if self.positive_class != _positive_class(self.schema, kind):
            raise DataError("transform's positive class does not match its schema")
        if self.invalid_numeric not in ("error", "missing"):
            raise DataError("invalid_numeric must be 'error' or 'missing'")
        if self.invalid_target not in ("error", "drop"):
            raise DataError("invalid_target must be 'error' or 'drop'")

    # ---- description ----------------------------------------------------------------------
    @property
    def target(self) -> str | None:
        return self.schema.target

    @property
    def target_kind(self) -> TargetKind:
        return target_kind(self.schema)

    @property
    def feature_names(self) -> list[str]:
        names: list[str] = []
        for col in self.schema.feature_columns:
            if col.kind == "numeric":
                names.append(col.name)
            else:
                names.extend(f"{col.name}={c}" for c in col.categories or [])
        return names

    @property
    def num_features(self) -> int:
        return sum(
            1 if c.kind == "numeric" else len(c.categories or [])
            for c in self.schema.feature_columns
        )

    @property
    def point_dim(self) -> int:
        return self.num_features + (0 if self.target is None else 1)

    # ---- application ----------------------------------------------------------------------
    def apply(self, table: RawTable) -> tuple[torch.Tensor, torch.Tensor | None]:
        """``(features (n, F) float64, target (n,) float64 or None)``.

        The target is None when the schema has none or the table lacks the target column.
        With ``invalid_target="drop"``, rows with an invalid target are removed from both.
        """
        has_target = self.target is not None and self.target in table.columns
        out = self._encode(table, with_target=has_target)
        if not has_target:
            return torch.from_numpy(out), None
        f = self.num_features
        return (
            torch.from_numpy(np.ascontiguousarray(out[:, :f])),
            torch.from_numpy(np.ascontiguousarray(out[:, f])),
        )

    def to_points(self, table: RawTable) -> torch.Tensor:
        """Model-space points: features with the encoded target appended as the last column."""
        if self.target is not None and self.target not in table.columns:
            raise DataError(f"target column {self.target!r} is not in the data")
        return torch.from_numpy(self._encode(table, with_target=self.target is not None))

    def _encode(self, table: RawTable, *, with_target: bool) -> np.ndarray:
        n = table.num_rows
        f = self.num_features
        out = np.zeros((n, f + (1 if with_target else 0)), dtype=np.float64)
        offset = 0
        for col in self.schema.feature_columns:
            if col.name not in table.columns:
                raise DataError(f"column {col.name!r} of the schema is not in the data")
            arr = table.array(col.name)
            if col.kind == "numeric":
                out[:, offset] = self._numeric(col, arr, table.private)
                offset += 1
            else:
                cats = col.categories or []
                idx = _category_index(arr, cats)
                rows = np.flatnonzero(idx >= 0)
                out[rows, offset + idx[rows]] = 1.0
                offset += len(cats)
        if with_target:
            assert self.target is not None
            y, valid = self._target(table.array(self.target), table.private)
            out[:, f] = y
            if not np.all(valid):
                out = out[valid]
        return out

    def encode_total(
        self,
        table: RawTable,
        *,
        missing_numeric: Literal["impute", "drop"] = "impute",
        unseen_category: Literal["other", "drop"] = "other",
    ) -> tuple[torch.Tensor, QualityIndicators]:
        """Model-space points of every record by public, total per-record rules (never raises on
        record content; the release's path):

        * a numeric feature that is missing, unparsable or not finite (``nan``, ``inf``, any case)
          is missing: imputed at the column centre (``"impute"``) or its record dropped;
        * a missing or unseen category (compared after :func:`normalise_text`) is the all-zero
          "other" vector (``"other"``) or its record dropped;
        * a missing or invalid target drops the record (binary: not one of the two classes;
          count: not a non-negative integer; real: not finite).

        Returns the kept points and, for every record READ (before drops), one boolean per rule
        (:class:`QualityIndicators`): private, for an accounted noisy-count mechanism only."""
        n = table.num_rows

        def numbers(name: str) -> tuple[np.ndarray, np.ndarray]:
            return parse_floats(_normalised_column(table, name, n))

        def categories(name: str, cats: list[str]) -> np.ndarray:
            return _category_index(_normalised_column(table, name, n), cats)

        def target(name: str) -> tuple[np.ndarray, np.ndarray]:
            arr = _normalised_column(table, name, n)
            return _replace(self, invalid_target="drop")._target(_normalised_target(self, arr), table.private)

        kept, indicators = _encode_records(self, n, numbers, categories, target, missing_numeric=missing_numeric,
                                           unseen_category=unseen_category)
        return torch.from_numpy(kept), QualityIndicators(QUALITY_RULES, indicators)

    def transform_rows(
        self, rows: Iterable[Mapping[str, str]]
    ) -> tuple[torch.Tensor, torch.Tensor | None]:
        """Map new raw rows (dicts of strings, absent keys = missing) like :meth:`apply`.

        The target is encoded only if some row carries the target key; else it is None.
        """
        rows = list(rows)
        header = [c.name for c in self.schema.feature_columns]
        if self.target is not None and any(self.target in r for r in rows):
            header.append(self.target)
        return self.apply(RawTable.from_rows(rows, header))

    def inverse_target(self, values: torch.Tensor) -> torch.Tensor:
        """Model-space target back to the original units (real: un-scale; binary/count: same)."""
        kind = self.target_kind
        if kind == "none":
            raise DataError("this transform has no target")
        if kind == "real":
            assert self.target is not None
            return values * self.scales[self.target] + self.centres[self.target]
        return values

    def sample_public_features(self, n: int, generator: torch.Generator) -> torch.Tensor:
        """``(n, F)`` synthetic features from a public distribution implied by the schema alone.

        Numeric: uniform over the scaled bounds (``[-1, 1]`` for :meth:`from_schema`), or
        standard normal for an unbounded column of a fitted transform. Categorical: one-hot of a
        uniformly chosen category. Costs no privacy.
        """
        out = torch.zeros(n, self.num_features, dtype=DTYPE)
        offset = 0
        for col in self.schema.feature_columns:
            if col.kind == "numeric":
                c, s = self.centres[col.name], self.scales[col.name]
                if col.lower is not None and col.upper is not None:
                    lo, hi = (col.lower - c) / s, (col.upper - c) / s
                    u = torch.rand(n, generator=generator, dtype=DTYPE)
                    out[:, offset] = lo + (hi - lo) * u
                else:
                    out[:, offset] = torch.randn(n, generator=generator, dtype=DTYPE)
                offset += 1
            else:
                k = len(col.categories or [])
                pick = torch.randint(0, k, (n,), generator=generator)
                out[torch.arange(n), offset + pick] = 1.0
                offset += k
        return out

    # ---- internals ------------------------------------------------------------------------
    def _numeric(self, col: ColumnSpec, arr: np.ndarray, private: bool) -> np.ndarray:
        values, ok = parse_floats(arr)
        bad = ~ok & (arr != "")
        if self.invalid_numeric == "error" and bad.any():
            i = _first_index(bad)
            raise _err(
                private,
                f"column {col.name!r} has a value that is not a finite number",
                f"data row {i + 1}: {arr[i]!r}",
            )
        c, s = self.centres[col.name], self.scales[col.name]
        if col.lower is not None and col.upper is not None:
            values = np.clip(values, col.lower, col.upper)
        values = np.where(ok, values, c)
        return (values - c) / s

    def _target(self, arr: np.ndarray, private: bool) -> tuple[np.ndarray, np.ndarray]:
        """Encoded target and a validity mask (all true unless ``invalid_target='drop'``)."""
        col = self.schema.target_column
        assert col is not None
        kind = self.target_kind
        missing = arr == ""
        if col.kind == "categorical":
            idx = _category_index(arr, col.categories or [])
            valid = idx >= 0
            y = (arr == self.positive_class).astype(np.float64)
            problem = "an unseen category"
        else:
            values, ok = parse_floats(arr)
            if col.lower is not None and col.upper is not None and kind != "binary":
                clipped = np.clip(values, col.lower, col.upper)
            else:
                clipped = values
            if kind == "binary":
                valid = ok & ((values == 0.0) | (values == 1.0))
                y = np.where(valid, values, 0.0)
                problem = "a value other than 0 and 1"
            elif kind == "count":
                valid = ok & _is_integral(np.where(ok, values, 0.0)) & (np.nan_to_num(values) >= 0)
                y = np.where(valid, clipped, 0.0)
                problem = "a value that is not a non-negative integer"
            else:
                valid = ok
                c, s = self.centres[col.name], self.scales[col.name]
                y = np.where(valid, (clipped - c) / s, 0.0)
                problem = "a value that is not a finite number"
        if self.invalid_target == "error" and not np.all(valid):
            i = _first_index(~valid)
            if missing[i]:
                raise _err(private, f"target {col.name!r} has a missing value", f"data row {i + 1}")
            raise _err(
                private, f"target {col.name!r} has {problem}", f"data row {i + 1}: {arr[i]!r}"
            )
        return y.astype(np.float64), valid


#: Per-record rules of :meth:`Transform.encode_total`, in the column order of its indicators.
QUALITY_RULES: Final = ("imputed_numeric", "other_category", "dropped_target", "dropped_numeric", "dropped_category")


@dataclass(frozen=True)
class QualityIndicators:
    """PRIVATE per-record flags (rows = records read, columns = :data:`QUALITY_RULES`)."""

    names: tuple[str, ...]
    indicators: np.ndarray


def _normalised_column(table: RawTable, name: str, n: int) -> np.ndarray:
    """A column with :func:`normalise_text` applied per distinct value (idempotent, so cheap
    insurance for tables not built by the reader); an absent column is all missing."""
    if name not in table.columns:
        return np.full(n, "", dtype=object)
    uniq, codes = factorize(table.columns[name])
    norm = np.empty(len(uniq), dtype=object)
    norm[:] = [normalise_text(u) for u in uniq]
    return norm[codes] if n else np.empty(0, dtype=object)


def _replace(tf: Transform, **changes: Any) -> Transform:
    import dataclasses

    return dataclasses.replace(tf, **changes)


def _normalised_target(tf: Transform, arr: np.ndarray) -> np.ndarray:
    """Map a categorical target's values that equal a category after normalisation onto it."""
    col = tf.schema.target_column
    if col is None or col.kind != "categorical":
        return arr
    lookup = {normalise_text(c): c for c in col.categories or []}
    out = np.empty(arr.shape[0], dtype=object)
    out[:] = [lookup.get(v, v) for v in arr.tolist()]
    return out


def _positive_class(schema: Schema, kind: TargetKind) -> str | None:
    col = schema.target_column
    if kind != "binary" or col is None:
        return None
    if col.kind == "numeric":
        return "1"
    if col.positive is not None:
        return col.positive
    return sorted(col.categories or [])[1]


def _category_index(arr: np.ndarray, categories: Sequence[str]) -> np.ndarray:
    """Index of each value in ``categories``; -1 for missing or unseen values."""
    n = arr.shape[0]
    if n == 0:
        return np.zeros(0, dtype=np.int64)
    lookup: defaultdict[str, int] = defaultdict(
        _minus_one, {c: i for i, c in enumerate(categories)}
    )
    lookup.pop("", None)
    values = arr.tolist()
    return np.fromiter(map(lookup.__getitem__, values), dtype=np.int64, count=len(values))


def _minus_one() -> int:
    return -1


# ---------------------------------------------------------------------------------------------
# Streaming: one pass over Arrow record batches (the release path, every engine)
# ---------------------------------------------------------------------------------------------
#: Bytes per block of the streaming CSV reader (a public constant; bounds the reader's memory).
STREAM_BLOCK_BYTES = 4 << 20
#: Rows per batch of the stdlib fallback reader and of Parquet batches.
STREAM_BATCH_ROWS = 1 << 16


def text_column(col: Any) -> tuple[Any, np.ndarray]:
    """One Arrow column of a batch as normalised text, and which rows held undecodable bytes.

    The reader's public rules, vectorised: binary columns are decoded as UTF-8 (undecodable
    bytes become U+FFFD and flag their row), typed columns (Parquet) are cast to their Arrow text
    form, nulls are missing (""), then Unicode NFKC (skipped for all-ASCII batches, where it is
    the identity) and leading/trailing Unicode whitespace removed. Returns ``(pa.StringArray,
    bool ndarray)``; PRIVATE (the flags go only into the quality-count mechanism)."""
    import pyarrow as pa
    import pyarrow.compute as pc

    if isinstance(col, pa.ChunkedArray):
        col = col.combine_chunks()
    n = len(col)
    bad = np.zeros(n, dtype=bool)
    if pa.types.is_dictionary(col.type):
        col = col.dictionary_decode()
    if pa.types.is_binary(col.type) or pa.types.is_large_binary(col.type):
        try:
            text = pc.cast(col, pa.string())
        except (pa.ArrowInvalid, pa.ArrowTypeError):
            values = []
            for i, b in enumerate(col.to_pylist()):
                b = b or b""
                try:
                    values.append(b.decode("utf-8"))
                except UnicodeDecodeError:
                    bad[i] = True
                    values.append(b.decode("utf-8", errors="replace"))
            text = pa.array(values, type=pa.string())
    elif pa.types.is_string(col.type) or pa.types.is_large_string(col.type):
        text = col
    else:
        text = pc.cast(col, pa.string())
    text = pc.fill_null(text, "")
    if not pc.all(pc.string_is_ascii(text)).as_py() if n else False:
        text = pc.utf8_normalize(text, "NFKC")
    return pc.utf8_trim_whitespace(text), bad


def text_numbers(text: Any) -> tuple[np.ndarray, np.ndarray, np.ndarray]:
    """``(values, ok, missing)`` of a normalised text column (see :func:`text_column`), the
    rule of :func:`parse_floats` after :func:`normalise_text`: ``ok`` where the value is a
    finite number, ``values`` NaN elsewhere, ``missing`` where the field is empty. Arrow's
    vectorised cast decides a batch whenever it parses every field (on those strings it agrees
    with Python's ``float``); otherwise the batch falls back to the per-distinct-value rule."""
    import pyarrow as pa
    import pyarrow.compute as pc

    empty = pc.equal(text, "")
    missing = empty.to_numpy(zero_copy_only=False)
    nullable = pc.if_else(empty, pa.scalar(None, pa.string()), text)
    try:
        # A cheap probe first: a text column fails on its first values, without a full cast.
        pc.cast(nullable.slice(0, 64), pa.float64())
        parsed = pc.cast(nullable, pa.float64())
        values = parsed.to_numpy(zero_copy_only=False).astype(np.float64, copy=True)
    except (pa.ArrowInvalid, pa.ArrowNotImplementedError):
        uniq, codes = dictionary_codes(text)
        arr = np.empty(len(uniq), dtype=object)
        arr[:] = [normalise_text(u) for u in uniq]
        uvals, _ = parse_floats(arr)
        values = uvals[codes] if len(uniq) else np.zeros(len(text))
    ok = np.isfinite(values) & ~missing
    return np.where(ok, values, np.nan), ok, missing


def dictionary_codes(text: Any) -> tuple[list[str], np.ndarray]:
    """Distinct values of a text column and each row's index among them (Arrow's hashing)."""
    import pyarrow.compute as pc

    enc = pc.dictionary_encode(text)
    if hasattr(enc, "combine_chunks"):
        enc = enc.combine_chunks()
    return enc.dictionary.to_pylist(), enc.indices.to_numpy(zero_copy_only=False).astype(np.int64)


@dataclass(frozen=True)
class EncodedBatch:
    """One batch in model space. ``rows``: the KEPT records (k, point_dim) float64.
    ``indicators`` (one row per record of the batch, columns :data:`QUALITY_RULES`) and
    ``undecodable`` (per record of the batch) are PRIVATE: they go only into the accounted
    quality-count mechanism, summed, never logged or returned by a release."""

    rows: np.ndarray
    indicators: np.ndarray
    undecodable: np.ndarray


def batch_columns(batch: Any) -> dict[str, Any]:
    """The columns of an Arrow record batch by normalised name (:func:`normalise_text`)."""
    return {normalise_text(str(name)): batch.column(i) for i, name in enumerate(batch.schema.names)}


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


def _encode_records(
    transform: Transform,
    n: int,
    numbers: Any,
    categories: Any,
    target: Any,
    *,
    missing_numeric: str,
    unseen_category: str,
) -> tuple[np.ndarray, np.ndarray]:
    """THE total per-record rules of :meth:`Transform.encode_total` and :func:`encode_batch`
    (one copy; the two differ only in how they read a column): ``numbers(name) -> (values,
    ok)``, ``categories(name, cats) -> index`` (-1 missing or unseen), ``target(name) -> (y,
    valid)``, each per record. Returns the kept model-space rows (C-contiguous float64) and the
    (n, 5) quality indicators in :data:`QUALITY_RULES` order (PRIVATE)."""
    f = transform.num_features
    with_target = transform.target is not None
    out = np.zeros((n, f + (1 if with_target else 0)), dtype=np.float64)
    imputed = np.zeros(n, dtype=bool)
    other = np.zeros(n, dtype=bool)
    drop_num = np.zeros(n, dtype=bool)
    drop_cat = np.zeros(n, dtype=bool)
    drop_target = np.zeros(n, dtype=bool)
    offset = 0
    for col in transform.schema.feature_columns:
        if col.kind == "numeric":
            values, ok = numbers(col.name)
            c, sc = transform.centres[col.name], transform.scales[col.name]
            if col.lower is not None and col.upper is not None:
                values = np.clip(values, col.lower, col.upper)
            out[:, offset] = (np.where(ok, values, c) - c) / sc
            if missing_numeric == "impute":
                imputed |= ~ok
            else:
                drop_num |= ~ok
            offset += 1
        else:
            cats = [normalise_text(x) for x in (col.categories or [])]
            idx = categories(col.name, cats)
            rows = np.flatnonzero(idx >= 0)
            out[rows, offset + idx[rows]] = 1.0
            if unseen_category == "other":
                other |= idx < 0
            else:
                drop_cat |= idx < 0
            offset += len(cats)
    if with_target:
        assert transform.target is not None
        y, valid = target(transform.target)
        out[:, f] = y
        drop_target = ~valid
    keep = ~(drop_num | drop_cat | drop_target)
    indicators = np.stack([imputed, other, drop_target, drop_num, drop_cat], axis=1)
    return np.ascontiguousarray(out[keep]), indicators


class BatchStream:
    """One streaming pass over a private CSV or Parquet file, as Arrow record batches whose
    columns are named by the normalised header (:func:`read_header`).

    CSV: ``pyarrow.csv.open_csv`` (every column read as bytes, blocks of
    :data:`STREAM_BLOCK_BYTES`); a row whose field count differs from the header's is dropped
    and counted in :attr:`ragged_rows` (PRIVATE: only for the quality-count mechanism); blank
    lines are skipped. Parquet: ``ParquetFile.iter_batches``. Memory is O(block), never the
    table. If pyarrow cannot parse the CSV (for example a quote never closed makes a field
    longer than a block) iteration raises :class:`StreamRestart`; the caller discards what it
    accumulated and makes a new pass with ``fallback=True``: the stdlib ``csv`` reader under the
    same public rules (the only use of the hand-written path; slow, but total, so no record can
    make a release refuse)."""

    def __init__(self, path: str | Path, *, fallback: bool = False, header: list[str] | None = None) -> None:
        self.path = Path(path)
        self.header = header if header is not None else read_header(self.path)
        self.fallback = fallback
        self.ragged_rows = 0

    def __iter__(self) -> Any:
        if _is_parquet(self.path):
            return self._parquet()
        if self.fallback:
            return self._stdlib()
        return self._arrow()

    def _parquet(self) -> Any:
        import pyarrow as pa
        import pyarrow.parquet as pq

        try:
            pf = pq.ParquetFile(self.path)
        except (OSError, ValueError):
            raise DataError(f"cannot read the Parquet file {self.path}; is it Parquet?") from None
        for batch in pf.iter_batches(batch_size=STREAM_BATCH_ROWS):
            yield pa.RecordBatch.from_arrays(batch.columns, names=self.header)

    def _arrow(self) -> Any:
        import pyarrow as pa
        import pyarrow.csv as pcsv

        def skip(_row: Any) -> str:
            self.ragged_rows += 1
            return "skip"

        names = list(self.header)
        try:
            reader = pcsv.open_csv(
                self.path,
                read_options=pcsv.ReadOptions(column_names=names, skip_rows=1, block_size=STREAM_BLOCK_BYTES,
                                              use_threads=True),
                parse_options=pcsv.ParseOptions(newlines_in_values=True, invalid_row_handler=skip),
                convert_options=pcsv.ConvertOptions(column_types={c: pa.binary() for c in names}, null_values=[],
                                                    strings_can_be_null=False, quoted_strings_can_be_null=False),
            )
        except pa.ArrowInvalid:
            raise StreamRestart() from None
        except OSError as exc:
            raise DataError(f"cannot read data file {self.path}: {type(exc).__name__}") from None
        while True:
            try:
                batch = reader.read_next_batch()
            except StopIteration:
                return
            except pa.ArrowInvalid:
                raise StreamRestart() from None
            if batch.num_rows:
                yield batch

    def _stdlib(self) -> Any:
        import sys

        import pyarrow as pa

        width = len(self.header)
        old_limit = csv.field_size_limit()
        csv.field_size_limit(sys.maxsize)  # a field is never refused for its length
        try:
            with open(self.path, encoding="utf-8", errors="surrogateescape", newline="") as fh:
                fh.readline()  # the header line, already checked by read_header
                cols: list[list[bytes]] = [[] for _ in range(width)]
                for row in csv.reader(fh, strict=False):
                    if not row:
                        continue  # an empty line, as pyarrow's ignore_empty_lines
                    if len(row) != width:
                        self.ragged_rows += 1
                        continue
                    for j, v in enumerate(row):
                        cols[j].append(v.encode("utf-8", errors="surrogateescape"))
                    if len(cols[0]) >= STREAM_BATCH_ROWS:
                        yield pa.RecordBatch.from_arrays([pa.array(c, pa.binary()) for c in cols], names=self.header)
                        cols = [[] for _ in range(width)]
                if cols[0]:
                    yield pa.RecordBatch.from_arrays([pa.array(c, pa.binary()) for c in cols], names=self.header)
        finally:
            csv.field_size_limit(old_limit)


class StreamRestart(Exception):  # noqa: N818 - a control-flow signal, not an error
    """pyarrow cannot parse this CSV: restart the pass with ``BatchStream(..., fallback=True)``."""


def stream_pass(path: str | Path, consumer_factory: Any, *, header: list[str] | None = None) -> tuple[Any, int]:
    """Run one full pass: ``consumer = consumer_factory()``; ``consumer.add(batch)`` for every
    batch; on :class:`StreamRestart` the consumer's ``discard()`` is called and the pass restarts
    with a fresh consumer over the fallback reader. Returns ``(consumer, ragged_rows)``
    (``ragged_rows`` PRIVATE)."""
    consumer = consumer_factory()
    stream = BatchStream(path, header=header)
    try:
        for batch in stream:
            consumer.add(batch)
        return consumer, stream.ragged_rows
    except StreamRestart:
        consumer.discard()
    except BaseException:
        consumer.discard()
        raise
    consumer = consumer_factory()
    stream = BatchStream(path, fallback=True, header=stream.header)
    try:
        for batch in stream:
            consumer.add(batch)
    except BaseException:
        consumer.discard()
        raise
    return consumer, stream.ragged_rows
