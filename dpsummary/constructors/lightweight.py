"""Lightweight coresets (Bachem, Lucic & Krause 2018; poster, Algorithm 1).

Importance sampling with the sensitivity-style proposal

    q(x) = 1 / (2N) + d(x, mu)^2 / (2 sum_n d(x_n, mu)^2),      mu = (1/N) sum_n x_n,

half uniform, half proportional to the squared Euclidean distance to the data mean. ``d`` is
measured in model space, i.e. on the points exactly as the constructor receives them (scaled
numerics, one-hot categories and, for regression models, the target as the last column). M
records are drawn i.i.d. *with replacement* from q and each draw gets weight 1 / (M q(x)), so
``sum_m w_m f(x_m)`` is an unbiased estimate of ``sum_n f(x_n)``.

Duplicates: a record drawn k times would appear k times with the same weight; we merge the k
copies into one point of weight k / (M q(x)), which leaves the weighted likelihood (hence the
posterior and the estimator) unchanged. The summary therefore has *at most* M distinct points.
No optimisation: zero steps.

The sampler, :func:`importance_sample`, is the ONE importance-sampling definition of dpsummary
(GLMs and mixtures, ``dpsummary.mixtures.coresets`` calls this constructor through
:func:`dpsummary.constructors.fit`). The constructor never evaluates the model
(``model_free``), so it applies to every model, including the Gaussian mixture.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import ClassVar

import torch

from ..models import DTYPE, Model


@dataclass(frozen=True)
class LightweightState:
    points: torch.Tensor
    weights: torch.Tensor


def lightweight_proposal(data: torch.Tensor) -> torch.Tensor:
    """The sampling distribution q over the N records (poster, Algorithm 1), shape ``(N,)``."""
    n = data.shape[0]
    x = data.to(DTYPE)
    sq = ((x - x.mean(0)) ** 2).sum(1)
    total = sq.sum()
    uniform = torch.full((n,), 1.0 / n, dtype=DTYPE)
    if not total > 0:  # all records identical: q is uniform
        return uniform
    return 0.5 * uniform + 0.5 * sq / total


def importance_sample(
    probabilities: torch.Tensor, size: int, generator: torch.Generator
) -> tuple[torch.Tensor, torch.Tensor]:
    """``size`` i.i.d. draws from ``probabilities`` (shape (N,), non-negative, summing to 1):
    returns the distinct drawn rows (sorted int64) and their weights ``count_n / (size * q_n)``.

    Contract: E[sum_m w_m f(x_{i_m})] = sum_n f(x_n) for every f; weights are positive.
    (``torch.multinomial`` with replacement, then ``bincount``: the random stream of the GLM
    ``lightweight`` baseline before this function existed, so its recorded results stand.)"""
    if size < 1:
        raise ValueError("size must be at least 1")
    q = probabilities.to(DTYPE)
    if q.ndim != 1 or bool((q < 0).any()) or abs(float(q.sum()) - 1.0) > 1e-8:
        raise ValueError("probabilities must be a non-negative vector summing to 1")
    idx = torch.multinomial(q, size, replacement=True, generator=generator)
    counts = torch.bincount(idx, minlength=q.shape[0])
    chosen = torch.nonzero(counts, as_tuple=True)[0]  # sorted, distinct
    return chosen, counts[chosen].to(DTYPE) / (size * q[chosen])


@dataclass(frozen=True)
class Lightweight:
    name: str = "lightweight"
    #: Capability: never evaluates the model, so it applies to every model.
    model_free: ClassVar[bool] = True

    def init(self, data: torch.Tensor, model: Model, size: int, generator: torch.Generator) -> LightweightState:
        chosen, weights = importance_sample(lightweight_proposal(data), size, generator)
        return LightweightState(data[chosen].clone(), weights)

    def num_steps(self, size: int) -> int:
        return 0

    def step(self, state, data, model, generator):  # pragma: no cover - zero steps
        return state

    def result(self, state: LightweightState) -> tuple[torch.Tensor, torch.Tensor]:
        return state.points, state.weights
