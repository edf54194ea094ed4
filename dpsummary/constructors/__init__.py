"""Coreset constructors behind one interface (see :mod:`dpsummary.constructors.base`)."""

from __future__ import annotations

from collections.abc import Callable
from functools import partial
from typing import Any, cast

from .base import Constructor, Summary, fit, write_atomic
from .giga import GIGA
from .lightweight import Lightweight
from .psvi import PSVI
from .sparsevi import SparseVI
from .uniform import Uniform

#: Method name -> constructor factory (keyword arguments are the constructor's hyperparameters).
#: (``cast``: the frozen dataclasses have a read-only ``name``, which mypy does not accept for the
#: protocol's settable ``name: str``; a ``@property`` in the protocol would remove the need.)
REGISTRY: dict[str, Callable[..., Constructor[Any, Any]]] = cast(Any, {
    "uniform": Uniform,
    "lightweight": Lightweight,
    "giga": GIGA,
    "giga-realistic": partial(GIGA, weighting="realistic", name="giga-realistic"),
    "sparsevi": SparseVI,
    "psvi": PSVI,
})


def applies(constructor: Any, model: Any) -> bool:
    """Whether ``constructor`` can run on ``model`` (declared capabilities, never names): a
    ``model_free`` constructor (lightweight, uniform) runs on every model; the others need
    Laplace approximations or posterior draws of the flat parameter, which a model with
    ``parameter_draws = False`` (the Gaussian mixture) does not support. Attributes absent
    mean: not model-free, draws supported (the GLMs)."""
    return bool(getattr(constructor, "model_free", False) or getattr(model, "parameter_draws", True))

__all__ = [
    "GIGA",
    "PSVI",
    "REGISTRY",
    "Constructor",
    "Lightweight",
    "SparseVI",
    "Summary",
    "Uniform",
    "applies",
    "fit",
    "write_atomic",
]
