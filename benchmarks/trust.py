"""Can an analyst trust a release? The issue-14 grid: noise-aware release vs DP-VI vs PSVI.

For every data set, epsilon, summary size M and seed, each method's posterior is judged against
the full-data posterior (exact or Laplace on the same rows, in the same model space) by
:func:`dpsummary.metrics.trust_report`: KL both ways (raw), posterior-mean error in full-posterior
sds (median, max), coverage of the full-data mean by the central 95% intervals, width ratio, the
effects found against the idealised floor (:func:`dpsummary.metrics.idealised_floor`), held-out
log-likelihood, and on simulated data coverage of the true parameter.

Methods:
* ``noise-aware`` — the default release mechanism (:mod:`dpsummary.noise_aware`) with its
  pseudocoreset (:mod:`dpsummary.constructors.gaussian_target`), the thing analysts load;
* ``noise-aware-gaussian`` — the Gaussian the pseudocoreset is matched to (M-independent);
* ``raw-gaussian`` — the same noisy statistics without accounting for the noise;
* ``dp-vi`` — the built-in DP-VI (Jaelkoe et al. 2017) at the same (epsilon, delta);
* ``psvi`` — non-private PSVI (``--psvi``; slow).

Count and schema are public here (as a policy would declare them): N is the training size, the
transform is the schema transform (``Transform.from_schema`` on the inferred schema). The
zero-configuration release is measured separately through the CLI (``--zero-config``).

The judge (full-data posterior, idealised floor, trust report) is the calibration suite's
(:func:`calibration.reference`, :func:`calibration.judge`; issue 37), the one place every
harness judges. This grid still runs the mechanism in memory (an in-process copy of the
release's noise-aware fit at a public count and schema); ``benchmarks/calibration.py`` runs real
releases instead and is the suite of record.

Usage::

    python benchmarks/trust.py run --out benchmarks/results/trust.csv [--quick] [--psvi]
    python benchmarks/trust.py report benchmarks/results/trust.csv benchmarks/results/trust.md
    python benchmarks/trust.py tune            # the schedule rule, simulated data only
"""

from __future__ import annotations

import argparse
import csv
import math
import statistics
import sys
import time
from collections import defaultdict
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import torch

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT))
sys.path.insert(0, str(Path(__file__).resolve().parent))  # benchmarks/: data_paths
import calibration  # noqa: E402
from data_paths import SHARED_DATA  # noqa: E402

DATA = SHARED_DATA

from dpsummary import noise_aware as na  # noqa: E402
from dpsummary.gaussian import DTYPE, GaussianPosterior  # noqa: E402
from dpsummary.inference import coreset_posterior, prior_posterior  # noqa: E402
from dpsummary.metrics import (  # noqa: E402
    IdealisedFloor,
    full_posterior,
    predictive_scores,
    trust_report,
)
from dpsummary.models import LogisticRegression, Model, PoissonRegression  # noqa: E402

DELTA = 1e-5
EPSILONS = (0.1, 0.2, 0.5, 1.0, 2.0)
SIZES = (20, 50, 100)
SEEDS = (0, 1, 2, 3, 4)
REAL = ("adult", "german_credit", "bike_rentals")
SIMULATED = ("sim_logistic_1e4", "sim_logistic_1e5", "sim_poisson_1e4", "sim_poisson_1e5")
#: Simulated tables: 6 numeric features uniform on [-1, 1] and 2 categorical columns of 4
#: levels (one-hot), the shape of a schema-transformed table; Poisson counts clipped at the
#: public bound below.
SIM_NUMERIC, SIM_CATEGORICAL, SIM_LEVELS, SIM_COUNT_BOUND = 6, 2, 4, 20.0


@dataclass(frozen=True)
class Table:
    name: str
    train: torch.Tensor
    test: torch.Tensor
    model: Model
    feature_norm: float
    target_bound: float
    full: GaussianPosterior
    truth: torch.Tensor | None


def simulated(name: str, seed: int) -> Table:
    # ``sim_<kind>[_shifted]_<N>``: "shifted" draws every numeric on [0, 1], off-centre in the
    # public box [-1, 1] as skewed real columns are.
    parts = name.split("_")
    kind, size, shifted = parts[1], int(float(parts[-1])), "shifted" in parts
    g = torch.Generator().manual_seed(20_000 + seed)
    f = SIM_NUMERIC + SIM_CATEGORICAL * SIM_LEVELS
    model: Model = LogisticRegression(f) if kind == "logistic" else PoissonRegression(f)
    n = size + 1000
    x = torch.zeros(n, f, dtype=DTYPE)
    x[:, :SIM_NUMERIC] = torch.rand(n, SIM_NUMERIC, generator=g, dtype=DTYPE) * (1 if shifted else 2) - (0 if shifted else 1)
    for c in range(SIM_CATEGORICAL):
        pick = torch.randint(0, SIM_LEVELS, (n,), generator=g)
        x[torch.arange(n), SIM_NUMERIC + c * SIM_LEVELS + pick] = 1.0
    scale = 0.7 if kind == "logistic" else 0.3
    theta = torch.randn(model.param_dim, generator=g, dtype=DTYPE) * scale
    pts = model.simulate(theta, n, g, features=x)
    target_bound = 1.0
    if kind == "poisson":
        pts[:, -1].clamp_(max=SIM_COUNT_BOUND)
        target_bound = SIM_COUNT_BOUND
    train, test = pts[:size], pts[size:]
    return Table(name, train, test, model, math.sqrt(SIM_NUMERIC + SIM_CATEGORICAL), target_bound,
                 full_posterior(model, train), theta)


def real(name: str, seed: int) -> Table:
    from dpsummary.data import Transform
    from dpsummary.experiment import prepare_public_dataset

    prep = prepare_public_dataset(DATA / f"{name}.csv", seed=seed, transform="schema")
    tf = Transform.from_dict(prep.transform)
    feature_norm, target_bound = na.schema_bounds(tf)
    return Table(name, prep.train, prep.test, prep.model, feature_norm, target_bound, prep.full_posterior, None)


def load(name: str, seed: int) -> Table:
    return simulated(name, seed) if name.startswith("sim_") else real(name, seed)


def noise_aware_fit(table: Table, epsilon: float, schedule: na.Schedule | None = None) -> tuple[na.NoiseAwareFit, float]:
    from dpsummary.private.mechanism import SystemRandomness
    from dpsummary.private.score_stats import noisy_score_statistics

    sched = schedule or na.Schedule.default(table.model)
    sigma, _ = na.calibrate(sched, target_epsilon=epsilon, delta=DELTA)
    rnd = SystemRandomness()

    def release(theta: torch.Tensor, sb: float, cb: float, sm: float, cm: float) -> tuple[torch.Tensor, torch.Tensor]:
        st = noisy_score_statistics(table.train, rnd, table.model, theta, score_bound=sb, curvature_bound=cb,
                                    score_noise_multiplier=sm, curvature_noise_multiplier=cm)
        return st.score, st.curvature

    fn, tb = calibration.release_bounds(sched, sigma, table.train, table.feature_norm, table.target_bound, rnd)
    bounds = na.public_bounds(table.model, feature_norm=fn, target_bound=tb)
    return na.fit(table.model, release, bounds, schedule=sched, sigma=sigma, feature_norm=fn,
                  target_bound=tb, generator=torch.Generator().manual_seed(0)), sigma


def public_features(table: Table, size: int, g: torch.Generator) -> torch.Tensor:
    """Initial pseudopoint features: uniform numerics in [-1, 1] / one-hot draws are what the
    schema sampler gives; the benchmark uses a uniform box of the same norm (public)."""
    f = table.model.num_features
    return (torch.rand(size, f, generator=g, dtype=DTYPE) * 2 - 1) * min(1.0, table.feature_norm / math.sqrt(f))


def floor(table: Table, epsilon: float, seed: int) -> IdealisedFloor:
    """The idealised floor (issue 27) of ``table`` at ``epsilon``, from the calibration suite's
    one reference builder (:func:`calibration.reference`), cached per table and seed."""
    fl = _reference(table, epsilon, seed).floor
    assert fl is not None
    return fl


def _reference(table: Table, epsilon: float | None, seed: int) -> calibration.Reference:
    return calibration.reference(table.model, table.train, epsilon=epsilon, delta=DELTA,
                                 key=f"trust:{table.name}:{seed}", seed=seed, full=table.full, truth=table.truth)


def judge(table: Table, post: GaussianPosterior, epsilon: float | None, seed: int) -> dict[str, Any]:
    """:func:`calibration.judge` (the trust report against the full-data posterior and the
    floor) plus held-out predictive scores."""
    out = calibration.judge(post, _reference(table, epsilon, seed))
    out.update(predictive_scores(table.model, post, table.test, generator=torch.Generator().manual_seed(seed)))
    return out


FIELDS = ["dataset", "method", "epsilon", "size", "seed", "kl_summary_full", "kl_full_summary",
          "kl_summary_full_over_prior", "kl_full_summary_over_prior", "mean_error_sd_median", "mean_error_sd_max",
          "coverage", "width_ratio", "true_coverage", "effects_full", "effects_found", "effects_wrong_sign",
          "floor_width_ratio", "width_vs_floor", "floor_effects_found", "effects_vs_floor", "test_loglik", "accuracy", "rmse", "seconds",
          "match_kl", "param_dim"]


def run(out: Path, datasets: list[str], epsilons: tuple[float, ...], sizes: tuple[int, ...], seeds: tuple[int, ...],
        psvi: bool, dpvi: bool, noise_aware: bool = True) -> None:
    from dpsummary.constructors.gaussian_target import match_gaussian

    out.parent.mkdir(parents=True, exist_ok=True)
    new = not out.exists()
    with out.open("a", newline="") as fh:
        w = csv.DictWriter(fh, fieldnames=FIELDS, extrasaction="ignore")
        if new:
            w.writeheader()

        def emit(row: dict[str, Any]) -> None:
            w.writerow(row)
            fh.flush()
            print({k: (round(v, 3) if isinstance(v, float) else v) for k, v in row.items()
                   if k in ("dataset", "method", "epsilon", "size", "seed", "kl_full_summary",
                            "mean_error_sd_median", "coverage", "width_ratio", "true_coverage", "seconds")})

        for name in datasets:
            for seed in seeds:
                table = load(name, seed)
                base = {"dataset": name, "seed": seed, "param_dim": table.model.param_dim}
                def run_dpvi(eps: float, table: Table = table, base: dict[str, Any] = base, seed: int = seed) -> None:
                    from dpsummary.dpvi import fit_dpvi

                    t2 = time.perf_counter()
                    res = fit_dpvi(table.train, table.model, epsilon=eps, delta=DELTA,
                                   generator=torch.Generator().manual_seed(seed))
                    emit({**base, "method": "dp-vi", "epsilon": eps, "size": "",
                          "seconds": time.perf_counter() - t2, **judge(table, res.posterior, eps, seed)})

                for eps in epsilons:
                    if not noise_aware:
                        if dpvi:
                            run_dpvi(eps)
                        continue
                    t0 = time.perf_counter()
                    fit_result, _ = noise_aware_fit(table, eps)
                    t_fit = time.perf_counter() - t0
                    for label, post in (("noise-aware-gaussian", fit_result.posterior),
                                        ("raw-gaussian", fit_result.raw_posterior)):
                        emit({**base, "method": label, "epsilon": eps, "size": "",
                              "seconds": t_fit, **judge(table, post, eps, seed)})
                    for size in sizes:
                        g = torch.Generator().manual_seed(seed)
                        t1 = time.perf_counter()
                        pts, wts, loss = match_gaussian(table.model, fit_result.posterior, size=size,
                                                        initial_features=public_features(table, size, g), generator=g)
                        post = coreset_posterior(table.model, pts, wts)
                        emit({**base, "method": "noise-aware", "epsilon": eps, "size": size, "match_kl": loss,
                              "seconds": t_fit + time.perf_counter() - t1, **judge(table, post, eps, seed)})
                    if dpvi:
                        run_dpvi(eps)
                if psvi:
                    from dpsummary.constructors.base import fit
                    from dpsummary.experiment import make_constructor

                    for size in sizes:
                        t3 = time.perf_counter()
                        s = fit(make_constructor("psvi"), table.train, table.model, size,
                                generator=torch.Generator().manual_seed(seed))
                        post = coreset_posterior(table.model, s.points, s.weights)
                        emit({**base, "method": "psvi", "epsilon": "", "size": size,
                              "seconds": time.perf_counter() - t3, **judge(table, post, None, seed)})


def _median(rows: list[dict[str, str]], key: str) -> float | None:
    vals = [float(r[key]) for r in rows if r.get(key) not in (None, "")]
    return statistics.median(vals) if vals else None


def _fmt(v: float | None, pct: bool = False) -> str:
    if v is None:
        return "-"
    if pct:
        return f"{100 * v:.0f}%"
    return f"{v:.3g}" if abs(v) < 1e4 else f"{v:.2e}"


def report(results: Path, target: Path) -> None:
    rows = list(csv.DictReader(results.open()))
    groups: dict[tuple[str, str, str, str], list[dict[str, str]]] = defaultdict(list)
    for r in rows:
        groups[(r["dataset"], r["method"], r["epsilon"], r["size"])].append(r)
    lines = [
        "# Trust benchmark (issue 14)", "",
        "Generated by `python benchmarks/trust.py report` from `trust.csv` "
        "(`python benchmarks/trust.py run`). Medians over seeds (n = seeds present). "
        "Coverage: share of coordinates whose central 95% interval contains the full-data posterior "
        "mean; true cov.: the same for the true parameter (simulated tables); width: median "
        "sd / full-data sd; floor width: the idealised floor's (issue 27); effects: full-data effects "
        "found (95% interval excludes 0, same sign) against the floor's mean; KL raw (nats).", "",
        "| data | method | eps | M | n | d | KL(full||s) | KL(s||full) | err sd med | err sd max | coverage | true cov. | width | floor width | effects found / full | floor effects | test LL |",
        "|---|---|---|---|---|---|---|---|---|---|---|---|---|---|---|---|---|",
    ]

    def order(k: tuple[str, str, str, str]) -> tuple[str, float, str, int]:
        return (k[0], float(k[2]) if k[2] else 0.0, k[1], int(k[3]) if k[3] else 0)

    for key in sorted(groups, key=order):
        g = groups[key]
        lines.append(
            f"| {key[0]} | {key[1]} | {key[2] or '-'} | {key[3] or '-'} | {len(g)} | {g[0].get('param_dim') or '-'} | "
            f"{_fmt(_median(g, 'kl_full_summary'))} | {_fmt(_median(g, 'kl_summary_full'))} | "
            f"{_fmt(_median(g, 'mean_error_sd_median'))} | {_fmt(_median(g, 'mean_error_sd_max'))} | "
            f"{_fmt(_median(g, 'coverage'), True)} | {_fmt(_median(g, 'true_coverage'), True)} | "
            f"{_fmt(_median(g, 'width_ratio'))} | {_fmt(_median(g, 'floor_width_ratio'))} | "
            f"{_fmt(_median(g, 'effects_found'))} / {_fmt(_median(g, 'effects_full'))} | "
            f"{_fmt(_median(g, 'floor_effects_found'))} | {_fmt(_median(g, 'test_loglik'))} |")
    # Target checks.
    lines += ["", "## Targets", "", "| check | data | eps | M | result |", "|---|---|---|---|---|"]
    for (ds, method, eps, size), g in sorted(groups.items(), key=lambda kv: order(kv[0])):
        if method != "noise-aware":
            continue
        cov = _median(g, "coverage")
        ok = cov is not None and cov >= 0.9
        lines.append(f"| honest (coverage >= 90%) | {ds} | {eps} | {size} | {'met' if ok else 'MISSED'} ({_fmt(cov, True)}) |")
        tc = _median(g, "true_coverage")
        if tc is not None:
            lines.append(f"| honest (true-parameter coverage >= 90%) | {ds} | {eps} | {size} | "
                         f"{'met' if tc >= 0.9 else 'MISSED'} ({_fmt(tc, True)}) |")
        if eps in ("0.2", "1.0") and size in ("50", "100") and (ds, "dp-vi", eps, "") in groups:
            d = groups[(ds, "dp-vi", eps, "")]
            kl_ok = (_median(g, "kl_full_summary") or 0) <= (_median(d, "kl_full_summary") or 0)
            err_ok = (_median(g, "mean_error_sd_median") or 0) <= (_median(d, "mean_error_sd_median") or 0)
            lines.append(f"| sharp vs DP-VI (KL(full||s), err) | {ds} | {eps} | {size} | "
                         f"{'met' if kl_ok else 'MISSED'} ({_fmt(_median(g, 'kl_full_summary'))} vs "
                         f"{_fmt(_median(d, 'kl_full_summary'))}), {'met' if err_ok else 'MISSED'} "
                         f"({_fmt(_median(g, 'mean_error_sd_median'))} vs {_fmt(_median(d, 'mean_error_sd_median'))}) |")
    target.write_text("\n".join(lines) + "\n")
    print(f"wrote {target}")


def tune(out: Path) -> None:
    """The schedule rule, written before any real table was run: on simulated logistic and
    Poisson tables (N = 10^4, 5 seeds), epsilon 0.2 and 1, pick the candidate schedule with the
    lowest mean over the two epsilons of median KL(full || noise-aware Gaussian) among those whose
    median coverage is >= 90%."""
    candidates = {
        "3 rounds (0.1,0.1),(0.1,0.1),(0.35,0.25)": ((0.1, 0.1), (0.1, 0.1), (0.35, 0.25)),
        "2 rounds (0.15,0.15),(0.5,0.2)": ((0.15, 0.15), (0.5, 0.2)),
        "2 rounds (0.1,0.15),(0.45,0.3)": ((0.1, 0.15), (0.45, 0.3)),
        "3 rounds (0.05,0.1),(0.05,0.1),(0.5,0.2)": ((0.05, 0.1), (0.05, 0.1), (0.5, 0.2)),
    }
    lines = ["# Noise-aware schedule rule (simulated tables only)", "", tune.__doc__ or "", "",
             "| schedule | data | eps | KL(full||s) | err sd med | coverage |", "|---|---|---|---|---|---|"]
    score: dict[str, list[float]] = defaultdict(list)
    covers: dict[str, list[float]] = defaultdict(list)
    for label, rounds in candidates.items():
        for ds in ("sim_logistic_1e4", "sim_poisson_1e4"):
            for eps in (0.2, 1.0):
                kls, errs, covs = [], [], []
                for seed in SEEDS:
                    table = simulated(ds, seed)
                    res, _ = noise_aware_fit(table, eps, na.Schedule(rounds))
                    rep = trust_report(res.posterior, table.full, prior_posterior(table.model))
                    kls.append(rep.kl_full_summary)
                    errs.append(rep.mean_error_sd_median)
                    covs.append(rep.coverage)
                kl, err, cov = statistics.median(kls), statistics.median(errs), statistics.median(covs)
                score[label].append(kl)
                covers[label].append(cov)
                lines.append(f"| {label} | {ds} | {eps} | {kl:.3g} | {err:.3g} | {100 * cov:.0f}% |")
                print(lines[-1])
    eligible = {k: statistics.mean(v) for k, v in score.items() if min(covers[k]) >= 0.9}
    best = min(eligible, key=eligible.__getitem__) if eligible else None
    lines += ["", f"Chosen: **{best}** (mean of median KLs {eligible.get(best, float('nan')):.3g})" if best else
              "No candidate met the coverage condition."]
    out.write_text("\n".join(lines) + "\n")
    print(f"wrote {out}")


def main() -> None:
    p = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    sub = p.add_subparsers(dest="cmd", required=True)
    r = sub.add_parser("run")
    r.add_argument("--out", type=Path, default=ROOT / "benchmarks" / "results" / "trust.csv")
    r.add_argument("--datasets", default=",".join(REAL + SIMULATED))
    r.add_argument("--epsilons", default=",".join(str(e) for e in EPSILONS))
    r.add_argument("--sizes", default=",".join(str(m) for m in SIZES))
    r.add_argument("--seeds", default=",".join(str(s) for s in SEEDS))
    r.add_argument("--psvi", action="store_true", help="also run non-private PSVI (slow)")
    r.add_argument("--no-dpvi", action="store_true")
    r.add_argument("--only-dpvi", action="store_true", help="DP-VI rows only (run in parallel with --no-dpvi)")
    r.add_argument("--quick", action="store_true", help="one seed, eps 0.2 and 1, M=50 (smoke)")
    rep = sub.add_parser("report")
    rep.add_argument("results", type=Path)
    rep.add_argument("target", type=Path)
    t = sub.add_parser("tune")
    t.add_argument("--out", type=Path, default=ROOT / "benchmarks" / "results" / "trust_schedule.md")
    a = p.parse_args()
    torch.set_num_threads(1)
    if a.cmd == "run":
        if a.quick:
            a.seeds, a.epsilons, a.sizes = "0", "0.2,1.0", "50"
        run(a.out, a.datasets.split(","), tuple(float(e) for e in a.epsilons.split(",")),
            tuple(int(m) for m in a.sizes.split(",")), tuple(int(s) for s in a.seeds.split(",")), a.psvi,
            not a.no_dpvi, not a.only_dpvi)
    elif a.cmd == "report":
        report(a.results, a.target)
    else:
        tune(a.out)


if __name__ == "__main__":
    main()
