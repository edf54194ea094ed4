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
   (benchmarks/results/noise_aware_variants.md, seventh rule).

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

Totality: whatever the noise draws, :func:`fit` returns finite Gaussians or raises
:class:`NonFiniteFit` (a DP-decided outcome; the release turns it into a charged refusal).

The noise-aware posterior is the release's target; :mod:`dpsummary.constructors.gaussian_target`
turns it into weighted pseudopoints any sampler can use.
"""

from __future__ import annotations

import dataclasses
import math
from collections.abc import Callable, Sequence
from dataclasses import dataclass, field
from typing import Any

import torch

from . import accounting as acc
from .gaussian import DTYPE, GaussianPosterior
from .models import Model

#: Convergence check of the rounds (public): a last step larger than this many posterior sds
#: in some coordinate is reported in the release's notes.
UNCONVERGED_SDS = 3.0
#: Name of the mechanism in artifacts, the CLI (``--mechanism``) and the benchmarks.
MECHANISM = "noise-aware-newton"


@dataclass(frozen=True)
class Schedule:
    """How the budget is divided over the mechanisms, as shares of the zero-concentrated
    privacy parameter rho = 1 / (2 sigma^2): Gaussian mechanisms compose additively in rho (and
    exactly as one Gaussian in RDP and PLD), so share w_j means noise multiplier
    ``sigma / sqrt(w_j)`` where ``sigma`` is the single-Gaussian calibration of the whole
    budget. ``rounds[k] = (score_share, curvature_share)``; shares sum to 1.

    Default rule (written down before any real table was run; chosen on simulated logistic and
    Poisson tables only, benchmarks/trust.py --tune, then issue 37's rules in
    benchmarks/results/noise_aware_variants.md): conjugate models one round (their likelihood is
    exactly quadratic) with the plug-in posterior; logistic regression :data:`DEFAULT_ROUNDS`,
    Poisson :data:`POISSON_ROUNDS`, both with the imputed posterior."""

    rounds: tuple[tuple[float, float], ...]
    #: How the anchor after round 1 is chosen: None (the noise-aware mean), ``"log-mean"``
    #: (log-link GLMs with an intercept; module docstring, 3.) or ``"log-odds"`` (logistic
    #: regression with an intercept; module docstring, 6.). Public.
    anchor: str | None = None
    #: Public trust region: a new anchor changes the linear predictor of any record of the
    #: public feature box by at most this much (None: no limit). Needs ``feature_norm`` in :func:`fit`.
    trust_eta: float | None = None
    #: :func:`noise_aware_posterior`'s fixed-point passes and their start (public).
    passes: int = 2
    start: str = "raw"
    #: The prior the intermediate anchors are computed with: ``"model"`` (the analyst's prior)
    #: or ``"anchor"`` (the same scale, centred at the current anchor: a damped, noise-aware
    #: Newton step; module docstring, 4.). The last round's posterior always uses the model's
    #: prior. Public.
    step_prior: str = "model"
    #: Where the released posterior's prior is centred: None (the model's prior mean),
    #: ``"log-mean"`` (the intercept at round 1's log-mean anchor, slopes at 0; module
    #: docstring, 5.; needs ``anchor == "log-mean"``) or ``"log-odds"`` (the same for logistic
    #: regression at round 1's log-odds anchor; needs ``anchor == "log-odds"``; issue 37's tenth
    #: rule). Public rule on DP outputs; the artifact's model declares the centre so analysts
    #: sample the same posterior.
    prior_centre: str | None = None
    #: How the released (last round's) posterior carries the curvature's noise: ``"plug-in"``
    #: (the noisy curvature plugged in, its noise's effect on the score through ``E u``; module
    #: docstring, 2.) or ``"imputed"`` (the true curvature integrated out by multiple
    #: imputation; module docstring, 7.). Intermediate anchors always use the plug-in. Public.
    posterior: str = "plug-in"
    #: Whether the released posterior also carries the last expansion's error
    #: (:func:`expansion_aware`; module docstring, 8.): None (no), ``"box"`` or ``"data"`` (its
    #: ``eta_rule``). Needs ``feature_norm`` in :func:`fit`. Public.
    expansion: str | None = None
    #: Whether the released posterior is built from the last round pooled with the earlier
    #: rounds whose anchors lie near it (:func:`pooled_release`; module docstring, 9.). Needs
    #: ``feature_norm`` in :func:`fit`. Public.
    pool: bool = False
    #: Whether the released posterior uses the last round's curvature pooled with the earlier
    #: rounds' whose anchors lie near it (:func:`pooled_curvature_release`; module docstring,
    #: 10.). Public.
    pool_curvature: bool = False
    #: The share of rho spent on the count target's histogram whose noisy quantile sets the
    #: target's clip bound (module docstring, 11.; :mod:`dpsummary.postprocess.count_range`), or 0
    #: (the schema's bound). Counts only (Poisson). Public.
    count_range: float = 0.0
    #: The share of rho spent on the histogram of the features' L2 norm whose noisy quantile sets
    #: the norm the rounds' bounds use (module docstring, 12.), or 0 (the schema's box). Public.
    feature_range: float = 0.0
    #: How the last round's share is split between its score and its curvature: None (as
    #: ``rounds[-1]`` says) or ``"preposterior"`` (chosen among :data:`LAST_SPLITS` from the
    #: earlier rounds' DP outputs, :func:`preposterior_split`; module docstring, 13.). The
    #: candidates compose to the same Gaussian, so the accountant's event does not depend on the
    #: choice. Public.
    last_split: str | None = None
    #: Whether the placement rounds left are merged into the last round once the anchor has
    #: settled (:data:`MERGE_RMS_ETA`; module docstring, 14.). Rounds 2.. are then declared as the
    #: one Gaussian they compose to, whatever the path. Public.
    merge_rounds: bool = False

    def __post_init__(self) -> None:
        flat = [w for pair in self.rounds for w in pair] + [w for w in (self.count_range, self.feature_range) if w]
        if not self.rounds or any(not (w > 0) for w in flat) or abs(sum(flat) - 1.0) > 1e-9:
            raise ValueError("schedule shares must be positive and sum to 1")
        if self.anchor not in (None, "log-mean", "log-odds"):
            raise ValueError("schedule anchor must be None, 'log-mean' or 'log-odds'")
        if self.trust_eta is not None and not (self.trust_eta > 0 and math.isfinite(self.trust_eta)):
            raise ValueError("trust_eta must be positive and finite")
        if self.passes < 1 or self.start not in ("raw", "anchor"):
            raise ValueError("passes must be >= 1 and start 'raw' or 'anchor'")
        if self.step_prior not in ("model", "anchor"):
            raise ValueError("step_prior must be 'model' or 'anchor'")
        if self.prior_centre not in (None, "log-mean", "log-odds") or (
                self.prior_centre is not None and self.anchor != self.prior_centre):
            raise ValueError("prior_centre must be None, 'log-mean' (with the log-mean anchor) or 'log-odds' "
                             "(with the log-odds anchor)")
        if self.posterior not in ("plug-in", "imputed"):
            raise ValueError("posterior must be 'plug-in' or 'imputed'")
        if self.expansion not in (None, "box", "data"):
            raise ValueError("expansion must be None, 'box' or 'data'")
        if self.last_split not in (None, "preposterior") or (self.last_split is not None and len(self.rounds) < 2):
            raise ValueError("last_split must be None or 'preposterior' (with at least two rounds)")
        if self.merge_rounds and len(self.rounds) < 2:
            raise ValueError("merge_rounds needs at least two rounds")

    @classmethod
    def default(cls, model: Model) -> Schedule:
        if model.conjugate:
            return cls(((0.5, 0.5),))
        # Issue 37: the released posterior integrates the curvature's noise out (module docstring,
        # 7.; adopted by the second rule in benchmarks/results/noise_aware_variants.md).
        if model.name == "poisson" and getattr(model, "intercept", False):
            # Issue 37's twelfth rule: the count's clip bound from a DP quantile, its share taken
            # from the rounds in proportion.
            rounds = tuple((s * (1.0 - COUNT_RANGE_SHARE), c * (1.0 - COUNT_RANGE_SHARE)) for s, c in POISSON_ROUNDS)
            return cls(rounds, anchor="log-mean", trust_eta=POISSON_TRUST_ETA, passes=3, start="anchor",
                       prior_centre="log-mean", posterior="imputed", count_range=COUNT_RANGE_SHARE)
        # Not the expansion-aware posterior (module docstring, 8.): the seventh rule's suite
        # confirmation failed (benchmarks/results/noise_aware_variants.md).
        return cls(DEFAULT_ROUNDS, posterior="imputed")

    def noise_multipliers(self, sigma: float) -> list[tuple[float, float]]:
        """Per-round (score, curvature) noise multipliers for single-Gaussian calibration sigma."""
        return [(sigma / math.sqrt(s), sigma / math.sqrt(c)) for s, c in self.rounds]

    def range_multiplier(self, sigma: float) -> float | None:
        """The data-range histogram's noise multiplier (module docstring, 11. and 12.: the count's
        and the feature norm's bins in one Gaussian mechanism), or None without one."""
        share = self.count_range + self.feature_range
        return sigma / math.sqrt(share) if share else None

    def split_candidates(self, sigma: float, shares: tuple[float, float]) -> list[tuple[float, float]]:
        """A last round's candidate (score, curvature) noise multipliers for its ``shares``: its
        own with a fixed split, else one per :data:`LAST_SPLITS` score fraction of its total
        share. Every candidate composes to the Gaussian of multiplier ``sigma / sqrt(total)``."""
        score, curvature = shares
        if self.last_split is None:
            return [(sigma / math.sqrt(score), sigma / math.sqrt(curvature))]
        total = score + curvature
        return [(sigma / math.sqrt(f * total), sigma / math.sqrt((1.0 - f) * total)) for f in LAST_SPLITS]

    def events(self, sigma: float) -> list[Any]:
        """The accountant's events: one Gaussian event per released statistic (the count
        histogram's first, when the schedule has one). Where the path is chosen from DP outputs
        the adaptive part is declared as the one Gaussian it composes to whatever is chosen (RDP
        orders add, Gaussian PLDs compose to a Gaussian; fully adaptive composition for Gaussian
        DP, Smith and Thakurta 2022): rounds 2.. with ``merge_rounds`` (module docstring, 14.),
        else the last round with a chosen split (13.)."""
        first = self.range_multiplier(sigma)
        pairs = self.noise_multipliers(sigma)
        adaptive = 0
        if self.merge_rounds:
            adaptive = len(self.rounds) - 1
        elif self.last_split is not None:
            adaptive = 1
        fixed = pairs[:len(pairs) - adaptive]
        block = [acc.gaussian_event(sigma / math.sqrt(sum(sum(r) for r in self.rounds[len(pairs) - adaptive:])))
                 ] if adaptive else []
        return ([] if first is None else [acc.gaussian_event(first)]) + [
            acc.gaussian_event(m) for pair in fixed for m in pair] + block

    def as_dict(self) -> dict[str, Any]:
        out: dict[str, Any] = {"rounds": [list(r) for r in self.rounds]}
        if self.anchor is not None:
            out["anchor"] = self.anchor
        if self.trust_eta is not None:
            out["trust_eta"] = self.trust_eta
        if (self.passes, self.start) != (2, "raw"):
            out["posterior_passes"] = self.passes
            out["posterior_start"] = self.start
        if self.step_prior != "model":
            out["step_prior"] = self.step_prior
        if self.prior_centre is not None:
            out["prior_centre"] = self.prior_centre
        if self.posterior != "plug-in":
            out["posterior"] = self.posterior
            out["imputations"] = IMPUTATIONS
        if self.pool:
            out["pool_eta"] = POOL_ETA
        if self.pool_curvature:
            out["pool_curvature_rms_eta"] = POOL_RMS_ETA
        if self.expansion is not None:
            out["expansion"] = self.expansion
            if self.expansion == "data":
                out["expansion_rms_factor"] = EXPANSION_RMS_FACTOR
        if self.count_range:
            from .postprocess.count_range import CLIP_QUANTILE

            out["count_range_share"] = self.count_range
            out["count_range_quantile"] = CLIP_QUANTILE
        if self.feature_range:
            from .postprocess.count_range import NORM_QUANTILE

            out["feature_range_share"] = self.feature_range
            out["feature_range_quantile"] = NORM_QUANTILE
        if self.last_split is not None:
            out["last_split"] = self.last_split
            out["last_split_score_fractions"] = list(LAST_SPLITS)
        if self.merge_rounds:
            out["merge_rounds"] = True
            out["merge_rms_eta"] = MERGE_RMS_ETA
        return out


#: Five rounds (issue 37, candidate "D" of the rule written before it was run,
#: benchmarks/results/noise_aware_variants.md; chosen on the suite's simulated tables only): four
#: cheap rounds that only place the anchor, so Newton from the prior mean reaches the mode when
#: the linear predictors there are far from 0 (large effects, imbalanced classes), then a last
#: round, whose statistics the posterior is built from, with 60% of the budget, its score (which
#: sets the posterior mean) the larger part. It replaced three rounds ((0.05, 0.1), (0.05, 0.1),
#: (0.5, 0.2)) (benchmarks/results/trust_schedule.md), which stopped short of the mode on
#: ``sim_large`` and covered 0.20 there.
DEFAULT_ROUNDS: tuple[tuple[float, float], ...] = ((0.02, 0.04), (0.03, 0.05), (0.04, 0.07), (0.05, 0.1), (0.45, 0.15))
#: The three-round schedule that was the default until issue 37 (benchmarks compare against it).
THREE_ROUNDS: tuple[tuple[float, float], ...] = ((0.05, 0.1), (0.05, 0.1), (0.5, 0.2))
#: Poisson (issue 25; rule and candidates in benchmarks/poisson.py ``tune``, simulated tables
#: only): round 1 at the prior mean gives the log-mean anchor (its curvature only needs the
#: record count, so it gets a small share), then Newton rounds inside the trust region.
#: Second wave (with the prior centre, benchmarks/results/poisson_tune.md): "R4b", which gives the
#: third round more so the last step is smaller.
POISSON_ROUNDS: tuple[tuple[float, float], ...] = ((0.05, 0.05), (0.05, 0.1), (0.15, 0.2), (0.2, 0.2))
#: Public trust region of the Poisson anchors (change of the linear predictor per round).
POISSON_TRUST_ETA = 3.0
#: The share of rho the Poisson default spends on the count's clip bound (module docstring, 11.;
#: issue 37's twelfth rule, benchmarks/results/noise_aware_variants.md).
COUNT_RANGE_SHARE = 0.05
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


def calibrate(
    schedule: Schedule, *, target_epsilon: float, delta: float, prior_events: Sequence[Any] = (),
    accountant: acc.Accountant = "rdp",
) -> tuple[float, list[Any]]:
    """Single-Gaussian noise multiplier for the schedule's share of the budget, and its events.

    The schedule's events compose to exactly one Gaussian of multiplier ``sigma`` (RDP: orders
    add; PLD: Gaussian PLDs compose to a Gaussian), so calibrating that Gaussian calibrates them;
    the result is re-checked on the actual event list."""
    sigma = acc.calibrate_gaussian(target_epsilon=target_epsilon, delta=delta, prior_events=prior_events,
                                   accountant=accountant)
    events = schedule.events(sigma)
    # Re-check on the real events; nudge sigma up if rounding made the composition exceed.
    for _ in range(50):
        if acc.epsilon([*prior_events, *events], delta, accountant) <= target_epsilon * (1 + 1e-6):
            return sigma, events
        sigma *= 1.0 + 1e-4
        events = schedule.events(sigma)
    raise RuntimeError("noise-aware calibration could not be confirmed by the accountant")


@dataclass(frozen=True)
class RoundRelease:
    """What one round's mechanisms released (DP outputs) and the public values around them."""

    anchor: torch.Tensor
    score: torch.Tensor
    curvature: torch.Tensor
    score_bound: float
    curvature_bound: float
    score_noise_std: float
    curvature_noise_std: float


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


#: ``release(theta, score_bound, curvature_bound, score_noise_multiplier,
#: curvature_noise_multiplier) -> (noisy score sum, noisy curvature sum)``: the mechanism,
#: bound to the private records by the caller (:meth:`PrivateRecords.noisy_score_statistics`).
ReleaseFn = Callable[[torch.Tensor, float, float, float, float], tuple[torch.Tensor, torch.Tensor]]
#: Public bounds at an anchor: ``theta -> (score_bound, curvature_bound)``.
BoundsFn = Callable[[torch.Tensor], tuple[float, float]]


class NonFiniteFit(ArithmeticError):
    """The post-processing could not produce a finite Gaussian from the released statistics
    (e.g. a noise draw so large that the precision overflows). Decided on DP outputs and public
    values only; the release turns it into a charged refusal (docs/REFUSALS.md, ``non-finite-fit``)."""


def _checked(post: GaussianPosterior) -> GaussianPosterior:
    """``post`` when its mean and scale are finite and the scale non-degenerate, else raise."""
    diag = torch.diagonal(post.scale_tril)
    if not (bool(torch.isfinite(post.mean).all()) and bool(torch.isfinite(post.scale_tril).all())
            and bool((diag > 0).all())):
        raise NonFiniteFit("the noise-aware posterior is not finite")
    return post


def _from_precision(precision: torch.Tensor, rhs: torch.Tensor) -> GaussianPosterior:
    """:meth:`GaussianPosterior.from_precision`, total: a non-finite or numerically indefinite
    precision raises :class:`NonFiniteFit` instead of a linear-algebra error."""
    if not (bool(torch.isfinite(precision).all()) and bool(torch.isfinite(rhs).all())):
        raise NonFiniteFit("the released statistics gave a non-finite precision")
    try:
        post = GaussianPosterior.from_precision(precision, rhs)
    except (RuntimeError, ValueError) as exc:  # torch.linalg.LinAlgError is a RuntimeError
        raise NonFiniteFit("the noise-aware precision is numerically singular") from exc
    return _checked(post)


def psd_part(matrix: torch.Tensor) -> torch.Tensor:
    """The positive semi-definite part of a symmetric matrix (negative eigenvalues set to 0)."""
    sym = 0.5 * (matrix + matrix.T)
    vals, vecs = torch.linalg.eigh(sym)
    return (vecs * vals.clamp(min=0.0)) @ vecs.T


def _sym(m: torch.Tensor) -> torch.Tensor:
    return 0.5 * (m + m.T)


def prior_precision(model: Model) -> torch.Tensor:
    """The prior's precision matrix: ``I / prior_scale^2`` (every model of the package), or the
    model's ``prior_precision_matrix`` when it has one (a non-isotropic Gaussian prior, e.g. the
    analyst's prior carried into a reparametrised working frame; benchmarks/prototypes)."""
    full = getattr(model, "prior_precision_matrix", None)
    if full is not None:
        return full.detach().to(DTYPE)
    return torch.eye(model.param_dim, dtype=DTYPE) / model.prior_scale**2


def noise_aware_posterior(
    model: Model, release: RoundRelease, *, passes: int = 2, start: str = "raw",
    prior_mean: torch.Tensor | None = None,
) -> tuple[GaussianPosterior, GaussianPosterior]:
    """(noise-aware, raw) Gaussian posteriors from one round's release (module docstring, 2.).

    ``passes`` fixed-point passes for ``u``, the first from the raw posterior (``start="raw"``)
    or from ``u = 0`` (``start="anchor"``). Raises :class:`NonFiniteFit` when no finite
    Gaussian results."""
    if start not in ("raw", "anchor"):
        raise ValueError("start must be 'raw' or 'anchor'")
    d = model.param_dim
    eye = torch.eye(d, dtype=DTYPE)
    prior_prec = prior_precision(model)
    mu0 = model.prior_mean if prior_mean is None else prior_mean.detach().to(DTYPE)
    a = release.anchor
    h = psd_part(release.curvature)
    s = release.score
    if not (bool(torch.isfinite(h).all()) and bool(torch.isfinite(s).all())):
        raise NonFiniteFit("the released statistics are not finite")
    raw = _from_precision(_sym(h + prior_prec), s + h @ a + prior_prec @ mu0)
    tau2 = release.curvature_noise_std**2
    score_var = release.score_noise_std**2
    post = raw
    for k in range(max(passes, 1)):
        u = post.mean - a
        spread = float(u @ u) + float(torch.diagonal(post.cov).sum())
        if k == 0 and start == "anchor":
            # The first pass assumes the anchor is the data's MLE (u = 0); later passes plug in
            # the posterior's own u. Avoids starting from the raw posterior, whose mean a noisy
            # curvature can throw arbitrarily far (issue 25).
            u = torch.zeros_like(u)
            spread = 0.0
        sigma_xi = score_var * eye + tau2 * (spread * eye + torch.outer(u, u))
        v = _sym(h + sigma_xi)
        try:
            hv = torch.linalg.solve(v, h).T  # H V^-1 (H, V symmetric)
        except RuntimeError as exc:  # singular V: only with zero noise and zero curvature
            raise NonFiniteFit("the noise-aware statistic covariance is singular") from exc
        precision = _sym(hv @ h + prior_prec)
        post = _from_precision(precision, hv @ (s + h @ a) + prior_prec @ mu0)
    return post, raw


#: Draws of the true curvature in :func:`imputed_posterior` (public).
IMPUTATIONS = 200


def symmetric_noise(dim: int, tau: float, generator: torch.Generator) -> torch.Tensor:
    """Noise of the curvature mechanism's structure (:mod:`dpsummary.private.score_stats`):
    i.i.d. ``N(0, tau^2)`` on the upper triangle, diagonal included, mirrored. Post-processing
    randomness (the caller's non-private generator), never privacy noise."""
    upper = torch.triu(torch.randn(dim, dim, generator=generator, dtype=DTYPE) * tau)
    return upper + torch.triu(upper, 1).T


def trace_kept_spectrum(vals: torch.Tensor) -> torch.Tensor:
    """Eigenvalues of the nearest (Frobenius) PSD matrix with the same trace as the symmetric
    matrix of eigenvalues ``vals``: ``max(vals - kappa, 0)`` at the ``kappa >= 0`` that makes them
    sum to ``sum(vals)`` (all 0 when that sum is not positive; ``kappa = 0`` when the positive part
    already sums to no more). Taking the plain PSD part adds the negative eigenvalues' magnitude
    to the trace, which a noise-dominated draw has in abundance (issue 37's twenty-seventh rule)."""
    total = float(vals.sum())
    positive = vals.clamp(min=0.0)
    if total <= 0.0 or not math.isfinite(total):
        return torch.zeros_like(vals)
    if float(positive.sum()) <= total:
        return positive
    # sum(max(v - kappa, 0)) is piecewise linear and decreasing in kappa: solve on the sorted values.
    desc = torch.sort(vals, descending=True).values
    csum = torch.cumsum(desc, 0)
    kappa = 0.0
    for k in range(desc.shape[0]):
        candidate = (float(csum[k]) - total) / (k + 1)
        if candidate >= 0.0 and (k + 1 == desc.shape[0] or candidate >= float(desc[k + 1])) and candidate <= float(desc[k]):
            kappa = candidate
            break
    return (vals - kappa).clamp(min=0.0)


def imputed_posterior(
    model: Model, release: RoundRelease, *, generator: torch.Generator, draws: int = IMPUTATIONS,
    prior_mean: torch.Tensor | None = None,
    spectrum: Callable[[torch.Tensor], torch.Tensor] | None = None,
) -> GaussianPosterior:
    """The noise-aware posterior with the released curvature's noise integrated out (module
    docstring, 7.): ``draws`` draws of the true curvature from its flat-prior posterior given the
    release (the released matrix plus fresh noise of the mechanism's structure, PSD part), the
    noise-aware posterior given each draw (the curvature then known, so only the score noise
    enters), and the moment-matched mixture. ``spectrum`` maps each draw's eigenvalues to the
    curvature used (default: the PSD part; e.g. :func:`trace_kept_spectrum`, the nearest PSD
    matrix with the draw's own trace, issue 37's twenty-seventh rule, an option, not the default;
    the benchmarks' other spectral candidates). Raises :class:`NonFiniteFit` when fewer than half the draws give a
    finite Gaussian. Post-processing of DP outputs with non-private randomness."""
    dim = release.curvature.shape[0]
    # Given the curvature H = Q diag(lam) Q^T (one draw) and no curvature noise, the posterior of
    # module docstring 2. is diagonal in Q (the prior precision is isotropic): precision
    # lam^2 / (lam + v) + 1/s^2 with v the score noise variance, so one eigendecomposition per
    # draw gives it exactly (the same formula as noise_aware_posterior with tau = 0, O(d^3) once).
    prior_var = model.prior_scale**2
    full_prior = getattr(model, "prior_precision_matrix", None)
    mu0 = (model.prior_mean if prior_mean is None else prior_mean).detach().to(DTYPE)
    score_var = release.score_noise_std**2
    a, s = release.anchor, release.score
    if not (bool(torch.isfinite(release.curvature).all()) and bool(torch.isfinite(s).all())):
        raise NonFiniteFit("the released statistics are not finite")
    means: list[torch.Tensor] = []
    cov_sum = torch.zeros(dim, dim, dtype=DTYPE)  # a running sum: 200 d x d matrices would not fit for large d
    for _ in range(draws):
        draw = _sym(release.curvature + symmetric_noise(dim, release.curvature_noise_std, generator))
        vals, vecs = torch.linalg.eigh(draw)
        lam = vals.clamp(min=0.0) if spectrum is None else spectrum(vals)  # the PSD part by default
        denom = lam + score_var
        gain = torch.where(denom > 0, lam / torch.where(denom > 0, denom, 1.0), torch.zeros_like(lam))
        if full_prior is None:
            precision = lam * gain + 1.0 / prior_var
            rhs = gain * (vecs.T @ s + lam * (vecs.T @ a)) + (vecs.T @ mu0) / prior_var
            mean = vecs @ (rhs / precision)
            cov = (vecs / precision) @ vecs.T
        else:  # a non-isotropic prior: the same posterior, solved in full (O(d^3) per draw)
            p_full = full_prior.detach().to(DTYPE)
            prec_full = _sym((vecs * (lam * gain)) @ vecs.T + p_full)
            rhs_full = vecs @ (gain * (vecs.T @ s + lam * (vecs.T @ a))) + p_full @ mu0
            try:
                cov = torch.linalg.inv(prec_full)
            except RuntimeError:
                continue
            mean = cov @ rhs_full
        if bool(torch.isfinite(mean).all()) and bool(torch.isfinite(cov).all()):
            means.append(mean)
            cov_sum += cov
    if len(means) < max(draws // 2, 2):
        raise NonFiniteFit("too few imputed curvatures gave a finite posterior")
    stacked = torch.stack(means)
    cov = _sym(cov_sum / len(means) + torch.cov(stacked.T))
    if not bool(torch.isfinite(cov).all()):
        raise NonFiniteFit("the imputed posterior is not finite")
    try:
        tril = torch.linalg.cholesky(cov)
    except RuntimeError as exc:
        raise NonFiniteFit("the imputed posterior covariance is not positive definite") from exc
    return _checked(GaussianPosterior(stacked.mean(0), tril))


#: ``Schedule.last_split = "preposterior"`` (module docstring, 13.; issue 37's twenty-fourth
#: rule, written before its run): the last round's candidate splits as the score's fraction of
#: its total share (the default's 0.45:0.15, then 0.375:0.225 and 0.3:0.3), the preposterior's
#: draws of the true curvature, the imputations per simulated release, and its fixed seed
#: (post-processing randomness, public). All public.
LAST_SPLITS: tuple[float, ...] = (0.75, 0.625, 0.5)
#: ``Schedule.merge_rounds`` (module docstring, 14.; issue 37's twenty-fifth rule, written before
#: its run): the placement rounds left are merged into the last once a round's step moves the
#: linear predictor by at most this curvature-weighted rms change (the ninth rule's
#: ``POOL_RMS_ETA``). Public.
MERGE_RMS_ETA = 0.25
PREPOSTERIOR_DRAWS = 8
PREPOSTERIOR_IMPUTATIONS = 32
PREPOSTERIOR_SEED = 37


def preposterior_split(model: Model, previous: RoundRelease, *, anchor: torch.Tensor, bounds: tuple[float, float],
                       candidates: Sequence[tuple[float, float]]) -> tuple[int, list[float]]:
    """Which of ``candidates`` (the last round's (score, curvature) noise multipliers) is
    expected to give the narrowest released posterior, judged from the round before it (module
    docstring, 13.): :data:`PREPOSTERIOR_DRAWS` draws of the true curvature from its flat-prior
    posterior given ``previous``'s released curvature (as :func:`imputed_posterior` draws it);
    for each draw and candidate a simulated last release at ``anchor`` taken as the mode (score:
    the candidate's score noise alone; curvature: the draw plus the candidate's curvature noise)
    and its imputed posterior's summed log marginal sds; the mean over draws. Common random
    numbers across candidates, a fixed public seed. Returns the index of the smallest (ties: the
    first) and every candidate's value. Post-processing of DP outputs and public values: costs no
    privacy, and the candidates compose to the same Gaussian, so the choice reveals nothing the
    accountant does not already charge."""
    g = torch.Generator().manual_seed(PREPOSTERIOR_SEED)
    dim = previous.curvature.shape[0]
    score_bound, curvature_bound = bounds
    truths = [psd_part(_sym(previous.curvature + symmetric_noise(dim, previous.curvature_noise_std, g)))
              for _ in range(PREPOSTERIOR_DRAWS)]
    unit_curvature = [symmetric_noise(dim, 1.0, g) for _ in range(PREPOSTERIOR_DRAWS)]
    unit_score = [torch.randn(dim, generator=g, dtype=DTYPE) for _ in range(PREPOSTERIOR_DRAWS)]
    seeds = [int(torch.randint(2**31 - 1, (1,), generator=g)) for _ in range(PREPOSTERIOR_DRAWS)]
    values: list[float] = []
    for s_mult, c_mult in candidates:
        score_sd, tau = s_mult * score_bound, c_mult * curvature_bound
        total = 0.0
        for truth, e, xi, seed in zip(truths, unit_curvature, unit_score, seeds, strict=True):
            simulated = RoundRelease(anchor=anchor, score=score_sd * xi, curvature=truth + tau * e,
                                     score_bound=score_bound, curvature_bound=curvature_bound,
                                     score_noise_std=score_sd, curvature_noise_std=tau)
            try:
                post = imputed_posterior(model, simulated, generator=torch.Generator().manual_seed(seed),
                                         draws=PREPOSTERIOR_IMPUTATIONS)
            except NonFiniteFit:
                total = math.inf
                break
            total += 0.5 * float(torch.log(torch.diagonal(post.cov)).sum())
        values.append(total / PREPOSTERIOR_DRAWS if math.isfinite(total) else math.inf)
    best = min(range(len(candidates)), key=lambda i: (values[i], i))
    return best, values


#: ``Schedule.pool``: earlier rounds whose anchor changes the linear predictor of any record of
#: the public box by at most this much from the last anchor are pooled with the last round
#: (public; written before its run, benchmarks/results/noise_aware_variants.md, eighth rule).
POOL_ETA = 0.25


def pooled_release(model: Model, rounds: Sequence[RoundRelease], *, feature_norm: float,
                   pool_eta: float = POOL_ETA) -> RoundRelease:
    """The last round's release pooled with every earlier round whose anchor lies within
    ``pool_eta`` of the last anchor in linear-predictor change over the public box (module
    docstring, 9.): the curvatures averaged with weights ``1 / tau_k^2`` (noise sd
    ``(sum 1 / tau_k^2)^-1/2``), each score moved to the last anchor through the pooled curvature
    (``s_k - H (a - a_k)``, the quadratic expansion over a step of at most ``pool_eta``) and
    averaged with weights ``1 / sigma_k^2``. When the noise hides the data the anchors barely move
    and every round is pooled, so the placement rounds' budget is not lost; when the anchors
    travel, only the last round (or the last few) is used. Post-processing of DP outputs."""
    last = rounds[-1]
    chosen = [r for r in rounds if eta_change(model, last.anchor - r.anchor, feature_norm) <= pool_eta]
    if len(chosen) < 2 or any(not (r.score_noise_std > 0 and r.curvature_noise_std > 0) for r in chosen):
        return last
    wc = [1.0 / r.curvature_noise_std**2 for r in chosen]
    curvature = _sym(sum((w * r.curvature for w, r in zip(wc, chosen, strict=True)), torch.zeros_like(last.curvature))
                     / sum(wc))
    ws = [1.0 / r.score_noise_std**2 for r in chosen]
    score = sum((w * (r.score - curvature @ (last.anchor - r.anchor)) for w, r in zip(ws, chosen, strict=True)),
                torch.zeros_like(last.score)) / sum(ws)
    return RoundRelease(anchor=last.anchor, score=score, curvature=curvature, score_bound=last.score_bound,
                        curvature_bound=last.curvature_bound, score_noise_std=sum(ws) ** -0.5,
                        curvature_noise_std=sum(wc) ** -0.5)


#: ``Schedule.pool_curvature``: earlier rounds' curvatures are pooled with the last round's
#: when their anchor lies within this curvature-weighted rms change of the linear predictor of
#: the last anchor (public; written before its run, noise_aware_variants.md, ninth rule).
POOL_RMS_ETA = 0.25


def rms_eta(release: RoundRelease, delta: torch.Tensor) -> float | None:
    """The curvature-weighted rms change of the linear predictor, ``sqrt(d^T H d / H_00)``, for
    a parameter change ``d``, read off ``release``'s curvature ``H`` (its intercept entry
    ``H_00`` is the sum of the curvature weights); None when ``H_00`` is not clearly (2 noise
    sds) above its noise. Post-processing of a DP output."""
    h = release.curvature
    h00 = float(h[0, 0])
    if not (h00 > 2.0 * release.curvature_noise_std and math.isfinite(h00)):
        return None
    return math.sqrt(max(float(delta @ h @ delta), 0.0) / h00)


def pooled_curvature_release(model: Model, rounds: Sequence[RoundRelease], *,
                             pool_eta: float = POOL_RMS_ETA) -> RoundRelease:
    """The last round's release with its curvature pooled (module docstring, 10.): the released
    curvatures of every round whose anchor lies within ``pool_eta`` of the last anchor in
    curvature-weighted rms change of the linear predictor (:func:`rms_eta`, read off the last
    round's curvature), averaged with weights ``1 / tau_k^2`` (noise sd ``(sum 1 / tau_k^2)^-1/2``).
    The score stays the last round's. Needs a model with an intercept (else the last round as
    released). Post-processing of DP outputs."""
    last = rounds[-1]
    if not getattr(model, "intercept", False) or not last.curvature_noise_std > 0:
        return last
    chosen = []
    for r in rounds:
        eta = rms_eta(last, last.anchor - r.anchor)
        if eta is not None and eta <= pool_eta and r.curvature_noise_std > 0:
            chosen.append(r)
    if len(chosen) < 2:
        return last
    wc = [1.0 / r.curvature_noise_std**2 for r in chosen]
    curvature = _sym(sum((w * r.curvature for w, r in zip(wc, chosen, strict=True)), torch.zeros_like(last.curvature))
                     / sum(wc))
    return dataclasses.replace(last, curvature=curvature, curvature_noise_std=sum(wc) ** -0.5)


#: ``Schedule.expansion = "data"``: the linear predictor change used is at most this many
#: curvature-weighted rms changes (public; written before its run, benchmarks/results/noise_aware_variants.md).
EXPANSION_RMS_FACTOR = 3.0


def expansion_range(eta: float) -> tuple[float, float]:
    """``(L, U)``: the range of the factor ``1 / c`` by which a Newton step read with the
    anchor's curvature must be scaled when the path-averaged curvature is ``c`` times it and
    every record's linear predictor changes by at most ``eta`` along the step (curvature
    weights with ``|d log w / d eta| <= 1``, :data:`EXPANSION_BIAS_SDS`):
    ``L = eta / (e^eta - 1)``, ``U = eta / (1 - e^-eta)``; both 1 at ``eta = 0``."""
    if eta < 1e-8:
        return 1.0 - eta / 2.0, 1.0 + eta / 2.0
    eta = min(eta, 700.0)
    return eta / math.expm1(eta), eta / -math.expm1(-eta)


def expansion_aware(model: Model, posterior: GaussianPosterior, release: RoundRelease, *, feature_norm: float,
                    eta_rule: str = "box") -> GaussianPosterior:
    """The released posterior with the quadratic expansion's error integrated out (issue 37,
    module docstring, 8.). The last round's posterior reads its released score with the curvature
    at its anchor ``a``; the step ``d = m - a`` it takes is right only if the curvature along the
    step equals the anchor's. With the linear predictors changing by at most ``eta`` along ``d``
    the true step is ``d / c`` with ``1 / c`` in :func:`expansion_range` ``(eta)``. Taking ``1 / c``
    log-uniform on that range (scale-invariant: nothing says which end) and moment-matching gives
    mean ``a + E[1/c] d`` and covariance ``cov + Var(1/c) d d^T``.

    ``eta_rule``: ``"box"`` - ``eta`` is the step's largest change over the public feature box
    (:func:`eta_change`; a bound); ``"data"`` - at most :data:`EXPANSION_RMS_FACTOR` times the
    curvature-weighted rms change ``sqrt(d^T H d / H_00)`` of the released curvature ``H`` (an
    estimate, tighter when the public box is much wider than the data; the box bound when the
    model has no intercept or ``H_00`` is not clearly above its noise). Post-processing of DP
    outputs and public values."""
    a = release.anchor
    d = posterior.mean - a
    eta = eta_change(model, d, feature_norm)
    if eta_rule == "data" and getattr(model, "intercept", False):
        h = release.curvature
        h00 = float(h[0, 0])
        if h00 > 2.0 * release.curvature_noise_std:
            rms = math.sqrt(max(float(d @ h @ d), 0.0) / h00)
            eta = min(eta, EXPANSION_RMS_FACTOR * rms)
    elif eta_rule not in ("box", "data"):
        raise ValueError("eta_rule must be 'box' or 'data'")
    lo, hi = expansion_range(eta)
    if hi - lo < 1e-12:
        return posterior
    span = math.log(hi / lo)
    first = (hi - lo) / span
    second = (hi * hi - lo * lo) / (2.0 * span)
    var = max(second - first * first, 0.0)
    mean = a + first * d
    cov = _sym(posterior.cov + var * torch.outer(d, d))
    try:
        tril = torch.linalg.cholesky(cov)
    except RuntimeError as exc:
        raise NonFiniteFit("the expansion-aware covariance is not positive definite") from exc
    return _checked(GaussianPosterior(mean, tril))


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


def eta_change(model: Model, delta: torch.Tensor, feature_norm: float) -> float:
    """Largest change of the linear predictor over the public feature box (``||x|| <=
    feature_norm``) for a parameter change ``delta``: ``|delta_0| + feature_norm ||delta_x||``
    with an intercept, else ``feature_norm ||delta||``."""
    if getattr(model, "intercept", False):
        return abs(float(delta[0])) + feature_norm * float(torch.linalg.vector_norm(delta[1:]))
    return feature_norm * float(torch.linalg.vector_norm(delta))


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
        generator: torch.Generator | None = None) -> NoiseAwareFit:
    """Run every round of ``schedule`` at single-Gaussian calibration ``sigma`` and return the
    noise-aware posterior of the last round (earlier rounds only place the anchor).

    ``feature_norm`` and ``target_bound`` (public, :func:`schema_bounds`) are needed by
    schedules with an ``anchor`` rule or a ``trust_eta``; ``generator`` (non-private, post-
    processing only) by a schedule whose ``posterior`` is ``"imputed"``. Total: returns finite Gaussians or
    raises :class:`NonFiniteFit`."""
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
    if schedule.posterior == "imputed":
        if generator is None:
            raise ValueError("the imputed posterior needs a (non-private) generator")
        posterior = imputed_posterior(model, final, generator=generator)
    if schedule.expansion is not None:
        if feature_norm is None:
            raise ValueError("the expansion-aware posterior needs the public feature norm")
        # Module docstring, 8.: measured from the step the posterior takes (before widening).
        step_taken = posterior
        posterior = expansion_aware(model, posterior, final, feature_norm=feature_norm,
                                    eta_rule=schedule.expansion)
    else:
        step_taken = posterior
    notes = [
        f"{MECHANISM}: {len(multipliers)} round(s) of noisy score and curvature sums, noise-aware "
        "Gaussian posterior (Kulkarni et al. 2021 style) by post-processing",
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
                         converged=converged, model=model, schedule=schedule)


def range_clips(schedule: Schedule, *, sigma: float, num_features: int, feature_norm: float, target_name: str,
                target_bound: float, histogram: Callable[[Any, float], Any]) -> Any:
    """The data ranges the rounds clip at (module docstring, 11. and 12.), or None when
    ``schedule`` spends nothing on them: the public layout of
    :func:`dpsummary.postprocess.count_range.range_layout` (the feature norm's bins below
    ``feature_norm`` with ``schedule.feature_range``, the count's below ``target_bound`` with
    ``schedule.count_range``), ``histogram(layout, noise_multiplier)`` (the caller's Gaussian
    mechanism, e.g. :meth:`~dpsummary.private.mechanism.PrivateRecords.noisy_marginals`; a
    :class:`~dpsummary.postprocess.marginals.NoisyMarginals`) at the schedule's noise multiplier,
    and its post-processing (a :class:`~dpsummary.postprocess.count_range.RangeClips`). The one
    place every caller of :func:`fit` (the release, the benchmarks) gets the bounds from."""
    multiplier = schedule.range_multiplier(sigma)
    if multiplier is None:
        return None
    from .postprocess.count_range import RangeClips, clip_bound, norm_clip, range_layout

    layout = range_layout(num_features, feature_bound=feature_norm if schedule.feature_range else None,
                          count=(target_name, target_bound) if schedule.count_range else None)
    noisy = histogram(layout, multiplier)
    return RangeClips(norm_clip(noisy, feature_norm) if schedule.feature_range else None,
                      clip_bound(noisy, target_bound) if schedule.count_range else None)


def public_bounds(model: Model, *, feature_norm: float, target_bound: float) -> BoundsFn:
    """The model's public per-record bounds for features of norm <= ``feature_norm``."""
    def bounds(theta: torch.Tensor) -> tuple[float, float]:
        return model.statistic_bounds(theta, feature_norm=feature_norm, target_bound=target_bound)

    return bounds


def schema_bounds(transform: Any) -> tuple[float, float]:
    """``(feature_norm, target_bound)`` in model space implied by a public schema transform
    (:meth:`dpsummary.data.Transform.from_schema`): every bounded numeric feature lies in
    [-1, 1], each categorical column is one-hot with at most one 1 (the "other" bucket is all
    zeros); a binary target is 0/1, a real one is scaled into [-1, 1], a count lies below its
    public upper bound. Unbounded numerics (fitted transforms) are bounded by their scaled
    clip range if known, else by 3 (and clipped by the mechanism)."""
    sq = 0.0
    for col in transform.schema.feature_columns:
        if col.kind == "numeric":
            if col.lower is not None and col.upper is not None:
                c, s = transform.centres[col.name], transform.scales[col.name]
                sq += max(abs(col.lower - c), abs(col.upper - c)) ** 2 / s**2
            else:
                sq += 9.0
        else:
            sq += 1.0
    kind = transform.target_kind
    target_bound = 1.0
    if kind == "count":
        col = transform.schema.target_column
        target_bound = float(col.upper) if col is not None and col.upper is not None else 1e3
    elif kind == "real":
        col = transform.schema.target_column
        if col is not None and col.lower is not None and col.upper is not None:
            c, s = transform.centres[col.name], transform.scales[col.name]
            target_bound = max(abs(col.lower - c), abs(col.upper - c)) / s
        else:
            target_bound = 3.0
    return math.sqrt(max(sq, 1e-12)), target_bound
