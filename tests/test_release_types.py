"""Issue 47 through the CLI (local engine): the issue's table reversed. A ``fixed_size_binary``
column ``cc`` (FR/US) releases as a 2-category categorical, and so does the same table plus ONE
record holding ``b'\\xff\\xff'`` (before: that record blanked ``cc`` for the whole batch and the
release dropped it). Zero configuration, epsilon 0.5, 60,000 records: see
tests/text_types_support.py for why the outcome is certain. The Spark engine's run is in
tests/spark/test_release_types_spark.py."""

from __future__ import annotations

from pathlib import Path

import pytest
from text_types_support import release_issue_table

pytestmark = pytest.mark.filterwarnings("ignore::FutureWarning")


@pytest.mark.parametrize("bad_row", [False, True], ids=["D", "D-plus-one-bad-row"])
def test_issue_table_releases_cc_categorical_local(tmp_path: Path, home: Path, bad_row: bool) -> None:
    output = release_issue_table(tmp_path, bad_row=bad_row, engine="local")
    assert "cc: categorical, 2 categories passed the noisy threshold" in output, output[-3000:]
    assert "cc: dropped" not in output
