"""``noise-aware-newton``: the default mechanism of the GLMs.

A few rounds in which, at a public anchor (the prior mean, then the previous round's noise-aware
mean), the sums over all records of per-record log-likelihood scores (clipped to L2 norm
``score_bound``) and curvatures (their upper triangle, diagonal included, the part noised and
released, clipped to L2 norm ``curvature_bound``) are released by two Gaussian mechanisms each, no
subsampling
(:meth:`~dpsummary.private.mechanism.PrivateRecords.noisy_score_statistics`, the privacy
boundary). The rounds' schedule and the noise-aware posterior are :mod:`dpsummary.noise_aware`
(post-processing); the pseudocoreset is matched to that posterior
(:mod:`dpsummary.constructors.gaussian_target`, post-processing).
"""

from __future__ import annotations

from typing import TYPE_CHECKING, Any, ClassVar

from ..errors import ChargedRefusal
from .base import (
    NON_FINITE_FIT_FIX,
    NON_FINITE_FIT_MESSAGE,
    CheckpointFn,
    MechanismOutput,
    MechanismPlan,
    ProgressFn,
    nonprivate_generator,
    quality_noise,
    quality_parts,
    selection_slack,
    stage_noise,
)
from .glm import GlmMechanism, glm_model, glm_split
from .noise_aware_linear import DESCRIPTION, MOMENTS, is_linear, linear_summaries
from .noise_aware_linear import events as linear_events

if TYPE_CHECKING:
    import torch

    from ..plan import PublicPlan, Released
    from ..selftest.config import SelftestScenario


def noise_aware_summaries(plan: MechanismPlan, records: Any, size: int, generator: torch.Generator
                          ) -> tuple[Any, dict[str, Any]]:
    """The noise-aware mechanism (:mod:`dpsummary.noise_aware`) on the private records, then its
    noise-aware Gaussian turned into a pseudocoreset (post-processing,
    :mod:`dpsummary.mechanisms.gaussian_summary`). The raw (noise-unaware) Gaussian is no longer
    matched or released (issue 25: nothing needed it, it doubled the matching time and was the
    first to go non-finite).

    Total: a fit that yields no finite Gaussian or no finite pseudocoreset (decided on DP outputs
    and public values only) ends in a :class:`ChargedRefusal` (``non-finite-fit``).

    With ``plan.settings["objective"]`` (:mod:`dpsummary.mechanisms.noise_aware_objective`) the
    last round is objective perturbation (:func:`dpsummary.noise_aware.objective.objective_round`)."""
    from .. import noise_aware
    from .gaussian_summary import summary_of_gaussian

    model, tf = plan.model, plan.transform
    objective = plan.settings.get("objective")
    schedule = plan.settings["schedule"] if objective is None else objective.schedule
    requested = size
    # A pseudocoreset of fewer points than parameters cannot carry a full-rank Gaussian (its
    # curvature has rank at most the number of points), so --size is a floor here: measured on the
    # calibration suite, every release with more parameters than points (adult and german_credit in
    # public mode, d 106 and 62; sim_small_wide, d 60) showed intervals other than its signed
    # Gaussian's. A public rule (size and schema); the notes say when it applied.
    size = max(size, model.param_dim)
    feature_norm, target_bound = noise_aware.schema_bounds(tf)
    # Module docstring of noise_aware, 11. and 12.: the count's and the features' clip bounds from
    # one more Gaussian mechanism (a histogram over public bins), then post-processing.
    ranges = noise_aware.range_clips(
        schedule, sigma=plan.noise_multiplier, num_features=tf.num_features, feature_norm=feature_norm,
        target_name=tf.target or "target", target_bound=target_bound,
        histogram=lambda layout, m: records.noisy_marginals(layout, noise_multiplier=m))
    count_clip = None if ranges is None else ranges.count
    norm_clip = None if ranges is None else ranges.feature
    if count_clip is not None:
        target_bound = count_clip.bound
    if norm_clip is not None:
        feature_norm = norm_clip.bound
    bounds = noise_aware.public_bounds(model, feature_norm=feature_norm, target_bound=target_bound)
    # Module docstring of noise_aware, 15.: counts at the clip bound censored in the statistics.
    statistic_model = noise_aware.statistic_model(model, schedule, target_bound)

    def release(theta: torch.Tensor, score_bound: float, curvature_bound: float, s_mult: float, c_mult: float
                ) -> tuple[torch.Tensor, torch.Tensor]:
        st = records.noisy_score_statistics(statistic_model, theta, score_bound=score_bound, curvature_bound=curvature_bound,
                                            score_noise_multiplier=s_mult, curvature_noise_multiplier=c_mult)
        return st.score, st.curvature

    last = None
    if objective is not None:
        from ..noise_aware.objective import records_round

        last = records_round(objective, records, model, feature_norm=feature_norm, bounds=bounds)
    # Module docstring of noise_aware, 18.: the public one-hot support (None: no categorical column).
    support = noise_aware.curvature_support(tf, model) if schedule.support else None
    try:
        result = noise_aware.fit(model, release, bounds, schedule=schedule, sigma=plan.noise_multiplier,
                                 feature_norm=feature_norm, target_bound=target_bound, generator=generator,
                                 relations=noise_aware.model_relations(tf, model) if schedule.relations else None,
                                 support=support, last=last)
    except noise_aware.NonFiniteFit:
        raise ChargedRefusal(NON_FINITE_FIT_MESSAGE, fix=NON_FINITE_FIT_FIX) from None
    posterior = result.posterior
    # The fit's model: the same likelihood, with the prior the posterior was taken under (a
    # Poisson release re-centres it at the noisy log-mean, noise_aware 5.); the summary carries it.
    model = result.model or model
    # Issue 48: the pseudocoreset is built so that analysts' draws of its exact weighted
    # posterior have the signed Gaussian's moments (mechanisms/gaussian_summary.py).
    built = summary_of_gaussian(model, posterior, transform=tf, size=size, requested=requested,
                                method=noise_aware.MECHANISM if objective is None else plan.mechanism, generator=generator)
    summary, model = built.summary, built.model
    gaussians = {"noise_aware": {"mean": posterior.mean.tolist(), "cov": posterior.cov.tolist()}}
    notes = [*result.notes, *([] if ranges is None else ranges.notes()), *built.notes]
    return summary, {
        "gaussians": gaussians, "notes": notes,
        "pseudocoreset_match": built.pseudocoreset_match,
        "noise_multipliers": [list(m) for m in result.noise_multipliers],
        "schedule": (result.schedule or schedule).as_dict() if objective is None else objective.as_dict(), "bounds": {"feature_norm": feature_norm, "target_bound": target_bound},
        "count_range": None if count_clip is None else count_clip.claim(),
        "feature_range": None if norm_clip is None else norm_clip.claim(),
        "prior_mean": model.prior_mean.tolist(),
        "rounds": [{"score_bound": r.score_bound, "curvature_bound": r.curvature_bound} for r in result.rounds],
        "exact_relations": None if result.exact_relations is None else result.exact_relations.tolist(),
        "curvature_support": support is not None,
    }


class NoiseAwareNewton(GlmMechanism):
    """Noisy score statistics, noise-aware posterior (see the module docstring)."""

    name: ClassVar[str] = "noise-aware-newton"
    sampling: ClassVar[str] = "none (every record)"

    def plan(self, public: PublicPlan, released: Released) -> MechanismPlan:
        """The GLM's model and transform, the quality counts' noise, the default schedule of
        rounds and its single-Gaussian noise multiplier, calibrated with the accountant of record
        so that everything composes to the release's epsilon (no initialisation)."""
        from dp_accounting import dp_event as dpe

        from .. import noise_aware

        _name, transform, model = glm_model(public, released)
        quality_sigma, before = quality_noise(public, glm_split(public, initialisation=False))
        if is_linear(model):
            # Issue 51: one Gaussian release of the moment matrix (noise_aware_linear.py).
            from .. import accounting as acc

            sigma, events = acc.calibrate_split_gaussian(  # the two rounds compose to one Gaussian
                linear_events, target_epsilon=public.req.epsilon - selection_slack(public), delta=public.delta,
                prior_events=before, accountant=public.accountant)
            parts = (*quality_parts(quality_sigma), ("optimisation", dpe.ComposedDpEvent(events)))
            return MechanismPlan(self.name, model, transform, sigma, 1.0, 1, quality_sigma, parts,
                                 {"statistic": MOMENTS})
        schedule = noise_aware.Schedule.default(model)
        sigma, _ = noise_aware.calibrate(schedule, target_epsilon=public.req.epsilon - selection_slack(public),
                                         delta=public.delta, prior_events=before, accountant=public.accountant)
        parts = (*quality_parts(quality_sigma), ("optimisation", dpe.ComposedDpEvent(schedule.events(sigma))))
        return MechanismPlan(self.name, model, transform, sigma, 1.0, 1, quality_sigma, parts,
                             {"schedule": schedule})

    def run(self, public: PublicPlan, plan: MechanismPlan, records: Any, *, record_count: float,
            progress: ProgressFn | None = None, checkpoint: CheckpointFn | None = None) -> MechanismOutput:
        mark = checkpoint or (lambda _name: None)
        nonpriv = nonprivate_generator(public.req.seed)
        mark("initialised")  # the public start: nothing to release
        summarise = linear_summaries if plan.settings.get("statistic") == MOMENTS else noise_aware_summaries
        summary, extra = summarise(plan, records, public.req.size, nonpriv)
        notes = extra.pop("notes")
        mark("optimised")
        # The default (and only) summary is the noise-aware one; its Gaussian rides along. Since
        # issue 25 there is no raw (noise-unaware) summary; older artifacts that carry one still load.
        body = {"posterior": {"default": "noise_aware", "gaussians": extra["gaussians"],
                              "pseudocoreset_match": extra.get("pseudocoreset_match")}}
        return MechanismOutput(summary, notes, extra, body)

    def claim(self, public: PublicPlan, plan: MechanismPlan, output: MechanismOutput) -> dict[str, Any]:
        ex = output.extra
        if ex.get("statistic") == MOMENTS:
            return {"name": self.name, "description": DESCRIPTION, "single_gaussian_noise_multiplier": plan.noise_multiplier,
                    "noise_multipliers": ex["noise_multipliers"], "statistic": MOMENTS, "shares": ex["shares"],
                    "anchor": ex["anchor"], "exact_relations": ex.get("exact_relations"),
                    # Whether each imputed design block was drawn on the one-hot support (an
                    # option, off: issue 50's forty-first rule; post-processing).
                    "design_support": ex.get("design_support", False),
                    "bounds_rule": ("public, from the schema: feature L2 norm bound as for the GLMs, target bound 1 (a "
                                    "real target scaled into [-1, 1]); moment_bound = sqrt((r^4 + min(r^2, r^4)) / 2) with "
                                    "r^2 = 1 + feature_norm^2 + target_bound^2 (the L2 norm of the upper triangle of z z^T); "
                                    "residual_vector_bound = sqrt((1 + feature_norm^2) residual_clip^2 + residual_range^4 / "
                                    "square_scale^2), residual_range = 2 target_bound, residual_clip and square_scale from the "
                                    "first release (DP outputs)"),
                    "bounds": ex["bounds"], "prior_mean": ex.get("prior_mean"),
                    "sampling": "none (every record)", "noise": "OpenDP discrete Gaussian from OS entropy",
                    **stage_noise(public, plan)}
        return {
            "name": self.name,
            "description": ("(for a count target, first one Gaussian histogram of the count over public bins, whose noisy "
                            "99.9% quantile sets the count's clip bound) rounds of DP Newton: at a public anchor (prior mean, then the previous round's "
                            "noise-aware mean) the sums over ALL records of per-record log-likelihood scores "
                            "(clipped to L2 score_bound) and curvatures (upper triangle, diagonal included, clipped to L2 "
                            "curvature_bound and noised) are released by Gaussian mechanisms; the noise-aware "
                            "posterior of the last round (Kulkarni et al. 2021 style; with schedule.posterior "
                            "'imputed', the curvature's noise integrated out by multiple imputation) is carried "
                            "by the pseudocoreset (for GLMs built in closed form; post-processing)"),
            "single_gaussian_noise_multiplier": plan.noise_multiplier,
            "noise_multipliers": ex["noise_multipliers"],
            "schedule": ex["schedule"],
            "bounds_rule": ("public, from the schema: feature L2 norm bound sqrt(sum over numeric columns of "
                            "their scaled range^2 + number of categorical columns), target bound from the "
                            "target's declared range (a count target's: the upper edge of the public 1-2-5 grid "
                            "bin holding the noisy 99.9% quantile of one Gaussian histogram, capped there; "
                            "count_range); per-model score/curvature bounds from Model.statistic_bounds"),
            "bounds": ex["bounds"],
            "count_range": ex.get("count_range"),
            "feature_range": ex.get("feature_range"),
            "rounds": ex["rounds"],
            # The released model's prior centre (summary.model.prior_mean): the model's prior mean,
            # or, with schedule.prior_centre "log-mean", the intercept at round 1's noisy log mean
            # count (post-processing of DP outputs).
            "prior_mean": ex.get("prior_mean"),
            # With schedule.relations: the public one-hot relations the released posterior is the
            # prior along (decided from the last round's released curvature; post-processing).
            **({} if ex.get("exact_relations") is None else {"exact_relations": ex["exact_relations"]}),
            # With schedule.support: whether the imputed curvatures were drawn on the one-hot
            # support of the curvature (false when the schema has no categorical column).
            **({"curvature_support": ex["curvature_support"]} if "curvature_support" in ex else {}),
            "sampling": "none (every record, every round)",
            "noise": "OpenDP discrete Gaussian from OS entropy",
            **stage_noise(public, plan),
        }

    def selftest_scenarios(self) -> tuple[SelftestScenario, ...]:
        """``newton``: the white-box audit of the score release
        (:func:`dpsummary.selftest.newton.newton_audit`); ``ranges``: the data-range histogram
        that sets the count's and the feature norm's clip bounds
        (:func:`dpsummary.selftest.ranges.ranges_audit`)."""
        from ..selftest.config import SelftestScenario
        from ..selftest.newton import newton_audit
        from ..selftest.ranges import ranges_audit

        return (SelftestScenario("newton", self.name, "audits", lambda cfg: "newton" in cfg.scenarios,
                                 lambda cfg, ctx, progress: [newton_audit(cfg, ctx.alpha, progress)]),
                SelftestScenario("ranges", self.name, "audits", lambda cfg: "ranges" in cfg.scenarios,
                                 lambda cfg, ctx, progress: [ranges_audit(cfg, ctx.alpha, progress)]))
