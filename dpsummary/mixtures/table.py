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
    :func:`dpsummary.data.infer_schema` calls numeric (no target), and standardise them with the
    GLM baselines' data-fitted transform (:meth:`dpsummary.data.Transform.fit`: mean and
    population sd) through its total per-record rules, dropping rows with a missing numeric value
    (``encode_total(missing_numeric="drop")``). Raises :class:`dpsummary.data.DataError` (a
    one-line user error) when no numeric column or fewer than two complete rows remain."""
    from .. import data as dmod

    table = dmod.read_csv(path)
    schema = dmod.infer_schema(table, target=dmod.NO_TARGET)
    numeric = [c for c in schema.columns if c.kind == "numeric"]
    if not numeric:
        raise dmod.DataError(f"{Path(path).name} has no numeric column to fit a mixture to")
    transform = dmod.Transform.fit(table, dmod.Schema(columns=numeric, target=None), invalid_numeric="missing")
    points, _ = transform.encode_total(table, missing_numeric="drop")
    values = points.numpy()
    if values.shape[0] < 2:
        raise dmod.DataError("fewer than two rows have every numeric column present")
    names = [c.name for c in numeric]
    centres = np.array([transform.centres[n] for n in names])
    scales = np.array([transform.scales[n] for n in names])
    return NumericTable(names, values, centres, scales, int(table.num_rows - values.shape[0]))
