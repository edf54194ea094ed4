"""Issue 29: the Spark executors' Python. Local masters run the workers on the driver's own
interpreter (no activated virtual environment), the package is shipped to the executors, and a
probe job that reads no record refuses for free when the executors cannot import dpsummary.

Each test runs the CLI in a fresh process (its own JVM and SparkContext: a context's worker Python
is fixed when it starts), through the venv's absolute path with a PATH that has no venv."""

from __future__ import annotations

import json
import os
import subprocess
import sys
from pathlib import Path

import pytest
from release_support import write_policy
from spark_helpers import table, write_parquet

from dpsummary.spark.session import spark_available

pytestmark = pytest.mark.skipif(spark_available() is not None, reason=f"needs pyspark and Java: {spark_available()}")

CLI = Path(sys.executable).with_name("dpsummary")


def _env(home: Path) -> dict[str, str]:
    """No venv on PATH, no VIRTUAL_ENV, no PYSPARK_PYTHON: what a user who did not activate sees."""
    venv_bin = str(Path(sys.executable).parent)
    path = ":".join(p for p in os.environ.get("PATH", "/usr/bin:/bin").split(":") if p and p != venv_bin)
    env = {k: v for k, v in os.environ.items() if k not in ("VIRTUAL_ENV", "PYSPARK_PYTHON", "PYSPARK_DRIVER_PYTHON",
                                                            "PYTHONPATH")}
    env.update(PATH=path or "/usr/bin:/bin", DPSUMMARY_HOME=str(home), OMP_NUM_THREADS="1")
    return env


def _release(home: Path, *args: str) -> subprocess.CompletedProcess[str]:
    assert CLI.exists(), CLI
    return subprocess.run([str(CLI), "release", *args], env=_env(home), capture_output=True, text=True, timeout=600,
                          check=False)


def _reserves(home: Path) -> list[dict[str, object]]:
    ledger = home / "ledger.jsonl"
    if not ledger.exists():
        return []
    lines = [json.loads(x) for x in ledger.read_text().splitlines() if x.strip()]
    return [e for e in lines if e.get("kind") == "reserve"]


@pytest.fixture()
def bare_python(tmp_path: Path) -> Path:
    """A Python of the driver's minor version without dpsummary or its dependencies."""
    bare = tmp_path / "bare-venv"
    base = Path(getattr(sys, "_base_executable", sys.executable))
    subprocess.run([str(base), "-m", "venv", "--without-pip", str(bare)], check=True, timeout=120)
    python = bare / "bin" / "python"
    probe = subprocess.run([str(python), "-c", "import numpy"], capture_output=True, check=False)
    assert probe.returncode != 0  # really bare
    return python


def test_local_master_needs_no_activated_venv(tmp_path: Path) -> None:
    data = write_parquet(tmp_path / "records.parquet", table(400, 4))
    pol = write_policy(tmp_path / "policy.toml", n=None)
    home = tmp_path / "home"
    r = _release(home, "--engine", "spark", "--spark-master", "local[1]", "--epsilon", "1.0", "--policy", str(pol),
                 "--out", str(tmp_path / "o.json"), str(data))
    assert r.returncode == 0, r.stdout + r.stderr
    assert (tmp_path / "o.json").exists()


def test_executors_without_dpsummary_refuse_before_the_reservation(tmp_path: Path, bare_python: Path) -> None:
    data = write_parquet(tmp_path / "records.parquet", table(400, 4))
    pol = write_policy(tmp_path / "policy.toml", n=None)
    home = tmp_path / "home"
    r = _release(home, "--engine", "spark", "--spark-master", "local[1]", "--spark-conf",
                 f"spark.pyspark.python={bare_python}", "--epsilon", "1.0", "--policy", str(pol), "--out",
                 str(tmp_path / "o.json"), str(data))
    assert r.returncode == 2, r.stdout + r.stderr
    lines = [x for x in (r.stdout + r.stderr).splitlines() if x.strip()]
    errors = [x for x in lines if x.startswith("error:")]
    assert len(errors) == 1 and lines[-1] == errors[0], lines
    assert "executors" in errors[0] and "spark.pyspark.python" in errors[0] and "Traceback" not in r.stderr
    assert "internal error" not in errors[0]
    assert _reserves(home) == []  # refused for free
    assert not (tmp_path / "o.json").exists()
