"""Issue 50, the next design (prototype, not a release path): a noise-aware posterior that models
the features' distribution instead of Newton rounds (Kulkarni, Jaelkoe, Koskela, Kaski and Honkela
2021; ../shared/notes/noise-aware-glm.md).

For logistic regression given the features, ``T = sum_i x_i y_i`` is sufficient. Over a public
feature domain of C cells (every combination of the declared levels), the records are the cell
counts ``n_c`` and ``T = sum_c x_c k_c`` with ``k_c ~ Binomial(n_c, p_c(theta))``; by the CLT
``T | theta, n ~ N(mu(theta, n), H(theta, n))`` with ``mu = sum_c n_c p_c x_c`` and
``H = sum_c n_c p_c (1 - p_c) x_c x_c^T`` (the data's Fisher information). One Gaussian mechanism
releases the cell counts (sensitivity 1 under add/remove) and ``T`` (sensitivity ``R``, the public
bound on ``||x||``) at noise multipliers ``sigma / sqrt(f)`` and ``sigma / sqrt(1 - f)``: together
exactly one Gaussian mechanism of multiplier ``sigma``, calibrated to the whole epsilon (the counts
replace the record count). No anchors, no rounds, no curvature release.

Posterior (post-processing): the counts are latent; M draws of ``n`` from their flat-prior
posterior given the release (unbiased: negative draws are kept, only the mean and curvature
read them), for each the MAP of ``N(T_hat | mu(theta, n), H(theta, n) + (sigma_T R)^2 I)`` times
the prior by Gauss-Newton with the covariance frozen per step, its Laplace precision
``H V^-1 H + P``; the moment-matched mixture over the draws. Without noise it is the CLT
posterior given the sufficient statistic, i.e. the full-data posterior up to the CLT.

The cells (``--domain``): ``distinct``, the table's distinct feature rows (an oracle: empty cells
of the public domain are left out), or ``public``, the NAPSU-MQ problem's declared domain of 50
cells (5 age bins x 5 races x 2 sexes), where empty cells are released with noise like any other.
Tables with numerics would need a public grid (not measured here).

Usage::

    python benchmarks/feature_cells.py --table napsu_adult --epsilons 0.3,0.5,1 --runs 20 \\
        --out benchmarks/results/feature_cells_napsu.csv

The counts' share of the mechanism ``noise-aware-cells`` (``--share-sweep``; the rule in
benchmarks/notebook/feature_cells.md): real releases through the calibration harness
(:func:`calibration.run_cells`) with ``dpsummary.cells.posterior.COUNT_SHARE`` set in-process to
each share, their rows labelled ``noise-aware-cells f=SHARE``; ``--judge-sweep`` applies the
rule's checks against the baseline share::

    python benchmarks/feature_cells.py --share-sweep 0.15,0.3,0.5 --tables sim_cells_logistic,sim_cells_poisson \\
        --epsilons 0.1,0.3,0.5,1,3 --runs 10 --out benchmarks/results/cells_share_sweep.csv
    python benchmarks/feature_cells.py --judge-sweep --out benchmarks/results/cells_share_sweep.csv
"""

from __future__ import annotations

import argparse
import csv
import math
import statistics
import sys
from pathlib import Path

import torch

sys.path.insert(0, str(Path(__file__).resolve().parent))
import calibration as cal  # noqa: E402
import noise_aware_variants as nav  # noqa: E402

from dpsummary import accounting as acc  # noqa: E402
from dpsummary.gaussian import DTYPE, GaussianPosterior  # noqa: E402


def domain(points: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor, torch.Tensor]:
    """``(cell features (C, f), exact counts n (C,), exact T (d,))`` with the intercept column."""
    x, y = points[:, :-1], points[:, -1]
    cells, inverse = torch.unique(x, dim=0, return_inverse=True)
    counts = torch.zeros(cells.shape[0], dtype=DTYPE).index_add_(0, inverse, torch.ones_like(y))
    z = torch.cat([torch.ones(x.shape[0], 1, dtype=DTYPE), x], 1)
    return torch.cat([torch.ones(cells.shape[0], 1, dtype=DTYPE), cells], 1), counts, z.T @ y


def public_domain(points: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor, torch.Tensor]:
    """The NAPSU-MQ problem's public domain (5 age bins x 5 races x 2 sexes = 50 cells, the
    domain NAPSU-MQ declares) in model space, with the exact counts (empty cells 0) and T. The
    age bins' model-space values are the five bin midpoints (public: the problem's binning)."""
    import itertools

    x, y = points[:, :-1], points[:, -1]
    ages = torch.unique(x[:, 0])
    if ages.numel() != 5 or x.shape[1] != 6:
        raise SystemExit("error: --domain public is defined for the NAPSU-MQ problem only")
    races = [[-1.0] * 4] + [[1.0 if j == k else -1.0 for j in range(4)] for k in range(4)]
    cells = torch.tensor([[float(a), *r, m] for a, r, m in itertools.product(ages.tolist(), races, (-1.0, 1.0))],
                         dtype=DTYPE)
    match = (x[:, None, :] == cells[None, :, :]).all(-1)
    if not bool((match.sum(1) == 1).all()):
        raise SystemExit("error: a record lies outside the declared domain")
    counts = match.to(DTYPE).sum(0)
    z = torch.cat([torch.ones(x.shape[0], 1, dtype=DTYPE), x], 1)
    return torch.cat([torch.ones(cells.shape[0], 1, dtype=DTYPE), cells], 1), counts, z.T @ y


def posterior(zc: torch.Tensor, n_hat: torch.Tensor, t_hat: torch.Tensor, *, sigma_n: float, sigma_t: float,
              prior_scale: float, draws: int, gen: torch.Generator) -> GaussianPosterior:
    """The prototype's posterior, now the package's (:func:`dpsummary.cells.posterior.cells_posterior`
    for logistic regression: the same Gauss-Newton MAP, Laplace precision and moment-matched
    mixture over ``draws`` imputed counts; the prototype's own copy gave the same numbers to 1e-13)."""
    from dpsummary.cells.posterior import cells_posterior
    from dpsummary.models import LogisticRegression

    model = LogisticRegression(zc.shape[1] - 1, prior_scale=prior_scale)
    return cells_posterior(model, zc, n_hat, t_hat, counts_noise_std=sigma_n, statistic_noise_std=sigma_t,
                           generator=gen, imputations=draws)


def run(table: str, epsilons: list[float], runs: int, shares: list[float], out: Path, draws: int,
        domain_kind: str = "distinct") -> None:
    model, pts, fn, _tb = nav._table(table)
    spec = cal.TABLES[table]
    delta = 0.1 / spec.n_max if spec.n_max else 1e-11
    zc, counts, t_true = (public_domain if domain_kind == "public" else domain)(pts)
    radius = math.sqrt(1.0 + fn**2)  # ||[1, x]|| on the public box
    rows = []
    for eps in epsilons:
        ref = cal.reference(model, pts, epsilon=eps, delta=delta, key=f"variants:{table}:prior1")
        sigma = acc.calibrate_gaussian(target_epsilon=eps, delta=delta, accountant="rdp")  # type: ignore[arg-type]
        for f in shares:
            sn, st = sigma / math.sqrt(f), radius * sigma / math.sqrt(1 - f)
            for r in range(runs):
                gen = torch.Generator().manual_seed(50_000 + 1000 * r + int(100 * eps) + int(1000 * f))
                n_hat = counts + sn * torch.randn(counts.shape, generator=gen, dtype=DTYPE)
                t_hat = t_true + st * torch.randn(t_true.shape, generator=gen, dtype=DTYPE)
                post = posterior(zc, n_hat, t_hat, sigma_n=sn, sigma_t=st, prior_scale=model.prior_scale,
                                 draws=draws, gen=gen)
                j = cal.judge(post, ref)
                rows.append({"table": table, "epsilon": eps, "hist_share": f, "run": r, "domain": domain_kind,
                             "cells": zc.shape[0],
                             "sigma": sigma, **{k: j[k] for k in (
                                 "coverage", "width_ratio", "floor_width_ratio", "floor_coverage", "effects_found",
                                 "floor_effects_found", "effects_wrong_sign", "mean_error_sd_max")}})
                print(f"{table} eps {eps} f {f} run {r}: cov {j['coverage']:.2f} w {j['width_ratio']:.2f} "
                      f"floor {j['floor_width_ratio']:.2f}", flush=True)
    out.parent.mkdir(parents=True, exist_ok=True)
    with out.open("w", newline="") as fh:
        w = csv.DictWriter(fh, fieldnames=list(rows[0]))
        w.writeheader()
        w.writerows(rows)
    summarise(out)


def summarise(path: Path) -> None:
    rows = list(csv.DictReader(path.open()))
    keys = sorted({(r["table"], float(r["epsilon"]), float(r["hist_share"])) for r in rows})
    print("| table | epsilon | count share | runs | coverage median / min | width (x full) median | floor width | "
          "effects found / floor | wrong signs |")
    print("|---|---|---|---|---|---|---|---|---|")
    for t, e, f in keys:
        rs = [r for r in rows if (r["table"], float(r["epsilon"]), float(r["hist_share"])) == (t, e, f)]
        cov = [float(r["coverage"]) for r in rs]
        print(f"| {t} | {e:g} | {f:g} | {len(rs)} | {statistics.median(cov):.2f} / {min(cov):.2f} | "
              f"{statistics.median(float(r['width_ratio']) for r in rs):.2f} | "
              f"{statistics.median(float(r['floor_width_ratio']) for r in rs):.2f} | "
              f"{statistics.mean(float(r['effects_found']) for r in rs):.1f} / "
              f"{statistics.mean(float(r['floor_effects_found']) for r in rs):.1f} | "
              f"{sum(int(float(r['effects_wrong_sign'])) for r in rs)} |")


#: The sweep's baseline share (today's COUNT_SHARE) and the rule's limits.
SWEEP_BASELINE = 0.3
SWEEP_GEOMEAN = 0.95
SWEEP_CELL_LIMIT = 1.10


def share_sweep(shares: list[float], tables: list[str], epsilons: list[float], runs: int, out: Path) -> None:
    """Real ``noise-aware-cells`` releases at each counts' share (module docstring), appended to ``out``."""
    import tempfile

    import dpsummary.cells.posterior as cells_posterior

    saved = cells_posterior.COUNT_SHARE
    try:
        for share in shares:
            cells_posterior.COUNT_SHARE = share
            with tempfile.TemporaryDirectory() as tmp:
                part = Path(tmp) / "part.csv"
                cal.run_cells(part, tables, ["public"], epsilons, ["noise-aware-cells"], runs)
                with part.open(newline="") as fh:
                    rows = list(csv.DictReader(fh))
            for row in rows:
                row["mechanism"] = f"noise-aware-cells f={share:g}"
            new = not out.exists()
            with out.open("a", newline="") as fh:
                w = csv.DictWriter(fh, fieldnames=cal.FIELDS, extrasaction="ignore")
                if new:
                    w.writeheader()
                w.writerows(rows)
    finally:
        cells_posterior.COUNT_SHARE = saved


def judge_sweep(out: Path, baseline: float = SWEEP_BASELINE) -> None:
    """The rule's checks (benchmarks/notebook/feature_cells.md) for every share of ``out`` against
    ``baseline``: (a) every cell honest, (b) the geometric mean of the width ratios over the cells
    at most SWEEP_GEOMEAN, (c) no cell wider than SWEEP_CELL_LIMIT. Prints markdown."""
    with out.open(newline="") as fh:
        rows = list(csv.DictReader(fh))
    cs = cal.cells(rows)
    base = f"noise-aware-cells f={baseline:g}"
    shares = sorted({k[4] for k in cs} - {base})
    print("| share | table | epsilon | verdict | coverage | width | baseline width | ratio |")
    print("|---|---|---|---|---|---|---|---|")
    verdicts = []
    for arm in [base, *shares]:
        ratios, honest, wider = [], True, []
        for key in sorted(k for k in cs if k[4] == arm):
            c = cs[key]
            b = cs.get((key[0], key[1], key[2], key[3], base))
            ratio = c.width / b.width if c.width and b is not None and b.width else float("nan")
            ratios.append(ratio)
            honest = honest and c.verdict == "HONEST"
            if ratio > SWEEP_CELL_LIMIT:
                wider.append(f"{key[0]} {key[3]:g}")
            print(f"| {arm.split('=')[1]} | {key[0]} | {key[3]:g} | {c.verdict} | {c.coverage:.2f} | {c.width:.2f}x | "
                  f"{b.width if b else float('nan'):.2f}x | {ratio:.3f} |")
        geo = math.exp(sum(math.log(r) for r in ratios) / len(ratios)) if ratios else float("nan")
        if arm != base:
            ok = honest and geo <= SWEEP_GEOMEAN and not wider
            verdicts.append(f"- f={arm.split('=')[1]}: (a) every cell honest: {honest}; (b) geometric mean {geo:.3f} "
                            f"(limit {SWEEP_GEOMEAN}); (c) cells over {SWEEP_CELL_LIMIT}x: {wider or 'none'}: "
                            f"{'PASSES' if ok else 'fails'}")
    print()
    print("\n".join(verdicts))


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    ap.add_argument("--table", default="napsu_adult")
    ap.add_argument("--epsilons", default="0.3,0.5,1")
    ap.add_argument("--shares", default="0.1")
    ap.add_argument("--runs", type=int, default=20)
    ap.add_argument("--draws", type=int, default=50)
    ap.add_argument("--domain", choices=("distinct", "public"), default="distinct",
                    help="the cells: the table's distinct feature rows (an oracle), or the declared public domain")
    ap.add_argument("--out", type=Path, required=True)
    ap.add_argument("--summary", action="store_true", help="only summarise --out")
    ap.add_argument("--share-sweep", help="comma-separated counts' shares of noise-aware-cells (module docstring)")
    ap.add_argument("--tables", default="sim_cells_logistic,sim_cells_poisson", help="--share-sweep's tables")
    ap.add_argument("--judge-sweep", action="store_true", help="the share rule's checks on --out")
    a = ap.parse_args()
    if a.share_sweep:
        share_sweep([float(s) for s in a.share_sweep.split(",")], a.tables.split(","),
                    [float(e) for e in a.epsilons.split(",")], a.runs, a.out)
        return
    if a.judge_sweep:
        judge_sweep(a.out)
        return
    if a.summary:
        summarise(a.out)
        return
    run(a.table, [float(e) for e in a.epsilons.split(",")], a.runs, [float(s) for s in a.shares.split(",")],
        a.out, a.draws, a.domain)


if __name__ == "__main__":
    main()
