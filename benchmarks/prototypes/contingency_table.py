"""Prototype (not a product path, NOT private): a saturated contingency-table release of the
NAPSU-MQ problem, the all-discrete route issue 37 names, without NAPSU-MQ's max-entropy model.

One Gaussian mechanism (L2 sensitivity 1: a record sits in exactly one cell) on the counts of
every cell of the public domain, the whole epsilon on it (single-Gaussian calibration of the
package's accountant); then, per cell, the posterior of the true count given its noisy count
under a flat prior on the non-negative integers (a discretised normal truncated at 0); then the
moment-matched mixture of the Laplace posteriors of ``draws`` tables drawn from those
posteriors (multiple imputation). Judged like every calibration-suite run
(``calibration.reference`` / ``judge``: the full-data posterior and the idealised floor in the
public schema's model space).

The noise comes from a seeded numpy generator and the records are read directly: it measures
utility only. ``--exclusive`` restricts the domain to rows with at most one race indicator set
(what the public schema does not say). Result: ``benchmarks/results/noise_aware_variants.md``,
"Tried and dropped before any rule".

    python benchmarks/prototypes/contingency_table.py --epsilons 1,0.5,0.3,0.1 --runs 5 [--exclusive]
"""

from __future__ import annotations

import argparse
import itertools
import statistics
import sys
from pathlib import Path

import numpy as np
import torch

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))
import calibration as cal  # noqa: E402
from noise_aware_variants import _table  # noqa: E402

from dpsummary import accounting as acc  # noqa: E402
from dpsummary.gaussian import DTYPE, GaussianPosterior  # noqa: E402
from dpsummary.inference import laplace  # noqa: E402


def cells(points: torch.Tensor, exclusive: bool) -> tuple[np.ndarray, np.ndarray]:
    """The public domain (product of each model-space column's values; with ``exclusive``, at
    most one of the four race indicators set) and the exact count of every cell."""
    support = [np.unique(points[:, j].numpy()) for j in range(points.shape[1])]
    domain = np.array(list(itertools.product(*support)))
    if exclusive:  # columns 1-4: the race indicators, +1 when set in the public transform's scale
        domain = domain[(domain[:, 1:5] > 0).sum(1) <= 1]
    index = {tuple(row): i for i, row in enumerate(domain)}
    counts = np.bincount([index[tuple(row)] for row in points.numpy()], minlength=len(domain))
    return domain, counts.astype(float)


def release(model: object, domain: np.ndarray, counts: np.ndarray, sigma: float, draws: int,
            rng: np.random.Generator) -> GaussianPosterior:
    noisy = counts + rng.normal(0.0, sigma, counts.shape)
    grid = np.arange(0, int(max(noisy.max(), 0.0) + 8 * sigma) + 1)
    logp = -0.5 * ((noisy[:, None] - grid[None, :]) / sigma) ** 2
    p = np.exp(logp - logp.max(1, keepdims=True))
    cdf = np.cumsum(p / p.sum(1, keepdims=True), 1)
    pts = torch.tensor(domain, dtype=DTYPE)
    means, covs = [], []
    for _ in range(draws):
        table = grid[(cdf < rng.uniform(size=len(counts))[:, None]).sum(1)]
        g = laplace(model, pts, torch.tensor(table, dtype=DTYPE))  # type: ignore[arg-type]
        means.append(g.mean)
        covs.append(g.cov)
    stacked = torch.stack(means)
    cov = torch.stack(covs).mean(0) + torch.cov(stacked.T) * (1 + 1 / draws)
    return GaussianPosterior(stacked.mean(0), torch.linalg.cholesky(0.5 * (cov + cov.T)))


def main() -> None:
    p = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    p.add_argument("--epsilons", default="1,0.5,0.3,0.1")
    p.add_argument("--runs", type=int, default=5)
    p.add_argument("--draws", type=int, default=50)
    p.add_argument("--exclusive", action="store_true")
    a = p.parse_args()
    model, pts, _fn, _tb = _table("napsu_adult")
    delta = 0.1 / (cal.TABLES["napsu_adult"].n_max or 1)
    domain, counts = cells(pts, a.exclusive)
    rng = np.random.default_rng(0)
    for eps in (float(e) for e in a.epsilons.split(",")):
        ref = cal.reference(model, pts, epsilon=eps, delta=delta, key="contingency:napsu_adult")
        sigma = acc.calibrate_gaussian(target_epsilon=eps, delta=delta)
        js = [cal.judge(release(model, domain, counts, sigma, a.draws, rng), ref) for _ in range(a.runs)]
        print(f"epsilon {eps:g}: {len(domain)} cells, noise sd {sigma:.1f}; coverage "
              f"{[round(j['coverage'], 2) for j in js]} (median {statistics.median(j['coverage'] for j in js):.2f}); "
              f"median width / full {statistics.median(j['width_ratio'] for j in js):.2f} "
              f"(floor {js[0]['floor_width_ratio']:.2f}); wrong signs {sum(j['effects_wrong_sign'] for j in js)}; "
              f"largest error {max(j['mean_error_sd_max'] for j in js):.1f} full-data sds", flush=True)


if __name__ == "__main__":
    main()
