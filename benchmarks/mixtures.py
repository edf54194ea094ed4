"""Lightweight vs uniform coresets for BGMM/DPGMM weighted CAVI (issue 17; poster Fig. 3-4).

    OMP_NUM_THREADS=1 nice -n 10 python benchmarks/mixtures.py --n 100000 --seeds 5
    -> benchmarks/results/mixtures.csv and benchmarks/results/mixtures.md

Data (public generator below, fixed seeds, ground truth known):

* ``outlying``: 2-d, three large components (50%, 30%, 15% of the mass) near the data mean and
  two small ones (3%, 2%) far from it: the case the poster's Algorithm 1 is designed for (q grows
  with the squared distance to the mean).
* ``central``: same weights, but the two small, tight components sit *between* the large ones,
  close to the data mean, where q is near its floor 1/(2N): the case where it should not help.
* ``adult``: the six numeric columns of ``../shared/data/adult.csv`` (standardised,
  non-private); no ground truth, so the reference is the full-data fit (its components with at
  least 1% of the mass; "small" = between 1% and 5%).

For every data set, model (gmm: K = 10 Dirichlet(1/K); dpgmm: T = 10 sticks Beta(1, 1/T);
scikit-learn's default priors computed from the weighted data), method (lightweight, uniform)
and M in {1%, 2%, 5%} of N and coreset seed in 0..seeds-1: build the coreset, run weighted CAVI
(k-means++ start, at most 500 sweeps, relative ELBO tolerance 1e-7; prior covariance
W0^-1 = 0.01 x data covariance, i.e. a prior component sd of ~10% of the data's: scikit-learn's
default W0^-1 = data covariance swamps the covariance of a 2% component) and measure, after Hungarian
matching (scipy ``linear_sum_assignment`` on mean distances) to the reference components:
mean error (Euclidean, averaged over reference components), covariance error (relative
Frobenius), number of small components recovered (matched weight >= half the reference weight
and matched mean inside the reference's 1-sigma ellipsoid), held-out log predictive density per
point (Student-t predictive, 10% held out / 10^4 fresh points), and wall time (coreset
construction + CAVI) against full-data CAVI on the same machine (2 shared cores: read times as
rough).
"""

from __future__ import annotations

import argparse
import csv
import math
import os
import statistics
import sys
import time
from collections import defaultdict
from dataclasses import dataclass
from pathlib import Path

import numpy as np

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT))

from dpsummary.mixtures import (  # noqa: E402
    MODEL_PROCESSES,
    MixtureFit,
    MixturePrior,
    build_coreset,
    component_errors,
    fit_cavi,
    log_predictive_density,
)
from dpsummary.mixtures.table import read_numeric_table  # noqa: E402

RESULTS = ROOT / "benchmarks" / "results"
ADULT = ROOT.parent / "shared" / "data" / "adult.csv"
FRACTIONS = (0.01, 0.02, 0.05)
METHODS = ("lightweight", "uniform")
N_COMPONENTS = 10
MAX_ITER = 500
TOL = 1e-7
#: Prior covariance W0^-1 = COVARIANCE_SCALE x data covariance (component sd prior ~10% of the data's).
COVARIANCE_SCALE = 0.01
#: Reference components lighter than this are "small"; for adult, lighter than REF_MIN are ignored.
SMALL = 0.05
REF_MIN = 0.01
#: Public seeds of the synthetic data (training and held-out draws).
DATA_SEED, TEST_SEED = 20260, 20261


@dataclass(frozen=True)
class Truth:
    weights: np.ndarray
    means: np.ndarray
    covariances: np.ndarray


def _rotation(angle: float) -> np.ndarray:
    c, s = np.cos(angle), np.sin(angle)
    return np.array([[c, -s], [s, c]])


def truth(scenario: str) -> Truth:
    """The ground-truth mixture of a synthetic scenario (see module docstring)."""
    weights = np.array([0.50, 0.30, 0.15, 0.03, 0.02])
    if scenario == "outlying":
        means = np.array([[0.0, 0.0], [4.0, 0.5], [1.5, 4.0], [11.0, 9.0], [-8.0, 7.0]])
        sds = np.array([[1.0, 0.6], [0.8, 0.5], [0.7, 0.7], [0.5, 0.3], [0.4, 0.4]])
    elif scenario == "central":
        means = np.array([[-5.0, 0.0], [5.0, 0.0], [0.0, 6.0], [0.0, 1.8], [0.0, -2.5]])
        sds = np.array([[1.0, 0.6], [0.8, 0.5], [0.7, 0.7], [0.3, 0.2], [0.25, 0.25]])
    else:
        raise ValueError(f"unknown scenario {scenario!r}")
    angles = np.array([0.3, -0.6, 1.0, 0.2, 0.0])
    covs = np.array([_rotation(a) @ np.diag(s**2) @ _rotation(a).T for a, s in zip(angles, sds, strict=True)])
    return Truth(weights, means, covs)


def sample(t: Truth, n: int, seed: int) -> np.ndarray:
    """n points from the mixture (component counts multinomial), shuffled."""
    rng = np.random.default_rng(seed)
    counts = rng.multinomial(n, t.weights)
    parts = [rng.multivariate_normal(m, c, size=k) for m, c, k in zip(t.means, t.covariances, counts, strict=True)]
    x = np.concatenate(parts)
    return x[rng.permutation(n)]


def _fit(x: np.ndarray, w: np.ndarray | None, model: str, seed: int) -> MixtureFit:
    prior = MixturePrior.default(MODEL_PROCESSES[model], N_COMPONENTS, x, w,
                                 covariance_scale=COVARIANCE_SCALE)
    return fit_cavi(x, w, prior, np.random.default_rng([seed, 2]), max_iter=MAX_ITER, tol=TOL)


def _scores(fit: MixtureFit, ref: Truth, test: np.ndarray) -> dict[str, float]:
    post = fit.posterior
    err = component_errors(ref.weights, ref.means, ref.covariances, post.expected_weights(), post.means,
                           post.covariances())
    small = ref.weights < SMALL
    return {
        "mean_error": float(err.mean_error.mean()),
        "cov_error": float(err.covariance_error.mean()),
        "small_recovered": int(err.recovered[small].sum()),
        "small_total": int(small.sum()),
        "all_recovered": int(err.recovered.sum()),
        "heldout_lpd": float(log_predictive_density(post, test).mean()),
        "iterations": len(fit.elbo_trace) - 1,
        "converged": int(fit.converged),
    }


def run_dataset(name: str, train: np.ndarray, test: np.ndarray, ref: Truth | None, models: list[str],
                seeds: int, rows: list[dict[str, object]], fractions: tuple[float, ...] = FRACTIONS) -> None:
    n = train.shape[0]
    for model in models:
        start = time.perf_counter()
        full = _fit(train, None, model, 0)
        full_seconds = time.perf_counter() - start
        if ref is None:  # real data: the full fit's non-negligible components are the reference
            post = full.posterior
            keep = post.expected_weights() >= REF_MIN
            ref_model = Truth(post.expected_weights()[keep], post.means[keep], post.covariances()[keep])
        else:
            ref_model = ref
        base = {"dataset": name, "model": model, "n": n, "full_seconds": full_seconds}
        rows.append({**base, "method": "full", "fraction": 1.0, "size": n, "seed": 0, "distinct": n,
                     "seconds": full_seconds, **_scores(full, ref_model, test)})
        print(f"{name} {model} full: {full_seconds:.1f}s {rows[-1]}", flush=True)
        for fraction in fractions:
            size = int(round(fraction * n))
            for method in METHODS:
                for seed in range(seeds):
                    start = time.perf_counter()
                    core = build_coreset(method, train, size, np.random.default_rng([seed, 1]))
                    fit = _fit(core.points, core.weights, model, seed)
                    seconds = time.perf_counter() - start
                    rows.append({**base, "method": method, "fraction": fraction, "size": size, "seed": seed,
                                 "distinct": int(core.weights.shape[0]), "seconds": seconds,
                                 **_scores(fit, ref_model, test)})
            print(f"{name} {model} M={size} done", flush=True)


def summarise(rows: list[dict[str, object]], command: str) -> str:
    groups: dict[tuple[object, ...], list[dict[str, object]]] = defaultdict(list)
    for r in rows:
        groups[(r["dataset"], r["n"], r["model"], r["fraction"], r["method"])].append(r)

    def ms(vals: list[float], fmt: str) -> str:
        if len(vals) == 1:
            return format(vals[0], fmt)
        return f"{format(statistics.mean(vals), fmt)} ± {format(statistics.stdev(vals), fmt)}"

    lines = [
        "# Lightweight vs uniform coresets for BGMM / DPGMM (weighted CAVI)",
        "",
        f"Generated by `{command}` (benchmarks/mixtures.py; its docstring defines data, metrics and",
        "settings). Mean ± sd over coreset seeds; `small rec.` = small reference components recovered",
        "(summed over seeds, out of seeds x small components); `lpd` = held-out log predictive",
        "density per point (higher is better); `speed-up` = full-data CAVI time / (coreset",
        "construction + coreset CAVI) time, on 2 cores shared with other jobs (rough).",
        f"Load average at the end: {os.getloadavg()[0]:.2f}.",
        "",
        "| data | N | model | M/N | method | mean err | cov err (rel) | small rec. | all rec. | lpd | sweeps (conv.) | speed-up |",
        "|---|---|---|---|---|---|---|---|---|---|---|---|",
    ]
    for key, rs in groups.items():
        dataset, n, model, fraction, method = key
        small = sum(int(r["small_recovered"]) for r in rs)  # type: ignore[call-overload]
        small_total = sum(int(r["small_total"]) for r in rs)  # type: ignore[call-overload]
        allrec = statistics.mean(float(r["all_recovered"]) for r in rs)  # type: ignore[arg-type]
        speed = [float(r["full_seconds"]) / float(r["seconds"]) for r in rs]  # type: ignore[arg-type]
        lines.append(
            f"| {dataset} | {n} | {model} | {float(fraction):.3g} | {method} "  # type: ignore[arg-type]
            f"| {ms([float(r['mean_error']) for r in rs], '.3f')} "  # type: ignore[arg-type]
            f"| {ms([float(r['cov_error']) for r in rs], '.3f')} "  # type: ignore[arg-type]
            f"| {small}/{small_total} | {allrec:.1f} "
            f"| {ms([float(r['heldout_lpd']) for r in rs], '.4f')} "  # type: ignore[arg-type]
            f"| {ms([float(r['iterations']) for r in rs], '.0f')} "  # type: ignore[arg-type]
            f"({sum(int(r['converged']) for r in rs)}/{len(rs)}) "  # type: ignore[call-overload]
            f"| {ms(speed, '.1f')} |"
        )
    return "\n".join(lines) + "\n"


class _NoNoise:
    """NON-PRIVATE reference randomness for the DP-EM algorithm without noise (epsilon = inf row)."""

    def coins(self, num_records: int, sample_rate: float) -> np.ndarray:
        return np.ones(num_records, dtype=bool)

    def sample_indices(self, num_records: int, sample_rate: float) -> np.ndarray:
        return np.arange(num_records, dtype=np.int64)

    def gaussian(self, values: np.ndarray, *, noise_std: float, clip_norm: float) -> np.ndarray:
        return np.asarray(values, dtype=np.float64)


def run_private(n: int, repeats: int, epsilons: list[float], rounds: int, radius: float) -> list[dict[str, object]]:
    """DP-EM (dpsummary.private.mixture) on the synthetic sets, in the public standardised space
    given by the generator's true mixture mean and sd (public: the generator is public).
    Privacy noise is real (OS entropy): rows vary between repeats and runs."""
    from dpsummary.private.mixture import private_mixture

    rows: list[dict[str, object]] = []
    for name in ("outlying", "central"):
        t = truth(name)
        mu = t.weights @ t.means
        cov = sum(w * (c + np.outer(m - mu, m - mu)) for w, m, c in zip(t.weights, t.means, t.covariances, strict=True))
        sd = np.sqrt(np.diag(cov))
        ref = Truth(t.weights, (t.means - mu) / sd, t.covariances / np.outer(sd, sd))
        train, test = (sample(t, n, DATA_SEED) - mu) / sd, (sample(t, 10_000, TEST_SEED) - mu) / sd
        d = train.shape[1]
        prior = MixturePrior("dirichlet_process", N_COMPONENTS, 1.0 / N_COMPONENTS, 1.0, np.zeros(d), float(d),
                             COVARIANCE_SCALE * np.eye(d))
        delta = 0.1 / n
        for eps in [*epsilons, math.inf]:
            for rep in range(repeats if math.isfinite(eps) else 1):
                start = time.perf_counter()
                summary = private_mixture(train, prior, epsilon=eps if math.isfinite(eps) else 1.0, delta=delta,
                                          radius=radius, rounds=rounds, init_rng=np.random.default_rng([rep, 3]),
                                          randomness=None if math.isfinite(eps) else _NoNoise())
                seconds = time.perf_counter() - start
                base = {"dataset": name, "n": n, "epsilon": eps, "delta": delta, "rounds": rounds, "radius": radius,
                        "sigma": summary.noise_multiplier if math.isfinite(eps) else 0.0, "repeat": rep,
                        "seconds": seconds}
                dp_em = MixtureFit(summary.posterior, np.array([np.nan]), True, seconds)
                rows.append({**base, "output": "dp-em posterior", "distinct": 0, **_scores(dp_em, ref, test)})
                refit = fit_cavi(summary.points, summary.weights, prior, np.random.default_rng([rep, 4]),
                                 max_iter=MAX_ITER, tol=TOL)
                rows.append({**base, "output": "pseudo-data -> CAVI", "distinct": int(summary.weights.shape[0]),
                             **_scores(refit, ref, test)})
                print(f"private {name} eps={eps} rep={rep} {rows[-2]['heldout_lpd']:.3f} {rows[-1]['heldout_lpd']:.3f}",
                      flush=True)
        full = fit_cavi(train, None, prior, np.random.default_rng([0, 2]), max_iter=MAX_ITER, tol=TOL)
        rows.append({"dataset": name, "n": n, "epsilon": "non-private", "delta": 0.0, "rounds": 0, "radius": 0.0,
                     "sigma": 0.0, "repeat": 0, "seconds": full.seconds, "output": "full-data CAVI", "distinct": n,
                     **_scores(full, ref, test)})
    return rows


def summarise_private(rows: list[dict[str, object]], command: str) -> str:
    groups: dict[tuple[object, ...], list[dict[str, object]]] = defaultdict(list)
    for r in rows:
        groups[(r["dataset"], r["epsilon"], r["output"])].append(r)
    lines = [
        "# Private mixture summary: DP-EM noisy statistics (dpsummary/private/mixture.py)",
        "",
        f"Generated by `{command}`. DPGMM, T = {N_COMPONENTS}, public prior (m0 = 0, W0^-1 = "
        f"{COVARIANCE_SCALE} I in the public standardised space), delta = 0.1/N, Opacus RDP calibration,",
        "real OS-entropy noise (numbers vary run to run); mean ± sd over repeats. `inf` = the same",
        "algorithm without noise (NON-PRIVATE, separates algorithm from noise). Metrics as in mixtures.md.",
        "",
        "| data | epsilon | output | sigma | mean err | cov err (rel) | small rec. | all rec. | lpd |",
        "|---|---|---|---|---|---|---|---|---|",
    ]
    for (dataset, eps, output), rs in groups.items():
        def ms(key: str, rs: list[dict[str, object]] = rs) -> str:
            vals = [float(r[key]) for r in rs]  # type: ignore[arg-type]
            return f"{statistics.mean(vals):.3f}" + (f" ± {statistics.stdev(vals):.3f}" if len(vals) > 1 else "")
        small = sum(int(r["small_recovered"]) for r in rs)  # type: ignore[call-overload]
        small_total = sum(int(r["small_total"]) for r in rs)  # type: ignore[call-overload]
        lines.append(f"| {dataset} | {eps} | {output} | {ms('sigma')} | {ms('mean_error')} | {ms('cov_error')} "
                     f"| {small}/{small_total} | {ms('all_recovered')} | {ms('heldout_lpd')} |")
    return "\n".join(lines) + "\n"


def _write(rows: list[dict[str, object]], stem: str, text: str) -> None:
    RESULTS.mkdir(parents=True, exist_ok=True)
    with open(RESULTS / f"{stem}.csv", "w", newline="") as fh:
        writer = csv.DictWriter(fh, fieldnames=list(rows[0]))
        writer.writeheader()
        writer.writerows(rows)
    (RESULTS / f"{stem}.md").write_text(text)
    print(f"wrote {RESULTS / stem}.md and .csv")


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--n", type=int, default=100_000, help="synthetic training size N")
    parser.add_argument("--seeds", type=int, default=5)
    parser.add_argument("--datasets", default="outlying,central,adult")
    parser.add_argument("--models", default="dpgmm,gmm")
    parser.add_argument("--out", default=None, help="results file stem in benchmarks/results/")
    parser.add_argument("--fractions", default=",".join(map(str, FRACTIONS)), help="M/N values")
    parser.add_argument("--private", action="store_true", help="run the DP-EM comparison instead")
    parser.add_argument("--epsilons", default="1,4,16")
    parser.add_argument("--rounds", type=int, default=20)
    parser.add_argument("--radius", type=float, default=6.0)
    args = parser.parse_args()
    command = "OMP_NUM_THREADS=1 nice -n 10 python benchmarks/mixtures.py " + " ".join(sys.argv[1:])
    if args.private:
        rows_p = run_private(args.n, args.seeds, [float(e) for e in args.epsilons.split(",")], args.rounds, args.radius)
        _write(rows_p, args.out or "mixtures_private", summarise_private(rows_p, command.strip()))
        return
    models = args.models.split(",")
    fractions = tuple(float(f) for f in args.fractions.split(","))
    rows: list[dict[str, object]] = []
    for name in args.datasets.split(","):
        if name == "adult":
            table = read_numeric_table(ADULT)
            perm = np.random.default_rng(DATA_SEED).permutation(table.values.shape[0])
            n_test = table.values.shape[0] // 10
            run_dataset(name, table.values[perm[n_test:]], table.values[perm[:n_test]], None, models, args.seeds, rows,
                        fractions)
        else:
            t = truth(name)
            run_dataset(name, sample(t, args.n, DATA_SEED), sample(t, 10_000, TEST_SEED), t, models, args.seeds, rows,
                        fractions)
    _write(rows, args.out or "mixtures", summarise(rows, command.strip()))


if __name__ == "__main__":
    main()
