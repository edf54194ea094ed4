"""The one place that touches private records.

:class:`PrivateRecords` holds the transformed private table and exposes only accounted
mechanisms: the Poisson-subsampled, clipped, Gaussian-noised sum of centred log-likelihood
vectors that DP-PSVI needs (DP-PSVI paper, Section 3.3 eq. (6)), a Gaussian-noised record
count, and Gaussian-noised per-column histograms over public bins (DP-PSVI's initialisation,
:mod:`dpsummary.private.marginals`). It has no ``__len__``, no accessor for the records, and
never logs; the realised batch size exists only inside :meth:`PrivateRecords.noisy_clipped_sum`.
The records live in a :class:`~dpsummary.private.store.RecordStore` (memory-bounded: a step
reads only its sampled rows, a full pass reads chunk by chunk), and every per-record rule
(clip, fixed-point rounding, exact sum) is in :mod:`dpsummary.private.kernel`, the one kernel
shared by every engine; a step's Poisson sample is drawn in O(qN) by
:mod:`dpsummary.private.sampling`.

Privacy randomness (inclusion coins, noise) comes from a :class:`PrivacyRandomness`; the only
implementation reachable from the CLI is :class:`SystemRandomness` (OS entropy, see
:mod:`dpsummary.private.noise`). Tests and the empirical self-test replay neighbouring data sets
with identical randomness by passing a recording implementation; that hook is the reason the
interface exists.
"""

from __future__ import annotations

import math
from typing import TYPE_CHECKING, Any, cast

import numpy as np
import numpy.typing as npt
import torch

from ..models import DTYPE, Model
from . import noise

# Re-exported for callers that import them from here (they live in fixed_point since issue 30).
from .fixed_point import FIXED_POINT_BITS as FIXED_POINT_BITS
from .fixed_point import MAX_EXACT_ROWS as MAX_EXACT_ROWS
from .fixed_point import MechanismError as MechanismError
from .fixed_point import clip_rows as clip_rows
from .fixed_point import fixed_point_unit as fixed_point_unit

# The protocol lives in its own module so score_stats can name it without importing this one
# (issue 49: the type-only cycle mechanism <-> score_stats); re-exported for every caller.
from .randomness import PrivacyRandomness as PrivacyRandomness
from .store import RecordStore

if TYPE_CHECKING:
    from ..cells.domain import CellDomain
    from ..models.glm import GLM
    from ..postprocess.marginals import NoisyMarginals
    from .cells import NoisyCells
    from .marginals import HistogramLayout
    from .moments import NoisyMoments, NoisyResiduals
    from .objective import PerturbedMode
    from .randomness import TiltRandomness
    from .score_stats import NoisyStatistics


class SystemRandomness:
    """Coins and noise from the operating system's CSPRNG (never seedable)."""

    def coins(self, num_records: int, sample_rate: float) -> np.ndarray:
        return noise.poisson_mask(num_records, sample_rate)

    def sample_indices(self, num_records: int, sample_rate: float) -> np.ndarray:
        from .sampling import poisson_indices

        return poisson_indices(num_records, sample_rate)

    def __init__(self) -> None:
        self._pools: dict[tuple[int, float, float], noise.GaussianNoisePool] = {}

    def prepare_gaussian(self, *, dim: int, noise_std: float, clip_norm: float, count: int) -> None:
        """Draw the noise of ``count`` upcoming identical Gaussian releases ahead of use, on a
        background thread (:class:`~dpsummary.private.noise.GaussianNoisePool`; OS entropy, each
        vector used once). Public arguments only."""
        key = (int(dim), float(noise_std), float(clip_norm))
        old = self._pools.pop(key, None)
        if old is not None:
            old.close()
        self._pools[key] = noise.GaussianNoisePool(dim=dim, noise_std=noise_std, clip_norm=clip_norm, count=count)

    def gaussian(self, values: np.ndarray, *, noise_std: float, clip_norm: float) -> np.ndarray:
        values = np.asarray(values, dtype=np.float64)
        pool = self._pools.get((values.shape[0], float(noise_std), float(clip_norm))) if values.ndim == 1 else None
        if pool is not None and pool.remaining > 0:
            return pool.add(values)
        return noise.add_gaussian_noise(values, noise_std=noise_std, clip_norm=clip_norm)

    def tilt(self, dim: int, *, noise_std: float) -> np.ndarray:
        return noise.dithered_gaussian(dim, noise_std=noise_std)

    def close(self) -> None:
        """Stop every pool; noise drawn but not used is discarded."""
        for pool in self._pools.values():
            pool.close()
        self._pools.clear()


def draw_sample(randomness: Any, num_records: int, sample_rate: float) -> np.ndarray:
    """One step's Poisson sample as sorted distinct indices (see :class:`PrivacyRandomness`).

    Validates the shape of what the randomness returned (a bug there must abort, never change
    the sample silently). PRIVATE output: the caller gathers rows with it and nothing else."""
    draw = getattr(randomness, "sample_indices", None)
    if draw is not None:
        idx = np.asarray(draw(num_records, sample_rate), dtype=np.int64)
        if idx.ndim != 1 or (idx.size and (idx[0] < 0 or idx[-1] >= num_records or np.any(np.diff(idx) <= 0))):
            raise MechanismError("sample indices are not sorted, distinct and in range")
        return idx
    mask = np.asarray(randomness.coins(num_records, sample_rate), dtype=bool)
    if mask.shape != (num_records,):
        raise MechanismError("inclusion mask has the wrong shape")
    return np.flatnonzero(mask).astype(np.int64)


def exact_clipped_sum(clipped: np.ndarray, clip_norm: float) -> np.ndarray:
    """The column sum of already clipped rows, computed exactly on a public fixed-point grid.

    Contract: every row of ``clipped`` (shape (m, d)) has L2 norm <= ``clip_norm``. Each
    coordinate is rounded TOWARD ZERO onto the grid :func:`fixed_point_unit` (so a rounded row's
    norm never exceeds the clipped row's), the integers are summed exactly (float64 chunk sums of
    at most :data:`dpsummary.private.kernel.CHUNK_ROWS` integers below 2^29, combined in Python
    integers: :func:`dpsummary.private.kernel.fixed_point_sum`), and the result is scaled back
    (:func:`dpsummary.private.kernel.finish`). Two neighbouring batches therefore give integer
    sums that differ by exactly one rounded row, of norm <= clip_norm: a float sum's rounding
    (1 + 5.3e-12 at 200,000 aligned rows) cannot inflate the sensitivity. Up to 2^24 rows the
    float64 result is exact; beyond, the conversion rounds by at most ``2^-53`` of each
    coordinate's value, which the CALLER's clip must leave room for: clip the rows to
    :func:`dpsummary.private.kernel.effective_clip` ``(clip_norm, d)`` (OpenDP's rounding slack
    plus :func:`dpsummary.private.noise.float_slack`, sized for up to
    :data:`dpsummary.private.noise.MAX_RECORDS` rows). The result is a multiple of the noise
    grid, so OpenDP's input rounding adds nothing. The rounding costs at most ``2^-28 C`` per
    coordinate of accuracy. Cost: O(m d), a few vectorised passes.
    """
    from . import kernel

    rows = np.asarray(clipped, dtype=np.float64)
    if rows.ndim != 2:
        raise MechanismError("exact_clipped_sum expects a 2-d array of rows")
    unit = fixed_point_unit(clip_norm)
    return kernel.finish(kernel.fixed_point_sum(rows, unit), clip_norm)


class PrivateRecords:
    """Private records in model space, reachable only through accounted mechanisms.

    Construct it from the encoded records (a :class:`~dpsummary.private.store.RecordStore`, or
    an in-memory tensor/array for tests, benchmarks and the self-test) *after* the ledger has
    reserved the budget. Every per-record computation goes through
    :mod:`dpsummary.private.kernel` (the kernel every engine shares).
    """

    __slots__ = ("_owns_randomness", "_randomness", "_store")

    def __init__(self, points: torch.Tensor | np.ndarray | RecordStore, *,
                 randomness: PrivacyRandomness | None = None) -> None:
        if isinstance(points, RecordStore):
            self._store = points
        else:
            arr = points.detach().to(DTYPE).numpy() if isinstance(points, torch.Tensor) else np.asarray(points)
            self._store = RecordStore.from_array(np.ascontiguousarray(arr, dtype=np.float64))
        self._owns_randomness = randomness is None
        self._randomness: PrivacyRandomness = randomness if randomness is not None else SystemRandomness()

    def close(self) -> None:
        """Release the records (the store's memory or anonymous file) and stop any noise pool."""
        self._store.close()
        stop = getattr(self._randomness, "close", None) if self._owns_randomness else None
        if stop is not None:
            stop()

    def noisy_clipped_sum(
        self,
        model: Model,
        theta: torch.Tensor,
        *,
        sample_rate: float,
        clip_norm: float,
        noise_multiplier: float,
    ) -> torch.Tensor:
        """One step of the Poisson-subsampled Gaussian mechanism (DP-PSVI eq. (6)).

        Each record is included with probability ``sample_rate`` (:func:`draw_sample`: exact
        Poisson sampling from the privacy randomness, O(qN) with :class:`SystemRandomness`); only
        the included rows are read from the store. For every included record its
        log-likelihood vector over the S draws ``theta`` is centred over its own S values and
        clipped to L2 norm ``clip_norm`` (minus the noise grid's rounding slack); the clipped
        vectors are summed EXACTLY on a public fixed-point grid (:func:`kernel.dppsvi_partial`,
        so float rounding cannot push the L2 sensitivity above ``clip_norm``) and Gaussian noise
        of standard deviation ``noise_multiplier * clip_norm`` is added once. Returns the noisy
        sum, shape (S,). ``theta`` and ``clip_norm`` must be public (functions of released
        pseudopoints); the caller divides by ``sample_rate`` itself.

        Implementation: the sum is released in units of ``clip_norm`` (each record contributes
        ``clip(v / C, 1)``, sensitivity 1, noise ``N(0, noise_multiplier^2)``) and multiplied back
        by C, which is post-processing. That is the same mechanism as clipping to C and adding
        noise of sd ``noise_multiplier * C``, and it makes every step of a run the identical
        unit mechanism whatever C, so :class:`SystemRandomness` may serve the noise from a pool
        drawn ahead of use (:meth:`expect_clipped_sums`, issue 15).
        """
        from . import kernel

        if not (clip_norm > 0 and math.isfinite(clip_norm) and noise_multiplier > 0):
            raise MechanismError("clip_norm and noise_multiplier must be positive")
        idx = draw_sample(self._randomness, self._store.num_rows, sample_rate)
        batch = self._store.gather(idx)
        return release_clipped_sum(self._randomness, kernel.dppsvi_partial(
            batch, model, theta, clip_norm=1.0, normalise_by=clip_norm), clip_norm=clip_norm,
            noise_multiplier=noise_multiplier)

    def expect_clipped_sums(self, *, num_draws: int, noise_multiplier: float, count: int) -> None:
        """Announce ``count`` upcoming :meth:`noisy_clipped_sum` calls with ``num_draws`` draws
        (public: the run's T, S and noise multiplier), so the randomness may draw their noise
        ahead of use (:class:`dpsummary.private.noise.GaussianNoisePool`). Optional for
        randomness implementations without ``prepare_gaussian``."""
        prepare = getattr(self._randomness, "prepare_gaussian", None)
        if prepare is not None:
            prepare(dim=num_draws, noise_std=noise_multiplier, clip_norm=1.0, count=count)

    def noisy_count(self, *, noise_multiplier: float) -> float:
        """The record count plus N(0, noise_multiplier^2) (a Gaussian mechanism, sensitivity 1)."""
        return release_count(self._randomness, self._store.num_rows, noise_multiplier=noise_multiplier)

    def perturbed_mode(self, model: GLM, *, feature_norm: float, ridge: float, centre: torch.Tensor,
                       noise_multiplier: float, output_multiplier: float) -> PerturbedMode:
        """Objective perturbation over ALL records (:func:`dpsummary.private.objective.perturbed_mode`):
        ``ObjectivePerturbationDpEvent(noise_multiplier, ...)`` then ``GaussianDpEvent(output_multiplier)``.
        Needs a randomness that draws a tilt with a density (:class:`SystemRandomness` does)."""
        from .objective import perturbed_mode

        return perturbed_mode(self._store, cast("TiltRandomness", self._randomness), model, feature_norm=feature_norm,
                              ridge=ridge, centre=centre, noise_multiplier=noise_multiplier,
                              output_multiplier=output_multiplier)

    def noisy_curvature(self, model: Model, theta: torch.Tensor, *, curvature_bound: float,
                        noise_multiplier: float) -> torch.Tensor:
        """The clipped curvature sum over ALL records at public ``theta`` alone
        (:func:`dpsummary.private.objective.noisy_curvature`): ``GaussianDpEvent(noise_multiplier)``."""
        from .objective import noisy_curvature

        return noisy_curvature(self._store, self._randomness, model, theta, curvature_bound=curvature_bound,
                               noise_multiplier=noise_multiplier)

    def noisy_score_statistics(
        self,
        model: Model,
        theta: torch.Tensor,
        *,
        score_bound: float,
        curvature_bound: float,
        score_noise_multiplier: float,
        curvature_noise_multiplier: float,
    ) -> NoisyStatistics:
        """The noise-aware mechanism's two Gaussian releases over ALL records at public ``theta``:
        clipped score and curvature sums (:mod:`dpsummary.private.score_stats`), i.e.
        ``GaussianDpEvent(score_noise_multiplier)`` and ``GaussianDpEvent(curvature_noise_multiplier)``."""
        from .score_stats import noisy_score_statistics

        return noisy_score_statistics(
            self._store, self._randomness, model, theta, score_bound=score_bound, curvature_bound=curvature_bound,
            score_noise_multiplier=score_noise_multiplier, curvature_noise_multiplier=curvature_noise_multiplier,
        )

    def noisy_moment_matrix(self, *, bound: float, noise_multiplier: float) -> NoisyMoments:
        """Linear regression's release over ALL records: the clipped moment matrix of
        ``[1, x, y]`` plus Gaussian noise (:mod:`dpsummary.private.moments`),
        ``GaussianDpEvent(noise_multiplier)``."""
        from .moments import noisy_moment_matrix

        return noisy_moment_matrix(self._store, self._randomness, bound=bound, noise_multiplier=noise_multiplier)

    def noisy_residual_vector(self, *, bound: float, noise_multiplier: float, anchor: torch.Tensor,
                              residual_clip: float, residual_range: float, square_scale: float) -> NoisyResiduals:
        """Linear regression's anchored round over ALL records: the clipped ``[X^T r, r^T r / s]``
        plus Gaussian noise (:mod:`dpsummary.private.moments`), ``GaussianDpEvent(noise_multiplier)``."""
        from .moments import noisy_residual_vector

        return noisy_residual_vector(self._store, self._randomness, bound=bound, noise_multiplier=noise_multiplier,
                                     anchor=anchor, residual_clip=residual_clip, residual_range=residual_range,
                                     square_scale=square_scale)

    def noisy_cell_statistics(self, domain: CellDomain, design: np.ndarray, *, target_bound: float,
                              count_share: float, noise_multiplier: float) -> NoisyCells:
        """``noise-aware-cells``' release over ALL records: the counts of the public domain's cells
        and ``T = sum_i z_c(i) y_i``, one ``GaussianDpEvent(noise_multiplier)``
        (:mod:`dpsummary.private.cells`, where the per-record rule and the sensitivity are)."""
        from .cells import noisy_cell_statistics

        return noisy_cell_statistics(self._store.chunks(), self._randomness, domain, design,
                                     target_bound=target_bound, count_share=count_share,
                                     noise_multiplier=noise_multiplier)

    def noisy_indicator_counts(self, indicators: np.ndarray, *, noise_multiplier: float) -> np.ndarray:
        """Noisy column sums of per-record 0/1 indicators: one Gaussian mechanism.

        ``indicators`` has shape (n, k), one row per record (e.g. which data-quality rules the
        record touched); it is coerced to bool, so every record adds at most 1 to each of the k
        column sums: L2 sensitivity sqrt(k) (add/remove one record). The counts are multiplied by
        :func:`noise.count_vector_scale` ``(k, k)`` (sensitivity <= 1 with OpenDP's rounding
        slack and the float64 rounding of ``count * scale`` included, for counts up to
        :data:`noise.MAX_RECORDS`), noised with standard deviation ``noise_multiplier`` from the OS CSPRNG, and
        divided back: the release is exactly ``GaussianDpEvent(noise_multiplier)`` and the
        returned (k,) floats carry noise of standard deviation ``noise_multiplier * sqrt(k) /
        (1 - slack)`` on the raw count scale. The exact counts never leave this method.
        """
        if not (noise_multiplier > 0 and np.isfinite(noise_multiplier)):
            raise MechanismError("noise_multiplier must be positive and finite")
        matrix = np.asarray(indicators)
        if matrix.ndim != 2 or matrix.shape[1] < 1:
            raise MechanismError("indicators must be a 2-d (records x rules) array")
        # Any nonzero entry counts as 1: the per-record contribution stays 0/1 whatever it holds.
        counts = (matrix != 0).sum(axis=0).astype(np.float64)
        return noisy_indicator_totals(self._randomness, counts, noise_multiplier=noise_multiplier)

    def noisy_marginals(self, layout: HistogramLayout, *, noise_multiplier: float) -> NoisyMarginals:
        """Per-column histograms over the public bins of ``layout``, one Gaussian mechanism.

        Every record adds exactly 1 to one bin of each of the ``layout.touches`` histograms, so
        the count vector times ``layout.scale`` has L2 sensitivity at most 1 (add/remove one
        record) and noise of standard deviation ``noise_multiplier`` is
        ``GaussianDpEvent(noise_multiplier)``. Returns the noisy counts on the raw count scale.
        """

        if not (noise_multiplier > 0 and np.isfinite(noise_multiplier)):
            raise MechanismError("noise_multiplier must be positive and finite")
        if layout.num_features > self._store.dim:
            raise MechanismError("the histogram layout does not match the records")
        counts = np.zeros(layout.num_bins, dtype=np.float64)
        records = 0
        for chunk in self._store.chunks():
            part = layout.counts(torch.from_numpy(np.ascontiguousarray(chunk)))
            check_marginal_counts(layout, part, chunk.shape[0])
            counts += part
            records += chunk.shape[0]
        return release_marginal_counts(self._randomness, layout, counts, records, noise_multiplier=noise_multiplier)


def release_clipped_sum(randomness: PrivacyRandomness, total: np.ndarray, *, clip_norm: float,
                        noise_multiplier: float) -> torch.Tensor:
    """DP-PSVI's release from EXACT unit-clipped integer totals (any engine's
    :func:`kernel.dppsvi_partial` sums with ``clip_norm=1, normalise_by=clip_norm``):
    ``clip_norm * (total + N(0, noise_multiplier^2 I))``, one Gaussian mechanism of sensitivity 1
    (the multiplication by the public ``clip_norm`` is post-processing)."""
    from . import kernel

    unit_sum = kernel.finish(total, 1.0)
    noisy = randomness.gaussian(unit_sum, noise_std=noise_multiplier, clip_norm=1.0)
    return torch.from_numpy(np.asarray(noisy, dtype=np.float64) * clip_norm)


def release_count(randomness: PrivacyRandomness, count: int, *, noise_multiplier: float) -> float:
    """An exact record count (any engine) plus N(0, noise_multiplier^2): a Gaussian mechanism
    with sensitivity 1 (add/remove one record). The exact count stays here."""
    if not (noise_multiplier > 0 and np.isfinite(noise_multiplier)):
        raise MechanismError("noise_multiplier must be positive and finite")
    return float(randomness.gaussian(np.array([float(count)]), noise_std=noise_multiplier, clip_norm=1.0)[0])


def check_marginal_counts(layout: HistogramLayout, counts: np.ndarray, num_records: int) -> None:
    """Re-check the invariant the accountant relies on: one unit per column per record."""
    if counts.shape != (layout.num_bins,) or not np.array_equal(
        [p.sum() for p in layout.split(counts)], [float(num_records)] * len(layout.columns)
    ):
        raise MechanismError("a record did not fall in exactly one bin per column")


def release_marginal_counts(randomness: PrivacyRandomness, layout: HistogramLayout, counts: np.ndarray,
                            num_records: int, *, noise_multiplier: float) -> NoisyMarginals:
    """The release of :meth:`PrivateRecords.noisy_marginals` from EXACT summed counts over
    ``num_records`` records (any engine). ``GaussianDpEvent(noise_multiplier)`` on the counts
    times ``layout.scale`` (:func:`noise.count_vector_scale`: the float64 rounding of the
    product is inside its slack); returns them on the raw count scale. The exact counts stay here."""
    from ..postprocess.marginals import NoisyMarginals

    if not (noise_multiplier > 0 and np.isfinite(noise_multiplier)):
        raise MechanismError("noise_multiplier must be positive and finite")
    counts = np.asarray(counts, dtype=np.float64)
    check_marginal_counts(layout, counts, num_records)
    scale = layout.scale
    noisy = randomness.gaussian(counts * scale, noise_std=noise_multiplier, clip_norm=1.0)
    return NoisyMarginals(layout, np.asarray(noisy, dtype=np.float64) / scale, noise_multiplier)


def noisy_indicator_totals(randomness: PrivacyRandomness, counts: npt.ArrayLike, *, noise_multiplier: float) -> np.ndarray:
    """The release of :meth:`PrivateRecords.noisy_indicator_counts` from already summed counts.

    CONTRACT (the caller's, checked by construction in :mod:`dpsummary.private.source`): entry
    j of ``counts`` is the number of records whose j-th 0/1 indicator is set, so one record
    changes each entry by at most 1 (L2 sensitivity sqrt(k)). One Gaussian mechanism,
    ``GaussianDpEvent(noise_multiplier)``; the exact counts never leave this function."""
    if not (noise_multiplier > 0 and np.isfinite(noise_multiplier)):
        raise MechanismError("noise_multiplier must be positive and finite")
    counts = np.asarray(counts, dtype=np.float64)
    if counts.ndim != 1 or counts.shape[0] < 1:
        raise MechanismError("counts must be a non-empty vector")
    k = counts.shape[0]
    scale = noise.count_vector_scale(k, k)
    noisy = randomness.gaussian(counts * scale, noise_std=noise_multiplier, clip_norm=1.0)
    return np.asarray(noisy, dtype=np.float64) / scale
