"""Stage 1's DP schema on Spark (issue 35, weakness 1): the value keys are aggregated, noised and
thresholded on the executors, and the driver receives only the fixed-size sections and the keys
that passed; the release is the local engine's mechanism (same counts, same noise scale, same
threshold, same post-processing)."""

from __future__ import annotations

from pathlib import Path
from typing import Any

import numpy as np
import pyarrow as pa
import pytest
from spark_helpers import Recorder, write_parquet, write_split

from dpsummary.data import NO_TARGET, ColumnSpec, text_column
from dpsummary.private import preprocess, spark_engine
from dpsummary.private.preprocess import (
    SchemaCounts,
    SchemaMechanism,
    column_counts,
    estimate_schema,
)
from dpsummary.private.spark_engine import (
    GRID,
    READ,
    SELECTED_SCHEMA,
    TYPE,
    VALUE,
    SparkSource,
    ValueSelection,
    release_selected,
)
from dpsummary.spark.session import private_dir

pytestmark = pytest.mark.filterwarnings("ignore::FutureWarning")


def _identity_noise(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setattr(preprocess, "add_gaussian_noise",
                        lambda values, *, noise_std, clip_norm: np.asarray(values, dtype=np.float64))


def _id_table(n: int, seed: int) -> pa.Table:
    """A unique ID per record, a 3-value category, integers 1..10 and a binary target."""
    rng = np.random.default_rng(seed)
    return pa.table({
        "id": [f"u{seed}-{i:07d}" for i in range(n)],
        "colour": rng.choice(["red", "green", "blue"], n).tolist(),
        "x": rng.integers(1, 11, n),
        "y": rng.choice(["no", "yes"], n).tolist(),
    })


def _aggregated_batches(counts: SchemaCounts, read: int, parts: int) -> list[list[pa.RecordBatch]]:
    """The rows of Spark's aggregated stage-1 frame (each key once, its total), dealt round-robin
    into ``parts`` partitions of small batches, as :class:`ValueSelection` receives them."""
    rows: list[tuple[int, int, str, int]] = [(-1, READ, "", read)]
    for i, name in enumerate(counts.header):
        rows += [(i, TYPE, str(b), int(c)) for b, c in enumerate(counts._types[name]) if c]
        rows += [(i, GRID, str(b), int(c)) for b, c in enumerate(counts._grid[name]) if c]
        rows += [(i, VALUE, v, c) for v, c in counts._values[name].items()]
    out = []
    for p in range(parts):
        mine = rows[p::parts]
        batches = []
        for a in range(0, len(mine), 7):
            chunk = mine[a:a + 7]
            batches.append(pa.RecordBatch.from_arrays(
                [pa.array([r[0] for r in chunk], pa.int32()), pa.array([r[1] for r in chunk], pa.int32()),
                 pa.array([r[2] for r in chunk], pa.string()), pa.array([r[3] for r in chunk], pa.int64())],
                names=["col", "section", "label", "count"]))
        out.append(batches)
    return out


@pytest.mark.parametrize(("target", "target_classes", "public"),
                         [("y", None, False), (NO_TARGET, None, False), ("colour", 2, False), ("y", 2, True)])
def test_distributed_selection_is_the_local_mechanism(monkeypatch: pytest.MonkeyPatch, target: str,
                                                      target_classes: int | None, public: bool) -> None:
    """With the noise replaced by the identity (in-process, so the executor function sees it):
    the executor-side selection over any partitioning plus the driver's part give exactly the
    local engine's release (schema, notes, noisy record count), and the only value keys that
    leave the executors are those above their column's threshold, at most ``keep`` per column
    and partition."""
    _identity_noise(monkeypatch)
    rng = np.random.default_rng(3)
    n = 1200
    cols = {
        "id": [f"id{i}" for i in range(n)],
        "cat": [f"c{k}" for k in rng.integers(0, 8, n)],  # 8 frequent values, max_categories 3
        "colour": rng.choice(["red", "green", "blue"], n, p=[0.5, 0.3, 0.2]).tolist(),
        "x": [f"{v:.2f}" for v in rng.normal(5, 2, n)],
        "y": rng.choice(["no", "yes"], n).tolist(),
    }
    counts = SchemaCounts(list(cols))
    for name, values in cols.items():
        counts.add(name, text_column(pa.array(values))[0])
    share = None if target_classes is not None else preprocess.DEFAULT_TARGET_SHARE
    # A public target (--positive-class): its column is left out on both engines.
    spec = ColumnSpec(name="y", kind="categorical", categories=["yes"], other_class=True,
                      positive="yes") if public else None
    want = estimate_schema(counts, noise_multiplier=0.7, target=target, delta=1e-6, max_categories=3,
                           target_classes=target_classes, target_share=share, public_target=spec)
    mech = SchemaMechanism.plan(list(cols), noise_multiplier=0.7, target=target, delta=1e-6, max_categories=3,
                                target_classes=target_classes, target_share=share, public_target=spec)
    for parts in (1, 3):
        sent: list[dict[str, Any]] = []
        for batches in _aggregated_batches(counts, n, parts):
            for out in ValueSelection(mech)(iter(batches)):
                sent += out.to_pylist()
        read, got = release_selected(mech, sent)
        assert read == n
        assert got.schema == want.schema and got.notes == want.notes and got.dropped == want.dropped
        assert got.noisy_num_records == want.noisy_num_records
        values = [r for r in sent if r["section"] == VALUE]
        if public:  # the public target's values are never noised or sent
            assert want.schema.column("y") == spec and not any(r["col"] == 4 for r in values)
        assert not any(r["label"].startswith("id") for r in values)  # count 1 < tau: never sent
        assert all(r["count"] is None and r["noisy"] > mech.threshold(mech.header[r["col"]]) for r in values)
        per_col = {c: sum(r["col"] == c for r in values) for c in range(len(cols))}
        # 8 frequent values pass; at most keep = 4 of them leave each partition
        assert per_col[1] == mech.keep if parts == 1 else mech.keep < per_col[1] <= min(8, mech.keep * parts)
        fixed = [r for r in sent if r["section"] != VALUE]
        assert all(r["noisy"] is None for r in fixed) and len(fixed) <= 1 + len(cols) * 87


def test_column_counts_are_schema_counts() -> None:
    """The Spark pass's per-batch counter is the local scan's (one function)."""
    arr = text_column(pa.array(["1", "2.5", "", "a", "a", "b", None, "nan"]))[0]
    types, grid, distinct, counts = column_counts(arr)
    assert types.tolist() == [2, 4, 1, 1] and int(grid.sum()) == 2  # missing, text, integer, fraction
    assert dict(zip(distinct.to_pylist(), counts.tolist(), strict=True)) == {"a": 2, "b": 1, "nan": 1}


@pytest.fixture()
def scratch() -> Any:
    import shutil

    path = private_dir()
    yield path
    shutil.rmtree(path, ignore_errors=True)


def test_spark_schema_with_an_id_column_sends_no_unreleased_value(spark: Any, tmp_path: Path, scratch: Path,
                                                                  monkeypatch: pytest.MonkeyPatch) -> None:
    """A zero-configuration schema on a table with a unique-ID column: Spark's release equals the
    local engine's (real noise; the margins make the outcome certain up to ~1e-6), the ID
    column is dropped on both, and no ID value reaches the driver: what the driver collects is
    the fixed-size sections plus value keys that passed the threshold, none of them an ID."""
    tbl = _id_table(3000, 5)
    single = write_parquet(tmp_path / "one.parquet", tbl)
    write_split(tmp_path / "split", tbl, parts=3)
    from dpsummary.private.source import PrivateSource

    with PrivateSource.open(single) as local:
        want = local.estimate_schema(noise_multiplier=1.0, target="y", delta=1e-6)
    assert want.dropped == ["id"]
    received: list[list[Any]] = []
    real = spark_engine._collect_rows

    def spy(df: Any) -> list[Any]:
        rows = real(df)
        received.append(rows)
        return rows

    monkeypatch.setattr(spark_engine, "_collect_rows", spy)
    for location in (single, tmp_path / "split"):
        src = SparkSource(spark, location, scratch, steps=1, randomness=Recorder(), partitions=5)
        got = src.estimate_schema(noise_multiplier=1.0, target="y", delta=1e-6)
        assert got.schema == want.schema and got.dropped == want.dropped
        assert abs(got.noisy_num_records - 3000) < 30
        assert src._rows == 3000  # stage 1's exact count comes with the same pass
        (rows,) = received[-1:]
        values = [r for r in rows if r["section"] == VALUE]
        assert {r["label"] for r in values} == {"red", "green", "blue", "no", "yes"}
        assert all(r["count"] is None for r in values)
        assert len(rows) - len(values) <= 1 + 4 * 87
        ids = set(tbl.column("id").to_pylist())
        assert not any(r["label"] in ids for r in rows)


def test_executor_noise_has_the_columns_public_scale(spark: Any, tmp_path: Path, scratch: Path) -> None:
    """The value keys' noise drawn on the executors has each column's raw std
    (``noise_multiplier / scale_c``): 120 keys of count 60 each, all above tau. Bounds hold
    except with probability far below 1e-9 (chi-square with 119 degrees of freedom)."""
    n_keys, per_key = 120, 60
    labels = [f"k{i:03d}" for i in range(n_keys) for _ in range(per_key)]
    tbl = pa.table({"v": labels, "y": (["a", "b"] * (len(labels) // 2))})
    path = write_parquet(tmp_path / "keys.parquet", tbl)
    src = SparkSource(spark, path, scratch, steps=1, randomness=Recorder(), partitions=3)
    mech = SchemaMechanism.plan(["v", "y"], noise_multiplier=2.0, target="y", delta=1e-6, max_categories=500)
    assert mech.threshold("v") < per_key - 6 * mech.raw_std("v")
    rows = spark_engine._collect_rows(src._stage1_totals().mapInArrow(ValueSelection(mech), SELECTED_SCHEMA))
    noisy = np.array([r["noisy"] for r in rows if r["section"] == VALUE and r["col"] == 0])
    assert noisy.shape == (n_keys,)
    resid = (noisy - per_key) / mech.raw_std("v")
    assert 0.5 < float(resid.std(ddof=1)) < 1.6
    assert abs(float(resid.mean())) < 0.6
