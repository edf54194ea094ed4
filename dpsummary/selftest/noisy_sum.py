"""White-box audits of DP-PSVI's mechanisms: the Poisson-subsampled noisy clipped sum
(``dirac`` and ``swap`` canaries, batched; the one-run audit) and the DP initialisation
histograms (``histogram``). Registered by :mod:`dpsummary.mechanisms.dp_psvi`."""

from __future__ import annotations

import os
from collections.abc import Callable, Sequence

import numpy as np
import torch

from ..accounting import calibrate_gaussian, epsilon, gaussian_event
from ..models import DTYPE, GaussianMean
from ..private.marginals import HistogramLayout
from .audits import gaussian_audit
from .canaries import block_data, canary_draws, histogram_design, projections
from .config import AuditResult, OneRunResult, Progress, Scenario, SelfTestConfig
from .randomness import NoScaleLayout, make_mechanism
from .statistics import (
    choose_threshold,
    dirac_score,
    epsilon_lower_bound,
    error_counts,
    one_run_epsilon_lower_bound,
    swap_score,
)


def _run_scores(
    runs: Sequence[tuple[Scenario, bool]],
    cfg: SelfTestConfig,
    sigma: float,
    q: float,
    on_call: Callable[[int], None],
) -> np.ndarray:
    """Score every run (T steps each) through the product's ``noisy_clipped_sum``."""
    design, c = cfg.design, cfg.design.clip_norm
    scores = np.zeros(len(runs))
    for lo in range(0, len(runs), cfg.runs_per_call):
        chunk = runs[lo: lo + cfg.runs_per_call]
        k = len(chunk)
        points, bounds = block_data(chunk, design)
        records = make_mechanism(points, inject=cfg.inject, noise_path=cfg.noise, blocks=bounds, block_dim=2)
        model, theta = GaussianMean(k), canary_draws(k)
        swap = np.array([s == "swap" for s, _ in chunk])
        acc = np.zeros(k)
        for _ in range(cfg.steps):
            y = records.noisy_clipped_sum(model, theta, sample_rate=q, clip_norm=c, noise_multiplier=sigma)
            u = projections(y.numpy(), c)
            acc += np.where(
                swap,
                swap_score(u, sample_rate=q, noise_multiplier=sigma, background=design.background),
                dirac_score(u, sample_rate=q, noise_multiplier=sigma),
            )
        scores[lo: lo + k] = acc
        on_call(k)
    return scores


def sum_audits(
    cfg: SelfTestConfig, scenarios: tuple[Scenario, ...], sigma: float, q: float, claimed: float, alpha: float,
    progress: Progress | None,
) -> list[AuditResult]:
    results = []
    pilot_runs = [(s, c) for s in scenarios for c in (False, True) for _ in range(cfg.pilot)]
    main_runs = [(s, c) for s in scenarios for c in (False, True) for _ in range(cfg.runs)]
    thresholds: dict[str, float] = {}
    for stage, runs in (("pilot", pilot_runs), ("main", main_runs)):
        done = [0]

        def on_call(k: int, stage: str = stage, total: int = len(runs), done: list[int] = done) -> None:
            done[0] += k
            if progress is not None:
                progress(stage, done[0], total)

        scores = _run_scores(runs, cfg, sigma, q, on_call)
        n = cfg.pilot if stage == "pilot" else cfg.runs
        for i, scenario in enumerate(scenarios):
            s0 = scores[(2 * i) * n: (2 * i + 1) * n]
            s1 = scores[(2 * i + 1) * n: (2 * i + 2) * n]
            if stage == "pilot":
                thresholds[scenario] = choose_threshold(s0, s1, delta=cfg.delta, alpha=alpha, main_runs=cfg.runs)
                continue
            t = thresholds[scenario]
            fp, fn = error_counts(s0, s1, t)
            lb, p_fp, p_fn = epsilon_lower_bound(fp, n, fn, n, delta=cfg.delta, alpha=alpha)
            results.append(AuditResult(
                scenario=scenario, claimed_epsilon=claimed, delta=cfg.delta, alpha=alpha,
                confidence=1 - alpha, runs_per_side=n, pilot_runs_per_side=cfg.pilot, threshold=t,
                false_positives=fp, false_negatives=fn, fp_upper=p_fp, fn_upper=p_fn,
                epsilon_lower_bound=lb, violation=lb > claimed, mechanism="noisy_clipped_sum", noise_multiplier=sigma,
            ))
    return results


def histogram_audit(cfg: SelfTestConfig, alpha: float, progress: Progress | None = None) -> AuditResult:
    """White-box Clopper-Pearson audit of ``PrivateRecords.noisy_marginals`` (the DP
    initialisation histograms) on :func:`histogram_design` (:func:`layout_audit`)."""
    layout, without, with_canary = histogram_design(cfg.histogram_columns, cfg.design.background)
    return layout_audit(cfg, alpha, layout, without, with_canary, scenario="histogram", progress=progress)


def layout_audit(cfg: SelfTestConfig, alpha: float, layout: HistogramLayout, without: torch.Tensor,
                 with_canary: torch.Tensor, *, scenario: str, progress: Progress | None = None) -> AuditResult:
    """White-box Clopper-Pearson audit of ``PrivateRecords.noisy_marginals`` on ``layout``,
    calibrated on its own: one Gaussian mechanism whose accountant reports ``cfg.epsilon`` at
    ``cfg.delta``. Each run is one call on D (``without``) or D' (``with_canary``); its score,
    the noisy counts' excess over D's counts summed over the canary's bins, is the
    Neyman-Pearson optimal statistic for a Gaussian mean shift. ``inject="no-scale"``: the
    layout's counts are not divided by sqrt(columns) before the noise."""
    sigma = calibrate_gaussian(target_epsilon=cfg.epsilon, delta=cfg.delta, accountant=cfg.accountant)
    claimed = epsilon([gaussian_event(sigma)], cfg.delta, cfg.accountant)
    if cfg.inject == "no-scale":
        layout = NoScaleLayout(layout.columns, layout.num_features)
    expected = layout.counts(without)
    direction = layout.counts(with_canary) - expected  # 1 on each of the canary's bins
    sides = [make_mechanism(rows, inject=cfg.inject, noise_path=cfg.noise) for rows in (without, with_canary)]

    def draw(canary: bool) -> float:
        noisy = sides[int(canary)].noisy_marginals(layout, noise_multiplier=sigma).noisy_counts
        return float(np.asarray(noisy - expected) @ direction)

    return gaussian_audit(cfg, alpha, draw, scenario=scenario, mechanism="noisy_marginals",
                          sigma=sigma, claimed=claimed, progress=progress)


def one_run_audit(
    cfg: SelfTestConfig, sigma: float, q: float, claimed: float, alpha: float, progress: Progress | None = None
) -> OneRunResult:
    """Steinke, Nasr, Jagielski (2023): m Dirac canaries in orthogonal directions, each included
    with probability 1/2 (OS entropy), ONE execution of T steps of the mechanism on the resulting
    data set (plus zero-vector background records). Canary j's score is its summed Dirac
    statistic; the auditor guesses "in" for the k highest and "out" for the k lowest scores, for
    each k of a fixed grid, at level alpha / len(grid) (Bonferroni)."""
    m, design, c = cfg.one_run_canaries, cfg.design, cfg.design.clip_norm
    included = np.frombuffer(os.urandom(m), dtype=np.uint8) & 1 == 1
    points = torch.zeros(m, m, dtype=DTYPE)
    points[np.arange(m), np.arange(m)] = design.offset
    points = torch.cat([points[torch.from_numpy(included)], torch.zeros(design.background, m, dtype=DTYPE)])
    records = make_mechanism(points, inject=cfg.inject, noise_path=cfg.noise)  # one data set, one run
    model, theta = GaussianMean(m), canary_draws(m)
    scores = np.zeros(m)
    for t in range(cfg.steps):
        y = records.noisy_clipped_sum(model, theta, sample_rate=q, clip_norm=c, noise_multiplier=sigma)
        scores += dirac_score(projections(y.numpy(), c), sample_rate=q, noise_multiplier=sigma)
        if progress is not None:
            progress("one-run", t + 1, cfg.steps)
    order = np.argsort(-scores, kind="stable")
    grid = [k for k in cfg.one_run_k_grid if 2 * k <= m] or [m // 2]
    a_each = alpha / len(grid)
    best: tuple[float, int, int, int] = (0.0, 0, 0, grid[0])
    for k in grid:
        v = int(included[order[:k]].sum() + (~included[order[m - k:]]).sum())
        lb = one_run_epsilon_lower_bound(m, 2 * k, v, delta=cfg.one_run_delta, alpha=a_each)
        if lb > best[0] or best[1] == 0:
            best = (lb, 2 * k, v, k)
    lb, r, v, k = best
    return OneRunResult(
        claimed_epsilon=claimed, delta=cfg.one_run_delta, alpha=alpha, confidence=1 - alpha,
        canaries=m, included=int(included.sum()), guesses=r, correct=v, k=k,
        epsilon_lower_bound=lb, violation=lb > claimed,
    )
