"""match_gaussian turns a Gaussian target into weighted pseudopoints (post-processing)."""

from __future__ import annotations

import pytest
import torch

from dpsummary.constructors.gaussian_target import match_gaussian
from dpsummary.gaussian import GaussianPosterior
from dpsummary.inference import coreset_posterior
from dpsummary.metrics import gaussian_kl
from dpsummary.models import GaussianMean, LinearRegression, LogisticRegression, PoissonRegression


@pytest.mark.parametrize("model", [LogisticRegression(4), PoissonRegression(4), LinearRegression(4), GaussianMean(4)],
                         ids=lambda m: m.name)
def test_matched_coreset_posterior_is_the_target(model):
    g = torch.Generator().manual_seed(0)
    d = model.param_dim
    a = torch.randn(d, d, generator=g, dtype=torch.float64) * 0.1
    cov = a @ a.T + 0.02 * torch.eye(d, dtype=torch.float64)
    if model.name == "gaussian_mean":
        cov = 0.05 * torch.eye(d, dtype=torch.float64)  # its posteriors are isotropic
    target = GaussianPosterior(torch.randn(d, generator=g, dtype=torch.float64) * 0.3, torch.linalg.cholesky(cov))
    feats = torch.rand(20, model.num_features, generator=g, dtype=torch.float64) * 2 - 1
    pts, w, loss = match_gaussian(model, target, size=20, initial_features=feats, generator=g)
    assert pts.shape == (20, model.point_dim) and bool((w > 0).all())
    post = coreset_posterior(model, pts, w)
    assert gaussian_kl(post, target) < 0.2 and gaussian_kl(target, post) < 0.2
    assert loss < 0.5
