"""The rounds of DP Newton (module docstring, 1., 3. to 6.): the anchors, the trust region, one
round's step, and :func:`fit`, which runs a schedule's rounds and builds the released
posterior with its convergence check.

Numbered references ("module docstring, N.") are to the package docstring,
:mod:`dpsummary.noise_aware`.
"""

from __future__ import annotations

import dataclasses
import math
from dataclasses import dataclass, field

import torch

from ..gaussian import GaussianPosterior
from ..models import Model
from .bounds import eta_change
from .posterior import imputed_posterior, noise_aware_posterior, trace_kept_spectrum
from .relations import exact_relations
from .released import MECHANISM, BoundsFn, LastRoundFn, NonFiniteFit, ReleaseFn, RoundRelease
from .schedule import LAST_SPLITS, MERGE_RMS_ETA, Schedule
from .support import CurvatureSupport
from .variants import (
    expansion_aware,
    pooled_curvature_release,
    pooled_release,
    preposterior_split,
    rms_eta,
)

#: Convergence check of the rounds (public): a last step larger than this many posterior sds
#: in some coordinate is reported in the release's notes.
UNCONVERGED_SDS = 3.0


#: Convergence rule of the GLMs (issue 25; written down from the expansion's error bound, before
#: any real table was run). Let ``delta`` be the last step (posterior mean minus last anchor) and
#: ``eta* = eta_change(delta)`` its largest change of the linear predictor over the public box.
#: Poisson and logistic curvature weights satisfy ``|d log w / d eta| <= 1``, so the score the
#: last round released is ``H~ delta`` with ``H~`` between ``H (1 - exp(-eta*)) / eta*`` and
#: ``H (exp(eta*) - 1) / eta*``: reading it with the released ``H`` (the quadratic expansion)
#: errs by at most the fraction :func:`expansion_error` ``(eta*) = (exp(eta*) - 1) / eta* - 1``
#: of the step, i.e. ``moved * expansion_error(eta*)`` posterior sds. A release is reported as
#: unconverged when the step exceeds :data:`UNCONVERGED_SDS` sds AND that bound exceeds
#: EXPANSION_BIAS_SDS (half an sd: a 95% interval shifted by half its sd still covers ~92%).
#: The step in sds alone fires by construction whenever the last round holds most of the budget
#: (the anchor it starts from is estimated with less), whatever the model's curvature.
EXPANSION_BIAS_SDS = 0.5


def expansion_error(eta_star: float) -> float:
    """Largest relative error of a Newton step whose linear predictor changes by at most
    ``eta_star`` (see :data:`EXPANSION_BIAS_SDS`): ``(exp(eta*) - 1) / eta* - 1`` (0 at 0)."""
    if eta_star < 1e-8:
        return eta_star / 2.0
    return math.expm1(min(eta_star, 700.0)) / eta_star - 1.0


@dataclass(frozen=True)
class NoiseAwareFit:
    """The result: the noise-aware posterior (the release's target), the raw one, the rounds."""

    posterior: GaussianPosterior
    raw_posterior: GaussianPosterior
    rounds: list[RoundRelease]
    noise_multipliers: list[tuple[float, float]]
    notes: list[str] = field(default_factory=list)
    #: The last round's step in posterior sds (largest coordinate).
    last_step_sds: float = 0.0
    #: False when the notes carry the convergence warning (see :func:`fit`).
    converged: bool = True
    #: The model the posterior is for: the caller's, or (``Schedule.prior_centre``) the same
    #: likelihood with its prior re-centred. Summaries and artifacts must carry this one.
    model: Model | None = None
    #: The schedule as run: the caller's, or (``Schedule.last_split``) the same with the last
    #: round's shares as chosen. Artifacts must carry this one.
    schedule: Schedule | None = None
    #: The public candidate relations the released posterior was projected off
    #: (``Schedule.relations``; rows of ``(r, param_dim)``), or None.
    exact_relations: torch.Tensor | None = None


@dataclass(frozen=True)
class State:
    """Explicit state of the rounds: the next anchor and what has been released so far."""

    anchor: torch.Tensor
    rounds: tuple[RoundRelease, ...]


def init(model: Model) -> State:
    return State(anchor=model.prior_mean.clone(), rounds=())


def log_mean_anchor(model: Model, release: RoundRelease, *, target_bound: float) -> torch.Tensor:
    """The anchor after a Poisson round at an anchor with zero slopes (module docstring, 3.):
    intercept ``a_0 + log((s_0 + H_00) / H_00)``, the log of the noisy mean count, slopes 0.

    Public rule on DP outputs: when the noisy count sum ``s_0 + H_00`` is below twice its noise
    sd, or ``H_00`` (the noisy record count times ``exp(a_0)``) is not positive, the anchor
    stays; the mean count is clamped to ``[MIN_MEAN_COUNT, max(target_bound, 1)]``."""
    a = release.anchor
    if bool((a[1:] != 0).any()):
        raise ValueError("the log-mean anchor needs an anchor with zero slopes")
    h00 = float(release.curvature[0, 0])
    total = float(release.score[0]) + h00
    noise_sd = math.hypot(release.score_noise_std, release.curvature_noise_std)
    out = a.clone()
    if not (h00 > 0 and total > 2.0 * noise_sd and math.isfinite(total)):
        return out
    mean_count = math.exp(float(a[0])) * total / h00
    out[0] = math.log(min(max(mean_count, MIN_MEAN_COUNT), max(float(target_bound), 1.0)))
    return out


#: Smallest mean count the log-mean anchor starts from (public).
MIN_MEAN_COUNT = 0.05
#: The log-odds anchor's positive share is clamped to [MIN_SHARE, 1 - MIN_SHARE] (public).
MIN_SHARE = 1e-3


def log_odds_anchor(model: Model, release: RoundRelease) -> torch.Tensor:
    """The anchor after a logistic round at an anchor with zero slopes (module docstring, 6.):
    intercept ``logit(p)`` with the noisy positive share ``p = s(a_0) + s_0 w_0 / H_00``
    (``w_0 = s(a_0) s(-a_0)``), slopes 0.

    Public rule on DP outputs: when ``H_00`` (the noisy record count times ``w_0``) is below twice
    its noise sd the anchor stays; ``p`` is clamped to ``[MIN_SHARE, 1 - MIN_SHARE]``."""
    a = release.anchor
    if not getattr(model, "intercept", False) or bool((a[1:] != 0).any()):
        raise ValueError("the log-odds anchor needs a model with an intercept and an anchor with zero slopes")
    h00 = float(release.curvature[0, 0])
    s0 = float(release.score[0])
    out = a.clone()
    if not (h00 > 2.0 * release.curvature_noise_std and math.isfinite(h00) and math.isfinite(s0)):
        return out
    p0 = 1.0 / (1.0 + math.exp(-float(a[0])))
    share = min(max(p0 + s0 * p0 * (1.0 - p0) / h00, MIN_SHARE), 1.0 - MIN_SHARE)
    out[0] = math.log(share / (1.0 - share))
    return out


def trust_region(model: Model, anchor: torch.Tensor, proposal: torch.Tensor, *, trust_eta: float,
                 feature_norm: float) -> torch.Tensor:
    """``proposal`` pulled back towards ``anchor`` so the step changes the linear predictor of
    any record of the public box by at most ``trust_eta`` (public; post-processing)."""
    delta = proposal - anchor
    change = eta_change(model, delta, feature_norm)
    if change <= trust_eta:
        return proposal
    return anchor + delta * (trust_eta / change)


def step(state: State, model: Model, release: ReleaseFn, bounds: BoundsFn,
         multipliers: tuple[float, float], *, schedule: Schedule | None = None,
         feature_norm: float | None = None, target_bound: float | None = None) -> State:
    """One round: release statistics at the current anchor; the next anchor is the noise-aware
    mean (post-processing), which shrinks noise-dominated directions to the prior instead of
    following a noisy Newton step out of the region where the quadratic expansion holds.

    With a ``schedule`` whose ``anchor`` is ``"log-mean"`` the anchor after the first round is
    :func:`log_mean_anchor` (needs ``target_bound``); with a ``trust_eta`` every other step is
    limited by :func:`trust_region` (needs ``feature_norm``)."""
    score_bound, curvature_bound = bounds(state.anchor)
    s_mult, c_mult = multipliers
    score, curvature = release(state.anchor, score_bound, curvature_bound, s_mult, c_mult)
    rel = RoundRelease(anchor=state.anchor, score=score, curvature=curvature, score_bound=score_bound,
                       curvature_bound=curvature_bound, score_noise_std=s_mult * score_bound,
                       curvature_noise_std=c_mult * curvature_bound)
    if schedule is not None and schedule.anchor == "log-mean" and not state.rounds:
        if target_bound is None:
            raise ValueError("the log-mean anchor needs the public target bound")
        nxt = log_mean_anchor(model, rel, target_bound=target_bound)
    elif schedule is not None and schedule.anchor == "log-odds" and not state.rounds:
        nxt = log_odds_anchor(model, rel)
    else:
        passes, start = (schedule.passes, schedule.start) if schedule is not None else (2, "raw")
        centre = state.anchor if schedule is not None and schedule.step_prior == "anchor" else None
        post, _ = noise_aware_posterior(model, rel, passes=passes, start=start, prior_mean=centre)
        nxt = post.mean
        if schedule is not None and schedule.trust_eta is not None:
            if feature_norm is None:
                raise ValueError("the trust region needs the public feature norm")
            nxt = trust_region(model, state.anchor, nxt, trust_eta=schedule.trust_eta, feature_norm=feature_norm)
    return State(anchor=nxt, rounds=(*state.rounds, rel))


def fit(model: Model, release: ReleaseFn, bounds: BoundsFn, *, schedule: Schedule, sigma: float,
        feature_norm: float | None = None, target_bound: float | None = None,
        generator: torch.Generator | None = None, relations: torch.Tensor | None = None,
        support: CurvatureSupport | None = None, last: LastRoundFn | None = None) -> NoiseAwareFit:
    """Run every round of ``schedule`` at single-Gaussian calibration ``sigma`` and return the
    noise-aware posterior of the last round (earlier rounds only place the anchor).

    ``feature_norm`` and ``target_bound`` (public, :func:`schema_bounds`) are needed by
    schedules with an ``anchor`` rule or a ``trust_eta``; ``generator`` (non-private, post-
    processing only) by a schedule whose ``posterior`` is ``"imputed"``; ``relations`` (the
    public candidates, rows of ``(r, param_dim)``: :func:`~dpsummary.noise_aware.model_relations`;
    None: the design has none, i.e. no categorical column) by a schedule with ``relations``;
    ``support`` (public: :func:`~dpsummary.noise_aware.curvature_support`; None: no categorical
    column) by a schedule with ``support``. ``last`` (None: a Newton round) releases the last
    round instead, from the anchor the rounds before it placed (objective perturbation,
    :mod:`dpsummary.noise_aware.objective`; not with ``last_split`` or ``merge_rounds``).
    Total: returns finite Gaussians or raises :class:`NonFiniteFit`."""
    if last is not None and (schedule.last_split is not None or schedule.merge_rounds):
        raise ValueError("a last round of its own cannot have its split chosen or rounds merged into it")
    state = init(model)
    extra_notes: list[str] = []
    left = list(schedule.rounds)  # the rounds still to run, as (score, curvature) shares of rho
    used: list[tuple[float, float]] = []
    multipliers: list[tuple[float, float]] = []
    while left:
        shares = left.pop(0)
        mult = (sigma / math.sqrt(shares[0]), sigma / math.sqrt(shares[1]))
        if not left and schedule.last_split is not None:
            # Module docstring, 13.: the last round's split from the rounds before it.
            candidates = schedule.split_candidates(sigma, shares)
            best, _ = preposterior_split(model, state.rounds[-1], anchor=state.anchor, bounds=bounds(state.anchor),
                                         candidates=candidates)
            mult, total = candidates[best], sum(shares)
            shares = (LAST_SPLITS[best] * total, (1.0 - LAST_SPLITS[best]) * total)
            extra_notes.append(f"the last round's share split {LAST_SPLITS[best]:.0%} score, {1 - LAST_SPLITS[best]:.0%} "
                               "curvature, chosen from the earlier rounds' released curvature (post-processing, no "
                               "privacy cost)")
        if not left and last is not None:
            final_release = last(state.anchor, mult)
            state = State(anchor=final_release.anchor, rounds=(*state.rounds, final_release))
        else:
            state = step(state, model, release, bounds, mult, schedule=schedule, feature_norm=feature_norm,
                         target_bound=target_bound)
        used.append(shares)
        multipliers.append(mult)
        if len(used) == 1 and schedule.prior_centre is not None:
            # Module docstring, 5.: every later posterior (the anchors' and the released one) is
            # taken under N(round 1's log-mean or log-odds anchor, prior_scale^2 I), a function of
            # round 1's DP outputs.
            model = model.with_prior_mean(state.anchor)
        if schedule.merge_rounds and len(left) >= 2:
            # Module docstring, 14.: once the anchor has settled, the placement rounds left are
            # spent on the last round instead (post-processing of round k's DP outputs).
            moved = rms_eta(state.rounds[-1], state.anchor - state.rounds[-1].anchor)
            if moved is not None and moved <= MERGE_RMS_ETA:
                extra_notes.append(f"the anchor settled after round {len(used)} (rms change of the linear predictor "
                                   f"{moved:.2f} <= {MERGE_RMS_ETA:g}): the {len(left)} rounds left were spent as one "
                                   "last round (post-processing, no privacy cost)")
                left = [(sum(x for x, _ in left), sum(c for _, c in left))]
    if used != list(schedule.rounds):
        schedule = dataclasses.replace(schedule, rounds=tuple(used))
    final = state.rounds[-1]
    if schedule.pool:
        if feature_norm is None:
            raise ValueError("pooling the rounds needs the public feature norm")
        final = pooled_release(model, state.rounds, feature_norm=feature_norm)
    if schedule.pool_curvature:
        final = pooled_curvature_release(model, [*state.rounds[:-1], final])
    posterior, raw = noise_aware_posterior(model, final, passes=schedule.passes, start=schedule.start)
    exact = None
    if schedule.relations:
        # Module docstring, 17.: the candidates the released curvature does not tell from exact
        # (post-processing of a DP output and public structure). None: the design has none (no
        # categorical column).
        relation_candidates = relations if relations is not None else torch.zeros(0, model.param_dim, dtype=final.curvature.dtype)
        exact = exact_relations(relation_candidates.to(final.curvature.dtype), final.curvature, final.curvature_noise_std)
        if exact.shape[0]:
            extra_notes.append(f"the released posterior is the prior along {exact.shape[0]} exact relation(s) among the "
                               "one-hot columns (the data carry no information there; post-processing)")
    if schedule.posterior == "imputed":
        if generator is None:
            raise ValueError("the imputed posterior needs a (non-private) generator")
        posterior = imputed_posterior(model, final, generator=generator,
                                      spectrum=trace_kept_spectrum if schedule.spectrum == "trace" else None,
                                      relations=exact, support=support if schedule.support else None)
    if schedule.expansion is not None and feature_norm is None:
        raise ValueError("the expansion-aware posterior needs the public feature norm")
    # The convergence check (below) and the expansion (module docstring, 8.) are measured from
    # the step the posterior takes, before any widening.
    step_taken = posterior
    notes = [
        f"{MECHANISM}: {len(multipliers)} round(s) of noisy score and curvature sums, noise-aware "
        "Gaussian posterior (Kulkarni et al. 2021 style) by post-processing",
    ] if last is None else [
        f"noise-aware-objective: {len(multipliers) - 1} round(s) of noisy score and curvature sums, then objective "
        "perturbation's mode and a noisy curvature sum there, noise-aware Gaussian posterior (Kulkarni et al. 2021 "
        "style) by post-processing",
    ]
    notes.extend(extra_notes)
    # The posterior is a quadratic expansion at the last anchor; if the last round still moved
    # the estimate by many posterior sds, the rounds had not converged and the expansion may not
    # hold there (e.g. Poisson with large counts, whose intercept is far from the prior mean).
    # Post-processing of released values: say so in the release.
    moved = float(((step_taken.mean - state.rounds[-1].anchor).abs() / torch.diagonal(step_taken.cov).sqrt()).max())
    if not math.isfinite(moved):
        raise NonFiniteFit("the last Newton step is not finite")
    # GLMs with a public box: the step's expansion error bound decides (EXPANSION_BIAS_SDS);
    # otherwise the step in sds alone.
    expansion_ok = feature_norm is not None and moved * expansion_error(
        eta_change(model, step_taken.mean - state.rounds[-1].anchor, feature_norm)) <= EXPANSION_BIAS_SDS
    converged = not (moved > UNCONVERGED_SDS and not expansion_ok)
    if schedule.expansion is not None and not (schedule.expansion_gate and converged):
        assert feature_norm is not None
        posterior = expansion_aware(model, posterior, final, feature_norm=feature_norm,
                                    eta_rule=schedule.expansion)
    if not converged:
        notes.append(
            f"warning: the last Newton round moved the estimate by {moved:.1f} posterior sds (> "
            f"{UNCONVERGED_SDS:g}) and the quadratic expansion may err by more than "
            f"{EXPANSION_BIAS_SDS:g} sd there: the rounds had not converged, so the noise-aware intervals may "
            "not cover; treat this release with caution"
            + ("" if schedule.expansion is None else
               " (they carry an estimate of the expansion's error, widened along the last step)")
        )
    return NoiseAwareFit(posterior=posterior, raw_posterior=raw, rounds=list(state.rounds),
                         noise_multipliers=multipliers, notes=notes, last_step_sds=moved,
                         converged=converged, model=model, schedule=schedule, exact_relations=exact)
