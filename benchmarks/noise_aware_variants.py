"""Issue 37 diagnosis: where does the default (noise-aware-newton) lose width and coverage on a
real table, and which change to its post-processing would help?

Each run replays the default mechanism in process on one table of the calibration suite
(:mod:`calibration`: the same table registry, public schema, full-data posterior, idealised floor
and judge), at the calibration a public-schema release with a private record count gets (the
count's Gaussian sized by :func:`dpsummary.accounting.calibrate_part` at the packaged default's
count share, then the schedule calibrated under RDP to the whole epsilon with the count as prior
event), with real OS-entropy noise (``--paired``: seeded noise shared by the schedules of a run,
so schedules are compared on the same draws). It keeps every round's DP outputs, so
post-processing variants are judged on the SAME noisy releases:

* ``plug-in`` - today's posterior (:func:`dpsummary.noise_aware.noise_aware_posterior`: the
  noisy curvature plugged in, its noise's effect on the score through ``E u``);
* ``imputed`` - the curvature integrated out by multiple imputation
  (:func:`dpsummary.noise_aware.imputed_posterior`: 200 draws of the true curvature from its
  flat-prior posterior given the release, the noisy matrix plus fresh noise of the mechanism's
  structure, PSD part; the noise-aware posterior given each draw; their moment-matched mixture;
  Bernstein and Sheldon 2018 treat the statistic as latent, this is the Monte Carlo version);
* ``lowered`` - the curvature lowered by the 95% quantile of the noise's largest eigenvalue (a
  Loewner lower confidence bound on the true curvature), so no direction is credited with
  information the noise could have made up.

Diagnostics per run: the last anchor's distance from the full-data mean, the score noise
variance against the curvature-noise term ``tau^2 |u|^2`` it shares the statistic with, and the
noisy curvature's spectrum against the data's.

Usage::

    python benchmarks/noise_aware_variants.py --table napsu_adult --epsilons 0.1,0.3,0.5,1 --runs 12 \\
        --out benchmarks/results/noise_aware_variants.csv
    # a rule's checks on two arms of the same runs (a variant, or schedule/variant):
    python benchmarks/noise_aware_variants.py --compare imputed trace \\
        --out benchmarks/results/noise_aware_trace.csv
"""

from __future__ import annotations

import argparse
import csv
import dataclasses
import math
import statistics
import sys
from collections import defaultdict
from pathlib import Path
from typing import Any

import torch

sys.path.insert(0, str(Path(__file__).resolve().parent))
import calibration as cal  # noqa: E402

from dpsummary import accounting as acc  # noqa: E402
from dpsummary import noise_aware as na  # noqa: E402
from dpsummary import objective_event  # noqa: E402
from dpsummary.gaussian import DTYPE, GaussianPosterior  # noqa: E402
from dpsummary.noise_aware.objective import OP_JACOBIAN_SHARE, OP_OUTPUT_MULTIPLIER  # noqa: E402

#: The packaged default's record-count share of a public-schema release (normalised without the
#: schema and initialisation shares: count 0.10 of count + quality + optimisation).
COUNT_SHARE = 0.10 / (0.10 + 0.05 + 0.75)


def _table(name: str, prior_scale: float = 1.0) -> tuple[Any, torch.Tensor, float, float]:
    from dpsummary.data import Schema, Transform, read_csv
    from dpsummary.models import get_model_class

    spec = cal.TABLES[name]
    path = cal.table_csv(spec)
    schema = Schema.model_validate(cal.public_schema(spec, path))
    tf = Transform.from_schema(schema)
    pts = tf.to_points(read_csv(path)).to(DTYPE)
    model = get_model_class(spec.model)(tf.num_features, prior_scale=prior_scale)
    fn, tb = na.schema_bounds(tf)
    _RELATIONS[name] = na.model_relations(tf, model)
    _SUPPORTS[name] = na.curvature_support(tf, model)
    return model, pts, fn, tb


#: Each table's public candidate relations (:func:`dpsummary.noise_aware.model_relations`), set by
#: :func:`_table` (the thirty-eighth rule's candidate reads them).
_RELATIONS: dict[str, torch.Tensor] = {}
#: Each table's public curvature support (:func:`dpsummary.noise_aware.curvature_support`; the
#: fortieth rule's candidate reads them).
_SUPPORTS: dict[str, na.CurvatureSupport | None] = {}


#: N's share of the budget for the features' norm histogram (thirteenth, thirtieth and
#: forty-fifth rules).
N_FEATURE_RANGE_SHARE = 0.05

#: The logistic schedule candidates of the rule in results/noise_aware_variants.md (written before
#: they were run); ``default`` is whatever :meth:`Schedule.default` gives today.
SCHEDULES: dict[str, Any] = {
    "default": na.Schedule.default,
    "A": lambda m: na.Schedule(na.THREE_ROUNDS),
    "B": lambda m: na.Schedule(na.THREE_ROUNDS, anchor="log-odds"),
    "C": lambda m: na.Schedule(((0.03, 0.04), (0.04, 0.08), (0.05, 0.1), (0.46, 0.2)), anchor="log-odds"),
    "D": lambda m: na.Schedule(((0.02, 0.04), (0.03, 0.05), (0.04, 0.07), (0.05, 0.1), (0.45, 0.15))),
    # Third rule: today's default for logistic regression (D, imputed) against E (the same with
    # intermediate anchors under a prior centred at the current anchor).
    "D-imputed": lambda m: na.Schedule(na.DEFAULT_ROUNDS, posterior="imputed"),
    "E": lambda m: na.Schedule(na.DEFAULT_ROUNDS, posterior="imputed", step_prior="anchor"),
    # Fourth rule: the last round's (score, curvature) split.
    "F": lambda m: na.Schedule((*na.DEFAULT_ROUNDS[:-1], (0.35, 0.25)), posterior="imputed"),
    "G": lambda m: na.Schedule((*na.DEFAULT_ROUNDS[:-1], (0.3, 0.3)), posterior="imputed"),
    # Tenth rule: today's default with the log-odds anchor and the prior's intercept centred there.
    "P": lambda m: na.Schedule(na.DEFAULT_ROUNDS, posterior="imputed", anchor="log-odds", prior_centre="log-odds"),
    # Thirteenth rule: today's default plus the features' norm clipped at a DP quantile, its share
    # taken from the rounds in proportion.
    "N": lambda m: _with_feature_range(na.Schedule.default(m), N_FEATURE_RANGE_SHARE),
    # Twenty-second and twenty-third rules: today's logistic default with the log-odds anchor
    # alone (Poisson: its own default).
    "L": lambda m: (dataclasses.replace(na.Schedule.default(m), anchor="log-odds") if m.name == "logistic"
                    else na.Schedule.default(m)),
    # Twenty-fourth rule: today's logistic default with the last round's split chosen by the
    # preposterior analysis (Poisson: its own default).
    "S": lambda m: (dataclasses.replace(na.Schedule.default(m), last_split="preposterior") if m.name == "logistic"
                    else na.Schedule.default(m)),
    # Twenty-fifth rule: placement rounds merged into the last once the anchor has settled (R),
    # and with the preposterior split (RS).
    "R": lambda m: (dataclasses.replace(na.Schedule.default(m), merge_rounds=True) if m.name == "logistic"
                    else na.Schedule.default(m)),
    "RS": lambda m: (dataclasses.replace(na.Schedule.default(m), merge_rounds=True, last_split="preposterior")
                     if m.name == "logistic" else na.Schedule.default(m)),
    # Thirty-second rule (issue 50): the Poisson default with counts at the clip bound censored
    # (logistic: its own default).
    "X": lambda m: (dataclasses.replace(na.Schedule.default(m), censor_counts=True) if m.name == "poisson"
                    else na.Schedule.default(m)),
}


# Issue 50's objective perturbation (``notebook/objective_perturbation.md``): OP_JACOBIAN_SHARE
# and OP_OUTPUT_MULTIPLIER are the release's (dpsummary.noise_aware.objective, imported above).
#: ``OP-last``: today's logistic placement rounds, then objective perturbation (ridge centred at
#: their anchor) and a curvature at its output with the last round's (score, curvature) shares;
#: ``OP-only``: no placement rounds, the ridge at the prior mean, the same split of the whole;
#: ``OP-1``: today's first placement round only, the ridge at its anchor, the rest split as
#: ``OP-only`` splits the whole.
OP_SCHEDULES = ("OP-last", "OP-only", "OP-1", "OP-1j")
#: ``OP-1j`` (the fiftieth rule): ``OP-1`` with this Jacobian share (a ridge with four times the room).
OP_1J_JACOBIAN_SHARE = 0.2


def objective_epsilon(scale: float, delta: float, *, placement: tuple[tuple[float, float], ...],
                      shares: tuple[float, float], jacobian: float, count_multiplier: float, dim: int) -> float:
    """Epsilon (the RDP accountant of record, at ``delta``) of an objective-perturbation arm at
    single scale ``scale``, from the ledger events a release would record
    (:func:`objective_events`)."""
    return acc.epsilon(objective_events(scale, placement=placement, shares=shares, jacobian=jacobian,
                                        count_multiplier=count_multiplier, dim=dim), delta, "rdp")


def objective_events(scale: float, *, placement: tuple[tuple[float, float], ...], shares: tuple[float, float],
                     jacobian: float, count_multiplier: float, dim: int) -> list[Any]:
    """The events of an objective-perturbation arm: the record count's Gaussian, the placement
    rounds' Gaussians at ``scale / sqrt(share)``, objective perturbation at ``scale /
    sqrt(shares[0])`` with Jacobian term ``jacobian`` in ``dim`` coordinates
    (:class:`dpsummary.objective_event.ObjectivePerturbationDpEvent`, the release's dithered tilt;
    its curve also bounds the seeded continuous tilt of ``--paired``), the output perturbation's
    Gaussian at ``OP_OUTPUT_MULTIPLIER`` and the curvature's at ``scale / sqrt(shares[1])``."""
    from dpsummary.objective_event import ObjectivePerturbationDpEvent
    from dpsummary.private.noise import TILT_GRID_RATIO

    events = [acc.gaussian_event(count_multiplier)]
    for s_share, c_share in placement:
        events += [acc.gaussian_event(scale / math.sqrt(s_share)), acc.gaussian_event(scale / math.sqrt(c_share))]
    return [*events, ObjectivePerturbationDpEvent(noise_multiplier=scale / math.sqrt(shares[0]), jacobian_log_ratio=jacobian,
                                                  dim=dim, grid_ratio=TILT_GRID_RATIO),
            acc.gaussian_event(OP_OUTPUT_MULTIPLIER), acc.gaussian_event(scale / math.sqrt(shares[1]))]


def objective_scale(epsilon: float, delta: float, **arm: Any) -> float:
    """The smallest single scale (to 1e-7 relative) whose :func:`objective_epsilon` meets ``epsilon``."""
    lo, hi = 1e-2, 1e6
    if objective_epsilon(hi, delta, **arm) > epsilon:
        raise ValueError("objective perturbation cannot meet this epsilon")
    while hi / lo > 1 + 1e-7:
        mid = math.sqrt(lo * hi)
        lo, hi = (mid, hi) if objective_epsilon(mid, delta, **arm) > epsilon else (lo, mid)
    return hi


def _fit_objective(model: Any, pts: torch.Tensor, fn: float, tb: float, epsilon: float, delta: float,
                   schedule: str, randomness: Any = None) -> na.NoiseAwareFit:
    """One release of an objective-perturbation arm (``OP_SCHEDULES``), calibrated under RDP to
    the whole ``epsilon`` with the record count's Gaussian as a prior part, as :func:`_fit` calibrates
    today's schedule: a single scale ``s`` with every Gaussian at ``s / sqrt(share)`` and the
    perturbed objective's noise at ``s / sqrt(score share)`` (its RDP curve,
    :class:`dpsummary.objective_event.ObjectivePerturbationDpEvent`, with the Jacobian term
    ``OP_JACOBIAN_SHARE * epsilon``), ``s`` bisected until the composed curve's epsilon meets the target.
    Its last ``RoundRelease`` is the perturbed mode read as a Newton round at that point."""
    from dpsummary.noise_aware.rounds import init, step
    from dpsummary.private.mechanism import SystemRandomness
    from dpsummary.private.objective import noisy_curvature, perturbed_mode
    from dpsummary.private.score_stats import noisy_score_statistics

    if model.name != "logistic":
        raise ValueError("the objective-perturbation arms are logistic only")
    if schedule in ("OP-1", "OP-1j"):
        return _fit_objective_release(model, pts, fn, tb, epsilon, delta, randomness,
                                      jacobian_share=OP_1J_JACOBIAN_SHARE if schedule == "OP-1j" else OP_JACOBIAN_SHARE)
    sched = na.Schedule.default(model)
    placement = {"OP-last": sched.rounds[:-1], "OP-1": sched.rounds[:1]}.get(schedule, ())
    last = sched.rounds[-1]
    rest = 1.0 - sum(sum(r) for r in placement)
    op_share, curv_share = last if schedule == "OP-last" else (rest * last[0] / sum(last), rest * last[1] / sum(last))
    design_norm = model.design_norm_bound(fn)
    # The ridge whose Jacobian term is OP_JACOBIAN_SHARE of epsilon; the accounted term is then
    # derived from the ridge actually used.
    ridge = (design_norm**2 / 4.0) / -math.expm1(-OP_JACOBIAN_SHARE * epsilon)
    jacobian = objective_event.objective_perturbation_jacobian(curvature_bound=design_norm**2 / 4.0, ridge=ridge)
    count = acc.calibrate_part(target_epsilon=COUNT_SHARE * epsilon, delta=delta)
    scale = objective_scale(epsilon, delta, placement=placement, shares=(op_share, curv_share), jacobian=jacobian,
                            count_multiplier=count, dim=model.param_dim)
    rnd = randomness if randomness is not None else SystemRandomness()
    bounds = na.public_bounds(model, feature_norm=fn, target_bound=tb)

    def release(theta: torch.Tensor, sb: float, cb: float, sm: float, cm: float) -> tuple[torch.Tensor, torch.Tensor]:
        st = noisy_score_statistics(pts, rnd, model, theta, score_bound=sb, curvature_bound=cb,
                                    score_noise_multiplier=sm, curvature_noise_multiplier=cm)
        return st.score, st.curvature

    state = init(model)
    multipliers = []
    for shares in placement:
        mult = (scale / math.sqrt(shares[0]), scale / math.sqrt(shares[1]))
        state = step(state, model, release, bounds, mult, schedule=sched)
        multipliers.append(mult)
    mode = perturbed_mode(pts, rnd, model, feature_norm=fn, ridge=ridge, centre=state.anchor,
                          noise_multiplier=scale / math.sqrt(op_share), output_multiplier=OP_OUTPUT_MULTIPLIER)
    curvature_bound = bounds(mode.theta)[1]
    curv_mult = scale / math.sqrt(curv_share)
    curvature = noisy_curvature(pts, rnd, model, mode.theta, curvature_bound=curvature_bound,
                                noise_multiplier=curv_mult)
    final = na.RoundRelease(anchor=mode.theta, score=mode.score, curvature=curvature, score_bound=design_norm,
                            curvature_bound=curvature_bound, score_noise_std=mode.score_noise_std,
                            curvature_noise_std=curv_mult * curvature_bound)
    multipliers.append((scale / math.sqrt(op_share), curv_mult))
    posterior, raw = na.noise_aware_posterior(model, final)  # finite, or NonFiniteFit
    return na.NoiseAwareFit(posterior=posterior, raw_posterior=raw, rounds=[*state.rounds, final],
                            noise_multipliers=multipliers, model=model, schedule=sched)


def _fit_objective_release(model: Any, pts: torch.Tensor, fn: float, tb: float, epsilon: float, delta: float,
                           randomness: Any = None, *, jacobian_share: float = OP_JACOBIAN_SHARE) -> na.NoiseAwareFit:
    """``OP-1`` through the release's own code (``--mechanism noise-aware-objective``): its plan
    (:func:`dpsummary.noise_aware.objective.objective_schedule`), its calibration with the record
    count's Gaussian as the prior part, its last round and :func:`dpsummary.noise_aware.fit` with
    the release's schedule flags; the harness's variants then read its rounds as before."""
    from dpsummary.noise_aware.objective import (
        calibrate_objective,
        objective_schedule,
        records_round,
    )
    from dpsummary.private.mechanism import PrivateRecords

    plan = objective_schedule(model, epsilon=epsilon, feature_norm=fn, jacobian_share=jacobian_share)
    count = acc.gaussian_event(acc.calibrate_part(target_epsilon=COUNT_SHARE * epsilon, delta=delta))
    sigma, _ = calibrate_objective(plan, target_epsilon=epsilon, delta=delta, prior_events=[count])
    records = PrivateRecords(pts, randomness=randomness)
    bounds = na.public_bounds(model, feature_norm=fn, target_bound=tb)

    def release(theta: torch.Tensor, sb: float, cb: float, sm: float, cm: float) -> tuple[torch.Tensor, torch.Tensor]:
        st = records.noisy_score_statistics(model, theta, score_bound=sb, curvature_bound=cb,
                                            score_noise_multiplier=sm, curvature_noise_multiplier=cm)
        return st.score, st.curvature

    return na.fit(model, release, bounds, schedule=plan.schedule, sigma=sigma, feature_norm=fn, target_bound=tb,
                  generator=torch.Generator().manual_seed(0), relations=None, support=None,
                  last=records_round(plan, records, model, feature_norm=fn, bounds=bounds))


def _with_feature_range(sched: na.Schedule, share: float) -> na.Schedule:
    factor = (1.0 - sched.count_range - share) / (1.0 - sched.count_range)
    return dataclasses.replace(sched, rounds=tuple((s * factor, c * factor) for s, c in sched.rounds),
                               feature_range=share)


def _fit(model: Any, pts: torch.Tensor, fn: float, tb: float, epsilon: float, delta: float,
         schedule: str = "default", randomness: Any = None, range_randomness: Any = None,
         relations: torch.Tensor | None = None, support: na.CurvatureSupport | None = None) -> na.NoiseAwareFit:
    """One release's rounds on ``pts``; ``randomness`` draws the rounds' noise and
    ``range_randomness`` (default: the same) the data-range histogram's, so that paired arms
    whose range histograms differ still draw the same noise in their rounds (thirtieth rule)."""
    from dpsummary.private.mechanism import SystemRandomness
    from dpsummary.private.score_stats import noisy_score_statistics

    if schedule in OP_SCHEDULES:
        return _fit_objective(model, pts, fn, tb, epsilon, delta, schedule, randomness)
    sched = SCHEDULES[schedule](model)
    count = acc.gaussian_event(acc.calibrate_part(target_epsilon=COUNT_SHARE * epsilon, delta=delta))
    sigma, _ = na.calibrate(sched, target_epsilon=epsilon, delta=delta, prior_events=[count])
    rnd = SystemRandomness() if randomness is None else randomness

    fn, tb = cal.release_bounds(sched, sigma, pts, fn, tb, rnd if range_randomness is None else range_randomness)
    bounds = na.public_bounds(model, feature_norm=fn, target_bound=tb)
    statistic_model = na.statistic_model(model, sched, tb)

    def release(theta: torch.Tensor, sb: float, cb: float, sm: float, cm: float) -> tuple[torch.Tensor, torch.Tensor]:
        st = noisy_score_statistics(pts, rnd, statistic_model, theta, score_bound=sb, curvature_bound=cb,
                                    score_noise_multiplier=sm, curvature_noise_multiplier=cm)
        return st.score, st.curvature

    return na.fit(model, release, bounds, schedule=sched, sigma=sigma, feature_norm=fn, target_bound=tb,
                  generator=torch.Generator().manual_seed(0), relations=relations, support=support)



def _symmetric_noise(dim: int, tau: float, g: torch.Generator) -> torch.Tensor:
    return na.symmetric_noise(dim, tau, g)


def imputed(model: Any, rel: na.RoundRelease, g: torch.Generator) -> GaussianPosterior:
    """The package's imputed posterior (:func:`dpsummary.noise_aware.imputed_posterior`)."""
    return na.imputed_posterior(model, rel, generator=g)


_EDGE: dict[int, float] = {}


def lowered(model: Any, rel: na.RoundRelease, g: torch.Generator) -> GaussianPosterior:
    dim = rel.curvature.shape[0]
    if dim not in _EDGE:
        tops = [float(torch.linalg.eigvalsh(_symmetric_noise(dim, 1.0, g)).max()) for _ in range(2000)]
        _EDGE[dim] = sorted(tops)[int(0.95 * len(tops))]
    h = rel.curvature - _EDGE[dim] * rel.curvature_noise_std * torch.eye(dim, dtype=DTYPE)
    return na.noise_aware_posterior(model, dataclasses.replace(rel, curvature=h))[0]


def expansion(eta_rule: str) -> Any:
    """The seventh rule's candidates: the imputed posterior with the expansion's error
    integrated out (:func:`dpsummary.noise_aware.expansion_aware`, ``eta_rule`` box or data)."""
    def variant(m: Any, rounds: list[na.RoundRelease], g: torch.Generator, fn: float) -> GaussianPosterior:
        rel = rounds[-1]
        return na.expansion_aware(m, na.imputed_posterior(m, rel, generator=g), rel, feature_norm=fn,
                                  eta_rule=eta_rule)
    return variant


def pooled(m: Any, rounds: list[na.RoundRelease], g: torch.Generator, fn: float) -> GaussianPosterior:
    """The eighth rule's candidate: the imputed posterior of the pooled rounds
    (:func:`dpsummary.noise_aware.pooled_release`)."""
    return na.imputed_posterior(m, na.pooled_release(m, rounds, feature_norm=fn), generator=g)


def curvature_pooled(m: Any, rounds: list[na.RoundRelease], g: torch.Generator, fn: float) -> GaussianPosterior:
    """The ninth rule's candidate: the imputed posterior of the last round with its curvature
    pooled (:func:`dpsummary.noise_aware.pooled_curvature_release`)."""
    return na.imputed_posterior(m, na.pooled_curvature_release(m, rounds), generator=g)


#: The eleventh rule's draws for the weighted imputation (importance weights need more draws
#: than the unweighted mixture's 200; written before its run).
WEIGHTED_DRAWS = 1000
_DIAG: dict[str, float] = {}


def weighted(m: Any, rounds: list[na.RoundRelease], g: torch.Generator, fn: float) -> GaussianPosterior:
    """A candidate tried and dropped before any rule (results/noise_aware_variants.md, after the
    tenth change): the imputed posterior with each curvature draw H weighted by the marginal
    likelihood of the released score, ``N(s; H (mu0 - a), H + v I + s0^2 H^2)`` (theta integrated
    out under the prior), i.e. the curvature's posterior given the whole release by self-normalised
    importance sampling from the unweighted draws. Records the effective number of draws."""
    rel = rounds[-1]
    dim = rel.curvature.shape[0]
    prior_var = m.prior_scale**2
    mu0, a, s, v = m.prior_mean.to(DTYPE), rel.anchor, rel.score, rel.score_noise_std**2
    means, covs, logw = [], [], []
    for _ in range(WEIGHTED_DRAWS):
        draw = rel.curvature + na.symmetric_noise(dim, rel.curvature_noise_std, g)
        lam, q = torch.linalg.eigh(0.5 * (draw + draw.T))
        lam = lam.clamp(min=0.0)
        gain = lam / (lam + v)
        prec = lam * gain + 1.0 / prior_var
        means.append(q @ ((gain * (q.T @ s + lam * (q.T @ a)) + (q.T @ mu0) / prior_var) / prec))
        covs.append((q / prec) @ q.T)
        var = lam + v + prior_var * lam * lam
        resid = q.T @ s - lam * (q.T @ (mu0 - a))
        logw.append(float(-0.5 * (torch.log(var).sum() + (resid * resid / var).sum())))
    w = torch.softmax(torch.tensor(logw, dtype=DTYPE), 0)
    _DIAG["ess"] = float(1.0 / (w * w).sum())
    stacked = torch.stack(means)
    centre = w @ stacked
    dev = stacked - centre
    cov = torch.einsum("k,kab->ab", w, torch.stack(covs)) + (dev * w[:, None]).T @ dev
    return GaussianPosterior(centre, torch.linalg.cholesky(0.5 * (cov + cov.T)))


def debiased(m: Any, rounds: list[na.RoundRelease], g: torch.Generator, fn: float) -> GaussianPosterior:
    """The eleventh rule's candidate (results/noise_aware_variants.md; not adopted): the imputed
    posterior with each draw's eigenvalues debiased by the spiked-Wigner inversion, noise sd
    ``sqrt(2) tau`` (the draw's about the true curvature), 0 below the bulk edge."""
    rel = rounds[-1]
    noise2 = 2.0 * rel.curvature_noise_std**2 * rel.curvature.shape[0]

    def spectrum(ell: torch.Tensor) -> torch.Tensor:
        disc = ell * ell - 4.0 * noise2
        return torch.where((ell > 0) & (disc > 0), 0.5 * (ell + disc.clamp(min=0).sqrt()), torch.zeros_like(ell))

    return na.imputed_posterior(m, rel, generator=g, spectrum=spectrum)


def soft(m: Any, rounds: list[na.RoundRelease], g: torch.Generator, fn: float) -> GaussianPosterior:
    """The twenty-sixth rule's candidate (results/noise_aware_variants.md): the imputed posterior
    with each draw's eigenvalues lowered by a pure-noise draw's mean positive eigenvalue,
    ``8 s sqrt(d) / (3 pi)`` with ``s = sqrt(2) tau``, clamped at 0."""
    rel = rounds[-1]
    kappa = 8.0 * math.sqrt(2.0) * rel.curvature_noise_std * math.sqrt(rel.curvature.shape[0]) / (3.0 * math.pi)
    return na.imputed_posterior(m, rel, generator=g, spectrum=lambda ell: (ell - kappa).clamp(min=0.0))


def trace(m: Any, rounds: list[na.RoundRelease], g: torch.Generator, fn: float) -> GaussianPosterior:
    """The twenty-seventh rule's candidate: :func:`dpsummary.noise_aware.imputed_posterior` with
    each draw projected onto the PSD matrices of its own trace."""
    return na.imputed_posterior(m, rounds[-1], generator=g, spectrum=na.trace_kept_spectrum)


def relations(table: str) -> Any:
    """The thirty-eighth rule's candidate (notebook, 2026-11-29): ``trace`` with each draw projected
    off the table's public one-hot relations the last round's curvature does not tell from exact
    (``Schedule.relations``, module docstring 17.). Identical to ``trace`` (same draws) where the
    table has no candidate relation."""
    def variant(m: Any, rounds: list[na.RoundRelease], g: torch.Generator, fn: float) -> GaussianPosterior:
        rel = rounds[-1]
        exact = na.exact_relations(_RELATIONS[table], rel.curvature, rel.curvature_noise_std)
        return na.imputed_posterior(m, rel, generator=g, spectrum=na.trace_kept_spectrum, relations=exact)
    return variant


def supported(table: str) -> Any:
    """The fortieth rule's candidate (notebook, 2026-11-29): :func:`relations` with each imputed
    curvature drawn under a flat prior on the one-hot support of the curvature (``Schedule.support``,
    module docstring 18.). Identical to :func:`relations` (the same draws) on a table without a
    categorical column."""
    def variant(m: Any, rounds: list[na.RoundRelease], g: torch.Generator, fn: float) -> GaussianPosterior:
        rel = rounds[-1]
        exact = na.exact_relations(_RELATIONS[table], rel.curvature, rel.curvature_noise_std)
        return na.imputed_posterior(m, rel, generator=g, spectrum=na.trace_kept_spectrum, relations=exact,
                                    support=_SUPPORTS[table])
    return variant


def supported_expansion(table: str) -> Any:
    """The forty-second rule's candidate (notebook, 2026-11-29): :func:`supported` (today's
    posterior) with the last expansion's error integrated out as ``rounds.fit`` applies
    ``Schedule.expansion = "data"`` (:func:`dpsummary.noise_aware.expansion_aware`)."""
    inner = supported(table)

    def variant(m: Any, rounds: list[na.RoundRelease], g: torch.Generator, fn: float) -> GaussianPosterior:
        return na.expansion_aware(m, inner(m, rounds, g, fn), rounds[-1], feature_norm=fn, eta_rule="data")
    return variant


def supported_expansion_gated(table: str, converged: bool) -> Any:
    """``support-expansion`` only where the release's convergence check failed (``rounds.fit``
    with ``Schedule.expansion_gate``, forty-third rule), else ``support``: the check is read from
    the fit of today's default, whose step it measures, as ``rounds.fit`` measures it."""
    return supported(table) if converged else supported_expansion(table)


#: Post-processing variants of one fit: ``(model, the fit's rounds, generator, feature norm)``.
VARIANTS = {"plug-in": lambda m, rs, g, fn: na.noise_aware_posterior(m, rs[-1])[0],
            "imputed": lambda m, rs, g, fn: imputed(m, rs[-1], g),
            "lowered": lambda m, rs, g, fn: lowered(m, rs[-1], g),
            "expansion-box": expansion("box"), "expansion-data": expansion("data"), "pooled": pooled,
            "curvature-pooled": curvature_pooled, "weighted": weighted, "debiased": debiased,
            "soft": soft, "trace": trace}
FIELDS = ["table", "epsilon", "run", "schedule", "variant", "coverage", "width_ratio", "floor_width_ratio", "floor_coverage",
          "effects_found", "floor_effects_found", "effects_wrong_sign", "mean_error_sd_max", "anchor_distance",
          "score_var", "curvature_term", "min_true_eig", "noise_edge", "converged", "imputation_ess",
          "rounds_run", "last_score_fraction", "floor_wrong_sign", "bound_floor_width_ratio"]


def run(table: str, epsilons: list[float], runs: int, out: Path, *, schedules: list[str] | None = None,
        variants: list[str] | None = None, prior_scale: float = 1.0, paired: bool = False, seed_offset: int = 0) -> None:
    """Replay ``runs`` releases per epsilon and schedule and judge every variant on them.
    ``prior_scale``: the model's prior sd (eighteenth rule); ``paired``: every schedule of run r
    draws the same standard-normal noise (a seeded stand-in for OS entropy, so schedules that
    differ in their anchors are compared on the same noise; twenty-third rule; the data-range
    histogram from its own stream, thirtieth rule), else OS entropy,
    independent per fit."""
    from dpsummary.metrics import data_hessian, idealised_floor

    model, pts, fn, tb = _table(table, prior_scale)
    spec = cal.TABLES[table]
    delta = 0.1 / spec.n_max if spec.n_max else 1e-11
    rows = []
    bound_floors: dict[tuple[float, float], float] = {}

    def bound_floor(ref: Any, eps: float, score_bound: float) -> float:
        """Rule 2' (notebook, 2026-11-29): the floor's width at the score bound the release paid."""
        if (eps, score_bound) not in bound_floors:
            bound_floors[eps, score_bound] = idealised_floor(
                model, pts, ref.full, epsilon=eps, delta=delta, sensitivity=score_bound,
                generator=torch.Generator().manual_seed(0)).width_ratio
        return bound_floors[eps, score_bound]

    for eps in epsilons:
        ref = cal.reference(model, pts, epsilon=eps, delta=delta, key=f"variants:{table}:prior{prior_scale:g}")
        true_eigs = torch.linalg.eigvalsh(data_hessian(model, pts, ref.full.mean))
        for r, sched in ((r, sched) for r in range(runs) for sched in (schedules or ["default"])):
            seed = seed_offset + 10_000 * r + int(1000 * eps)
            fit = _fit(model, pts, fn, tb, eps, delta, sched, randomness=_SeededNoise(seed) if paired else None,
                       relations=_RELATIONS[table], support=_SUPPORTS[table],
                       range_randomness=_SeededNoise(seed + RANGE_SEED_OFFSET) if paired else None)
            last = fit.rounds[-1]
            m = fit.model or model
            u = fit.posterior.mean - last.anchor
            chosen = {k: v for k, v in {**VARIANTS, "relations": relations(table), "support": supported(table),
                                        "support-expansion": supported_expansion(table),
                                        "support-expansion-gated": supported_expansion_gated(table, fit.converged)}.items()
                      if variants is None or k in variants}
            for name, variant in chosen.items():
                _DIAG.clear()
                j = cal.judge(variant(m, fit.rounds, torch.Generator().manual_seed(1000 + r), fn), ref)
                rows.append({
                    "table": table, "epsilon": eps, "run": r, "schedule": sched, "variant": name, **{k: j[k] for k in (
                        "coverage", "width_ratio", "floor_width_ratio", "floor_coverage", "effects_found",
                        "floor_effects_found", "effects_wrong_sign", "mean_error_sd_max")},
                    "anchor_distance": float((last.anchor - ref.full.mean).norm()),
                    "score_var": last.score_noise_std**2, "curvature_term": last.curvature_noise_std**2 * float(u @ u),
                    "min_true_eig": float(true_eigs[0]),
                    "noise_edge": 2 * math.sqrt(pts.shape[1] - 1) * last.curvature_noise_std,
                    "converged": fit.converged, "imputation_ess": _DIAG.get("ess", ""),
                    "rounds_run": len(fit.rounds), "floor_wrong_sign": j["floor_wrong_sign"],
                    "bound_floor_width_ratio": bound_floor(ref, eps, float(last.score_bound)),
                    "last_score_fraction": round(fit.noise_multipliers[-1][1] ** 2 / (
                        fit.noise_multipliers[-1][0] ** 2 + fit.noise_multipliers[-1][1] ** 2), 4),
                })
            print(f"{table} eps {eps} run {r} schedule {sched}: " + ", ".join(
                f"{x['variant']} cov {x['coverage']:.2f} w {x['width_ratio']:.2f}" for x in rows[-len(chosen):]),
                flush=True)
    out.parent.mkdir(parents=True, exist_ok=True)
    with out.open("w", newline="") as fh:
        w = csv.DictWriter(fh, fieldnames=FIELDS)
        w.writeheader()
        w.writerows(rows)
    summary(out)


def misses(table: str, epsilons: list[float], runs: int, seed_offset: int = 0) -> None:
    """Which coordinates a cell misses, and why (issue 50's diagnosis of 2026-11-28): today's
    default (schedule and imputed posterior) on ``runs`` seeded releases per epsilon; for every
    coordinate whose 95% interval misses the full-data mean, the full-data mean and sd, the
    release's mean and sd, the idealised floor's sd and the miss in release sds. Prints markdown."""
    model, pts, fn, tb = _table(table)
    spec = cal.TABLES[table]
    delta = 0.1 / spec.n_max if spec.n_max else 1e-11
    print("| table | epsilon | run | coverage | coordinate | full-data mean (sd) | release mean (sd) | floor sd | z |")
    print("|---|---|---|---|---|---|---|---|---|")
    for eps in epsilons:
        ref = cal.reference(model, pts, epsilon=eps, delta=delta, key=f"variants:{table}:prior1")
        full_mean, full_sd = ref.full.mean, torch.sqrt(torch.diagonal(ref.full.cov))
        for r in range(runs):
            fit = _fit(model, pts, fn, tb, eps, delta, "default",
                       randomness=_SeededNoise(seed_offset + 10_000 * r + int(1000 * eps)), relations=_RELATIONS[table],
                       support=_SUPPORTS[table])
            post = fit.posterior  # today's default posterior, whatever its options
            sd = torch.sqrt(torch.diagonal(post.cov))
            z = (post.mean - full_mean) / sd
            missed = torch.nonzero(z.abs() > 1.959963984540054).flatten().tolist()
            cov = 1.0 - len(missed) / len(z)
            for i in missed or [None]:
                cells = ["-"] * 5 if i is None else [
                    str(i), f"{full_mean[i]:+.2f} ({full_sd[i]:.3f})", f"{post.mean[i]:+.2f} ({sd[i]:.3f})",
                    f"{ref.floor.sd[i]:.3f}", f"{z[i]:+.2f}"]
                print(f"| {table} | {eps:g} | {r} | {cov:.2f} | " + " | ".join(cells) + " |", flush=True)


#: Added to a paired run's seed for its data-range histogram's own stream (thirtieth rule).
RANGE_SEED_OFFSET = 5_000_000


class _SeededNoise:
    """A seeded stand-in for OS entropy (benchmarks only): two fits with the same seed draw the
    same standard-normal noise, so a change of the noise's scale is measured paired."""

    def __init__(self, seed: int) -> None:
        import numpy as np

        self.rng = np.random.default_rng(seed)

    def gaussian(self, values: Any, *, noise_std: float, clip_norm: float) -> Any:
        return values + noise_std * self.rng.standard_normal(len(values))

    def tilt(self, dim: int, *, noise_std: float) -> Any:
        """Objective perturbation's tilt: a seeded continuous Gaussian (the release draws the
        dithered discrete Gaussian, whose accounted curve also bounds this one)."""
        return noise_std * self.rng.standard_normal(dim)


def paired_curvature_bound(table: str, epsilons: list[float], runs: int) -> None:
    """Change 3 of results/noise_aware_variants.md, measured paired: the default logistic release
    with the curvature's sensitivity taken as the Frobenius norm ``r^2 / 4`` (before) and as the
    released upper triangle's norm (:meth:`dpsummary.models.glm.GLM.rank_one_upper_bound`, now),
    the same standard-normal draws scaled by each."""
    from dpsummary.models.glm import LogisticRegression
    from dpsummary.private.score_stats import noisy_score_statistics

    model, pts, fn, tb = _table(table)
    if type(model) is not LogisticRegression:
        raise SystemExit("the paired curvature-bound comparison is for logistic tables")
    spec = cal.TABLES[table]
    delta = 0.1 / spec.n_max if spec.n_max else 1e-11
    r = model.design_norm_bound(fn)
    _, now = model.statistic_bounds(torch.zeros(model.param_dim, dtype=DTYPE), feature_norm=fn, target_bound=tb)
    sched = na.Schedule.default(model)
    for eps in epsilons:
        ref = cal.reference(model, pts, epsilon=eps, delta=delta, key=f"variants:{table}")
        count = acc.gaussian_event(acc.calibrate_part(target_epsilon=COUNT_SHARE * eps, delta=delta))
        sigma, _ = na.calibrate(sched, target_epsilon=eps, delta=delta, prior_events=[count])
        judged: dict[str, list[dict[str, Any]]] = {"frobenius": [], "upper": []}
        for run in range(runs):
            for name, curvature_bound in (("frobenius", r * r / 4.0), ("upper", now)):
                noise = _SeededNoise(1000 + run)

                def release(theta: torch.Tensor, sb: float, cb: float, sm: float, cm: float,
                            noise: _SeededNoise = noise) -> tuple[torch.Tensor, torch.Tensor]:
                    st = noisy_score_statistics(pts, noise, model, theta, score_bound=sb, curvature_bound=cb,
                                                score_noise_multiplier=sm, curvature_noise_multiplier=cm)
                    return st.score, st.curvature

                def bounds(theta: torch.Tensor, cb: float = curvature_bound) -> tuple[float, float]:
                    return r, cb

                fit = na.fit(model, release, bounds, schedule=sched, sigma=sigma, feature_norm=fn, target_bound=tb,
                             generator=torch.Generator().manual_seed(run), relations=_RELATIONS[table])
                judged[name].append(cal.judge(fit.posterior, ref))
        ratios = [b["width_ratio"] / a["width_ratio"] for a, b in zip(judged["frobenius"], judged["upper"], strict=True)]
        for name, js in judged.items():
            print(f"{table} eps {eps:g} {name}: median width {statistics.median(j['width_ratio'] for j in js):.2f} "
                  f"mean coverage {statistics.mean(j['coverage'] for j in js):.3f} "
                  f"median effects {statistics.median(j['effects_found'] for j in js):.1f} "
                  f"wrong signs {sum(j['effects_wrong_sign'] for j in js)}")
        print(f"  paired width ratio upper / frobenius: median {statistics.median(ratios):.3f}, quartiles "
              f"{[round(q, 3) for q in statistics.quantiles(ratios, n=4)]}")


def summary(path: Path) -> None:
    with path.open(newline="") as fh:
        rows = list(csv.DictReader(fh))
    cells: dict[tuple[str, float, str], list[dict[str, str]]] = {}
    for row in rows:
        name = row["variant"] if row.get("schedule", "default") == "default" else f"{row['schedule']}/{row['variant']}"
        cells.setdefault((row["table"], float(row["epsilon"]), name), []).append(row)
    print("| table | epsilon | variant | runs | median coverage | min coverage | median width / full (floor) "
          "| effects (floor) | wrong signs | median anchor distance | median tau^2 u^2 / sigma_s^2 |")
    print("|---|---:|---|---:|---:|---:|---:|---:|---:|---:|---:|")
    for (table, eps, variant), rs in sorted(cells.items()):
        def med(k: str, rs: list[dict[str, str]] = rs) -> float:
            return statistics.median(float(x[k]) for x in rs)
        print(f"| {table} | {eps:g} | {variant} | {len(rs)} | {med('coverage'):.2f} | "
              f"{min(float(x['coverage']) for x in rs):.2f} | {med('width_ratio'):.2f} ({med('floor_width_ratio'):.2f}) | "
              f"{med('effects_found'):.1f} ({med('floor_effects_found'):.1f}) | "
              f"{sum(int(x['effects_wrong_sign']) for x in rs)} | {med('anchor_distance'):.2f} | "
              f"{statistics.median(float(x['curvature_term']) / float(x['score_var']) for x in rs):.2f} |")


@dataclasses.dataclass(frozen=True)
class CellVerdict:
    """One (table, epsilon) cell of one arm, judged by the calibration suite's own rule
    (:func:`calibration.verdict`, issue 50's rules 1 and 3: median coverage against 0.9, or
    min(0.9, the floor's median coverage - 0.05) where the floor is dishonest; wrong-sign effects
    over the runs at most the floor's expected count over them + 1)."""

    coverage: float
    floor_coverage: float
    wrong_signs: int
    width: float
    floor_width: float
    effects: float
    floor_effects: float
    runs: int
    #: The idealised floor's expected wrong-sign effects summed over the runs (None: unknown).
    floor_wrong: float | None = None
    #: Rule 2': the median width of the floor at the score bound the runs paid (None: runs made
    #: before it was recorded).
    bound_floor_width: float | None = None

    @property
    def reference_width(self) -> float:
        """Rule 2' (notebook/noise_aware_variants.md, 2026-11-29): the width a change is measured
        from besides the baseline's own: max(the floor's, the bound floor's)."""
        return max(self.floor_width, self.bound_floor_width or self.floor_width)

    @property
    def honest(self) -> bool:
        return self.verdict == "HONEST"

    @property
    def threshold(self) -> float:
        return float(cal.verdict(self.coverage, self.floor_coverage, 0, 0, 0, self.floor_wrong)[1])

    @property
    def verdict(self) -> str:
        return str(cal.verdict(self.coverage, self.floor_coverage, self.wrong_signs, 0, 0, self.floor_wrong)[0])


def _arm(row: dict[str, str]) -> str:
    return row["variant"] if row.get("schedule", "default") == "default" else f"{row['schedule']}/{row['variant']}"


def suite_floor_wrong(path: Path = cal.RESULTS / "calibration_10run_before_issue48.csv") -> dict[tuple[str, float], float]:
    """The idealised floor's expected wrong-sign effects per release, per (table, epsilon), from
    the suite's public-mode releases of the default mechanism: the stand-in for variants CSVs
    written before the harness recorded ``floor_wrong_sign``. The same quantity where the suite's
    public mode and this harness share the model space and delta (checked on every logistic cell
    of the committed CSVs: the floors' coverage and width agree to every printed digit; the
    Poisson simulations' floors differ in the third decimal of coverage)."""
    out: dict[tuple[str, float], float] = {}
    if not path.exists():
        return out
    with path.open(newline="") as fh:
        for r in csv.DictReader(fh):
            if (r["mode"] == "public" and r["mechanism"] == "noise-aware-newton" and r["outcome"] == "released"
                    and r.get("floor_wrong_sign") not in (None, "")):
                out.setdefault((r["table"], float(r["epsilon"])), float(r["floor_wrong_sign"]))
    return out


def cell_verdicts(rows: list[dict[str, str]], arm: str,
                  floor_wrong: dict[tuple[str, float], float] | None = None) -> dict[tuple[str, float], CellVerdict]:
    """The cells of one arm of a variants CSV: ``arm`` names a variant (today's default schedule)
    or a schedule (``schedule/variant``, as :func:`summary` prints it). The floor's expected
    wrong-sign count of a cell is the rows' ``floor_wrong_sign`` summed, or for rows without it
    ``floor_wrong``'s per-release value times the runs, else unknown (judged as 0)."""
    cells: dict[tuple[str, float], list[dict[str, str]]] = {}
    for row in rows:
        if _arm(row) == arm:
            cells.setdefault((row["table"], float(row["epsilon"])), []).append(row)

    def med(rs: list[dict[str, str]], key: str) -> float:
        return statistics.median(float(x[key]) for x in rs)

    out = {}
    for key, rs in cells.items():
        recorded = [float(x["floor_wrong_sign"]) for x in rs if x.get("floor_wrong_sign") not in (None, "")]
        if len(recorded) == len(rs):
            fw: float | None = sum(recorded)
        elif floor_wrong is not None and key in floor_wrong:
            fw = floor_wrong[key] * len(rs)
        else:
            fw = None
        bound = [float(x["bound_floor_width_ratio"]) for x in rs if x.get("bound_floor_width_ratio") not in (None, "")]
        out[key] = CellVerdict(med(rs, "coverage"), med(rs, "floor_coverage"),
                               sum(int(float(x["effects_wrong_sign"])) for x in rs), med(rs, "width_ratio"),
                               med(rs, "floor_width_ratio"), med(rs, "effects_found"), med(rs, "floor_effects_found"),
                               len(rs), fw, statistics.median(bound) if len(bound) == len(rs) else None)
    return out


#: Rule 4' (b): a pure narrowing must narrow the honest cells by at least 3% (geometric mean of
#: plain width ratios) and widen none of them by more than 10%.
#: Rule 4v (notebook/objective_perturbation.md): the effects-found gain that stands for a
#: narrowing, as the 3% of :data:`NARROWING_GEOMEAN` stands for one of width.
EFFECTS_GAIN = 1.03
NARROWING_GEOMEAN = 0.97
NARROWING_CELL_LIMIT = 1.10
#: Rule 4'' (c''): a cell the candidate turns dishonest is forgiven as run noise only when it is at
#: most this much wider than max(width, floor, bound floor) under the candidate.
FLIP_WIDTH_LIMIT = 1.10


def is_narrowing(ratios: tuple[float, ...]) -> bool:
    """Rule 4' (b)'s narrowing over plain width ratios (candidate over baseline): their geometric
    mean at most :data:`NARROWING_GEOMEAN` and none above :data:`NARROWING_CELL_LIMIT` (False
    without any)."""
    if not ratios:
        return False
    geo = math.exp(sum(math.log(r) for r in ratios) / len(ratios))
    return geo <= NARROWING_GEOMEAN and max(ratios) <= NARROWING_CELL_LIMIT


@dataclasses.dataclass(frozen=True)
class Comparison:
    """Issue 50's rules applied to two arms of paired runs (:func:`compare`)."""

    cells: int
    honest_baseline: int
    honest_candidate: int
    lost: list[tuple[str, float]]
    gained: list[tuple[str, float]]
    widths: cal.WidthCheck
    fewer_effects: list[tuple[str, float]]
    wrong_signs: cal.SuiteWrongSigns
    #: Cells whose floor's expected wrong-sign count was not known (judged as 0).
    floor_unknown: list[tuple[str, float]]

    @property
    def more_honest(self) -> bool:
        """Rule 4: more cells made honest than made dishonest."""
        return len(self.gained) > len(self.lost)

    @property
    def not_reversed(self) -> bool:
        """No more cells made dishonest than made honest."""
        return len(self.gained) >= len(self.lost)

    #: Plain width ratios (candidate / baseline median width) over the cells honest under both.
    plain_ratios: tuple[float, ...] = ()
    #: Each lost cell's width change from max(width, floor, bound floor) (rule 4'' (c'')).
    lost_width_changes: tuple[float, ...] = ()
    #: Rule 4''': the cells whose median plain width is below ``BELOW_FULL`` times the full data's,
    #: under the baseline and under the candidate.
    below_full_baseline: tuple[tuple[str, float], ...] = ()
    below_full_candidate: tuple[tuple[str, float], ...] = ()
    #: Rule 4'''' (the fortieth rule): the tables where the two arms are the same in every run
    #: (width and coverage), and the plain width ratios over the cells honest under both of the
    #: other tables, where the candidate acts.
    identical_tables: tuple[str, ...] = ()
    acting_ratios: tuple[float, ...] = ()
    #: The baseline's wrong-sign total over the same cells (rule 1', the forty-fourth rule).
    baseline_wrong_total: float | None = None
    #: Effects found over the set, each cell's median per release summed over the cells, under the
    #: baseline and under the candidate (rule 4v, notebook/objective_perturbation.md).
    effects_baseline: float = 0.0
    effects_candidate: float = 0.0

    @property
    def finds_more_effects(self) -> bool:
        """Rule 4v's alternative to a narrowing: at least :data:`EFFECTS_GAIN` times the baseline's
        effects found, rule 2' met and no widening on average (its geometric mean from max(width,
        floor, bound floor) over the cells honest under both at most 1)."""
        return (self.effects_baseline > 0 and self.effects_candidate >= EFFECTS_GAIN * self.effects_baseline
                and self.widths.ok and self.widths.geomean <= 1.0)

    @property
    def rule_4_v(self) -> bool:
        """Rule 4v for the simulations (the forty-eighth rule): :attr:`rule_4_quadruple_prime`, or
        no cell turned either way and :attr:`finds_more_effects`."""
        moved = bool(self.gained or self.lost)
        return self.rule_4_quadruple_prime or (not moved and self.finds_more_effects)

    @property
    def rule_1_prime(self) -> bool:
        """Rule 1' (a candidate's check; notebook, the forty-fourth rule): the candidate's
        wrong-sign total within rule 1's limit, or no greater than the baseline's on the same
        paired runs (a candidate is charged only for the wrong signs it adds)."""
        return self.wrong_signs.ok or (
            self.baseline_wrong_total is not None and self.wrong_signs.total <= self.baseline_wrong_total)

    @property
    def fewer_below_full(self) -> bool:
        """Rule 4''' (notebook/noise_aware_variants.md, the thirty-ninth rule): fewer cells narrower
        than the full data's posterior under the candidate, and none newly so."""
        base, cand = set(self.below_full_baseline), set(self.below_full_candidate)
        return len(cand) < len(base) and cand <= base

    @property
    def no_more_below_full(self) -> bool:
        """Rule 4''', for either set: no cell newly narrower than the full data's posterior."""
        return set(self.below_full_candidate) <= set(self.below_full_baseline)

    @property
    def rule_4_triple_prime(self) -> bool:
        """Rule 4''' for the simulations: :attr:`rule_4_double_prime`, or no cell turned either way
        and :attr:`fewer_below_full` (rule 2' is checked apart, as for 4'')."""
        moved = bool(self.gained or self.lost)
        return self.rule_4_double_prime or (not moved and self.fewer_below_full)

    @property
    def confirms_4_triple_prime(self) -> bool:
        """Rule 4''' for the real tables: :attr:`confirms_4_double_prime` and
        :attr:`no_more_below_full`."""
        return self.confirms_4_double_prime and self.no_more_below_full

    @property
    def narrows_where_acting(self) -> bool:
        """Rule 4'''' (notebook/noise_aware_variants.md, the fortieth rule): :attr:`narrows` over
        the cells of the tables where the candidate acts (not in :attr:`identical_tables`)."""
        return is_narrowing(self.acting_ratios)

    @property
    def rule_4_quadruple_prime(self) -> bool:
        """Rule 4'''' for the simulations: :attr:`rule_4_triple_prime` with (a'')'s narrowing
        judged where the candidate acts (:attr:`narrows_where_acting`); a candidate that turns
        no cell either way passes by that narrowing or by :attr:`fewer_below_full`."""
        moved = bool(self.gained or self.lost)
        if moved:
            return self.rule_4_double_prime
        return self.flips_at_width and (self.narrows_where_acting or self.fewer_below_full)

    @property
    def narrows(self) -> bool:
        """Rule 4' (b), second branch: over the cells honest under both arms, the geometric mean of
        the plain width ratios at most :data:`NARROWING_GEOMEAN` and none above
        :data:`NARROWING_CELL_LIMIT`."""
        return is_narrowing(self.plain_ratios)

    @property
    def rule_4_prime(self) -> bool:
        """Rule 4' (notebook/noise_aware_variants.md, "Rule 4 rewritten"): (a) no cell honest under
        the baseline turned dishonest, and (b) more cells turned honest than dishonest, or none
        turned either way and the candidate narrows (:attr:`narrows`)."""
        if self.lost:
            return False
        return len(self.gained) > 0 or self.narrows

    @property
    def flips_at_width(self) -> bool:
        """Rule 4'' (c''): every cell turned dishonest is at most :data:`FLIP_WIDTH_LIMIT` wider than
        max(width, floor, bound floor): a flip at equal width is run noise, a flip bought with
        width is not."""
        return all(c <= FLIP_WIDTH_LIMIT for c in self.lost_width_changes)

    @property
    def rule_4_double_prime(self) -> bool:
        """Rule 4'' (a'') and the width part of (c''), for the simulations (notebook/
        noise_aware_variants.md, "Rule 4' (a) rewritten"): more cells turned honest than
        dishonest (issue 50's rule 4), or none either way and :attr:`narrows`; and
        :attr:`flips_at_width`."""
        moved = bool(self.gained or self.lost)
        return self.flips_at_width and (self.more_honest if moved else self.narrows)

    @property
    def confirms_4_double_prime(self) -> bool:
        """Rule 4'' (c''), for the real tables: no more cells turned dishonest than honest, and
        :attr:`flips_at_width`."""
        return self.not_reversed and self.flips_at_width


def compare(paths: list[Path], baseline: str, candidate: str,
            floor_wrong: dict[tuple[str, float], float] | None = None, kind: str | None = None) -> Comparison:
    """The checks of the rules in results/noise_aware_variants.md for two arms of the same runs
    (``baseline`` and ``candidate`` as :func:`cell_verdicts` names them), printed per cell and in
    total, under issue 50's decision: verdicts by :func:`calibration.verdict` (rules 1 and 3); cells
    turned dishonest or honest (rule 4 asks for more of the latter); rule 2 by
    :func:`calibration.width_check` (the width change from max(the baseline's width, the floor's,
    and since rule 2' the floor's at the score bound the baseline paid where its rows record it);
    cells dishonest under the baseline widen for free; none of the baseline's honest cells more
    than 25% wider, the geometric mean over the cells honest under both at most 1.05); the
    candidate's wrong-sign total against 1.25x the floor's expected total + 3 (rule 1, over these
    cells); cells honest under the baseline that lose more than 0.5 median effects found
    (reported). A cell is judged on the first of ``paths`` that holds both arms for it: paired runs
    are never pooled across files. ``floor_wrong``: per-release floor wrong-sign counts for rows
    without them (default: :func:`suite_floor_wrong`). ``kind``: only the simulations (``sim``) or
    only the real tables (``real``), which the rules judge separately. The rule decides what these
    must be."""
    def wanted(table: str) -> bool:
        sim = table in cal.TABLES and cal.TABLES[table].kind == "sim"
        return kind is None or (kind == "sim") == sim

    per_file: list[list[dict[str, str]]] = []
    for path in paths:
        with path.open(newline="") as fh:
            per_file.append([r for r in csv.DictReader(fh) if wanted(r["table"])])
    # Rule 4'''': a table whose two arms agree in every run (width and coverage) is one the
    # candidate does not act on.
    arms: dict[tuple[str, str, str], dict[str, tuple[str, str]]] = defaultdict(dict)
    for rows in per_file:
        for r in rows:
            arm = _arm(r)
            if arm in (baseline, candidate):
                arms[r["table"], r["epsilon"], r["run"]][arm] = (r["width_ratio"], r["coverage"])
    acting_tables = {t for (t, _, _), v in arms.items() if len(v) == 2 and v[baseline] != v[candidate]}
    fw = suite_floor_wrong() if floor_wrong is None else floor_wrong
    base: dict[tuple[str, float], CellVerdict] = {}
    cand: dict[tuple[str, float], CellVerdict] = {}
    for rows in per_file:
        b_cells, c_cells = cell_verdicts(rows, baseline, fw), cell_verdicts(rows, candidate, fw)
        for key in b_cells.keys() & c_cells.keys():
            if key not in base:
                base[key], cand[key] = b_cells[key], c_cells[key]
    if not base:
        raise SystemExit(f"error: no cells with rows for both {baseline!r} and {candidate!r}; arms are the variant "
                         "names of the default schedule or schedule/variant")
    lost, gained, fewer, lost_changes = [], [], [], []
    for key in sorted(base):
        b, c = base[key], cand[key]
        flags = []
        change = cal.width_change(b.width, c.width, b.reference_width)
        if b.honest and not c.honest:
            lost.append(key)
            lost_changes.append(change)
            flags.append("HONEST->DISHONEST")
        if not b.honest and c.honest:
            gained.append(key)
            flags.append("gained")
        if b.honest and change > cal.WIDER_LIMIT:
            flags.append("WIDER>25%")
        if b.honest and c.effects < b.effects - 0.5:
            fewer.append(key)
            flags.append("LOST EFFECTS")
        print(f"{key[0]:18s} {key[1]:4g} | {baseline}: cov {b.coverage:.2f}/{b.threshold:.2f} wrong {b.wrong_signs}"
              f"/{'-' if b.floor_wrong is None else f'{b.floor_wrong:.1f}'} "
              f"{b.width:.2f}x (floor {b.floor_width:.2f}, reference {b.reference_width:.2f}) effects {b.effects:.1f}/{b.floor_effects:.1f} "
              f"{'H' if b.honest else 'D'} | {candidate}: cov {c.coverage:.2f} wrong {c.wrong_signs} {c.width:.2f}x "
              f"effects {c.effects:.1f} {'H' if c.honest else 'D'} | ratio {c.width / b.width:.3f} "
              f"(from max(width, floor, bound floor) {change:.3f}) {' '.join(flags)}")
    keys = sorted(base)
    widths = cal.width_check((k, base[k].honest, cand[k].honest, base[k].width, cand[k].width,
                              base[k].reference_width) for k in keys)
    wrong = cal.suite_wrong_signs((cand[k].wrong_signs, cand[k].floor_wrong) for k in keys)
    unknown = [k for k in keys if base[k].floor_wrong is None]
    plain = tuple(cand[k].width / base[k].width for k in keys if base[k].honest and cand[k].honest)
    acting = tuple(cand[k].width / base[k].width for k in keys
                   if base[k].honest and cand[k].honest and k[0] in acting_tables)
    identical = tuple(sorted({k[0] for k in keys} - acting_tables))
    below = cal.BELOW_FULL
    result = Comparison(len(keys), sum(base[k].honest for k in keys), sum(cand[k].honest for k in keys), lost, gained,
                        widths, fewer, wrong, unknown, plain, tuple(lost_changes),
                        tuple(k for k in keys if base[k].width < below), tuple(k for k in keys if cand[k].width < below),
                        identical, acting,
                        cal.suite_wrong_signs((base[k].wrong_signs, base[k].floor_wrong) for k in keys).total,
                        sum(base[k].effects for k in keys), sum(cand[k].effects for k in keys))
    print(f"honest: {baseline} {result.honest_baseline}, {candidate} {result.honest_candidate} of {len(keys)}; "
          f"turned dishonest {lost}; turned honest {gained}; wider than 25% {widths.wider}; lost effects {fewer}")
    if widths.ratios:
        ratios = [cand[k].width / base[k].width for k in keys if base[k].honest and cand[k].honest]
        print(f"width ratio over the {len(ratios)} cells honest under both: geometric mean "
              f"{math.exp(sum(math.log(r) for r in ratios) / len(ratios)):.3f}, median {statistics.median(ratios):.3f}; "
              f"from max(width, floor) (rule 2): geometric mean {widths.geomean:.3f}")
    print(f"rule 2 {'met' if widths.ok else 'NOT met'}; rule 4 (more cells made honest than dishonest) "
          f"{'met' if result.more_honest else 'NOT met'}; {candidate}'s wrong signs {wrong.total:g} against the "
          f"floor's expected {wrong.floor_total:.1f} (limit {wrong.limit:.1f}): {'met' if wrong.ok else 'NOT met'}"
          + (f"; floor's wrong-sign count unknown (judged as 0) in {unknown}" if unknown else ""))
    print(f"rule 1' (within the limit, or no more wrong signs than {baseline}'s {result.baseline_wrong_total:g}): "
          f"{'met' if result.rule_1_prime else 'NOT met'}")
    print(f"rule 4' (no honest cell lost; more gained, or a narrowing: geometric mean <= {NARROWING_GEOMEAN}, "
          f"no cell > {NARROWING_CELL_LIMIT}x): {'met' if result.rule_4_prime else 'NOT met'}")
    print(f"rule 4'' (simulations: more gained than lost, or none and a narrowing; real tables: no more lost than "
          f"gained; either: every cell lost at most {FLIP_WIDTH_LIMIT}x wider than max(width, floor, bound floor)): "
          f"as the simulations' check {'met' if result.rule_4_double_prime else 'NOT met'}, as the real tables' "
          f"{'met' if result.confirms_4_double_prime else 'NOT met'}")
    print(f"cells below {below:g}x the full data's width: {baseline} {list(result.below_full_baseline)}, {candidate} "
          f"{list(result.below_full_candidate)}; rule 4''' (4'', or none turned either way and fewer such cells, none "
          f"new): as the simulations' check {'met' if result.rule_4_triple_prime else 'NOT met'}, as the real tables' "
          f"{'met' if result.confirms_4_triple_prime else 'NOT met'}")
    if acting:
        geo = math.exp(sum(math.log(r) for r in acting) / len(acting))
        print(f"rule 4'''' (4''' with the narrowing judged where {candidate} acts: {len(acting)} cells honest under both, "
              f"geometric mean {geo:.3f}, largest {max(acting):.3f}; identical in every run on {list(identical)}): as the "
              f"simulations' check {'met' if result.rule_4_quadruple_prime else 'NOT met'}")
    print(f"effects found (cell medians summed): {baseline} {result.effects_baseline:g}, {candidate} "
          f"{result.effects_candidate:g}; rule 4v (4'''', or none turned either way, at least {EFFECTS_GAIN:g}x the "
          f"effects found, rule 2' met and no widening on average): as the simulations' check "
          f"{'met' if result.rule_4_v else 'NOT met'}")
    return result


def main() -> None:
    p = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    p.add_argument("--table", default="napsu_adult")
    p.add_argument("--epsilons", default="0.1,0.3,0.5,1")
    p.add_argument("--runs", type=int, default=12)
    p.add_argument("--out", type=Path, default=cal.RESULTS / "noise_aware_variants.csv")
    p.add_argument("--schedules", default="default", help=f"comma-separated, of {', '.join([*SCHEDULES, *OP_SCHEDULES])}")
    p.add_argument("--variants", default=",".join(VARIANTS), help=f"comma-separated, of {', '.join(VARIANTS)}, relations, support, support-expansion, support-expansion-gated")
    p.add_argument("--summary", action="store_true", help="only print the table of an existing --out")
    p.add_argument("--prior-scale", type=float, default=1.0, help="the model's prior sd (eighteenth rule)")
    p.add_argument("--paired", action="store_true",
                   help="the schedules of a run share their (seeded) noise draws, for comparing anchor changes")
    p.add_argument("--paired-curvature-bound", action="store_true",
                   help="compare the Frobenius and the released-triangle curvature bound on the same noise draws")
    p.add_argument("--seed-offset", type=int, default=0,
                   help="added to every --paired seed: fresh paired runs (a rule judged on runs other than those "
                        "that motivated it)")
    p.add_argument("--compare", nargs=2, metavar=("BASELINE", "CANDIDATE"),
                   help="apply the rules' checks to two arms (variant, or schedule/variant) of --out and --also "
                        "(each cell judged on the first of those files that holds both arms)")
    p.add_argument("--also", type=Path, nargs="*", default=[], help="more CSVs for --compare")
    p.add_argument("--kind", choices=("sim", "real"), help="--compare only the simulations or only the real tables")
    p.add_argument("--misses", action="store_true",
                   help="print each missed coordinate of today's default on seeded runs (issue 50's diagnosis)")
    a = p.parse_args()
    if a.misses:
        misses(a.table, [float(e) for e in a.epsilons.split(",")], a.runs, a.seed_offset)
    elif a.compare:
        compare([a.out, *a.also], *a.compare, kind=a.kind)  # each cell judged on the first file holding both arms
    elif a.summary:
        summary(a.out)
    elif a.paired_curvature_bound:
        paired_curvature_bound(a.table, [float(e) for e in a.epsilons.split(",")], a.runs)
    else:
        run(a.table, [float(e) for e in a.epsilons.split(",")], a.runs, a.out,
            schedules=a.schedules.split(","), variants=a.variants.split(","), prior_scale=a.prior_scale,
            paired=a.paired, seed_offset=a.seed_offset)


if __name__ == "__main__":
    main()
