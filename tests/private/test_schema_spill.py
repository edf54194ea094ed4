"""The local engine's schema counts with a bounded number of keys in memory (issue 35): beyond
``spill_keys`` distinct (column, value) keys they wait in sorted runs in anonymous temporary
files, and the counts, the streamed value totals and the release are exactly those of the
in-memory path."""

from __future__ import annotations

from typing import Any

import numpy as np
import pyarrow as pa
import pytest

from dpsummary.data import NO_TARGET, RawTable, text_column
from dpsummary.private import preprocess
from dpsummary.private.preprocess import SchemaCounts, build_count_vector, estimate_schema


def _columns(n: int, seed: int) -> dict[str, list[str]]:
    rng = np.random.default_rng(seed)
    return {
        "id": [f"id{i:05d}" for i in rng.permutation(n)],  # one distinct value per record
        "code": [f"k{v}" for v in rng.integers(0, 40, n)],  # repeated values, across batches
        "x": [f"{v:.2f}" if i % 17 else "oops" for i, v in enumerate(rng.normal(5, 2, n))],
        "y": rng.choice(["no", "yes"], n).tolist(),
    }


def _counts(cols: dict[str, list[str]], spill_keys: int, batch: int = 113) -> SchemaCounts:
    counts = SchemaCounts(list(cols), spill_keys=spill_keys)
    n = len(next(iter(cols.values())))
    for a in range(0, n, batch):
        for name, values in cols.items():
            counts.add(name, text_column(pa.array(values[a:a + batch]))[0])
    return counts


@pytest.mark.parametrize("spill_keys", [1, 7, 500, 10**9])
def test_spilled_counts_equal_the_in_memory_counts(spill_keys: int) -> None:
    cols = _columns(2000, 1)
    ref = build_count_vector(RawTable(header=list(cols), columns=cols))
    counts = _counts(cols, spill_keys)
    assert (len(counts._runs) > 0) == (spill_keys < 2000)
    vec = counts.vector()
    assert vec.keys == ref.keys and np.array_equal(vec.counts, ref.counts) and vec.touches == ref.touches
    pieces = list(counts.value_totals(chunk=64))
    assert all(len(labels) <= 64 and len(labels) == len(totals) for _, labels, totals in pieces)
    streamed = [(name, "value", v) for name, labels, _ in pieces for v in labels]
    assert streamed == [k for k in ref.keys if k[1] == "value"]  # each key once, in order
    counts.close()
    assert counts._runs == []


def test_spilled_release_is_the_in_memory_release(monkeypatch: pytest.MonkeyPatch) -> None:
    """Identity noise: the streamed estimate on spilled counts equals the one-call estimate on the
    raw table (schema, notes, noisy record count); every noise call gets the public scale."""
    calls: list[Any] = []

    def identity(values: np.ndarray, *, noise_std: float, clip_norm: float) -> np.ndarray:
        calls.append((len(values), noise_std, clip_norm))
        return np.asarray(values, dtype=np.float64)

    monkeypatch.setattr(preprocess, "add_gaussian_noise", identity)
    cols = _columns(3000, 2)
    raw = RawTable(header=list(cols), columns=cols)
    for target in ("y", NO_TARGET):
        want = estimate_schema(raw, noise_multiplier=0.6, target=target, delta=1e-6, max_categories=5)
        calls.clear()
        got = estimate_schema(_counts(cols, 50), noise_multiplier=0.6, target=target, delta=1e-6, max_categories=5)
        assert got.schema == want.schema and got.notes == want.notes and got.dropped == want.dropped
        assert got.noisy_num_records == want.noisy_num_records
        assert want.dropped == ["id"] and got.schema.column("code").categories is not None
        assert len(got.schema.column("code").categories or []) == 5
        assert all(std == 0.6 and clip == 1.0 for _, std, clip in calls)
        assert sum(n for n, _, _ in calls) == len(build_count_vector(raw).keys)  # every key noised once
