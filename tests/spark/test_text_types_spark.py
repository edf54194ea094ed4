"""Issue 47 on the Spark engine: the type matrix of tests/text_types_support.py.

One shared session (the ``spark`` fixture), parametrised inside. For every type Spark reads,
D and D' (one added record with an invalid or extreme value) give stage-1 exact count vectors
that differ by at most what one record may change, and the first N records' stage-2 encodings
(the executors' :class:`BatchEncoder`, the local engine's encoder) are identical in D and D'.
Spark's counts and encodings are the local engine's for every type it reads. A type Spark cannot read (float16, decimal256, TIME, TIMESTAMP(NANOS), UUID), and the
millisecond TIMESTAMP (Spark converts it with a checked multiply: one extreme value fails the
whole pass), is a one-line refusal made from the footers' schema alone: the same for D and D',
before any reservation (tests/spark/test_release_types_spark.py checks the ledger side).
"""

from __future__ import annotations

import json
import shutil
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import numpy as np
import pyarrow as pa
import pytest
from text_types_support import (
    CASE_IDS,
    check_stage1,
    check_stage2,
    encodings,
    tables,
    transforms,
    write,
)

from dpsummary.data import text_column
from dpsummary.data.stream import BatchStream
from dpsummary.private.source import PrivateSource
from dpsummary.private.spark_engine import ROW_COLUMN, BatchEncoder, SparkSource, _data_columns
from dpsummary.spark.session import SparkEngineError, private_dir, public_header

pytestmark = pytest.mark.filterwarnings("ignore::FutureWarning")

#: Types Spark 4 cannot read from Parquet (its reader refuses the physical or logical type).
SPARK_UNREADABLE = {"float16", "decimal256(76,0)", "time32[ms]", "time64[us]", "time64[ns]", "timestamp[ns]"}
#: Refused before the reservation by the public schema check: the unreadable types and the
#: millisecond timestamp (Spark's checked ms-to-us multiply fails the pass on one extreme value).
SPARK_REFUSED = SPARK_UNREADABLE | {"timestamp[ms]"}



def _encode_pass(encoder: BatchEncoder) -> Any:
    """Per-record encodings on the executors, keyed by the row's index in its file (a nested
    function: pickled by value). Test-only: a release never collects records."""

    def fn(batches: Iterator[pa.RecordBatch]) -> Iterator[pa.RecordBatch]:
        for batch in batches:
            ids = batch.column(batch.schema.get_field_index(ROW_COLUMN)).to_pylist()
            rows, kept, quality = encoder(_data_columns(batch))
            where = {int(k): j for j, k in enumerate(kept.tolist())}
            enc = [json.dumps([rows[where[i]].tolist() if i in where else None, quality[i].tolist()])
                   for i in range(batch.num_rows)]
            yield pa.RecordBatch.from_pydict({"row": pa.array(ids, pa.int64()), "enc": pa.array(enc, pa.string())})

    return fn


def _spark_encodings(src: SparkSource, transform: Any) -> tuple[np.ndarray, np.ndarray, np.ndarray]:
    out = sorted((r["row"], json.loads(r["enc"])) for r in
                 src._df.mapInArrow(_encode_pass(BatchEncoder(transform, "drop", "other")), "row long, enc string")
                 .collect())
    assert [r for r, _ in out] == list(range(len(out)))
    width = transform.point_dim
    kept = np.array([e[0] is not None for _, e in out])
    rows = np.array([e[0] if e[0] is not None else [np.nan] * width for _, e in out], dtype=np.float64)
    quality = np.array([e[1] for _, e in out], dtype=bool)
    return kept, rows, quality


def _local_encodings(path: Path, transform: Any) -> tuple[np.ndarray, np.ndarray, np.ndarray]:
    return encodings(list(BatchStream(path)), transform)


@pytest.fixture(scope="module")
def scratch() -> Iterator[Path]:
    path = private_dir()
    yield path
    shutil.rmtree(path, ignore_errors=True)


@pytest.mark.parametrize("name", CASE_IDS)
def test_spark_one_record_moves_stage1_and_stage2_by_one_record(spark: Any, tmp_path: Path, scratch: Path,
                                                                 name: str) -> None:
    base, neighbour = tables(name)
    paths = write(tmp_path / "d.parquet", base), write(tmp_path / "n.parquet", neighbour)
    if name in SPARK_REFUSED:
        # Decided from the footers' schema alone: the same one-line refusal for D and D'.
        messages = set()
        for path in paths:
            with pytest.raises(SparkEngineError) as err:
                public_header(path, None)
            messages.add(str(err.value).replace(path.name, "<file>"))
            assert "\n" not in str(err.value) and "'c'" in str(err.value)
            if name in SPARK_UNREADABLE:  # and the engine's own safety net, should the check be bypassed
                with pytest.raises(SparkEngineError, match="Spark cannot read the input"):
                    SparkSource(spark, path, scratch, steps=1)
        assert len(messages) == 1
        return
    assert all(public_header(path, None) == ["c", "x", "y"] for path in paths)
    sources = [SparkSource(spark, path, scratch, steps=1) for path in paths]
    vectors = [src.schema_counts().vector() for src in sources]
    check_stage1(vectors[0], vectors[1], (int(sources[0]._rows or 0), int(sources[1]._rows or 0)))
    local = PrivateSource.open(paths[1])
    local._scan_stage1(schema=True)
    # The engines agree: Spark reads fixed_size_binary as binary, uint64 as decimal(20,0),
    # durations as int64, nulls as int32 and zoned timestamps in its session's zone (printed in
    # UTC by the reader), all to the same texts, hence the same exact counts and encodings.
    assert vectors[1].as_dict() == local._schema_counts.vector().as_dict()
    local.close()
    clean_text = text_column(next(iter(BatchStream(paths[0]))).column(0))[0].to_pylist()
    for tf in transforms(clean_text):
        got = [_spark_encodings(src, tf) for src in sources]
        check_stage2(got[0], got[1])
        for a, b in zip(got[1], _local_encodings(paths[1], tf), strict=True):
            assert np.array_equal(a, b, equal_nan=True)
    for src in sources:
        src.close()
