"""Lightweight and uniform coresets for mixtures (poster, Algorithm 1), as weighted points.

The lightweight proposal q is dpsummary's own :func:`dpsummary.constructors.lightweight.lightweight_proposal`
(one definition for GLMs and mixtures). What this module adds is a numpy-``Generator`` sampler,
:func:`importance_sample`, shared by every importance-sampling coreset: M i.i.d. draws from q,
each with weight 1 / (M q(x)), duplicates merged into one point of weight k / (M q(x)) (the same
convention as the GLM constructor), so ``sum_m w_m f(x_m)`` is an unbiased estimate of
``sum_n f(x_n)`` for every f; in particular the weighted log-likelihood of the coreset is
unbiased for the full-data log-likelihood at every parameter (poster, Theorem's premise).

Points are in whatever space the caller gives (the CLI and benchmarks standardise the numeric
columns first, so the squared distances of q are not dominated by one column's unit).
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Literal

import numpy as np

CoresetMethod = Literal["lightweight", "uniform"]
CORESET_METHODS: tuple[CoresetMethod, ...] = ("lightweight", "uniform")


@dataclass(frozen=True)
class WeightedPoints:
    """A coreset: ``points`` (M', D), ``weights`` (M',) and the rows they came from (``indices``).
    M' <= M: lightweight merges repeated draws."""

    points: np.ndarray
    weights: np.ndarray
    indices: np.ndarray
    method: str


def lightweight_probabilities(x: np.ndarray) -> np.ndarray:
    """q(x_n) = 1/(2N) + ||x_n - mu||^2 / (2 sum_m ||x_m - mu||^2) (poster, Algorithm 1)."""
    import torch

    from ..constructors.lightweight import lightweight_proposal

    return np.asarray(lightweight_proposal(torch.from_numpy(np.asarray(x, dtype=np.float64))).numpy())


def importance_sample(
    probabilities: np.ndarray, size: int, rng: np.random.Generator
) -> tuple[np.ndarray, np.ndarray]:
    """``size`` i.i.d. draws from ``probabilities`` (sums to 1, shape (N,)); returns the distinct
    drawn rows (sorted) and their weights ``count_n / (size * q_n)``.

    Contract: E[sum_m w_m f(x_{i_m})] = sum_n f(x_n) for every f; weights are positive.
    """
    if size < 1:
        raise ValueError("size must be at least 1")
    q = np.asarray(probabilities, dtype=np.float64)
    if q.ndim != 1 or np.any(q < 0) or not np.isclose(q.sum(), 1.0):
        raise ValueError("probabilities must be a non-negative vector summing to 1")
    counts = rng.multinomial(size, q / q.sum())
    chosen = np.flatnonzero(counts)
    return chosen, counts[chosen] / (size * q[chosen])


def lightweight_coreset(x: np.ndarray, size: int, rng: np.random.Generator) -> WeightedPoints:
    """Poster Algorithm 1: M draws from q, weights 1 / (M q)."""
    pts = np.asarray(x, dtype=np.float64)
    idx, w = importance_sample(lightweight_probabilities(pts), size, rng)
    return WeightedPoints(pts[idx], w, idx, "lightweight")


def uniform_coreset(x: np.ndarray, size: int, rng: np.random.Generator) -> WeightedPoints:
    """min(M, N) rows without replacement, each weighted N / M (as dpsummary's GLM ``uniform``)."""
    pts = np.asarray(x, dtype=np.float64)
    n = pts.shape[0]
    m = min(size, n)
    idx = np.sort(rng.choice(n, size=m, replace=False))
    return WeightedPoints(pts[idx], np.full(m, n / m), idx, "uniform")


def build_coreset(method: str, x: np.ndarray, size: int, rng: np.random.Generator) -> WeightedPoints:
    """Dispatch on ``method`` ("lightweight" or "uniform")."""
    if method == "lightweight":
        return lightweight_coreset(x, size, rng)
    if method == "uniform":
        return uniform_coreset(x, size, rng)
    raise ValueError(f"unknown coreset method {method!r}; choose one of {', '.join(CORESET_METHODS)}")
