"""Refusal rate of DP schema estimation on healthy tables with a binary target (issue 13).

A zero-configuration release at epsilon 0.2 spends the count and preprocessing shares of the
default policy (0.05 + 0.15 of epsilon, composed) on the record count and the schema mechanism.
This script calibrates the schema noise multiplier the way ``dpsummary.release`` does, then runs
``estimate_schema`` on freshly drawn healthy synthetic tables (5,000-7,000 rows, 20-50% positive
0/1 target, numeric and categorical features) and counts refusals ("target ...: it appears
constant" or any DataError) for the old rule (evenly spread sensitivity, no class count), the
new default (target share 0.5), and the new default plus ``target_classes=2``.

Run: ``python benchmarks/schema_refusal_rate.py [runs] [--out benchmarks/results/...md]``.
Synthetic data only (numpy's seeded generator for the tables; the privacy noise is OS entropy).
"""

from __future__ import annotations

import argparse
import math
import time
from typing import Any

import numpy as np
from dp_accounting import dp_event as dpe

from dpsummary import accounting as acc
from dpsummary.data import DataError, RawTable
from dpsummary.postprocess import schema as schema_post
from dpsummary.private.preprocess import estimate_schema

EPSILON = 0.2
COUNT_SHARE, PRE_SHARE = 0.05, 0.15
TOTAL_DELTA = 1e-6
SELECTION_SHARE = 0.1


def sigmas() -> tuple[float, float]:
    delta = TOTAL_DELTA * (1 - SELECTION_SHARE)
    count = acc.calibrate_gaussian(target_epsilon=COUNT_SHARE * EPSILON, delta=delta, accountant="rdp")
    schema = acc.calibrate_gaussian(
        target_epsilon=(COUNT_SHARE + PRE_SHARE) * EPSILON, delta=delta,
        prior_events=[dpe.GaussianDpEvent(count)], accountant="rdp",
    )
    return count, schema


def table(rng: np.random.Generator) -> RawTable:
    n = int(rng.integers(5000, 7001))
    p = float(rng.uniform(0.2, 0.5))
    cols = {
        "age": rng.integers(18, 80, n).astype(str),
        "income": np.round(rng.lognormal(10, 1, n), 2).astype(str),
        "score": np.round(rng.normal(0, 1, n), 3).astype(str),
        "region": rng.choice(["north", "south", "east", "west"], n),
        "plan": rng.choice(["basic", "plus"], n, p=[0.7, 0.3]),
        "y": (rng.random(n) < p).astype(int).astype(str),
    }
    return RawTable(header=list(cols), columns={k: v.tolist() for k, v in cols.items()})


RULES: dict[str, dict[str, Any]] = {
    "old rule (even share, shared floor)": {"target_share": None, "old_floor": True},
    "target floor + share 0.4": {"target_share": 0.4},
    "NEW DEFAULT: target floor + share 0.5": {},
    "target floor + share 0.5 + target_classes=2": {"target_classes": 2},
    "even share + target_classes=2": {"target_share": None, "target_classes": 2},
}


def main() -> None:
    ap = argparse.ArgumentParser()
    ap.add_argument("runs", type=int, nargs="?", default=500)
    ap.add_argument("--out", default=None)
    args = ap.parse_args()
    _, sigma = sigmas()
    rng = np.random.default_rng(13)
    refusals = dict.fromkeys(RULES, 0)
    dropped = dict.fromkeys(RULES, 0)
    target_refusals = dict.fromkeys(RULES, 0)
    start = time.perf_counter()
    for _ in range(args.runs):
        t = table(rng)
        for rule, kw in RULES.items():
            opts = dict(kw)
            old_floor = bool(opts.pop("old_floor", False))
            try:
                # The old rule: the target shared the features' floor (1% over all 6 columns).
                schema_post.TARGET_FALSE_BIN_PROB = 0.01 / 6 if old_floor else 0.01
                res = estimate_schema(t, noise_multiplier=sigma, target="y", delta=TOTAL_DELTA * SELECTION_SHARE, **opts)
                dropped[rule] += len(res.dropped)
            except DataError as err:
                refusals[rule] += 1
                target_refusals[rule] += str(err).startswith("target")
            finally:
                schema_post.TARGET_FALSE_BIN_PROB = 0.01
    took = time.perf_counter() - start
    lines = [
        "# Schema-estimation refusal rate on healthy binary-target tables",
        "",
        f"epsilon {EPSILON}, count+preprocessing shares {COUNT_SHARE}+{PRE_SHARE}, schema noise multiplier "
        f"{sigma:.3f}, {args.runs} runs, 5,000-7,000 rows, 20-50% positive, 5 features "
        f"(3 numeric, 2 categorical); {took:.0f} s.",
        "",
        "| rule | refusals | rate | 95% upper bound | of which on the target | dropped feature columns"
        " (mean per run, of 5) |",
        "|---|---|---|---|---|---|",
    ]
    for rule in RULES:
        k = refusals[rule]
        # Quick 95% upper bound: the rule of three when k == 0, else the normal approximation.
        rate = k / args.runs
        upper = 3 / args.runs if k == 0 else rate + 1.96 * math.sqrt(rate * (1 - rate) / args.runs)
        lines.append(
            f"| {rule} | {k} | {rate:.2%} | {upper:.2%} | {target_refusals[rule]} | "
            f"{dropped[rule] / args.runs:.2f} |"
        )
    text = "\n".join(lines) + "\n"
    print(text)
    if args.out:
        with open(args.out, "w") as fh:
            fh.write(text)


if __name__ == "__main__":
    main()
