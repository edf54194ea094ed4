"""The sampler's mass matrix (``dpsummary.sampling.nuts``): dense where the warm-up's last slow
window can estimate a ``d x d`` covariance, diagonal where it cannot (session 65: at d = 106 with
300 warm-up steps the dense estimate was rank-deficient and NUTS ran to its maximum tree depth
on every draw, 80-86 s a run instead of 1-4 s)."""

from __future__ import annotations

import numpy as np
import pytest
import torch

from dpsummary.inference import coreset_posterior
from dpsummary.models import LogisticRegression
from dpsummary.sampling import NutsSettings, sample_posterior
from dpsummary.sampling.nuts import DENSE_DRAWS_PER_DIM, last_window_draws, mass_matrix_is_dense
from dpsummary.sampling.reference import importance_moments

pytest.importorskip("blackjax")


@pytest.mark.parametrize(("num_warmup", "expected"), [(300, 100), (1000, 500), (2000, 1100)])
def test_last_window_is_stans_doubling_schedule(num_warmup: int, expected: int) -> None:
    """Stan's windows: 75 fast steps (15%), then slow windows of 25, 50, 100, ... doubling, the
    last stretched to end 50 steps (the final fast phase) before the warm-up does: 300 -> 25, 50,
    100; 1,000 -> 25, 50, 100, 200, 500; 2,000 -> ..., 400, 1,100."""
    assert last_window_draws(num_warmup) == expected


def test_dense_only_where_the_last_window_holds_ten_draws_per_dimension() -> None:
    default = NutsSettings()  # 1,000 warm-up steps: last window 500 draws
    assert DENSE_DRAWS_PER_DIM == 10
    assert mass_matrix_is_dense(50, default) and not mass_matrix_is_dense(51, default)
    short = NutsSettings(num_warmup=300)  # the moment matching's warm-up: last window 100
    assert mass_matrix_is_dense(10, short) and not mass_matrix_is_dense(106, short)
    assert mass_matrix_is_dense(106, NutsSettings(num_warmup=300, mass_matrix="dense"))
    assert not mass_matrix_is_dense(2, NutsSettings(mass_matrix="diagonal"))
    with pytest.raises(ValueError, match="mass_matrix"):
        NutsSettings(mass_matrix="full")


def test_short_warm_up_at_large_dimension_samples_with_short_trees() -> None:
    """d = 81 with 300 warm-up steps (last window 100 draws, under 81 x 10): the diagonal mass
    matrix in whitened coordinates keeps trees short (the dense estimate from 100 draws, full rank
    here but noisy, averages 62 leapfrog steps a draw; at d = 106 it was rank-deficient and ran at
    about 980 of the maximum 1,023), and the draws agree with an importance-
    sampling reference. Tolerances: 4 x 1,000 draws with bulk ESS above 1,000 give a mean's Monte
    Carlo error of at most about 0.032 sd (the reference's, with over 5,000 effective draws,
    0.014; together 0.035), so 0.2 sd is over 5 standard errors in each of 81 coordinates
    (failure rate below 1e-5; the seeds are fixed, so the test is deterministic); an sd's
    relative error is about 2.3%, so 12% is over 5. R-hat: the largest of 81 split R-hats of mixing chains stays below 1.02."""
    gen = torch.Generator().manual_seed(3)
    d_features = 80
    model = LogisticRegression(d_features)
    x = torch.randn(240, d_features, generator=gen, dtype=torch.float64) * 0.5
    theta = torch.randn(d_features + 1, generator=gen, dtype=torch.float64) * 0.3
    eta = theta[0] + x @ theta[1:]
    y = (torch.rand(240, generator=gen, dtype=torch.float64) < torch.sigmoid(eta)).to(torch.float64)
    points = torch.cat([x, y[:, None]], dim=1)
    weights = torch.full((240,), 25.0, dtype=torch.float64)
    start = coreset_posterior(model, points, weights)
    settings = NutsSettings(num_warmup=300, draws_per_chain=1000)
    assert not mass_matrix_is_dense(model.param_dim, settings)
    draws = sample_posterior(model, points, weights, start=start, settings=settings, seed=7)
    assert draws.mean_tree_steps < 32  # 14 here; 62 with mass_matrix='dense' at these seeds
    assert float(np.nanmin(draws.diagnostics.ess_bulk)) > 1000 and float(np.nanmax(draws.diagnostics.rhat)) < 1.02
    ref = importance_moments(model, points, weights, start, draws=100_000, generator=torch.Generator().manual_seed(0))
    assert ref.ess > 5_000
    flat = draws.flat()
    ref_sd = ref.sd.numpy()
    assert np.max(np.abs(flat.mean(0) - ref.mean.numpy()) / ref_sd) < 0.2
    ratio = flat.std(0, ddof=1) / ref_sd
    assert 0.88 < ratio.min() and ratio.max() < 1.12
