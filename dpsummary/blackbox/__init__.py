"""Black-box coreset variational inference (Manousakas, Ritter and Karaletsos 2022).

Coresets for models without a tractable posterior (Bayesian neural networks, and GLMs through
the same path): the coreset posterior is a mean-field Gaussian fitted to the weighted
pseudodata by an inner VI loop, and the outer objective (an importance-weighted lower bound on
the full data's evidence, Section 3) is differentiated through that loop with ``torch.func``.
See ``docs/BNN.md``.
"""

from __future__ import annotations

from collections.abc import Callable
from typing import Any

from .constructors import (
    BBPSVI,
    BBPruning,
    BBSparseVI,
    BBSparseVIIncremental,
    FullDataVI,
    RandomSubsetVI,
)
from .objective import InnerConfig

#: Method name -> constructor factory (keyword arguments are hyperparameters).
REGISTRY: dict[str, Callable[..., Any]] = {
    "bb-psvi": BBPSVI,
    "bb-sparsevi": BBSparseVI,
    "bb-sparsevi-incremental": BBSparseVIIncremental,
    "bb-sparsevi-pruning": BBPruning,
    "random-subset-vi": RandomSubsetVI,
    "full-data-vi": FullDataVI,
}

__all__ = [
    "BBPSVI",
    "REGISTRY",
    "BBPruning",
    "BBSparseVI",
    "BBSparseVIIncremental",
    "FullDataVI",
    "InnerConfig",
    "RandomSubsetVI",
]
