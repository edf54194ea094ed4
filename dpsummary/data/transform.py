"""The transform: raw rows to model space (section "The transform" of :mod:`dpsummary.data`),
and THE total per-record rules of the release (:func:`_encode_records`, shared by
:meth:`Transform.encode_total` and :func:`dpsummary.data.encode.encode_batch`)."""

from __future__ import annotations

import math
from collections import defaultdict
from collections.abc import Iterable, Mapping, Sequence
from dataclasses import dataclass
from typing import Any, Final, Literal

import numpy as np
import torch

from ..header import DataError, normalise_text
from .parsing import _first_index, _is_integral, factorize, parse_floats
from .reading import RawTable, _err
from .schema import ColumnSpec, Schema, TargetKind, target_kind

DTYPE = torch.float64
TRANSFORM_FORMAT: Final = "dpsummary.transform/1"


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
                    f"numeric column {col.name!r} has no public bounds",
                    fix="give lower and upper in the schema (or use Transform.fit for a non-private baseline)")
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
        if col.kind == "categorical" and col.other_class:
            # One-vs-rest (ColumnSpec.other_class): every non-missing value outside the one
            # listed class is the second class (1, or 0 when ``positive`` names the listed
            # class); only a missing field is invalid.
            idx = _category_index(arr, col.categories or [])
            valid = ~missing
            listed_is_one = col.positive is not None
            listed = idx >= 0
            if listed_is_one:
                # A numeric class (--positive-class 1) matches by value: "1", "1.0" and "1e0" are
                # the same class code (a public rule; text equality otherwise).
                code, is_number = parse_floats(np.array([col.positive], dtype=object))
                if bool(is_number[0]):
                    values, ok = parse_floats(arr)
                    listed = listed | (ok & (values == code[0]))
            y = ((listed if listed_is_one else ~listed) & valid).astype(np.float64)
            problem = "a missing value"
        elif col.kind == "categorical":
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
    if col.other_class:
        # A label, never compared with values (Transform._target encodes one-vs-rest itself).
        return f"any value other than {(col.categories or [''])[0]!r}"
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
