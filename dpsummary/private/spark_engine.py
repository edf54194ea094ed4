"""The Spark engine's private part: ``dpsummary release --engine spark`` on a Parquet path or table.

What reads records or draws privacy randomness on Spark (pyspark imported lazily, inside
functions). The session, the public checks, the executor probe and package shipping never see a
record and live in :mod:`dpsummary.spark`. It runs the same mechanisms as the local engine,
through the same kernel, on data that lives in a Spark cluster (or in ``local[2]``):

* **Full passes** (the quality counts; the noise-aware mechanism's rounds): ``mapInArrow``
  runs, per partition and per Arrow batch, the shared per-batch code (encoder, kernel), which
  returns exact INTEGER partial sums of a public, fixed size; the driver adds them as Python
  integers (exact, so the total is bit-identical to the local engine's whatever the partitioning)
  and then adds the noise ONCE through the mechanism's own noise path.
* **Stage 1's DP schema** (zero configuration): the schema counts include one count per distinct
  text value, so they are summed BY KEY on the executors (:class:`Stage1Pass`, ``groupBy``),
  each value key is noised and thresholded there (:class:`ValueSelection`, the local engine's
  :class:`~dpsummary.private.preprocess.SchemaMechanism`: OpenDP noise from the executor's OS
  entropy, the column's public scale, the same ``tau_c``), and the driver receives the record
  count, the fixed-size type and grid counts (noised on the driver) and only value keys that
  passed, at most ``keep`` per column and shuffle partition: driver memory does not grow with
  the number of distinct values, and no value the threshold does not release reaches it.
  Proof that this is the local engine's distribution: :mod:`dpsummary.private.preprocess`,
  "Distributed form".
* **DP-PSVI**: ONE pass pre-materialises every step's batch. Each row's steps come from keyed
  PRF coins (:mod:`dpsummary.private.prf`: ChaCha20 under a 256-bit key from OS entropy, at the
  row's id = (index of its file in the sorted file list, ``_metadata.row_index``)), so the
  batches are exactly Poisson subsamples with rate q, independent across steps, identical
  whatever the partitioning. The included (step, encoded row) pairs are shuffled by step into a
  few Parquet files by Spark's writer (a public number of files, not one per step and input
  partition), which the driver splits into one Arrow file per step, all under a private 0700
  temporary directory; per step the driver reads that step's file and runs the local engine's
  mechanism on it (:meth:`PrivateRecords.noisy_clipped_sum` at rate 1: the same kernel, the
  same noise, added once), then deletes the file.

Privacy caveats (see SECURITY.md, "The Spark engine"):

* Spark's ``rand(seed)`` is never used; coins come only from the keyed PRF (key from
  :func:`secrets.token_bytes`), noise only from the mechanisms' OS-entropy path (OpenDP), on
  the driver, and for stage 1's value keys on the executors (never seeded either).
* Stage 1's exact value counts are shuffled between executors (``groupBy``) in Spark's shuffle
  files, inside the private directory's spill dirs on ``local`` and on the executors' local
  disks on a cluster (enable ``spark.io.encryption.enabled``, as below).
* The step files are raw-equivalent records (model-space rows): the private directory is mode
  0700, holds Spark's local/spill dirs and the JVM's tmpdir too, and is deleted on every exit
  path (success, refusal, exception) by :class:`SparkEngine`'s context manager. A SIGKILL can
  leave it behind: it then has the same access controls as the input.
* Nothing data-derived is logged: no row counts, batch sizes, step-file sizes or fine timings.
  Spark's log level is WARN, its UI and console progress bar are off.
* Task retries cannot double-count a record: full-pass partials are taken from one successful
  attempt per partition (``collect``), step files go through Spark's output committer. A
  retried :class:`ValueSelection` task draws fresh noise and only one attempt's output reaches
  the driver (a retry is caused by a failure, never by the output's value; speculation is off, and
  a release refuses to run with it on: :func:`dpsummary.spark.session.check_session_settings`).
* On a cluster, the PRF key travels inside the task closure to the executors: enable Spark's
  RPC/IO encryption (``--spark-conf spark.network.crypto.enabled=true --spark-conf
  spark.io.encryption.enabled=true``) and treat the executors like the curator's machine. The
  private directory must be on a filesystem both driver and executors see (local mode: always).
"""

from __future__ import annotations

import os
import shutil
from collections.abc import Callable, Iterator, Mapping
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from ..spark.session import SparkEngineError

# =============================================================================================
# Row ids and passes (the functions below run on executors: pure, no logging, no randomness
# other than the keyed PRF)
# =============================================================================================
#: Names of the position columns added to the input (never data columns).
FILE_COLUMN = "__dpsummary_file"
ROW_COLUMN = "__dpsummary_row"
STEP_COLUMN = "step"


def _row_ids(batch: Any, file_index: Mapping[str, int]) -> Any:
    """int64 row ids of an Arrow batch from its position columns (file, row index in file)."""
    import numpy as np

    from .prf import parquet_row_id

    files = batch.column(batch.schema.get_field_index(FILE_COLUMN)).to_pylist()
    rows = batch.column(batch.schema.get_field_index(ROW_COLUMN)).to_numpy(zero_copy_only=False)
    known: dict[str, int] = {}
    for f in set(files):
        known[f] = file_index[_norm_uri(f)]
    idx = np.fromiter((known[f] for f in files), dtype=np.int64, count=len(files))
    return parquet_row_id(idx, rows.astype(np.int64))


def _data_columns(batch: Any) -> Any:
    """The batch without the position columns (what the encoder sees)."""
    keep = [i for i, name in enumerate(batch.schema.names) if name not in (FILE_COLUMN, ROW_COLUMN)]
    return batch.select(keep)


def _ints_json(values: Any) -> str:
    import json

    return json.dumps([int(v) for v in list(values)])


def _ints_from_json(text: str) -> Any:
    import json

    import numpy as np

    values = json.loads(text)
    out = np.empty(len(values), dtype=object)
    out[:] = [int(v) for v in values]
    return out


@dataclass(frozen=True)
class BatchEncoder:
    """The shared per-batch encoder with the release's public transform and data-quality rules
    (picklable: it travels to the executors)."""

    transform: Any
    missing_numeric: str
    unseen_category: str

    def __call__(self, batch: Any) -> tuple[Any, Any, Any]:
        """``(rows (m, point_dim) float64 of the KEPT records, kept (m,) int64 positions in the
        batch, quality (n, 4) bool per record in :data:`~dpsummary.postprocess.quality.QUALITY_COUNTS`
        order)`` for one Arrow batch of data columns, by :func:`dpsummary.data.encode_batch`
        (the encoder the local engine uses)."""
        import numpy as np

        from ..data import QUALITY_RULES, encode_batch

        enc = encode_batch(batch, self.transform, missing_numeric=self.missing_numeric,  # type: ignore[arg-type]
                           unseen_category=self.unseen_category)  # type: ignore[arg-type]
        ind = np.asarray(enc.indicators, dtype=bool)

        def rule(name: str) -> Any:
            return ind[:, QUALITY_RULES.index(name)]

        # The rule encode_batch keeps records by (tested against its row count on every batch).
        dropped = rule("dropped_target") | rule("dropped_numeric") | rule("dropped_category")
        kept = np.flatnonzero(~dropped).astype(np.int64)
        if kept.shape[0] != enc.rows.shape[0]:
            from .mechanism import MechanismError

            raise MechanismError("the encoder's kept rows do not match its drop indicators")
        # QUALITY_COUNTS order: ragged_or_unreadable (Parquet has no ragged rows),
        # imputed_numeric, other_category, dropped.
        quality = np.stack([np.asarray(enc.undecodable, dtype=bool), rule("imputed_numeric"),
                            rule("other_category"), dropped], axis=1)
        return np.ascontiguousarray(enc.rows, dtype=np.float64), kept, quality


PAYLOAD_SCHEMA = "name string, ints string"


@dataclass(frozen=True)
class QualityPass:
    """Per partition: records read and how many records each public quality rule touched, as
    exact integers (one output row per partition)."""

    encoder: BatchEncoder

    def __call__(self, batches: Iterator[Any]) -> Iterator[Any]:
        import numpy as np
        import pyarrow as pa

        read = 0
        touched: Any = None
        for batch in batches:
            _, _, indicators = self.encoder(_data_columns(batch))
            read += batch.num_rows
            sums = (np.asarray(indicators) != 0).sum(axis=0).astype(np.int64)
            touched = sums if touched is None else touched + sums
        rows = [("read", _ints_json([read]))]
        if touched is not None:
            rows.append(("quality", _ints_json(touched.tolist())))
        yield pa.RecordBatch.from_pydict({"name": [r[0] for r in rows], "ints": [r[1] for r in rows]})


#: Stage 1's exact counts on the executors: one row per (column index, section, label). Sections:
#: the record count (column -1), the 4 type bins and 83 grid bins of each column (label = bin
#: index; both public, fixed-size), and the value keys (label = the text value).
STAGE1_SCHEMA = "col int, section int, label string, count long"
READ, TYPE, GRID, VALUE = 0, 1, 2, 3
#: What the value selection sends to the driver: the fixed sections' exact counts (``noisy``
#: null) and, per column, only value keys that passed the threshold, with their noisy count
#: (``count`` null: a selected key's exact count never leaves the executor).
SELECTED_SCHEMA = "col int, section int, label string, count long, noisy double"


def _stage1_rows(cols: list[int], sections: list[int], labels: Any, counts: Any) -> Any:
    import pyarrow as pa

    if isinstance(labels, pa.Array):
        labels = labels if labels.type == pa.string() else labels.cast(pa.string())
    return pa.RecordBatch.from_arrays(
        [pa.array(cols, pa.int32()), pa.array(sections, pa.int32()),
         labels if isinstance(labels, pa.Array) else pa.array(labels, pa.string()),
         pa.array(counts, pa.int64())], names=["col", "section", "label", "count"])


@dataclass(frozen=True)
class Stage1Pass:
    """Per partition: records read and, with a ``header``, the exact counts of DP schema
    estimation, counted as the local engine's stage-1 scan counts them
    (:func:`~dpsummary.private.preprocess.column_counts` on :func:`dpsummary.data.text_column` of
    each column of each Arrow batch). Value keys are emitted per batch (one row per distinct
    value of the batch: executor memory is one batch, Spark's partial aggregation combines
    them); the fixed-size sections once per partition (non-zero bins only). Nothing leaves the
    executors but into :class:`ValueSelection` (``groupBy`` sums them first)."""

    header: tuple[str, ...] | None

    def __call__(self, batches: Iterator[Any]) -> Iterator[Any]:
        import numpy as np

        from ..data import batch_columns, text_column
        from ..postprocess.schema import NUM_GRID_BINS
        from .preprocess import column_counts

        read = 0
        index = {name: i for i, name in enumerate(self.header or ())}
        types = np.zeros((len(index), 4), dtype=np.int64)
        grid = np.zeros((len(index), NUM_GRID_BINS), dtype=np.int64)
        for batch in batches:
            data = _data_columns(batch)
            read += data.num_rows
            if self.header is None:
                continue
            for name, col in batch_columns(data).items():
                i = index[name]
                t, g, distinct, value_counts = column_counts(text_column(col)[0])
                types[i] += t
                grid[i] += g
                if distinct is not None and len(distinct):
                    k = len(distinct)
                    yield _stage1_rows([i] * k, [VALUE] * k, distinct, value_counts)
        cols, sections, labels, totals = [-1], [READ], [""], [read]
        for section, table in ((TYPE, types), (GRID, grid)):
            rows, bins = np.nonzero(table)
            cols += rows.tolist()
            sections += [section] * len(rows)
            labels += [str(b) for b in bins.tolist()]
            totals += table[rows, bins].tolist()
        yield _stage1_rows(cols, sections, labels, totals)


@dataclass(frozen=True)
class ValueSelection:
    """Per partition of the AGGREGATED stage-1 counts (each key exactly once over all
    partitions, its total count): the schema mechanism's value part on the executor. Each value
    key gets its Gaussian noise (:meth:`SchemaMechanism.select_values`: OpenDP's discrete
    Gaussian from the executor's OS entropy, the column's public scale), keys whose noisy count
    does not exceed ``tau_c`` are dropped here, and of the rest at most ``keep`` per column (the
    largest) are sent. Fixed-size sections pass through exactly (the driver noises them).
    Executor memory: one batch plus ``keep`` keys per column."""

    mechanism: Any  # preprocess.SchemaMechanism

    def __call__(self, batches: Iterator[Any]) -> Iterator[Any]:
        import numpy as np
        import pyarrow as pa
        import pyarrow.compute as pc

        from .preprocess import top_values

        mech = self.mechanism
        best: dict[int, list[tuple[str, float]]] = {}
        names = ["col", "section", "label", "count", "noisy"]
        for batch in batches:
            col = batch.column(0).to_numpy(zero_copy_only=False)
            section = batch.column(1).to_numpy(zero_copy_only=False)
            fixed = section != VALUE
            if fixed.any():
                keep = pa.array(fixed)
                yield pa.RecordBatch.from_arrays(
                    [pc.filter(batch.column(j), keep) for j in range(4)]
                    + [pa.nulls(int(fixed.sum()), pa.float64())], names=names)
            for c in np.unique(col[~fixed]).tolist():
                if mech.header[c] not in mech.estimated:  # a public target: never noised or sent
                    continue
                rows = pa.array(~fixed & (col == c))
                labels = pc.filter(batch.column(2), rows).to_pylist()
                counts = pc.filter(batch.column(3), rows).to_numpy(zero_copy_only=False)
                chosen = mech.select_values(mech.header[c], labels, counts)
                best[c] = top_values(best.get(c, []) + chosen, mech.keep)
        out = [(c, lab, v) for c, kept in sorted(best.items()) for lab, v in kept]
        if out:
            yield pa.RecordBatch.from_arrays(
                [pa.array([c for c, _, _ in out], pa.int32()), pa.array([VALUE] * len(out), pa.int32()),
                 pa.array([lab for _, lab, _ in out], pa.string()), pa.nulls(len(out), pa.int64()),
                 pa.array([v for _, _, v in out], pa.float64())], names=names)


@dataclass(frozen=True)
class ScorePass:
    """Per partition: the noise-aware kernel's exact partial sums at one public ``theta``."""

    encoder: BatchEncoder
    model: Any
    theta: Any
    score_bound: float
    curvature_bound: float

    def __call__(self, batches: Iterator[Any]) -> Iterator[Any]:
        import pyarrow as pa

        from .kernel import ScorePartial, score_partial

        total = ScorePartial.zero(self.model.param_dim)
        for batch in batches:
            rows, _, _ = self.encoder(_data_columns(batch))
            total = total + score_partial(rows, self.model, self.theta, score_bound=self.score_bound,
                                          curvature_bound=self.curvature_bound)
        yield pa.RecordBatch.from_pydict({"name": ["score", "curvature"],
                                          "ints": [_ints_json(total.score), _ints_json(total.curvature)]})


@dataclass(frozen=True)
class MomentPass:
    """Per partition: linear regression's exact moment-matrix partial sums (issue 51)."""

    encoder: BatchEncoder
    bound: float

    def __call__(self, batches: Iterator[Any]) -> Iterator[Any]:
        import pyarrow as pa

        from .kernel import combine, moment_partial

        total = None
        for batch in batches:
            rows, _, _ = self.encoder(_data_columns(batch))
            part = moment_partial(rows, bound=self.bound)
            total = part if total is None else combine(total, part)
        if total is not None:
            yield pa.RecordBatch.from_pydict({"name": ["moments"], "ints": [_ints_json(total)]})


@dataclass(frozen=True)
class ResidualPass:
    """Per partition: linear regression's anchored-round exact partial sums (issue 51)."""

    encoder: BatchEncoder
    bound: float
    anchor: Any
    residual_clip: float
    residual_range: float
    square_scale: float

    def __call__(self, batches: Iterator[Any]) -> Iterator[Any]:
        import pyarrow as pa

        from .kernel import combine, residual_partial

        total = None
        for batch in batches:
            rows, _, _ = self.encoder(_data_columns(batch))
            part = residual_partial(rows, bound=self.bound, anchor=self.anchor, residual_clip=self.residual_clip,
                                    residual_range=self.residual_range, square_scale=self.square_scale)
            total = part if total is None else combine(total, part)
        if total is not None:
            yield pa.RecordBatch.from_pydict({"name": ["residuals"], "ints": [_ints_json(total)]})


@dataclass(frozen=True)
class MarginalsPass:
    """Per partition: the initialisation histograms' exact counts over the public bins."""

    encoder: BatchEncoder
    layout: Any

    def __call__(self, batches: Iterator[Any]) -> Iterator[Any]:
        import numpy as np
        import pyarrow as pa
        import torch

        total = np.zeros(self.layout.num_bins, dtype=np.int64)
        kept = 0
        for batch in batches:
            rows, _, _ = self.encoder(_data_columns(batch))
            counts = np.asarray(self.layout.counts(torch.from_numpy(np.ascontiguousarray(rows))))
            total += np.rint(counts).astype(np.int64)
            kept += rows.shape[0]
        yield pa.RecordBatch.from_pydict({"name": ["counts", "kept"],
                                          "ints": [_ints_json(total.tolist()), _ints_json([kept])]})


@dataclass(frozen=True)
class MaterialisePass:
    """Every (step, encoded row) pair of the DP-PSVI run: row ``r`` is in step ``t`` iff its
    keyed PRF coin says so (:class:`~dpsummary.private.prf.StepCoins`). Output rows go to the
    step files; nothing else leaves the executor."""

    encoder: BatchEncoder
    coins: Any
    file_index: Mapping[str, int]
    point_dim: int

    def __call__(self, batches: Iterator[Any]) -> Iterator[Any]:
        import numpy as np
        import pyarrow as pa

        names = [STEP_COLUMN, *point_columns(self.point_dim)]
        for batch in batches:
            ids = _row_ids(batch, self.file_index)
            rows, kept, _ = self.encoder(_data_columns(batch))
            pos, steps = self.coins.membership(ids[np.asarray(kept, dtype=np.int64)])
            picked = np.asarray(rows, dtype=np.float64)[pos]
            arrays = [pa.array(steps.astype(np.int32))] + [pa.array(picked[:, j]) for j in range(self.point_dim)]
            yield pa.RecordBatch.from_arrays(arrays, names=names)


def point_columns(point_dim: int) -> list[str]:
    return [f"p{j}" for j in range(point_dim)]


def _split_by_step(spark_out: Path, steps_dir: Path, point_dim: int) -> None:
    """Spark's output (each file sorted by step, every step in exactly one file) -> one Arrow
    IPC file per run of one step, ``<step>-<seq>.arrow``, mode 0600 (any order of the input stays
    exact). Streams batch by batch (memory: one batch)."""
    import numpy as np
    import pyarrow as pa
    import pyarrow.parquet as pq

    cols = point_columns(point_dim)
    schema = pa.schema([(c, pa.float64()) for c in cols])
    writer: Any = None
    sink: Any = None
    current = -1
    counter = iter(range(1 << 62))

    def close() -> None:
        if writer is not None:
            writer.close()
        if sink is not None:
            sink.close()

    try:
        for path in sorted(spark_out.glob("*.parquet")):
            current = -1  # a new file starts new step files
            for batch in pq.ParquetFile(path).iter_batches(batch_size=1 << 16):
                steps = batch.column(batch.schema.get_field_index(STEP_COLUMN)).to_numpy()
                cuts = np.flatnonzero(np.diff(steps)) + 1
                for a, b in zip(np.concatenate([[0], cuts]).tolist(), np.concatenate([cuts, [len(steps)]]).tolist(),
                                strict=True):
                    step = int(steps[a])
                    if step != current:
                        close()
                        # A step normally lies in one file; ``-<seq>`` keeps it exact if not.
                        seq = next(counter)
                        target = steps_dir / f"{step}-{seq}.arrow"
                        os.close(os.open(target, os.O_WRONLY | os.O_CREAT | os.O_EXCL, 0o600))
                        sink = pa.OSFile(str(target), "wb")
                        writer = pa.ipc.new_file(sink, schema)
                        current = step
                    writer.write_batch(batch.slice(a, b - a).select(cols))
    finally:
        close()


# =============================================================================================
# Driver side
# =============================================================================================
def _norm_uri(uri: str) -> str:
    """One spelling for a file URI (``file:/x`` and ``file:///x``, percent-encoding removed)."""
    from urllib.parse import unquote, urlsplit

    parts = urlsplit(uri)
    return f"{parts.scheme}://{parts.netloc}{unquote(parts.path)}"


def _file_index_of(files: list[str]) -> dict[str, int]:
    """Files sorted by their normalised URI -> index (public: file names, never content)."""
    return {f: i for i, f in enumerate(sorted({_norm_uri(f) for f in files}))}


def read_positions(spark: Any, location: str | Path) -> tuple[Any, dict[str, int]]:
    """The input as a DataFrame with two position columns (file URI, row index in the file),
    and the file index. ``location``: a Parquet file or directory, or a table name."""
    from pyspark.sql import functions as F

    loc = str(location)
    try:
        # Spark infers the schema here from the files' footers (a job that reads no record).
        df = spark.read.parquet(loc) if Path(loc).exists() or "://" in loc else spark.table(loc)
    except Exception as exc:  # noqa: BLE001 - a public fact about the input's schema: one line
        raise _unreadable(exc) from None
    files = df.inputFiles()
    index = _file_index_of(files)
    out = df.select("*", F.col("_metadata.file_path").alias(FILE_COLUMN),
                    F.col("_metadata.row_index").alias(ROW_COLUMN))
    return out, index


def _unreadable(exc: BaseException) -> SparkEngineError:
    """Spark could not open the input: its reader refuses a column's Parquet type (float16,
    decimals beyond 38 digits, TIME, TIMESTAMP(NANOS), UUID: issue 47) or the table is missing.
    Decided from the schema and the file list, before any reservation (the source is opened
    first), so the refusal is free and the same for every neighbouring data set. The message
    names Spark's error condition only (a type rule; Spark's text is not repeated)."""
    get = getattr(exc, "getCondition", None) or getattr(exc, "getErrorClass", None)
    condition = None
    try:
        condition = get() if get is not None else None
    except Exception:  # noqa: BLE001 - no condition: the exception type names it
        condition = None
    return SparkEngineError(
        f"--engine spark: Spark cannot read the input ({condition or type(exc).__name__}); Spark reads no float16, "
        "decimal wider than 38 digits, TIME, nanosecond TIMESTAMP or UUID column",
        fix="convert such columns (e.g. to string, double or int64) or use --engine local")


def _collect(df: Any, fn: Any) -> dict[str, Any]:
    """Run one full pass (``mapInArrow`` of ``fn`` per partition) and add the integer partials
    of every name exactly (Python integers: the total does not depend on the partitioning)."""
    from .kernel import combine
    from .mechanism import MechanismError

    try:
        rows = df.mapInArrow(fn, PAYLOAD_SCHEMA).collect()
    except Exception as exc:  # noqa: BLE001 - a Spark failure: one line, no worker traceback
        raise MechanismError(f"a Spark job failed ({type(exc).__name__}); see the Spark logs") from None
    parts: dict[str, list[Any]] = {}
    for row in rows:
        parts.setdefault(row["name"], []).append(_ints_from_json(row["ints"]))
    return {name: combine(*values) for name, values in parts.items()}


class SparkSource:
    """The private Parquet data of a release on Spark: the same interface as
    :class:`~dpsummary.private.source.PrivateSource` (noisy count; :meth:`encode`), answering only
    through accounted mechanisms. A release opens it before its first reservation
    (:func:`dpsummary.spark.launch.open_spark_source`), so that an unreachable cluster refuses
    for free: constructing it reads only metadata (the schema and the file list), never a record.
    ``on_close`` (the release's session scope) runs last in :meth:`close`."""

    __slots__ = ("_coins", "_df", "_file_index", "_header", "_on_close", "_randomness", "_rows",
                 "_scratch", "_spark", "_steps")

    def __init__(self, spark: Any, location: str | Path, scratch: Path, *, steps: int,
                 randomness: Any = None, coins: Any = None, partitions: int | None = None,
                 on_close: Callable[[], None] | None = None) -> None:
        from .mechanism import SystemRandomness

        self._spark = spark
        self._scratch = scratch
        self._df, self._file_index = read_positions(spark, location)
        if partitions is not None:
            # Any partitioning gives the same totals and the same step batches (row ids travel
            # with the rows); exposed for tests and for tuning on a cluster.
            self._df = self._df.repartition(partitions)
        self._steps = steps
        self._randomness = randomness if randomness is not None else SystemRandomness()
        #: Tests replay with a given :class:`StepCoins`; a release draws a fresh key.
        self._coins = coins
        self._on_close = on_close
        from ..data import normalise_text

        #: The data columns by normalised name (the local reader's header rule).
        self._header = [normalise_text(str(c)) for c in self._df.columns if c not in (FILE_COLUMN, ROW_COLUMN)]
        self._rows: int | None = None  # PRIVATE exact count of records read (stage 1's pass)

    def close(self) -> None:
        on_close, self._on_close = self._on_close, None
        stop = getattr(self._randomness, "close", None)
        if stop is not None:
            stop()  # noise pools drawn ahead (unused vectors discarded)
        if on_close is not None:
            on_close()

    def __enter__(self) -> SparkSource:
        return self

    def __exit__(self, *exc: object) -> None:
        self.close()

    def prepare(self, transform: Any, *, missing_numeric: str, unseen_category: str) -> None:
        """Nothing to do: every Spark pass encodes on the executors."""

    def noisy_record_count(self, *, noise_multiplier: float) -> float:
        """Records read (Parquet rows) plus Gaussian noise: sensitivity 1, noise on the driver."""
        from .mechanism import release_count

        if self._rows is None:
            self._count_rows()
        assert self._rows is not None
        return release_count(self._randomness, self._rows, noise_multiplier=noise_multiplier)

    def _count_rows(self) -> None:
        """Stage 1's record count, unless :meth:`estimate_schema`'s pass gave it: Spark's Parquet
        count (row-group footers; the same number of records the local reader reads from
        Parquet, which has no ragged rows)."""
        if self._rows is not None:
            return
        try:
            self._rows = int(self._df.count())
        except Exception as exc:  # noqa: BLE001
            raise _job_failed(exc) from None

    def _stage1_totals(self) -> Any:
        """The exact stage-1 counts aggregated ON THE EXECUTORS (a lazy DataFrame, one row per
        key with its total): :class:`Stage1Pass` per partition, then ``groupBy`` + ``sum`` (a
        shuffle by key). PRIVATE: only :class:`ValueSelection` reads it in a release."""
        from pyspark.sql import functions as F

        return (self._df.mapInArrow(Stage1Pass(tuple(self._header)), STAGE1_SCHEMA)
                .groupBy("col", "section", "label").agg(F.sum("count").alias("count")))

    def schema_counts(self) -> Any:
        """PRIVATE exact schema counts (a :class:`~dpsummary.private.preprocess.SchemaCounts`),
        collected from :meth:`_stage1_totals` (the frame the mechanism reads): for cross-engine
        replay tests only. A release never calls it (it would bring every distinct value to
        the driver); :meth:`estimate_schema` brings only the selected ones."""
        import numpy as np

        from ..postprocess.schema import NUM_GRID_BINS
        from .preprocess import SchemaCounts

        rows = _collect_rows(self._stage1_totals())
        counts = SchemaCounts(self._header)
        fixed = {name: (np.zeros(4, dtype=np.int64), np.zeros(NUM_GRID_BINS, dtype=np.int64)) for name in self._header}
        for r in rows:
            if r["section"] == READ:
                self._rows = int(r["count"])
            elif r["section"] in (TYPE, GRID):
                fixed[self._header[r["col"]]][r["section"] - TYPE][int(r["label"])] += int(r["count"])
            else:
                counts.add_totals(self._header[r["col"]], np.zeros(4), np.zeros(NUM_GRID_BINS), [r["label"]],
                                  [int(r["count"])])
        for name, (types, grid) in fixed.items():
            counts.add_totals(name, types, grid, [], [])
        return counts

    def estimate_schema(self, *, noise_multiplier: float, target: str | None, delta: float,
                        target_classes: int | None = None, public_target: Any = None,
                        count_target: bool = False) -> Any:
        """DP schema estimation on Spark: the local engine's mechanism (the same
        :class:`~dpsummary.private.preprocess.SchemaMechanism`, with the release's target rule of
        :func:`~dpsummary.private.source.release_schema`) with its value part distributed.

        One job: :meth:`_stage1_totals` (exact counts, aggregated by key on the executors), then
        :class:`ValueSelection` per aggregated partition (each value key noised and thresholded on
        its executor; at most ``keep`` survivors per column and partition). The driver receives
        the record count and the fixed-size type and grid counts (``C x 87`` numbers), adds their
        noise here in one call, and receives only value keys that passed ``tau_c``: at most
        ``keep x C x P`` of them (``P``: the shuffle's partition count, a public setting),
        whatever the number of distinct values. Same distribution as the local engine: every
        coordinate gets an independent discrete Gaussian of the same public scale whether it is
        noised in one call or in pieces (:class:`~dpsummary.private.preprocess.SchemaMechanism`);
        the threshold and the top-``keep`` cut are the same functions, and top-``keep`` of the
        union of per-partition top-``keep`` lists is the top-``keep`` of all survivors
        (:func:`~dpsummary.private.preprocess.top_values`). Stage 1's exact record count comes
        from the same pass."""
        from .preprocess import DEFAULT_TARGET_SHARE, SchemaMechanism

        # release_schema's target rule: an even noise share when the class count is public.
        mech = SchemaMechanism.plan(self._header, noise_multiplier=noise_multiplier, target=target, delta=delta,
                                    target_classes=target_classes,
                                    target_share=None if target_classes is not None else DEFAULT_TARGET_SHARE,
                                    public_target=public_target, count_target=count_target)
        rows = _collect_rows(self._stage1_totals().mapInArrow(ValueSelection(mech), SELECTED_SCHEMA))
        self._rows, result = release_selected(mech, rows)
        return result

    def encode(self, transform: Any, *, missing_numeric: str, unseen_category: str) -> SparkEncoded:
        encoder = BatchEncoder(transform, missing_numeric, unseen_category)
        return SparkEncoded(self, encoder)


def release_selected(mech: Any, rows: list[Any]) -> tuple[int, Any]:
    """The driver's part of stage 1 on Spark, from what :class:`ValueSelection` sent (rows of
    :data:`SELECTED_SCHEMA`, any order and partitioning): ``(exact record count, the schema
    release)``. The fixed-size type and grid counts (``C x 87``, zero where absent) get their
    Gaussian noise here, in one call at each column's public scale; the value keys already
    carry theirs and passed ``tau_c`` on the executors; the per-partition top-``keep`` lists
    merge exactly (:func:`~dpsummary.private.preprocess.top_values`, in
    :meth:`~dpsummary.private.preprocess.SchemaMechanism.release`, post-processing)."""
    import numpy as np

    from ..postprocess.schema import NUM_GRID_BINS

    full = mech.header  # the rows' column indices refer to the whole header
    header = mech.estimated  # without a public target, whose counts are dropped here unnoised
    exact = np.zeros((len(full), 4 + NUM_GRID_BINS), dtype=np.int64)
    values: dict[str, list[tuple[str, float]]] = {name: [] for name in header}
    read = 0
    for r in rows:
        if r["section"] == READ:
            read += int(r["count"])
        elif r["section"] == TYPE:
            exact[r["col"], int(r["label"])] += int(r["count"])
        elif r["section"] == GRID:
            exact[r["col"], 4 + int(r["label"])] += int(r["count"])
        elif full[r["col"]] in values:
            values[full[r["col"]]].append((r["label"], float(r["noisy"])))
    exact = exact[[full.index(name) for name in header]]
    scales = np.repeat([mech.scale(name) for name in header], 4 + NUM_GRID_BINS)
    noisy = mech.noise(exact.reshape(-1).astype(np.float64), scales).reshape(exact.shape)
    return read, mech.release({name: noisy[i, :4] for i, name in enumerate(header)},
                              {name: noisy[i, 4:] for i, name in enumerate(header)}, values)


def _collect_rows(df: Any) -> list[Any]:
    """``df.collect()`` with a Spark failure as one line (no worker traceback)."""
    try:
        return list(df.collect())
    except Exception as exc:  # noqa: BLE001
        raise _job_failed(exc) from None


def _job_failed(exc: BaseException) -> Exception:
    from .mechanism import MechanismError

    return MechanismError(f"a Spark job failed ({type(exc).__name__}); see the Spark logs")


class SparkEncoded:
    """Records in model space on Spark (encoded per batch on the executors, never collected)."""

    __slots__ = ("_encoder", "_source", "records")

    def __init__(self, source: SparkSource, encoder: BatchEncoder) -> None:
        self._source = source
        self._encoder = encoder
        self.records = SparkRecords(source, encoder)

    def noisy_score_statistics(self, model: Any, theta: Any, **mechanism: float) -> Any:
        return self.records.noisy_score_statistics(model, theta, **mechanism)

    def noisy_moment_matrix(self, **mechanism: float) -> Any:
        return self.records.noisy_moment_matrix(**mechanism)

    def noisy_residual_vector(self, **mechanism: Any) -> Any:
        return self.records.noisy_residual_vector(**mechanism)

    def close(self) -> None:
        """Step files go with the source's private directory (:meth:`SparkSource.close`)."""

    def noisy_quality_counts(self, *, noise_multiplier: float) -> Any:
        """One full pass: the exact per-rule counts, then one Gaussian mechanism on the driver
        (:func:`~dpsummary.private.mechanism.noisy_indicator_totals`, the local engine's path)."""
        from ..postprocess.quality import QUALITY_COUNTS, QualityCounts
        from .mechanism import noisy_indicator_totals

        totals = _collect(self._source._df, QualityPass(self._encoder))
        import numpy as np

        counts = np.array([float(int(v)) for v in totals["quality"]] if "quality" in totals
                          else [0.0] * len(QUALITY_COUNTS))
        noisy = noisy_indicator_totals(self._source._randomness, counts, noise_multiplier=noise_multiplier)
        return QualityCounts(dict(zip(QUALITY_COUNTS, (float(v) for v in noisy), strict=True)), noise_multiplier)


class SparkRecords:
    """The mechanisms of :class:`~dpsummary.private.mechanism.PrivateRecords` on Spark: the same
    kernel (:mod:`dpsummary.private.kernel`) on the executors, the same noise on the driver."""

    __slots__ = ("_encoder", "_next_step", "_source", "_step_dir", "_step_rate")

    def __init__(self, source: SparkSource, encoder: BatchEncoder) -> None:
        self._source = source
        self._encoder = encoder
        self._step_dir: Path | None = None
        self._step_rate: float | None = None
        self._next_step = 0

    # ---- full passes ------------------------------------------------------------------------
    def noisy_score_statistics(self, model: Any, theta: Any, *, score_bound: float, curvature_bound: float,
                               score_noise_multiplier: float, curvature_noise_multiplier: float) -> Any:
        """One full pass of the noise-aware kernel, then the two Gaussian releases on the driver
        (:func:`~dpsummary.private.score_stats.release_statistics`, the local engine's release)."""
        from .score_stats import release_statistics

        total = self.score_totals(model, theta, score_bound=score_bound, curvature_bound=curvature_bound)
        return release_statistics(total, self._source._randomness, model.param_dim, score_bound=score_bound,
                                  curvature_bound=curvature_bound, score_noise_multiplier=score_noise_multiplier,
                                  curvature_noise_multiplier=curvature_noise_multiplier)

    def score_totals(self, model: Any, theta: Any, *, score_bound: float, curvature_bound: float) -> Any:
        """PRIVATE exact totals of one noise-aware round (a ``kernel.ScorePartial``): for the
        mechanism above and for replay tests only."""
        from .kernel import ScorePartial

        fn = ScorePass(self._encoder, model, theta.detach(), float(score_bound), float(curvature_bound))
        totals = _collect(self._source._df, fn)
        if not totals:
            return ScorePartial.zero(model.param_dim)
        return ScorePartial(totals["score"], totals["curvature"])

    def noisy_moment_matrix(self, *, bound: float, noise_multiplier: float) -> Any:
        """One full pass of linear regression's moment kernel, then the Gaussian release on the
        driver (:func:`~dpsummary.private.moments.release_moments`, the local engine's release)."""
        from .kernel import zero_partial
        from .moments import release_moments

        dim = self._encoder.transform.point_dim + 1
        totals = _collect(self._source._df, MomentPass(self._encoder, float(bound)))
        total = totals["moments"] if "moments" in totals else zero_partial(dim * (dim + 1) // 2)
        return release_moments(total, self._source._randomness, dim, bound=bound, noise_multiplier=noise_multiplier)

    def noisy_residual_vector(self, *, bound: float, noise_multiplier: float, anchor: Any, residual_clip: float,
                              residual_range: float, square_scale: float) -> Any:
        """One full pass of the anchored round's kernel, then the Gaussian release on the driver
        (:func:`~dpsummary.private.moments.release_residuals`, the local engine's release)."""
        from .kernel import zero_partial
        from .moments import release_residuals

        dim = self._encoder.transform.point_dim + 1
        totals = _collect(self._source._df, ResidualPass(self._encoder, float(bound), anchor.detach(),
                                                         float(residual_clip), float(residual_range),
                                                         float(square_scale)))
        total = totals["residuals"] if "residuals" in totals else zero_partial(dim)
        return release_residuals(total, self._source._randomness, dim, bound=bound, noise_multiplier=noise_multiplier)

    def noisy_marginals(self, layout: Any, *, noise_multiplier: float) -> Any:
        """One full pass of exact histogram counts, then one Gaussian mechanism on the driver
        (:func:`~dpsummary.private.mechanism.release_marginal_counts`, the local engine's release)."""
        import numpy as np

        from .mechanism import MechanismError, release_marginal_counts

        if layout.num_features > self._encoder.transform.point_dim:
            raise MechanismError("the histogram layout does not match the records")
        totals = _collect(self._source._df, MarginalsPass(self._encoder, layout))
        kept = int(totals["kept"][0]) if "kept" in totals else 0
        counts = (np.array([float(int(v)) for v in totals["counts"]]) if "counts" in totals
                  else np.zeros(layout.num_bins))
        return release_marginal_counts(self._source._randomness, layout, counts, kept,
                                       noise_multiplier=noise_multiplier)

    # ---- DP-PSVI: steps from the pre-materialised step files ---------------------------------
    def _materialise(self, sample_rate: float) -> None:
        """The one pass: every (step, encoded row) pair, shuffled by step into a few Parquet
        files (Spark's committer: a retried task never duplicates a row), then split on the
        driver into one Arrow file per step. All inside the private directory."""
        from .prf import StepCoins

        src = self._source
        coins = src._coins if src._coins is not None else StepCoins.generate(sample_rate, src._steps)
        if coins.sample_rate != sample_rate or coins.steps != src._steps:
            raise SparkEngineError("internal: the step coins do not match the planned rate and steps",
                                   fix="report this bug")
        spark_out = src._scratch / "pairs"
        steps_dir = src._scratch / "steps"
        steps_dir.mkdir(mode=0o700)
        dim = self._encoder.transform.point_dim
        fn = MaterialisePass(self._encoder, coins, src._file_index, dim)
        schema = ", ".join([f"{STEP_COLUMN} int", *(f"{c} double" for c in point_columns(dim))])
        # A public number of output files (not one per step and input partition).
        files = max(1, min(src._steps, int(src._spark.sparkContext.defaultParallelism)))
        try:
            (src._df.mapInArrow(fn, schema).repartition(files, STEP_COLUMN)
             .sortWithinPartitions(STEP_COLUMN).write.mode("overwrite").parquet(spark_out.as_uri()))
        except Exception as exc:  # noqa: BLE001
            raise _job_failed(exc) from None
        if not (spark_out / "_SUCCESS").exists():  # always written: a public fact about storage
            raise SparkEngineError("the step files written by the executors are not visible on the driver",
                                   fix="point TMPDIR at storage that driver and executors share")
        try:
            _split_by_step(spark_out, steps_dir, dim)
        finally:
            shutil.rmtree(spark_out, ignore_errors=True)
        self._step_dir = steps_dir
        self._step_rate = sample_rate

    def step_rows(self, step: int) -> Any:
        """Model-space rows of one step's batch (PRIVATE; from the step's file)."""
        import numpy as np
        import pyarrow as pa

        assert self._step_dir is not None
        dim = self._encoder.transform.point_dim
        parts = [np.zeros((0, dim), dtype=np.float64)]
        for path in sorted(self._step_dir.glob(f"{step}-*.arrow")):
            with pa.memory_map(str(path)) as source:
                table = pa.ipc.open_file(source).read_all()
            if table.num_rows:
                parts.append(np.column_stack([table.column(c).to_numpy() for c in point_columns(dim)]))
            path.unlink()  # each step's batch is used once
        return np.ascontiguousarray(np.concatenate(parts), dtype=np.float64)

    def expect_clipped_sums(self, *, num_draws: int, noise_multiplier: float, count: int) -> None:
        """As :meth:`PrivateRecords.expect_clipped_sums`: the steps' noise may be drawn ahead."""
        prepare = getattr(self._source._randomness, "prepare_gaussian", None)
        if prepare is not None:
            prepare(dim=num_draws, noise_std=noise_multiplier, clip_norm=1.0, count=count)

    def noisy_clipped_sum(self, model: Any, theta: Any, *, sample_rate: float, clip_norm: float,
                          noise_multiplier: float) -> Any:
        """Step t of DP-PSVI (t = 0, 1, ... in call order): that step's pre-materialised Poisson
        batch through the shared kernel, then the noise once (the local engine's path)."""
        from .mechanism import MechanismError, PrivateRecords

        if not (clip_norm > 0 and noise_multiplier > 0):
            raise MechanismError("clip_norm and noise_multiplier must be positive")
        if self._step_dir is None:
            self._materialise(sample_rate)
        if sample_rate != self._step_rate or self._next_step >= self._source._steps:
            raise MechanismError("more steps, or another rate, than the materialised batches")
        rows = self.step_rows(self._next_step)
        self._next_step += 1
        # The local engine's mechanism on the step's batch, already Poisson-sampled by the PRF
        # coins: at rate 1 its sampler includes every row (exactly), then kernel + noise once.
        batch = PrivateRecords(rows, randomness=self._source._randomness)
        try:
            return batch.noisy_clipped_sum(model, theta, sample_rate=1.0, clip_norm=clip_norm,
                                           noise_multiplier=noise_multiplier)
        finally:
            batch.close()
