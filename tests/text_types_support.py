"""Issue 47's type matrix, shared by tests/data/test_text_types.py (local engine) and
tests/spark/test_text_types_spark.py: for every Arrow type pyarrow writes to Parquet and reads
back, a table D (column ``c`` of that type, a numeric ``x`` and a target ``y``) and its neighbour
D' = D plus ONE record whose ``c`` holds an invalid or extreme value of the type, in the same
Arrow batch (the old reader blanked a whole batch's column on one such value).

The checks are the sensitivities the accountant assumes:

* stage 1 (the DP schema's count vector, :class:`~dpsummary.private.preprocess.CountVector`):
  the record count differs by exactly 1, and in each column at most 2 coordinates differ, each
  by at most 1 (so the L2 distance is at most ``sqrt(touches)``, ``touches = 2 x columns``);
* stage 2 (every release sum is a sum over records of the encoded row and its quality flags):
  the first ``N`` records encode to the SAME rows and flags in D and D' (nothing the added record
  holds changes another record), and the added record adds at most one row and one flag per rule.
"""

from __future__ import annotations

import datetime as dt
import decimal
from collections.abc import Callable
from pathlib import Path
from typing import Any

import numpy as np
import pyarrow as pa
import pyarrow.parquet as pq

from dpsummary.data import ColumnSpec, Schema, Transform
from dpsummary.private.spark_engine import BatchEncoder

#: Records of D (one Arrow batch: far below STREAM_BATCH_ROWS).
N = 400

Case = tuple[str, Callable[[], pa.Array], Callable[[], pa.Array]]


def _bytes_array(values: list[bytes | None], typ: pa.DataType) -> pa.Array:
    """``values`` as an array of ``typ`` holding exactly these bytes (string types are VIEWED
    from binary: Arrow does not validate UTF-8 then, as Parquet writers such as Spark do not)."""
    if pa.types.is_fixed_size_binary(typ):
        return pa.array(values, typ)
    if pa.types.is_string_view(typ):
        return pa.array(values, pa.binary_view()).view(typ)
    if pa.types.is_binary_view(typ):
        return pa.array(values, typ)
    if pa.types.is_large_string(typ):
        return pa.array(values, pa.large_binary()).view(typ)
    if pa.types.is_string(typ):
        return pa.array(values, pa.binary()).view(typ)
    return pa.array(values, typ)


def _clean_bytes(n: int) -> list[bytes | None]:
    """``FR``/``US`` (one in three ``FR``), every 50th value null."""
    return [None if i % 50 == 49 else (b"FR" if i % 3 == 0 else b"US") for i in range(n)]


def _byte_case(name: str, typ: pa.DataType, *, dictionary: bool = False) -> Case:
    def clean() -> pa.Array:
        arr = _bytes_array(_clean_bytes(N), typ)
        return arr.dictionary_encode() if dictionary else arr

    def extra() -> pa.Array:
        arr = _bytes_array([b"\xff\xff"], typ)
        return arr.dictionary_encode() if dictionary else arr

    return name, clean, extra


def _values_case(name: str, typ: pa.DataType, clean: list[Any], extreme: Any) -> Case:
    reps = N // len(clean) + 1
    return name, lambda: pa.array((clean * reps)[:N], typ), lambda: pa.array([extreme], typ)


BYTE_TYPES = [("string", pa.string()), ("large_string", pa.large_string()), ("string_view", pa.string_view()),
              ("binary", pa.binary()), ("large_binary", pa.large_binary()), ("binary_view", pa.binary_view()),
              ("fixed_size_binary", pa.binary(2))]
I64 = (-(2**63), 2**63 - 1)


def cases() -> list[Case]:
    """(name, D's column, the neighbour's one value) for every type of the matrix. Dictionaries
    of the view types are left out: pyarrow cannot write them to Parquet (its cast kernel has no
    dictionary-to-view path); text_column reads them (tests/data/test_text_types.py)."""
    out = [_byte_case(name, typ) for name, typ in BYTE_TYPES]
    out += [_byte_case(f"dictionary<{name}>", typ, dictionary=True) for name, typ in BYTE_TYPES
            if not (pa.types.is_string_view(typ) or pa.types.is_binary_view(typ))]
    d = decimal.Decimal
    out += [
        _values_case("int8", pa.int8(), [1, 2, 3], -128),
        _values_case("int16", pa.int16(), [1, 2, 3], -(2**15)),
        _values_case("int32", pa.int32(), [1, 2, 3], 2**31 - 1),
        _values_case("int64", pa.int64(), [1, 2, 3], I64[0]),
        _values_case("uint8", pa.uint8(), [1, 2, 3], 255),
        _values_case("uint16", pa.uint16(), [1, 2, 3], 2**16 - 1),
        _values_case("uint32", pa.uint32(), [1, 2, 3], 2**32 - 1),
        _values_case("uint64", pa.uint64(), [1, 2, 3], 2**64 - 1),
        _values_case("float16", pa.float16(), [np.float16(1.5), np.float16(2.5)], np.float16("nan")),
        _values_case("float32", pa.float32(), [1.5, 2.5, None], float("-inf")),
        _values_case("float64", pa.float64(), [1.5, 2.5, None], 1.7976931348623157e308),
        _values_case("decimal128(9,2)", pa.decimal128(9, 2), [d("1.50"), d("2.25")], d("-9999999.99")),
        _values_case("decimal128(38,0)", pa.decimal128(38, 0), [d(1), d(2)], d(10**38 - 1)),
        _values_case("decimal256(76,0)", pa.decimal256(76, 0), [d(1), d(2)], d(10**76 - 1)),
        _values_case("date32", pa.date32(), [dt.date(2020, 1, 1), dt.date(2021, 6, 30)], dt.date(1, 1, 1)),
        ("date32-out-of-range", lambda: pa.array([18262, 18808] * (N // 2), pa.int32()).view(pa.date32()),
         lambda: pa.array([-(2**31)], pa.int32()).view(pa.date32())),
        _values_case("date64", pa.date64(), [dt.date(2020, 1, 1)], dt.date(9999, 12, 31)),
        _values_case("time32[ms]", pa.time32("ms"), [0, 1000], 2**31 - 1),
        _values_case("time64[us]", pa.time64("us"), [0, 10**6], I64[1]),
        _values_case("time64[ns]", pa.time64("ns"), [0, 10**9], I64[0]),
        _values_case("timestamp[ms]", pa.timestamp("ms"), [0, 86_400_000], I64[1]),
        _values_case("timestamp[us]", pa.timestamp("us"), [0, 86_400_000_000], I64[0]),
        _values_case("timestamp[ns]", pa.timestamp("ns"), [0, 86_400 * 10**9], I64[1]),
        _values_case("timestamp[us,UTC]", pa.timestamp("us", tz="UTC"), [0, 86_400_000_000], I64[1]),
        _values_case("duration[ns]", pa.duration("ns"), [1, 2], I64[1]),
        _values_case("bool", pa.bool_(), [True, False, None], True),
        ("null", lambda: pa.nulls(N), lambda: pa.nulls(1)),
        _values_case("list<int64>", pa.list_(pa.int64()), [[1], [2, 3]], [None] * 1000),
        _values_case("large_list<string>", pa.large_list(pa.string()), [["FR"]], ["\x00" * 100]),
        _values_case("fixed_size_list<int64,2>", pa.list_(pa.int64(), 2), [[1, 2]], [I64[0], I64[1]]),
        _values_case("struct", pa.struct([("a", pa.int64()), ("b", pa.string())]), [{"a": 1, "b": "FR"}],
                     {"a": I64[1], "b": None}),
        _values_case("map<string,int64>", pa.map_(pa.string(), pa.int64()), [[("k", 1)]], [("", I64[0])] * 50),
    ]
    return out


CASE_IDS = [c[0] for c in cases()]


def case(name: str) -> Case:
    return next(c for c in cases() if c[0] == name)


def tables(name: str) -> tuple[pa.Table, pa.Table]:
    """(D, D'): columns ``c`` (the type under test), ``x`` numeric text, ``y`` target; D' is D
    plus one record (``c`` the neighbour's value, ``x`` and ``y`` valid)."""
    _, clean, extra = case(name)
    rng = np.random.default_rng(47)
    x = [f"{v:.3f}" for v in rng.uniform(0, 10, N)]
    y = ["yes" if v > 0.5 else "no" for v in rng.random(N)]
    base = pa.table({"c": clean(), "x": pa.array(x), "y": pa.array(y)})
    one = pa.table({"c": extra(), "x": pa.array(["5.000"]), "y": pa.array(["yes"])})
    return base, pa.concat_tables([base, one.cast(base.schema)]).combine_chunks()


def write(path: Path, tbl: pa.Table) -> Path:
    pq.write_table(tbl, path)
    return path


def transforms(clean_text: list[str]) -> list[Transform]:
    """Two public schemas reading ``c``: as a categorical with D's two most common texts as
    categories, and as a numeric in [0, 10]; ``x`` numeric, ``y`` the binary target."""
    x = ColumnSpec(name="x", kind="numeric", lower=0, upper=10)
    y = ColumnSpec(name="y", kind="categorical", categories=["no", "yes"])
    words = sorted({t for t in clean_text if t}, key=lambda t: (-clean_text.count(t), t))[:2] or ["none"]
    return [Transform.from_schema(Schema(columns=[ColumnSpec(name="c", kind="categorical", categories=words), x, y],
                                         target="y")),
            Transform.from_schema(Schema(columns=[ColumnSpec(name="c", kind="numeric", lower=0, upper=10), x, y],
                                         target="y"))]


def check_stage1(base: Any, neighbour: Any, rows: tuple[int, int]) -> None:
    """Stage 1's exact counts (two :class:`CountVector`) differ as one record may change them."""
    assert rows[1] - rows[0] == 1
    assert base.touches == neighbour.touches
    a, b = base.as_dict(), neighbour.as_dict()
    per_column: dict[str, int] = {}
    total = 0.0
    for key in set(a) | set(b):
        diff = abs(b.get(key, 0.0) - a.get(key, 0.0))
        assert diff <= 1.0, (key, diff)
        if diff:
            per_column[key[0]] = per_column.get(key[0], 0) + 1
            total += diff * diff
    assert all(v <= 2 for v in per_column.values()), per_column
    assert total <= base.touches
    # The added record is counted in every column's type histogram (nothing else moved there).
    for column in ("c", "x", "y"):
        assert sum(b[k] for k in b if k[:2] == (column, "type")) - sum(a[k] for k in a if k[:2] == (column, "type")) == 1


def check_stage2(base: tuple[np.ndarray, np.ndarray, np.ndarray], neighbour: tuple[np.ndarray, np.ndarray, np.ndarray]) -> None:
    """Per-record encodings ``(kept (n,) bool, rows (n, d) float64 with NaN where dropped,
    quality (n, k) bool)`` of D and D' in record order: the first N records are identical, and
    D' has exactly one more record, so every stage-2 sum moves by one record's clipped term."""
    kept_a, rows_a, q_a = base
    kept_b, rows_b, q_b = neighbour
    n = kept_a.shape[0]
    assert kept_b.shape[0] == n + 1
    assert np.array_equal(kept_a, kept_b[:n])
    assert np.array_equal(rows_a, rows_b[:n], equal_nan=True)
    assert np.array_equal(q_a, q_b[:n])
    assert np.abs(q_b.sum(axis=0).astype(np.int64) - q_a.sum(axis=0).astype(np.int64)).max() <= 1
    assert int(kept_b.sum()) - int(kept_a.sum()) in (0, 1)


def encodings(batches: list[pa.RecordBatch], transform: Any) -> tuple[np.ndarray, np.ndarray, np.ndarray]:
    """Per-record (kept, rows with NaN where dropped, quality flags) by the shared encoder."""
    encoder = BatchEncoder(transform, "drop", "other")
    kept_all, rows_all, quality_all = [], [], []
    for batch in batches:
        rows, kept, quality = encoder(batch)
        mask = np.zeros(batch.num_rows, dtype=bool)
        mask[kept] = True
        full = np.full((batch.num_rows, rows.shape[1]), np.nan)
        full[kept] = rows
        kept_all.append(mask)
        rows_all.append(full)
        quality_all.append(quality)
    return np.concatenate(kept_all), np.concatenate(rows_all), np.concatenate(quality_all)


#: The issue's table: 60,000 records (the issue's size; at epsilon 0.5 the feature category
#: threshold is about 1,400 records and FR's 20,000 sit more than 100 noise sds above it, so
#: either outcome below fails with probability far below 1e-12).
ISSUE_ROWS = 60_000


def issue_table(path: Path, *, bad_row: bool) -> Path:
    """``cc`` ``fixed_size_binary(2)`` (FR one in three, else US), ``x`` in [0, 10], target
    ``y``; with ``bad_row`` one more record whose ``cc`` is ``b'\\xff\\xff'``."""
    rng = np.random.default_rng(47)
    x = rng.uniform(0, 10, ISSUE_ROWS)
    y = np.where(rng.random(ISSUE_ROWS) < 1 / (1 + np.exp(-(x - 5) / 2)), "yes", "no")
    cc = [b"FR" if i % 3 == 0 else b"US" for i in range(ISSUE_ROWS)]
    extra = 1 if bad_row else 0
    tbl = pa.table({"cc": pa.array(cc + [b"\xff\xff"] * extra, pa.binary(2)),
                    "x": pa.array(x.tolist() + [5.0] * extra), "y": pa.array(y.tolist() + ["yes"] * extra)})
    pq.write_table(tbl, path)
    return path


def release_issue_table(tmp_path: Path, *, bad_row: bool, engine: str) -> str:
    """The issue's release: zero configuration (no policy, no schema), epsilon 0.5, target
    ``y``, through the CLI; returns its output after asserting a signed artifact."""
    from typer.testing import CliRunner

    import dpsummary
    from dpsummary.cli import app

    data = issue_table(tmp_path / f"cc{int(bad_row)}.parquet", bad_row=bad_row)
    out = tmp_path / f"cc{int(bad_row)}.json"
    r = CliRunner().invoke(app, ["release", "--epsilon", "0.5", "--target", "y", "--engine", engine, "--out", str(out),
                                 str(data)])
    assert r.exit_code == 0, r.output[-2000:]
    assert dpsummary.load(out) is not None
    return " ".join(r.output.split())
