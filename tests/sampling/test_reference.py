"""The importance-sampling reference (dpsummary.sampling.reference) against closed forms."""

from __future__ import annotations

import math

import torch

from dpsummary.gaussian import DTYPE, GaussianPosterior
from dpsummary.models import GaussianMean, LogisticRegression
from dpsummary.sampling.reference import importance_moments


def test_importance_moments_recover_a_conjugate_posterior_from_a_poor_proposal():
    """A Gaussian-mean posterior (exact in closed form) from a proposal 0.5 sd off-centre and 1.5x
    too wide: 40,000 draws give an ESS of several thousand, so a mean's Monte Carlo error is
    about 0.02 sd and an sd's about 1.5%; the bounds (0.1 sd, 6%) are over 4 standard errors
    (failure rate below 1e-4 per coordinate; seeds fixed)."""
    gen = torch.Generator().manual_seed(3)
    model = GaussianMean(3, prior_scale=2.0, noise_scale=1.0)
    points = torch.randn(30, 3, generator=gen, dtype=DTYPE)
    weights = torch.rand(30, generator=gen, dtype=DTYPE) * 2
    exact = model.exact_posterior(points, weights)
    sd = exact.cov.diagonal().sqrt()
    proposal = GaussianPosterior(exact.mean + 0.5 * sd, 1.5 * exact.scale_tril)
    est = importance_moments(model, points, weights, proposal, draws=40_000, generator=gen)
    assert est.ess > 3_000
    assert float(((est.mean - exact.mean) / sd).abs().max()) < 0.1
    assert float((est.sd / sd - 1).abs().max()) < 0.06


def test_importance_moments_report_zero_ess_when_the_weights_are_not_finite():
    """A proposal whose draws all land where the log density is -inf or nan yields ESS 0 and nan
    moments, never a silent number."""
    model = LogisticRegression(1)
    points = torch.tensor([[0.5, 1.0]], dtype=DTYPE)
    weights = torch.tensor([math.nan], dtype=DTYPE)
    proposal = GaussianPosterior(torch.zeros(2, dtype=DTYPE), torch.eye(2, dtype=DTYPE))
    est = importance_moments(model, points, weights, proposal, draws=100, generator=torch.Generator().manual_seed(0))
    assert est.ess == 0.0 and bool(torch.isnan(est.mean).all())
