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

``--posterior`` chooses what is made of the noisy table (the fifteenth rule's two candidates,
2026-11-27; the same section):

* ``imputed`` (the default): the flat-prior imputation above;
* ``weighted``: the likelihood of the noisy table itself. Per cell the noisy total ``t`` and
  difference ``d = positives - negatives`` (independent noises of variance ``2 s^2``); the true
  total integrated on an exchangeable gamma prior fitted to the noisy totals by moments (binned
  quadrature, exact however spiky), the positives given the total by the binomial's normal
  approximation with its variance at the previous mode, ``d | n ~ N(n (2p - 1), 4 n p_ref (1 -
  p_ref) + 2 s^2)``; Laplace at the mode;
* ``sandwich``: the full data's log-likelihood estimated without bias (every cell's noisy counts
  in place of its counts), its mode, and ``H^-1 + H^-1 V H^-1`` with ``V = sum_k x_k x_k^T s^2
  ((1 - p_k)^2 + p_k^2)`` the estimated score's noise.

    python benchmarks/prototypes/contingency_table.py --epsilons 1,0.5,0.3,0.1 --runs 5 [--exclusive] \
        [--posterior imputed|weighted|sandwich]
"""

from __future__ import annotations

import argparse
import itertools
import math
import statistics
import sys
from collections.abc import Callable
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


def _mode(log_post: Callable[[torch.Tensor], torch.Tensor], start: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor]:
    """Damped Newton to the mode; the negative Hessian there, eigenvalues floored at 1 (the prior's)."""
    from torch.autograd.functional import hessian

    theta, value = start, log_post(start)
    for _ in range(100):
        th = theta.detach().requires_grad_(True)
        (grad,) = torch.autograd.grad(log_post(th), th)
        evals, evecs = torch.linalg.eigh(-hessian(log_post, theta))
        step = evecs @ ((evecs.T @ grad) / evals.clamp(min=1.0))
        scale = 1.0
        while scale > 1e-6 and not bool(log_post(theta + scale * step) >= value - 1e-12):
            scale /= 2
        theta = theta + scale * step
        value = log_post(theta)
        if float((scale * step).abs().max()) < 1e-9:
            break
    evals, evecs = torch.linalg.eigh(-hessian(log_post, theta))
    return theta.detach(), evecs @ torch.diag(evals.clamp(min=1.0)) @ evecs.T


def _design(model: object, domain: np.ndarray) -> tuple[torch.Tensor, np.ndarray]:
    """The design rows of the cells whose last coordinate is the target's 1, and their index pairs."""
    pts = torch.tensor(domain, dtype=DTYPE)
    feats = {tuple(row[:-1]) for row in domain}
    order = sorted(feats)
    index = {tuple(row): i for i, row in enumerate(domain)}
    pairs = np.array([[index[(*f, 0.0)], index[(*f, 1.0)]] for f in order])
    return model.design(pts[pairs[:, 1]]), pairs  # type: ignore[attr-defined]


def weighted(model: object, domain: np.ndarray, counts: np.ndarray, sigma: float,
             rng: np.random.Generator) -> GaussianPosterior:
    from scipy.special import gammainc

    design, pairs = _design(model, domain)
    noisy = counts + rng.normal(0.0, sigma, counts.shape)
    t = noisy[pairs].sum(1)
    d = torch.tensor(noisy[pairs[:, 1]] - noisy[pairs[:, 0]], dtype=DTYPE)
    m = max(float(t.mean()), 1.0)
    v = max(float(t.var()) - 2 * sigma**2, m)
    shape, rate = m * m / v, m / v
    sd = math.sqrt(2.0) * sigma
    frac = np.linspace(0.0, 1.0, 49)[None, :]
    tt = t[:, None]
    edges = np.where(tt > 8 * sd, tt - 8 * sd + 16 * sd * frac, (np.maximum(tt, 0.0) + 8 * sd) * frac**2)
    mid = 0.5 * (edges[:, 1:] + edges[:, :-1])
    log_w = np.log(np.maximum(np.diff(gammainc(shape, rate * edges), axis=1), 1e-300)) - 0.5 * ((tt - mid) / sd) ** 2
    w = np.exp(log_w - log_w.max(1, keepdims=True))
    n, logw = torch.tensor(mid), torch.log(torch.tensor(w / w.sum(1, keepdims=True)))
    mode = torch.zeros(design.shape[1], dtype=DTYPE)
    for _ in range(6):
        ref = torch.sigmoid(design @ mode)
        var = 4.0 * n * (ref * (1 - ref))[:, None] + 2 * sigma**2

        def log_post(theta: torch.Tensor, var: torch.Tensor = var) -> torch.Tensor:
            p = torch.sigmoid(design @ theta)[:, None]
            r = d[:, None] - n * (2 * p - 1)
            return torch.logsumexp(-0.5 * (r * r / var + torch.log(var)) + logw, 1).sum() - 0.5 * (theta * theta).sum()

        mode, precision = _mode(log_post, mode)
    return GaussianPosterior.from_precision(precision, precision @ mode)


def sandwich(model: object, domain: np.ndarray, counts: np.ndarray, sigma: float,
             rng: np.random.Generator) -> GaussianPosterior:
    design, pairs = _design(model, domain)
    noisy = torch.tensor(counts + rng.normal(0.0, sigma, counts.shape), dtype=DTYPE)
    pos, tot = noisy[pairs[:, 1]], noisy[pairs].sum(1)

    def log_post(theta: torch.Tensor) -> torch.Tensor:
        eta = design @ theta
        return (pos * eta - tot * torch.nn.functional.softplus(eta)).sum() - 0.5 * (theta * theta).sum()

    mode, precision = _mode(log_post, torch.zeros(design.shape[1], dtype=DTYPE))
    p = torch.sigmoid(design @ mode)
    score_var = design.T @ ((sigma**2 * ((1 - p) ** 2 + p**2))[:, None] * design)
    h_inv = torch.linalg.inv(precision)
    cov = h_inv + h_inv @ score_var @ h_inv
    return GaussianPosterior(mode, torch.linalg.cholesky(0.5 * (cov + cov.T)))


def main() -> None:
    p = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    p.add_argument("--epsilons", default="1,0.5,0.3,0.1")
    p.add_argument("--runs", type=int, default=5)
    p.add_argument("--draws", type=int, default=50)
    p.add_argument("--exclusive", action="store_true")
    p.add_argument("--posterior", choices=("imputed", "weighted", "sandwich"), default="imputed")
    a = p.parse_args()
    model, pts, _fn, _tb = _table("napsu_adult")
    delta = 0.1 / (cal.TABLES["napsu_adult"].n_max or 1)
    domain, counts = cells(pts, a.exclusive)
    rng = np.random.default_rng(0)
    for eps in (float(e) for e in a.epsilons.split(",")):
        ref = cal.reference(model, pts, epsilon=eps, delta=delta, key="contingency:napsu_adult")
        sigma = acc.calibrate_gaussian(target_epsilon=eps, delta=delta)
        if a.posterior == "imputed":
            js = [cal.judge(release(model, domain, counts, sigma, a.draws, rng), ref) for _ in range(a.runs)]
        else:
            fn = weighted if a.posterior == "weighted" else sandwich
            js = [cal.judge(fn(model, domain, counts, sigma, rng), ref) for _ in range(a.runs)]
        print(f"epsilon {eps:g}: {len(domain)} cells, noise sd {sigma:.1f}; coverage "
              f"{[round(j['coverage'], 2) for j in js]} (median {statistics.median(j['coverage'] for j in js):.2f}); "
              f"median width / full {statistics.median(j['width_ratio'] for j in js):.2f} "
              f"(floor {js[0]['floor_width_ratio']:.2f}); wrong signs {sum(j['effects_wrong_sign'] for j in js)}; "
              f"largest error {max(j['mean_error_sd_max'] for j in js):.1f} full-data sds", flush=True)


if __name__ == "__main__":
    main()
