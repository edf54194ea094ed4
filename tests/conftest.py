"""Suite-wide settings: one intra-op torch thread (small tensors; threads only add contention on
the 2-core CI machine) and an isolated dpsummary home so no test touches the user's keys."""

from __future__ import annotations

from pathlib import Path

import pytest
import torch

torch.set_num_threads(1)


@pytest.fixture(autouse=True)
def _isolated_home(tmp_path_factory: pytest.TempPathFactory, monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setenv("DPSUMMARY_HOME", str(tmp_path_factory.mktemp("dpsummary-home")))


@pytest.fixture()
def home(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> Path:
    """A fresh dpsummary home (keys, ledger) inside the test's own folder, for tests that read
    the ledger or the keys a release made. Modules that define their own ``home`` keep it."""
    h = tmp_path / "home"
    monkeypatch.setenv("DPSUMMARY_HOME", str(h))
    return h
