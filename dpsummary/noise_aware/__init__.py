"""Noise-aware private posterior from noisy score statistics (the default release mechanism).

The paper's DP-PSVI privatises an S-dimensional log-likelihood vector at every one of hundreds of
subsampled steps. Most of that budget buys nothing an analyst sees, and the released posterior
ignores the noise it was built from, so its intervals are overconfident (issue 14). This module
spends the budget on the few statistics a Gaussian posterior approximation is made of and then
accounts for the noise in the posterior itself:

1. **Rounds of DP Newton** (Ganesh, Haghifam, Steinke and Thakurta 2023). Round k releases, at a
   public anchor ``a_k`` (the prior mean, then the previous round's noise-aware mean), the noisy
   sums ``s = sum_i grad log p(x_i | a_k) + xi`` and ``H = sum_i -hess log p(x_i | a_k) + E``
   (:mod:`dpsummary.private.score_stats`, two Gaussian mechanisms, clipped to public bounds).
   Conjugate models are exactly quadratic, so one round is their whole answer.
2. **Noise-aware likelihood of the released statistic** (Bernstein and Sheldon 2018; Kulkarni,
   Jaelkoe, Koskela, Kaski and Honkela 2021, Sec. 3, for GLMs). Around the anchor the log-
   likelihood is quadratic, so the score sum is ``S = H (theta_hat - a)`` with the data's MLE
   ``theta_hat ~ N(theta, H^-1)`` given the parameter, hence given theta the released statistic
   is ``s ~ N(H (theta - a), H + Sigma_xi)``. With the Gaussian prior this gives the posterior
   ``precision = H V^-1 H + P``, ``mean = precision^-1 (H V^-1 (s + H a) + P mu0)``, with
   ``V = H + Sigma_xi``. Without noise (Sigma_xi = 0) it is exactly the full-data Laplace
   posterior; with noise it widens exactly in the directions the noise hides, and shrinks to the
   prior where the noise dominates. ``Sigma_xi`` holds the score noise ``(sigma_s C_s)^2 I`` and
   the curvature noise's effect ``E u`` on the statistic (``u = theta_hat - a``), whose
   covariance for symmetric noise of entry variance tau^2 is ``tau^2 (|u|^2 I + u u^T)``; u is
   plugged in from the posterior itself (two fixed-point passes).

Everything after the mechanisms is post-processing of DP outputs and public parameters (the
schema's bounds, the prior, the noise multipliers), so it costs no privacy. The raw (not noise-
aware) posterior ``N((H + P)^-1 (s + H a + P mu0), (H + P)^-1)`` is returned for benchmarks
(:class:`NoiseAwareFit`); releases no longer carry it (issue 25).

3. **Anchors for log-link models** (issue 25). Poisson intercepts sit far from the prior mean
   (log of a mean count of 150 is 5), where a Newton step from 0 is useless: the curvature at
   0 is a count's worth of a rate of 1. With ``Schedule.anchor = "log-mean"`` the first round
   (at the prior mean, slopes 0) is read as an intercept-only Poisson release: its intercept
   entries are ``s_0 = sum(y_i) - n`` and ``H_00 = n`` (plus noise), so the next anchor is the
   intercept ``log(1 + s_0 / H_00)`` (the log of a noisy mean count) with slopes 0; a function
   of round 1's DP outputs, so it costs nothing extra. Every later anchor moves the linear
   predictor of any record of the public feature box by at most ``Schedule.trust_eta`` (a
   public trust region), and the statistic bounds follow the anchor's public bound on the
   linear predictor (:meth:`dpsummary.models.PoissonRegression.linear_predictor_bound`).

4. **Damped anchor steps** (optional, ``Schedule.step_prior = "anchor"``): an intermediate
   anchor may be computed with the model's prior scale centred at the current anchor instead of
   the prior mean, so noise-dominated directions stay put instead of shrinking towards the prior
   mean (e.g. a Poisson intercept of 5 towards 0). Post-processing; the last round's posterior
   always uses the analyst's prior. Not a default (benchmarks/results/poisson_tune.md).

5. **A prior centred where the counts are** (Poisson default, ``Schedule.prior_centre``). The
   analyst-facing prior ``N(0, I)`` on standardised coefficients is fine for slopes but puts an
   intercept of 5 (a mean count near 150) five prior sds out; where the features are not
   centred, the intercept direction is weakly identified and the noise-aware posterior shrinks
   it towards 0, which biases every slope that correlates with it
   (benchmarks/results/poisson_diagnosis.md). So once round 1 has released the log-mean anchor
   ``c = (log noisy mean count, 0, ..., 0)``, every later posterior uses the prior
   ``N(c, prior_scale^2 I)`` (an empirical-Bayes prior built from DP outputs only: free). The
   released model declares ``prior_mean = c`` (:meth:`dpsummary.models.Model.spec`), so the
   pseudocoreset, the exporters and every sampler use the same prior.

6. **Anchors for logistic regression** (issue 37). With an intercept far from 0 (imbalanced
   classes: 3-5% positives is a log-odds of -3), Newton from the prior mean under-steps: the
   curvature at 0 (1/4 per record) is up to 8x the mode's, so a few rounds stop short and the
   last expansion is read with too large a curvature (too narrow and off-centre;
   benchmarks/results/noise_aware_variants.md). With ``Schedule.anchor = "log-odds"`` the first
   round (at the prior mean, slopes 0) is read as an intercept-only logistic release: its
   intercept entries are ``s_0 = sum(y_i - s(a_0))`` and ``H_00 = n s(a_0) s(-a_0)`` (plus
   noise), so the next anchor is the intercept at the log-odds of the noisy positive share, with
   slopes 0 (:func:`log_odds_anchor`; a function of round 1's DP outputs, so free).

7. **The curvature's noise integrated out** (issue 37, ``Schedule.posterior = "imputed"``).
   The plug-in posterior (2.) reads the noisy curvature as the data's: where the noise's
   eigenvalues rival the data's (rare indicators beside the intercept, directions the data do
   not identify, wide public bounds) it credits the noise with information. Treating the true
   curvature as latent (Bernstein and Sheldon 2018) and integrating it out by multiple
   imputation (:func:`imputed_posterior`: draws from its flat-prior posterior given the release,
   the posterior given each, their moment-matched mixture) widens exactly those directions
   (benchmarks/results/noise_aware_variants.md).

8. **The expansion's error integrated out** (issue 37, ``Schedule.expansion``). The released
   posterior reads the last round's score with the curvature at its anchor; when the rounds
   stopped short of the mode (large effects: Newton from the prior mean under-steps, and noisy
   intermediate anchors stall), the curvature along the last step differs from the anchor's and
   the step is wrong by a factor. :func:`expansion_aware` bounds that factor from the largest
   change of the linear predictor along the step (the curvature weights' ``|d log w / d eta| <=
   1``), takes it log-uniform on the range and moment-matches: the mean moves along the step and
   the covariance widens along it, by nothing when the step is small. ``"data"`` estimates the
   change from the released curvature (3 weighted rms changes) rather than the public box, which
   can be far wider than the data. An option, not a default: it qualified on the simulated
   tables but its whole-suite confirmation failed, and it cannot see a release whose last step is
   small because the noise-aware posterior stayed near a far anchor
   (benchmarks/results/noise_aware_variants.md, seventh rule). Judged again in zero configuration
   (issue 50's forty-second rule) it gained four cells whose dominant coefficients the rounds
   leave short and lost none, but widened low-epsilon releases along a last step the noise made;
   ``Schedule.expansion_gate`` (an option) applies it only where the convergence check fails.

9. **Rounds pooled** (issue 37, ``Schedule.pool``). Only the last round's statistics make the
   released posterior, so the budget of the rounds that place the anchor is lost to it. Where the
   noise hides the data the anchors barely move (``nass`` at epsilon 0.3: every anchor within 0.3
   of the prior mean), and the earlier rounds measure the same score and curvature as the last:
   :func:`pooled_release` averages the rounds whose anchors lie within :data:`POOL_ETA` of the
   last (linear-predictor change over the public box), the scores moved to the last anchor
   through the quadratic expansion.

10. **Curvatures pooled** (issue 37, ``Schedule.pool_curvature``). The curvature's noise is
    most of the width the released posterior has beyond the idealised floor's (the NAPSU-MQ
    problem at epsilon 0.3: 5.2x the full-data width, 2.9x with the curvature exact, the floor
    2.5x), and the rounds before the last released curvatures too. Near the mode the curvature
    changes only through the curvature weights, to first order by the change of the linear
    predictor, so :func:`pooled_curvature_release` averages the released curvatures of the
    rounds whose anchors lie within :data:`POOL_RMS_ETA` curvature-weighted rms change of it.

11. **The count's clip bound from the data** (issue 37, ``Schedule.count_range``; the Poisson
    default). The score's sensitivity grows with the count column's upper bound ``B``, which a
    careful curator declares far above the data (10,000 for counts whose 99.9% quantile is 257),
    and the zero-configuration schema puts at the highest noisy grid bin: the releases were
    100-800x the full-data width where the idealised floor is 1-10x. Before the rounds, one more
    Gaussian mechanism releases a histogram of the count over the public 1-2-5 grid edges below
    ``B`` (a record in one bin: sensitivity 1; :meth:`~dpsummary.private.mechanism.PrivateRecords.noisy_marginals`);
    the clip bound is the upper edge of the bin holding its noisy 99.9% quantile, capped at ``B``
    (:mod:`dpsummary.postprocess.count_range`, post-processing), and every round's statistic
    bounds use it. A record above it has its score clipped like a record outside the public box
    (a bias the 0.1% tail makes small: benchmarks/results/noise_aware_variants.md, twelfth rule).

12. **The features' norm clipped at the data's** (issue 37's thirteenth rule,
    ``Schedule.feature_range``). The score's and the curvature's sensitivities grow with the
    largest feature norm the public box allows, which a curator's wide bounds put far above the
    data (the suite's ``sim_correlated`` and ``sim_imbalanced``: the data's 99.9% norm is 0.11x
    and 0.15x the box's). One more histogram, of the L2 norm of each record's model-space
    features over public geometric bins below the box's norm (in the same Gaussian mechanism as
    the count's histogram when there is one), sets the norm every round's bounds, trust region
    and convergence check use: the upper edge of the bin holding its noisy 99.9% quantile
    (:mod:`dpsummary.postprocess.count_range`). A record above it has its score and curvature
    clipped, the same bias as the count's clip. An option, not a default: the thirteenth rule
    failed on the simulations (one honest cell fewer; ``sim_correlated`` at 0.3 widened 47%), and
    on real public schemas the box's corners are where the records are (0/1 columns map to +-1).

13. **The last round's split chosen from the rounds before it** (issue 37's twenty-fourth rule,
    ``Schedule.last_split``). More curvature budget in the last round narrows the tables whose
    released curvature's noise is the bottleneck (rare indicators: the NAPSU-MQ problem, whose
    release at epsilon 0.3 would be 2.9x the full-data width with its curvature exact instead of
    4.2x) and widens those whose score's noise is (large N, few features). Before the last round,
    :func:`preposterior_split` simulates it under each candidate split (:data:`LAST_SPLITS`) from
    the previous round's released curvature and picks the one whose imputed posterior is expected
    narrowest. The candidates' two Gaussians compose to the same one Gaussian (RDP and PLD), so
    the accountant's event is that Gaussian whichever is chosen (:meth:`Schedule.events`), and
    the choice is post-processing of DP outputs (adaptive composition with a fixed privacy
    profile).

14. **Placement rounds merged once the anchor has settled** (issue 37's twenty-fifth rule,
    ``Schedule.merge_rounds``). The placement rounds' statistics never reach the released
    posterior; once a round's step to the next anchor moves the linear predictor by at most
    :data:`MERGE_RMS_ETA` (curvature-weighted rms, :func:`rms_eta`), the rounds left are run as one
    last round at that anchor with the sum of their shares. Every path spends the same total rho
    in Gaussians, so rounds 2.. are declared as the one Gaussian they compose to (fully adaptive
    composition for Gaussian DP, Smith and Thakurta 2022; Renyi filters, Feldman and Zrnic 2021),
    and the decision is post-processing of DP outputs.

15. **Counts at the clip bound censored** (issue 50's thirty-second rule,
    ``Schedule.censor_counts``). With the count clipped at the public bound ``B`` (11.), a record
    whose count is ``K = max(floor(B), 1)`` or more enters the rounds' statistics with the score
    and curvature of ``log P(Y >= K)`` (:class:`~dpsummary.models.glm.CensoredPoissonRegression`),
    the exact likelihood of ``min(Y, K)``, instead of a clipped score under the mean model
    ``exp(eta)``, which ignores the clip and biases the intercept low where the clip cuts a visible
    share of the count mass. The score weight lies in ``(0, K]`` and the curvature weight in
    ``[0, mu]``, so the statistic bounds and the events are unchanged. Under the Poisson model the
    censoring is unbiased; on an overdispersed table the tail above ``K`` is extrapolated from the
    model, so a misfit in the tail still biases the intercept. An option, not a default: the
    rule moved no verdict in paired public runs and widened ``sim_poisson_rare`` at epsilon 0.1
    1.19x, where the noisy clip lands inside the counts' bulk and censoring drops what today's
    norm clip keeps (benchmarks/notebook/noise_aware_variants.md).

16. **Each imputed curvature at its own trace** (issue 50's thirty-seventh rule,
    ``Schedule.spectrum = "trace"``; the logistic and Poisson default). An imputation draw of
    the curvature (7.) is the released matrix plus fresh noise, so where the noise dominates,
    half its eigenvalues are negative, and its PSD part adds their magnitude to the trace: the
    noise is credited as about one prior's worth of information in every direction the data do
    not identify, and the release is narrower than any mechanism at that budget could honestly
    be (``hmda``; the simulation ``sim_categorical``). The trace is the one statistic of the
    spectrum the noise barely moves, so each draw is replaced by the nearest PSD matrix with
    its own trace (:func:`trace_kept_spectrum`: eigenvalues soft-thresholded). Where the data
    dominate the noise it changes nothing. Judged on fresh paired runs under rule 4''
    (benchmarks/notebook/noise_aware_variants.md): three simulated cells and two real ones
    turned honest, none lost, the honest cells 1.08x / 1.10x wider (simulated / real, geometric
    mean), 1.03x counted from the floor.

17. **The posterior along exact one-hot relations is the prior's** (issue 50's thirty-eighth
    and thirty-ninth rules, ``Schedule.relations``; the logistic and Poisson default). A categorical column is one-hot over all its public categories,
    so with the intercept every record satisfies ``x_i . v = 0`` for ``v = e_0 - sum_{level}
    e_level``: the data's score and curvature are exactly 0 along ``v`` and the full data's
    posterior there is the prior's. An imputed curvature draw (7.) keeps noise along ``v``, and
    the released score's noise there is then read as information. With ``relations`` the
    candidates of the public schema (:func:`model_relations`) that the last round's released
    curvature does not tell from exact (:func:`exact_relations`: ``v^T H v`` within
    :data:`RELATION_Z` noise sds of 0; a relation broken by fewer records than the noise resolves
    is taken as exact, so its direction gets the prior, wider than the full data's, never
    narrower) are projected off every draw (:func:`relation_projector`), as linear regression's
    imputed moment matrix is (issue 51). Post-processing of the last round's DP outputs and the
    public schema; the claim lists the relations projected off. Judged on fresh paired runs
    (benchmarks/notebook/noise_aware_variants.md): no cell turned dishonest, `wells` 1 turned
    honest, and the releases narrower than the full data's posterior (`fertility` 0.87-0.89x) are
    1.00x; `default`-like tables 7-14% narrower at epsilon 1-3, the others 1-5% wider.

18. **The curvature's one-hot support** (issue 50's fortieth rule, ``Schedule.support``; the
    logistic and Poisson default). One-hot
    coding fixes entries of every record's ``w x x^T``, hence of the released curvature's target,
    whatever the data: two levels of one column are never both 1 (their entry is 0), a level is
    its own square (its diagonal equals its intercept-row entry), and two levels of different
    columns give an entry between 0 and the smaller of their diagonals. The imputed draws (7.)
    ignore this and put the mechanism's noise in every such entry (``adult``'s schema fixes about
    1,100 of its 5,671 entries at 0). With ``support`` each draw is taken under a flat prior on
    that support (:func:`support_draw`: those entries' Gaussians truncated to their bounds; the
    rest as before). Post-processing of the last round's DP output and the public schema, no
    privacy cost; identical to the draws without it on a schema with no categorical column.
    Judged on fresh paired runs (benchmarks/notebook/noise_aware_variants.md): no cell turned
    dishonest, `nass` 0.3 turned honest; `adult` 5-12% narrower at epsilon 0.3-3 (effects found
    at 3: 5.4 -> 8.8 per release), an adult-like simulation 9-20%, `smokeban`,
    `health_insurance` and `nass` up to 9%.

Totality: whatever the noise draws, :func:`fit` returns finite Gaussians or raises
:class:`NonFiniteFit` (a DP-decided outcome; the release turns it into a charged refusal).

The noise-aware posterior is the release's target; :mod:`dpsummary.constructors.gaussian_target`
turns it into weighted pseudopoints any sampler can use.

The package holds one idea per module: :mod:`.schedule` (the budget's division, the defaults,
calibration), :mod:`.rounds` (the Newton rounds, their anchors and :func:`fit`),
:mod:`.posterior` (the noise-aware and imputed posteriors of one round's release),
:mod:`.variants` (the schedule's options: preposterior split, pooling, expansion-aware),
:mod:`.bounds` (the public feature box), :mod:`.relations` (exact one-hot relations: the
candidates, the test, the projector), :mod:`.support` (the curvature's one-hot support and draws
on it), :mod:`.linear` (linear regression with sigma estimated:
the noisy moment matrix's imputed posterior, issue 51) and :mod:`.released` (what a round releases, and
:class:`NonFiniteFit`). Every public name is re-exported here; import from
``dpsummary.noise_aware``.
"""

from __future__ import annotations

from .bounds import (
    eta_change,
    public_bounds,
    schema_bounds,
)
from .linear import (
    LINEAR_IMPUTATIONS,
    linear_posterior,
    moment_bound,
    residual_bound,
    residual_posterior,
    square_scale,
)
from .objective import (
    OP_JACOBIAN_SHARE,
    OP_OUTPUT_MULTIPLIER,
    TILT_GRID_RATIO,
    ObjectiveSchedule,
    calibrate_objective,
    calibrate_rdp_scale,
    objective_round,
    objective_schedule,
    records_round,
    ridge_for,
)
from .posterior import (
    IMPUTATIONS,
    imputed_posterior,
    noise_aware_posterior,
    prior_precision,
    symmetric_noise,
    trace_kept_spectrum,
)
from .relations import (
    RELATION_Z,
    exact_relations,
    model_relations,
    one_hot_relations,
    relation_projector,
)
from .released import (
    MECHANISM,
    BoundsFn,
    NonFiniteFit,
    ReleaseFn,
    RoundRelease,
    psd_part,
)
from .rounds import (
    EXPANSION_BIAS_SDS,
    MIN_MEAN_COUNT,
    MIN_SHARE,
    UNCONVERGED_SDS,
    NoiseAwareFit,
    State,
    expansion_error,
    fit,
    init,
    log_mean_anchor,
    log_odds_anchor,
    step,
    trust_region,
)
from .schedule import (
    COUNT_RANGE_SHARE,
    DEFAULT_ROUNDS,
    POISSON_ROUNDS,
    POISSON_TRUST_ETA,
    THREE_ROUNDS,
    Schedule,
    calibrate,
    range_clips,
    statistic_model,
)
from .support import (
    CurvatureSupport,
    curvature_support,
    design_support,
    support_draw,
    truncated_normal,
)
from .variants import (
    EXPANSION_RMS_FACTOR,
    LAST_SPLITS,
    MERGE_RMS_ETA,
    POOL_ETA,
    POOL_RMS_ETA,
    PREPOSTERIOR_DRAWS,
    PREPOSTERIOR_IMPUTATIONS,
    PREPOSTERIOR_SEED,
    expansion_aware,
    expansion_range,
    pooled_curvature_release,
    pooled_release,
    preposterior_split,
    rms_eta,
)

__all__ = [
    "OP_JACOBIAN_SHARE",
    "OP_OUTPUT_MULTIPLIER",
    "TILT_GRID_RATIO",
    "ObjectiveSchedule",
    "calibrate_objective",
    "calibrate_rdp_scale",
    "objective_round",
    "objective_schedule",
    "records_round",
    "ridge_for",
    "BoundsFn",
    "COUNT_RANGE_SHARE",
    "CurvatureSupport",
    "curvature_support",
    "design_support",
    "support_draw",
    "truncated_normal",
    "LINEAR_IMPUTATIONS",
    "RELATION_Z",
    "linear_posterior",
    "moment_bound",
    "residual_bound",
    "residual_posterior",
    "square_scale",
    "exact_relations",
    "one_hot_relations",
    "DEFAULT_ROUNDS",
    "EXPANSION_BIAS_SDS",
    "EXPANSION_RMS_FACTOR",
    "IMPUTATIONS",
    "LAST_SPLITS",
    "MECHANISM",
    "MERGE_RMS_ETA",
    "MIN_MEAN_COUNT",
    "MIN_SHARE",
    "NoiseAwareFit",
    "NonFiniteFit",
    "POISSON_ROUNDS",
    "POISSON_TRUST_ETA",
    "POOL_ETA",
    "POOL_RMS_ETA",
    "PREPOSTERIOR_DRAWS",
    "PREPOSTERIOR_IMPUTATIONS",
    "PREPOSTERIOR_SEED",
    "ReleaseFn",
    "RoundRelease",
    "Schedule",
    "State",
    "THREE_ROUNDS",
    "UNCONVERGED_SDS",
    "calibrate",
    "eta_change",
    "expansion_aware",
    "expansion_error",
    "expansion_range",
    "fit",
    "imputed_posterior",
    "init",
    "log_mean_anchor",
    "log_odds_anchor",
    "noise_aware_posterior",
    "pooled_curvature_release",
    "pooled_release",
    "preposterior_split",
    "prior_precision",
    "model_relations",
    "psd_part",
    "relation_projector",
    "public_bounds",
    "range_clips",
    "rms_eta",
    "schema_bounds",
    "statistic_model",
    "step",
    "symmetric_noise",
    "trace_kept_spectrum",
    "trust_region",
]
