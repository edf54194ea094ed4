"""The self-test's statistics: Clopper-Pearson and one-run lower bounds on epsilon, the canary
scores (log-likelihood ratios) and the pilot threshold. Pure functions of counts and scores."""

from __future__ import annotations

import math

import numpy as np
from scipy import stats


def clopper_pearson_upper(successes: int, trials: int, alpha: float) -> float:
    """One-sided upper confidence bound (level 1 - alpha) on a binomial proportion."""
    if trials < 1:
        return 1.0
    if successes >= trials:
        return 1.0
    return float(stats.beta.ppf(1.0 - alpha, successes + 1, trials - successes))


def epsilon_lower_bound(
    false_positives: int, negatives: int, false_negatives: int, positives: int, *, delta: float, alpha: float
) -> tuple[float, float, float]:
    """``(eps_LB, pFP, pFN)`` from a threshold test's error counts (Jagielski et al. 2020).

    ``negatives`` runs without the canary gave ``false_positives`` "canary" guesses; ``positives``
    runs with it gave ``false_negatives`` "no canary" guesses. pFP and pFN are Clopper-Pearson upper
    bounds at level alpha/2 each, so both hold simultaneously with probability >= 1 - alpha. An
    (eps, delta)-DP mechanism forces FP + e^eps FN >= 1 - delta and FN + e^eps FP >= 1 - delta
    for every test, hence eps >= ln((1 - delta - FN)/FP) and eps >= ln((1 - delta - FP)/FN);
    both expressions decrease in FP and FN, so the upper bounds keep them valid.
    """
    p_fp = clopper_pearson_upper(false_positives, negatives, alpha / 2)
    p_fn = clopper_pearson_upper(false_negatives, positives, alpha / 2)
    best = 0.0
    for num, den in ((1.0 - delta - p_fn, p_fp), (1.0 - delta - p_fp, p_fn)):
        if num > 0 and den > 0:
            best = max(best, math.log(num / den))
    return best, p_fp, p_fn


def one_run_p_value(m: int, r: int, v: int, eps: float, delta: float) -> float:
    """P[at least v of r guesses correct] under (eps, delta)-DP (Steinke, Nasr, Jagielski 2023).

    m canaries, each included independently with probability 1/2; the auditor guesses membership
    for r of them. Under eps-DP the number of correct guesses is stochastically dominated by
    Bin(r, p) with p = e^eps / (1 + e^eps); delta adds 2 m delta max_{1<=i<=v} P[v-i <= Bin < v] / i.
    """
    if not (0 <= v <= r <= m):
        raise ValueError("need 0 <= v <= r <= m")
    p = 1.0 / (1.0 + math.exp(-eps))
    tail = float(stats.binom.sf(v - 1, r, p))
    if v == 0 or delta == 0:
        return min(tail, 1.0)
    i = np.arange(1, v + 1)
    cdf_below_v = float(stats.binom.cdf(v - 1, r, p))
    window = cdf_below_v - stats.binom.cdf(v - 1 - i, r, p)  # P[v-i <= Bin <= v-1]
    return float(min(1.0, tail + 2.0 * m * delta * float(np.max(window / i))))


def one_run_epsilon_lower_bound(m: int, r: int, v: int, *, delta: float, alpha: float) -> float:
    """Largest eps (to 1e-4) at which ``v`` correct guesses out of ``r`` still have p-value <= alpha.

    The p-value increases with eps, so every eps' below the returned value is rejected at level
    alpha: the mechanism is not (eps', delta)-DP, with confidence 1 - alpha.
    """
    if r == 0 or one_run_p_value(m, r, v, 0.0, delta) > alpha:
        return 0.0
    lo, hi = 0.0, 1.0
    while one_run_p_value(m, r, v, hi, delta) <= alpha:
        lo, hi = hi, 2 * hi
        if hi > 100:
            return lo
    while hi - lo > 1e-4:
        mid = 0.5 * (lo + hi)
        if one_run_p_value(m, r, v, mid, delta) <= alpha:
            lo = mid
        else:
            hi = mid
    return lo


def dirac_score(u: np.ndarray, *, sample_rate: float, noise_multiplier: float) -> np.ndarray:
    """Per-step log-likelihood ratio for the Dirac canary, ``u = <y, c_hat> / C``.

    Without the canary the projection of the step's output y on the canary direction c_hat is
    N(0, (sigma C)^2); with it, the canary is included with probability q and adds its clipped
    vector, of norm exactly C along c_hat: q N(C, (sigma C)^2) + (1 - q) N(0, (sigma C)^2). The
    orthogonal coordinates carry the same distribution in both worlds and cancel. The ratio is

        p1(y)/p0(y) = (1 - q) + q exp( (2 <y,c_hat> C - C^2) / (2 sigma^2 C^2) )
                    = (1 - q) + q exp( (u - 1/2) / sigma^2 ),

    evaluated with logaddexp. Steps have independent coins and noise, so a run's statistic is
    the sum over its T steps (Neyman-Pearson optimal for this pair of data sets).
    """
    q, s2 = sample_rate, noise_multiplier**2
    return np.logaddexp(math.log1p(-q), math.log(q) + (u - 0.5) / s2)


def swap_score(u: np.ndarray, *, sample_rate: float, noise_multiplier: float, background: int) -> np.ndarray:
    """Per-step statistic for the swap canary (``background`` records at -c, canary at +c).

    ``v = u + q * background`` centres the background's expected projection. If the canary's
    inclusion displaces one background record (fixed-size batches), the projection moves by 2C;
    the score is the log-likelihood ratio of that alternative,
    (1 - q) + q exp( (2 v - 2) / sigma^2 ) (the Dirac formula with a shift of 2C). Under Poisson
    sampling the background count varies, which only costs this statistic power.
    """
    q, s2 = sample_rate, noise_multiplier**2
    v = u + q * background
    return np.logaddexp(math.log1p(-q), math.log(q) + (2.0 * v - 2.0) / s2)


def error_counts(s0: np.ndarray, s1: np.ndarray, threshold: float) -> tuple[int, int]:
    """(false positives, false negatives) of the test "canary iff score >= threshold"."""
    return int(np.sum(s0 >= threshold)), int(np.sum(s1 < threshold))


def choose_threshold(
    s0: np.ndarray, s1: np.ndarray, *, delta: float, alpha: float, main_runs: int | None = None, grid: int = 512
) -> float:
    """The pilot threshold for the test "canary iff score >= threshold" (uses pilot runs only).

    Among (up to ``grid``) observed pilot scores, pick the one whose Clopper-Pearson lower bound
    is largest when the pilot's error *rates* are projected onto ``main_runs`` runs per side (the
    expected counts of the main audit; default: the pilot size). Projecting matters: the best
    threshold for 10^4 runs lies further in the tail than the best one for 2500.
    """
    pooled = np.unique(np.concatenate([s0, s1]))
    if pooled.size > grid:
        pooled = pooled[np.unique(np.linspace(0, pooled.size - 1, grid).round().astype(int))]
    s0s, s1s = np.sort(s0), np.sort(s1)
    n0, n1 = s0s.size, s1s.size
    n = main_runs or min(n0, n1)
    best_t, best = float(pooled[-1]), -1.0
    for t in pooled:
        fp = n0 - int(np.searchsorted(s0s, t, "left"))
        fn = int(np.searchsorted(s1s, t, "left"))
        lb = epsilon_lower_bound(round(fp * n / n0), n, round(fn * n / n1), n, delta=delta, alpha=alpha)[0]
        if lb > best:
            best, best_t = lb, float(t)
    return best_t
