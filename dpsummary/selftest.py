"""Empirical privacy self-test: does the implementation leak more than the accountant claims?

Proofs cover the algorithm; bugs live in the code. This module runs the product's own mechanism
(:meth:`dpsummary.private.mechanism.PrivateRecords.noisy_clipped_sum`: its Poisson coins, its
clipping, its OpenDP noise) on neighbouring data sets D and D + canary many times and derives a
statistically valid *lower* bound on epsilon. A lower bound above the accountant's epsilon proves
a violation; a lower bound below it proves nothing about privacy (it only shows that the audit
found no gross implementation bug). See ``docs/SELFTEST.md``.

Audits
------
1. White-box Clopper-Pearson audit (Jagielski, Ullman, Oprea 2020; Nasr et al. 2021, 2023).
   Two canary designs, each a pair (D, D + canary) fixed before any run:

   * ``dirac``: the other records' centred log-likelihood vectors are exactly zero, the canary's
     clipped vector has norm exactly C in a fixed direction c (verified numerically by
     :func:`check_canary_design`). This is the worst case of add/remove adjacency for the
     subsampled Gaussian mechanism; the Neyman-Pearson optimal statistic is the log-likelihood
     ratio summed over the T steps (:func:`dirac_score`).
   * ``swap``: the other records point in the opposite direction -c with norm C. Under correct
     Poisson sampling the canary's inclusion is independent of theirs; under fixed-size batches
     the canary *displaces* a record, the projection moves by 2C and the audit sees it
     (:func:`swap_score`).

   Each run is scored, a threshold is chosen on separate pilot runs, and the false-positive and
   false-negative counts of the main runs give Clopper-Pearson upper bounds pFP, pFN and

       eps_LB = max( ln((1 - delta - pFN) / pFP), ln((1 - delta - pFP) / pFN) ),

   valid with probability >= 1 - alpha whenever the mechanism is (eps, delta)-DP.

2. One-run audit (Steinke, Nasr, Jagielski 2023): m canaries, each included with probability
   1/2 in ONE data set, one execution of T steps; the auditor guesses membership for the k
   highest and k lowest scores (k from a small grid, Bonferroni-corrected), and
   :func:`one_run_epsilon_lower_bound` turns v correct out of r guesses into a lower bound.

   A third scenario, ``histogram``, audits the other mechanism a release runs on private
   records, :meth:`PrivateRecords.noisy_marginals` (DP-PSVI's initialisation histograms), with
   the same Clopper-Pearson machinery and its own calibration (one Gaussian mechanism at the
   claimed epsilon): D has records in category 0 of every column, the canary sits in category 1
   of every column, the worst case of add/remove (:func:`histogram_audit`).

   A fourth scenario, ``quality``, audits the release's handling of invalid records: the total
   per-record rules and the noisy data-quality counts (:func:`quality_audit`). D is a clean CSV; the
   canary is one record that every rule touches (undecodable bytes in a numeric field, an unseen
   category, a missing target). The audited path is the product's own: the pyarrow reader, the
   total encoding and ``noisy_quality_counts``; the observation is "refused" or the noisy counts.
   A release that refused on a single invalid record (injected bug ``refuse-invalid``, the old
   behaviour) is distinguishable with certainty and the lower bound exceeds any claim.

   A fifth scenario, ``csv-lines``, audits the record count under the CSV line neighbours of
   issue 24 (an unclosed quote after the header, in the middle and on the last line, a lone
   quote, a quoted newline, a bare CR; :func:`csv_lines_audit`): the product's reader must move
   the exact count by at most one, and the noisy count is audited against the neighbour that
   moved it most. The injected bug ``multiline-csv`` (a quoted field may run across lines, the
   old reading) swallows every record after an unclosed quote: detected with certainty.

3. Gray-box replay (Cebere et al. 2026): the full DP-PSVI constructor on D and D + canary with
   identical (recorded, non-private) randomness: same control flow, same shapes, and the
   pre-noise sum moves by at most C (:func:`gray_box_replay`).

4. The BNN mechanism (``dp-bb-psvi``, :mod:`dpsummary.private.bnn`; :func:`bnn_checks`): the
   released noise's standard deviation against the analytic ``sigma * C`` through the release
   path (noise pool included), the accountant's epsilon for its events reproduced by Opacus's
   own RDP accountant, and the gray-box replay of the full private BB-PSVI loop on D and
   D + canary in sensitivity units (:func:`bnn_gray_box_replay`, the same verdict as 3).

Batching runs
-------------
A run is T calls of ``noisy_clipped_sum``. To make tens of thousands of runs affordable, K runs
share one call: the model is :class:`~dpsummary.models.GaussianMean` in K dimensions and the S = 2K
posterior draws are ``+e_j, -e_j``; a record ``x * e_j`` then has the centred log-likelihood
vector ``x * (e_{2j} - e_{2j+1})``, non-zero only in run j's two coordinates. Because the
product's coins are independent per record and its noise independent per coordinate, the
output's coordinates (2j, 2j+1) are distributed exactly as one run of the mechanism on run j's
records alone (cross-run leakage is floating-point rounding, checked to be below 1e-12 C).

Noise paths
-----------
``noise="opendp"`` (default) audits the product's noise (:class:`SystemRandomness`: OS-entropy
coins and OpenDP's discrete Gaussian). ``noise="numpy"`` keeps the product's coins, clipping and
mechanism code but replaces the noise by a vectorised numpy Gaussian (PCG64 seeded from OS
entropy), several times faster; results say which path was audited.

Bug injection
-------------
``inject`` replaces one piece of the product by a known bug, everything else unchanged:
``no-clip`` (:class:`NoClipRecords`), ``half-noise`` (:class:`HalfNoiseRandomness`),
``fixed-size`` (:class:`FixedSizeRandomness`: exactly round(qn) records per step, still
accounted as Poisson), ``fixed-seed`` (:class:`FixedSeedRandomness`: noise from a generator
re-seeded with one constant seed at every call) and ``no-scale`` (:class:`NoScaleLayout`: the
initialisation histograms forget their 1/sqrt(columns) scaling), ``refuse-invalid`` (the
release refuses when one record has an invalid value, the behaviour issue 13 removed) and
``multiline-csv`` (:func:`_multiline_csv`: a quoted CSV field runs across lines, the reading
issue 24 removed).
"""

from __future__ import annotations

import math
import os
import time
from collections.abc import Callable, Iterator, Sequence
from contextlib import contextmanager
from dataclasses import asdict, dataclass, field
from pathlib import Path
from typing import Any, Literal

import numpy as np
import torch
from scipy import stats

from .accounting import (
    Accountant,
    calibrate_gaussian,
    calibrate_noise_multiplier,
    epsilon,
    gaussian_event,
    subsampled_gaussian_event,
)
from .models import DTYPE, GaussianMean, LogisticRegression, Model
from .private import noise
from .private.marginals import ColumnBins, HistogramLayout
from .private.mechanism import PrivacyRandomness, PrivateRecords, SystemRandomness, clip_rows
from .private.sampling import poisson_indices

Injection = Literal["none", "no-clip", "half-noise", "fixed-size", "fixed-seed", "no-scale", "refuse-invalid",
                    "multiline-csv"]
INJECTIONS: tuple[Injection, ...] = ("none", "no-clip", "half-noise", "fixed-size", "fixed-seed", "no-scale",
                                     "refuse-invalid", "multiline-csv")
NoisePath = Literal["opendp", "numpy"]
NOISE_PATHS: tuple[NoisePath, ...] = ("opendp", "numpy")
Scenario = Literal["dirac", "swap", "histogram", "quality", "newton", "csv-lines"]
SCENARIOS: tuple[Scenario, ...] = ("dirac", "swap", "histogram", "quality", "newton", "csv-lines")
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


# =========================================================================== statistics


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


# =========================================================================== randomness and bugs


class NumpyGaussianRandomness:
    """The fast noise path: the product's sampler (:func:`dpsummary.private.sampling.poisson_indices`,
    exact Poisson sampling from OS entropy; :func:`noise.poisson_mask` for ``coins``) and a
    vectorised numpy Gaussian from a PCG64 generator seeded from OS entropy. Not the product's
    noise (OpenDP's discrete Gaussian); results audited with it say so."""

    def __init__(self) -> None:
        self._rng = np.random.default_rng()  # seeded from OS entropy

    def coins(self, num_records: int, sample_rate: float) -> np.ndarray:
        return noise.poisson_mask(num_records, sample_rate)

    def sample_indices(self, num_records: int, sample_rate: float) -> np.ndarray:
        return poisson_indices(num_records, sample_rate)

    def gaussian(self, values: np.ndarray, *, noise_std: float, clip_norm: float) -> np.ndarray:
        values = np.asarray(values, dtype=np.float64)
        return values + noise_std * self._rng.standard_normal(values.shape[0])


class HalfNoiseRandomness:
    """Bug: the noise standard deviation is halved (coins and noise sampler otherwise unchanged)."""

    def __init__(self, base: PrivacyRandomness) -> None:
        self.base = base

    def coins(self, num_records: int, sample_rate: float) -> np.ndarray:
        return self.base.coins(num_records, sample_rate)

    def sample_indices(self, num_records: int, sample_rate: float) -> np.ndarray:
        return self.base.sample_indices(num_records, sample_rate)

    def gaussian(self, values: np.ndarray, *, noise_std: float, clip_norm: float) -> np.ndarray:
        return self.base.gaussian(values, noise_std=noise_std / 2, clip_norm=clip_norm)


class FixedSizeRandomness:
    """Bug: exactly round(q n) records per step, drawn without replacement (OS entropy), while
    the accountant is still told "Poisson with rate q".

    ``blocks`` lists the (start, stop) record ranges of independent data sets sharing one call
    (batched runs); each gets its own fixed-size batch. ``None``: one data set.
    """

    def __init__(self, base: PrivacyRandomness, blocks: Sequence[tuple[int, int]] | None = None) -> None:
        self.base = base
        self.blocks = None if blocks is None else list(blocks)
        self._rng = np.random.default_rng()

    def coins(self, num_records: int, sample_rate: float) -> np.ndarray:
        blocks = self.blocks if self.blocks is not None else [(0, num_records)]
        starts = np.array([b[0] for b in blocks], dtype=np.int64)
        sizes = np.array([b[1] - b[0] for b in blocks], dtype=np.int64)
        if int(sizes.sum()) != num_records or np.any(starts != np.concatenate([[0], np.cumsum(sizes)[:-1]])):
            raise ValueError("blocks must tile the records contiguously")
        take = np.array([round(sample_rate * int(s)) for s in sizes], dtype=np.int64)
        block_of = np.repeat(np.arange(len(blocks)), sizes)
        order = np.lexsort((self._rng.random(num_records), block_of))  # random order within blocks
        rank = np.empty(num_records, dtype=np.int64)
        rank[order] = np.arange(num_records) - starts[block_of[order]]
        return rank < take[block_of]

    def sample_indices(self, num_records: int, sample_rate: float) -> np.ndarray:
        return np.flatnonzero(self.coins(num_records, sample_rate))

    def gaussian(self, values: np.ndarray, *, noise_std: float, clip_norm: float) -> np.ndarray:
        return self.base.gaussian(values, noise_std=noise_std, clip_norm=clip_norm)


class FixedSeedRandomness:
    """Bug: the noise generator is re-created from one constant seed at every call, so every step
    (and every run) adds the same noise vector. Coins are the base's.

    ``block_dim``: output coordinates per data set when several share one call (the noise vector
    is repeated per data set, exactly as separate runs with the same seed would see it).
    """

    SEED = 20230512

    def __init__(self, base: PrivacyRandomness, block_dim: int | None = None) -> None:
        self.base = base
        self.block_dim = block_dim

    def coins(self, num_records: int, sample_rate: float) -> np.ndarray:
        return self.base.coins(num_records, sample_rate)

    def sample_indices(self, num_records: int, sample_rate: float) -> np.ndarray:
        return self.base.sample_indices(num_records, sample_rate)

    def gaussian(self, values: np.ndarray, *, noise_std: float, clip_norm: float) -> np.ndarray:
        values = np.asarray(values, dtype=np.float64)
        dim = self.block_dim or values.shape[0]
        z = np.random.default_rng(self.SEED).standard_normal(dim)
        return values + noise_std * np.tile(z, values.shape[0] // dim)


class NoClipRecords(PrivateRecords):
    """Bug: clipping disabled. The product's method is called with the clip norm inflated by
    :attr:`INFLATION` (so no realistic vector is clipped) and the noise multiplier deflated by the
    same factor (so the noise standard deviation sigma * C is unchanged)."""

    __slots__ = ()
    INFLATION = 1e6

    def noisy_clipped_sum(
        self, model: Model, theta: torch.Tensor, *, sample_rate: float, clip_norm: float, noise_multiplier: float
    ) -> torch.Tensor:
        return super().noisy_clipped_sum(
            model, theta, sample_rate=sample_rate, clip_norm=clip_norm * self.INFLATION,
            noise_multiplier=noise_multiplier / self.INFLATION,
        )

    def noisy_score_statistics(
        self, model: Model, theta: torch.Tensor, *, score_bound: float, curvature_bound: float,
        score_noise_multiplier: float, curvature_noise_multiplier: float,
    ) -> Any:
        return super().noisy_score_statistics(
            model, theta, score_bound=score_bound * self.INFLATION, curvature_bound=curvature_bound * self.INFLATION,
            score_noise_multiplier=score_noise_multiplier / self.INFLATION,
            curvature_noise_multiplier=curvature_noise_multiplier / self.INFLATION,
        )


@dataclass(frozen=True)
class NoScaleLayout(HistogramLayout):
    """Bug: the histogram counts are not divided by sqrt(number of columns) before the noise, so
    one record moves the noised vector by sqrt(K) (K columns) while the accountant is told 1."""

    @property
    def scale(self) -> float:
        return noise.count_vector_scale(1, self.num_bins)


def base_randomness(noise_path: NoisePath) -> PrivacyRandomness:
    if noise_path == "opendp":
        return SystemRandomness()
    if noise_path == "numpy":
        return NumpyGaussianRandomness()
    raise ValueError(f"unknown noise path {noise_path!r}; choose one of {', '.join(NOISE_PATHS)}")


def make_mechanism(
    points: torch.Tensor,
    *,
    inject: Injection = "none",
    noise_path: NoisePath = "opendp",
    blocks: Sequence[tuple[int, int]] | None = None,
    block_dim: int | None = None,
) -> PrivateRecords:
    """The product's :class:`PrivateRecords` over ``points`` with one injected bug (or none)."""
    if inject not in INJECTIONS:
        raise ValueError(f"unknown injection {inject!r}; choose one of {', '.join(INJECTIONS)}")
    rnd = base_randomness(noise_path)
    if inject == "half-noise":
        rnd = HalfNoiseRandomness(rnd)
    elif inject == "fixed-size":
        rnd = FixedSizeRandomness(rnd, blocks)
    elif inject == "fixed-seed":
        rnd = FixedSeedRandomness(rnd, block_dim)
    cls = NoClipRecords if inject == "no-clip" else PrivateRecords
    return cls(points, randomness=rnd)


# =========================================================================== batched canary design


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


def _draws(k: int) -> torch.Tensor:
    """S = 2k posterior draws, interleaved: theta_{2j} = +e_j, theta_{2j+1} = -e_j (all norm 1)."""
    eye = torch.eye(k, dtype=DTYPE)
    return torch.stack([eye, -eye], dim=1).reshape(2 * k, k)


def _block_data(
    runs: Sequence[tuple[Scenario, bool]], design: Design
) -> tuple[torch.Tensor, list[tuple[int, int]]]:
    """Records for K batched runs: run j lives in dimension j; returns points and record ranges."""
    k, x = len(runs), design.offset
    rows: list[torch.Tensor] = []
    bounds: list[tuple[int, int]] = []
    start = 0
    for j, (scenario, canary) in enumerate(runs):
        n = design.background + int(canary)
        block = torch.zeros(n, k, dtype=DTYPE)
        if scenario == "swap":
            block[: design.background, j] = -x
        if canary:
            block[-1, j] = x
        rows.append(block)
        bounds.append((start, start + n))
        start += n
    return torch.cat(rows), bounds


def _projections(y: np.ndarray, clip_norm: float) -> np.ndarray:
    """u_j = <y_(2j, 2j+1), (1, -1)/sqrt 2> / C for every batched run j."""
    y = np.asarray(y, dtype=np.float64).reshape(-1, 2)
    return (y[:, 0] - y[:, 1]) / (math.sqrt(2.0) * clip_norm)


@dataclass(frozen=True)
class CanaryCheck:
    """Numerical verification of the canary design through the product's own functions."""

    clip_norm: float
    canary_clipped_norm: float
    canary_cosine: float
    dirac_background_max_norm: float
    swap_background_projection: float
    cross_run_leak_max: float
    ok: bool


def check_canary_design(design: Design, k: int = 4) -> CanaryCheck:
    """Compute every record's clipped centred vector exactly as the mechanism does
    (``model.log_likelihood``, centring over the draws, :func:`clip_rows` at C minus the rounding
    slack) and check the design: the canary has norm C (within the slack) along (1, -1)/sqrt 2 in
    its own run's coordinates, dirac background vectors vanish, swap background vectors are -C
    along the same direction, and nothing leaks into other runs' coordinates (< 1e-12 C)."""
    c = design.clip_norm
    extra: list[tuple[Scenario, bool]] = [("dirac", False)] * (k - 2)
    runs: list[tuple[Scenario, bool]] = [("dirac", True), ("swap", True), *extra]
    points, bounds = _block_data(runs, design)
    model = GaussianMean(k)
    theta = _draws(k)
    slack = noise.rounding_slack(c, 2 * k)
    with torch.no_grad():
        ll = model.log_likelihood(points, theta)
        clipped = clip_rows(ll - ll.mean(1, keepdim=True), c - slack).numpy()
    direction = np.zeros(2 * k)
    leak = 0.0
    norms_canary, cos_canary, bg_dirac, bg_swap = [], [], 0.0, []
    for j, ((scenario, canary), (lo, hi)) in enumerate(zip(runs, bounds, strict=True)):
        direction[:] = 0.0
        direction[2 * j], direction[2 * j + 1] = 1 / math.sqrt(2), -1 / math.sqrt(2)
        own = np.zeros(2 * k, dtype=bool)
        own[2 * j: 2 * j + 2] = True
        block = clipped[lo:hi]
        leak = max(leak, float(np.abs(block[:, ~own]).max(initial=0.0)))
        if canary:
            v = block[-1]
            norms_canary.append(float(np.linalg.norm(v)))
            cos_canary.append(float(v @ direction / np.linalg.norm(v)))
        bg = block[: design.background]
        if scenario == "dirac":
            bg_dirac = max(bg_dirac, float(np.linalg.norm(bg, axis=1).max(initial=0.0)))
        else:
            bg_swap.extend((bg @ direction).tolist())
    canary_norm = min(norms_canary)
    ok = (
        c - 2 * slack - 1e-12 * c <= canary_norm <= c
        and max(norms_canary) <= c
        and min(cos_canary) >= 1 - 1e-12
        and bg_dirac <= 1e-12 * c
        and all(abs(p + c) <= 2 * slack + 1e-12 * c for p in bg_swap)
        and leak <= 1e-12 * c
    )
    return CanaryCheck(
        clip_norm=c, canary_clipped_norm=canary_norm, canary_cosine=min(cos_canary),
        dirac_background_max_norm=bg_dirac, swap_background_projection=float(np.mean(bg_swap)),
        cross_run_leak_max=leak, ok=bool(ok),
    )


# =========================================================================== configuration and results


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


# =========================================================================== white-box audit


@contextmanager
def _torch_threads(n: int | None) -> Iterator[None]:
    if n is None:
        yield
        return
    old = torch.get_num_threads()
    torch.set_num_threads(n)
    try:
        yield
    finally:
        torch.set_num_threads(old)


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
        points, bounds = _block_data(chunk, design)
        records = make_mechanism(points, inject=cfg.inject, noise_path=cfg.noise, blocks=bounds, block_dim=2)
        model, theta = GaussianMean(k), _draws(k)
        swap = np.array([s == "swap" for s, _ in chunk])
        acc = np.zeros(k)
        for _ in range(cfg.steps):
            y = records.noisy_clipped_sum(model, theta, sample_rate=q, clip_norm=c, noise_multiplier=sigma)
            u = _projections(y.numpy(), c)
            acc += np.where(
                swap,
                swap_score(u, sample_rate=q, noise_multiplier=sigma, background=design.background),
                dirac_score(u, sample_rate=q, noise_multiplier=sigma),
            )
        scores[lo: lo + k] = acc
        on_call(k)
    return scores


def _counts(s0: np.ndarray, s1: np.ndarray, threshold: float) -> tuple[int, int]:
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


def white_box_audits(
    cfg: SelfTestConfig, sigma: float, q: float, claimed: float, alpha: float, progress: Progress | None = None
) -> list[AuditResult]:
    """The Clopper-Pearson audits of every scenario in ``cfg.scenarios`` (each at level ``alpha``):
    the noisy-sum scenarios at ``sigma``, ``q`` (claim ``claimed``), then the histogram one."""
    sum_scenarios = tuple(s for s in cfg.scenarios if s in SUM_SCENARIOS)
    results = _sum_audits(cfg, sum_scenarios, sigma, q, claimed, alpha, progress) if sum_scenarios else []
    if "histogram" in cfg.scenarios:
        results.append(histogram_audit(cfg, alpha, progress))
    if "quality" in cfg.scenarios:
        results.append(quality_audit(cfg, alpha, progress))
    if "newton" in cfg.scenarios:
        results.append(newton_audit(cfg, alpha, progress))
    if "csv-lines" in cfg.scenarios:
        results.append(csv_lines_audit(cfg, alpha, progress))
    return results


def _sum_audits(
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
            fp, fn = _counts(s0, s1, t)
            lb, p_fp, p_fn = epsilon_lower_bound(fp, n, fn, n, delta=cfg.delta, alpha=alpha)
            results.append(AuditResult(
                scenario=scenario, claimed_epsilon=claimed, delta=cfg.delta, alpha=alpha,
                confidence=1 - alpha, runs_per_side=n, pilot_runs_per_side=cfg.pilot, threshold=t,
                false_positives=fp, false_negatives=fn, fp_upper=p_fp, fn_upper=p_fn,
                epsilon_lower_bound=lb, violation=lb > claimed, mechanism="noisy_clipped_sum", noise_multiplier=sigma,
            ))
    return results


def _gaussian_audit(cfg: SelfTestConfig, alpha: float, scores: Callable[[int, bool], np.ndarray], *, scenario: str,
                    mechanism: str, sigma: float, claimed: float) -> AuditResult:
    """The Clopper-Pearson audit shared by the single-mechanism scenarios: threshold chosen on
    the pilot runs, counted on the main runs; ``scores(n, canary)`` draws n runs of one side."""
    t = choose_threshold(scores(cfg.pilot, False), scores(cfg.pilot, True), delta=cfg.delta, alpha=alpha,
                         main_runs=cfg.runs)
    fp, fn = _counts(scores(cfg.runs, False), scores(cfg.runs, True), t)
    lb, p_fp, p_fn = epsilon_lower_bound(fp, cfg.runs, fn, cfg.runs, delta=cfg.delta, alpha=alpha)
    return AuditResult(
        scenario=scenario, claimed_epsilon=claimed, delta=cfg.delta, alpha=alpha, confidence=1 - alpha,
        runs_per_side=cfg.runs, pilot_runs_per_side=cfg.pilot, threshold=t, false_positives=fp,
        false_negatives=fn, fp_upper=p_fp, fn_upper=p_fn, epsilon_lower_bound=lb, violation=lb > claimed,
        mechanism=mechanism, noise_multiplier=sigma,
    )


def histogram_design(columns: int, background: int) -> tuple[HistogramLayout, torch.Tensor, torch.Tensor]:
    """The "histogram" canary design: a layout of ``columns`` categorical columns with two
    categories each (one-hot, model space); D = ``background`` records in category 0 of every
    column; D' = D + a canary in category 1 of every column. The canary changes ``columns``
    counts by 1, so after the layout's 1/sqrt(columns) scaling it moves the noised vector by
    exactly the sensitivity (1, up to the noise grid's slack): the worst case of add/remove for
    this Gaussian mechanism. Returns (layout, D, D')."""
    layout = HistogramLayout(
        tuple(ColumnBins(f"c{j}", "categorical", 2 * j, 2) for j in range(columns)), 2 * columns
    )
    without = torch.zeros(background, 2 * columns, dtype=DTYPE)
    without[:, 0::2] = 1.0
    canary = torch.zeros(1, 2 * columns, dtype=DTYPE)
    canary[:, 1::2] = 1.0
    return layout, without, torch.cat([without, canary])


def histogram_audit(cfg: SelfTestConfig, alpha: float, progress: Progress | None = None) -> AuditResult:
    """White-box Clopper-Pearson audit of ``PrivateRecords.noisy_marginals`` (the DP
    initialisation histograms), calibrated on its own: one Gaussian mechanism whose accountant
    reports ``cfg.epsilon`` at ``cfg.delta``. Each run is one call on D or D' (see
    :func:`histogram_design`); its score, the noisy counts' excess over D's counts summed over the
    canary's bins, is the Neyman-Pearson optimal statistic for a Gaussian mean shift."""
    sigma = calibrate_gaussian(target_epsilon=cfg.epsilon, delta=cfg.delta, accountant=cfg.accountant)
    claimed = epsilon([gaussian_event(sigma)], cfg.delta, cfg.accountant)
    layout, without, with_canary = histogram_design(cfg.histogram_columns, cfg.design.background)
    if cfg.inject == "no-scale":
        layout = NoScaleLayout(layout.columns, layout.num_features)
    expected = layout.counts(without)
    direction = layout.counts(with_canary) - expected  # 1 on each of the canary's bins
    done = [0]
    total = 2 * (cfg.pilot + cfg.runs)

    def scores(n: int, canary: bool) -> np.ndarray:
        records = make_mechanism(with_canary if canary else without, inject=cfg.inject, noise_path=cfg.noise)
        out = np.empty(n)
        for i in range(n):
            noisy = records.noisy_marginals(layout, noise_multiplier=sigma).noisy_counts
            out[i] = float((noisy - expected) @ direction)
            done[0] += 1
            if progress is not None and (done[0] % 256 == 0 or done[0] == total):
                progress("histogram", done[0], total)
        return out

    return _gaussian_audit(cfg, alpha, scores, scenario="histogram", mechanism="noisy_marginals",
                           sigma=sigma, claimed=claimed)


#: The "quality" scenario's public schema and canary (one record every data-quality rule touches).
QUALITY_SCHEMA: dict[str, Any] = {
    "target": "y",
    "columns": [
        {"name": "x1", "kind": "numeric", "lower": 0, "upper": 10},
        {"name": "x2", "kind": "categorical", "categories": ["a", "b", "c"]},
        {"name": "y", "kind": "categorical", "categories": ["no", "yes"]},
    ],
}
QUALITY_CANARY = b"\xff\xfe,zzz,"


def quality_design(background: int) -> tuple[bytes, bytes]:
    """The "quality" canary design: D = ``background`` clean records (CSV bytes); D' = D plus
    :data:`QUALITY_CANARY`: undecodable bytes in the numeric column (so also an imputed numeric),
    an unseen category and a missing target (so also dropped). It adds exactly 1 to each of the
    four released quality counts, the worst case of add/remove for that mechanism."""
    rows = [b"x1,x2,y"] + [f"{(3 * i) % 10}.5,{'abc'[i % 3]},{('no', 'yes')[i % 2]}".encode() for i in range(background)]
    clean = b"\n".join(rows) + b"\n"
    return clean, clean + QUALITY_CANARY + b"\n"


def quality_outcome(path: Any, *, inject: Injection = "none") -> Any:
    """The release's record handling on one file: the encoded source, or None when the release
    would refuse. ``inject="refuse-invalid"`` restores the removed behaviour (strict parsing:
    one invalid value refuses the release)."""
    from .data import DataError, Schema, Transform
    from .policy import DataQuality
    from .private.source import PrivateSource

    schema = Schema.model_validate(QUALITY_SCHEMA)
    rules = DataQuality()
    source = PrivateSource.open(path)
    if inject == "refuse-invalid":
        try:
            from .data import read_csv

            Transform.from_schema(schema).apply(read_csv(path, private=True))
        except DataError:
            return None
    return source.encode(Transform.from_schema(schema), missing_numeric=rules.missing_numeric,
                         unseen_category=rules.unseen_category)


def quality_audit(cfg: SelfTestConfig, alpha: float, progress: Progress | None = None) -> AuditResult:
    """White-box Clopper-Pearson audit of the invalid-record handling (see the module docstring),
    calibrated on its own: the quality counts are one Gaussian mechanism whose accountant reports
    ``cfg.epsilon`` at ``cfg.delta``. The reading and encoding are deterministic, so each side is
    read once and the mechanism is drawn per run; a refusal scores +inf. The score, the sum of the
    four noisy counts (D's counts are all zero), is Neyman-Pearson optimal for the mean shift."""
    import tempfile

    sigma = calibrate_gaussian(target_epsilon=cfg.epsilon, delta=cfg.delta, accountant=cfg.accountant)
    claimed = epsilon([gaussian_event(sigma)], cfg.delta, cfg.accountant)
    clean, poisoned = quality_design(cfg.design.background)
    done = [0]
    total = 2 * (cfg.pilot + cfg.runs)
    with tempfile.TemporaryDirectory(prefix="dpsummary-selftest-") as tmp:
        outcomes = []
        for name, content in (("d.csv", clean), ("d1.csv", poisoned)):
            p = Path(tmp) / name
            p.write_bytes(content)
            outcomes.append(quality_outcome(p, inject=cfg.inject))

        def scores(n: int, canary: bool) -> np.ndarray:
            encoded = outcomes[int(canary)]
            out = np.empty(n)
            for i in range(n):
                if encoded is None:
                    out[i] = math.inf
                else:
                    out[i] = float(np.sum(list(encoded.noisy_quality_counts(noise_multiplier=sigma).noisy.values())))
                done[0] += 1
                if progress is not None and (done[0] % 256 == 0 or done[0] == total):
                    progress("quality", done[0], total)
            return out

        return _gaussian_audit(cfg, alpha, scores, scenario="quality", mechanism="noisy_quality_counts",
                               sigma=sigma, claimed=claimed)


#: The "csv-lines" scenario (issue 24): one line inserted into a clean CSV, each a line that a
#: reader letting a quoted field run across lines, or ending a record at a bare CR, reads as
#: many records. ``where``: right after the header, before the middle line, or as the last line
#: (no final newline). The quoted newline is two physical lines.
CSV_LINE_NEIGHBOURS: dict[str, tuple[bytes, str]] = {
    "unclosed-quote-after-header": (b'3.5,"a,yes', "header"),
    "unclosed-quote-middle": (b'3.5,"a,yes', "middle"),
    "unclosed-quote-last": (b'3.5,a,"yes', "last"),
    "lone-quote": (b'"', "middle"),
    "quoted-newline": (b'3.5,"a\nb",yes', "middle"),
    "bare-cr": (b"3.5,a,yes\r4.5,b,no", "middle"),
    "bare-cr-in-field": (b"3.5,a\r,yes", "middle"),  # one record (the count's real sensitivity)
}


def csv_line_design(background: int) -> tuple[bytes, dict[str, bytes]]:
    """D (the "quality" scenario's clean CSV of ``background`` records) and each neighbour of
    :data:`CSV_LINE_NEIGHBOURS` as CSV bytes."""
    clean, _ = quality_design(background)
    lines = clean.split(b"\n")[:-1]
    out = {}
    for name, (line, where) in CSV_LINE_NEIGHBOURS.items():
        if where == "last":
            out[name] = clean + line
        else:
            at = 1 if where == "header" else len(lines) // 2
            out[name] = b"\n".join(lines[:at] + [line] + lines[at:]) + b"\n"
    return clean, out


def _multiline_csv(self: Any) -> Iterator[Any]:
    """INJECTED BUG ``multiline-csv``: the CSV reading issue 24 removed (the old stdlib fallback):
    ``csv.reader`` over the whole file, so a quoted field runs across lines and a bare CR ends a
    record; ragged rows dropped and counted as before."""
    import csv
    import sys

    import pyarrow as pa

    width = len(self.header)
    old_limit = csv.field_size_limit()
    csv.field_size_limit(sys.maxsize)
    try:
        with open(self.path, encoding="utf-8", errors="surrogateescape", newline="") as fh:
            fh.readline()
            cols: list[list[bytes]] = [[] for _ in range(width)]
            for row in csv.reader(fh, strict=False):
                if not row:
                    continue
                if len(row) != width:
                    self.ragged_rows += 1
                    continue
                for j, v in enumerate(row):
                    cols[j].append(v.encode("utf-8", errors="surrogateescape"))
            if cols[0]:
                yield pa.RecordBatch.from_arrays([pa.array(c, pa.binary()) for c in cols], names=self.header)
    finally:
        csv.field_size_limit(old_limit)


@contextmanager
def _csv_reading(inject: Injection) -> Iterator[None]:
    """The product's CSV reading, or with ``inject="multiline-csv"`` :func:`_multiline_csv` in
    its place (class attribute swapped for the duration, then restored)."""
    from .data import BatchStream

    if inject != "multiline-csv":
        yield
        return
    original = BatchStream._csv
    BatchStream._csv = _multiline_csv  # type: ignore[method-assign]
    try:
        yield
    finally:
        BatchStream._csv = original  # type: ignore[method-assign]


def csv_lines_audit(cfg: SelfTestConfig, alpha: float, progress: Progress | None = None) -> AuditResult:
    """White-box audit of the record count's sensitivity under the CSV line neighbours (issue 24).

    The product's reader (:func:`dpsummary.data.stream_pass`) reads D and every neighbour of
    :func:`csv_line_design` once (deterministic): the exact record counts must differ by at most
    one (the count's sensitivity, reported as ``sensitivity``; more is a violation on its own).
    Then the Clopper-Pearson audit of ``PrivateSource.noisy_record_count`` (one Gaussian
    mechanism, calibrated so that the accountant reports ``cfg.epsilon`` at ``cfg.delta``) on D
    against the neighbour whose count moved most, score ``|noisy count - count(D)|``.
    ``inject="multiline-csv"`` restores the old multi-line reading (:func:`_multiline_csv`): an
    unclosed quote after the header then swallows every record."""
    import dataclasses
    import tempfile

    from .data import stream_pass
    from .private.source import PrivateSource

    class _Count:
        def __init__(self) -> None:
            self.rows = 0

        def add(self, batch: Any) -> None:
            self.rows += batch.num_rows

        def discard(self) -> None:
            self.rows = 0

    sigma = calibrate_gaussian(target_epsilon=cfg.epsilon, delta=cfg.delta, accountant=cfg.accountant)
    claimed = epsilon([gaussian_event(sigma)], cfg.delta, cfg.accountant)
    clean, neighbours = csv_line_design(cfg.design.background)
    done = [0]
    total = 2 * (cfg.pilot + cfg.runs)
    with tempfile.TemporaryDirectory(prefix="dpsummary-selftest-") as tmp, _csv_reading(cfg.inject):
        paths = {}
        for name, content in (("base", clean), *neighbours.items()):
            paths[name] = Path(tmp) / f"{name}.csv"
            paths[name].write_bytes(content)
        counts = {name: stream_pass(p, _Count)[0].rows for name, p in paths.items()}
        moved = {name: abs(counts[name] - counts["base"]) for name in neighbours}
        worst = max(moved, key=lambda name: moved[name])
        sources = [PrivateSource.open(paths["base"]), PrivateSource.open(paths[worst])]

        def scores(n: int, canary: bool) -> np.ndarray:
            source = sources[int(canary)]
            out = np.empty(n)
            for i in range(n):
                out[i] = abs(source.noisy_record_count(noise_multiplier=sigma) - counts["base"])
                done[0] += 1
                if progress is not None and (done[0] % 256 == 0 or done[0] == total):
                    progress("csv-lines", done[0], total)
            return out

        result = _gaussian_audit(cfg, alpha, scores, scenario="csv-lines", mechanism="noisy_record_count",
                                 sigma=sigma, claimed=claimed)
    return dataclasses.replace(result, sensitivity=float(moved[worst]),
                               violation=result.violation or moved[worst] > 1)


def newton_design(background: int) -> tuple[torch.Tensor, torch.Tensor, float]:
    """The "newton" canary design for the noise-aware mechanism's score release: logistic
    regression with one feature, public feature bound 1 (score bound sqrt(2) at theta = 0).
    D = ``background`` records at x = 0, y = 0 (score (-1/2, 0) each); D' = D plus a canary at
    x = 10 (outside the public box), y = 1: its raw score (1/2, 5) is 3.5x the bound, so only
    clipping keeps the shift at the sensitivity. Returns (D, D', score bound)."""
    without = torch.zeros(background, 2, dtype=DTYPE)
    canary = torch.tensor([[10.0, 1.0]], dtype=DTYPE)
    return without, torch.cat([without, canary]), math.sqrt(2.0)


def newton_audit(cfg: SelfTestConfig, alpha: float, progress: Progress | None = None) -> AuditResult:
    """White-box Clopper-Pearson audit of the noise-aware mechanism's score release
    (:func:`dpsummary.private.score_stats.noisy_score_statistics`), calibrated on its own: the
    score sum is one Gaussian mechanism whose accountant reports ``cfg.epsilon`` at
    ``cfg.delta`` (the curvature release is drawn too, at a large multiplier, and ignored: a test
    on the score alone is bounded by the score event). Score: the noisy sum's excess over D's,
    projected on the canary's clipped direction (Neyman-Pearson optimal for the mean shift).
    ``inject="no-clip"`` (:class:`NoClipRecords`): clipping disabled at unchanged noise, so the
    canary moves the release by 3.5x the sensitivity."""
    from .models import LogisticRegression

    sigma = calibrate_gaussian(target_epsilon=cfg.epsilon, delta=cfg.delta, accountant=cfg.accountant)
    claimed = epsilon([gaussian_event(sigma)], cfg.delta, cfg.accountant)
    model = LogisticRegression(1)
    without, with_canary, bound = newton_design(cfg.design.background)
    theta = torch.zeros(2, dtype=DTYPE)
    expected = model.record_scores(without, theta).sum(0).numpy()
    canary_score = model.record_scores(with_canary[-1:], theta)[0].numpy()
    direction = canary_score / np.linalg.norm(canary_score)
    done = [0]
    total = 2 * (cfg.pilot + cfg.runs)

    def scores(n: int, canary: bool) -> np.ndarray:
        records = make_mechanism(with_canary if canary else without, inject=cfg.inject, noise_path=cfg.noise)
        out = np.empty(n)
        for i in range(n):
            st = records.noisy_score_statistics(model, theta, score_bound=bound, curvature_bound=1.0,
                                                score_noise_multiplier=sigma, curvature_noise_multiplier=1e3)
            out[i] = float((st.score.numpy() - expected) @ direction)
            done[0] += 1
            if progress is not None and (done[0] % 256 == 0 or done[0] == total):
                progress("newton", done[0], total)
        return out

    return _gaussian_audit(cfg, alpha, scores, scenario="newton", mechanism="noisy_score_statistics",
                           sigma=sigma, claimed=claimed)


# =========================================================================== one-run audit


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
    model, theta = GaussianMean(m), _draws(m)
    scores = np.zeros(m)
    for t in range(cfg.steps):
        y = records.noisy_clipped_sum(model, theta, sample_rate=q, clip_norm=c, noise_multiplier=sigma)
        scores += dirac_score(_projections(y.numpy(), c), sample_rate=q, noise_multiplier=sigma)
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


# =========================================================================== gray-box replay


class ReplayRandomness:
    """Seeded, recording stand-in for OS entropy (replay only: never used for a release).

    Coins for the first ``shared`` records come from the seed; records beyond them (the canary)
    are always included, the worst case for the sensitivity check."""

    def __init__(self, seed: int, shared: int, zero_noise: bool = False) -> None:
        self._rng = np.random.default_rng(seed)
        self.shared = shared
        self.zero_noise = zero_noise
        self.inputs: list[np.ndarray] = []
        self.noise_stds: list[float] = []
        self.masks: list[np.ndarray] = []
        self.replay_masks: list[np.ndarray] | None = None

    def coins(self, num_records: int, sample_rate: float) -> np.ndarray:
        if self.replay_masks is not None:
            base = self.replay_masks[len(self.masks)]
        else:
            base = self._rng.random(self.shared) < sample_rate
        mask = np.concatenate([base, np.ones(num_records - self.shared, dtype=bool)])
        self.masks.append(base)
        return mask

    def sample_indices(self, num_records: int, sample_rate: float) -> np.ndarray:
        return np.flatnonzero(self.coins(num_records, sample_rate))

    def gaussian(self, values: np.ndarray, *, noise_std: float, clip_norm: float) -> np.ndarray:
        values = np.array(values, dtype=np.float64, copy=True)
        self.inputs.append(values.copy())
        self.noise_stds.append(float(noise_std))
        if self.zero_noise:
            return values
        return values + noise_std * self._rng.standard_normal(values.shape[0])


class _LockstepRecords:
    """Runs D through the mechanism and, at the same public inputs (theta, C) and the same coins,
    D + canary with zero noise; the constructor's trajectory follows D."""

    def __init__(self, main: PrivateRecords, main_rnd: ReplayRandomness,
                 twin: PrivateRecords, twin_rnd: ReplayRandomness) -> None:
        self.main, self.main_rnd, self.twin, self.twin_rnd = main, main_rnd, twin, twin_rnd
        self.ratios: list[float] = []

    def noisy_clipped_sum(
        self, model: Model, theta: torch.Tensor, *, sample_rate: float, clip_norm: float, noise_multiplier: float
    ) -> torch.Tensor:
        out = self.main.noisy_clipped_sum(
            model, theta, sample_rate=sample_rate, clip_norm=clip_norm, noise_multiplier=noise_multiplier
        )
        self.twin.noisy_clipped_sum(
            model, theta, sample_rate=sample_rate, clip_norm=clip_norm, noise_multiplier=noise_multiplier
        )
        delta = np.linalg.norm(self.twin_rnd.inputs[-1] - self.main_rnd.inputs[-1])
        self.ratios.append(_moved_in_sensitivities(float(delta), self.main_rnd.noise_stds[-1], noise_multiplier))
        return out


def _moved_in_sensitivities(delta: float, noise_std: float, noise_multiplier: float) -> float:
    """How far a neighbour moved a mechanism's pre-noise input, in units of the sensitivity the
    accountant is told: the noise had sd ``noise_multiplier x sensitivity``, so this is
    ``delta * noise_multiplier / noise_std`` (at most 1 for a correct mechanism), whatever units
    the mechanism releases its sum in (DP-PSVI releases it in units of C_t)."""
    return delta * noise_multiplier / noise_std


def _replay_deltas(in0: list[np.ndarray], in1: list[np.ndarray], noise_stds: list[float], clips: list[float],
                   noise_multiplier: float) -> list[float]:
    """Per step, how far D + canary moved the pre-noise sum, on the scale of the step's clip
    norm C_t (so ``<= C_t`` is the sensitivity check)."""
    return [_moved_in_sensitivities(float(np.linalg.norm(b - a)), sd, noise_multiplier) * c
            for a, b, sd, c in zip(in0, in1, noise_stds, clips, strict=False)]


#: The replays' DP-PSVI noise multiplier (what "the accountant is told" in their sensitivity check).
REPLAY_NOISE_MULTIPLIER = 1.0


def _recording_dppsvi(log: list[float], *, sample_rate: float, records: int, steps: int,
                      num_samples: int) -> Any:
    """The replays' DP-PSVI constructor, logging every step's clip norm into ``log``."""
    from .private.dppsvi import DPPSVI

    class Recording(DPPSVI):
        def clip_norm(self, model: Model, state: Any, theta: torch.Tensor) -> float:
            c = super().clip_norm(model, state, theta)
            log.append(c)
            return c

    return Recording(noise_multiplier=REPLAY_NOISE_MULTIPLIER, sample_rate=sample_rate,
                     record_count=float(records), steps=steps, num_samples=num_samples)


def _replay_verdict(in0: list[np.ndarray], in1: list[np.ndarray], stds: list[float], clips: list[list[float]],
                    lock_ratios: list[float], steps: int) -> ReplayResult:
    """The replay's checks (see :func:`gray_box_replay`), whatever engine produced the inputs."""
    deltas = _replay_deltas(in0, in1, stds, clips[0], REPLAY_NOISE_MULTIPLIER)
    shapes = len(in0) == len(in1) and all(a.shape == b.shape for a, b in zip(in0, in1, strict=True))
    first_clip_equal = bool(clips[0] and clips[1] and clips[0][0] == clips[1][0])
    first_ok = bool(deltas) and deltas[0] <= clips[0][0] + 1e-9
    lock_max = max(lock_ratios) if lock_ratios else math.inf
    ok = len(in0) == len(in1) == steps and shapes and first_clip_equal and first_ok and lock_max <= 1 + 1e-9
    return ReplayResult(
        steps=steps, calls=(len(in0), len(in1)), shapes_equal=shapes, first_step_clip_equal=first_clip_equal,
        first_step_delta=deltas[0] if deltas else math.nan, first_step_clip=clips[0][0] if clips[0] else math.nan,
        per_step_delta=deltas, per_step_clip=list(clips[0]), lockstep_max_ratio=lock_max, ok=bool(ok),
    )


def gray_box_replay(
    *, inject: Injection = "none", records: int = 400, steps: int = 8, num_samples: int = 20,
    seed: int = 2, progress: Progress | None = None,
) -> ReplayResult:
    """Replay the full DP-PSVI constructor (:func:`dpsummary.constructors.fit` with
    :class:`~dpsummary.private.dppsvi.DPPSVI`) on D and D + canary with identical randomness.

    Two checks: (1) two independent fits with identical recorded randomness must make the same
    number of mechanism calls with the same shapes, and at the first step (identical public
    state) the same clip norm and a pre-noise sum that moves by at most C; later steps differ as
    post-processing of different noisy outputs and are reported, not asserted. (2) Lockstep: along
    D's trajectory, D + canary is evaluated at the same public inputs and coins at every step, and
    ||delta sum|| <= C_t must hold at every step. Only ``no-clip`` of the injections acts here
    (the others change randomness, which the replay controls itself)."""
    from .constructors import fit
    from .private.dppsvi import DPPSVI

    cls = NoClipRecords if inject == "no-clip" else PrivateRecords
    g = torch.Generator().manual_seed(5)
    model = LogisticRegression(4)
    theta0 = model.sample_prior(1, g)[0]
    points = model.simulate(theta0, records, g)
    canary = torch.tensor([[6.0, -6.0, 6.0, -6.0, 1.0]], dtype=DTYPE)
    q = noise.quantize_sample_rate(0.25)

    clips: list[list[float]] = [[], []]

    def constructor(log: list[float]) -> DPPSVI:
        return _recording_dppsvi(log, sample_rate=q, records=records, steps=steps, num_samples=num_samples)

    inputs = []
    stds: list[float] = []
    for i, data in enumerate((points, torch.cat([points, canary]))):
        rnd = ReplayRandomness(seed, shared=records)
        fit(constructor(clips[i]), cls(data, randomness=rnd), model, 5,
            generator=torch.Generator().manual_seed(9))
        inputs.append(rnd.inputs)
        stds = stds or rnd.noise_stds
        if progress is not None:
            progress("replay", i + 1, 3)
    in0, in1 = inputs
    main_rnd = ReplayRandomness(seed, shared=records)
    twin_rnd = ReplayRandomness(seed, shared=records, zero_noise=True)
    twin_rnd.replay_masks = main_rnd.masks
    main_rnd.zero_noise = False
    lock = _LockstepRecords(cls(points, randomness=main_rnd), main_rnd,
                            cls(torch.cat([points, canary]), randomness=twin_rnd), twin_rnd)
    fit(constructor([]), lock, model, 5, generator=torch.Generator().manual_seed(9))
    if progress is not None:
        progress("replay", 3, 3)
    # main_rnd records its (noise-free) input before adding noise, so inputs are comparable.
    return _replay_verdict(in0, in1, stds, clips, lock.ratios, steps)


class _SparkReplayRandomness:
    """Recording, seeded noise for the Spark replay: the Spark engine's coins are its keyed PRF
    (shared by D and D + canary); its per-step mechanism runs at rate 1 on the step's batch."""

    def __init__(self, seed: int, zero_noise: bool = False) -> None:
        self._rng = np.random.default_rng(seed)
        self.zero_noise = zero_noise
        self.inputs: list[np.ndarray] = []
        self.noise_stds: list[float] = []

    def coins(self, num_records: int, sample_rate: float) -> np.ndarray:
        if sample_rate != 1.0:
            raise RuntimeError("the Spark replay samples only through the PRF step coins")
        return np.ones(num_records, dtype=bool)

    def sample_indices(self, num_records: int, sample_rate: float) -> np.ndarray:
        return np.flatnonzero(self.coins(num_records, sample_rate))

    def gaussian(self, values: np.ndarray, *, noise_std: float, clip_norm: float) -> np.ndarray:
        values = np.array(values, dtype=np.float64, copy=True)
        self.inputs.append(values.copy())
        self.noise_stds.append(float(noise_std))
        return values if self.zero_noise else values + noise_std * self._rng.standard_normal(values.shape[0])


def spark_gray_box_replay(spark: Any = None, *, records: int = 400, steps: int = 8, num_samples: int = 20,
                          seed: int = 2, master: str = "local[2]") -> ReplayResult:
    """:func:`gray_box_replay` against the Spark engine (:mod:`dpsummary.private.spark_engine`).

    D (``records`` simulated logistic records, Parquet) and D + canary (one extreme record
    appended, so every other row keeps its row id and hence its PRF coins) run the full DP-PSVI
    constructor through :class:`~dpsummary.private.spark_engine.SparkSource` with one shared
    :class:`~dpsummary.private.prf.StepCoins` key and identical recorded noise: the same calls and
    shapes, the same first clip norm, a first-step move <= C, and in lockstep along D's trajectory
    ``||delta sum|| <= C_t`` at every step. ``spark``: an active SparkSession (else one is started
    on ``master`` and stopped). Files live in a private temporary directory, deleted at the end."""
    import shutil
    from contextlib import nullcontext
    from typing import cast

    import pyarrow as pa
    import pyarrow.parquet as pq

    from .constructors import fit
    from .data import ColumnSpec, Schema, Transform
    from .private.dppsvi import DPPSVI
    from .private.prf import StepCoins
    from .private.spark_engine import SparkOptions, SparkSource, private_dir, spark_scope

    bound = 8.0
    schema = Schema(columns=[*(ColumnSpec(name=f"x{i}", kind="numeric", lower=-bound, upper=bound) for i in range(4)),
                             ColumnSpec(name="y", kind="categorical", categories=["0", "1"])], target="y")
    tf = Transform.from_schema(schema)
    model = LogisticRegression(tf.num_features)
    g = torch.Generator().manual_seed(5)
    points = model.simulate(model.sample_prior(1, g)[0], records, g).numpy()

    def table(rows: np.ndarray) -> Any:
        cols: dict[str, Any] = {f"x{i}": rows[:, i] * bound for i in range(4)}
        cols["y"] = [str(int(v)) for v in rows[:, 4]]
        return pa.table(cols)

    canary = np.array([[1.0, -1.0, 1.0, -1.0, 1.0]])
    q = noise.quantize_sample_rate(0.25)
    coins = StepCoins.generate(q, steps)
    work = private_dir("dpsummary-selftest-spark-")
    clips: list[list[float]] = [[], []]

    def constructor(log: list[float]) -> DPPSVI:
        return _recording_dppsvi(log, sample_rate=q, records=records, steps=steps, num_samples=num_samples)

    scope: Any = nullcontext((spark, work)) if spark is not None else spark_scope(SparkOptions(master=master))
    try:
        paths = [work / "d0.parquet", work / "d1.parquet"]
        pq.write_table(table(points), paths[0])
        pq.write_table(table(np.concatenate([points, canary])), paths[1])
        counter = iter(range(1_000))

        def records_of(path: Path, rnd: Any) -> Any:
            scratch = work / f"run{next(counter)}"
            scratch.mkdir(mode=0o700)
            source = SparkSource(session, path, scratch, steps=steps, randomness=rnd, coins=coins)
            return source.encode(tf, missing_numeric="impute", unseen_category="other").records

        with scope as (session, _):
            inputs = []
            stds: list[float] = []
            for i, path in enumerate(paths):
                rnd = _SparkReplayRandomness(seed)
                fit(constructor(clips[i]), records_of(path, rnd), model, 5, generator=torch.Generator().manual_seed(9))
                inputs.append(rnd.inputs)
                stds = stds or rnd.noise_stds
            main_rnd, twin_rnd = _SparkReplayRandomness(seed), _SparkReplayRandomness(seed, zero_noise=True)
            lock = _LockstepRecords(cast(Any, records_of(paths[0], main_rnd)), cast(Any, main_rnd),
                                    cast(Any, records_of(paths[1], twin_rnd)), cast(Any, twin_rnd))
            fit(constructor([]), lock, model, 5, generator=torch.Generator().manual_seed(9))
    finally:
        shutil.rmtree(work, ignore_errors=True)
    in0, in1 = inputs
    return _replay_verdict(in0, in1, stds, clips, lock.ratios, steps)


# =========================================================================== the BNN mechanism


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


@dataclass(frozen=True)
class BNNCheckResult(MechanismChecks):
    """:func:`bnn_checks`: noise scale (sd / sigma C), accountant reproduction, gray-box replay
    of dp-bb-psvi."""

    clip_norm: float
    replay: ReplayResult


class _BNNLockstep:
    """The BNN twin of :class:`_LockstepRecords`: D's mechanism drives the trajectory; at the
    same public (theta, C) and the same coins, D + canary is released with zero noise, and the
    move of the pre-noise sum is recorded in sensitivity units. ``inflate`` > 1 injects the
    no-clip bug (clip norm times ``inflate``, noise multiplier divided by it: same noise sd)."""

    def __init__(self, main: PrivateRecords, main_rnd: ReplayRandomness, twin: PrivateRecords,
                 twin_rnd: ReplayRandomness, inflate: float = 1.0) -> None:
        self.main, self.main_rnd, self.twin, self.twin_rnd = main, main_rnd, twin, twin_rnd
        self.inflate = inflate
        self.ratios: list[float] = []

    def noisy_bnn_statistic(self, model: Model, theta: torch.Tensor, *, sample_rate: float, clip_norm: float,
                            noise_multiplier: float) -> Any:
        from .private.bnn import records_statistic

        kw = {"sample_rate": sample_rate, "clip_norm": clip_norm * self.inflate,
              "noise_multiplier": noise_multiplier / self.inflate}
        out = records_statistic(self.main, model, theta, **kw)
        records_statistic(self.twin, model, theta, **kw)
        moved = float(np.linalg.norm(self.twin_rnd.inputs[-1] - self.main_rnd.inputs[-1]))
        self.ratios.append(_moved_in_sensitivities(moved, self.main_rnd.noise_stds[-1], noise_multiplier))
        return out


class _BNNInflated:
    """The no-clip bug on one record set (independent replays): see :class:`_BNNLockstep`."""

    def __init__(self, records: PrivateRecords, inflate: float) -> None:
        self.records, self.inflate = records, inflate

    def noisy_bnn_statistic(self, model: Model, theta: torch.Tensor, *, sample_rate: float, clip_norm: float,
                            noise_multiplier: float) -> Any:
        from .private.bnn import records_statistic

        return records_statistic(self.records, model, theta, sample_rate=sample_rate,
                                 clip_norm=clip_norm * self.inflate, noise_multiplier=noise_multiplier / self.inflate)


def _bnn_replay_design(records: int) -> tuple[Any, torch.Tensor, torch.Tensor]:
    """A small public BNN, D (simulated from a prior draw) and an extreme canary record whose
    statistic is far above C before clipping."""
    from .models.bnn import BNN

    model = BNN(3, widths=(4,))
    g = torch.Generator().manual_seed(5)
    points = model.simulate(model.sample_prior(1, g)[0], records, g)
    canary = torch.tensor([[40.0, -40.0, 40.0, 1.0]], dtype=DTYPE)
    return model, points, canary


def bnn_gray_box_replay(*, inject: Injection = "none", records: int = 200, steps: int = 4, size: int = 5,
                        seed: int = 2, clip_norm: float = 1.0) -> ReplayResult:
    """:func:`gray_box_replay` for the BNN mechanism: the full private BB-PSVI loop
    (:func:`dpsummary.private.bnn.fit_private` on :class:`PrivateRecords`) on D and D + canary
    with identical recorded randomness (same calls and shapes, a first-step move <= C at the
    identical public state), and in lockstep along D's trajectory ``||delta sum|| <= C`` at every
    step, all in units of the sensitivity the accountant is told
    (:func:`_moved_in_sensitivities`). Only ``no-clip`` of the injections acts here."""
    from .blackbox.objective import InnerConfig
    from .private import bnn as pb

    model, points, canary = _bnn_replay_design(records)
    q = noise.quantize_sample_rate(0.25)
    inflate = NoClipRecords.INFLATION if inject == "no-clip" else 1.0
    inner = InnerConfig(steps=2, num_samples=3)

    def run(recs: Any) -> None:
        init = pb.public_init(model, size, torch.Generator().manual_seed(11))
        pb.fit_private(recs, model, size=size, steps=steps, sample_rate=q, noise_multiplier=REPLAY_NOISE_MULTIPLIER,
                       clip_norm=clip_norm, record_count=float(records), initial_points=init,
                       generator=torch.Generator().manual_seed(9), inner=inner, outer_samples=3, warmup_steps=4)

    inputs: list[list[np.ndarray]] = []
    stds: list[float] = []
    for data in (points, torch.cat([points, canary])):
        rnd = ReplayRandomness(seed, shared=records)
        recs = PrivateRecords(data, randomness=rnd)
        run(_BNNInflated(recs, inflate) if inflate != 1.0 else recs)
        inputs.append(rnd.inputs)
        stds = stds or rnd.noise_stds
    main_rnd = ReplayRandomness(seed, shared=records)
    twin_rnd = ReplayRandomness(seed, shared=records, zero_noise=True)
    twin_rnd.replay_masks = main_rnd.masks
    lock = _BNNLockstep(PrivateRecords(points, randomness=main_rnd), main_rnd,
                        PrivateRecords(torch.cat([points, canary]), randomness=twin_rnd), twin_rnd, inflate)
    run(lock)
    clips = [[clip_norm] * len(inputs[0]), [clip_norm] * len(inputs[1])]
    return _replay_verdict(inputs[0], inputs[1], stds, clips, lock.ratios, steps)


def bnn_noise_check(*, inject: Injection = "none", noise_multiplier: float = 1.3, clip_norm: float = 0.7,
                    calls: int = 30) -> tuple[float, int, float]:
    """The BNN release path's noise against the analytic sd ``sigma * C``: ``calls`` releases at
    q = 1 (every record included, so the pre-noise sum is known exactly from the same per-record
    rule) through :func:`dpsummary.private.bnn.records_statistic` with the product's
    :class:`SystemRandomness` (its noise pool announced as in a release; ``half-noise``
    halves it). Returns ``(sample sd / (sigma C), coordinates, tolerance)``; the tolerance is 6
    standard errors of the ratio, ``6 / sqrt(2 n)`` (false failure below 2e-9)."""
    from .private import bnn as pb
    from .private.kernel import finish

    model, points, _ = _bnn_replay_design(50)
    theta = model.sample_prior(3, torch.Generator().manual_seed(3))
    base = SystemRandomness()
    rnd: Any = HalfNoiseRandomness(base) if inject == "half-noise" else base
    recs = PrivateRecords(points, randomness=rnd)
    try:
        recs.expect_clipped_sums(num_draws=3 * (model.param_dim + 1), noise_multiplier=noise_multiplier, count=calls)
        exact = torch.from_numpy(finish(pb.unit_clipped_total(pb.record_statistics(model, points, theta),
                                                              clip_norm), 1.0) * clip_norm)
        noise_draws = []
        for _ in range(calls):
            st = pb.records_statistic(recs, model, theta, sample_rate=1.0, clip_norm=clip_norm,
                                      noise_multiplier=noise_multiplier)
            noise_draws.append((torch.cat([st.L, st.G.flatten()]) - exact).numpy())
    finally:
        recs.close()
        base.close()
    z = np.concatenate(noise_draws)
    ratio = float(np.sqrt(np.mean(z * z))) / (noise_multiplier * clip_norm)
    return ratio, int(z.size), 6.0 / math.sqrt(2.0 * z.size)


def bnn_checks(*, inject: Injection = "none", progress: Progress | None = None) -> BNNCheckResult:
    """The BNN mechanism's self-test: noise scale (:func:`bnn_noise_check`), accountant
    reproduction (the events of :func:`dpsummary.private.bnn.privacy_events` at a calibrated
    sigma, epsilon by dpsummary's RDP evaluation and by Opacus's own ``RDPAccountant`` loop on
    the same orders, relative difference <= 1e-6), and :func:`bnn_gray_box_replay`."""
    from .accounting import RDP_ORDERS
    from .private import bnn as pb

    sigma, clip = 1.3, 0.7
    ratio, n, tol = bnn_noise_check(inject=inject, noise_multiplier=sigma, clip_norm=clip)
    if progress is not None:
        progress("bnn", 1, 3)
    q, steps, delta = noise.quantize_sample_rate(0.05), 200, 1e-5
    sig = calibrate_noise_multiplier(target_epsilon=1.0, delta=delta, sample_rate=q, steps=steps, accountant="rdp")
    ours = epsilon(pb.privacy_events(sig, q, steps), delta, "rdp")
    from opacus.accountants import RDPAccountant

    opacus_acc = RDPAccountant()
    opacus_acc.history = [(sig, q, steps)]
    theirs = float(opacus_acc.get_epsilon(delta, alphas=list(RDP_ORDERS)))
    acc_ok = abs(ours - theirs) <= 1e-6 * theirs and ours <= 1.0 + 1e-3
    if progress is not None:
        progress("bnn", 2, 3)
    replay = bnn_gray_box_replay(inject=inject)
    if progress is not None:
        progress("bnn", 3, 3)
    noise_ok = abs(ratio - 1.0) <= tol
    failed = [name for name, good in (("noise scale", noise_ok), ("accountant", acc_ok),
                                      ("gray-box replay", replay.ok)) if not good]
    return BNNCheckResult(
        noise_multiplier=sigma, clip_norm=clip, noise_sd_ratio=ratio, noise_samples=n, noise_tolerance=tol,
        noise_ok=noise_ok, accountant_epsilon=ours, opacus_epsilon=theirs, accountant_ok=bool(acc_ok),
        replay=replay, ok=not failed, failed=failed,
    )


# =========================================================================== mixture mechanism


@dataclass(frozen=True)
class MixtureCheckResult(MechanismChecks):
    """:func:`mixture_checks`: noise scale (sd / sigma), accountant reproduction and the coupled
    neighbour replay of ``dp-kd-tree`` (:mod:`dpsummary.private.mixture`)."""

    #: Coupled replay: the neighbour (one extreme record added) run returns the first run's noisy
    #: outputs; the largest L2 move of a released exact count vector, in sensitivity units (1).
    replay_max_move: float
    #: The neighbour run released the same nodes and the same pseudo-points (decisions read only
    #: the noisy counts).
    replay_same_output: bool
    replay_ok: bool


class _CountRecorder:
    """Privacy randomness wrapper for the mixture replay: noise from ``base`` (or, with
    ``outputs``, the first run's noisy vectors, which couples the neighbour's noise); records
    every exact vector it is asked to noise. The tree samples nothing (no coins)."""

    def __init__(self, base: PrivacyRandomness, outputs: list[np.ndarray] | None = None) -> None:
        self.base = base
        self.outputs = outputs
        self.given: list[np.ndarray] = []
        self.returned: list[np.ndarray] = []

    def coins(self, num_records: int, sample_rate: float) -> np.ndarray:
        raise RuntimeError("the kd-tree samples nothing")

    def sample_indices(self, num_records: int, sample_rate: float) -> np.ndarray:
        raise RuntimeError("the kd-tree samples nothing")

    def gaussian(self, values: np.ndarray, *, noise_std: float, clip_norm: float) -> np.ndarray:
        self.given.append(np.array(values, dtype=np.float64))
        if self.outputs is not None:
            k = len(self.given) - 1
            out = self.outputs[k] if k < len(self.outputs) else np.full(np.shape(values), np.nan)
        else:
            out = np.asarray(self.base.gaussian(values, noise_std=noise_std, clip_norm=clip_norm), dtype=np.float64)
        self.returned.append(np.array(out))
        return out


def mixture_checks(*, inject: Injection = "none", noise_path: NoisePath = "opendp") -> MixtureCheckResult:
    """The mixture mechanism's self-test (``dp-kd-tree``):

    1. noise scale: the tree's count release (:func:`dpsummary.private.mixture.release_counts`)
       on 4,000 zero counts, sample sd / sigma within 6 standard errors of 1 (``half-noise``
       fails it);
    2. accountant: ``SelfComposedDpEvent(GaussianDpEvent(sigma), L + 1)`` by dpsummary's RDP
       evaluation against Opacus's own ``RDPAccountant`` (sample rate 1, L + 1 steps), relative
       difference <= 1e-6;
    3. coupled neighbour replay: a synthetic 2-d mixture D and D + one extreme record (a corner
       of the box); the run on D + record gets D's noisy outputs back, so it releases the same
       nodes iff every split/keep decision reads only noisy counts; every released exact count
       vector may move by at most the sensitivity 1 (L2), and the pseudo-points must be equal.
    """
    from dp_accounting import dp_event as dpe
    from opacus.accountants import RDPAccountant

    from .accounting import RDP_ORDERS
    from .private import mixture as pm

    base = base_randomness(noise_path)
    noise_rnd: PrivacyRandomness = HalfNoiseRandomness(base) if inject == "half-noise" else base
    sigma = 3.0
    n = 4000
    noisy = pm.release_counts(noise_rnd, np.zeros(n), sigma)
    ratio = float(np.std(noisy) / sigma)
    tol = 6.0 / math.sqrt(2.0 * n)
    noise_ok = abs(ratio - 1.0) <= tol

    levels, delta = 13, 1e-5
    sig = calibrate_noise_multiplier(target_epsilon=1.0, delta=delta, sample_rate=1.0, steps=levels,
                                     accountant="rdp")
    event = dpe.SelfComposedDpEvent(dpe.GaussianDpEvent(sig), levels)
    ours = epsilon([event], delta, "rdp")
    opacus_acc = RDPAccountant()
    opacus_acc.history = [(sig, 1.0, levels)]
    theirs = float(opacus_acc.get_epsilon(delta, alphas=list(RDP_ORDERS)))
    acc_ok = abs(ours - theirs) <= 1e-6 * theirs and ours <= 1.0 + 1e-3

    rng = np.random.default_rng(7)  # the synthetic data set (public, fixed)
    blobs = np.concatenate([rng.normal([-1.5, -1.0], 0.4, (600, 2)), rng.normal([1.5, 1.0], 0.3, (400, 2))])
    plan = pm.TreePlan(dim=2, bound=4.0, max_depth=10, noise_multiplier=sigma)
    first = _CountRecorder(noise_rnd)
    out_d = pm.release_mixture_summary(PrivateRecords(blobs, randomness=first), plan=plan)
    second = _CountRecorder(noise_rnd, outputs=first.returned)
    extreme = np.array([[4.0, -4.0]])
    out_n = pm.release_mixture_summary(PrivateRecords(np.concatenate([blobs, extreme]), randomness=second), plan=plan)
    shapes = [a.shape for a in first.given] == [b.shape for b in second.given]
    moves = [float(np.linalg.norm(a - b)) for a, b in zip(first.given, second.given, strict=False)] if shapes else [
        math.inf]
    same = shapes and out_d.points.shape == out_n.points.shape and bool(np.array_equal(out_d.points, out_n.points)) \
        and bool(np.array_equal(out_d.weights, out_n.weights))
    max_move = max(moves) if moves else 0.0
    replay_ok = same and max_move <= 1.0 + 1e-12
    failed = [name for name, good in (("noise scale", noise_ok), ("accountant", acc_ok),
                                      ("coupled replay", replay_ok)) if not good]
    return MixtureCheckResult(
        noise_multiplier=sigma, noise_sd_ratio=ratio, noise_samples=n, noise_tolerance=tol, noise_ok=noise_ok,
        accountant_epsilon=ours, opacus_epsilon=theirs, accountant_ok=bool(acc_ok), replay_max_move=max_move,
        replay_same_output=bool(same), replay_ok=bool(replay_ok), ok=not failed, failed=failed,
    )


# =========================================================================== driver


@dataclass(frozen=True)
class BootstrapCheckResult:
    """:func:`bootstrap_check`: DP-PSVI's parametric bootstrap (:mod:`dpsummary.bootstrap`) gives
    bit-identical output with the record store closed and with the records poisoned (NaN)."""

    replicates: int
    #: Reading the closed store raised (the check really ran with the records unreachable).
    store_closed: bool
    #: Calibrated summary and Gaussian identical after poisoning the records in place.
    identical: bool
    finite: bool

    @property
    def ok(self) -> bool:
        return self.store_closed and self.identical and self.finite


def bootstrap_check(*, replicates: int = 5, steps: int = 15) -> BootstrapCheckResult:
    """Run a small DP-PSVI release path (logistic, public schema, DP initialisation) on an
    in-memory table, CLOSE its record store, run the bootstrap (seeded, one process); then
    overwrite the table's memory with NaN and run it again. The bootstrap receives only the
    release's outputs and public settings, so both runs must agree bit for bit (any read of a
    record would raise on the closed store or spread NaN)."""
    from .bootstrap import BootstrapConfig, MechanismSettings, ParametricBootstrap
    from .constructors.base import fit
    from .data import ColumnSpec, Schema, Transform
    from .models import LogisticRegression
    from .private.noise import quantize_sample_rate
    from .release import dp_psvi_constructor, initial_samplers, plan_initialisation

    schema = Schema(columns=[ColumnSpec(name="a", kind="numeric", lower=-1.0, upper=1.0),
                             ColumnSpec(name="b", kind="categorical", categories=["u", "v", "w"]),
                             ColumnSpec(name="y", kind="categorical", categories=["0", "1"], positive="1")],
                    target="y")
    tf = Transform.from_schema(schema)
    model = LogisticRegression(tf.num_features)
    gen = torch.Generator().manual_seed(11)
    n = 400
    table = model.simulate(torch.tensor([0.3, 1.0, -0.5, 0.0, 0.2], dtype=torch.float64), n, gen,
                           features=tf.sample_public_features(n, gen))
    q = quantize_sample_rate(0.2)
    init_sigma, layout, _ = plan_initialisation(tf, "logistic", prior_events=[], target_epsilon=0.5, delta=1e-5,
                                                accountant="rdp")
    records = PrivateRecords(table)
    try:
        start = initial_samplers(records, tf, layout, init_sigma)
        constructor = dp_psvi_constructor(transform=tf, model=model, noise_multiplier=2.0, sample_rate=q,
                                          record_count=float(n), steps=steps, num_samples=20,
                                          init_features=start.features, init_targets=start.targets)
        raw = fit(constructor, records, model, 5, generator=gen, transform=tf.to_dict())
    finally:
        records.close()
    try:
        records.noisy_marginals(layout, noise_multiplier=1.0)  # reads every record
        closed = False
    except Exception:
        closed = True
    settings = MechanismSettings(model=model, transform=tf, size=5, steps=steps, num_samples=20, noise_multiplier=2.0,
                                 sample_rate=q, record_count=float(n), init_noise_multiplier=init_sigma,
                                 init_layout=layout, init_marginals=start.marginals)
    config = BootstrapConfig(replicates=replicates, rounds=1, workers=1, seed=3)
    first = ParametricBootstrap(settings, config).fit(raw)
    table.fill_(float("nan"))  # poison every record in place
    second = ParametricBootstrap(settings, config).fit(raw)
    identical = (torch.equal(first.summary.points, second.summary.points)
                 and torch.equal(first.summary.weights, second.summary.weights)
                 and torch.equal(first.calibration.posterior.mean, second.calibration.posterior.mean)
                 and torch.equal(first.calibration.posterior.scale_tril, second.calibration.posterior.scale_tril))
    finite = bool(torch.isfinite(first.summary.points).all() and torch.isfinite(first.summary.weights).all())
    return BootstrapCheckResult(replicates, closed, identical, finite)


def run_selftest(config: SelfTestConfig | None = None, progress: Progress | None = None) -> SelfTestResult:
    """Calibrate sigma with the real accountant for the inflated claim, then run the white-box
    audits, the one-run audit and the gray-box replay. ``alpha`` is split equally (Bonferroni)
    over the audits that produce lower bounds, so the probability that a correct implementation
    is reported as violating its claim is at most ``alpha``."""
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
    n_audits = len(cfg.scenarios) + (1 if cfg.one_run_canaries > 0 else 0)
    a_each = cfg.alpha / max(n_audits, 1)
    t0 = time.perf_counter()
    with _torch_threads(cfg.torch_threads):
        wb_start = time.perf_counter()
        audits = white_box_audits(cfg, sigma, q, claimed, a_each, progress)
        wb_time = time.perf_counter() - wb_start
        one = None
        if cfg.one_run_canaries > 0:
            claimed_one = epsilon([event], cfg.one_run_delta, cfg.accountant)
            one = one_run_audit(cfg, sigma, q, claimed_one, a_each, progress)
        replay = gray_box_replay(inject=cfg.inject, progress=progress) if cfg.replay else None
        bnn = bnn_checks(inject=cfg.inject, progress=progress) if cfg.bnn else None
        mixture = mixture_checks(inject=cfg.inject, noise_path=cfg.noise) if cfg.mixture else None
        boot = bootstrap_check() if cfg.bootstrap else None
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
