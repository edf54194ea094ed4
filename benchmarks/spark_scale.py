"""Spark engine at scale: per-pass and per-step costs, and end-to-end releases, in local[2].

    nice -n 10 python benchmarks/spark_scale.py --rows 1000000 --rows 10000000 \
        --out benchmarks/results/spark_scale.md

Synthetic tables (generated here into a private temp directory, never committed): 20 columns,
18 numeric features uniform on their public bounds, one categorical feature with 4 categories
and a binary target drawn from a logistic model; Parquet, row groups of 2^17 rows, typed columns
(the encoder casts them to text and applies the public total rules, as for any Parquet input).

Measured (wall clock, curator-local; these timings are benchmarks, never published by a release):

* ``count pass``: the stage-1 record count (Spark's Parquet count: footers only);
* ``quality pass``: one full pass of the shared encoder (quality counts, noise on the driver);
* ``score pass``: one noise-aware round (encoder + ``kernel.score_partial`` per batch, exact
  integer partials combined on the driver, two Gaussian releases);
* ``materialise pass``: DP-PSVI's one pass that writes every step's batch (PRF coins per
  (row id, step), T = 500 steps, q = 200 / N) into step files;
* ``per step``: reading one step file + ``kernel.dppsvi_partial`` + noise (mean over steps);
* ``release``: ``dpsummary release --engine spark`` end to end (public schema and count in the
  policy; noise-aware default and ``--mechanism dp-psvi``), when the release hook is present.
"""

from __future__ import annotations

import argparse
import os
import platform
import shutil
import statistics
import sys
import tempfile
import time
from pathlib import Path

import numpy as np

NUMERIC = 18
CATEGORIES = ["a", "b", "c", "d"]
STEPS = 500
EXPECTED_BATCH = 200


def schema_toml() -> str:
    cols = "".join(f'[[schema.columns]]\nname = "x{i}"\nkind = "numeric"\nlower = 0\nupper = 1\n'
                   for i in range(NUMERIC))
    cols += f'[[schema.columns]]\nname = "c"\nkind = "categorical"\ncategories = {CATEGORIES!r}\n'
    cols += '[[schema.columns]]\nname = "y"\nkind = "categorical"\ncategories = ["0", "1"]\n'
    return '[schema]\ntarget = "y"\n' + cols.replace("'", '"')


def schema() -> object:
    import tomllib

    from dpsummary.data import Schema

    return Schema.model_validate(tomllib.loads(schema_toml())["schema"])


def generate(path: Path, rows: int, seed: int = 0) -> None:
    """``rows`` x 20 columns into ``path`` (Parquet), in chunks of 10^6 rows."""
    import pyarrow as pa
    import pyarrow.parquet as pq

    rng = np.random.default_rng(seed)
    beta = rng.normal(size=NUMERIC + 1)
    writer = None
    try:
        for start in range(0, rows, 1_000_000):
            m = min(1_000_000, rows - start)
            x = rng.random((m, NUMERIC))
            c = rng.integers(0, len(CATEGORIES), m)
            eta = (x - 0.5) @ beta[:NUMERIC] + beta[NUMERIC] * (c == 1)
            y = (rng.random(m) < 1 / (1 + np.exp(-eta))).astype(np.int64)
            cols = {f"x{i}": x[:, i] for i in range(NUMERIC)}
            cols["c"] = pa.array(np.array(CATEGORIES, dtype=object)[c].tolist(), pa.string())
            cols["y"] = y
            tbl = pa.table(cols)
            if writer is None:
                writer = pq.ParquetWriter(path, tbl.schema)
            writer.write_table(tbl, row_group_size=1 << 17)
    finally:
        if writer is not None:
            writer.close()


def policy(path: Path, rows: int) -> Path:
    path.write_text(f"""source_id = "spark-bench-{rows}"
total_epsilon = 1000.0
total_delta = 1e-6
max_epsilon_per_release = 10.0
min_records = 50
n_max = {max(rows * 2, 1000)}
record_count_public = true
record_count = {rows}
{schema_toml()}""")
    return path


def timed(fn: object) -> tuple[float, object]:
    t0 = time.perf_counter()
    out = fn()  # type: ignore[operator]
    return time.perf_counter() - t0, out


def passes(spark: object, data: Path, rows: int, step_samples: int) -> dict[str, float]:
    import torch

    from dpsummary.data import Transform
    from dpsummary.models import LogisticRegression
    from dpsummary.private.noise import quantize_sample_rate
    from dpsummary.private.spark_engine import SparkSource, private_dir

    tf = Transform.from_schema(schema())  # type: ignore[arg-type]
    model = LogisticRegression(tf.num_features)
    scratch = private_dir()
    out: dict[str, float] = {}
    try:
        src = SparkSource(spark, data, scratch, steps=STEPS)
        out["count pass"], _ = timed(lambda: src.noisy_record_count(noise_multiplier=10.0))
        enc = src.encode(tf, missing_numeric="impute", unseen_category="other")
        out["quality pass"], _ = timed(lambda: enc.noisy_quality_counts(noise_multiplier=10.0))
        theta = model.prior_mean
        out["score pass (one noise-aware round)"], _ = timed(lambda: enc.noisy_score_statistics(
            model, theta, score_bound=3.0, curvature_bound=3.0, score_noise_multiplier=5.0,
            curvature_noise_multiplier=5.0))
        q = quantize_sample_rate(EXPECTED_BATCH / rows)
        out["materialise pass (T=500)"], _ = timed(lambda: enc.records._materialise(q))
        draws = model.sample_prior(100, torch.Generator().manual_seed(0))
        times = []
        for _ in range(step_samples):
            dt, _ = timed(lambda: enc.records.noisy_clipped_sum(model, draws, sample_rate=q, clip_norm=1.0,
                                                                noise_multiplier=1.0))
            times.append(dt)
        out["per step (median)"] = statistics.median(times)
        out["per step (mean)"] = statistics.fmean(times)
    finally:
        shutil.rmtree(scratch, ignore_errors=True)
    return out


def release(data: Path, pol: Path, mechanism: str) -> float | None:
    """End-to-end ``dpsummary release --engine spark`` (None if the hook is not there)."""
    import dataclasses

    from dpsummary.private.spark_engine import SparkOptions
    from dpsummary.release import ReleaseRequest, run_release

    if "engine" not in {f.name for f in dataclasses.fields(ReleaseRequest)}:
        return None
    out = data.with_suffix(f".{mechanism}.dpsummary.json")
    req = ReleaseRequest(data=data, epsilon=1.0, policy=pol, out=out, mechanism=mechanism, steps=STEPS,
                         seed=0, engine="spark", spark=SparkOptions())  # type: ignore[call-arg]
    dt, _ = timed(lambda: run_release(req))
    return dt


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    ap.add_argument("--rows", type=int, action="append", help="table sizes (repeatable)")
    ap.add_argument("--step-samples", type=int, default=30)
    ap.add_argument("--no-release", action="store_true", help="skip the end-to-end releases")
    ap.add_argument("--releases-only", action="store_true", help="skip the per-pass measurements")
    ap.add_argument("--mechanism", action="append", choices=["noise-aware-newton", "dp-psvi"],
                    help="end-to-end releases to time (repeatable; default both)")
    ap.add_argument("--out", type=Path, default=None)
    args = ap.parse_args()
    sizes = args.rows or [1_000_000]
    from dpsummary.private.spark_engine import SparkOptions, build_session, private_dir

    work = Path(tempfile.mkdtemp(prefix="dpsummary-spark-bench-"))
    os.environ.setdefault("DPSUMMARY_HOME", str(work / "home"))
    scratch = private_dir()
    results: dict[int, dict[str, float | None]] = {}
    try:
        for rows in sizes:
            data = work / f"synthetic_{rows}.parquet"
            gen, _ = timed(lambda rows=rows, data=data: generate(data, rows))
            print(f"rows {rows}: generated in {gen:.1f} s ({data.stat().st_size / 1e6:.0f} MB)", flush=True)
            res: dict[str, float | None] = {}
            if not args.releases_only:
                spark = build_session(SparkOptions(), scratch)
                try:
                    res.update(passes(spark, data, rows, args.step_samples))
                finally:
                    spark.stop()
            print(rows, res, flush=True)
            if not args.no_release:
                pol = policy(work / f"policy_{rows}.toml", rows)
                for mech in args.mechanism or ["noise-aware-newton", "dp-psvi"]:
                    res[f"release {mech} (end to end)"] = release(data, pol, mech)
                    print(rows, mech, res[f"release {mech} (end to end)"], flush=True)
            results[rows] = res
            data.unlink()
    finally:
        shutil.rmtree(work, ignore_errors=True)
        shutil.rmtree(scratch, ignore_errors=True)
    lines = [f"machine: {platform.machine()}, {os.cpu_count()} cores, Python {platform.python_version()}, "
             f"Spark local[2]; command: `nice -n 10 python benchmarks/spark_scale.py "
             + " ".join(f"--rows {r}" for r in sizes)
             + "".join(f" --mechanism {m}" for m in args.mechanism or []) + "`", "",
             "| rows | " + " | ".join(next(iter(results.values())).keys()) + " |",
             "|---" * (1 + len(next(iter(results.values())))) + "|"]
    for rows, res in results.items():
        cells = ["n/a" if v is None else f"{v:.3f} s" if v < 10 else f"{v:.1f} s" for v in res.values()]
        lines.append(f"| {rows:,} | " + " | ".join(cells) + " |")
    text = "\n".join(lines) + "\n"
    print(text)
    if args.out:
        args.out.write_text(text)


if __name__ == "__main__":
    sys.exit(main())
