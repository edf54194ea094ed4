"""The Spark engine against the local engine: bit-identical exact sums under different
partitionings (same recorded randomness, same PRF key), Binomial(N, q) batches under Spark, and
the gray-box neighbouring replay."""

from __future__ import annotations

import shutil
from pathlib import Path
from typing import Any

import numpy as np
import pyarrow as pa
import pytest
import torch
from scipy import stats
from spark_helpers import SCHEMA, Recorder, local_encoded, table, write_parquet, write_split

from dpsummary.data import Transform
from dpsummary.models import LogisticRegression
from dpsummary.private import kernel
from dpsummary.private.mechanism import PrivateRecords
from dpsummary.private.noise import quantize_sample_rate
from dpsummary.private.prf import StepCoins
from dpsummary.private.spark_engine import SparkSource
from dpsummary.spark.session import private_dir

pytestmark = pytest.mark.filterwarnings("ignore::FutureWarning")

N = 3000
STEPS = 8
TF = Transform.from_schema(SCHEMA)
MODEL = LogisticRegression(TF.num_features)
KEY = bytes(range(100, 132))


_SCRATCH: list[Path] = []


def _scratch() -> Path:
    """A private directory for one SparkSource (step files), removed after the module."""
    _SCRATCH.append(private_dir())
    return _SCRATCH[-1]


@pytest.fixture(scope="module", autouse=True)
def _remove_scratch() -> Any:
    yield
    for path in _SCRATCH:
        shutil.rmtree(path, ignore_errors=True)


@pytest.fixture(scope="module")
def data(tmp_path_factory: pytest.TempPathFactory) -> dict[str, Any]:
    root = tmp_path_factory.mktemp("spark-data")
    tbl = table(N)
    single = write_parquet(root / "one.parquet", tbl)
    split = write_split(root / "split", tbl)
    return {"table": tbl, "single": single, "split_dir": root / "split", "split": split}


def _source(spark: Any, location: Path, recorder: Recorder, *, coins: StepCoins | None = None,
            partitions: int | None = None, max_bytes: int | None = None) -> SparkSource:
    if max_bytes is not None:
        spark.conf.set("spark.sql.files.maxPartitionBytes", str(max_bytes))
    try:
        src = SparkSource(spark, location, _scratch(), steps=STEPS, randomness=recorder, coins=coins,
                          partitions=partitions)
        if partitions is not None or max_bytes is not None:
            assert src._df.rdd.getNumPartitions() > 2  # really another partitioning
        return src
    finally:
        spark.conf.unset("spark.sql.files.maxPartitionBytes")


def _draws(seed: int) -> torch.Tensor:
    return MODEL.sample_prior(12, torch.Generator().manual_seed(seed))


PARTITIONINGS = [("single", None, None), ("split", 5, None), ("split", None, 2048)]


@pytest.mark.parametrize(("which", "partitions", "max_bytes"), PARTITIONINGS)
def test_score_sums_bit_identical_to_local(spark: Any, data: dict[str, Any], which: str, partitions: int | None,
                                           max_bytes: int | None) -> None:
    files = [data["single"]] if which == "single" else data["split"]
    location = data["single"] if which == "single" else data["split_dir"]
    rows, _ = local_encoded(files, TF)
    theta = _draws(1)[0]
    bounds = {"score_bound": 3.0, "curvature_bound": 2.5}
    local, remote = Recorder(), Recorder()
    PrivateRecords(rows, randomness=local).noisy_score_statistics(
        MODEL, theta, **bounds, score_noise_multiplier=1.0, curvature_noise_multiplier=1.0)
    enc = _source(spark, location, remote, partitions=partitions, max_bytes=max_bytes).encode(
        TF, missing_numeric="impute", unseen_category="other")
    enc.noisy_score_statistics(MODEL, theta, **bounds, score_noise_multiplier=1.0, curvature_noise_multiplier=1.0)
    assert len(local.inputs) == len(remote.inputs) == 2
    for a, b in zip(local.inputs, remote.inputs, strict=True):
        assert a.dtype == b.dtype and np.array_equal(a, b)  # bit-identical pre-noise sums
    exact = kernel.score_partial(rows, MODEL, theta, **bounds)
    totals = enc.records.score_totals(MODEL, theta, **bounds)
    assert list(totals.score) == list(exact.score) and list(totals.curvature) == list(exact.curvature)


def test_linear_releases_bit_identical_to_local(spark: Any, data: dict[str, Any]) -> None:
    """Linear regression's two releases (issue 51: the moment matrix, then the anchored residual
    vector) give bit-identical pre-noise sums on Spark (5 partitions) and locally."""
    rows, _ = local_encoded(data["split"], TF)
    anchor = torch.tensor([0.1, -0.2, 0.3, 0.0, 0.1], dtype=torch.float64)  # w = [1, x1, x2 one-hot]
    rule = {"residual_clip": 0.5, "residual_range": 2.0, "square_scale": 3.0}
    local, remote = Recorder(), Recorder()
    mine = PrivateRecords(rows, randomness=local)
    mine.noisy_moment_matrix(bound=5.0, noise_multiplier=1.0)
    mine.noisy_residual_vector(bound=3.0, noise_multiplier=1.0, anchor=anchor, **rule)
    enc = _source(spark, data["split_dir"], remote, partitions=5).encode(
        TF, missing_numeric="impute", unseen_category="other")
    enc.noisy_moment_matrix(bound=5.0, noise_multiplier=1.0)
    enc.noisy_residual_vector(bound=3.0, noise_multiplier=1.0, anchor=anchor, **rule)
    assert len(local.inputs) == len(remote.inputs) == 2
    for a, b in zip(local.inputs, remote.inputs, strict=True):
        assert a.dtype == b.dtype and np.array_equal(a, b)
    exact = kernel.finish(kernel.residual_partial(rows, bound=3.0, anchor=anchor, **rule), 3.0)
    assert np.array_equal(local.inputs[1], exact)


@pytest.mark.parametrize(("which", "partitions", "max_bytes"), PARTITIONINGS)
def test_dppsvi_steps_bit_identical_to_local(spark: Any, data: dict[str, Any], which: str, partitions: int | None,
                                            max_bytes: int | None) -> None:
    files = [data["single"]] if which == "single" else data["split"]
    location = data["single"] if which == "single" else data["split_dir"]
    q = quantize_sample_rate(0.2)
    coins = StepCoins(q, STEPS, KEY)
    rows, ids = local_encoded(files, TF)
    samples = [np.flatnonzero(coins.mask(ids, t)) for t in range(STEPS)]
    local, remote = Recorder(samples), Recorder()
    local_records = PrivateRecords(rows, randomness=local)
    src = _source(spark, location, remote, coins=coins, partitions=partitions, max_bytes=max_bytes)
    remote_records = src.encode(TF, missing_numeric="impute", unseen_category="other").records
    for t in range(STEPS):
        theta = _draws(10 + t)
        for recs in (local_records, remote_records):
            recs.noisy_clipped_sum(MODEL, theta, sample_rate=q, clip_norm=1.5, noise_multiplier=1.0)
    assert len(local.inputs) == len(remote.inputs) == STEPS
    for a, b in zip(local.inputs, remote.inputs, strict=True):
        assert np.array_equal(a, b)
    assert sum(bool(np.any(a != 0)) for a in local.inputs) == STEPS  # every batch non-empty
    with pytest.raises(Exception, match="more steps"):
        remote_records.noisy_clipped_sum(MODEL, _draws(0), sample_rate=q, clip_norm=1.5, noise_multiplier=1.0)


def test_spark_step_batches_are_binomial(spark: Any, tmp_path: Path) -> None:
    """Batch sizes of 120 steps over 2,000 clean rows at q = 0.05 against Binomial(2000, q):
    chi-square test at level 1e-4 (fixed key: deterministic)."""
    n, steps = 2000, 120
    path = write_parquet(tmp_path / "clean.parquet", table(n, 3, dirty=False))
    q = quantize_sample_rate(0.05)
    src = SparkSource(spark, path, _scratch(), steps=steps, randomness=Recorder(),
                      coins=StepCoins(q, steps, KEY[::-1]), partitions=3)
    records = src.encode(TF, missing_numeric="impute", unseen_category="other").records
    # Small output files: a step may then span several files (kept exact, <step>-<seq>.arrow).
    spark.conf.set("spark.sql.files.maxRecordsPerFile", "37")
    try:
        records._materialise(q)
    finally:
        spark.conf.unset("spark.sql.files.maxRecordsPerFile")
    sizes = np.array([records.step_rows(t).shape[0] for t in range(steps)])
    # Exactly the PRF's batches (the file's row ids are 0..n-1 of file 0).
    _, local_steps = StepCoins(q, steps, KEY[::-1]).membership(np.arange(n))
    assert np.array_equal(sizes, np.bincount(local_steps, minlength=steps))
    k = np.arange(n + 1)
    lo, hi = int(stats.binom.ppf(1e-3, n, q)), int(stats.binom.ppf(1 - 1e-3, n, q))
    edges = np.unique(np.concatenate([[0], np.linspace(lo, hi, 9).astype(int), [n + 1]]))
    expected = np.array([stats.binom.pmf(k[a:b], n, q).sum() for a, b in zip(edges[:-1], edges[1:], strict=True)])
    observed = np.array([((sizes >= a) & (sizes < b)).sum() for a, b in zip(edges[:-1], edges[1:], strict=True)])
    merged_e, merged_o, acc_e, acc_o = [], [], 0.0, 0.0
    for e, o in zip(expected * steps, observed, strict=True):
        acc_e, acc_o = acc_e + e, acc_o + o
        if acc_e >= 5:
            merged_e.append(acc_e)
            merged_o.append(acc_o)
            acc_e = acc_o = 0.0
    merged_e[-1] += acc_e
    merged_o[-1] += acc_o
    e_arr, o_arr = np.array(merged_e), np.array(merged_o)
    p = stats.chi2.sf(float(((o_arr - e_arr) ** 2 / e_arr).sum()), df=len(e_arr) - 1)
    assert p > 1e-4
    assert abs(sizes.mean() - n * q) < 6 * np.sqrt(n * q * (1 - q) / steps)


def test_gray_box_neighbouring_replay(spark: Any, tmp_path: Path) -> None:
    """D and D + one record (appended: every other row keeps its id, hence its coins), identical
    recorded randomness: the same calls with the same shapes, and every pre-noise sum moves by
    at most its clip norm (DP-PSVI steps and a noise-aware round)."""
    base = table(600, 5, dirty=True)
    canary = pa.table({"x1": ["10"], "x2": ["c"], "y": ["yes"]})
    d0 = write_parquet(tmp_path / "d0.parquet", base)
    d1 = write_parquet(tmp_path / "d1.parquet", pa.concat_tables([base, canary]))
    q = quantize_sample_rate(0.5)
    coins = StepCoins(q, STEPS, KEY)
    recs, recorders = [], []
    for path in (d0, d1):
        rec = Recorder()
        src = SparkSource(spark, path, _scratch(), steps=STEPS, randomness=rec, coins=coins, partitions=2)
        recs.append(src.encode(TF, missing_numeric="impute", unseen_category="other"))
        recorders.append(rec)
    clip = 0.8
    for t in range(STEPS):
        theta = _draws(50 + t)
        for enc in recs:
            enc.records.noisy_clipped_sum(MODEL, theta, sample_rate=q, clip_norm=clip, noise_multiplier=1.0)
    bounds = {"score_bound": 2.0, "curvature_bound": 1.5}
    for enc in recs:
        enc.noisy_score_statistics(MODEL, _draws(99)[0], **bounds, score_noise_multiplier=1.0,
                                   curvature_noise_multiplier=1.0)
    a, b = recorders
    assert [x.shape for x in a.inputs] == [x.shape for x in b.inputs] and len(a.inputs) == STEPS + 2
    moved = [float(np.linalg.norm(x - y)) for x, y in zip(a.inputs, b.inputs, strict=True)]
    # DP-PSVI releases each step's sum in units of its clip norm (records clip(v / C, 1)):
    # neighbouring pre-noise inputs differ by at most 1 in those units, i.e. by C.
    assert all(m <= 1.0 for m in moved[:STEPS])
    assert any(m > 0 for m in moved[:STEPS])  # the canary is in some step (fixed key)
    assert moved[STEPS] <= bounds["score_bound"] and moved[STEPS + 1] <= bounds["curvature_bound"]
    assert moved[STEPS] > 0


def test_selftest_gray_box_replay_against_spark(spark: Any) -> None:
    from dpsummary.selftest import spark_gray_box_replay

    result = spark_gray_box_replay(spark, records=300, steps=6, num_samples=10)
    assert result.ok, result
    assert result.calls == (6, 6) and result.lockstep_max_ratio <= 1 + 1e-9


def _mixed_table(n: int, seed: int) -> pa.Table:
    """Typed Parquet columns (float64 with nulls and NaN, int64, float32, strings with nulls and
    stray spaces) besides the dirty text columns: what DP schema estimation meets in real tables."""
    rng = np.random.default_rng(seed)
    base = table(n, seed)
    f64 = rng.normal(50, 20, n)
    f64[::37] = np.nan
    ints = rng.integers(0, 90, n)
    text = rng.choice(["red", "green", " blue", "blue", "Red"], n).astype(object)
    text[::53] = None
    cols = {name: base.column(name) for name in base.column_names}
    cols.update(score=pa.array(f64, mask=np.arange(n) % 41 == 0), age=pa.array(ints, pa.int64()),
                ratio=pa.array(rng.random(n).astype(np.float32)), colour=pa.array(list(text), pa.string()))
    return pa.table(cols)


@pytest.mark.parametrize(("partitions", "max_bytes"), [(None, None), (5, None), (None, 2048)])
def test_stage1_sums_identical_to_local(spark: Any, tmp_path: Path, partitions: int | None,
                                        max_bytes: int | None) -> None:
    """Stage 1 on Spark releases the local engine's mechanisms on the same noise-free totals:
    the exact record count, every DP schema count (same keys, same order; the totals summed by
    key on the executors, which the Spark schema mechanism noises and thresholds there, see
    test_schema_selection.py) and the data-quality rule counts, whatever the partitioning and
    the file split."""
    from dpsummary.private.source import PrivateSource
    from dpsummary.private.spark_engine import QualityPass, _collect

    tbl = _mixed_table(2500, 9)
    single = write_parquet(tmp_path / "one.parquet", tbl)
    write_split(tmp_path / "split", tbl, parts=3)
    local = PrivateSource.open(single)
    local._scan_stage1(schema=True)
    want = local._schema_counts.vector()
    local_quality = local.encode(TF, missing_numeric="impute", unseen_category="other")._quality
    for location in (single, tmp_path / "split"):
        src = _source(spark, location, Recorder(), partitions=partitions, max_bytes=max_bytes)
        got = src.schema_counts().vector()
        assert got.keys == want.keys and np.array_equal(got.counts, want.counts) and got.touches == want.touches
        assert src._rows == local._rows == tbl.num_rows
        enc = src.encode(TF, missing_numeric="impute", unseen_category="other")
        spark_quality = _collect(src._df, QualityPass(enc._encoder))["quality"]
        assert [int(v) for v in spark_quality] == [int(v) for v in local_quality]
        # The released record count goes through the shared count mechanism on that exact total.
        recorder = Recorder()
        src._randomness = recorder
        src.noisy_record_count(noise_multiplier=3.0)
        assert recorder.inputs[0].tolist() == [float(tbl.num_rows)]
    local.close()


def test_edges_histogram_identical_to_local(spark: Any, data: dict[str, Any]) -> None:
    """The count clip's histogram (a layout of kind "edges", here over the 0/1 target and over x1's
    model-space coordinate) gives Spark and the local engine the same pre-noise counts."""
    from dpsummary.postprocess.count_range import count_layout
    from dpsummary.private.marginals import ColumnBins, HistogramLayout

    rows, _ = local_encoded([data["single"]], TF)
    layouts = [count_layout(TF.num_features, "y", 1.0),
               HistogramLayout((ColumnBins("x1", "edges", 0, 1, edges=(-0.5, 0.0, 0.5)),), 1)]
    for layout in layouts:
        local, remote = Recorder(), Recorder()
        PrivateRecords(rows, randomness=local).noisy_marginals(layout, noise_multiplier=1.0)
        enc = _source(spark, data["single"], remote).encode(TF, missing_numeric="impute", unseen_category="other")
        enc.records.noisy_marginals(layout, noise_multiplier=1.0)
        assert len(local.inputs) == len(remote.inputs) == 1
        assert np.array_equal(local.inputs[0], remote.inputs[0])
        assert float(local.inputs[0].sum()) > 0
