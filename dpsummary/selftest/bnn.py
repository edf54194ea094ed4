"""The BNN mechanism's self-test (``dp-bb-psvi``, :mod:`dpsummary.private.bnn`): noise scale,
accountant reproduction, gray-box replay. Registered by :mod:`dpsummary.mechanisms.dp_bb_psvi`."""

from __future__ import annotations

import math
from dataclasses import dataclass
from typing import Any

import numpy as np
import torch

from ..accounting import calibrate_noise_multiplier, epsilon
from ..models import DTYPE, Model
from ..private import noise
from ..private.mechanism import PrivateRecords, SystemRandomness
from .config import MechanismChecks, Progress, ReplayResult
from .randomness import HalfNoiseRandomness, Injection, NoClipRecords
from .replay import (
    REPLAY_NOISE_MULTIPLIER,
    ReplayRandomness,
    moved_in_sensitivities,
    replay_verdict,
)


@dataclass(frozen=True)
class BNNCheckResult(MechanismChecks):
    """:func:`bnn_checks`: noise scale (sd / sigma C), accountant reproduction, gray-box replay
    of dp-bb-psvi."""

    clip_norm: float
    replay: ReplayResult


class _BNNLockstep:
    """The BNN twin of :class:`_LockstepRecords`: D's mechanism drives the trajectory; at the
    same public (theta, C) and the same coins, D + canary is released with zero noise, and the
    move of the pre-noise sum is recorded in sensitivity units. ``inflate`` > 1 injects the
    no-clip bug (clip norm times ``inflate``, noise multiplier divided by it: same noise sd)."""

    def __init__(self, main: PrivateRecords, main_rnd: ReplayRandomness, twin: PrivateRecords,
                 twin_rnd: ReplayRandomness, inflate: float = 1.0) -> None:
        self.main, self.main_rnd, self.twin, self.twin_rnd = main, main_rnd, twin, twin_rnd
        self.inflate = inflate
        self.ratios: list[float] = []

    def noisy_bnn_statistic(self, model: Model, theta: torch.Tensor, *, sample_rate: float, clip_norm: float,
                            noise_multiplier: float) -> Any:
        from ..private.bnn import records_statistic

        kw = {"sample_rate": sample_rate, "clip_norm": clip_norm * self.inflate,
              "noise_multiplier": noise_multiplier / self.inflate}
        out = records_statistic(self.main, model, theta, **kw)
        records_statistic(self.twin, model, theta, **kw)
        moved = float(np.linalg.norm(self.twin_rnd.inputs[-1] - self.main_rnd.inputs[-1]))
        self.ratios.append(moved_in_sensitivities(moved, self.main_rnd.noise_stds[-1], noise_multiplier))
        return out


class _BNNInflated:
    """The no-clip bug on one record set (independent replays): see :class:`_BNNLockstep`."""

    def __init__(self, records: PrivateRecords, inflate: float) -> None:
        self.records, self.inflate = records, inflate

    def noisy_bnn_statistic(self, model: Model, theta: torch.Tensor, *, sample_rate: float, clip_norm: float,
                            noise_multiplier: float) -> Any:
        from ..private.bnn import records_statistic

        return records_statistic(self.records, model, theta, sample_rate=sample_rate,
                                 clip_norm=clip_norm * self.inflate, noise_multiplier=noise_multiplier / self.inflate)


def bnn_replay_design(records: int) -> tuple[Any, torch.Tensor, torch.Tensor]:
    """A small public BNN, D (simulated from a prior draw) and an extreme canary record whose
    statistic is far above C before clipping."""
    from ..models.bnn import BNN

    model = BNN(3, widths=(4,))
    g = torch.Generator().manual_seed(5)
    points = model.simulate(model.sample_prior(1, g)[0], records, g)
    canary = torch.tensor([[40.0, -40.0, 40.0, 1.0]], dtype=DTYPE)
    return model, points, canary


def bnn_gray_box_replay(*, inject: Injection = "none", records: int = 200, steps: int = 4, size: int = 5,
                        seed: int = 2, clip_norm: float = 1.0) -> ReplayResult:
    """:func:`gray_box_replay` for the BNN mechanism: the full private BB-PSVI loop
    (:func:`dpsummary.blackbox.dp_bb_psvi.fit_private` on :class:`PrivateRecords`) on D and D + canary
    with identical recorded randomness (same calls and shapes, a first-step move <= C at the
    identical public state), and in lockstep along D's trajectory ``||delta sum|| <= C`` at every
    step, all in units of the sensitivity the accountant is told
    (:func:`moved_in_sensitivities`). Only ``no-clip`` of the injections acts here."""
    from ..blackbox import dp_bb_psvi as pb
    from ..blackbox.objective import InnerConfig

    model, points, canary = bnn_replay_design(records)
    q = noise.quantize_sample_rate(0.25)
    inflate = NoClipRecords.INFLATION if inject == "no-clip" else 1.0
    inner = InnerConfig(steps=2, num_samples=3)

    def run(recs: Any) -> None:
        init = pb.public_init(model, size, torch.Generator().manual_seed(11))
        pb.fit_private(recs, model, size=size, steps=steps, sample_rate=q, noise_multiplier=REPLAY_NOISE_MULTIPLIER,
                       clip_norm=clip_norm, record_count=float(records), initial_points=init,
                       generator=torch.Generator().manual_seed(9), inner=inner, outer_samples=3, warmup_steps=4)

    inputs: list[list[np.ndarray]] = []
    stds: list[float] = []
    for data in (points, torch.cat([points, canary])):
        rnd = ReplayRandomness(seed, shared=records)
        recs = PrivateRecords(data, randomness=rnd)
        run(_BNNInflated(recs, inflate) if inflate != 1.0 else recs)
        inputs.append(rnd.inputs)
        stds = stds or rnd.noise_stds
    main_rnd = ReplayRandomness(seed, shared=records)
    twin_rnd = ReplayRandomness(seed, shared=records, zero_noise=True)
    twin_rnd.replay_masks = main_rnd.masks
    lock = _BNNLockstep(PrivateRecords(points, randomness=main_rnd), main_rnd,
                        PrivateRecords(torch.cat([points, canary]), randomness=twin_rnd), twin_rnd, inflate)
    run(lock)
    clips = [[clip_norm] * len(inputs[0]), [clip_norm] * len(inputs[1])]
    return replay_verdict(inputs[0], inputs[1], stds, clips, lock.ratios, steps)


def bnn_noise_check(*, inject: Injection = "none", noise_multiplier: float = 1.3, clip_norm: float = 0.7,
                    calls: int = 30) -> tuple[float, int, float]:
    """The BNN release path's noise against the analytic sd ``sigma * C``: ``calls`` releases at
    q = 1 (every record included, so the pre-noise sum is known exactly from the same per-record
    rule) through :func:`dpsummary.private.bnn.records_statistic` with the product's
    :class:`SystemRandomness` (its noise pool announced as in a release; ``half-noise``
    halves it). Returns ``(sample sd / (sigma C), coordinates, tolerance)``; the tolerance is 6
    standard errors of the ratio, ``6 / sqrt(2 n)`` (false failure below 2e-9)."""
    from ..private import bnn as pb
    from ..private.kernel import finish

    model, points, _ = bnn_replay_design(50)
    theta = model.sample_prior(3, torch.Generator().manual_seed(3))
    base = SystemRandomness()
    rnd: Any = HalfNoiseRandomness(base) if inject == "half-noise" else base
    recs = PrivateRecords(points, randomness=rnd)
    try:
        recs.expect_clipped_sums(num_draws=3 * (model.param_dim + 1), noise_multiplier=noise_multiplier, count=calls)
        exact = torch.from_numpy(finish(pb.unit_clipped_total(pb.record_statistics(model, points, theta),
                                                              clip_norm), 1.0) * clip_norm)
        noise_draws = []
        for _ in range(calls):
            st = pb.records_statistic(recs, model, theta, sample_rate=1.0, clip_norm=clip_norm,
                                      noise_multiplier=noise_multiplier)
            noise_draws.append((torch.cat([st.L, st.G.flatten()]) - exact).numpy())
    finally:
        recs.close()
        base.close()
    z = np.concatenate(noise_draws)
    ratio = float(np.sqrt(np.mean(z * z))) / (noise_multiplier * clip_norm)
    return ratio, int(z.size), 6.0 / math.sqrt(2.0 * z.size)


def bnn_checks(*, inject: Injection = "none", progress: Progress | None = None) -> BNNCheckResult:
    """The BNN mechanism's self-test: noise scale (:func:`bnn_noise_check`), accountant
    reproduction (the events of :func:`dpsummary.blackbox.dp_bb_psvi.privacy_events` at a calibrated
    sigma, epsilon by dpsummary's RDP evaluation and by Opacus's own ``RDPAccountant`` loop on
    the same orders, relative difference <= 1e-6), and :func:`bnn_gray_box_replay`."""
    from ..accounting import RDP_ORDERS
    from ..blackbox import dp_bb_psvi as pb

    sigma, clip = 1.3, 0.7
    ratio, n, tol = bnn_noise_check(inject=inject, noise_multiplier=sigma, clip_norm=clip)
    if progress is not None:
        progress("bnn", 1, 3)
    q, steps, delta = noise.quantize_sample_rate(0.05), 200, 1e-5
    sig = calibrate_noise_multiplier(target_epsilon=1.0, delta=delta, sample_rate=q, steps=steps, accountant="rdp")
    ours = epsilon(pb.privacy_events(sig, q, steps), delta, "rdp")
    from opacus.accountants import RDPAccountant

    opacus_acc = RDPAccountant()
    opacus_acc.history = [(sig, q, steps)]
    theirs = float(opacus_acc.get_epsilon(delta, alphas=list(RDP_ORDERS)))
    acc_ok = abs(ours - theirs) <= 1e-6 * theirs and ours <= 1.0 + 1e-3
    if progress is not None:
        progress("bnn", 2, 3)
    replay = bnn_gray_box_replay(inject=inject)
    if progress is not None:
        progress("bnn", 3, 3)
    noise_ok = abs(ratio - 1.0) <= tol
    failed = [name for name, good in (("noise scale", noise_ok), ("accountant", acc_ok),
                                      ("gray-box replay", replay.ok)) if not good]
    return BNNCheckResult(
        noise_multiplier=sigma, clip_norm=clip, noise_sd_ratio=ratio, noise_samples=n, noise_tolerance=tol,
        noise_ok=noise_ok, accountant_epsilon=ours, opacus_epsilon=theirs, accountant_ok=bool(acc_ok),
        replay=replay, ok=not failed, failed=failed,
    )
