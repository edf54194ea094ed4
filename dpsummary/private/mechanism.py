"""The one place that touches private records.

:class:`PrivateRecords` holds the transformed private table and exposes only accounted
mechanisms: the Poisson-subsampled, clipped, Gaussian-noised sum of centred log-likelihood
vectors that DP-PSVI needs (DP-PSVI paper, Section 3.3 eq. (6)), a Gaussian-noised record
count, and Gaussian-noised per-column histograms over public bins (DP-PSVI's initialisation,
:mod:`dpsummary.private.marginals`). It has no ``__len__``, no accessor for the records, and
never logs; the realised batch size exists only inside :meth:`PrivateRecords.noisy_clipped_sum`.

Privacy randomness (inclusion coins, noise) comes from a :class:`PrivacyRandomness`; the only
implementation reachable from the CLI is :class:`SystemRandomness` (OS entropy, see
:mod:`dpsummary.private.noise`). Tests and the empirical self-test replay neighbouring data sets
with identical randomness by passing a recording implementation; that hook is the reason the
interface exists.
"""

from __future__ import annotations

import math
from dataclasses import dataclass
from typing import TYPE_CHECKING, Protocol

import numpy as np
import torch

from ..models import DTYPE, Model
from . import noise

if TYPE_CHECKING:
    from .marginals import HistogramLayout, NoisyMarginals
    from .score_stats import NoisyStatistics


class PrivacyRandomness(Protocol):
    def coins(self, num_records: int, sample_rate: float) -> np.ndarray:
        """Boolean inclusion mask, each entry true independently with probability sample_rate."""
        ...

    def gaussian(self, values: np.ndarray, *, noise_std: float, clip_norm: float) -> np.ndarray:
        """``values`` plus independent N(0, noise_std^2) noise per coordinate."""
        ...


class SystemRandomness:
    """Coins and noise from the operating system's CSPRNG (never seedable)."""

    def coins(self, num_records: int, sample_rate: float) -> np.ndarray:
        return noise.poisson_mask(num_records, sample_rate)

    def gaussian(self, values: np.ndarray, *, noise_std: float, clip_norm: float) -> np.ndarray:
        return noise.add_gaussian_noise(values, noise_std=noise_std, clip_norm=clip_norm)


class MechanismError(RuntimeError):
    """An internal invariant of a mechanism failed; the release must abort (budget stays spent)."""


@dataclass(frozen=True)
class ClipReport:
    """What a noisy-sum call may tell its caller: nothing data-dependent."""

    clip_norm: float
    effective_clip_norm: float


#: Fixed-point resolution of clipped sums: every coordinate is rounded toward zero onto the grid
#: ``2^(floor(log2 C) + 1 - FIXED_POINT_BITS)``, so one row contributes integers below
#: ``2^FIXED_POINT_BITS`` in magnitude.
FIXED_POINT_BITS = 29
#: Public cap on the rows of one exact sum: ``2^24 * 2^29 = 2^53``, so every partial and final
#: integer sum fits int64 AND converts to float64 exactly. Batches are Poisson draws whose size is
#: private; 2^24 (16.7 million) rows is far above any batch a policy allows (n_max * q), and
#: beyond it the sum is still computed exactly in Python integers (see :func:`exact_clipped_sum`).
MAX_EXACT_ROWS = 2**24


def fixed_point_unit(clip_norm: float) -> float:
    """The public grid step of :func:`exact_clipped_sum` for this clip norm (a power of two).

    It is a multiple of OpenDP's noise grid ``2^grid_exponent(C)`` (``FIXED_POINT_BITS < 45``
    bits below C versus 45), so an exact fixed-point sum is already on the noise grid and
    OpenDP's input rounding leaves it unchanged.
    """
    if not (clip_norm > 0 and np.isfinite(clip_norm)):
        raise MechanismError("clip_norm must be positive and finite")
    return math.ldexp(1.0, math.floor(math.log2(clip_norm)) + 1 - FIXED_POINT_BITS)


def exact_clipped_sum(clipped: np.ndarray, clip_norm: float) -> np.ndarray:
    """The column sum of already clipped rows, computed exactly on a public fixed-point grid.

    Contract: every row of ``clipped`` (shape (m, d)) has L2 norm <= ``clip_norm``. Each
    coordinate is rounded TOWARD ZERO onto the grid :func:`fixed_point_unit` (so a rounded row's
    norm never exceeds the clipped row's), the integers are summed exactly (int64 chunks of at
    most :data:`MAX_EXACT_ROWS` rows, combined in Python integers beyond that), and the result is
    scaled back. Two neighbouring batches therefore give sums that differ by exactly one rounded
    row, of norm <= clip_norm, in float64: a float sum's rounding (1 + 5.3e-12 at 200,000
    aligned rows) cannot inflate the sensitivity. Up to 2^24 rows the float64 result is exact;
    it is a multiple of the noise grid, so OpenDP's input rounding adds nothing. The rounding
    costs at most ``2^-28 C`` per coordinate of accuracy. Cost: O(m d), a few vectorised passes.
    """
    rows = np.asarray(clipped, dtype=np.float64)
    if rows.ndim != 2:
        raise MechanismError("exact_clipped_sum expects a 2-d array of rows")
    unit = fixed_point_unit(clip_norm)
    # Division by a power of two is exact; trunc rounds toward zero. |x / unit| < 2^29.
    ints = np.trunc(rows / unit).astype(np.int64)
    if rows.shape[0] <= MAX_EXACT_ROWS:
        total = ints.sum(axis=0, dtype=np.int64)
        return total.astype(np.float64) * unit
    # Beyond the cap: exact integer sum (no overflow), then one correctly rounded conversion.
    exact = [0] * rows.shape[1]
    for start in range(0, rows.shape[0], MAX_EXACT_ROWS):
        part = ints[start : start + MAX_EXACT_ROWS].sum(axis=0, dtype=np.int64)
        exact = [a + int(b) for a, b in zip(exact, part.tolist(), strict=True)]
    return np.array([float(v) * unit for v in exact], dtype=np.float64)


def clip_rows(vectors: torch.Tensor, clip_norm: float) -> torch.Tensor:
    """Scale every row to L2 norm at most ``clip_norm``; non-finite rows become zero.

    Zeroing a non-finite row is itself a per-record function with norm <= clip_norm, so it keeps
    the sensitivity bound and branches on nothing shared between records.
    """
    finite = torch.isfinite(vectors).all(1, keepdim=True)
    vectors = torch.where(finite, vectors, torch.zeros_like(vectors))
    norms = vectors.norm(dim=1, keepdim=True)
    factor = torch.clamp(clip_norm / torch.clamp(norms, min=1e-300), max=1.0)
    return vectors * factor


class PrivateRecords:
    """Private records in model space, reachable only through accounted mechanisms.

    Construct it from the transformed table *after* the ledger has reserved the budget.
    """

    __slots__ = ("_points", "_randomness")

    def __init__(self, points: torch.Tensor, *, randomness: PrivacyRandomness | None = None) -> None:
        self._points = points.detach().to(DTYPE)
        self._randomness: PrivacyRandomness = randomness if randomness is not None else SystemRandomness()

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

        Each record is included with probability ``sample_rate`` (coins from the privacy
        randomness); for every included record its log-likelihood vector over the S draws
        ``theta`` is centred over its own S values and clipped to L2 norm ``clip_norm`` (minus
        the noise grid's rounding slack); the clipped vectors are summed EXACTLY on a public
        fixed-point grid (:func:`exact_clipped_sum`, so float rounding cannot push the L2
        sensitivity above ``clip_norm``) and Gaussian noise of
        standard deviation ``noise_multiplier * clip_norm`` is added once. Returns the noisy
        sum, shape (S,). ``theta`` and ``clip_norm`` must be public (functions of released
        pseudopoints); the caller divides by ``sample_rate`` itself.
        """
        if not (clip_norm > 0 and noise_multiplier > 0):
            raise MechanismError("clip_norm and noise_multiplier must be positive")
        num_draws = theta.shape[0]
        effective = clip_norm - noise.rounding_slack(clip_norm, num_draws)
        mask = np.asarray(self._randomness.coins(self._points.shape[0], sample_rate), dtype=bool)
        if mask.shape != (self._points.shape[0],):
            raise MechanismError("inclusion mask has the wrong shape")
        batch = self._points[torch.from_numpy(mask)]
        with torch.no_grad():
            ll = model.log_likelihood(batch, theta.detach())
            centred = ll - ll.mean(1, keepdim=True)
            clipped = clip_rows(centred, effective)
            # Re-check the invariant the accountant relies on, after clipping.
            if clipped.shape[0] and bool((clipped.norm(dim=1) > clip_norm).any()):
                raise MechanismError("a clipped contribution exceeds the clip norm")
            # Exact fixed-point sum: neighbouring sums differ by one rounded row, norm <= C.
            total = exact_clipped_sum(clipped.numpy(), clip_norm)
        noisy = self._randomness.gaussian(total, noise_std=noise_multiplier * clip_norm, clip_norm=clip_norm)
        return torch.from_numpy(np.asarray(noisy, dtype=np.float64))

    def noisy_count(self, *, noise_multiplier: float) -> float:
        """The record count plus N(0, noise_multiplier^2) (a Gaussian mechanism, sensitivity 1)."""
        count = np.array([float(self._points.shape[0])])
        return float(self._randomness.gaussian(count, noise_std=noise_multiplier, clip_norm=1.0)[0])

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
            self._points, self._randomness, model, theta, score_bound=score_bound, curvature_bound=curvature_bound,
            score_noise_multiplier=score_noise_multiplier, curvature_noise_multiplier=curvature_noise_multiplier,
        )

    def noisy_indicator_counts(self, indicators: np.ndarray, *, noise_multiplier: float) -> np.ndarray:
        """Noisy column sums of per-record 0/1 indicators: one Gaussian mechanism.

        ``indicators`` has shape (n, k), one row per record (e.g. which data-quality rules the
        record touched); it is coerced to bool, so every record adds at most 1 to each of the k
        column sums: L2 sensitivity sqrt(k) (add/remove one record). The counts are multiplied by
        :func:`noise.count_vector_scale` ``(k, k)`` (sensitivity <= 1, OpenDP's rounding slack
        included), noised with standard deviation ``noise_multiplier`` from the OS CSPRNG, and
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
        k = matrix.shape[1]
        scale = noise.count_vector_scale(k, k)
        noisy = self._randomness.gaussian(counts * scale, noise_std=noise_multiplier, clip_norm=1.0)
        return np.asarray(noisy, dtype=np.float64) / scale

    def noisy_marginals(self, layout: HistogramLayout, *, noise_multiplier: float) -> NoisyMarginals:
        """Per-column histograms over the public bins of ``layout``, one Gaussian mechanism.

        Every record adds exactly 1 to one bin of each of the ``layout.touches`` histograms, so
        the count vector times ``layout.scale`` has L2 sensitivity at most 1 (add/remove one
        record) and noise of standard deviation ``noise_multiplier`` is
        ``GaussianDpEvent(noise_multiplier)``. Returns the noisy counts on the raw count scale.
        """
        from .marginals import NoisyMarginals

        if not (noise_multiplier > 0 and np.isfinite(noise_multiplier)):
            raise MechanismError("noise_multiplier must be positive and finite")
        if layout.num_features > self._points.shape[1]:
            raise MechanismError("the histogram layout does not match the records")
        counts = layout.counts(self._points)
        # Re-check the invariant the accountant relies on: one unit per column per record.
        if counts.shape != (layout.num_bins,) or not np.allclose(
            [part.sum() for part in layout.split(counts)], self._points.shape[0]
        ):
            raise MechanismError("a record did not fall in exactly one bin per column")
        scale = layout.scale
        noisy = self._randomness.gaussian(counts * scale, noise_std=noise_multiplier, clip_norm=1.0)
        return NoisyMarginals(layout, np.asarray(noisy, dtype=np.float64) / scale, noise_multiplier)
