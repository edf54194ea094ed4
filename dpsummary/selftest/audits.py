"""The Clopper-Pearson audit shared by the single-mechanism scenarios (histogram, quality,
csv-lines, newton): a threshold chosen on pilot runs, error counts on the main runs."""

from __future__ import annotations

from collections.abc import Callable

import numpy as np

from .config import AuditResult, Progress, SelfTestConfig
from .statistics import choose_threshold, epsilon_lower_bound, error_counts


def gaussian_audit(cfg: SelfTestConfig, alpha: float, draw: Callable[[bool], float], *, scenario: str,
                    mechanism: str, sigma: float, claimed: float, progress: Progress | None = None) -> AuditResult:
    """The Clopper-Pearson audit shared by the single-mechanism scenarios: threshold chosen on
    the pilot runs, counted on the main runs. ``draw(canary)`` is one run's score on one side
    (D, or D with the canary); progress is reported under ``scenario`` every 256 runs."""
    done = [0]
    total = 2 * (cfg.pilot + cfg.runs)

    def scores(n: int, canary: bool) -> np.ndarray:
        out = np.empty(n)
        for i in range(n):
            out[i] = draw(canary)
            done[0] += 1
            if progress is not None and (done[0] % 256 == 0 or done[0] == total):
                progress(scenario, done[0], total)
        return out

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
