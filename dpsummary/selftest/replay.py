"""Gray-box replay (Cebere et al. 2026): the full DP-PSVI constructor on D and D + canary with
identical recorded randomness, locally and on the Spark engine; the recording randomness and
the sensitivity verdict are shared with the BNN replay (:mod:`dpsummary.selftest.bnn`)."""

from __future__ import annotations

import math
from pathlib import Path
from typing import Any

import numpy as np
import torch

from ..models import DTYPE, LogisticRegression, Model
from ..private import noise
from ..private.mechanism import PrivateRecords
from .config import Progress, ReplayResult
from .randomness import Injection, NoClipRecords


class ReplayRandomness:
    """Seeded, recording stand-in for OS entropy (replay only: never used for a release).

    Coins for the first ``shared`` records come from the seed; records beyond them (the canary)
    are always included, the worst case for the sensitivity check."""

    def __init__(self, seed: int, shared: int, zero_noise: bool = False) -> None:
        self._rng = np.random.default_rng(seed)
        self.shared = shared
        self.zero_noise = zero_noise
        self.inputs: list[np.ndarray] = []
        self.noise_stds: list[float] = []
        self.masks: list[np.ndarray] = []
        self.replay_masks: list[np.ndarray] | None = None

    def coins(self, num_records: int, sample_rate: float) -> np.ndarray:
        if self.replay_masks is not None:
            base = self.replay_masks[len(self.masks)]
        else:
            base = self._rng.random(self.shared) < sample_rate
        mask = np.concatenate([base, np.ones(num_records - self.shared, dtype=bool)])
        self.masks.append(base)
        return mask

    def sample_indices(self, num_records: int, sample_rate: float) -> np.ndarray:
        return np.flatnonzero(self.coins(num_records, sample_rate))

    def gaussian(self, values: np.ndarray, *, noise_std: float, clip_norm: float) -> np.ndarray:
        values = np.array(values, dtype=np.float64, copy=True)
        self.inputs.append(values.copy())
        self.noise_stds.append(float(noise_std))
        if self.zero_noise:
            return values
        return values + noise_std * self._rng.standard_normal(values.shape[0])


class _LockstepRecords:
    """Runs D through the mechanism and, at the same public inputs (theta, C) and the same coins,
    D + canary with zero noise; the constructor's trajectory follows D."""

    def __init__(self, main: PrivateRecords, main_rnd: ReplayRandomness,
                 twin: PrivateRecords, twin_rnd: ReplayRandomness) -> None:
        self.main, self.main_rnd, self.twin, self.twin_rnd = main, main_rnd, twin, twin_rnd
        self.ratios: list[float] = []

    def noisy_clipped_sum(
        self, model: Model, theta: torch.Tensor, *, sample_rate: float, clip_norm: float, noise_multiplier: float
    ) -> torch.Tensor:
        out = self.main.noisy_clipped_sum(
            model, theta, sample_rate=sample_rate, clip_norm=clip_norm, noise_multiplier=noise_multiplier
        )
        self.twin.noisy_clipped_sum(
            model, theta, sample_rate=sample_rate, clip_norm=clip_norm, noise_multiplier=noise_multiplier
        )
        delta = np.linalg.norm(self.twin_rnd.inputs[-1] - self.main_rnd.inputs[-1])
        self.ratios.append(moved_in_sensitivities(float(delta), self.main_rnd.noise_stds[-1], noise_multiplier))
        return out


def moved_in_sensitivities(delta: float, noise_std: float, noise_multiplier: float) -> float:
    """How far a neighbour moved a mechanism's pre-noise input, in units of the sensitivity the
    accountant is told: the noise had sd ``noise_multiplier x sensitivity``, so this is
    ``delta * noise_multiplier / noise_std`` (at most 1 for a correct mechanism), whatever units
    the mechanism releases its sum in (DP-PSVI releases it in units of C_t)."""
    return delta * noise_multiplier / noise_std


def _replay_deltas(in0: list[np.ndarray], in1: list[np.ndarray], noise_stds: list[float], clips: list[float],
                   noise_multiplier: float) -> list[float]:
    """Per step, how far D + canary moved the pre-noise sum, on the scale of the step's clip
    norm C_t (so ``<= C_t`` is the sensitivity check)."""
    return [moved_in_sensitivities(float(np.linalg.norm(b - a)), sd, noise_multiplier) * c
            for a, b, sd, c in zip(in0, in1, noise_stds, clips, strict=False)]


#: The replays' DP-PSVI noise multiplier (what "the accountant is told" in their sensitivity check).
REPLAY_NOISE_MULTIPLIER = 1.0


def recording_dppsvi(log: list[float], *, sample_rate: float, records: int, steps: int,
                      num_samples: int) -> Any:
    """The replays' DP-PSVI constructor, logging every step's clip norm into ``log``."""
    from ..constructors.dppsvi import DPPSVI

    class Recording(DPPSVI):
        def clip_norm(self, model: Model, state: Any, theta: torch.Tensor) -> float:
            c = super().clip_norm(model, state, theta)
            log.append(c)
            return c

    return Recording(noise_multiplier=REPLAY_NOISE_MULTIPLIER, sample_rate=sample_rate,
                     record_count=float(records), steps=steps, num_samples=num_samples)


def replay_verdict(in0: list[np.ndarray], in1: list[np.ndarray], stds: list[float], clips: list[list[float]],
                    lock_ratios: list[float], steps: int) -> ReplayResult:
    """The replay's checks (see :func:`gray_box_replay`), whatever engine produced the inputs."""
    deltas = _replay_deltas(in0, in1, stds, clips[0], REPLAY_NOISE_MULTIPLIER)
    shapes = len(in0) == len(in1) and all(a.shape == b.shape for a, b in zip(in0, in1, strict=True))
    first_clip_equal = bool(clips[0] and clips[1] and clips[0][0] == clips[1][0])
    first_ok = bool(deltas) and deltas[0] <= clips[0][0] + 1e-9
    lock_max = max(lock_ratios) if lock_ratios else math.inf
    ok = len(in0) == len(in1) == steps and shapes and first_clip_equal and first_ok and lock_max <= 1 + 1e-9
    return ReplayResult(
        steps=steps, calls=(len(in0), len(in1)), shapes_equal=shapes, first_step_clip_equal=first_clip_equal,
        first_step_delta=deltas[0] if deltas else math.nan, first_step_clip=clips[0][0] if clips[0] else math.nan,
        per_step_delta=deltas, per_step_clip=list(clips[0]), lockstep_max_ratio=lock_max, ok=bool(ok),
    )


def gray_box_replay(
    *, inject: Injection = "none", records: int = 400, steps: int = 8, num_samples: int = 20,
    seed: int = 2, progress: Progress | None = None,
) -> ReplayResult:
    """Replay the full DP-PSVI constructor (:func:`dpsummary.constructors.fit` with
    :class:`~dpsummary.constructors.dppsvi.DPPSVI`) on D and D + canary with identical randomness.

    Two checks: (1) two independent fits with identical recorded randomness must make the same
    number of mechanism calls with the same shapes, and at the first step (identical public
    state) the same clip norm and a pre-noise sum that moves by at most C; later steps differ as
    post-processing of different noisy outputs and are reported, not asserted. (2) Lockstep: along
    D's trajectory, D + canary is evaluated at the same public inputs and coins at every step, and
    ||delta sum|| <= C_t must hold at every step. Only ``no-clip`` of the injections acts here
    (the others change randomness, which the replay controls itself)."""
    from ..constructors import fit
    from ..constructors.dppsvi import DPPSVI

    cls = NoClipRecords if inject == "no-clip" else PrivateRecords
    g = torch.Generator().manual_seed(5)
    model = LogisticRegression(4)
    theta0 = model.sample_prior(1, g)[0]
    points = model.simulate(theta0, records, g)
    canary = torch.tensor([[6.0, -6.0, 6.0, -6.0, 1.0]], dtype=DTYPE)
    q = noise.quantize_sample_rate(0.25)

    clips: list[list[float]] = [[], []]

    def constructor(log: list[float]) -> DPPSVI:
        return recording_dppsvi(log, sample_rate=q, records=records, steps=steps, num_samples=num_samples)

    inputs = []
    stds: list[float] = []
    for i, data in enumerate((points, torch.cat([points, canary]))):
        rnd = ReplayRandomness(seed, shared=records)
        fit(constructor(clips[i]), cls(data, randomness=rnd), model, 5,
            generator=torch.Generator().manual_seed(9))
        inputs.append(rnd.inputs)
        stds = stds or rnd.noise_stds
        if progress is not None:
            progress("replay", i + 1, 3)
    in0, in1 = inputs
    main_rnd = ReplayRandomness(seed, shared=records)
    twin_rnd = ReplayRandomness(seed, shared=records, zero_noise=True)
    twin_rnd.replay_masks = main_rnd.masks
    main_rnd.zero_noise = False
    lock = _LockstepRecords(cls(points, randomness=main_rnd), main_rnd,
                            cls(torch.cat([points, canary]), randomness=twin_rnd), twin_rnd)
    fit(constructor([]), lock, model, 5, generator=torch.Generator().manual_seed(9))
    if progress is not None:
        progress("replay", 3, 3)
    # main_rnd records its (noise-free) input before adding noise, so inputs are comparable.
    return replay_verdict(in0, in1, stds, clips, lock.ratios, steps)


class _SparkReplayRandomness(ReplayRandomness):
    """Recording, seeded noise for the Spark replay: the Spark engine's coins are its keyed PRF
    (shared by D and D + canary); its per-step mechanism runs at rate 1 on the step's batch."""

    def __init__(self, seed: int, zero_noise: bool = False) -> None:
        super().__init__(seed, shared=0, zero_noise=zero_noise)

    def coins(self, num_records: int, sample_rate: float) -> np.ndarray:
        if sample_rate != 1.0:
            raise RuntimeError("the Spark replay samples only through the PRF step coins")
        return np.ones(num_records, dtype=bool)


def spark_gray_box_replay(spark: Any = None, *, records: int = 400, steps: int = 8, num_samples: int = 20,
                          seed: int = 2, master: str = "local[2]") -> ReplayResult:
    """:func:`gray_box_replay` against the Spark engine (:mod:`dpsummary.private.spark_engine`).

    D (``records`` simulated logistic records, Parquet) and D + canary (one extreme record
    appended, so every other row keeps its row id and hence its PRF coins) run the full DP-PSVI
    constructor through :class:`~dpsummary.private.spark_engine.SparkSource` with one shared
    :class:`~dpsummary.private.prf.StepCoins` key and identical recorded noise: the same calls and
    shapes, the same first clip norm, a first-step move <= C, and in lockstep along D's trajectory
    ``||delta sum|| <= C_t`` at every step. ``spark``: an active SparkSession (else one is started
    on ``master`` and stopped). Files live in a private temporary directory, deleted at the end."""
    import shutil
    from contextlib import nullcontext
    from typing import cast

    import pyarrow as pa
    import pyarrow.parquet as pq

    from ..constructors import fit
    from ..constructors.dppsvi import DPPSVI
    from ..data import ColumnSpec, Schema, Transform
    from ..private.prf import StepCoins
    from ..private.spark_engine import SparkSource
    from ..spark.session import SparkOptions, private_dir, spark_scope

    bound = 8.0
    schema = Schema(columns=[*(ColumnSpec(name=f"x{i}", kind="numeric", lower=-bound, upper=bound) for i in range(4)),
                             ColumnSpec(name="y", kind="categorical", categories=["0", "1"])], target="y")
    tf = Transform.from_schema(schema)
    model = LogisticRegression(tf.num_features)
    g = torch.Generator().manual_seed(5)
    points = model.simulate(model.sample_prior(1, g)[0], records, g).numpy()

    def table(rows: np.ndarray) -> Any:
        cols: dict[str, Any] = {f"x{i}": rows[:, i] * bound for i in range(4)}
        cols["y"] = [str(int(v)) for v in rows[:, 4]]
        return pa.table(cols)

    canary = np.array([[1.0, -1.0, 1.0, -1.0, 1.0]])
    q = noise.quantize_sample_rate(0.25)
    coins = StepCoins.generate(q, steps)
    work = private_dir("dpsummary-selftest-spark-")
    clips: list[list[float]] = [[], []]

    def constructor(log: list[float]) -> DPPSVI:
        return recording_dppsvi(log, sample_rate=q, records=records, steps=steps, num_samples=num_samples)

    scope: Any = nullcontext((spark, work)) if spark is not None else spark_scope(SparkOptions(master=master))
    try:
        paths = [work / "d0.parquet", work / "d1.parquet"]
        pq.write_table(table(points), paths[0])
        pq.write_table(table(np.concatenate([points, canary])), paths[1])
        counter = iter(range(1_000))

        def records_of(path: Path, rnd: Any) -> Any:
            scratch = work / f"run{next(counter)}"
            scratch.mkdir(mode=0o700)
            source = SparkSource(session, path, scratch, steps=steps, randomness=rnd, coins=coins)
            return source.encode(tf, missing_numeric="impute", unseen_category="other").records

        with scope as (session, _):
            inputs = []
            stds: list[float] = []
            for i, path in enumerate(paths):
                rnd = _SparkReplayRandomness(seed)
                fit(constructor(clips[i]), records_of(path, rnd), model, 5, generator=torch.Generator().manual_seed(9))
                inputs.append(rnd.inputs)
                stds = stds or rnd.noise_stds
            main_rnd, twin_rnd = _SparkReplayRandomness(seed), _SparkReplayRandomness(seed, zero_noise=True)
            lock = _LockstepRecords(cast(Any, records_of(paths[0], main_rnd)), cast(Any, main_rnd),
                                    cast(Any, records_of(paths[1], twin_rnd)), cast(Any, twin_rnd))
            fit(constructor([]), lock, model, 5, generator=torch.Generator().manual_seed(9))
    finally:
        shutil.rmtree(work, ignore_errors=True)
    in0, in1 = inputs
    return replay_verdict(in0, in1, stds, clips, lock.ratios, steps)
