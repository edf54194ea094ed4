"""Calibrated DP-PSVI (issue 28): coverage, width and effects found, raw vs parametric bootstrap.

For every table, epsilon and seed: the release's DP-PSVI (the release's own planning,
:func:`dpsummary.mechanisms.dp_psvi_setup.plan_initialisation`, the accountant's noise multiplier,
:func:`dpsummary.mechanisms.dp_psvi_setup.initial_samplers`, :func:`dpsummary.mechanisms.dp_psvi_setup.dp_psvi_constructor`, the
product's ``SystemRandomness``) on the training rows with the count and schema public, then the
bootstrap (:mod:`dpsummary.bootstrap`) on its output only. Both posteriors (raw pseudocoreset, and
the calibrated pseudocoreset an analyst loads by default) and the default mechanism
(noise-aware-newton, its Gaussian) are judged by
:func:`dpsummary.metrics.trust_report` through ``benchmarks/trust.py``'s harness (its tables,
full-data posteriors and ``judge``), plus "effects found": coordinates whose full-data 95%
interval excludes 0 and whose release interval excludes 0 with the same sign (``wrong``: the
release's interval excludes 0 with the opposite sign, or excludes 0 where the full-data one does
not).

Usage::

    python benchmarks/dppsvi_bootstrap.py run --datasets german_credit,sim_logistic_1e4 --seeds 0,1,2,3,4
    python benchmarks/dppsvi_bootstrap.py zero-config --datasets adult --seeds 0,1,2   # real CLI releases
    python benchmarks/dppsvi_bootstrap.py report benchmarks/results/dppsvi_bootstrap.csv \
        benchmarks/results/dppsvi_bootstrap.md
"""

from __future__ import annotations

import argparse
import csv
import statistics
import sys
import time
from collections import defaultdict
from pathlib import Path
from typing import Any

import torch

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT))
sys.path.insert(0, str(ROOT / "benchmarks"))

import calibration  # noqa: E402
import trust  # noqa: E402

from dpsummary import accounting as acc  # noqa: E402
from dpsummary.bootstrap import (  # noqa: E402
    DEFAULT_REPLICATES,
    DEFAULT_ROUNDS,
    BootstrapConfig,
    MechanismSettings,
    ParametricBootstrap,
)
from dpsummary.gaussian import GaussianPosterior  # noqa: E402
from dpsummary.inference import coreset_posterior  # noqa: E402
from dpsummary.metrics import Z95  # noqa: E402

RESULTS = ROOT / "benchmarks" / "results"
FIELDS = ["dataset", "method", "epsilon", "seed", "replicates", "coverage", "true_coverage", "width_ratio",
          "mean_error_sd_median", "kl_full_summary", "effects_full", "effects_found", "effects_wrong",
          "floor_width_ratio", "width_vs_floor", "floor_effects_found", "effects_vs_floor",
          "mechanism_seconds", "bootstrap_seconds", "loo_coverage", "mc_se_coverage", "match_kl", "pooled_slope",
          "param_dim"]


def sim_transform(name: str) -> Any:
    """The public schema of ``trust.simulated`` tables (numerics in [-1, 1], 2 x 4 categories)."""
    from dpsummary.data import ColumnSpec, Schema, Transform

    cols = [ColumnSpec(name=f"x{j}", kind="numeric", lower=-1.0, upper=1.0) for j in range(trust.SIM_NUMERIC)]
    cols += [ColumnSpec(name=f"c{c}", kind="categorical", categories=[f"c{c}_{k}" for k in range(trust.SIM_LEVELS)])
             for c in range(trust.SIM_CATEGORICAL)]
    if "logistic" in name:
        cols.append(ColumnSpec(name="y", kind="categorical", categories=["0", "1"], positive="1"))
    else:
        cols.append(ColumnSpec(name="y", kind="numeric", lower=0.0, upper=trust.SIM_COUNT_BOUND, integer=True))
    return Transform.from_schema(Schema(columns=cols, target="y"))


def table_transform(name: str, seed: int) -> Any:
    if name.startswith("sim_"):
        return sim_transform(name)
    from dpsummary.data import Transform
    from dpsummary.experiment import prepare_public_dataset

    return Transform.from_dict(prepare_public_dataset(trust.DATA / f"{name}.csv", seed=seed,
                                                      transform="schema").transform)


def effects(post: GaussianPosterior, full: GaussianPosterior) -> tuple[int, int, int]:
    def sign(p: GaussianPosterior) -> torch.Tensor:
        sd = torch.sqrt(torch.diagonal(p.cov))
        return torch.where(p.mean - Z95 * sd > 0, 1, torch.where(p.mean + Z95 * sd < 0, -1, 0))

    s, f = sign(post), sign(full)
    found = int(((s == f) & (f != 0)).sum())
    wrong = int(((s != 0) & (s != f)).sum())
    return int((f != 0).sum()), found, wrong


def mechanism(table: trust.Table, tf: Any, epsilon: float,
              init_models: frozenset[str] | None = None) -> tuple[Any, MechanismSettings, float]:
    """The release's DP-PSVI on the table's training rows (count and schema public).

    ``init_models``: the models that get the DP initialisation histograms (None: the release's
    :data:`~dpsummary.mechanisms.dp_psvi_setup.DP_INITIALISATION_MODELS`); the
    ``--init-models`` experiment of issue 28 (Poisson features for the bootstrap)."""
    from dpsummary.constructors.base import fit
    from dpsummary.mechanisms.base import (
        DEFAULT_EXPECTED_BATCH,
        DEFAULT_NUM_SAMPLES,
        DEFAULT_SIZE,
        DEFAULT_STEPS,
    )
    from dpsummary.mechanisms.dp_psvi_setup import (
        dp_psvi_constructor,
        initial_samplers,
        plan_initialisation,
    )
    from dpsummary.policy import default_policy
    from dpsummary.private.mechanism import PrivateRecords
    from dpsummary.private.noise import quantize_sample_rate

    n = table.train.shape[0]
    share = default_policy().budget_split.normalised(count=False, preprocessing=False)["initialisation"]
    q = quantize_sample_rate(min(1.0, DEFAULT_EXPECTED_BATCH / n))
    extra = {} if init_models is None else {"models": init_models}
    init_sigma, layout, before = plan_initialisation(tf, table.model.name, prior_events=[],
                                                     target_epsilon=share * epsilon, delta=trust.DELTA,
                                                     accountant="rdp", **extra)
    sigma = acc.calibrate_noise_multiplier(target_epsilon=epsilon, delta=trust.DELTA, sample_rate=q,
                                           steps=DEFAULT_STEPS, prior_events=before)
    t0 = time.perf_counter()
    records = PrivateRecords(table.train)
    start = initial_samplers(records, tf, layout, init_sigma)
    marginals = getattr(start, "marginals", None)
    c = dp_psvi_constructor(transform=tf, model=table.model, noise_multiplier=sigma, sample_rate=q,
                            record_count=n, steps=DEFAULT_STEPS, num_samples=DEFAULT_NUM_SAMPLES,
                            init_features=start.features, init_targets=start.targets)
    summary = fit(c, records, table.model, DEFAULT_SIZE, generator=torch.Generator().manual_seed(0),
                  transform=tf.to_dict())
    records.close()
    seconds = time.perf_counter() - t0
    settings = MechanismSettings(model=table.model, transform=tf, size=DEFAULT_SIZE, steps=DEFAULT_STEPS,
                                 num_samples=DEFAULT_NUM_SAMPLES, noise_multiplier=sigma, sample_rate=q,
                                 record_count=float(n), init_noise_multiplier=init_sigma, init_layout=layout,
                                 init_marginals=marginals)
    return summary, settings, seconds


def default_mechanism(table: trust.Table, epsilon: float) -> Any:
    """The default mechanism (noise-aware-newton, its default schedule) on the training rows, as
    ``benchmarks/trust.py`` runs it (the public feature norm and target bound passed through)."""
    return trust.noise_aware_fit(table, epsilon)[0]


def run(out: Path, datasets: list[str], epsilons: list[float], seeds: list[int], replicates: int,
        rounds: int, workers: int | None, init_models: frozenset[str] | None = None) -> None:
    out.parent.mkdir(parents=True, exist_ok=True)
    new = not out.exists()
    with out.open("a", newline="") as fh:
        w = csv.DictWriter(fh, fieldnames=FIELDS, extrasaction="ignore")
        if new:
            w.writeheader()
        for name in datasets:
            for seed in seeds:
                table = trust.load(name, seed)
                tf = table_transform(name, seed)
                for eps in epsilons:
                    raw_summary, settings, mech_s = mechanism(table, tf, eps, init_models)
                    boot = ParametricBootstrap(settings, BootstrapConfig(replicates=replicates, rounds=rounds,
                                                                         workers=workers,
                                                                         seed=1000 * seed + int(100 * eps)))
                    result = boot.fit(raw_summary)
                    base = {"dataset": name, "epsilon": eps, "seed": seed, "param_dim": table.model.param_dim,
                            "mechanism_seconds": round(mech_s, 2), "replicates": replicates * rounds}
                    cal = result.calibration
                    t1 = time.perf_counter()
                    default_fit = default_mechanism(table, eps)
                    default_s = time.perf_counter() - t1
                    for label, post in (
                        ("dp-psvi raw", coreset_posterior(table.model, raw_summary.points, raw_summary.weights)),
                        ("dp-psvi calibrated", coreset_posterior(table.model, result.summary.points,
                                                                 result.summary.weights)),
                        ("noise-aware-newton (default; Gaussian)", default_fit.posterior),
                    ):
                        judged = trust.judge(table, post, eps, seed)
                        ef, found, wrong = effects(post, table.full)
                        row = {**base, **judged, "method": label, "effects_full": ef, "effects_found": found,
                               "effects_wrong": wrong}
                        if label.startswith("noise-aware"):
                            row.update(mechanism_seconds=round(default_s, 2), replicates="")
                        if label.endswith("calibrated"):
                            row.update({"bootstrap_seconds": round(result.seconds, 2),
                                        "loo_coverage": cal.loo_coverage, "mc_se_coverage": cal.loo_coverage_se,
                                        "match_kl": cal.match_symmetric_kl, "pooled_slope": cal.fit.slope_pooled})
                        w.writerow(row)
                        fh.flush()
                        print({k: (round(v, 3) if isinstance(v, float) else v) for k, v in row.items()
                               if k in ("dataset", "method", "epsilon", "seed", "coverage", "true_coverage",
                                        "width_ratio", "width_vs_floor", "effects_full", "effects_found",
                                        "floor_effects_found", "effects_wrong", "mechanism_seconds",
                                        "bootstrap_seconds", "match_kl")}, flush=True)


#: A permissive copy of the packaged default policy for the zero-configuration sweep.
ZERO_CONFIG_DATA = {"adult": ROOT / "examples" / "adult.csv", "bike_rentals": trust.DATA / "bike_rentals.csv"}


def zero_config(out: Path, datasets: list[str], epsilons: list[float], seeds: list[int], workdir: Path) -> None:
    """Zero configuration: real CLI releases (``dpsummary release --epsilon E data.csv``, private
    count and schema, the packaged default policy with a large lifetime budget), once with
    ``--mechanism dp-psvi`` and once with the default mechanism, per seed. Each artifact is
    judged in its own model space: the CSV encoded by the artifact's public transform, its
    full-data posterior and the idealised floor at the artifact's epsilon and accounting delta."""
    import os
    import subprocess

    workdir.mkdir(parents=True, exist_ok=True)
    from data_paths import write_sweep_policy

    pol = write_sweep_policy(workdir)
    env = {**os.environ, "DPSUMMARY_HOME": str(workdir / "home")}
    os.environ["DPSUMMARY_HOME"] = env["DPSUMMARY_HOME"]  # this process verifies the artifacts with that key
    exe = Path(sys.executable).parent / "dpsummary"
    new = not out.exists()
    with out.open("a", newline="") as fh:
        w = csv.DictWriter(fh, fieldnames=FIELDS, extrasaction="ignore")
        if new:
            w.writeheader()
        for name in datasets:
            for eps in epsilons:
                for seed in seeds:
                    for mech in ("dp-psvi", "default"):
                        art = workdir / f"{name}_{eps:g}_{seed}_{mech}.json"
                        t0 = time.perf_counter()
                        if not art.exists():
                            subprocess.run([str(exe), "release", "--epsilon", f"{eps:g}", str(ZERO_CONFIG_DATA[name]),
                                            "--policy", str(pol), "--out", str(art), "--seed", str(seed),
                                            *(["--mechanism", "dp-psvi"] if mech == "dp-psvi" else [])],
                                           check=False, env=env, stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL)
                        seconds = time.perf_counter() - t0
                        if not art.exists():
                            print(f"no artifact: {name} eps {eps} seed {seed} {mech}", flush=True)
                            continue
                        # The calibration suite's judge: the artifact's own model space, full-data
                        # posterior and floor at its epsilon and accounting delta (seed 0).
                        rel, ref = calibration.artifact_reference(art, ZERO_CONFIG_DATA[name], eps)
                        model, claim = ref.model, rel.claim
                        kinds = [("dp-psvi calibrated", rel.summary),
                                 ("dp-psvi raw", calibration.artifact_reference(art, ZERO_CONFIG_DATA[name], eps,
                                                                                posterior="raw")[0].summary)] \
                            if mech == "dp-psvi" else [("noise-aware-newton (default)", rel.summary)]
                        cal = claim["mechanism"].get("calibration") or {}
                        for label, s in kinds:
                            post = coreset_posterior(model, s.points, s.weights)
                            rep = calibration.judge(post, ref)
                            row = {**rep, "dataset": f"{name} (zero-config)", "method": label, "epsilon": eps,
                                   "seed": seed, "param_dim": model.param_dim, "effects_wrong": rep["effects_wrong_sign"],
                                   "mechanism_seconds": round(seconds, 1)}
                            if label.endswith("calibrated"):
                                row.update(replicates=cal.get("replicates"), loo_coverage=cal.get("bootstrap_coverage_leave_one_out"),
                                           mc_se_coverage=cal.get("monte_carlo_se_of_coverage"),
                                           match_kl=cal.get("match_symmetric_kl"), pooled_slope=cal.get("pooled_slope"))
                            w.writerow(row)
                            fh.flush()
                            print({k: (round(v, 3) if isinstance(v, float) else v) for k, v in row.items()
                                   if k in ("dataset", "method", "epsilon", "seed", "coverage", "width_ratio",
                                            "width_vs_floor", "effects_full", "effects_found", "floor_effects_found",
                                            "effects_wrong", "mechanism_seconds", "match_kl")}, flush=True)


def _median(rows: list[dict[str, str]], key: str) -> float | None:
    vals = [float(r[key]) for r in rows if r.get(key) not in (None, "")]
    return statistics.median(vals) if vals else None


def _fmt(v: float | None, pct: bool = False) -> str:
    if v is None:
        return "-"
    return f"{100 * v:.0f}%" if pct else f"{v:.3g}"


def report(results: Path, target: Path, command: str) -> None:
    rows = list(csv.DictReader(results.open()))
    groups: dict[tuple[str, str, str], list[dict[str, str]]] = defaultdict(list)
    for r in rows:
        method = r["method"]
        if method == "dp-psvi calibrated" and r.get("replicates"):
            method = f"dp-psvi calibrated, B = {r['replicates']}"
        elif method == "dp-psvi raw":
            r = {**r, "replicates": ""}
        groups[(r["dataset"], r["epsilon"], method)].append(r)
    lines = [
        "# Calibrated DP-PSVI by parametric bootstrap (issue 28)", "",
        f"Commands: `{command}`, then `python benchmarks/dppsvi_bootstrap.py report "
        "benchmarks/results/dppsvi_bootstrap.csv benchmarks/results/dppsvi_bootstrap.md`.", "",
        "Public schema (count and schema public): the release's DP-PSVI code path on the table's "
        "training rows (`run`); zero configuration: real CLI releases, private count and schema "
        "(`zero-config`, judged in each artifact's own model space). M = 50, the release's default "
        "DP-PSVI settings (T = 500, S = 100, expected batch 200, default budget split). Medians over "
        "seeds (n). Coverage: share of coordinates whose central 95% interval contains the full-data "
        "posterior mean (true cov.: the true parameter, simulated tables). Width: median sd / "
        "full-data sd; / floor: over the idealised floor's (`dpsummary.metrics.idealised_floor`). "
        "Effects: coordinates whose full-data 95% interval excludes 0 (full), found by the release "
        "with the same sign, the floor's expected count, and wrong (the release excludes 0 with the "
        "other sign or where the full-data interval does not). The default mechanism "
        "(noise-aware-newton) is judged by its Gaussian in `run` and by its artifact in "
        "`zero-config`. Mech. s: the mechanism's own time (zero-config: the whole CLI release, "
        "bootstrap included); boot s: the bootstrap's wall time on 2 worker processes (shared "
        "2-core machine with other jobs running: load average 3-7); LOO cov.: the calibration "
        "rule's leave-one-out coverage inside the bootstrap (before widening) and its Monte Carlo "
        "se; KL: symmetric KL of the matched pseudocoreset to the calibrated Gaussian.", "",
        "| data | eps | method | n | coverage | true cov. | width | / floor | effects full / found / floor / "
        "wrong | mech. s | boot s | B | LOO cov. (MC se) | match KL |",
        "|---|---|---|---|---|---|---|---|---|---|---|---|---|---|",
    ]
    for key in sorted(groups, key=lambda k: (k[0], float(k[1]), k[2])):
        g = groups[key]
        lines.append(
            f"| {key[0]} | {key[1]} | {key[2]} | {len(g)} | {_fmt(_median(g, 'coverage'), True)} | "
            f"{_fmt(_median(g, 'true_coverage'), True)} | {_fmt(_median(g, 'width_ratio'))} | "
            f"{_fmt(_median(g, 'width_vs_floor'))} | {_fmt(_median(g, 'effects_full'))} / "
            f"{_fmt(_median(g, 'effects_found'))} / {_fmt(_median(g, 'floor_effects_found'))} / "
            f"{_fmt(_median(g, 'effects_wrong'))} | "
            f"{_fmt(_median(g, 'mechanism_seconds'))} | {_fmt(_median(g, 'bootstrap_seconds'))} | "
            f"{g[0].get('replicates') or '-'} | {_fmt(_median(g, 'loo_coverage'), True)} "
            f"({_fmt(_median(g, 'mc_se_coverage'), True)}) | {_fmt(_median(g, 'match_kl'))} |")
    lines += ["", "## Target: coverage >= 90% (true parameter on simulated tables)", "",
              "| data | eps | calibrated (replicates) | raw | default mechanism |", "|---|---|---|---|---|"]
    for (ds, eps, method), g in sorted(groups.items(), key=lambda kv: (kv[0][0], float(kv[0][1]))):
        if not method.startswith("dp-psvi calibrated"):
            continue
        cov_key = "true_coverage" if ds.startswith("sim_") else "coverage"
        cov = _median(g, cov_key)
        raw = _median(groups.get((ds, eps, "dp-psvi raw"), []), cov_key)
        default = [v for (d2, e2, m2), v in groups.items() if d2 == ds and e2 == eps and m2.startswith("noise-aware")]
        dcov = _median(default[0], cov_key) if default else None
        ok = cov is not None and cov >= 0.9
        lines.append(f"| {ds} | {eps} | {method[len('dp-psvi calibrated, '):] or '-'}: "
                     f"{'met' if ok else 'MISSED'} ({_fmt(cov, True)}) | {_fmt(raw, True)} | "
                     f"{_fmt(dcov, True)} |")
    notes = target.read_text().split("<!-- notes -->", 1)[1] if target.exists() and "<!-- notes -->" in \
        target.read_text() else "\n"
    target.write_text("\n".join(lines) + "\n\n<!-- notes -->" + notes)
    print(f"wrote {target}")


def main() -> None:
    p = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    sub = p.add_subparsers(dest="cmd", required=True)
    r = sub.add_parser("run")
    r.add_argument("--out", type=Path, default=RESULTS / "dppsvi_bootstrap.csv")
    r.add_argument("--datasets", default="german_credit,sim_logistic_1e4,sim_poisson_1e4,bike_rentals,adult,"
                                         "sim_logistic_1e5,sim_poisson_1e5")
    r.add_argument("--epsilons", default="0.2,1.0")
    r.add_argument("--seeds", default="0,1,2,3,4")
    r.add_argument("--replicates", type=int, default=DEFAULT_REPLICATES, help="per round")
    r.add_argument("--rounds", type=int, default=DEFAULT_ROUNDS)
    r.add_argument("--workers", type=int, default=None)
    r.add_argument("--init-models", default=None,
                   help="comma list of models with DP initialisation histograms (default: the release's)")
    z = sub.add_parser("zero-config")
    z.add_argument("--out", type=Path, default=RESULTS / "dppsvi_bootstrap.csv")
    z.add_argument("--datasets", default="adult,bike_rentals")
    z.add_argument("--epsilons", default="0.2,1.0")
    z.add_argument("--seeds", default="0,1,2,3,4")
    z.add_argument("--workdir", type=Path, default=Path("/tmp/dppsvi-bootstrap-zero-config"))
    rep = sub.add_parser("report")
    rep.add_argument("results", type=Path)
    rep.add_argument("target", type=Path)
    rep.add_argument("--command", default="python benchmarks/dppsvi_bootstrap.py run")
    a = p.parse_args()
    torch.set_num_threads(1)
    if a.cmd == "run":
        run(a.out, a.datasets.split(","), [float(e) for e in a.epsilons.split(",")],
            [int(s) for s in a.seeds.split(",")], a.replicates, a.rounds, a.workers,
            None if a.init_models is None else frozenset(a.init_models.split(",")))
    elif a.cmd == "zero-config":
        zero_config(a.out, a.datasets.split(","), [float(e) for e in a.epsilons.split(",")],
                    [int(x) for x in a.seeds.split(",")], a.workdir)
    else:
        report(a.results, a.target, a.command)


if __name__ == "__main__":
    main()
