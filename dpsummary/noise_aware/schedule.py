"""The schedule: how the budget is divided over the mechanisms (the rounds' shares of rho, the
data-range histogram's), the defaults per model, the accountant's events and the noise
multiplier that calibrates them, and the data ranges the histogram sets.

Numbered references ("module docstring, N.") are to the package docstring,
:mod:`dpsummary.noise_aware`.
"""

from __future__ import annotations

import math
from collections.abc import Callable, Sequence
from dataclasses import dataclass
from typing import Any

from .. import accounting as acc
from ..models import Model
from .posterior import IMPUTATIONS
from .relations import RELATION_Z
from .variants import EXPANSION_RMS_FACTOR, LAST_SPLITS, MERGE_RMS_ETA, POOL_ETA, POOL_RMS_ETA


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
    #: How each imputed curvature draw is made PSD (``posterior = "imputed"`` only; module
    #: docstring, 16.): ``"psd"`` (its PSD part) or ``"trace"`` (the nearest PSD matrix with
    #: the draw's own trace, :func:`trace_kept_spectrum`; issue 50's thirty-seventh rule). Public.
    spectrum: str = "psd"
    #: Whether the released posterior also carries the last expansion's error
    #: (:func:`expansion_aware`; module docstring, 8.): None (no), ``"box"`` or ``"data"`` (its
    #: ``eta_rule``). Needs ``feature_norm`` in :func:`fit`. Public.
    expansion: str | None = None
    #: With ``expansion``: whether it applies only to a release whose convergence check fails
    #: (:func:`~dpsummary.noise_aware.fit`: the last step more than ``UNCONVERGED_SDS`` posterior
    #: sds and its expansion bias bound above ``EXPANSION_BIAS_SDS``), i.e. where the step is the
    #: data's and may be short, not where the noise made it (issue 50's forty-second rule widened
    #: noise-made steps 1.35-2.8x). A decision on DP outputs and public bounds. Public.
    expansion_gate: bool = False
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
    #: Whether the rounds treat a count at or above the count's clip bound as censored
    #: (:func:`statistic_model`; module docstring, 15.; issue 50's thirty-second rule). Needs
    #: ``count_range``. Public.
    censor_counts: bool = False
    #: Whether each imputed curvature is projected off the public one-hot relations the last
    #: round's released curvature does not tell from exact (:func:`~dpsummary.noise_aware.exact_relations`;
    #: module docstring, 17.; issue 50's thirty-eighth and thirty-ninth rules; the logistic and
    #: Poisson default). Needs the imputed posterior; :func:`fit` takes the candidates. Public.
    relations: bool = False
    #: Whether each imputed curvature is drawn under a flat prior on the one-hot support of the
    #: curvature (:func:`~dpsummary.noise_aware.support_draw`; module docstring, 18.; issue 50's
    #: fortieth rule; the logistic and Poisson default). Needs the imputed posterior; :func:`fit`
    #: takes the support. Public.
    support: bool = False

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
        if self.spectrum not in ("psd", "trace") or (self.spectrum != "psd" and self.posterior != "imputed"):
            raise ValueError("spectrum must be 'psd' or 'trace' (with the imputed posterior)")
        if self.expansion not in (None, "box", "data"):
            raise ValueError("expansion must be None, 'box' or 'data'")
        if self.expansion_gate and self.expansion is None:
            raise ValueError("expansion_gate needs an expansion")
        if self.last_split not in (None, "preposterior") or (self.last_split is not None and len(self.rounds) < 2):
            raise ValueError("last_split must be None or 'preposterior' (with at least two rounds)")
        if self.merge_rounds and len(self.rounds) < 2:
            raise ValueError("merge_rounds needs at least two rounds")
        if self.censor_counts and not self.count_range:
            raise ValueError("censor_counts needs the count's clip bound (count_range)")
        if self.relations and self.posterior != "imputed":
            raise ValueError("relations needs the imputed posterior")
        if self.support and self.posterior != "imputed":
            raise ValueError("support needs the imputed posterior")

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
                       prior_centre="log-mean", posterior="imputed", spectrum="trace", count_range=COUNT_RANGE_SHARE,
                       relations=True, support=True)
        # Not the expansion-aware posterior (module docstring, 8.): the seventh rule's suite
        # confirmation failed (benchmarks/results/noise_aware_variants.md). Each imputed curvature
        # at its own trace (module docstring, 16.): issue 50's thirty-seventh rule. Each projected
        # off the exact one-hot relations (17.): the thirty-ninth rule. Each drawn on the curvature's
        # one-hot support (18.): the fortieth rule.
        return cls(DEFAULT_ROUNDS, posterior="imputed", spectrum="trace", relations=True, support=True)

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
        if self.spectrum != "psd":
            out["imputed_spectrum"] = self.spectrum
        if self.pool:
            out["pool_eta"] = POOL_ETA
        if self.pool_curvature:
            out["pool_curvature_rms_eta"] = POOL_RMS_ETA
        if self.expansion is not None:
            out["expansion"] = self.expansion
            if self.expansion == "data":
                out["expansion_rms_factor"] = EXPANSION_RMS_FACTOR
            if self.expansion_gate:
                out["expansion_only_unconverged"] = True
        if self.count_range:
            from ..postprocess.count_range import CLIP_QUANTILE

            out["count_range_share"] = self.count_range
            out["count_range_quantile"] = CLIP_QUANTILE
        if self.feature_range:
            from ..postprocess.count_range import NORM_QUANTILE

            out["feature_range_share"] = self.feature_range
            out["feature_range_quantile"] = NORM_QUANTILE
        if self.last_split is not None:
            out["last_split"] = self.last_split
            out["last_split_score_fractions"] = list(LAST_SPLITS)
        if self.merge_rounds:
            out["merge_rounds"] = True
            out["merge_rms_eta"] = MERGE_RMS_ETA
        if self.censor_counts:
            out["censored_counts"] = True
        if self.relations:
            out["relations"] = "one-hot relations projected off where exact"
            out["relation_z"] = RELATION_Z
        if self.support:
            out["curvature_support"] = "one-hot zeros, ties and bounds kept in every imputed curvature"
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


def calibrate(
    schedule: Schedule, *, target_epsilon: float, delta: float, prior_events: Sequence[Any] = (),
    accountant: acc.Accountant = "rdp",
) -> tuple[float, list[Any]]:
    """Single-Gaussian noise multiplier for the schedule's share of the budget, and its events.

    The schedule's events compose to exactly one Gaussian of multiplier ``sigma`` (RDP: orders
    add; PLD: Gaussian PLDs compose to a Gaussian), so calibrating that Gaussian calibrates them;
    the result is re-checked on the actual event list."""
    return acc.calibrate_split_gaussian(schedule.events, target_epsilon=target_epsilon, delta=delta,
                                        prior_events=prior_events, accountant=accountant)


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
    from ..postprocess.count_range import RangeClips, clip_bound, norm_clip, range_layout

    layout = range_layout(num_features, feature_bound=feature_norm if schedule.feature_range else None,
                          count=(target_name, target_bound) if schedule.count_range else None)
    noisy = histogram(layout, multiplier)
    return RangeClips(norm_clip(noisy, feature_norm) if schedule.feature_range else None,
                      clip_bound(noisy, target_bound) if schedule.count_range else None)


def statistic_model(model: Model, schedule: Schedule, target_bound: float) -> Model:
    """The model whose per-record score and curvature the rounds release (module docstring, 15.):
    ``model`` itself, or with ``schedule.censor_counts`` (a Poisson schedule with the count's clip)
    the same Poisson regression with counts at or above ``target_bound`` (the clip bound, public)
    censored (:meth:`~dpsummary.models.PoissonRegression.censored`). The posterior, the prior and
    the statistic bounds stay ``model``'s. The one place every caller of :func:`fit` (the release,
    the benchmarks) gets the rounds' statistic model from."""
    if not schedule.censor_counts:
        return model
    censored = getattr(model, "censored", None)
    if censored is None:
        raise ValueError(f"censor_counts needs a count model, not {model.name!r}")
    return censored(target_bound)
