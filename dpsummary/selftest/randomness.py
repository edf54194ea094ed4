"""Privacy randomness for the audits, and the injected bugs (``--inject``).

Each injection replaces one piece of the product by a known bug, everything else unchanged
(see :mod:`dpsummary.selftest`): the classes here wrap the product's
:class:`~dpsummary.private.mechanism.PrivacyRandomness` or subclass its
:class:`~dpsummary.private.mechanism.PrivateRecords` / histogram layout."""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass
from typing import TYPE_CHECKING, Any, Literal, cast

import numpy as np
import torch

from ..models import Model
from ..private import noise
from ..private.marginals import HistogramLayout
from ..private.mechanism import PrivacyRandomness, PrivateRecords, SystemRandomness
from ..private.sampling import poisson_indices

if TYPE_CHECKING:
    from ..models.glm import GLM
    from ..private.objective import PerturbedMode
    from ..private.randomness import TiltRandomness

Injection = Literal["none", "no-clip", "half-noise", "fixed-size", "fixed-seed", "no-scale", "refuse-invalid",
                    "multiline-csv", "strict-utf8"]
INJECTIONS: tuple[Injection, ...] = ("none", "no-clip", "half-noise", "fixed-size", "fixed-seed", "no-scale",
                                     "refuse-invalid", "multiline-csv", "strict-utf8")
NoisePath = Literal["opendp", "numpy"]
NOISE_PATHS: tuple[NoisePath, ...] = ("opendp", "numpy")


class NumpyGaussianRandomness:
    """The fast noise path: the product's sampler (:func:`dpsummary.private.sampling.poisson_indices`,
    exact Poisson sampling from OS entropy; :func:`noise.poisson_mask` for ``coins``) and a
    vectorised numpy Gaussian from a PCG64 generator seeded from OS entropy. Not the product's
    noise (OpenDP's discrete Gaussian); results audited with it say so."""

    def __init__(self) -> None:
        self._rng = np.random.default_rng()  # seeded from OS entropy

    def coins(self, num_records: int, sample_rate: float) -> np.ndarray:
        return noise.poisson_mask(num_records, sample_rate)

    def sample_indices(self, num_records: int, sample_rate: float) -> np.ndarray:
        return poisson_indices(num_records, sample_rate)

    def gaussian(self, values: np.ndarray, *, noise_std: float, clip_norm: float) -> np.ndarray:
        values = np.asarray(values, dtype=np.float64)
        return values + noise_std * self._rng.standard_normal(values.shape[0])

    def tilt(self, dim: int, *, noise_std: float) -> np.ndarray:
        """A float Gaussian tilt (the fast path's; the product draws the dithered discrete one)."""
        return noise_std * self._rng.standard_normal(dim)


class HalfNoiseRandomness:
    """Bug: the noise standard deviation is halved (coins and noise sampler otherwise unchanged)."""

    def __init__(self, base: PrivacyRandomness) -> None:
        self.base = base

    def coins(self, num_records: int, sample_rate: float) -> np.ndarray:
        return self.base.coins(num_records, sample_rate)

    def sample_indices(self, num_records: int, sample_rate: float) -> np.ndarray:
        return self.base.sample_indices(num_records, sample_rate)

    def gaussian(self, values: np.ndarray, *, noise_std: float, clip_norm: float) -> np.ndarray:
        return self.base.gaussian(values, noise_std=noise_std / 2, clip_norm=clip_norm)

    def tilt(self, dim: int, *, noise_std: float) -> np.ndarray:
        return cast("TiltRandomness", self.base).tilt(dim, noise_std=noise_std / 2)


class FixedSizeRandomness:
    """Bug: exactly round(q n) records per step, drawn without replacement (OS entropy), while
    the accountant is still told "Poisson with rate q".

    ``blocks`` lists the (start, stop) record ranges of independent data sets sharing one call
    (batched runs); each gets its own fixed-size batch. ``None``: one data set.
    """

    def __init__(self, base: PrivacyRandomness, blocks: Sequence[tuple[int, int]] | None = None) -> None:
        self.base = base
        self.blocks = None if blocks is None else list(blocks)
        self._rng = np.random.default_rng()

    def coins(self, num_records: int, sample_rate: float) -> np.ndarray:
        blocks = self.blocks if self.blocks is not None else [(0, num_records)]
        starts = np.array([b[0] for b in blocks], dtype=np.int64)
        sizes = np.array([b[1] - b[0] for b in blocks], dtype=np.int64)
        if int(sizes.sum()) != num_records or np.any(starts != np.concatenate([[0], np.cumsum(sizes)[:-1]])):
            raise ValueError("blocks must tile the records contiguously")
        take = np.array([round(sample_rate * int(s)) for s in sizes], dtype=np.int64)
        block_of = np.repeat(np.arange(len(blocks)), sizes)
        order = np.lexsort((self._rng.random(num_records), block_of))  # random order within blocks
        rank = np.empty(num_records, dtype=np.int64)
        rank[order] = np.arange(num_records) - starts[block_of[order]]
        return rank < take[block_of]

    def sample_indices(self, num_records: int, sample_rate: float) -> np.ndarray:
        return np.flatnonzero(self.coins(num_records, sample_rate))

    def gaussian(self, values: np.ndarray, *, noise_std: float, clip_norm: float) -> np.ndarray:
        return self.base.gaussian(values, noise_std=noise_std, clip_norm=clip_norm)

    def tilt(self, dim: int, *, noise_std: float) -> np.ndarray:
        return cast("TiltRandomness", self.base).tilt(dim, noise_std=noise_std)


class FixedSeedRandomness:
    """Bug: the noise generator is re-created from one constant seed at every call, so every step
    (and every run) adds the same noise vector. Coins are the base's.

    ``block_dim``: output coordinates per data set when several share one call (the noise vector
    is repeated per data set, exactly as separate runs with the same seed would see it).
    """

    SEED = 20230512

    def __init__(self, base: PrivacyRandomness, block_dim: int | None = None) -> None:
        self.base = base
        self.block_dim = block_dim

    def coins(self, num_records: int, sample_rate: float) -> np.ndarray:
        return self.base.coins(num_records, sample_rate)

    def sample_indices(self, num_records: int, sample_rate: float) -> np.ndarray:
        return self.base.sample_indices(num_records, sample_rate)

    def gaussian(self, values: np.ndarray, *, noise_std: float, clip_norm: float) -> np.ndarray:
        values = np.asarray(values, dtype=np.float64)
        dim = self.block_dim or values.shape[0]
        z = np.random.default_rng(self.SEED).standard_normal(dim)
        return values + noise_std * np.tile(z, values.shape[0] // dim)

    def tilt(self, dim: int, *, noise_std: float) -> np.ndarray:
        return noise_std * np.random.default_rng(self.SEED + 1).standard_normal(dim)


class NoClipRecords(PrivateRecords):
    """Bug: clipping disabled. The product's method is called with the clip norm inflated by
    :attr:`INFLATION` (so no realistic vector is clipped) and the noise multiplier deflated by the
    same factor (so the noise standard deviation sigma * C is unchanged)."""

    __slots__ = ()
    INFLATION = 1e6
    #: Objective perturbation's inflation (:meth:`perturbed_mode`): its solver's tolerance grows
    #: with the bound, so a modest factor.
    OBJECTIVE_INFLATION = 100.0

    def noisy_clipped_sum(
        self, model: Model, theta: torch.Tensor, *, sample_rate: float, clip_norm: float, noise_multiplier: float
    ) -> torch.Tensor:
        return super().noisy_clipped_sum(
            model, theta, sample_rate=sample_rate, clip_norm=clip_norm * self.INFLATION,
            noise_multiplier=noise_multiplier / self.INFLATION,
        )

    def noisy_score_statistics(
        self, model: Model, theta: torch.Tensor, *, score_bound: float, curvature_bound: float,
        score_noise_multiplier: float, curvature_noise_multiplier: float,
    ) -> Any:
        return super().noisy_score_statistics(
            model, theta, score_bound=score_bound * self.INFLATION, curvature_bound=curvature_bound * self.INFLATION,
            score_noise_multiplier=score_noise_multiplier / self.INFLATION,
            curvature_noise_multiplier=curvature_noise_multiplier / self.INFLATION,
        )

    def perturbed_mode(self, model: GLM, *, feature_norm: float, ridge: float, centre: torch.Tensor,
                       noise_multiplier: float, output_multiplier: float) -> PerturbedMode:
        """Objective perturbation without the projection into the public ball: the feature norm
        inflated :attr:`OBJECTIVE_INFLATION` times (enough for the audits' canaries, 10x the
        bound), both multipliers deflated so the tilt's and the output noise's sds (each its
        multiplier times a bound proportional to the design norm bound) are unchanged; the ridge
        as the product's."""
        inflated = feature_norm * self.OBJECTIVE_INFLATION
        scale = model.design_norm_bound(feature_norm) / model.design_norm_bound(inflated)
        return super().perturbed_mode(model, feature_norm=inflated, ridge=ridge, centre=centre,
                                      noise_multiplier=noise_multiplier * scale,
                                      output_multiplier=output_multiplier * scale)


@dataclass(frozen=True)
class NoScaleLayout(HistogramLayout):
    """Bug: the histogram counts are not divided by sqrt(number of columns) before the noise, so
    one record moves the noised vector by sqrt(K) (K columns) while the accountant is told 1."""

    @property
    def scale(self) -> float:
        return noise.count_vector_scale(1, self.num_bins)


def base_randomness(noise_path: NoisePath) -> PrivacyRandomness:
    if noise_path == "opendp":
        return SystemRandomness()
    if noise_path == "numpy":
        return NumpyGaussianRandomness()
    raise ValueError(f"unknown noise path {noise_path!r}; choose one of {', '.join(NOISE_PATHS)}")


def make_mechanism(
    points: torch.Tensor,
    *,
    inject: Injection = "none",
    noise_path: NoisePath = "opendp",
    blocks: Sequence[tuple[int, int]] | None = None,
    block_dim: int | None = None,
) -> PrivateRecords:
    """The product's :class:`PrivateRecords` over ``points`` with one injected bug (or none)."""
    if inject not in INJECTIONS:
        raise ValueError(f"unknown injection {inject!r}; choose one of {', '.join(INJECTIONS)}")
    rnd = base_randomness(noise_path)
    if inject == "half-noise":
        rnd = HalfNoiseRandomness(rnd)
    elif inject == "fixed-size":
        rnd = FixedSizeRandomness(rnd, blocks)
    elif inject == "fixed-seed":
        rnd = FixedSeedRandomness(rnd, block_dim)
    cls = NoClipRecords if inject == "no-clip" else PrivateRecords
    return cls(points, randomness=rnd)
