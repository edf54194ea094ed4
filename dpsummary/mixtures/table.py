"""Numeric columns of a CSV, standardised: the (non-private) input of the mixture baselines."""

from __future__ import annotations

from dataclasses import dataclass
from pathlib import Path

import numpy as np


@dataclass(frozen=True)
class NumericTable:
    """Rows with every numeric column present and finite, standardised column-wise.

    ``values`` = (raw - ``centres``) / ``scales``; :meth:`to_raw_*` map results back to the
    CSV's units. Constant columns keep scale 1. ``dropped_rows`` counts rows with a missing
    numeric value (this is a non-private baseline: the count may be printed).
    """

    names: list[str]
    values: np.ndarray
    centres: np.ndarray
    scales: np.ndarray
    dropped_rows: int

    def to_raw_means(self, means: np.ndarray) -> np.ndarray:
        return means * self.scales + self.centres

    def to_raw_covariances(self, covariances: np.ndarray) -> np.ndarray:
        return covariances * np.outer(self.scales, self.scales)


def read_numeric_table(path: str | Path) -> NumericTable:
    """Read ``path`` with :func:`dpsummary.data.read_csv`, keep the columns that
    :func:`dpsummary.data.infer_schema` calls numeric (no target), drop rows with a missing
    value, standardise. Raises :class:`dpsummary.data.DataError` (a one-line user error) when no
    numeric column or fewer than two complete rows remain."""
    from .. import data as dmod

    table = dmod.read_csv(path)
    schema = dmod.infer_schema(table, target=dmod.NO_TARGET)
    names = [c.name for c in schema.columns if c.kind == "numeric"]
    if not names:
        raise dmod.DataError(f"{Path(path).name} has no numeric column to fit a mixture to")
    cols, oks = zip(*(dmod.parse_floats(table.array(n)) for n in names), strict=True)
    raw = np.column_stack(cols)
    complete = np.logical_and.reduce(oks)
    raw = raw[complete]
    if raw.shape[0] < 2:
        raise dmod.DataError("fewer than two rows have every numeric column present")
    centres = raw.mean(0)
    scales = raw.std(0)
    scales = np.where(scales > 0, scales, 1.0)
    return NumericTable(names, (raw - centres) / scales, centres, scales, int((~complete).sum()))
