"""The fixed-point and clipping primitives every private mechanism shares (no records, no noise).

Split out of :mod:`dpsummary.private.mechanism` so that the per-record kernel
(:mod:`dpsummary.private.kernel`), the score statistics and the mechanisms import them without an
import cycle (issue 30). Pure functions of public parameters and of the rows passed in; nothing
here reads a record store, logs or draws randomness.
"""

from __future__ import annotations

import math

import numpy as np
import torch

__all__ = ["FIXED_POINT_BITS", "MAX_EXACT_ROWS", "MechanismError", "clip_rows", "fixed_point_unit"]


class MechanismError(RuntimeError):
    """An internal invariant of a mechanism failed; the release must abort (budget stays spent)."""


#: Fixed-point resolution of clipped sums: every coordinate is rounded toward zero onto the grid
#: ``2^(floor(log2 C) + 1 - FIXED_POINT_BITS)``, so one row contributes integers below
#: ``2^FIXED_POINT_BITS`` in magnitude.
FIXED_POINT_BITS = 29
#: Rows up to which an exact sum also CONVERTS to float64 exactly: ``2^24 * 2^29 = 2^53``. It is
#: not a cap: beyond it the sum is still computed exactly in Python integers (see
#: :func:`dpsummary.private.mechanism.exact_clipped_sum`), and only its conversion to float64
#: rounds, by at most ``2^-53`` of each coordinate's value; the per-record clip reserves room for
#: that for sums over up to :data:`dpsummary.private.noise.MAX_RECORDS` records
#: (:func:`dpsummary.private.noise.float_slack`, :func:`dpsummary.private.kernel.effective_clip`),
#: so the sensitivity holds at every record count a policy allows (n_max <= 10^12).
MAX_EXACT_ROWS = 2**24


def fixed_point_unit(clip_norm: float) -> float:
    """The public grid step of :func:`dpsummary.private.mechanism.exact_clipped_sum` for this clip norm (a power of two).

    It is a multiple of OpenDP's noise grid ``2^grid_exponent(C)`` (``FIXED_POINT_BITS < 45``
    bits below C versus 45), so an exact fixed-point sum is already on the noise grid and
    OpenDP's input rounding leaves it unchanged.
    """
    if not (clip_norm > 0 and np.isfinite(clip_norm)):
        raise MechanismError("clip_norm must be positive and finite")
    return math.ldexp(1.0, math.floor(math.log2(clip_norm)) + 1 - FIXED_POINT_BITS)


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
