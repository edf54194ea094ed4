"""Differentially private black-box PSVI for BNNs (issue 16, beyond the paper). DESIGN + MECHANISM;
not wired into :mod:`dpsummary.release` (its owner decides how).

Where data enters. In the outer objective (eq. 9 of the black-box coreset paper) the records
appear only in the data term ``D(phi) = sum_k wt_k(phi) sum_n log p(x_n | theta_k(phi))``, where
``phi`` are the coreset parameters, ``theta_k = mu*(phi) + sd*(phi) eps_k`` the draws from the
unrolled inner fit and ``wt`` the importance weights. By the chain rule

    grad_phi D = sum_k [ grad_phi wt_k * L_k + wt_k * (d theta_k / d phi)^T G_k ],
    L_k = sum_n log p(x_n | theta_k),   G_k = sum_n grad_theta log p(x_n | theta_k),

so the data reach the gradient only through ONE sum over records of the per-record statistic

    s(x) = [log p(x | theta_1..K), grad_theta log p(x | theta_1..K)]  in R^{K (d + 1)},

whatever the size of phi and however many inner steps are unrolled. Per step the mechanism
(:func:`noisy_statistic`): Poisson-subsample records (rate q, OS-entropy coins), clip each
record's ``s`` to L2 norm C (:func:`dpsummary.private.mechanism.clip_rows`; C less OpenDP's
rounding slack), sum exactly on the fixed-point grid (``exact_clipped_sum``), add Gaussian noise
of sd ``sigma * C`` ONCE (:func:`dpsummary.private.noise.add_gaussian_noise`). Neighbouring
data sets (add/remove one record) change the sum by at most C: each step is a Poisson-subsampled
Gaussian mechanism with noise multiplier sigma, accounted by
:func:`dpsummary.accounting.subsampled_gaussian_event` (``T`` steps). Everything after the noisy
sum is post-processing: the gradient is that of the surrogate

    sum_k wt_k(phi) L~_k / q + sum_k sg(wt_k) theta_k(phi) . G~_k / q

(sg = stop-gradient), whose gradient equals the formula above with the noisy sums (tested
against the non-private gradient at sigma = 0, q = 1, C = inf). Initial pseudopoints come from
public information only (:func:`public_init`).

Alternatives measured against this one: the K log-likelihoods alone (DP-PSVI's statistic,
dimension K) lose the reparameterisation path through theta_k, which for a BNN carries most of
the signal (the importance weights are nearly degenerate, effective sample size ~1 at d = 401);
per-record gradients with respect to phi cost one backward pass through the unrolled inner
loop per record, versus one ``vmap``-ed gradient of the log-likelihood here.
"""

from __future__ import annotations

from dataclasses import dataclass

import numpy as np
import torch
from torch.func import grad, vmap

from ..blackbox.core import BBState
from ..blackbox.objective import InnerConfig, importance_log_weights, inner_fit, loglik_matrix
from ..models import DTYPE, Model
from ..models.bnn import BNN, MeanFieldGaussian
from . import noise as noise_mod
from .mechanism import clip_rows, exact_clipped_sum


def record_statistics(model: Model, records: torch.Tensor, theta: torch.Tensor) -> torch.Tensor:
    """Per-record ``s(x) = [log p(x|theta_k)]_k ++ [grad_theta log p(x|theta_k)]_k``, shape
    ``(B, K (d + 1))``, with ``torch.func.vmap`` over records (each record's draws share nothing)."""
    ll = model.log_likelihood(records, theta)  # (B, K)

    def one(x: torch.Tensor, th: torch.Tensor) -> torch.Tensor:
        # Summing over k is harmless: the k-th term depends on theta_k only.
        return model.log_likelihood(x[None], th)[0].sum()

    g = vmap(grad(one, argnums=1), in_dims=(0, None))(records, theta)  # (B, K, d)
    return torch.cat([ll, g.flatten(1)], 1)


@dataclass(frozen=True)
class NoisyStatistic:
    """One release: ``L`` (K,) and ``G`` (K, d), noisy sums over the Poisson batch (unscaled)."""

    L: torch.Tensor
    G: torch.Tensor
    batch_size: int  # private; kept only for tests and diagnostics, never published


def noisy_statistic(model: Model, records: torch.Tensor, theta: torch.Tensor, *, sample_rate: float,
                    clip_norm: float, noise_multiplier: float, mask: np.ndarray | None = None) -> NoisyStatistic:
    """The accounted mechanism of one step (see module docstring).

    ``mask`` replaces the OS-entropy Poisson coins (tests replay fixed batches with it);
    ``noise_multiplier == 0`` skips the noise (non-private, tests only).
    """
    n = records.shape[0]
    if mask is None:
        mask = noise_mod.poisson_mask(n, noise_mod.quantize_sample_rate(sample_rate))
    batch = records[torch.from_numpy(np.asarray(mask, dtype=bool))]
    k, d = theta.shape
    dim = k * (d + 1)
    if batch.shape[0]:
        stats = record_statistics(model, batch, theta)
    else:
        stats = torch.zeros(0, dim, dtype=DTYPE)
    if noise_multiplier > 0:
        c_eff = clip_norm - noise_mod.rounding_slack(clip_norm, dim)
        total = exact_clipped_sum(clip_rows(stats, c_eff).numpy(), clip_norm)
        total = noise_mod.add_gaussian_noise(total, noise_std=noise_multiplier * clip_norm, clip_norm=clip_norm)
        out = torch.from_numpy(np.asarray(total, dtype=np.float64))
    else:
        out = clip_rows(stats, clip_norm).sum(0) if np.isfinite(clip_norm) else stats.sum(0)
    return NoisyStatistic(out[:k].clone(), out[k:].reshape(k, d).clone(), int(batch.shape[0]))


def private_loss(points: torch.Tensor, weights: torch.Tensor, mu0: torch.Tensor, rho0: torch.Tensor,
                 stat_l: torch.Tensor, stat_g: torch.Tensor, theta_fixed: torch.Tensor, sample_rate: float,
                 num_records: int, inner_eps: torch.Tensor, outer_eps: torch.Tensor, model: Model,
                 family: MeanFieldGaussian, config: InnerConfig) -> tuple[torch.Tensor, tuple[torch.Tensor, ...]]:
    """``-ELBO_PSVI-IS-BB / N`` with the data term replaced by the surrogate on noisy sums.

    ``theta_fixed`` are the draws at which the statistic was computed (the same values as the
    differentiable ``theta`` here; the surrogate's ``theta . G`` term uses ``theta - theta_fixed``
    so that its value, too, equals the data term)."""
    mu, rho, mom = inner_fit(mu0, rho0, points, weights, inner_eps, model, family, config)
    theta = family.sample(mu, rho, outer_eps)
    coreset_ll = loglik_matrix(model, points, theta) @ weights
    log_iw = importance_log_weights(mu, rho, theta, coreset_ll, model, family)
    wt = torch.softmax(log_iw, 0)
    data = (wt * stat_l).sum() + (wt.detach()[:, None] * (theta - theta_fixed) * stat_g).sum()
    elbo = data / sample_rate - (wt * coreset_ll).sum() + log_iw.mean()
    return -elbo / num_records, (mu, rho)


def private_outer_gradient(state: BBState, records: torch.Tensor, model: Model, generator: torch.Generator, *,
                           inner: InnerConfig, outer_samples: int, sample_rate: float, clip_norm: float,
                           noise_multiplier: float, mask: np.ndarray | None = None
                           ) -> tuple[torch.Tensor, torch.Tensor, NoisyStatistic, tuple[torch.Tensor, torch.Tensor]]:
    """Gradients of the private surrogate w.r.t. the state's points and weights.

    Pass 1 (no records): run the inner fit to get ``theta_k``. Mechanism: noisy sums at those
    draws. Pass 2 (no records): differentiate the surrogate through the same inner fit (same
    noise, so the same draws). ``generator`` drives only non-private randomness.
    """
    d = model.param_dim
    family = MeanFieldGaussian(model.prior_scale)
    inner_eps = torch.randn(inner.steps, inner.num_samples, d, generator=generator, dtype=DTYPE)
    outer_eps = torch.randn(outer_samples, d, generator=generator, dtype=DTYPE)
    points, weights = state.points.detach(), state.weights.detach()
    with torch.no_grad():
        mu, rho, _ = inner_fit(state.mu, state.rho, points, weights, inner_eps, model, family, inner)
        theta = family.sample(mu, rho, outer_eps)
    stat = noisy_statistic(model, records, theta, sample_rate=sample_rate, clip_norm=clip_norm,
                           noise_multiplier=noise_multiplier, mask=mask)
    fn = torch.func.grad(private_loss, argnums=(0, 1), has_aux=True)
    (g_p, g_w), (mu_new, rho_new) = fn(points, weights, state.mu, state.rho, stat.L, stat.G, theta, sample_rate,
                                       state.num_records, inner_eps, outer_eps, model, family, inner)
    return g_p, g_w, stat, (mu_new.detach(), rho_new.detach())


def public_init(model: BNN, size: int, generator: torch.Generator) -> torch.Tensor:
    """Initial pseudopoints from public information only: standard-normal features (the public
    transform standardises) and uniformly random hard labels (or targets 0 for regression)."""
    x = torch.randn(size, model.num_features, generator=generator, dtype=DTYPE)
    if model.likelihood == "softmax":
        idx = torch.randint(model.num_classes, (size,), generator=generator)
        y = torch.nn.functional.one_hot(idx, model.num_classes).to(DTYPE)
    elif model.likelihood == "bernoulli":
        y = torch.randint(2, (size, 1), generator=generator).to(DTYPE)
    else:
        y = torch.zeros(size, 1, dtype=DTYPE)
    return torch.cat([x, y], 1)


def privacy_events(noise_multiplier: float, sample_rate: float, steps: int) -> list:
    """The accountant's events for ``steps`` releases of :func:`noisy_statistic`."""
    from ..accounting import subsampled_gaussian_event

    return [subsampled_gaussian_event(noise_multiplier, noise_mod.quantize_sample_rate(sample_rate), steps)]


def private_step(state: BBState, records: torch.Tensor, model: Model, generator: torch.Generator, *,
                 inner: InnerConfig, outer_samples: int, sample_rate: float, clip_norm: float,
                 noise_multiplier: float) -> BBState:
    """One DP outer step: the mechanism, then an optimiser step on the coreset (post-processing).

    The inner Adam restarts from zero moments every step (both passes must see the same inner
    trajectory)."""
    g_p, g_w, _stat, (mu, rho) = private_outer_gradient(
        state, records, model, generator, inner=inner, outer_samples=outer_samples, sample_rate=sample_rate,
        clip_norm=clip_norm, noise_multiplier=noise_multiplier)
    weights = state.weight.weights()
    state.optimizer.zero_grad(set_to_none=True)
    if state.learn_points:
        if not state.learn_labels:
            g_p = g_p.clone()
            g_p[:, model.num_features:] = 0.0
        state.points.grad = g_p
    torch.autograd.backward([weights], [g_w])
    state.optimizer.step()
    with torch.no_grad():
        if state.learn_points:
            model.project_points(state.points)
    state.weight.project()
    state.mu, state.rho = mu, rho
    state.step += 1
    return state
