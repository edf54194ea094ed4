"""What the packaged default policy's delta costs, and how often a noisy count refuses near a bound
(issue 29).

The default policy fixes delta from the public bound ``n_max`` (per-release delta <=
``max_delta_times_n_max / n_max``) and the lifetime ``total_delta``. This script compares the
previous default (``n_max = 10^6``, ``total_delta = 1e-6``, count / preprocessing shares 0.05 /
0.15) with the packaged one (10^10, 1e-10, 0.10 / 0.10), through the
release's own planner (:func:`dpsummary.release.plan_public` and
:func:`dpsummary.release.plan_stage2` on ``examples/adult.csv`` at epsilon 0.2, zero
configuration, with a non-private schema standing in for the DP one: the noise multipliers depend
on the schema only through the model's dimension):

* per-release delta, the noise multipliers of the record count, the DP schema, the quality
  counts, the noise-aware mechanism and DP-PSVI, and the DP schema's category threshold;
* how many such releases fit in the lifetime budget (``total_epsilon`` at ``total_delta``,
  composed under the accountant of record, partition-selection deltas included);
* the refusal rate of the noisy-count checks near a public bound (``n_max`` or ``min_records``):
  analytic, ``P(refuse | N) = Phi((N - bound) / sigma_count)``, confirmed by a simulation of the
  release's count mechanism (:func:`dpsummary.private.mechanism.release_count`'s noise path:
  OpenDP Gaussian noise from OS entropy), with a 99.9% binomial interval.

Run: ``python benchmarks/default_policy.py [--draws 20000] [--out benchmarks/results/default_policy.md]``
"""

from __future__ import annotations

import argparse
import os
import tempfile
import time
from pathlib import Path
from typing import Any

import numpy as np
from scipy import stats

ROOT = Path(__file__).resolve().parents[1]
ADULT = ROOT / "examples" / "adult.csv"
EPSILON = 0.2
#: The previous packaged default's two delta settings (issue 29), the rest unchanged.
OLD = {"n_max": "1_000_000", "total_delta": "1e-6", "count": "0.05", "preprocessing": "0.15"}


def policy_text(n_max: str | None = None, total_delta: str | None = None, count: str | None = None,
                preprocessing: str | None = None) -> str:
    """The packaged default policy, optionally with ``n_max`` / ``total_delta`` and the count and
    preprocessing shares of ``[budget_split]`` replaced."""
    from dpsummary.policy import default_policy_path

    lines = []
    for line in default_policy_path().read_text().splitlines():
        if count is not None and line.startswith("count ="):
            line = f"count = {count}"
        if preprocessing is not None and line.startswith("preprocessing ="):
            line = f"preprocessing = {preprocessing}"
        if n_max is not None and line.startswith("n_max ="):
            line = f"n_max = {n_max}"
        if total_delta is not None and line.startswith("total_delta ="):
            line = f"total_delta = {total_delta}"
        lines.append(line)
    return "\n".join(lines) + "\n"


def plan(policy: Path, mechanism: str | None) -> tuple[Any, Any]:
    """The release's public plan and stage-2 plan for a zero-configuration adult release."""
    from dpsummary.data import infer_schema, read_table
    from dpsummary.release import Released, ReleaseRequest, plan_public, plan_stage2

    req = ReleaseRequest(data=ADULT, epsilon=EPSILON, policy=policy, mechanism=mechanism)
    public = plan_public(req, lambda _m: None)
    table, _ = read_table(ADULT)
    schema = infer_schema(table, target="income")
    released = Released(schema, float(table.num_rows), False, [])
    return public, plan_stage2(public, released)


def smallest_epsilon(policy: Path, grid: tuple[float, ...] = (0.05, 0.075, 0.1, 0.125, 0.15, 0.2)) -> float | None:
    """The smallest epsilon of ``grid`` whose zero-configuration release plans (below it the
    accountant of record cannot calibrate the record count's share at this delta)."""
    global EPSILON
    saved = EPSILON
    try:
        for eps in grid:
            EPSILON = eps
            try:
                plan(policy, None)
            except ValueError:
                continue
            return eps
        return None
    finally:
        EPSILON = saved


def count_sigma_at(policy: Path, epsilon: float) -> float:
    """The record count's noise sd of a zero-configuration release at ``epsilon``."""
    from dpsummary.release import ReleaseRequest, plan_public

    public = plan_public(ReleaseRequest(data=ADULT, epsilon=epsilon, policy=policy), lambda _m: None)
    return float(public.stage1.count_sigma)


def releases_in_budget(public: Any, stage2: Any) -> int:
    """How many identical releases the lifetime budget admits (the ledger's composition rule)."""
    from dpsummary import accounting as acc

    pol = public.policy
    events = [*public.stage1.events, *stage2.events]
    k = 0
    while True:
        nxt = k + 1
        extras = [public.delta_selection] * nxt
        if sum(extras) >= pol.total_delta:  # partition selection alone would use up total_delta
            return k
        spent = acc.composed_epsilon(events * nxt, delta=pol.total_delta - sum(extras), extra_deltas=extras,
                                     accountant=public.accountant)
        if spent > pol.total_epsilon:
            return k
        k = nxt


def measure_policy(name: str, text: str, home: Path) -> dict[str, Any]:
    from dpsummary.private.preprocess import selection_threshold

    path = home / f"{name}.toml"
    path.write_text(text)
    public, na = plan(path, None)
    _, psvi = plan(path, "dp-psvi")
    # The DP schema's category threshold (records) for a 15-column table: the schema noise's raw
    # standard deviation is of the order of its multiplier; the ratio between policies is exact.
    sigma_s = public.stage1.schema_sigma
    return {
        "name": name, "n_max": public.policy.n_max, "total_delta": public.policy.total_delta,
        "delta": public.delta_total, "count_sigma": public.stage1.count_sigma, "schema_sigma": sigma_s,
        "quality_sigma": na.quality_noise_multiplier, "na_sigma": na.noise_multiplier,
        "psvi_sigma": psvi.noise_multiplier, "psvi_q": psvi.sample_rate,
        "threshold_15": selection_threshold(sigma_s, public.delta_selection / 15),
        "releases": releases_in_budget(public, na),
        "min_epsilon": smallest_epsilon(path),
    }


def simulate_refusals(sigma: float, bound: float, offsets: list[float], draws: int) -> list[dict[str, float]]:
    """Noisy counts of a table with ``bound + offset * sigma`` records through the release's count
    noise (OpenDP, OS entropy), judged by the n_max rule (refuse when noisy > bound)."""
    from dpsummary.private.mechanism import SystemRandomness

    rng = SystemRandomness()
    rows = []
    for off in offsets:
        n_true = round(bound + off * sigma)
        noisy = rng.gaussian(np.full(draws, float(n_true)), noise_std=sigma, clip_norm=1.0)
        refused = int((noisy > bound).sum())
        lo, hi = stats.binomtest(refused, draws).proportion_ci(0.999, method="exact")
        rows.append({"offset": off, "n_true": n_true, "analytic": float(stats.norm.cdf((n_true - bound) / sigma)),
                     "simulated": refused / draws, "lo": lo, "hi": hi})
    return rows


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--draws", type=int, default=20000)
    ap.add_argument("--out", type=Path, default=None)
    args = ap.parse_args()
    home = Path(tempfile.mkdtemp(prefix="dpsummary-default-policy-"))
    os.environ["DPSUMMARY_HOME"] = str(home)  # the planner creates a key; never the user's
    t0 = time.perf_counter()
    old = measure_policy("previous", policy_text(**OLD), home)
    new = measure_policy("packaged", policy_text(), home)
    alternatives = [measure_policy(f"n_max-{n}", policy_text(n_max=n, total_delta=d), home)
                    for n, d in (("100_000_000", "1e-9"), ("1_000_000_000", "1e-10"))]
    alternatives.append(measure_policy("old-split", policy_text(count="0.05", preprocessing="0.15"), home))
    alternatives[-1]["split"] = "0.05 / 0.15"
    sim = simulate_refusals(new["count_sigma"], float(new["n_max"]), [-3, -2, -1, -0.5, 0, 0.5, 1, 2], args.draws)
    z99 = float(stats.norm.isf(0.01))
    lines = [
        "# The packaged default policy: delta, its cost in noise, refusals near a public bound",
        "",
        f"Command: `python benchmarks/default_policy.py --draws {args.draws}"
        + (f" --out {args.out}`" if args.out else "`"),
        "",
        f"Zero-configuration release of `examples/adult.csv` at epsilon {EPSILON} (accountant of record RDP), "
        "planned by the release's own planner; noise multipliers are deterministic.",
        "",
        "| quantity | previous default | packaged default | ratio |",
        "|---|---|---|---|",
    ]
    rows = [("n_max", "n_max", "{:.0e}"), ("total_delta", "total_delta", "{:.0e}"),
            ("per-release delta", "delta", "{:.1e}"), ("record count noise (records)", "count_sigma", "{:.1f}"),
            ("DP schema noise multiplier", "schema_sigma", "{:.2f}"),
            ("quality counts noise multiplier", "quality_sigma", "{:.2f}"),
            ("noise-aware mechanism noise multiplier", "na_sigma", "{:.3f}"),
            ("DP-PSVI noise multiplier (T = 500)", "psvi_sigma", "{:.3f}"),
            ("DP schema category threshold, 15 columns (raw scale, unit multiplier x sigma)", "threshold_15", "{:.1f}"),
            ("releases at epsilon 0.2 within the lifetime budget", "releases", "{}"),
            ("smallest epsilon (of 0.05, 0.075, 0.1, ...) a zero-configuration release plans at", "min_epsilon", "{}")]
    for label, key, fmt in rows:
        a, b = old[key], new[key]
        ratio = (f"{b / a:.3f}" if isinstance(a, float | int) and isinstance(b, float | int) and a
                 and key not in ("n_max", "total_delta", "min_epsilon") else "")
        lines.append(f"| {label} | {fmt.format(a)} | {fmt.format(b)} | {ratio} |")
    sigma = new["count_sigma"]
    lines += [
        "",
        "Alternatives: a tighter n_max (total_delta = 0.1 / n_max), and n_max = 10^10 with the previous count / "
        "preprocessing shares (count + preprocessing is calibrated as one cumulative epsilon, so moving share "
        "between them leaves every later noise unchanged).",
        "",
        "| n_max | total_delta | per-release delta | count / preprocessing | record count noise | DP schema "
        "multiplier | noise-aware multiplier | DP-PSVI multiplier | smallest epsilon |",
        "|---|---|---|---|---|---|---|---|---|",
    ]
    for r in [old, *alternatives, new]:
        split = r.get("split", "0.05 / 0.15" if r is old else "0.10 / 0.10")
        lines.append(f"| {r['n_max']:.0e} | {r['total_delta']:.0e} | {r['delta']:.0e} | {split} | "
                     f"{r['count_sigma']:.1f} | {r['schema_sigma']:.1f} | {r['na_sigma']:.3f} | "
                     f"{r['psvi_sigma']:.3f} | {r['min_epsilon']} |")
    small = 1000  # examples/german_credit.csv
    sigma_min = count_sigma_at(home / "packaged.toml", new["min_epsilon"])
    p_old = float(stats.norm.cdf((200 - small) / old["count_sigma"]))
    p_new = float(stats.norm.cdf((200 - small) / sigma))
    lines += [
        "",
        "Noise standard deviations scale with the noise multiplier, so every released statistic's noise (and the "
        "noise part of a credible interval's width) grows by the ratio in its row.",
        "",
        "## Refusal rate near a public bound",
        "",
        f"The record-count checks (`n_max`, `min_records`) are judged on the noisy count, noise sd sigma = "
        f"{sigma:.1f} records under the packaged default at epsilon {EPSILON}. A table with N records refuses on "
        "`n_max` with probability Phi((N - n_max) / sigma) and on `min_records` with probability "
        f"Phi((min_records - N) / sigma): a coin flip at the bound, below 1% once the table is {z99:.2f} sigma = "
        f"{z99 * sigma:.0f} records inside it, below 1e-9 at 6 sigma = {6 * sigma:.0f} records. With n_max = "
        f"{new['n_max']:.0e}, a 10^6- or 10^7-row table sits about 10^10 / sigma sigma below the bound: the "
        f"probability of an n_max refusal is zero to double precision. (At epsilon {new['min_epsilon']}, the "
        f"smallest that plans, sigma is {sigma_min:.0f} records; the band scales with it.)",
        "",
        f"The same band applies at `min_records` = 200: a zero-configuration release of a {small}-row table "
        f"(`examples/german_credit.csv`) at epsilon {EPSILON} refuses there with probability {p_new:.3f} under the "
        f"packaged default ({p_old:.3f} under the previous one). Under RDP the record count's small epsilon share "
        "is where the smaller delta costs most: the accountant's order grid ends at 1024, below the optimal order "
        "there, so at delta 1e-11 no noise multiplier reaches an epsilon below about 0.01 (hence the count share "
        "0.10, which keeps zero-configuration releases planning down to epsilon 0.1). A curator with small tables "
        "declares the count public, or sets a tighter n_max.",
        "",
        f"Simulation: {args.draws} draws per row of the release's count noise (OpenDP, OS entropy) at "
        f"N = n_max + offset x sigma, judged by the n_max rule; exact 99.9% binomial interval.",
        "",
        "| offset (sigma) | analytic P(refuse) | simulated | 99.9% interval | analytic inside |",
        "|---|---|---|---|---|",
    ]
    for r in sim:
        inside = "yes" if r["lo"] <= r["analytic"] <= r["hi"] else "NO"
        lines.append(f"| {r['offset']:+g} | {r['analytic']:.4f} | {r['simulated']:.4f} | "
                     f"[{r['lo']:.4f}, {r['hi']:.4f}] | {inside} |")
    lines += ["", f"Run time {time.perf_counter() - t0:.0f} s."]
    text = "\n".join(lines) + "\n"
    print(text)
    if args.out is not None:
        tmp = args.out.with_suffix(".tmp")
        tmp.write_text(text)
        tmp.replace(args.out)


if __name__ == "__main__":
    main()
