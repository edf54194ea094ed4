"""One shared local[2] SparkSession for the Spark engine's tests (skipped, with the reason, when
pyspark or Java is missing; CI installs both, see .ci/run)."""

from __future__ import annotations

import os
import shutil
from collections.abc import Iterator
from typing import Any

import pytest

from dpsummary.spark.session import SparkOptions, build_session, private_dir, spark_available


@pytest.fixture(scope="session")
def spark() -> Iterator[Any]:
    reason = spark_available()
    if reason is not None:
        if os.environ.get("DPSUMMARY_REQUIRE_SPARK") == "1":  # CI: a missing engine is a failure
            pytest.fail(f"Spark engine tests need pyspark and Java: {reason}")
        pytest.skip(f"Spark engine tests need pyspark and Java: {reason}")
    scratch = private_dir("dpsummary-spark-tests-")
    session = build_session(SparkOptions(conf={"spark.sql.shuffle.partitions": "4",
                                               "spark.default.parallelism": "2"}), scratch)
    try:
        yield session
    finally:
        session.stop()
        shutil.rmtree(scratch, ignore_errors=True)
