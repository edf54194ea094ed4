"""Sampling a release's weighted posterior: NUTS (BlackJAX) with convergence diagnostics.

:func:`sample_posterior` is the front door ``Release.sample()`` calls: it builds the posterior's
JAX log density (:mod:`.densities`), whitens it by a Gaussian (the release's signed Gaussian, or
the pseudocoreset's Laplace approximation), runs NUTS with mass-matrix adaptation (dense, or
diagonal where the warm-up is too short for a dense estimate, :mod:`.nuts`) and computes
rank-normalised split R-hat, bulk and tail ESS and divergences (:mod:`.diagnostics`). Sampling
is post-processing of a release: it costs no privacy, whatever the number of draws.
"""

from __future__ import annotations

import numpy as np
import torch

from ..gaussian import GaussianPosterior
from ..models import Model
from .densities import glm_data, torch_log_density
from .diagnostics import ESS_MIN, RHAT_MAX, Diagnostics, diagnose
from .nuts import Draws, NutsSettings, run_nuts

__all__ = ["ESS_MIN", "RHAT_MAX", "Diagnostics", "Draws", "NutsSettings", "diagnose", "sample_posterior",
           "SamplingWarning", "warning_text"]


class SamplingWarning(UserWarning):
    """The draws failed a convergence check (R-hat, ESS or divergences); the message says which
    and what to do."""


def sample_posterior(
    model: Model,
    points: torch.Tensor,
    weights: torch.Tensor,
    *,
    start: GaussianPosterior,
    settings: NutsSettings | None = None,
    seed: int | None = None,
    names: list[str] | None = None,
) -> Draws:
    """NUTS draws of ``prior(theta) prod_m p(points_m | theta)^weights_m``, whitened and
    warm-started by ``start`` (its mean and Cholesky factor). Raises ``ValueError`` when
    ``start`` is not finite. Never warns: callers decide (see :func:`warning_text`)."""
    cfg = settings or NutsSettings()
    centre = start.mean.detach().to(torch.float64).numpy()
    tril = start.scale_tril.detach().to(torch.float64).numpy()
    glm = glm_data(model, points, weights)
    if glm is not None:
        return run_nuts(centre=centre, tril=tril, settings=cfg, seed=seed, glm=glm, names=names)
    return run_nuts(centre=centre, tril=tril, settings=cfg, seed=seed,
                    log_density=torch_log_density(model, points, weights), names=names)


def warning_text(draws: Draws) -> str | None:
    """The warning for draws that fail a check, with the fix, or None."""
    problems = draws.problems()
    if not problems:
        return None
    return ("the draws may not represent the posterior: " + "; ".join(problems)
            + f" [{draws.diagnostics.summary()}]. Fix: draw more (num_samples), warm up longer (num_warmup), "
            "or run more chains (chains); Release.sample(..., return_draws=True).diagnostics has the figures")


def as_numpy(x: torch.Tensor | np.ndarray) -> np.ndarray:
    return x.detach().cpu().numpy() if isinstance(x, torch.Tensor) else np.asarray(x)
