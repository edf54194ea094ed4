"""Tests for dpsummary.private.preprocess: private schema estimation and its privacy claims."""

from __future__ import annotations

import math
import re
from pathlib import Path
from typing import Any

import dp_accounting
import numpy as np
import pytest
from scipy.stats import norm

from dpsummary.data import NO_TARGET, DataError, RawTable, Transform, read_csv, target_kind
from dpsummary.postprocess import schema as schema_post
from dpsummary.postprocess.schema import GRID_EDGES, NUM_GRID_BINS
from dpsummary.private import preprocess
from dpsummary.private.preprocess import build_count_vector, estimate_schema, selection_threshold

DATA_DIR = Path(__file__).resolve().parents[2] / "shared" / "data"


def table(columns: dict[str, list[str]]) -> RawTable:
    return RawTable(header=list(columns), columns={k: list(v) for k, v in columns.items()})


def synthetic(n: int = 5000, seed: int = 0, singletons: int = 0) -> RawTable:
    rng = np.random.default_rng(seed)
    age = rng.integers(18, 91, n)
    x = rng.normal(3.0, 1.0, n)
    colour = rng.choice(["red", "green", "blue"], n, p=[0.5, 0.3, 0.2]).tolist()
    for i in range(singletons):
        colour[i] = f"rare{i}"
    colour[-1] = ""  # one missing value
    y = rng.choice(["no", "yes"], n).tolist()
    return table(
        {
            "age": [str(a) for a in age],
            "x": [f"{v:.4f}" for v in x],
            "colour": colour,
            "y": y,
        }
    )


def identity_noise(monkeypatch: pytest.MonkeyPatch) -> list[dict[str, Any]]:
    """Replace the noise with the identity (deterministic tests); record every call."""
    calls: list[dict[str, Any]] = []

    def fake(values: np.ndarray, *, noise_std: float, clip_norm: float) -> np.ndarray:
        calls.append({"values": np.array(values), "noise_std": noise_std, "clip_norm": clip_norm})
        return np.asarray(values, dtype=np.float64)

    monkeypatch.setattr(preprocess, "add_gaussian_noise", fake)
    return calls


# ---- the threshold, analytically ------------------------------------------------------------
@pytest.mark.parametrize("s", [1.0, 5.477, 40.0])
@pytest.mark.parametrize("delta_col", [1e-3, 1e-6, 1e-10])
def test_selection_threshold_keeps_singletons_with_prob_delta(s: float, delta_col: float) -> None:
    tau = selection_threshold(s, delta_col)
    # A key held by one record has raw count 1: P[1 + N(0, s^2) > tau] must equal delta_col.
    assert norm.sf((tau - 1.0) / s) == pytest.approx(delta_col, rel=1e-6)
    # ... and a key with count 0 or less (no holder) could never be released: it has no key.
    assert tau > 1.0


def test_threshold_used_matches_claim(monkeypatch: pytest.MonkeyPatch) -> None:
    """estimate_schema's threshold is selection_threshold(s, delta / C) on the raw scale."""
    calls = identity_noise(monkeypatch)
    t = synthetic(500)
    res = estimate_schema(t, noise_multiplier=2.0, target=None, delta=1e-6, target_share=None)
    (call,) = calls
    assert call["noise_std"] == 2.0 and call["clip_norm"] == 1.0
    vec = build_count_vector(t)
    s = 2.0 / vec.scale
    tau = selection_threshold(s, 1e-6 / 4)
    assert f"{tau:.1f}" in res.notes[0]
    assert res.delta == 1e-6
    assert res.events == [dp_accounting.GaussianDpEvent(2.0)]
    assert res.epsilon_slack == pytest.approx(1e-6, rel=1e-5)


# ---- sensitivity ----------------------------------------------------------------------------
def l2_between(a: RawTable, b: RawTable) -> tuple[float, float, int]:
    va, vb = build_count_vector(a), build_count_vector(b)
    da, db = va.as_dict(), vb.as_dict()
    keys = set(da) | set(db)
    diff = np.array([da.get(k, 0.0) - db.get(k, 0.0) for k in keys])
    raw = float(np.linalg.norm(diff))
    assert va.touches == vb.touches
    return raw, raw * va.scale, va.touches


EXTRA_RECORDS = [
    {"age": "45", "x": "2.5", "colour": "red", "y": "yes"},  # all common values
    {"age": "7e12", "x": "-0.00001", "colour": "never-seen", "y": "maybe"},  # new keys, extremes
    {"age": "", "x": "", "colour": "", "y": ""},  # all missing
    {"age": "nan", "x": "inf", "colour": "3", "y": "0"},  # non-finite strings, numbers as text
]


@pytest.mark.parametrize("extra", EXTRA_RECORDS)
def test_per_record_l2_contribution_at_most_one(extra: dict[str, str]) -> None:
    base = synthetic(300)
    cols = {k: list(v) for k, v in base.columns.items()}
    for k, v in extra.items():
        cols[k].append(v)
    bigger = table(cols)
    raw, scaled, touches = l2_between(base, bigger)
    assert touches == 2 * len(base.header)
    assert raw <= math.sqrt(touches) + 1e-12
    assert scaled <= 1.0
    non_missing = sum(1 for v in extra.values() if v)
    assert raw == pytest.approx(math.sqrt(len(extra) + non_missing))  # exactly the touched bins


def test_removing_any_record_moves_at_most_one() -> None:
    base = synthetic(60, singletons=3)
    for i in range(base.num_rows):
        cols = {k: v[:i] + v[i + 1 :] for k, v in base.columns.items()}
        _, scaled, _ = l2_between(base, table(cols))
        assert scaled <= 1.0


def test_count_vector_layout_is_public_except_values() -> None:
    vec = build_count_vector(synthetic(100))
    per_col = 4 + NUM_GRID_BINS
    value_keys = [k for k in vec.keys if k[1] == "value"]
    assert len(vec.keys) == 4 * per_col + len(value_keys)
    assert {k[0] for k in value_keys} <= {"colour", "y"}


def test_grid_bins_closed_away_from_zero() -> None:
    bins = preprocess._grid_bins(np.array([1.0, 0.99, -1.0, 0.0, 2e9, -2e9, 1e9]))
    edges = [schema_post._bin_edges(int(b)) for b in bins]
    assert edges[0] == (0.5, 1.0) and edges[1] == (0.5, 1.0)
    assert edges[2] == (-1.0, -0.5)
    assert edges[3] == (0.0, 0.0)
    assert edges[4] == (1e9, 1e9) and edges[5] == (-1e9, -1e9)  # capped
    assert edges[6] == (5e8, 1e9)
    assert GRID_EDGES[0] == -1e9 and GRID_EDGES[-1] == 1e9


# ---- estimation -----------------------------------------------------------------------------
def test_estimate_exact_without_noise(monkeypatch: pytest.MonkeyPatch) -> None:
    identity_noise(monkeypatch)
    res = estimate_schema(synthetic(5000), noise_multiplier=1.0, target=None, delta=1e-6)
    s = res.schema
    assert s.target == "y" and target_kind(s) == "binary"
    age, x, colour = s.column("age"), s.column("x"), s.column("colour")
    assert age.kind == "numeric" and age.integer and (age.lower, age.upper) == (10.0, 100.0)
    assert x.kind == "numeric" and not x.integer
    assert x.lower is not None and x.upper is not None and x.lower <= 1.0 and x.upper >= 5.0
    assert colour.categories == ["blue", "green", "red"]
    assert res.noisy_num_records == pytest.approx(5000)


def test_estimate_with_real_noise_recovers_types() -> None:
    t = synthetic(5000, singletons=40)
    res = estimate_schema(t, noise_multiplier=1.0, target=None, delta=1e-6)
    s = res.schema
    assert [c.kind for c in s.columns] == ["numeric", "numeric", "categorical", "categorical"]
    assert s.column("age").integer and not s.column("x").integer
    age = s.column("age")
    assert age.lower is not None and age.upper is not None
    assert age.lower <= 20 and age.upper >= 85 and age.lower >= 0 and age.upper <= 200
    assert s.column("colour").categories == ["blue", "green", "red"]  # no singleton kept
    assert s.column("y").categories == ["no", "yes"]
    assert abs(res.noisy_num_records - 5000) < 100
    assert res.events == [dp_accounting.GaussianDpEvent(1.0)]
    model_t = Transform.from_schema(s, invalid_numeric="missing", invalid_target="drop")
    pts = model_t.to_points(t)
    assert pts.shape[1] == model_t.num_features + 1 and float(pts[:, :-1].abs().max()) <= 1.0


def test_singletons_never_kept_realistic() -> None:
    # 300 singleton values, realistic sigma and delta: expected number kept 300 * 1e-7 / 1.
    cols = {"v": [f"id{i}" for i in range(300)] + ["common"] * 200, "y": ["a", "b"] * 250}
    res = estimate_schema(table(cols), noise_multiplier=0.8, target=NO_TARGET, delta=1e-7)
    assert res.schema.column("v").categories == ["common"]
    assert res.schema.target is None


def test_max_categories_keeps_largest(monkeypatch: pytest.MonkeyPatch) -> None:
    identity_noise(monkeypatch)
    values = [f"c{i:02d}" for i in range(10) for _ in range(200 + 10 * i)]
    n = len(values)
    t = table({"v": values, "w": ["1"] * n})
    res = estimate_schema(t, noise_multiplier=0.5, target=NO_TARGET, delta=1e-6, max_categories=3)
    assert res.schema.column("v").categories == ["c07", "c08", "c09"]


def test_count_and_numeric_binary_targets(monkeypatch: pytest.MonkeyPatch) -> None:
    identity_noise(monkeypatch)
    rng = np.random.default_rng(1)
    n = 3000
    feat = [str(v) for v in rng.integers(0, 5, n)]
    counts = [str(v) for v in rng.poisson(30, n)]
    res = estimate_schema(
        table({"f": feat, "c": counts}), noise_multiplier=1.0, target=None, delta=1e-6
    )
    assert target_kind(res.schema) == "count"
    binary = [str(v) for v in rng.integers(0, 2, n)]
    res = estimate_schema(
        table({"f": feat, "b": binary}), noise_multiplier=1.0, target="b", delta=1e-6
    )
    assert target_kind(res.schema) == "binary"


def test_errors_are_data_free() -> None:
    t = table({"f": ["1", "2"] * 5, "y": [""] * 10})
    with pytest.raises(DataError) as info:
        estimate_schema(t, noise_multiplier=1.0, target=None, delta=1e-6)
    assert re.search(r"\d", str(info.value)) is None and "'y'" in str(info.value)
    with pytest.raises(DataError, match="not in the data"):
        estimate_schema(t, noise_multiplier=1.0, target="zz", delta=1e-6)
    with pytest.raises(ValueError):
        estimate_schema(t, noise_multiplier=0.0, target=None, delta=1e-6)
    with pytest.raises(ValueError):
        estimate_schema(t, noise_multiplier=1.0, target=None, delta=0.0)


def test_dropped_feature_is_noted(monkeypatch: pytest.MonkeyPatch) -> None:
    identity_noise(monkeypatch)
    n = 400
    t = table({"empty": [""] * n, "f": ["1", "2"] * (n // 2), "y": ["a", "b"] * (n // 2)})
    res = estimate_schema(t, noise_multiplier=1.0, target=None, delta=1e-6)
    assert res.dropped == ["empty"] and res.schema.names == ["f", "y"]
    assert any("empty: dropped" in note for note in res.notes)


def test_real_data_private_schema() -> None:
    path = DATA_DIR / "german_credit.csv"
    if not path.exists():
        pytest.skip(f"{path} not present")
    t = read_csv(path, private=True)
    res = estimate_schema(t, noise_multiplier=1.0, target=None, delta=1e-6)
    assert res.schema.target == "credit_risk" and target_kind(res.schema) == "binary"
    assert res.schema.column("checking_status").kind == "categorical"
    assert res.schema.column("age").kind == "numeric"
    pts = Transform.from_schema(res.schema, invalid_target="drop").to_points(t)
    assert pts.shape[0] > 900


# ---- issue 13: a public scale, a target share, top-k for a binary target --------------------
def test_scale_is_identical_for_neighbours_with_a_new_distinct_value() -> None:
    """The scale (hence noise std, tau, bin floors) depends on public facts only."""
    base = synthetic(300)
    cols = {k: list(v) for k, v in base.columns.items()}
    for k, v in {"age": "45", "x": "2.5", "colour": "a-value-nobody-else-has", "y": "yes"}.items():
        cols[k].append(v)
    bigger = table(cols)
    va, vb = build_count_vector(base), build_count_vector(bigger)
    assert len(va.keys) != len(vb.keys)  # the new value adds a key ...
    assert va.scale == vb.scale  # ... yet the scale is bit-for-bit the same
    for share in (None, 0.5):
        sa = set(va.coordinate_scales("y", share).tolist())
        sb = set(vb.coordinate_scales("y", share).tolist())
        assert sa == sb


@pytest.mark.parametrize("share", [0.2, 0.5, 0.9])
def test_target_share_keeps_sensitivity_one(share: float) -> None:
    base = synthetic(200, singletons=2)
    for extra in EXTRA_RECORDS:
        cols = {k: list(v) for k, v in base.columns.items()}
        for k, v in extra.items():
            cols[k].append(v)
        bigger = table(cols)
        va, vb = build_count_vector(base), build_count_vector(bigger)
        da = dict(zip(va.keys, (va.counts * va.coordinate_scales("y", share)).tolist(), strict=True))
        db = dict(zip(vb.keys, (vb.counts * vb.coordinate_scales("y", share)).tolist(), strict=True))
        diff = np.array([da.get(k, 0.0) - db.get(k, 0.0) for k in set(da) | set(db)])
        assert float(np.linalg.norm(diff)) <= 1.0


def test_target_share_lowers_target_noise(monkeypatch: pytest.MonkeyPatch) -> None:
    identity_noise(monkeypatch)
    vec = build_count_vector(synthetic(50))
    sc = vec.coordinate_scales("y", 0.5)
    is_y = np.array([k[0] == "y" for k in vec.keys])
    assert sc[is_y].min() > vec.scale > sc[~is_y].max()
    assert estimate_schema(synthetic(500), noise_multiplier=2.0, target="y", delta=1e-6).events == [
        dp_accounting.GaussianDpEvent(2.0)
    ]


def _binary_table(n: int, positives: int) -> RawTable:
    rng = np.random.default_rng(0)
    y = ["1"] * positives + ["0"] * (n - positives)
    return table({"x": [f"{v:.3f}" for v in rng.normal(size=n)], "y": y})


def test_numeric_binary_target_is_public_zero_one(monkeypatch: pytest.MonkeyPatch) -> None:
    """With target_classes=2 (--model logistic) a numeric target is the classes 0 and 1 by a
    public rule, even when the positive class sits far below the noise (post-processing only)."""
    identity_noise(monkeypatch)
    t = _binary_table(400, 3)  # 3 positives: far below any floor at this noise
    with pytest.raises(DataError, match="constant"):
        estimate_schema(t, noise_multiplier=5.0, target="y", delta=1e-6, target_share=None)
    res = estimate_schema(t, noise_multiplier=5.0, target="y", delta=1e-6, target_share=None, target_classes=2)
    spec = next(c for c in res.schema.columns if c.name == "y")
    assert (spec.lower, spec.upper, spec.integer) == (0.0, 1.0, True) and target_kind(res.schema) == "binary"
    assert any("read as the classes 0 and 1" in note for note in res.notes)


def test_count_target_with_a_thin_grid_is_the_public_count_range(monkeypatch: pytest.MonkeyPatch) -> None:
    """With count_target (--model poisson) a numeric target whose noisy grid shows only the bin of
    zero (or nothing) is the count [0, 1e9] by a public rule instead of a refusal; a grid that
    shows a range gives the usual bounds (post-processing only; the noise is the identity)."""
    identity_noise(monkeypatch)
    t = _binary_table(400, 3)  # 397 zeros, 3 ones: the ones' bin stays below the floor
    with pytest.raises(DataError, match="constant"):
        estimate_schema(t, noise_multiplier=5.0, target="y", delta=1e-6, target_share=None)
    res = estimate_schema(t, noise_multiplier=5.0, target="y", delta=1e-6, target_share=None, count_target=True)
    spec = res.schema.column("y")
    assert (spec.lower, spec.upper, spec.integer) == (0.0, schema_post.GRID_LIMIT, True)
    assert target_kind(res.schema) == "count"
    assert any("count target, bounds [0, 1e+09]" in note and "constant" in note for note in res.notes)
    # A grid that shows the counts' range keeps the bounds read off it.
    rng = np.random.default_rng(2)
    wide = table({"x": [f"{v:.3f}" for v in rng.normal(size=3000)], "y": [str(v) for v in rng.poisson(20.0, 3000)]})
    spec = estimate_schema(wide, noise_multiplier=0.5, target="y", delta=1e-6, count_target=True).schema.column("y")
    assert spec.integer and spec.lower <= 10.0 and 20.0 <= spec.upper < 1e3


def test_count_target_reaches_the_schema_mechanism() -> None:
    mech = preprocess.SchemaMechanism.plan(["x", "y"], noise_multiplier=2.0, target="y", delta=1e-6,
                                           count_target=True)
    assert mech.count_target and not preprocess.SchemaMechanism.plan(
        ["x", "y"], noise_multiplier=2.0, target="y", delta=1e-6).count_target


def test_target_classes_caps_categorical_target(monkeypatch: pytest.MonkeyPatch) -> None:
    identity_noise(monkeypatch)
    n = 3000
    y = ["yes"] * 1500 + ["no"] * 1400 + ["maybe"] * 100
    rng = np.random.default_rng(1)
    t = table({"x": [f"{v:.3f}" for v in rng.normal(size=n)], "y": y})
    res = estimate_schema(t, noise_multiplier=0.5, target="y", delta=1e-6, target_classes=2)
    spec = next(c for c in res.schema.columns if c.name == "y")
    assert spec.categories == ["no", "yes"]
    with pytest.raises(ValueError):
        estimate_schema(t, noise_multiplier=0.5, target="y", delta=1e-6, target_classes=1)


def test_binary_numeric_target_counts_other_integers() -> None:
    """The 0/1 rule's note counts, from the released grid, the other integer values (whose
    records the transform drops), summing only bins that can hold an integer (public structure)."""
    holds = [schema_post._bin_edges(k) for k in range(NUM_GRID_BINS) if schema_post._INTEGER_BINS[k]]
    assert (0.0, 0.0) in holds and (0.5, 1.0) in holds and (-1.0, -0.5) in holds
    assert (0.0, 1e-4) not in holds and (-1e-4, 0.0) not in holds
    assert schema_post._bin_edges(schema_post.ONE_BIN) == (0.5, 1.0)
    grid = np.zeros(NUM_GRID_BINS)
    near_zero, two_bin = int(np.searchsorted(schema_post.GRID_EDGES, 1e-4)), int(np.searchsorted(schema_post.GRID_EDGES, 2.0))
    grid[[NUM_GRID_BINS - 1, schema_post.ONE_BIN, near_zero, two_bin]] = [100.0, 80.0, 90.0, 700.0]
    n_integer_bins = int(schema_post._INTEGER_BINS.sum()) - 2
    spec, why = schema_post._binary_numeric_target("y", grid, noise_sd=700.0 / math.sqrt(n_integer_bins))
    assert spec is not None and (spec.lower, spec.upper, spec.integer) == (0.0, 1.0, True)
    assert "about 700 other integers" in why  # the (1, 2] bin; the non-integer (0, 1e-4] bin is not summed
    # 700 is one sd of the sum above; at 4.1 sds it is clearly not noise: not coded 0/1, no spec.
    spec, why = schema_post._binary_numeric_target("y", grid, noise_sd=700.0 / 4.1 / math.sqrt(n_integer_bins))
    assert spec is None and "other integers" in why


def test_target_coded_one_two_is_refused_for_logistic(monkeypatch: pytest.MonkeyPatch) -> None:
    """A 1/2-coded target under --model logistic is refused (decided on the released grid), naming
    --positive-class, rather than read as 0/1 with half its records dropped."""
    identity_noise(monkeypatch)
    rng = np.random.default_rng(5)
    t = table({"x": [f"{v:.3f}" for v in rng.normal(size=2000)], "y": ["1"] * 1200 + ["2"] * 800})
    with pytest.raises(DataError, match="positive-class"):
        estimate_schema(t, noise_multiplier=2.0, target="y", delta=1e-6, target_share=None, target_classes=2)


def _rare_class_table(n: int, rare: int) -> RawTable:
    rng = np.random.default_rng(3)
    return table({"x": [f"{v:.3f}" for v in rng.normal(size=n)], "y": ["yes"] * rare + ["no"] * (n - rare)})


def test_rare_second_class_becomes_one_vs_rest(monkeypatch: pytest.MonkeyPatch) -> None:
    """A categorical target whose rare class misses the noisy threshold (3% positives at a small
    schema share) is released as 'no' against every other value, not refused; decided on the
    released counts only (here exact: the noise is replaced by the identity)."""
    identity_noise(monkeypatch)
    mech = preprocess.SchemaMechanism.plan(["x", "y"], noise_multiplier=20.0, target="y", delta=1e-9,
                                           target_classes=2, target_share=None)
    s, tau = mech.raw_std("y"), mech.threshold("y")
    rare = int(math.ceil(schema_post.ONE_VS_REST_SDS * math.sqrt(2.0) * s)) + 5
    assert rare < tau  # the rare class cannot pass the threshold, yet is well above the noise
    res = estimate_schema(_rare_class_table(4000, rare), noise_multiplier=20.0, target="y", delta=1e-9,
                          target_share=None, target_classes=2)
    spec = res.schema.column("y")
    assert spec.categories == ["no"] and spec.other_class and target_kind(res.schema) == "binary"
    assert any("one-vs-rest" in note for note in res.notes)
    tf = Transform.from_schema(res.schema)
    assert tf.positive_class == "any value other than 'no'"
    y, valid = tf._target(np.array(["no", "yes", "maybe"], dtype=object), True)
    assert y.tolist() == [0.0, 1.0, 1.0] and valid.all()
    with pytest.raises(DataError, match="missing value"):  # only a missing field is invalid
        tf._target(np.array(["no", ""], dtype=object), True)


def test_one_vs_rest_needs_a_rest_above_the_noise(monkeypatch: pytest.MonkeyPatch) -> None:
    """A rest within three sds of the noise on the difference stays a single class (refused)."""
    identity_noise(monkeypatch)
    mech = preprocess.SchemaMechanism.plan(["x", "y"], noise_multiplier=20.0, target="y", delta=1e-9,
                                           target_classes=2, target_share=None)
    rare = int(schema_post.ONE_VS_REST_SDS * math.sqrt(2.0) * mech.raw_std("y")) - 2
    with pytest.raises(DataError, match="single class"):
        estimate_schema(_rare_class_table(4000, rare), noise_multiplier=20.0, target="y", delta=1e-9,
                        target_share=None, target_classes=2)


def _public_target() -> Any:
    from dpsummary.data import ColumnSpec

    return ColumnSpec(name="y", kind="categorical", categories=["yes"], other_class=True, positive="yes")


def test_public_target_is_never_counted(monkeypatch: pytest.MonkeyPatch) -> None:
    """``--positive-class``: the target column is left out of the mechanism. The noised vector
    is the one of the table without it (whatever the target holds: neighbours differing only
    there release the same distribution), one record touches 2 (C - 1) coordinates, every
    column gets the same scale, and the schema carries the public spec in header position."""
    calls = identity_noise(monkeypatch)
    t = synthetic(600)
    spec = _public_target()
    res = estimate_schema(t, noise_multiplier=2.0, target="y", delta=1e-6, public_target=spec)
    without = table({c: t.columns[c] for c in t.header if c != "y"})
    vec = build_count_vector(without)
    (call,) = calls
    assert vec.touches == 2 * (len(t.header) - 1)
    np.testing.assert_array_equal(call["values"], vec.counts * vec.scale)
    assert res.schema.names == t.header and res.schema.target == "y"
    assert res.schema.column("y") == spec and target_kind(res.schema) == "binary"
    assert any("public (--positive-class)" in note for note in res.notes)
    assert not any(note.startswith("y:") for note in res.notes)  # nothing estimated about y
    # The target's content cannot change what is noised: a constant, or an unseen label.
    for values in (["yes"] * 600, ["no"] * 600, ["maybe"] * 599 + [""]):
        other = table({**t.columns, "y": values})
        estimate_schema(other, noise_multiplier=2.0, target="y", delta=1e-6, public_target=spec)
        np.testing.assert_array_equal(calls[-1]["values"], call["values"])
    # The threshold is delta over the C - 1 estimated columns.
    mech = preprocess.SchemaMechanism.plan(t.header, noise_multiplier=2.0, target="y", delta=1e-6,
                                           public_target=spec)
    assert mech.estimated == ("age", "x", "colour")
    assert mech.threshold("colour") == selection_threshold(2.0 / vec.scale, 1e-6 / 3)


def test_public_target_streaming_equals_in_memory(monkeypatch: pytest.MonkeyPatch) -> None:
    """The local engine's streamed counts give the same release as the in-memory table."""
    import pyarrow as pa

    from dpsummary.data import text_column

    identity_noise(monkeypatch)
    t = synthetic(400, seed=2)
    counts = preprocess.SchemaCounts(t.header)
    for name in t.header:
        counts.add(name, text_column(pa.array(t.columns[name]))[0])
    spec = _public_target()
    a = estimate_schema(t, noise_multiplier=2.0, target="y", delta=1e-6, public_target=spec)
    b = estimate_schema(counts, noise_multiplier=2.0, target="y", delta=1e-6, public_target=spec)
    assert a.schema == b.schema and a.notes == b.notes


def test_public_target_must_be_the_target() -> None:
    with pytest.raises(ValueError, match="target column"):
        preprocess.SchemaMechanism.plan(["x", "y", "z"], noise_multiplier=2.0, target="z", delta=1e-6,
                                        public_target=_public_target())
    with pytest.raises(DataError, match="no feature column"):
        preprocess.SchemaMechanism.plan(["y"], noise_multiplier=2.0, target="y", delta=1e-6,
                                        public_target=_public_target())


def test_logistic_numeric_target_is_integer_whatever_the_fraction_noise() -> None:
    """With a public class count (--model logistic) a numeric target holds class codes: its
    noisy non-integer count (here well above 3 sds, as the noise can make it) does not turn it
    'real'; without the class count the same counts do."""
    from dpsummary.postprocess.schema import ReleasedColumn, schema_from_release

    grid = np.zeros(NUM_GRID_BINS)
    grid[NUM_GRID_BINS - 1] = 14000.0  # exact zero
    grid[int(np.searchsorted(GRID_EDGES, 1.0))] = 18000.0  # the bin (0.5, 1]
    s = 400.0
    target = ReleasedColumn(type_counts={"missing": 0.0, "text": 0.0, "integer": 32000.0, "fraction": 2000.0},
                            grid=grid, values=[], raw_noise_std=s)
    feature = ReleasedColumn(type_counts={"missing": 0.0, "text": 0.0, "integer": 0.0, "fraction": 32000.0},
                             grid=np.where(np.arange(NUM_GRID_BINS) == 20, 32000.0, 0.0), values=[], raw_noise_std=s)
    common = dict(target="y", events=[], noise_multiplier=1.0, delta=1e-9, touches=4, target_share=None,
                  feature_threshold=10.0, max_categories=50)
    res = schema_from_release({"x": feature, "y": target}, target_classes=2, **common)
    spec = res.schema.column("y")
    assert spec.integer and (spec.lower, spec.upper) == (0.0, 1.0) and target_kind(res.schema) == "binary"
    res_free = schema_from_release({"x": feature, "y": target}, target_classes=None, **common)
    assert not res_free.schema.column("y").integer


def test_a_bound_set_by_a_lone_marginal_grid_bin_is_flagged_not_dropped() -> None:
    """Zero configuration's feature bounds keep every bin above the threshold (dropping lone bins
    clipped real columns: noise_aware_variants.md, sixteenth and seventeenth rules), but a bound
    set by one bin alone in its decade, within one noise sd of the threshold, that widens the box
    more than 10x (a false bin's profile) carries a warning naming the fix; a real 0/1 column, a
    zero-inflated column and a lone bin well above the threshold do not."""
    from dpsummary.postprocess.schema import ZERO_BIN, _numeric_spec

    one = int(np.searchsorted(GRID_EDGES, 1.0))  # the bin (0.5, 1]
    far = int(np.searchsorted(GRID_EDGES, 1e8))  # the bin (5e7, 1e8]
    floor, sd = 40.0, 10.0
    grid = np.zeros(NUM_GRID_BINS)
    grid[ZERO_BIN], grid[one] = 1500.0, 1000.0
    spec, note = _numeric_spec("b", grid, floor, True, full_range=False, noise_sd=sd)
    assert spec is not None and (spec.lower, spec.upper) == (0.0, 1.0) and "warning" not in note
    grid[far] = floor + 0.5 * sd  # just over the threshold, over 1% of the mass, alone
    spec, note = _numeric_spec("b", grid, floor, True, full_range=False, noise_sd=sd)
    assert spec is not None and spec.upper == 1e8  # kept: the release does not drop it
    assert "warning: its upper bound" in note and "declare the column's bounds" in note
    grid[far] = floor + 3 * sd  # clearly above the threshold: a real bin, no warning
    assert "warning" not in _numeric_spec("b", grid, floor, True, full_range=False, noise_sd=sd)[1]
    zeros = np.zeros(NUM_GRID_BINS)  # a zero-inflated column: exact zeros and values 100-2000
    zeros[ZERO_BIN] = floor + 0.5 * sd
    for edge in (200.0, 500.0, 1000.0, 2000.0):
        zeros[int(np.searchsorted(GRID_EDGES, edge))] = 2000.0
    assert "warning" not in _numeric_spec("z", zeros, floor, False, full_range=False, noise_sd=sd)[1]


def test_a_target_range_set_by_a_false_bin_profile_is_read_off_the_next_bin() -> None:
    """Issue 51 (sim_linear_heavy, zero configuration, epsilon 0.1): the target's range is read off
    its lowest and highest surviving bins, and one false bin far out put every residual into a
    sliver of model space (coefficient sds 10^7 times the full data's). A bin with a false bin's
    profile (alone in its decade, within one noise sd of the threshold, widening the range more
    than 10x) is left out of the TARGET's range and the note says so; a far bin clearly above the
    threshold, and a near one, are kept."""
    from dpsummary.postprocess.schema import _numeric_spec

    floor, sd = 40.0, 10.0
    grid = np.zeros(NUM_GRID_BINS)
    for edge in (-5.0, -2.0, -1.0, 1.0, 2.0, 5.0):
        grid[int(np.searchsorted(GRID_EDGES, edge))] = 3000.0
    spec, note = _numeric_spec("y", grid, floor, False, full_range=True, noise_sd=sd)
    assert spec is not None and (spec.lower, spec.upper) == (-10.0, 5.0)  # [-5, -2) reaches down to -10's edge
    far = int(np.searchsorted(GRID_EDGES, 1e8))
    grid[far] = floor + 0.5 * sd
    spec, note = _numeric_spec("y", grid, floor, False, full_range=True, noise_sd=sd)
    assert spec is not None and spec.upper == 5.0 and "upper surviving bin was left out" in note
    grid[far] = floor + 3 * sd  # clearly above the threshold: real values, kept
    spec, note = _numeric_spec("y", grid, floor, False, full_range=True, noise_sd=sd)
    assert spec is not None and spec.upper == 1e8 and "left out" not in note
    grid[far] = 0.0
    grid[int(np.searchsorted(GRID_EDGES, 10.0))] = floor + 0.5 * sd  # next to the data: kept
    spec, note = _numeric_spec("y", grid, floor, False, full_range=True, noise_sd=sd)
    assert spec is not None and spec.upper == 10.0 and "left out" not in note


def test_no_feature_refusal_names_the_public_noise_sd(monkeypatch: pytest.MonkeyPatch) -> None:
    """When no feature survives, the refusal gives one count's noise sd (public: epsilon, delta and
    the number of columns fix it) and both fixes; nothing read off the data."""
    identity_noise(monkeypatch)  # noiseless counts of 400 rows, all far below the thresholds below
    t = synthetic(400, seed=2)
    spec = _public_target()
    mech = preprocess.SchemaMechanism.plan(t.header, noise_multiplier=1e5, target="y", delta=1e-6, public_target=spec)
    sd = max(mech.raw_std(c) for c in mech.estimated)
    with pytest.raises(DataError) as caught:
        estimate_schema(t, noise_multiplier=1e5, target="y", delta=1e-6, public_target=spec)
    assert f"noise sd about {sd:,.0f} records" in caught.value.problem
    assert "public schema" in (caught.value.fix or "") and "raise --epsilon" in (caught.value.fix or "")
