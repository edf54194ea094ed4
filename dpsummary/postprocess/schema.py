"""Post-processing of DP schema estimation: a :class:`dpsummary.data.Schema` from what the one
Gaussian mechanism of :func:`dpsummary.private.preprocess.estimate_schema` released.

Nothing here reads a record or draws privacy noise. The input is the release after partition
selection (:class:`ReleasedColumn` per column: noisy type and grid histograms, the value keys
whose noisy count passed the column's threshold, the column's public noise scale); the public
grid the per-record counting bins into (:data:`GRID_EDGES`) is defined here too, because the
bounds are read off it. The mechanism, its sensitivity and the partition-selection argument are
in :mod:`dpsummary.private.preprocess`.

Post-processing (no further privacy cost)
-----------------------------------------
* numeric vs categorical: numeric when the noisy number count exceeds the noisy text count (a
  column with a few stray strings is numeric; transform it with ``invalid_numeric="missing"``);
* integer: the noisy non-integer count is below ``max(3 s, 1% of the numbers)``;
* bounds: grid bins with noisy count below ``z s_c`` are zeroed (``z`` chosen so that, over
  all grid bins of all feature columns, an empty bin survives with probability below 1%; the
  target has its own 1% over its 83 bins, ``TARGET_FALSE_BIN_PROB``); the bounds are
  the outer edges of the bins holding the 1% and 99% quantiles of what remains (for the target:
  of the lowest and highest surviving bins, except a bin with a false bin's profile, which the
  target's note names: see ``_numeric_spec``), rounded inwards (ceil / floor) for integer
  columns, capped at ``±1e9``; a feature's note warns when a bound was set by one bin alone in
  its decade whose count is within one noise sd of the threshold and that widens the box more
  than 10x (a false bin's profile, :func:`_suspect_bounds`; the bin is kept, since dropping such
  bins clipped real columns);
* categories: the values above ``tau_c``, the ``max_categories`` largest, sorted.
* a count regression's target (``count_target``, public: ``--model poisson``): when its noisy
  grid shows no bin above the noise, or only the bin of zero (a refusal before), it is the count
  ``[0, GRID_LIMIT]``, a public range the default mechanism's count stage then clips at a DP
  quantile; a grid that does show a range gives the bounds as for any numeric target;
* a public class count (``target_classes``: 2 for logistic regression): a numeric target is
  read as the classes 0 and 1 (the public coding of a numeric logistic-regression response, as in
  R's ``glm`` and statsmodels' ``Logit``; a record with any other value is dropped by the
  transform's total rule and counted among the dropped records the quality check refuses on),
  nothing about its range read off the noisy grid: the noisy top-2 bins it replaced picked a
  noise bin over a rare class's often enough to refuse about one zero-configuration release in
  ten at epsilon 0.1 (the calibration suite: youthrisk, sim_imbalanced, sim_exact,
  sim_small_wide); a categorical target keeps at most ``target_classes`` of the values above
  ``tau_c`` (the threshold stays, since its candidate keys come from the data and a key only one
  neighbour has must pass with probability <= delta / C).
A feature column for which nothing survives is dropped (with a note); for the target that is a
DataError. Notes and errors only ever mention noisy, released quantities.
"""

from __future__ import annotations

import dataclasses
import math
from dataclasses import dataclass, field
from typing import Any, Final

import dp_accounting
import numpy as np
from scipy.special import ndtri  # norm.isf(q) is -ndtri(q); scipy.stats costs 0.3 s (issue 29)

from ..data import ColumnSpec, DataError, Schema, target_kind

#: Positive public grid edges: 1-2-5 steps from 1e-4 to 5e8, then 1e9.
_POSITIVE_EDGES: Final = [m * 10.0**e for e in range(-4, 9) for m in (1.0, 2.0, 5.0)] + [1e9]
#: All edges, ascending: -1e9 ... -1e-4, 0, 1e-4 ... 1e9 (81 edges). Bin k (0 <= k <= 81) lies
#: between GRID_EDGES[k-1] and GRID_EDGES[k] (open ends), closed on the side away from zero:
#: (a, b] for positive values, [a, b) for negative ones; bin 82 is exact zero.
GRID_EDGES: Final = np.array([-x for x in reversed(_POSITIVE_EDGES)] + [0.0] + _POSITIVE_EDGES)
GRID_LIMIT: Final = 1e9
NUM_GRID_BINS: Final = len(GRID_EDGES) + 2
#: The bin of exact zero (the last one).
ZERO_BIN: Final = NUM_GRID_BINS - 1
TYPE_BINS: Final = ("missing", "text", "integer", "fraction")
#: Quantiles of the denoised grid histogram used as feature bounds.
LOWER_QUANTILE: Final = 0.01
UPPER_QUANTILE: Final = 0.99
#: Probability that any empty grid bin (over all columns) survives denoising.
GRID_FALSE_BIN_PROB: Final = 0.01
#: Probability that an empty grid bin of the TARGET survives (its own budget, not shared with
#: the features: a lower floor keeps a healthy minority class; a false bin only widens bounds).
TARGET_FALSE_BIN_PROB = 0.01


@dataclass(frozen=True)
class ReleasedColumn:
    """What schema estimation releases about one column (noisy counts, raw count scale):
    ``type_counts`` (the four :data:`TYPE_BINS`), ``grid`` (:data:`NUM_GRID_BINS` public grid
    bins), ``values`` (the value keys whose noisy count passed the column's partition-selection
    threshold, with those counts) and ``raw_noise_std`` (the column's noise sd, public)."""

    type_counts: dict[str, float]
    grid: np.ndarray
    values: list[tuple[str, float]]
    raw_noise_std: float


@dataclass(frozen=True)
class PrivateSchemaResult:
    """A privately estimated schema and exactly what it cost.

    ``events``: the dp_accounting events of the mechanism (one Gaussian). ``delta``: the extra
    delta consumed by partition selection, to be added to the accountant's delta.
    ``epsilon_slack``: ``-log(1 - delta)``, see the module docstring. ``noisy_num_records``: a
    noisy record count (post-processing of the type histograms), usable wherever a DP count of
    the records is needed. ``notes``: what was derived, for the release report.
    """

    schema: Schema
    events: list[dp_accounting.DpEvent]
    delta: float
    epsilon_slack: float
    noise_multiplier: float
    noisy_num_records: float
    notes: list[str] = field(default_factory=list)
    dropped: list[str] = field(default_factory=list)


def schema_from_release(
    columns: dict[str, ReleasedColumn],
    *,
    target: str | None,
    events: list[dp_accounting.DpEvent],
    noise_multiplier: float,
    delta: float,
    touches: int,
    target_share: float | None,
    feature_threshold: float,
    max_categories: int,
    target_classes: int | None,
    count_target: bool = False,
) -> PrivateSchemaResult:
    """The schema, notes and noisy record count from the released ``columns`` (in header order;
    post-processing only, see the module docstring). ``target``, ``events``, ``delta``,
    ``touches``, ``target_share`` and ``feature_threshold`` (the feature columns' category
    threshold, for the notes) are the mechanism's public parameters. Raises ``DataError`` when
    the target or every feature column is left with nothing (messages name only released,
    noisy quantities)."""
    header = list(columns)
    num_cols = len(header)
    tgt = target
    z_grid = float(-ndtri(GRID_FALSE_BIN_PROB / (num_cols * NUM_GRID_BINS)))
    z_target = float(-ndtri(TARGET_FALSE_BIN_PROB / NUM_GRID_BINS))
    tau = feature_threshold

    specs: list[ColumnSpec] = []
    notes: list[str] = [
        f"schema estimated privately: one Gaussian mechanism, noise multiplier "
        f"{noise_multiplier:g}, L2 sensitivity 1 after scaling counts (one record touches "
        f"{touches} of them{'' if target_share is None or tgt is None else f', target share {target_share:g}'}); "
        f"feature category threshold {tau:.1f} records (delta {delta:g} for partition selection)"
    ]
    dropped: list[str] = []
    totals: list[float] = []
    for name in header:
        column = columns[name]
        is_target = name == tgt
        s = column.raw_noise_std
        t = column.type_counts
        totals.append(sum(t.values()))
        numbers = t["integer"] + t["fraction"]
        spec: ColumnSpec | None
        why: str
        if max(numbers, t["text"]) < 3.0 * s:
            spec, why = None, "too few non-missing values to estimate anything"
        elif numbers > t["text"]:
            if is_target and target_classes == 2:
                # A numeric target of logistic regression codes its classes 0/1: a public rule of
                # the model (module docstring), not read off the noisy grid.
                spec, why = _binary_numeric_target(name, column.grid, noise_sd=s)
            else:
                integer = t["fraction"] < max(3.0 * s, 0.01 * numbers)
                # The target has its own false-bin budget (TARGET_FALSE_BIN_PROB over its 83
                # bins): a lower floor, so a healthy minority class is not taken for noise (issue 13).
                z = z_target if is_target else z_grid
                spec, why = _numeric_spec(name, column.grid, z * s, integer, full_range=is_target, noise_sd=s)
                if spec is None and is_target and count_target:
                    # A count regression's target is a count (a public rule of the model): a grid
                    # too thin to show its range gives the public range instead of a refusal.
                    spec, why = _count_target(name, why)
        else:
            values = column.values
            cap = min(max_categories, target_classes) if is_target and target_classes else max_categories
            spec, why = _categorical_spec(name, values, cap)
            if is_target and spec is not None and len(spec.categories or []) == 1:
                spec, why = _one_vs_rest(spec, values, text=t["text"], noise_sd=s, why=why)
        if spec is None:
            if is_target:
                raise DataError(f"target {name!r}: {why}", fix=TARGET_FIX)
            dropped.append(name)
            notes.append(f"{name}: dropped ({why})")
            continue
        specs.append(spec)
        notes.append(why)
    if not [c for c in specs if c.name != tgt]:
        # The noise sd is public (epsilon, delta and the number of columns fix it); it tells the
        # curator how far the budget is from what a zero-configuration release of this width needs
        # (benchmarks/results/refusal_reasons.md).
        feature_sd = max((columns[n].raw_noise_std for n in header if n != tgt), default=0.0)
        raise DataError(f"no feature column could be estimated privately (at this epsilon each of the schema "
                        f"estimate's counts has noise sd about {feature_sd:,.0f} records)",
                        fix="give the policy a public schema instead (`dpsummary policy init DATA` writes a skeleton "
                        "to fill in, then pass it with --policy), or raise --epsilon")
    schema = Schema(columns=specs, target=tgt)
    spec_t = schema.target_column
    if spec_t is not None and spec_t.kind == "categorical" and len(spec_t.categories or []) == 1 \
            and not spec_t.other_class:
        raise DataError(f"target {tgt!r} has a single class (the rest is not clearly above the noise)",
                        fix=TARGET_FIX)
    kind = target_kind(schema)
    if tgt is not None:
        notes.append(f"target {tgt!r}: {kind}")
    return PrivateSchemaResult(
        schema=schema,
        events=list(events),
        delta=delta,
        epsilon_slack=-math.log1p(-delta),
        noise_multiplier=noise_multiplier,
        noisy_num_records=max(float(np.mean(totals)), 0.0),
        notes=notes,
        dropped=dropped,
    )


def with_public_target(result: PrivateSchemaResult, target: ColumnSpec, header: list[str] | tuple[str, ...]
                       ) -> PrivateSchemaResult:
    """``result`` (estimated without the target) with the target's PUBLIC spec added in its
    header position (``--positive-class``; nothing about the target column was released)."""
    specs = {c.name: c for c in result.schema.columns}
    specs[target.name] = target
    schema = Schema(columns=[specs[name] for name in header if name in specs], target=target.name)
    listed = (target.categories or [""])[0]
    is_one = target.positive is not None
    note = (f"target {target.name!r}: binary, public (--positive-class): 1 = {listed!r}, 0 = any other non-missing "
            "value" if is_one else
            f"target {target.name!r}: binary, public: 0 = {listed!r}, 1 = any other non-missing value")
    target_kind(schema)  # the public spec must suit a binary model; raises DataError otherwise
    return dataclasses.replace(result, schema=schema, notes=[*result.notes, note])


def _count_target(name: str, reason: str) -> tuple[ColumnSpec, str]:
    """The public spec of a count regression's numeric target when its noisy grid gives no range
    (``reason``: nothing above the noise, or only the bin of zero): integer in ``[0, GRID_LIMIT]``.
    The default mechanism's count stage clips it at the bin edge of a DP quantile
    (:mod:`dpsummary.postprocess.count_range`); a value that is not a non-negative integer is
    dropped by the transform's total rule."""
    spec = ColumnSpec(name=name, kind="numeric", lower=0.0, upper=GRID_LIMIT, integer=True)
    return spec, (f"{name}: count target, bounds [0, {GRID_LIMIT:g}] (public: a count regression reads a numeric target "
                  f"as a count; its noisy grid gave no range: {reason})")


#: The fix a refused zero-configuration target names (a yes/no target needs only its class).
TARGET_FIX: Final = ("for a yes/no target name the class to predict with --positive-class; otherwise give the policy "
                     "a public schema with the target (`dpsummary policy init DATA` writes a skeleton to fill in, "
                     "then pass it with --policy)")


def _bin_edges(k: int) -> tuple[float, float]:
    """Outer edges of bin k, capped at +-GRID_LIMIT (values beyond it are clipped)."""
    if k == ZERO_BIN:
        return 0.0, 0.0
    lo = GRID_EDGES[k - 1] if k >= 1 else -GRID_LIMIT
    hi = GRID_EDGES[k] if k < len(GRID_EDGES) else GRID_LIMIT
    return float(lo), float(hi)


def _holds_integer(k: int) -> bool:
    """Whether grid bin k (closed away from zero, capped at +-GRID_LIMIT) contains an integer."""
    if k == ZERO_BIN:
        return True
    lo, hi = _bin_edges(k)
    if lo >= 0.0:  # (lo, hi]
        return math.floor(hi) > lo
    return math.ceil(lo) < hi  # [lo, hi)


_INTEGER_BINS: Final = np.array([_holds_integer(k) for k in range(NUM_GRID_BINS)])


#: The grid bin holding the integer 1: ``(0.5, 1]``.
ONE_BIN: Final = int(np.searchsorted(GRID_EDGES, 1.0))


#: A logistic regression's numeric target is refused as not coded 0/1 when the noisy count of
#: other integer values exceeds this many of its noise sds (a 0/1 target passes but for a
#: 3e-5 chance).
OTHER_CODES_SDS: Final = 4.0


def _binary_numeric_target(name: str, grid: np.ndarray, *, noise_sd: float) -> tuple[ColumnSpec | None, str]:
    """The public spec of a logistic regression's numeric target: integer in ``[0, 1]`` (module
    docstring). The note gives the noisy number of other integer values from the released grid
    (post-processing), whose records the transform drops; when that count is clearly above its
    noise (:data:`OTHER_CODES_SDS`; a 1/2 coding, a count) the target is not coded 0/1 and there
    is no spec (the caller refuses, naming --positive-class)."""
    other = [k for k in range(NUM_GRID_BINS) if _INTEGER_BINS[k] and k not in (ZERO_BIN, ONE_BIN)]
    outside = max(float(grid[other].sum()), 0.0)
    outside_sd = noise_sd * math.sqrt(len(other))
    if outside > OTHER_CODES_SDS * outside_sd:
        return None, (f"logistic regression reads a numeric target as 0/1, but about {outside:,.0f} values are other "
                      f"integers (noisy count, noise sd {outside_sd:,.0f})")
    spec = ColumnSpec(name=name, kind="numeric", lower=0.0, upper=1.0, integer=True)
    return spec, (f"{name}: numeric target read as the classes 0 and 1 (public: logistic regression codes a numeric "
                  f"target 0/1); a record with any other value is dropped: about {outside:,.0f} other integers (noisy "
                  f"count from the released grid, noise sd {outside_sd:,.0f})")


def _numeric_spec(
    name: str, grid: np.ndarray, floor: float, integer: bool, *, full_range: bool, noise_sd: float = 0.0,
) -> tuple[ColumnSpec | None, str]:
    """Bounds from the denoised grid histogram (pure post-processing)."""
    kept = np.where(grid > floor, grid, 0.0)
    # Reorder bins by position on the line: the zero bin sits between (-1e-4, 0) and [0, 1e-4).
    zero_at = int(np.searchsorted(GRID_EDGES, 0.0, side="right"))  # bin [0, 1e-4)
    order = list(range(zero_at)) + [ZERO_BIN] + list(range(zero_at, ZERO_BIN))
    mass = kept[order]
    total = float(mass.sum())
    if total <= 0:
        return None, "no numeric bin rose above the noise"
    dropped_sides: list[str] = []
    if full_range:
        nz = np.flatnonzero(mass > 0)
        lo_bin, hi_bin = order[int(nz[0])], order[int(nz[-1])]
        # The target's range sets the model-space scale of every residual, so a false bin far out
        # makes the whole release noise (sim_linear_heavy, zero configuration, epsilon 0.1: a
        # bin at the noise level widened the target's range and the coefficients' sds came out
        # 10^7 times the full data's): a bound set by a bin with a false bin's profile
        # (:func:`_suspect_bounds`) is read off the next surviving bin instead, and the note says so.
        dropped_sides = _suspect_bounds(mass, order, lo_bin, hi_bin, floor, noise_sd) if nz.size > 1 else []
        if "lower" in dropped_sides:
            lo_bin = order[int(nz[1])]
        if "upper" in dropped_sides:
            hi_bin = order[int(nz[-2])]
    else:
        cum = np.cumsum(mass) / total
        lo_bin = order[int(np.searchsorted(cum, LOWER_QUANTILE, side="left"))]
        hi_bin = order[min(int(np.searchsorted(cum, UPPER_QUANTILE, side="left")), len(order) - 1)]
    lower, _ = _bin_edges(lo_bin)
    _, upper = _bin_edges(hi_bin)
    suspect = [] if full_range else _suspect_bounds(mass, order, lo_bin, hi_bin, floor, noise_sd)
    # Values in the grid bins outside [lo_bin, hi_bin] are clipped to the bounds: their number,
    # summed from the released noisy grid counts (post-processing, no new budget), tells the
    # curator whether to give public bounds instead. Floored at 0: the sum is noisy.
    # An integer column's values sit only in bins holding an integer (public structure), so only
    # those are summed: less noise. ``noise_sd`` (the column's per-bin noise sd) gives the sum's.
    lo_at, hi_at = order.index(lo_bin), order.index(hi_bin)
    beyond = [k for k in order[:lo_at] + order[hi_at + 1:] if _INTEGER_BINS[k] or not integer]
    outside = max(float(grid[beyond].sum()), 0.0)
    outside_sd = noise_sd * math.sqrt(len(beyond))
    if integer:
        # The closed hull of the two bins' integers: round outer edges inwards, ceil / floor.
        lo_i, hi_i = float(math.ceil(lower)), float(math.floor(upper))
        if lo_i <= hi_i:
            lower, upper = lo_i, hi_i
    how = "lowest/highest surviving bins" if full_range else "noisy 1%/99% quantiles"
    if lower >= upper:
        if full_range:
            return None, "it appears constant"
        upper = lower + 1.0
        how += ", widened to unit width (constant column)"
    spec = ColumnSpec(name=name, kind="numeric", lower=lower, upper=upper, integer=integer)
    kind = "integer" if integer else "real"
    if dropped_sides:
        how += (f"; its {' and '.join(dropped_sides)} surviving bin was left out: alone in its decade, within one noise "
                f"sd of the threshold and widening the range more than {SUSPECT_WIDENING:g}x (a false bin's profile); "
                "if the target does reach that far, declare its bounds in the policy's schema")
    warning = "" if not suspect else (
        f"; warning: its {' and '.join(suspect)} bound comes from one grid bin alone in its decade whose noisy count "
        "is within one noise sd of the threshold, and it widens the box more than "
        f"{SUSPECT_WIDENING:g}x: it may be noise, which puts the column's values in a sliver of the box (about 1 "
        "zero-configuration release in 250 on small tables); declare the column's bounds in the policy's schema")
    return (
        spec,
        f"{name}: numeric ({kind}), bounds [{lower:g}, {upper:g}] from {how} on a public grid; values outside "
        f"are clipped to them: about {outside:,.0f} (noisy count from the released grid, noise sd {outside_sd:,.0f}; "
        "public bounds in the policy's schema avoid this)" + warning,
    )


#: A quantile bound is flagged when the bin that sets it is alone within this many positions of
#: the line (a decade of the 1-2-5 grid), its noisy count is within one noise sd of the threshold,
#: and the box is more than SUSPECT_WIDENING times wider with it than without it: the profile of
#: a false bin (an empty bin whose noise crossed the threshold), which on a small table can carry
#: over 1% of the rows (benchmarks/notebook/noise_aware_variants.md, sixteenth and seventeenth
#: rules: dropping such bins clips real columns, so the release keeps them and says so).
SUSPECT_ISOLATION: Final = 3
SUSPECT_WIDENING: Final = 10.0


def _suspect_bounds(mass: np.ndarray, order: list[int], lo_bin: int, hi_bin: int, floor: float,
                    noise_sd: float) -> list[str]:
    """Which of the bounds ("lower", "upper") a possibly false grid bin set (see
    :data:`SUSPECT_WIDENING`). ``mass`` is the thresholded grid in line order (``order``).
    Post-processing of released counts; it only adds a warning to the note."""
    alive = np.flatnonzero(mass > 0)
    out = []
    for side, k in (("lower", lo_bin), ("upper", hi_bin)):
        at = order.index(k)
        others = alive[alive != at]
        if others.size == 0 or np.abs(others - at).min() <= SUSPECT_ISOLATION:
            continue
        if not mass[at] < floor + noise_sd:
            continue
        # The span of every surviving bin, with and without this one (at least 1: a 0/1 column's).
        span_with = _bin_edges(order[int(alive[-1])])[1] - _bin_edges(order[int(alive[0])])[0]
        span_without = max(_bin_edges(order[int(others[-1])])[1] - _bin_edges(order[int(others[0])])[0], 1.0)
        if span_with > SUSPECT_WIDENING * span_without:
            out.append(side)
    return out


def _categorical_spec(
    name: str, values: list[tuple[str, float]], max_categories: int
) -> tuple[ColumnSpec | None, str]:
    if not values:
        return None, "no category was frequent enough to pass the noisy threshold"
    ranked = sorted(values, key=lambda lv: (-lv[1], lv[0]))
    kept = sorted(lab for lab, _ in ranked[:max_categories])
    extra = f", the {max_categories} most frequent kept" if len(ranked) > max_categories else ""
    spec = ColumnSpec(name=name, kind="categorical", categories=kept)
    noun = "category" if len(kept) == 1 else "categories"
    return spec, f"{name}: categorical, {len(kept)} {noun} passed the noisy threshold{extra}"


def _one_vs_rest(spec: ColumnSpec, values: list[tuple[str, float]], *, text: float, noise_sd: float,
                 why: str) -> tuple[ColumnSpec, str]:
    """A categorical target of which only one class passed the threshold (a rare second class
    is the usual reason: 3% defaults in 10,000 rows at a small schema share) becomes a binary
    target, that class against every other non-missing value (:attr:`ColumnSpec.other_class`),
    when the noisy text count exceeds the class's noisy count by more than
    ``ONE_VS_REST_SDS`` sds of their difference (``sqrt(2)`` noise sds); otherwise the one class
    stays and the target is refused as having a single class. Post-processing of released
    counts: the listed class and both counts are DP outputs."""
    label = (spec.categories or [""])[0]
    count = dict(values)[label]
    if text - count <= ONE_VS_REST_SDS * math.sqrt(2.0) * noise_sd:
        return spec, why
    one = ColumnSpec(name=spec.name, kind="categorical", categories=[label], other_class=True)
    return one, (f"{why}; the target is binary one-vs-rest: 1 = any non-missing value other than {label!r} "
                 "(their noisy count is well above zero)")


#: How many sds of the noise on (text count - class count) the rest must exceed (public).
ONE_VS_REST_SDS = 3.0


def describe(result: PrivateSchemaResult) -> dict[str, Any]:
    """A JSON-able summary for release reports (everything in it is already released)."""
    return {
        "schema": result.schema.model_dump(mode="json"),
        "events": [repr(e) for e in result.events],
        "delta": result.delta,
        "epsilon_slack": result.epsilon_slack,
        "noise_multiplier": result.noise_multiplier,
        "noisy_num_records": result.noisy_num_records,
        "notes": list(result.notes),
        "dropped": list(result.dropped),
    }
