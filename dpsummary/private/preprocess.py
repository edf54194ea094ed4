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

What leaves the mechanism: per column the noisy type and grid histograms and the value keys
above ``tau_c`` cut to the ``keep = max_categories + 1`` largest noisy counts
(:attr:`SchemaMechanism.keep`). Post-processing reads no more than that (whether any value
passed, the ``cap <= max_categories`` largest, whether more than ``cap`` passed), so the cut is
post-processing and changes no schema; it bounds what any engine must hold after selection.

Distributed form (the Spark engine and streaming, issue 35)
------------------------------------------------------------
:class:`SchemaMechanism` holds the mechanism's public parameters and steps, and both engines
run it. The local engine noises its fixed-size sections in one call and streams the value keys
in pieces (:meth:`SchemaCounts.value_totals`: memory bounded, spilled keys merged from sorted
runs); an in-memory :class:`RawTable` is noised in one call. The Spark engine sums the
counts by key on the executors, noises each value key there (:meth:`SchemaMechanism.select_values`,
in pieces, on whichever executor holds the key), thresholds and cuts there, and sends the driver
only the fixed-size type and grid counts (noised on the driver) and the surviving keys. The
released distribution is the same, term by term:

* the same counts: each key's total is the exact integer sum of the same per-batch counts
  (:func:`column_counts`), whatever the partitioning;
* the same noise: OpenDP's ``make_gaussian`` releases, coordinate by coordinate,
  ``round_k(x_i) + 2^k Z_i`` with ``Z_i`` independent discrete Gaussians of one public scale
  (``noise_multiplier``, grid ``k`` fixed by ``clip_norm = 1``); it has no cross-coordinate
  state, so noising a vector in pieces (any split, order or machine; each key exactly once) is
  the same joint distribution as one call, with the same per-column multipliers
  (:meth:`SchemaMechanism.scale`, the values of :meth:`CountVector.coordinate_scales`), hence the
  same ``GaussianDpEvent(noise_multiplier)``, the same sensitivity and the same slack;
* the same selection: each key is kept iff its noisy count exceeds the same ``tau_c``, a
  per-key decision, so deciding it where the key lives changes nothing; the top-``keep`` of the
  union of per-partition top-``keep`` lists is the top-``keep`` of all survivors
  (:func:`top_values`, a total order).
Entropy: the executors' OpenDP samplers read their own OS CSPRNG, as the driver's does.

"""

from __future__ import annotations

import math
from collections.abc import Iterator
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
    with_public_target,
)
from .noise import add_gaussian_noise, count_vector_scale, float_slack, rounding_slack

__all__ = [
    "CountVector",
    "SchemaCounts",
    "SchemaMechanism",
    "build_count_vector",
    "column_counts",
    "estimate_schema",
    "selection_threshold",
    "top_values",
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
        pair = None if target is None else _share_scales(self.touches, target_share)
        if pair is None:
            return np.full(len(self.keys), self.scale)
        is_target = np.array([col == target for col, _, _ in self.keys], dtype=bool)
        return np.where(is_target, pair[0], pair[1])

    def scaled(self) -> np.ndarray:
        return self.counts * self.scale

    def as_dict(self) -> dict[tuple[str, str, str], float]:
        return dict(zip(self.keys, self.counts.tolist(), strict=True))


def _share_scales(touches: int, target_share: float | None) -> tuple[float, float] | None:
    """``(a, b)`` of :meth:`CountVector.coordinate_scales` (target, other columns), or ``None``
    for the uniform :func:`count_vector_scale` (no share, or a single column)."""
    if target_share is None or touches <= 2:
        return None
    if not 0.0 < target_share < 1.0:
        raise ValueError("target_share must lie in (0, 1)")
    room = 1.0 - rounding_slack(1.0, touches) - float_slack(1.0)  # as count_vector_scale
    return room * math.sqrt(target_share / 2.0), room * math.sqrt((1.0 - target_share) / (touches - 2))


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


def column_counts(text: Any) -> tuple[np.ndarray, np.ndarray, Any, np.ndarray]:
    """One batch of one normalised text column (:func:`dpsummary.data.text_column`) counted as
    :func:`build_count_vector` counts it: ``(type counts (4,), grid counts (83,), distinct text
    values (an Arrow string array, or None), their counts)``. Every record adds 1 to one type
    bin and, unless missing, 1 to one grid bin or one value count. PRIVATE (exact counts)."""
    from ..data import text_numbers
    from ..data.stream import arrow_to_numpy

    values, ok, missing = text_numbers(text)
    is_text = ~ok & ~missing
    integral = ok & (values == np.round(values))
    kinds = np.where(missing, 0, np.where(is_text, 1, np.where(integral, 2, 3)))
    types = np.bincount(kinds, minlength=4).astype(np.int64)
    grid = np.bincount(_grid_bins(values[ok]), minlength=NUM_GRID_BINS).astype(np.int64)
    if not is_text.any():
        return types, grid, None, np.zeros(0, dtype=np.int64)
    import pyarrow.compute as pc

    from ..data import arrow_bool_mask  # not pa.array: it imports pandas (issue 29)

    enc = pc.dictionary_encode(pc.filter(text, arrow_bool_mask(is_text)))
    if hasattr(enc, "combine_chunks"):
        enc = enc.combine_chunks()
    counts = np.bincount(arrow_to_numpy(enc.indices).astype(np.int64, copy=False), minlength=len(enc.dictionary))
    return types, grid, enc.dictionary, counts.astype(np.int64)


#: Distinct (column, value) keys :class:`SchemaCounts` holds in memory before it writes them, as
#: one sorted run, to a private anonymous temporary file (a public constant; about 100 MB).
SPILL_KEYS: Final = 1 << 19
#: Keys per Arrow batch in a run (memory of the final merge: one batch per run).
_RUN_BATCH: Final = 4096
#: Keys per piece handed to the noise when streaming the value totals.
VALUE_CHUNK: Final = 1 << 16


class SchemaCounts:
    """The counts of :func:`build_count_vector` accumulated batch by batch (a streaming pass).

    :meth:`add` takes one batch's normalised text columns (:func:`dpsummary.data.text_column`);
    :meth:`vector` gives exactly the :class:`CountVector` that :func:`build_count_vector` gives on
    the whole table (same keys in the same order, same counts), and :meth:`value_totals` streams
    the same value keys and totals, so :func:`estimate_schema` releases the same mechanism.
    PRIVATE: the exact counts never leave this module except through :func:`estimate_schema`'s
    noise.

    Memory (issue 35): at most :data:`SPILL_KEYS` distinct (column, value) keys are held; beyond
    that they are written, sorted, as one run to an anonymous temporary file (created by
    :func:`tempfile.TemporaryFile`: mode 0600, unlinked at once on Linux, gone when closed or
    when the process ends; the same access controls as the input) and :meth:`value_totals`
    merges the runs, one small batch of each at a time. So a column of unique identifiers costs
    disk, not memory, and cannot exhaust memory after the charge. Whether it spills depends on
    the data but changes only where the exact counts wait, never a released value."""

    def __init__(self, header: list[str], *, spill_keys: int = SPILL_KEYS) -> None:
        if not header:
            raise DataError("the table has no columns")
        if spill_keys < 1:
            raise ValueError("spill_keys must be positive")
        self.header = list(header)
        self._types = {h: np.zeros(4, dtype=np.int64) for h in self.header}
        self._grid = {h: np.zeros(NUM_GRID_BINS, dtype=np.int64) for h in self.header}
        self._values: dict[str, dict[str, int]] = {h: {} for h in self.header}
        self._held = 0
        self._spill_keys = int(spill_keys)
        self._runs: list[Any] = []

    def add(self, name: str, text: Any) -> None:
        types, grid, distinct, counts = column_counts(text)
        self.add_totals(name, types, grid, [] if distinct is None else distinct.to_pylist(), counts)

    def add_totals(self, name: str, types: Any, grid: Any, labels: list[str], counts: Any) -> None:
        """Add exact totals of column ``name`` (as :func:`column_counts` gives them)."""
        self._types[name] += np.asarray(types, dtype=np.int64)
        self._grid[name] += np.asarray(grid, dtype=np.int64)
        table = self._values[name]
        before = len(table)
        for v, c in zip(labels, np.asarray(counts).tolist(), strict=True):
            table[v] = table.get(v, 0) + int(c)
        self._held += len(table) - before
        if self._held > self._spill_keys:
            self._spill()

    def _spill(self) -> None:
        """Write every held key, sorted by (column index, value), as one run; hold none."""
        import tempfile

        import pyarrow as pa

        schema = pa.schema([("col", pa.int32()), ("label", pa.string()), ("count", pa.int64())])
        run = tempfile.TemporaryFile()  # noqa: SIM115 - kept open until close(): the run lives in it
        with pa.ipc.new_stream(run, schema) as writer:
            for i, name in enumerate(self.header):
                table = self._values[name]
                keys = sorted(table)
                for a in range(0, len(keys), _RUN_BATCH):
                    part = keys[a:a + _RUN_BATCH]
                    writer.write_batch(pa.record_batch(
                        [pa.array([i] * len(part), pa.int32()), pa.array(part, pa.string()),
                         pa.array([table[k] for k in part], pa.int64())], schema=schema))
                table.clear()
        run.seek(0)
        self._runs.append(run)
        self._held = 0

    def close(self) -> None:
        """Close (and so delete) the spilled runs."""
        runs, self._runs = self._runs, []
        for run in runs:
            run.close()

    def _sorted_keys(self) -> Iterator[tuple[int, str, int]]:
        """Every (column index, value, partial count) of the runs and the held keys, in
        (column index, value) order (each source is sorted; equal keys are adjacent)."""
        import heapq

        import pyarrow as pa

        def held() -> Iterator[tuple[int, str, int]]:
            for i, name in enumerate(self.header):
                table = self._values[name]
                for k in sorted(table):
                    yield i, k, table[k]

        def read(run: Any) -> Iterator[tuple[int, str, int]]:
            run.seek(0)
            for batch in pa.ipc.open_stream(run):
                yield from zip(batch.column(0).to_pylist(), batch.column(1).to_pylist(),
                               batch.column(2).to_pylist(), strict=True)

        return heapq.merge(held(), *(read(r) for r in self._runs))

    def value_totals(self, chunk: int = VALUE_CHUNK) -> Iterator[tuple[str, list[str], np.ndarray]]:
        """The value keys with their exact totals, each key exactly once, in (column, value)
        order, as ``(column, values, totals)`` pieces of at most ``chunk`` keys of one column
        (memory: one piece plus one batch per spilled run)."""
        col, labels, totals = -1, list[str](), list[int]()
        last: tuple[int, str] | None = None
        for i, label, count in self._sorted_keys():
            if last == (i, label):
                totals[-1] += count
                continue
            if i != col or len(labels) >= chunk:
                if labels:
                    yield self.header[col], labels, np.array(totals, dtype=np.int64)
                col, labels, totals = i, list[str](), list[int]()
            labels.append(label)
            totals.append(count)
            last = (i, label)
        if labels:
            yield self.header[col], labels, np.array(totals, dtype=np.int64)

    def fixed_totals(self, name: str) -> tuple[np.ndarray, np.ndarray]:
        """Column ``name``'s exact type counts (4) and grid counts (83)."""
        return self._types[name].copy(), self._grid[name].copy()

    def vector(self) -> CountVector:
        values: dict[str, tuple[list[str], list[np.ndarray]]] = {name: ([], []) for name in self.header}
        for name, labels, totals in self.value_totals():
            values[name][0].extend(labels)
            values[name][1].append(totals)
        keys: list[tuple[str, str, str]] = []
        parts: list[np.ndarray] = []
        for name in self.header:
            keys += [(name, "type", b) for b in TYPE_BINS]
            keys += [(name, "grid", str(k)) for k in range(NUM_GRID_BINS)]
            keys += [(name, "value", v) for v in values[name][0]]
            parts += [self._types[name], self._grid[name], *values[name][1]]
        counts = np.concatenate(parts).astype(np.float64)
        return CountVector(keys=keys, counts=counts, touches=2 * len(self.header))


def top_values(values: list[tuple[str, float]], keep: int) -> list[tuple[str, float]]:
    """The ``keep`` largest ``(label, noisy count)`` pairs, ranked by (-count, label) (a total
    order: labels are distinct). Top-``keep`` of a union equals top-``keep`` of the union of each
    part's top-``keep``, so partial selections merge exactly in any order."""
    return sorted(values, key=lambda lv: (-lv[1], lv[0]))[:keep]


@dataclass(frozen=True)
class SchemaMechanism:
    """The public parameters of :func:`estimate_schema`'s mechanism, and its steps as reusable
    parts (picklable: the Spark engine ships it to the executors).

    Every field is public (the header, the resolved target, the noise multiplier, delta, the
    target share, the category cap, the public class count); so is everything derived from them:
    each column's multiplier (:meth:`scale`, equal to :meth:`CountVector.coordinate_scales` on
    that column's coordinates), its raw noise std and its threshold ``tau_c`` (:meth:`threshold`).

    Steps: :meth:`noise` (the Gaussian noise on scaled counts, any subset of coordinates at a
    time: OpenDP's ``make_gaussian`` rounds each coordinate to the grid ``2^k`` and adds an
    independent discrete Gaussian to each, so noising the vector in pieces, in any order, on
    any machine, is the same joint distribution as one call on the whole vector),
    :meth:`select_values` (noise plus partition selection plus the top-``keep`` cut for one
    column's value keys) and :meth:`release` (post-processing into the schema).
    """

    header: tuple[str, ...]
    target: str | None
    noise_multiplier: float
    delta: float
    target_share: float | None
    max_categories: int
    target_classes: int | None
    #: The target's :class:`~dpsummary.data.ColumnSpec` when it is PUBLIC (``--positive-class``):
    #: the target column is then left out of the mechanism altogether (none of its counts is
    #: noised or released, and one record touches ``2 (C - 1)`` coordinates), the other columns
    #: share the sensitivity evenly, and the spec is put into the schema as given.
    public_target: Any = None
    #: The requested model is a count regression (public): a numeric target whose noisy grid
    #: gives no range is read as a count in ``[0, GRID_LIMIT]`` (:mod:`dpsummary.postprocess.schema`).
    count_target: bool = False

    @classmethod
    def plan(cls, header: list[str] | tuple[str, ...], *, noise_multiplier: float, target: str | None, delta: float,
             max_categories: int = 50, target_classes: int | None = None,
             target_share: float | None = DEFAULT_TARGET_SHARE, public_target: Any = None,
             count_target: bool = False) -> SchemaMechanism:
        """Validate the public parameters (``target``: ``None`` for the last column, ``NO_TARGET``
        for none, else a column name; ``public_target``: the target's public spec or ``None``) and
        resolve the target."""
        if target_classes is not None and target_classes < 2:
            raise ValueError("target_classes must be at least 2")
        if not (noise_multiplier > 0 and math.isfinite(noise_multiplier)):
            raise ValueError("noise_multiplier must be positive and finite")
        if not 0.0 < delta < 1.0:
            raise ValueError("delta must lie in (0, 1)")
        if max_categories < 1:
            raise ValueError("max_categories must be at least 1")
        cols = tuple(header)
        if not cols:
            raise DataError("the table has no columns")
        if target is None:
            tgt: str | None = cols[-1]
        elif target == NO_TARGET:
            tgt = None
        elif target not in cols:
            raise DataError(f"target column {target!r} is not in the data")
        else:
            tgt = target
        if public_target is not None:
            if tgt is None or public_target.name != tgt:
                raise ValueError("public_target must be the spec of the release's target column")
            if len(cols) < 2:
                raise DataError("the table has no feature column besides the target")
            target_share, target_classes = None, None
        mech = cls(cols, tgt, float(noise_multiplier), float(delta), target_share, int(max_categories),
                   target_classes, public_target, bool(count_target))
        mech.scale(mech.estimated[0])  # validates target_share now, not on an executor
        return mech

    @property
    def estimated(self) -> tuple[str, ...]:
        """The columns whose counts the mechanism noises: the header without a public target."""
        if self.public_target is None:
            return self.header
        return tuple(c for c in self.header if c != self.public_target.name)

    @property
    def touches(self) -> int:
        """K = 2C: coordinates one record changes, each by exactly 1 (module docstring); C counts
        the estimated columns only (a public target is not counted at all)."""
        return 2 * len(self.estimated)

    @property
    def keep(self) -> int:
        """Value keys kept per column after the threshold: ``max_categories + 1`` is all that
        post-processing reads (:func:`dpsummary.postprocess.schema._categorical_spec` uses
        whether any passed, the ``cap <= max_categories`` largest, and whether more than ``cap``
        passed), so cutting to it is post-processing that leaves the schema unchanged."""
        return self.max_categories + 1

    def scale(self, name: str) -> float:
        """Column ``name``'s multiplier (the value :meth:`CountVector.coordinate_scales` gives
        its coordinates)."""
        pair = None if self.target is None else _share_scales(self.touches, self.target_share)
        if pair is None:
            return count_vector_scale(self.touches, self.touches)
        return pair[0] if name == self.target else pair[1]

    def _target_in_mechanism(self) -> str | None:
        """The target as the estimation sees it: none when its spec is public."""
        return None if self.public_target is not None else self.target

    def raw_std(self, name: str) -> float:
        """Column ``name``'s noise std on the raw count scale (public)."""
        return self.noise_multiplier / self.scale(name)

    def threshold(self, name: str) -> float:
        """``tau_c = selection_threshold(s_c, delta / C)`` (module docstring)."""
        return selection_threshold(self.raw_std(name), self.delta / len(self.estimated))

    def noise(self, counts: np.ndarray, scales: np.ndarray) -> np.ndarray:
        """Noisy raw counts: ``(counts * scales + N(0, noise_multiplier^2 I)) / scales``, the
        noise from OpenDP's exact discrete Gaussian (OS entropy), sensitivity 1 after scaling."""
        counts = np.asarray(counts, dtype=np.float64)
        if counts.shape[0] == 0:
            return counts
        return add_gaussian_noise(counts * scales, noise_std=self.noise_multiplier, clip_norm=1.0) / scales

    def select_values(self, name: str, labels: list[str], counts: np.ndarray) -> list[tuple[str, float]]:
        """Column ``name``'s value keys (any subset, each key once overall): each gets its
        Gaussian noise, those whose noisy count exceeds ``tau_c`` are kept (partition
        selection), cut to the :attr:`keep` largest (:func:`top_values`)."""
        counts = np.asarray(counts, dtype=np.float64)
        noisy = self.noise(counts, np.full(counts.shape[0], self.scale(name)))
        return self.passing(name, zip(labels, noisy.tolist(), strict=True))

    def passing(self, name: str, noisy: Any) -> list[tuple[str, float]]:
        """Of ``(label, noisy count)`` pairs, those above ``tau_c``, top :attr:`keep`."""
        tau = self.threshold(name)
        return top_values([(lab, v) for lab, v in noisy if v > tau], self.keep)

    def release(self, types: dict[str, np.ndarray], grids: dict[str, np.ndarray],
                values: dict[str, list[tuple[str, float]]]) -> PrivateSchemaResult:
        """Post-processing: the schema from each column's noisy type counts (4, in
        :data:`TYPE_BINS` order), noisy grid counts and selected values."""
        cols = self.estimated
        if self.target is None or self.target_share is None:
            s_feat = self.noise_multiplier / count_vector_scale(self.touches, self.touches)
        else:
            s_feat = max(self.raw_std(c) for c in cols)
        tau = selection_threshold(s_feat, self.delta / len(cols))
        released = {
            name: ReleasedColumn(
                type_counts=dict(zip(TYPE_BINS, np.asarray(types[name], dtype=np.float64).tolist(), strict=True)),
                grid=np.asarray(grids[name], dtype=np.float64),
                values=top_values(values.get(name, []), self.keep),
                raw_noise_std=self.raw_std(name),
            )
            for name in cols
        }
        result = schema_from_release(
            released, target=self._target_in_mechanism(),
            events=[dp_accounting.dp_event.GaussianDpEvent(self.noise_multiplier)],
            noise_multiplier=self.noise_multiplier, delta=self.delta, touches=self.touches,
            target_share=self.target_share, feature_threshold=tau, max_categories=self.max_categories,
            target_classes=self.target_classes, count_target=self.count_target,
        )
        if self.public_target is None:
            return result
        return with_public_target(result, self.public_target, self.header)


def estimate_schema(
    table: RawTable | SchemaCounts,
    *,
    noise_multiplier: float,
    target: str | None,
    delta: float,
    max_categories: int = 50,
    target_classes: int | None = None,
    target_share: float | None = DEFAULT_TARGET_SHARE,
    public_target: Any = None,
    count_target: bool = False,
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
    regression), or ``None``. When given, a numeric target is the classes 0 and 1 by a public
    rule, refused when the released grid shows other integer values clearly above the noise
    (:mod:`dpsummary.postprocess.schema`; post-processing, no threshold needed) and a categorical
    target keeps at most the ``target_classes`` largest values among those above ``tau``. The threshold stays for the
    categorical case because its candidate keys come from the data: a value only the larger
    neighbour has still passes with probability at most ``delta / C`` (module docstring);
    ranking the survivors is post-processing, so the argument is unchanged.

    ``count_target``: the requested model is a count regression (PUBLIC): a numeric target whose
    noisy grid shows no bin above the noise, or only the bin of zero, is the count ``[0, 1e9]``
    (the default mechanism's count stage then clips it at a DP quantile) instead of a refusal.

    ``public_target``: the target's PUBLIC :class:`~dpsummary.data.ColumnSpec`
    (``--positive-class``): its column is left out of the count vector (the proof is the one
    above on the other ``C - 1`` columns: no count of the target column is noised or released -
    the streaming and Spark passes may tally them, and they are discarded unreleased), so
    ``target_share`` and ``target_classes`` do not apply, and the spec joins the
    estimated schema as given (:func:`~dpsummary.postprocess.schema.with_public_target`).

    On a :class:`RawTable` the whole count vector is noised in one call; on the local engine's
    :class:`SchemaCounts` the fixed-size sections in one call and the value keys streamed in
    pieces (:meth:`SchemaCounts.value_totals`, memory bounded); the Spark engine noises and
    selects the value keys on its executors. All are the same distribution (module docstring,
    "Distributed form").
    """
    mech = SchemaMechanism.plan(list(table.header), noise_multiplier=noise_multiplier, target=target, delta=delta,
                                max_categories=max_categories, target_classes=target_classes,
                                target_share=target_share, public_target=public_target,
                                count_target=count_target)
    if isinstance(table, SchemaCounts):
        return _estimate_streaming(mech, table)
    if mech.public_target is not None:  # the public target's column is never counted
        table = RawTable(header=list(mech.estimated), columns={c: table.columns[c] for c in mech.estimated},
                         private=table.private)
    vec = build_count_vector(table)
    scales = vec.coordinate_scales(mech._target_in_mechanism(), mech.target_share)
    noisy = mech.noise(vec.counts, scales)

    sections: dict[tuple[str, str], list[tuple[str, float]]] = {}
    for (col, section, label), value in zip(vec.keys, noisy.tolist(), strict=True):
        sections.setdefault((col, section), []).append((label, value))
    # Partition selection: a value key leaves this function only if its noisy count passes its
    # column's threshold tau_c (module docstring); what is returned is the release.
    return mech.release(
        {name: np.array([v for _, v in sections[(name, "type")]]) for name in mech.estimated},
        {name: np.array([v for _, v in sections[(name, "grid")]]) for name in mech.estimated},
        {name: mech.passing(name, sections.get((name, "value"), [])) for name in mech.estimated},
    )


def _estimate_streaming(mech: SchemaMechanism, counts: SchemaCounts) -> PrivateSchemaResult:
    """:func:`estimate_schema` on :class:`SchemaCounts`: the type and grid counts noised in one
    call, then each piece of value keys noised, thresholded and cut
    (:meth:`SchemaMechanism.select_values`), keeping at most ``keep`` keys per column."""
    header = mech.estimated
    fixed = [counts.fixed_totals(name) for name in header]
    exact = np.concatenate([np.concatenate(tg) for tg in fixed]).astype(np.float64)
    width = 4 + NUM_GRID_BINS
    noisy = mech.noise(exact, np.repeat([mech.scale(name) for name in header], width)).reshape(len(header), width)
    chosen: dict[str, list[tuple[str, float]]] = {name: [] for name in header}
    for name, labels, totals in counts.value_totals():
        if name not in chosen:  # a public target's values: never noised, never released
            continue
        chosen[name] = top_values(chosen[name] + mech.select_values(name, labels, totals), mech.keep)
    return mech.release({name: noisy[i, :4] for i, name in enumerate(header)},
                        {name: noisy[i, 4:] for i, name in enumerate(header)}, chosen)
