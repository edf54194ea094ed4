"""The one-hot support of the true curvature (module docstring, 18.): what the released
curvature's target satisfies for ANY data set because of the schema's one-hot coding, and draws of
it that respect that.

The last round releases ``H = sum_i c_i w_i x_i x_i^T + E`` (:mod:`dpsummary.private.score_stats`):
every record adds a non-negative multiple (its curvature weight times its clip factor) of
``x x^T``, where ``x`` is the record's model-space design row. A categorical column is one-hot
over its public levels (each 0 or 1, at most one 1 per record), so whatever the data:

1. two levels of one column are never both 1: ``H_jk = 0``;
2. a level is its own square: with an intercept ``H_jj = H_0j`` (two noisy readings of one value);
3. levels of two different columns are 0 or 1: ``0 <= H_jk <= min(H_jj, H_kk)``, and a level's
   diagonal lies in ``[0, H_00]``.

The released matrix carries the mechanism's noise in each of these entries too (``adult``'s public
schema has about 1,100 fixed zeros among its 5,671 entries, and most entries between two levels
are bounded by a rare level's small weighted count). The imputed posterior (module docstring, 7.)
draws the true curvature from its flat-prior posterior given the release; under a flat prior on
this support each such entry's posterior given the diagonal is the released value's Gaussian
truncated to its bounds (:func:`support_draw`); every other entry is drawn as before. The
remaining joint constraint, the whole matrix being PSD, is the spectrum's step.

Why only the levels' facts: a numeric column's bound and the PSD inequality ``|H_jk| <= sqrt(H_jj
H_kk)`` hold too, but where the data sit on such a boundary (a 0/1 column declared numeric, whose
square is the intercept's; two numerics correlated 0.99) per-entry truncation pulls the draws off
it and reads the direction as less informative than it is: on the simulations that widened
`sim_rare`, `sim_dummies` and `sim_correlated` by 5-14% (notebook/noise_aware_variants.md,
fortieth rule's pilot).

Post-processing of a DP output and the public schema, with non-private randomness; no privacy
cost. Numbered references ("module docstring, N.") are to the package docstring,
:mod:`dpsummary.noise_aware`.
"""

from __future__ import annotations

import math
from dataclasses import dataclass
from typing import Any

import torch

from ..gaussian import DTYPE


@dataclass(frozen=True)
class CurvatureSupport:
    """The one-hot facts of the module docstring for one model's parameter space: ``group[j]`` is
    the categorical column a one-hot coordinate belongs to (-1: the intercept or a numeric);
    ``intercept``: coordinate 0 is the intercept."""

    group: torch.Tensor
    intercept: bool

    @property
    def dim(self) -> int:
        return int(self.group.shape[0])


def curvature_support(transform: Any, model: Any) -> CurvatureSupport | None:
    """The :class:`CurvatureSupport` of ``model``'s parameter space (``[intercept, x]`` or ``x``)
    under ``transform``'s public schema (:meth:`dpsummary.data.Transform.from_schema`), or None
    when the schema has no categorical feature column (nothing to add). Public (the schema
    alone)."""
    intercept = bool(getattr(model, "intercept", True))
    groups = ([-1] if intercept else []) + _feature_groups(transform)
    if len(groups) != model.param_dim:
        raise ValueError("the schema's design does not match the model's parameters")
    if all(g < 0 for g in groups):
        return None
    return CurvatureSupport(torch.tensor(groups, dtype=torch.long), intercept)


def design_support(transform: Any) -> CurvatureSupport | None:
    """The :class:`CurvatureSupport` of the design block ``sum_i w_i w_i^T``, ``w = [1, x]``, of
    linear regression's released moment matrix (:mod:`dpsummary.noise_aware.linear`; the record
    count at ``[0, 0]`` whether or not the model has an intercept): the same one-hot facts as a
    GLM's curvature with every curvature weight 1. None when the schema has no categorical feature
    column. Public (the schema alone)."""
    groups = [-1, *_feature_groups(transform)]
    if all(g < 0 for g in groups):
        return None
    return CurvatureSupport(torch.tensor(groups, dtype=torch.long), True)


def _feature_groups(transform: Any) -> list[int]:
    """Per model-space feature column of ``transform``'s public schema: the index of the
    categorical column a one-hot coordinate belongs to, or -1 for a numeric."""
    groups: list[int] = []
    for g, col in enumerate(transform.schema.feature_columns):
        groups.extend([-1] if col.kind == "numeric" else [g] * len(col.categories or []))
    return groups


def truncated_normal(mean: torch.Tensor, sd: float | torch.Tensor, lower: torch.Tensor, upper: torch.Tensor,
                     generator: torch.Generator) -> torch.Tensor:
    """Draws of ``N(mean, sd^2)`` truncated to ``[lower, upper]`` (elementwise; bounds may be
    infinite; by the inverse CDF, in the tail where the CDF is accurate). Where the interval is
    empty the draw is ``lower``; where its probability underflows, the interval's point nearest
    the mean."""
    mean = mean.to(DTYPE)
    sd_t = torch.as_tensor(sd, dtype=DTYPE)
    a, b = (lower - mean) / sd_t, (upper - mean) / sd_t
    flip = a > 0  # the interval above the mean: draw -z on [-b, -a], where ndtr is accurate
    lo, hi = torch.where(flip, -b, a), torch.where(flip, -a, b)
    p_lo, p_hi = torch.special.ndtr(lo), torch.special.ndtr(hi)
    u = torch.rand(mean.shape, generator=generator, dtype=DTYPE)
    z = torch.special.ndtri(p_lo + u * (p_hi - p_lo))
    x = mean + sd_t * torch.where(flip, -z, z)
    nearest = torch.minimum(torch.maximum(mean, lower), upper)
    ok = (p_hi - p_lo > 0) & torch.isfinite(x)
    x = torch.where(ok, torch.minimum(torch.maximum(x, lower), upper), nearest)
    return torch.where(upper > lower, x, lower)


def support_draw(released: torch.Tensor, tau: float, support: CurvatureSupport,
                 generator: torch.Generator) -> torch.Tensor:
    """One draw of the true curvature from its posterior given the released symmetric matrix
    (i.i.d. ``N(0, tau^2)`` noise on the upper triangle, diagonal included) under a flat prior on
    ``support`` (module docstring): the intercept's entry (at least 0) and the levels' diagonal
    (in ``[0, H_00]``; with an intercept a level's diagonal and its intercept-row entry are two
    readings of one value: their mean, sd ``tau / sqrt(2)``) first, then the entries between two
    levels given it (0 within a column, in ``[0, min(H_jj, H_kk)]`` across columns), each the
    released value's Gaussian truncated to its bounds; every other entry the released value plus
    ``N(0, tau^2)``, as without a support. Post-processing with non-private randomness."""
    h = 0.5 * (released + released.T).to(DTYPE)
    dim = support.dim
    if h.shape != (dim, dim):
        raise ValueError("the released curvature does not match the support")
    inf = torch.tensor(math.inf, dtype=DTYPE)
    level = support.group >= 0
    tied = level & support.intercept
    bounded = level.clone()  # the diagonal entries with a support: the levels' and the intercept's
    if support.intercept:
        bounded[0] = True
    reading = torch.diagonal(h).clone()
    sd = torch.full((dim,), float(tau), dtype=DTYPE)
    if support.intercept:
        reading = torch.where(tied, 0.5 * (reading + h[0]), reading)
        sd = torch.where(tied, sd / math.sqrt(2.0), sd)
        h00 = truncated_normal(reading[:1], float(tau), torch.zeros(1, dtype=DTYPE), inf.reshape(1), generator)
        top = torch.where(level, h00.expand(dim), inf)
    else:
        top = torch.full((dim,), math.inf, dtype=DTYPE)
    lower = torch.where(bounded, torch.zeros(dim, dtype=DTYPE), -inf)
    upper = torch.where(bounded, top, inf)
    diag = truncated_normal(reading, sd, lower, upper, generator)
    if support.intercept:
        diag[0] = h00[0]
    rows, cols = torch.triu_indices(dim, dim, offset=1)
    both = level[rows] & level[cols]
    same = both & (support.group[rows] == support.group[cols])
    pair_upper = torch.where(both, torch.minimum(diag[rows], diag[cols]), inf)
    pair_upper = torch.where(same, torch.zeros_like(pair_upper), pair_upper)  # 1.
    pair_lower = torch.where(both, torch.zeros_like(pair_upper), -inf)  # 3.
    values = truncated_normal(h[rows, cols], float(tau), pair_lower, pair_upper, generator)
    if support.intercept:
        values = torch.where((rows == 0) & tied[cols], diag[cols], values)  # 2.
    out = torch.diag(diag)
    out[rows, cols] = values
    out[cols, rows] = values
    return out
