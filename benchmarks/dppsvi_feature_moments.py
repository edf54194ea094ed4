"""Issue 28 experiment: why does calibrated DP-PSVI miss coverage on bike_rentals?

The calibrated DP-PSVI release misses coverage on bike_rentals (78% median); the diagnosis in
``benchmarks/results/dppsvi_bootstrap.md`` was the bootstrap's feature model: its synthetic
tables draw every feature column independently (from the public box for Poisson), so collinear
columns (temp and atemp) look independent to it. This script re-runs the public-schema benchmark
rows (:func:`dppsvi_bootstrap.mechanism`, the release's DP-PSVI on the training rows, which for
Poisson now starts from the DP initialisation histograms) with the bootstrap's synthetic tables
changed, to measure what a better feature or target model could
give. The two oracle variants read the REAL table inside the bootstrap and are therefore NOT
private: they bound what any feature/target model could reach, they are not candidates.

* ``oracle``: the bootstrap resamples the table's real feature rows (every joint structure
  exact); targets as today (Poisson at the bootstrap's truth).
* ``oracle-nb``: the same features, and targets overdispersed as the real table's are:
  ``y ~ Poisson(mu G)``, ``G ~ Gamma(k, 1/k)`` (negative binomial, variance ``mu + mu^2 / k``),
  ``k`` the real table's method-of-moments dispersion at the full-data posterior mean.
* ``dp``: what a DP release could carry instead (a feasibility check before building it): the
  release's DP initialisation histograms plus one Gaussian release of the sum of ``[x / R, triu(x x^T) / R^2,
  y / B, (y / B)^2] / 2`` (unit L2 sensitivity) at sqrt(2) times the histograms' noise multiplier
  (as if the initialisation share were split equally between the two; the histograms themselves
  keep their full share, so this is slightly optimistic). Features: a maximum-entropy tilt of the
  histograms' independent sampler to the noisy first and second moments (pool of 50,000 rows,
  dual ridge-penalised by the noise); targets: negative binomial with ``1/k`` matched at each
  replicate's truth to the noisy mean of ``y^2``. The ``dispersion_k`` column holds the tilt's
  effective sample size for these rows.
* ``dp-tilt``: the ``dp`` features with the model's own (Poisson) targets.
* ``dp-tree``: one Gaussian release of every pairwise table of the histogram layout's public
  bins (L2 sensitivity sqrt(number of pairs), at the same sqrt(2) times the histograms' noise
  multiplier), a Chow-Liu tree (maximum spanning tree of the noisy tables' mutual information)
  and features sampled along it (root from the release's DP histogram); Poisson targets.

Per row, ``z`` lists the calibrated release's errors (posterior mean minus full-data posterior
mean, in its own sds) per coordinate, intercept first. Usage::

    python benchmarks/dppsvi_feature_moments.py --datasets bike_rentals --seeds 0,1,2,3,4
    python benchmarks/dppsvi_feature_moments.py --datasets bike_rentals --seeds 0,1,2,3,4 --features dp
    python benchmarks/dppsvi_feature_moments.py --report benchmarks/results/dppsvi_feature_moments.csv \
        benchmarks/results/dppsvi_feature_moments.md
"""

from __future__ import annotations

import argparse
import csv
import dataclasses
import math
import sys
from pathlib import Path
from typing import Any

import numpy as np
import torch

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT))
sys.path.insert(0, str(ROOT / "benchmarks"))

import dppsvi_bootstrap as dpb  # noqa: E402
import trust  # noqa: E402

from dpsummary.bootstrap import BootstrapConfig, ParametricBootstrap  # noqa: E402
from dpsummary.inference import coreset_posterior  # noqa: E402

DTYPE = torch.float64


class WeightedRows:
    """Feature sampler resampling fixed rows with weights (picklable for the bootstrap workers)."""

    def __init__(self, rows: torch.Tensor, weights: torch.Tensor | None = None) -> None:
        self.rows = rows.detach()
        self.weights = None if weights is None else weights.detach()
        self.ess = rows.shape[0] if weights is None else float(1.0 / (self.weights * self.weights).sum())

    def __call__(self, n: int, gen: torch.Generator) -> torch.Tensor:
        if self.weights is None:
            idx = torch.randint(0, self.rows.shape[0], (n,), generator=gen)
        else:
            idx = torch.multinomial(self.weights, n, replacement=True, generator=gen)
        return self.rows[idx].clone()


class FixedFeatures:
    """Stands in for ``MechanismSettings.init_marginals``: ``sampler(public)`` returns ``fn``."""

    def __init__(self, fn: Any) -> None:
        self.fn = fn

    def sampler(self, public: Any) -> Any:
        return self.fn


def oracle(x: torch.Tensor) -> Any:
    return WeightedRows(x)


class OverdispersedPoisson:
    """Wraps a Poisson model: targets ~ Poisson(mu G), G ~ Gamma(k, 1/k) (negative binomial,
    variance ``mu + mu^2 / k``). ``oracle-nb``: a fixed ``1/k`` (the real table's); ``dp``
    (``mean_y2`` given): at each replicate's truth, ``1/k`` chosen so that the synthetic table's
    mean of ``y^2`` matches the DP one (``E y^2 = E mu + (1 + 1/k) E mu^2``), clamped to [0, 10];
    Poisson when the DP second moment is below Poisson's."""

    def __init__(self, model: Any, *, inv_k: float | None = None, mean_y2: float | None = None) -> None:
        self._model, self.inv_k, self.mean_y2 = model, inv_k, mean_y2

    def __getattr__(self, name: str) -> Any:
        return getattr(self._model, name)

    def simulate(self, theta: torch.Tensor, num: int, generator: torch.Generator,
                 features: torch.Tensor | None = None) -> torch.Tensor:
        assert features is not None
        mu = (self._model.design(features) @ theta).clamp(max=30.0).exp()
        inv_k = self.inv_k
        if self.mean_y2 is not None:
            e_mu, e_mu2 = float(mu.mean()), float((mu * mu).mean())
            inv_k = min(max((self.mean_y2 - e_mu - e_mu2) / max(e_mu2, 1e-12), 0.0), 10.0)
        assert inv_k is not None
        rate = mu
        if inv_k >= 1e-6:
            rate = mu * torch._standard_gamma(torch.full_like(mu, 1.0 / inv_k), generator=generator) * inv_k
        y = torch.poisson(rate, generator=generator)
        return torch.cat([features, y[:, None].to(DTYPE)], 1)


def moment_stats(x: torch.Tensor) -> torch.Tensor:
    """[x, upper triangle (with diagonal) of x x^T] per row."""
    d = x.shape[1]
    iu = torch.triu_indices(d, d)
    return torch.cat([x, (x[:, :, None] * x[:, None, :])[:, iu[0], iu[1]]], dim=1)


def dp_moments(x: torch.Tensor, y: torch.Tensor, *, feature_norm: float, target_bound: float,
               noise_multiplier: float, generator: torch.Generator) -> tuple[torch.Tensor, torch.Tensor, float]:
    """One Gaussian release of the sum of ``[x / R, triu(x x^T) / R^2, y / B, (y / B)^2] / 2``
    (L2 norm <= 1 per record: unit sensitivity), divided by the (public) record count. Returns
    the noisy feature moments (first, then second), their noise sds, and the noisy mean of y^2."""
    n = x.shape[0]
    r, b = feature_norm, target_bound
    t = moment_stats(x)
    nf = x.shape[1]
    scale = torch.cat([torch.full((nf,), r), torch.full((t.shape[1] - nf,), r * r)]).to(DTYPE)
    u = torch.cat([t / scale, (y / b)[:, None], ((y / b) ** 2)[:, None]], 1) / 2.0
    noisy = u.sum(0) + noise_multiplier * torch.randn(u.shape[1], generator=generator, dtype=DTYPE)
    feat = noisy[:-2] * 2.0 * scale / n
    feat_sd = noise_multiplier * 2.0 * scale / n
    mean_y2 = float(noisy[-1]) * 2.0 * b * b / n
    return feat, feat_sd, mean_y2


def tilt_sampler(base: Any, target: torch.Tensor, noise_sd: torch.Tensor, *, pool: int,
                 generator: torch.Generator) -> WeightedRows:
    """Max-entropy tilt of ``base`` (the release's independent per-column sampler) towards the
    noisy moments: rows of a pool reweighted by ``exp(lambda . t(x))``, the dual ridge-penalised by
    the noise variance (the MAP tilt given Gaussian noise on the target)."""
    cand = base(pool, generator)
    t = moment_stats(cand)
    centre, spread = t.mean(0), t.std(0).clamp_min(1e-6)
    ts = (t - centre) / spread
    tau = (target - centre) / spread
    ridge = (noise_sd / spread) ** 2
    lam = torch.zeros(ts.shape[1], dtype=DTYPE, requires_grad=True)
    opt = torch.optim.LBFGS([lam], lr=1.0, max_iter=500, line_search_fn="strong_wolfe")

    def closure() -> torch.Tensor:
        opt.zero_grad()
        loss = torch.logsumexp(ts @ lam, 0) - lam @ tau + 0.5 * (ridge * lam * lam).sum()
        loss.backward()
        return loss

    opt.step(closure)
    with torch.no_grad():
        return WeightedRows(cand, torch.softmax(ts @ lam, 0))


class TreeSampler:
    """Features drawn along a tree of DP two-way marginals (``dp-tree``; picklable).

    ``columns``: the histogram layout's feature columns; ``root_mass``: the root's noisy one-way
    mass; ``children``: (child, parent, conditional table ``P(child bin | parent bin)``) in
    sampling order; ``public``: the public sampler for coordinates outside the layout."""

    def __init__(self, columns: list[Any], root: int, root_mass: np.ndarray,
                 children: list[tuple[int, int, np.ndarray]], public: Any) -> None:
        self.columns, self.root, self.root_mass, self.children, self.public = columns, root, root_mass, children, public

    def _values(self, col: Any, bins: torch.Tensor, gen: torch.Generator) -> torch.Tensor:
        from dpsummary.private.marginals import NUM_INTERIOR_BINS

        n = bins.shape[0]
        if col.kind == "categorical":
            out = torch.zeros(n, col.width + 1, dtype=DTYPE)
            out[torch.arange(n), bins] = 1.0
            return out[:, : col.width]
        width = (col.upper - col.lower) / NUM_INTERIOR_BINS
        u = torch.rand(n, generator=gen, dtype=DTYPE)
        v = col.lower + (bins - 1).to(DTYPE) * width + u * width
        v = torch.where(bins == 0, torch.full_like(v, col.lower), v)
        v = torch.where(bins == NUM_INTERIOR_BINS + 1, torch.full_like(v, col.upper), v)
        return v[:, None]

    def __call__(self, n: int, gen: torch.Generator) -> torch.Tensor:
        out = self.public(n, gen)
        picks: dict[int, torch.Tensor] = {}
        probs = torch.as_tensor(self.root_mass / self.root_mass.sum(), dtype=DTYPE)
        picks[self.root] = torch.multinomial(probs, n, replacement=True, generator=gen)
        for child, parent, cond in self.children:
            rows = torch.as_tensor(cond, dtype=DTYPE)[picks[parent]]
            picks[child] = torch.multinomial(rows, 1, generator=gen)[:, 0]
        for k, col in enumerate(self.columns):
            out[:, col.start : col.start + col.width] = self._values(col, picks[k], gen)
        return out


def dp_tree_sampler(points: torch.Tensor, layout: Any, marginals: Any, public: Any, *, noise_multiplier: float,
                    generator: torch.Generator) -> TreeSampler:
    """``dp-tree``: one Gaussian release of every pairwise bin table of the layout's feature
    columns (each record adds 1 to one cell of each of the P tables: L2 sensitivity sqrt(P)),
    a maximum spanning tree of the noisy tables' mutual information (Chow-Liu), and conditional
    tables along it; the root's marginal is the release's own DP histogram."""
    cols = [c for c in layout.columns if not c.target]
    bins = [torch.as_tensor(c.record_bins(points)) for c in cols]
    k = len(cols)
    pairs = [(i, j) for i in range(k) for j in range(i + 1, k)]
    sd = noise_multiplier * math.sqrt(len(pairs))
    tables: dict[tuple[int, int], np.ndarray] = {}
    for i, j in pairs:
        t = torch.zeros(cols[i].num_bins, cols[j].num_bins, dtype=DTYPE)
        t.index_put_((bins[i], bins[j]), torch.ones(points.shape[0], dtype=DTYPE), accumulate=True)
        t = t + sd * torch.randn(t.shape, generator=generator, dtype=DTYPE)
        tables[(i, j)] = t.clamp_min(0.0).numpy()

    def mi(t: np.ndarray) -> float:
        p = t / max(t.sum(), 1e-12)
        pi, pj = p.sum(1, keepdims=True), p.sum(0, keepdims=True)
        with np.errstate(divide="ignore", invalid="ignore"):
            terms = np.where(p > 0, p * np.log(p / (pi * pj)), 0.0)
        return float(np.nansum(terms))

    weight = {key: mi(t) for key, t in tables.items()}
    in_tree, children = {0}, []
    while len(in_tree) < k:
        best = max(((i, j) for (i, j) in pairs if (i in in_tree) != (j in in_tree)), key=lambda e: weight[e])
        parent, child = best if best[0] in in_tree else (best[1], best[0])
        t = tables[best] if best[0] == parent else tables[best].T
        cond = t + 1e-9
        cond = cond / cond.sum(1, keepdims=True)
        children.append((child, parent, cond))
        in_tree.add(child)
    masses = [m for c, m in zip(layout.columns, marginals.masses(), strict=True) if not c.target]
    root_mass = masses[0] if masses[0] is not None else tables[(0, 1)].sum(1) + 1e-9
    return TreeSampler(cols, 0, root_mass, children, public)


def real_dispersion_k(table: Any) -> float:
    nf = table.model.num_features
    x, y = table.train[:, :nf], table.train[:, -1]
    mu = (table.model.design(x) @ table.full.mean).exp()
    inv_k = float((((y - mu) ** 2 - mu).sum() / (mu * mu).sum()).clamp_min(1e-6))
    return 1.0 / inv_k


def report(results: Path, target: Path) -> None:
    """The table of ``target`` (between its ``<!-- table -->`` markers) from ``results``: per
    feature source and epsilon, median and pooled coverage, the intercept's errors, width,
    effects found and wrong; the rest of ``target`` (the notes) is kept."""
    import statistics
    from collections import defaultdict

    groups: dict[tuple[str, str, str], list[dict[str, str]]] = defaultdict(list)
    with results.open() as fh:
        for r in csv.DictReader(fh):
            groups[(r["dataset"], r["features"], r["epsilon"])].append(r)
    lines = ["<!-- table -->",
             "| data | eps | bootstrap world | n | median coverage | pooled | intercept error (sds), per run | "
             "width / full | effects found / full | wrong (total) |",
             "|---|---|---|---|---|---|---|---|---|---|"]
    for (name, kind, eps), rows in sorted(groups.items(), key=lambda kv: (kv[0][0], float(kv[0][2]), kv[0][1])):
        cov = [float(r["coverage"]) for r in rows]
        coords = [len(r["z"].split()) for r in rows]
        pooled = sum(c * k for c, k in zip(cov, coords, strict=True)) / sum(coords)
        z0 = ", ".join(r["z"].split()[0] for r in rows)
        lines.append(f"| {name} | {float(eps):g} | {kind} | {len(rows)} | {statistics.median(cov):.0%} | {pooled:.0%} | "
                     f"{z0} | {statistics.median(float(r['width_ratio']) for r in rows):.0f} | "
                     f"{statistics.median(float(r['effects_found']) for r in rows):g} / "
                     f"{statistics.median(float(r['effects_full']) for r in rows):g} | "
                     f"{sum(int(r['effects_wrong']) for r in rows)} |")
    lines.append("<!-- /table -->")
    text = target.read_text() if target.exists() else "<!-- table -->\n<!-- /table -->\n"
    head, rest = text.split("<!-- table -->", 1)
    tail = rest.split("<!-- /table -->", 1)[1]
    target.write_text(head + "\n".join(lines) + tail)


def main() -> None:
    p = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    p.add_argument("--datasets", default="bike_rentals")
    p.add_argument("--epsilons", default="0.2,1.0")
    p.add_argument("--seeds", default="0,1,2")
    p.add_argument("--features", nargs="+", default=["oracle", "oracle-nb"])
    p.add_argument("--pool", type=int, default=50_000)
    p.add_argument("--out", type=Path, default=dpb.RESULTS / "dppsvi_feature_moments.csv")
    p.add_argument("--report", nargs=2, type=Path, metavar=("RESULTS", "TARGET"),
                   help="write the table of TARGET (markdown) from RESULTS and exit")
    a = p.parse_args()
    if a.report is not None:
        report(*a.report)
        return
    fields = ["dataset", "features", "epsilon", "seed", "coverage", "true_coverage", "width_ratio", "width_vs_floor",
              "effects_full", "effects_found", "floor_effects_found", "effects_wrong", "loo_coverage", "dispersion_k", "z"]
    new = not a.out.exists()
    with a.out.open("a", newline="") as fh:
        w = csv.DictWriter(fh, fieldnames=fields, extrasaction="ignore")
        if new:
            w.writeheader()
        for name in a.datasets.split(","):
            for seed in [int(s) for s in a.seeds.split(",")]:
                table = trust.load(name, seed)
                tf = dpb.table_transform(name, seed)
                nf = table.model.num_features
                x = table.train[:, :nf].to(DTYPE)
                for eps in [float(e) for e in a.epsilons.split(",")]:
                    raw_summary, settings, _ = dpb.mechanism(table, tf, eps)
                    for kind in a.features:
                        k_real = ""
                        model_override = None
                        if kind == "oracle":
                            fn = oracle(x)
                        elif kind == "oracle-nb":
                            fn = oracle(x)
                            k_real = real_dispersion_k(table)
                            model_override = OverdispersedPoisson(table.model, inv_k=1.0 / k_real)
                        elif kind == "dp-tree":
                            gen = torch.Generator().manual_seed(7000 + seed)
                            fn = dp_tree_sampler(table.train, settings.init_layout, settings.init_marginals,
                                                 tf.sample_public_features,
                                                 noise_multiplier=settings.init_noise_multiplier * math.sqrt(2.0),
                                                 generator=gen)
                        elif kind in ("dp", "dp-tilt"):
                            gen = torch.Generator().manual_seed(7000 + seed)
                            sigma = settings.init_noise_multiplier * math.sqrt(2.0)
                            feat, feat_sd, mean_y2 = dp_moments(x, table.train[:, -1].to(DTYPE),
                                                                feature_norm=table.feature_norm,
                                                                target_bound=table.target_bound,
                                                                noise_multiplier=sigma, generator=gen)
                            base = settings.init_marginals.sampler(tf.sample_public_features)
                            fn = tilt_sampler(base, feat, feat_sd, pool=a.pool, generator=gen)
                            k_real = f"ess {fn.ess:.0f}"
                            if kind == "dp":
                                model_override = OverdispersedPoisson(table.model, mean_y2=mean_y2)
                        else:
                            raise SystemExit(f"error: unknown feature source {kind}")
                        s2 = dataclasses.replace(settings, init_marginals=FixedFeatures(fn))
                        if model_override is not None:
                            import dpsummary.bootstrap as boot_mod

                            original = boot_mod.synthetic_table

                            def patched(st: Any, truth: torch.Tensor, num: int, g: torch.Generator,
                                        _o: Any = original, _m: Any = model_override) -> torch.Tensor:
                                return _o(dataclasses.replace(st, model=_m), truth, num, g)

                            boot_mod.synthetic_table = patched
                        boot = ParametricBootstrap(s2, BootstrapConfig(seed=1000 * seed + int(100 * eps)))
                        try:
                            result = boot.fit(raw_summary)
                        finally:
                            if model_override is not None:
                                boot_mod.synthetic_table = original
                        post = coreset_posterior(table.model, result.summary.points, result.summary.weights)
                        judged = trust.judge(table, post, eps, seed)
                        ef, found, wrong = dpb.effects(post, table.full)
                        row = {**judged, "dataset": name, "features": kind, "epsilon": eps, "seed": seed,
                               "effects_full": ef, "effects_found": found, "effects_wrong": wrong,
                               "loo_coverage": result.calibration.loo_coverage, "dispersion_k": k_real}
                        z = (post.mean - table.full.mean) / torch.diagonal(post.cov).sqrt()
                        row["z"] = " ".join(f"{v:+.1f}" for v in z.tolist())
                        w.writerow(row)
                        fh.flush()
                        print({k: (round(v, 3) if isinstance(v, float) else v) for k, v in row.items()
                               if k in fields}, flush=True)


if __name__ == "__main__":
    main()
