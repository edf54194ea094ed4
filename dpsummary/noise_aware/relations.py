"""Exact linear relations among the design's columns (module docstring, 17.; issue 51 for linear
regression): the public candidates a categorical schema implies (:func:`one_hot_relations`),
which of them a DP release does not tell from exact (:func:`exact_relations`, post-processing),
and the projector off them (:func:`relation_projector`). Along an exact relation ``v`` every
record has ``x_i . v = 0``, so the data's score and curvature are exactly 0 there and the full
data's posterior along ``v`` is the prior's; a noisy release keeps noise there, which an imputed
posterior would read as information.

Numbered references ("module docstring, N.") are to the package docstring,
:mod:`dpsummary.noise_aware`.
"""

from __future__ import annotations

import torch

from ..gaussian import DTYPE

#: A public one-hot relation is taken as exact when the release puts it within this many noise
#: sds of 0 (:func:`exact_relations`): a Gaussian exceeds 3 sds one time in 740.
RELATION_Z = 3.0


def one_hot_relations(transform: object, *, intercept: bool) -> torch.Tensor:
    """The public candidate linear relations among the design's columns ``w = [1, x]`` (rows of
    a ``(r, 1 + num_features)`` tensor): a categorical feature is one-hot (0/1) over its public
    categories, so for every record with a listed category its columns sum to 1, the intercept's
    value: ``w . (e_0 - sum_{j in group} e_j) = 0``. Without an intercept, two groups' sums are
    equal instead. A record with a missing or unseen category (the all-zero "other" vector)
    breaks the relation, so whether it holds is data-dependent: :func:`exact_relations` decides
    it from the DP release."""
    from ..data import Transform

    assert isinstance(transform, Transform)
    dim = 1 + transform.num_features
    groups: list[list[int]] = []
    offset = 1
    for col in transform.schema.feature_columns:
        if col.kind == "numeric":
            offset += 1
            continue
        k = len(col.categories or [])
        groups.append(list(range(offset, offset + k)))
        offset += k
    rows = []
    for i, group in enumerate(groups):
        v = torch.zeros(dim, dtype=DTYPE)
        v[group] = -1.0
        if intercept:
            v[0] = 1.0
        elif i == 0:
            continue
        else:
            v[groups[0]] = 1.0
        rows.append(v)
    return torch.stack(rows) if rows else torch.zeros(0, dim, dtype=DTYPE)


def exact_relations(relations: torch.Tensor, block: torch.Tensor, tau: float) -> torch.Tensor:
    """The candidate relations (:func:`one_hot_relations`) a noisy released matrix ``block`` does
    not tell from exact (per-entry noise sd ``tau`` on the upper triangle): linear regression's
    design block (count, ``X^T 1``, ``X^T X``), or a GLM round's curvature ``sum_i w_i x_i x_i^T``
    (module docstring, 17.). ``v^T block v`` is the records breaking the relation (weighted by
    ``w_i (x_i . v)^2`` for a GLM), plus noise of sd ``tau sqrt(2 |v|^4 - sum v^4)``; a relation
    is kept when that is below :data:`RELATION_Z` noise sds. Post-processing of a DP output and
    public structure. Along an exact relation the full data's posterior is the prior;
    the imputed block keeps noise eigenvalues there, and reading the released ``X^T r`` along
    them as information made cps1988's release 0.6-0.9x the full data's width (issue 51). A
    relation broken by fewer records than the noise resolves is taken as exact too: its direction
    then gets the prior, wider than the full data's posterior, never narrower."""
    if relations.shape[0] == 0:
        return relations
    sym = 0.5 * (block + block.T).to(DTYPE)
    quad = torch.einsum("ri,ij,rj->r", relations, sym, relations)
    sq = relations**2
    sd = tau * torch.sqrt(2.0 * sq.sum(1) ** 2 - (sq**2).sum(1))
    return relations[quad < RELATION_Z * sd]


def relation_projector(relations: torch.Tensor | None, dim: int) -> torch.Tensor | None:
    """The orthogonal projector onto the complement of the span of ``relations`` (rows of a
    ``(r, dim)`` tensor; None or no row: None). Along an exact linear relation among the design's
    columns (``x_i . v = 0`` for every record) the data's score and curvature are exactly 0, so
    an imputed curvature projected off it carries no noise there and the posterior along it is
    the prior's, as the full data's is (issue 51 for linear regression; module docstring 17.)."""
    if relations is None or relations.shape[0] == 0:
        return None
    q, _ = torch.linalg.qr(relations.to(DTYPE).T)
    return torch.eye(dim, dtype=DTYPE) - q @ q.T


def model_relations(transform: object, model: object) -> torch.Tensor:
    """:func:`one_hot_relations` in ``model``'s parameter space (a GLM's ``[intercept, x]``, or
    ``x`` without an intercept): the candidates :func:`~dpsummary.noise_aware.fit` takes. Public."""
    intercept = bool(getattr(model, "intercept", True))
    rows = one_hot_relations(transform, intercept=intercept)
    return rows if intercept else rows[:, 1:]
