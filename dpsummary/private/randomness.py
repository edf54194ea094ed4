"""The interface every privacy coin and noise draw comes through (:class:`PrivacyRandomness`).

Its own module, below :mod:`dpsummary.private.mechanism` and :mod:`dpsummary.private.score_stats`,
so both can name it without naming each other. The release's only implementation is
:class:`dpsummary.private.mechanism.SystemRandomness` (OS entropy); callers import the protocol
from :mod:`dpsummary.private.mechanism`, which re-exports it.
"""

from __future__ import annotations

from typing import Protocol

import numpy as np


class PrivacyRandomness(Protocol):
    """Where every privacy coin and every noise draw of a mechanism comes from.

    The release uses :class:`~dpsummary.private.mechanism.SystemRandomness` only. Tests and the
    self-test replay neighbouring data sets with identical randomness by passing a recording
    implementation (the hook this protocol exists for). The mechanisms draw a step's sample
    through :func:`~dpsummary.private.mechanism.draw_sample`: ``sample_indices`` when the
    implementation has it, else the included positions of ``coins``, so a replay double may
    implement either (``coins`` alone is enough for small tests)."""

    def coins(self, num_records: int, sample_rate: float) -> np.ndarray:
        """Boolean inclusion mask, each entry true independently with probability sample_rate."""
        ...

    def sample_indices(self, num_records: int, sample_rate: float) -> np.ndarray:
        """Sorted distinct int64 indices of the included records of ``0 .. num_records-1``:
        each independently with probability sample_rate (Poisson sampling). The same
        distribution as ``flatnonzero(coins(...))``, in O(q N) expected time."""
        ...

    def gaussian(self, values: np.ndarray, *, noise_std: float, clip_norm: float) -> np.ndarray:
        """``values`` plus independent N(0, noise_std^2) noise per coordinate."""
        ...


class TiltRandomness(PrivacyRandomness, Protocol):
    """A :class:`PrivacyRandomness` that can also draw objective perturbation's tilt
    (:mod:`dpsummary.private.objective`, the only caller); a protocol of its own so that the
    replay doubles of mechanisms that never perturb an objective need not implement it."""

    def tilt(self, dim: int, *, noise_std: float) -> np.ndarray:
        """A draw with a density, sd ``noise_std`` per coordinate
        (:func:`dpsummary.private.noise.dithered_gaussian` in the release)."""
        ...
