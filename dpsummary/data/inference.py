"""Non-private schema inference from the data itself (section "Non-private schema inference" of
:mod:`dpsummary.data`): for non-private baselines only."""

from __future__ import annotations

import math

import numpy as np

from ..header import DataError
from .parsing import _is_integral, _parses, _to_float
from .reading import RawTable, _err
from .schema import NO_TARGET, ColumnSpec, Schema, target_kind


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
