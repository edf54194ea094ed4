"""Poisson subsampling in O(qN) expected time, exactly at rate q, from the OS CSPRNG.

The accountant assumes Poisson subsampling: every record is included independently with
probability exactly ``q`` (a multiple of 2^-32, :func:`dpsummary.private.noise.quantize_sample_rate`).
:func:`poisson_indices` returns the sorted indices of the included records of ``0 .. n-1``
without drawing one coin per record: it draws the GAPS between included records.

Exactness. With ``s = 1 - q``, the gap G (records skipped before the next included one) is
geometric: ``P(G = g) = q s^g``. Writing ``G = sum_i b_i 2^i`` in binary, ``P(G = g)`` is
proportional to ``prod_i (s^(2^i))^(b_i)``, so the binary digits are INDEPENDENT Bernoulli
variables with ``P(b_i = 1) = r_i / (1 + r_i)``, ``r_i = s^(2^i)``; and the high part
``H = G >> L`` is independent of the low L digits and geometric: H counts the successes of
Bernoulli(``r_L``) trials before the first failure. Each Bernoulli(x) is drawn EXACTLY by
comparing a uniform binary fraction from ``os.urandom`` with x, 64 bits at a time: x is
computed with Python integers in fixed point with rigorous lower and upper bounds (interval
squaring), and more bits of x (and of the uniform) are used whenever the first 64 cannot decide
(probability about 2^-64 per comparison). ``L`` is the first digit with ``r_L < 2^-64``. So the
gaps, hence the included set, have exactly the distribution of independent coins at rate q;
there is no floating-point logarithm anywhere (an inverse-CDF ``log(U) / log(1 - q)`` would be
off by about 2^-53 relative per probability, which is not the mechanism the accountant is told).

Cost: ``L + 1`` 64-bit words of entropy per included record (L is about ``log2(44 / q)``), so
O(qN) expected time and memory per step, independent of N. For large rates, where one 32-bit
coin per record is cheaper (``8 (L + 1) q > 4``), the same set is drawn with coins
(``u32 < q 2^32``, exactly the rule of :func:`dpsummary.private.noise.poisson_mask`) in chunks,
which is O(N) time and O(qN + chunk) memory. Both are exactly Poisson sampling at rate q.

Privacy caveats: the indices (and their number, the realised batch size) are private; they are
used only to gather rows inside the mechanism and never logged or returned by a mechanism. The
sampler takes no seed; tests replay neighbouring data sets through the recording hook of
:class:`~dpsummary.private.mechanism.PrivacyRandomness`, never through this module.
"""

from __future__ import annotations

import math
import os
from functools import lru_cache

import numpy as np

__all__ = ["poisson_indices"]

_RATE_BITS = 32
#: Records per chunk of the coin path (bounds its memory).
_COIN_CHUNK = 1 << 20


def _ticks(sample_rate: float) -> int:
    if not 0.0 < sample_rate <= 1.0:
        raise ValueError("sample_rate must lie in (0, 1]")
    ticks = sample_rate * 2**_RATE_BITS
    if ticks != math.floor(ticks):
        raise ValueError("sample_rate is not a multiple of 2^-32; quantise it first")
    return int(ticks)


class _GapDistribution:
    """Exact binary-digit description of the geometric gap for one rate (cached per rate)."""

    def __init__(self, ticks: int) -> None:
        self.ticks = ticks
        self.s_num = 2**_RATE_BITS - ticks  # s = s_num / 2^32
        # Number of low digits: the first L with r_L = s^(2^L) < 2^-64 (L = 0 when s = 0).
        level, r = 0, self.s_num / 2**_RATE_BITS
        while r >= 2.0**-66 and level < 80:  # float only to choose L; exactness does not rely on it
            r = r * r
            level += 1
        self.levels = level
        # 64-bit thresholds floor(x_i 2^64) of the digit probabilities and of the tail r_L.
        self.digit_thresholds = np.array([self.threshold(i, 64, tail=False) for i in range(level)], dtype=np.uint64)
        self.tail_threshold = self.threshold(level, 64, tail=True)

    @lru_cache(maxsize=256)  # noqa: B019 - one instance per rate, cached itself
    def _r_bounds(self, i: int, prec: int) -> tuple[int, int]:
        """Integers lo, hi with lo <= s^(2^i) 2^prec <= hi (rigorous interval squaring)."""
        lo = hi = self.s_num << (prec - _RATE_BITS)
        for _ in range(i):
            lo = (lo * lo) >> prec
            hi = -((-(hi * hi)) >> prec)  # ceiling
        return lo, hi

    def threshold(self, i: int, bits: int, *, tail: bool) -> int:
        """floor(x 2^bits) exactly, x = r_i / (1 + r_i) (a digit) or x = r_i (the tail)."""
        prec = max(256, 2 * bits + 2 * i + 64)
        while True:
            lo, hi = self._r_bounds(i, prec)
            one = 1 << prec
            if tail:
                x_lo, x_hi = lo, hi
            else:  # x = r / (1 + r) is increasing in r
                x_lo = (lo << prec) // (one + lo)
                x_hi = -((-(hi << prec)) // (one + hi))
            t_lo, t_hi = (x_lo << bits) >> prec, (x_hi << bits) >> prec
            if t_lo == t_hi and x_hi < one:
                return t_lo
            prec *= 2
            if prec > 1 << 16:  # x is a dyadic boundary: fall back to exact rationals
                from fractions import Fraction

                r = Fraction(self.s_num, 2**_RATE_BITS) ** (2**i)
                x = r if tail else r / (1 + r)
                return math.floor(x * 2**bits)

    def bernoulli_slow(self, i: int, prefix: int, *, tail: bool) -> bool:
        """Finish an exact comparison whose first 64 uniform bits equalled the threshold."""
        bits = 64
        while True:
            prefix = (prefix << 64) | int.from_bytes(os.urandom(8), "little")
            bits += 64
            t = self.threshold(i, bits, tail=tail)
            if prefix < t:
                return True
            if prefix > t:
                return False


@lru_cache(maxsize=32)
def _distribution(ticks: int) -> _GapDistribution:
    return _GapDistribution(ticks)


def _uniform64(shape: tuple[int, ...]) -> np.ndarray:
    count = int(np.prod(shape))
    return np.frombuffer(os.urandom(8 * count), dtype=np.uint64).reshape(shape)


def _gaps(dist: _GapDistribution, count: int) -> np.ndarray:
    """``count`` independent exact geometric gaps (int64; a gap beyond 2^62 is capped, which is
    far beyond any record index and so changes no included set)."""
    levels = dist.levels
    gaps = np.zeros(count, dtype=np.int64)
    if levels:
        u = _uniform64((count, levels))
        thr = dist.digit_thresholds
        digits = u < thr
        ties = np.argwhere(u == thr)
        for row, col in ties.tolist():  # probability ~2^-64 each: exact slow path
            digits[row, col] = dist.bernoulli_slow(col, int(u[row, col]), tail=False)
        weights = (np.int64(1) << np.arange(levels, dtype=np.int64))
        gaps = (digits.astype(np.int64) * weights).sum(axis=1)
    # High part H: successes of Bernoulli(r_L) before the first failure (almost always 0).
    w = _uniform64((count,))
    for row in np.flatnonzero(w <= np.uint64(dist.tail_threshold)).tolist():
        high, word = 0, int(w[row])
        while True:
            if word < dist.tail_threshold:
                success = True
            elif word > dist.tail_threshold:
                success = False
            else:
                success = dist.bernoulli_slow(levels, word, tail=True)
            if not success:
                break
            high += 1
            word = int(_uniform64((1,))[0])
        gaps[row] = min(int(gaps[row]) + (high << levels), 1 << 62)
    return gaps


def _coin_indices(num_records: int, ticks: int) -> np.ndarray:
    parts = []
    for start in range(0, num_records, _COIN_CHUNK):
        m = min(_COIN_CHUNK, num_records - start)
        coins = np.frombuffer(os.urandom(4 * m), dtype=np.uint32)
        parts.append(np.flatnonzero(coins < np.uint64(ticks)).astype(np.int64) + start)
    return np.concatenate(parts) if parts else np.zeros(0, dtype=np.int64)


def poisson_indices(num_records: int, sample_rate: float) -> np.ndarray:
    """Sorted int64 indices of the records of ``0 .. num_records-1`` included by Poisson
    sampling at rate ``sample_rate`` (a multiple of 2^-32): each independently with exactly
    that probability, from ``os.urandom``. PRIVATE output (see the module docstring)."""
    ticks = _ticks(sample_rate)
    if num_records < 0:
        raise ValueError("num_records must be non-negative")
    if num_records == 0:
        return np.zeros(0, dtype=np.int64)
    if ticks == 2**_RATE_BITS:
        return np.arange(num_records, dtype=np.int64)
    dist = _distribution(ticks)
    if 8 * (dist.levels + 1) * ticks >= 4 * 2**_RATE_BITS:
        return _coin_indices(num_records, ticks)
    q = ticks / 2**_RATE_BITS
    out: list[np.ndarray] = []
    position = -1  # index of the last included record
    while True:
        remaining = num_records - 1 - position
        # Enough gaps to pass the end with high probability; loop otherwise (public sizes only:
        # they depend on n, q and how far the draw got, and nothing leaves this function).
        want = int(remaining * q + 6.0 * math.sqrt(remaining * q + 1.0) + 16)
        steps = _gaps(dist, want) + 1
        positions = position + np.cumsum(steps)
        inside = positions[positions < num_records]
        out.append(inside)
        if inside.shape[0] < positions.shape[0]:
            break
        position = int(positions[-1])
    return np.concatenate(out)
