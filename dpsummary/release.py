"""The private release: ``dpsummary release --epsilon 0.2 data.csv``, end to end.

:func:`run_release` is a pipeline of named stages; each takes explicit inputs and returns explicit
outputs, and only the stages marked *reads records* touch the private file, always after the
ledger has reserved the budget of every mechanism they run. The pipeline names no mechanism: the
stage-2 mechanism (``--mechanism``, or the one ``--model`` selects) is an entry of
:data:`dpsummary.mechanisms.REGISTRY` behind one interface
(:class:`~dpsummary.mechanisms.base.Mechanism`, docs/MECHANISMS.md): it plans from public values
and declares its privacy events, runs on the encoded records and writes its claim section. The
records a mechanism receives (:class:`~dpsummary.plan.ReleaseRequest`,
:class:`~dpsummary.plan.PublicPlan`, :class:`~dpsummary.plan.Released`) live in
:mod:`dpsummary.plan`, below both this module and the mechanisms, which never import it.

====  ===========================  ===================================================  ==========
 #    stage                        what                                                 charged
====  ===========================  ===================================================  ==========
 0    :func:`plan_public`          options, policy, delta, budget split, stage-1        nothing
                                   noise, key, ledger, the file's header, the
                                   mechanism's public checks (public facts only)
 1    reserve stage 1              count/schema events + a hold on the rest of epsilon  yes
 1a   :func:`read_source`          *reads records* through the total per-record rules   -
 1b   :func:`run_stage1`           *reads records*: DP record count, DP schema          stage 1
 1c   :func:`choose_mechanism`     the default GLM mechanism from public or released    -
                                   values (``noise-aware-cells`` on a small public
                                   discrete domain with records enough per cell)
 2    :func:`plan_stage2`          the mechanism's plan from public or released         -
                                   values, with its declared events; refusals here
                                   are DP-decided
 3    reserve stage 2              the declared events (quality counts, mechanism)      yes
 3a   :func:`run_stage2`           *reads records*: total encoding, noisy quality       stage 2
                                   counts (data-quality refusal), the mechanism's run
 3b   ``Mechanism.postprocess``    with the record store closed (no privacy cost)       -
 4    :func:`write_release`        claim, signed artifact (atomic), ledger commit       -
====  ===========================  ===================================================  ==========

With a public record count and schema, stage 1 is empty and one reservation covers everything.
The ledger session (:meth:`dpsummary.ledger.Ledger.session`) settles every reservation and hold
on every exit path: a refusal or crash after a reservation leaves its events charged and its
hold released. Every time the release publishes (ledger entries, the artifact's ``created``) is
the session's start, taken before any record is read.

Refusals (docs/REFUSALS.md): before stage 1 only public facts refuse
(:class:`~dpsummary.errors.ReleaseError`, :class:`~dpsummary.policy.PolicyError`, the ledger's
budget); after it, only DP outputs do (:class:`ChargedRefusal`), and the reservation stays charged.
"""

from __future__ import annotations

import contextlib
import dataclasses
import datetime as _dt
import math
import os
import platform
import secrets
from dataclasses import dataclass, field
from pathlib import Path
from typing import TYPE_CHECKING, Any

from . import __version__
from .errors import DATA_NOT_FOUND_FIX, NOT_A_FILE_FIX, ChargedRefusal, PolicyRefusal, ReleaseError
from .mechanisms import REGISTRY
from .mechanisms.base import (
    NON_FINITE_FIT_FIX,
    NON_FINITE_FIT_MESSAGE,
    CheckpointFn,
    Mechanism,
    MechanismOutput,
    MechanismPlan,
    NoticeFn,
    ProgressFn,
    all_finite,
)
from .model_names import BINARY_MODELS
from .plan import PublicPlan, Released, ReleaseRequest, Stage1Plan
from .postprocess.quality import QUALITY_REFUSAL_SDS

if TYPE_CHECKING:
    from .accounting import Accountant

#: Share of a release's delta given to the partition selection of DP schema estimation.
DELTA_SELECTION_SHARE = 0.1

#: The stage boundaries :func:`run_release` reports to its ``checkpoint`` callback, in order
#: (tests raise from it to check that every exit path settles the ledger).
CHECKPOINTS = ("planned-public", "reserved-stage1", "read", "stage1", "planned-stage2", "reserved-stage2",
               "encoded", "quality", "initialised", "optimised", "written")


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
    mechanism: str = ""

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


#: The fix of a charged refusal of the DP schema estimate that names none of its own.
SCHEMA_ESTIMATE_FIX = ("declare the schema in the policy instead of estimating it (`dpsummary policy init DATA` "
                       "writes a skeleton from the header)")
#: Header columns named in the fix of an unknown ``--target`` (a wide header is cut there).
TARGET_COLUMNS_SHOWN = 30


def unknown_target(target: str, header: list[str]) -> ReleaseError:
    """The refusal of a ``--target`` that is not a column of the header (public): its fix names
    the closest column (difflib) and lists the header's columns, which are public."""
    import difflib

    close = difflib.get_close_matches(target, header, n=1)
    shown = ", ".join(header[:TARGET_COLUMNS_SHOWN])
    more = f", ... ({len(header) - TARGET_COLUMNS_SHOWN} more)" if len(header) > TARGET_COLUMNS_SHOWN else ""
    hint = f"did you mean --target {close[0]}? " if close else ""
    return ReleaseError(f"target column {target!r} is not in the data's header",
                        fix=f"{hint}pass one of the header's columns: {shown}{more}")


def _check_request(req: ReleaseRequest) -> None:
    """Public checks of the options, of the file's existence and of the output path (no record
    is read, nothing heavy is imported): an existing artifact is refused unless ``force``."""
    if not (isinstance(req.epsilon, float | int) and math.isfinite(req.epsilon) and req.epsilon > 0):
        raise ReleaseError("--epsilon must be a positive, finite number", fix="pass e.g. --epsilon 1")
    if req.delta is not None and not (0 < req.delta < 1):
        raise ReleaseError("--delta must lie in (0, 1)", fix="pass e.g. --delta 1e-6, or leave --delta out for the policy's")
    if req.size < 1:
        raise ReleaseError("--size must be at least 1", fix="pass --size 1 or more")
    if req.steps < 1:
        raise ReleaseError("--steps must be at least 1", fix="pass --steps 1 or more")
    if req.num_samples < 2:
        raise ReleaseError("--num-samples must be at least 2", fix="pass --num-samples 2 or more")
    if req.sample_rate is not None and not (0 < req.sample_rate <= 1):
        raise ReleaseError("--sample-rate must lie in (0, 1]", fix="pass e.g. --sample-rate 0.01, or leave it out")
    if req.mechanism not in REGISTRY:
        raise ReleaseError(f"unknown --mechanism {req.mechanism}",
                           fix=f"choose one of {', '.join(REGISTRY)}, or leave --mechanism out")
    if req.positive_class is not None:
        if not req.positive_class or req.positive_class != req.positive_class.strip():
            raise ReleaseError("--positive-class must be a non-empty value without surrounding whitespace",
                               fix="pass the class exactly as it is written in the data")
        if req.model not in (None, *BINARY_MODELS):
            raise ReleaseError(f"--positive-class needs a binary target, and --model {req.model} takes another "
                               "target", fix=f"pass --model {' or '.join(BINARY_MODELS)} (or leave --model out), or "
                               "drop --positive-class")
    if not req.data.exists():
        raise ReleaseError(f"data file not found: {req.data}", fix=DATA_NOT_FOUND_FIX)
    if req.engine not in ("local", "spark"):
        raise ReleaseError(f"unknown --engine {req.engine}", fix="pass --engine local or --engine spark")
    if not (req.data.is_file() or (req.engine == "spark" and req.data.is_dir())):
        raise ReleaseError(f"not a file: {req.data}", fix=NOT_A_FILE_FIX)
    out = default_out(req)
    if out.resolve() == req.data.resolve():
        raise ReleaseError(f"--out {out} is the data file itself", fix="choose another --out")
    if out.is_dir():
        raise ReleaseError(f"--out {out} is a directory", fix="give a file path")
    if out.exists() and not req.force:
        raise ReleaseError(f"{out} already exists (a published artifact is never replaced silently)",
                           fix="pass --force to replace it, or --out to write elsewhere")
    # Where the artifact goes is a public fact: refuse here, before the budget is charged, rather
    # than after the mechanism ran (the default path sits beside the data, which may be a
    # read-only shared directory).
    folder = out.resolve().parent
    if not folder.is_dir():
        raise ReleaseError(f"--out {out}: the folder {folder} does not exist",
                           fix="create it or choose another --out")
    if not os.access(folder, os.W_OK | os.X_OK):
        raise ReleaseError(f"cannot write the artifact into {folder} (not writable)",
                           fix="pass --out with a writable path")


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
    mechanism = mechanism_of(public)
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
        public = choose_mechanism(public, released, say)
        mechanism = mechanism_of(public)
        plan = plan_stage2(public, released)
        mark("planned-stage2")
        stage2 = session.reserve(events=plan.events, delta=public.delta, stage=plan.mechanism)
        mark("reserved-stage2")
        if source is None:
            source = opened.enter_context(read_source(req.data, req))
            mark("read")
        output = run_stage2(public, released, plan, source, progress=progress, checkpoint=mark)
        source.close()
        # Stage 3b: post-processing with the record store closed (DP-PSVI's parametric bootstrap).
        output = dataclasses.replace(output, result=mechanism.postprocess(public, output.result, progress=progress,
                                                                          notice=say))
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
    # After the last read of the ledger (spent) and of the artifact: their file times are the
    # recorded start again (a read moves the access time to now; issue 47).
    from .artifact import stamp_published_time

    stamp_published_time((public.out, public.ledger_path), public.started)
    return ReleaseResult(
        out=public.out, artifact_digest=digest, source_id=public.source_id, epsilons=output.epsilons,
        delta=public.delta_total, noise_multiplier=plan.noise_multiplier, sample_rate=plan.sample_rate,
        steps=plan.steps, size=output.summary.size, budget_split=output.budget_split,
        composed_total=spent.composed, naive_total=spent.naive_sum, notes=[*released.notes, *output.notes],
        key_created=public.key_created, ledger=public.ledger_path, policy=public.policy_name,
        mechanism=plan.mechanism,
    )


# ---- stage 0: public planning ----------------------------------------------------------------
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
    by_default = req.mechanism is None and not any(req.model in m.models for m in REGISTRY.values())
    req = resolve_mechanism(req)
    _check_request(req)
    if req.engine != "spark":
        # The header line only, by the light reader, before the policy (whose validation imports
        # the model registry, hence torch): a target absent from the file is refused either way.
        header = read_header(req.data)
        if req.target is not None and req.target not in header:
            raise unknown_target(req.target, header)
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
            f"--calibrate-to {req.calibrate_to} differs from the policy's accountant of record {pol.accountant}",
            fix=f"set accountant = \"{req.calibrate_to}\" in the policy instead")
    accountant: Accountant = pol.accountant
    delta_total = pol.resolve_delta(req.delta)
    if req.epsilon > pol.max_epsilon_per_release:
        raise PolicyRefusal(
            f"epsilon {req.epsilon:g} exceeds the policy's per-release cap {pol.max_epsilon_per_release:g}",
            fix="lower --epsilon or raise max_epsilon_per_release in the policy")
    source_id = pol.source_id or pmod.source_id_from_path(req.data)
    if pol.source_id is None:
        say(f"budget attaches to data source {source_id!r} (derived from the file name; "
            "set source_id in the policy to name it)")
    if req.model is not None:
        pol.check_model(req.model)
    mechanism = REGISTRY[req.mechanism or ""]
    mechanism.check_public(req, None)  # the mechanism's refusals on the options alone
    if req.engine not in mechanism.engines:
        raise ReleaseError(f"--mechanism {mechanism.name} runs on --engine {' or '.join(mechanism.engines)} only",
                           fix=f"pass --engine {mechanism.engines[0]}, or choose another --mechanism")
    if accountant not in mechanism.accountants:
        raise PolicyRefusal(f"--mechanism {mechanism.name} is accounted by the {' or '.join(mechanism.accountants)} "
                            f"accountant only; the policy's accountant of record is {accountant}",
                            fix=f"set accountant = \"{mechanism.accountants[0]}\" in the policy, or choose another --mechanism")
    if req.engine == "spark":
        from .spark.session import public_header

        header = public_header(req.data, pol)  # public checks of --engine spark (metadata only)
    schema_public = pol.data_schema is not None
    if schema_public and req.positive_class is not None:
        raise ReleaseError("--positive-class is for a release without a public schema; the policy declares one",
                           fix="name the class there: positive = \"...\" on its target column")
    if schema_public:
        missing = [c.name for c in pol.data_schema.columns if c.name not in header]
        if missing:
            raise ReleaseError(f"the data has no column {missing[0]!r} named in the policy's schema",
                               fix="fix the header or the policy's schema (`dpsummary policy init DATA` writes a "
                               "schema skeleton from the header)")
        mechanism.check_public(req, pol.data_schema)
    elif mechanism.requires_public_schema:
        raise ReleaseError(f"{mechanism.name} needs a public schema (it reads its domain from the schema)",
                           fix="declare a schema in the policy ([schema]; `dpsummary policy init DATA` writes a "
                           "skeleton), or use --mechanism noise-aware-newton")
    elif req.target is not None and req.target not in header:
        raise unknown_target(req.target, header)

    # Every public refusal above is decided; the accountants (dp_accounting, scipy) load here.
    from . import accounting as acc
    from .ledger import Ledger

    key_info, key_created = keys.resolve_signing_key(req.key)
    if key_created:
        say(f"created a new signing key: {key_info.private_path} (public key {key_info.public_path})")
    ledger_path = req.ledger or pol.ledger_path() or keys.default_home() / "ledger.jsonl"
    ledger = Ledger(ledger_path, keys.load_private_key(key_info.private_path), key_info.keyid)

    count_public = pol.record_count_public
    split = pol.budget_split.normalised(count=not count_public, preprocessing=not schema_public,
                                        initialisation="initialisation" in mechanism.budget_parts(req))
    # DP schema estimation selects categories by thresholding noisy counts, which spends a little
    # delta outside its Gaussian event (partition selection): a tenth of this release's delta.
    delta_selection = 0.0 if schema_public else DELTA_SELECTION_SHARE * delta_total
    delta = delta_total - delta_selection
    events: list[Any] = []
    try:
        count_sigma, schema_sigma, events = stage1_noise(split, epsilon=req.epsilon, delta=delta,
                                                         count_public=count_public, schema_public=schema_public)
        # The parts are sized by the Gaussian's exact privacy profile (accounting.calibrate_part),
        # which certifies any epsilon; the
        # accountant of record must still certify the whole release. A plain Gaussian at the whole
        # epsilon after the parts is the least any mechanism adds: if the accountant of record
        # cannot calibrate even that, no mechanism can run, so refuse now, before any charge.
        acc.calibrate_gaussian(target_epsilon=req.epsilon, delta=delta, prior_events=events, accountant=accountant)
    except ValueError as exc:
        # Public facts only (epsilon, the policy's split and delta): refused before any charge.
        raise PolicyRefusal(
            f"--epsilon {req.epsilon:g} is too small for the policy at delta {delta:.3g}: the {accountant} "
            f"accountant cannot certify it ({exc})",
            fix="raise --epsilon, or raise the policy's delta (a smaller n_max)") from exc
    release_id = secrets.token_hex(8)
    # No hash of the input file anywhere (issue 24): the ledger binds the release to its
    # artifact's digest (commit entry), post-processing of released values.
    return PublicPlan(
        req=req, policy=pol, policy_name=policy_name, accountant=accountant, delta_total=delta_total,
        delta=delta, delta_selection=delta_selection, split=split,
        stage1=Stage1Plan(events, count_sigma, schema_sigma), source_id=source_id, release_id=release_id,
        started=started, ledger=ledger, ledger_path=ledger_path, key_info=key_info,
        key_created=key_info.private_path if key_created else None,
        out=default_out(req), header=header, mechanism_by_default=by_default,
    )


# ---- stage 1: record count and schema ------------------------------------------------------
def read_source(path: Path, req: ReleaseRequest | None = None) -> Any:
    """Open the private file through the total per-record rules (after a reservation); with
    ``--engine spark`` a :class:`~dpsummary.private.spark_engine.SparkSource` (same interface)."""
    if req is not None and req.engine == "spark":
        from .spark.launch import open_spark_source
        from .spark.session import SparkOptions

        return open_spark_source(path, req.spark or SparkOptions(), steps=req.steps)
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

            # A mechanism whose model has no target (a mixture) looks for no target column.
            target = public.req.target if mechanism_of(public).uses_target else NO_TARGET
            est = source.estimate_schema(noise_multiplier=plan.schema_sigma, target=target,
                                         delta=public.delta_selection,
                                         target_classes=2 if public.req.model == "logistic" else None,
                                         count_target=public.req.model == "poisson",
                                         public_target=public_target_spec(public))
        except DataError as exc:
            # The DP schema estimate refused (decided on noisy counts); a public schema avoids it.
            raise ChargedRefusal(exc.problem, fix=exc.fix or SCHEMA_ESTIMATE_FIX) from None
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


def public_inputs(public: PublicPlan) -> dict[str, Any]:
    """The public facts the release relied on (the claim's ``public_inputs``): the policy's, plus
    the target's spec when ``--positive-class`` made it public."""
    inputs = public.policy.public_inputs()
    spec = public_target_spec(public)
    if spec is not None:
        inputs["target"] = spec.model_dump(mode="json", exclude_defaults=True)
    return inputs


def public_target_spec(public: PublicPlan) -> Any:
    """The target's public :class:`~dpsummary.data.ColumnSpec` from ``--positive-class`` (that
    class is 1, every other non-missing value 0), or ``None`` (the target is estimated)."""
    from .data import ColumnSpec

    cls = public.req.positive_class
    if cls is None:
        return None
    name = public.req.target if public.req.target is not None else public.header[-1]
    return ColumnSpec(name=name, kind="categorical", categories=[cls], other_class=True, positive=cls)


def stage1_noise(split: dict[str, float], *, epsilon: float, delta: float, count_public: bool,
                 schema_public: bool) -> tuple[float | None, float | None, list[Any]]:
    """Stage 1's noise multipliers (record count, DP schema; None when public) and their events,
    from public values only: each part calibrated as the cumulative composed epsilon of the
    budget split's shares (:func:`dpsummary.accounting.calibrate_part`). Raises ``ValueError``
    when a part cannot be calibrated."""
    from dp_accounting import dp_event as dpe

    from . import accounting as acc

    events: list[Any] = []
    count_sigma = schema_sigma = None
    if not count_public:
        count_sigma = acc.calibrate_part(target_epsilon=split["count"] * epsilon, delta=delta)
        events.append(dpe.GaussianDpEvent(count_sigma))
    if not schema_public:
        schema_sigma = acc.calibrate_part(target_epsilon=(split["count"] + split["preprocessing"]) * epsilon,
                                          delta=delta, prior_events=events)
        events.append(dpe.GaussianDpEvent(schema_sigma))
    return count_sigma, schema_sigma, events


# ---- stage 1c: the default GLM mechanism ----------------------------------------------------
def choose_mechanism(public: PublicPlan, released: Released, say: NoticeFn) -> PublicPlan:
    """Stage 1c. ``public`` with ``noise-aware-cells`` as its mechanism when the request left the
    mechanism to the default and the cells' public rule says they pay
    (:func:`dpsummary.mechanisms.noise_aware_cells.cells_pay`: the policy's public schema is a
    small discrete domain and the record count, public or stage 1's DP count, gives at least
    :data:`~dpsummary.mechanisms.noise_aware_cells.RECORDS_PER_CELL_SDS` records per cell in
    units of a cell count's noise sd; issue 50's thirty-first rule); otherwise ``public``
    unchanged. Both GLM mechanisms keep the same stage-0 budget parts, so nothing charged so far
    depends on the choice; the choice reads only public and DP-released values (post-processing)."""
    if not public.mechanism_by_default:
        return public
    from .mechanisms.noise_aware_cells import NAME as CELLS
    from .mechanisms.noise_aware_cells import cells_pay

    candidate = dataclasses.replace(public, req=dataclasses.replace(public.req, mechanism=CELLS))
    if not cells_pay(candidate, released):
        return public
    say(f"mechanism: {CELLS} (the default for this policy's small public discrete domain: its record count "
        "gives enough records per cell above the counts' noise; --mechanism noise-aware-newton runs the Newton "
        "rounds instead)")
    return candidate


# ---- stage 2 plan: the mechanism's, from public or released values --------------------------
def mechanism_of(public: PublicPlan) -> Mechanism:
    """The release's stage-2 mechanism (resolved in stage 0 by :func:`resolve_mechanism`)."""
    return REGISTRY[public.req.mechanism or ""]


def plan_stage2(public: PublicPlan, released: Released) -> MechanismPlan:
    """Stage 2's plan: the mechanism's (:meth:`~dpsummary.mechanisms.base.Mechanism.plan`), from
    public or released values only; its declared events are exactly what stage 2 reserves. The
    refusals here (too few records, more than n_max, a DP-estimated target that does not suit the
    model) are decided on DP outputs: :class:`ChargedRefusal` when stage 1 ran, a public
    :class:`~dpsummary.errors.PolicyRefusal` when the count and schema are public."""
    return mechanism_of(public).plan(public, released)


# ---- stage 2: encoding, quality counts, the mechanism's run --------------------------------
@dataclass(frozen=True)
class Stage2Output:
    """What stage 2 produced: the mechanism's output, the claim's epsilons and budget split (from
    the declared events), the noisy quality counts (None without a quality share) and the
    pipeline's own notes."""

    result: MechanismOutput
    epsilons: dict[str, float]
    budget_split: dict[str, float]
    quality: Any
    pipeline_notes: list[str] = field(default_factory=list)

    @property
    def summary(self) -> Any:
        return self.result.summary

    @property
    def notes(self) -> list[str]:
        return [*self.pipeline_notes, *self.result.notes]


def run_stage2(
    public: PublicPlan,
    released: Released,
    plan: MechanismPlan,
    source: Any,
    *,
    progress: ProgressFn | None = None,
    checkpoint: CheckpointFn | None = None,
) -> Stage2Output:
    """Stage 2 (reads records, charged): start the claim's epsilons on the second core (they
    depend only on the planned, public events; PRV alone takes about 0.7 s; nothing else calls
    the accountants until the result is collected, so their warning filters, not thread-safe, are
    not raced), encode every record by the public total rules, release the noisy quality counts
    and decide the data-quality refusal on them, then run the mechanism on the encoded records
    (:meth:`~dpsummary.mechanisms.base.Mechanism.run`)."""
    from concurrent.futures import ThreadPoolExecutor

    from . import accounting as acc

    mark = checkpoint or (lambda _name: None)
    pol = public.policy
    pool = ThreadPoolExecutor(max_workers=1, thread_name_prefix="dpsummary-accounting")
    events = [*public.stage1.events, *plan.events]
    # Every accountant that can compose the events (objective perturbation's: RDP alone).
    claimed = pool.submit(acc.epsilons, events, public.delta, acc.composable(events))
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
        count_sd = 0.0 if released.count_is_public else float(public.stage1.count_sigma or 0.0)
        excess = quality.dropped_excess_sds(released.record_count, count_sd, rules.max_dropped_fraction)
        if share > rules.max_dropped_fraction and excess > QUALITY_REFUSAL_SDS:
            raise ChargedRefusal(
                f"about {100 * share:.0f}% of the records are unusable under the policy's data_quality rules "
                f"(more than max_dropped_fraction {rules.max_dropped_fraction:g} by {excess:.1f} noise sds)",
                fix="fix the data or the rules")
        # The mechanism's record count: records read minus records dropped (both noisy).
        record_count = max(released.record_count - max(quality.noisy["dropped"], 0.0), 1.0)
        notes.append("data quality: noisy counts of the records each public rule touched are in the artifact")
    mark("quality")
    result = mechanism_of(public).run(public, plan, encoded.records, record_count=record_count, progress=progress,
                                      checkpoint=mark)
    epsilons = claimed.result()
    if public.delta_selection:
        epsilons = {k: v + acc.selection_slack([public.delta_selection]) for k, v in epsilons.items()}
    return Stage2Output(result, epsilons, _budget_split(public, plan), quality, notes)


def _budget_split(public: PublicPlan, plan: MechanismPlan) -> dict[str, float]:
    """Standalone epsilon of each part: stage 1's count and schema, then every part the plan
    declares (their naive sum bounds the composed total from above)."""
    from dp_accounting import dp_event as dpe

    from . import accounting as acc

    out = {"count": 0.0, "preprocessing": 0.0, "quality": 0.0, "initialisation": 0.0}
    for part, sigma in (("count", public.stage1.count_sigma), ("preprocessing", public.stage1.schema_sigma)):
        if sigma is not None:
            out[part] = acc.epsilon([dpe.GaussianDpEvent(sigma)], public.delta, public.accountant)
    for part, event in plan.parts:
        out[part] = acc.epsilon([event], public.delta, public.accountant)
    return out


# ---- stage 4: the signed artifact ----------------------------------------------------------
def write_release(public: PublicPlan, released: Released, plan: MechanismPlan, output: Stage2Output) -> str:
    """Build the claim (public parameters and DP outputs only; the mechanism writes its own
    section), sign and write the artifact atomically; returns its digest for the ledger commit."""
    from . import accounting as acc
    from .artifact import write_artifact

    pol = public.policy
    mechanism = mechanism_of(public)
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
        "sampling": mechanism.sampling,
        "accountant_of_record": public.accountant,
        "accountants": {a: acc.accountant_description(a) for a in ("rdp", "prv", "pld")},
        "accountant_versions": acc.accountant_versions(),
        "events": acc.events_to_json(all_events),
        "mechanism": mechanism.claim(public, plan, output.result),
        "data_quality": {
            "rules": pol.data_quality.model_dump(mode="json"),
            "counts": None if output.quality is None else output.quality.as_dict(),
        },
        "budget_split": output.budget_split,
        "public_inputs": public_inputs(public),
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
        # What the mechanism publishes besides the summary (the default posterior's Gaussian,
        # DP-PSVI's uncalibrated pseudocoreset): DP outputs and public values only.
        **output.result.body,
    }
    if not all_finite(body) or not all_finite(claim):
        # Post-processing must be total (DEVELOPERS.md): a non-finite number in any summary is
        # decided on DP outputs and public values only, so it is a charged refusal, never a crash.
        raise ChargedRefusal(NON_FINITE_FIT_MESSAGE, fix=NON_FINITE_FIT_FIX)
    return write_artifact(public.out, body, claim, public.ledger.private_key, public.key_info.keyid)


# ---- which mechanism runs ---------------------------------------------------------------------
def resolve_mechanism(req: ReleaseRequest) -> ReleaseRequest:
    """The request with its stage-2 mechanism fixed (public, before anything else): a model that
    a mechanism claims (its ``models``) gets that mechanism, every other model the first general
    mechanism of :data:`~dpsummary.mechanisms.REGISTRY` (``noise-aware-newton``) unless
    ``--mechanism`` says otherwise. Another mechanism for a claimed model, a claiming mechanism
    for another model, or an option only another mechanism reads refuse (one line)."""
    owner = {model: mech.name for mech in REGISTRY.values() for model in mech.models}
    own = owner.get(req.model or "")
    mech = req.mechanism
    if own is not None:
        if mech is not None and mech != own:
            raise ReleaseError(f"--mechanism {mech} does not run --model {req.model}; --model {req.model} uses {own}",
                               fix="leave --mechanism out")
        mech = own
    elif mech is not None and mech in REGISTRY and REGISTRY[mech].models:
        models = ", ".join(sorted(REGISTRY[mech].models))
        raise ReleaseError(f"--mechanism {mech} is only for --model {models}", fix="leave --mechanism out")
    elif mech is None:
        mech = next(m.name for m in REGISTRY.values() if not m.models)
    for other in REGISTRY.values():
        for option in other.options:
            if other.name != mech and getattr(req, option) is not None:
                needs = (" or ".join(f"--model {m}" for m in sorted(other.models)) if other.models
                         else f"--mechanism {other.name}")
                raise ReleaseError(f"--{option.replace('_', '-')} needs {needs}",
                                   fix=f"pass {needs}, or leave --{option.replace('_', '-')} out")
    return req if mech == req.mechanism else dataclasses.replace(req, mechanism=mech)
