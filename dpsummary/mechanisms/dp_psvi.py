"""``dp-psvi``: the DP-PSVI paper's mechanism (``--mechanism dp-psvi``, for reproduction).

Optionally one Gaussian mechanism over per-column histograms on public bins, from which the
initial pseudopoints are drawn (:meth:`~dpsummary.private.mechanism.PrivateRecords.noisy_marginals`;
logistic and Poisson models whose policy gives ``budget_split.initialisation`` a share,
:data:`~dpsummary.mechanisms.dp_psvi_setup.DP_INITIALISATION_MODELS`), then T steps of the
Poisson-subsampled Gaussian mechanism on per-record centred log-likelihood vectors clipped to
L2 norm C (DP-PSVI paper, Section 3.3;
:meth:`~dpsummary.private.mechanism.PrivateRecords.noisy_clipped_sum`, the privacy boundary).
The optimiser (:mod:`dpsummary.constructors.dppsvi`) is post-processing; so is the parametric
bootstrap (:mod:`dpsummary.bootstrap`) that calibrates the released intervals after the record
store is closed (:meth:`DpPsvi.postprocess`). The release's DP-PSVI settings are in
:mod:`dpsummary.mechanisms.dp_psvi_setup`.

That calibration is validated on simulated tables only (on real tables the intervals were
measured overconfident, issue 37): every claim records ``interval_calibration``
(:data:`dpsummary.caveats.DP_PSVI_INTERVAL_CALIBRATION`) and the release ends with a warning note.
"""

from __future__ import annotations

from typing import TYPE_CHECKING, Any, ClassVar

from ..caveats import DP_PSVI_INTERVAL_CALIBRATION, warning_text
from ..errors import ChargedRefusal
from .base import (
    CheckpointFn,
    MechanismOutput,
    MechanismPlan,
    NoticeFn,
    ProgressFn,
    default_sample_rate,
    nonprivate_generator,
    quality_noise,
    quality_parts,
    selection_slack,
    stage_noise,
)
from .dp_psvi_setup import (
    DEFAULT_CLIP_MULTIPLIER,
    DEFAULT_CLIP_QUANTILE,
    DEFAULT_NUM_REFERENCE,
    DP_INITIALISATION_MODELS,
    InitialStart,
    dp_psvi_constructor,
    initial_samplers,
    plan_initialisation,
)
from .glm import GlmMechanism, glm_model, glm_split

if TYPE_CHECKING:
    from ..plan import PublicPlan, Released
    from ..selftest.config import SelftestScenario


def bootstrap_settings(public: PublicPlan, plan: MechanismPlan, record_count: float, start: InitialStart) -> Any:
    """What the parametric bootstrap re-runs (:mod:`dpsummary.bootstrap`): the public settings of
    this DP-PSVI run, its noisy (or public) record count and its DP initialisation histograms:
    public values and DP outputs only, never a record."""
    from ..bootstrap import MechanismSettings

    req = public.req
    return MechanismSettings(
        model=plan.model, transform=plan.transform, size=req.size, steps=req.steps, num_samples=req.num_samples,
        noise_multiplier=plan.noise_multiplier, sample_rate=plan.sample_rate, record_count=float(record_count),
        count_noise_multiplier=public.stage1.count_sigma, init_noise_multiplier=plan.settings["init_noise_multiplier"],
        init_layout=plan.settings["init_layout"], init_marginals=start.marginals,
    )


class DpPsvi(GlmMechanism):
    """DP-PSVI with the release's public defaults (see the module docstring)."""

    name: ClassVar[str] = "dp-psvi"
    sampling: ClassVar[str] = "poisson"

    def plan(self, public: PublicPlan, released: Released) -> MechanismPlan:
        """The GLM's model and transform, q (default 200 / released count), the quality counts'
        noise, the DP initialisation histograms' noise and bins (when the model has one and the
        policy a share) and the noise multiplier of T Poisson-subsampled Gaussian steps, each
        calibrated with the accountant of record so that everything composes to the epsilon."""
        from .. import accounting as acc
        from ..postprocess.marginals import marginals_event

        req = public.req
        model_name, transform, model = glm_model(public, released)
        q = default_sample_rate(req, released)
        split = glm_split(public, initialisation=model_name in DP_INITIALISATION_MODELS)
        quality_sigma, before = quality_noise(public, split)
        init_target = (split["count"] + split["preprocessing"] + split["quality"] + split["initialisation"]) * req.epsilon
        init_sigma, layout, before = plan_initialisation(
            transform, model_name, prior_events=before,
            target_epsilon=init_target if split["initialisation"] > 0 else 0.0,
            delta=public.delta, accountant=public.accountant,
        )
        # Calibrate to the target minus the partition-selection slack so the claim stays <= target.
        sigma = acc.calibrate_noise_multiplier(
            target_epsilon=req.epsilon - selection_slack(public), delta=public.delta, sample_rate=q,
            steps=req.steps, prior_events=before, accountant=public.accountant,
        )
        parts = (*quality_parts(quality_sigma),
                 *(() if init_sigma is None else (("initialisation", marginals_event(init_sigma)),)),
                 ("optimisation", acc.subsampled_gaussian_event(sigma, q, req.steps)))
        return MechanismPlan(self.name, model, transform, sigma, q, req.steps, quality_sigma, parts,
                             {"init_noise_multiplier": init_sigma, "init_layout": layout})

    def run(self, public: PublicPlan, plan: MechanismPlan, records: Any, *, record_count: float,
            progress: ProgressFn | None = None, checkpoint: CheckpointFn | None = None) -> MechanismOutput:
        """The DP initialisation (when planned), then DP-PSVI on the records."""
        from ..constructors.base import fit

        mark = checkpoint or (lambda _name: None)
        req = public.req
        nonpriv = nonprivate_generator(req.seed)
        start = initial_samplers(records, plan.transform, plan.settings["init_layout"],
                                 plan.settings["init_noise_multiplier"])
        notes = [] if start.description is None else [start.description]
        mark("initialised")
        constructor = dp_psvi_constructor(
            transform=plan.transform, model=plan.model, noise_multiplier=plan.noise_multiplier,
            sample_rate=plan.sample_rate, record_count=record_count, steps=req.steps, num_samples=req.num_samples,
            init_features=start.features, init_targets=start.targets,
        )
        summary = fit(constructor, records, plan.model, req.size, generator=nonpriv,
                      transform=plan.transform.to_dict(), progress=progress)
        mark("optimised")
        return MechanismOutput(summary, notes, {"bootstrap_settings": bootstrap_settings(public, plan, record_count,
                                                                                         start)})

    def postprocess(self, public: PublicPlan, output: MechanismOutput, *, progress: ProgressFn | None = None,
                    notice: NoticeFn | None = None) -> MechanismOutput:
        """Calibrate DP-PSVI's intervals by the parametric bootstrap of :mod:`dpsummary.bootstrap`,
        which sees the release's outputs and public settings only (called after the private source
        is CLOSED; no privacy cost). The calibrated pseudocoreset becomes the default summary; the
        uncalibrated one and the bootstrap's record ride along. ``req.seed`` (if any) seeds the
        bootstrap's simulation (it protects nothing). A failure of the bootstrap (a bug) ends the
        charged release in a one-line refusal, never in an uncalibrated artifact."""
        import dataclasses

        from ..bootstrap import BootstrapConfig, ParametricBootstrap
        from ..constructors.gaussian_target import MATCH_KL_WARNING

        say = notice or (lambda _msg: None)
        extra = dict(output.extra)
        settings = extra.pop("bootstrap_settings")
        boot = ParametricBootstrap(settings, BootstrapConfig(seed=public.req.seed))
        workers = boot.config.resolved_workers()
        say(f"calibrating DP-PSVI's intervals: parametric bootstrap, {boot.config.rounds} x {boot.config.replicates} "
            f"re-runs of the mechanism on synthetic tables drawn from the release ({workers} "
            f"{'worker processes' if workers > 1 else 'process (in-process replicates)'}; post-processing, "
            "no privacy cost)")
        try:
            result = boot.fit(output.summary, progress=progress)
        except Exception as exc:  # a bug: the budget is charged, the release refuses in one line
            raise ChargedRefusal(f"the parametric bootstrap of DP-PSVI failed ({type(exc).__name__})",
                                 fix="report this bug") from None
        cal = result.calibration
        say(f"bootstrap done: calibrated posterior (bias and spread per coordinate), "
            f"leave-one-out coverage on its own synthetic replicates {cal.loo_coverage:.0%} (Monte Carlo se "
            f"{cal.loo_coverage_se:.1%}; a self-consistency check on tables drawn from the release, not coverage "
            "on this table: see the warning at the end); "
            f"pseudocoreset matched to it (symmetric KL {cal.match_symmetric_kl:.3g} nats"
            + (", a poor match: the artifact also carries the calibrated Gaussian)"
               if cal.match_symmetric_kl > MATCH_KL_WARNING else ")"))
        record = result.record(settings)
        extra.update(calibration=record)
        # The default summary is the bootstrap-calibrated one (the claim's mechanism.calibration
        # says how); the uncalibrated pseudocoreset rides along for analysts who ask
        # (``dpsummary.load(..., posterior="raw")``).
        body = {"raw_summary": output.summary.to_dict(),
                "posterior": {"default": "calibrated", "gaussians": {"calibrated": record["gaussian"]}}}
        # Last note of the mechanism, printed at the end of the release as "note: warning: ...":
        # the same mechanism-level caveat the claim records (public text, nothing data-derived).
        caveat = warning_text({"mechanism": {"name": self.name, "interval_calibration": DP_PSVI_INTERVAL_CALIBRATION}})
        notes = [*output.notes, f"warning: {caveat}"]
        return dataclasses.replace(output, summary=result.summary, extra=extra, body=body, notes=notes)

    def claim(self, public: PublicPlan, plan: MechanismPlan, output: MechanismOutput) -> dict[str, Any]:
        from ..private.marginals import NUM_INTERIOR_BINS

        req = public.req
        init_sigma, layout = plan.settings["init_noise_multiplier"], plan.settings["init_layout"]
        return {
            "name": self.name,
            # The default summary's calibration by parametric bootstrap (dpsummary.bootstrap).
            "calibration": output.extra.get("calibration"),
            # What that calibration is validated on (issue 37): simulated tables only; inspect,
            # dpsummary.load and the exporters warn from this record (dpsummary.caveats).
            "interval_calibration": dict(DP_PSVI_INTERVAL_CALIBRATION),
            "noise_multiplier": plan.noise_multiplier,
            "sample_rate": plan.sample_rate,
            "steps": req.steps,
            "num_posterior_samples": req.num_samples,
            "clip_norm_rule": (f"{DEFAULT_CLIP_MULTIPLIER:g} x the {DEFAULT_CLIP_QUANTILE:g}-quantile of the L2 "
                               "norms of the centred log-likelihood vectors of "
                               f"{DEFAULT_NUM_REFERENCE} public synthetic records at each step (features "
                               "from the public schema, targets simulated at the prior mean)"),
            "noise": "OpenDP discrete Gaussian from OS entropy",
            **stage_noise(public, plan),
            "initialisation": None if init_sigma is None else {
                "rule": ("initial pseudopoint features drawn from Gaussian-noised per-column histograms "
                         f"over public bins (bounded numeric: at-lower, {NUM_INTERIOR_BINS} equal-width, at-upper; "
                         "categorical: each category and none); L2 sensitivity 1 after dividing the "
                         "counts by sqrt(number of columns)"
                         + ("; a count target is histogrammed the same way and initial targets (also the "
                            "clip-norm reference records') are drawn from its marginal"
                            if any(c.target for c in layout.columns) else "")),
                "noise_multiplier": init_sigma,
                "columns": [c.name for c in layout.columns],
            },
        }

    def selftest_scenarios(self) -> tuple[SelftestScenario, ...]:
        """The batched noisy-sum audits (``dirac``, ``swap``), the ``histogram`` audit of the DP
        initialisation, the one-run audit, the gray-box replay of the full constructor and the
        check that the bootstrap reads no record (:mod:`dpsummary.selftest`)."""
        from ..selftest.bootstrap_check import bootstrap_check
        from ..selftest.config import SUM_SCENARIOS, SelftestScenario
        from ..selftest.noisy_sum import histogram_audit, one_run_audit, sum_audits
        from ..selftest.replay import gray_box_replay

        def sums(cfg: Any, ctx: Any, progress: Any) -> Any:
            chosen = tuple(s for s in cfg.scenarios if s in SUM_SCENARIOS)
            return sum_audits(cfg, chosen, ctx.sigma, ctx.sample_rate, ctx.claimed, ctx.alpha, progress)

        return (
            SelftestScenario("dirac+swap", self.name, "audits",
                             lambda cfg: any(s in SUM_SCENARIOS for s in cfg.scenarios), sums),
            SelftestScenario("histogram", self.name, "audits", lambda cfg: "histogram" in cfg.scenarios,
                             lambda cfg, ctx, progress: [histogram_audit(cfg, ctx.alpha, progress)]),
            SelftestScenario("one-run", self.name, "one_run", lambda cfg: cfg.one_run_canaries > 0,
                             lambda cfg, ctx, progress: one_run_audit(cfg, ctx.sigma, ctx.sample_rate,
                                                                      ctx.claimed_one_run, ctx.alpha, progress)),
            SelftestScenario("replay", self.name, "replay", lambda cfg: cfg.replay,
                             lambda cfg, ctx, progress: gray_box_replay(inject=cfg.inject, progress=progress)),
            SelftestScenario("bootstrap", self.name, "bootstrap", lambda cfg: cfg.bootstrap,
                             lambda cfg, ctx, progress: bootstrap_check()),
        )
