"""The private release: ``dpsummary release --epsilon 0.2 data.csv``, end to end.

Order of operations (each step touches private data only after the previous one allowed it):

1. **Public planning** (no data): options and policy validated, delta fixed from the policy's
   public rule, the budget split fixed, the noise multipliers of the DP count and of the DP
   schema estimation calibrated, the signing key found or created.
2. **Parsing**: the CSV is parsed with private error messages (column and problem only). A
   failure here releases nothing, so it is not charged.
3. **Stage 1** (only when the record count or the schema is not public): the ledger reserves
   the count/preprocessing events *and holds the whole release budget* under its lock, then the
   DP count and DP schema estimation run; the stage is committed. Everything after this is
   charged even if it fails.
4. **Planning from released values**: model, public transform, sample rate q = B / count, the
   noise multiplier of the DP initialisation histograms (when the model uses them) and the
   optimisation noise multiplier, calibrated so that the *composed* epsilon of every event of
   this release is at or below the target under the accountant of record.
5. **Stage 2**: the ledger reserves the initialisation and DP-PSVI events (replacing the hold),
   the DP histograms and DP-PSVI run on a :class:`PrivateRecords` handle, the artifact is
   signed and written atomically, and the ledger commits with the artifact's digest. Any failure aborts the stage; the charge stays.
"""

from __future__ import annotations

import datetime as _dt
import math
import platform
import secrets
from collections.abc import Callable
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any, Literal

import torch

from . import __version__

Accountant = Literal["rdp", "prv", "pld"]

#: Public defaults, chosen on synthetic data (benchmarks/tune_dp_defaults.py), never on private data.
DEFAULT_SIZE = 50
DEFAULT_STEPS = 500
DEFAULT_NUM_SAMPLES = 100
DEFAULT_EXPECTED_BATCH = 200
DEFAULT_CLIP_MULTIPLIER = 1.0
DEFAULT_CLIP_QUANTILE = 0.5
DEFAULT_NUM_REFERENCE = 1000
DEFAULT_LEARNING_RATE = 0.05
DEFAULT_THETA_SCALE = 0.3
#: Models whose DP-PSVI starts from DP per-column histograms when the policy gives the
#: ``initialisation`` share a budget (benchmarks/results/tune_dp_defaults.md: on synthetic
#: logistic tables it lowers KL; on synthetic Poisson tables it did not, so Poisson and the
#: untested models keep the uniform public start and their share goes to optimisation).
DP_INITIALISATION_MODELS = frozenset({"logistic"})
#: Share of a release's delta given to the partition selection of DP schema estimation.
DELTA_SELECTION_SHARE = 0.1


class ReleaseError(Exception):
    """A release refused or failed; the message is one line and reveals nothing about the data."""

    code = 1


@dataclass(frozen=True)
class ReleaseRequest:
    data: Path
    epsilon: float
    delta: float | None = None
    model: str | None = None
    target: str | None = None
    size: int = DEFAULT_SIZE
    steps: int = DEFAULT_STEPS
    sample_rate: float | None = None
    num_samples: int = DEFAULT_NUM_SAMPLES
    policy: Path | None = None
    out: Path | None = None
    seed: int | None = None
    ledger: Path | None = None
    key: Path | None = None
    calibrate_to: Accountant | None = None


@dataclass
class ReleaseResult:
    out: Path
    artifact_digest: str
    source_id: str
    epsilons: dict[str, float]
    delta: float
    noise_multiplier: float
    sample_rate: float
    steps: int
    size: int
    budget_split: dict[str, float]
    composed_total: dict[str, float]
    naive_total: float
    notes: list[str] = field(default_factory=list)
    key_created: Path | None = None
    ledger: Path | None = None

    def as_dict(self) -> dict[str, Any]:
        return {
            "out": str(self.out),
            "artifact_sha256": self.artifact_digest,
            "source_id": self.source_id,
            "epsilon": self.epsilons,
            "delta": self.delta,
            "noise_multiplier": self.noise_multiplier,
            "sample_rate": self.sample_rate,
            "steps": self.steps,
            "size": self.size,
            "budget_split": self.budget_split,
            "source_spent_composed": self.composed_total,
            "source_spent_naive_sum": self.naive_total,
            "notes": self.notes,
            "key_created": str(self.key_created) if self.key_created else None,
            "ledger": str(self.ledger) if self.ledger else None,
        }


def software_versions() -> dict[str, str]:
    from importlib.metadata import PackageNotFoundError, version

    out = {"dpsummary": __version__, "python": platform.python_version()}
    for dist in ("torch", "opacus", "dp-accounting", "opendp", "numpy"):
        try:
            out[dist] = version(dist)
        except PackageNotFoundError:  # pragma: no cover
            out[dist] = "unknown"
    return out


def _check_request(req: ReleaseRequest) -> None:
    if not (isinstance(req.epsilon, float | int) and math.isfinite(req.epsilon) and req.epsilon > 0):
        raise ReleaseError("--epsilon must be a positive, finite number")
    if req.delta is not None and not (0 < req.delta < 1):
        raise ReleaseError("--delta must lie in (0, 1)")
    if req.size < 1:
        raise ReleaseError("--size must be at least 1")
    if req.steps < 1:
        raise ReleaseError("--steps must be at least 1")
    if req.num_samples < 2:
        raise ReleaseError("--num-samples must be at least 2")
    if req.sample_rate is not None and not (0 < req.sample_rate <= 1):
        raise ReleaseError("--sample-rate must lie in (0, 1]")
    if not req.data.exists():
        raise ReleaseError(f"data file not found: {req.data}")
    if not req.data.is_file():
        raise ReleaseError(f"not a file: {req.data}")


ProgressFn = Callable[[int, int], None]
NoticeFn = Callable[[str], None]


def run_release(
    req: ReleaseRequest,
    *,
    progress: ProgressFn | None = None,
    notice: NoticeFn | None = None,
) -> ReleaseResult:
    """Run a private release. Raises :class:`ReleaseError` (or a data/policy/ledger error with a
    one-line message) on refusal; writes nothing in that case except the ledger's charge when
    data had already been touched."""
    from dp_accounting import dp_event as dpe

    from . import accounting as acc
    from . import data as dmod
    from . import keys
    from . import policy as pmod
    from .artifact import write_artifact
    from .ledger import Ledger

    say = notice or (lambda _msg: None)
    _check_request(req)

    # ---- 1. public planning ----------------------------------------------------------------
    pol = pmod.load_policy(req.policy) if req.policy is not None else pmod.default_policy()
    accountant: Accountant = req.calibrate_to or pol.accountant
    delta_total = pol.resolve_delta(req.delta)
    if req.epsilon > pol.max_epsilon_per_release:
        raise ReleaseError(
            f"epsilon {req.epsilon:g} exceeds the policy's per-release cap {pol.max_epsilon_per_release:g}"
        )
    source_id = pol.source_id or pmod.source_id_from_path(req.data)
    if pol.source_id is None:
        say(f"budget attaches to data source {source_id!r} (derived from the file name; "
            "set source_id in the policy to name it)")
    if req.model is not None:
        pol.check_model(req.model)

    key_info, key_created = keys.resolve_signing_key(req.key)
    if key_created:
        say(f"created a new signing key: {key_info.private_path} (public key {key_info.public_path})")
    ledger_path = req.ledger or pol.ledger_path() or keys.default_home() / "ledger.jsonl"
    ledger = Ledger(ledger_path, keys.load_private_key(key_info.private_path), key_info.keyid)

    schema_public = pol.data_schema is not None
    count_public = pol.record_count_public
    split = pol.budget_split.normalised(count=not count_public, preprocessing=not schema_public)
    if req.model is not None and req.model not in DP_INITIALISATION_MODELS:
        # Known now to keep the uniform start: its share goes to optimisation, not to stage 1.
        split = pol.budget_split.normalised(count=not count_public, preprocessing=not schema_public,
                                            initialisation=False)
    # DP schema estimation selects categories by thresholding noisy counts, which spends a little
    # delta outside its Gaussian event (partition selection): a tenth of this release's delta.
    delta_selection = 0.0 if schema_public else DELTA_SELECTION_SHARE * delta_total
    delta = delta_total - delta_selection
    stage1_events: list[Any] = []
    count_sigma = pre_sigma = None
    if not count_public:
        count_sigma = acc.calibrate_gaussian(target_epsilon=split["count"] * req.epsilon, delta=delta,
                                             accountant=accountant)
        stage1_events.append(dpe.GaussianDpEvent(count_sigma))
    if not schema_public:
        pre_sigma = acc.calibrate_gaussian(
            target_epsilon=(split["count"] + split["preprocessing"]) * req.epsilon,
            delta=delta, prior_events=stage1_events, accountant=accountant,
        )
        stage1_events.append(dpe.GaussianDpEvent(pre_sigma))

    # ---- 2. parsing (nothing released on failure) ------------------------------------------
    table = dmod.read_csv(req.data, private=True)
    _reject_non_finite(table)
    if schema_public:
        missing = [c.name for c in pol.data_schema.columns if c.name not in table.header]
        if missing:
            raise ReleaseError(f"the data has no column {missing[0]!r} named in the policy's schema")
        # Validate every record against the public schema now, before anything is reserved:
        # a bad value is the curator's input error and nothing is released.
        dmod.Transform.from_schema(pol.data_schema).apply(table)

    content_id = keys.keyed_content_id_for_file(req.data)
    release_id = secrets.token_hex(8)
    notes: list[str] = []
    nonpriv = torch.Generator().manual_seed(req.seed if req.seed is not None else secrets.randbits(63))

    # ---- 3. stage 1: DP count and DP schema --------------------------------------------------
    from .private.marginals import NUM_INTERIOR_BINS
    from .private.mechanism import PrivateRecords

    noisy_count: float
    if stage1_events:
        reservation = ledger.reserve(
            source_id=source_id, events=stage1_events, delta=delta, policy=pol, content_id=content_id,
            release_id=release_id, stage="count-and-schema", hold_epsilon=req.epsilon,
            extra_delta=delta_selection,
        )
        try:
            if schema_public:
                schema = pol.data_schema
            else:
                from .private.preprocess import estimate_schema

                target = req.target
                assert pre_sigma is not None
                est = estimate_schema(table, noise_multiplier=pre_sigma, target=target, delta=delta_selection)
                schema = est.schema
                notes.extend(est.notes)
            if count_public:
                assert pol.record_count is not None
                noisy_count = float(pol.record_count)
            else:
                assert count_sigma is not None
                noisy_count = PrivateRecords(torch.zeros(table.num_rows, 1)).noisy_count(
                    noise_multiplier=count_sigma
                )
                notes.append("record count estimated with the Gaussian mechanism (not public)")
            reservation.commit(artifact_digest=None)
        except BaseException as exc:
            reservation.abort(reason=type(exc).__name__)
            raise
    else:
        assert pol.record_count is not None
        schema = pol.data_schema
        noisy_count = float(pol.record_count)

    # ---- 4. planning from released values ------------------------------------------------------
    try:
        # Calibrate to the target minus the partition-selection slack so the claim stays <= target.
        slack = -math.log1p(-delta_selection)
        plan = _plan_optimisation(
            req, pol, schema, noisy_count, stage1_events, delta, accountant, target_epsilon=req.epsilon - slack,
            init_target_epsilon=(split["count"] + split["preprocessing"] + split["initialisation"]) * req.epsilon
            if split["initialisation"] > 0 else 0.0,
        )
    except BaseException as exc:
        if stage1_events:
            _end_hold(ledger, source_id=source_id, release_id=release_id, delta=delta, policy=pol,
                      content_id=content_id, reason=type(exc).__name__)
        raise
    model, transform, q, sigma = plan.model, plan.transform, plan.sample_rate, plan.noise_multiplier
    psvi_event = acc.subsampled_gaussian_event(sigma, q, req.steps)
    stage2_events = [*plan.init_events(), psvi_event]
    all_events = [*stage1_events, *stage2_events]

    # ---- 5. stage 2: DP-PSVI ------------------------------------------------------------------
    from .constructors.base import Summary, fit

    out = req.out or req.data.with_name(req.data.stem + ".dpsummary.json")
    reservation = ledger.reserve(
        source_id=source_id, events=stage2_events, delta=delta, policy=pol, content_id=content_id,
        release_id=release_id, stage="dp-psvi", hold_epsilon=0.0,
    )
    # The claim's epsilons depend only on the planned events (public), not on the run: compute
    # them on the second core while DP-PSVI runs (PRV alone takes about 0.7 s). Nothing else
    # calls the accountants until the result is collected, so their warning filters (not
    # thread-safe) are not raced.
    from concurrent.futures import ThreadPoolExecutor

    pool = ThreadPoolExecutor(max_workers=1, thread_name_prefix="dpsummary-accounting")
    claimed = pool.submit(acc.epsilons, all_events, delta)
    pool.shutdown(wait=False)
    try:
        points = transform.to_points(table)
        records = PrivateRecords(points)
        del points
        start = initial_samplers(records, transform, plan.init_layout, plan.init_noise_multiplier)
        if start.description is not None:
            notes.append(start.description)
        constructor = dp_psvi_constructor(
            transform=transform, model=model, noise_multiplier=sigma, sample_rate=q,
            record_count=noisy_count, steps=req.steps, num_samples=req.num_samples, init_features=start.features,
            init_targets=start.targets,
        )
        summary: Summary = fit(constructor, records, model, req.size, generator=nonpriv,
                               transform=transform.to_dict(), progress=progress)
        epsilons = claimed.result()
        split_eps = _budget_split(count_sigma, pre_sigma, plan.init_noise_multiplier, psvi_event, delta, accountant)
        if delta_selection:
            epsilons = {k: v - math.log1p(-delta_selection) for k, v in epsilons.items()}
        claim = {
            "epsilon": epsilons,
            "delta": delta_total,
            "delta_accounting": delta,
            "delta_partition_selection": delta_selection,
            "epsilon_note": ("epsilons are computed at delta_accounting; DP schema estimation adds "
                             "delta_partition_selection to delta and -log(1 - delta_partition_selection) "
                             "(about the same, negligible) to epsilon") if delta_selection else None,
            "adjacency": "add/remove one record",
            "sampling": "poisson",
            "accountant_of_record": accountant,
            "accountants": {a: acc.accountant_description(a) for a in ("rdp", "prv", "pld")},
            "accountant_versions": acc.accountant_versions(),
            "events": acc.events_to_json(all_events),
            "mechanism": {
                "name": "dp-psvi",
                "noise_multiplier": sigma,
                "sample_rate": q,
                "steps": req.steps,
                "num_posterior_samples": req.num_samples,
                "clip_norm_rule": (f"{DEFAULT_CLIP_MULTIPLIER:g} x the {DEFAULT_CLIP_QUANTILE:g}-quantile of the L2 "
                                   "norms of the centred log-likelihood vectors of "
                                   f"{DEFAULT_NUM_REFERENCE} public synthetic records at each step (features "
                                   "from the public schema, targets simulated at the prior mean)"),
                "noise": "OpenDP discrete Gaussian from OS entropy",
                "count_noise_multiplier": count_sigma,
                "preprocessing_noise_multiplier": pre_sigma,
                "initialisation": None if plan.init_noise_multiplier is None else {
                    "rule": ("initial pseudopoint features drawn from Gaussian-noised per-column histograms "
                             f"over public bins (bounded numeric: at-lower, {NUM_INTERIOR_BINS} equal-width, at-upper; "
                             "categorical: each category and none); L2 sensitivity 1 after dividing the "
                             "counts by sqrt(number of columns)"
                             + ("; a count target is histogrammed the same way and initial targets (also the "
                                "clip-norm reference records') are drawn from its marginal"
                                if any(c.target for c in plan.init_layout.columns) else "")),
                    "noise_multiplier": plan.init_noise_multiplier,
                    "columns": [c.name for c in plan.init_layout.columns],
                },
            },
            "budget_split": split_eps,
            "public_inputs": pol.public_inputs(),
            "source_id": source_id,
        }
        body = {
            "format": "dpsummary.release/v1",
            "summary": summary.to_dict(),
            "feature_names": transform.feature_names,
            "param_names": model.param_names(transform.feature_names),
            "software": software_versions(),
            "created": _dt.datetime.now(_dt.UTC).isoformat(timespec="seconds"),
            "release_id": release_id,
        }
        digest = write_artifact(out, body, claim, ledger.private_key, key_info.keyid)
        reservation.commit(artifact_digest=digest)
    except BaseException as exc:
        reservation.abort(reason=type(exc).__name__)
        raise

    # The source's running total is shown under the accountant of record and the tight PLD one;
    # PRV (about 0.5 s more per call) is in the claim already and in `dpsummary audit`.
    shown: tuple[Accountant, ...] = ("rdp", "prv", "pld") if accountant == "prv" else ("rdp", "pld")
    spent = ledger.spent(source_id, delta=pol.total_delta, accountants=shown)
    return ReleaseResult(
        out=out, artifact_digest=digest, source_id=source_id, epsilons=epsilons, delta=delta_total,
        noise_multiplier=sigma, sample_rate=q, steps=req.steps, size=summary.size,
        budget_split=split_eps, composed_total=spent.composed, naive_total=spent.naive_sum,
        notes=notes, key_created=key_info.private_path if key_created else None, ledger=ledger_path,
    )


_NON_FINITE = frozenset({"nan", "+nan", "-nan", "inf", "+inf", "-inf", "infinity", "+infinity", "-infinity"})


def _reject_non_finite(table: Any) -> None:
    """NaN or infinite values are bad input in any column (one-line error, column name only)."""
    from .data import DataError

    for name in table.header:
        # Only the distinct values need looking at (a set of a column is ~100x cheaper than
        # lower-casing every cell).
        distinct = {str(v).lower() for v in set(table.array(name).tolist())}
        if not distinct.isdisjoint(_NON_FINITE):
            raise DataError(f"column {name!r} contains NaN or infinite values")


def _plan_optimisation(
    req: ReleaseRequest,
    pol: Any,
    schema: Any,
    noisy_count: float,
    stage1_events: list[Any],
    delta: float,
    accountant: Accountant,
    *,
    target_epsilon: float,
    init_target_epsilon: float,
) -> OptimisationPlan:
    """Model, public transform, sample rate and noise multipliers, from public or released values
    only (the schema and the count are public or DP outputs of stage 1)."""
    from . import accounting as acc
    from . import data as dmod
    from .models import get_model_class
    from .private.noise import quantize_sample_rate

    kind = dmod.target_kind(schema)
    model_name = req.model or dmod.default_model_name(kind)
    pol.check_model(model_name)
    if noisy_count < pol.min_records:
        raise ReleaseError("too few records for the policy (judged on the noisy record count)")
    if pol.n_max is not None and noisy_count > pol.n_max:
        raise ReleaseError("more records than the policy's public bound n_max (judged on the noisy count)")
    transform = dmod.Transform.from_schema(schema, invalid_numeric="missing", invalid_target="drop")
    model = get_model_class(model_name)(transform.num_features)
    if model.point_dim != transform.point_dim:
        raise ReleaseError(f"model {model_name!r} does not match the data's target ({kind})")
    if model_name == "logistic" and kind != "binary":
        raise ReleaseError(f"logistic regression needs a binary target; the target is {kind}")
    q = quantize_sample_rate(
        req.sample_rate if req.sample_rate is not None else min(1.0, DEFAULT_EXPECTED_BATCH / max(noisy_count, 1.0))
    )
    init_sigma, layout, before = plan_initialisation(
        transform, model_name, prior_events=stage1_events, target_epsilon=init_target_epsilon, delta=delta,
        accountant=accountant,
    )
    sigma = acc.calibrate_noise_multiplier(
        target_epsilon=target_epsilon, delta=delta, sample_rate=q, steps=req.steps,
        prior_events=before, accountant=accountant,
    )
    return OptimisationPlan(model, transform, q, sigma, init_sigma, layout)


@dataclass(frozen=True)
class OptimisationPlan:
    """Everything stage 2 needs, fixed from public or released values before it runs.
    ``init_noise_multiplier`` / ``init_layout`` are None for the uniform public start."""

    model: Any
    transform: Any
    sample_rate: float
    noise_multiplier: float
    init_noise_multiplier: float | None
    init_layout: Any

    def init_events(self) -> list[Any]:
        from .private.marginals import marginals_event

        return [] if self.init_noise_multiplier is None else [marginals_event(self.init_noise_multiplier)]


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
    calibrated to it (as the count and schema stages are). Returns the events to compose before
    the optimisation. Used by the release and the benchmarks, so both measure the same thing."""
    from . import accounting as acc
    from .private.marginals import layout_for, marginals_event

    if model_name not in models or target_epsilon <= 0:
        return None, None, list(prior_events)
    layout = layout_for(transform, count_target=True)
    if not layout.columns:
        return None, None, list(prior_events)
    sigma = acc.calibrate_gaussian(target_epsilon=target_epsilon, delta=delta, prior_events=prior_events,
                                   accountant=accountant)
    return sigma, layout, [*prior_events, marginals_event(sigma)]


@dataclass(frozen=True)
class InitialStart:
    """Samplers for DP-PSVI's initial pseudopoints drawn from the DP histograms (None: the
    public default) and the release note describing them."""

    features: Any = None
    targets: Any = None
    description: str | None = None


def initial_samplers(records: Any, transform: Any, layout: Any, noise_multiplier: float | None) -> InitialStart:
    """Run the planned initialisation mechanism (:meth:`PrivateRecords.noisy_marginals`) and turn
    its output into samplers; ``noise_multiplier`` None (the uniform public start) touches no
    data. Used by the release and the benchmarks, so both measure the same thing."""
    if noise_multiplier is None:
        return InitialStart()
    marginals = records.noisy_marginals(layout, noise_multiplier=noise_multiplier)
    return InitialStart(marginals.sampler(transform.sample_public_features), marginals.target_sampler(),
                        marginals.describe())


def _end_hold(ledger: Any, *, source_id: str, release_id: str, delta: float, policy: Any,
              content_id: str | None, reason: str) -> None:
    """A release refused between its stages gives back the rest of its held budget (what stage 1
    spent stays charged): an empty reservation replaces the hold and is aborted."""
    from dp_accounting import dp_event as dpe

    r = ledger.reserve(source_id=source_id, events=[dpe.NoOpDpEvent()], delta=delta, policy=policy,
                       content_id=content_id, release_id=release_id, stage="refused", hold_epsilon=0.0)
    r.abort(reason=reason)


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
    :meth:`~dpsummary.private.marginals.NoisyMarginals.sampler`); default the public uniform
    one. The clip-norm reference records always use the public uniform sampler for features.
    ``init_targets``: a sampler for the initial targets of the pseudopoints and of the reference
    records (the DP target marginal of a count target); default simulated from the model."""
    from .private.dppsvi import DPPSVI

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


def _budget_split(count_sigma, pre_sigma, init_sigma, psvi_event, delta, accountant) -> dict[str, float]:
    """Standalone epsilon of each part (their naive sum bounds the composed total from above)."""
    from dp_accounting import dp_event as dpe

    from . import accounting as acc

    out = {"count": 0.0, "preprocessing": 0.0, "initialisation": 0.0}
    for part, sig in (("count", count_sigma), ("preprocessing", pre_sigma), ("initialisation", init_sigma)):
        if sig is not None:
            out[part] = acc.epsilon([dpe.GaussianDpEvent(sig)], delta, accountant)
    out["optimisation"] = acc.epsilon([psvi_event], delta, accountant)
    return out
