"""Why the calibration suite's refused cells refuse: what zero configuration's stage 1 can see.

Issue 50 asks, for every cell that is not honest, a measured reason written beside it; for a
refused cell, whether it could be released honestly with what stage 1 learned. Every refused cell
of the suite is a zero-configuration release whose DP schema kept no feature column ("no feature
column could be estimated privately", or a target too thin to estimate). This benchmark measures,
from the table's own noise-free counts (a benchmark reads the records; a release never does this),
how far each feature column is from the threshold its noisy count must pass, at the cell's epsilon
and with the release's own stage-1 mechanism (:class:`dpsummary.private.preprocess.SchemaMechanism`
planned by :func:`dpsummary.release.plan_public` on the suite's zero-configuration policy):

* a numeric column is kept when one of its public grid bins has a noisy count above ``z s`` (``s``
  the column's noise sd on the count scale, ``z`` the false-bin threshold over every grid bin of
  every estimated column, :mod:`dpsummary.postprocess.schema`);
* a text column when one of its values has a noisy count above ``tau`` (partition selection,
  :meth:`SchemaMechanism.threshold`).

Per column, ``P(kept) = 1 - prod_b Phi((threshold - c_b) / s)`` over its non-empty bins or values
``c_b`` (the chance that noise lifts an empty bin, at most 1% over the table by construction, is
left out); per table, ``P(any feature kept) = 1 - prod_columns (1 - P(kept))``. The smallest
epsilon of :data:`EPSILON_GRID` at which that probability reaches 0.9 says what budget zero
configuration needs on this table (a public schema needs none).

Usage::

    python benchmarks/refusal_reasons.py --out benchmarks/results/refusal_reasons.md

reads the refused cells from ``benchmarks/results/calibration.csv`` (``--results``).
"""

from __future__ import annotations

import argparse
import csv
import os
import sys
import tempfile
from collections import defaultdict
from dataclasses import dataclass
from pathlib import Path

import numpy as np
from scipy.special import ndtr, ndtri

sys.path.insert(0, str(Path(__file__).resolve().parent))
import calibration as cal  # noqa: E402  (the suite's tables and policies)

RESULTS = Path(__file__).resolve().parent / "results"
#: The budgets at which a table's stage-1 visibility is computed (the suite's and between).
EPSILON_GRID = (0.1, 0.2, 0.3, 0.5, 1.0, 2.0, 3.0, 5.0, 10.0)
#: The probability of keeping at least one feature at which zero configuration is said to work.
ENOUGH = 0.9


@dataclass(frozen=True)
class Visibility:
    """What stage 1 can see of one table at one epsilon (module docstring)."""

    schema_sigma: float
    feature_noise_sd: float
    best_column: str
    best_ratio: float
    p_any_feature: float


def visibility(spec: cal.TableSpec, epsilon: float, workdir: Path, cache: Path = cal.CACHE) -> Visibility:
    """Stage 1's view of ``spec`` at ``epsilon`` under the suite's zero-configuration policy
    (with the table's ``--positive-class`` as the suite passes it)."""
    from dpsummary.data import read_csv
    from dpsummary.postprocess.schema import GRID_FALSE_BIN_PROB, NUM_GRID_BINS
    from dpsummary.private.preprocess import SchemaMechanism, build_count_vector
    from dpsummary.release import ReleaseRequest, plan_public, public_target_spec

    workdir.mkdir(parents=True, exist_ok=True)
    os.environ["DPSUMMARY_HOME"] = str(workdir / "home")
    data = cal.table_csv(spec, cache)
    policy = cal.write_policy(spec, "zero-config", data, workdir)
    req = ReleaseRequest(data=data, epsilon=epsilon, model=spec.model, target=cal.target_of(spec, data),
                         policy=policy, out=workdir / "x.json", ledger=workdir / "l.jsonl", force=True,
                         mechanism="noise-aware-newton", positive_class=spec.positive_class)
    public = plan_public(req, lambda _m: None)
    sigma = public.stage1.schema_sigma
    assert sigma is not None
    mech = SchemaMechanism.plan(public.header, noise_multiplier=sigma, target=req.target,
                                delta=public.delta_selection,
                                target_classes=2 if spec.model == "logistic" else None,
                                count_target=spec.model == "poisson", public_target=public_target_spec(public))
    counts = build_count_vector(read_csv(data))
    by_column: dict[str, dict[str, list[float]]] = defaultdict(lambda: {"grid": [], "value": []})
    for (column, section, _label), count in zip(counts.keys, counts.counts.tolist(), strict=True):
        if section != "type" and count > 0:
            by_column[column][section].append(count)
    z_grid = float(-ndtri(GRID_FALSE_BIN_PROB / (len(mech.estimated) * NUM_GRID_BINS)))
    target = mech.target
    features = [c for c in mech.estimated if c != target]
    p_none, best, best_ratio, noise_sd = 1.0, "", 0.0, 0.0
    for column in features:
        s = mech.raw_std(column)
        noise_sd = max(noise_sd, s)
        cells = [(np.asarray(by_column[column]["grid"]), z_grid * s), (np.asarray(by_column[column]["value"]), mech.threshold(column))]
        p_missed = 1.0
        for c, threshold in cells:
            if c.size:
                p_missed *= float(np.prod(ndtr((threshold - c) / s)))
                ratio = float(c.max() / threshold)
                if ratio > best_ratio:
                    best, best_ratio = column, ratio
        p_none *= p_missed
    return Visibility(float(sigma), noise_sd, best, best_ratio, 1.0 - p_none)


def refused_cells(results: Path) -> list[tuple[str, float, int, int, str]]:
    """(table, epsilon, refused runs, runs, what refused) of every zero-configuration
    noise-aware-newton cell with a refusal; what refused: ``features`` (no feature column kept),
    ``target`` (the target not estimable) or both, from the refusals' messages."""
    cells: dict[tuple[str, float], list[tuple[str, str]]] = defaultdict(list)
    with results.open(newline="") as fh:
        for row in csv.DictReader(fh):
            if row["mechanism"] == "noise-aware-newton" and row["mode"] == "zero-config":
                cells[(row["table"], float(row["epsilon"]))].append((row["outcome"], row.get("message") or ""))
    out = []
    for (t, e), v in sorted(cells.items()):
        messages = [m for o, m in v if o == "refused"]
        if messages:
            kinds = sorted({"target" if "target" in m.split(":", 2)[1] else "features" for m in messages})
            out.append((t, e, len(messages), len(v), " and ".join(kinds)))
    return out


def needed_epsilon(spec: cal.TableSpec, workdir: Path) -> float | None:
    """The smallest epsilon of :data:`EPSILON_GRID` at which stage 1 keeps a feature with
    probability at least :data:`ENOUGH`."""
    for eps in EPSILON_GRID:
        if visibility(spec, eps, workdir).p_any_feature >= ENOUGH:
            return eps
    return None


def report(results: Path) -> list[str]:
    workdir = Path(tempfile.mkdtemp(prefix="refusal-reasons-"))
    lines = [
        "# Why the suite's refused cells refuse (issue 50)",
        "",
        "Generated by `python benchmarks/refusal_reasons.py --out benchmarks/results/refusal_reasons.md` from "
        f"`{results.relative_to(RESULTS.parent.parent) if results.is_relative_to(RESULTS.parent.parent) else results}` "
        "and the tables' noise-free counts (the method: the script's docstring). Each refused cell is a "
        "zero-configuration release whose stage 1 (the DP schema, a fifth of the budget) kept no feature column "
        "(`features`) or could not estimate a target with no `--positive-class` (`target`: a 0/1 numeric target "
        "whose noisy counts are below three noise sds). "
        "Feature noise sd: the noise sd of one count of a feature column (records). Best feature: the column "
        "whose largest noise-free bin or category comes closest to the threshold its noisy count must pass, and "
        "that ratio. P(any feature): the chance that stage 1 keeps at least one feature column at all. "
        f"Needs epsilon: the smallest of {', '.join(f'{e:g}' for e in EPSILON_GRID)} at which that chance reaches "
        f"{ENOUGH:g} (a public schema needs no budget for this).",
        "",
        "| table | epsilon | refused / runs | what refused | schema noise multiplier | feature noise sd | best feature (largest count / threshold) | P(any feature) | needs epsilon |",
        "|---|---|---|---|---|---|---|---|---|",
    ]
    needs: dict[str, float | None] = {}
    below: list[str] = []
    above: list[str] = []
    for table, eps, refused, runs, what in refused_cells(results):
        spec = cal.TABLES[table]
        v = visibility(spec, eps, workdir)
        if table not in needs:
            needs[table] = needed_epsilon(spec, workdir)
        need = needs[table]
        (below if v.best_ratio < 1.0 else above).append(
            f"{table} at {eps:g} ({v.best_column} {v.best_ratio:.2f}, P {v.p_any_feature:.2f}, refused {refused} of {runs})")
        lines.append(f"| {table} | {eps:g} | {refused} / {runs} | {what} | {v.schema_sigma:.1f} | {v.feature_noise_sd:,.0f} | "
                     f"{v.best_column} ({v.best_ratio:.2f}) | {v.p_any_feature:.3f} | "
                     f"{'over ' + format(EPSILON_GRID[-1], 'g') if need is None else format(need, 'g')} |")
    lines += [
        "",
        f"What this says: in {len(below)} of the {len(below) + len(above)} refused cells no feature column's largest "
        "noise-free count reaches the threshold (ratio below 1), so stage 1 keeps a feature only when noise lifts "
        "one (where the target refused, the features would have refused too)"
        + ("." if not above else f"; in the others ({'; '.join(above)}) a feature is above it, and the cell refused "
           "in the releases where noise pushed it below.")
        + " A refused release has no feature to regress on. What stage 1 did learn (the target's spec, a noisy "
        "record count) would support only an intercept, which answers a different question than the regression "
        "asked, so the refusal is kept: it costs stage 1's share and names the fix, a public schema (`dpsummary "
        "policy init DATA`).",
    ]
    return lines


def main(argv: list[str] | None = None) -> None:
    p = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    p.add_argument("--results", type=Path, default=RESULTS / "calibration.csv")
    p.add_argument("--out", type=Path, default=RESULTS / "refusal_reasons.md")
    a = p.parse_args(argv)
    if not a.results.exists():
        raise SystemExit(f"error: no results file {a.results}; run `calibration.py run --out` first")
    text = "\n".join(report(a.results.resolve())) + "\n"
    tmp = a.out.with_suffix(a.out.suffix + ".tmp")
    tmp.write_text(text)
    tmp.replace(a.out)
    print(f"wrote {a.out}")


if __name__ == "__main__":
    main()
