"""The self-test's driver: calibrate the headline claim, run every registered scenario the
configuration selects, and give one verdict.

Scenarios are registered where the code they audit lives: each mechanism's
``selftest_scenarios()`` (:data:`dpsummary.mechanisms.REGISTRY`), plus the pipeline's own
record-handling audits (:data:`PIPELINE_SCENARIOS`: the total per-record rules and quality
counts, the record count under the CSV line neighbours), which every release runs whatever its
mechanism."""

from __future__ import annotations

import math
import time
from collections.abc import Iterator
from contextlib import contextmanager
from dataclasses import asdict, dataclass
from typing import Any

import torch

from ..accounting import calibrate_noise_multiplier, epsilon, subsampled_gaussian_event
from ..mechanisms import REGISTRY
from ..private import noise
from .bnn import BNNCheckResult
from .bootstrap_check import BootstrapCheckResult
from .canaries import CanaryCheck, check_canary_design
from .config import (
    CERTIFIES,
    DOES_NOT_CERTIFY,
    SCENARIOS,
    AuditContext,
    AuditResult,
    OneRunResult,
    Progress,
    ReplayResult,
    SelfTestConfig,
    SelftestScenario,
)
from .mixture import MixtureCheckResult
from .records import csv_lines_audit, quality_audit, quality_parquet_audit

#: The pipeline's own audits: what every release does to records before its mechanism runs.
PIPELINE_SCENARIOS: tuple[SelftestScenario, ...] = (
    SelftestScenario("quality", "pipeline", "audits", lambda cfg: "quality" in cfg.scenarios,
                     lambda cfg, ctx, progress: [quality_audit(cfg, ctx.alpha, progress),
                                                  quality_parquet_audit(cfg, ctx.alpha, progress)]),
    SelftestScenario("csv-lines", "pipeline", "audits", lambda cfg: "csv-lines" in cfg.scenarios,
                     lambda cfg, ctx, progress: [csv_lines_audit(cfg, ctx.alpha, progress)]),
)


def registered_scenarios() -> tuple[SelftestScenario, ...]:
    """Every scenario: the pipeline's, then each registered mechanism's, in registry order."""
    return PIPELINE_SCENARIOS + tuple(s for mech in REGISTRY.values() for s in mech.selftest_scenarios())


@dataclass(frozen=True)
class SelfTestResult:
    config: dict[str, Any]
    noise_multiplier: float
    claimed_epsilon: float
    audits: list[AuditResult]
    one_run: OneRunResult | None
    replay: ReplayResult | None
    canary_check: CanaryCheck
    noise_path_audited: str
    white_box_runs: int
    runs_per_second: float
    elapsed_seconds: float
    alpha_per_audit: float
    violation: bool
    verdict: str
    certifies: str = CERTIFIES
    does_not_certify: str = DOES_NOT_CERTIFY
    #: The BNN mechanism's checks (None when ``config.bnn`` is false).
    bnn: BNNCheckResult | None = None
    #: The mixture mechanism's checks (None when ``config.mixture`` is false).
    mixture: MixtureCheckResult | None = None
    #: DP-PSVI's bootstrap never reads a record (None when ``config.bootstrap`` is false).
    bootstrap: BootstrapCheckResult | None = None

    @property
    def max_lower_bound(self) -> float:
        return max([a.epsilon_lower_bound for a in self.audits]
                   + ([self.one_run.epsilon_lower_bound] if self.one_run else []))

    def as_dict(self) -> dict[str, Any]:
        out = asdict(self)
        out["max_lower_bound"] = self.max_lower_bound
        return out


@contextmanager
def torch_threads(n: int | None) -> Iterator[None]:
    if n is None:
        yield
        return
    old = torch.get_num_threads()
    torch.set_num_threads(n)
    try:
        yield
    finally:
        torch.set_num_threads(old)


def run_selftest(config: SelfTestConfig | None = None, progress: Progress | None = None) -> SelfTestResult:
    """Calibrate sigma with the real accountant for the inflated claim, then run every registered
    scenario the configuration selects (:func:`registered_scenarios`): the white-box audits first
    (timed together), then the one-run audit, the replays and the per-mechanism checks. ``alpha``
    is split equally (Bonferroni) over the audits that produce lower bounds, so the probability
    that a correct implementation is reported as violating its claim is at most ``alpha``."""
    cfg = (config or SelfTestConfig()).validated()
    q = noise.quantize_sample_rate(cfg.sample_rate)
    sigma = calibrate_noise_multiplier(
        target_epsilon=cfg.epsilon, delta=cfg.delta, sample_rate=q, steps=cfg.steps, accountant=cfg.accountant
    )
    event = subsampled_gaussian_event(sigma, q, cfg.steps)
    claimed = epsilon([event], cfg.delta, cfg.accountant)
    check = check_canary_design(cfg.design)
    if not check.ok:
        raise RuntimeError(f"canary design check failed: {check}")
    # One alpha share per audit: the "quality" scenario runs two (CSV and Parquet, issue 35).
    n_audits = (len(cfg.scenarios) + (1 if "quality" in cfg.scenarios else 0)
                + (1 if cfg.one_run_canaries > 0 else 0))
    a_each = cfg.alpha / max(n_audits, 1)
    claimed_one = epsilon([event], cfg.one_run_delta, cfg.accountant) if cfg.one_run_canaries > 0 else math.nan
    ctx = AuditContext(sigma=sigma, sample_rate=q, claimed=claimed, claimed_one_run=claimed_one, alpha=a_each)
    chosen = [s for s in registered_scenarios() if s.enabled(cfg)]
    slots: dict[str, Any] = {}
    t0 = time.perf_counter()
    with torch_threads(cfg.torch_threads):
        wb_start = time.perf_counter()
        audits: list[AuditResult] = [a for s in chosen if s.slot == "audits" for a in s.run(cfg, ctx, progress)]
        # Scenario order; an audit a scenario adds ("quality-parquet") follows its scenario.
        audits.sort(key=lambda a: SCENARIOS.index(a.scenario.removesuffix("-parquet")))
        wb_time = time.perf_counter() - wb_start
        for slot in ("one_run", "replay", "bnn", "mixture", "bootstrap"):
            for s in chosen:
                if s.slot == slot:
                    slots[slot] = s.run(cfg, ctx, progress)
    one: OneRunResult | None = slots.get("one_run")
    replay: ReplayResult | None = slots.get("replay")
    bnn: BNNCheckResult | None = slots.get("bnn")
    mixture: MixtureCheckResult | None = slots.get("mixture")
    boot: BootstrapCheckResult | None = slots.get("bootstrap")
    wb_runs = 2 * len(cfg.scenarios) * (cfg.runs + cfg.pilot)
    violation = (any(a.violation for a in audits) or bool(one and one.violation) or bool(replay and not replay.ok)
                 or bool(bnn and not bnn.ok) or bool(mixture and not mixture.ok) or bool(boot and not boot.ok))
    lbs = ", ".join(
        f"{a.scenario} {a.epsilon_lower_bound:.3f}"
        + ("" if abs(a.claimed_epsilon - claimed) < 5e-4 else f" (claim {a.claimed_epsilon:.3f})")
        for a in audits
    )
    if one is not None:
        lbs += f", one-run {one.epsilon_lower_bound:.3f} (claim {one.claimed_epsilon:.3f} at delta {one.delta:g})"
    verdict = (
        f"VIOLATION DETECTED: lower bounds [{lbs}] vs claimed epsilon {claimed:.3f} at delta {cfg.delta:g}"
        if violation else
        f"no violation detected: lower bounds [{lbs}] do not exceed claimed epsilon {claimed:.3f} "
        f"at delta {cfg.delta:g} (this is not a proof of privacy)"
    )
    if replay is not None and not replay.ok:
        verdict += "; gray-box replay failed (control flow or sensitivity)"
    if bnn is not None and not bnn.ok:
        verdict += f"; BNN mechanism check failed ({', '.join(bnn.failed)})"
    if mixture is not None and not mixture.ok:
        verdict += f"; mixture mechanism check failed ({', '.join(mixture.failed)})"
    if boot is not None and not boot.ok:
        verdict += "; DP-PSVI bootstrap check failed (its output changed when the records were closed or poisoned)"
    cfg_dict = asdict(cfg)
    cfg_dict["sample_rate_quantised"] = q
    return SelfTestResult(
        config=cfg_dict, noise_multiplier=sigma, claimed_epsilon=claimed, audits=audits, one_run=one,
        replay=replay, canary_check=check,
        noise_path_audited=(
            "product: OpenDP discrete Gaussian (SystemRandomness)" if cfg.noise == "opendp"
            else "numpy Gaussian (fast mode); product coins, clipping and mechanism code"
        ),
        white_box_runs=wb_runs, runs_per_second=wb_runs / wb_time if wb_time > 0 else math.inf,
        elapsed_seconds=time.perf_counter() - t0, alpha_per_audit=a_each, violation=violation,
        verdict=verdict, bnn=bnn, mixture=mixture, bootstrap=boot,
    )
