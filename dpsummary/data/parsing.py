"""Vectorised parsing of string columns (section "Parsing helpers" of :mod:`dpsummary.data`)."""

from __future__ import annotations

import math
from collections.abc import Sequence

import numpy as np


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
