"""Spark engine at scale: per-pass and per-step costs, and end-to-end releases, in local[N].

    nice -n 10 python benchmarks/spark_scale.py --rows 1000000 --rows 10000000 \
        --out benchmarks/results/spark_scale.md
    # docs/SCALE.md's cost model: few columns, local[2] and local[1], shuffle bytes and driver
    # memory from Spark's REST API, zero-configuration releases with the packaged default policy
    nice -n 10 python benchmarks/spark_scale.py --rows 1000000 --rows 10000000 --numeric 4 \
        --master 'local[2]' --master 'local[1]' --metrics --zero-config --out benchmarks/results/spark_scale_cost.md

    # issue 35: driver memory of zero-configuration releases with a 10^6-distinct-value ID column
    nice -n 10 python benchmarks/spark_scale.py --rows 1000000 --driver-memory \
        --out benchmarks/results/spark_scale_id_column.md

Synthetic tables (generated here into a private temp directory, never committed): 20 columns,
18 numeric features uniform on their public bounds, one categorical feature with 4 categories
and a binary target drawn from a logistic model; Parquet, row groups of 2^17 rows, typed columns
(the encoder casts them to text and applies the public total rules, as for any Parquet input).

Measured (wall clock, curator-local; these timings are benchmarks, never published by a release):

* ``stage-1 pass``: zero configuration's one pass for the record count and the DP schema counts
  (:class:`~dpsummary.private.spark_engine.Stage1Pass`, exact counts merged on the driver);
* ``count pass``: the stage-1 record count alone, with a public schema (Spark's Parquet count:
  footers only);
* ``quality pass``: one full pass of the shared encoder (quality counts, noise on the driver);
* ``score pass``: one noise-aware round (encoder + ``kernel.score_partial`` per batch, exact
  integer partials combined on the driver, two Gaussian releases);
* ``materialise pass``: DP-PSVI's one pass that writes every step's batch (PRF coins per
  (row id, step), T = 500 steps, q = 200 / N) into step files;
* ``per step``: reading one step file + ``kernel.dppsvi_partial`` + noise (mean over steps);
* ``release``: ``dpsummary release --engine spark`` end to end (public schema and count in the
  policy; noise-aware default and ``--mechanism dp-psvi``), when the release hook is present;
* with ``--metrics``: per pass, the bytes read and shuffled (written) by its Spark stages and, per
  run, the driver JVM's peak heap (Spark's REST API, UI on for the benchmark only) and the Python
  driver's peak RSS;
* with ``--zero-config``: ``dpsummary release --epsilon 0.2 --target y`` with the PACKAGED
  default policy (no ``--policy``), on Spark and on the local engine, in a fresh process each.
* with ``--driver-memory`` (issue 35): the same zero-configuration release on the same table
  with and without an extra ``id`` column holding a distinct string per record, in a fresh
  process each: the Python driver's peak RSS (``VmHWM`` of the release's own process, read
  after the release returns; not ``getrusage``, which Linux carries across fork and exec from the
  benchmark process) and the JVM driver's (``VmHWM`` of the ``java`` child, read before the
  process exits; in ``local[N]`` that JVM runs the executors' tasks and shuffle too), and the
  wall clock; ``--baseline-src DIR`` repeats the Spark runs with the dpsummary package found in
  ``DIR`` (e.g. ``git archive`` of an older commit) for comparison.
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
from typing import Any

import numpy as np

NUMERIC = 18  # --numeric changes it
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


def generate(path: Path, rows: int, seed: int = 0, *, id_column: bool = False) -> None:
    """``rows`` x 20 columns into ``path`` (Parquet), in chunks of 10^6 rows; with
    ``id_column`` a first column ``id`` of distinct strings (one per record)."""
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
            cols = {"id": pa.array([f"id-{seed}-{start + i:012d}" for i in range(m)], pa.string())} if id_column else {}
            cols.update({f"x{i}": x[:, i] for i in range(NUMERIC)})
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


def stage_totals(spark: object) -> tuple[float, float]:
    """(input bytes, shuffle bytes written) summed over the application's completed stages,
    from Spark's REST API (the benchmark's session has its UI on)."""
    import json
    import urllib.request

    sc = spark.sparkContext  # type: ignore[attr-defined]
    url = f"{sc.uiWebUrl}/api/v1/applications/{sc.applicationId}/stages?status=complete"
    time.sleep(1.0)  # the listener bus updates the status store asynchronously
    with urllib.request.urlopen(url, timeout=30) as resp:  # noqa: S310 - the local Spark UI
        stages = json.load(resp)
    return (float(sum(s.get("inputBytes", 0) for s in stages)),
            float(sum(s.get("shuffleWriteBytes", 0) for s in stages)))


def driver_peak_heap(spark: object) -> float | None:
    """Peak JVM heap of the driver (bytes), from the REST API's executor metrics, or None."""
    import json
    import urllib.request

    sc = spark.sparkContext  # type: ignore[attr-defined]
    url = f"{sc.uiWebUrl}/api/v1/applications/{sc.applicationId}/allexecutors"
    with urllib.request.urlopen(url, timeout=30) as resp:  # noqa: S310 - the local Spark UI
        execs = json.load(resp)
    for e in execs:
        if e.get("id") == "driver":
            peak = (e.get("peakMemoryMetrics") or {}).get("JVMHeapMemory")
            return float(peak) if peak is not None else None
    return None


def passes(spark: object, data: Path, rows: int, step_samples: int, metrics: bool = False) -> dict[str, float]:
    import torch

    from dpsummary.data import Transform
    from dpsummary.models import LogisticRegression
    from dpsummary.private.noise import quantize_sample_rate
    from dpsummary.private.spark_engine import SparkSource
    from dpsummary.spark.session import private_dir

    tf = Transform.from_schema(schema())  # type: ignore[arg-type]
    model = LogisticRegression(tf.num_features)
    scratch = private_dir()
    out: dict[str, float] = {}
    last = stage_totals(spark) if metrics else (0.0, 0.0)

    def measure(name: str, fn: object) -> None:
        nonlocal last
        out[name], _ = timed(fn)
        if metrics:
            now = stage_totals(spark)
            out[f"{name}: input MB"] = (now[0] - last[0]) / 1e6
            out[f"{name}: shuffle MB"] = (now[1] - last[1]) / 1e6
            last = now

    try:
        measure("stage-1 pass (count + schema counts)",
                lambda: SparkSource(spark, data, scratch, steps=STEPS).schema_counts())
        src = SparkSource(spark, data, scratch, steps=STEPS)
        measure("count pass", lambda: src.noisy_record_count(noise_multiplier=10.0))
        enc = src.encode(tf, missing_numeric="impute", unseen_category="other")
        measure("quality pass", lambda: enc.noisy_quality_counts(noise_multiplier=10.0))
        theta = model.prior_mean
        measure("score pass (one noise-aware round)", lambda: enc.noisy_score_statistics(
            model, theta, score_bound=3.0, curvature_bound=3.0, score_noise_multiplier=5.0,
            curvature_noise_multiplier=5.0))
        q = quantize_sample_rate(EXPECTED_BATCH / rows)
        measure("materialise pass (T=500)", lambda: enc.records._materialise(q))
        draws = model.sample_prior(100, torch.Generator().manual_seed(0))
        times = []
        for _ in range(step_samples):
            dt, _ = timed(lambda: enc.records.noisy_clipped_sum(model, draws, sample_rate=q, clip_norm=1.0,
                                                                noise_multiplier=1.0))
            times.append(dt)
        out["per step (median)"] = statistics.median(times)
        out["per step (mean)"] = statistics.fmean(times)
        if metrics:
            import resource

            heap = driver_peak_heap(spark)
            out["driver JVM peak heap MB"] = heap / 1e6 if heap is not None else float("nan")
            out["driver Python peak RSS MB"] = resource.getrusage(resource.RUSAGE_SELF).ru_maxrss / 1024
    finally:
        shutil.rmtree(scratch, ignore_errors=True)
    return out


def release(data: Path, pol: Path, mechanism: str) -> float | None:
    """End-to-end ``dpsummary release --engine spark`` (None if the hook is not there)."""
    import dataclasses

    from dpsummary.release import ReleaseRequest, run_release
    from dpsummary.spark.session import SparkOptions

    if "engine" not in {f.name for f in dataclasses.fields(ReleaseRequest)}:
        return None
    out = data.with_suffix(f".{mechanism}.dpsummary.json")
    req = ReleaseRequest(data=data, epsilon=1.0, policy=pol, out=out, mechanism=mechanism, steps=STEPS,
                         seed=0, engine="spark", spark=SparkOptions())  # type: ignore[call-arg]
    dt, _ = timed(lambda: run_release(req))
    return dt


def zero_config_release(data: Path, engine: str, master: str, home: Path) -> float:
    """``dpsummary release --epsilon 0.2 --target y`` with the packaged default policy, in a
    fresh process (the CLI next to this interpreter); raises if it does not succeed."""
    import subprocess

    cli = Path(sys.executable).with_name("dpsummary")
    cmd = [str(cli), "release", "--epsilon", "0.2", "--target", "y", "--out", str(home / f"{engine}.json")]
    if engine == "spark":
        cmd += ["--engine", "spark", "--spark-master", master]
    env = dict(os.environ, DPSUMMARY_HOME=str(home / engine), OMP_NUM_THREADS="1")
    t0 = time.perf_counter()
    proc = subprocess.run([*cmd, str(data)], env=env, capture_output=True, text=True, check=False)
    if proc.returncode != 0:
        raise SystemExit(f"zero-configuration release failed ({engine}):\n{proc.stdout[-2000:]}{proc.stderr[-2000:]}")
    return time.perf_counter() - t0


#: Run in a fresh interpreter: one CLI release, then its peak memory as one JSON line on stderr.
_MEASURED_RELEASE = r"""
import json, os, sys, time
from pathlib import Path


def java_hwm_mb():
    me, best = os.getpid(), None
    parents = {}
    for pid in filter(str.isdigit, os.listdir("/proc")):
        try:
            stat = Path(f"/proc/{pid}/stat").read_text()
            parents[int(pid)] = (int(stat.rsplit(")", 1)[1].split()[1]), stat.split("(", 1)[1].rsplit(")", 1)[0])
        except OSError:
            continue
    for pid, (_, comm) in parents.items():
        p = pid
        while p in parents and p != me:
            p = parents[p][0]
        if p == me and pid != me and comm == "java":
            for line in Path(f"/proc/{pid}/status").read_text().splitlines():
                if line.startswith("VmHWM:"):
                    best = max(best or 0.0, int(line.split()[1]) / 1024)
    return best


from dpsummary.cli import main

sys.argv = ["dpsummary", *sys.argv[1:]]
t0 = time.perf_counter()
code = 0
try:
    main()
except SystemExit as exc:
    code = exc.code
wall = time.perf_counter() - t0
# VmHWM of this process, not getrusage: Linux carries ru_maxrss across fork and exec, so it
# would report the parent's (the benchmark's) peak when that is higher.
hwm = [int(ln.split()[1]) / 1024 for ln in Path("/proc/self/status").read_text().splitlines() if ln.startswith("VmHWM:")]
import dpsummary.private.spark_engine as engine_module
print("MEASURED " + json.dumps({"exit": code, "wall": wall, "java_hwm_mb": java_hwm_mb(),
      "python_maxrss_mb": hwm[0], "code": engine_module.__file__}), file=sys.stderr)
"""


def _measured(proc: Any, what: str, src: Path | None) -> dict[str, Any]:
    """The child's (a ``subprocess.CompletedProcess``) last ``MEASURED {json}`` line, checked to
    come from the intended dpsummary (this checkout when ``src`` is None, else the tree at ``src``)."""
    import json

    lines = [ln for ln in proc.stderr.splitlines() if ln.startswith("MEASURED ")]
    if not lines:
        raise SystemExit(f"{what} did not report:\n{proc.stdout[-2000:]}{proc.stderr[-3000:]}")
    res: dict[str, Any] = json.loads(lines[-1][len("MEASURED "):])
    if (src is not None) != (not res.pop("code").startswith(str(Path(__file__).resolve().parents[1]))):
        raise SystemExit(f"the {what} did not import the intended dpsummary")
    return res


def measured_release(data: Path, engine: str, master: str, home: Path, src: Path | None = None) -> dict[str, float]:
    """A zero-configuration release (packaged default policy) in a fresh interpreter, with its
    driver's peak memory: Python (``ru_maxrss`` of that process) and JVM (``VmHWM`` of its java
    child). ``src``: a directory whose ``dpsummary`` package is used instead (a baseline)."""
    import json
    import subprocess

    out = home / f"{engine}-{data.stem}{'-baseline' if src is not None else ''}.json"
    cmd = [sys.executable, "-c", _MEASURED_RELEASE, "release", "--epsilon", "0.2", "--target", "y", "--out", str(out)]
    if engine == "spark":
        cmd += ["--engine", "spark", "--spark-master", master]
    env = dict(os.environ, DPSUMMARY_HOME=str(home / f"{engine}-{data.stem}-{src is not None}"), OMP_NUM_THREADS="1")
    if src is not None:
        env["PYTHONPATH"] = str(src)
    # cwd: not the repository (``python -c`` puts the working directory first on sys.path)
    proc = subprocess.run([*cmd, str(data)], env=env, capture_output=True, text=True, check=False, cwd=home)
    res = _measured(proc, f"measured release ({engine})", src)
    res["ok"] = float(res.pop("exit") == 0 and out.exists())
    if not res["ok"]:
        print(f"release failed ({engine}, {data.name}):\n{proc.stdout[-1500:]}{proc.stderr[-1500:]}", flush=True)
    columns: list[str] = []
    if out.exists():  # the released schema's columns (in the signed statement's payload)
        import base64

        statement = json.loads(base64.b64decode(json.loads(out.read_text())["payload"]))
        columns = [c["name"] for c in statement["predicate"]["body"]["summary"]["transform"]["schema"]["columns"]]
    res["schema_columns"] = float(len(columns))
    res["id_released"] = float("id" in columns)
    return res


#: Stage 1's DP schema alone on Spark, in a fresh interpreter: what the Python driver allocates
#: (tracemalloc peak) and receives (value keys and their bytes) during ``estimate_schema``.
_STAGE1_PROBE = r"""
import json, sys, time, tracemalloc
from pathlib import Path

from dpsummary.private import spark_engine
from dpsummary.private.spark_engine import SparkSource
from dpsummary.spark.session import SparkOptions, build_session, private_dir

data, master = Path(sys.argv[1]), sys.argv[2]
scratch = private_dir()
spark = build_session(SparkOptions(master=master), scratch)
src = SparkSource(spark, data, scratch, steps=1)
received = {"rows": 0, "value_keys": 0, "value_bytes": 0}
if hasattr(spark_engine, "_collect_rows"):  # this commit: count what the driver collects
    real = spark_engine._collect_rows

    def spy(df):
        rows = real(df)
        values = [r for r in rows if r["section"] == spark_engine.VALUE]
        received["rows"] += len(rows)
        received["value_keys"] += len(values)
        received["value_bytes"] += sum(len(r["label"].encode()) for r in values)
        return rows

    spark_engine._collect_rows = spy


def rss(field):
    return [int(ln.split()[1]) / 1024 for ln in Path("/proc/self/status").read_text().splitlines()
            if ln.startswith(field + ":")][0]


before = rss("VmRSS")
tracemalloc.start()
t0 = time.perf_counter()
result = src.estimate_schema(noise_multiplier=2.0, target="y", delta=1e-10)
wall = time.perf_counter() - t0
peak = tracemalloc.get_traced_memory()[1] / 2**20
held = getattr(src, "_schema_counts", None)  # the baseline keeps every distinct value here
if held is not None:
    received["value_keys"] = sum(len(v) for v in held._values.values())
    received["value_bytes"] = sum(len(k.encode()) for v in held._values.values() for k in v)
print("MEASURED " + json.dumps({"wall": wall, "tracemalloc_peak_mb": peak, "rss_growth_mb": rss("VmHWM") - before,
                                "dropped": result.dropped, "code": spark_engine.__file__, **received}), file=sys.stderr)
spark.stop()
"""


def stage1_probe(data: Path, master: str, src: Path | None) -> dict[str, Any]:
    """:data:`_STAGE1_PROBE` on ``data`` in a fresh interpreter (``src``: a baseline package)."""
    import subprocess

    env = dict(os.environ, OMP_NUM_THREADS="1")
    if src is not None:
        env["PYTHONPATH"] = str(src)
    proc = subprocess.run([sys.executable, "-c", _STAGE1_PROBE, str(data), master], env=env, capture_output=True,
                          text=True, check=False, cwd=data.parent)
    res = _measured(proc, "stage-1 probe", src)
    return res


def driver_memory(rows: int, master: str, work: Path, baseline: Path | None, engines: list[str],
                  whole: bool = True) -> str:
    """The ``--driver-memory`` table (markdown): per table (with / without the ID column),
    engine and code version, the zero-configuration release's outcome, wall clock and driver
    peak memory."""
    home = Path(tempfile.mkdtemp(dir=work))
    stage1 = ["| table | code | value keys the driver received (their bytes) | driver rows collected | "
              "Python allocations during stage 1 (tracemalloc peak) | driver RSS growth | stage 1 wall clock |",
              "|---|---|---|---|---|---|---|"]
    lines = ["| table | engine | code | exit | released schema columns | wall clock | Python driver peak RSS | "
             "JVM driver peak RSS |", "|---|---|---|---|---|---|---|---|"]
    for id_column in (False, True):
        data = work / f"synthetic_{rows}{'_id' if id_column else ''}.parquet"
        generate(data, rows, id_column=id_column)
        label = f"{rows:,} rows x {20 + id_column} columns" + (" (+ `id`, one distinct value per row)" if id_column
                                                              else "")
        for src in [None] + ([baseline] if baseline is not None else []):
            res1 = stage1_probe(data, master, src)
            print(rows, id_column, "stage 1", src, res1, flush=True)
            stage1.append(f"| {'+ `id`' if id_column else 'no `id`'} | {'baseline' if src is not None else 'this commit'} | "
                          f"{res1['value_keys']:,} ({res1['value_bytes'] / 2**20:,.1f} MiB) | "
                          f"{res1['rows'] if src is None else 'n/a'} | {res1['tracemalloc_peak_mb']:,.1f} MiB | "
                          f"{res1['rss_growth_mb']:,.0f} MB | {res1['wall']:.0f} s |")
        runs = [(e, None) for e in engines] + ([("spark", baseline)] if baseline is not None else [])
        runs = runs if whole else []
        for engine, src in runs:
            res = measured_release(data, engine, master, home, src)
            print(rows, id_column, engine, src, res, flush=True)
            java = "n/a (no JVM)" if res["java_hwm_mb"] is None else f"{res['java_hwm_mb']:,.0f} MB"
            lines.append(f"| {label} | {engine}{f' ({master})' if engine == 'spark' else ''} | "
                         f"{'baseline' if src is not None else 'this commit'} | "
                         f"{'0' if res['ok'] else 'failed'} | {res['schema_columns']:.0f}"
                         f"{' (id among them)' if res['id_released'] else ''} | {res['wall']:.0f} s | "
                         f"{res['python_maxrss_mb']:,.0f} MB | {java} |")
        data.unlink()
    text = ("Stage 1's DP schema alone (`SparkSource.estimate_schema`, noise multiplier 2, delta 1e-10), "
            f"{rows:,} rows, {master}, fresh process each:\n\n" + "\n".join(stage1) + "\n")
    if whole:
        text += ("\nWhole zero-configuration releases (`dpsummary release --epsilon 0.2 --target y`, packaged "
                 "default policy), fresh process each:\n\n" + "\n".join(lines) + "\n")
    return text


def main() -> None:
    global NUMERIC
    ap = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    ap.add_argument("--rows", type=int, action="append", help="table sizes (repeatable)")
    ap.add_argument("--step-samples", type=int, default=30)
    ap.add_argument("--no-release", action="store_true", help="skip the end-to-end releases")
    ap.add_argument("--releases-only", action="store_true", help="skip the per-pass measurements")
    ap.add_argument("--mechanism", action="append", choices=["noise-aware-newton", "dp-psvi"],
                    help="end-to-end releases to time (repeatable; default both)")
    ap.add_argument("--out", type=Path, default=None)
    ap.add_argument("--master", action="append", help="Spark masters (repeatable; default local[2])")
    ap.add_argument("--numeric", type=int, default=18, help="numeric feature columns")
    ap.add_argument("--metrics", action="store_true", help="input/shuffle bytes and driver memory (REST API)")
    ap.add_argument("--driver-memory", action="store_true",
                    help="issue 35: driver peak memory of zero-configuration releases with and without an ID column")
    ap.add_argument("--baseline-src", type=Path, default=None,
                    help="with --driver-memory: also run Spark with the dpsummary package in this directory")
    ap.add_argument("--stage1-only", action="store_true", help="with --driver-memory: skip the whole releases")
    ap.add_argument("--engine", action="append", choices=["spark", "local"],
                    help="with --driver-memory: engines to run (repeatable; default both)")
    ap.add_argument("--zero-config", action="store_true",
                    help="time zero-configuration releases with the packaged default policy (Spark and local)")
    args = ap.parse_args()
    NUMERIC = args.numeric
    sizes = args.rows or [1_000_000]
    masters = args.master or ["local[2]"]
    from dpsummary.spark.session import SparkOptions, build_session, private_dir

    work = Path(tempfile.mkdtemp(prefix="dpsummary-spark-bench-"))
    os.environ.setdefault("DPSUMMARY_HOME", str(work / "home"))
    if args.driver_memory:
        try:
            tables = [driver_memory(rows, masters[0], work, args.baseline_src, args.engine or ["spark", "local"],
                                    whole=not args.stage1_only) for rows in sizes]
        finally:
            shutil.rmtree(work, ignore_errors=True)
        command = ("nice -n 10 python benchmarks/spark_scale.py " + " ".join(f"--rows {r}" for r in sizes)
                   + "".join(f" --master '{m}'" for m in args.master or []) + " --driver-memory"
                   + (" --baseline-src DIR" if args.baseline_src else "") + (" --stage1-only" if args.stage1_only else "")
                   + "".join(f" --engine {e}" for e in args.engine or []))
        text = (f"machine: {platform.machine()}, {os.cpu_count()} cores (shared), Python {platform.python_version()}; "
                f"command: `{command}`\n\n" + "\n".join(tables))
        print(text)
        if args.out:
            args.out.write_text(text)
        return
    scratch = private_dir()
    results: dict[tuple[int, str], dict[str, float | None]] = {}
    try:
        for rows in sizes:
            data = work / f"synthetic_{rows}.parquet"
            gen, _ = timed(lambda rows=rows, data=data: generate(data, rows))
            print(f"rows {rows}: generated in {gen:.1f} s ({data.stat().st_size / 1e6:.0f} MB)", flush=True)
            for master in masters:
                res: dict[str, float | None] = {}
                if not args.releases_only:
                    conf = {"spark.ui.enabled": "true"} if args.metrics else {}
                    spark = build_session(SparkOptions(master=master, conf=conf), scratch)
                    try:
                        res.update(passes(spark, data, rows, args.step_samples, metrics=args.metrics))
                    finally:
                        spark.stop()
                print(rows, master, res, flush=True)
                if not args.no_release:
                    pol = policy(work / f"policy_{rows}.toml", rows)
                    for mech in args.mechanism or ["noise-aware-newton", "dp-psvi"]:
                        res[f"release {mech} (end to end)"] = release(data, pol, mech)
                        print(rows, mech, res[f"release {mech} (end to end)"], flush=True)
                if args.zero_config:
                    home = Path(tempfile.mkdtemp(dir=work))
                    res["zero-configuration release, packaged default, --engine spark"] = zero_config_release(
                        data, "spark", master, home)
                    print(rows, master, "zero-config spark", res, flush=True)
                    if master == masters[0]:
                        res["zero-configuration release, packaged default, --engine local"] = zero_config_release(
                            data, "local", master, home)
                results[(rows, master)] = res
            data.unlink()
    finally:
        shutil.rmtree(work, ignore_errors=True)
        shutil.rmtree(scratch, ignore_errors=True)
    command = ("nice -n 10 python benchmarks/spark_scale.py " + " ".join(f"--rows {r}" for r in sizes)
               + (f" --numeric {args.numeric}" if args.numeric != 18 else "")
               + "".join(f" --master '{m}'" for m in args.master or [])
               + "".join(f" --mechanism {m}" for m in args.mechanism or [])
               + (" --metrics" if args.metrics else "") + (" --zero-config" if args.zero_config else "")
               + (" --no-release" if args.no_release else "") + (" --releases-only" if args.releases_only else ""))
    lines = [f"machine: {platform.machine()}, {os.cpu_count()} cores (shared), Python {platform.python_version()}, "
             f"{args.numeric} numeric + 1 categorical feature + binary target; command: `{command}`", ""]
    names = list(dict.fromkeys(k for res in results.values() for k in res))
    lines += ["| quantity | " + " | ".join(f"{r:,} rows, {m}" for r, m in results) + " |",
              "|---" * (1 + len(results)) + "|"]

    def cell(name: str, v: float | None) -> str:
        if v is None:
            return "n/a"
        if name.endswith(" MB"):
            return f"{v:,.1f} MB"
        return f"{v:.3f} s" if v < 10 else f"{v:.1f} s"

    for name in names:
        lines.append(f"| {name} | " + " | ".join(cell(name, res.get(name)) if name in res else ""
                                               for res in results.values()) + " |")
    text = "\n".join(lines) + "\n"
    print(text)
    if args.out:
        args.out.write_text(text)


if __name__ == "__main__":
    sys.exit(main())
