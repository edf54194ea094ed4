"""The Clopper-Pearson audit shared by the single-mechanism scenarios (histogram, quality,
csv-lines, newton): a threshold chosen on pilot runs, error counts on the main runs."""

from __future__ import annotations

from collections.abc import Callable

import numpy as np

from .config import AuditResult, SelfTestConfig
from .statistics import choose_threshold, epsilon_lower_bound, error_counts


def gaussian_audit(cfg: SelfTestConfig, alpha: float, scores: Callable[[int, bool], np.ndarray], *, scenario: str,
                    mechanism: str, sigma: float, claimed: float) -> AuditResult:
    """The Clopper-Pearson audit shared by the single-mechanism scenarios: threshold chosen on
    the pilot runs, counted on the main runs; ``scores(n, canary)`` draws n runs of one side."""
    t = choose_threshold(scores(cfg.pilot, False), scores(cfg.pilot, True), delta=cfg.delta, alpha=alpha,
                         main_runs=cfg.runs)
    fp, fn = error_counts(scores(cfg.runs, False), scores(cfg.runs, True), t)
    lb, p_fp, p_fn = epsilon_lower_bound(fp, cfg.runs, fn, cfg.runs, delta=cfg.delta, alpha=alpha)
    return AuditResult(
        scenario=scenario, claimed_epsilon=claimed, delta=cfg.delta, alpha=alpha, confidence=1 - alpha,
        runs_per_side=cfg.runs, pilot_runs_per_side=cfg.pilot, threshold=t, false_positives=fp,
        false_negatives=fn, fp_upper=p_fp, fn_upper=p_fn, epsilon_lower_bound=lb, violation=lb > claimed,
        mechanism=mechanism, noise_multiplier=sigma,
    )
