"""``dpsummary baseline --model gmm|dpgmm`` through typer's CliRunner."""

from __future__ import annotations

import json
from pathlib import Path

import numpy as np
import pytest
from typer.testing import CliRunner

from dpsummary.cli import app


def _write_csv(path: Path, x: np.ndarray) -> Path:
    rows = ["a,label,b"] + [f"{u:.6f},{'yes' if i % 2 else 'no'},{v:.6f}" for i, (u, v) in enumerate(x)]
    path.write_text("\n".join(rows) + "\n")
    return path


@pytest.mark.parametrize("model", ["gmm", "dpgmm"])
def test_mixture_baseline_prints_both_fits(tmp_path: Path, blobs: np.ndarray, model: str) -> None:
    csv = _write_csv(tmp_path / "blobs.csv", blobs)
    result = CliRunner().invoke(app, ["baseline", "--model", model, "--method", "lightweight", "--size", "60",
                                      "--components", "4", "--json", str(csv)])
    assert result.exit_code == 0, result.output
    payload = json.loads(result.output)
    assert payload["columns"] == ["a", "b"]  # the categorical column is left out
    assert payload["distinct_points"] <= 60
    for part in ("coreset", "full"):
        comps = payload[part]["components"]
        assert 1 <= len(comps) <= 4
        assert sum(c["weight"] for c in comps) == pytest.approx(1.0, abs=0.01)
        assert np.array(comps[0]["covariance"]).shape == (2, 2)
    # In CSV units: the largest full-data component sits on the 300-point blob at the origin.
    assert np.allclose(payload["full"]["components"][0]["mean"], [0.0, 0.0], atol=0.3)
    text = CliRunner().invoke(app, ["baseline", "--model", model, "--method", "uniform", "-M", "60",
                                    "--components", "3", str(csv)])
    assert text.exit_code == 0, text.output
    assert "full data fit" in text.output and "coreset fit" in text.output and "cov [" in text.output


@pytest.mark.parametrize(
    ("args", "message"),
    [
        (["--method", "psvi"], "not available for mixtures"),
        (["--method", "uniform", "--components", "0"], "--components must be at least 1"),
        (["--method", "uniform", "--size", "0"], "--size must be at least 1"),
    ],
)
def test_bad_options_are_one_line_errors(tmp_path: Path, blobs: np.ndarray, args: list[str], message: str) -> None:
    csv = _write_csv(tmp_path / "blobs.csv", blobs)
    result = CliRunner().invoke(app, ["baseline", "--model", "gmm", *args, str(csv)])
    assert result.exit_code == 2
    assert result.output.strip().startswith("error:") and message in result.output
    assert len(result.output.strip().splitlines()) == 1


def test_table_without_numeric_columns_is_a_user_error(tmp_path: Path) -> None:
    csv = tmp_path / "words.csv"
    csv.write_text("x,y\na,b\nc,d\n")
    result = CliRunner().invoke(app, ["baseline", "--model", "dpgmm", "--method", "uniform", str(csv)])
    assert result.exit_code == 2 and "no numeric column" in result.output
