"""The private BNN mechanism (dpsummary.private.bnn): exact non-private limit, sensitivity bound,
Binomial batches, noise scale, accountant reproduction."""

from __future__ import annotations

import numpy as np
import torch

from dpsummary.blackbox import dp_bb_psvi as dpb
from dpsummary.blackbox.core import WeightParam, make_state
from dpsummary.blackbox.objective import InnerConfig, outer_gradient
from dpsummary.models import DTYPE
from dpsummary.models.bnn import BNN, MeanFieldGaussian
from dpsummary.private import bnn as pb
from dpsummary.private.mechanism import clip_rows

INNER = InnerConfig(steps=3, lr=0.05, num_samples=4)


def setup(n: int = 40):
    model = BNN(2, widths=(5,), activation="tanh")
    g = torch.Generator().manual_seed(0)
    data = model.simulate(model.sample_prior(1, g)[0], n, g)
    state = make_state(model, dpb.public_init(model, 6, g), WeightParam.softmax(6, float(n), learn_total=True), n, g,
                       learn_points=True, learn_labels=True, points_lr=0.01, weights_lr=0.1, total_lr=0.001,
                       inner=INNER, init_sd=0.1, warmup_steps=5)
    return model, data, state


def test_non_private_limit_equals_black_box_gradient() -> None:
    """sigma = 0, q = 1, C = inf: the surrogate's gradient is exactly the non-private one."""
    model, data, state = setup()
    g_p, g_w, stat, _ = dpb.private_outer_gradient(
        state, data, model, torch.Generator().manual_seed(3), inner=INNER, outer_samples=5, sample_rate=1.0,
        clip_norm=float("inf"), noise_multiplier=0.0, mask=np.ones(data.shape[0], dtype=bool))
    gen = torch.Generator().manual_seed(3)
    inner_eps = torch.randn(3, 4, model.param_dim, generator=gen, dtype=DTYPE)
    outer_eps = torch.randn(5, model.param_dim, generator=gen, dtype=DTYPE)
    ref_p, ref_w, _, _ = outer_gradient(state.points.detach(), state.weights.detach(), state.mu, state.rho, data,
                                        data.shape[0], inner_eps, outer_eps, model, MeanFieldGaussian(1.0), INNER)
    assert stat.batch_size == data.shape[0]
    torch.testing.assert_close(g_p, ref_p, rtol=1e-9, atol=1e-12)
    torch.testing.assert_close(g_w, ref_w, rtol=1e-9, atol=1e-12)


def test_statistic_is_loglik_and_score() -> None:
    model, data, _ = setup()
    theta = model.sample_prior(3, torch.Generator().manual_seed(1))
    s = pb.record_statistics(model, data[:4], theta)
    assert s.shape == (4, 3 * (model.param_dim + 1))
    torch.testing.assert_close(s[:, :3], model.log_likelihood(data[:4], theta))
    ref = torch.func.jacrev(lambda th: model.log_likelihood(data[:1], th)[0])(theta)  # (K, K, d)
    torch.testing.assert_close(s[0, 3:].reshape(3, -1), torch.einsum("kkd->kd", ref))


def test_neighbouring_sums_differ_by_at_most_clip() -> None:
    """Add/remove one (extreme) record: clipped sums over the same other records differ <= C."""
    model, data, _ = setup()
    theta = model.sample_prior(4, torch.Generator().manual_seed(2))
    big = data.clone()
    big[0, :2] *= 1e3  # a record far outside the data: its statistic is large before clipping
    c = 0.1
    stats = pb.record_statistics(model, big, theta)
    assert float(stats[0].norm()) > 10 * c
    full = clip_rows(stats, c).sum(0)
    neighbour = clip_rows(stats[1:], c).sum(0)
    assert float((full - neighbour).norm()) <= c * (1 + 1e-12)
    # And through the released path with replayed coins (noise off): same bound.
    mask = np.ones(big.shape[0], dtype=bool)
    a = pb.noisy_statistic(model, big, theta, sample_rate=1.0, clip_norm=c, noise_multiplier=0.0, mask=mask)
    b = pb.noisy_statistic(model, big[1:], theta, sample_rate=1.0, clip_norm=c, noise_multiplier=0.0, mask=mask[1:])
    diff = torch.cat([a.L - b.L, (a.G - b.G).flatten()])
    assert float(diff.norm()) <= c * (1 + 1e-12)


def test_poisson_batches_are_binomial() -> None:
    model, data, _ = setup(n=200)
    theta = model.sample_prior(2, torch.Generator().manual_seed(4))
    q = 0.1
    sizes = np.array([pb.noisy_statistic(model, data, theta, sample_rate=q, clip_norm=1.0,
                                         noise_multiplier=0.0).batch_size for _ in range(300)])
    mean_se = np.sqrt(200 * q * (1 - q) / len(sizes))
    assert abs(sizes.mean() - 200 * q) < 4 * mean_se
    assert 0.6 < sizes.var(ddof=1) / (200 * q * (1 - q)) < 1.5


def test_noise_scale() -> None:
    """An empty batch releases pure noise of sd sigma * C in every coordinate."""
    model, data, _ = setup()
    theta = model.sample_prior(3, torch.Generator().manual_seed(5))
    sigma, c = 1.7, 0.3
    empty = np.zeros(data.shape[0], dtype=bool)
    draws = torch.cat([torch.cat([r.L, r.G.flatten()]) for r in (
        pb.noisy_statistic(model, data, theta, sample_rate=0.5, clip_norm=c, noise_multiplier=sigma, mask=empty)
        for _ in range(20))])
    sd = float(draws.std())
    n = draws.numel()
    assert abs(sd / (sigma * c) - 1) < 4 / np.sqrt(2 * n), (sd, sigma * c)
    assert abs(float(draws.mean())) < 4 * sigma * c / np.sqrt(n)


def test_accountant_reproduces_opacus() -> None:
    from opacus.accountants import RDPAccountant

    from dpsummary.accounting import epsilon

    sigma, q, steps, delta = 1.1, 0.0625, 300, 1e-5
    events = dpb.privacy_events(sigma, q, steps)
    acc = RDPAccountant()
    acc.history = [(sigma, q, steps)]
    ref = acc.get_epsilon(delta)
    ours = epsilon(events, delta, "rdp")
    assert abs(ours - ref) / ref < 0.02, (ours, ref)
    assert ours < epsilon(dpb.privacy_events(sigma, q, 2 * steps), delta, "rdp")


def test_private_step_runs_and_keeps_supports() -> None:
    model, data, state = setup()
    g = torch.Generator().manual_seed(6)
    for _ in range(2):
        state = dpb.private_step(state, data, model, g, inner=INNER, outer_samples=4, sample_rate=0.5, clip_norm=1.0,
                                noise_multiplier=1.0)
    assert torch.isfinite(state.points).all() and torch.isfinite(state.weights).all()
    assert ((state.points[:, -1] >= 0) & (state.points[:, -1] <= 1)).all()
    assert state.step == 2
