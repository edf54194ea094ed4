"""Open a release's Spark source before its first reservation (no record is read here).

Joins the public orchestration of :mod:`dpsummary.spark.session` (the private scratch directory,
the session, the executor probe) with the private data source of
:mod:`dpsummary.private.spark_engine`, which reads records only when a mechanism asks.
"""

from __future__ import annotations

from pathlib import Path

from ..private.spark_engine import SparkSource
from .session import (
    SparkEngineError,
    SparkOptions,
    check_executors,
    check_session_settings,
    spark_scope,
)


def open_spark_source(location: str | Path, options: SparkOptions, *, steps: int) -> SparkSource:
    """For a release, BEFORE any reservation: a private 0700 directory, a SparkSession (or the
    active one) whose temp/spill dirs live inside it, the executor probe, and the input's metadata
    (schema, file list; no record is read until a mechanism runs). A session that cannot start,
    one whose effective settings the noise argument forbids (speculation; checked by reading
    them back from the session), or executors without the driver's dpsummary, is a public,
    one-line :class:`SparkEngineError`.
    :meth:`SparkSource.close` (or its context manager) stops a session started here and deletes
    the directory: step files never outlive the release."""
    scope = spark_scope(options)
    try:
        spark, scratch = scope.__enter__()
    except SparkEngineError:
        raise
    except Exception as exc:
        # Whether a cluster answers is a public fact, and the release opens this source before
        # any reservation, so this refusal costs no budget. The message names the exception
        # type only (Spark's own text may carry host details, never data).
        raise SparkEngineError(
            f"--engine spark: could not start a Spark session on {options.master!r} ({type(exc).__name__})",
            fix="check --spark-master, --spark-conf and that the cluster is reachable") from None

    def end_scope() -> None:
        scope.__exit__(None, None, None)

    try:
        check_session_settings(spark)
        check_executors(spark, scratch, options)
        return SparkSource(spark, location, scratch, steps=steps, on_close=end_scope)
    except BaseException:
        scope.__exit__(None, None, None)
        raise
