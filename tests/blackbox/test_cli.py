"""``dpsummary baseline --method bb-psvi|bb-sparsevi --model bnn`` through typer's CliRunner."""

from __future__ import annotations

import json

import pytest
import torch
from typer.testing import CliRunner

from dpsummary.cli import app
from dpsummary.constructors import Summary
from dpsummary.models.bnn import BNN


@pytest.fixture()
def moons_csv(tmp_path):
    g = torch.Generator().manual_seed(0)
    t = torch.rand(150, generator=g) * 3.14159
    lab = (torch.rand(150, generator=g) < 0.5)
    x1 = torch.where(lab, 1 - torch.cos(t), torch.cos(t))
    x2 = torch.where(lab, 0.5 - torch.sin(t), torch.sin(t)) + 0.1 * torch.randn(150, generator=g)
    path = tmp_path / "moons.csv"
    rows = ["x1,x2,label"] + [f"{a:.5f},{b:.5f},{'yes' if c else 'no'}" for a, b, c in zip(x1, x2, lab, strict=True)]
    path.write_text("\n".join(rows) + "\n")
    return path


@pytest.mark.parametrize("method", ["bb-psvi", "bb-sparsevi"])
def test_cli_blackbox_baseline(method, moons_csv, tmp_path) -> None:
    out = tmp_path / "s.json"
    res = CliRunner().invoke(app, ["baseline", str(moons_csv), "--method", method, "--model", "bnn", "--size", "8",
                                   "--steps", "2", "--json", "--out", str(out)])
    assert res.exit_code == 0, res.output
    payload = json.loads(res.output[res.output.index("{"):])
    assert payload["method"] == method and payload["model"] == "bnn"
    assert set(payload["metrics"]) >= {"accuracy", "test_ll", "ece"}
    assert 0.0 <= payload["metrics"]["accuracy"] <= 1.0 and payload["metrics"]["test_ll"] < 0
    summary = Summary.load(out)
    assert isinstance(summary.model, BNN) and summary.model.widths == (100,)
    assert 1 <= summary.size <= 8 and len(summary.info["variational"]["mu"]) == summary.model.param_dim


def test_cli_rejects_unknown_blackbox_method(moons_csv) -> None:
    res = CliRunner().invoke(app, ["baseline", str(moons_csv), "--method", "bb-nope", "--model", "bnn"])
    assert res.exit_code != 0 and "bb-nope" in res.output
