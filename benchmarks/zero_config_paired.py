"""Issue 50: paired zero-configuration releases, to judge a candidate where most cells that are
not honest live.

The variants harness (``noise_aware_variants.py``) replays the rounds on a table's PUBLIC schema;
the frontier puts most of the suite's cells that are not honest in zero configuration, whose DP
schema (stage 1) changes the model space, the bounds and the rounds' share of the budget from
release to release, so an unpaired comparison of two arms there is mostly the schema's noise.
Here both arms run the real release path (:func:`calibration.release`, what the CLI runs) on the
same privacy noise: for run ``r`` at ``epsilon``, every Gaussian draw of the release (stage 1's
schema and record count, the quality counts, the rounds) comes from one seeded stream
(``seed_offset + 10,000 r + 1,000 epsilon``; the data-range histogram, which only some arms
draw, from its own stream), a stand-in for OS entropy that exists only in this
benchmark process (it replaces :func:`dpsummary.private.noise.add_gaussian_noise`, the one
function every Gaussian mechanism of a GLM release draws through; the product never seeds its
privacy noise). Stage 1 happens before any arm's choice, so both arms release on the same DP
schema and are judged against the same reference; the rounds draw the same normals in the same
order until the arms' statistics differ.

An arm is today's :meth:`dpsummary.noise_aware.Schedule.default` with one change
(:data:`ARMS`), patched for this process the way ``calibration.py run --censor-counts`` patches
its arm, or another mechanism with today's schedule (:data:`ARM_MECHANISMS`: ``objective`` is
the opt-in ``noise-aware-objective``, whose tilt is drawn from a seeded stream of its own, a
continuous Gaussian standing in for the dithered one, the convention of the seeded doubles in
:mod:`dpsummary.private.objective`). Each release is judged in its own model space against the
full-data posterior and the idealised floor (:func:`calibration.artifact_reference`) by its
signed Gaussian (the posterior ``sample()``'s pseudocoreset is matched to, issue 48) and, with
``--sampled``, also by what analysts get, ``Release.sample()``'s draws. Rows are in
``noise_aware_variants.py``'s CSV form (``schedule`` = the arm, ``variant`` = ``signed`` or
``sampled``), so its ``--compare signed ARM/signed`` (or ``sampled ARM/sampled``) applies issue
50's rules (the floor's width stands in for the bound floor's: rule 2 as written, the stricter).
A run refused in either arm is left out of both and counted. ``--mode public`` runs the same
pairing through the suite's public schema (no stage 1; the rounds' draws are paired as above),
for a candidate judged through the release path in both modes.

    python benchmarks/zero_config_paired.py --tables sim_onehot_correlated --epsilons 0.3,1,3 \\
        --runs 10 --arms default,expansion-data --seed-offset S --out CSV
"""

from __future__ import annotations

import argparse
import contextlib
import csv
import dataclasses
import os
import sys
import tempfile
from collections.abc import Callable, Iterator
from pathlib import Path
from typing import Any

import numpy as np
import torch

sys.path.insert(0, str(Path(__file__).resolve().parent))

import calibration as C  # noqa: E402
import noise_aware_variants as nv  # noqa: E402


def _expansion_data(sched: Any) -> Any:
    return dataclasses.replace(sched, expansion="data") if sched.posterior == "imputed" else sched


def _expansion_gated(sched: Any) -> Any:
    """``expansion-data`` only where the convergence check fails (``Schedule.expansion_gate``)."""
    return dataclasses.replace(sched, expansion="data", expansion_gate=True) if sched.posterior == "imputed" else sched


def _six_rounds(sched: Any) -> Any:
    """One more placement round (0.05, 0.05) before the last, its shares taken from the last
    round's (the K pilot's idea as a fixed schedule; logistic only)."""
    from dpsummary import noise_aware as na

    if sched.rounds != na.DEFAULT_ROUNDS:
        return sched
    *placement, (s_last, c_last) = na.DEFAULT_ROUNDS
    return dataclasses.replace(sched, rounds=(*placement, (0.05, 0.05), (s_last - 0.05, c_last - 0.05)))


def _feature_range(sched: Any) -> Any:
    """The thirtieth rule's N (forty-fifth rule): 5% of the budget on the DP histogram of the
    features' L2 norm whose noisy quantile sets the rounds' feature norm, taken from the rounds in
    proportion (``noise_aware_variants.SCHEDULES["N"]``; logistic only)."""
    from dpsummary import noise_aware as na

    return nv._with_feature_range(sched, nv.N_FEATURE_RANGE_SHARE) if sched.rounds == na.DEFAULT_ROUNDS else sched


#: The arms: today's default schedule with one change each (post-processing or the rounds' split,
#: each declared to the accountant by the schedule's own events).
ARMS: dict[str, Callable[[Any], Any]] = {
    "default": lambda sched: sched,
    "expansion-data": _expansion_data,
    "expansion-gated": _expansion_gated,
    "six-rounds": _six_rounds,
    "feature-range": _feature_range,
    "objective": lambda sched: sched,
}

#: Arms that release through another mechanism than the default's (with today's schedule):
#: ``objective`` is the opt-in ``noise-aware-objective`` (issue 50's objective perturbation;
#: logistic tables only). Stage 1 comes before the mechanism, so it is paired as for any arm.
ARM_MECHANISMS: dict[str, str] = {"objective": "noise-aware-objective"}
DEFAULT_MECHANISM = "noise-aware-newton"
#: The objective arm's tilt (``noise.dithered_gaussian``) draws from its own seeded stream, offset
#: from the run's seed like the data-range histogram's, so its draws never shift the main stream's.
TILT_SEED_OFFSET = 7_000_000


@contextlib.contextmanager
def seeded_release(seed: int, arm: str) -> Iterator[None]:
    """For the ``with`` block: every Gaussian draw from one numpy stream seeded with ``seed``
    (continuous normals standing in for OpenDP's discrete Gaussian from OS entropy), and
    :meth:`Schedule.default` giving ``arm``'s schedule. Restored on exit."""
    from dpsummary import noise_aware as na
    from dpsummary.private import noise, preprocess
    from dpsummary.private.mechanism import PrivateRecords

    streams = {"main": np.random.default_rng(seed), "range": np.random.default_rng(seed + nv.RANGE_SEED_OFFSET),
               "tilt": np.random.default_rng(seed + TILT_SEED_OFFSET)}
    current = ["main"]

    def gaussian(values: np.ndarray, *, noise_std: float, clip_norm: float) -> np.ndarray:
        v = np.asarray(values, dtype=np.float64)
        return v + noise_std * streams[current[0]].standard_normal(v.shape)

    def tilt(dim: int, *, noise_std: float) -> np.ndarray:
        # A continuous Gaussian standing in for the dithered discrete one (the seeded doubles'
        # convention, dpsummary.private.objective's docstring).
        return noise_std * streams["tilt"].standard_normal(dim)

    marginals = PrivateRecords.noisy_marginals

    def range_marginals(self: Any, layout: Any, *, noise_multiplier: float) -> Any:
        # The data-range histogram (and any other per-column histogram) from its own stream.
        current[0] = "range"
        try:
            return marginals(self, layout, noise_multiplier=noise_multiplier)
        finally:
            current[0] = "main"

    today = na.Schedule.default
    change = ARMS[arm]

    def default(cls: type[Any], model: Any) -> Any:
        return change(today(model))

    saved = (noise.add_gaussian_noise, preprocess.add_gaussian_noise)
    saved_tilt = noise.dithered_gaussian
    noise.add_gaussian_noise = gaussian  # type: ignore[assignment]
    preprocess.add_gaussian_noise = gaussian  # type: ignore[assignment]
    noise.dithered_gaussian = tilt  # type: ignore[assignment]
    na.Schedule.default = classmethod(default)  # type: ignore[method-assign, assignment]
    PrivateRecords.noisy_marginals = range_marginals  # type: ignore[method-assign]
    try:
        yield
    finally:
        noise.add_gaussian_noise, preprocess.add_gaussian_noise = saved  # type: ignore[assignment]
        noise.dithered_gaussian = saved_tilt  # type: ignore[assignment]
        na.Schedule.default = today  # type: ignore[method-assign]
        PrivateRecords.noisy_marginals = marginals  # type: ignore[method-assign]


def judged(art: Path, data: Path, epsilon: float, *, sampled: bool = False) -> dict[str, dict[str, Any]]:
    """The release judged in its own model space (module docstring), one row per variant:
    ``signed`` (always) the Gaussian the release signs; ``sampled`` (with ``sampled``) what
    analysts get, ``Release.sample()``'s default draws with their quantile intervals, judged as
    the suite judges them (:func:`calibration.judge_artifact`). The floor's figures are the
    reference's, shared by both."""
    import warnings

    from dpsummary.gaussian import GaussianPosterior
    from dpsummary.metrics import draws_report

    rel, ref = C.artifact_reference(art, data, epsilon)
    g = rel.body["posterior"]["gaussians"][rel.body["posterior"]["default"]]
    cov = torch.tensor(g["cov"], dtype=torch.float64)
    gauss = GaussianPosterior(mean=torch.tensor(g["mean"], dtype=torch.float64),
                              scale_tril=torch.linalg.cholesky(0.5 * (cov + cov.T)))
    j = C.judge(gauss, ref)
    keys = ("coverage", "width_ratio", "floor_width_ratio", "floor_coverage", "effects_found", "floor_effects_found",
            "effects_wrong_sign", "mean_error_sd_max", "floor_wrong_sign")
    signed = {k: j[k] for k in keys}
    signed["bound_floor_width_ratio"] = j["floor_width_ratio"]
    signed["param_dim"] = int(ref.full.mean.shape[0])
    out = {"signed": signed}
    if sampled:
        with warnings.catch_warnings():
            warnings.simplefilter("ignore")  # the suite records the sampler's diagnostics; here only the intervals
            draws = rel.sample(C.SAMPLED_DRAWS, seed=0)
        d = draws_report(np.asarray(draws), ref.full, floor=ref.floor)
        out["sampled"] = {**signed, **{k: d[k] for k in ("coverage", "width_ratio", "effects_found",
                                                         "effects_wrong_sign", "mean_error_sd_max")}}
    return out


def run(tables: list[str], epsilons: list[float], runs: int, arms: list[str], seed_offset: int, out: Path, *,
        sampled: bool = False, mode: str = "zero-config") -> None:
    rows: list[dict[str, Any]] = []
    refused = 0
    with tempfile.TemporaryDirectory() as tmp:
        os.environ["DPSUMMARY_HOME"] = str(Path(tmp) / "home")
        for table in tables:
            spec = C.TABLES[table]
            data = C.table_csv(spec)
            (Path(tmp) / table).mkdir()
            for eps in epsilons:
                for r in range(runs):
                    seed = seed_offset + 10_000 * r + int(1000 * eps)
                    got: dict[str, dict[str, dict[str, Any]]] = {}
                    for arm in arms:
                        try:
                            with seeded_release(seed, arm):
                                art = C.release(spec, data, mode, eps,
                                                ARM_MECHANISMS.get(arm, DEFAULT_MECHANISM), r, Path(tmp) / table)
                        except Exception as exc:  # noqa: BLE001 - a refusal leaves the run out of both arms
                            print(f"{table} eps {eps:g} run {r} {arm}: {type(exc).__name__}: {exc}", file=sys.stderr)
                            break
                        got[arm] = judged(art, data, eps, sampled=sampled)
                        art.unlink(missing_ok=True)
                    if len(got) != len(arms):
                        refused += 1
                        continue
                    for arm in arms:
                        for variant, judgement in got[arm].items():
                            rows.append({"table": table, "mode": mode, "epsilon": eps, "run": r, "schedule": arm,
                                         "variant": variant, **judgement})
                    print(f"{table} eps {eps:g} run {r}: " + ", ".join(
                        f"{a} {v} cov {j['coverage']:.2f} w {j['width_ratio']:.2f}" for a in arms
                        for v, j in got[a].items()), file=sys.stderr, flush=True)
    out.parent.mkdir(parents=True, exist_ok=True)
    with out.open("w", newline="") as fh:
        writer = csv.DictWriter(fh, fieldnames=list(rows[0]) if rows else ["table"])
        writer.writeheader()
        writer.writerows(rows)
    print(f"{len(rows)} rows, {refused} runs refused in some arm (left out of every arm)", file=sys.stderr)


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--tables", required=True)
    ap.add_argument("--epsilons", default="0.1,0.3,1,3")
    ap.add_argument("--runs", type=int, default=10)
    ap.add_argument("--arms", default="default,expansion-data")
    ap.add_argument("--seed-offset", type=int, required=True)
    ap.add_argument("--out", type=Path, required=True)
    ap.add_argument("--mode", choices=("zero-config", "public"), default="zero-config",
                    help="the schema the releases use (default: zero configuration, stage 1 paired)")
    ap.add_argument("--sampled", action="store_true",
                    help="also judge Release.sample()'s draws (rows with variant 'sampled'; NUTS per release)")
    a = ap.parse_args()
    arms = C._names(a.arms, ARMS, "arm")
    if "default" not in arms:
        raise SystemExit("error: --arms must include default (the baseline)")
    tables = C._names(a.tables, C.TABLES, "table")
    if "objective" in arms and any(C.TABLES[t].model != "logistic" for t in tables):
        raise SystemExit("error: the objective arm is for logistic tables only; drop the others from --tables")
    torch.set_num_threads(1)
    run(tables, [float(e) for e in a.epsilons.split(",")], a.runs, arms, a.seed_offset, a.out, sampled=a.sampled,
        mode=a.mode)


if __name__ == "__main__":
    main()
