"""Compare DP-PSVI default candidates on SYNTHETIC tables only (no private data touched).

Defaults chosen on the data a release will be judged on would leak (Papernot & Steinke 2022) and
overfit, so the release's public defaults are compared here, on tables simulated from the
models and written to CSV, then run through exactly the code path of the benchmarks: public
bounds from the schema, :meth:`Transform.from_schema`, and :func:`dpsummary.release.dp_psvi_constructor`
(so the synthetic initialisation draws features uniformly over the public box, as in a release).

The tables are built to have what real tables have and a uniform synthetic start does not:
skewed category frequencies (Zipf-like), and a zero-inflated, heavy-tailed numeric column (most
records at its lower bound, a few spread up to the upper bound) that carries a large coefficient.
Records with such values are the ones clipping and noise hurt most.

Each candidate (a ``[name] = {field: value}`` override of the release's DP-PSVI) is run at
epsilon 0.2 and 1, M = 50 and 100, for logistic and Poisson tables, several seeds; the reported
number is the median over seeds of KL(summary || full) divided by non-private PSVI's at the same
M and seed. Run (about 6 minutes on one core for three candidates):

    python benchmarks/tune_dp_defaults.py
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

from dpsummary.constructors import fit  # noqa: E402
from dpsummary.data import Transform  # noqa: E402
from dpsummary.experiment import make_constructor, prepare_public_dataset  # noqa: E402
from dpsummary.metrics import evaluate  # noqa: E402
from dpsummary.private.accounting import calibrate_noise_multiplier  # noqa: E402
from dpsummary.private.mechanism import PrivateRecords  # noqa: E402
from dpsummary.private.noise import quantize_sample_rate  # noqa: E402
from dpsummary.release import DEFAULT_EXPECTED_BATCH, DEFAULT_STEPS, dp_psvi_constructor  # noqa: E402

OUT = ROOT / "benchmarks" / "results" / "tune_dp_defaults.csv"
OUT_MD = ROOT / "benchmarks" / "results" / "tune_dp_defaults.md"

#: The candidates compared: field overrides of the release's DP-PSVI (empty = current default).
CANDIDATES: dict[str, dict[str, Any]] = {
    "reference targets from a 0.3-scaled prior draw (before)": {"reference_theta_scale": 0.3},
    "reference targets at the prior mean (default)": {"reference_theta_scale": 0.0},
    "init and reference at the prior mean": {"theta_scale": 0.0, "reference_theta_scale": 0.0},
}


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
    args = ap.parse_args()
    torch.set_num_threads(1)
    rows: list[dict[str, Any]] = []
    with tempfile.TemporaryDirectory() as tmp:
        for kind in args.kinds:
            for seed in range(args.seeds):
                path = Path(tmp) / f"{kind}-{seed}.csv"
                write_csv(path, *synthetic_table(kind, args.n, seed))
                prep = prepare_public_dataset(path, target="y", seed=seed, transform="schema")
                tf = Transform.from_dict(prep.transform)
                n = prep.train.shape[0]  # public here, as a policy's record_count would be
                q = quantize_sample_rate(min(1.0, DEFAULT_EXPECTED_BATCH / n))
                for size in args.sizes:
                    psvi = fit(make_constructor("psvi"), prep.train, prep.model, size,
                               generator=torch.Generator().manual_seed(seed))
                    base = evaluate(prep.model, psvi.points, psvi.weights, prep.full_posterior)["forward"]
                    for eps in args.epsilons:
                        sigma = calibrate_noise_multiplier(target_epsilon=eps, delta=1e-7, sample_rate=q,
                                                           steps=DEFAULT_STEPS)
                        for name, fields in CANDIDATES.items():
                            c = dataclasses.replace(
                                dp_psvi_constructor(transform=tf, model=prep.model, noise_multiplier=sigma,
                                                    sample_rate=q, record_count=n), **fields)
                            t0 = time.perf_counter()
                            s = fit(c, PrivateRecords(prep.train), prep.model, size,
                                    generator=torch.Generator().manual_seed(seed))
                            kl = evaluate(prep.model, s.points, s.weights, prep.full_posterior)["forward"]
                            row = {"kind": kind, "seed": seed, "size": size, "epsilon": eps, "candidate": name,
                                   "kl_fwd": kl, "psvi_kl_fwd": base, "ratio_to_psvi": kl / base,
                                   "seconds": round(time.perf_counter() - t0, 2)}
                            rows.append(row)
                            print(row, flush=True)
    OUT.parent.mkdir(parents=True, exist_ok=True)
    with OUT.open("w", newline="") as fh:
        w = csv.DictWriter(fh, fieldnames=list(rows[0]))
        w.writeheader()
        w.writerows(rows)
    groups: dict[tuple[str, float, int, str], list[float]] = defaultdict(list)
    for r in rows:
        groups[(r["kind"], r["epsilon"], r["size"], r["candidate"])].append(r["ratio_to_psvi"])
    lines = ["# DP-PSVI default candidates on synthetic tables", "",
             "Reproduce: `python benchmarks/tune_dp_defaults.py` (synthetic data only; see its docstring). "
             "Cell: median [max] over seeds of KL(summary || full) / non-private PSVI's at the same M and seed.", "",
             "| kind | eps | M | " + " | ".join(CANDIDATES) + " |", "|---|---|---|" + "---|" * len(CANDIDATES)]
    for kind in args.kinds:
        for eps in args.epsilons:
            for size in args.sizes:
                cells = [groups[(kind, eps, size, c)] for c in CANDIDATES]
                lines.append(f"| {kind} | {eps:g} | {size} | "
                             + " | ".join(f"{statistics.median(v):.2f} [{max(v):.2f}]" for v in cells) + " |")
    OUT_MD.write_text("\n".join(lines) + "\n")
    print("\n".join(lines))


if __name__ == "__main__":
    main()
