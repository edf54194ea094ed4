"""Tabular data as an explicit, serialisable transform into model space.

Pipeline: :func:`read_csv` gives a :class:`RawTable` of raw strings; a :class:`Schema` says what
each column is (from a policy file, from :func:`infer_schema` for non-private baselines, or from
:func:`dpsummary.private.preprocess.estimate_schema` for a zero-configuration private release);
a :class:`Transform` built from the schema maps raw rows to *model space*: scaled numerics and
one-hot categories, with the encoded target, if any, as the last column.

Documented handling choices
---------------------------
* Whitespace around every field and header name is stripped; an empty field is *missing*.
  Blank lines are skipped. A UTF-8 byte order mark is removed.
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

Error messages never contain a data value, a row number or a row count when the table was read
with ``private=True``: only the column name and the kind of problem.
"""

from __future__ import annotations

import csv
import io
import math
import operator
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
    "ColumnSpec",
    "DataError",
    "RawTable",
    "Schema",
    "TargetKind",
    "Transform",
    "default_model_name",
    "infer_schema",
    "factorize",
    "parse_floats",
    "read_csv",
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
        cols = {h: [str(r.get(h, "") or "").strip() for r in rows] for h in header}
        return cls(header=list(header), columns=cols, private=private)


def _err(private: bool, message: str, detail: str = "") -> DataError:
    """A DataError whose ``detail`` (row numbers, values) is kept only for non-private data."""
    if detail and not private:
        return DataError(f"{message} ({detail})")
    return DataError(message)


_RAGGED = "a data row does not have the same number of fields as the header"


def _edge_whitespace(text: str) -> bool:
    """Whether any field may start or end with whitespace (substring scans, no regex)."""
    if text[:1].isspace() or text[-1:] in (" ", "\t"):
        return True
    return any(p in text for p in (" ,", ", ", "\t,", ",\t", " \n", "\n ", "\t\n", "\n\t"))


def _parse_plain(text: str, private: bool) -> tuple[list[str], list[list[str]]]:
    """Header and columns of an unquoted CSV: one record per line, every comma a separator.

    Exactly what the csv module returns for such text, several times faster: one flat list of
    fields (strings are not tracked by the garbage collector, lists of rows are).
    """
    if "\r" in text:
        text = text.replace("\r\n", "\n").replace("\r", "\n")
    lines = [line for line in text.split("\n") if line]
    if not lines:
        return [], []
    header = lines[0].split(",")
    width = len(header)
    data = lines[1:]
    counts = np.fromiter(map(operator.methodcaller("count", ","), data), np.int64, len(data))
    if np.any(counts != width - 1):
        bad = _first_index(counts != width - 1)
        raise _err(
            private, _RAGGED, f"data row {bad + 1}: {counts[bad] + 1} fields, header has {width}"
        )
    flat = ",".join(data).split(",") if data else []
    return header, [flat[j::width] for j in range(width)]


def _parse_quoted(text: str, path: Path, private: bool) -> tuple[list[str], list[list[str]]]:
    try:
        rows = [r for r in csv.reader(io.StringIO(text, newline="")) if r]
    except csv.Error as exc:
        raise _err(private, f"malformed CSV in {path}", str(exc)) from None
    if not rows:
        return [], []
    header, data = rows[0], rows[1:]
    width = len(header)
    for i, r in enumerate(data):
        if len(r) != width:
            raise _err(private, _RAGGED, f"data row {i + 1}: {len(r)} fields, header has {width}")
    if not data:
        return header, [[] for _ in header]
    return header, [list(c) for c in zip(*data, strict=True)]


def read_csv(path: str | Path, *, private: bool = False) -> RawTable:
    """Read a CSV with a header row into raw string columns (UTF-8, byte order mark removed).

    Quoted files go through the stdlib ``csv`` module; files without any quote character take
    an equivalent fast path. Whitespace around fields is stripped; blank lines are skipped.
    Raises DataError for a missing or unreadable file, an empty file, a header without data
    rows, empty or duplicate header names, and rows whose field count differs from the header's.
    With ``private=True`` messages name at most a column and never a row number or value.
    """
    p = Path(path)
    if not p.is_file():
        raise DataError(f"data file not found: {p}")
    try:
        text = p.read_text(encoding="utf-8-sig")
    except UnicodeDecodeError:
        raise DataError(f"data file is not valid UTF-8 text: {p}") from None
    except OSError as exc:
        raise DataError(f"cannot read data file {p}: {exc.strerror}") from None
    if '"' in text:
        raw_header, cols = _parse_quoted(text, p, private)
    else:
        raw_header, cols = _parse_plain(text, private)
    if not raw_header:
        raise DataError(f"data file is empty: {p}")
    header = [h.strip() for h in raw_header]
    for i, h in enumerate(header):
        if not h:
            raise _err(private, "the header has an empty column name", f"column {i + 1}")
    seen: set[str] = set()
    for h in header:
        if h in seen:
            raise DataError(f"duplicate column name in the header: {h!r}")
        seen.add(h)
    if not cols[0]:
        raise DataError(f"data file has a header but no data rows: {p}")
    if _edge_whitespace(text):
        cols = [list(map(str.strip, c)) for c in cols]
    columns = dict(zip(header, cols, strict=True))
    return RawTable(header=header, columns=columns, private=private)


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
