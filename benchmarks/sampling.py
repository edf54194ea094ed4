"""Do the draws analysts get represent the released posterior, and how fast are they? (issue 48)

For releases of the calibration suite's tables (the first run of each table's public-schema cell
at one epsilon, released by :func:`calibration.release`, exactly as the suite does):

* ``Release.sample()`` at its default (NUTS at its default settings; for linear regression,
  whose default is independent draws by quadrature over log sigma, those) with ``--seeds`` seeds, each against an
  independent reference of the pseudocoreset's exact weighted posterior: importance sampling from
  a multivariate t around its Laplace approximation when that reaches ``MIN_IS_ESS`` effective
  draws (low dimensions), else one long NumPyro NUTS run of the exporter's program (a second
  library; 4 chains of 5,000). Recorded: the largest |mean - reference| in reference sds, the sd
  ratio range, R-hat, bulk and tail ESS, divergences, the seconds per 1,000 draws.
* The exact posterior against the signed Gaussian (issue 48, item 5): what the artifact's
  ``pseudocoreset_match`` recorded, and the same measured from the reference.
* ``--exporters``: the exporters' samplers (NumPyro, PyMC with its default sampler, PyStan) on the
  same releases, 4 chains x 1,000 draws after 1,000 warm-up each, their agreement with the
  reference and their seconds per 1,000 draws (compilation excluded where the library separates it).

``--match A.json,B.json``: moment matching (:func:`dpsummary.constructors.moment_match.match_moments`)
re-run on each artifact's signed Gaussian, ``--seeds`` times, so that two versions of the code can
be compared on the same targets (paired): ``--code TREE`` imports ``dpsummary`` from another
checkout (``git worktree add /tmp/old COMMIT``). Appends the recorded agreement, iterations and
seconds to ``results/moment_match.csv`` (notebook: ``moment_match_stopping.md``).

``--sample-check A.json,B.json``: ``Release.sample()`` at its defaults (4 chains, 1,000 warm-up
steps, 1,000 draws each), ``--seeds`` seeds from 1, on each artifact against a long BlackJAX
run of the same posterior with a dense mass matrix (4 x 5,000 draws after 1,000 warm-up steps,
seed 12345), so that two versions of the sampler can be compared on the same draws' seeds
(``--code TREE`` as above); appends to ``results/sampling_mass_matrix.csv`` (notebook:
``moment_match_stopping.md``, session 65).

Run: ``python benchmarks/sampling.py --tables napsu_adult,adult --exporters`` (the timing table at
d = 7 and d = 106), ``python benchmarks/sampling.py --suite`` (every suite table's first release;
``--skip adult --seeds 2 --epsilon 1 --out benchmarks/results/sampling_suite.csv`` for the
committed suite table); writes ``benchmarks/results/sampling.csv`` and ``sampling.md``.
"""

from __future__ import annotations

import argparse
import csv
import os
import sys
import time
import warnings
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import numpy as np
import torch

sys.path.insert(0, str(Path(__file__).resolve().parent))
sys.path.insert(0, str(Path(__file__).resolve().parents[1]))

import calibration  # noqa: E402

RESULTS = Path(__file__).resolve().parent / "results"
MIN_IS_ESS = 4000.0
FIELDS = ["table", "d", "epsilon", "sampler", "seed", "reference", "reference_ess", "mean_error_sd_max",
          "sd_ratio_min", "sd_ratio_max", "rhat_max", "ess_bulk_min", "ess_tail_min", "divergences",
          "seconds_per_1000", "signed_mean_error_sd_max", "signed_sd_ratio_min", "signed_sd_ratio_max",
          "recorded_mean_error_sd", "recorded_sd_ratio_min", "recorded_sd_ratio_max"]


def importance_reference(rel: Any, draws: int = 200_000, seed: int = 0) -> tuple[np.ndarray, np.ndarray, float]:
    """Mean, sd and ESS of the exact weighted posterior by importance sampling
    (:func:`dpsummary.sampling.reference.importance_moments`, proposal on the Laplace posterior)."""
    from dpsummary.inference import coreset_posterior
    from dpsummary.sampling.reference import importance_moments

    points, weights = rel.nonzero()
    est = importance_moments(rel.model, points, weights, coreset_posterior(rel.model, points, weights), draws=draws,
                             generator=torch.Generator().manual_seed(seed))
    return est.mean.numpy(), est.sd.numpy(), est.ess


def numpyro_draws(rel: Any, *, warmup: int, draws: int, seed: int) -> tuple[np.ndarray, float]:
    """Draws ``(chains, draws, d)`` of the NumPyro exporter's program and its sampling seconds."""
    from dpsummary.export import neutral
    from dpsummary.export.templates import numpyro_model as nm

    data = nm.from_document(neutral.to_neutral(rel))
    t0 = time.perf_counter()
    mcmc = nm.run_nuts(data, num_warmup=warmup, num_samples=draws, num_chains=4, seed=seed)
    values = np.asarray(mcmc.get_samples(group_by_chain=True)["theta"], dtype=np.float64)
    return values, time.perf_counter() - t0


def pymc_draws(rel: Any, *, seed: int) -> tuple[np.ndarray, float]:
    import pymc as pm

    from dpsummary.export import neutral
    from dpsummary.export.templates import pymc_model as pm_model

    doc = neutral.to_neutral(rel)
    with pm_model.build_model(pm_model.from_document(doc)):
        t0 = time.perf_counter()
        idata = pm.sample(1000, tune=1000, chains=4, cores=1, random_seed=seed, progressbar=False)
        secs = time.perf_counter() - t0
    values = np.asarray(idata.posterior["theta"], dtype=np.float64)
    return values, secs


def stan_draws(rel: Any, *, seed: int) -> tuple[np.ndarray, float]:
    from dpsummary.export import neutral, stan

    doc = neutral.to_neutral(rel)
    posterior = stan.pystan_posterior(doc, random_seed=seed)
    t0 = time.perf_counter()
    fit = posterior.sample(num_chains=4, num_samples=1000, num_warmup=1000)
    secs = time.perf_counter() - t0
    flat = np.asarray(fit["theta"], dtype=np.float64).T  # (draws * chains, D), chain after chain
    return flat.reshape(4, 1000, -1), secs


def compare(values: np.ndarray, mean: np.ndarray, sd: np.ndarray) -> dict[str, float]:
    from dpsummary.sampling import diagnose

    flat = values.reshape(-1, values.shape[-1])
    ratio = flat.std(0, ddof=1) / sd
    diag = diagnose(values)
    return {"mean_error_sd_max": float(np.max(np.abs(flat.mean(0) - mean) / sd)), "sd_ratio_min": float(ratio.min()),
            "sd_ratio_max": float(ratio.max()), "rhat_max": float(np.nanmax(diag.rhat)),
            "ess_bulk_min": float(diag.ess_bulk.min()), "ess_tail_min": float(diag.ess_tail.min())}


def release_of(table: str, epsilon: float, workdir: Path, mode: str = "public") -> Path:
    spec = calibration.TABLES[table]
    data = calibration.table_csv(spec)
    art = calibration.release(spec, data, mode, epsilon, "noise-aware-newton", 0, workdir)
    os.environ["DPSUMMARY_HOME"] = str(workdir / "home")
    return art


def bench_table(table: str, epsilon: float, seeds: int, exporters: bool, workdir: Path, mode: str = "public",
                artifact: Path | None = None) -> list[dict[str, Any]]:
    import dpsummary

    art = artifact or release_of(table, epsilon, workdir, mode)
    rel = dpsummary.load(art, allow_unsigned=True)
    rows: list[dict[str, Any]] = []
    mean, sd, ess = importance_reference(rel)
    reference = "importance sampling"
    if ess < MIN_IS_ESS:
        long, _ = numpyro_draws(rel, warmup=2000, draws=5000, seed=12345)
        flat = long.reshape(-1, rel.dim)
        mean, sd, ess = flat.mean(0), flat.std(0, ddof=1), float(compare(long, flat.mean(0), flat.std(0))["ess_bulk_min"])
        reference = "NumPyro NUTS 4x5000"
    base = {"table": table, "d": rel.dim, "epsilon": epsilon, "reference": reference, "reference_ess": round(ess)}
    signed = rel.signed_gaussian()
    if signed is not None:
        m, s = signed.mean.numpy(), np.sqrt(np.diagonal(signed.cov.numpy()))
        r = sd / s
        base.update(signed_mean_error_sd_max=float(np.max(np.abs(mean - m) / s)), signed_sd_ratio_min=float(r.min()),
                    signed_sd_ratio_max=float(r.max()))
    match = (rel.body.get("posterior") or {}).get("pseudocoreset_match") or {}
    base.update(recorded_mean_error_sd=match.get("max_mean_error_sd"), recorded_sd_ratio_min=match.get("sd_ratio_min"),
                recorded_sd_ratio_max=match.get("sd_ratio_max"))
    exact = getattr(rel.model, "exact_draws", None) is not None
    for seed in range(seeds):
        with warnings.catch_warnings():
            warnings.simplefilter("ignore")
            t0 = time.perf_counter()
            if exact:  # linear regression: sample()'s default is independent draws by quadrature, no MCMC
                values = np.asarray(rel.sample(4000, seed=seed), dtype=np.float64).reshape(4, 1000, rel.dim)
                divergences: Any = ""
            else:
                drawn = rel.sample(4000, seed=seed, return_draws=True)
                values, divergences = drawn.values, drawn.diagnostics.divergences
            secs = time.perf_counter() - t0
        sampler = "sample() (exact, quadrature)" if exact else "sample() (BlackJAX NUTS)"
        row = {**base, "sampler": sampler, "seed": seed, **compare(values, mean, sd),
               "divergences": divergences, "seconds_per_1000": secs / 4.0}
        what = "independent draws" if exact else drawn.diagnostics.summary()
        print(f"{table} d={rel.dim} seed {seed}: {what}; mean error "
              f"{row['mean_error_sd_max']:.3f} sd, sd ratio {row['sd_ratio_min']:.3f}-{row['sd_ratio_max']:.3f} "
              f"({secs:.1f} s incl. any compile)", flush=True)
        rows.append(row)
    if exporters:
        for name, fn in (("NumPyro (exporter)", lambda: numpyro_draws(rel, warmup=1000, draws=1000, seed=0)),
                         ("PyMC (exporter)", lambda: pymc_draws(rel, seed=0)),
                         ("PyStan (exporter)", lambda: stan_draws(rel, seed=0))):
            try:
                values, secs = fn()
            except Exception as exc:  # noqa: BLE001 - a missing optional sampler is recorded, not fatal
                print(f"{table}: {name} failed: {type(exc).__name__}: {exc}", flush=True)
                continue
            rows.append({**base, "sampler": name, "seed": 0, **compare(values, mean, sd), "divergences": "",
                         "seconds_per_1000": secs / 4.0})
            print(f"{table}: {name}: {rows[-1]['mean_error_sd_max']:.3f} sd, {secs / 4:.1f} s / 1000 draws", flush=True)
    return rows


def write_md(rows: list[dict[str, Any]], path: Path) -> None:
    def f(v: Any, nd: int = 3) -> str:
        return "-" if v in (None, "") else (f"{float(v):.{nd}f}" if isinstance(v, float | int | str) else str(v))

    lines = ["# Sampling: the draws analysts get against the exact posterior (issue 48)", "",
             "Generated by `python benchmarks/sampling.py` (module docstring: what is measured and how). "
             "Criteria: `sample()` within 0.1 reference sds and 10% of the reference sds for every seed; "
             "the exact posterior within 0.05 sd and 3% of the signed Gaussian.", "",
             "| table | d | eps | sampler | seed | reference (ESS) | max mean error (sd) | sd ratio | max R-hat | "
             "min bulk / tail ESS | div. | s per 1,000 draws | exact vs signed: mean (sd) / sd ratio | "
             "recorded by the release |",
             "|---|---|---|---|---|---|---|---|---|---|---|---|---|---|"]
    for r in rows:
        lines.append(
            f"| {r['table']} | {r['d']} | {r['epsilon']} | {r['sampler']} | {r['seed']} | {r['reference']} "
            f"({r['reference_ess']}) | {f(r['mean_error_sd_max'])} | {f(r['sd_ratio_min'])}-{f(r['sd_ratio_max'])} | "
            f"{f(r['rhat_max'])} | {f(r['ess_bulk_min'], 0)} / {f(r['ess_tail_min'], 0)} | {r['divergences']} | "
            f"{f(r['seconds_per_1000'], 2)} | {f(r.get('signed_mean_error_sd_max'))} / "
            f"{f(r.get('signed_sd_ratio_min'))}-{f(r.get('signed_sd_ratio_max'))} | "
            f"{f(r.get('recorded_mean_error_sd'))} / {f(r.get('recorded_sd_ratio_min'))}-{f(r.get('recorded_sd_ratio_max'))} |")
    path.write_text("\n".join(lines) + "\n")


def main(argv: list[str] | None = None) -> None:
    ap = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    ap.add_argument("--tables", default="napsu_adult")
    ap.add_argument("--suite", action="store_true", help="every table of the calibration suite")
    ap.add_argument("--skip", default="", help="with --suite: comma-separated tables to leave out")
    ap.add_argument("--epsilon", type=float, default=1.0)
    ap.add_argument("--mode", default="public")
    ap.add_argument("--seeds", type=int, default=5)
    ap.add_argument("--first-seed", type=int, default=1, help="with --match: generator seeds first..first+seeds-1")
    ap.add_argument("--judge-reference", nargs=2, metavar=("BEFORE", "AFTER"),
                    help="rule 2' on results/moment_match_reference.csv: the two arms' `code` labels")
    ap.add_argument("--reference", action="store_true",
                    help="with --match: also measure each chosen pseudocoreset by a long dense NUTS run "
                         "(results/moment_match_reference.csv)")
    ap.add_argument("--exporters", action="store_true")
    ap.add_argument("--artifact", type=Path, help="judge this artifact instead of releasing (with --tables ONE)")
    ap.add_argument("--workdir", type=Path, default=Path(".cache/sampling"))
    ap.add_argument("--out", type=Path, default=RESULTS / "sampling.csv")
    ap.add_argument("--match", help="comma-separated artifacts: re-run moment matching on their signed Gaussians")
    ap.add_argument("--sample-check", help="comma-separated artifacts: sample() at its defaults against a long dense run")
    ap.add_argument("--code", type=Path, help="with --match or --sample-check: import dpsummary from this checkout")
    args = ap.parse_args(argv)
    if args.judge_reference:
        print(judge_reference(RESULTS / "moment_match_reference.csv", *args.judge_reference))
        return
    if args.match:
        if args.code:
            sys.path.insert(0, str(args.code.resolve()))
        bench_match([Path(a) for a in args.match.split(",")], args.seeds,
                    RESULTS / ("moment_match_reference.csv" if args.reference else "moment_match.csv"),
                    version=calibration.code_version() if args.code is None else f"tree:{args.code}",
                    first_seed=args.first_seed, reference=args.reference)
        return
    if args.sample_check:
        if args.code:
            sys.path.insert(0, str(args.code.resolve()))
        bench_sample_defaults([Path(a) for a in args.sample_check.split(",")], args.seeds,
                              RESULTS / "sampling_mass_matrix.csv",
                              version=calibration.code_version() if args.code is None else f"tree:{args.code}")
        return
    skip = set(filter(None, args.skip.split(",")))
    tables = [t for t in calibration.TABLES if t not in skip] if args.suite else args.tables.split(",")
    args.workdir.mkdir(parents=True, exist_ok=True)
    rows: list[dict[str, Any]] = []
    for t in tables:
        try:
            rows += bench_table(t, args.epsilon, args.seeds, args.exporters, args.workdir, args.mode, args.artifact)
        except Exception as exc:  # noqa: BLE001 - a refused release is recorded in the log, the rest goes on
            print(f"{t}: not benchmarked: {type(exc).__name__}: {exc}", flush=True)
    new = args.out.exists()
    with args.out.open("a", newline="") as fh:
        w = csv.DictWriter(fh, fieldnames=FIELDS, extrasaction="ignore")
        if not new:
            w.writeheader()
        w.writerows(rows)
    with args.out.open(newline="") as fh:
        write_md(list(csv.DictReader(fh)), args.out.with_suffix(".md"))


SAMPLE_CHECK_FIELDS = ["artifact", "d", "seed", "code", "mass_matrix", "mean_error_sd_max", "sd_ratio_min",
                      "sd_ratio_max", "rhat_max", "ess_bulk_min", "ess_tail_min", "divergences", "mean_tree_steps",
                      "seconds", "reference_ess_bulk_min"]


def dense_settings(num_warmup: int, draws_per_chain: int) -> Any:
    """NUTS settings with a dense mass matrix in the code under test (a checkout from before the
    ``mass_matrix`` setting adapts a dense one anyway)."""
    import dataclasses

    from dpsummary.sampling import NutsSettings

    cfg = NutsSettings(num_warmup=num_warmup, draws_per_chain=draws_per_chain)
    if any(f.name == "mass_matrix" for f in dataclasses.fields(NutsSettings)):
        cfg = dataclasses.replace(cfg, mass_matrix="dense")
    return cfg


def loaded_targets(artifacts: list[Path]) -> Iterator[tuple[Path, Any, Any]]:
    """``(path, release, signed Gaussian)`` of each artifact (unsigned allowed), saying which
    ``dpsummary`` is imported (``--code``); artifacts without a signed Gaussian are skipped."""
    import dpsummary
    from dpsummary.analyst import load

    print(f"dpsummary from {Path(dpsummary.__file__).parent}", flush=True)
    for art in artifacts:
        os.environ.setdefault("DPSUMMARY_HOME", str(art.parent / "home"))
        rel = load(art, allow_unsigned=True)
        target = rel.signed_gaussian()
        if target is None:
            print(f"{art.name}: no signed Gaussian", flush=True)
            continue
        yield art, rel, target


def bench_sample_defaults(artifacts: list[Path], seeds: int, out: Path, *, version: str) -> None:
    """``Release.sample()`` at its defaults against a long dense BlackJAX run (module docstring)."""
    from dpsummary.sampling import NutsSettings, sample_posterior

    rows = []
    for art, rel, target in loaded_targets(artifacts):
        points, weights = rel.nonzero()
        ref = sample_posterior(rel.model, points, weights, start=target, settings=dense_settings(1000, 5000), seed=12345)
        flat = ref.flat()
        mean, sd = flat.mean(0), flat.std(0, ddof=1)
        try:
            from dpsummary.sampling.nuts import mass_matrix_is_dense
            form = "dense" if mass_matrix_is_dense(rel.dim, NutsSettings()) else "diagonal"
        except ImportError:
            form = "dense"
        for seed in range(1, seeds + 1):
            with warnings.catch_warnings():
                warnings.simplefilter("ignore")
                t0 = time.perf_counter()
                drawn = rel.sample(4000, seed=seed, return_draws=True)
                secs = time.perf_counter() - t0
            row = {"artifact": art.name, "d": rel.dim, "seed": seed, "code": version, "mass_matrix": form,
                   **compare(drawn.values, mean, sd), "divergences": drawn.diagnostics.divergences,
                   "mean_tree_steps": round(drawn.mean_tree_steps, 1), "seconds": round(secs, 1),
                   "reference_ess_bulk_min": round(float(np.nanmin(ref.diagnostics.ess_bulk)))}
            print(row, flush=True)
            rows.append(row)
    new = not out.exists()
    with out.open("a", newline="") as fh:
        w = csv.DictWriter(fh, fieldnames=SAMPLE_CHECK_FIELDS, extrasaction="ignore")
        if new:
            w.writeheader()
        w.writerows(rows)


MATCH_FIELDS = ["artifact", "d", "seed", "code", "iterations", "max_mean_error_sd", "sd_ratio_min", "sd_ratio_max",
                "agrees", "estimator", "seconds"]
REFERENCE_FIELDS = ["reference_mean_error_sd", "reference_sd_ratio_min", "reference_sd_ratio_max",
                    "reference_agrees", "reference_ess_bulk_min"]
#: The common reference of ``--match --reference`` (notebook ``moment_match_stopping.md``, rule 2'):
#: the same settings and seed in every arm, a dense mass matrix from a 500-draw last window.
REFERENCE_WARMUP, REFERENCE_DRAWS_PER_CHAIN, REFERENCE_SEED = 1000, 10_000, 424242


def reference_agreement(model: Any, points: torch.Tensor, weights: torch.Tensor, target: Any) -> dict[str, Any]:
    """A chosen pseudocoreset's exact posterior against its signed Gaussian, by the common
    reference run (dense mass matrix wherever the code under test can be asked for one)."""
    from dpsummary.sampling import sample_posterior

    drawn = sample_posterior(model, points, weights, start=target,
                             settings=dense_settings(REFERENCE_WARMUP, REFERENCE_DRAWS_PER_CHAIN), seed=REFERENCE_SEED)
    flat = drawn.flat()
    m = target.mean.detach().numpy()
    sd = np.sqrt(np.diag(target.cov.detach().numpy()))
    err = float(np.max(np.abs(flat.mean(0) - m) / sd))
    ratio = flat.std(0, ddof=1) / sd
    return {"reference_mean_error_sd": round(err, 4), "reference_sd_ratio_min": round(float(ratio.min()), 4),
            "reference_sd_ratio_max": round(float(ratio.max()), 4),
            "reference_agrees": err <= 0.05 and float(np.max(np.abs(ratio - 1.0))) <= 0.03,
            "reference_ess_bulk_min": round(float(np.nanmin(drawn.diagnostics.ess_bulk)))}


def judge_reference(path: Path, before: str, after: str) -> str:
    """Rule 2' (notebook ``moment_match_stopping.md``) on the paired rows of ``path``: pairs are
    (artifact, seed) present in both arms; the reference's figures decide."""
    rows = list(csv.DictReader(path.open()))
    arms = {code: {(r["artifact"], r["seed"]): r for r in rows if r["code"] == code} for code in (before, after)}
    keys = sorted(set(arms[before]) & set(arms[after]))
    if not keys:
        return "no pairs"

    def dev(r: dict[str, str]) -> float:
        return max(abs(float(r["reference_sd_ratio_min"]) - 1.0), abs(float(r["reference_sd_ratio_max"]) - 1.0))

    d_mean = [float(arms[after][k]["reference_mean_error_sd"]) - float(arms[before][k]["reference_mean_error_sd"])
              for k in keys]
    d_sd = [dev(arms[after][k]) - dev(arms[before][k]) for k in keys]
    secs = {c: sum(float(arms[c][k]["seconds"]) for k in keys) for c in (before, after)}
    within = {c: (sum(arms[c][k]["reference_agrees"] == "True" for k in keys),
                  sum(arms[c][k]["agrees"] == "True" for k in keys)) for c in (before, after)}
    a = float(np.mean(d_mean)) <= 0.01 and float(np.mean(d_sd)) <= 0.005
    b = max(d_mean) <= 0.05 and max(d_sd) <= 0.02
    c = secs[after] < secs[before]
    lines = [f"{len(keys)} pairs",
             f"a'. mean change: largest mean error {np.mean(d_mean):+.4f} sd (limit +0.01), largest sd deviation "
             f"{np.mean(d_sd):+.4f} (limit +0.005): {'met' if a else 'FAILED'}",
             f"b'. worst pair: {max(d_mean):+.4f} sd (limit +0.05), {max(d_sd):+.4f} (limit +0.02): "
             f"{'met' if b else 'FAILED'}",
             f"c'. seconds {secs[before]:.0f} -> {secs[after]:.0f}: {'met' if c else 'FAILED'}",
             f"within the criterion (reference; recorded): before {within[before]}, after {within[after]}",
             "ADOPTED (with d)" if a and b and c else "NOT ADOPTED"]
    return "\n".join(lines)


def bench_match(artifacts: list[Path], seeds: int, out: Path, *, version: str, first_seed: int = 1,
                reference: bool = False) -> None:
    """Moment matching re-run on each artifact's signed Gaussian under the model's own prior (the
    release's ``model_prior_scale``), with generator seeds ``first_seed..first_seed+seeds-1``;
    with ``reference``, each chosen pseudocoreset also measured by :func:`reference_agreement`.
    Rows appended to ``out``."""
    from dpsummary.constructors.moment_match import match_moments

    rows = []
    for art, rel, target in loaded_targets(artifacts):
        spec = rel.model.spec()
        scale = ((rel.body.get("posterior") or {}).get("pseudocoreset_match") or {}).get("model_prior_scale")
        if scale is not None:
            spec["prior_scale"] = scale
        del spec["name"]
        model = type(rel.model)(spec.pop("num_features"), **spec)
        for seed in range(first_seed, first_seed + seeds):
            start = time.perf_counter()
            m = match_moments(model, target, size=rel.summary.size, generator=torch.Generator().manual_seed(seed))
            if m is None:
                print(f"{art.name}: the closed-form construction does not apply", flush=True)
                break
            row = {"artifact": art.name, "d": int(target.mean.shape[0]), "seed": seed, "code": version,
                   "iterations": m.iterations, "max_mean_error_sd": round(m.max_mean_error_sd, 4),
                   "sd_ratio_min": round(m.sd_ratio_min, 4), "sd_ratio_max": round(m.sd_ratio_max, 4),
                   "agrees": m.agrees, "estimator": m.estimator, "seconds": round(time.perf_counter() - start, 1)}
            if reference:
                row.update(reference_agreement(m.model, m.points, m.weights, target))
            print(row, flush=True)
            rows.append(row)
    new = not out.exists()
    with out.open("a", newline="") as fh:
        w = csv.DictWriter(fh, fieldnames=MATCH_FIELDS + (REFERENCE_FIELDS if reference else []))
        if new:
            w.writeheader()
        w.writerows(rows)


if __name__ == "__main__":
    main()
