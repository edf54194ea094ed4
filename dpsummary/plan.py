"""The records the release pipeline hands a stage-2 mechanism: the request, the public plan of
stage 0 and what stage 1 released.

:mod:`dpsummary.release` builds these records and :mod:`dpsummary.mechanisms` reads them
(:class:`~dpsummary.mechanisms.base.Mechanism`'s ``check_public(req, ...)``,
``plan(public, released)``, ``run(public, ...)``, ``claim(public, ...)``). They live below both,
so the mechanism interface names no part of the pipeline: this module imports only the standard
library (and the accountant's ``Accountant`` name for type checking), and
``tests/test_import_cycles.py`` fails if it, or any mechanism, imports :mod:`dpsummary.release`.

Every field is public: the options, the policy, the key and ledger handles, the file's header,
and stage 1's DP outputs (or the record count and schema the policy declares public).
"""

from __future__ import annotations

from dataclasses import dataclass
from pathlib import Path
from typing import TYPE_CHECKING, Any

if TYPE_CHECKING:
    from .accounting import Accountant

#: Public defaults of a release request, chosen on synthetic data
#: (benchmarks/tune_dp_defaults.py), never on private data.
DEFAULT_SIZE = 50
DEFAULT_STEPS = 500
DEFAULT_NUM_SAMPLES = 100


@dataclass(frozen=True)
class ReleaseRequest:
    """The options of one release (``dpsummary release``; public, checked in stage 0)."""

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
    #: A name of :data:`dpsummary.mechanisms.REGISTRY`: ``noise-aware-newton`` (the default for
    #: GLMs), ``dp-psvi`` (the paper's mechanism, for reproduction), or the mechanism a model
    #: selects (``dp-bb-psvi`` for ``bnn``, ``dp-kd-tree`` for ``gmm``/``dpgmm``). None: chosen
    #: from the model (:func:`dpsummary.release.resolve_mechanism`).
    mechanism: str | None = None
    #: ``local`` or ``spark`` (:mod:`dpsummary.private.spark_engine`; ``spark`` holds its
    #: :class:`~dpsummary.spark.session.SparkOptions`).
    engine: str = "local"
    spark: Any = None
    #: Options one mechanism reads (its ``options``; refused with any other,
    #: :func:`dpsummary.release.resolve_mechanism`).
    #: ``--model bnn`` (``dp-bb-psvi``): hidden layer widths (public; default
    #: :data:`dpsummary.blackbox.dp_bb_psvi.DEFAULT_WIDTHS`).
    bnn_widths: tuple[int, ...] | None = None
    #: ``--model gmm|dpgmm`` (``dp-kd-tree``): the number of components K (gmm) or the truncation T
    #: (dpgmm), public (default :data:`dpsummary.mechanisms.dp_kd_tree.MIXTURE_DEFAULT_COMPONENTS`).
    components: int | None = None
    #: ``--positive-class``: the target's class encoded as 1, every other non-missing value 0
    #: (public: the question the analyst asks). Without a public schema the target column is then
    #: not estimated at all (:class:`~dpsummary.private.preprocess.SchemaMechanism`'s
    #: ``public_target``), so a rare class cannot make the release refuse; binary models only.
    positive_class: str | None = None
    #: Replace an existing artifact at the output path (``--force``). Without it, an existing
    #: file there refuses the release in stage 0, before any reservation (a published artifact
    #: is never silently replaced).
    force: bool = False


@dataclass(frozen=True)
class Stage1Plan:
    """Stage 1's events and noise multipliers (empty when the count and schema are public)."""

    events: list[Any]
    count_sigma: float | None
    schema_sigma: float | None


@dataclass(frozen=True)
class PublicPlan:
    """Everything fixed from public inputs before any record is read (stage 0,
    :func:`dpsummary.release.plan_public`)."""

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
    #: The request named no mechanism and its model claims none, so stage 0 resolved the general
    #: default (``noise-aware-newton``), which :func:`dpsummary.release.choose_mechanism` may
    #: replace by ``noise-aware-cells`` after stage 1 (issue 50's thirty-first rule).
    mechanism_by_default: bool = False


@dataclass(frozen=True)
class Released:
    """What stage 1 released (or the policy declared public): the schema and the record count."""

    schema: Any
    record_count: float
    count_is_public: bool
    notes: list[str]
