"""Linear regression's mechanism: the noisy moment matrix of ``z = [1, x, y]`` (issue 51).

Every record contributes ``z_i z_i^T`` with ``z_i = [1, x_i, y_i]`` in model space (features
then the target); the upper triangle (diagonal included) of each is clipped to L2 norm ``bound``
(public: :meth:`~dpsummary.models.GLM.rank_one_upper_bound` of the public box's
``||z||^2 = 1 + feature_norm^2 + target_bound^2``, so a record in the box is never clipped),
summed exactly over ALL records (:func:`dpsummary.private.kernel.moment_partial`) and released
by ONE Gaussian mechanism with noise ``N(0, (noise_multiplier * bound)^2)`` per entry: adding or
removing one record moves the released vector by its own clipped upper triangle, so this is
``GaussianDpEvent(noise_multiplier)`` (add/remove adjacency). The released symmetric matrix holds
the noisy record count, ``X^T 1``, ``X^T X``, ``X^T y``, ``1^T y`` and ``y^T y``: the noisy
sufficient statistics of Bernstein and Sheldon (2019), which identify the coefficients AND the
noise scale. Their noise-aware posterior is post-processing (:mod:`dpsummary.noise_aware.linear`).

The anchored round of :mod:`dpsummary.mechanisms.noise_aware_linear` releases a VECTOR instead
(:func:`noisy_residual_vector`): per record ``u_i = [w_i clip(r_i, c_r), min(r_i^2, R^2) / s]``
with ``w_i = [1, x_i]``, ``r_i = y_i - w_i . a`` at a public anchor ``a``, ``c_r`` the public
residual clip, ``R`` the public residual range and ``s`` a public scale; the sum over ALL records
of ``u_i`` clipped to L2 norm ``bound`` (public, at least ``sqrt((1 + feature_norm^2) c_r^2 + R^4 /
s^2)``, so a record in the box is never clipped) plus ``N(0, (noise_multiplier * bound)^2)`` per
entry: ``GaussianDpEvent(noise_multiplier)``. It carries ``X^T r`` (clipped residuals) and the
residual sum of squares ``r^T r / s``; the design block ``X^T X`` is NOT in it (its sensitivity,
``||x||^2``, is what made the anchored moment matrix's noise on ``X^T r`` several times the
idealised floor's).

Privacy caveats: ``bound`` and ``noise_multiplier`` must be public; nothing about the records
leaves this module except the noisy matrix; noise from the caller's
:class:`~dpsummary.private.mechanism.PrivacyRandomness` (OS entropy in a release).
"""

from __future__ import annotations

from collections.abc import Iterable
from dataclasses import dataclass
from typing import TYPE_CHECKING, Any

import numpy as np
import torch

from .score_stats import _check_positive, symmetric_from_upper

if TYPE_CHECKING:
    from .randomness import PrivacyRandomness
    from .store import RecordStore


@dataclass(frozen=True)
class NoisyMoments:
    """The DP output: the noisy symmetric ``sum z z^T`` (D, D) and its per-entry noise sd."""

    matrix: torch.Tensor
    noise_std: float


def noisy_moment_matrix(points: torch.Tensor | np.ndarray | RecordStore, randomness: PrivacyRandomness, *,
                        bound: float, noise_multiplier: float) -> NoisyMoments:
    """Release the clipped moment matrix of ``points`` (see the module docstring): the first
    round of :mod:`dpsummary.mechanisms.noise_aware_linear`."""
    from . import kernel
    from .store import RecordStore

    _check_positive(bound=bound, noise_multiplier=noise_multiplier)
    if isinstance(points, RecordStore):
        chunks: Iterable[np.ndarray] = points.chunks()
        dim = points.dim + 1
    else:
        arr = points.detach().numpy() if isinstance(points, torch.Tensor) else np.asarray(points)
        chunks = [np.ascontiguousarray(arr, dtype=np.float64)]
        dim = arr.shape[1] + 1
    total = kernel.zero_partial(dim * (dim + 1) // 2)
    for chunk in chunks:
        total = kernel.combine(total, kernel.moment_partial(chunk, bound=bound))
    return release_moments(total, randomness, dim, bound=bound, noise_multiplier=noise_multiplier)


def release_moments(total: Any, randomness: PrivacyRandomness, dim: int, *, bound: float,
                    noise_multiplier: float) -> NoisyMoments:
    """The Gaussian release from the EXACT integer totals (any engine's
    :func:`~dpsummary.private.kernel.moment_partial` sums): the one place this mechanism adds
    noise; the totals never leave it."""
    from . import kernel
    from .fixed_point import MechanismError

    _check_positive(bound=bound, noise_multiplier=noise_multiplier)
    if len(total) != dim * (dim + 1) // 2:
        raise MechanismError("totals do not match the moment matrix's dimension")
    tri = kernel.finish(total, bound)
    std = noise_multiplier * bound
    noisy = randomness.gaussian(tri, noise_std=std, clip_norm=bound)
    return NoisyMoments(symmetric_from_upper(torch.from_numpy(np.asarray(noisy, dtype=np.float64)), dim), float(std))


@dataclass(frozen=True)
class NoisyResiduals:
    """The DP output of the anchored round: the noisy ``sum_i u_i`` (d + 1,) (see the module
    docstring) and its per-entry noise sd."""

    vector: torch.Tensor
    noise_std: float


def noisy_residual_vector(points: torch.Tensor | np.ndarray | RecordStore, randomness: PrivacyRandomness, *,
                          bound: float, noise_multiplier: float, anchor: torch.Tensor, residual_clip: float,
                          residual_range: float, square_scale: float) -> NoisyResiduals:
    """Release the anchored round's clipped residual vector of ``points`` (module docstring);
    the per-record rule is :func:`dpsummary.private.kernel.residual_partial`."""
    from . import kernel
    from .store import RecordStore

    _check_positive(bound=bound, noise_multiplier=noise_multiplier)
    if isinstance(points, RecordStore):
        chunks: Iterable[np.ndarray] = points.chunks()
        dim = points.dim
    else:
        arr = points.detach().numpy() if isinstance(points, torch.Tensor) else np.asarray(points)
        chunks = [np.ascontiguousarray(arr, dtype=np.float64)]
        dim = arr.shape[1]
    total = kernel.zero_partial(dim + 1)
    for chunk in chunks:
        total = kernel.combine(total, kernel.residual_partial(
            chunk, bound=bound, anchor=anchor, residual_clip=residual_clip, residual_range=residual_range,
            square_scale=square_scale))
    return release_residuals(total, randomness, dim + 1, bound=bound, noise_multiplier=noise_multiplier)


def release_residuals(total: Any, randomness: PrivacyRandomness, dim: int, *, bound: float,
                      noise_multiplier: float) -> NoisyResiduals:
    """The Gaussian release of the anchored round from the EXACT integer totals (any engine's
    :func:`~dpsummary.private.kernel.residual_partial` sums): the one place it adds noise."""
    from . import kernel
    from .fixed_point import MechanismError

    _check_positive(bound=bound, noise_multiplier=noise_multiplier)
    if len(total) != dim:
        raise MechanismError("totals do not match the residual vector's dimension")
    std = noise_multiplier * bound
    noisy = randomness.gaussian(kernel.finish(total, bound), noise_std=std, clip_norm=bound)
    return NoisyResiduals(torch.from_numpy(np.asarray(noisy, dtype=np.float64)), float(std))
