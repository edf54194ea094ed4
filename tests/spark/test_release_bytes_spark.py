"""Issue 35 on the Spark engine: the cases of tests/test_release_bytes.py (one value's bytes in a
Parquet table, public schema and zero configuration) released with ``--engine spark`` end as
the clean table's release does. See tests/bytes_support.py."""

from __future__ import annotations

from pathlib import Path
from typing import Any

import pytest
from bytes_support import cases, clean_values, corrupted, release

pytestmark = pytest.mark.filterwarnings("ignore::FutureWarning")



@pytest.mark.parametrize("mode,config,column,row,raw",
                         [c for c in cases() if c[0].endswith("spark")],
                         ids=lambda v: v if isinstance(v, str) else None)
def test_one_value_never_decides_a_sparkrelease(spark: Any, tmp_path: Path, home: Path, mode: str, config: str,
                                                  column: str | None, row: int, raw: bytes) -> None:
    release(tmp_path, home, mode, config, corrupted(clean_values(), column, row, raw), "case")
