"""Privacy randomness: Poisson-sampling coins and Gaussian noise, both from OS entropy.

Nothing here accepts a seed. ``--seed`` governs only non-private randomness (prior draws,
synthetic initialisation, posterior samples); the coins that choose records and the noise that
hides them always come from the operating system's CSPRNG, so a reproducible run can never
reproduce (and thereby cancel) its own noise.

Gaussian noise goes through OpenDP's ``make_gaussian``: the input is rounded to a grid of
granularity 2^k and a *discrete* Gaussian on that grid is added, sampled with exact arithmetic
from system entropy. This closes the floating-point attacks on textbook Gaussian samplers
(Mironov 2012; Jin et al. 2022). The rounding can move two neighbouring inputs apart by at most
2^k * sqrt(dim); :func:`rounding_slack` returns that amount so callers clip to ``C - slack`` and
the end-to-end L2 sensitivity stays at most ``C``.
"""

from __future__ import annotations

import math
import os
from functools import lru_cache
from typing import Any

import numpy as np

from ..objective_event import TILT_GRID_BITS as TILT_GRID_BITS
from ..objective_event import TILT_GRID_RATIO as TILT_GRID_RATIO

#: Sample rates are multiples of 2^-32 so that the coin ``u32 < rate * 2^32`` has exactly the
#: inclusion probability the accountant is told.
RATE_RESOLUTION_BITS = 32
#: Noise grid 2^k with k = floor(log2(scale-free clip norm)) - GRID_BITS_BELOW_CLIP.
GRID_BITS_BELOW_CLIP = 45


def quantize_sample_rate(sample_rate: float) -> float:
    """The nearest representable rate (a multiple of 2^-32) at or below ``sample_rate``."""
    if not 0.0 < sample_rate <= 1.0:
        raise ValueError("sample_rate must lie in (0, 1]")
    ticks = math.floor(sample_rate * 2**RATE_RESOLUTION_BITS)
    if ticks < 1:
        raise ValueError("sample_rate below 2^-32 cannot be represented")
    return ticks / 2**RATE_RESOLUTION_BITS


def poisson_mask(num_records: int, sample_rate: float) -> np.ndarray:
    """Independent inclusion coins, one per record, each true with probability ``sample_rate``.

    ``sample_rate`` must already be quantised (see :func:`quantize_sample_rate`); coins are 32-bit
    integers from ``os.urandom``. This is Poisson subsampling as the RDP/PRV accountants assume it:
    no fixed batch size, no replacement, no truncation.
    """
    ticks = sample_rate * 2**RATE_RESOLUTION_BITS
    if ticks != math.floor(ticks):
        raise ValueError("sample_rate is not a multiple of 2^-32; quantise it first")
    coins = np.frombuffer(os.urandom(4 * num_records), dtype=np.uint32)
    return coins < np.uint64(int(ticks))


def secure_uniform(shape: tuple[int, ...] | int) -> np.ndarray:
    """Uniform floats in [0, 1) with 53 random bits each, from ``os.urandom`` (non-seedable)."""
    n = int(np.prod(shape))
    bits = np.frombuffer(os.urandom(8 * n), dtype=np.uint64) >> np.uint64(11)
    return (bits.astype(np.float64) * 2.0**-53).reshape(shape)


def grid_exponent(clip_norm: float) -> int:
    """The OpenDP granularity exponent k used for a mechanism with this clip norm."""
    if not (clip_norm > 0 and math.isfinite(clip_norm)):
        raise ValueError("clip_norm must be positive and finite")
    return math.floor(math.log2(clip_norm)) - GRID_BITS_BELOW_CLIP


def rounding_slack(clip_norm: float, dim: int) -> float:
    """Upper bound on the L2 distance that OpenDP's input rounding can add between neighbours."""
    return 2.0 ** grid_exponent(clip_norm) * math.sqrt(dim)


#: Public bound on the records one released sum or count covers (:func:`float_slack`). The policy
#: caps n_max at 10^12 and a release refuses a noisy count above n_max, so a larger table would
#: need count noise of about 10^12 to be released.
MAX_RECORDS = 2**41


def float_slack(bound: float) -> float:
    """L2 room for float64 rounding between neighbouring released vectors that sum (or count,
    times a float scale) at most :data:`MAX_RECORDS` + 1 records of L2 norm <= ``bound`` each:
    ``||V|| <= (MAX_RECORDS + 1) bound``, rounding moves each coordinate by <= ``2^-53 |V_j|``,
    so two neighbours by <= ``2^-52 (MAX_RECORDS + 1) bound`` (about ``4.9e-4 bound``). Needed
    beyond 2^53 grid units (a sum over ~1.7 * 10^7 records at full norm) and for scaled counts
    above ~10^3; callers reserve it together with :func:`rounding_slack`."""
    return math.ldexp(float(bound) * (MAX_RECORDS + 1), -52)


def count_vector_scale(touches: int, dim: int) -> float:
    """Multiplier giving a count vector L2 sensitivity at most 1 under the OpenDP noise.

    One record changes at most ``touches`` of the ``dim`` coordinates, each by exactly 1 (L2
    distance sqrt(touches)); dividing by sqrt(touches) makes that 1, and the factor
    ``1 - rounding_slack(1, dim) - float_slack(1)`` leaves room for OpenDP's input rounding and
    for the float64 rounding of ``count * scale`` (one ulp-half per coordinate, counts up to
    :data:`MAX_RECORDS`: :func:`float_slack`), so that noise of standard deviation
    ``noise_multiplier`` is exactly ``GaussianDpEvent(noise_multiplier)``.
    ``dim`` need only bound the coordinates that can differ between neighbours (rounding is
    coordinate-wise, untouched coordinates round identically), so ``touches`` is a valid, and
    public, choice; callers must never pass a data-dependent ``dim``. Clipped sums instead use
    the exact fixed-point grid of :func:`dpsummary.private.mechanism.exact_clipped_sum`, which
    is coarser than the noise grid, so OpenDP's rounding leaves them unchanged (one rule: sums
    are exact and on the grid, the slack is kept only as a margin in the clip).
    """
    return (1.0 - rounding_slack(1.0, max(dim, 1)) - float_slack(1.0)) / math.sqrt(max(touches, 1))


@lru_cache(maxsize=64)
def _gaussian_measurement(dim: int, scale: float, k: int) -> Any:
    # The specific modules, not ``opendp.prelude``: the prelude imports ``opendp.extras.sklearn``,
    # which pulls scikit-learn and scipy.stats in when they are installed (about 1.7 s per
    # release, issue 15's import floor).
    from opendp.domains import atom_domain, vector_domain
    from opendp.measurements import make_gaussian
    from opendp.metrics import l2_distance
    from opendp.mod import enable_features

    enable_features("contrib")
    space = (vector_domain(atom_domain(T=float, nan=False), size=dim), l2_distance(T=float))
    return make_gaussian(*space, scale=scale, k=k)


def add_gaussian_noise(values: np.ndarray, *, noise_std: float, clip_norm: float) -> np.ndarray:
    """Release ``values + N(0, noise_std^2 I)`` (discretised, OS entropy) for a 1-d vector.

    ``clip_norm`` is the mechanism's L2 sensitivity; it fixes the grid so the rounding slack is
    negligible (2^-45 of it per coordinate) and callers clip to ``clip_norm - rounding_slack``.
    """
    values = np.asarray(values, dtype=np.float64)
    if values.ndim != 1:
        raise ValueError("add_gaussian_noise expects a 1-d vector")
    if not np.all(np.isfinite(values)):
        raise ValueError("non-finite value reached the noise mechanism")
    if not noise_std > 0:
        raise ValueError("noise_std must be positive")
    meas = _gaussian_measurement(values.shape[0], float(noise_std), grid_exponent(clip_norm))
    return np.asarray(meas(values.tolist()), dtype=np.float64)


class GaussianNoisePool:
    """Gaussian noise for a run of identical mechanisms, drawn AHEAD of use on a background thread.

    A run of T releases with the same dimension, noise standard deviation and clip norm (DP-PSVI's
    steps, whose per-record vectors are normalised to clip norm 1: :mod:`dpsummary.private.kernel`)
    needs T independent noise vectors that do not depend on the data. OpenDP's exact sampler costs
    about 16 microseconds per coordinate whatever the scale (1.6 ms for S = 100; issue 15's
    profile), so the pool asks OpenDP for the noise alone, ``measurement(0)``, i.e. ``2^k * Z`` with
    Z discrete Gaussian, on a daemon thread while the main thread computes (the Rust sampler runs
    outside the GIL), at most ``ahead`` vectors in advance.

    Why this is the same mechanism: OpenDP's ``make_gaussian`` on input x releases
    ``round_k(x) + 2^k Z`` computed exactly, then converted to float. The values passed to
    :meth:`add` must already lie on the grid 2^k (exact fixed-point sums do: their grid is
    coarser, see :func:`dpsummary.private.mechanism.fixed_point_unit`; :meth:`add` checks it), so
    ``round_k(x) = x`` and ``x + 2^k Z`` is the same exact value; the one float addition rounds it
    to nearest, a post-processing. Every vector is used once and never re-used; the noise never
    depends on the data, the values or their order; vectors still queued when the run ends are
    discarded. Entropy: OpenDP's sampler reads the OS CSPRNG, as :func:`add_gaussian_noise`.
    """

    def __init__(self, *, dim: int, noise_std: float, clip_norm: float, count: int, ahead: int = 64) -> None:
        import queue
        import threading

        if dim < 1 or count < 0 or ahead < 1:
            raise ValueError("dim and ahead must be positive, count non-negative")
        if not (noise_std > 0 and math.isfinite(noise_std)):
            raise ValueError("noise_std must be positive and finite")
        self.dim = int(dim)
        self.noise_std = float(noise_std)
        self.clip_norm = float(clip_norm)
        self.grid = 2.0 ** grid_exponent(clip_norm)
        self._count = int(count)
        self._remaining = int(count)
        self._queue: queue.Queue[np.ndarray | BaseException] = queue.Queue(maxsize=int(ahead))
        self._stop = threading.Event()
        self._thread = threading.Thread(target=self._fill, name="dpsummary-noise", daemon=True)
        self._thread.start()

    def _fill(self) -> None:
        import queue

        try:
            meas = _gaussian_measurement(self.dim, self.noise_std, grid_exponent(self.clip_norm))
            zeros = [0.0] * self.dim
            for _ in range(self._count):
                vec = np.asarray(meas(zeros), dtype=np.float64)
                while not self._stop.is_set():
                    try:
                        self._queue.put(vec, timeout=0.1)
                        break
                    except queue.Full:
                        continue
                if self._stop.is_set():
                    return
        except BaseException as exc:  # noqa: BLE001 - re-raised in the consumer's thread
            self._queue.put(exc)

    @property
    def remaining(self) -> int:
        """Vectors still to be handed out (public: the announced count minus those used)."""
        return self._remaining

    def add(self, values: np.ndarray) -> np.ndarray:
        """``values`` (on the noise grid) plus the next pre-drawn noise vector."""
        values = np.asarray(values, dtype=np.float64)
        if values.shape != (self.dim,):
            raise ValueError("values have the wrong shape for this noise pool")
        if not np.all(np.isfinite(values)):
            raise ValueError("non-finite value reached the noise mechanism")
        if not np.array_equal(np.floor(values / self.grid), values / self.grid):
            raise ValueError("values are not on the noise grid: pre-drawn noise would not be the same mechanism")
        if self._remaining <= 0:
            raise ValueError("the noise pool is exhausted")
        item = self._queue.get()
        if isinstance(item, BaseException):
            raise item
        self._remaining -= 1
        return values + item

    def close(self) -> None:
        """Stop drawing; queued vectors are discarded (never used)."""
        self._stop.set()
        while not self._queue.empty():
            self._queue.get_nowait()

    def __enter__(self) -> GaussianNoisePool:
        return self

    def __exit__(self, *exc: object) -> None:
        self.close()


# Objective perturbation's tilt grid (:func:`dithered_gaussian`) is TILT_GRID_BITS below the noise
# sd, so the discrete part's scale is at least 2^40 grid steps; the bound TILT_GRID_RATIO on the
# grid's ratio to the sd is the event's (dpsummary.objective_event, the one definition; imported above).
#: :func:`tilt_rounding_bound` holds on the event ``||b|| <= TILT_TAIL_SDS noise_std sqrt(dim)``.
TILT_TAIL_SDS = 64.0


def tilt_grid(noise_std: float) -> float:
    """The grid of :func:`dithered_gaussian` for this noise sd (a power of two, public)."""
    if not (noise_std > 0 and math.isfinite(noise_std)):
        raise ValueError("noise_std must be positive and finite")
    return 2.0 ** (math.floor(math.log2(noise_std)) - TILT_GRID_BITS)


def dithered_gaussian(dim: int, *, noise_std: float) -> np.ndarray:
    """A draw of ``g (K + U)``: objective perturbation's tilt (:mod:`dpsummary.private.objective`).

    ``K`` has independent coordinates from OpenDP's discrete Gaussian of scale ``noise_std / g`` on
    the integers (exact arithmetic, OS entropy: ``make_gaussian`` applied to zeros returns ``g K``
    exactly, :class:`GaussianNoisePool`'s argument), ``U`` is uniform on ``[-1/2, 1/2)^dim`` with
    53 bits per coordinate from ``os.urandom`` and ``g`` is :func:`tilt_grid`. Why not the
    release's discrete Gaussian: objective perturbation's proof is a change of variables, so the
    tilt needs a **density**; the dither gives ``K`` one, piecewise constant,
    ``p(b) = P(K = round(b / g)) / g^dim``, for which :func:`dpsummary.objective_event.dithered_objective_perturbation_rdp`
    is proved. A textbook float Gaussian would have a density only in exact arithmetic and is
    open to the floating-point attacks this module exists to close.

    What is returned differs from the ideal ``g (K + U_exact)`` (``U_exact`` continuous, coupled
    to the 53-bit ``U`` by truncation) by the truncation and one float addition per coordinate:
    at most :func:`tilt_rounding_bound` in L2 norm, on an event of probability at least
    ``1 - exp(-991 dim)``. The mechanism absorbs that into its solver tolerance. Noise only: it
    never sees data."""
    if dim < 1:
        raise ValueError("dim must be positive")
    grid = tilt_grid(noise_std)
    meas = _gaussian_measurement(int(dim), float(noise_std), math.floor(math.log2(grid)))
    lattice = np.asarray(meas([0.0] * int(dim)), dtype=np.float64)
    dither = secure_uniform(int(dim)) - 0.5
    return lattice + grid * dither


def tilt_rounding_bound(dim: int, noise_std: float) -> float:
    """L2 bound on ``||returned - ideal||`` for :func:`dithered_gaussian` (see there).

    Per coordinate the 53-bit truncation of ``U`` moves ``g U`` by less than ``g 2^-53``, and the
    float addition (round to nearest) by at most ``2^-53 |b_j|``; ``g K`` and ``g U`` are exact
    floats while ``|K| < 2^53``. So the error is at most ``2^-53 (g sqrt(dim) + ||b||)``, and
    ``2^-52 sqrt(dim) (g + TILT_TAIL_SDS noise_std)`` with room to spare whenever
    ``||b|| <= TILT_TAIL_SDS noise_std sqrt(dim)``. ``g K`` is sub-Gaussian with variance proxy
    ``noise_std^2`` per coordinate (Canonne, Kamath and Steinke 2020), so
    ``P(||g K|| > 63 noise_std sqrt(dim)) <= 2^(dim/2) exp(-63^2 dim / 4) < exp(-991 dim)``, and
    ``||g U|| <= g sqrt(dim) / 2`` always; on that event ``|K| < 2^53`` too for ``dim < 16,000``."""
    if dim < 1 or dim >= 16_000:
        raise ValueError("dim must lie in [1, 16000)")
    return math.ldexp(math.sqrt(dim) * (tilt_grid(noise_std) + TILT_TAIL_SDS * noise_std), -52)
