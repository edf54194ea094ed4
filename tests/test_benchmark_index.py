"""The generated pages: the README's trust table (``benchmarks/headline.py``) and the
BENCHMARKS.md index (``benchmarks/index.py``), issue 49."""

from __future__ import annotations

import csv
import sys
from pathlib import Path
from typing import Any

import pytest

ROOT = Path(__file__).resolve().parents[1]
RESULTS = ROOT / "benchmarks" / "results"


def _module(name: str) -> Any:
    sys.path.insert(0, str(ROOT / "benchmarks"))
    try:
        return __import__(name)
    finally:
        sys.path.pop(0)


def _row(table: str, outcome: str, coverage: float, wrong: int = 0, **extra: Any) -> dict[str, Any]:
    return {"table": table, "kind": "real", "model": "logistic", "mode": "public", "epsilon": 0.3,
            "mechanism": "noise-aware-newton", "run": 0, "outcome": outcome, "param_dim": 5,
            "coverage": coverage if outcome == "released" else "", "effects_wrong_sign": wrong,
            "floor_coverage": 0.97, "floor_wrong_sign": 0, "width_ratio": 2.0, "floor_width_ratio": 1.6,
            "width_vs_floor": 1.25, "effects_full": 3, "effects_found": 1, "floor_effects_found": 2,
            "posterior": "noise_aware", **extra}


def test_headline_counts_cells_by_the_suites_own_verdict(tmp_path: Path) -> None:
    cal, headline = _module("calibration"), _module("headline")
    rows = [_row("adult", "released", 0.95), _row("adult", "released", 0.92),    # honest
            _row("wells", "released", 0.95, wrong=2),                           # 2 wrong signs > floor 0 + 1: not honest
            _row("sim_rare", "refused", 0.0, message="ChargedRefusal: x"),      # refused
            _row("hmda", "released", 0.5, mechanism="dp-psvi")]                 # another mechanism: left out
    path = tmp_path / "calibration.csv"
    with path.open("w", newline="") as fh:
        w = csv.DictWriter(fh, fieldnames=cal.FIELDS, restval="")
        w.writeheader()
        w.writerows(rows)
    lines = headline.headline(path, link="docs/CALIBRATION.md")
    assert lines[2] == "| 0.3 | 1 of 3 | 1 | 1 | 1.25 | 2.0 (4.0) | 2 |"
    text = " ".join(lines)
    assert "3 tables (2 real, 1 simulated)" in text
    assert "Laplace posterior" in text and "`noise_aware`" in text
    assert "not a proven bound" in text and "(docs/CALIBRATION.md)" in text


def test_splice_replaces_only_the_block_and_refuses_without_markers() -> None:
    headline = _module("headline")
    text = f"top\n{headline.START}\nold\n{headline.END}\nbottom\n"
    assert headline.splice(text, ["a", "b"]) == f"top\n{headline.START}\na\nb\n{headline.END}\nbottom\n"
    with pytest.raises(SystemExit, match="needs one"):
        headline.splice("no markers\n", ["a"])
    with pytest.raises(SystemExit, match="needs one"):
        headline.splice(f"{headline.END}\n{headline.START}\n", ["a"])


def test_readme_and_calibration_page_carry_the_current_headline() -> None:
    # Fails when calibration.csv changed without `python benchmarks/headline.py`.
    assert _module("headline").main(["--check"]) == 0


def test_extract_picks_rows_columns_and_bullets() -> None:
    index = _module("index")
    page = ("# T\n\n| a | b | c |\n|---|---|---|\n| 1 | x | 10 |\n| 2 | y | 20 |\n| 3 | x | 30 |\n\n"
            "## S\n\n- one\n- two x\n- three x\n")
    assert index.extract(page, index.Headline("p", rows=1, cols=(0, 2), grep="| x |")) == [
        "| a | c |", "| --- | --- |", "| 1 | 10 |"]
    assert index.extract(page, index.Headline("p", "## S", rows=1, grep="x", bullets=True)) == ["- two x"]
    assert index.extract(page, index.Headline("p", "## missing")) == []


def test_benchmarks_md_is_the_generated_index() -> None:
    index = _module("index")
    target = ROOT / "BENCHMARKS.md"
    text = target.read_text()
    # Fails when a results page changed without `python benchmarks/run.py --report-only`.
    assert index.index_markdown(RESULTS, target) == text
    assert len(text.splitlines()) <= 300
    assert "(no headline" not in text  # every section found its table in its results page
    assert "notebook/" not in text.replace("`benchmarks/notebook/`", "")  # the notebook is not a result
    for bench in index.BENCHMARKS:
        assert (RESULTS / bench.results[0]).exists(), bench.title
