"""Uniform subsampling: M records drawn without replacement, each weighted N/M. Model-free: it
applies to every model (GLMs and the Gaussian mixture)."""

from __future__ import annotations

from dataclasses import dataclass
from typing import ClassVar

import torch

from ..models import DTYPE, Model


@dataclass(frozen=True)
class UniformState:
    points: torch.Tensor
    weights: torch.Tensor


@dataclass(frozen=True)
class Uniform:
    name: str = "uniform"
    #: Capability: never evaluates the model, so it applies to every model.
    model_free: ClassVar[bool] = True

    def init(self, data: torch.Tensor, model: Model, size: int, generator: torch.Generator) -> UniformState:
        n = data.shape[0]
        m = min(size, n)
        idx = torch.randperm(n, generator=generator)[:m]
        return UniformState(data[idx].clone(), torch.full((m,), n / m, dtype=DTYPE))

    def num_steps(self, size: int) -> int:
        return 0

    def step(self, state, data, model, generator):  # pragma: no cover - zero steps
        return state

    def result(self, state: UniformState) -> tuple[torch.Tensor, torch.Tensor]:
        return state.points, state.weights
