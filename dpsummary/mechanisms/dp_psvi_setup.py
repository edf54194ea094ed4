"""DP-PSVI as the release runs it: public defaults, the DP initialisation (plan and samplers),
the public point box and the constructor.

Shared by the ``dp-psvi`` mechanism (:mod:`dpsummary.mechanisms.dp_psvi`), the parametric
bootstrap that re-runs it on synthetic tables (:mod:`dpsummary.bootstrap`) and the benchmarks, so
all of them measure the same thing. Kept apart from the mechanism so the bootstrap can import it
without importing the mechanism that calls the bootstrap (no import cycle).
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import TYPE_CHECKING, Any

from ..plan import DEFAULT_NUM_SAMPLES, DEFAULT_STEPS

if TYPE_CHECKING:
    from ..accounting import Accountant

#: Public defaults, chosen on synthetic data (benchmarks/tune_dp_defaults.py), never on private data.
DEFAULT_CLIP_MULTIPLIER = 1.0
DEFAULT_CLIP_QUANTILE = 0.5
DEFAULT_NUM_REFERENCE = 1000
DEFAULT_LEARNING_RATE = 0.05
DEFAULT_THETA_SCALE = 0.3
#: Models whose DP-PSVI starts from DP per-column histograms when the policy gives the
#: ``initialisation`` share a budget; the other models keep the uniform public start and their
#: share goes to optimisation. Logistic: on synthetic tables it lowers KL
#: (benchmarks/results/tune_dp_defaults.md). Poisson (issue 28): the histograms are also what
#: the parametric bootstrap draws synthetic features from, instead of the public box; by the
#: rule written before those runs (calibrated coverage >= 0.9 in every simulated cell, worst cell
#: no lower than without) they are adopted (benchmarks/results/dppsvi_poisson_init.md:
#: worst simulated cell 100% against 93%; bike_rentals 78% -> 89%, wrong-sign effects 7 -> 2 over
#: 10 runs; the price is power on the simulated tables, which the rule did not weigh; re-measured
#: once wired, benchmarks/results/dppsvi_bootstrap.md: bike_rentals 100% / 89% at epsilon 0.2 / 1).
DP_INITIALISATION_MODELS = frozenset({"logistic", "poisson"})


def plan_initialisation(
    transform: Any,
    model_name: str,
    *,
    prior_events: list[Any],
    target_epsilon: float,
    delta: float,
    accountant: Accountant,
    models: frozenset[str] = DP_INITIALISATION_MODELS,
) -> tuple[float | None, Any, list[Any]]:
    """Noise multiplier and public bins of DP-PSVI's DP initialisation histograms, or
    ``(None, None, prior_events)`` when the model keeps the uniform public start (not in
    ``models``, by default :data:`DP_INITIALISATION_MODELS`; no share; or no column with public
    bins).

    ``target_epsilon`` is cumulative: the composition of ``prior_events`` and the histograms is
    calibrated to it (as the count and schema stages are), by :func:`~dpsummary.accounting.calibrate_part`
    (the Gaussian's exact privacy profile) whatever ``accountant`` is; ``accountant`` (the accountant of record) composes the
    release's events and calibrates the optimisation that follows. Returns the events to compose before
    the optimisation. Used by the release and the benchmarks, so both measure the same thing."""
    from .. import accounting as acc
    from ..postprocess.marginals import layout_for, marginals_event

    if model_name not in models or target_epsilon <= 0:
        return None, None, list(prior_events)
    layout = layout_for(transform, count_target=True)
    if not layout.columns:
        return None, None, list(prior_events)
    sigma = acc.calibrate_part(target_epsilon=target_epsilon, delta=delta, prior_events=prior_events)
    return sigma, layout, [*prior_events, marginals_event(sigma)]


@dataclass(frozen=True)
class InitialStart:
    """Samplers for DP-PSVI's initial pseudopoints drawn from the DP histograms (None: the
    public default) and the release note describing them."""

    features: Any = None
    targets: Any = None
    description: str | None = None
    #: The DP histograms themselves (a DP output; the parametric bootstrap draws synthetic
    #: features from them, :mod:`dpsummary.bootstrap`), None for the public start.
    marginals: Any = None


def initial_samplers(records: Any, transform: Any, layout: Any, noise_multiplier: float | None) -> InitialStart:
    """Run the planned initialisation mechanism (:meth:`PrivateRecords.noisy_marginals`) and turn
    its output into samplers; ``noise_multiplier`` None (the uniform public start) touches no
    data. Used by the release and the benchmarks, so both measure the same thing."""
    if noise_multiplier is None:
        return InitialStart()
    marginals = records.noisy_marginals(layout, noise_multiplier=noise_multiplier)
    return InitialStart(marginals.sampler(transform.sample_public_features), marginals.target_sampler(),
                        marginals.describe(), marginals)


def dp_psvi_constructor(
    *,
    transform: Any,
    model: Any,
    noise_multiplier: float,
    sample_rate: float,
    record_count: float,
    steps: int = DEFAULT_STEPS,
    num_samples: int = DEFAULT_NUM_SAMPLES,
    init_features: Any = None,
    init_targets: Any = None,
) -> Any:
    """DP-PSVI with the release's public defaults, for a public ``transform`` (used by the
    release and by the benchmarks, so both measure the same thing).

    ``init_features``: a sampler for the initial pseudopoints' features (the DP histograms'
    :meth:`~dpsummary.postprocess.marginals.NoisyMarginals.sampler`); default the public uniform
    one. The clip-norm reference records always use the public uniform sampler for features.
    ``init_targets``: a sampler for the initial targets of the pseudopoints and of the reference
    records (the DP target marginal of a count target); default simulated from the model."""
    from ..constructors.dppsvi import DPPSVI

    return DPPSVI(
        noise_multiplier=noise_multiplier, sample_rate=sample_rate, record_count=record_count,
        steps=steps, num_samples=num_samples, points_lr=DEFAULT_LEARNING_RATE,
        weights_lr=DEFAULT_LEARNING_RATE, clip_multiplier=DEFAULT_CLIP_MULTIPLIER,
        theta_scale=DEFAULT_THETA_SCALE,
        feature_sampler=init_features if init_features is not None else transform.sample_public_features,
        reference_feature_sampler=transform.sample_public_features,
        target_sampler=init_targets,
        clip_rule="synthetic", clip_quantile=DEFAULT_CLIP_QUANTILE, num_reference=DEFAULT_NUM_REFERENCE,
        point_scale=tuple(public_point_scale(transform, model)),
        point_bounds=public_point_bounds(transform, model),
    )


def public_point_scale(transform: Any, model: Any) -> list[float]:
    """Units in which DP-PSVI moves each point coordinate, from the public schema only.

    Features are in [-1, 1] after the public transform (scale 1). A count target moves in units
    of a quarter of its public upper bound (so a pseudopoint can travel the target's range within
    the optimisation); binary and real (already scaled) targets in units of 1.
    """
    scale = [1.0] * model.point_dim
    if model.has_target and transform.target_kind == "count":
        col = transform.schema.column(transform.target)
        if col.upper is not None and col.upper > 4:
            scale[-1] = float(col.upper) / 4.0
    return scale


def public_point_bounds(transform: Any, model: Any) -> tuple[tuple[float, ...], tuple[float, ...]]:
    """The public domain of model space, from the schema only: bounded numeric features in their
    scaled bounds ([-1, 1] under the public transform), one-hot coordinates in [0, 1], and the
    target in its range (binary [0, 1]; count [0, public upper bound]; real: scaled bounds).
    DP-PSVI projects pseudopoints into this box after every step."""
    inf = float("inf")
    lower: list[float] = []
    upper: list[float] = []

    def numeric(col: Any) -> tuple[float, float]:
        if col.lower is None or col.upper is None:
            return -inf, inf
        c, s = transform.centres[col.name], transform.scales[col.name]
        return (col.lower - c) / s, (col.upper - c) / s

    for col in transform.schema.feature_columns:
        if col.kind == "numeric":
            lo, hi = numeric(col)
            lower.append(lo)
            upper.append(hi)
        else:
            k = len(col.categories or [])
            lower += [0.0] * k
            upper += [1.0] * k
    if model.has_target:
        kind = transform.target_kind
        col = transform.schema.column(transform.target)
        if kind == "binary":
            lower.append(0.0)
            upper.append(1.0)
        elif kind == "count":
            lower.append(0.0)
            upper.append(float(col.upper) if col.upper is not None else inf)
        else:
            lo, hi = numeric(col)
            lower.append(lo)
            upper.append(hi)
    return tuple(lower), tuple(upper)
