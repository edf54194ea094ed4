"""A linear release (issue 51: sigma estimated) end to end through ``--engine spark``: the same
Parquet records and the same seeded noise give the same signed Gaussian as the local engine,
sigma's interval covers the full-data sigma, and the artifact reads back with ``log_sigma``.

The privacy noise comes from a seeded stand-in for OS entropy (every Gaussian release draws
through ``SystemRandomness.gaussian`` on the driver), so the test is deterministic; the local and
Spark releases each get a fresh generator with the same seed, so they draw the same normals in
the same order when both engines release the same statistics in the same order."""

from __future__ import annotations

import json
import math
from pathlib import Path
from typing import Any

import numpy as np
import pyarrow as pa
import pytest
import torch
from release_support import write_linear_policy
from spark_helpers import write_parquet
from typer.testing import CliRunner

from dpsummary.cli import app

pytestmark = pytest.mark.filterwarnings("ignore::FutureWarning")
runner = CliRunner()
#: The seeded noise's seed (the linear mechanism test's, tests/mechanisms/test_noise_aware_linear.py).
NOISE_SEED = 52


def _records(n: int, seed: int = 0) -> pa.Table:
    """x1 in [0, 10], x2 in [-5, 5]; y = 0.3 (x1 - 5) - 0.4 x2 + N(0, 0.5^2), declared in [-8, 8]."""
    rng = np.random.default_rng(seed)
    x1, x2 = rng.uniform(0, 10, n), rng.uniform(-5, 5, n)
    y = 0.3 * (x1 - 5) - 0.4 * x2 + rng.normal(0, 0.5, n)
    return pa.table({"x1": x1, "x2": x2, "y": y})


def _release(tmp_path: Path, monkeypatch: pytest.MonkeyPatch, name: str, data: Path, policy: Path,
             *engine: str) -> tuple[Any, Path]:
    from dpsummary.analyst import load
    from dpsummary.private.mechanism import SystemRandomness

    rng = np.random.default_rng(NOISE_SEED)

    def seeded(self: SystemRandomness, values: np.ndarray, *, noise_std: float, clip_norm: float) -> np.ndarray:
        v = np.asarray(values, dtype=np.float64)
        return v + noise_std * rng.standard_normal(v.shape)

    monkeypatch.setattr(SystemRandomness, "gaussian", seeded)
    home = tmp_path / f"home-{name}"
    monkeypatch.setenv("DPSUMMARY_HOME", str(home))
    out = tmp_path / f"{name}.json"
    res = runner.invoke(app, ["release", *engine, str(data), "--policy", str(policy), "--epsilon", "1",
                              "--model", "linear", "--target", "y", "--out", str(out), "--seed", "1", "--json"],
                        catch_exceptions=False)
    assert res.exit_code == 0, res.output
    assert json.loads(res.stdout)["mechanism"] == "noise-aware-newton"
    return load(out, key=home / "keys" / "dpsummary.pub"), out


def test_linear_release_on_spark_matches_the_local_engine(spark: Any, tmp_path: Path,
                                                           monkeypatch: pytest.MonkeyPatch) -> None:
    from dpsummary.private import spark_engine

    data = write_parquet(tmp_path / "records.parquet", _records(4000))
    policy = write_linear_policy(tmp_path / "policy.toml")
    local, _ = _release(tmp_path, monkeypatch, "local", data, policy)
    passes: list[str] = []
    real_collect = spark_engine._collect

    def collect(df: Any, fn: Any) -> Any:
        passes.append(type(fn).__name__)
        return real_collect(df, fn)

    monkeypatch.setattr(spark_engine, "_collect", collect)
    on_spark, _ = _release(tmp_path, monkeypatch, "spark", data, policy, "--engine", "spark")
    assert {"MomentPass", "ResidualPass"} <= set(passes), passes  # the two releases' sums ran on Spark
    for rel in (local, on_spark):
        assert rel.param_names[-1] == "log_sigma" and rel.claim["mechanism"]["statistic"] == "moments"
        assert torch.isfinite(rel.points).all() and torch.isfinite(rel.weights).all()
    a, b = local.signed_gaussian(), on_spark.signed_gaussian()
    assert a is not None and b is not None
    # The released sums are bit-identical across engines (tests/spark/test_engine.py); the
    # posterior is post-processing of them with the same non-private seed.
    torch.testing.assert_close(b.mean, a.mean, rtol=1e-9, atol=1e-12)
    torch.testing.assert_close(b.cov, a.cov, rtol=1e-9, atol=1e-12)
    # sigma's 95% interval covers the full-data sigma (exact posterior on the release's transform).
    from dpsummary.data.reading import read_table

    pts = on_spark.transform.to_points(read_table(data)[0])
    full = on_spark.model.exact_posterior(pts, torch.ones(pts.shape[0], dtype=torch.float64))
    m, sd = float(b.mean[-1]), float(b.cov[-1, -1]) ** 0.5
    lo, hi = math.exp(m - 1.96 * sd), math.exp(m + 1.96 * sd)
    assert lo <= math.exp(float(full.mean[-1])) <= hi, (lo, math.exp(float(full.mean[-1])), hi)
