"""The public feature domain of ``noise-aware-cells``: every combination of the declared feature
columns' levels, in model space, from the policy's schema alone.

THE RULE (public; nothing here reads a record):

* every feature column must be DISCRETE:

  - a categorical column of K categories has the K one-hot vectors as its levels, plus the
    all-zero vector (the "missing/other" level :mod:`dpsummary.data.transform` encodes a missing
    or unseen category as) when the policy's ``data_quality.unseen_category`` is ``"other"``
    (with ``"drop"`` those records are dropped, so the level never occurs);
  - a numeric column must be declared ``integer = true`` with public bounds; its levels are the
    integers in ``[ceil(lower), floor(upper)]`` mapped to model space by the public transform
    (``(v - centre) / half_range``), plus the column's centre when the policy's
    ``data_quality.missing_numeric`` is ``"impute"`` (the transform imputes a missing value
    there) and the centre is not already an integer level;
  - any other numeric column (continuous, or unbounded) refuses: it has no finite public set of
    levels;

* the domain is the product of the columns' levels, in the schema's column order (the last
  column varies fastest); its size is public (a function of the schema and the policy);
* it applies when the domain has at most :data:`MAX_CELLS` cells. The check before any
  reservation (:func:`check_schema`) counts the largest domain the schema allows (both
  data-quality levels included), so the policy's rules can only make the domain it runs on
  smaller, never refuse later.

Why 512 (:data:`MAX_CELLS`): the counts' noise enters the noise-aware likelihood's mean in every
cell, so its effect on the intervals grows with the number of cells (benchmarks/notebook/
feature_cells.md: the one domain measured has 50 cells). 512 = 2^9 is about ten times the domain
measured and keeps the posterior's per-imputation cost (cells x parameters^2) trivial; it is a
public constant chosen before any run on it, not a measured optimum. Larger domains need a
feature model with structure (marginals, a copula), which this mechanism does not have.

A record whose encoded features are not exactly a level (a non-integer value in an integer
column, clipped into its bounds by the transform) is mapped, column by column, to the NEAREST
level in model space, ties to the level listed first (:func:`dpsummary.private.cells.cell_indices`,
a total per-record rule); its statistic then uses the cell's features, so the released T is
exactly the sum over cells the posterior models.
"""

from __future__ import annotations

import math
from collections.abc import Iterator
from dataclasses import dataclass
from typing import TYPE_CHECKING, Any

from ..errors import ReleaseError

if TYPE_CHECKING:
    import numpy as np

#: The public cap on the number of cells (module docstring: why 512).
MAX_CELLS = 512
#: The fix every "not a small discrete domain" refusal names.
OTHER_MECHANISM = "or use --mechanism noise-aware-newton"


@dataclass(frozen=True)
class CellDomain:
    """The product domain in model space: per feature column its name and its levels (each a
    tuple of the column's model-space coordinates: 1 for a numeric column, K for a categorical
    one). Public; JSON-able through :meth:`describe`."""

    columns: tuple[str, ...]
    levels: tuple[tuple[tuple[float, ...], ...], ...]

    @property
    def num_cells(self) -> int:
        return math.prod(len(lv) for lv in self.levels)

    @property
    def num_features(self) -> int:
        return sum(len(lv[0]) for lv in self.levels)

    def features(self) -> np.ndarray:
        """``(C, F)`` model-space features of every cell (the last column varies fastest, the
        order of :func:`dpsummary.private.cells.cell_indices`)."""
        import itertools

        import numpy as np

        rows = [[v for level in combo for v in level] for combo in itertools.product(*self.levels)]
        return np.array(rows, dtype=np.float64).reshape(self.num_cells, self.num_features)

    def design_radius(self) -> float:
        """``max over cells of ||[1, x_c]||`` (public): the L2 bound of a record's ``[1, x] y``
        for a target in [0, 1], the statistic T's sensitivity."""
        return math.sqrt(1.0 + sum(max(sum(v * v for v in level) for level in lv) for lv in self.levels))

    def describe(self) -> dict[str, Any]:
        """The claim's record of the domain (public)."""
        return {"cells": self.num_cells, "max_cells": MAX_CELLS,
                "columns": {c: len(lv) for c, lv in zip(self.columns, self.levels, strict=True)}}


def _numeric_levels(col: Any, centre: float, half_range: float, impute: bool) -> list[tuple[float, ...]]:
    lo, hi = math.ceil(col.lower), math.floor(col.upper)
    values = [float(v) for v in range(lo, hi + 1)]
    if impute and centre not in values:
        values.append(centre)
    return [((v - centre) / half_range,) for v in values]


def _level_counts(schema: Any, *, impute: bool, other: bool) -> Iterator[tuple[str, int]]:
    """``(column, number of levels)`` per feature column; refuses on a column that is not
    discrete (a public fact)."""
    for col in schema.feature_columns:
        if col.kind == "categorical":
            yield col.name, len(col.categories or []) + int(other)
            continue
        if not col.integer or col.lower is None or col.upper is None:
            raise ReleaseError(
                f"noise-aware-cells needs discrete features; column {col.name!r} is numeric and not declared integer "
                "with bounds",
                fix=f"declare it integer = true with integer bounds, or bin it into a categorical column, {OTHER_MECHANISM}")
        lo, hi = math.ceil(col.lower), math.floor(col.upper)
        if hi < lo:
            raise ReleaseError(f"noise-aware-cells: integer column {col.name!r} has no integer inside its bounds",
                               fix=f"fix its bounds in the policy's schema, {OTHER_MECHANISM}")
        centre = (col.lower + col.upper) / 2
        count = hi - lo + 1
        if count > MAX_CELLS:
            yield col.name, count  # enough to refuse; the centre cannot matter
            continue
        yield col.name, count + int(impute and not (centre == int(centre) and lo <= centre <= hi))


def check_schema(schema: Any) -> int:
    """Refuse (:class:`~dpsummary.errors.ReleaseError`, before any reservation) unless the
    public schema gives a discrete domain of at most :data:`MAX_CELLS` cells, counted with every
    data-quality level included (the largest domain any policy can run on); returns that count.
    (No public schema at all is refused by the pipeline: ``Mechanism.requires_public_schema``.)"""
    total = 1
    for _name, count in _level_counts(schema, impute=True, other=True):
        total *= count
        if total > MAX_CELLS:
            raise ReleaseError(
                f"noise-aware-cells: the schema's feature domain has more than {MAX_CELLS} cells (its public cap)",
                fix=f"declare fewer levels (coarser integer bins, fewer categories, fewer columns), {OTHER_MECHANISM}")
    return total


def cell_domain(transform: Any, *, missing_numeric: str, unseen_category: str) -> CellDomain:
    """The domain the mechanism runs on: the public transform's schema under the policy's
    data-quality rules (module docstring). Call after :func:`check_schema` (it refuses first)."""
    schema = transform.schema
    impute, other = missing_numeric == "impute", unseen_category == "other"
    names, levels = [], []
    for col in schema.feature_columns:
        names.append(col.name)
        if col.kind == "categorical":
            k = len(col.categories or [])
            lv = [tuple(1.0 if j == i else 0.0 for j in range(k)) for i in range(k)]
            levels.append(tuple(lv + ([tuple([0.0] * k)] if other else [])))
        else:
            levels.append(tuple(_numeric_levels(col, transform.centres[col.name], transform.scales[col.name], impute)))
    return CellDomain(tuple(names), tuple(levels))
