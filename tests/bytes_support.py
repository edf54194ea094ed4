"""Shared cases of the issue-35 byte tests (tests/test_release_bytes.py, local engine, and
tests/spark/test_release_bytes_spark.py): a clean 3,000-row table, one-value byte corruptions
drawn by a seeded generator, and one release through the CLI that must end as the clean table's
does (a finite signed artifact, every reservation committed)."""

from __future__ import annotations

import base64
import json
from pathlib import Path
from typing import Any

import numpy as np
import pyarrow as pa
import pyarrow.parquet as pq
from release_support import finite, ledger_lines, write_policy
from typer.testing import CliRunner

import dpsummary
from dpsummary.cli import app

runner = CliRunner()

N = 3000
#: Columns of the table: ``note`` is outside the public schema (never used, still read).
COLUMNS = ("x1", "x2", "note", "y")
#: One value's bytes, by family (issue 35's list).
CORRUPTIONS: dict[str, list[bytes]] = {
    "invalid-utf8": [b"\xff\xfeZ", b"caf\xe9", b"\xed\xa0\x80", b"\xc0\xaf", b"\x80", b"7.\xff5"],
    "nul": [b"a\x00b", b"\x00", b"1\x002"],
    "overlong": [b"9" * 200_000, b"x" * 300_000, b"\xff" * 50_000],
    "bare-cr": [b"a\rb", b"\r", b"5\r"],
    "quotes": [b'"abc', b'a"b', b'"', b'""', b'"a,b"'],
    "bom": [b"\xef\xbb\xbf7.5", b"\xef\xbb\xbf", b"\xef\xbb\xbfyes"],
    "huge-numeric": [b"1e308", b"1e999", b"-1e400", b"nan", b"inf", b"-inf", b"1" * 400, b"0x1p1023"],
    "delimiter": [b"1,2", b"a\nb", b"\n"],
}
ISSUE_CASES = [("x2", b"\xff\xfeZ"), ("note", b"caf\xe9")]


def clean_values(seed: int = 0) -> dict[str, list[bytes]]:
    rng = np.random.default_rng(seed)
    x1 = rng.uniform(0, 10, N)
    x2 = rng.choice(["a", "b", "c"], N)
    eta = 0.5 * (x1 - 5) + (x2 == "b")
    y = np.where(rng.random(N) < 1 / (1 + np.exp(-eta)), "yes", "no")
    note = rng.choice(["alpha", "beta", "gamma"], N)
    return {"x1": [f"{v:.3f}".encode() for v in x1], "x2": [v.encode() for v in x2],
            "note": [v.encode() for v in note], "y": [v.encode() for v in y]}


def corrupted(values: dict[str, list[bytes]], column: str | None, row: int, raw: bytes) -> dict[str, list[bytes]]:
    out = {k: list(v) for k, v in values.items()}
    if column is not None:
        out[column][row] = raw
    return out


def write_csv(path: Path, values: dict[str, list[bytes]]) -> Path:
    lines = [b",".join(c.encode() for c in COLUMNS)]
    lines += [b",".join(values[c][i] for c in COLUMNS) for i in range(N)]
    path.write_bytes(b"\n".join(lines) + b"\n")
    return path


def string_column(values: list[bytes]) -> Any:
    """An Arrow string column holding exactly these bytes (Arrow does not validate UTF-8 when
    built from buffers, as Parquet writers such as Spark do not)."""
    offsets = np.concatenate([[0], np.cumsum([len(v) for v in values])]).astype(np.int32)
    return pa.StringArray.from_buffers(len(values), pa.py_buffer(offsets.tobytes()), pa.py_buffer(b"".join(values)))


def write_parquet(path: Path, values: dict[str, list[bytes]]) -> Path:
    pq.write_table(pa.table({c: string_column(values[c]) for c in COLUMNS}), path, row_group_size=1000)
    return path


def cases() -> list[tuple[str, str, str | None, int, bytes]]:
    """(mode, configuration, column, row, bytes): the issue's two values in every mode and
    configuration, then seeded draws over the families (fewer on Spark, whose releases are slower)."""
    rng = np.random.default_rng(35)
    families = sorted(CORRUPTIONS)
    cases: list[tuple[str, str, str | None, int, bytes]] = []
    for mode, draws in (("csv-local", 5), ("parquet-local", 5), ("parquet-spark", 1)):
        for config in ("schema", "zero-config"):
            cases.append((mode, config, None, 0, b""))  # the clean table
            if mode != "csv-local":
                cases += [(mode, config, col, 1234, raw) for col, raw in ISSUE_CASES]
            for _ in range(draws):
                fam = families[int(rng.integers(len(families)))]
                raw = CORRUPTIONS[fam][int(rng.integers(len(CORRUPTIONS[fam])))]
                cases.append((mode, config, COLUMNS[int(rng.integers(len(COLUMNS)))], int(rng.integers(N)), raw))
    return cases



def release(tmp_path: Path, home: Path, mode: str, config: str, values: dict[str, list[bytes]], tag: str) -> None:
    """One release; asserts the clean outcome class: exit 0, a finite signed artifact that
    loads, every reservation of the release committed, no abort in the ledger."""
    parquet = mode.startswith("parquet")
    data = (write_parquet if parquet else write_csv)(tmp_path / f"{tag}.{'parquet' if parquet else 'csv'}", values)
    pol = write_policy(tmp_path / "policy.toml", n=None, schema=config == "schema", total_epsilon=1e6, cap=5.0,
                       n_max=10**6)
    out = tmp_path / f"{tag}.dpsummary.json"
    args = ["release", "--epsilon", "4", "--policy", str(pol), "--out", str(out), "--size", "10"]
    if config == "zero-config":
        args += ["--target", "y", "--model", "logistic"]
    if mode.endswith("spark"):
        args += ["--engine", "spark"]
    r = runner.invoke(app, [*args, str(data)])
    assert "internal error" not in r.output and "Traceback" not in r.output, r.output[-2000:]
    assert r.exit_code == 0, f"{tag}: {r.output[-1500:]}"
    release = dpsummary.load(out)
    assert np.isfinite(np.asarray(release.summary.points)).all() and np.isfinite(np.asarray(release.summary.weights)).all()
    payload = json.loads(base64.b64decode(json.loads(out.read_text())["payload"]))
    assert finite(payload)
    entries = ledger_lines(home)
    assert not [e for e in entries if e["kind"] == "abort"], entries[-1]
    reserves = {e["seq"] for e in entries if e["kind"] == "reserve"}
    settled = {e["ref"] for e in entries if e["kind"] == "commit"}
    assert reserves <= settled
