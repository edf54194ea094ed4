"""``noise-aware-cells``: logistic (binary target) or Poisson (count target with its public
upper bound) regression over a small PUBLIC discrete feature domain, one Gaussian mechanism, no
Newton rounds (issue 50; opt-in, the default stays ``noise-aware-newton``).

When to use it: every feature column of the policy's schema is discrete (categorical, or numeric
declared ``integer`` with bounds) and their levels make at most
:data:`dpsummary.cells.domain.MAX_CELLS` cells (the public rule:
:mod:`dpsummary.cells.domain`). Otherwise, and without a public schema, it refuses before any
reservation, naming the fix.

What it releases (:meth:`~dpsummary.private.mechanism.PrivateRecords.noisy_cell_statistics`, the
privacy boundary; :mod:`dpsummary.private.cells`): the records' counts over the domain's cells
(sensitivity 1) and ``T = sum_i [1, x_i] y_i`` (sensitivity ``R B``: ``R`` the domain's largest
``||[1, x_c]||``, ``B`` the target's public bound, 1 for a binary target, the schema's upper bound
for a count, each record's target clipped to ``[0, B]``), as ONE Gaussian mechanism of multiplier ``sigma`` calibrated to the stage's
budget (the counts at multiplier ``sigma / sqrt(f)``, T at ``sigma / sqrt(1 - f)``, ``f`` =
:data:`dpsummary.cells.posterior.COUNT_SHARE`). Then, post-processing: the
noise-aware posterior with the latent counts integrated by imputation
(:mod:`dpsummary.cells.posterior`) and the pseudocoreset moment-matched to it
(:mod:`dpsummary.mechanisms.gaussian_summary`), as ``noise-aware-newton`` builds its own. A
Poisson release first sets ``B`` from the data, as the Newton rounds do (issue 37's twelfth rule;
:func:`count_range`): a Gaussian histogram of the count over the public 1-2-5 grid below the
schema's bound, share :data:`~dpsummary.noise_aware.schedule.COUNT_RANGE_SHARE` of the stage's
Gaussian (the cells get the rest; the two compose to the plan's one multiplier), and ``B`` the
upper edge of the bin holding its noisy 99.9% quantile. Its prior's intercept is centred at the
log of the noisy mean count (:func:`poisson_prior_centre`, as the Newton rounds do), and its
posterior models the clipped count ``min(y, B)`` (:func:`dpsummary.cells.posterior.clipped_poisson_moments`;
issue 50's thirty-third rule, benchmarks/notebook/feature_cells.md).

Stage 1 is the framework's: with a private record count the pipeline still releases its noisy
count (min_records and n_max are judged on it before the plan); the posterior does not read it
(the noisy counts' sum is the N it models). The prototype and its measurements:
benchmarks/feature_cells.py, benchmarks/notebook/feature_cells.md.
"""

from __future__ import annotations

import math
from typing import TYPE_CHECKING, Any, ClassVar

from ..errors import ChargedRefusal, ReleaseError
from .base import (
    NON_FINITE_FIT_FIX,
    NON_FINITE_FIT_MESSAGE,
    CheckpointFn,
    MechanismOutput,
    MechanismPlan,
    ProgressFn,
    gaussian_event,
    nonprivate_generator,
    quality_noise,
    quality_parts,
    refusal_kind,
    selection_slack,
    stage_noise,
)
from .glm import GlmMechanism, glm_model, glm_split

if TYPE_CHECKING:
    from ..plan import PublicPlan, Released, ReleaseRequest
    from ..selftest.config import SelftestScenario

NAME = "noise-aware-cells"
#: The smallest count clip a Poisson release uses: the count grid's first positive edge (a DP clip in
#: the bin of 0 is raised to it).
MIN_COUNT_CLIP = 1.0
#: The fix of every refusal on the model or engine.
USE_NEWTON = "use --mechanism noise-aware-newton"
#: The model each target kind gets (public): logistic for a binary target, Poisson for a count.
SERVED = {"binary": "logistic", "count": "poisson"}
#: Smallest mean count the Poisson prior's centre uses (the Newton rounds' public floor).
MIN_MEAN_COUNT = 0.05
#: The default runs this mechanism instead of the Newton rounds when the policy's public schema
#: is a small discrete domain (:func:`dpsummary.cells.domain.check_schema`) and a cell's mean
#: record count is at least this many sds of a cell count's noise (:func:`records_per_cell_sds`).
#: Issue 50's thirty-first rule (benchmarks/notebook/feature_cells.md), chosen on simulated
#: small-domain tables only: below it the counts' noise costs more than the rounds do.
RECORDS_PER_CELL_SDS = 3.38


def records_per_cell_sds(plan: MechanismPlan, record_count: float) -> float:
    """The mean records per cell in units of a cell count's noise sd: ``(N / D) / (sigma_c /
    sqrt(f))``, with ``N`` the record count (public, or stage 1's DP count), ``D`` the public
    domain's size, ``sigma_c`` the cells' Gaussian multiplier in ``plan`` (the stage's, less the
    Poisson count histogram's share) and ``f`` the counts' share. Public and DP-released values
    only (post-processing)."""
    range_share = float(plan.settings.get("range_share", 0.0))
    cells_multiplier = plan.noise_multiplier / math.sqrt(1.0 - range_share)
    count_sd = cells_multiplier / math.sqrt(float(plan.settings["count_share"]))
    return (record_count / plan.settings["domain"].num_cells) / count_sd


def cells_pay(public: PublicPlan, released: Released) -> bool:
    """Whether the default should run this mechanism (``public.req.mechanism`` already names it):
    the public checks pass on the policy's schema (logistic or Poisson, the local engine, a small
    discrete domain) and :func:`records_per_cell_sds` at this plan is at least
    :data:`RECORDS_PER_CELL_SDS`. Without a public schema, or where a public check refuses, False
    (the Newton rounds serve every GLM). Reads no record."""
    schema = public.policy.data_schema
    if schema is None:
        return False
    mechanism = NoiseAwareCells()
    try:
        mechanism.check_public(public.req, schema)
    except ReleaseError:
        return False
    plan = mechanism.plan(public, released)
    return records_per_cell_sds(plan, released.record_count) >= RECORDS_PER_CELL_SDS


def poisson_prior_centre(model: Any, cells: Any, *, target_bound: float) -> Any:
    """A Poisson model's prior centred at the intercept of the noisy mean count (the Newton
    rounds' ``prior_centre`` rule, :mod:`dpsummary.noise_aware` 5.): ``log(T_0 / N)`` with ``N``
    the noisy counts' sum, clamped to ``[MIN_MEAN_COUNT, max(target_bound, 1)]``, slopes 0; kept
    at the model's own centre when ``T_0`` or ``N`` is below twice its noise sd. An
    empirical-Bayes prior from DP outputs only (free); the released model declares it. Other
    models are returned unchanged."""
    import math

    import torch

    from ..models.glm import PoissonRegression

    if not isinstance(model, PoissonRegression) or not model.intercept:
        return model
    total, t0 = float(cells.counts.sum()), float(cells.statistic[0])
    if not (total > 2.0 * cells.counts_noise_std * math.sqrt(len(cells.counts))
            and t0 > 2.0 * cells.statistic_noise_std):
        return model
    centre = torch.zeros(model.param_dim, dtype=torch.float64)
    centre[0] = math.log(min(max(t0 / total, MIN_MEAN_COUNT), max(target_bound, 1.0)))
    return model.with_prior_mean(centre)


def cells_events(sigma: float, range_share: float) -> list[Any]:
    """The stage's Gaussian events at single-Gaussian multiplier ``sigma``: the count histogram's
    (share ``range_share``, Poisson only) and the cells' (the rest); they compose to
    ``GaussianDpEvent(sigma)``."""
    if range_share <= 0.0:
        return [gaussian_event(sigma)]
    return [gaussian_event(sigma / math.sqrt(range_share)), gaussian_event(sigma / math.sqrt(1.0 - range_share))]


def composed(events: list[Any]) -> Any:
    from dp_accounting import dp_event as dpe

    return events[0] if len(events) == 1 else dpe.ComposedDpEvent(events)


def count_range(records: Any, plan: MechanismPlan, range_share: float) -> Any:
    """The count target's DP clip bound (a :class:`~dpsummary.postprocess.count_range.Clip`), or
    None without a share: the Newton rounds' histogram over the public 1-2-5 grid below the
    schema's bound (:func:`~dpsummary.postprocess.count_range.count_layout`), one Gaussian
    mechanism at ``sigma / sqrt(range_share)``, then :func:`~dpsummary.postprocess.count_range.clip_bound`
    (post-processing)."""
    if range_share <= 0.0:
        return None
    from ..postprocess.count_range import clip_bound, count_layout

    tf, bound = plan.transform, float(plan.settings["target_bound"])
    layout = count_layout(tf.num_features, tf.target or "target", bound)
    noisy = records.noisy_marginals(layout, noise_multiplier=plan.noise_multiplier / math.sqrt(range_share))
    return clip_bound(noisy, bound)


class NoiseAwareCells(GlmMechanism):
    """Cell counts and T in one Gaussian mechanism; the noise-aware posterior (module docstring)."""

    name: ClassVar[str] = NAME
    sampling: ClassVar[str] = "none (every record)"
    requires_public_schema: ClassVar[bool] = True

    def check_public(self, req: ReleaseRequest, schema: Any | None) -> None:
        """Public refusals: the engine, the model (logistic or Poisson), then (with the policy's
        schema) the target (binary for logistic, count for Poisson) and the domain rule (:func:`dpsummary.cells.domain.check_schema`). Without a public schema the
        pipeline refuses before any reservation (``requires_public_schema``)."""
        if req.engine != "local":
            raise ReleaseError(f"{NAME} runs on the local engine only", fix=f"drop --engine spark, or {USE_NEWTON}")
        if req.model is not None and req.model not in SERVED.values():
            raise ReleaseError(f"{NAME} supports logistic and Poisson regression only, not --model {req.model}",
                               fix=USE_NEWTON)
        if schema is None:
            return
        from .. import data as dmod
        from ..cells.domain import check_schema

        super().check_public(req, schema)
        kind = dmod.target_kind(schema)
        if kind not in SERVED or (req.model is not None and req.model != SERVED[kind]):
            raise ReleaseError(f"{NAME} supports logistic regression of a binary target and Poisson regression of a "
                               f"count target only; the schema's target is {kind}", fix=USE_NEWTON)
        check_schema(schema)

    def plan(self, public: PublicPlan, released: Released) -> MechanismPlan:
        """The model, the target's public bound, the domain under the policy's data-quality rules, and ONE
        Gaussian event calibrated (with the accountant of record) so that stage 1's events, the
        quality counts' and it compose to the release's epsilon."""
        from .. import accounting as acc
        from ..cells.domain import cell_domain
        from ..cells.posterior import COUNT_SHARE
        from ..models.glm import LogisticRegression, PoissonRegression
        from ..noise_aware.schedule import COUNT_RANGE_SHARE

        _name, transform, model = glm_model(public, released)
        if isinstance(model, LogisticRegression):
            target_bound = 1.0
        elif isinstance(model, PoissonRegression):
            # The count's public upper bound (a count target's schema has one): each record's
            # target is clipped there, so T's sensitivity is the design radius times it.
            target_bound = float(transform.schema.target_column.upper)
        else:  # check_public refused this on the public schema
            raise refusal_kind(public)(f"{NAME} supports logistic and Poisson regression only", fix=USE_NEWTON)
        rules = public.policy.data_quality
        domain = cell_domain(transform, missing_numeric=rules.missing_numeric, unseen_category=rules.unseen_category)
        quality_sigma, before = quality_noise(public, glm_split(public, initialisation=False))
        range_share = COUNT_RANGE_SHARE if isinstance(model, PoissonRegression) else 0.0
        sigma, events = acc.calibrate_split_gaussian(  # the count histogram and the cells compose to one Gaussian
            lambda s: cells_events(s, range_share), target_epsilon=public.req.epsilon - selection_slack(public),
            delta=public.delta, prior_events=before, accountant=public.accountant)
        parts = (*quality_parts(quality_sigma), ("optimisation", composed(events)))
        return MechanismPlan(self.name, model, transform, sigma, 1.0, 1, quality_sigma, parts,
                             {"domain": domain, "count_share": COUNT_SHARE, "target_bound": target_bound,
                              "range_share": range_share})

    def run(self, public: PublicPlan, plan: MechanismPlan, records: Any, *, record_count: float,
            progress: ProgressFn | None = None, checkpoint: CheckpointFn | None = None) -> MechanismOutput:
        import torch

        from ..cells.posterior import cells_posterior
        from ..noise_aware.released import NonFiniteFit
        from .gaussian_summary import summary_of_gaussian

        mark = checkpoint or (lambda _name: None)
        nonpriv = nonprivate_generator(public.req.seed)
        mark("initialised")  # nothing to release before the one mechanism
        model, domain, share = plan.model, plan.settings["domain"], plan.settings["count_share"]
        design = model.design(torch.from_numpy(domain.features()))
        range_share = plan.settings.get("range_share", 0.0)
        count_clip = count_range(records, plan, range_share)
        # A clip in the count grid's bin of 0 (every bin above it under the noise) would clip every
        # count to 0: T then carries nothing and its sensitivity is 0. The first positive grid
        # edge, 1, keeps "any count" (a public rule on a DP output; as the Newton rounds' max(B, 1)).
        target_bound = plan.settings["target_bound"] if count_clip is None else max(count_clip.bound, MIN_COUNT_CLIP)
        cells_multiplier = plan.noise_multiplier / math.sqrt(1.0 - range_share)
        cells = records.noisy_cell_statistics(domain, design.numpy(), target_bound=target_bound, count_share=share,
                                              noise_multiplier=cells_multiplier)
        model = poisson_prior_centre(model, cells, target_bound=target_bound)
        try:
            posterior = cells_posterior(model, design, torch.from_numpy(cells.counts),
                                        torch.from_numpy(cells.statistic), counts_noise_std=cells.counts_noise_std,
                                        statistic_noise_std=cells.statistic_noise_std, generator=nonpriv,
                                        target_bound=float(target_bound))
        except NonFiniteFit:
            raise ChargedRefusal(NON_FINITE_FIT_MESSAGE, fix=NON_FINITE_FIT_FIX) from None
        requested = public.req.size
        built = summary_of_gaussian(model, posterior, transform=plan.transform, size=max(requested, model.param_dim),
                                    requested=requested, method=NAME, generator=nonpriv)
        mark("optimised")
        gaussians = {"noise_aware": {"mean": posterior.mean.tolist(), "cov": posterior.cov.tolist()}}
        radius = float(design.norm(dim=1).max())
        notes = [f"{NAME}: the counts of {domain.num_cells} public feature cells and T = sum [1, x] y released by one "
                 "Gaussian mechanism; the posterior integrates both noises (latent counts imputed)",
                 *([] if count_clip is None else [count_clip.note()]), *built.notes]
        extra = {"gaussians": gaussians, "pseudocoreset_match": built.pseudocoreset_match,
                 "domain": domain.describe(), "count_share": share, "design_radius": radius,
                 "count_range": None if count_clip is None else count_clip.claim(), "target_bound": target_bound,
                 "cells_noise_multiplier": cells_multiplier,
                 "noise_stds": {"counts": cells.counts_noise_std, "statistic": cells.statistic_noise_std},
                 "prior_mean": built.model.prior_mean.tolist()}
        body = {"posterior": {"default": "noise_aware", "gaussians": gaussians,
                              "pseudocoreset_match": built.pseudocoreset_match}}
        return MechanismOutput(built.summary, notes, extra, body)

    def claim(self, public: PublicPlan, plan: MechanismPlan, output: MechanismOutput) -> dict[str, Any]:
        ex = output.extra
        share = ex["count_share"]
        sigma = ex.get("cells_noise_multiplier", plan.noise_multiplier)  # the cells' Gaussian (the stage's, less the count histogram's share)
        return {
            "name": self.name,
            "description": ("for Poisson, first one Gaussian mechanism over ALL records releases a histogram of the "
                            "count target over public 1-2-5 bins below the schema's bound (sensitivity 1; share "
                            "count_range_share of the stage's Gaussian) and target_bound is the upper edge of the bin "
                            "holding its noisy 99.9% quantile, at least 1 (count_range; issue 37's twelfth rule, as the "
                            "Newton rounds); then one Gaussian mechanism over ALL records releases the record counts of the "
                            "public feature domain's cells (every combination of the schema's declared levels; "
                            "sensitivity 1) and T = sum_i [1, x_i] y_i with x_i the record's cell's features and y_i "
                            "clipped to [0, target_bound] (sensitivity design_radius x target_bound); for Poisson the "
                            "prior is centred at the log of the noisy mean count (prior_mean); "
                            "the noise-aware posterior N(T | mu(theta, n), H(theta, n) + noise) (for Poisson with the "
                            "moments of the clipped count min(y, target_bound)) with the latent counts "
                            "integrated by imputation (Kulkarni et al. 2021 style) is carried by the pseudocoreset "
                            "(moment-matched; post-processing)"),
            "single_gaussian_noise_multiplier": plan.noise_multiplier,
            "cells_noise_multiplier": sigma,
            "count_range": ex.get("count_range"),
            "count_range_share": plan.settings.get("range_share", 0.0),
            "count_share": share,
            "counts_noise_multiplier": sigma / share**0.5,
            "statistic_noise_multiplier": sigma / (1.0 - share) ** 0.5,
            "design_radius": ex["design_radius"],
            "target_bound": ex.get("target_bound", plan.settings["target_bound"]),
            "schema_target_bound": plan.settings["target_bound"],
            "noise_stds": ex["noise_stds"],
            "domain": ex["domain"],
            "domain_rule": ("public, from the schema and the policy's data-quality rules: categorical columns' one-hot "
                            "levels (plus the all-zero missing/other level when unseen_category = other), integer "
                            "numeric columns' integers inside their bounds in model space (plus the centre when "
                            "missing_numeric = impute); a record maps to the nearest level per column"),
            "prior_mean": ex.get("prior_mean"),
            "sampling": "none (every record)",
            "noise": "OpenDP discrete Gaussian from OS entropy",
            **stage_noise(public, plan),
        }

    def selftest_scenarios(self) -> tuple[SelftestScenario, ...]:
        """``cells``: the white-box audit of its one release (:func:`dpsummary.selftest.cells.cells_audit`)."""
        from ..selftest.cells import cells_audit
        from ..selftest.config import SelftestScenario

        return (SelftestScenario("cells", self.name, "audits", lambda cfg: "cells" in cfg.scenarios,
                                 lambda cfg, ctx, progress: [cells_audit(cfg, ctx.alpha, progress)]),)
