"""The private release: ``dpsummary release --epsilon 0.2 data.csv``, end to end.

:func:`run_release` is a pipeline of named stages; each takes explicit inputs and returns explicit
outputs, and only the stages marked *reads records* touch the private file, always after the
ledger has reserved the budget of every mechanism they run:

====  =========================  =====================================================  ==========
 #    stage                      what                                                   charged
====  =========================  =====================================================  ==========
 0    :func:`plan_public`        options, policy, delta, budget split, stage-1 noise,   nothing
                                 key, ledger, the file's header (public facts only)
 1    reserve stage 1            count/schema events + a hold on the rest of epsilon    yes
 1a   :func:`read_source`        *reads records* through the total per-record rules     -
 1b   :func:`run_stage1`         *reads records*: DP record count, DP schema            stage 1
 2    :func:`plan_stage2`        model, transform, q, noise multipliers from public or  -
                                 released values; refusals here are DP-decided
 3    reserve stage 2            quality counts, DP initialisation, DP-PSVI events      yes
 3a   :func:`run_stage2`         *reads records*: total encoding, noisy quality counts  stage 2
                                 (data-quality refusal), initialisation, DP-PSVI
 4    :func:`write_release`      claim, signed artifact (atomic), ledger commit         -
====  =========================  =====================================================  ==========

With a public record count and schema, stage 1 is empty and one reservation covers everything.

Model families with their own stage-2 mechanism (today the Bayesian neural network, ``--model
bnn``, mechanism ``dp-bb-psvi``) plug in through :data:`FAMILY_MECHANISMS`: a
:class:`FamilyMechanism` supplies the public checks, the stage-2 plan, the stage-2 run and the
claim's ``mechanism`` block; stages 0, 1, the reservations, the signing and the ledger commit are
the ones above, unchanged.
The ledger session (:meth:`dpsummary.ledger.Ledger.session`) settles every reservation and hold
on every exit path: a refusal or crash after a reservation leaves its events charged and its
hold released. Every time the release publishes (ledger entries, the artifact's ``created``) is
the session's start, taken before any record is read.

Refusals (docs/REFUSALS.md): before stage 1 only public facts refuse
(:class:`ReleaseError`, :class:`~dpsummary.policy.PolicyError`, the ledger's budget); after it,
only DP outputs do (:class:`ChargedRefusal`), and the reservation stays charged.
"""

from __future__ import annotations

import contextlib
import datetime as _dt
import math
import platform
import secrets
from collections.abc import Callable
from dataclasses import dataclass, field
from pathlib import Path
from typing import TYPE_CHECKING, Any, Literal

from . import __version__
from .errors import ChargedRefusal, PolicyRefusal, Refusal

if TYPE_CHECKING:
    # torch (like scipy, opacus, dp_accounting and opendp) is imported inside the functions that
    # need it, after the public checks of stage 0: a refusal on a public fact loads none of them.
    import torch

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
#: Stage-2 mechanisms of the GLM family: the default first. Family mechanisms (one per model
#: family with its own mechanism, chosen automatically by ``--model``) are in
#: :data:`FAMILY_MECHANISMS`.
MECHANISMS = ("noise-aware-newton", "dp-psvi")
#: Stage-2 mechanisms whose optimisation is T Poisson-subsampled Gaussian releases (one
#: ``subsampled_gaussian_event``): DP-PSVI and the family mechanisms built like it.
SUBSAMPLED_MECHANISMS = frozenset({"dp-psvi", "dp-bb-psvi"})
#: Share of a release's delta given to the partition selection of DP schema estimation.
DELTA_SELECTION_SHARE = 0.1


class ReleaseError(Refusal):
    """A release refused on public facts (options, file, header); one line, reveals no data."""


ProgressFn = Callable[[int, int], None]
NoticeFn = Callable[[str], None]
#: Called with a stage boundary's name (see :data:`CHECKPOINTS`); tests raise from it to check
#: that every exit path settles the ledger.
CheckpointFn = Callable[[str], None]
CHECKPOINTS = ("planned-public", "reserved-stage1", "read", "stage1", "planned-stage2", "reserved-stage2",
               "encoded", "quality", "initialised", "optimised", "written")


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
    #: ``noise-aware-newton`` (default for GLMs: noisy score statistics, noise-aware posterior,
    #: see :mod:`dpsummary.noise_aware`), ``dp-psvi`` (the paper's mechanism, for reproduction),
    #: or a family mechanism (``dp-bb-psvi`` for ``model="bnn"``). None: chosen from the model
    #: (:func:`resolve_mechanism`).
    mechanism: str | None = None
    #: ``local`` or ``spark`` (:mod:`dpsummary.private.spark_engine`; ``spark`` holds its
    #: :class:`~dpsummary.private.spark_engine.SparkOptions`).
    engine: str = "local"
    spark: Any = None
    #: ``--model bnn`` only: hidden layer widths (public; default
    #: :data:`dpsummary.private.bnn.DEFAULT_WIDTHS`).
    bnn_widths: tuple[int, ...] | None = None
    #: ``--model gmm|dpgmm`` only: the number of components K (gmm) or the truncation T (dpgmm),
    #: public (default :data:`MIXTURE_DEFAULT_COMPONENTS`).
    components: int | None = None
    #: Replace an existing artifact at the output path (``--force``). Without it, an existing
    #: file there refuses the release in stage 0, before any reservation (a published artifact
    #: is never silently replaced).
    force: bool = False


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
    policy: str = ""
    mechanism: str = "dp-psvi"

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
            "policy": self.policy,
            "mechanism": self.mechanism,
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


def default_out(req: ReleaseRequest) -> Path:
    """The artifact's path: ``--out``, else ``DATA.dpsummary.json`` beside the data."""
    return req.out or req.data.with_name(req.data.stem + ".dpsummary.json")


def _check_request(req: ReleaseRequest) -> None:
    """Public checks of the options, of the file's existence and of the output path (no record
    is read, nothing heavy is imported): an existing artifact is refused unless ``force``."""
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
    if req.mechanism not in MECHANISMS and req.mechanism not in FAMILY_MECHANISMS:
        raise ReleaseError(f"--mechanism must be one of {', '.join((*MECHANISMS, *FAMILY_MECHANISMS))}")
    if not req.data.exists():
        raise ReleaseError(f"data file not found: {req.data}")
    if req.engine not in ("local", "spark"):
        raise ReleaseError("--engine must be local or spark")
    if not (req.data.is_file() or (req.engine == "spark" and req.data.is_dir())):
        raise ReleaseError(f"not a file: {req.data}")
    out = default_out(req)
    if out.resolve() == req.data.resolve():
        raise ReleaseError(f"--out {out} is the data file itself; choose another --out")
    if out.is_dir():
        raise ReleaseError(f"--out {out} is a directory; give a file path")
    if out.exists() and not req.force:
        raise ReleaseError(f"{out} already exists (a published artifact is never replaced silently); "
                           "pass --force to replace it, or --out to write elsewhere")


# =============================================================================================
# The pipeline
# =============================================================================================
def run_release(
    req: ReleaseRequest,
    *,
    progress: ProgressFn | None = None,
    notice: NoticeFn | None = None,
    checkpoint: CheckpointFn | None = None,
) -> ReleaseResult:
    """Run a private release; see the module docstring for the stages.

    Raises a :class:`~dpsummary.errors.Refusal` (or a policy/ledger/data error with a one-line
    message) on refusal and writes no artifact; the ledger keeps the charge of every mechanism
    whose budget was reserved, and no hold outlives the call."""
    say = notice or (lambda _msg: None)
    mark = checkpoint or (lambda _name: None)
    public = plan_public(req, say)
    req = public.req  # the mechanism resolved from the model (resolve_mechanism)
    family = FAMILY_MECHANISMS.get(req.mechanism or "")
    mark("planned-public")
    with public.ledger.session(source_id=public.source_id, policy=public.policy, release_id=public.release_id,
                               started=public.started) as session, \
            contextlib.ExitStack() as opened:
        # The private source (and its record store) is closed on every exit path.
        source = None
        if req.engine == "spark":
            # Before any reservation: starting the session and listing the Parquet files are
            # public facts (no record is read), so an unreachable cluster refuses for free.
            source = opened.enter_context(read_source(req.data, req))
            mark("read")
        if public.stage1.events:
            stage1 = session.reserve(events=public.stage1.events, delta=public.delta, stage="count-and-schema",
                                     hold_epsilon=req.epsilon, extra_delta=public.delta_selection)
            mark("reserved-stage1")
            if source is None:
                source = opened.enter_context(read_source(req.data, req))
                mark("read")
            released = run_stage1(public, source)
            stage1.commit(artifact_digest=None)
            mark("stage1")
        else:
            released = public_stage1(public)
        plan = family.plan(public, released) if family is not None else plan_stage2(public, released)
        mark("planned-stage2")
        stage2 = session.reserve(events=plan.events, delta=public.delta, stage=plan.mechanism)
        mark("reserved-stage2")
        if source is None:
            source = opened.enter_context(read_source(req.data, req))
            mark("read")
        stage2_run = family.run if family is not None else run_stage2
        output = stage2_run(public, released, plan, source, progress=progress, checkpoint=mark)
        source.close()
        if plan.mechanism == "dp-psvi":
            output = calibrate_dp_psvi(public, output, progress=progress, notice=say)
        digest = write_release(public, released, plan, output)
        try:
            mark("written")
            stage2.commit(artifact_digest=digest)
        except BaseException:
            # No artifact without a committed ledger entry: a failure here withdraws the file
            # (the reservation is aborted by the session and stays charged).
            public.out.unlink(missing_ok=True)
            raise
    # The source's running total is shown under the accountant of record and the tight PLD one;
    # PRV (about 0.5 s more per call) is in the claim already and in `dpsummary audit`.
    shown: tuple[Accountant, ...] = ("rdp", "prv", "pld") if public.accountant == "prv" else ("rdp", "pld")
    spent = public.ledger.spent(public.source_id, delta=public.policy.total_delta, accountants=shown)
    return ReleaseResult(
        out=public.out, artifact_digest=digest, source_id=public.source_id, epsilons=output.epsilons,
        delta=public.delta_total, noise_multiplier=plan.noise_multiplier, sample_rate=plan.sample_rate,
        steps=plan.steps, size=output.summary.size, budget_split=output.budget_split,
        composed_total=spent.composed, naive_total=spent.naive_sum, notes=[*released.notes, *output.notes],
        key_created=public.key_created, ledger=public.ledger_path, policy=public.policy_name,
        mechanism=plan.mechanism,
    )


# ---- stage 0: public planning ----------------------------------------------------------------
@dataclass(frozen=True)
class Stage1Plan:
    """Stage 1's events and noise multipliers (empty when the count and schema are public)."""

    events: list[Any]
    count_sigma: float | None
    schema_sigma: float | None


@dataclass(frozen=True)
class PublicPlan:
    """Everything fixed from public inputs before any record is read."""

    req: ReleaseRequest
    policy: Any
    policy_name: str
    accountant: Accountant
    delta_total: float
    delta: float
    delta_selection: float
    split: dict[str, float]
    stage1: Stage1Plan
    source_id: str
    release_id: str
    started: str
    ledger: Any
    ledger_path: Path
    key_info: Any
    key_created: Path | None
    out: Path
    header: list[str]


def plan_public(req: ReleaseRequest, say: NoticeFn) -> PublicPlan:
    """Stage 0. Validate the request and the policy, fix delta, the budget split and stage 1's
    noise, find the key and the ledger, and read the file's HEADER only (column names are public:
    a missing file, no header or a schema column absent from the header refuse here).

    The first public checks import nothing heavy (torch, scipy, opacus, dp_accounting, opendp):
    bad options, a missing file, an existing artifact without ``force``, an unreadable header
    and a target absent from a local file's header refuse in about the time of ``--help``
    (tests/test_cli_newcomer.py checks ``sys.modules``). Loading the policy validates its
    models against the model registry, which imports torch; the accountants load after every
    public check."""
    from .header import read_header

    # Captured before anything else: the only time the release publishes.
    started = _dt.datetime.now(_dt.UTC).replace(microsecond=0).isoformat()
    req = resolve_mechanism(req)
    _check_request(req)
    if req.engine != "spark":
        # The header line only, by the light reader, before the policy (whose validation imports
        # the model registry, hence torch): a target absent from the file is refused either way.
        header = read_header(req.data)
        if req.target is not None and req.target not in header:
            raise ReleaseError(f"target column {req.target!r} is not in the data's header")
    from . import keys
    from . import policy as pmod

    policy_path = req.policy if req.policy is not None else pmod.default_policy_path()
    pol = pmod.load_policy(policy_path)
    policy_name = str(policy_path) if req.policy is not None else f"packaged default ({policy_path.name})"
    say(f"policy: {policy_name}")
    if req.calibrate_to is not None and req.calibrate_to != pol.accountant:
        # One rule: the accountant that calibrates the noise is the one the ledger charges and the
        # per-release cap is checked under (the policy's accountant of record).
        raise PolicyRefusal(
            f"--calibrate-to {req.calibrate_to} differs from the policy's accountant of record "
            f"{pol.accountant}; set accountant = \"{req.calibrate_to}\" in the policy instead"
        )
    accountant: Accountant = pol.accountant
    delta_total = pol.resolve_delta(req.delta)
    if req.epsilon > pol.max_epsilon_per_release:
        raise PolicyRefusal(
            f"epsilon {req.epsilon:g} exceeds the policy's per-release cap {pol.max_epsilon_per_release:g}; "
            "lower --epsilon or raise max_epsilon_per_release in the policy"
        )
    source_id = pol.source_id or pmod.source_id_from_path(req.data)
    if pol.source_id is None:
        say(f"budget attaches to data source {source_id!r} (derived from the file name; "
            "set source_id in the policy to name it)")
    if req.model is not None:
        pol.check_model(req.model)
    family = FAMILY_MECHANISMS.get(req.mechanism or "")
    if family is not None:
        family.check_public(req)
    if req.engine == "spark":
        from .private.spark_engine import public_header

        header = public_header(req.data, pol)  # public checks of --engine spark (metadata only)
    schema_public = pol.data_schema is not None
    if schema_public:
        missing = [c.name for c in pol.data_schema.columns if c.name not in header]
        if missing:
            raise ReleaseError(f"the data has no column {missing[0]!r} named in the policy's schema; "
                               "fix the header or the policy's schema")
        if family is not None:
            family.check_schema(req, pol.data_schema)
        else:
            _check_model_for_schema(req.model, pol.data_schema)
    elif req.target is not None and req.target not in header:
        raise ReleaseError(f"target column {req.target!r} is not in the data's header")

    # Every public refusal above is decided; the accountants (dp_accounting, scipy) load here.
    from dp_accounting import dp_event as dpe

    from . import accounting as acc
    from .ledger import Ledger

    key_info, key_created = keys.resolve_signing_key(req.key)
    if key_created:
        say(f"created a new signing key: {key_info.private_path} (public key {key_info.public_path})")
    ledger_path = req.ledger or pol.ledger_path() or keys.default_home() / "ledger.jsonl"
    ledger = Ledger(ledger_path, keys.load_private_key(key_info.private_path), key_info.keyid)

    count_public = pol.record_count_public
    dp_init = req.model is None or req.model in DP_INITIALISATION_MODELS
    split = pol.budget_split.normalised(count=not count_public, preprocessing=not schema_public,
                                        initialisation=dp_init)
    # DP schema estimation selects categories by thresholding noisy counts, which spends a little
    # delta outside its Gaussian event (partition selection): a tenth of this release's delta.
    delta_selection = 0.0 if schema_public else DELTA_SELECTION_SHARE * delta_total
    delta = delta_total - delta_selection
    events: list[Any] = []
    count_sigma = schema_sigma = None
    try:
        if not count_public:
            count_sigma = acc.calibrate_gaussian(target_epsilon=split["count"] * req.epsilon, delta=delta,
                                                 accountant=accountant)
            events.append(dpe.GaussianDpEvent(count_sigma))
        if not schema_public:
            schema_sigma = acc.calibrate_gaussian(
                target_epsilon=(split["count"] + split["preprocessing"]) * req.epsilon,
                delta=delta, prior_events=events, accountant=accountant,
            )
            events.append(dpe.GaussianDpEvent(schema_sigma))
    except ValueError as exc:
        # Public facts only (epsilon, the policy's split and delta): refused before any charge.
        raise PolicyRefusal(
            f"--epsilon {req.epsilon:g} is too small for the policy at delta {delta:.3g}: its record-count and "
            f"schema shares cannot be calibrated ({exc}); raise --epsilon, or declare the record count and "
            "schema public in the policy"
        ) from exc
    release_id = secrets.token_hex(8)
    # No hash of the input file anywhere (issue 24): the ledger binds the release to its
    # artifact's digest (commit entry), post-processing of released values.
    return PublicPlan(
        req=req, policy=pol, policy_name=policy_name, accountant=accountant, delta_total=delta_total,
        delta=delta, delta_selection=delta_selection, split=split,
        stage1=Stage1Plan(events, count_sigma, schema_sigma), source_id=source_id, release_id=release_id,
        started=started, ledger=ledger, ledger_path=ledger_path, key_info=key_info,
        key_created=key_info.private_path if key_created else None,
        out=default_out(req), header=header,
    )


def _check_model_for_schema(model_name: str | None, schema: Any) -> None:
    """With a public schema the model/target match is a public fact: refuse before reserving."""
    from . import data as dmod
    from .models import get_model_class

    if model_name is None:
        return
    kind = dmod.target_kind(schema)
    if model_name == "logistic" and kind != "binary":
        raise ReleaseError(f"logistic regression needs a binary target; the schema's target is {kind}; "
                           "choose --model for it or fix the schema")
    n_features = dmod.Transform.from_schema(schema).num_features
    point_dim = n_features + (0 if schema.target is None else 1)
    if get_model_class(model_name)(n_features).point_dim != point_dim:
        raise ReleaseError(f"model {model_name!r} does not match the schema's target ({kind}); "
                           "choose another --model")


# ---- stage 1: record count and schema ------------------------------------------------------
@dataclass(frozen=True)
class Released:
    """What stage 1 released (or the policy declared public): the schema and the record count."""

    schema: Any
    record_count: float
    count_is_public: bool
    notes: list[str]


def read_source(path: Path, req: ReleaseRequest | None = None) -> Any:
    """Open the private file through the total per-record rules (after a reservation); with
    ``--engine spark`` a :class:`~dpsummary.private.spark_engine.SparkSource` (same interface)."""
    if req is not None and req.engine == "spark":
        from .private.spark_engine import SparkOptions, SparkSource

        return SparkSource.open(path, req.spark or SparkOptions(), steps=req.steps)
    from .private.source import PrivateSource

    return PrivateSource.open(path)


def public_stage1(public: PublicPlan) -> Released:
    """Stage 1 when the policy declares the count and the schema public: nothing to run."""
    pol = public.policy
    assert pol.record_count is not None and pol.data_schema is not None
    return Released(pol.data_schema, float(pol.record_count), True, [])


def run_stage1(public: PublicPlan, source: Any) -> Released:
    """Stage 1 (reads records, charged): DP schema estimation and the DP record count, for the
    parts the policy does not declare public. A refusal here (e.g. the DP schema finds no usable
    target) is decided on DP outputs: :class:`ChargedRefusal`."""
    from .data import DataError, Transform

    pol, plan = public.policy, public.stage1
    notes: list[str] = []
    if pol.data_schema is not None:
        schema = pol.data_schema
    else:
        assert plan.schema_sigma is not None
        try:
            from .data import NO_TARGET

            # A mixture models the numeric columns jointly: no column is a target.
            target = NO_TARGET if public.req.model in MIXTURE_MODELS else public.req.target
            est = source.estimate_schema(noise_multiplier=plan.schema_sigma, target=target,
                                         delta=public.delta_selection,
                                         target_classes=2 if public.req.model == "logistic" else None)
        except DataError as exc:
            raise ChargedRefusal(str(exc)) from None
        schema = est.schema
        notes.extend(est.notes)
    if pol.record_count_public:
        assert pol.record_count is not None
        count = float(pol.record_count)
    else:
        assert plan.count_sigma is not None
        if pol.data_schema is not None:
            # A public schema fixes the (public) transform now: encode in this pass, so one
            # streaming read serves stage 1's count and stage 2 (releases nothing by itself).
            try:
                transform = Transform.from_schema(pol.data_schema)
            except DataError:
                pass  # the same public error is raised by plan_stage2, as before
            else:
                prepare = getattr(source, "prepare", None)  # the local engine's one-pass shortcut
                if prepare is not None:
                    prepare(transform, missing_numeric=pol.data_quality.missing_numeric,
                            unseen_category=pol.data_quality.unseen_category)
        count = source.noisy_record_count(noise_multiplier=plan.count_sigma)
        notes.append("record count estimated with the Gaussian mechanism (not public)")
    return Released(schema, count, pol.record_count_public, notes)


# ---- stage 2 plan: from public or released values ------------------------------------------
@dataclass(frozen=True)
class OptimisationPlan:
    """Everything stage 2 needs, fixed from public or released values before it runs.
    ``init_noise_multiplier`` / ``init_layout`` are None for the uniform public start;
    ``quality_noise_multiplier`` is None when the policy gives the quality counts no share."""

    model: Any
    transform: Any
    sample_rate: float
    noise_multiplier: float
    init_noise_multiplier: float | None
    init_layout: Any
    quality_noise_multiplier: float | None = None
    steps: int = DEFAULT_STEPS
    #: The stage-2 mechanism; for ``noise-aware-newton`` ``noise_multiplier`` is the single-
    #: Gaussian calibration the schedule's per-statistic multipliers derive from.
    mechanism: str = "dp-psvi"
    schedule: Any = None
    #: Family mechanisms only: their public settings (e.g. the BNN's widths, clip norm, inner
    #: loop), written to the claim by the family's ``claim`` function.
    settings: dict[str, Any] = field(default_factory=dict)
    #: Family mechanisms whose optimisation is neither DP-PSVI's subsampled Gaussian nor a
    #: noise-aware schedule (the mixture's noisy kd-tree): their whole stage-2 event.
    event: Any = None

    def init_events(self) -> list[Any]:
        from .private.marginals import marginals_event

        return [] if self.init_noise_multiplier is None else [marginals_event(self.init_noise_multiplier)]

    def quality_events(self) -> list[Any]:
        from dp_accounting import dp_event as dpe

        q = self.quality_noise_multiplier
        return [] if q is None else [dpe.GaussianDpEvent(q)]

    @property
    def optimisation_event(self) -> Any:
        from dp_accounting import dp_event as dpe

        from . import accounting as acc

        if self.event is not None:
            return self.event
        if self.mechanism in SUBSAMPLED_MECHANISMS:
            return acc.subsampled_gaussian_event(self.noise_multiplier, self.sample_rate, self.steps)
        return dpe.ComposedDpEvent(self.schedule.events(self.noise_multiplier))

    @property
    def events(self) -> list[Any]:
        """Stage 2's events in the order they run (quality counts, initialisation, DP-PSVI)."""
        return [*self.quality_events(), *self.init_events(), self.optimisation_event]


def plan_stage2(public: PublicPlan, released: Released) -> OptimisationPlan:
    """Model, public transform, sample rate and noise multipliers from public or released values
    only. The refusals here (too few records, more than n_max, a DP-estimated target that does not
    suit the model) are decided on DP outputs: :class:`ChargedRefusal` when stage 1 ran, a public
    :class:`ReleaseError` when the count and schema are public."""
    from . import accounting as acc
    from . import data as dmod
    from .models import get_model_class
    from .private.noise import quantize_sample_rate

    req, pol, schema = public.req, public.policy, released.schema
    refuse: type[Refusal] = PolicyRefusal if public.stage1.events == [] else ChargedRefusal
    kind = dmod.target_kind(schema)
    model_name = req.model or dmod.default_model_name(kind)
    pol.check_model(model_name)
    _check_released_count(public, released, refuse)
    transform = dmod.Transform.from_schema(schema)
    model = get_model_class(model_name)(transform.num_features)
    if model.point_dim != transform.point_dim:
        raise refuse(f"model {model_name!r} does not match the data's target ({kind}); choose another --model")
    if model_name == "logistic" and kind != "binary":
        raise refuse(f"logistic regression needs a binary target; the target is {kind}; choose another --model")
    q = quantize_sample_rate(
        req.sample_rate if req.sample_rate is not None
        else min(1.0, DEFAULT_EXPECTED_BATCH / max(released.record_count, 1.0))
    )
    split = public.split
    dp_init_models = DP_INITIALISATION_MODELS if req.mechanism == "dp-psvi" else frozenset()
    if model_name not in dp_init_models and split["initialisation"] > 0:
        # Known only now (the model follows the schema): the share goes to optimisation.
        split = pol.budget_split.normalised(count="count" in _nonzero(split), preprocessing="preprocessing" in
                                            _nonzero(split), initialisation=False)
    eps = req.epsilon
    quality_sigma, before = _quality_noise(public, split)
    init_target = (split["count"] + split["preprocessing"] + split["quality"] + split["initialisation"]) * eps
    init_sigma, layout, before = plan_initialisation(
        transform, model_name, prior_events=before, target_epsilon=init_target if split["initialisation"] > 0 else 0.0,
        delta=public.delta, accountant=public.accountant, models=dp_init_models,
    )
    # Calibrate to the target minus the partition-selection slack so the claim stays <= target.
    slack = acc.selection_slack([public.delta_selection])
    if req.mechanism != "dp-psvi":
        from . import noise_aware

        schedule = noise_aware.Schedule.default(model)
        na_sigma, _ = noise_aware.calibrate(schedule, target_epsilon=eps - slack, delta=public.delta,
                                            prior_events=before, accountant=public.accountant)
        return OptimisationPlan(model, transform, 1.0, na_sigma, init_sigma, layout, quality_sigma, 1,
                                mechanism=req.mechanism or MECHANISMS[0], schedule=schedule)
    sigma = acc.calibrate_noise_multiplier(
        target_epsilon=eps - slack, delta=public.delta, sample_rate=q, steps=req.steps,
        prior_events=before, accountant=public.accountant,
    )
    return OptimisationPlan(model, transform, q, sigma, init_sigma, layout, quality_sigma, req.steps)


def _nonzero(split: dict[str, float]) -> set[str]:
    return {k for k, v in split.items() if v > 0}


def _gaussian(sigma: float) -> Any:
    from dp_accounting import dp_event as dpe

    return dpe.GaussianDpEvent(sigma)


# ---- stage 2: quality counts, initialisation, DP-PSVI --------------------------------------
@dataclass(frozen=True)
class Stage2Output:
    summary: Any
    epsilons: dict[str, float]
    budget_split: dict[str, float]
    quality: Any
    init_description: str | None
    notes: list[str]
    #: Noise-aware mechanism only: the raw summary and the two Gaussians (post-processing).
    extra: dict[str, Any] = field(default_factory=dict)


def _check_released_count(public: PublicPlan, released: Released, refuse: type[Refusal]) -> None:
    """The policy's min_records and n_max, judged on the public or the noisy record count."""
    pol = public.policy
    judged = "public record count" if released.count_is_public else "noisy record count"
    if released.record_count < pol.min_records:
        raise refuse(f"too few records for the policy's min_records {pol.min_records} (judged on the {judged})")
    if pol.n_max is not None and released.record_count > pol.n_max:
        raise refuse(f"more records than the policy's public bound n_max (judged on the {judged}); raise n_max")


def _quality_noise(public: PublicPlan, split: dict[str, float]) -> tuple[float | None, list[Any]]:
    """The quality counts' noise multiplier (None without a quality share) and the events that
    precede the stage-2 mechanism (stage 1's, then the quality counts')."""
    from . import accounting as acc

    before = list(public.stage1.events)
    if split["quality"] <= 0:
        return None, before
    sigma = acc.calibrate_gaussian(
        target_epsilon=(split["count"] + split["preprocessing"] + split["quality"]) * public.req.epsilon,
        delta=public.delta, prior_events=before, accountant=public.accountant)
    return sigma, [*before, _gaussian(sigma)]


@dataclass
class _Stage2Start:
    """What every stage-2 mechanism starts from: the encoded records, the noisy quality counts
    (None without a quality share), the optimisation's record count and the notes so far."""

    encoded: Any
    quality: Any
    record_count: float
    notes: list[str]
    claimed: Any  # Future of the claim's epsilons


def _begin_stage2(public: PublicPlan, released: Released, plan: OptimisationPlan, source: Any,
                  mark: CheckpointFn) -> _Stage2Start:
    """Shared by every stage-2 mechanism (reads records, charged): start the claim's epsilons on
    the second core (they depend only on the planned, public events; PRV alone takes about
    0.7 s; nothing else calls the accountants until the result is collected, so their warning
    filters, not thread-safe, are not raced), encode every record by the public total rules,
    release the noisy quality counts and decide the data-quality refusal on them."""
    from concurrent.futures import ThreadPoolExecutor

    from . import accounting as acc

    pol = public.policy
    pool = ThreadPoolExecutor(max_workers=1, thread_name_prefix="dpsummary-accounting")
    claimed = pool.submit(acc.epsilons, [*public.stage1.events, *plan.events], public.delta)
    pool.shutdown(wait=False)
    rules = pol.data_quality
    encoded = source.encode(plan.transform, missing_numeric=rules.missing_numeric,
                            unseen_category=rules.unseen_category)
    mark("encoded")
    notes: list[str] = []
    record_count = released.record_count
    quality = None
    if plan.quality_noise_multiplier is not None:
        quality = encoded.noisy_quality_counts(noise_multiplier=plan.quality_noise_multiplier)
        share = quality.dropped_fraction(released.record_count)
        if share > rules.max_dropped_fraction:
            raise ChargedRefusal(
                f"about {100 * share:.0f}% of the records are unusable under the policy's data_quality rules "
                f"(more than max_dropped_fraction {rules.max_dropped_fraction:g}); fix the data or the rules"
            )
        # The optimisation's record count: records read minus records dropped (both noisy).
        record_count = max(released.record_count - max(quality.noisy["dropped"], 0.0), 1.0)
        notes.append("data quality: noisy counts of the records each public rule touched are in the artifact")
    mark("quality")
    return _Stage2Start(encoded, quality, record_count, notes, claimed)


def _finish_stage2(public: PublicPlan, plan: OptimisationPlan, start: _Stage2Start, summary: Any,
                   init_description: str | None = None, extra: dict[str, Any] | None = None) -> Stage2Output:
    """Shared by every stage-2 mechanism: the claim's epsilons (plus the partition-selection
    slack) and the budget split, around the summary the mechanism produced."""
    from . import accounting as acc

    epsilons = start.claimed.result()
    if public.delta_selection:
        epsilons = {k: v + acc.selection_slack([public.delta_selection]) for k, v in epsilons.items()}
    split_eps = _budget_split(public.stage1.count_sigma, public.stage1.schema_sigma, plan.quality_noise_multiplier,
                              plan.init_noise_multiplier, plan.optimisation_event, public.delta, public.accountant)
    return Stage2Output(summary, epsilons, split_eps, start.quality, init_description, start.notes, extra or {})


def run_stage2(
    public: PublicPlan,
    released: Released,
    plan: OptimisationPlan,
    source: Any,
    *,
    progress: ProgressFn | None = None,
    checkpoint: CheckpointFn | None = None,
) -> Stage2Output:
    """Stage 2 (reads records, charged): encode every record by the public total rules, release
    the noisy quality counts and decide the data-quality refusal on them (:func:`_begin_stage2`),
    then the DP initialisation and the noise-aware mechanism or DP-PSVI."""
    import torch

    from .constructors.base import fit

    mark = checkpoint or (lambda _name: None)
    req = public.req
    begun = _begin_stage2(public, released, plan, source, mark)
    encoded, notes = begun.encoded, begun.notes
    nonpriv = torch.Generator().manual_seed(req.seed if req.seed is not None else secrets.randbits(63))
    start = initial_samplers(encoded.records, plan.transform, plan.init_layout, plan.init_noise_multiplier)
    if start.description is not None:
        notes.append(start.description)
    mark("initialised")
    if plan.mechanism != "dp-psvi":
        summary, extra = _noise_aware_summaries(plan, encoded, req.size, nonpriv)
        notes.extend(extra.pop("notes"))
        mark("optimised")
        return _finish_stage2(public, plan, begun, summary, start.description, extra)
    constructor = dp_psvi_constructor(
        transform=plan.transform, model=plan.model, noise_multiplier=plan.noise_multiplier,
        sample_rate=plan.sample_rate, record_count=begun.record_count, steps=req.steps, num_samples=req.num_samples,
        init_features=start.features, init_targets=start.targets,
    )
    summary = fit(constructor, encoded.records, plan.model, req.size, generator=nonpriv,
                  transform=plan.transform.to_dict(), progress=progress)
    mark("optimised")
    return _finish_stage2(public, plan, begun, summary, start.description,
                          {"dppsvi_settings": _dppsvi_bootstrap_settings(public, plan, begun.record_count, start)})


def _dppsvi_bootstrap_settings(public: PublicPlan, plan: OptimisationPlan, record_count: float,
                               start: InitialStart) -> Any:
    """What the parametric bootstrap re-runs (:mod:`dpsummary.bootstrap`): the public settings of
    this DP-PSVI run, its noisy (or public) record count and its DP initialisation histograms:
    public values and DP outputs only, never a record."""
    from .bootstrap import MechanismSettings

    req = public.req
    return MechanismSettings(
        model=plan.model, transform=plan.transform, size=req.size, steps=req.steps, num_samples=req.num_samples,
        noise_multiplier=plan.noise_multiplier, sample_rate=plan.sample_rate, record_count=float(record_count),
        count_noise_multiplier=public.stage1.count_sigma, init_noise_multiplier=plan.init_noise_multiplier,
        init_layout=plan.init_layout, init_marginals=start.marginals,
    )


def calibrate_dp_psvi(public: PublicPlan, output: Stage2Output, *, progress: ProgressFn | None = None,
                      notice: NoticeFn | None = None) -> Stage2Output:
    """Stage 3b (post-processing, after the private source is CLOSED; no privacy cost): calibrate
    DP-PSVI's intervals by the parametric bootstrap of :mod:`dpsummary.bootstrap`, which sees the
    release's outputs and public settings only. The calibrated pseudocoreset becomes the default
    summary; the uncalibrated one and the bootstrap's record ride along. ``req.seed`` (if any)
    seeds the bootstrap's simulation (it protects nothing). A failure of the bootstrap (a bug)
    ends the charged release in a one-line refusal, never in an uncalibrated artifact."""
    import dataclasses

    from .bootstrap import MATCH_KL_WARNING, BootstrapConfig, ParametricBootstrap

    say = notice or (lambda _msg: None)
    extra = dict(output.extra)
    settings = extra.pop("dppsvi_settings")
    boot = ParametricBootstrap(settings, BootstrapConfig(seed=public.req.seed))
    workers = boot.config.resolved_workers()
    say(f"calibrating DP-PSVI's intervals: parametric bootstrap, {boot.config.rounds} x {boot.config.replicates} "
        f"re-runs of the mechanism on synthetic tables drawn from the release ({workers} "
        f"{'worker processes' if workers > 1 else 'process (in-process replicates)'}; post-processing, no privacy cost)")
    try:
        result = boot.fit(output.summary, progress=progress)
    except Exception as exc:  # a bug: the budget is charged, the release refuses in one line
        raise ChargedRefusal(f"the parametric bootstrap of DP-PSVI failed ({type(exc).__name__}); "
                             "report this bug") from None
    cal = result.calibration
    say(f"bootstrap done in {result.seconds:.0f} s: calibrated posterior (bias and spread per coordinate), "
        f"leave-one-out bootstrap coverage {cal.loo_coverage:.0%} (Monte Carlo se {cal.loo_coverage_se:.1%}); "
        f"pseudocoreset matched to it (symmetric KL {cal.match_symmetric_kl:.3g} nats"
        + (", a poor match: the artifact also carries the calibrated Gaussian)"
           if cal.match_symmetric_kl > MATCH_KL_WARNING else ")"))
    extra.update(raw_summary=output.summary, calibration=result.record(settings))
    return dataclasses.replace(output, summary=result.summary, extra=extra)


def _noise_aware_summaries(plan: OptimisationPlan, records: Any, size: int, generator: torch.Generator
                           ) -> tuple[Any, dict[str, Any]]:
    """The noise-aware mechanism (:mod:`dpsummary.noise_aware`) on the private records, then its
    noise-aware Gaussian turned into a pseudocoreset (post-processing,
    :mod:`dpsummary.constructors.gaussian_target`). The raw (noise-unaware) Gaussian is no longer
    matched or released (issue 25: nothing needed it, it doubled the matching time and was the
    first to go non-finite).

    Total: a fit that yields no finite Gaussian or no finite pseudocoreset (decided on DP outputs
    and public values only) ends in a :class:`ChargedRefusal` (``non-finite-fit``)."""
    import torch

    from . import noise_aware
    from .constructors.base import Summary
    from .constructors.gaussian_target import match_gaussian

    model, tf = plan.model, plan.transform
    feature_norm, target_bound = noise_aware.schema_bounds(tf)
    bounds = noise_aware.public_bounds(model, feature_norm=feature_norm, target_bound=target_bound)

    def release(theta: torch.Tensor, score_bound: float, curvature_bound: float, s_mult: float, c_mult: float
                ) -> tuple[torch.Tensor, torch.Tensor]:
        st = records.noisy_score_statistics(model, theta, score_bound=score_bound, curvature_bound=curvature_bound,
                                            score_noise_multiplier=s_mult, curvature_noise_multiplier=c_mult)
        return st.score, st.curvature

    try:
        result = noise_aware.fit(model, release, bounds, schedule=plan.schedule, sigma=plan.noise_multiplier,
                                 feature_norm=feature_norm, target_bound=target_bound)
    except noise_aware.NonFiniteFit:
        raise ChargedRefusal(NON_FINITE_FIT_MESSAGE) from None
    posterior = result.posterior
    points, weights, loss = match_gaussian(model, posterior, size=size,
                                           initial_features=tf.sample_public_features(size, generator),
                                           generator=generator)
    if not (math.isfinite(loss) and bool(torch.isfinite(points).all()) and bool(torch.isfinite(weights).all())):
        raise ChargedRefusal(NON_FINITE_FIT_MESSAGE)
    summary = Summary(points, weights, model, noise_aware.MECHANISM, tf.to_dict(),
                      {"posterior": "noise_aware", "match_symmetric_kl": loss})
    gaussians = {"noise_aware": {"mean": posterior.mean.tolist(), "cov": posterior.cov.tolist()}}
    notes = [*result.notes, f"pseudocoreset matched to the noise-aware Gaussian (symmetric KL {loss:.3g} nats)"]
    return summary, {
        "gaussians": gaussians, "notes": notes,
        "noise_multipliers": [list(m) for m in result.noise_multipliers],
        "schedule": plan.schedule.as_dict(), "bounds": {"feature_norm": feature_norm, "target_bound": target_bound},
        "rounds": [{"score_bound": r.score_bound, "curvature_bound": r.curvature_bound} for r in result.rounds],
    }


# ---- stage 4: the signed artifact ----------------------------------------------------------
def write_release(public: PublicPlan, released: Released, plan: OptimisationPlan, output: Stage2Output) -> str:
    """Build the claim (public parameters and DP outputs only), sign and write the artifact
    atomically; returns its digest for the ledger commit."""
    from . import accounting as acc
    from .artifact import write_artifact
    from .private.marginals import NUM_INTERIOR_BINS

    req, pol = public.req, public.policy
    all_events = [*public.stage1.events, *plan.events]
    sel = public.delta_selection
    claim = {
        "epsilon": output.epsilons,
        "delta": public.delta_total,
        "delta_accounting": public.delta,
        "delta_partition_selection": sel,
        "epsilon_note": ("epsilons are computed at delta_accounting; DP schema estimation adds "
                         "delta_partition_selection to delta and -log(1 - delta_partition_selection) "
                         "(about the same, negligible) to epsilon") if sel else None,
        "adjacency": "add/remove one record",
        # What the stage-2 mechanism's accountant assumes (the audit re-checks it from events).
        "sampling": "poisson" if plan.mechanism in SUBSAMPLED_MECHANISMS else "none (every record)",
        "accountant_of_record": public.accountant,
        "accountants": {a: acc.accountant_description(a) for a in ("rdp", "prv", "pld")},
        "accountant_versions": acc.accountant_versions(),
        "events": acc.events_to_json(all_events),
        "mechanism": FAMILY_MECHANISMS[plan.mechanism].claim(public, plan, output)
        if plan.mechanism in FAMILY_MECHANISMS else
        _noise_aware_claim(public, plan, output) if plan.mechanism != "dp-psvi" else {
            "name": "dp-psvi",
            # The default summary's calibration by parametric bootstrap (dpsummary.bootstrap).
            "calibration": output.extra.get("calibration"),
            "noise_multiplier": plan.noise_multiplier,
            "sample_rate": plan.sample_rate,
            "steps": req.steps,
            "num_posterior_samples": req.num_samples,
            "clip_norm_rule": (f"{DEFAULT_CLIP_MULTIPLIER:g} x the {DEFAULT_CLIP_QUANTILE:g}-quantile of the L2 "
                               "norms of the centred log-likelihood vectors of "
                               f"{DEFAULT_NUM_REFERENCE} public synthetic records at each step (features "
                               "from the public schema, targets simulated at the prior mean)"),
            "noise": "OpenDP discrete Gaussian from OS entropy",
            "count_noise_multiplier": public.stage1.count_sigma,
            "preprocessing_noise_multiplier": public.stage1.schema_sigma,
            "quality_noise_multiplier": plan.quality_noise_multiplier,
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
        "data_quality": {
            "rules": pol.data_quality.model_dump(mode="json"),
            "counts": None if output.quality is None else output.quality.as_dict(),
        },
        "budget_split": output.budget_split,
        "public_inputs": pol.public_inputs(),
        "source_id": public.source_id,
    }
    body = {
        "format": "dpsummary.release/v1",
        "summary": output.summary.to_dict(),
        "feature_names": plan.transform.feature_names,
        "param_names": plan.model.param_names(plan.transform.feature_names),
        "software": software_versions(),
        # The session's start (before any record was read): no data-dependent run time.
        "created": public.started,
        "release_id": public.release_id,
    }
    if "calibration" in output.extra:
        # DP-PSVI: the default summary is the bootstrap-calibrated one (the claim's
        # mechanism.calibration says how); the uncalibrated pseudocoreset rides along for
        # analysts who ask (``dpsummary.load(..., posterior="raw")``).
        body["raw_summary"] = output.extra["raw_summary"].to_dict()
        body["posterior"] = {"default": "calibrated", "gaussians": {"calibrated": output.extra["calibration"]["gaussian"]}}
    elif output.extra and plan.mechanism != "dp-psvi":
        # The default (and only) summary is the noise-aware one; its Gaussian rides along. Since
        # issue 25 there is no raw (noise-unaware) summary; older artifacts that carry one still load.
        body["posterior"] = {"default": "noise_aware", "gaussians": output.extra["gaussians"]}
    if not _all_finite(body) or not _all_finite(claim):
        # Post-processing must be total (DEVELOPERS.md): a non-finite number in any summary is
        # decided on DP outputs and public values only, so it is a charged refusal, never a crash.
        raise ChargedRefusal(NON_FINITE_FIT_MESSAGE)
    return write_artifact(public.out, body, claim, public.ledger.private_key, public.key_info.keyid)


#: The ``non-finite-fit`` refusal (docs/REFUSALS.md): what to change when post-processing of the
#: DP outputs yields no finite summary.
NON_FINITE_FIT_MESSAGE = (
    "the noisy statistics gave no finite summary (the privacy noise overwhelmed them); raise --epsilon, "
    "or declare tighter public bounds (the target's upper bound) in the policy's schema"
)


def _all_finite(value: Any) -> bool:
    """True when every float inside ``value`` (nested dicts, lists, tuples) is finite."""
    if isinstance(value, float):
        return math.isfinite(value)
    if isinstance(value, dict):
        return all(_all_finite(v) for v in value.values())
    if isinstance(value, list | tuple):
        return all(_all_finite(v) for v in value)
    return True


def _noise_aware_claim(public: PublicPlan, plan: OptimisationPlan, output: Stage2Output) -> dict[str, Any]:
    from . import noise_aware

    ex = output.extra
    return {
        "name": noise_aware.MECHANISM,
        "description": ("rounds of DP Newton: at a public anchor (prior mean, then the previous round's "
                        "noise-aware mean) the sums over ALL records of per-record log-likelihood scores "
                        "(clipped to L2 score_bound) and curvatures (clipped to Frobenius curvature_bound, "
                        "upper triangle noised) are released by Gaussian mechanisms; the noise-aware "
                        "posterior of the last round (Kulkarni et al. 2021 style) is matched by the "
                        "pseudocoreset (post-processing)"),
        "single_gaussian_noise_multiplier": plan.noise_multiplier,
        "noise_multipliers": ex["noise_multipliers"],
        "schedule": ex["schedule"],
        "bounds_rule": ("public, from the schema: feature L2 norm bound sqrt(sum over numeric columns of "
                        "their scaled range^2 + number of categorical columns), target bound from the "
                        "target's declared range; per-model score/curvature bounds from "
                        "Model.statistic_bounds"),
        "bounds": ex["bounds"],
        "rounds": ex["rounds"],
        "sampling": "none (every record, every round)",
        "noise": "OpenDP discrete Gaussian from OS entropy",
        "count_noise_multiplier": public.stage1.count_sigma,
        "preprocessing_noise_multiplier": public.stage1.schema_sigma,
        "quality_noise_multiplier": plan.quality_noise_multiplier,
    }


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


def _budget_split(count_sigma, pre_sigma, quality_sigma, init_sigma, psvi_event, delta, accountant) -> dict[str, float]:
    """Standalone epsilon of each part (their naive sum bounds the composed total from above)."""
    from dp_accounting import dp_event as dpe

    from . import accounting as acc

    out = {"count": 0.0, "preprocessing": 0.0, "quality": 0.0, "initialisation": 0.0}
    for part, sig in (("count", count_sigma), ("preprocessing", pre_sigma), ("quality", quality_sigma),
                      ("initialisation", init_sigma)):
        if sig is not None:
            out[part] = acc.epsilon([dpe.GaussianDpEvent(sig)], delta, accountant)
    out["optimisation"] = acc.epsilon([psvi_event], delta, accountant)
    return out


# =============================================================================================
# Model families with their own stage-2 mechanism (extension point)
# =============================================================================================
@dataclass(frozen=True)
class FamilyMechanism:
    """A model family's stage-2 mechanism, plugged into :func:`run_release`.

    ``run_release`` keeps stages 0 and 1, both reservations, the ledger session, the signing and
    the commit; the family supplies only what differs:

    * ``check_public(req)``: refusals on the options alone (public, before any reservation;
      raise :class:`ReleaseError`);
    * ``check_schema(req, schema)``: refusals on a PUBLIC schema (before any reservation);
    * ``plan(public, released) -> OptimisationPlan``: model, transform, q and the noise
      multipliers calibrated with the accountant of record to the release's epsilon, from public
      or released values only (refuse with ``PolicyRefusal`` when stage 1 was empty, else
      :class:`ChargedRefusal`); ``plan.events`` is what the ledger reserves;
    * ``run(public, released, plan, source, *, progress, checkpoint) -> Stage2Output``: reads
      records only through ``source`` (:mod:`dpsummary.private`), runs exactly ``plan.events``;
    * ``claim(public, plan, output) -> dict``: the claim's ``mechanism`` block (public
      parameters only).

    ``models`` are the registry names that select the mechanism automatically (``--model``);
    the GLM mechanisms refuse them and this mechanism refuses every other model."""

    name: str
    models: frozenset[str]
    check_public: Callable[[ReleaseRequest], None]
    check_schema: Callable[[ReleaseRequest, Any], None]
    plan: Callable[[PublicPlan, Released], OptimisationPlan]
    run: Callable[..., Stage2Output]
    claim: Callable[[PublicPlan, OptimisationPlan, Stage2Output], dict[str, Any]]


def resolve_mechanism(req: ReleaseRequest) -> ReleaseRequest:
    """The request with its stage-2 mechanism fixed from the model (public, before anything
    else): a family's model gets its family mechanism, every other model ``noise-aware-newton``
    unless ``--mechanism`` says otherwise. A GLM mechanism for a family model, a family mechanism
    for another model, or family options without the family's model refuse (one line)."""
    import dataclasses

    family_of = {m: name for name, fam in FAMILY_MECHANISMS.items() for m in fam.models}
    own = family_of.get(req.model or "")
    mech = req.mechanism
    if own is not None:
        if mech is not None and mech != own:
            raise ReleaseError(f"--mechanism {mech} does not run --model {req.model}; "
                               f"--model {req.model} uses {own} (leave --mechanism out)")
        mech = own
    else:
        if mech in FAMILY_MECHANISMS:
            models = ", ".join(sorted(FAMILY_MECHANISMS[mech].models))
            raise ReleaseError(f"--mechanism {mech} is only for --model {models}; leave --mechanism out")
        if req.bnn_widths is not None:
            raise ReleaseError("--bnn-widths needs --model bnn")
        mech = mech if mech is not None else MECHANISMS[0]
    if req.components is not None and own != "dp-kd-tree":
        raise ReleaseError("--components needs --model gmm or --model dpgmm")
    return req if mech == req.mechanism else dataclasses.replace(req, mechanism=mech)


# ---- the Bayesian neural network family: dp-bb-psvi (dpsummary/private/bnn.py) -------------
#: Target kind -> BNN likelihood (categorical targets with more than two classes are not yet
#: encodable by the public transform; count targets have no BNN likelihood here).
BNN_LIKELIHOODS = {"binary": "bernoulli", "real": "gaussian"}
#: Public caps on the network (options are public; the caps bound the statistic's dimension).
BNN_MAX_LAYERS = 4
BNN_MAX_WIDTH = 512


def _bnn_widths(req: ReleaseRequest) -> tuple[int, ...]:
    from .private import bnn as pb

    return tuple(req.bnn_widths) if req.bnn_widths is not None else pb.DEFAULT_WIDTHS


def _bnn_check_public(req: ReleaseRequest) -> None:
    if req.engine != "local":
        raise ReleaseError("--model bnn runs on the local engine only; use --engine local")
    widths = _bnn_widths(req)
    if not (1 <= len(widths) <= BNN_MAX_LAYERS and all(1 <= int(w) <= BNN_MAX_WIDTH for w in widths)):
        raise ReleaseError(f"--bnn-widths must be 1 to {BNN_MAX_LAYERS} hidden widths, each in 1..{BNN_MAX_WIDTH}")


def _bnn_check_schema(req: ReleaseRequest, schema: Any) -> None:
    from . import data as dmod

    kind = dmod.target_kind(schema)
    if kind not in BNN_LIKELIHOODS:
        raise ReleaseError(f"--model bnn needs a binary or real target; the schema's target is {kind}; "
                           "choose another --model or fix the schema")


def plan_bnn(public: PublicPlan, released: Released) -> OptimisationPlan:
    """Stage-2 plan of ``dp-bb-psvi``: the network (public widths, ReLU, N(0, 1) prior,
    likelihood from the target kind), the public transform, q (default 200 / released count),
    the quality counts' noise as for the GLMs, and the noise multiplier of T Poisson-subsampled
    Gaussian steps calibrated so that everything composes to the release's epsilon."""
    from . import accounting as acc
    from . import data as dmod
    from .models.bnn import BNN
    from .private import bnn as pb
    from .private.noise import quantize_sample_rate

    req, pol, schema = public.req, public.policy, released.schema
    refuse: type[Refusal] = PolicyRefusal if public.stage1.events == [] else ChargedRefusal
    kind = dmod.target_kind(schema)
    pol.check_model("bnn")
    _check_released_count(public, released, refuse)
    if kind not in BNN_LIKELIHOODS:
        raise refuse(f"--model bnn needs a binary or real target; the target is {kind}; choose another --model")
    transform = dmod.Transform.from_schema(schema)
    model = BNN(transform.num_features, widths=_bnn_widths(req), likelihood=BNN_LIKELIHOODS[kind], activation="relu")
    if model.point_dim != transform.point_dim:
        raise refuse("model 'bnn' does not match the data's target; choose another --model")
    q = quantize_sample_rate(
        req.sample_rate if req.sample_rate is not None
        else min(1.0, DEFAULT_EXPECTED_BATCH / max(released.record_count, 1.0))
    )
    split = public.split  # no initialisation share: the start is public (plan_public)
    eps = req.epsilon
    quality_sigma, before = _quality_noise(public, split)
    slack = acc.selection_slack([public.delta_selection])
    sigma = acc.calibrate_noise_multiplier(
        target_epsilon=eps - slack, delta=public.delta, sample_rate=q, steps=req.steps,
        prior_events=before, accountant=public.accountant,
    )
    settings = {
        "clip_norm": pb.DEFAULT_CLIP_NORM, "outer_samples": pb.DEFAULT_OUTER_SAMPLES,
        "inner_steps": pb.DEFAULT_INNER_STEPS, "warmup_steps": pb.DEFAULT_WARMUP_STEPS,
        "points_lr": pb.DEFAULT_POINTS_LR, "weights_lr": pb.DEFAULT_WEIGHTS_LR,
    }
    return OptimisationPlan(model, transform, q, sigma, None, None, quality_sigma, req.steps,
                            mechanism=pb.MECHANISM, settings=settings)


def run_bnn_stage2(
    public: PublicPlan,
    released: Released,
    plan: OptimisationPlan,
    source: Any,
    *,
    progress: ProgressFn | None = None,
    checkpoint: CheckpointFn | None = None,
) -> Stage2Output:
    """Stage 2 of ``dp-bb-psvi`` (reads records, charged): total encoding, the noisy quality
    counts and the data-quality refusal (as for the GLMs), then DP BB-PSVI
    (:func:`dpsummary.private.bnn.fit_private`) on the encoded
    :class:`~dpsummary.private.mechanism.PrivateRecords` from the public start."""

    import torch

    from .blackbox.objective import InnerConfig
    from .constructors.base import Summary
    from .private import bnn as pb

    mark = checkpoint or (lambda _name: None)
    req = public.req
    begun = _begin_stage2(public, released, plan, source, mark)
    encoded, notes, record_count = begun.encoded, begun.notes, begun.record_count
    nonpriv = torch.Generator().manual_seed(req.seed if req.seed is not None else secrets.randbits(63))
    model, st = plan.model, plan.settings
    initial = pb.public_init_from_schema(model, req.size, nonpriv, plan.transform.sample_public_features)
    notes.append("initial pseudopoints from public information only (features uniform over the policy's "
                 "bounds and categories, labels uniform)")
    mark("initialised")
    fit = pb.fit_private(
        encoded.records, model, size=req.size, steps=plan.steps, sample_rate=plan.sample_rate,
        noise_multiplier=plan.noise_multiplier, clip_norm=st["clip_norm"], record_count=record_count,
        initial_points=initial, generator=nonpriv, inner=InnerConfig(steps=st["inner_steps"]),
        outer_samples=st["outer_samples"], warmup_steps=st["warmup_steps"], points_lr=st["points_lr"],
        weights_lr=st["weights_lr"], progress=progress,
    )
    mark("optimised")
    summary = Summary(fit.points, fit.weights, model, pb.MECHANISM, plan.transform.to_dict(),
                      {"variational": {"family": "mean-field Gaussian, sd = softplus(rho)",
                                       "mu": fit.mu.tolist(), "rho": fit.rho.tolist()}})
    return _finish_stage2(public, plan, begun, summary)


def _bnn_claim(public: PublicPlan, plan: OptimisationPlan, output: Stage2Output) -> dict[str, Any]:
    from .models.bnn import BNN
    from .private import bnn as pb

    model = plan.model
    assert isinstance(model, BNN)
    st = plan.settings
    return {
        "name": pb.MECHANISM,
        "description": ("differentially private black-box PSVI (Manousakas, Ritter, Karaletsos 2022, "
                        "extended): at each of T steps every record is Poisson-sampled with rate q, its "
                        "statistic [log p(x|theta_k), grad_theta log p(x|theta_k)]_{k=1..K} at K public "
                        "draws of the coreset's variational posterior is divided by C and clipped to L2 norm 1, "
                        "the exact fixed-point sum gets Gaussian noise of sd sigma once and is multiplied "
                        "by C; the coreset takes an Adam step on the surrogate outer gradient "
                        "(post-processing)"),
        "noise_multiplier": plan.noise_multiplier,
        "sample_rate": plan.sample_rate,
        "steps": plan.steps,
        "clip_norm": st["clip_norm"],
        "statistic_dimension": st["outer_samples"] * (model.param_dim + 1),
        "outer_samples": st["outer_samples"],
        "inner": {"steps": st["inner_steps"], "warmup_steps": st["warmup_steps"]},
        "learning_rates": {"points": st["points_lr"], "weights": st["weights_lr"]},
        "network": {"widths": list(model.widths), "activation": model.activation, "likelihood": model.likelihood,
                    "prior": {"family": "normal", "mean": 0.0, "scale": model.prior_scale}},
        "initialisation": ("public: features uniform over the policy's bounds and categories, labels uniform "
                           "(Bernoulli) or 0 (Gaussian); no privacy cost"),
        "noise": "OpenDP discrete Gaussian from OS entropy",
        "count_noise_multiplier": public.stage1.count_sigma,
        "preprocessing_noise_multiplier": public.stage1.schema_sigma,
        "quality_noise_multiplier": plan.quality_noise_multiplier,
    }


# ---- Gaussian mixtures: the noisy kd-tree (``--model gmm|dpgmm``, mechanism ``dp-kd-tree``) ----
#: Public defaults and caps of a mixture release (docs/MIXTURES.md, "The private release").
MIXTURE_DEFAULT_COMPONENTS = 10
MIXTURE_MAX_COMPONENTS = 50
#: The mixture's space: each numeric column's public bounds map onto [-BOUND, BOUND]
#: (``z = BOUND (x - centre) / half_range``), the noisy kd-tree's public box
#: (:data:`dpsummary.private.mixture.DEFAULT_BOUND`).
MIXTURE_BOUND = 4.0
#: Public cap on the released pseudo-points weighted CAVI is run on (post-processing cost only;
#: a larger release keeps the points of the leaves with the largest noisy counts for the fit,
#: all of them stay in the artifact).
MIXTURE_FIT_MAX_POINTS = 20000
#: The public prior of the published fit (the benchmarks' prior, docs/MIXTURES.md): component
#: covariance scale 0.01 of the unit box, mean 0, one degree of freedom more than D - 1.
MIXTURE_PRIOR_COVARIANCE = 0.01


#: The registry names a mixture release serves.
MIXTURE_MODELS = frozenset({"gmm", "dpgmm"})


def _mixture_columns(schema: Any) -> list[str]:
    """The columns a mixture release models: every numeric column (with its public bounds; a
    target included: a mixture models the columns jointly). Categorical columns are not
    Gaussian and are left out."""
    return [col.name for col in schema.columns if col.kind == "numeric"]


def _mixture_transform(req: ReleaseRequest, schema: Any) -> Any:
    """The public transform of a mixture release: the numeric columns only, no target, each
    column's public bounds mapped onto the kd-tree's box ``[-MIXTURE_BOUND, MIXTURE_BOUND]``
    (``z = MIXTURE_BOUND (x - centre) / half_range``; values outside the bounds are clipped, the
    total per-record rule of :class:`~dpsummary.data.Transform`). Pseudo-points live in this
    space. A numeric column without public bounds is a one-line refusal (:class:`ReleaseError`;
    the caller re-raises it with its own kind)."""
    import dataclasses

    from .data import DataError, Schema, Transform

    columns = [c.model_copy(update={"positive": None}) for c in schema.columns if c.kind == "numeric"]
    if not columns:
        raise ReleaseError(f"--model {req.model} needs at least one numeric column; the schema has none")
    try:
        base = Transform.from_schema(Schema(columns=columns, target=None))
    except DataError as exc:
        raise ReleaseError(f"--model {req.model}: {exc}") from None
    return dataclasses.replace(base, scales={k: v / MIXTURE_BOUND for k, v in base.scales.items()})


def _mixture_check_public(req: ReleaseRequest) -> None:
    if req.target is not None:
        raise ReleaseError(f"--target has no meaning for --model {req.model} (a mixture models the numeric "
                           "columns jointly); leave it out")
    if req.engine != "local":
        raise ReleaseError(f"--model {req.model} runs on the local engine only; use --engine local")
    k = req.components if req.components is not None else MIXTURE_DEFAULT_COMPONENTS
    if not 1 <= k <= MIXTURE_MAX_COMPONENTS:
        raise ReleaseError(f"--components must lie in 1..{MIXTURE_MAX_COMPONENTS}")


def _mixture_check_schema(req: ReleaseRequest, schema: Any) -> None:
    if not _mixture_columns(schema):
        raise ReleaseError(f"--model {req.model} needs at least one numeric column with public bounds in the "
                           "schema; declare lower and upper, or choose another --model")
    _mixture_transform(req, schema)


def plan_mixture(public: PublicPlan, released: Released) -> OptimisationPlan:
    """Stage-2 plan of ``dp-kd-tree``: the numeric columns (public bounds mapped onto the
    kd-tree's box), the tree's public design (depth min(6 D, 36), split at 3 sigma, keep at 2
    sigma; :func:`dpsummary.private.mixture.default_max_depth`) and its noise multiplier,
    calibrated with the accountant of record so that everything composes to the release's
    epsilon. Nothing here reads a record."""
    from dp_accounting import dp_event as dpe

    from . import accounting as acc
    from .models.gmm import mixture_model
    from .private import mixture as pm

    req, pol, schema = public.req, public.policy, released.schema
    refuse: type[Refusal] = PolicyRefusal if public.stage1.events == [] else ChargedRefusal
    assert req.model is not None
    pol.check_model(req.model)
    _check_released_count(public, released, refuse)
    columns = _mixture_columns(schema)
    if not columns:
        raise refuse(f"--model {req.model} needs at least one numeric column; the schema has none; choose "
                     "another --model")
    try:
        transform = _mixture_transform(req, schema)
    except ReleaseError as exc:
        raise refuse(str(exc)) from None
    k = req.components if req.components is not None else MIXTURE_DEFAULT_COMPONENTS
    process: Literal["dirichlet_process", "dirichlet_distribution"] = (
        "dirichlet_process" if req.model == "dpgmm" else "dirichlet_distribution")
    model = mixture_model(len(columns), n_components=k, process=process)
    split = public.split
    eps = req.epsilon
    quality_sigma, before = _quality_noise(public, split)
    depth = pm.default_max_depth(len(columns))
    slack = acc.selection_slack([public.delta_selection])
    sigma = acc.calibrate_noise_multiplier(target_epsilon=eps - slack, delta=public.delta, sample_rate=1.0,
                                           steps=depth + 1, prior_events=before, accountant=public.accountant)
    tree = pm.TreePlan(dim=len(columns), bound=MIXTURE_BOUND, max_depth=depth, noise_multiplier=sigma)
    event = dpe.SelfComposedDpEvent(dpe.GaussianDpEvent(sigma), depth + 1)
    settings = {"columns": columns, "tree": tree, "process": process, "components": k}
    return OptimisationPlan(model, transform, 1.0, sigma, None, None, quality_sigma, depth + 1,
                            mechanism="dp-kd-tree", settings=settings, event=event)


def run_mixture_stage2(
    public: PublicPlan,
    released: Released,
    plan: OptimisationPlan,
    source: Any,
    *,
    progress: ProgressFn | None = None,
    checkpoint: CheckpointFn | None = None,
) -> Stage2Output:
    """Stage 2 of ``dp-kd-tree`` (reads records, charged): total encoding, the noisy quality
    counts and the data-quality refusal (as for the GLMs), the numeric columns mapped by their
    public bounds onto the tree's box (:meth:`PrivateRecords.select_columns`), the noisy kd-tree
    (:func:`dpsummary.private.mixture.release_mixture_summary`), then weighted CAVI on the
    released pseudo-points with a public prior (post-processing)."""

    import numpy as np
    import torch

    from .constructors.base import Summary
    from .mixtures.vi import MixturePrior, fit_cavi
    from .private import mixture as pm

    mark = checkpoint or (lambda _name: None)
    req = public.req
    begun = _begin_stage2(public, released, plan, source, mark)
    encoded, notes = begun.encoded, begun.notes
    columns = plan.settings["columns"]
    mark("initialised")
    # The records are already in the tree's box (the mixture transform maps bounds onto it).
    rel = pm.release_mixture_summary(encoded.records, plan=plan.settings["tree"])
    if progress is not None:
        progress(plan.steps, plan.steps)
    mark("optimised")
    model = plan.model
    d, k = len(columns), plan.settings["components"]
    components: dict[str, Any] | None = None
    if rel.weights.shape[0]:
        # Weighted CAVI on the released pseudo-points (post-processing): public prior, public or
        # OS-random start. A very large release is fitted on its heaviest leaves (a public cap on
        # the cost; the artifact keeps every point).
        seed = req.seed if req.seed is not None else secrets.randbits(63)
        order = np.argsort(-rel.weights, kind="stable")[:MIXTURE_FIT_MAX_POINTS]
        prior = MixturePrior(process=plan.settings["process"], n_components=k, weight_concentration=1.0 / k,
                             mean_precision=1.0, mean=np.zeros(d), degrees_of_freedom=float(d),
                             covariance=MIXTURE_PRIOR_COVARIANCE * np.eye(d))
        fit = fit_cavi(rel.points[order], rel.weights[order], prior, np.random.default_rng(seed)).posterior
        components = _mixture_components(fit, plan.transform, columns)
        notes.append(f"mixture fitted by weighted CAVI on the released pseudo-points ({len(components['weights'])} "
                     "components above 0.1% of the mass)")
    else:
        notes.append("every kd-tree leaf fell below the public keep threshold: the release holds no pseudo-point "
                     "(too few records for this epsilon)")
    summary = Summary(torch.from_numpy(np.ascontiguousarray(rel.points)), torch.from_numpy(rel.weights.copy()),
                      model, "dp-kd-tree", plan.transform.to_dict(),
                      {"space": ("the transform's model space: z = (x - centre) / scale per numeric column, "
                                 f"the public bounds mapped onto [-{MIXTURE_BOUND:g}, {MIXTURE_BOUND:g}]"),
                       "tree": {"leaves": rel.notes.get("leaves"),
                                "released_per_depth": rel.notes.get("released_per_depth")},
                       "mixture": components})
    return _finish_stage2(public, plan, begun, summary)


def _mixture_components(fit: Any, transform: Any, columns: list[str]) -> dict[str, Any]:
    """The fitted mixture in the CSV's units (components above 0.1% of the mass)."""
    import numpy as np

    centres = np.array([transform.centres[c] for c in columns])
    unit = np.array([transform.scales[c] for c in columns])
    weights = fit.expected_weights()
    keep = np.flatnonzero(weights > 1e-3)
    means = fit.means[keep] * unit + centres
    covs = fit.covariances()[keep] * np.outer(unit, unit)
    return {"columns": columns, "weights": weights[keep].tolist(), "means": means.tolist(),
            "covariances": covs.tolist()}


def _mixture_claim(public: PublicPlan, plan: OptimisationPlan, output: Stage2Output) -> dict[str, Any]:
    tree = plan.settings["tree"]
    return {
        "name": "dp-kd-tree",
        "description": ("noisy adaptive kd-tree (a Gaussian-noise, fixed-depth relative of PrivTree, Zhang, Xiao "
                        "and Xie 2016): the public box of the numeric columns (public bounds mapped onto "
                        f"[-{MIXTURE_BOUND:g}, {MIXTURE_BOUND:g}]) is split at midpoints cycling over the columns; "
                        "at each depth the counts of the released nodes get Gaussian noise of sd sigma once "
                        "(each record lies in one node per depth: L2 sensitivity 1), a node is split iff its noisy "
                        "count is at least split_threshold x sigma, kept leaves (noisy count at least "
                        "keep_threshold x sigma) become 2D weighted pseudo-points with the cell's mean and "
                        "covariance; weighted CAVI on them is post-processing"),
        "noise_multiplier": plan.noise_multiplier,
        "levels": tree.max_depth + 1,
        "max_depth": tree.max_depth,
        "split_threshold": tree.split_threshold,
        "keep_threshold": tree.keep_threshold,
        "bound": tree.bound,
        "columns": plan.settings["columns"],
        "model": {"name": plan.model.name, "components": plan.settings["components"],
                  "process": plan.settings["process"],
                  "prior": {"weight_concentration": 1.0 / plan.settings["components"], "mean_precision": 1.0,
                            "mean": 0.0, "degrees_of_freedom": len(plan.settings["columns"]),
                            "covariance": f"{MIXTURE_PRIOR_COVARIANCE:g} I (in the box's units)"}},
        "noise": "OpenDP discrete Gaussian from OS entropy",
        "count_noise_multiplier": public.stage1.count_sigma,
        "preprocessing_noise_multiplier": public.stage1.schema_sigma,
        "quality_noise_multiplier": plan.quality_noise_multiplier,
    }


FAMILY_MECHANISMS: dict[str, FamilyMechanism] = {
    "dp-bb-psvi": FamilyMechanism(
        name="dp-bb-psvi", models=frozenset({"bnn"}), check_public=_bnn_check_public,
        check_schema=_bnn_check_schema, plan=plan_bnn, run=run_bnn_stage2, claim=_bnn_claim,
    ),
    "dp-kd-tree": FamilyMechanism(
        name="dp-kd-tree", models=MIXTURE_MODELS, check_public=_mixture_check_public,
        check_schema=_mixture_check_schema, plan=plan_mixture, run=run_mixture_stage2, claim=_mixture_claim,
    ),
}
