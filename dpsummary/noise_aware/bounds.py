"""The public feature box: the per-record statistic bounds the rounds clip at, the box a schema
implies, and the largest change of the linear predictor over it (public values only).

Numbered references ("module docstring, N.") are to the package docstring,
:mod:`dpsummary.noise_aware`.
"""

from __future__ import annotations

import math
from typing import Any

import torch

from ..models import Model
from .released import BoundsFn


def eta_change(model: Model, delta: torch.Tensor, feature_norm: float) -> float:
    """Largest change of the linear predictor over the public feature box (``||x|| <=
    feature_norm``) for a parameter change ``delta``: ``|delta_0| + feature_norm ||delta_x||``
    with an intercept, else ``feature_norm ||delta||``."""
    if getattr(model, "intercept", False):
        return abs(float(delta[0])) + feature_norm * float(torch.linalg.vector_norm(delta[1:]))
    return feature_norm * float(torch.linalg.vector_norm(delta))


def public_bounds(model: Model, *, feature_norm: float, target_bound: float) -> BoundsFn:
    """The model's public per-record bounds for features of norm <= ``feature_norm``."""
    def bounds(theta: torch.Tensor) -> tuple[float, float]:
        return model.statistic_bounds(theta, feature_norm=feature_norm, target_bound=target_bound)

    return bounds


def schema_bounds(transform: Any) -> tuple[float, float]:
    """``(feature_norm, target_bound)`` in model space implied by a public schema transform
    (:meth:`dpsummary.data.Transform.from_schema`): every bounded numeric feature lies in
    [-1, 1], each categorical column is one-hot with at most one 1 (the "other" bucket is all
    zeros); a binary target is 0/1, a real one is scaled into [-1, 1], a count lies below its
    public upper bound. Unbounded numerics (fitted transforms) are bounded by their scaled
    clip range if known, else by 3 (and clipped by the mechanism)."""
    sq = 0.0
    for col in transform.schema.feature_columns:
        if col.kind == "numeric":
            if col.lower is not None and col.upper is not None:
                c, s = transform.centres[col.name], transform.scales[col.name]
                sq += max(abs(col.lower - c), abs(col.upper - c)) ** 2 / s**2
            else:
                sq += 9.0
        else:
            sq += 1.0
    kind = transform.target_kind
    target_bound = 1.0
    if kind == "count":
        col = transform.schema.target_column
        target_bound = float(col.upper) if col is not None and col.upper is not None else 1e3
    elif kind == "real":
        col = transform.schema.target_column
        if col is not None and col.lower is not None and col.upper is not None:
            c, s = transform.centres[col.name], transform.scales[col.name]
            target_bound = max(abs(col.lower - c), abs(col.upper - c)) / s
        else:
            target_bound = 3.0
    return math.sqrt(max(sq, 1e-12)), target_bound
