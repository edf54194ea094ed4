"""Issue 47 through the CLI on the Spark engine (typer CliRunner, the shared local[2] session):

* the issue's table reversed: ``cc`` (``fixed_size_binary(2)``, FR/US) releases as a 2-category
  categorical, with and without ONE added record holding ``b'\\xff\\xff'`` (zero configuration,
  epsilon 0.5, 60,000 records: tests/text_types_support.py says why the outcome is certain);
* a column Spark cannot read record by record (a millisecond TIMESTAMP) and the settings the
  noise argument forbids (``spark.speculation=true``, from ``--spark-conf`` or read back from the
  running session) are one-line refusals before the reservation: no ``reserve`` in the ledger;
* the executor probe runs through ``mapInArrow``: pyspark's own driver-side requirement
  (pandas) missing is a one-line refusal before the reservation, never an internal error after.
"""

from __future__ import annotations

from pathlib import Path
from typing import Any

import pyarrow as pa
import pyarrow.parquet as pq
import pytest
from release_support import ledger_lines
from text_types_support import release_issue_table
from typer.testing import CliRunner

from dpsummary.cli import app
from dpsummary.spark import session as spark_session

pytestmark = pytest.mark.filterwarnings("ignore::FutureWarning")
runner = CliRunner()


def _refused_for_free(r: Any, home: Path, *needles: str) -> None:
    assert r.exit_code == 2, r.output
    lines = [ln for ln in r.output.splitlines() if ln.strip()]
    assert lines[-1].startswith("error: ") and "Traceback" not in r.output and "internal error" not in r.output
    message = " ".join(r.output.split())
    for needle in needles:
        assert needle in message, message
    assert not [e for e in ledger_lines(home) if e.get("kind") == "reserve"]


def _small_table(path: Path, **extra: pa.Array) -> Path:
    tbl = pa.table({"x": pa.array([float(i % 10) for i in range(200)]),
                    "y": pa.array(["yes" if i % 3 else "no" for i in range(200)]), **extra})
    pq.write_table(tbl, path)
    return path


@pytest.mark.parametrize("bad_row", [False, True], ids=["D", "D-plus-one-bad-row"])
def test_issue_table_releases_cc_categorical_spark(spark: Any, tmp_path: Path, home: Path, bad_row: bool) -> None:
    output = release_issue_table(tmp_path, bad_row=bad_row, engine="spark")
    assert "cc: categorical, 2 categories passed the noisy threshold" in output, output[-3000:]
    assert "cc: dropped" not in output


def test_speculation_is_refused_before_the_reservation(tmp_path: Path, home: Path) -> None:
    data = _small_table(tmp_path / "d.parquet")
    for value in ("true", "TRUE"):
        r = runner.invoke(app, ["release", "--engine", "spark", "--spark-conf", f"spark.speculation={value}",
                                "--epsilon", "0.5", "--target", "y", "--out", str(tmp_path / "o.json"), str(data)])
        _refused_for_free(r, home, "spark.speculation", "noise")
    r = runner.invoke(app, ["release", "--engine", "spark", "--spark-conf",
                            "spark.sql.parquet.datetimeRebaseModeInRead=EXCEPTION", "--epsilon", "0.5", "--target", "y",
                            "--out", str(tmp_path / "o.json"), str(data)])
    _refused_for_free(r, home, "datetimeRebaseModeInRead")


class _Conf:
    def __init__(self, values: dict[str, str]) -> None:
        self.values = values

    def get(self, key: str, default: Any = None) -> Any:
        return self.values.get(key, default)


class _Session:
    """A session whose EFFECTIVE settings say speculation is on (as spark-defaults.conf or an
    already running session could): only what check_session_settings reads, plus stop()."""

    def __init__(self) -> None:
        self.sparkContext = type("Ctx", (), {"getConf": lambda _self: _Conf({"spark.speculation": "true"})})()
        self.conf = _Conf({})
        self.stopped = False

    def stop(self) -> None:
        self.stopped = True


def test_speculation_read_back_from_the_session_is_refused(spark: Any, tmp_path: Path, home: Path,
                                                           monkeypatch: pytest.MonkeyPatch) -> None:
    """No --spark-conf: the setting comes from the session itself; the release reads the
    effective value back after the session starts and refuses before any reservation."""
    spark_session.check_session_settings(spark)  # the tests' real session: speculation off
    fake = _Session()
    monkeypatch.setattr(spark_session, "build_session", lambda options, scratch: fake)
    data = _small_table(tmp_path / "d.parquet")
    r = runner.invoke(app, ["release", "--engine", "spark", "--epsilon", "0.5", "--target", "y", "--out",
                            str(tmp_path / "o.json"), str(data)])
    _refused_for_free(r, home, "the Spark session has spark.speculation=true")


def test_a_column_spark_cannot_read_per_record_is_refused_before_the_reservation(spark: Any, tmp_path: Path,
                                                                                 home: Path) -> None:
    """A millisecond TIMESTAMP (Spark's checked conversion fails the pass on one extreme value)
    and a float16 (Spark cannot read it): decided from the footer, the column named."""
    ts = pa.array([i * 1000 for i in range(200)], pa.timestamp("ms"))
    half = pa.array([float(i) for i in range(200)], pa.float64()).cast(pa.float16())
    files = {name: _small_table(tmp_path / f"{name}.parquet", **{name: col}) for name, col in (("when", ts),
                                                                                             ("half", half))}
    for name, data in files.items():
        r = runner.invoke(app, ["release", "--engine", "spark", "--epsilon", "0.5", "--target", "y", "--out",
                                str(tmp_path / "o.json"), str(data)])
        _refused_for_free(r, home, f"column '{name}'", "--engine local")
    for name, data in files.items():  # the local engine reads the same files, the column per record
        r = runner.invoke(app, ["release", "--epsilon", "0.5", "--target", "y", "--out", str(tmp_path / f"{name}.json"),
                                str(data)])
        assert "internal error" not in r.output and "Traceback" not in r.output


def test_probe_runs_the_arrow_path_and_refuses_for_free_without_pandas(spark: Any, tmp_path: Path, home: Path,
                                                                       monkeypatch: pytest.MonkeyPatch) -> None:
    """pyspark's mapInArrow wants pandas on the driver (issue 47: a fresh ``.[spark]`` venv once
    failed there AFTER the charge). The probe calls mapInArrow, so its check fails first."""
    from pyspark.errors import PySparkImportError
    from pyspark.sql.pandas import functions as pandas_functions

    scratch = spark_session.private_dir()
    try:
        assert spark_session.executor_report(spark, scratch) == [("ok", spark_session._version())]
    finally:
        import shutil

        shutil.rmtree(scratch, ignore_errors=True)

    def no_pandas() -> None:
        raise PySparkImportError(errorClass="PACKAGE_NOT_INSTALLED",
                                 messageParameters={"package_name": "Pandas", "minimum_version": "2.2.0"})

    monkeypatch.setattr(pandas_functions, "require_minimum_pandas_version", no_pandas)
    data = _small_table(tmp_path / "d.parquet")
    r = runner.invoke(app, ["release", "--engine", "spark", "--epsilon", "0.5", "--target", "y", "--out",
                            str(tmp_path / "o.json"), str(data)])
    _refused_for_free(r, home, "pyspark cannot run the engine's Arrow passes", "Pandas", "dpsummary[spark]")
