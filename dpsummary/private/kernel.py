"""THE per-record kernel of every engine: records in, exact clipped sum out.

Every engine that runs a stage-2 mechanism (the local engine over
:class:`~dpsummary.private.store.RecordStore`, the Spark engine over Arrow batches on executors)
calls exactly these functions on batches of model-space rows and adds the partial results; the
noise is added once, by the caller, on the finished sum. There is no second copy of the
per-record rules anywhere:

* :func:`dppsvi_partial` — DP-PSVI (paper Section 3.3): per record, the log-likelihood vector
  over the S public draws ``theta``, centred over its own S values, clipped to L2 norm
  ``effective_clip(clip_norm, S)`` (``clip_norm`` minus OpenDP's input-rounding slack and the
  float64 slack of the sum, see :func:`effective_clip`; non-finite records become zero);
* :func:`score_partial` — the noise-aware mechanism (:mod:`dpsummary.private.score_stats`): per
  record, the score at one public ``theta`` clipped to L2 norm ``effective_clip(score_bound, d)``
  and the curvature (symmetrised) scaled so that its upper triangle (diagonal included, row-major;
  the vector the mechanism releases) has L2 norm at most ``effective_clip(curvature_bound,
  d(d+1)/2)``. The released vector's own norm is the sensitivity, so clipping it (rather than the
  full matrix's Frobenius norm, which counts each off-diagonal entry twice) lets the bound be up
  to sqrt(2) smaller for the same records (:func:`upper_triangle_norm`).

Exactness (why partial sums from ANY partitioning combine into bit-identical totals): each
clipped record's coordinates are rounded TOWARD ZERO onto the public grid
:func:`~dpsummary.private.mechanism.fixed_point_unit` of the statistic's bound (so a rounded
record's norm never exceeds the clipped record's), giving integers of magnitude below
``2^FIXED_POINT_BITS``; partial sums are exact Python integers (numpy ``object`` arrays), and
integer addition is associative and commutative. Two neighbouring data sets therefore give sums
that differ by exactly one rounded record, whose norm is at most the bound, whatever the order or
the partitioning. :func:`finish` converts the integer total to float64 on the grid (exact up to
2^53 units, correctly rounded beyond); the result is a multiple of the noise grid, so OpenDP's
input rounding leaves it unchanged. Beyond 2^53 units (a sum over more than about 1.7 * 10^7
records at full norm) the conversion rounds, by at most ``2^-53`` of each coordinate's value;
the per-record clip :func:`effective_clip` reserves :func:`~dpsummary.private.noise.float_slack`
for it, sized for sums over up to :data:`~dpsummary.private.noise.MAX_RECORDS` records, so the
released vectors of neighbours stay within the bound. The curvature sum is fixed-point PER RECORD too (no float
Gram-matrix sum, hence no summation-error margin).

Inputs: ``rows`` is a C-contiguous float64 numpy array (n, point_dim) in model space (the output
of :func:`dpsummary.data.encode_batch`); ``theta`` is a torch float64 tensor (S, d) for DP-PSVI
or (d,) for the score statistics; the bounds are public. All functions are pure and
deterministic (no randomness, no I/O), so they run unchanged on Spark executors. They never log
and never see a count beyond their own batch; the caller must not release a partial sum, a batch
size or anything else derived from them except through the noise of the mechanism.
"""

from __future__ import annotations

import math

import numpy as np
import torch

from ..models import DTYPE, Model
from . import noise
from .fixed_point import MechanismError, clip_rows, fixed_point_unit

__all__ = [
    "CHUNK_ROWS",
    "ScorePartial",
    "combine",
    "dppsvi_partial",
    "moment_partial",
    "residual_partial",
    "effective_clip",
    "finish",
    "fixed_point_sum",
    "score_partial",
    "zero_partial",
]

#: Records per vectorised chunk inside one kernel call (bounds the n x d(d+1)/2 work array;
#: float64 sums of at most this many integers below 2^29 are exact).
CHUNK_ROWS = 8192


#: An invariant of the kernel failed (a bug, never a data condition); the release aborts.
KernelError = MechanismError


def _unit(bound: float) -> float:
    return fixed_point_unit(bound)


def upper_triangle_norm(weight: torch.Tensor, z: torch.Tensor) -> torch.Tensor:
    """L2 norm of the upper triangle (diagonal included) of each rank-one ``weight_i z_i z_i^T``:
    ``|weight_i| sqrt((|z_i|^4 + sum_k z_ik^4) / 2)`` (the diagonal's squares once, the off-
    diagonal pairs once, i.e. half the Frobenius square plus half the diagonal's)."""
    sq = z * z
    return weight.abs() * torch.sqrt(0.5 * (sq.sum(1) ** 2 + (sq * sq).sum(1)))


def effective_clip(bound: float, dim: int) -> float:
    """The per-record clip actually applied for a mechanism of L2 sensitivity ``bound`` over a
    ``dim``-vector: ``bound`` minus OpenDP's input-rounding slack and minus the float64 slack of
    :func:`finish` for sums over up to :data:`~dpsummary.private.noise.MAX_RECORDS` records
    (:func:`~dpsummary.private.noise.float_slack`; a public function).

    Why both: neighbouring integer totals differ by one rounded record of norm <= this clip;
    :func:`finish` rounds each total to float64 (exact below 2^53 grid units, off by at most
    ``2^-53 |value|`` per coordinate beyond), which can move the two released vectors apart by
    at most ``float_slack(bound)`` more; the result ``clip + float_slack <= bound - rounding_slack``
    (the rounding slack is OpenDP's, unused here because the sums lie on its grid, kept as margin)."""
    if not (bound > 0 and math.isfinite(bound)):
        raise KernelError("bound must be positive and finite")
    return bound - noise.rounding_slack(bound, dim) - noise.float_slack(bound)


def zero_partial(dim: int) -> np.ndarray:
    """The empty partial sum (dtype object, Python ints)."""
    out = np.empty(dim, dtype=object)
    out[:] = [0] * dim
    return out


def combine(*parts: np.ndarray) -> np.ndarray:
    """Exact sum of partial integer sums (any number, any order: the result is identical)."""
    if not parts:
        raise KernelError("combine needs at least one partial sum")
    total = zero_partial(len(parts[0]))
    for p in parts:
        if len(p) != len(total):
            raise KernelError("partial sums of different lengths")
        total = total + np.asarray(p, dtype=object)
    return total


def finish(total: np.ndarray, bound: float) -> np.ndarray:
    """Integer total -> float64 on the public grid of ``bound``: exact up to 2^53 units, correctly
    rounded beyond (``float(int)`` rounds to nearest; times a power of two is exact), i.e. within
    ``2^-53 |value|`` per coordinate, the error :func:`effective_clip` reserves room for."""
    unit = _unit(bound)
    return np.array([float(int(v)) * unit for v in np.asarray(total, dtype=object).tolist()], dtype=np.float64)


def fixed_point_sum(clipped: np.ndarray, unit: float) -> np.ndarray:
    """Column sums of ``trunc(clipped / unit)`` as Python ints. Entries are integers below 2^29
    in magnitude and a chunk holds at most :data:`CHUNK_ROWS` rows, so the float64 column sum of
    the truncated values is an exact integer (every partial sum is below 2^53)."""
    out = zero_partial(clipped.shape[1])
    for start in range(0, clipped.shape[0], CHUNK_ROWS):
        block = np.trunc(clipped[start:start + CHUNK_ROWS] / unit)
        out = out + np.array([int(v) for v in block.sum(axis=0).tolist()], dtype=object)
    return out


def _as_rows(rows: np.ndarray | torch.Tensor) -> torch.Tensor:
    if isinstance(rows, torch.Tensor):
        return rows.detach().to(DTYPE)
    arr = np.ascontiguousarray(rows, dtype=np.float64)
    if arr.ndim != 2:
        raise KernelError("rows must be a 2-d (records x point_dim) array")
    return torch.from_numpy(arr)


def dppsvi_partial(rows: np.ndarray | torch.Tensor, model: Model, theta: torch.Tensor, *,
                   clip_norm: float, normalise_by: float = 1.0) -> np.ndarray:
    """DP-PSVI's exact partial sum over ``rows``: shape (S,) integers on the grid of
    ``clip_norm`` (see the module docstring for the per-record rule).

    ``normalise_by`` (public, positive) divides every record's centred vector BEFORE the clip:
    the mechanism calls this with ``clip_norm=1`` and ``normalise_by=C_t``, so each record
    contributes ``clip(v / C_t, 1)`` (= ``clip(v, C_t) / C_t``) and every step is the same unit
    mechanism whatever ``C_t`` (which lets the noise be drawn ahead: noise.GaussianNoisePool)."""
    if not (normalise_by > 0 and math.isfinite(normalise_by)):
        raise KernelError("normalise_by must be positive and finite")
    theta = theta.detach().to(DTYPE)
    s = theta.shape[0]
    effective = effective_clip(clip_norm, s)
    batch = _as_rows(rows)
    if batch.shape[0] == 0:
        return zero_partial(s)
    unit = _unit(clip_norm)
    out = zero_partial(s)
    with torch.no_grad():
        for start in range(0, batch.shape[0], CHUNK_ROWS):
            ll = model.log_likelihood(batch[start:start + CHUNK_ROWS], theta)
            centred = ll - ll.mean(1, keepdim=True)
            clipped = clip_rows(centred if normalise_by == 1.0 else centred / normalise_by, effective)
            # Re-check the invariant the accountant relies on, after clipping.
            if bool((clipped.norm(dim=1) > clip_norm).any()):
                raise KernelError("a clipped contribution exceeds the clip norm")
            out = out + fixed_point_sum(clipped.numpy(), unit)
    return out


def _rank_one_upper_sum(c: np.ndarray, z: np.ndarray, unit: float) -> np.ndarray:
    """Exact column sums of ``trunc(c_i z_ir z_ic / unit)`` over the upper triangle (r <= c,
    row-major), records of one chunk (at most :data:`CHUNK_ROWS`, so the float64 sums of the
    truncated integers, each below 2^29, are exact). Per record the value is computed as
    ``((c_i / unit) z_ir) z_ic``: one fixed, deterministic evaluation order, the same in every
    engine (this function is the definition), and within a few ulps of the exact product, far
    inside the rounding slack kept below the bound."""
    n, d = z.shape
    zt = np.ascontiguousarray(z.T)
    czt = zt * (c / unit)
    sums = np.empty(d * (d + 1) // 2, dtype=np.float64)
    buf = np.empty((d, n), dtype=np.float64)
    k = 0
    for r in range(d):
        block = buf[: d - r]
        np.multiply(czt[r], zt[r:], out=block)
        np.trunc(block, out=block)
        sums[k:k + d - r] = block.sum(axis=1)
        k += d - r
    out = np.empty(sums.shape[0], dtype=object)
    out[:] = [int(v) for v in sums.tolist()]
    return out


class ScorePartial:
    """The noise-aware kernel's partial sums: ``score`` (d,) on the grid of ``score_bound`` and
    ``curvature`` (d(d+1)/2,) upper triangle on the grid of ``curvature_bound``; add with ``+``."""

    __slots__ = ("curvature", "score")

    def __init__(self, score: np.ndarray, curvature: np.ndarray) -> None:
        self.score = score
        self.curvature = curvature

    def __add__(self, other: ScorePartial) -> ScorePartial:
        return ScorePartial(combine(self.score, other.score), combine(self.curvature, other.curvature))

    @classmethod
    def zero(cls, dim: int) -> ScorePartial:
        return cls(zero_partial(dim), zero_partial(dim * (dim + 1) // 2))


def score_partial(rows: np.ndarray | torch.Tensor, model: Model, theta: torch.Tensor, *, score_bound: float,
                  curvature_bound: float) -> ScorePartial:
    """The noise-aware mechanism's exact partial sums over ``rows`` at one public ``theta`` (d,)."""
    d = model.param_dim
    tri = d * (d + 1) // 2
    theta = theta.detach().to(DTYPE)
    eff_score = effective_clip(score_bound, d)
    eff_curv = effective_clip(curvature_bound, tri)
    s_unit, c_unit = _unit(score_bound), _unit(curvature_bound)
    iu, ju = np.triu_indices(d)
    batch = _as_rows(rows)
    total = ScorePartial.zero(d)
    with torch.no_grad():
        for start in range(0, batch.shape[0], CHUNK_ROWS):
            chunk = batch[start:start + CHUNK_ROWS]
            scores = clip_rows(model.record_scores(chunk, theta).reshape(chunk.shape[0], -1), eff_score)
            if bool((scores.norm(dim=1) > score_bound).any()):
                raise KernelError("a clipped statistic exceeds its bound")
            factors = model.record_curvature_factors(chunk, theta)
            if factors is not None:
                # Rank-one curvatures c_i z_i z_i^T: the released upper triangle's L2 norm
                # (upper_triangle_norm), clipped by scaling c_i; each record's upper triangle is
                # then rounded to the grid (toward zero, so its norm only falls).
                c, z = factors
                c = torch.where(torch.isfinite(c) & torch.isfinite(z).all(1), c, torch.zeros_like(c))
                z = torch.where(torch.isfinite(z), z, torch.zeros_like(z))
                unit = upper_triangle_norm(torch.ones_like(c), z)
                c = c * torch.clamp(eff_curv / torch.clamp(c.abs() * unit, min=1e-300), max=1.0)
                if bool((c.abs() * unit > curvature_bound).any()):
                    raise KernelError("a clipped statistic exceeds its bound")
                curv_ints = _rank_one_upper_sum(c.numpy(), z.numpy(), c_unit)
            else:
                curvs = model.record_curvatures(chunk, theta)
                # Symmetrise per record first, then clip the upper triangle that is sent.
                sym = 0.5 * (curvs + curvs.transpose(1, 2))
                upper = clip_rows(sym[:, torch.from_numpy(iu), torch.from_numpy(ju)], eff_curv)
                if bool((upper.norm(dim=1) > curvature_bound).any()):
                    raise KernelError("a clipped statistic exceeds its bound")
                curv_ints = fixed_point_sum(upper.numpy(), c_unit)
            total = total + ScorePartial(fixed_point_sum(scores.numpy(), s_unit), curv_ints)
    return total


def moment_partial(rows: np.ndarray | torch.Tensor, *, bound: float) -> np.ndarray:
    """Linear regression's exact partial sums over ``rows`` (model-space points: features, then
    the target): the upper triangle (diagonal included, row-major) of ``sum_i z_i z_i^T`` with
    ``z_i = [1, x_i, y_i]``, on the grid of ``bound``. Per record: non-finite entries become 0,
    the upper triangle of ``z_i z_i^T`` is clipped to L2 norm :func:`effective_clip` ``(bound)``
    by scaling (a record inside the public box is never clipped when ``bound`` is the box's
    :meth:`~dpsummary.models.GLM.rank_one_upper_bound`), then rounded toward zero onto the grid
    and summed exactly (:func:`_rank_one_upper_sum`)."""
    batch = _as_rows(rows)
    dim = batch.shape[1] + 1
    tri = dim * (dim + 1) // 2
    eff = effective_clip(bound, tri)
    unit = _unit(bound)
    total = zero_partial(tri)
    with torch.no_grad():
        for start in range(0, batch.shape[0], CHUNK_ROWS):
            chunk = batch[start:start + CHUNK_ROWS]
            z = torch.cat([torch.ones(chunk.shape[0], 1, dtype=DTYPE), chunk], 1)
            z = torch.where(torch.isfinite(z), z, torch.zeros_like(z))
            norm = upper_triangle_norm(torch.ones(z.shape[0], dtype=DTYPE), z)
            c = torch.clamp(eff / torch.clamp(norm, min=1e-300), max=1.0)
            if bool((c * norm > bound).any()):
                raise KernelError("a clipped statistic exceeds its bound")
            total = total + _rank_one_upper_sum(c.numpy(), z.numpy(), unit)
    return total


def residual_partial(rows: np.ndarray | torch.Tensor, *, bound: float, anchor: torch.Tensor, residual_clip: float,
                     residual_range: float, square_scale: float) -> np.ndarray:
    """Linear regression's anchored round (issue 51): exact partial sums over ``rows``
    (model-space points: features, then the target) of the vector
    ``u_i = [w_i clip(r_i, residual_clip), min(r_i^2, residual_range^2) / square_scale]`` with
    ``w_i = [1, x_i]`` and ``r_i = y_i - w_i . anchor`` (anchor public, intercept first), on the
    grid of ``bound``. Per record: non-finite entries of ``x`` and a non-finite residual become 0,
    ``r`` is clipped to ``[-residual_clip, residual_clip]`` in the first block and to
    ``[-residual_range, residual_range]`` in the last entry, the vector is clipped to L2 norm
    :func:`effective_clip` ``(bound)`` by scaling (a record in the public box with
    ``bound^2 >= (1 + feature_norm^2) residual_clip^2 + residual_range^4 / square_scale^2`` is
    never clipped), rounded toward zero onto the grid and summed exactly."""
    for name, value in (("bound", bound), ("residual_clip", residual_clip), ("residual_range", residual_range),
                        ("square_scale", square_scale)):
        if not (value > 0 and math.isfinite(value)):
            raise KernelError(f"the anchored round needs a positive finite {name}")
    batch = _as_rows(rows)
    a = anchor.detach().to(DTYPE)
    dim = batch.shape[1] + 1
    eff = effective_clip(bound, dim)
    unit = _unit(bound)
    total = zero_partial(dim)
    with torch.no_grad():
        for start in range(0, batch.shape[0], CHUNK_ROWS):
            chunk = batch[start:start + CHUNK_ROWS]
            w = torch.cat([torch.ones(chunk.shape[0], 1, dtype=DTYPE), chunk[:, :-1]], 1)
            w = torch.where(torch.isfinite(w), w, torch.zeros_like(w))
            r = torch.nan_to_num(chunk[:, -1] - w @ a, nan=0.0, posinf=0.0, neginf=0.0)
            u = torch.cat([w * r.clamp(-residual_clip, residual_clip)[:, None],
                           (r.clamp(-residual_range, residual_range) ** 2 / square_scale)[:, None]], 1)
            clipped = clip_rows(u, eff)
            if bool((clipped.norm(dim=1) > bound).any()):
                raise KernelError("a clipped statistic exceeds its bound")
            total = total + fixed_point_sum(clipped.numpy(), unit)
    return total
