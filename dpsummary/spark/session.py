"""Spark orchestration of ``dpsummary release --engine spark`` that never sees a record.

Public engine options (the master URL, ``--spark-conf``), the pre-reservation checks on public
facts (pyspark and Java installed, the Parquet input's column names), the session (its private
0700 scratch directory for Spark's local, spill and JVM temp dirs; logs at WARN, UI off,
speculation off), shipping the installed package to the executors, and the probe job that checks
the executors import the driver's dpsummary before any reservation (it reads no record).

Everything that reads records or draws privacy randomness on Spark (the passes, the keyed PRF
coins, the step files, the noise on the driver) is in :mod:`dpsummary.private.spark_engine`;
:func:`dpsummary.spark.launch.open_spark_source` joins the two for a release. pyspark is
imported lazily, inside functions (install the ``spark`` extra and Java 17).
"""

from __future__ import annotations

import os
import re
import shutil
import stat
import sys
import tempfile
import warnings
from collections.abc import Iterator, Mapping
from contextlib import contextmanager
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from ..errors import Refusal

#: Default master for ``--engine spark`` (tests, CI, one machine).
DEFAULT_MASTER = "local[2]"


class SparkEngineError(Refusal):
    """The Spark engine cannot run (pyspark or Java missing, bad --spark-conf, executors without
    dpsummary): a public fact, decided before the reservation; one line."""


#: The fix of ``--engine spark`` without pyspark or Java (the reason names what to install).
SPARK_MISSING_FIX = "install what is missing, or use --engine local"


def to_parquet_fix(path: Path) -> str:
    """How to turn a CSV into the Parquet file ``--engine spark`` reads (pyarrow, a dependency of
    dpsummary, does it in one line; the file is the user's own, so nothing is revealed)."""
    src = str(path)
    dst = str(path.with_suffix(".parquet"))
    return ("convert it once with pyarrow: python -c \"import pyarrow.csv as c, pyarrow.parquet as p; "
            f"p.write_table(c.read_csv({src!r}), {dst!r})\", then pass {dst}; or use --engine local, "
            "which reads CSV")


def spark_available() -> str | None:
    """None if pyspark and a Java runtime are present, else a one-line reason (public)."""
    try:
        import pyspark  # noqa: F401
    except ImportError:
        return "pyspark is not installed (pip install 'dpsummary[spark]')"
    java_home = os.environ.get("JAVA_HOME")
    if not (shutil.which("java") or (java_home and Path(java_home, "bin", "java").exists())):
        return "no Java runtime found (install Java 17, e.g. openjdk-17-jre-headless)"
    return None


def parse_spark_conf(items: list[str] | None) -> dict[str, str]:
    """``["k=v", ...]`` from ``--spark-conf`` to a dict; a malformed item, or a setting the
    noise argument does not allow (:func:`unsafe_setting`), is a public error."""
    out: dict[str, str] = {}
    for item in items or []:
        key, sep, value = item.partition("=")
        if not sep or not key.strip():
            raise SparkEngineError(f"--spark-conf expects key=value, got {item!r}",
                                   fix="pass e.g. --spark-conf spark.executor.memory=4g")
        out[key.strip()] = value.strip()
    reason = unsafe_setting(out.get)
    if reason is not None:
        raise SparkEngineError(f"--spark-conf {reason}", fix="leave that setting out (or set it to its default)")
    return out


#: Spark settings the release's privacy argument depends on, with the values it forbids
#: (compared case-insensitively) and why. Speculation: the driver keeps the FIRST of two
#: independently noised attempts of a task to finish, and OpenDP's sampler takes longer for some
#: noise values than others, so the kept noise is no longer the declared Gaussian (issue 47). A
#: rebase mode of EXCEPTION: one record's date before 1582 in a file written by a legacy Spark
#: fails the whole pass after the charge (the default, CORRECTED, reads it per record).
FORBIDDEN_SETTINGS: dict[str, tuple[str, str]] = {
    "spark.speculation": ("true", "speculative attempts would let the fastest of two independently noised "
                                  "attempts decide which noise is released"),
    "spark.sql.parquet.datetimeRebaseModeInRead": ("exception", "one record's ancient date would fail the whole "
                                                                "pass after the charge"),
    "spark.sql.parquet.int96RebaseModeInRead": ("exception", "one record's ancient timestamp would fail the "
                                                             "whole pass after the charge"),
}


def unsafe_setting(get: Any) -> str | None:
    """The first forbidden setting (:data:`FORBIDDEN_SETTINGS`) among the values ``get(key)``
    returns (None: not set), as ``"key=value: why; ..."``, else None. A public fact."""
    for key, (bad, why) in FORBIDDEN_SETTINGS.items():
        value = get(key)
        if value is not None and str(value).strip().lower() == bad:
            return f"{key}={value}: {why}; dpsummary runs Spark without it (remove the setting)"
    return None


def check_session_settings(spark: Any) -> None:
    """Before any reservation: the EFFECTIVE values of :data:`FORBIDDEN_SETTINGS`, read back
    from the running session (core settings from the SparkContext's conf, SQL settings from the
    session's), whatever set them (``--spark-conf``, ``spark-defaults.conf``, an active
    session). A forbidden value is a one-line :class:`SparkEngineError`."""
    core = spark.sparkContext.getConf()

    def get(key: str) -> str | None:
        value = core.get(key, None)
        if value is None:
            try:
                value = spark.conf.get(key, None)
            except Exception:  # noqa: BLE001 - a setting the session does not know is unset
                value = None
        return value

    reason = unsafe_setting(get)
    if reason is not None:
        raise SparkEngineError(f"--engine spark: the Spark session has {reason}",
                               fix="remove that setting from spark-defaults.conf or the active session")


def public_header(location: str | Path, policy: Any) -> list[str]:
    """The checks ``--engine spark`` makes before the reservation, all on public facts: pyspark
    and Java are installed, and the Parquet input's column names (its metadata; no record is
    read). Returns the header; raises :class:`SparkEngineError` (one line). Without a schema in
    the policy, stage 1 estimates it on Spark
    (:meth:`dpsummary.private.spark_engine.SparkSource.estimate_schema`)."""
    reason = spark_available()
    if reason is not None:
        raise SparkEngineError(f"--engine spark: {reason}", fix=SPARK_MISSING_FIX)
    path = Path(location)
    if path.is_dir():
        files = sorted(f for f in path.rglob("*.parquet") if not any(part.startswith((".", "_"))
                                                                      for part in f.relative_to(path).parts))
        if not files:
            raise SparkEngineError(f"no Parquet files under {path}",
                                   fix="pass a .parquet file or a directory that holds some")
        path = files[0]
    elif path.suffix.lower() not in (".parquet", ".pq"):
        raise SparkEngineError(f"--engine spark reads Parquet (a .parquet file or a directory of them), not {path.name}",
                               fix=to_parquet_fix(path))
    else:
        files = [path]
    from ..data import read_header

    header = read_header(path)
    for f in files:
        bad = spark_unsafe_column(f)
        if bad is not None:
            raise SparkEngineError(
                f"--engine spark: column {bad[0]!r} of {f.name} is {bad[1]}: {bad[2]}",
                fix="convert it (e.g. to string, double or int64 microseconds) or use --engine local")
    return header


def spark_unsafe_column(path: Path) -> tuple[str, str, str] | None:
    """The first column of a Parquet file (its footer's schema: public metadata, no record)
    whose type Spark cannot read record by record, as ``(column, type, why)``, else None.

    Issue 47: Spark refuses float16, decimals wider than 38 digits, TIME, nanosecond TIMESTAMP
    and UUID columns when it opens the file (a job failure after the charge, were it not
    checked here), and it converts a millisecond TIMESTAMP to microseconds with a checked
    multiply, so ONE extreme value (beyond about year 294,000) fails the whole pass after the
    charge: a record deciding the release. The local engine reads all of them per record. A
    rule on every leaf column's Parquet type (nested fields included: Spark reads them too)."""
    import pyarrow.parquet as pq

    try:
        schema = pq.ParquetFile(path).schema
    except (OSError, ValueError):
        raise SparkEngineError(f"cannot read the Parquet file {path}",
                               fix="check that it is a Parquet file (pyarrow.parquet.read_table opens it)") from None
    unreadable = "Spark's Parquet reader cannot read it"
    for i in range(len(schema)):
        column = schema.column(i)
        logical = str(column.logical_type)
        name = column.path.split(".")[0]
        if logical == "Float16":
            return name, "float16", unreadable
        if logical.startswith("Decimal(") and column.precision > 38:
            return name, f"a decimal of {column.precision} digits", "Spark reads at most 38 digits"
        if logical.startswith("Time("):
            return name, "a TIME", unreadable
        if logical == "UUID":
            return name, "a UUID", unreadable
        if logical.startswith("Timestamp(") and "timeUnit=nanoseconds" in logical:
            return name, "a nanosecond TIMESTAMP", unreadable
        if logical.startswith("Timestamp(") and "timeUnit=milliseconds" in logical:
            return name, "a millisecond TIMESTAMP", ("Spark's reader fails the whole pass on one value beyond "
                                                         "its microsecond range")
    return None


#: The master URL forms Spark accepts (local modes, standalone, YARN, Kubernetes, Mesos).
MASTER_URL = re.compile(r"local(\[(\d+|\*)(,\s*\d+)?\])?|local-cluster\[\d+,\s*\d+,\s*\d+\]"
                        r"|spark://[^\s/]+(:\d+)?(,[^\s/]+(:\d+)?)*|yarn|k8s://\S+|mesos://\S+")


@dataclass(frozen=True)
class SparkOptions:
    """Public engine options from the CLI: the master URL and extra Spark configuration.

    The master URL's form is checked here, before the reservation (a typo is a public fact);
    whether the cluster answers is known only when the session starts, after it."""

    master: str = DEFAULT_MASTER
    conf: Mapping[str, str] = field(default_factory=dict)

    def __post_init__(self) -> None:
        if not MASTER_URL.fullmatch(self.master):
            raise SparkEngineError(f"--spark-master {self.master!r} is not a Spark master URL",
                                   fix="pass local, local[N], local[*], spark://HOST:PORT, yarn or k8s://URL")


def private_dir(prefix: str = "dpsummary-spark-") -> Path:
    """A fresh directory readable only by this user (0700) for step files and Spark's spill."""
    path = Path(tempfile.mkdtemp(prefix=prefix))
    os.chmod(path, stat.S_IRWXU)
    return path


def _quiet_spark(spark: Any) -> None:
    spark.sparkContext.setLogLevel("WARN")


def build_session(options: SparkOptions, scratch: Path) -> Any:
    """A SparkSession whose temp and spill dirs are inside ``scratch``, logs at WARN, no UI.

    If a session is already active (tests share one), it is reused as is: its local dirs were
    fixed when it was created (the tests' fixture puts them in a private temp dir too)."""
    reason = spark_available()
    if reason is not None:
        raise SparkEngineError(f"--engine spark: {reason}", fix=SPARK_MISSING_FIX)
    warnings.filterwarnings("ignore", category=FutureWarning, module=r"pyspark\..*")
    from pyspark.sql import SparkSession

    active = SparkSession.getActiveSession()
    if active is not None:
        _quiet_spark(active)
        return active
    spill = scratch / "spark-local"
    spill.mkdir(mode=0o700, exist_ok=True)
    java_opts = f"-Djava.io.tmpdir={spill}"
    builder = (SparkSession.builder.master(options.master).appName("dpsummary")
               .config("spark.local.dir", str(spill))
               .config("spark.driver.extraJavaOptions", java_opts)
               .config("spark.executor.extraJavaOptions", java_opts)
               .config("spark.ui.enabled", "false")
               .config("spark.ui.showConsoleProgress", "false")
               .config("spark.speculation", "false")
               .config("spark.sql.execution.arrow.maxRecordsPerBatch", "65536")
               .config("spark.sql.sources.partitionOverwriteMode", "static"))
    python = worker_python(options)
    if python is not None:
        builder = builder.config("spark.pyspark.python", python)
    if options.master.startswith("local"):
        builder = builder.config("spark.pyspark.driver.python", sys.executable)
    for key, value in options.conf.items():
        builder = builder.config(key, value)
    # PySpark takes the workers' interpreter from PYSPARK_PYTHON when the context starts (the
    # spark.pyspark.python setting is read only by spark-submit): set it for that moment only.
    saved = os.environ.get("PYSPARK_PYTHON")
    if python is not None:
        os.environ["PYSPARK_PYTHON"] = python
    try:
        spark = builder.getOrCreate()
    finally:
        if python is not None:
            if saved is None:
                os.environ.pop("PYSPARK_PYTHON", None)
            else:
                os.environ["PYSPARK_PYTHON"] = saved
    _quiet_spark(spark)
    return spark


def worker_python(options: SparkOptions) -> str | None:
    """The executors' Python: ``spark.pyspark.python`` from ``--spark-conf`` if given; for a
    local master the driver's own interpreter (no activated virtual environment needed); else
    None (the cluster's default, ``PYSPARK_PYTHON`` of the executors' environment)."""
    given = options.conf.get("spark.pyspark.python")
    if given:
        return given
    return sys.executable if options.master.startswith("local") else None


# ---- the executors' dpsummary: shipped, then checked by a probe that touches no record ------
#: Modules an executor imports to run the engine's passes (the probe imports them all).
EXECUTOR_MODULES = ("numpy", "pyarrow", "pandas", "torch", "opendp.measurements", "dpsummary.data.encode",
                    "dpsummary.private.kernel", "dpsummary.private.preprocess", "dpsummary.private.spark_engine",
                    "dpsummary.private.prf")


def package_zip(scratch: Path) -> Path:
    """A zip of the installed dpsummary package (its ``.py`` files and package data), written
    inside the private directory, for :meth:`SparkContext.addPyFile`."""
    import zipfile

    from .. import __version__

    root = Path(__file__).resolve().parents[1]
    out = scratch / f"dpsummary-{__version__}.zip"
    with zipfile.ZipFile(out, "w", zipfile.ZIP_DEFLATED) as zf:
        for path in sorted(root.rglob("*")):
            rel = path.relative_to(root.parent)
            if path.is_file() and "__pycache__" not in rel.parts and path.suffix != ".pyc":
                zf.write(path, rel.as_posix())
    return out


def ship_package(spark: Any, scratch: Path) -> None:
    """Ship this dpsummary to the executors (PySpark's ``addPyFile`` of a zip: on every
    executor's ``sys.path`` ahead of any installed copy), once per SparkContext."""
    from .. import __version__

    sc = spark.sparkContext
    if f"dpsummary-{__version__}.zip" in (getattr(sc, "_python_includes", None) or []):
        return
    sc.addPyFile(str(package_zip(scratch)))


def _probe_function() -> Any:
    """The probe run on the executors (a nested function: pickled by value, so unpickling it
    needs no dpsummary). It touches no record: it imports :data:`EXECUTOR_MODULES`."""
    modules = EXECUTOR_MODULES

    def probe(_: Any) -> tuple[str, str]:
        import importlib

        try:
            for name in modules:
                importlib.import_module(name)
            import dpsummary

            return ("ok", str(dpsummary.__version__))
        except Exception as exc:  # noqa: BLE001 - reported to the driver as one line
            return ("error", f"{type(exc).__name__}: {exc}".splitlines()[0][:200])

    return probe


def _arrow_probe_function() -> Any:
    """The probe as a ``mapInArrow`` function (nested: pickled by value): the release's passes
    run through ``mapInArrow``, whose driver side needs pandas and whose executor side needs
    pyarrow, so the probe goes through exactly that path. It reads no record (its input is
    ``spark.range``, a public constant)."""
    probe = _probe_function()

    def arrow_probe(batches: Any) -> Any:
        import pyarrow as pa

        for _ in batches:
            pass
        kind, detail = probe(None)
        yield pa.RecordBatch.from_pydict({"kind": [kind], "detail": [detail]})

    return arrow_probe


def executor_report(spark: Any, scratch: Path) -> list[tuple[str, str]]:
    """Ship the package, then run the probe in one task per default-parallelism slot, first as a
    plain RDD map (its answer names a missing module), then through ``mapInArrow`` (the path
    every release pass takes: pyspark's pandas and Arrow requirements, issue 47): the distinct
    answers (("ok", version) or ("error", one line)). A job that fails (e.g. the executors'
    Python cannot start) is one ("job", exception type) answer; a package pyspark itself wants
    on the driver (pandas for ``mapInArrow``) is one ("driver", its one-line message) answer."""
    ship_package(spark, scratch)
    sc = spark.sparkContext
    slots = max(1, int(sc.defaultParallelism))
    try:
        answers = set(sc.parallelize(range(slots), slots).map(_probe_function()).collect())
    except Exception as exc:  # noqa: BLE001 - a worker that cannot start: one line, no traceback
        return [("job", type(exc).__name__)]
    if answers != {("ok", _version())}:
        return sorted(answers)
    try:
        frame = spark.range(0, slots, 1, slots).mapInArrow(_arrow_probe_function(), "kind string, detail string")
    except Exception as exc:  # noqa: BLE001 - pyspark's own driver-side requirement check (pandas)
        return [("driver", _one_line(exc))]
    try:
        return sorted({(r["kind"], r["detail"]) for r in frame.collect()})
    except Exception as exc:  # noqa: BLE001
        return [("job", type(exc).__name__)]


def _version() -> str:
    from .. import __version__

    return str(__version__)


def _one_line(exc: BaseException) -> str:
    """The first line of an exception's message, without pyspark's ``[CONDITION]`` prefix
    decoration kept (it names the missing package; no data is involved)."""
    text = (str(exc).strip().splitlines() or [""])[0]
    return f"{type(exc).__name__}: {text}"[:200]


def check_executors(spark: Any, scratch: Path, options: SparkOptions) -> None:
    """Before any reservation: the executors import the driver's dpsummary version (a public
    fact about the cluster; no record is read). Else a one-line :class:`SparkEngineError`."""
    from .. import __version__

    answers = executor_report(spark, scratch)
    bad = [a for a in answers if a != ("ok", __version__)]
    if not bad:
        return
    kind, detail = bad[0]
    if kind == "driver":
        raise SparkEngineError(
            f"--engine spark: pyspark cannot run the engine's Arrow passes on this driver ({detail})",
            fix="install dpsummary with its 'spark' extra (pip install 'dpsummary[spark]'), which includes it")
    if kind == "ok":
        what = f"import dpsummary {detail}, not the driver's {__version__}"
    elif kind == "job":
        what = f"could not run the probe job ({detail})"
    else:
        what = f"cannot import dpsummary {__version__} and its dependencies ({detail})"
    python = worker_python(options) or "the cluster's default python"
    raise SparkEngineError(
        f"--engine spark: the Spark executors ({python}) {what}",
        fix="install dpsummary with its 'spark' extra in the executors' Python, or point them at one that has it "
        "(--spark-conf spark.pyspark.python=/path/to/python)")


@contextmanager
def spark_scope(options: SparkOptions) -> Iterator[tuple[Any, Path]]:
    """(session, private dir) for one release; the dir (step files, spill) is deleted and a
    session created here is stopped on every exit path."""
    reason = spark_available()
    if reason is not None:
        raise SparkEngineError(f"--engine spark: {reason}", fix=SPARK_MISSING_FIX)
    from pyspark.sql import SparkSession

    scratch = private_dir()
    created = SparkSession.getActiveSession() is None
    spark = None
    try:
        spark = build_session(options, scratch)
        yield spark, scratch
    finally:
        try:
            if created and spark is not None:
                spark.stop()
        finally:
            shutil.rmtree(scratch, ignore_errors=True)
