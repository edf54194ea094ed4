"""Lightweight and uniform coresets for mixtures (poster, Algorithm 1), through dpsummary's one
constructor interface.

There is no mixture-specific sampler: :func:`build_coreset` runs the GLM constructors
(:class:`dpsummary.constructors.Lightweight`, :class:`dpsummary.constructors.Uniform`) through
:func:`dpsummary.constructors.fit` on :class:`dpsummary.models.gmm.GaussianMixture`, the mixture
written as a :class:`~dpsummary.models.base.Model`. The lightweight sampler is
:func:`dpsummary.constructors.lightweight.importance_sample` (M i.i.d. draws from q, weight
1 / (M q(x)), duplicates merged into one point of weight k / (M q(x))), so ``sum_m w_m f(x_m)``
is an unbiased estimate of ``sum_n f(x_n)`` for every f; in particular the weighted
log-likelihood of the coreset is unbiased for the full-data log-likelihood at every parameter
(poster, Theorem's premise). Which constructors apply is a declared capability
(:func:`dpsummary.constructors.applies`): only the model-free ones.

Points are in whatever space the caller gives (the CLI and benchmarks standardise the numeric
columns first, so the squared distances of q are not dominated by one column's unit).
"""

from __future__ import annotations

from dataclasses import dataclass

import numpy as np
import torch

from ..constructors import REGISTRY, applies, fit
from ..constructors.lightweight import lightweight_proposal
from ..models.gmm import GaussianMixture

#: The constructors that apply to mixtures (model-free ones; see :func:`constructors.applies`).
CORESET_METHODS: tuple[str, ...] = tuple(
    name for name, factory in REGISTRY.items() if applies(factory(), GaussianMixture(1))
)


@dataclass(frozen=True)
class WeightedPoints:
    """A coreset: ``points`` (M', D) and ``weights`` (M',). M' <= M: lightweight merges repeated
    draws."""

    points: np.ndarray
    weights: np.ndarray
    method: str


def lightweight_probabilities(x: np.ndarray) -> np.ndarray:
    """q(x_n) = 1/(2N) + ||x_n - mu||^2 / (2 sum_m ||x_m - mu||^2) (poster, Algorithm 1)."""
    return np.asarray(lightweight_proposal(torch.from_numpy(np.asarray(x, dtype=np.float64))).numpy())


def build_coreset(method: str, x: np.ndarray, size: int, generator: torch.Generator, *,
                  model: GaussianMixture | None = None) -> WeightedPoints:
    """Run the shared constructor ``method`` on the points ``x`` (N, D) for the mixture ``model``
    (default: a DPGMM with D features) and return its summary as numpy arrays. ``generator``
    drives the (non-private) sampling. Raises ``ValueError`` for a constructor that does not
    apply to mixtures."""
    pts = np.ascontiguousarray(x, dtype=np.float64)
    mdl = model if model is not None else GaussianMixture(pts.shape[1])
    if method not in REGISTRY:
        raise ValueError(f"unknown coreset method {method!r}; choose one of {', '.join(CORESET_METHODS)}")
    constructor = REGISTRY[method]()
    if not applies(constructor, mdl):
        raise ValueError(f"method {method!r} does not apply to mixtures; choose one of {', '.join(CORESET_METHODS)}")
    summary = fit(constructor, torch.from_numpy(pts), mdl, size, generator=generator)
    return WeightedPoints(summary.points.numpy(), summary.weights.numpy(), method)
