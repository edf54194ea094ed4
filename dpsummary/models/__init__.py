"""Statistical models and their registry (``dpsummary.models.REGISTRY``)."""

from __future__ import annotations

from typing import Any

from .base import DTYPE, Model
from .bnn import BNN
from .gaussian_mean import GaussianMean
from .glm import GLM, LogisticRegression, PoissonRegression
from .gmm import DPGaussianMixture, GaussianMixture
from .linear import LinearRegression

REGISTRY: dict[str, type[Model]] = {
    cls.name: cls for cls in (GaussianMean, LinearRegression, LogisticRegression, PoissonRegression, BNN, GaussianMixture,
                                DPGaussianMixture)
}


def get_model_class(name: str) -> type[Model]:
    try:
        return REGISTRY[name]
    except KeyError:
        raise ValueError(f"unknown model {name!r}; known models: {', '.join(sorted(REGISTRY))}") from None


def from_spec(spec: dict[str, Any]) -> Model:
    """Rebuild a model from :meth:`Model.spec`."""
    spec = dict(spec)
    cls = get_model_class(spec.pop("name"))
    num_features = spec.pop("num_features")
    return cls(num_features, **spec)


__all__ = [
    "DTYPE",
    "GLM",
    "REGISTRY",
    "GaussianMean",
    "LinearRegression",
    "LogisticRegression",
    "Model",
    "PoissonRegression",
    "from_spec",
    "get_model_class",
]
