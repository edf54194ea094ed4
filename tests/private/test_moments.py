"""Issue 51: linear regression's moment-matrix release (dpsummary/private/moments.py)."""

from __future__ import annotations

import math

import numpy as np
import torch

from dpsummary.noise_aware import moment_bound
from dpsummary.private import kernel
from dpsummary.private.moments import noisy_moment_matrix, release_moments


class Recording:
    """Randomness that adds no noise and remembers what it was asked."""

    def __init__(self) -> None:
        self.calls: list[tuple[float, float]] = []

    def gaussian(self, values, *, noise_std, clip_norm):
        self.calls.append((noise_std, clip_norm))
        return np.asarray(values, dtype=np.float64)


def n_unit(n: int, bound: float) -> float:
    """Rounding toward zero onto the public grid loses less than one unit per record and entry."""
    from dpsummary.private.fixed_point import fixed_point_unit

    return n * fixed_point_unit(bound)


def _points(n: int, seed: int = 0) -> torch.Tensor:
    g = torch.Generator().manual_seed(seed)
    return torch.rand(n, 4, generator=g, dtype=torch.float64) * 2 - 1  # 3 features and a target in [-1, 1]


def test_noise_free_release_is_the_moment_matrix_and_the_noise_is_declared() -> None:
    pts = _points(500)
    bound = moment_bound(feature_norm=math.sqrt(3), target_bound=1.0)
    rnd = Recording()
    out = noisy_moment_matrix(pts, rnd, bound=bound, noise_multiplier=2.0)
    z = torch.cat([torch.ones(500, 1, dtype=torch.float64), pts], 1)
    torch.testing.assert_close(out.matrix, z.T @ z, atol=n_unit(500, bound), rtol=0)  # grid rounding only
    assert rnd.calls == [(2.0 * bound, bound)] and out.noise_std == 2.0 * bound


def test_one_record_moves_the_exact_totals_by_at_most_the_bound() -> None:
    """Add/remove adjacency: the totals with and without a record (inside the box, and far
    outside it, where the clip bites) differ by at most moment_bound in L2."""
    bound = moment_bound(feature_norm=math.sqrt(3), target_bound=1.0)
    base = _points(300, seed=1)
    for extra in ([1.0, -1.0, 1.0, 1.0], [50.0, -80.0, 3.0, 1e6], [float("nan"), 0.0, 0.0, 2.0]):
        row = torch.tensor([extra], dtype=torch.float64)
        with_it = kernel.finish(kernel.moment_partial(torch.cat([base, row]), bound=bound), bound)
        without = kernel.finish(kernel.moment_partial(base, bound=bound), bound)
        assert float(np.linalg.norm(with_it - without)) <= bound


def test_anchored_release_uses_clipped_residuals() -> None:
    pts = _points(200, seed=2)
    anchor = torch.tensor([0.1, 0.5, -0.5, 0.0], dtype=torch.float64)
    bound = moment_bound(feature_norm=math.sqrt(3), target_bound=2.0)
    out = noisy_moment_matrix(pts, Recording(), bound=bound, noise_multiplier=1.0, anchor=anchor, residual_bound=0.3)
    z = torch.cat([torch.ones(200, 1, dtype=torch.float64), pts[:, :3]], 1)
    r = (pts[:, 3] - z @ anchor).clamp(-0.3, 0.3)
    full = torch.cat([z, r[:, None]], 1)
    torch.testing.assert_close(out.matrix, full.T @ full, atol=n_unit(200, bound), rtol=0)


def test_release_refuses_totals_of_the_wrong_size() -> None:
    import pytest

    from dpsummary.private.fixed_point import MechanismError

    with pytest.raises(MechanismError):
        release_moments(kernel.zero_partial(9), Recording(), 5, bound=1.0, noise_multiplier=1.0)
