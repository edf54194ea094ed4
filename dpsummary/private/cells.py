"""``noise-aware-cells``'s mechanism: the records' histogram over a public feature domain and the
statistic ``T = sum_i [1, x_i] y_i``, released together by ONE Gaussian mechanism.

Per record (a total function of the record and public values only):

1. its cell: column by column, the nearest level of the public domain
   (:class:`dpsummary.cells.domain.CellDomain`) in model space, ties to the level listed first; a
   non-finite coordinate counts as 0. Every record of the public box has a cell;
2. its target clipped to ``[0, target_bound]`` (a binary target is 0/1 already; non-finite: 0);
3. its unit-space contribution ``u_i = (a e_c, b z_c y_i)`` with ``z_c = [1, x_c]`` the CELL's
   design row (so T is exactly the sum over cells the posterior models), ``a = sqrt(f) k`` and
   ``b = sqrt(1 - f) k / R``, where ``f`` is the counts' share, ``R = max_c ||z_c|| target_bound``
   (public) and ``k`` = :func:`dpsummary.private.kernel.effective_clip` ``(1, C + d)`` (the room
   for OpenDP's input rounding and the float64 rounding of the sum). Hence
   ``||u_i||^2 <= k^2 (f + (1 - f)) = k^2 <= 1``.

The unit-space sum (counts times ``a``, exact; T's rows rounded toward zero on the fixed-point
grid of bound 1 and summed exactly, :func:`dpsummary.private.kernel.fixed_point_sum`) plus
``N(0, sigma^2 I)`` is ONE Gaussian mechanism of L2 sensitivity 1 under add/remove-one-record
adjacency: ``GaussianDpEvent(sigma)``. Dividing back (post-processing) gives noisy counts with
noise sd ``sigma / a`` (about ``sigma / sqrt(f)``) and a noisy T with noise sd ``sigma / b``
(about ``R sigma / sqrt(1 - f)``): the two statistics at multipliers ``sigma / sqrt(f)`` and
``sigma / sqrt(1 - f)`` of their own sensitivities (1 and R), which compose to exactly the one
Gaussian of multiplier ``sigma``.

Privacy caveats: the domain, the share, the bounds and ``sigma`` must be public. The exact
counts and T never leave :func:`noisy_cell_statistics`; the record count is not returned (the
noisy counts' sum is the only N this release gives). Noise from the caller's
:class:`~dpsummary.private.randomness.PrivacyRandomness` (OS entropy in a release).
"""

from __future__ import annotations

import math
from collections.abc import Iterable
from dataclasses import dataclass
from typing import TYPE_CHECKING

import numpy as np

from .fixed_point import MechanismError, fixed_point_unit

if TYPE_CHECKING:
    from ..cells.domain import CellDomain
    from .randomness import PrivacyRandomness


@dataclass(frozen=True)
class NoisyCells:
    """The DP outputs: noisy cell counts (C,), noisy ``T`` (d,), and their noise sds."""

    counts: np.ndarray
    statistic: np.ndarray
    counts_noise_std: float
    statistic_noise_std: float


def cell_indices(features: np.ndarray, domain: CellDomain) -> np.ndarray:
    """Each row's cell (int64, in the domain's product order: the last column fastest) by the
    nearest-level rule of the module docstring. ``features``: (n, F) model-space features.
    Total: every row gets exactly one cell."""
    x = np.where(np.isfinite(features), features, 0.0)
    index = np.zeros(x.shape[0], dtype=np.int64)
    offset = 0
    for levels in domain.levels:
        lv = np.asarray(levels, dtype=np.float64)  # (k, w)
        block = x[:, offset:offset + lv.shape[1]]
        dist = ((block[:, None, :] - lv[None, :, :]) ** 2).sum(axis=2)
        index = index * lv.shape[0] + np.argmin(dist, axis=1)  # argmin: the first of equal minima
        offset += lv.shape[1]
    if offset != x.shape[1]:
        raise MechanismError("the domain does not match the records' features")
    return index


def noisy_cell_statistics(chunks: Iterable[np.ndarray], randomness: PrivacyRandomness, domain: CellDomain,
                          design: np.ndarray, *, target_bound: float, count_share: float,
                          noise_multiplier: float) -> NoisyCells:
    """Release the cell counts and T over every record of ``chunks`` (model-space rows, the
    target last) by one Gaussian mechanism of multiplier ``noise_multiplier`` (module docstring).

    ``design``: the public (C, d) design rows ``z_c`` of the cells (intercept first)."""
    from . import kernel

    if not (noise_multiplier > 0 and math.isfinite(noise_multiplier)):
        raise MechanismError("noise_multiplier must be positive and finite")
    if not (0.0 < count_share < 1.0) or not (target_bound > 0 and math.isfinite(target_bound)):
        raise MechanismError("count_share must lie in (0, 1) and target_bound be positive")
    design = np.ascontiguousarray(design, dtype=np.float64)
    cells, d = design.shape
    if cells != domain.num_cells:
        raise MechanismError("the design does not match the domain")
    radius = float(np.sqrt((design**2).sum(axis=1)).max()) * target_bound
    keep = kernel.effective_clip(1.0, cells + d)
    unit = fixed_point_unit(1.0)
    # Every record adds the same rounded amount a_q <= a to its cell's count coordinate.
    a_units = math.trunc(math.sqrt(count_share) * keep / unit)
    b = math.sqrt(1.0 - count_share) * keep / radius
    counts = np.zeros(cells, dtype=np.int64)
    t_total = kernel.zero_partial(d)
    for chunk in chunks:
        rows = np.asarray(chunk, dtype=np.float64)
        if rows.ndim != 2 or rows.shape[1] != domain.num_features + 1:
            raise MechanismError("the records do not match the domain (features + target)")
        idx = cell_indices(rows[:, :-1], domain)
        counts += np.bincount(idx, minlength=cells)
        y = rows[:, -1]
        y = np.clip(np.where(np.isfinite(y), y, 0.0), 0.0, target_bound)
        contrib = design[idx] * (b * y)[:, None]
        # Re-check the invariant the accountant relies on (a bug, never a data condition).
        if contrib.size and float(np.sqrt((contrib**2).sum(axis=1)).max()) ** 2 + (a_units * unit) ** 2 > 1.0:
            raise MechanismError("a record's contribution exceeds the unit sensitivity")
        t_total = t_total + kernel.fixed_point_sum(contrib, unit)
    count_part = np.array([int(c) * a_units * unit for c in counts.tolist()], dtype=np.float64)
    values = np.concatenate([count_part, kernel.finish(t_total, 1.0)])
    noisy = np.asarray(randomness.gaussian(values, noise_std=noise_multiplier, clip_norm=1.0), dtype=np.float64)
    a_q = a_units * unit
    return NoisyCells(counts=noisy[:cells] / a_q, statistic=noisy[cells:] / b,
                      counts_noise_std=noise_multiplier / a_q, statistic_noise_std=noise_multiplier / b)
