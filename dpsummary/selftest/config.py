"""The self-test's configuration (public, fixed before any run), its result records and the
record by which a mechanism registers a scenario (:class:`SelftestScenario`)."""

from __future__ import annotations

import math
from collections.abc import Callable
from dataclasses import dataclass, field
from typing import Any, Literal

from ..accounting import Accountant
from .randomness import INJECTIONS, NOISE_PATHS, Injection, NoisePath

Scenario = Literal["dirac", "swap", "histogram", "quality", "newton", "csv-lines", "cells", "ranges", "objective"]
SCENARIOS: tuple[Scenario, ...] = ("dirac", "swap", "histogram", "quality", "newton", "csv-lines", "cells", "ranges",
                                   "objective")
#: Scenarios that audit ``noisy_clipped_sum`` (batched runs); "histogram" audits ``noisy_marginals``.
SUM_SCENARIOS: tuple[Scenario, ...] = ("dirac", "swap")

#: ``progress(stage, done, total)``; stages: "pilot", "main", "one-run", "replay".
Progress = Callable[[str, int, int], None]

CERTIFIES = (
    "A lower bound ABOVE the claimed epsilon certifies, with confidence 1 - alpha, that the audited "
    "code path does not satisfy its claimed (epsilon, delta) guarantee: an implementation or "
    "accounting bug."
)
DOES_NOT_CERTIFY = (
    "A lower bound BELOW the claimed epsilon is no proof of privacy. It shows only that these audits, "
    "with these canaries and this many runs, found no gross leak (such as missing clipping, noise on "
    "the wrong scale, fixed-size batches accounted as Poisson, or reused noise). The test runs at an "
    "inflated epsilon, on a synthetic data set, with the mechanism's public inputs fixed; bugs that "
    "only show at small epsilon, in data-dependent preprocessing, in other code paths or in "
    "side channels (timing, floating point) are out of its reach."
)


@dataclass(frozen=True)
class Design:
    """The public, fixed-in-advance canary design (units: the clip norm C)."""

    clip_norm: float = 1.0
    #: The canary's raw (unclipped) centred vector has this many times the clip norm.
    canary_norm_factor: float = 4.0
    #: Other records per data set (zero vectors for "dirac", -c for "swap").
    background: int = 10

    @property
    def offset(self) -> float:
        """|x| of a record x e_j whose raw centred vector x (1, -1) has norm canary_norm_factor C."""
        return self.canary_norm_factor * self.clip_norm / math.sqrt(2.0)


@dataclass(frozen=True)
class SelfTestConfig:
    """Parameters of a self-test run (all public, fixed before any run)."""

    #: The inflated claim: sigma is calibrated so that the accountant reports this epsilon.
    epsilon: float = 2.0
    #: delta of the audited claim. Finite-run audits resolve error rates down to ~1/runs, so the
    #: claim is audited where that has power; the accountant's (epsilon(delta), delta) guarantee
    #: holds for every delta, so a violation at this delta is a violation of the claim.
    delta: float = 1e-2
    accountant: Accountant = "rdp"
    sample_rate: float = 0.1
    steps: int = 10
    #: Main runs per side (without / with the canary) for each canary scenario.
    runs: int = 10_000
    #: Pilot runs per side (threshold selection); None: runs // 4.
    pilot_runs: int | None = None
    alpha: float = 0.05
    inject: Injection = "none"
    noise: NoisePath = "opendp"
    scenarios: tuple[Scenario, ...] = SCENARIOS
    design: Design = field(default_factory=Design)
    #: Runs batched into one mechanism call (see the module docstring).
    runs_per_call: int = 128
    #: One-run audit: number of canaries (0 disables it) and the delta it audits.
    one_run_canaries: int = 1000
    one_run_delta: float = 1e-6
    one_run_k_grid: tuple[int, ...] = (25, 50, 100, 200)
    #: "histogram" scenario: categorical columns (two categories each) of the audited layout.
    histogram_columns: int = 9
    replay: bool = True
    #: Run the BNN mechanism's checks (:func:`bnn_checks`).
    bnn: bool = True
    #: Run the mixture mechanism's checks (:func:`mixture_checks`).
    mixture: bool = True
    #: Check that DP-PSVI's parametric bootstrap never reads a record (:func:`bootstrap_check`).
    bootstrap: bool = True
    #: Torch threads during the audit (restored afterwards); 1 is fastest for these tiny calls.
    torch_threads: int | None = 1

    def validated(self) -> SelfTestConfig:
        if not (self.epsilon > 0 and math.isfinite(self.epsilon)):
            raise ValueError("epsilon must be positive")
        if not (0 < self.delta < 1 and 0 < self.one_run_delta < 1):
            raise ValueError("delta must lie in (0, 1)")
        if not (0 < self.alpha < 1):
            raise ValueError("alpha must lie in (0, 1)")
        if self.runs < 10 or (self.pilot_runs is not None and self.pilot_runs < 10):
            raise ValueError("runs and pilot runs must be at least 10 per side")
        if self.steps < 1 or self.runs_per_call < 1:
            raise ValueError("steps and runs_per_call must be positive")
        if self.inject not in INJECTIONS:
            raise ValueError(f"unknown injection {self.inject!r}; choose one of {', '.join(INJECTIONS)}")
        if self.noise not in NOISE_PATHS:
            raise ValueError(f"unknown noise path {self.noise!r}; choose one of {', '.join(NOISE_PATHS)}")
        if not self.scenarios or not set(self.scenarios) <= set(SCENARIOS):
            raise ValueError(f"scenarios must be some of {', '.join(SCENARIOS)}")
        if self.histogram_columns < 1:
            raise ValueError("histogram_columns must be positive")
        return self

    @property
    def pilot(self) -> int:
        return self.pilot_runs if self.pilot_runs is not None else max(10, self.runs // 4)


@dataclass(frozen=True)
class AuditResult:
    """A white-box Clopper-Pearson audit of one canary scenario."""

    scenario: str
    claimed_epsilon: float
    delta: float
    alpha: float
    confidence: float
    runs_per_side: int
    pilot_runs_per_side: int
    threshold: float
    false_positives: int
    false_negatives: int
    fp_upper: float
    fn_upper: float
    epsilon_lower_bound: float
    violation: bool
    #: The audited mechanism: "noisy_clipped_sum" (dirac, swap) or "noisy_marginals" (histogram).
    mechanism: str = "noisy_clipped_sum"
    #: Its noise multiplier (each mechanism is calibrated to the claim on its own).
    noise_multiplier: float | None = None
    #: "csv-lines": the largest exact move of the record count over the neighbours (must be <= 1).
    sensitivity: float | None = None


@dataclass(frozen=True)
class OneRunResult:
    claimed_epsilon: float
    delta: float
    alpha: float
    confidence: float
    canaries: int
    included: int
    guesses: int
    correct: int
    k: int
    epsilon_lower_bound: float
    violation: bool


@dataclass(frozen=True)
class ReplayResult:
    """Gray-box replay of the full DP-PSVI constructor on D and D + canary."""

    steps: int
    calls: tuple[int, int]
    shapes_equal: bool
    first_step_clip_equal: bool
    first_step_delta: float
    first_step_clip: float
    per_step_delta: list[float]
    per_step_clip: list[float]
    #: max_t ||sum(D+canary) - sum(D)|| / C_t with both evaluated at D's public state (lockstep).
    lockstep_max_ratio: float
    ok: bool


@dataclass(frozen=True)
class MechanismChecks:
    """What the family mechanisms' self-tests share: the noise scale against its analytic value,
    the accountant against Opacus's own, and the names of the failed checks."""

    noise_multiplier: float
    #: Sample sd of the released noise over ``noise_samples`` coordinates / its analytic value.
    noise_sd_ratio: float
    noise_samples: int
    #: Two-sided tolerance on the ratio (6 standard errors: false failure below 2e-9).
    noise_tolerance: float
    noise_ok: bool
    accountant_epsilon: float
    opacus_epsilon: float
    accountant_ok: bool
    ok: bool
    failed: list[str]


#: Where a scenario's result goes in :class:`~dpsummary.selftest.driver.SelfTestResult`: the list
#: ``audits`` (ordered as :data:`SCENARIOS`) or one named field.
ResultSlot = Literal["audits", "one_run", "replay", "bnn", "mixture", "bootstrap"]


@dataclass(frozen=True)
class AuditContext:
    """What the driver fixes before any scenario runs: the headline calibration of the batched
    noisy-sum audits (Poisson-subsampled Gaussian at ``cfg.sample_rate`` and ``cfg.steps``, the
    claim they are judged against) and the Bonferroni share of alpha per audit."""

    sigma: float
    sample_rate: float
    claimed: float
    #: The one-run audit's claim: the same event at ``cfg.one_run_delta``.
    claimed_one_run: float
    alpha: float


@dataclass(frozen=True)
class SelftestScenario:
    """A self-test scenario, registered by its mechanism (``Mechanism.selftest_scenarios``,
    :mod:`dpsummary.mechanisms`) or by the pipeline (the driver's record-handling audits).

    ``enabled(cfg)`` says whether a configuration selects it (``cfg.scenarios`` for an audit, a
    flag such as ``cfg.bnn`` otherwise); ``run(cfg, ctx, progress)`` returns a list of
    :class:`AuditResult` when ``slot == "audits"``, else the record of that result field."""

    name: str
    mechanism: str
    slot: ResultSlot
    enabled: Callable[[SelfTestConfig], bool]
    run: Callable[[SelfTestConfig, AuditContext, Progress | None], Any]
