"""Differentially private black-box PSVI for BNNs (issue 16, beyond the paper): the mechanism of
``dpsummary release --model bnn`` (``dp-bb-psvi``; orchestrated by :mod:`dpsummary.release`).

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
against the non-private gradient at sigma = 0, q = 1, C = inf). That surrogate, the loss around
it and the coreset update are the non-private BB-PSVI's own code, outside this package
(:func:`dpsummary.blackbox.objective.statistic_data_fit`,
:func:`dpsummary.blackbox.core.statistic_step`): this module keeps only what reads records or
draws privacy randomness, and hands the step its noisy statistic. The run around it (public
defaults, public initial pseudopoints, the accountant's events, the T steps and their
post-processing) is :mod:`dpsummary.blackbox.dp_bb_psvi`.

Alternatives measured against this one: the K log-likelihoods alone (DP-PSVI's statistic,
dimension K) lose the reparameterisation path through theta_k, which for a BNN carries most of
the signal (the importance weights are nearly degenerate, effective sample size ~1 at d = 401);
per-record gradients with respect to phi cost one backward pass through the unrolled inner
loop per record, versus one ``vmap``-ed gradient of the log-likelihood here.

Records and randomness in the release. :func:`records_statistic` reads the records through a
:class:`~dpsummary.private.mechanism.PrivateRecords` (its record store and its privacy
randomness): the step's Poisson sample comes from
:func:`dpsummary.private.mechanism.draw_sample` (with :class:`SystemRandomness`, the exact O(qN)
sampler of :mod:`dpsummary.private.sampling`: the sampling the accountant assumes), only the
sampled rows are gathered, and the statistic is released exactly as DP-PSVI's sum is: each
record contributes ``clip(s(x) / C, 1)`` (less OpenDP's rounding slack), summed exactly on the
public fixed-point grid (:func:`dpsummary.private.kernel.fixed_point_sum`), noised once with
``N(0, sigma^2)`` per coordinate by :func:`dpsummary.private.mechanism.release_clipped_sum` and
multiplied back by the public C (post-processing). One step is therefore the unit Gaussian
mechanism of sensitivity 1 (noise multiplier sigma), and its noise may be drawn ahead of use
(:meth:`PrivateRecords.expect_clipped_sums`). :func:`dpsummary.blackbox.dp_bb_psvi.fit_private`
runs the whole private BB-PSVI loop (public start, T accounted steps, post-processing); nothing it
returns or logs depends on the batches except through the noisy sums.

Privacy caveats: C, q, T, sigma, the network, the inner-loop settings and the initial
pseudopoints must be public (the release takes them from the policy, the options and the
released record count/schema). The realised batch sizes are private and never leave this module
on the release path (:attr:`NoisyStatistic.batch_size` is -1 there).
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any

import numpy as np
import torch
from torch.func import grad, vmap

from ..models import DTYPE, Model
from . import kernel
from . import noise as noise_mod
from .mechanism import (
    MechanismError,
    PrivateRecords,
    SystemRandomness,
    clip_rows,
    draw_sample,
    fixed_point_unit,
    release_clipped_sum,
)


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


class _MaskRandomness:
    """Replays a fixed inclusion mask (tests); noise from OS entropy unless ``noise`` is given."""

    def __init__(self, mask: np.ndarray, noise: Any = None) -> None:
        self.mask = np.asarray(mask, dtype=bool)
        self.noise = noise if noise is not None else SystemRandomness()

    def coins(self, num_records: int, sample_rate: float) -> np.ndarray:
        if self.mask.shape != (num_records,):
            raise MechanismError("inclusion mask has the wrong shape")
        return self.mask

    def gaussian(self, values: np.ndarray, *, noise_std: float, clip_norm: float) -> np.ndarray:
        return np.asarray(self.noise.gaussian(values, noise_std=noise_std, clip_norm=clip_norm))


def unit_clipped_total(stats: torch.Tensor, clip_norm: float) -> np.ndarray:
    """THE per-record rule of the mechanism: every row ``s`` becomes ``clip(s / C, 1 - slack)``
    (non-finite rows zero, :func:`clip_rows`), rounded toward zero onto the public grid of
    bound 1 and summed exactly (Python integers, :func:`kernel.fixed_point_sum`). Neighbouring
    batches give totals that differ by one rounded row of norm <= 1 (unit sensitivity)."""
    if not (clip_norm > 0 and np.isfinite(clip_norm)):
        raise MechanismError("clip_norm must be positive and finite")
    dim = stats.shape[1]
    if stats.shape[0] == 0:
        return kernel.zero_partial(dim)
    clipped = clip_rows(stats.detach().to(DTYPE) / clip_norm, kernel.effective_clip(1.0, dim))
    # Re-check the invariant the accountant relies on, after clipping.
    if bool((clipped.norm(dim=1) > 1.0).any()):
        raise MechanismError("a clipped contribution exceeds the clip norm")
    return kernel.fixed_point_sum(clipped.numpy(), fixed_point_unit(1.0))


def _release(randomness: Any, batch: torch.Tensor, model: Model, theta: torch.Tensor, *, clip_norm: float,
             noise_multiplier: float) -> torch.Tensor:
    """Statistic of the gathered batch, unit-clipped exact sum, Gaussian noise once (sd sigma in
    units of C), times C. Returns the flat noisy sum ``(K (d + 1),)``."""
    k, d = theta.shape
    dim = k * (d + 1)
    stats = record_statistics(model, batch, theta) if batch.shape[0] else torch.zeros(0, dim, dtype=DTYPE)
    total = unit_clipped_total(stats, clip_norm)
    return release_clipped_sum(randomness, total, clip_norm=clip_norm, noise_multiplier=noise_multiplier)


def _split(flat: torch.Tensor, theta: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor]:
    k, d = theta.shape
    return flat[:k].clone(), flat[k:].reshape(k, d).clone()


def records_statistic(records: PrivateRecords, model: Model, theta: torch.Tensor, *, sample_rate: float,
                      clip_norm: float, noise_multiplier: float) -> NoisyStatistic:
    """The release path of one step (see the module docstring): Poisson sample through the
    records' privacy randomness (:func:`draw_sample`; exact sampler), gather only those rows
    from the record store, release the noisy statistic. ``theta``, C, q and sigma are public."""
    if not (noise_multiplier > 0 and np.isfinite(noise_multiplier)):
        raise MechanismError("noise_multiplier must be positive and finite")
    # The private package's own records object: its store and randomness are read here only.
    store, randomness = records._store, records._randomness
    idx = draw_sample(randomness, store.num_rows, sample_rate)
    batch = torch.from_numpy(np.ascontiguousarray(store.gather(idx), dtype=np.float64))
    flat = _release(randomness, batch, model, theta.detach().to(DTYPE), clip_norm=clip_norm,
                    noise_multiplier=noise_multiplier)
    big_l, big_g = _split(flat, theta)
    return NoisyStatistic(big_l, big_g, -1)


def noisy_statistic(model: Model, records: torch.Tensor, theta: torch.Tensor, *, sample_rate: float,
                    clip_norm: float, noise_multiplier: float, mask: np.ndarray | None = None) -> NoisyStatistic:
    """The accounted mechanism of one step on an in-memory tensor (benchmarks and tests; the
    release uses :func:`records_statistic`, the same rule and the same sampler).

    ``mask`` replaces the OS-entropy Poisson coins (tests replay fixed batches with it; noise
    still from OS entropy); ``noise_multiplier == 0`` skips the noise and the unit clipping
    (non-private, tests only; ``clip_norm`` may then be infinite)."""
    n = records.shape[0]
    q = noise_mod.quantize_sample_rate(sample_rate)
    randomness: Any = _MaskRandomness(mask) if mask is not None else SystemRandomness()
    idx = draw_sample(randomness, n, q)
    batch = records[torch.from_numpy(idx)].to(DTYPE)
    k, d = theta.shape
    if noise_multiplier > 0:
        flat = _release(randomness, batch, model, theta.detach().to(DTYPE), clip_norm=clip_norm,
                        noise_multiplier=noise_multiplier)
    else:
        stats = record_statistics(model, batch, theta) if batch.shape[0] else torch.zeros(0, k * (d + 1), dtype=DTYPE)
        flat = clip_rows(stats, clip_norm).sum(0) if np.isfinite(clip_norm) else stats.sum(0)
    big_l, big_g = _split(flat, theta)
    return NoisyStatistic(big_l, big_g, int(idx.size))


def statistic(records: Any, model: Model, theta: torch.Tensor, *, sample_rate: float, clip_norm: float,
              noise_multiplier: float, mask: np.ndarray | None = None) -> NoisyStatistic:
    """Dispatch one step's release: a tensor (benchmarks/tests), an object with a
    ``noisy_bnn_statistic`` method (the self-test's lockstep replay), or :class:`PrivateRecords`
    (the release)."""
    if isinstance(records, torch.Tensor):
        return noisy_statistic(model, records, theta, sample_rate=sample_rate, clip_norm=clip_norm,
                               noise_multiplier=noise_multiplier, mask=mask)
    hook = getattr(records, "noisy_bnn_statistic", None)
    if hook is not None:
        return hook(model, theta, sample_rate=sample_rate, clip_norm=clip_norm, noise_multiplier=noise_multiplier)
    return records_statistic(records, model, theta, sample_rate=sample_rate, clip_norm=clip_norm,
                             noise_multiplier=noise_multiplier)
