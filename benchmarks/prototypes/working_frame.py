"""Prototype (not a product path): the default mechanism run in a 0/1 working frame for the
columns a public schema declares numeric ``[0, 1]``, with the analyst's prior carried over exactly.

Why (issue 37, item 3; ``benchmarks/results/noise_aware_variants.md``, thirteenth rule): the public
transform maps a ``[0, 1]`` column to ``{-1, +1}``, so every record of a table of indicators sits
at a corner of the box and its score and curvature have the box's largest norm: a DP bound on the
features' norm (candidate N) cannot help. Coded 0/1, rare or mutually exclusive indicators give
small norms (the NAPSU-MQ problem's four race indicators and ``male``: at most 2 of 5 set), which a
DP quantile of that block's norm can bound. Coding the released model 0/1 instead would change
the analyst's prior (``N(0, 1)`` per 0/1 unit is half the +-1 coding's scale: measured, it shrinks
`sim_rare`'s rare effects and covers 0.64 at epsilon 0.3), so here the frame is a reparametrisation
inside the mechanism:

* design rows ``z_w = (1, x_w)`` with ``x_w = (x + 1) / 2`` on the ``[0, 1]`` columns, so
  ``eta = theta_m . z_m = theta_w . z_w`` with ``theta_w = T theta_m`` (intercept
  ``theta_0 - sum_B theta_j``, ``2 theta_j`` on those columns);
* the prior ``N(T mu, T T^T s^2)`` (``dpsummary.noise_aware.prior_precision``'s non-isotropic
  path), so the posterior is the same model's;
* one Gaussian histogram (5% of the optimisation's rho, taken from the rounds in proportion) of
  the norm of the ``[0, 1]`` block over the public geometric bins of
  :func:`dpsummary.postprocess.count_range.norm_edges`; the rounds' feature norm is
  ``sqrt(rest^2 + clip^2)`` with ``rest`` the box's bound on the other coordinates;
* the posterior mapped back, ``theta_m = T^-1 theta_w``, and judged like every calibration run.

Noise: OS entropy (``SystemRandomness``) through the package's mechanisms; the records are the
public-schema model-space rows (``noise_aware_variants._table``). Utility only.

    python benchmarks/prototypes/working_frame.py --table napsu_adult --epsilons 0.1,0.3,1,3 --runs 6
"""

from __future__ import annotations

import argparse
import csv
import dataclasses
import math
import statistics
import sys
from pathlib import Path
from typing import Any

import torch

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))
import calibration as cal  # noqa: E402
import noise_aware_variants as nv  # noqa: E402

from dpsummary import accounting as acc  # noqa: E402
from dpsummary import noise_aware as na  # noqa: E402
from dpsummary.gaussian import DTYPE, GaussianPosterior  # noqa: E402
from dpsummary.models import get_model_class  # noqa: E402
from dpsummary.postprocess.count_range import norm_clip, norm_edges  # noqa: E402
from dpsummary.private.marginals import ColumnBins, HistogramLayout  # noqa: E402
from dpsummary.private.mechanism import PrivateRecords, SystemRandomness  # noqa: E402
from dpsummary.private.score_stats import noisy_score_statistics  # noqa: E402

#: The block histogram's share of rho (the thirteenth rule's).
SHARE = 0.05


def unit_columns(name: str) -> list[int]:
    """Model-space feature coordinates of the columns the public schema declares numeric [0, 1]."""
    spec = cal.TABLES[name]
    schema = cal.public_schema(spec, cal.table_csv(spec))
    out, at = [], 0
    for col in schema["columns"]:
        if col["name"] == schema["target"]:
            continue
        if col["kind"] == "numeric":
            if col.get("lower") == 0.0 and col.get("upper") == 1.0:
                out.append(at)
            at += 1
        else:
            at += len(col.get("categories") or [])
    return out


def frame(d: int, block: list[int]) -> torch.Tensor:
    """``T`` with ``theta_w = T theta_m`` (intercept first; feature j is parameter j + 1)."""
    t = torch.eye(d, dtype=DTYPE)
    for j in block:
        t[0, j + 1] = -1.0
        t[j + 1, j + 1] = 2.0
    return t


class FramedLogistic(get_model_class("logistic")):  # type: ignore[misc]
    """Logistic regression in the working frame, with the analyst's prior carried over."""

    def __init__(self, num_features: int, t: torch.Tensor, base: Any) -> None:
        super().__init__(num_features)
        self._t = t
        self.prior_precision_matrix = torch.linalg.inv(t @ t.T) / base.prior_scale**2
        self._mean = t @ base.prior_mean

    @property
    def prior_mean(self) -> torch.Tensor:
        return self._mean.clone()


def fit_framed(name: str, epsilon: float, delta: float) -> GaussianPosterior:
    model, pts, fn, tb = nv._table(name)
    block = unit_columns(name)
    if not block or block != list(range(block[0], block[0] + len(block))):
        raise SystemExit(f"{name}: needs a contiguous block of [0, 1] columns (got {block})")
    d = model.param_dim
    t = frame(d, block)
    work = pts.clone()
    work[:, block] = (work[:, block] + 1.0) / 2.0
    wmodel = FramedLogistic(model.num_features, t, model)
    base = na.Schedule.default(model)
    sched = dataclasses.replace(base, rounds=tuple((s * (1 - SHARE), c * (1 - SHARE)) for s, c in base.rounds),
                                feature_range=SHARE)
    count = acc.gaussian_event(acc.calibrate_part(target_epsilon=nv.COUNT_SHARE * epsilon, delta=delta))
    sigma, _ = na.calibrate(sched, target_epsilon=epsilon, delta=delta, prior_events=[count])
    rnd = SystemRandomness()
    box = math.sqrt(len(block))
    layout = HistogramLayout((ColumnBins("unit block", "norm", block[0], len(block), edges=norm_edges(box)),),
                             model.num_features)
    noisy = PrivateRecords(work, randomness=rnd).noisy_marginals(layout, noise_multiplier=sched.range_multiplier(sigma))
    clip = norm_clip(noisy, box).bound
    rest2 = max(fn**2 - len(block), 0.0)
    feature_norm = math.sqrt(rest2 + clip**2)

    def release(theta: torch.Tensor, sb: float, cb: float, sm: float, cm: float) -> tuple[torch.Tensor, torch.Tensor]:
        st = noisy_score_statistics(work, rnd, wmodel, theta, score_bound=sb, curvature_bound=cb,
                                    score_noise_multiplier=sm, curvature_noise_multiplier=cm)
        return st.score, st.curvature

    bounds = na.public_bounds(wmodel, feature_norm=feature_norm, target_bound=tb)
    res = na.fit(wmodel, release, bounds, schedule=sched, sigma=sigma, feature_norm=feature_norm, target_bound=tb,
                 generator=torch.Generator().manual_seed(0))
    back = torch.linalg.inv(t)
    mean = back @ res.posterior.mean
    cov = back @ res.posterior.cov @ back.T
    return GaussianPosterior(mean, torch.linalg.cholesky(0.5 * (cov + cov.T)))


def main() -> None:
    p = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    p.add_argument("--table", default="napsu_adult")
    p.add_argument("--epsilons", default="0.1,0.3,1,3")
    p.add_argument("--runs", type=int, default=6)
    p.add_argument("--delta", type=float, default=1e-6)
    p.add_argument("--out", type=Path, default=None)
    a = p.parse_args()
    model, pts, fn, tb = nv._table(a.table)
    rows = []
    for eps in [float(e) for e in a.epsilons.split(",")]:
        ref = cal.reference(model, pts, epsilon=eps, delta=a.delta, key=a.table)
        for variant in ("default", "frame"):
            for run in range(a.runs):
                post = (nv._fit(model, pts, fn, tb, eps, a.delta).posterior if variant == "default"
                        else fit_framed(a.table, eps, a.delta))
                j = cal.judge(post, ref)
                rows.append({"table": a.table, "epsilon": eps, "variant": variant, "run": run, **{
                    k: j[k] for k in ("coverage", "width_ratio", "floor_width_ratio", "floor_coverage", "effects_found",
                                      "floor_effects_found", "effects_wrong_sign")}})
            cell = [r for r in rows if r["epsilon"] == eps and r["variant"] == variant]
            print(f"{a.table} eps {eps:g} {variant:8s} coverage {statistics.median(r['coverage'] for r in cell):.2f} "
                  f"(min {min(r['coverage'] for r in cell):.2f}) width {statistics.median(r['width_ratio'] for r in cell):.2f} "
                  f"(floor {cell[0]['floor_width_ratio']:.2f}, floor cov {cell[0]['floor_coverage']:.2f}) effects "
                  f"{statistics.median(r['effects_found'] for r in cell):.1f}/{cell[0]['floor_effects_found']:.1f} wrong "
                  f"{sum(r['effects_wrong_sign'] for r in cell)}", flush=True)
    if a.out is not None:
        with a.out.open("a", newline="") as fh:
            w = csv.DictWriter(fh, fieldnames=list(rows[0]))
            if fh.tell() == 0:
                w.writeheader()
            w.writerows(rows)


if __name__ == "__main__":
    main()
