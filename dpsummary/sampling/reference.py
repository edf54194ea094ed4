"""Moments of a weighted posterior by importance sampling: the one independent reference.

``Release.sample()`` (NUTS) is checked against it (tests/sampling/test_agreement.py), the
exporters' programs are (tests/export/test_exporters.py, benchmarks/sampling.py), and the moment
matching of a pseudocoreset reads the exact posterior's moments from it when its effective sample
size is large enough (:mod:`dpsummary.constructors.moment_match`). One implementation, so the
reference every check uses is the same object.

The proposal is a multivariate t with 5 degrees of freedom centred at a Gaussian's mean with 1.3x
its scale (heavier tails than the posterior in every direction the Gaussian gets roughly right;
the effective sample size says when it does not). Post-processing of a release: no privacy cost.
"""

from __future__ import annotations

import math
from dataclasses import dataclass

import torch

from ..gaussian import DTYPE, GaussianPosterior
from ..models import Model

#: The proposal's degrees of freedom and its scale relative to the Gaussian it is built on.
PROPOSAL_DF = 5.0
PROPOSAL_SCALE = 1.3


@dataclass(frozen=True)
class ImportanceMoments:
    """Self-normalised importance-sampling mean and sd (``(d,)`` tensors) and the effective
    number of draws ``1 / sum(w^2)`` (Kish); ``ess`` is 0 when the weights are not finite."""

    mean: torch.Tensor
    sd: torch.Tensor
    ess: float


def importance_moments(model: Model, points: torch.Tensor, weights: torch.Tensor, proposal: GaussianPosterior, *,
                       draws: int, generator: torch.Generator, chunk: int = 20_000) -> ImportanceMoments:
    """Mean, sd and ESS of ``prior x prod_i p(points_i | theta)^weights_i`` by importance sampling
    from the t proposal built on ``proposal``, with ``draws`` draws from ``generator``."""
    from ..inference import weighted_log_posterior

    d = int(proposal.mean.shape[0])
    mean0 = proposal.mean.detach().to(DTYPE)
    tril = proposal.scale_tril.detach().to(DTYPE)
    z = torch.randn(draws, d, generator=generator, dtype=DTYPE)
    # A chi-square per draw as a sum of squared normals (torch's Chi2 takes no generator).
    chi = (torch.randn(draws, int(PROPOSAL_DF), generator=generator, dtype=DTYPE) ** 2).sum(1, keepdim=True)
    t = z * torch.sqrt(PROPOSAL_DF / chi)
    theta = mean0 + PROPOSAL_SCALE * t @ tril.T
    log_q = -0.5 * (PROPOSAL_DF + d) * torch.log1p((t * t).sum(1) / PROPOSAL_DF)  # up to a constant
    log_p = torch.cat([weighted_log_posterior(model, points, weights, part) for part in theta.split(chunk)])
    lw = (log_p - log_q).detach()
    w = torch.exp(lw - lw.max())
    w = w / w.sum()
    ess = float(1.0 / (w * w).sum())
    if not math.isfinite(ess):
        nan = torch.full((d,), math.nan, dtype=DTYPE)
        return ImportanceMoments(nan, nan, 0.0)
    mu = w @ theta
    return ImportanceMoments(mu, torch.sqrt(w @ (theta - mu) ** 2), ess)
