"""The stage-2 mechanisms of ``dpsummary release``, one module each, behind one interface
(:class:`~dpsummary.mechanisms.base.Mechanism`; docs/MECHANISMS.md).

Adding a mechanism touches its own module, its tests and one line of :data:`REGISTRY`.
Importing this package loads no heavy library (each mechanism imports torch, the accountants and
its private part inside its functions).
"""

from __future__ import annotations

from .base import Mechanism, MechanismOutput, MechanismPlan
from .dp_bb_psvi import DpBbPsvi
from .dp_kd_tree import DpKdTree
from .dp_psvi import DpPsvi
from .noise_aware_cells import NoiseAwareCells
from .noise_aware_newton import NoiseAwareNewton
from .noise_aware_objective import NoiseAwareObjective

#: Every mechanism by name. The first one that serves any model (``models`` empty) is the
#: default of ``--mechanism``; a mechanism with ``models`` is chosen by ``--model``.
REGISTRY: dict[str, Mechanism] = {
    "noise-aware-newton": NoiseAwareNewton(),
    "dp-psvi": DpPsvi(),
    "dp-bb-psvi": DpBbPsvi(),
    "dp-kd-tree": DpKdTree(),
    "noise-aware-cells": NoiseAwareCells(),
    "noise-aware-objective": NoiseAwareObjective(),
}

__all__ = ["REGISTRY", "Mechanism", "MechanismOutput", "MechanismPlan"]
