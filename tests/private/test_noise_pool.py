"""GaussianNoisePool: noise drawn ahead of use is the same Gaussian mechanism, used once."""

from __future__ import annotations

import math

import numpy as np
import pytest
from scipy import stats

from dpsummary.private import noise


def test_pool_noise_has_the_analytic_scale_and_is_never_reused():
    # 400 vectors of dimension 25 at sigma 1.3: the variance ratio is chi2(K)/K with K = 10^4;
    # accept within 6 of its standard deviations (failure probability ~2e-9), and a KS test at
    # p > 1e-6.
    dim, count, sigma = 25, 400, 1.3
    with noise.GaussianNoisePool(dim=dim, noise_std=sigma, clip_norm=1.0, count=count, ahead=8) as pool:
        vals = np.stack([pool.add(np.zeros(dim)) for _ in range(count)])
    k = vals.size
    assert abs(float((vals**2).mean()) / sigma**2 - 1) < 6 * math.sqrt(2 / k)
    assert stats.kstest((vals / sigma).ravel(), "norm").pvalue > 1e-6
    # No vector is handed out twice (continuous-looking draws on a 2^-45 grid never collide).
    assert len({v.tobytes() for v in vals}) == count


def test_pool_adds_noise_to_grid_values_exactly_like_a_fresh_draw():
    pool = noise.GaussianNoisePool(dim=3, noise_std=0.5, clip_norm=1.0, count=2)
    values = np.array([1.0, -2.5, 0.125])  # multiples of 2^-45
    out = pool.add(values)
    assert out.shape == (3,) and not np.array_equal(out, values)
    # A value off the noise grid would be rounded by OpenDP first: the pool refuses it.
    with pytest.raises(ValueError, match="grid"):
        pool.add(np.array([1.0, 2.0, 2.0**-60]))
    pool.add(values)
    with pytest.raises(ValueError, match="exhausted"):
        pool.add(values)
    pool.close()


def test_pool_validates_arguments_and_shapes():
    with pytest.raises(ValueError):
        noise.GaussianNoisePool(dim=0, noise_std=1.0, clip_norm=1.0, count=1)
    with pytest.raises(ValueError):
        noise.GaussianNoisePool(dim=2, noise_std=0.0, clip_norm=1.0, count=1)
    with noise.GaussianNoisePool(dim=2, noise_std=1.0, clip_norm=1.0, count=1) as pool:
        with pytest.raises(ValueError, match="shape"):
            pool.add(np.zeros(3))
        with pytest.raises(ValueError, match="non-finite"):
            pool.add(np.array([np.nan, 0.0]))


def test_dppsvi_steps_draw_their_noise_from_the_pool_and_keep_the_analytic_scale():
    """PrivateRecords announces the steps (public T, S, z); SystemRandomness serves them from a
    pool; the release is C * (unit sum + N(0, z^2)), i.e. noise of sd z * C, as before."""
    import torch

    from dpsummary.models import DTYPE, LogisticRegression
    from dpsummary.private.mechanism import PrivateRecords, SystemRandomness

    model = LogisticRegression(3, intercept=False)
    zeros = torch.zeros(40, 4, dtype=DTYPE)  # all-zero records: centred log-likelihoods are 0
    draws = torch.randn(16, 3, generator=torch.Generator().manual_seed(0), dtype=DTYPE)
    rnd = SystemRandomness()
    records = PrivateRecords(zeros, randomness=rnd)
    steps, sigma, clip = 150, 1.4, 0.3
    records.expect_clipped_sums(num_draws=16, noise_multiplier=sigma, count=steps)
    pool = rnd._pools[(16, sigma, 1.0)]
    vals = np.stack([records.noisy_clipped_sum(model, draws, sample_rate=0.5, clip_norm=clip,
                                               noise_multiplier=sigma).numpy() for _ in range(steps)])
    assert pool.remaining == 0
    k = vals.size  # chi2(k)/k within 6 of its sds: failure probability ~2e-9
    assert abs(float((vals**2).mean()) / (sigma * clip) ** 2 - 1) < 6 * math.sqrt(2 / k)
    # Beyond the announced count the mechanism falls back to fresh OpenDP draws.
    extra = records.noisy_clipped_sum(model, draws, sample_rate=0.5, clip_norm=clip, noise_multiplier=sigma)
    assert extra.shape == (16,)
    records.close()
