"""Calibrated DP-PSVI by parametric bootstrap: honest intervals by post-processing alone.

DP-PSVI's pseudocoreset posterior ignores the privacy noise and the subsampling, so its 95%
intervals are confidently wrong (issue 28). Following Ferrando, Wang and Sheldon (2022,
"Parametric bootstrap for differentially private confidence intervals"), after the mechanism has
run we simulate it, in ``rounds`` rounds of ``replicates`` re-runs each: for ``b = 1..B``

1. draw a truth ``theta*_b``: in round 1 from the model's PRIOR, in later rounds from the previous
   round's calibrated posterior (correlations dropped);
2. draw a synthetic table of ``round(N~)`` records at ``theta*_b`` (``N~`` the release's noisy or
   public record count): features from the release's DP initialisation histograms when the
   release ran them (DP outputs of this very release), else from the public schema's box;
   targets simulated from the model, clamped to the schema's public range; the table is a
   :class:`SyntheticStore` (fixed blocks regenerated on demand, only the rows of the run's
   pre-drawn Poisson samples kept), so its memory does not grow with ``N~``;
3. re-run the WHOLE mechanism on it through the mechanism's own code path
   (:func:`dpsummary.mechanisms.dp_psvi_setup.initial_samplers`,
   :func:`dpsummary.mechanisms.dp_psvi_setup.dp_psvi_constructor`,
   :func:`dpsummary.constructors.base.fit` over a :class:`~dpsummary.private.mechanism.PrivateRecords`
   of the synthetic table): the same public settings (M, T, S, q, noise multipliers, clip rule,
   initialisation), a fresh noisy record count when the release's was noisy, fresh noise;
4. keep the replicate's raw posterior mean ``m_b``.

Calibration (:func:`calibrate`): per coordinate, the mechanism is modelled as linear-Gaussian in
the truth, ``m_bj = a_j + c_j theta*_bj + N(0, s_j^2)`` (:func:`fit_linear`: least squares over
all replicates, slopes shrunk toward their pooled value by empirical Bayes and clamped at 0,
residual variances inflated by ``(t_{B-2}/z)^2`` for their Monte Carlo error). The calibrated
posterior is the model's prior times that likelihood of the release's own raw mean
(:func:`linear_posterior`): it corrects the bias (shrinkage toward the initialisation, shifts)
and the spread per coordinate, and where the mechanism's output does not track the truth
(``c_j`` ~ 0: noise-dominated) it returns the prior instead of a confident wrong answer. It is
never wider than the prior, so a pseudocoreset of the release's size matched to it
(:func:`dpsummary.constructors.gaussian_target.match_gaussian`, as the default mechanism does)
represents it closely; the matching KL is recorded. Why not simpler rules (measured, issue 28):
tempering every weight by one factor cannot fix bias and collapsed to the prior; subtracting
the bootstrap bias measured at truths drawn from the (wrong) raw posterior under-covers
(german_credit, eps 0.2: 65%) because DP-PSVI's bias depends on the truth (slope c ~ 0.1-0.2 on
real tables at eps 0.2). Finally the noise sds are widened by one factor (>= 1) that brings the
rule's leave-one-out coverage on the replicates to 95% (:func:`widening_factor`, a one-level
double bootstrap of the width); the leave-one-out coverage before widening is recorded as the
rule's Monte Carlo check. The uncalibrated summary is kept (``posterior="raw"``).

Privacy. Everything here is a function of the release (the raw pseudocoreset, the DP
initialisation histograms, the noisy record count) and public settings: post-processing, no
privacy cost. This module never receives a record, a record store or a private source. The
"privacy" noise inside the bootstrap (Poisson coins, Gaussian noise of every re-run) is
SIMULATION noise: it protects nothing, so it comes from a seeded numpy Generator
(:class:`SimulationRandomness`), never from OS entropy, and the whole bootstrap is reproducible
from its recorded seed. The synthetic tables hold no real record.

Cost: ``rounds x replicates`` full re-runs of the mechanism (default 2 x 7; each replicate holds
one block of :data:`SYNTHETIC_BLOCK_ROWS` rows plus its sampled rows, whatever ``N~``), spread over
worker processes (``workers``, default ``min(2, cores)`` on Linux, where workers start by
``fork`` and need no ``__main__`` guard; one in-process worker elsewhere, see
:func:`worker_start_method`). Replicates share nothing but public setup.
"""

from __future__ import annotations

import math
import os
import secrets
import time
from collections.abc import Callable, Iterator
from dataclasses import dataclass
from typing import Any

import numpy as np
import torch

from .gaussian import DTYPE, GaussianPosterior
from .private.store import RecordStore

#: Default number of bootstrap replicates PER ROUND (issue 28's cost budget: at most 10x the
#: mechanism, aim 3x, on 2 cores: 2 x 7 re-runs on 2 workers cost about 7 mechanism run times);
#: the Monte Carlo error of the calibration is recorded with it.
DEFAULT_REPLICATES = 7
#: Rounds of the bootstrap: round 1 draws truths from the prior, every later round from the
#: previous round's calibrated posterior (public).
DEFAULT_ROUNDS = 2
#: Two-sided 95% normal quantile.
Z95 = 1.959963984540054
#: Method name written to the artifact.
METHOD = "parametric-bootstrap"

ProgressFn = Callable[[int, int], None]


class BootstrapError(RuntimeError):
    """The bootstrap could not calibrate (e.g. every replicate failed); a bug, never data."""


# ---- simulation randomness ---------------------------------------------------------------------
class SimulationRandomness:
    """A :class:`~dpsummary.private.mechanism.PrivacyRandomness` for SIMULATED tables only.

    Seeded numpy PCG64: Poisson coins and continuous Gaussian noise of the same standard
    deviations as the release's OpenDP discrete Gaussian. It protects nothing (the tables are
    synthetic) and must never be given real records; the release path always uses
    :class:`~dpsummary.private.mechanism.SystemRandomness`.

    :meth:`plan_samples` draws the Poisson samples of a run's ``steps`` steps AHEAD of the run
    (from ``coin_rng``, a stream of their own) so that a :class:`SyntheticStore` knows which
    rows the run will ever read; :meth:`sample_indices` then hands them out in order. The coins
    depend on nothing but the record count and q (never on the data, the draws or the noise),
    so drawing them first gives exactly the joint distribution of drawing them step by step."""

    def __init__(self, rng: np.random.Generator, coin_rng: np.random.Generator | None = None) -> None:
        self._rng = rng
        self._coin_rng = coin_rng if coin_rng is not None else rng
        self._planned: list[np.ndarray] | None = None
        self._plan_key: tuple[int, float] | None = None

    def coins(self, num_records: int, sample_rate: float) -> np.ndarray:
        return self._coin_rng.random(num_records) < sample_rate

    def _draw_indices(self, num_records: int, sample_rate: float) -> np.ndarray:
        k = int(self._coin_rng.binomial(num_records, sample_rate))
        return np.sort(self._coin_rng.choice(num_records, size=k, replace=False)).astype(np.int64)

    def plan_samples(self, num_records: int, sample_rate: float, steps: int) -> np.ndarray:
        """Draw the Poisson samples of the next ``steps`` calls of :meth:`sample_indices` with
        these arguments; returns their union (sorted distinct indices: every row the run reads)."""
        self._planned = [self._draw_indices(num_records, sample_rate) for _ in range(steps)]
        self._plan_key = (int(num_records), float(sample_rate))
        return (np.unique(np.concatenate(self._planned)) if self._planned
                else np.zeros(0, dtype=np.int64))

    def sample_indices(self, num_records: int, sample_rate: float) -> np.ndarray:
        if self._planned is None:
            return self._draw_indices(num_records, sample_rate)
        if self._plan_key != (int(num_records), float(sample_rate)) or not self._planned:
            raise BootstrapError("a replicate asked for a Poisson sample its plan does not hold (a bug)")
        return self._planned.pop(0)

    def gaussian(self, values: np.ndarray, *, noise_std: float, clip_norm: float) -> np.ndarray:
        values = np.asarray(values, dtype=np.float64)
        return values + self._rng.normal(0.0, noise_std, size=values.shape)


# ---- what is simulated --------------------------------------------------------------------------
@dataclass(frozen=True)
class MechanismSettings:
    """The public settings of the DP-PSVI run being simulated (all public or DP outputs).

    ``record_count``: the release's record count (noisy, or public); ``count_noise_multiplier``:
    the noise of that count (None: public, re-used as is); ``init_marginals``: the release's DP
    initialisation histograms (:class:`~dpsummary.postprocess.marginals.NoisyMarginals`), the source
    of synthetic features, or None (public schema box)."""

    model: Any
    transform: Any
    size: int
    steps: int
    num_samples: int
    noise_multiplier: float
    sample_rate: float
    record_count: float
    count_noise_multiplier: float | None = None
    init_noise_multiplier: float | None = None
    init_layout: Any = None
    init_marginals: Any = None

    def describe(self) -> dict[str, Any]:
        return {
            "record_count": "the release's noisy record count" if self.count_noise_multiplier is not None
            else "the public record count",
            "features": "drawn from the release's DP initialisation histograms (per column, independently)"
            if self.init_marginals is not None else "drawn from the public schema (uniform box, uniform categories)",
            "targets": "simulated from the model at the truth, clamped to the schema's public range",
            "mechanism": ("the release's DP-PSVI code path re-run in full (count noise, initialisation "
                          "histograms, T subsampled Gaussian steps) with the same public settings"),
        }


@dataclass(frozen=True)
class BootstrapConfig:
    """``replicates`` B; ``workers`` processes (None: ``min(2, cores)``); ``seed`` of the
    simulation (None: drawn at random and recorded; it protects nothing)."""

    replicates: int = DEFAULT_REPLICATES
    rounds: int = DEFAULT_ROUNDS
    workers: int | None = None
    seed: int | None = None

    def resolved_workers(self) -> int:
        """Worker processes used: ``workers`` if given, else ``min(2, cores)`` where worker
        processes need no ``__main__`` guard (Linux, :func:`worker_start_method`) and 1 (in
        process, stated in the release's notice) elsewhere."""
        cores = os.cpu_count() or 1
        default = min(2, cores) if worker_start_method() == "fork" and not fork_unsafe_runtime() else 1
        want = self.workers if self.workers is not None else default
        return max(1, min(want, self.replicates))


#: Runtimes that keep threads of their own once imported, so that a ``fork`` of the process can
#: deadlock in the child (JAX warns exactly this); with one of them loaded (an analyst's notebook
#: or a test process that also ran the exporters) the default is one in-process worker.
FORK_UNSAFE_MODULES = ("jax", "jaxlib")


def fork_unsafe_runtime() -> bool:
    """Whether a runtime of :data:`FORK_UNSAFE_MODULES` is loaded in this process."""
    import sys

    return any(name in sys.modules for name in FORK_UNSAFE_MODULES)


def worker_start_method() -> str:
    """How worker processes start: ``"fork"`` on Linux, ``"spawn"`` elsewhere.

    ``spawn`` (and ``forkserver``) children re-import the caller's ``__main__`` script, so a
    library call from a script without an ``if __name__ == "__main__":`` guard would start the
    bootstrap again inside every child and crash (``BrokenProcessPool``). ``fork`` copies the
    parent instead and needs no guard. It is safe here because a child only runs
    :func:`run_replicate` (pure torch/numpy on its job, ``torch.set_num_threads(1)`` first, no
    I/O, no locks of the parent's threads). macOS and Windows have no safe ``fork``; there the
    default is one in-process worker, and more workers (``BootstrapConfig(workers=...)``) need
    the caller's script to have the ``__main__`` guard."""
    import multiprocessing
    import sys

    return "fork" if sys.platform.startswith("linux") and "fork" in multiprocessing.get_all_start_methods() \
        else "spawn"


@dataclass(frozen=True)
class ReplicateJob:
    settings: MechanismSettings
    truth: torch.Tensor
    seed: int


@dataclass(frozen=True)
class Replicate:
    """One re-run: its truth, its pseudocoreset and that pseudocoreset's posterior mean."""

    truth: torch.Tensor
    points: torch.Tensor
    weights: torch.Tensor
    mean: torch.Tensor


def synthetic_table(settings: MechanismSettings, truth: torch.Tensor, num_records: int,
                    generator: torch.Generator) -> torch.Tensor:
    """``num_records`` synthetic rows in model space from the release only (module docstring).

    The rows are i.i.d.: features from per-column samplers that draw each row independently
    (:meth:`~dpsummary.postprocess.marginals.NoisyMarginals.sampler`: multinomial with
    replacement per column, then uniform within the bin; the public box:
    :meth:`~dpsummary.data.transform.Transform.sample_public_features`), a target drawn from the
    model given that row's features only (``model.simulate``), clamped per row. So a table
    generated in blocks (:class:`SyntheticStore`) has the same distribution as one generated at
    once."""
    from .mechanisms.dp_psvi_setup import public_point_bounds

    tf, model = settings.transform, settings.model
    public = tf.sample_public_features
    sampler = settings.init_marginals.sampler(public) if settings.init_marginals is not None else public
    features = sampler(num_records, generator)
    table = model.simulate(truth, num_records, generator, features=features)
    if model.has_target:
        lower, upper = public_point_bounds(tf, model)
        table[:, -1] = table[:, -1].clamp(min=lower[-1], max=upper[-1])
    return table


#: Rows per generated block of a replicate's synthetic table (public constant): a full pass over
#: a :class:`SyntheticStore` holds one block at a time.
SYNTHETIC_BLOCK_ROWS = 1 << 16


class SyntheticStore(RecordStore):
    """A replicate's synthetic table of ``num_rows`` rows whose memory does not grow with it.

    The table is FIXED, as a materialised one would be: block ``b`` (rows ``b*K .. b*K+K-1``,
    ``K = block_rows``) is ``synthetic_table(settings, truth, K, Generator(seed_b))`` with
    ``seed_b`` derived from ``(table_seed, b)`` alone, so it can be regenerated bit for bit.
    :meth:`chunks` (the DP histograms' full pass) generates the blocks one at a time and drops
    them; :meth:`gather` (a DP-PSVI step) serves rows from a cache of the rows at ``touched``,
    the union of every step's Poisson sample drawn ahead by
    :meth:`SimulationRandomness.plan_samples`, filled on the first pass (or, if no full pass
    comes first, by generating only the blocks that hold touched rows). A run therefore reads
    exactly the rows it would read from the materialised table
    ``concatenate([block_0, block_1, ...])`` (tested bit for bit), i.e. it replays the mechanism
    on a synthetic table of the released size, while memory is O(K x dim) for a pass plus
    O(|touched| x dim) for the cache: ``|touched| <= T x`` the batch sizes, whose expectation
    is ``T q N~`` (``T x 200`` under the release's default ``q = 200 / N~``, whatever ``N~``) --
    the mechanism's own per-step batch times T, independent of the record count.

    Synthetic data only: it never holds a record (module docstring)."""

    def __init__(self, settings: MechanismSettings, truth: torch.Tensor, num_rows: int, *, table_seed: int,
                 touched: np.ndarray, block_rows: int | None = None) -> None:
        block_rows = SYNTHETIC_BLOCK_ROWS if block_rows is None else block_rows
        if num_rows < 1 or block_rows < 1:
            raise ValueError("a synthetic table needs at least one row and one row per block")
        super().__init__(int(settings.model.point_dim), memory_bytes=0)
        self._syn_settings = settings
        self._syn_truth = truth
        self._syn_rows = int(num_rows)
        self._syn_seed = int(table_seed)
        self._syn_block = int(block_rows)
        self._touched = np.asarray(touched, dtype=np.int64)
        if self._touched.size and (self._touched[0] < 0 or self._touched[-1] >= num_rows
                                   or np.any(np.diff(self._touched) <= 0)):
            raise ValueError("touched rows must be sorted, distinct and within the table")
        self._cache: np.ndarray | None = None
        self._syn_closed = False

    @property
    def num_rows(self) -> int:
        return self._syn_rows

    def block(self, b: int) -> np.ndarray:
        """Block ``b`` of the table (deterministic in ``(table_seed, b)``)."""
        start = b * self._syn_block
        rows = min(self._syn_block, self._syn_rows - start)
        state = np.random.SeedSequence([self._syn_seed, b]).generate_state(1, np.uint64)[0]
        gen = torch.Generator().manual_seed(int(state))
        # Looked up at call time, so a caller that swaps synthetic_table (a benchmark) is obeyed.
        table = synthetic_table(self._syn_settings, self._syn_truth, rows, gen)
        return np.ascontiguousarray(table.detach().to(DTYPE).numpy(), dtype=np.float64)

    def _blocks(self) -> int:
        return -(-self._syn_rows // self._syn_block)

    def _keep(self, b: int, rows: np.ndarray, cache: np.ndarray) -> None:
        start = b * self._syn_block
        lo, hi = np.searchsorted(self._touched, [start, start + rows.shape[0]])
        if hi > lo:
            cache[lo:hi] = rows[self._touched[lo:hi] - start]

    def _check_open(self) -> None:
        if self._syn_closed:
            raise RuntimeError("the store is closed")

    def chunks(self, rows: int = 0) -> Iterator[np.ndarray]:
        """Every row in order, one generated block at a time (``rows`` is ignored: the block
        size is :data:`SYNTHETIC_BLOCK_ROWS`); the first pass also fills the touched-row cache."""
        self._check_open()
        cache = None if self._cache is not None else np.empty((self._touched.size, self.dim), dtype=np.float64)
        for b in range(self._blocks()):
            part = self.block(b)
            if cache is not None:
                self._keep(b, part, cache)
            yield part
        if cache is not None:
            self._cache = cache

    def gather(self, indices: np.ndarray) -> np.ndarray:
        """The rows at sorted, distinct ``indices``, all of which must be touched rows."""
        self._check_open()
        idx = np.asarray(indices, dtype=np.int64)
        if self._cache is None:
            cache = np.empty((self._touched.size, self.dim), dtype=np.float64)
            for b in np.unique(self._touched // self._syn_block).tolist():
                self._keep(b, self.block(b), cache)
            self._cache = cache
        pos = np.searchsorted(self._touched, idx)
        if idx.ndim != 1 or np.any(pos >= self._touched.size) or not np.array_equal(self._touched[pos], idx):
            raise BootstrapError("a replicate read a synthetic row outside its planned samples (a bug)")
        return self._cache[pos]

    def close(self) -> None:
        self._syn_closed = True
        self._cache = None
        super().close()


def run_replicate(job: ReplicateJob) -> Replicate:
    """One replicate: synthetic table, then the mechanism's own code path on it (module docstring).
    Pure function of the job (reproducible from ``job.seed``).

    Seeding: the torch Generator of the run (posterior draws, initial points) and the numpy
    Generator of the Gaussian noise are seeded by ``job.seed`` as before; the Poisson coins and
    the table take streams of their own: ``SeedSequence([job.seed, 1])`` for the coins, and the
    table seed ``SeedSequence([job.seed, 2])`` whose block ``b`` is generated from ``[table seed, b]``. The table is a :class:`SyntheticStore` (memory independent of the
    record count), the coins of all T steps are drawn before the run
    (:meth:`SimulationRandomness.plan_samples`)."""
    from .private.mechanism import PrivateRecords

    s = job.settings
    torch.set_num_threads(1)
    gen = torch.Generator().manual_seed(job.seed)
    randomness = SimulationRandomness(np.random.default_rng(job.seed), np.random.default_rng([job.seed, 1]))
    num = max(int(round(s.record_count)), 1)
    touched = randomness.plan_samples(num, s.sample_rate, s.steps)
    store = SyntheticStore(s, job.truth, num, table_seed=int(np.random.SeedSequence([job.seed, 2]).generate_state(
        1, np.uint64)[0]), touched=touched)
    return replay_mechanism(s, job.truth, PrivateRecords(store, randomness=randomness), gen)


def replay_mechanism(s: MechanismSettings, truth: torch.Tensor, records: Any, gen: torch.Generator) -> Replicate:
    """The release's DP-PSVI code path on ``records`` (synthetic; a
    :class:`~dpsummary.private.mechanism.PrivateRecords` with :class:`SimulationRandomness`):
    noisy count (when the release's was noisy), DP initialisation, T steps; closes ``records``."""
    from .constructors.base import fit
    from .inference import coreset_posterior
    from .mechanisms.dp_psvi_setup import dp_psvi_constructor, initial_samplers

    try:
        count = s.record_count if s.count_noise_multiplier is None else max(
            records.noisy_count(noise_multiplier=s.count_noise_multiplier), 1.0)
        start = initial_samplers(records, s.transform, s.init_layout, s.init_noise_multiplier)
        constructor = dp_psvi_constructor(
            transform=s.transform, model=s.model, noise_multiplier=s.noise_multiplier, sample_rate=s.sample_rate,
            record_count=count, steps=s.steps, num_samples=s.num_samples,
            init_features=start.features, init_targets=start.targets,
        )
        summary = fit(constructor, records, s.model, s.size, generator=gen)
    finally:
        records.close()
    post = coreset_posterior(s.model, summary.points, summary.weights)
    return Replicate(truth, summary.points.detach().clone(), summary.weights.detach().clone(),
                     post.mean.detach().clone())


# ---- calibration --------------------------------------------------------------------------------
#: Adam steps of the match (public). Capped: run to convergence (a few thousand steps) the match
#: reaches ~0.05 nats by sending single weights to ~1e12, a pseudocoreset whose posterior
#: Newton's method can fail on (measured, sim_logistic_1e4, epsilon 1: 400 steps 7.0 nats,
#: largest weight 39; 1000 steps 2.5 nats, 1.9e3; 6000 steps 0.05 nats, 1e12).
MATCH_STEPS = 1000
MATCH_STEPS_FALLBACK = 400


def _t_quantile(df: int) -> float:
    from scipy.stats import t as student_t

    return float(student_t.ppf(0.975, max(df, 1)))


@dataclass(frozen=True)
class LinearFit:
    """Per coordinate ``j``, the replicates' posterior means ``m_bj ~ a_j + c_j theta*_bj + N(0, s_j^2)``."""

    intercept: torch.Tensor  # a (d,)
    slope: torch.Tensor  # c (d,), >= 0
    noise_var: torch.Tensor  # s^2 (d,), inflated for its Monte Carlo error
    slope_pooled: float
    replicates: int


def fit_linear(truths: torch.Tensor, means: torch.Tensor) -> LinearFit:
    """Least squares per coordinate, slopes shrunk toward their pooled value by empirical Bayes
    (James-Stein: ``c_j = c + l_j (c^_j - c)``, ``l_j = tau^2 / (tau^2 + se_j^2)``), clamped at 0
    (a mechanism whose output falls as the parameter rises carries no usable information about
    it). Residual variances on ``B - 2`` degrees of freedom, inflated by ``(t_{B-2} / z)^2`` so
    that intervals built from the fit allow for their own Monte Carlo error."""
    b = truths.shape[0]
    if b < 4:
        raise BootstrapError("the linear calibration needs at least 4 replicates")
    tc = truths - truths.mean(0)
    mc = means - means.mean(0)
    sxx = (tc**2).sum(0).clamp(min=1e-12)
    raw_slope = (tc * mc).sum(0) / sxx
    resid = mc - raw_slope * tc
    s2 = (resid**2).sum(0) / (b - 2)
    se2 = s2 / sxx
    pooled = float((tc * mc).sum() / (tc**2).sum().clamp(min=1e-12))
    spread = float(((raw_slope - pooled) ** 2).mean() - se2.mean())
    tau2 = max(spread, 0.0)
    shrink = tau2 / (tau2 + se2) if tau2 > 0 else torch.zeros_like(se2)
    slope = (pooled + shrink * (raw_slope - pooled)).clamp(min=0.0)
    resid = mc - slope * tc
    noise_var = (resid**2).sum(0) / (b - 2) * (_t_quantile(b - 2) / Z95) ** 2
    intercept = means.mean(0) - slope * truths.mean(0)
    return LinearFit(intercept, slope, noise_var.clamp(min=1e-18), pooled, b)


def linear_posterior(model: Any, fit: LinearFit, observed: torch.Tensor) -> GaussianPosterior:
    """The model's prior ``N(mu0, tau^2 I)`` times the fitted linear-Gaussian likelihood of the
    released posterior mean ``observed``, per coordinate: precision ``1/tau^2 + c_j^2 / s_j^2``.
    Never wider than the prior; the prior itself where the mechanism carries no information."""
    prior_prec = 1.0 / model.prior_scale**2
    info = fit.slope**2 / fit.noise_var
    prec = prior_prec + info
    mean = (model.prior_mean.to(DTYPE) * prior_prec + fit.slope * (observed - fit.intercept) / fit.noise_var) / prec
    return GaussianPosterior(mean=mean, scale_tril=torch.diag(torch.rsqrt(prec)))


def leave_one_out_z(model: Any, truths: torch.Tensor, means: torch.Tensor) -> torch.Tensor:
    """``|posterior mean - truth| / posterior sd`` per replicate and coordinate, ``(B, d)``, each
    replicate judged by :func:`linear_posterior` fitted WITHOUT it: honest held-out errors of
    the calibration rule on the bootstrap's own simulations."""
    b = truths.shape[0]
    rows = []
    for i in range(b):
        keep = torch.arange(b) != i
        post = linear_posterior(model, fit_linear(truths[keep], means[keep]), means[i])
        rows.append((post.mean - truths[i]).abs() / torch.sqrt(torch.diagonal(post.cov)))
    return torch.stack(rows)


def widening_factor(z: torch.Tensor) -> float:
    """The factor (>= 1) on the likelihood's noise sd that brings the held-out coverage to 95%:
    ``max(1, q_0.95(|z|) / 1.96)`` (a one-level double bootstrap of the interval's width; it
    absorbs what the per-coordinate linear model misses, e.g. nonlinearity and cross-effects)."""
    q = float(torch.quantile(z.flatten(), 0.95))
    return max(1.0, q / Z95) if math.isfinite(q) else 1.0


def _coverage(z: torch.Tensor) -> tuple[float, float]:
    per = (z <= Z95).to(DTYPE).mean(1).numpy()
    return float(per.mean()), float(per.std(ddof=1) / math.sqrt(per.size))


@dataclass(frozen=True)
class Calibration:
    """The bootstrap's measurements and the calibrated Gaussian (see :func:`calibrate`)."""

    posterior: GaussianPosterior
    fit: LinearFit
    loo_coverage: float
    loo_coverage_se: float
    bias_at_truths: torch.Tensor
    rounds: int
    replicates: int
    widening: float = 1.0
    match_symmetric_kl: float = float("nan")
    match_steps: int = 0

    def as_dict(self) -> dict[str, Any]:
        sd = torch.sqrt(torch.diagonal(self.posterior.cov))
        return {
            "rounds": self.rounds,
            "replicates": self.replicates,
            "replicates_in_fit": self.fit.replicates,
            "pooled_slope": self.fit.slope_pooled,
            "slope": self.fit.slope.tolist(),
            "intercept": self.fit.intercept.tolist(),
            "noise_sd": torch.sqrt(self.fit.noise_var).tolist(),
            "monte_carlo_inflation_of_variance": (_t_quantile(self.fit.replicates - 2) / Z95) ** 2,
            "bootstrap_coverage_leave_one_out": self.loo_coverage,
            "widening_factor": self.widening,
            "monte_carlo_se_of_coverage": self.loo_coverage_se,
            "relative_monte_carlo_se_of_sd": 1.0 / math.sqrt(2 * (self.fit.replicates - 2)),
            "bootstrap_bias_of_raw_mean": self.bias_at_truths.tolist(),
            "gaussian": {"mean": self.posterior.mean.tolist(), "sd": sd.tolist()},
            "match_symmetric_kl": self.match_symmetric_kl,
            "match_steps": self.match_steps,
        }


def calibrate(model: Any, replicates: list[Replicate], observed: torch.Tensor, *, rounds: int = 1) -> Calibration:
    """The calibrated Gaussian from the replicates (all rounds pooled) and the release's raw
    posterior mean ``observed``: :func:`fit_linear`; its noise sds widened by
    :func:`widening_factor` of the leave-one-out errors; then :func:`linear_posterior`. The
    leave-one-out coverage before widening (an honest check) is recorded with its Monte Carlo
    standard error."""
    import dataclasses

    if len(replicates) < 5:
        raise BootstrapError("fewer than 5 bootstrap replicates finished (4 fit, 1 left out)")
    truths = torch.stack([r.truth for r in replicates])
    means = torch.stack([r.mean for r in replicates])
    z = leave_one_out_z(model, truths, means)
    loo, loo_se = _coverage(z)
    widen = widening_factor(z)
    fit = fit_linear(truths, means)
    fit = dataclasses.replace(fit, noise_var=fit.noise_var * widen**2)
    post = linear_posterior(model, fit, observed)
    return Calibration(post, fit, loo, loo_se, (means - truths).mean(0), rounds, len(replicates), widen)


def diagonal(post: GaussianPosterior) -> GaussianPosterior:
    """``post`` with its correlations dropped (the proposal of the next round)."""
    return GaussianPosterior(mean=post.mean, scale_tril=torch.diag(torch.sqrt(torch.diagonal(post.cov))))


# ---- the front door -----------------------------------------------------------------------------
@dataclass(frozen=True)
class BootstrapResult:
    """``summary``: the calibrated pseudocoreset (default in the artifact); ``calibration``: the
    measurements; ``seconds``: wall time of the bootstrap; ``workers``; ``seed``."""

    summary: Any
    calibration: Calibration
    seconds: float
    workers: int
    seed: int

    def record(self, settings: MechanismSettings) -> dict[str, Any]:
        """What the artifact records (public settings and post-processed values only)."""
        return {
            "method": METHOD,
            "reference": ("Ferrando, Wang and Sheldon (2022), parametric bootstrap for DP confidence intervals; "
                          "inverted through a per-coordinate linear-Gaussian model of the mechanism "
                          "(regression adjustment as in approximate Bayesian computation)"),
            "truth": ("round 1: theta* drawn from the model's prior; later rounds: from the previous round's "
                      "calibrated posterior (correlations dropped)"),
            "synthetic_tables": settings.describe(),
            "simulation_noise": "seeded numpy PCG64 (simulation noise on synthetic tables; protects nothing)",
            "simulation_seed": self.seed,
            "rule": ("per coordinate j, fit the raw posterior means of all replicates as a_j + c_j theta*_j + "
                     "N(0, s_j^2) (least squares; slopes shrunk toward their pooled value by empirical Bayes, "
                     "clamped at 0; s_j^2 inflated by (t_{B-2}/z)^2 for Monte Carlo error, s_j then widened by "
                     "widening_factor = max(1, q_0.95 of the leave-one-out |error| / sd over replicates and "
                     "coordinates / 1.96)); the calibrated "
                     "posterior is the prior times that likelihood of the released raw mean: "
                     "N(mean, sd^2) per coordinate, never wider than the prior; the summary is a "
                     "pseudocoreset of the release's size matched to it (dpsummary.constructors.gaussian_target)"),
            "workers": self.workers,
            "privacy_cost": "none (post-processing of the release)",
            **self.calibration.as_dict(),
        }


class ParametricBootstrap:
    """``ParametricBootstrap(settings, config).fit(raw_summary)`` -> :class:`BootstrapResult`.

    Per round, ``jobs`` draws the replicates' truths and seeds (cheap), ``run`` executes them (in
    ``workers`` processes when more than one), and the calibration refits; ``finish`` matches the
    pseudocoreset to the final Gaussian. Nothing here takes records (module docstring)."""

    def __init__(self, settings: MechanismSettings, config: BootstrapConfig | None = None) -> None:
        self.settings = settings
        self.config = config or BootstrapConfig()
        if self.config.replicates < 5:
            raise ValueError("the bootstrap needs at least 5 replicates per round")
        if self.config.rounds < 1:
            raise ValueError("the bootstrap needs at least 1 round")
        self.seed = self.config.seed if self.config.seed is not None else secrets.randbits(62)

    def raw_posterior(self, raw_summary: Any) -> GaussianPosterior:
        from .inference import coreset_posterior

        return coreset_posterior(self.settings.model, raw_summary.points, raw_summary.weights)

    def jobs(self, proposal: GaussianPosterior, generator: torch.Generator) -> list[ReplicateJob]:
        truths = proposal.sample(self.config.replicates, generator)
        seeds = torch.randint(0, 2**62, (self.config.replicates,), generator=generator).tolist()
        return [ReplicateJob(self.settings, truths[i].clone(), int(seeds[i])) for i in range(len(seeds))]

    def run(self, jobs: list[ReplicateJob], progress: ProgressFn | None = None, *, offset: int = 0,
            total: int | None = None) -> list[Replicate]:
        workers = self.config.resolved_workers()
        total = len(jobs) if total is None else total
        done: list[Replicate | None] = [None] * len(jobs)
        if progress is not None:
            progress(offset, total)
        if workers <= 1:
            for i, job in enumerate(jobs):
                done[i] = run_replicate(job)
                if progress is not None:
                    progress(offset + i + 1, total)
        else:
            import multiprocessing
            from concurrent.futures import ProcessPoolExecutor, as_completed

            ctx = multiprocessing.get_context(worker_start_method())
            with ProcessPoolExecutor(max_workers=workers, mp_context=ctx) as pool:
                futures = {pool.submit(run_replicate, job): i for i, job in enumerate(jobs)}
                for count, fut in enumerate(as_completed(futures), start=1):
                    done[futures[fut]] = fut.result()
                    if progress is not None:
                        progress(offset + count, total)
        return [r for r in done if r is not None]

    def finish(self, cal: Calibration, raw_summary: Any, generator: torch.Generator) -> tuple[Any, Calibration]:
        """The pseudocoreset (same size as the raw one) matched to the calibrated Gaussian.
        Public rule: for a GLM with at least as many points as parameters, the closed form
        (:func:`~dpsummary.constructors.gaussian_target.exact_glm_pseudopoints`, exact wherever
        the calibrated Gaussian is nowhere wider than the prior; recorded as 0 steps) when its
        symmetric KL is within the match tolerance; else :data:`MATCH_STEPS` Adam
        steps from the raw summary's features, else the shorter :data:`MATCH_STEPS_FALLBACK`,
        each kept only if the match's posterior can be computed from the prior mean, as an
        analyst would; the steps used are recorded. Raises :class:`BootstrapError` (a charged
        refusal in the release) if none gives a finite pseudocoreset with a computable posterior."""
        import dataclasses

        from .constructors.base import Summary
        from .constructors.gaussian_target import (
            DEFAULT_TOLERANCE,
            exact_glm_pseudopoints,
            match_gaussian,
        )
        from .inference import NewtonFailure, coreset_posterior
        from .models import GLM

        model = self.settings.model
        size = raw_summary.points.shape[0]
        features = raw_summary.points[:, : model.num_features].detach().clone()

        def candidates() -> Any:
            # Lazily: the Adam fits run only if the closed form is unavailable or unusable.
            exact = exact_glm_pseudopoints(model, cal.posterior, size=size, generator=generator) \
                if isinstance(model, GLM) else None
            if exact is not None and exact.kl <= DEFAULT_TOLERANCE:
                yield 0, exact.points, exact.weights, exact.kl
            for n in (MATCH_STEPS, MATCH_STEPS_FALLBACK):
                yield (n, *match_gaussian(model, cal.posterior, size=size, initial_features=features,
                                          generator=generator, steps=n))

        chosen = None
        for candidate in candidates():
            _, points, weights, loss = candidate
            if not (math.isfinite(loss) and bool(torch.isfinite(points).all())
                    and bool(torch.isfinite(weights).all())):
                continue
            try:
                post = coreset_posterior(model, points, weights)
            except (NewtonFailure, RuntimeError):  # RuntimeError: a Cholesky failure
                continue
            if bool(torch.isfinite(post.mean).all()):
                chosen = candidate
                break
        if chosen is None:
            raise BootstrapError("the calibrated Gaussian could not be matched by a usable pseudocoreset")
        steps, points, weights, loss = chosen
        cal = dataclasses.replace(cal, match_symmetric_kl=float(loss), match_steps=steps)
        summary = Summary(points, weights, raw_summary.model, raw_summary.method, raw_summary.transform,
                          {**raw_summary.info, "posterior": "calibrated", "match_symmetric_kl": float(loss)})
        return summary, cal

    def fit(self, raw_summary: Any, progress: ProgressFn | None = None) -> BootstrapResult:
        from .inference import prior_posterior

        t0 = time.perf_counter()
        model = self.settings.model
        gen = torch.Generator().manual_seed(self.seed)
        observed = self.raw_posterior(raw_summary).mean
        proposal = prior_posterior(model)
        total = self.config.rounds * self.config.replicates
        replicates: list[Replicate] = []
        cal: Calibration | None = None
        for r in range(self.config.rounds):
            replicates += self.run(self.jobs(proposal, gen), progress, offset=len(replicates), total=total)
            cal = calibrate(model, replicates, observed, rounds=r + 1)
            proposal = diagonal(cal.posterior)
        assert cal is not None
        summary, cal = self.finish(cal, raw_summary, gen)
        return BootstrapResult(summary, cal, time.perf_counter() - t0, self.config.resolved_workers(), self.seed)
