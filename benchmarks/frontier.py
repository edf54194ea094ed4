"""Issue 50: the measured frontier of each suite cell that is not honest.

For every DISHONEST cell of ``results/calibration.csv`` (issue 50's verdict), in the model space
of each of ``--releases`` fresh releases of that cell through the real release path (runs from
``--run``, not counted in the suite; every quantity is the median over them, since a
zero-configuration release's model space follows its DP schema), this decomposes the distance between the release and the idealised floor
(:func:`dpsummary.metrics.idealised_floor`, the suite's reference: known curvature, one score
release at the full-data mode, sensitivity the largest record score there, 0.8 of epsilon) into
the handicaps a real mechanism pays, each still with the curvature known and the anchor at the mode:

- ``floor``: the suite's floor (coverage, width x full data);
- ``public bound``: the same at the release's public score bound (the claim's feature norm and
  target bound through ``Model.statistic_bounds``) instead of the data's largest score;
- ``public bound, last round``: and at the noise multiplier of the release's best single score
  release (the smallest multiplier among the Newton rounds' events in the claim; the default's
  last round holds 0.45 of the rounds' budget), instead of 0.8 of epsilon;
- ``+ curvature released`` (:func:`curvature_released_floor`): and the curvature no longer known:
  released beside the score at the mode with the last round's curvature noise (its multiplier in
  the claim times the public curvature bound at the mode), read through the release's own
  posterior (each imputed curvature kept at its trace, :func:`dpsummary.noise_aware.imputed_posterior`).
  What is left between it and the release is the rounds' anchor (the expansion read away from the
  mode); between it and ``+ last round``, the price of releasing a d x d curvature.

Each is judged by the cell's own rule (issue 50's rules 1 and 3, :func:`frontier_honest`):
coverage at least the cell's threshold, and its expected wrong-sign effects over the cell's
released runs (each floor's mean per noise draw times the runs) within the suite floor's expected
count for those runs plus one. If the last one is dishonest, no mechanism that releases one score
at the Newton rounds' best share and public bound can be honest there even with the curvature and
the mode given: the cell's frontier is the design's budget shape, not its approximations. If it is
honest, the release loses its honesty to what the floor assumes away (the curvature's noise, the
anchor's distance from the mode, the count clip).

Then the next design's own floor (Kulkarni et al. 2021, ``../shared/notes/noise-aware-glm.md``):
a posterior that models the features' distribution reads ``T = sum_i z_i y_i`` through
``mu(theta) = N E_x[z m(z theta)]`` under its feature model. Without any privacy noise its mode
solves ``T = mu(theta) + P (theta - mu0)``; the distance of that mode from the full-data mean,
in full-data sds, is the bias the design carries at every budget from the feature model alone.
Three feature models, each fitted to the EXACT records (no noise, the most they could be):
``empirical`` (the records themselves: a check, the bias must be 0), ``gaussian`` (the exact mean
and covariance of the features; 200,000 draws, fixed seed) and ``marginals`` (each column's exact
empirical distribution, columns independent). The bias is also given in the floor's sds: above 2
the design misses that coordinate at the floor's width.

Usage::

    python benchmarks/frontier.py --out benchmarks/results/frontier.md [--tables T1,T2] [--run 900]
    python benchmarks/frontier.py --out benchmarks/results/frontier_wide.md --wide 2 --releases 1 --no-bias

``--wide X`` measures the honest cells whose median width exceeds X times the floor's instead
(honest and wide: where the width goes), ``--no-bias`` skips the feature-model biases.

It also writes the rows beside ``--out`` as CSV (``frontier.csv``), which the suite's report
(``calibration.py report``) cites beside each cell that is not honest.

Curator-side only (computes from the records); no release budget is involved beyond the fresh
release, which is a benchmark's, not a product's.
"""

from __future__ import annotations

import argparse
import csv
import math
import statistics
import sys
import tempfile
from pathlib import Path
from typing import Any

import torch

sys.path.insert(0, str(Path(__file__).resolve().parent))
import calibration as cal  # noqa: E402
from suite_verdict import WRONG_SIGN_SLACK  # noqa: E402

from dpsummary.gaussian import DTYPE  # noqa: E402
from dpsummary.metrics import Z95, data_hessian, idealised_floor  # noqa: E402
from dpsummary.noise_aware import (  # noqa: E402
    CurvatureSupport,
    RoundRelease,
    curvature_support,
    imputed_posterior,
    symmetric_noise,
    trace_kept_spectrum,
)
from dpsummary.noise_aware.posterior import prior_precision  # noqa: E402

#: Draws of the Gaussian feature model (fixed seed).
GAUSSIAN_DRAWS = 200_000
#: Newton steps of the feature-model mode at most (converged when the largest step is below 1e-10).
NEWTON_STEPS = 60


def rounds_best_multiplier(claim: dict[str, Any]) -> float:
    """The smallest Gaussian noise multiplier among the Newton rounds' events of a release's claim
    (the composed event): its best single score release."""
    composed = [e for e in claim["events"] if e.get("class_name") == "ComposedDpEvent"]
    if len(composed) != 1:
        raise ValueError("the claim has no single composed event of the rounds")
    return min(float(e["noise_multiplier"]) for e in composed[0]["events"] if "noise_multiplier" in e)


#: Noise draws of :func:`curvature_released_floor` (each with the posterior's own imputations).
CURVATURE_DRAWS = 20
#: The summary counts a cell's width as the curvature's price when the ``+ curvature`` floor is at
#: least the fresh releases' width divided by this.
WIDTH_PRICED = 1.25


def rounds_last_pair(claim: dict[str, Any]) -> tuple[float, float]:
    """The last Newton round's (score, curvature) noise multipliers: the last two events of the
    claim's composed event (:meth:`dpsummary.noise_aware.Schedule.events` lists each round's pair
    in order)."""
    composed = [e for e in claim["events"] if e.get("class_name") == "ComposedDpEvent"]
    if len(composed) != 1:
        raise ValueError("the claim has no single composed event of the rounds")
    mults = [float(e["noise_multiplier"]) for e in composed[0]["events"] if "noise_multiplier" in e]
    if len(mults) < 2:
        raise ValueError("the claim's composed event has no (score, curvature) pair")
    return mults[-2], mults[-1]


def curvature_released_floor(model: Any, points: torch.Tensor, full: Any, *, score_sd: float, curvature_sd: float,
                             score_bound: float, curvature_bound: float, draws: int = CURVATURE_DRAWS,
                             generator: torch.Generator, relations: torch.Tensor | None = None,
                             support: CurvatureSupport | None = None) -> dict[str, float]:
    """The ``+ curvature released`` floor (module docstring): ``draws`` releases at the full-data
    mode of the score sum plus ``N(0, score_sd^2)`` noise and the data curvature plus the
    mechanism's symmetric noise of sd ``curvature_sd``, each read by the release's imputed
    posterior (trace-kept spectrum, projected off ``relations``: the exact one-hot relations the
    release's claim lists; on the curvature's one-hot ``support`` when the release's schedule
    used it, the fortieth rule); coverage of the full-data mean, median sd over the full-data sd and
    wrong-sign effects per release, each the mean over draws."""
    m = full.mean.detach().to(DTYPE)
    d = m.shape[0]
    h = data_hessian(model, points, m)
    h = 0.5 * (h + h.T)
    g = model.record_scores(points, m).sum(0)
    sd_full = torch.sqrt(torch.diagonal(full.cov))
    cov_sum = wid_sum = wrong_sum = 0.0
    for _ in range(draws):
        rel = RoundRelease(anchor=m, score=g + score_sd * torch.randn(d, generator=generator, dtype=DTYPE),
                           curvature=h + symmetric_noise(d, curvature_sd, generator), score_bound=score_bound,
                           curvature_bound=curvature_bound, score_noise_std=score_sd, curvature_noise_std=curvature_sd)
        post = imputed_posterior(model, rel, generator=generator, spectrum=trace_kept_spectrum, relations=relations,
                                 support=support)
        sd = torch.sqrt(torch.diagonal(post.cov))
        cov_sum += float(((post.mean - m).abs() <= Z95 * sd).to(DTYPE).mean())
        wid_sum += float((sd / sd_full).median())
        lo, hi = post.mean - Z95 * sd, post.mean + Z95 * sd
        wrong_sum += float((((lo > 0) & (m < 0)) | ((hi < 0) & (m > 0))).sum())
    return {"coverage": cov_sum / draws, "width_ratio": wid_sum / draws, "wrong_sign": wrong_sum / draws}


def frontier_honest(coverage: float, wrong_per_release: float, *, threshold: float, runs: int,
                    floor_wrong: float | None) -> bool:
    """Whether a frontier floor would pass the cell's own verdict (issue 50's rules 1 and 3): its
    coverage reaches the cell's ``threshold`` and its expected wrong-sign effects over the cell's
    ``runs`` released runs exceed the suite floor's expected count over those runs
    (``floor_wrong``, None: not recorded, taken as 0 like the suite) by at most
    :data:`~suite_verdict.WRONG_SIGN_SLACK`."""
    return (coverage >= threshold - 1e-12
            and wrong_per_release * runs <= (floor_wrong or 0.0) + WRONG_SIGN_SLACK + 1e-9)


def feature_model_mode(model: Any, points: torch.Tensor, features: torch.Tensor, start: torch.Tensor
                       ) -> torch.Tensor:
    """The mode of ``theta^T T - (N / M) sum_s A(z_s theta) - (theta - mu0)^T P (theta - mu0) / 2``:
    the noise-free posterior mode given ``T = sum_i z_i y_i`` when the M rows ``features`` stand
    for the records' features (canonical-link GLMs: ``A' = m``, ``A'' = v``)."""
    n = points.shape[0]
    _, z_data = model.record_curvature_factors(points, start)
    t = z_data.T @ points[:, -1]
    synth = torch.cat([features, torch.zeros(features.shape[0], 1, dtype=DTYPE)], 1)
    _, z = model.record_curvature_factors(synth, start)
    scale = n / z.shape[0]
    p = prior_precision(model)
    mu0 = model.prior_mean.to(DTYPE)
    theta = start.clone()
    for _ in range(NEWTON_STEPS):
        eta = z @ theta
        d1, d2 = model.eta_derivatives(torch.zeros_like(eta), eta)
        mean, var = -d1, -d2
        grad = t - scale * (z.T @ mean) - p @ (theta - mu0)
        hess = scale * (z * var[:, None]).T @ z + p
        step = torch.linalg.solve(hess, grad)
        theta = theta + step
        if float(step.abs().max()) < 1e-10:
            break
    return theta


def feature_models(points: torch.Tensor, seed: int = 0) -> dict[str, torch.Tensor]:
    """The three feature models' rows (module docstring), from the exact records."""
    x = points[:, :-1]
    gen = torch.Generator().manual_seed(seed)
    mean = x.mean(0)
    cov = torch.cov(x.T).reshape(x.shape[1], x.shape[1])
    evals, evecs = torch.linalg.eigh(0.5 * (cov + cov.T))
    root = evecs * evals.clamp_min(0.0).sqrt()  # exact relations keep their zero variance
    gauss = mean + torch.randn(GAUSSIAN_DRAWS, x.shape[1], generator=gen, dtype=DTYPE) @ root.T
    marg = torch.stack([x[torch.randperm(x.shape[0], generator=gen), j] for j in range(x.shape[1])], 1)
    return {"empirical": x, "gaussian": gauss, "marginals": marg}


def cell_frontier(spec: Any, mode: str, epsilon: float, run: int, workdir: Path, bias: bool = True
                  ) -> dict[str, float]:
    """One fresh release of the cell and its frontier (module docstring), as a flat record."""
    data = cal.table_csv(spec)
    art = cal.release(spec, data, mode, epsilon, "noise-aware-newton", run, workdir)
    rel, ref = cal.artifact_reference(art, data, epsilon)
    judged = cal.judge_artifact(art, data, epsilon, sampled=False)
    model, pts, full = ref.model, ref.points, ref.full
    bounds = rel.claim["mechanism"]["bounds"]
    r_public = float(model.statistic_bounds(full.mean, feature_norm=float(bounds["feature_norm"]),
                                            target_bound=float(bounds["target_bound"]))[0])
    delta = float(rel.claim["delta_accounting"])
    kw = {"epsilon": epsilon, "delta": delta, "generator": torch.Generator().manual_seed(0)}
    floors = {
        "floor": ref.floor,
        "public_bound": idealised_floor(model, pts, full, sensitivity=r_public, **kw),  # type: ignore[arg-type]
        "last_round": idealised_floor(model, pts, full, sensitivity=r_public,  # type: ignore[arg-type]
                                      noise_multiplier=rounds_best_multiplier(rel.claim), **kw),
    }
    out = {"fresh_coverage": float(judged["coverage"]), "fresh_width_ratio": float(judged["width_ratio"]),
           "r_data": float(ref.floor.sensitivity), "r_public": r_public}
    for k, f in floors.items():
        out[f"{k}_coverage"], out[f"{k}_width_ratio"] = float(f.coverage), float(f.width_ratio)
        out[f"{k}_wrong_sign"] = float(f.wrong_sign)
    out["fresh_wrong_sign"] = float(judged["effects_wrong_sign"])
    score_mult, curvature_mult = rounds_last_pair(rel.claim)
    c_public = float(model.statistic_bounds(full.mean, feature_norm=float(bounds["feature_norm"]),
                                            target_bound=float(bounds["target_bound"]))[1])
    exact = rel.claim["mechanism"].get("exact_relations")  # the release's own (thirty-ninth rule), if any
    curv = curvature_released_floor(model, pts, full, score_sd=score_mult * r_public,
                                    curvature_sd=curvature_mult * c_public, score_bound=r_public,
                                    curvature_bound=c_public, generator=torch.Generator().manual_seed(0),
                                    relations=torch.tensor(exact, dtype=DTYPE) if exact else None,
                                    support=(curvature_support(rel.transform, model) if rel.transform is not None
                                             and "curvature_support" in rel.claim["mechanism"]["schedule"] else None))
    out.update({f"curvature_{k}": v for k, v in curv.items()})
    if not bias:
        return out
    sd_full = torch.sqrt(torch.diagonal(full.cov))
    for name, rows in feature_models(pts).items():
        err = (feature_model_mode(model, pts, rows, full.mean) - full.mean).abs()
        out[f"bias_{name}_full_sd"] = float((err / sd_full).max())
        out[f"bias_{name}_floor_sd"] = float((err / ref.floor.sd).max())
    return out


def median_frontier(spec: Any, mode: str, epsilon: float, runs: list[int], workdir: Path, bias: bool = True
                    ) -> dict[str, float]:
    """:func:`cell_frontier` over ``runs`` fresh releases, each quantity's median (a zero-configuration
    release's model space follows its DP schema, so its floors and biases vary with the release),
    but wrong-sign effects per release by their mean (a count whose median is 0 in most cells)."""
    records = [cell_frontier(spec, mode, epsilon, r, workdir, bias) for r in runs]
    return {k: (statistics.mean if k.endswith("_wrong_sign") else statistics.median)(r[k] for r in records)
            for k in records[0]}


def _f(v: float | None, nd: int = 2) -> str:
    return "-" if v is None or (isinstance(v, float) and math.isnan(v)) else f"{v:.{nd}f}"


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    ap.add_argument("--results", type=Path, default=cal.RESULTS / "calibration.csv")
    ap.add_argument("--tables", help="only these tables' cells")
    ap.add_argument("--run", type=int, default=900, help="the first fresh release's run id (its --seed)")
    ap.add_argument("--releases", type=int, default=4, help="fresh releases per cell (medians)")
    ap.add_argument("--wide", type=float, default=None,
                    help="measure the HONEST cells wider than this many times the floor instead")
    ap.add_argument("--no-bias", dest="bias", action="store_false", help="skip the feature-model biases")
    ap.add_argument("--out", type=Path, required=True)
    a = ap.parse_args()
    with a.results.open(newline="") as fh:
        rows = list(csv.DictReader(fh))
    cells = cal.cells(rows)
    keep = set(a.tables.split(",")) if a.tables else None

    def chosen(c: Any) -> bool:
        if a.wide is None:
            return bool(c.verdict == "DISHONEST")
        return bool(c.verdict == "HONEST" and c.width_vs_floor is not None and c.width_vs_floor > a.wide)

    todo = [c for k, c in sorted(cells.items(), key=lambda kv: cal._order(kv[0]))
            if chosen(c) and (keep is None or k[0] in keep)]
    flags = (f" --wide {a.wide:g}" if a.wide is not None else "") + ("" if a.bias else " --no-bias")
    which = ("the suite's cells that are not honest" if a.wide is None
             else f"the suite's honest cells wider than {a.wide:g}x the idealised floor")
    lines = [
        f"# The measured frontier of {which} (issue 50)",
        "",
        f"Generated by `python benchmarks/frontier.py --out {cal._rel(a.out)} --releases {a.releases}{flags}` from "
        f"`{cal._rel(a.results)}` and {a.releases} fresh",
        f"release{'s' if a.releases != 1 else ''} per cell (runs {a.run}-{a.run + a.releases - 1}, the real release "
        "path, not counted in the suite; every entry the median over them). The method is the",
        "script's docstring. Coverage and width are each posterior's against the full-data posterior",
        "(width: median sd over the full-data sd). `suite`: the cell's verdict rows; `fresh`: the fresh",
        "releases' pseudocoreset posterior; `floor`: the suite's idealised floor; `public bound`: the floor",
        "at the release's public score bound; `+ last round`: and at the noise multiplier of the rounds'",
        "best single score release; `+ curvature`: and the curvature released beside it at the last round's",
        "curvature noise, read by the release's imputed posterior (the anchor still at the mode).",
        "`wrong / release`: wrong-sign effects per release (the fresh releases'",
        "count; each floor's mean over its noise draws), judged like the suite over the cell's runs: at most",
        "the suite floor's expected count + 1. `R data / R public`: the two sensitivities."
        + (" Feature-model bias: the" if a.bias else ""),
    ]
    if a.bias:
        lines += ["noise-free mode of the next design under each feature model, its largest error in full-data sds",
                  "(and in the floor's sds)."]
    head = ("| table | mode | epsilon | threshold | suite coverage / width | fresh | floor | public bound | + last round "
            "| + curvature | wrong / release: suite, fresh, floor, public bound, + last round, + curvature "
            "| verdict at + last round, + curvature | R data / R public |")
    ncol = 13
    if a.bias:
        head += " bias: empirical | gaussian | marginals |"
        ncol += 3
    lines += ["", head, "|" + "---|" * ncol]
    honest_last = 0
    honest_curvature = 0
    curvature_priced = 0
    records: list[dict[str, Any]] = []
    with tempfile.TemporaryDirectory() as tmp:
        for c in todo:
            name, _kind, mode, eps, _mech = c.key
            spec = cal.TABLES[name]
            print(f"{name} {mode} {eps:g} ...", flush=True)
            try:
                fr = median_frontier(spec, mode, float(eps), list(range(a.run, a.run + a.releases)), Path(tmp),
                                     a.bias)
            except Exception as exc:  # a refused fresh release: say so and go on
                lines.append(f"| {name} | {mode} | {eps:g} | {c.threshold:.2f} | {_f(c.coverage)} / {_f(c.width)}x "
                             f"| {type(exc).__name__}: {str(exc)[:60]} |" + " |" * (ncol - 6))
                continue

            def cw(k: str, fr: dict[str, float] = fr) -> str:
                return f"{fr[k + '_coverage']:.2f} / {fr[k + '_width_ratio']:.2f}x"

            reached = frontier_honest(fr["last_round_coverage"], fr["last_round_wrong_sign"], threshold=c.threshold,
                                      runs=c.released, floor_wrong=c.floor_wrong)
            reached_curvature = frontier_honest(fr["curvature_coverage"], fr["curvature_wrong_sign"],
                                                threshold=c.threshold, runs=c.released, floor_wrong=c.floor_wrong)
            suite_wrong = c.wrong_sign / c.released if c.released else float("nan")
            wrongs = ", ".join(_f(v) for v in (suite_wrong, fr["fresh_wrong_sign"], fr["floor_wrong_sign"],
                                                fr["public_bound_wrong_sign"], fr["last_round_wrong_sign"],
                                                fr["curvature_wrong_sign"]))
            row = (f"| {name} | {mode} | {eps:g} | {c.threshold:.2f} | {_f(c.coverage)} / {_f(c.width)}x | {cw('fresh')} | "
                   f"{cw('floor')} | {cw('public_bound')} | {cw('last_round')} | {cw('curvature')} | {wrongs} | "
                   f"{'honest' if reached else 'not'}, {'honest' if reached_curvature else 'not'} | "
                   f"{fr['r_data']:.2f} / {fr['r_public']:.2f} |")
            if a.bias:
                row += " " + " | ".join(f"{fr[f'bias_{k}_full_sd']:.2f} ({fr[f'bias_{k}_floor_sd']:.2f})"
                                        for k in ("empirical", "gaussian", "marginals")) + " |"
            lines.append(row)
            print(lines[-1], flush=True)
            records.append({"table": name, "mode": mode, "epsilon": eps, "threshold": c.threshold,
                            "releases": a.releases, "suite_runs": c.released, "suite_floor_wrong": c.floor_wrong,
                            "suite_width_ratio": c.width, **fr, "last_round_honest": int(reached),
                            "curvature_honest": int(reached_curvature)})
            honest_last += reached
            honest_curvature += reached_curvature
            curvature_priced += fr["curvature_width_ratio"] >= fr["fresh_width_ratio"] / WIDTH_PRICED
    if a.wide is None:
        lines += ["", f"Cells whose `+ last round` floor passes the cell's verdict (coverage and wrong signs): "
                  f"{honest_last} of {len(todo)}; whose `+ curvature` floor does (today's posterior with the anchor "
                  f"at the mode: the rounds' anchor is what the release loses): {honest_curvature} of {len(todo)}."]
    lines += ["", f"Cells whose `+ curvature` floor is at least 1/{WIDTH_PRICED:g} of the fresh releases' width "
              f"(their width is the price of releasing the curvature, not of the rounds' anchor): "
              f"{curvature_priced} of {len(records)}."]
    a.out.parent.mkdir(parents=True, exist_ok=True)
    tmp_out = a.out.with_suffix(".tmp")
    tmp_out.write_text("\n".join(lines) + "\n")
    tmp_out.replace(a.out)
    if records:
        csv_out = a.out.with_suffix(".csv")
        tmp_csv = csv_out.with_suffix(".csv.tmp")
        with tmp_csv.open("w", newline="") as fh:
            w = csv.DictWriter(fh, fieldnames=list(records[0]))
            w.writeheader()
            w.writerows(records)
        tmp_csv.replace(csv_out)
    print("\n".join(lines))


if __name__ == "__main__":
    main()
