"""Issue 47: every column type a Parquet file can hold is read one record at a time (local engine).

The type matrix of tests/text_types_support.py: for each type, D and D' (D plus one record with
an invalid or extreme value, in the same Arrow batch) written to Parquet and read back by the
release's reader. Stage 1's exact count vectors differ by at most what one record may change,
and stage 2's per-record encodings of D's records are identical in D' (so every sum moves by one
record's term). The Spark engine runs the same matrix in tests/spark/test_text_types_spark.py.
"""

from __future__ import annotations

from pathlib import Path

import pyarrow as pa
import pytest
from text_types_support import (
    CASE_IDS,
    N,
    check_stage1,
    check_stage2,
    encodings,
    tables,
    transforms,
    write,
)

from dpsummary.data import text_column
from dpsummary.data.stream import BatchStream, text_kind
from dpsummary.private.source import PrivateSource


def _stage1(path: Path) -> tuple[object, int]:
    src = PrivateSource.open(path)
    try:
        src._scan_stage1(schema=True)
        return src._schema_counts.vector(), int(src._rows)
    finally:
        src.close()


@pytest.mark.parametrize("name", CASE_IDS)
def test_one_record_moves_stage1_and_stage2_by_one_record(tmp_path: Path, name: str) -> None:
    base, neighbour = tables(name)
    pa_d, pa_n = write(tmp_path / "d.parquet", base), write(tmp_path / "n.parquet", neighbour)
    read_d, read_n = list(BatchStream(pa_d)), list(BatchStream(pa_n))
    assert len(read_n) == 1  # the added record shares the batch of every other record
    typ = read_n[0].schema.field("c").type
    assert read_d[0].schema.field("c").type == typ  # the same public type in both tables
    (vec_d, rows_d), (vec_n, rows_n) = _stage1(pa_d), _stage1(pa_n)
    check_stage1(vec_d, vec_n, (rows_d, rows_n))
    text = text_column(read_n[0].column(0))[0].to_pylist()
    if text_kind(typ) == "none":  # no text form: every value missing, by the type alone
        assert text == [""] * (N + 1)
    else:
        # One value can change only its own record: D's non-missing texts all survive in D'.
        assert text[:N] == text_column(read_d[0].column(0))[0].to_pylist()
    for tf in transforms(text[:N]):
        check_stage2(encodings(read_d, tf), encodings(read_n, tf))


def test_the_issue_table_counts_every_record_as_text(tmp_path: Path) -> None:
    """The issue's table: ``fixed_size_binary(2)`` FR/US, plus one ``b'\\xff\\xff'``: the type
    counts of ``cc`` are text 1,001 (before: missing 1,001), the bad value flagged alone."""
    values = [b"FR" if i % 3 == 0 else b"US" for i in range(1000)]
    for extra in ([], [b"\xff\xff"]):
        path = write(tmp_path / f"t{len(extra)}.parquet", pa.table({"cc": pa.array(values + extra, pa.binary(2))}))
        vec, _ = _stage1(path)
        counts = vec.as_dict()
        assert counts[("cc", "type", "text")] == 1000 + len(extra) and counts[("cc", "type", "missing")] == 0
        assert counts[("cc", "value", "FR")] == 334 and counts[("cc", "value", "US")] == 666
        text, bad = text_column(next(iter(BatchStream(path))).column(0))
        assert int(bad.sum()) == len(extra) and text.to_pylist()[:1000] == [v.decode() for v in values]


def test_text_kind_is_the_types_alone() -> None:
    """The rule is a function of the Arrow type: dictionaries, extension types and view types
    (which pyarrow cannot write to Parquet as dictionaries) take their value type's rule."""
    byte_types = [pa.string(), pa.large_string(), pa.string_view(), pa.binary(), pa.large_binary(),
                  pa.binary_view(), pa.binary(16)]
    for t in byte_types:
        assert text_kind(t) == "bytes" and text_kind(pa.dictionary(pa.int32(), t)) == "bytes"
    assert text_kind(pa.uuid()) == "bytes" and text_kind(pa.json_()) == "bytes"
    for t in (pa.int8(), pa.uint64(), pa.float16(), pa.decimal256(76, 0), pa.date64(), pa.time32("s"),
              pa.timestamp("ns", tz="UTC"), pa.duration("s"), pa.bool_(), pa.null()):
        assert text_kind(t) == "cast"
    for t in (pa.list_(pa.string()), pa.struct([("a", pa.string())]), pa.map_(pa.string(), pa.string()),
              pa.list_view(pa.int8()), pa.dense_union([pa.field("a", pa.int8())]),
              pa.month_day_nano_interval()):
        assert text_kind(t) == "none"


@pytest.mark.parametrize("typ", [pa.string_view(), pa.binary_view(), pa.binary(2)])
def test_dictionary_of_view_and_fixed_types_reads_per_value(typ: pa.DataType) -> None:
    """In memory (Parquet cannot hold them), dictionaries of view and fixed-size types read as
    their values do: the bad value flags only the rows that hold it; a null index is missing."""
    from text_types_support import _bytes_array

    values = _bytes_array([b"FR", b"\xff\xff"], typ)
    col = pa.DictionaryArray.from_arrays(pa.array([0, 1, None, 0], pa.int32()), values)
    text, bad = text_column(col)
    assert text.to_pylist() == ["FR", "\ufffd\ufffd", "", "FR"] and bad.tolist() == [False, True, False, False]
    sliced, sliced_bad = text_column(col.slice(1, 2))
    assert sliced.to_pylist() == ["\ufffd\ufffd", ""] and sliced_bad.tolist() == [True, False]


def test_out_of_range_temporal_values_read_as_text_per_record() -> None:
    """Arrow's text form of an out-of-range date or timestamp is a per-value text, never an
    error (the cast of a 'cast' type is total on the types pyarrow reads from Parquet)."""
    i64 = pa.array([-(2**63) + 1, 0, 2**63 - 1], pa.int64())
    for typ in (pa.timestamp("s"), pa.timestamp("ms"), pa.timestamp("us", tz="Europe/Paris"), pa.date64(),
                pa.time64("ns"), pa.duration("ms")):
        text, bad = text_column(i64.view(typ))
        assert all(text.to_pylist()) and not bad.any()
    text, _ = text_column(i64.view(pa.timestamp("ms")))
    assert text.to_pylist()[1] == "1970-01-01 00:00:00.000" and text.to_pylist()[0].startswith("<value out of range")
