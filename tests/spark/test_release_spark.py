"""``dpsummary release --engine spark`` end to end (typer CliRunner, shared local[2] session):
both mechanisms, a zero-configuration release (stage 1 on Spark), the private directory removed
and the PRF key never shown or written."""

from __future__ import annotations

import json
from pathlib import Path
from typing import Any

import pytest
from release_support import ledger_lines, write_policy
from spark_helpers import table, write_parquet
from typer.testing import CliRunner

from dpsummary.cli import app
from dpsummary.private import prf
from dpsummary.spark import session as spark_session

pytestmark = pytest.mark.filterwarnings("ignore::FutureWarning")
runner = CliRunner()


@pytest.fixture()
def home(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> Path:
    h = tmp_path / "home"
    monkeypatch.setenv("DPSUMMARY_HOME", str(h))
    return h


def _release(*args: str) -> Any:
    return runner.invoke(app, ["release", *args], catch_exceptions=False)


def test_release_engine_spark_both_mechanisms(spark: Any, tmp_path: Path, home: Path,
                                              monkeypatch: pytest.MonkeyPatch) -> None:
    data = write_parquet(tmp_path / "records.parquet", table(900, 11))
    pol = write_policy(tmp_path / "policy.toml", n=None)
    keys: list[bytes] = []
    dirs: list[Path] = []
    real_generate, real_dir = prf.StepCoins.generate, spark_session.private_dir

    def generate(sample_rate: float, steps: int) -> prf.StepCoins:
        coins = real_generate(sample_rate, steps)
        keys.append(coins._key)
        return coins

    def tracked(prefix: str = "dpsummary-spark-") -> Path:
        dirs.append(real_dir(prefix))
        return dirs[-1]

    monkeypatch.setattr(prf.StepCoins, "generate", staticmethod(generate))
    monkeypatch.setattr(spark_session, "private_dir", tracked)
    out1 = tmp_path / "na.json"
    r = _release("--engine", "spark", "--epsilon", "1.0", "--policy", str(pol), "--out", str(out1), "--json",
                 str(data))
    assert r.exit_code == 0, r.output
    assert json.loads(r.stdout)["mechanism"] == "noise-aware-newton"
    out2 = tmp_path / "psvi.json"
    r2 = _release("--engine", "spark", "--mechanism", "dp-psvi", "--steps", "12", "--size", "5", "--epsilon", "1.0",
                  "--policy", str(pol), "--out", str(out2), "--json", str(data))
    assert r2.exit_code == 0, r2.output
    body = json.loads(r2.stdout)
    assert body["mechanism"] == "dp-psvi" and body["steps"] == 12
    assert len(keys) == 1  # one fresh OS-entropy key for the DP-PSVI release
    assert dirs and not any(d.exists() for d in dirs)  # step files and spill removed
    published = [r.output, r2.output, out1.read_text(), out2.read_text(), (home / "ledger.jsonl").read_text()]
    for text in published:
        assert keys[0].hex() not in text and keys[0].hex().upper() not in text
    for path in (out1, out2, home / "ledger.jsonl"):
        assert keys[0] not in path.read_bytes()


def test_engine_spark_zero_configuration(spark: Any, tmp_path: Path, home: Path) -> None:
    """No schema and no count in the policy: stage 1 (noisy count, DP schema) runs on Spark and
    the release completes with the default mechanism (issue 29)."""
    data = write_parquet(tmp_path / "records.parquet", table(3000, 2, dirty=False))
    pol = write_policy(tmp_path / "policy.toml", n=None, schema=False, total_epsilon=10.0, cap=5.0)
    out = tmp_path / "zero.json"
    r = _release("--engine", "spark", "--epsilon", "4.0", "--target", "y", "--policy", str(pol), "--out", str(out),
                 "--json", str(data))
    assert r.exit_code == 0, r.output
    body = json.loads(r.stdout)
    assert body["mechanism"] == "noise-aware-newton"
    assert {"count", "preprocessing"} <= {k for k, v in body["budget_split"].items() if v > 0}
    stages = [e.get("stage") for e in ledger_lines(home) if e.get("kind") == "reserve"]
    assert stages[0] == "count-and-schema"


def test_spark_options_need_engine_spark(tmp_path: Path, home: Path) -> None:
    data = write_parquet(tmp_path / "records.parquet", table(300, 2))
    r = _release("--spark-conf", "a=b", "--epsilon", "0.5", str(data))
    assert r.exit_code == 2 and r.output.startswith("error:")
    r = _release("--engine", "spark", "--spark-conf", "novalue", "--epsilon", "0.5", str(data))
    assert r.exit_code == 2 and "key=value" in r.output
    # A malformed master URL is refused before the reservation (nothing in the ledger).
    r = _release("--engine", "spark", "--spark-master", "sprak://head:7077", "--epsilon", "0.5", str(data))
    assert r.exit_code == 2 and r.output.startswith("error:") and "master" in r.output
    assert not (home / "ledger.jsonl").exists() or "reserve" not in (home / "ledger.jsonl").read_text()
    for ok in ("local", "local[2]", "local[*]", "spark://head:7077", "spark://a:7077,b:7077", "yarn", "k8s://https://h:443"):
        assert spark_session.SparkOptions(master=ok).master == ok


def test_spark_session_that_cannot_start_refuses_before_the_reservation(tmp_path: Path, home: Path,
                                                                          monkeypatch: pytest.MonkeyPatch) -> None:
    """Whether a cluster answers is public: the release starts the session before reserving
    anything, so an unreachable master costs no budget and prints one line (no Spark text)."""
    data = write_parquet(tmp_path / "records.parquet", table(50, 3))
    pol = write_policy(tmp_path / "policy.toml", n=None)

    def unreachable(options: Any, scratch: Path) -> Any:
        raise RuntimeError("java.net.ConnectException: Connection refused: nohost/10.0.0.1:7077")

    monkeypatch.setattr(spark_session, "build_session", unreachable)
    r = runner.invoke(app, ["release", "--engine", "spark", "--spark-master", "spark://nohost:7077", "--epsilon",
                            "1.0", "--policy", str(pol), "--out", str(tmp_path / "o.json"), str(data)])
    assert r.exit_code == 2, r.output
    lines = [ln for ln in r.output.splitlines() if ln.strip()]
    assert lines[-1].startswith("error: --engine spark: could not start a Spark session on 'spark://nohost:7077'")
    assert "Connection refused" not in r.output and "Traceback" not in r.output
    assert ledger_lines(home) == []
    assert not (tmp_path / "o.json").exists()
