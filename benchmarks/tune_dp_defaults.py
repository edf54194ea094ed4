"""Choose DP-PSVI's default hyperparameters on SYNTHETIC data only (no private data touched).

Defaults tuned on the private data would leak (Papernot & Steinke 2022), so the release's
defaults (clip multiplier, learning rate, theta scale for the synthetic initialisation) are
picked here, on data simulated from the models with features that look like transformed tables
(numerics uniform on [-1, 1], one-hot blocks). Run:

    python benchmarks/tune_dp_defaults.py --out benchmarks/results/tune_dp_defaults.csv
"""

from __future__ import annotations

import argparse
import csv
import itertools
import time
from pathlib import Path

import torch

from dpsummary.constructors import fit
from dpsummary.metrics import evaluate, full_posterior
from dpsummary.models import DTYPE, LogisticRegression, PoissonRegression
from dpsummary.private.accounting import calibrate_noise_multiplier
from dpsummary.private.dppsvi import DPPSVI
from dpsummary.private.mechanism import PrivateRecords
from dpsummary.private.noise import quantize_sample_rate


def table_like_features(n: int, numeric: int, blocks: list[int], g: torch.Generator) -> torch.Tensor:
    cols = [torch.rand(n, numeric, generator=g, dtype=DTYPE) * 2 - 1]
    for k in blocks:
        idx = torch.randint(0, k, (n,), generator=g)
        cols.append(torch.nn.functional.one_hot(idx, k).to(DTYPE))
    return torch.cat(cols, 1)


def synthetic(kind: str, n: int, seed: int):
    g = torch.Generator().manual_seed(1000 + seed)
    numeric, blocks = 5, [4, 6, 3]
    f = numeric + sum(blocks)
    feats = table_like_features(n + 2000, numeric, blocks, g)
    if kind == "logistic":
        model = LogisticRegression(f)
        theta = torch.randn(f + 1, generator=g, dtype=DTYPE) * 0.7
        theta[0] = -1.0
    else:
        model = PoissonRegression(f)
        theta = torch.randn(f + 1, generator=g, dtype=DTYPE) * 0.3
        theta[0] = 3.0
    pts = model.simulate(theta, n + 2000, g, features=feats)
    sampler_gen_feats = (numeric, blocks)
    return model, pts[:n], pts[n:], sampler_gen_feats


def main() -> None:
    ap = argparse.ArgumentParser()
    ap.add_argument("--out", type=Path, default=Path("benchmarks/results/tune_dp_defaults.csv"))
    ap.add_argument("--seeds", type=int, default=2)
    args = ap.parse_args()
    rows = []
    grid = {
        "kind": ["logistic", "poisson"],
        "epsilon": [0.2, 1.0],
        "clip_multiplier": [3.0, 10.0, 30.0],
        "lr": [0.2],
        "theta_scale": [0.3],
    }
    n, size, steps, batch, delta = 20000, 50, 300, 200, 1e-7
    q = quantize_sample_rate(batch / n)
    for kind, eps in itertools.product(grid["kind"], grid["epsilon"]):
        sigma = calibrate_noise_multiplier(target_epsilon=eps, delta=delta, sample_rate=q, steps=steps)
        for seed in range(args.seeds):
            model, train, test, (numeric, blocks) = synthetic(kind, n, seed)
            fp = full_posterior(model, train)
            point_scale = None
            if kind == "poisson":
                point_scale = tuple([1.0] * model.num_features + [float(train[:, -1].mean())])
            def sampler(m: int, g: torch.Generator, numeric=numeric, blocks=blocks) -> torch.Tensor:
                return table_like_features(m, numeric, blocks, g)
            for cm, lr, ts in itertools.product(grid["clip_multiplier"], grid["lr"], grid["theta_scale"]):
                c = DPPSVI(noise_multiplier=sigma, sample_rate=q, record_count=n, steps=steps,
                           points_lr=lr, weights_lr=lr, clip_multiplier=cm, theta_scale=ts,
                           feature_sampler=sampler, point_scale=point_scale)
                t0 = time.perf_counter()
                s = fit(c, PrivateRecords(train), model, size, generator=torch.Generator().manual_seed(seed))
                e = evaluate(model, s.points, s.weights, fp, test=test)
                row = {"kind": kind, "epsilon": eps, "seed": seed, "clip_multiplier": cm, "lr": lr,
                       "theta_scale": ts, "kl_fwd_norm": e["forward_normalised"],
                       "kl_rev_norm": e["reverse_normalised"], "test_loglik": e["test_loglik"],
                       "seconds": time.perf_counter() - t0}
                rows.append(row)
                print(row, flush=True)
    args.out.parent.mkdir(parents=True, exist_ok=True)
    with args.out.open("w", newline="") as fh:
        w = csv.DictWriter(fh, fieldnames=list(rows[0]))
        w.writeheader()
        w.writerows(rows)


if __name__ == "__main__":
    main()
