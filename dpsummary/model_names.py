"""The names of the model families (light: no torch), for policy validation before any heavy import.

:data:`dpsummary.models.REGISTRY` maps exactly these names to their classes (tested), so a policy's
``allowed_models`` can be checked, and a public refusal made, without importing torch."""

from __future__ import annotations

MODEL_NAMES: frozenset[str] = frozenset({"gaussian_mean", "linear", "logistic", "poisson", "bnn", "gmm", "dpgmm"})

#: The models whose target is binary (``--positive-class`` names its class 1); bnn also takes a
#: real target, so only a binary spec is checked for it.
BINARY_MODELS: tuple[str, ...] = ("logistic", "bnn")
