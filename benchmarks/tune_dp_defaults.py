"""Compare DP-PSVI default candidates on SYNTHETIC tables only (no private data touched).

Defaults chosen on the data a release will be judged on would leak (Papernot & Steinke 2022) and
overfit, so the release's public defaults are compared here, on tables simulated from the
models and written to CSV, then run through exactly the code path of the benchmarks: public
bounds from the schema, :meth:`Transform.from_schema`, and :func:`dpsummary.mechanisms.dp_psvi_setup.dp_psvi_constructor`
(so the synthetic initialisation draws features uniformly over the public box, as in a release).

The tables are built to have what real tables have and a uniform synthetic start does not:
skewed category frequencies (Zipf-like), and a zero-inflated, heavy-tailed numeric column (most
records at its lower bound, a few spread up to the upper bound) that carries a large coefficient.
Records with such values are the ones clipping and noise hurt most.

Each candidate (a ``[name] = {field: value}`` override of the release's DP-PSVI; the key
``initialisation`` instead sets the budget share of the DP initialisation histograms, 0 for the
uniform public start, otherwise the default policy's share is used) is run at epsilon 0.2 and 1,
M = 50 and 100, for logistic and Poisson tables, several seeds; the reported number is the
median over seeds of KL(summary || full) divided by non-private PSVI's at the same M and seed.
The DP initialisation is evaluated for both kinds here (the release first used it for
logistic regression only because of this table; Poisson was added by issue 28's coverage rule,
:data:`dpsummary.mechanisms.dp_psvi_setup.DP_INITIALISATION_MODELS`). For Poisson the histograms include the count target, so that initial targets start at
the data's scale. The committed Poisson rows were re-run with that in the fourth session; the
logistic rows are the third session's. Privacy noise comes from OS entropy, so a rerun differs (run-to-run spread is part of the
result). Run (about 8 minutes per kind on one core for four candidates and 5 seeds; the two
kinds can run side by side and be merged):

    python benchmarks/tune_dp_defaults.py --seeds 5 --kinds logistic --csv /tmp/l.csv &
    python benchmarks/tune_dp_defaults.py --seeds 5 --kinds poisson --csv /tmp/p.csv
    python benchmarks/tune_dp_defaults.py --report-only /tmp/l.csv /tmp/p.csv

``--set levers`` compares other levers (learning rate, steps, batch, posterior draws) around
the defaults, with the DP initialisation on (results ``tune_dp_defaults_levers.md``); ``--set
weights`` a slower weight learning rate and larger batches (``tune_dp_defaults_weights.md``).
"""

from __future__ import annotations

import argparse
import csv
import dataclasses
import statistics
import sys
import tempfile
import time
from collections import defaultdict
from pathlib import Path
from typing import Any

import numpy as np
import torch

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT))

from dpsummary.accounting import calibrate_noise_multiplier  # noqa: E402
from dpsummary.constructors import fit  # noqa: E402
from dpsummary.data import Transform  # noqa: E402
from dpsummary.experiment import make_constructor, prepare_public_dataset  # noqa: E402
from dpsummary.mechanisms.base import (  # noqa: E402
    DEFAULT_EXPECTED_BATCH,
    DEFAULT_STEPS,
)
from dpsummary.mechanisms.dp_psvi_setup import (  # noqa: E402
    dp_psvi_constructor,
    initial_samplers,
    plan_initialisation,
)
from dpsummary.metrics import evaluate  # noqa: E402
from dpsummary.policy import default_policy  # noqa: E402
from dpsummary.private.mechanism import PrivateRecords  # noqa: E402
from dpsummary.private.noise import quantize_sample_rate  # noqa: E402

RESULTS = ROOT / "benchmarks" / "results"

#: Candidate sets: field overrides of the release's DP-PSVI (empty = current default). Harness
#: keys: ``initialisation`` (budget share of the DP initialisation histograms), ``steps`` and
#: ``expected_batch`` (sigma recalibrated), ``learning_rate`` (both learning rates).
CANDIDATE_SETS: dict[str, dict[str, dict[str, Any]]] = {
    "init": {
        "uniform public start (before)": {"initialisation": 0.0},
        "DP histograms, share 1/16": {"initialisation": 0.0625},
        "DP histograms, share 1/8": {"initialisation": 0.125},
        "DP histograms, share 1/4 (default policy)": {},
    },
    # Second session: the clip-norm reference's targets (uniform start, as then).
    "reference": {
        "reference targets from a 0.3-scaled prior draw (before)": {"reference_theta_scale": 0.3,
                                                                    "initialisation": 0.0},
        "reference targets at the prior mean (default)": {"reference_theta_scale": 0.0, "initialisation": 0.0},
        "init and reference at the prior mean": {"theta_scale": 0.0, "reference_theta_scale": 0.0,
                                                 "initialisation": 0.0},
    },
    "levers": {
        "default": {},
        "learning rate 0.025": {"learning_rate": 0.025},
        "learning rate 0.1": {"learning_rate": 0.1},
        "1000 steps": {"steps": 1000},
        "expected batch 800": {"expected_batch": 800},
        "S = 200 draws": {"num_samples": 200},
        "clip x0.5": {"clip_multiplier": 0.5},
        "clip x2": {"clip_multiplier": 2.0},
    },
    # Fourth session: a slower weight learning rate under noise, and larger batches.
    "weights": {
        "default": {},
        "weights lr 0.01": {"weights_lr": 0.01},
        "weights lr 0.02": {"weights_lr": 0.02},
        "expected batch 2000": {"expected_batch": 2000},
        "expected batch 2000, 250 steps": {"expected_batch": 2000, "steps": 250},
    },
}


def outputs(candidate_set: str) -> tuple[Path, Path]:
    stem = "tune_dp_defaults" if candidate_set == "init" else f"tune_dp_defaults_{candidate_set}"
    return RESULTS / f"{stem}.csv", RESULTS / f"{stem}.md"



def synthetic_table(kind: str, n: int, seed: int) -> tuple[list[str], np.ndarray]:
    """A CSV-ready table: 4 uniform numerics, 1 zero-inflated heavy-tailed numeric (large
    coefficient), 3 categorical columns with Zipf-like frequencies, and the target ``y``."""
    rng = np.random.default_rng(20_000 + seed)
    cols: dict[str, np.ndarray] = {}
    for j in range(4):
        cols[f"x{j}"] = rng.uniform(0, 100, n).round(1)
    heavy = np.where(rng.random(n) < 0.08, rng.pareto(1.5, n) * 2000.0, 0.0)
    cols["gain"] = np.clip(heavy, 0, 99_999).round(0)
    eta = np.zeros(n)
    for j in range(4):
        eta += rng.normal(0, 0.6) * (cols[f"x{j}"] - 50) / 50
    eta += 6.0 * np.minimum(cols["gain"], 20_000) / 20_000  # the few records with gains matter
    for c, k in (("a", 4), ("b", 8), ("c", 12)):
        p = 1.0 / np.arange(1, k + 1) ** 1.2
        idx = rng.choice(k, n, p=p / p.sum())
        cols[c] = np.array([f"{c}{i}" for i in idx])
        eta += rng.normal(0, 0.5, k)[idx]
    if kind == "logistic":
        eta += -1.0
        y = np.where(rng.random(n) < 1 / (1 + np.exp(-eta)), "yes", "no")
    else:
        eta = 0.3 * eta + 3.0
        y = rng.poisson(np.exp(np.minimum(eta, 8.0))).astype(str)
    cols["y"] = y
    header = list(cols)
    return header, np.column_stack([cols[h].astype(str) for h in header])


def write_csv(path: Path, header: list[str], rows: np.ndarray) -> None:
    with path.open("w", newline="") as fh:
        w = csv.writer(fh)
        w.writerow(header)
        w.writerows(rows.tolist())


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--seeds", type=int, default=3)
    ap.add_argument("--n", type=int, default=20_000)
    ap.add_argument("--epsilons", type=float, nargs="+", default=[0.2, 1.0])
    ap.add_argument("--sizes", type=int, nargs="+", default=[50, 100])
    ap.add_argument("--kinds", nargs="+", default=["logistic", "poisson"])
    ap.add_argument("--set", dest="candidate_set", choices=sorted(CANDIDATE_SETS), default="init",
                    help="which candidates to compare (results: tune_dp_defaults[_SET].csv/.md)")
    ap.add_argument("--csv", type=Path, default=None, help="where to write the rows (default: the results file)")
    ap.add_argument("--report-only", type=Path, nargs="+", metavar="CSV",
                    help="only write the table from these CSVs (merged into the default CSV)")
    args = ap.parse_args()
    candidates = CANDIDATE_SETS[args.candidate_set]
    out_csv, out_md = outputs(args.candidate_set)
    if args.report_only:
        merged: list[dict[str, Any]] = []
        for path in args.report_only:
            with path.open() as fh:
                merged += [{**r, "epsilon": float(r["epsilon"]), "size": int(r["size"]),
                            "ratio_to_psvi": float(r["ratio_to_psvi"])} for r in csv.DictReader(fh)]
        write_rows(out_csv, merged)
        report(merged, list(candidates), out_md, args.candidate_set)
        return
    torch.set_num_threads(1)
    default_share = default_policy().budget_split.normalised(count=False, preprocessing=False)["initialisation"]
    rows: list[dict[str, Any]] = []
    with tempfile.TemporaryDirectory() as tmp:
        for kind in args.kinds:
            for seed in range(args.seeds):
                path = Path(tmp) / f"{kind}-{seed}.csv"
                write_csv(path, *synthetic_table(kind, args.n, seed))
                prep = prepare_public_dataset(path, target="y", seed=seed, transform="schema")
                tf = Transform.from_dict(prep.transform)
                n = prep.train.shape[0]  # public here, as a policy's record_count would be
                for size in args.sizes:
                    psvi = fit(make_constructor("psvi"), prep.train, prep.model, size,
                               generator=torch.Generator().manual_seed(seed))
                    base = evaluate(prep.model, psvi.points, psvi.weights, prep.full_posterior)["forward"]
                    for eps in args.epsilons:
                        for name, options in candidates.items():
                            fields = dict(options)
                            share = float(fields.pop("initialisation", default_share))
                            steps = int(fields.pop("steps", DEFAULT_STEPS))
                            q = quantize_sample_rate(min(1.0, float(fields.pop("expected_batch",
                                                                               DEFAULT_EXPECTED_BATCH)) / n))
                            if "learning_rate" in fields:
                                fields["points_lr"] = fields["weights_lr"] = fields.pop("learning_rate")
                            # The release's own planning: histogram noise, then sigma composed with it.
                            init_sigma, layout, before = plan_initialisation(
                                tf, prep.model.name, prior_events=[], target_epsilon=share * eps, delta=1e-7,
                                accountant="rdp", models=frozenset({"logistic", "poisson"}))
                            sigma = calibrate_noise_multiplier(target_epsilon=eps, delta=1e-7, sample_rate=q,
                                                               steps=steps, prior_events=before)
                            t0 = time.perf_counter()
                            records = PrivateRecords(prep.train)
                            start = initial_samplers(records, tf, layout, init_sigma)
                            c = dataclasses.replace(
                                dp_psvi_constructor(transform=tf, model=prep.model, noise_multiplier=sigma,
                                                    sample_rate=q, record_count=n, steps=steps,
                                                    init_features=start.features, init_targets=start.targets),
                                **fields)
                            s = fit(c, records, prep.model, size, generator=torch.Generator().manual_seed(seed))
                            kl = evaluate(prep.model, s.points, s.weights, prep.full_posterior)["forward"]
                            row = {"kind": kind, "seed": seed, "size": size, "epsilon": eps, "candidate": name,
                                   "kl_fwd": kl, "psvi_kl_fwd": base, "ratio_to_psvi": kl / base,
                                   "noise_multiplier": sigma, "init_noise_multiplier": init_sigma,
                                   "seconds": round(time.perf_counter() - t0, 2)}
                            rows.append(row)
                            print(row, flush=True)
    write_rows(args.csv or out_csv, rows)
    if args.csv is None:
        report(rows, list(candidates), out_md, args.candidate_set)


def write_rows(path: Path, rows: list[dict[str, Any]]) -> None:
    path.parent.mkdir(parents=True, exist_ok=True)
    with path.open("w", newline="") as fh:
        w = csv.DictWriter(fh, fieldnames=list(rows[0]))
        w.writeheader()
        w.writerows(rows)


def report(rows: list[dict[str, Any]], names: list[str], out_md: Path, candidate_set: str) -> None:
    kinds = list(dict.fromkeys(r["kind"] for r in rows))
    epsilons = sorted({r["epsilon"] for r in rows})
    sizes = sorted({r["size"] for r in rows})
    groups: dict[tuple[str, float, int, str], list[float]] = defaultdict(list)
    for r in rows:
        groups[(r["kind"], r["epsilon"], r["size"], r["candidate"])].append(r["ratio_to_psvi"])
    lines = ["# DP-PSVI default candidates on synthetic tables", "",
             f"Reproduce: `python benchmarks/tune_dp_defaults.py --set {candidate_set}` (synthetic data only; "
             "see its docstring for the options used and for running the kinds in parallel). "
             f"Cell: median [max] over {max(len(v) for v in groups.values())} seeds of KL(summary || full) / "
             "non-private PSVI's at the same M and seed; synthetic tables of `--n` rows (default 20,000), delta 1e-7.", "",
             "| kind | eps | M | " + " | ".join(names) + " |", "|---|---|---|" + "---|" * len(names)]
    for kind in kinds:
        for eps in epsilons:
            for size in sizes:
                cells = [groups.get((kind, eps, size, c)) for c in names]
                lines.append(f"| {kind} | {eps:g} | {size} | " + " | ".join(
                    f"{statistics.median(v):.2f} [{max(v):.2f}]" if v else "-" for v in cells) + " |")
    out_md.write_text("\n".join(lines) + "\n")
    print("\n".join(lines))


if __name__ == "__main__":
    main()
