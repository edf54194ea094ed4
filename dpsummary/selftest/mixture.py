"""The mixture mechanism's self-test (``dp-kd-tree``, :mod:`dpsummary.private.mixture`): noise
scale, accountant reproduction, coupled neighbour replay. Registered by
:mod:`dpsummary.mechanisms.dp_kd_tree`."""

from __future__ import annotations

import math
from dataclasses import dataclass

import numpy as np

from ..accounting import calibrate_noise_multiplier, epsilon
from ..private.mechanism import PrivacyRandomness, PrivateRecords
from .config import MechanismChecks
from .randomness import HalfNoiseRandomness, Injection, NoisePath, base_randomness


@dataclass(frozen=True)
class MixtureCheckResult(MechanismChecks):
    """:func:`mixture_checks`: noise scale (sd / sigma), accountant reproduction and the coupled
    neighbour replay of ``dp-kd-tree`` (:mod:`dpsummary.private.mixture`)."""

    #: Coupled replay: the neighbour (one extreme record added) run returns the first run's noisy
    #: outputs; the largest L2 move of a released exact count vector, in sensitivity units (1).
    replay_max_move: float
    #: The neighbour run released the same nodes and the same pseudo-points (decisions read only
    #: the noisy counts).
    replay_same_output: bool
    replay_ok: bool


class _CountRecorder:
    """Privacy randomness wrapper for the mixture replay: noise from ``base`` (or, with
    ``outputs``, the first run's noisy vectors, which couples the neighbour's noise); records
    every exact vector it is asked to noise. The tree samples nothing (no coins)."""

    def __init__(self, base: PrivacyRandomness, outputs: list[np.ndarray] | None = None) -> None:
        self.base = base
        self.outputs = outputs
        self.given: list[np.ndarray] = []
        self.returned: list[np.ndarray] = []

    def coins(self, num_records: int, sample_rate: float) -> np.ndarray:
        raise RuntimeError("the kd-tree samples nothing")

    def sample_indices(self, num_records: int, sample_rate: float) -> np.ndarray:
        raise RuntimeError("the kd-tree samples nothing")

    def gaussian(self, values: np.ndarray, *, noise_std: float, clip_norm: float) -> np.ndarray:
        self.given.append(np.array(values, dtype=np.float64))
        if self.outputs is not None:
            k = len(self.given) - 1
            out = self.outputs[k] if k < len(self.outputs) else np.full(np.shape(values), np.nan)
        else:
            out = np.asarray(self.base.gaussian(values, noise_std=noise_std, clip_norm=clip_norm), dtype=np.float64)
        self.returned.append(np.array(out))
        return out


def mixture_checks(*, inject: Injection = "none", noise_path: NoisePath = "opendp") -> MixtureCheckResult:
    """The mixture mechanism's self-test (``dp-kd-tree``):

    1. noise scale: the tree's count release (:func:`dpsummary.private.mixture.release_counts`)
       on 4,000 zero counts, sample sd / sigma within 6 standard errors of 1 (``half-noise``
       fails it);
    2. accountant: ``SelfComposedDpEvent(GaussianDpEvent(sigma), L + 1)`` by dpsummary's RDP
       evaluation against Opacus's own ``RDPAccountant`` (sample rate 1, L + 1 steps), relative
       difference <= 1e-6;
    3. coupled neighbour replay: a synthetic 2-d mixture D and D + one extreme record (a corner
       of the box); the run on D + record gets D's noisy outputs back, so it releases the same
       nodes iff every split/keep decision reads only noisy counts; every released exact count
       vector may move by at most the sensitivity 1 (L2), and the pseudo-points must be equal.
    """
    from dp_accounting import dp_event as dpe
    from opacus.accountants import RDPAccountant

    from ..accounting import RDP_ORDERS
    from ..mixtures.dp_summary import release_mixture_summary
    from ..mixtures.kdtree import TreePlan
    from ..private import mixture as pm

    base = base_randomness(noise_path)
    noise_rnd: PrivacyRandomness = HalfNoiseRandomness(base) if inject == "half-noise" else base
    sigma = 3.0
    n = 4000
    noisy = pm.release_counts(noise_rnd, np.zeros(n), sigma)
    ratio = float(np.std(noisy) / sigma)
    tol = 6.0 / math.sqrt(2.0 * n)
    noise_ok = abs(ratio - 1.0) <= tol

    levels, delta = 13, 1e-5
    sig = calibrate_noise_multiplier(target_epsilon=1.0, delta=delta, sample_rate=1.0, steps=levels,
                                     accountant="rdp")
    event = dpe.SelfComposedDpEvent(dpe.GaussianDpEvent(sig), levels)
    ours = epsilon([event], delta, "rdp")
    opacus_acc = RDPAccountant()
    opacus_acc.history = [(sig, 1.0, levels)]
    theirs = float(opacus_acc.get_epsilon(delta, alphas=list(RDP_ORDERS)))
    acc_ok = abs(ours - theirs) <= 1e-6 * theirs and ours <= 1.0 + 1e-3

    rng = np.random.default_rng(7)  # the synthetic data set (public, fixed)
    blobs = np.concatenate([rng.normal([-1.5, -1.0], 0.4, (600, 2)), rng.normal([1.5, 1.0], 0.3, (400, 2))])
    plan = TreePlan(dim=2, bound=4.0, max_depth=10, noise_multiplier=sigma)
    first = _CountRecorder(noise_rnd)
    out_d = release_mixture_summary(PrivateRecords(blobs, randomness=first), plan=plan)
    second = _CountRecorder(noise_rnd, outputs=first.returned)
    extreme = np.array([[4.0, -4.0]])
    out_n = release_mixture_summary(PrivateRecords(np.concatenate([blobs, extreme]), randomness=second), plan=plan)
    shapes = [a.shape for a in first.given] == [b.shape for b in second.given]
    moves = [float(np.linalg.norm(a - b)) for a, b in zip(first.given, second.given, strict=False)] if shapes else [
        math.inf]
    same = shapes and out_d.points.shape == out_n.points.shape and bool(np.array_equal(out_d.points, out_n.points)) \
        and bool(np.array_equal(out_d.weights, out_n.weights))
    max_move = max(moves) if moves else 0.0
    replay_ok = same and max_move <= 1.0 + 1e-12
    failed = [name for name, good in (("noise scale", noise_ok), ("accountant", acc_ok),
                                      ("coupled replay", replay_ok)) if not good]
    return MixtureCheckResult(
        noise_multiplier=sigma, noise_sd_ratio=ratio, noise_samples=n, noise_tolerance=tol, noise_ok=noise_ok,
        accountant_epsilon=ours, opacus_epsilon=theirs, accountant_ok=bool(acc_ok), replay_max_move=max_move,
        replay_same_output=bool(same), replay_ok=bool(replay_ok), ok=not failed, failed=failed,
    )
