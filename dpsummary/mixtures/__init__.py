"""Bayesian Gaussian mixtures (BGMM) and truncated Dirichlet-process mixtures (DPGMM) with
weighted variational inference, and lightweight/uniform coresets for them (non-private
baselines; poster "Coresets for VI in BGMM and DPGMM", Algorithm 1). See ``docs/MIXTURES.md``.

Nothing here reads a private record or draws privacy noise: the private summaries' mechanisms
live in :mod:`dpsummary.private.mixture`; their public plans and runs are :mod:`.kdtree` and
:mod:`.dp_summary`.
"""

from __future__ import annotations

from .coresets import (
    CORESET_METHODS,
    WeightedPoints,
    build_coreset,
    lightweight_probabilities,
)
from .metrics import ComponentErrors, component_errors, match_components
from .vi import (
    PROCESSES,
    CAVIState,
    MixtureFit,
    MixturePosterior,
    MixturePrior,
    Process,
    Statistics,
    SVIState,
    cavi_init,
    cavi_step,
    elbo,
    expected_log_density,
    fit_cavi,
    fit_svi,
    full_elbo,
    kmeans_responsibilities,
    log_predictive_density,
    posterior_from_statistics,
    responsibilities,
    svi_init,
    svi_step,
    weighted_statistics,
)

#: CLI model names and the weight process each stands for.
MODEL_PROCESSES: dict[str, Process] = {"gmm": "dirichlet_distribution", "dpgmm": "dirichlet_process"}

__all__ = [
    "CORESET_METHODS", "MODEL_PROCESSES", "PROCESSES", "CAVIState", "ComponentErrors", "MixtureFit",
    "MixturePosterior", "MixturePrior", "Process", "SVIState", "Statistics", "WeightedPoints", "build_coreset",
    "cavi_init", "cavi_step", "component_errors", "elbo", "expected_log_density", "fit_cavi", "fit_svi",
    "full_elbo", "kmeans_responsibilities",
    "lightweight_probabilities", "log_predictive_density", "match_components", "posterior_from_statistics",
    "responsibilities", "svi_init", "svi_step", "weighted_statistics",
]
