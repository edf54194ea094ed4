"""Zero configuration's feature bounds: how often a DP schema release gives a numeric feature a
"blown" box (bounds spanning more than 10x the column's data range), with and without the
sixteenth and seventeenth rules' isolated-marginal-bin rule (``benchmarks/notebook/noise_aware_variants.md``).

Each run is one schema release of a calibration-suite table (:mod:`calibration`'s registry and
zero-configuration policy) at the release's own calibration (the record count's and the schema's
Gaussians sized as ``dpsummary.release`` sizes them from the policy's budget split and delta),
with OS-entropy noise (:func:`dpsummary.private.preprocess.estimate_schema`). The released grid
histograms are post-processed twice, with the rule and without it (the same noise: a paired
comparison), and each numeric feature's bounds are compared with the column's data range. The
product's own post-processing (the "without" side) also warns, in a feature's note, when a bound
was set by a lone marginal bin that widens the box over 10x (:func:`dpsummary.postprocess.schema._suspect_bounds`):
the last two columns count those releases and how many of them are blown.

    python benchmarks/schema_bounds.py --tables azpro,default,wells --epsilons 0.3,1,3 --runs 300 --candidate Y
    python benchmarks/schema_bounds.py --tables sim_small_wide,sim_exact,sim_rare,sim_imbalanced --runs 300
"""

from __future__ import annotations

import argparse
import sys
import tempfile
from pathlib import Path
from typing import Any

import numpy as np

sys.path.insert(0, str(Path(__file__).resolve().parent))
import calibration as cal  # noqa: E402

from dpsummary.postprocess import schema as post  # noqa: E402
from dpsummary.private import preprocess  # noqa: E402

#: Candidates Y (sixteenth rule) and Y' (seventeenth: the exact-zero bin and the bin holding 1
#: exempt): a surviving grid bin with no other surviving bin within ISOLATION_BINS positions on the
#: line and a noisy count below the threshold plus MARGINAL_SDS noise sds is zeroed, when another
#: bin of the column survived. Measured here only; neither is in the product.
ISOLATION_BINS = 3
MARGINAL_SDS = 1.0


def line_order() -> list[int]:
    """Grid bins in their order on the line (the zero bin between the tiny negative and positive bins)."""
    zero_at = int(np.searchsorted(post.GRID_EDGES, 0.0, side="right"))
    return list(range(zero_at)) + [post.ZERO_BIN] + list(range(zero_at, post.ZERO_BIN))


def candidate(exempt: bool) -> Any:
    """``_numeric_spec`` with the candidate's bins zeroed first (features only)."""
    original = post._numeric_spec
    order = line_order()
    spared = {post.ZERO_BIN, post.ONE_BIN} if exempt else set()

    def numeric_spec(name: str, grid: np.ndarray, floor: float, integer: bool, *, full_range: bool,
                     noise_sd: float = 0.0) -> Any:
        if not full_range:
            alive = [i for i, k in enumerate(order) if grid[k] > floor]
            if len(alive) >= 2:
                pruned = grid.copy()
                for i in alive:
                    k = order[i]
                    lonely = not any(j != i and abs(j - i) <= ISOLATION_BINS for j in alive)
                    if k not in spared and lonely and grid[k] < floor + MARGINAL_SDS * noise_sd:
                        pruned[k] = 0.0
                if (pruned > floor).any():  # never every bin: then the grid as released
                    grid = pruned
        return original(name, grid, floor, integer, full_range=full_range, noise_sd=noise_sd)

    return numeric_spec


#: A feature's box is blown when its bounds span more than this many times its data range.
BLOWN_FACTOR = 10.0
#: A change of the bounds is harmful when it clips more than this share of a feature's records
#: beyond what the release without the rule clips.
HARM_SHARE = 0.01


def calibration(spec: cal.TableSpec, epsilon: float) -> tuple[float, float]:
    """The schema Gaussian's noise multiplier and the partition-selection delta of a
    zero-configuration release of ``spec`` at ``epsilon`` (``dpsummary.release``'s own stage-1
    calibration, :func:`dpsummary.release.stage1_noise`, on the suite's policy)."""
    from dpsummary import policy as pmod
    from dpsummary.release import DELTA_SELECTION_SHARE, stage1_noise

    path = cal.table_csv(spec)
    with tempfile.TemporaryDirectory() as tmp:
        pol = pmod.load_policy(cal.write_policy(spec, "zero-config", path, Path(tmp)))
    split = pol.budget_split.normalised(count=True, preprocessing=True, initialisation=True)
    delta_total = pol.resolve_delta(None)
    selection = DELTA_SELECTION_SHARE * delta_total
    _, schema, _ = stage1_noise(split, epsilon=epsilon, delta=delta_total - selection, count_public=False,
                                schema_public=False)
    assert schema is not None
    return schema, selection


def column_values(table: Any) -> dict[str, np.ndarray]:
    """Each column's finite numeric values (columns with none left out)."""
    from dpsummary.data import parse_floats

    out = {}
    for name in table.header:
        values, ok = parse_floats(table.array(name))
        if ok.any():
            out[name] = values[ok]
    return out


def data_ranges(values: dict[str, np.ndarray]) -> dict[str, float]:
    """Each column's data range (max - min of its finite numeric values)."""
    return {name: float(v.max() - v.min()) for name, v in values.items()}


def clipped(schema: Any, values: dict[str, np.ndarray]) -> dict[str, float]:
    """Per numeric feature with bounds, the share of its values outside them."""
    out = {}
    for col in schema.feature_columns:
        if col.kind == "numeric" and col.lower is not None and col.upper is not None and col.name in values:
            v = values[col.name]
            out[col.name] = float(((v < col.lower) | (v > col.upper)).mean())
    return out


def blown(schema: Any, ranges: dict[str, float]) -> list[str]:
    """The numeric features whose bounds span more than BLOWN_FACTOR times their data range."""
    out = []
    for col in schema.feature_columns:
        if col.kind == "numeric" and col.lower is not None and col.upper is not None:
            span = ranges.get(col.name, 0.0)
            if span > 0 and col.upper - col.lower > BLOWN_FACTOR * span:
                out.append(f"{col.name} [{col.lower:g}, {col.upper:g}]")
    return out


def run(spec: cal.TableSpec, epsilon: float, runs: int, exempt: bool) -> dict[str, Any]:
    from dpsummary.data import DataError, read_csv

    table = read_csv(cal.table_csv(spec))
    values = column_values(table)
    ranges = data_ranges(values)
    sigma, selection = calibration(spec, epsilon)
    captured: dict[str, Any] = {}
    original = preprocess.schema_from_release

    def capture(columns: Any, **kwargs: Any) -> Any:
        captured["columns"], captured["kwargs"] = columns, kwargs
        return original(columns, **kwargs)

    preprocess.schema_from_release = capture  # type: ignore[assignment]
    plain = post._numeric_spec
    counts = {"without": 0, "with": 0, "refused_without": 0, "refused_with": 0, "changed": 0, "harmful": 0,
              "warned": 0, "blown_warned": 0}
    examples: list[str] = []
    try:
        for _ in range(runs):
            captured.clear()
            try:
                preprocess.estimate_schema(table, noise_multiplier=sigma, target=cal.target_of(spec, cal.table_csv(spec)),
                                           delta=selection, target_classes=2 if spec.model == "logistic" else None,
                                           count_target=spec.model == "poisson")
            except DataError:
                pass
            if "columns" not in captured:
                continue
            bounds: dict[str, Any] = {}
            for variant, fn in (("without", plain), ("with", candidate(exempt))):
                post._numeric_spec = fn  # type: ignore[assignment]
                try:
                    result = original(captured["columns"], **captured["kwargs"])
                except DataError:
                    counts[f"refused_{variant}"] += 1
                    continue
                found = blown(result.schema, ranges)
                counts[variant] += bool(found)
                if variant == "without":  # the product's own post-processing: its warning
                    warned = any("warning: its" in note for note in result.notes)
                    counts["warned"] += warned
                    counts["blown_warned"] += warned and bool(found)
                bounds[variant] = result.schema
                if found and variant == "without" and len(examples) < 3:
                    examples.append("blown without the candidate: " + "; ".join(found))
            if len(bounds) == 2 and bounds["with"] != bounds["without"]:
                counts["changed"] += 1
                before, after = clipped(bounds["without"], values), clipped(bounds["with"], values)
                worst = max((after[k] - before.get(k, 0.0) for k in after), default=0.0)
                if worst > HARM_SHARE:
                    counts["harmful"] += 1
                    if len(examples) < 6:
                        examples.append("clipping > 1% more with it: " + "; ".join(
                            f"{c.name} [{c.lower:g}, {c.upper:g}]" for c in bounds["with"].feature_columns
                            if c.kind == "numeric" and after.get(c.name, 0.0) - before.get(c.name, 0.0) > HARM_SHARE))
    finally:
        preprocess.schema_from_release = original  # type: ignore[assignment]
        post._numeric_spec = plain  # type: ignore[assignment]
    return {"table": spec.name, "epsilon": epsilon, "runs": runs, "noise_multiplier": sigma, **counts,
            "examples": examples}


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--tables", default="azpro,default,wells")
    ap.add_argument("--epsilons", default="0.3,1,3")
    ap.add_argument("--runs", type=int, default=300)
    ap.add_argument("--candidate", choices=("Y", "Y'"), default="Y'")
    a = ap.parse_args()
    print("| table | epsilon | runs | schema noise multiplier | blown boxes without the candidate | with it | schemas it changed | of them clipping > 1% more | refused without | with | releases warned (product) | blown and warned |")
    print("|---|---:|---:|---:|---:|---:|---:|---:|---:|---:|---:|---:|")
    for name in a.tables.split(","):
        for eps in (float(e) for e in a.epsilons.split(",")):
            r = run(cal.TABLES[name], eps, a.runs, exempt=a.candidate == "Y'")
            print(f"| {name} | {eps:g} | {r['runs']} | {r['noise_multiplier']:.3g} | {r['without']} | {r['with']} | "
                  f"{r['changed']} | {r['harmful']} | {r['refused_without']} | {r['refused_with']} | {r['warned']} | "
                  f"{r['blown_warned']} |", flush=True)
            for ex in r["examples"]:
                print(f"  {ex}", file=sys.stderr)


if __name__ == "__main__":
    main()
