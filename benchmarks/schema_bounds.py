"""Zero configuration's feature bounds: how often a DP schema release gives a numeric feature a
"blown" box (bounds spanning more than 10x the column's data range), with and without the
sixteenth rule's isolated-marginal-bin rule (``benchmarks/results/noise_aware_variants.md``).

Each run is one schema release of a calibration-suite table (:mod:`calibration`'s registry and
zero-configuration policy) at the release's own calibration (the record count's and the schema's
Gaussians sized as ``dpsummary.release`` sizes them from the policy's budget split and delta),
with OS-entropy noise (:func:`dpsummary.private.preprocess.estimate_schema`). The released grid
histograms are post-processed twice, with the rule and without it (the same noise: a paired
comparison), and each numeric feature's bounds are compared with the column's data range.

    python benchmarks/schema_bounds.py --tables azpro,default,wells --epsilons 0.3,1,3 --runs 300
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

from dpsummary import accounting as acc  # noqa: E402
from dpsummary.postprocess import schema as post  # noqa: E402
from dpsummary.private import preprocess  # noqa: E402

#: A feature's box is blown when its bounds span more than this many times its data range.
BLOWN_FACTOR = 10.0


def calibration(spec: cal.TableSpec, epsilon: float) -> tuple[float, float]:
    """The schema Gaussian's noise multiplier and the partition-selection delta of a
    zero-configuration release of ``spec`` at ``epsilon`` (as ``dpsummary.release`` plans it)."""
    from dp_accounting import dp_event as dpe

    from dpsummary import policy as pmod
    from dpsummary.release import DELTA_SELECTION_SHARE

    path = cal.table_csv(spec)
    with tempfile.TemporaryDirectory() as tmp:
        pol = pmod.load_policy(cal.write_policy(spec, "zero-config", path, Path(tmp)))
    split = pol.budget_split.normalised(count=True, preprocessing=True, initialisation=True)
    delta_total = pol.resolve_delta(None)
    selection = DELTA_SELECTION_SHARE * delta_total
    delta = delta_total - selection
    count = acc.calibrate_part(target_epsilon=split["count"] * epsilon, delta=delta)
    schema = acc.calibrate_part(target_epsilon=(split["count"] + split["preprocessing"]) * epsilon, delta=delta,
                                prior_events=[dpe.GaussianDpEvent(count)])
    return schema, selection


def data_ranges(table: Any) -> dict[str, float]:
    """Each column's data range (max - min of its finite numeric values)."""
    from dpsummary.data import parse_floats

    out = {}
    for name in table.header:
        values, ok = parse_floats(table.array(name))
        if ok.any():
            out[name] = float(values[ok].max() - values[ok].min())
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


def run(spec: cal.TableSpec, epsilon: float, runs: int) -> dict[str, Any]:
    from dpsummary.data import DataError, read_csv

    table = read_csv(cal.table_csv(spec))
    ranges = data_ranges(table)
    sigma, selection = calibration(spec, epsilon)
    captured: dict[str, Any] = {}
    original = preprocess.schema_from_release

    def capture(columns: Any, **kwargs: Any) -> Any:
        captured["columns"], captured["kwargs"] = columns, kwargs
        return original(columns, **kwargs)

    preprocess.schema_from_release = capture  # type: ignore[assignment]
    rule = post._drop_isolated_marginal
    counts = {"without": 0, "with": 0, "refused_without": 0, "refused_with": 0, "changed": 0}
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
            for variant, fn in (("without", lambda m, f, s: m), ("with", rule)):
                post._drop_isolated_marginal = fn  # type: ignore[assignment]
                try:
                    result = original(captured["columns"], **captured["kwargs"])
                except DataError:
                    counts[f"refused_{variant}"] += 1
                    continue
                found = blown(result.schema, ranges)
                counts[variant] += bool(found)
                bounds[variant] = result.schema
                if found and variant == "without" and len(examples) < 3:
                    examples.append("; ".join(found))
            if len(bounds) == 2 and bounds["with"] != bounds["without"]:
                counts["changed"] += 1
    finally:
        preprocess.schema_from_release = original  # type: ignore[assignment]
        post._drop_isolated_marginal = rule  # type: ignore[assignment]
    return {"table": spec.name, "epsilon": epsilon, "runs": runs, "noise_multiplier": sigma, **counts,
            "examples": examples}


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--tables", default="azpro,default,wells")
    ap.add_argument("--epsilons", default="0.3,1,3")
    ap.add_argument("--runs", type=int, default=300)
    a = ap.parse_args()
    print("| table | epsilon | runs | schema noise multiplier | blown boxes without the rule | with it | schemas the rule changed | refused without | with |")
    print("|---|---:|---:|---:|---:|---:|---:|---:|---:|")
    for name in a.tables.split(","):
        for eps in (float(e) for e in a.epsilons.split(",")):
            r = run(cal.TABLES[name], eps, a.runs)
            print(f"| {name} | {eps:g} | {r['runs']} | {r['noise_multiplier']:.3g} | {r['without']} | {r['with']} | "
                  f"{r['changed']} | {r['refused_without']} | {r['refused_with']} |", flush=True)
            for ex in r["examples"]:
                print(f"  without the rule: {ex}", file=sys.stderr)


if __name__ == "__main__":
    main()
