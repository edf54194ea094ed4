"""Issue 15, large N on one machine: the CLI release streams into the record store (forced to
spill to its private temporary file here), for both mechanisms and with a private count and
schema, leaves nothing on disk, and reads the file in streaming passes only."""

from __future__ import annotations

import json
from pathlib import Path

import pytest
from release_support import mentions_number
from release_support import write_csv as _write_csv
from release_support import write_policy as _policy
from typer.testing import CliRunner

from dpsummary.cli import app

runner = CliRunner()


@pytest.fixture()
def home(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> Path:
    h = tmp_path / "home"
    monkeypatch.setenv("DPSUMMARY_HOME", str(h))
    return h


@pytest.fixture()
def spill(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> Path:
    """Every store spills to disk at once; the temporary directory is watched."""
    import tempfile

    from dpsummary.private import store

    tmp = tmp_path / "tmp"
    tmp.mkdir()
    monkeypatch.setattr(tempfile, "tempdir", str(tmp))
    monkeypatch.setattr(store, "MEMORY_BYTES", 0)
    opened: list[int] = []
    real = store._private_file

    def watched() -> int:
        fd = real()
        opened.append(fd)
        assert list(tmp.iterdir()) == []  # unlinked at once, directory included
        return fd

    closed: list[int] = []
    real_close = store._close_fd

    def close(fd: int) -> None:
        closed.append(fd)
        real_close(fd)

    monkeypatch.setattr(store, "_private_file", watched)
    monkeypatch.setattr(store, "_close_fd", close)
    monkeypatch.setattr(store, "FDS_FOR_TEST", (opened, closed), raising=False)
    return tmp


@pytest.mark.parametrize(("mechanism", "schema"), [("dp-psvi", True), ("noise-aware-newton", False)])
def test_release_streams_through_a_spilled_store(tmp_path: Path, home: Path, spill: Path, mechanism: str,
                                                 schema: bool) -> None:
    from dpsummary.data import BatchStream
    from dpsummary.private import store

    passes: list[bool] = []
    real_iter = BatchStream.__iter__

    def counting(self: BatchStream):  # type: ignore[no-untyped-def]
        passes.append(self.fallback)
        return real_iter(self)

    data = _write_csv(tmp_path / "d.csv", 900)
    pol = _policy(tmp_path / "p.toml", n=None, schema=schema)
    out = tmp_path / "r.json"
    with pytest.MonkeyPatch.context() as mp:
        mp.setattr(BatchStream, "__iter__", counting)
        res = runner.invoke(app, ["release", str(data), "--epsilon", "1", "--policy", str(pol), "--out", str(out),
                                  "--steps", "20", "--size", "5", "--json", "--seed", "1", "--mechanism", mechanism])
    assert res.exit_code == 0, res.output
    payload = json.loads(res.stdout[res.stdout.index("{"):])
    assert payload["epsilon"]["rdp"] <= 1.0 + 1e-12
    assert not mentions_number(res.stdout, 900)
    # A public schema: one pass serves the count and stage 2; zero configuration: two passes.
    assert passes == ([False] if schema else [False, False])
    opened, closed = store.FDS_FOR_TEST  # type: ignore[attr-defined]
    assert opened, "the store did not spill"
    assert sorted(opened) == sorted(closed)  # every descriptor released when the release ended
    # The store leaves nothing behind. (A dp-psvi release's bootstrap may start worker processes,
    # and Python's multiprocessing keeps its own private "pymp-*" directory until the interpreter
    # exits: not the store's; the bootstrap never sees a record.)
    left = [p for p in spill.iterdir() if not (p.name.startswith("pymp-") and p.is_dir())]
    assert left == []
