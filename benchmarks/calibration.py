"""Issue 37: the calibration suite. Can an analyst believe a release's 95% intervals on real tables?

ONE harness for every GLM mechanism. A *cell* is table x model x mode x epsilon x mechanism; a
*run* is one real release through the product's own path (:func:`dpsummary.release.run_release`,
what ``dpsummary release`` calls: the policy, the budget split, the record count, the DP schema
or the public one, the mechanism and its post-processing, the signed artifact), judged in the
release's own model space. Whatever ``dpsummary/`` does today is what is measured: nothing of the
mechanism is copied here.

Judging one run (:func:`judge_artifact`): the table's CSV encoded by the artifact's public
transform (the release's own model space; the same total per-record rules), the full-data
posterior of the artifact's model (prior included; :func:`dpsummary.metrics.full_posterior`), the
idealised floor at the release's epsilon and accounting delta
(:func:`dpsummary.metrics.idealised_floor`, 200 noise draws, seed 0), and the posterior an analyst
loads by default (the Laplace posterior of the artifact's weighted pseudocoreset,
:func:`dpsummary.inference.coreset_posterior`) judged by :func:`dpsummary.metrics.trust_report`:
coverage of the full-data posterior mean by the central 95% intervals, wrong-sign effects, median
sd / full-data sd, effects found, and the same against the floor.

Verdict of a cell (:func:`verdict`; issue 50's binding decision, which replaced issue 37's "no
wrong-sign effect in any run"): the cell is HONEST when its median coverage over runs is >= 0.9
and its wrong-sign effects summed over its runs exceed the idealised floor's expected count for
those runs by at most 1 (a wrong sign is a miscoverage; one in ten releases does not fail a cell
by itself). Where the floor itself is dishonest (it covers less than 0.9, or it expects more than
one wrong-sign effect over the cell's runs: ``sim_correlated``'s public schema), the cell is
judged against the floor: median coverage >= min(0.9, the floor's coverage - 0.05) (such cells
are marked ``floor`` in the table), wrong signs as above. A cell with a refused run is REFUSED
(the issue counts a refusal as a failure to release); a run that crashed is ERROR. Across the
suite (:func:`suite_wrong_signs`, per mechanism) the wrong-sign total must stay within 1.25x the
floor's expected total plus 3. A change's width cost in a cell (:func:`width_change`, rule 2) is
measured from max(the cell's width before, the floor's width).

Modes:
* ``zero-config``: the packaged default policy (``benchmarks/data_paths.write_sweep_policy``: a
  lifetime budget and a per-release cap large enough for the sweep; the table's ``n_max`` where it
  declares one), private record count and DP schema; ``--target`` and ``--model`` given, and for
  a two-valued text target ``--positive-class`` with the class its documentation names as the
  event (:data:`POSITIVE_CLASSES`; the sixth rule of ``results/noise_aware_variants.md``, adopted
  2026-11-26: it takes the target out of the DP schema; ``run --no-positive-class`` gives the
  earlier mode, whose rows are in git history);
* ``public``: the same policy with a public ``[schema]``: the table's declared schema where it has
  one (NAPSU-MQ, the simulations), else the schema dpsummary infers NON-privately from the whole
  table (:func:`dpsummary.data.inference.infer_schema`: data bounds, observed categories; the
  most favourable public schema, as the older grids used). The record count stays private.

Mechanisms: ``noise-aware-newton`` (the default for GLMs), ``dp-psvi`` (the paper's mechanism;
the artifact's default posterior is the calibrated one), ``noise-aware-cells`` (opt-in; public
mode on tables with a small discrete schema only) and ``noise-aware-objective`` (opt-in; logistic
tables only: issue 50's objective perturbation).

Tables: ``suite_tables.py`` (its docstring lists each table and its settings; the registry
:data:`TABLES`; ``python benchmarks/calibration.py tables`` lists them). Verdicts, report and
comparison: ``suite_verdict.py``. Both are re-exported here, so ``calibration.X`` names
everything the suite has.

Output: one CSV row per run (``--out``; appended, so a run can be resumed or extended), then
``report`` rebuilds the markdown table (one row per cell, a headline summary) and the plot from
the CSV alone. The column ``code`` records the commit and whether ``dpsummary/`` had uncommitted
changes when the run started.

Usage::

    python benchmarks/calibration.py tables                       # the registry
    python benchmarks/calibration.py run --tables napsu_adult --epsilons 0.3,1 --runs 3 \\
        --mechanisms noise-aware-newton --modes public --out X.csv
    python benchmarks/calibration.py run --suite real --epsilons 0.3,1 --runs 3 \\
        --out benchmarks/results/calibration.csv                  # the baseline
    python benchmarks/calibration.py report benchmarks/results/calibration.csv \\
        benchmarks/results/calibration.md --plot benchmarks/results/plots/calibration.png

Randomness: privacy noise from the OS CSPRNG, as in every release (never seeded); the releases'
non-private randomness from ``--seed`` = the run index; simulated tables and the floor's noise
draws from fixed seeds. Run at most one worker on the shared 2-core machine (``nice -n 10``).
"""

from __future__ import annotations

import argparse
import collections
import csv
import dataclasses
import json
import math
import os
import subprocess
import sys
import tempfile
import time
from collections.abc import Callable, Iterable
from pathlib import Path
from typing import Any

import numpy as np
import torch

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT))
sys.path.insert(0, str(Path(__file__).resolve().parent))  # benchmarks/: suite_tables, suite_verdict
from suite_tables import (  # noqa: E402
    BY_NAME_ONLY,
    CACHE,
    CELL_FLAG_RATE,
    CELL_REGIONS,
    LINEAR_RDATASETS,
    NAPSU_RACES,
    POSITIVE_CLASSES,
    RDATASETS,
    RESULTS,
    SIMULATIONS,
    SUITES,
    TABLES,
    WIDE_REGIONS,
    SimColumn,
    TableSpec,
    _binary,
    _discrete_schema,
    _discrete_sim,
    _effects,
    _napsu_adult,
    _napsu_adult_cells,
    _napsu_cells_schema,
    _napsu_schema,
    _rdataset,
    _reference_region,
    _registry,
    _shared,
    _sim_schema,
    _sim_specs,
    _simulate,
    _simulate_linear,
    _toml_value,
    _uniform,
    public_schema,
    table_csv,
    target_of,
    write_policy,
)
from suite_verdict import (  # noqa: E402
    BELOW_FULL,
    FLOOR_MARGIN,
    GEOMEAN_LIMIT,
    HONEST_COVERAGE,
    NARROW,
    SUITE_WRONG_FACTOR,
    SUITE_WRONG_SLACK,
    WIDER_LIMIT,
    WRONG_SIGN_SLACK,
    Cell,
    CellKey,
    SuiteWrongSigns,
    WidthCheck,
    _f,
    _floats,
    _median,
    _order,
    _plot,
    _rel,
    _x,
    cells,
    compare,
    floor_dishonest,
    load_frontier,
    report,
    suite_wrong_signs,
    verdict,
    width_change,
    width_check,
)

#: Every name of the suite's two modules, so ``calibration.X`` reaches them (module docstring).
__all__ = [
    'RESULTS', 'CACHE', 'TableSpec', '_shared', '_napsu_adult', '_napsu_schema', 'NAPSU_RACES',
    '_napsu_adult_cells', '_napsu_cells_schema', 'CELL_REGIONS', 'CELL_FLAG_RATE', '_discrete_sim',
    '_reference_region', '_discrete_schema', 'WIDE_REGIONS', '_rdataset', 'RDATASETS',
    'LINEAR_RDATASETS', 'POSITIVE_CLASSES', 'SimColumn', '_simulate', '_sim_schema', '_simulate_linear',
    '_uniform', '_binary', '_effects', '_sim_specs', '_registry', 'TABLES', 'BY_NAME_ONLY',
    'SIMULATIONS', 'SUITES', 'table_csv', 'target_of', '_toml_value', 'public_schema', 'write_policy',
    'HONEST_COVERAGE', 'FLOOR_MARGIN', 'WRONG_SIGN_SLACK', 'SUITE_WRONG_FACTOR', 'SUITE_WRONG_SLACK',
    'WIDER_LIMIT', 'GEOMEAN_LIMIT', 'NARROW', 'BELOW_FULL', 'CellKey', '_floats', '_median', 'Cell',
    'floor_dishonest', 'verdict', 'SuiteWrongSigns', 'suite_wrong_signs', 'width_change', 'WidthCheck',
    'width_check', 'cells', '_f', '_x', '_order', 'load_frontier', 'report', 'compare', '_rel', '_plot',
]

EPSILONS = (0.1, 0.3, 1.0, 3.0)
MECHANISMS = ("noise-aware-newton", "dp-psvi", "noise-aware-cells", "noise-aware-objective", "default")
MODES = ("zero-config", "public")


# ---- one run: a real release, judged --------------------------------------------------------
#: Recently used references (full-data posterior and floor), bounded: a zero-configuration cell
#: has a transform per run, and each reference holds the table's rows.
_REFERENCES: collections.OrderedDict[tuple[str, float, float], Reference] = collections.OrderedDict()
_FULLS: collections.OrderedDict[str, Any] = collections.OrderedDict()
CACHE_ENTRIES = 8


@dataclasses.dataclass(frozen=True)
class Reference:
    """The judge's side of a run: the rows in the release's model space, the full-data
    posterior, the idealised floor at the release's (epsilon, delta) (None: not judged against
    one), the prior, and the true parameter of a simulated table (or None)."""

    model: Any
    points: torch.Tensor
    full: Any
    floor: Any
    prior: Any
    truth: torch.Tensor | None = None


def _remember(cache: collections.OrderedDict[Any, Any], key: Any, value: Any) -> None:
    cache[key] = value
    cache.move_to_end(key)
    while len(cache) > CACHE_ENTRIES:
        cache.popitem(last=False)


def reference(model: Any, points: torch.Tensor, *, epsilon: float | None, delta: float, key: str | None = None,
              seed: int = 0, full: Any = None, truth: torch.Tensor | None = None) -> Reference:
    """The full-data posterior of ``model`` on ``points`` (:func:`dpsummary.metrics.full_posterior`,
    unless ``full`` is given) and the idealised floor at ``(epsilon, delta)``
    (:func:`dpsummary.metrics.idealised_floor`, 200 noise draws from ``seed``; none when
    ``epsilon`` is None). Cached under ``key`` (a description of the rows and the model, which
    the caller vouches for) when one is given. The one place every harness gets these from."""
    from dpsummary.inference import prior_posterior
    from dpsummary.metrics import full_posterior, idealised_floor

    ck = None if key is None else (key, -1.0 if epsilon is None else float(epsilon), float(delta))
    if ck is not None and ck in _REFERENCES:
        _REFERENCES.move_to_end(ck)
        return _REFERENCES[ck]
    if full is None:
        full = _FULLS.get(key) if key is not None else None
        if full is None:
            full = full_posterior(model, points)
    if key is not None:
        _remember(_FULLS, key, full)
    fl = None if epsilon is None else idealised_floor(model, points, full, epsilon=epsilon, delta=delta,
                                                      generator=torch.Generator().manual_seed(seed))
    ref = Reference(model, points, full, fl, prior_posterior(model), truth)
    if ck is not None:
        _remember(_REFERENCES, ck, ref)
    return ref


def cached_reference(key: str, epsilon: float, delta: float) -> Reference | None:
    """The cached reference under ``key`` at ``(epsilon, delta)``, if there is one (lets a
    caller skip re-encoding the rows)."""
    return _REFERENCES.get((key, float(epsilon), float(delta)))


def release_bounds(schedule: Any, sigma: float, points: torch.Tensor, feature_norm: float, target_bound: float,
                   randomness: Any, noise: torch.Generator | None = None) -> tuple[float, float]:
    """For the harnesses that call :func:`dpsummary.noise_aware.fit` directly: the ``(feature_norm,
    target_bound)`` a release of ``points`` (model space, the target last) uses, i.e. the data
    ranges' clip bounds when the schedule spends on them (:func:`dpsummary.noise_aware.range_clips`,
    the release's own stage, its histogram from ``randomness``, or from exact counts plus seeded
    Gaussian noise of the mechanism's scale with ``noise``), else the schema's."""
    from dpsummary import noise_aware as na
    from dpsummary.postprocess.marginals import NoisyMarginals
    from dpsummary.private.mechanism import PrivateRecords

    def histogram(layout: Any, multiplier: float) -> Any:
        if noise is None:
            return PrivateRecords(points, randomness=randomness).noisy_marginals(layout, noise_multiplier=multiplier)
        counts = layout.counts(points)
        draw = torch.randn(len(counts), generator=noise, dtype=torch.float64).numpy()
        return NoisyMarginals(layout, counts + draw * multiplier / layout.scale, multiplier)

    clips = na.range_clips(schedule, sigma=sigma, num_features=points.shape[1] - 1, feature_norm=feature_norm,
                           target_name="target", target_bound=target_bound, histogram=histogram)
    if clips is None:
        return feature_norm, target_bound
    return (feature_norm if clips.feature is None else float(clips.feature.bound),
            target_bound if clips.count is None else float(clips.count.bound))


def judge(posterior: Any, ref: Reference) -> dict[str, Any]:
    """:func:`dpsummary.metrics.trust_report` of ``posterior`` against ``ref`` (its floor and
    true parameter when it has them), plus the floor's own coverage (``floor_coverage``) and its
    expected wrong-sign effects per release (``floor_wrong_sign``)."""
    from dpsummary.metrics import trust_report

    rep = trust_report(posterior, ref.full, ref.prior, truth=ref.truth, floor=ref.floor)
    out: dict[str, Any] = dict(rep.as_dict())
    out["floor_coverage"] = None if ref.floor is None else ref.floor.coverage
    out["floor_wrong_sign"] = None if ref.floor is None else ref.floor.wrong_sign
    return out


def artifact_reference(artifact: Path, data: Path, epsilon: float, *, posterior: str = "default"
                       ) -> tuple[Any, Reference]:
    """Load ``artifact`` (``posterior`` as :func:`dpsummary.load` takes it) and build its
    reference in its own model space: ``data`` encoded by the artifact's public transform (the
    release's total rules: an invalid numeric is missing, a row with an invalid target dropped),
    the artifact's model (its prior included), the floor at ``epsilon`` and the artifact's
    accounting delta. Returns ``(release, reference)``."""
    import dpsummary
    from dpsummary import data as dmod

    rel = dpsummary.load(str(artifact), posterior=posterior)
    if rel.transform is None:
        raise ValueError(f"{artifact} carries no public transform (not a GLM release)")
    delta = float(rel.claim["delta_accounting"])
    model = modelling_model(rel)
    key = json.dumps({"data": str(data), "transform": rel.transform.to_dict(), "model": repr(model),
                      "prior_mean": model.prior_mean.tolist()}, sort_keys=True, default=str)
    ref = cached_reference(key, epsilon, delta)
    if ref is None:
        tf = dataclasses.replace(rel.transform, invalid_numeric="missing", invalid_target="drop")
        pts = tf.to_points(dmod.read_csv(data, private=True)).to(torch.float64)
        ref = reference(model, pts, epsilon=epsilon, delta=delta, key=key)
    return rel, ref


def modelling_model(rel: Any) -> Any:
    """The release's model with the prior its posterior was computed under: a pseudocoreset
    carried under a wider prior (``pseudocoreset_match.carrier_prior_scale``, issue 48) is
    judged against the full-data posterior under the model's own prior."""
    match = (rel.body.get("posterior") or {}).get("pseudocoreset_match") or {}
    scale = match.get("model_prior_scale")
    model = rel.model
    if scale is None or float(scale) == model.prior_scale:
        return model
    spec = {**model.spec(), "prior_scale": float(scale)}
    del spec["name"]
    return type(model)(spec.pop("num_features"), **spec)


#: Draws of ``Release.sample()`` judged per release (its default NUTS settings otherwise).
SAMPLED_DRAWS = 4000


def judge_artifact(artifact: Path, data: Path, epsilon: float, *, sampled: bool = True) -> dict[str, Any]:
    """Judge one signed artifact in its own model space (:func:`artifact_reference`): the Laplace
    posterior of its weighted pseudocoreset (the ``coverage`` columns), the Gaussian it signs
    (``gaussian_*``) and, with ``sampled``, what analysts get: ``Release.sample()``'s default
    NUTS draws of the pseudocoreset's exact posterior, judged by their quantile intervals
    (``sampled_*``, :func:`dpsummary.metrics.draws_report`), with the draws' worst R-hat and ESS."""
    import warnings

    from dpsummary.gaussian import GaussianPosterior
    from dpsummary.inference import coreset_posterior
    from dpsummary.metrics import draws_report

    rel, ref = artifact_reference(artifact, data, epsilon)
    post = coreset_posterior(rel.model, rel.summary.points, rel.summary.weights)
    sigma_block = bool(getattr(rel.model, "estimates_sigma", False))
    full_sigma = ref.full.mean[-1] if sigma_block else None
    if sigma_block:
        # Issue 51: the coefficients are judged as every table's are; sigma separately (below).
        ref = coefficient_reference(ref)
        out_sigma = {"sigma_covered": _covers(post, float(full_sigma))}
        post = _block(post)
    out = judge(post, ref)
    if sigma_block:
        out.update(out_sigma)
    out.update(delta=float(rel.claim["delta_accounting"]), n_rows=int(ref.points.shape[0]),
               mechanism_ran=(rel.claim.get("mechanism") or {}).get("name"),
               posterior=rel.summary.info.get("posterior", ""),
               match_kl=rel.summary.info.get("match_symmetric_kl"))
    # Diagnostic: the Gaussian the pseudocoreset was matched to, when the artifact carries it
    # (noise-aware-newton): separates an error of the posterior from one of the matching.
    gaussians = (rel.body.get("posterior") or {}).get("gaussians") or {}
    default = (rel.body.get("posterior") or {}).get("default")
    g = gaussians.get(default) if isinstance(default, str) else None
    if isinstance(g, dict) and "mean" in g and ("cov" in g or "sd" in g):
        if "cov" in g:  # noise-aware-newton: the full covariance
            cov = torch.tensor(g["cov"], dtype=torch.float64)
            tril = torch.linalg.cholesky(0.5 * (cov + cov.T))
        else:  # calibrated dp-psvi: per-coordinate sds
            tril = torch.diag(torch.tensor(g["sd"], dtype=torch.float64))
        gauss = GaussianPosterior(mean=torch.tensor(g["mean"], dtype=torch.float64), scale_tril=tril)
        if sigma_block:
            out["gaussian_sigma_covered"] = _covers(gauss, float(full_sigma))
            gauss = _block(gauss)
        gj = judge(gauss, ref)
        out.update(gaussian_coverage=gj["coverage"], gaussian_width_ratio=gj["width_ratio"],
                   gaussian_wrong_sign=gj["effects_wrong_sign"])
    if sampled and getattr(rel.model, "parameter_draws", True):
        with warnings.catch_warnings():
            warnings.simplefilter("ignore")  # the diagnostics are recorded, not printed
            if rel.model.conjugate or hasattr(rel.model, "exact_draws"):  # exact, independent draws
                values, rhat, ess = rel.sample(SAMPLED_DRAWS, seed=0), None, None
            else:
                drawn = rel.sample(SAMPLED_DRAWS, seed=0, return_draws=True)
                values = drawn.flat()
                rhat = float(drawn.diagnostics.rhat.max())
                ess = float(min(drawn.diagnostics.ess_bulk.min(), drawn.diagnostics.ess_tail.min()))
        if sigma_block:
            lo, hi = np.quantile(values[:, -1], [0.025, 0.975])
            out["sampled_sigma_covered"] = float(lo <= float(full_sigma) <= hi)
            values = values[:, :-1]
        sj = draws_report(values, ref.full, floor=ref.floor)
        out.update(sampled_coverage=sj["coverage"], sampled_width_ratio=sj["width_ratio"],
                   sampled_width_vs_floor=sj["width_vs_floor"], sampled_effects_found=sj["effects_found"],
                   sampled_wrong_sign=sj["effects_wrong_sign"], sampled_mean_error_sd_max=sj["mean_error_sd_max"],
                   sampled_rhat=rhat, sampled_ess=ess)
    match = (rel.body.get("posterior") or {}).get("pseudocoreset_match") or {}
    if match:
        out.update(exact_mean_error_sd=match.get("max_mean_error_sd"),
                   exact_sd_ratio_min=match.get("sd_ratio_min"), exact_sd_ratio_max=match.get("sd_ratio_max"))
    return out


def _block(post: Any) -> Any:
    """The coefficients' marginal (every coordinate but the last, log_sigma) of a Gaussian."""
    from dpsummary.gaussian import GaussianPosterior

    cov = post.cov[:-1, :-1]
    return GaussianPosterior(mean=post.mean[:-1], scale_tril=torch.linalg.cholesky(0.5 * (cov + cov.T)))


def _covers(post: Any, value: float) -> float:
    """1.0 when the Gaussian's central 95% interval for its last coordinate holds ``value``."""
    sd = float(post.cov[-1, -1]) ** 0.5
    return float(abs(float(post.mean[-1]) - value) <= 1.959963984540054 * sd)


def coefficient_reference(ref: Reference) -> Reference:
    """A linear reference (sigma estimated) restricted to the coefficients: full-data posterior,
    prior and floor without log_sigma (the floor's width and effects are the coefficients' already,
    :func:`dpsummary.metrics.idealised_floor`)."""
    floor = ref.floor if ref.floor is None else dataclasses.replace(ref.floor, sd=ref.floor.sd[:-1])
    return dataclasses.replace(ref, full=_block(ref.full), prior=_block(ref.prior), floor=floor,
                               truth=None if ref.truth is None else ref.truth[:-1])


def release(spec: TableSpec, data: Path, mode: str, epsilon: float, mechanism: str, run: int, workdir: Path,
            positive_class: bool = True) -> Path:
    """One release through :func:`dpsummary.release.run_release` (what the CLI runs): a fresh
    ledger per release, the workdir's signing key. ``positive_class``: a zero-configuration
    release passes the table's :attr:`TableSpec.positive_class` as ``--positive-class``.
    Returns the artifact; raises on refusal."""
    from dpsummary.release import ReleaseRequest, run_release

    os.environ["DPSUMMARY_HOME"] = str(workdir / "home")
    policy = write_policy(spec, mode, data, workdir)
    art = workdir / f"{spec.name}-{mode}-{epsilon:g}-{mechanism}-{run}.json"
    ledger = workdir / f"ledger-{spec.name}-{mode}-{epsilon:g}-{mechanism}-{run}.jsonl"
    ledger.unlink(missing_ok=True)
    try:
        cls = spec.positive_class if positive_class and mode == "zero-config" else None
        run_release(ReleaseRequest(data=data, epsilon=float(epsilon), model=spec.model, target=target_of(spec, data),
                                   policy=policy, out=art, ledger=ledger, seed=run,
                                   mechanism=None if mechanism == DEFAULT_ARM else mechanism, force=True,
                                   positive_class=cls))
    finally:
        ledger.unlink(missing_ok=True)
    return art


#: The ``--mechanisms`` arm that names no mechanism: the release's own default choice
#: (:func:`dpsummary.release.choose_mechanism`); ``mechanism_ran`` records what ran.
DEFAULT_ARM = "default"

FIELDS = ["table", "kind", "model", "mode", "epsilon", "mechanism", "run", "outcome", "message", "param_dim",
          "n_rows", "delta", "coverage", "effects_wrong_sign", "width_ratio", "effects_full", "effects_found",
          "floor_coverage", "floor_width_ratio", "width_vs_floor", "floor_effects_found", "effects_vs_floor", "floor_wrong_sign",
          "mean_error_sd_median", "mean_error_sd_max", "kl_full_summary", "posterior", "match_kl",
          "gaussian_coverage", "gaussian_width_ratio", "gaussian_wrong_sign",
          "sampled_coverage", "sampled_width_ratio", "sampled_width_vs_floor", "sampled_effects_found",
          "sampled_wrong_sign", "sampled_mean_error_sd_max", "sampled_rhat", "sampled_ess",
          "exact_mean_error_sd", "exact_sd_ratio_min", "exact_sd_ratio_max", "release_seconds", "judge_seconds",
          "code", "started", "sigma_covered", "gaussian_sigma_covered", "sampled_sigma_covered", "mechanism_ran"]


def code_version() -> str:
    """``<commit>`` or ``<commit>+dirty`` (uncommitted changes under dpsummary/); in a tree
    without git (an export of a commit, ``git archive``) ``$DPSUMMARY_CODE_VERSION``."""
    if os.environ.get("DPSUMMARY_CODE_VERSION"):
        return os.environ["DPSUMMARY_CODE_VERSION"]
    try:
        head = subprocess.run(["git", "rev-parse", "--short", "HEAD"], cwd=ROOT, capture_output=True, text=True,
                              check=True).stdout.strip()
        dirty = subprocess.run(["git", "diff", "--quiet", "HEAD", "--", "dpsummary"], cwd=ROOT).returncode != 0
    except (OSError, subprocess.CalledProcessError):
        return "unknown"
    return head + ("+dirty" if dirty else "")


def run_cells(out: Path, tables: list[str], modes: list[str], epsilons: list[float], mechanisms: list[str],
              runs: int, workdir: Path | None = None, first_run: int = 0,
              say: Callable[[str], None] = print, cache: Path = CACHE, positive_class: bool = True) -> int:
    """Run every cell ``runs`` times, appending one row per run to ``out``. Returns the rows
    written. ``positive_class``: zero-configuration releases pass the table's class of interest
    (:func:`release`)."""
    out.parent.mkdir(parents=True, exist_ok=True)
    new = not out.exists() or out.stat().st_size == 0
    if not new:
        _upgrade_header(out)
    code = code_version()
    started = time.strftime("%Y-%m-%dT%H:%M:%SZ", time.gmtime())
    written = 0
    own_tmp = workdir is None
    wd = Path(tempfile.mkdtemp(prefix="calibration-")) if workdir is None else workdir
    wd.mkdir(parents=True, exist_ok=True)
    try:
        with out.open("a", newline="") as fh:
            w = csv.DictWriter(fh, fieldnames=FIELDS, extrasaction="ignore")
            if new:
                w.writeheader()
            for name in tables:
                spec = TABLES[name]
                data = table_csv(spec, cache)
                for mode in modes:
                    for eps in epsilons:
                        for mech in mechanisms:
                            for r in range(first_run, first_run + runs):
                                row: dict[str, Any] = {"table": name, "kind": spec.kind, "model": spec.model,
                                                       "mode": mode, "epsilon": eps, "mechanism": mech, "run": r,
                                                       "code": code, "started": started}
                                t0 = time.perf_counter()
                                try:
                                    art = release(spec, data, mode, eps, mech, r, wd, positive_class)
                                except Exception as exc:  # noqa: BLE001 - a refusal is a result row
                                    from dpsummary.errors import Refusal

                                    row["outcome"] = "refused" if isinstance(exc, Refusal) else "error"
                                    row["message"] = f"{type(exc).__name__}: {exc}".replace("\n", " ")[:300]
                                    row["release_seconds"] = round(time.perf_counter() - t0, 2)
                                else:
                                    row["release_seconds"] = round(time.perf_counter() - t0, 2)
                                    t1 = time.perf_counter()
                                    try:
                                        row.update(judge_artifact(art, data, eps))
                                    except Exception as exc:  # noqa: BLE001 - a harness fault is an error row
                                        row["outcome"] = "error"
                                        row["message"] = f"judging: {type(exc).__name__}: {exc}".replace("\n", " ")[:300]
                                    else:
                                        row["outcome"] = "released"
                                    row["judge_seconds"] = round(time.perf_counter() - t1, 2)
                                    art.unlink(missing_ok=True)
                                w.writerow(row)
                                fh.flush()
                                written += 1
                                say(" ".join(f"{k}={_short(row.get(k))}" for k in (
                                    "table", "mode", "epsilon", "mechanism", "run", "outcome", "coverage",
                                    "effects_wrong_sign", "width_ratio", "floor_coverage", "effects_found",
                                    "floor_effects_found", "release_seconds", "message") if row.get(k) not in (None, "")))
    finally:
        if own_tmp:
            import shutil

            shutil.rmtree(wd, ignore_errors=True)
    return written


def _upgrade_header(out: Path) -> None:
    """Make an existing results file's header :data:`FIELDS` before appending: a file written by
    an earlier version of the harness (a subset of the columns) is rewritten atomically with the
    new columns left blank; a file with columns the harness does not know is refused."""
    with out.open(newline="") as fh:
        reader = csv.DictReader(fh)
        header = list(reader.fieldnames or [])
        if header == FIELDS:
            return
        unknown = [c for c in header if c not in FIELDS]
        if unknown:
            raise SystemExit(f"error: {out} has column {unknown[0]!r}, which this harness does not write; "
                             "append to a new file with --out")
        rows = list(reader)
    tmp = out.with_suffix(out.suffix + ".tmp")
    with tmp.open("w", newline="") as fh:
        w = csv.DictWriter(fh, fieldnames=FIELDS, restval="")
        w.writeheader()
        w.writerows(rows)
    tmp.replace(out)


def _short(v: Any) -> str:
    return f"{v:.3g}" if isinstance(v, float) else str(v)


def censor_poisson_counts() -> None:
    """The thirty-fifth rule's arm X, for this process: :meth:`dpsummary.noise_aware.Schedule.default`
    gives Poisson schedules that clip the count (``count_range``) ``censor_counts=True`` (the
    thirty-second rule's candidate); every other schedule is today's. A benchmark arm through the
    real release path, not a product option."""
    from dpsummary import noise_aware as na

    today = na.Schedule.default

    def default(cls: type[na.Schedule], model: Any) -> na.Schedule:
        sched = today(model)
        return dataclasses.replace(sched, censor_counts=True) if sched.count_range else sched

    na.Schedule.default = classmethod(default)  # type: ignore[method-assign, assignment]


# ---- CLI --------------------------------------------------------------------------------------
def _names(value: str, known: Iterable[str], what: str) -> list[str]:
    names = [v.strip() for v in value.split(",") if v.strip()]
    known = list(known)
    bad = [n for n in names if n not in known]
    if bad or not names:
        raise SystemExit(f"error: unknown {what} {bad[0] if bad else value!r}; choose from {', '.join(known)}")
    return names


def _epsilons(value: str) -> list[float]:
    try:
        eps = [float(v) for v in value.split(",") if v.strip()]
    except ValueError:
        raise SystemExit(f"error: --epsilons must be a comma list of positive numbers, not {value!r}") from None
    if not eps or any(not (math.isfinite(e) and e > 0) for e in eps):
        raise SystemExit(f"error: --epsilons must be a comma list of positive numbers, not {value!r}")
    return eps


def main(argv: list[str] | None = None) -> None:
    p = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    sub = p.add_subparsers(dest="cmd", required=True)
    sub.add_parser("tables", help="list the registry")
    r = sub.add_parser("run", help="run cells, appending one row per release to --out")
    r.add_argument("--out", type=Path, required=True)
    r.add_argument("--suite", choices=sorted(SUITES), help="a named set of tables (instead of --tables)")
    r.add_argument("--tables", help="comma list of table names")
    r.add_argument("--modes", default=",".join(MODES))
    r.add_argument("--epsilons", default=",".join(f"{e:g}" for e in EPSILONS))
    r.add_argument("--mechanisms", default="noise-aware-newton")
    r.add_argument("--runs", type=int, default=5)
    r.add_argument("--first-run", type=int, default=0, help="index of the first run (extends a cell)")
    r.add_argument("--no-positive-class", dest="positive_class", action="store_false",
                   help="zero-configuration releases do NOT pass the table's class of interest as --positive-class "
                        "(the mode before the sixth rule)")
    r.add_argument("--workdir", type=Path, help="keep policies and keys here (default: a temporary directory)")
    r.add_argument("--cache", type=Path, default=CACHE, help="where the tables' CSVs are built (default: %(default)s)")
    r.add_argument("--censor-counts", action="store_true",
                   help="the thirty-fifth rule's arm X (notebook/noise_aware_variants.md): Poisson schedules with the "
                        "count's clip get Schedule.censor_counts, patched in-process (logistic ones unchanged)")
    rep = sub.add_parser("report", help="rebuild the markdown table (and plot) from the CSV")
    rep.add_argument("results", type=Path)
    rep.add_argument("target", type=Path)
    rep.add_argument("--plot", type=Path)
    rep.add_argument("--note", default="", help="a paragraph placed above the headline")
    cmp = sub.add_parser("compare", help="print how the cells of two CSVs differ (verdicts, widths, effects)")
    cmp.add_argument("before", type=Path)
    cmp.add_argument("after", type=Path)
    a = p.parse_args(argv)
    torch.set_num_threads(1)
    if a.cmd == "tables":
        for name, t in TABLES.items():
            print(f"{name:18} {t.kind:9} {t.model:8} {t.source}: {t.note}")
    elif a.cmd == "run":
        if (a.suite is None) == (a.tables is None):
            raise SystemExit("error: give exactly one of --suite or --tables")
        tables = list(SUITES[a.suite]) if a.suite else _names(a.tables, TABLES, "table")
        if a.runs < 1:
            raise SystemExit("error: --runs must be at least 1")
        if a.censor_counts:
            censor_poisson_counts()
        run_cells(a.out, tables, _names(a.modes, MODES, "mode"), _epsilons(a.epsilons),
                  _names(a.mechanisms, MECHANISMS, "mechanism"), a.runs, a.workdir, a.first_run,
                  say=lambda s: print(s, flush=True), cache=a.cache, positive_class=a.positive_class)
    elif a.cmd == "compare":
        print("\n".join(compare(a.before, a.after)))
    else:
        if not a.results.exists():
            raise SystemExit(f"error: no results file {a.results}; run `calibration.py run --out` first")
        report(a.results, a.target, a.plot, a.note)


if __name__ == "__main__":
    main()
