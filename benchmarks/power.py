"""Issue 27: does the release find what the data shows? The power frontier.

For each table and epsilon, every method's Gaussian posterior is judged against the full-data
posterior in the release's own model space (:func:`dpsummary.metrics.trust_report`) and against
the idealised floor (:func:`dpsummary.metrics.idealised_floor`, the issue's definition: one
Gaussian mechanism on the full-data score at the mode, 80% of epsilon, curvature free):

* ``floor`` — the idealised floor (mean over 200 noise draws; not a mechanism);
* ``default`` — today's release mechanism (:func:`dpsummary.noise_aware.fit`, the default
  schedule, the stage-2 noise multiplier the release itself used), its noise-aware Gaussian
  (the posterior the artifact carries and analysts load by default);
* ``candidate`` — the research candidate (:func:`bootstrap_calibrated_fit` below): rounds of the
  same noisy score and curvature statistics, the curvature pooled over rounds, then the
  posterior's covariance and bias measured by a parametric bootstrap of the whole
  post-processing (fresh simulated noise, never the records). Logistic only;
* ``dp-vi`` — the built-in DP-VI (:func:`dpsummary.dpvi.fit_dpvi`) at the release's (epsilon,
  delta), record count free (a utility baseline, not a release path).

Tables:
* ``adult`` — the README job in the ZERO-CONFIGURATION release's model space: for each epsilon
  one real CLI release (``dpsummary release --epsilon E examples/adult.csv --policy P``; a
  permissive copy of the default policy, see ``artifacts``) fixes the private schema (so the
  parameter count varies with epsilon) and the stage-2 noise multiplier (read from the
  artifact's accounting events); the release mechanisms are then re-run on the rows encoded by
  that public transform with fresh noise, ``--runs`` times. DP-VI and the floor get the whole
  epsilon (at the artifact's accounting delta).
* ``sim_<logistic|poisson>_<N>_<d>`` — a simulated table shaped like a schema transform
  (numerics uniform on [-1, 1], one-hot categoricals of 4 levels, an intercept); public count
  and schema, so the release mechanisms get the whole epsilon; judged against the full-data
  posterior (and the true parameter: ``true_coverage``).

Usage::

    python benchmarks/power.py artifacts --dir /tmp/power-artifacts      # 6 CLI releases of adult
    python benchmarks/power.py run --out benchmarks/results/power.csv --artifacts /tmp/power-artifacts
    python benchmarks/power.py report benchmarks/results/power.csv benchmarks/results/power.md
    python benchmarks/power.py run --out benchmarks/results/power_grid.csv --epsilons 0.2 1 \
        --artifacts /tmp/power-artifacts --public german_credit bike_rentals --sim sim_logistic_1e4_d10 ...
    python benchmarks/power.py tune --out benchmarks/results/power_tune.csv   # the candidate's rule

Exact commands and results: benchmarks/results/power.md.

Judging (full-data posterior, idealised floor, trust report) is the calibration suite's
(:func:`calibration.reference`, :func:`calibration.judge`; issue 37): the one place every harness
judges. ``benchmarks/calibration.py`` runs real releases and is the suite of record.

Randomness: privacy noise from OS entropy (:class:`SystemRandomness`), as in a release; the
bootstrap's and DP-VI's non-private draws from seeded generators.
"""

from __future__ import annotations

import argparse
import base64
import copy
import csv
import dataclasses
import functools
import json
import math
import statistics
import subprocess
import sys
import time
from collections import defaultdict
from collections.abc import Callable
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
from dpsummary.inference import prior_posterior  # noqa: E402
from dpsummary.metrics import IdealisedFloor, full_posterior, idealised_floor, trust_report  # noqa: E402
from dpsummary.models import LogisticRegression, Model, PoissonRegression  # noqa: E402

EPSILONS = (0.1, 0.2, 0.5, 1.0, 2.0, 5.0)
GRID_EPSILONS = (0.2, 1.0)
#: Delta of the simulated tables (the zero-configuration adult release uses about 9e-8).
SIM_DELTA = 1e-7
SIM_LEVELS = 4
SIM_COUNT_BOUND = 20.0
#: Simulated shapes: d (parameters incl. intercept) -> (numeric columns, categorical columns).
SIM_SHAPES = {10: (5, 1), 30: (5, 6)}  # 1 + 5 + 4 = 10; 1 + 5 + 24 = 30


@dataclasses.dataclass(frozen=True)
class Table:
    name: str
    epsilon: float
    delta: float
    model: Model
    train: torch.Tensor
    full: GaussianPosterior
    feature_norm: float
    target_bound: float
    #: Single-Gaussian noise multiplier of the release's stage-2 mechanism.
    stage2_sigma: float
    truth: torch.Tensor | None = None
    #: Parameter indices of each one-hot block (public: from the schema; intercept is index 0).
    blocks: tuple[tuple[int, ...], ...] = ()


# ---- tables -------------------------------------------------------------------------------
def _artifact_body(path: Path) -> dict[str, Any]:
    envelope = json.loads(path.read_text())
    pred: dict[str, Any] = json.loads(base64.b64decode(envelope["payload"]))["predicate"]
    return pred


def _stage2_sigma(claim: dict[str, Any]) -> float:
    """The stage-2 single-Gaussian multiplier: the composed group of Gaussian events (the
    noise-aware rounds) compose to one Gaussian, 1/sigma^2 = sum 1/m_j^2."""
    groups = [e for e in claim["events"] if e["class_name"] == "ComposedDpEvent"]
    if len(groups) != 1:
        raise ValueError("expected exactly one composed stage-2 event in the artifact")
    mults = [float(e["noise_multiplier"]) for e in groups[0]["events"]]
    return 1.0 / math.sqrt(sum(1.0 / m**2 for m in mults))


def adult_table(epsilon: float, artifact_dir: Path) -> Table:
    from dpsummary import data as dmod
    from dpsummary.constructors.base import Summary

    pred = _artifact_body(artifact_dir / f"adult_{epsilon:g}.json")
    body, claim = pred["body"], pred["claim"]
    summary = Summary.from_dict(body["summary"])
    tf = dmod.Transform.from_dict(body["summary"]["transform"])
    tf = dataclasses.replace(tf, invalid_numeric="missing", invalid_target="drop")
    pts = tf.to_points(dmod.read_csv(ROOT / "examples" / "adult.csv", private=True)).to(DTYPE)
    feature_norm, target_bound = na.schema_bounds(tf)
    return Table("adult", epsilon, float(claim["delta_accounting"]), summary.model, pts,
                 full_posterior(summary.model, pts), feature_norm, target_bound, _stage2_sigma(claim),
                 blocks=onehot_blocks(tf))


def public_schema_table(name: str, epsilon: float) -> Table:
    """``name`` (german_credit, bike_rentals) under its public schema (the schema a curator
    would declare, :meth:`Transform.from_schema` on the inferred schema; count public), the
    90% training split of :func:`dpsummary.experiment.prepare_public_dataset`; the release
    mechanisms get the whole epsilon at delta :data:`SIM_DELTA`."""
    from dpsummary import data as dmod
    from dpsummary.experiment import prepare_public_dataset

    prep = prepare_public_dataset(DATA / f"{name}.csv", seed=0, transform="schema")
    tf = dmod.Transform.from_dict(prep.transform)
    feature_norm, target_bound = na.schema_bounds(tf)
    sigma, _ = na.calibrate(na.Schedule.default(prep.model), target_epsilon=epsilon, delta=SIM_DELTA)
    return Table(name, epsilon, SIM_DELTA, prep.model, prep.train, prep.full_posterior, feature_norm, target_bound,
                 sigma, blocks=onehot_blocks(tf))


def onehot_blocks(transform: Any) -> tuple[tuple[int, ...], ...]:
    """Parameter indices (intercept = 0) of every categorical column's one-hot block (public)."""
    blocks, at = [], 1
    for col in transform.schema.feature_columns:
        width = 1 if col.kind == "numeric" else len(col.categories or [])
        if col.kind != "numeric":
            blocks.append(tuple(range(at, at + width)))
        at += width
    return tuple(blocks)


def simulated_table(kind: str, n: int, d: int, epsilon: float, seed: int = 0) -> Table:
    nnum, ncat = SIM_SHAPES[d]
    f = nnum + ncat * SIM_LEVELS
    g = torch.Generator().manual_seed(27_000 + 97 * seed + d + n % 1000)
    model: Model = LogisticRegression(f) if kind == "logistic" else PoissonRegression(f)
    x = torch.zeros(n, f, dtype=DTYPE)
    x[:, :nnum] = torch.rand(n, nnum, generator=g, dtype=DTYPE) * 2 - 1
    for c in range(ncat):
        pick = torch.randint(0, SIM_LEVELS, (n,), generator=g)
        x[torch.arange(n), nnum + c * SIM_LEVELS + pick] = 1.0
    theta = torch.randn(model.param_dim, generator=g, dtype=DTYPE) * (0.7 if kind == "logistic" else 0.3)
    pts = model.simulate(theta, n, g, features=x)
    target_bound = 1.0
    if kind == "poisson":
        pts[:, -1].clamp_(max=SIM_COUNT_BOUND)
        target_bound = SIM_COUNT_BOUND
    schedule = na.Schedule.default(model)
    sigma, _ = na.calibrate(schedule, target_epsilon=epsilon, delta=SIM_DELTA)
    blocks = tuple(tuple(range(1 + nnum + c * SIM_LEVELS, 1 + nnum + (c + 1) * SIM_LEVELS)) for c in range(ncat))
    return Table(f"sim_{kind}_{n:.0e}_d{d}".replace("+0", ""), epsilon, SIM_DELTA, model, pts,
                 full_posterior(model, pts), math.sqrt(nnum + ncat), target_bound, sigma, theta, blocks)


# ---- methods ------------------------------------------------------------------------------
def _release_fn(table: Table) -> na.ReleaseFn:
    from dpsummary.private.mechanism import SystemRandomness
    from dpsummary.private.score_stats import noisy_score_statistics

    rnd = SystemRandomness()

    def release(theta: torch.Tensor, sb: float, cb: float, sm: float, cm: float) -> tuple[torch.Tensor, torch.Tensor]:
        st = noisy_score_statistics(table.train, rnd, table.model, theta, score_bound=sb, curvature_bound=cb,
                                    score_noise_multiplier=sm, curvature_noise_multiplier=cm)
        return st.score, st.curvature

    return release


def default_fit(table: Table, seed: int) -> GaussianPosterior:
    """Today's release mechanism at the release's own stage-2 noise multiplier."""
    del seed
    schedule = na.Schedule.default(table.model)
    bounds = na.public_bounds(table.model, feature_norm=table.feature_norm, target_bound=table.target_bound)
    res = na.fit(table.model, _release_fn(table), bounds, schedule=schedule, sigma=table.stage2_sigma,
                 feature_norm=table.feature_norm, target_bound=table.target_bound, generator=torch.Generator().manual_seed(0))
    return res.posterior


#: The candidate's rounds (score share, curvature share), and how far the bootstrap world's
#: curvature is lowered (in units of the pooled curvature noise's spectral scale 2 sqrt(d) tau).
CANDIDATE_ROUNDS: tuple[tuple[float, float], ...] = ((0.05, 0.1), (0.05, 0.1), (0.5, 0.2))
CANDIDATE_LOWER = 0.5
CANDIDATE_BOOTSTRAP = 200
#: Apply :func:`structured` (public one-hot structure) to every released curvature.
CANDIDATE_STRUCTURE = False


def _lowered(h: torch.Tensor, amount: float) -> torch.Tensor:
    vals, vecs = torch.linalg.eigh(0.5 * (h + h.T))
    return (vecs * (vals - amount).clamp(min=0.0)) @ vecs.T


def structured(h: torch.Tensor, blocks: tuple[tuple[int, ...], ...]) -> torch.Tensor:
    """Post-processing of a noisy GLM curvature sum with public one-hot structure: within a
    one-hot block two levels never co-occur, so those off-diagonal entries are exactly 0 in the
    true sum (their released values are pure noise: set to 0); a 0/1 column j has
    ``x_j^2 = x_j``, so the intercept entry H_0j and the diagonal H_jj are the same sum released
    twice with independent noise of equal scale (both set to their average)."""
    out = h.clone()
    for block in blocks:
        idx = torch.tensor(block)
        for j in block:
            others = idx[idx != j]
            out[j, others] = 0.0
            avg = 0.5 * (out[0, j] + out[j, j])
            out[0, j] = out[j, 0] = out[j, j] = avg
    return out


def _pooled_rounds(stds: list[tuple[float, float]], release: Callable[[torch.Tensor, int], tuple[torch.Tensor, torch.Tensor]],
                   mu0: torch.Tensor, prior_prec: torch.Tensor, blocks: tuple[tuple[int, ...], ...] = ()
                   ) -> tuple[torch.Tensor, torch.Tensor]:
    """The candidate's post-processing: at each round's anchor, the noisy score s and curvature
    H_k; the curvature estimate is the precision-weighted pool of all rounds' H_k, projected to
    PSD; the next anchor is the score-noise-aware mean (precision H V^-1 H + P, V = H + s_var I).
    The first round's curvature (at the prior mean, far from the mode: for logistic regression an
    upper bound there) only places the second anchor and is left out of the pool when there are
    later rounds. Returns (estimate, pooled curvature)."""
    a = mu0.clone()
    d = a.shape[0]
    eye = torch.eye(d, dtype=DTYPE)
    num = torch.zeros(d, d, dtype=DTYPE)
    den = 0.0
    hp = num
    for k, (s_std, c_std) in enumerate(stds):
        s, hk = release(a, k)
        if blocks:
            hk = structured(hk, blocks)
        if k == 0 or len(stds) == 1:
            num, den = torch.zeros(d, d, dtype=DTYPE), 0.0
        num = num + hk / c_std**2
        den += 1.0 / c_std**2
        hp = na.psd_part(num / den)
        v = hp + s_std**2 * eye
        hv = torch.linalg.solve(v, hp).T
        prec = hv @ hp + prior_prec
        a = torch.linalg.solve(0.5 * (prec + prec.T), hv @ (s + hp @ a) + prior_prec @ mu0)
    return a, hp


def bootstrap_calibrated_fit(table: Table, seed: int, rounds: tuple[tuple[float, float], ...] = CANDIDATE_ROUNDS,
                             lower: float = CANDIDATE_LOWER, draws: int = CANDIDATE_BOOTSTRAP,
                             structure: bool = CANDIDATE_STRUCTURE) -> GaussianPosterior:
    """The candidate (logistic regression): rounds of the release's own noisy statistics
    (:func:`_pooled_rounds`), then a parametric bootstrap on DP outputs only: in a quadratic
    world with curvature ``H*`` (the pooled estimate with its eigenvalues lowered by
    ``lower * 2 sqrt(d) tau``, tau the pooled curvature noise's entry sd) and a parameter drawn
    around the estimate, the releases are simulated with fresh noise of the real scales and the
    same post-processing re-run; the posterior is N(estimate - mean error, error covariance +
    (H* + P)^-1): the privacy error around the data's estimate plus the data's own posterior
    spread (the bootstrap world's score is exact, so its errors hold only the former)."""
    model = table.model
    if model.name != "logistic":
        raise ValueError("the bootstrap candidate is implemented for logistic regression only")
    d = model.param_dim
    schedule = na.Schedule(rounds)
    mults = schedule.noise_multipliers(table.stage2_sigma)
    sb, cb = model.statistic_bounds(model.prior_mean, feature_norm=table.feature_norm, target_bound=table.target_bound)
    stds = [(sm * sb, cm * cb) for sm, cm in mults]
    prior_prec = torch.eye(d, dtype=DTYPE) / model.prior_scale**2
    mu0 = model.prior_mean.to(DTYPE)
    real = _release_fn(table)
    blocks = table.blocks if structure else ()
    est, hp = _pooled_rounds(stds, lambda a, k: real(a, sb, cb, mults[k][0], mults[k][1]), mu0, prior_prec, blocks)
    tau = (1.0 / sum(1.0 / c**2 for _, c in stds[1:] or stds)) ** 0.5
    hstar = _lowered(hp, lower * 2.0 * math.sqrt(d) * tau) if lower > 0 else hp
    g = torch.Generator().manual_seed(seed)
    chol = torch.linalg.cholesky(hstar + prior_prec)
    errors = []
    for _ in range(draws):
        z = torch.randn(d, generator=g, dtype=DTYPE)
        theta_b = est + torch.linalg.solve_triangular(chol.T, z[:, None], upper=True)[:, 0]

        def simulated(a: torch.Tensor, k: int, theta_b: torch.Tensor = theta_b) -> tuple[torch.Tensor, torch.Tensor]:
            s_std, c_std = stds[k]
            s = hstar @ (theta_b - a) + torch.randn(d, generator=g, dtype=DTYPE) * s_std
            e = torch.triu(torch.randn(d, d, generator=g, dtype=DTYPE) * c_std)
            return s, hstar + e + torch.triu(e, 1).T

        eb, _ = _pooled_rounds(stds, simulated, mu0, prior_prec, blocks)
        errors.append(eb - theta_b)
    err = torch.stack(errors)
    cov = torch.cov(err.T) + torch.cholesky_inverse(chol)
    cov = 0.5 * (cov + cov.T)
    return GaussianPosterior.from_precision(torch.linalg.inv(cov), torch.linalg.solve(cov, est - err.mean(0)))


def dpvi_fit(table: Table, seed: int) -> GaussianPosterior:
    from dpsummary.dpvi import fit_dpvi

    return fit_dpvi(table.train, table.model, epsilon=table.epsilon, delta=table.delta,
                    generator=torch.Generator().manual_seed(seed)).posterior


METHODS: dict[str, Callable[[Table, int], GaussianPosterior]] = {
    "default": default_fit, "candidate": bootstrap_calibrated_fit, "dp-vi": dpvi_fit,
}

FIELDS = ["table", "epsilon", "param_dim", "method", "run", "coverage", "true_coverage", "effects_full",
          "effects_found", "effects_wrong_sign", "width_ratio", "floor_width_ratio", "width_vs_floor",
          "floor_effects_found", "effects_vs_floor", "seconds"]


def _reference(table: Table) -> calibration.Reference:
    """The table's full-data posterior and idealised floor (seed 0), from the calibration
    suite's one reference builder (:func:`calibration.reference`)."""
    return calibration.reference(table.model, table.train, epsilon=table.epsilon, delta=table.delta,
                                 key=f"power:{table.name}:{table.model.prior_scale}", full=table.full,
                                 truth=table.truth)


def _floor(table: Table) -> IdealisedFloor:
    fl = _reference(table).floor
    assert fl is not None
    return fl


def _row(table: Table, method: str, run: int, post: GaussianPosterior, fl: IdealisedFloor, seconds: float) -> dict[str, Any]:
    """The judged row (:func:`calibration.judge`); ``fl`` must be the table's floor (:func:`_floor`)."""
    ref = _reference(table)
    assert ref.floor is fl, "judged against a floor other than the table's"
    out = {k: v for k, v in calibration.judge(post, ref).items() if k in FIELDS}
    return {**out, "table": table.name, "epsilon": table.epsilon, "param_dim": table.model.param_dim,
            "method": method, "run": run, "seconds": round(seconds, 2)}


def measure(tables: list[Callable[[], Table]], methods: list[str], runs: int, out: Path) -> None:
    out.parent.mkdir(parents=True, exist_ok=True)
    new = not out.exists()
    with out.open("a", newline="") as fh:
        w = csv.DictWriter(fh, fieldnames=FIELDS, extrasaction="ignore")
        if new:
            w.writeheader()
        for make in tables:
            table = make()
            fl = _floor(table)
            full_eff = int(trust_report(table.full, table.full, prior_posterior(table.model)).effects_full)
            w.writerow({"table": table.name, "epsilon": table.epsilon, "param_dim": table.model.param_dim,
                        "method": "floor", "run": "", "coverage": fl.coverage, "effects_full": full_eff,
                        "effects_found": fl.effects_found, "width_ratio": fl.width_ratio,
                        "floor_width_ratio": fl.width_ratio, "width_vs_floor": 1.0,
                        "floor_effects_found": fl.effects_found, "effects_vs_floor": 1.0})
            fh.flush()
            for method in methods:
                if method == "candidate" and table.model.name != "logistic":
                    continue
                for run in range(runs):
                    t0 = time.perf_counter()
                    try:
                        post = METHODS[method](table, run)
                    except Exception as exc:  # a benchmark row, never a crash of the sweep
                        print(f"{table.name} eps {table.epsilon} {method} run {run}: {type(exc).__name__}: {exc}")
                        continue
                    row = _row(table, method, run, post, fl, time.perf_counter() - t0)
                    w.writerow(row)
                    fh.flush()
                    print({k: (round(v, 3) if isinstance(v, float) else v) for k, v in row.items()
                           if k in ("table", "epsilon", "method", "coverage", "effects_found", "effects_full",
                                    "width_vs_floor", "effects_vs_floor", "seconds")})


# ---- the candidate's rule (simulated tables only) ---------------------------------------------
#: Written down before any real table was run with these configurations (issue 27's rule):
#: every (rounds, lower) pair below runs on the simulated logistic tables N in {1e4, 1e5},
#: d in {10, 30}, at epsilon 0.2 and 1, ``TUNE_RUNS`` runs each. A configuration is admissible
#: when its median coverage of the full-data mean is >= 0.9 in EVERY (table, epsilon) cell; the
#: admissible one with the largest sum over cells of median effects found wins (ties: the
#: larger ``lower``, i.e. the more conservative). Real tables confirm; they never tune.
TUNE_ROUNDS: dict[str, tuple[tuple[float, float], ...]] = {
    "3r": ((0.05, 0.1), (0.05, 0.1), (0.5, 0.2)),
    "2r": ((0.1, 0.2), (0.5, 0.2)),
    "3r-curv": ((0.05, 0.15), (0.05, 0.15), (0.4, 0.2)),
    "2r-score": ((0.1, 0.15), (0.6, 0.15)),
}
TUNE_LOWER = (0.5, 1.0)
TUNE_RUNS = 3
TUNE_TABLES = ("sim_logistic_1e4_d10", "sim_logistic_1e4_d30", "sim_logistic_1e5_d10", "sim_logistic_1e5_d30")


#: Second stage (same rule, same cells): the chosen configuration with and without
#: :func:`structured`; structure is kept when it stays admissible and finds at least as many.
def tune(out: Path, configs: dict[str, tuple[tuple[float, float], ...]] | None = None,
         lowers: tuple[float, ...] = TUNE_LOWER, structures: tuple[bool, ...] = (False,)) -> None:
    out.parent.mkdir(parents=True, exist_ok=True)
    fields = ["config", "lower", *FIELDS]
    with out.open("w", newline="") as fh:
        w = csv.DictWriter(fh, fieldnames=fields, extrasaction="ignore")
        w.writeheader()
        for make in _sim_tables(list(TUNE_TABLES), GRID_EPSILONS):
            table = make()
            fl = _floor(table)
            for label, rounds in (configs or TUNE_ROUNDS).items():
                for lower in lowers:
                    for structure in structures:
                        for run in range(TUNE_RUNS):
                            t0 = time.perf_counter()
                            post = bootstrap_calibrated_fit(table, run, rounds=rounds, lower=lower, structure=structure)
                            row = _row(table, "candidate", run, post, fl, time.perf_counter() - t0)
                            w.writerow({"config": label + ("+structure" if structure else ""), "lower": lower, **row})
                            fh.flush()
    with out.open(newline="") as fh:
        rows = list(csv.DictReader(fh))
    cells: dict[tuple[str, str], dict[tuple[str, str], list[dict[str, str]]]] = defaultdict(lambda: defaultdict(list))
    for r in rows:
        cells[(r["config"], r["lower"])][(r["table"], r["epsilon"])].append(r)
    best = None
    for key, by_cell in cells.items():
        cov = min(_median(rs, "coverage") or 0.0 for rs in by_cell.values())
        found = sum(_median(rs, "effects_found") or 0.0 for rs in by_cell.values())
        ratio = statistics.median(_median(rs, "effects_vs_floor") or 0.0 for rs in by_cell.values())
        width = statistics.median(_median(rs, "width_vs_floor") or 0.0 for rs in by_cell.values())
        print(f"{key[0]:>9} lower {key[1]}: worst-cell median coverage {cov:.2f}, effects found {found:.1f}, "
              f"median found/floor {ratio:.2f}, median width/floor {width:.2f}")
        if cov >= 0.9 and (best is None or (found, float(key[1])) > best[0]):
            best = ((found, float(key[1])), key)
    print("chosen:", None if best is None else best[1])


# ---- artifacts ----------------------------------------------------------------------------
def make_artifacts(directory: Path, epsilons: tuple[float, ...]) -> None:
    """One zero-configuration CLI release of examples/adult.csv per epsilon, under a copy of the
    packaged default policy with a lifetime budget large enough for the sweep."""
    import os

    directory.mkdir(parents=True, exist_ok=True)
    from data_paths import write_sweep_policy

    pol = write_sweep_policy(directory)
    env = {**os.environ, "DPSUMMARY_HOME": str(directory / "home")}
    exe = Path(sys.executable).parent / "dpsummary"
    for eps in epsilons:
        if (directory / f"adult_{eps:g}.json").exists():
            continue
        subprocess.run([str(exe), "release", "--epsilon", f"{eps:g}", str(ROOT / "examples" / "adult.csv"),
                        "--policy", str(pol), "--out", str(directory / f"adult_{eps:g}.json"), "--seed", "0"],
                       check=False, env=env, stdout=subprocess.DEVNULL)
        if not (directory / f"adult_{eps:g}.json").exists():
            raise SystemExit(f"error: the release at epsilon {eps:g} wrote no artifact")


def with_prior_scale(make: Callable[[], Table], scale: float) -> Table:
    """``make()``'s table with the model's prior scale replaced, for the release and for the
    full-data reference alike (the floor is defined under the prior the release uses); the
    table's name says so."""
    table = make()
    model = copy.copy(table.model)
    model.prior_scale = float(scale)
    return dataclasses.replace(table, name=f"{table.name} (prior {scale:g})", model=model,
                               full=full_posterior(model, table.train))


# ---- prior shrinkage ----------------------------------------------------------------------
def prior_shrinkage(artifacts: Path, epsilons: tuple[float, ...], scales: tuple[float, ...]) -> list[str]:
    """The idealised floor on adult (zero-configuration space of each artifact) with the model's
    prior scale replaced: is a floor coverage of the full-data mean below 0.9 caused by the
    prior's shrinkage? (issues 27 and 28; the full-data posterior keeps the release's prior.)"""
    lines = ["| epsilon | d | prior scale | floor coverage | floor effects found | floor width / full |",
             "|---|---|---|---|---|---|"]
    for eps in epsilons:
        table = adult_table(eps, artifacts)
        for scale in scales:
            model = copy.copy(table.model)
            model.prior_scale = float(scale)
            fl = idealised_floor(model, table.train, table.full, epsilon=eps, delta=table.delta,
                                 generator=torch.Generator().manual_seed(0))
            lines.append(f"| {eps:g} | {model.param_dim} | {scale:g} | {fl.coverage:.3f} | {fl.effects_found:.2f} | "
                         f"{fl.width_ratio:.2f} |")
            print(lines[-1], flush=True)
    return lines


# ---- report -------------------------------------------------------------------------------
def _median(rows: list[dict[str, str]], key: str) -> float | None:
    vals = [float(r[key]) for r in rows if r.get(key) not in (None, "")]
    return statistics.median(vals) if vals else None


def _f(v: float | None, nd: int = 2) -> str:
    return "-" if v is None else f"{v:.{nd}f}"


def summarise(rows: list[dict[str, str]]) -> dict[tuple[str, float, str], dict[str, Any]]:
    groups: dict[tuple[str, float, str], list[dict[str, str]]] = defaultdict(list)
    for r in rows:
        groups[(r["table"], float(r["epsilon"]), r["method"])].append(r)
    out = {}
    for key, rs in groups.items():
        out[key] = {"runs": len(rs) if key[2] != "floor" else 0, "d": rs[0]["param_dim"],
                    "effects_full": rs[0]["effects_full"],
                    **{k: _median(rs, k) for k in ("coverage", "true_coverage", "effects_found", "effects_wrong_sign",
                                                   "width_ratio", "width_vs_floor", "effects_vs_floor")}}
    return out


ORDER = {"floor": 0, "default": 1, "candidate": 2, "dp-vi": 3}


def report(results: Path, target: Path, plot: Path | None) -> None:
    with results.open(newline="") as fh:
        rows = list(csv.DictReader(fh))
    summ = summarise(rows)
    lines = ["| table | epsilon | method | d | runs | coverage | true coverage | effects found (of full-data) | "
             "wrong sign | width / full | width / floor | found / floor's |",
             "|---|---|---|---|---|---|---|---|---|---|---|---|"]
    for (tab, eps, meth), s in sorted(summ.items(), key=lambda kv: (kv[0][0], kv[0][1], ORDER.get(kv[0][2], 9))):
        found = _f(s["effects_found"], 1)
        lines.append(f"| {tab} | {eps:g} | {meth} | {s['d']} | {s['runs'] or '200 draws'} | {_f(s['coverage'])} | "
                     f"{_f(s['true_coverage'])} | {found} of {s['effects_full']} | {_f(s['effects_wrong_sign'], 0)} | "
                     f"{_f(s['width_ratio'], 1)}x | {_f(s['width_vs_floor'])} | {_f(s['effects_vs_floor'])} |")
    text = target.read_text() if target.exists() else ""
    start, end = f"<!-- table:{results.stem} -->", f"<!-- /table:{results.stem} -->"
    block = start + "\n" + "\n".join(lines) + "\n" + end
    if start in text and end in text:
        text = text[:text.index(start)] + block + text[text.index(end) + len(end):]
    else:
        text = text + "\n" + block + "\n"
    target.write_text(text)
    if plot is not None:
        _plot(summ, plot)


def _plot(summ: dict[tuple[str, float, str], dict[str, Any]], path: Path) -> None:
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    tables = sorted({k[0] for k in summ})
    fig, axes = plt.subplots(2, len(tables), figsize=(5.5 * len(tables), 7.5), squeeze=False)
    for j, tab in enumerate(tables):
        for meth in sorted({k[2] for k in summ if k[0] == tab}, key=lambda m: ORDER.get(m, 9)):
            pts = sorted((k[1], v) for k, v in summ.items() if k[0] == tab and k[2] == meth)
            eps = [p[0] for p in pts]
            axes[0][j].plot(eps, [p[1]["effects_found"] for p in pts], marker="o", label=meth)
            axes[1][j].plot(eps, [p[1]["width_ratio"] for p in pts], marker="o", label=meth)
        axes[0][j].set_title(tab)
        axes[0][j].set_ylabel("effects found (median)")
        axes[1][j].set_ylabel("median sd / full-data sd")
        for ax in (axes[0][j], axes[1][j]):
            ax.set_xscale("log")
            ax.set_xlabel("epsilon")
            ax.grid(True, alpha=0.3)
        axes[1][j].set_yscale("log")
        axes[0][j].legend()
    fig.tight_layout()
    path.parent.mkdir(parents=True, exist_ok=True)
    fig.savefig(path, dpi=110)
    plt.close(fig)


# ---- CLI ----------------------------------------------------------------------------------
def _sim_tables(names: list[str], epsilons: tuple[float, ...]) -> list[Callable[[], Table]]:
    out: list[Callable[[], Table]] = []
    for name in names:
        _, kind, n, d = name.split("_")
        for eps in epsilons:
            out.append(functools.partial(simulated_table, kind, int(float(n)), int(d[1:]), eps))
    return out


def main() -> None:
    p = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    sub = p.add_subparsers(dest="cmd", required=True)
    a = sub.add_parser("artifacts")
    a.add_argument("--dir", type=Path, required=True)
    a.add_argument("--epsilons", type=float, nargs="+", default=list(EPSILONS))
    r = sub.add_parser("run")
    r.add_argument("--out", type=Path, required=True)
    r.add_argument("--artifacts", type=Path, help="directory of adult_<eps>.json (omit: no adult)")
    r.add_argument("--sim", nargs="*", default=["sim_logistic_1e4_d30"])
    r.add_argument("--epsilons", type=float, nargs="+", default=list(EPSILONS))
    r.add_argument("--methods", nargs="+", default=["default", "candidate", "dp-vi"])
    r.add_argument("--runs", type=int, default=5)
    r.add_argument("--public", nargs="*", default=[], help="real tables under their public schema")
    r.add_argument("--prior-scale", type=float, default=None,
                   help="replace the model's prior scale (release and full-data reference alike)")
    t = sub.add_parser("tune")
    t.add_argument("--out", type=Path, required=True)
    t.add_argument("--structure-of", nargs=2, metavar=("CONFIG", "LOWER"),
                   help="second stage: this configuration with and without the one-hot structure")
    ps = sub.add_parser("prior-shrinkage")
    ps.add_argument("--artifacts", type=Path, required=True)
    ps.add_argument("--epsilons", type=float, nargs="+", default=list(GRID_EPSILONS))
    ps.add_argument("--scales", type=float, nargs="+", default=[1.0, 3.0, 10.0, 1000.0])
    rep = sub.add_parser("report")
    rep.add_argument("results", type=Path)
    rep.add_argument("target", type=Path)
    rep.add_argument("--plot", type=Path)
    args = p.parse_args()
    torch.set_num_threads(1)
    if args.cmd == "artifacts":
        make_artifacts(args.dir, tuple(args.epsilons))
    elif args.cmd == "tune":
        if args.structure_of:
            label, lower = args.structure_of
            tune(args.out, {label: TUNE_ROUNDS[label]}, (float(lower),), (False, True))
        else:
            tune(args.out)
    elif args.cmd == "prior-shrinkage":
        prior_shrinkage(args.artifacts, tuple(args.epsilons), tuple(args.scales))
    elif args.cmd == "run":
        eps = tuple(args.epsilons)
        tables: list[Callable[[], Table]] = []
        if args.artifacts is not None:
            tables += [functools.partial(adult_table, e, args.artifacts) for e in eps]
        tables += [functools.partial(public_schema_table, name, e) for name in args.public for e in eps]
        tables += _sim_tables(args.sim, eps)
        if args.prior_scale is not None:
            tables = [functools.partial(with_prior_scale, make, args.prior_scale) for make in tables]
        measure(tables, args.methods, args.runs, args.out)
    else:
        report(args.results, args.target, args.plot)


if __name__ == "__main__":
    main()
