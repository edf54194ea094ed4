"""Schemas: what each column is (section "Schema" of :mod:`dpsummary.data`).

Deliberately light (pydantic and the standard library only; no numpy, no torch), so that
validating a policy's ``[schema]`` (:mod:`dpsummary.policy`) imports nothing heavy."""

from __future__ import annotations

import math
from typing import Final, Literal

from pydantic import BaseModel, ConfigDict, model_validator

from ..header import DataError

#: Pass as ``target`` to :func:`infer_schema` / ``estimate_schema`` for "no target" (a Gaussian
#: mean model). ``None`` there means the default: the last column. Column names are never empty.
NO_TARGET: Final = ""

TargetKind = Literal["binary", "count", "real", "none"]


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
    #: For a categorical target with ONE listed category: every other non-missing value is the
    #: second class (one-vs-rest), encoded as 1 unless ``positive`` names the listed category
    #: (then the listed category is 1 and every other value 0). A zero-configuration release sets
    #: it when only the most frequent class passes the noisy threshold
    #: (:mod:`dpsummary.postprocess.schema`), or, with ``positive``, from ``--positive-class``.
    other_class: bool = False

    @model_validator(mode="after")
    def _check(self) -> ColumnSpec:
        if not self.name or self.name != self.name.strip():
            raise ValueError("column names must be non-empty and carry no surrounding whitespace")
        if self.kind == "numeric":
            if self.categories is not None:
                raise ValueError(f"numeric column {self.name!r} cannot list categories")
            if self.positive is not None:
                raise ValueError(f"numeric column {self.name!r} cannot name a positive class")
            if self.other_class:
                raise ValueError(f"numeric column {self.name!r} cannot have an other_class")
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
            if self.other_class and len(self.categories) != 1:
                raise ValueError(f"column {self.name!r}: other_class needs exactly one category (every other "
                                 "value is the second class)")
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
        for c in self.columns:
            if c.other_class and c.name != self.target:
                raise ValueError(f"column {c.name!r} has an other_class but is no target")
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
        if len(cats) == 1 and not col.other_class:
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
