"""Differentially private schema estimation for a zero-configuration release.

Only the header row (the column names) is public. Everything else the release needs from the
data to build a :class:`dpsummary.data.Schema` (column types, integer flags, numeric bounds,
category lists, the kind of the target) is derived from ONE Gaussian mechanism applied to one
concatenated vector of counts, followed by partition selection (here) and post-processing
(:func:`dpsummary.postprocess.schema.schema_from_release`, with the public grid
:data:`dpsummary.postprocess.schema.GRID_EDGES`; "Post-processing" there).

What is released (before post-processing)
-----------------------------------------
For every column ``c`` of the header (C columns in all), noisy versions of:

1. a *type histogram* with four bins: missing (empty field) / text (anything that is not a finite
   number, ``nan`` and ``inf`` included) / integer number / non-integer number;
2. a *grid histogram* of the finite numbers over a PUBLIC, data-independent grid: symmetric
   1-2-5 edges ``±{1, 2, 5} x 10^e`` for ``e = -4 .. 8`` plus ``±1e9``, bins closed away from
   zero, a separate bin for exact zero and open bins beyond ``±1e9`` (83 bins);
3. a *value histogram* over the distinct text values present in the data, released only for the
   values whose noisy count exceeds a threshold ``tau`` (partition selection, see below).

Sensitivity (add/remove-one-record adjacency)
---------------------------------------------
Adding or removing one record changes, in each column, exactly one bin of the type histogram by
1 and, if the field is non-missing, exactly one bin of *either* the grid histogram (a finite
number) *or* the value histogram (any other string) by 1. So at most ``K = 2C`` coordinates of
the raw count vector change, each by exactly 1: the L2 distance is at most ``sqrt(K)``. The
vector is multiplied by ``(1 - slack) / sqrt(K)`` before the noise, where ``slack`` is OpenDP's
input-rounding slack (:func:`dpsummary.private.noise.rounding_slack`) plus the float64 rounding of
``count * scale`` (:func:`dpsummary.private.noise.float_slack`), so the end-to-end L2
sensitivity is at most 1 and ``noise_std = noise_multiplier`` is exactly the Gaussian mechanism
that ``dp_accounting.GaussianDpEvent(noise_multiplier)`` describes. :func:`build_count_vector`
asserts the per-record bound by construction (each record is counted exactly once per
histogram it touches, and touches at most K of them). The slack is sized for the K touched
coordinates, not for the number of keys: OpenDP rounds coordinate-wise, so untouched
coordinates round identically in both neighbours, and the scale is a function of the number
of columns only (public), never of how many distinct values the data holds.

Target share (issue 13): by default the target column's coordinates (at most 2 per record) get
the share ``f = DEFAULT_TARGET_SHARE`` of the squared sensitivity, ``a = (1 - slack) sqrt(f/2)``,
and the other coordinates (at most K - 2 per record) ``b = (1 - slack) sqrt((1 - f)/(K - 2))``:
``2 a^2 + (K - 2) b^2 = (1 - slack)^2``, the same Gaussian event with less raw noise on the
target and more on the features. Every per-column raw noise std ``s_c = noise_multiplier /
scale_c`` is public, and the thresholds below use each column's own ``s_c``.

Partition selection (the value histograms)
------------------------------------------
The keys of a value histogram are data-dependent: a record may bring a value nobody else has.
Such a key has raw count exactly 1 in the larger data set and does not exist in the smaller one.
It is released only if ``1 + N(0, s_c^2) > tau_c``, with ``s_c`` the column's noise on the raw
scale; choosing ``tau_c = 1 + s_c * Phi^{-1}(1 - delta / C)`` makes this
probability ``delta / C`` per column, so at most ``delta`` over the (at most C) new keys of one
record (union bound). On the shared keys the release is the Gaussian mechanism above (dropping
the new keys' coordinates can only shrink the L2 distance) followed by thresholding, which is
post-processing. Hence the whole estimation is ``(eps_G, delta_G + delta)``-DP where
``(eps_G, delta_G)`` is any guarantee of ``GaussianDpEvent(noise_multiplier)`` (Korolova,
Kenthapadi, Mishra, Ntoulas 2009 for the Laplace version; Gopi, Gulhane, Kulkarni, Shen, Shokouhi,
Yekhanin 2020, "Differentially Private Set Union", and Wilson, Zhang, Lam, Desfontaines,
Simmons-Marengo, Gipson 2020, "Differentially Private SQL with Bounded User Contribution", Sec. 4,
for Gaussian thresholding). In the direction "smaller data set first" the bound picks up a factor
``1 / (1 - delta)`` instead, i.e. ``eps_G - log(1 - delta)``; ``epsilon_slack`` in the result
reports that term (about ``delta``, negligible) for a caller that wants to add it.

"""

from __future__ import annotations

import math
from dataclasses import dataclass
from typing import Any, Final

import dp_accounting
import numpy as np
from scipy.special import ndtri  # norm.isf(q) is -ndtri(q); scipy.stats costs 0.3 s (issue 29)

from ..data import NO_TARGET, DataError, RawTable, parse_floats
from ..postprocess.schema import (
    GRID_EDGES,
    NUM_GRID_BINS,
    TYPE_BINS,
    ZERO_BIN,
    PrivateSchemaResult,
    ReleasedColumn,
    schema_from_release,
)
from .noise import add_gaussian_noise, count_vector_scale, float_slack, rounding_slack

__all__ = [
    "CountVector",
    "SchemaCounts",
    "build_count_vector",
    "estimate_schema",
    "selection_threshold",
]

#: Default share of the schema mechanism's squared L2 sensitivity given to the target column
#: (the other columns share the rest evenly); see benchmarks/results/schema_refusal_rate.md.
DEFAULT_TARGET_SHARE: Final = 0.5


@dataclass(frozen=True)
class CountVector:
    """The pre-noise concatenated count vector and its layout.

    ``keys[i] = (column, section, label)`` with section ``type`` / ``grid`` / ``value``;
    ``counts`` are raw integer counts; ``touches`` (K) bounds how many coordinates one record
    changes, each by exactly 1, so ``counts * scale`` has L2 sensitivity at most 1.
    """

    keys: list[tuple[str, str, str]]
    counts: np.ndarray
    touches: int

    @property
    def scale(self) -> float:
        """Multiplier making the L2 sensitivity at most 1, OpenDP's rounding slack included.

        A function of public facts only (``touches = 2 x number of columns``): OpenDP rounds
        coordinate-wise, so coordinates one record does not touch are identical in both
        neighbours and round identically; only the <= ``touches`` touched ones carry rounding
        error, and the slack is sized for them, never for ``len(keys)`` (which counts the
        distinct values present and so depends on the data).
        """
        return count_vector_scale(self.touches, self.touches)

    def coordinate_scales(self, target: str | None = None, target_share: float | None = None) -> np.ndarray:
        """Per-coordinate multipliers giving L2 sensitivity at most 1 (public facts only).

        Without ``target_share``: :attr:`scale` everywhere. With it, the target column's
        coordinates (one record touches at most 2 of them) get ``a = (1 - slack) sqrt(f / 2)``
        and all others (at most ``touches - 2`` per record) ``b = (1 - slack) sqrt((1 - f) /
        (touches - 2))``, so ``2 a^2 + (touches - 2) b^2 = (1 - slack)^2``: the same Gaussian
        event, with the share ``f`` of the squared sensitivity (hence less raw noise) on the
        target. ``slack`` is OpenDP's rounding slack for ``touches`` coordinates plus the float64
        slack of ``count * scale`` (:func:`~dpsummary.private.noise.float_slack`).
        """
        uniform = np.full(len(self.keys), self.scale)
        if target is None or target_share is None or self.touches <= 2:
            return uniform
        if not 0.0 < target_share < 1.0:
            raise ValueError("target_share must lie in (0, 1)")
        room = 1.0 - rounding_slack(1.0, self.touches) - float_slack(1.0)  # as count_vector_scale
        a = room * math.sqrt(target_share / 2.0)
        b = room * math.sqrt((1.0 - target_share) / (self.touches - 2))
        is_target = np.array([col == target for col, _, _ in self.keys], dtype=bool)
        return np.where(is_target, a, b)

    def scaled(self) -> np.ndarray:
        return self.counts * self.scale

    def as_dict(self) -> dict[tuple[str, str, str], float]:
        return dict(zip(self.keys, self.counts.tolist(), strict=True))


def selection_threshold(raw_noise_std: float, delta_per_column: float) -> float:
    """Threshold tau on the raw scale: a key with true count 1 survives with prob. delta_col.

    ``P[1 + N(0, s^2) > tau] = Phi_bar((tau - 1) / s) = delta_col`` gives
    ``tau = 1 + s * Phi_bar^{-1}(delta_col)`` (``norm.isf``, accurate for tiny deltas).
    """
    if not 0.0 < delta_per_column < 1.0:
        raise ValueError("delta_per_column must lie in (0, 1)")
    return 1.0 + raw_noise_std * float(-ndtri(delta_per_column))


def _grid_bins(values: np.ndarray) -> np.ndarray:
    """Grid bin of each finite value. Bins are closed on the side away from zero, so round
    maxima such as 1, 100 or 1000 land in the bin they end, not in the next one up."""
    toward = np.searchsorted(GRID_EDGES, values, side="left")  # (a, b] for v > 0
    # side="right" differs from side="left" exactly where the value equals an edge: [a, b) for v < 0
    on_edge = GRID_EDGES[np.minimum(toward, len(GRID_EDGES) - 1)] == values
    away = toward + on_edge
    return np.where(values == 0.0, ZERO_BIN, np.where(values > 0, toward, away))


def build_count_vector(table: RawTable) -> CountVector:
    """The raw counts that :func:`estimate_schema` noises, with their keys (see module doc)."""
    if not table.header:
        raise DataError("the table has no columns")
    n = table.num_rows
    keys: list[tuple[str, str, str]] = []
    parts: list[np.ndarray] = []
    touches_per_record = np.zeros(n, dtype=np.int64)
    for name in table.header:
        arr = table.array(name)
        missing = arr == ""
        values, ok = parse_floats(arr)
        text = ~ok & ~missing
        integral = ok & (values == np.round(values))
        kinds = np.where(missing, 0, np.where(text, 1, np.where(integral, 2, 3)))
        type_counts = np.bincount(kinds, minlength=4)
        grid_counts = np.bincount(_grid_bins(values[ok]), minlength=NUM_GRID_BINS)
        text_values = arr[text].tolist()
        distinct = sorted(set(text_values))
        pos = {v: i for i, v in enumerate(distinct)}
        value_counts = np.bincount(
            np.fromiter(map(pos.__getitem__, text_values), np.int64, len(text_values)),
            minlength=len(distinct),
        )
        # Each record: one unit in the type histogram, and one in grid OR value unless missing.
        assert type_counts.sum() == n
        assert grid_counts.sum() + value_counts.sum() == n - missing.sum()
        touches_per_record += 1 + (~missing).astype(np.int64)
        keys += [(name, "type", b) for b in TYPE_BINS]
        keys += [(name, "grid", str(k)) for k in range(NUM_GRID_BINS)]
        keys += [(name, "value", v) for v in distinct]
        parts += [type_counts, grid_counts, value_counts]
    touches = 2 * len(table.header)
    assert n == 0 or int(touches_per_record.max()) <= touches
    counts = np.concatenate(parts).astype(np.float64)
    return CountVector(keys=keys, counts=counts, touches=touches)


class SchemaCounts:
    """The counts of :func:`build_count_vector` accumulated batch by batch (a streaming pass).

    :meth:`add` takes one batch's normalised text columns (:func:`dpsummary.data.text_column`);
    :meth:`vector` gives exactly the :class:`CountVector` that :func:`build_count_vector` gives on
    the whole table (same keys in the same order, same counts), so :func:`estimate_schema`
    releases the same mechanism. PRIVATE: the exact counts never leave this module except through
    :func:`estimate_schema`'s noise. Memory: the distinct text values of each column (as the
    in-memory path); a column of unique identifiers holds one entry per record."""

    def __init__(self, header: list[str]) -> None:
        if not header:
            raise DataError("the table has no columns")
        self.header = list(header)
        self._types = {h: np.zeros(4, dtype=np.int64) for h in self.header}
        self._grid = {h: np.zeros(NUM_GRID_BINS, dtype=np.int64) for h in self.header}
        self._values: dict[str, dict[str, int]] = {h: {} for h in self.header}

    def add(self, name: str, text: Any) -> None:
        from ..data import dictionary_codes, text_numbers

        values, ok, missing = text_numbers(text)
        is_text = ~ok & ~missing
        integral = ok & (values == np.round(values))
        kinds = np.where(missing, 0, np.where(is_text, 1, np.where(integral, 2, 3)))
        self._types[name] += np.bincount(kinds, minlength=4)
        self._grid[name] += np.bincount(_grid_bins(values[ok]), minlength=NUM_GRID_BINS)
        if is_text.any():
            import pyarrow.compute as pc

            from ..data import arrow_bool_mask  # not pa.array: it imports pandas (issue 29)

            uniq, codes = dictionary_codes(pc.filter(text, arrow_bool_mask(is_text)))
            counts = np.bincount(codes, minlength=len(uniq))
            table = self._values[name]
            for v, c in zip(uniq, counts.tolist(), strict=True):
                table[v] = table.get(v, 0) + c

    def merge(self, other: SchemaCounts) -> None:
        """Add the counts of ``other`` (the same header, e.g. another partition's pass): the
        result is exactly what one pass over both parts gives (integer counts; :meth:`vector`
        orders the keys)."""
        if other.header != self.header:
            raise ValueError("schema counts of different headers")
        for name in self.header:
            self._types[name] += other._types[name]
            self._grid[name] += other._grid[name]
            table = self._values[name]
            for v, c in other._values[name].items():
                table[v] = table.get(v, 0) + c

    def vector(self) -> CountVector:
        keys: list[tuple[str, str, str]] = []
        parts: list[np.ndarray] = []
        for name in self.header:
            distinct = sorted(self._values[name])
            keys += [(name, "type", b) for b in TYPE_BINS]
            keys += [(name, "grid", str(k)) for k in range(NUM_GRID_BINS)]
            keys += [(name, "value", v) for v in distinct]
            parts += [self._types[name], self._grid[name],
                      np.array([self._values[name][v] for v in distinct], dtype=np.int64)]
        counts = np.concatenate(parts).astype(np.float64)
        return CountVector(keys=keys, counts=counts, touches=2 * len(self.header))


def estimate_schema(
    table: RawTable | SchemaCounts,
    *,
    noise_multiplier: float,
    target: str | None,
    delta: float,
    max_categories: int = 50,
    target_classes: int | None = None,
    target_share: float | None = DEFAULT_TARGET_SHARE,
) -> PrivateSchemaResult:
    """Estimate a schema with one Gaussian mechanism (see the module docstring for the proof).

    ``target``: ``None`` for the last column, ``NO_TARGET`` for none, else a column name.
    ``delta``: the delta spent on partition selection (over all columns together).

    ``target_share``: the share of the (squared) L2 sensitivity given to the target column's
    coordinates (see :meth:`CountVector.coordinate_scales`); ``None`` spreads it evenly as the
    other columns. Any value is the same ``GaussianDpEvent(noise_multiplier)``; the default
    lowers the target's raw noise so that a healthy binary target is not mistaken for a
    constant one (benchmarks/schema_refusal_rate.py).

    ``target_classes``: a PUBLIC number of classes implied by the model (2 for logistic
    regression), or ``None``. When given, a numeric target's bounds come from the
    ``target_classes`` largest noisy grid bins (the grid is public, so this noisy top-k is
    post-processing and needs no threshold) and a categorical target keeps at most the
    ``target_classes`` largest values among those above ``tau``. The threshold stays for the
    categorical case because its candidate keys come from the data: a value only the larger
    neighbour has still passes with probability at most ``delta / C`` (module docstring);
    ranking the survivors is post-processing, so the argument is unchanged.
    """
    if target_classes is not None and target_classes < 2:
        raise ValueError("target_classes must be at least 2")
    if not (noise_multiplier > 0 and math.isfinite(noise_multiplier)):
        raise ValueError("noise_multiplier must be positive and finite")
    if not 0.0 < delta < 1.0:
        raise ValueError("delta must lie in (0, 1)")
    if max_categories < 1:
        raise ValueError("max_categories must be at least 1")
    header = list(table.header)
    if not header:
        raise DataError("the table has no columns")
    if target is None:
        tgt: str | None = header[-1]
    elif target == NO_TARGET:
        tgt = None
    elif target not in header:
        raise DataError(f"target column {target!r} is not in the data")
    else:
        tgt = target

    vec = table.vector() if isinstance(table, SchemaCounts) else build_count_vector(table)
    scales = vec.coordinate_scales(tgt, target_share)
    noisy = add_gaussian_noise(vec.counts * scales, noise_std=noise_multiplier, clip_norm=1.0) / scales
    num_cols = len(header)

    sections: dict[tuple[str, str], list[tuple[str, float]]] = {}
    raw_std: dict[str, float] = {}  # noise std on the raw count scale, per column (public)
    for (col, section, label), value, sc in zip(vec.keys, noisy.tolist(), scales.tolist(), strict=True):
        sections.setdefault((col, section), []).append((label, value))
        raw_std[col] = noise_multiplier / sc
    s_feat = noise_multiplier / vec.scale if tgt is None or target_share is None else max(raw_std.values())
    tau = selection_threshold(s_feat, delta / num_cols)

    # Partition selection: a value key leaves this function only if its noisy count passes its
    # column's threshold tau_c (module docstring); what is returned is the release.
    released: dict[str, ReleasedColumn] = {}
    for name in header:
        s = raw_std[name]
        tau_col = selection_threshold(s, delta / num_cols)
        released[name] = ReleasedColumn(
            type_counts=dict(sections[(name, "type")]),
            grid=np.array([v for _, v in sections[(name, "grid")]]),
            values=[(lab, v) for lab, v in sections.get((name, "value"), []) if v > tau_col],
            raw_noise_std=s,
        )
    return schema_from_release(
        released, target=tgt, events=[dp_accounting.dp_event.GaussianDpEvent(noise_multiplier)],
        noise_multiplier=noise_multiplier, delta=delta, touches=vec.touches, target_share=target_share,
        feature_threshold=tau, max_categories=max_categories, target_classes=target_classes,
    )
