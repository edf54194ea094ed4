"""Shared data and replay doubles for the Spark engine's tests."""

from __future__ import annotations

from pathlib import Path

import numpy as np
import pyarrow as pa
import pyarrow.parquet as pq

from dpsummary.data import ColumnSpec, Schema, Transform, encode_batch
from dpsummary.private.prf import parquet_row_id

SCHEMA = Schema(columns=[
    ColumnSpec(name="x1", kind="numeric", lower=0, upper=10),
    ColumnSpec(name="x2", kind="categorical", categories=["a", "b", "c"]),
    ColumnSpec(name="y", kind="categorical", categories=["no", "yes"]),
], target="y")


def table(n: int, seed: int = 0, *, dirty: bool = True) -> pa.Table:
    """``x1`` numeric in [0, 10], ``x2`` in {a, b, c}, binary ``y``; with ``dirty`` a few
    records hit every data-quality rule (missing numerics, unseen categories, bad targets)."""
    rng = np.random.default_rng(seed)
    x1 = rng.uniform(0, 10, n)
    x2 = rng.choice(["a", "b", "c"], n).astype(object)
    eta = 0.5 * (x1 - 5) + (x2 == "b")
    y = np.where(rng.random(n) < 1 / (1 + np.exp(-eta)), "yes", "no").astype(object)
    x1_col = [f"{v:.3f}" for v in x1]
    if dirty:
        for i in range(0, n, 97):
            x1_col[i] = "nan"
        for i in range(5, n, 89):
            x2[i] = "zzz"
        for i in range(7, n, 83):
            y[i] = "maybe"
    return pa.table({"x1": x1_col, "x2": list(x2), "y": list(y)})


def write_parquet(path: Path, tbl: pa.Table, *, row_group: int = 300) -> Path:
    pq.write_table(tbl, path, row_group_size=row_group)
    return path


def write_split(directory: Path, tbl: pa.Table, parts: int = 3) -> list[Path]:
    """The same records in ``parts`` files (sorted names = file order)."""
    directory.mkdir(parents=True, exist_ok=True)
    bounds = np.linspace(0, tbl.num_rows, parts + 1).astype(int)
    paths = []
    for i in range(parts):
        p = directory / f"part-{i:03d}.parquet"
        pq.write_table(tbl.slice(bounds[i], bounds[i + 1] - bounds[i]), p, row_group_size=250)
        paths.append(p)
    return paths


def local_encoded(files: list[Path], transform: Transform) -> tuple[np.ndarray, np.ndarray]:
    """The local engine's encoding (data.encode_batch, Arrow batches of the local reader's
    size) of ``files`` in sorted order: (rows of the kept records, their row ids)."""
    rows, ids = [], []
    for fi, path in enumerate(sorted(files)):
        offset = 0
        for batch in pq.ParquetFile(path).iter_batches(batch_size=1000):
            enc = encode_batch(batch, transform)
            dropped = enc.indicators[:, 2:].any(axis=1)
            kept = np.flatnonzero(~dropped)
            rows.append(enc.rows)
            ids.append(parquet_row_id(fi, kept + offset))
            offset += batch.num_rows
    return np.concatenate(rows), np.concatenate(ids)


class Recorder:
    """Replay double of PrivacyRandomness: records every pre-noise input and adds no noise; the
    local engine's step samples are given (the PRF coins' indices), rate 1 includes all."""

    def __init__(self, samples: list[np.ndarray] | None = None) -> None:
        self.inputs: list[np.ndarray] = []
        self._samples = iter(samples or [])

    def sample_indices(self, num_records: int, sample_rate: float) -> np.ndarray:
        if sample_rate == 1.0:
            return np.arange(num_records, dtype=np.int64)
        return next(self._samples)

    def coins(self, num_records: int, sample_rate: float) -> np.ndarray:
        mask = np.zeros(num_records, dtype=bool)
        mask[self.sample_indices(num_records, sample_rate)] = True
        return mask

    def gaussian(self, values: np.ndarray, *, noise_std: float, clip_norm: float) -> np.ndarray:
        self.inputs.append(np.array(values, dtype=np.float64, copy=True))
        return np.asarray(values, dtype=np.float64)
