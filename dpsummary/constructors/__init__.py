"""Coreset constructors behind one interface (see :mod:`dpsummary.constructors.base`)."""

from __future__ import annotations

from .base import Constructor, Summary, fit, write_atomic
from .psvi import PSVI
from .uniform import Uniform

__all__ = ["PSVI", "Constructor", "Summary", "Uniform", "fit", "write_atomic"]
