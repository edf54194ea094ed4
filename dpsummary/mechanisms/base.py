"""The mechanism interface: what a stage-2 mechanism supplies to the release pipeline.

The pipeline (:mod:`dpsummary.release`) owns stages 0 and 1, the ledger session, the
reservations, the encoding of every record by the public total rules, the noisy data-quality
counts and their refusal, the accountant's epsilons, the signed artifact and the ledger commit.
A mechanism supplies only what differs (:class:`Mechanism`, in the style of dp_accounting's
``DpEvent`` and optax's ``GradientTransformation``: small frozen records, a few functions):

* ``check_public(req, schema)``: refusals on public facts (options; a public schema), before
  any reservation, reading no record;
* ``plan(public, released) -> MechanismPlan``: model, transform and noise multipliers from
  public or released values only; the plan DECLARES stage 2's privacy events (``plan.parts``),
  which is exactly what the ledger reserves and the claim's epsilons are computed from;
* ``run(public, plan, records, ...) -> MechanismOutput``: the only code that touches records
  (:class:`~dpsummary.private.mechanism.PrivateRecords`), spending exactly the declared events;
* ``claim(public, plan, output) -> dict``: the claim's ``mechanism`` section (public parameters
  and DP outputs only);
* ``selftest_scenarios()``: its scenarios for ``dpsummary selftest``.

Two hooks have defaults: ``budget_parts(req)`` (the optional budget-split parts stage 0 keeps)
and ``postprocess(public, output, ...)`` (post-processing after the record store is closed).

The records a mechanism receives (``req``, ``public``, ``released``) are
:mod:`dpsummary.plan`'s, below both the pipeline and the mechanisms: no mechanism imports
:mod:`dpsummary.release`, not even for type checking (tests/test_import_cycles.py).

Nothing here imports torch or the accountants at module level: a public refusal stays light.
"""

from __future__ import annotations

import math
import secrets
from collections.abc import Callable, Mapping
from dataclasses import dataclass, field
from typing import TYPE_CHECKING, Any, ClassVar, Protocol

from ..errors import ChargedRefusal, PolicyRefusal, Refusal

# The request's public defaults live with the request (dpsummary/plan.py); re-exported here for
# the benchmarks that read them beside DEFAULT_EXPECTED_BATCH.
from ..plan import DEFAULT_NUM_SAMPLES as DEFAULT_NUM_SAMPLES
from ..plan import DEFAULT_SIZE as DEFAULT_SIZE
from ..plan import DEFAULT_STEPS as DEFAULT_STEPS

if TYPE_CHECKING:
    import torch

    from ..plan import PublicPlan, Released, ReleaseRequest
    from ..selftest.config import SelftestScenario

#: Expected Poisson batch of the subsampled mechanisms: q = min(1, this / released count).
DEFAULT_EXPECTED_BATCH = 200

ProgressFn = Callable[[int, int], None]
NoticeFn = Callable[[str], None]
#: Called with a stage boundary's name (``dpsummary.release.CHECKPOINTS``).
CheckpointFn = Callable[[str], None]

#: The ``non-finite-fit`` refusal (docs/REFUSALS.md): what to change when post-processing of the
#: DP outputs yields no finite summary.
NON_FINITE_FIT_MESSAGE = "the noisy statistics gave no finite summary (the privacy noise overwhelmed them)"
NON_FINITE_FIT_FIX = ("raise --epsilon, or declare tighter public bounds (the target's upper bound) in the "
                      "policy's schema")


@dataclass(frozen=True)
class MechanismPlan:
    """A mechanism's stage-2 plan, fixed from public or released values before any record of
    stage 2 is read.

    ``parts`` declares stage 2's privacy events by budget-split part, in the order they run:
    ``("quality", event)`` when the policy gives the quality counts a share (released by the
    pipeline at ``quality_noise_multiplier``), optionally ``("initialisation", event)``, then
    ``("optimisation", event)``. The ledger reserves exactly :attr:`events`; the claim's epsilons
    and budget split are computed from them; the mechanism's ``run`` must spend no more."""

    mechanism: str
    model: Any
    transform: Any
    #: The headline noise multiplier (the release result and the claim report it).
    noise_multiplier: float
    sample_rate: float
    steps: int
    quality_noise_multiplier: float | None
    parts: tuple[tuple[str, Any], ...]
    #: The mechanism's own public settings (initialisation layout, schedule, tree, widths...).
    settings: Mapping[str, Any] = field(default_factory=dict)

    @property
    def events(self) -> list[Any]:
        """Stage 2's events in the order they run (what the ledger reserves)."""
        return [event for _part, event in self.parts]

    @property
    def optimisation_event(self) -> Any:
        return dict(self.parts)["optimisation"]


@dataclass(frozen=True)
class MechanismOutput:
    """What a mechanism's ``run`` returns: the summary (a DP output), release notes, ``extra``
    (what its ``claim`` and ``postprocess`` read) and ``body`` (fields the artifact's body
    carries besides the summary, e.g. a posterior Gaussian). Public values and DP outputs only."""

    summary: Any
    notes: list[str] = field(default_factory=list)
    extra: dict[str, Any] = field(default_factory=dict)
    body: dict[str, Any] = field(default_factory=dict)


class Mechanism(Protocol):
    """A stage-2 mechanism of ``dpsummary release`` (see the module docstring).

    Attributes: ``name`` (``--mechanism`` and the claim's ``mechanism.name``); ``models``, the
    model names that select it automatically and that no other mechanism runs (empty: it runs
    every model no family mechanism claims); ``options``, the :class:`ReleaseRequest` fields only
    it reads (refused with any other mechanism); ``uses_target``, whether stage 1's DP schema
    estimation looks for a target column; ``sampling``, what the claim says about sampling;
    ``requires_public_schema`` (default False), whether it refuses without a public schema;
    ``engines`` and ``accountants`` (default: all), those it runs on and is accounted by."""

    name: ClassVar[str]
    models: ClassVar[frozenset[str]]
    options: ClassVar[tuple[str, ...]]
    uses_target: ClassVar[bool]
    sampling: ClassVar[str]
    #: True when the mechanism cannot run without the policy's public schema (its public
    #: domain is read from it): the pipeline refuses a release without one before any
    #: reservation, with :meth:`check_public` given ``schema`` None.
    requires_public_schema: ClassVar[bool] = False
    #: The ``--engine`` values it runs on; another is refused before any reservation.
    engines: ClassVar[tuple[str, ...]] = ("local", "spark")
    #: The accountants that can compose its events (objective perturbation's are RDP only); a
    #: policy whose accountant of record is another is refused before any reservation.
    accountants: ClassVar[tuple[str, ...]] = ("rdp", "prv", "pld")

    def check_public(self, req: ReleaseRequest, schema: Any | None) -> None:
        """Refuse (:class:`~dpsummary.errors.ReleaseError`) on public facts: called on the options
        alone (``schema`` None) before anything heavy, and again with the policy's schema when
        the policy declares one. Reads no record, charges nothing."""
        ...

    def budget_parts(self, req: ReleaseRequest) -> frozenset[str]:
        """The optional budget-split parts (``"initialisation"``) stage 0 keeps for this request
        (public: the options only). Default: none."""
        return frozenset()

    def plan(self, public: PublicPlan, released: Released) -> MechanismPlan:
        """Stage 2's plan from public or released values only (see :class:`MechanismPlan`).
        Refusals here use :func:`refusal_kind`."""
        ...

    def run(self, public: PublicPlan, plan: MechanismPlan, records: Any, *, record_count: float,
            progress: ProgressFn | None = None, checkpoint: CheckpointFn | None = None) -> MechanismOutput:
        """Run on the encoded private records (charged: ``plan.events`` are reserved), spending
        exactly the declared ``initialisation`` and ``optimisation`` events; call
        ``checkpoint("initialised")`` and then ``checkpoint("optimised")``. ``record_count`` is the
        released (noisy or public) count of usable records. A refusal here is a
        :class:`~dpsummary.errors.ChargedRefusal` decided on DP outputs only."""
        ...

    def postprocess(self, public: PublicPlan, output: MechanismOutput, *, progress: ProgressFn | None = None,
                    notice: NoticeFn | None = None) -> MechanismOutput:
        """Post-processing after the record store is CLOSED (no privacy cost). Default: none."""
        return output

    def claim(self, public: PublicPlan, plan: MechanismPlan, output: MechanismOutput) -> dict[str, Any]:
        """The claim's ``mechanism`` section: public parameters and DP outputs only, finite."""
        ...

    def selftest_scenarios(self) -> tuple[SelftestScenario, ...]:
        """The scenarios ``dpsummary selftest`` runs for this mechanism."""
        ...


# ---- shared by the mechanisms' plans, runs and claims ----------------------------------------
def refusal_kind(public: PublicPlan) -> type[Refusal]:
    """The refusal stage 2's planning raises: public (:class:`PolicyRefusal`) when stage 1 was
    empty (the count and schema are public), else charged (decided on DP outputs)."""
    return PolicyRefusal if public.stage1.events == [] else ChargedRefusal


def check_released_count(public: PublicPlan, released: Released, refuse: type[Refusal]) -> None:
    """The policy's min_records and n_max, judged on the public or the noisy record count."""
    pol = public.policy
    judged = "public record count" if released.count_is_public else "noisy record count"
    if released.record_count < pol.min_records:
        raise refuse(f"too few records for the policy's min_records {pol.min_records} (judged on the {judged})",
                     fix="release from a larger data set, or lower min_records in the policy")
    if pol.n_max is not None and released.record_count > pol.n_max:
        raise refuse(f"more records than the policy's public bound n_max (judged on the {judged})",
                     fix="raise n_max in the policy")


def gaussian_event(sigma: float) -> Any:
    from dp_accounting import dp_event as dpe

    return dpe.GaussianDpEvent(sigma)


def quality_noise(public: PublicPlan, split: dict[str, float]) -> tuple[float | None, list[Any]]:
    """The quality counts' noise multiplier (None without a quality share) and the events that
    precede the stage-2 mechanism (stage 1's, then the quality counts')."""
    from .. import accounting as acc

    before = list(public.stage1.events)
    if split["quality"] <= 0:
        return None, before
    sigma = acc.calibrate_part(
        target_epsilon=(split["count"] + split["preprocessing"] + split["quality"]) * public.req.epsilon,
        delta=public.delta, prior_events=before)
    return sigma, [*before, gaussian_event(sigma)]


def quality_parts(sigma: float | None) -> tuple[tuple[str, Any], ...]:
    """The ``("quality", event)`` part of a plan, or nothing without a quality share."""
    return () if sigma is None else (("quality", gaussian_event(sigma)),)


def default_sample_rate(req: ReleaseRequest, released: Released) -> float:
    """``--sample-rate``, else ``DEFAULT_EXPECTED_BATCH / released count`` (at most 1), on the
    sampler's 2^-32 grid."""
    from ..private.noise import quantize_sample_rate

    return quantize_sample_rate(
        req.sample_rate if req.sample_rate is not None
        else min(1.0, DEFAULT_EXPECTED_BATCH / max(released.record_count, 1.0))
    )


def selection_slack(public: PublicPlan) -> float:
    """The partition-selection slack in epsilon; mechanisms calibrate to the target minus it, so
    the claim stays at or below the requested epsilon."""
    from .. import accounting as acc

    return acc.selection_slack([public.delta_selection])


def nonprivate_generator(seed: int | None) -> torch.Generator:
    """The generator of NON-private randomness (initial points, posterior draws): ``--seed``, else
    OS entropy. Privacy coins and noise never come from it."""
    import torch

    return torch.Generator().manual_seed(seed if seed is not None else secrets.randbits(63))


def stage_noise(public: PublicPlan, plan: MechanismPlan) -> dict[str, Any]:
    """The claim section's closing fields every mechanism reports: the noise multipliers of the
    record count, the DP schema and the quality counts (None when not run)."""
    return {
        "count_noise_multiplier": public.stage1.count_sigma,
        "preprocessing_noise_multiplier": public.stage1.schema_sigma,
        "quality_noise_multiplier": plan.quality_noise_multiplier,
    }


def all_finite(value: Any) -> bool:
    """True when every float inside ``value`` (nested dicts, lists, tuples) is finite."""
    if isinstance(value, float):
        return math.isfinite(value)
    if isinstance(value, dict):
        return all(all_finite(v) for v in value.values())
    if isinstance(value, list | tuple):
        return all(all_finite(v) for v in value)
    return True
