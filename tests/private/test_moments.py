"""Issue 51: linear regression's two releases, the moment matrix and the anchored residual vector
(dpsummary/private/moments.py)."""

from __future__ import annotations

import math

import numpy as np
import torch

from dpsummary.noise_aware import moment_bound, residual_bound, square_scale
from dpsummary.private import kernel
from dpsummary.private.moments import noisy_moment_matrix, noisy_residual_vector, release_moments


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


def _residual_rule(feature_norm: float = math.sqrt(3), clip: float = 0.3, rng: float = 2.0) -> dict[str, float]:
    scale = square_scale(feature_norm=feature_norm, residual_clip=clip, residual_range=rng)
    bound = residual_bound(feature_norm=feature_norm, residual_clip=clip, residual_range=rng, scale=scale)
    return {"bound": bound, "residual_clip": clip, "residual_range": rng, "square_scale": scale}


def test_anchored_release_is_the_clipped_residual_vector() -> None:
    pts = _points(200, seed=2)
    anchor = torch.tensor([0.1, 0.5, -0.5, 0.0], dtype=torch.float64)
    rule = _residual_rule()
    rnd = Recording()
    out = noisy_residual_vector(pts, rnd, noise_multiplier=1.5, anchor=anchor, **rule)
    w = torch.cat([torch.ones(200, 1, dtype=torch.float64), pts[:, :3]], 1)
    r = pts[:, 3] - w @ anchor
    want = torch.cat([w.T @ r.clamp(-0.3, 0.3), (r.clamp(-2, 2) ** 2).sum()[None] / rule["square_scale"]])
    torch.testing.assert_close(out.vector, want, atol=n_unit(200, rule["bound"]), rtol=0)
    assert rnd.calls == [(1.5 * rule["bound"], rule["bound"])] and out.noise_std == 1.5 * rule["bound"]


def test_anchored_release_noise_has_its_declared_sd() -> None:
    """The released vector minus the exact one is N(0, (noise_multiplier * bound)^2) per entry:
    over 400 seeded releases of 5 entries (2,000 draws) the sample sd is within 7% of the
    declared one (its relative sd is 1.6%: a 4.4-sd band, failure rate below 1e-5), means within
    4 sds of their standard error."""
    from dpsummary.private.mechanism import SystemRandomness

    class Seeded(SystemRandomness):
        def __init__(self) -> None:
            self._rng = np.random.default_rng(7)

        def gaussian(self, values, *, noise_std, clip_norm):
            v = np.asarray(values, dtype=np.float64)
            return v + noise_std * self._rng.standard_normal(v.shape)

    pts = _points(100, seed=3)
    anchor = torch.zeros(4, dtype=torch.float64)
    rule = _residual_rule()
    exact = noisy_residual_vector(pts, Recording(), noise_multiplier=1.0, anchor=anchor, **rule).vector
    rnd = Seeded()
    draws = torch.stack([noisy_residual_vector(pts, rnd, noise_multiplier=2.0, anchor=anchor, **rule).vector - exact
                         for _ in range(400)])
    declared = 2.0 * rule["bound"]
    assert abs(float(draws.std()) / declared - 1.0) < 0.07
    assert float(draws.mean(0).abs().max()) < 4 * declared / math.sqrt(400)


def test_one_record_moves_the_anchored_totals_by_at_most_the_bound() -> None:
    """The stated sensitivity sqrt((1 + F^2) c_r^2 + R^4 / s^2): a record at the public box's
    corner (every feature at +-1, the target at 1, a residual beyond both clips) moves the
    released vector by the bound itself up to the grid's rounding (so the bound is tight, not
    loose), and records far outside the box or with missing values by no more."""
    rule = _residual_rule()
    bound = rule["bound"]
    base = _points(300, seed=4)
    anchor = torch.tensor([-1.0, -0.5, 0.5, -0.5], dtype=torch.float64)
    without = kernel.finish(kernel.residual_partial(base, anchor=anchor, **rule), bound)
    corner = [1.0, -1.0, 1.0, 1.0]  # w = [1, 1, -1, 1], w . a = -2.5, r = 3.5: beyond c_r and R
    moves = []
    for extra in (corner, [50.0, -80.0, 3.0, 1e6], [float("nan"), 0.0, 0.0, 2.0], [0.0, 0.0, 0.0, float("inf")]):
        row = torch.tensor([extra], dtype=torch.float64)
        with_it = kernel.finish(kernel.residual_partial(torch.cat([base, row]), anchor=anchor, **rule), bound)
        moves.append(float(np.linalg.norm(with_it - without)))
    assert max(moves) <= bound
    assert moves[0] >= bound - math.sqrt(5) * n_unit(1, bound) - (bound - kernel.effective_clip(bound, 5))


def test_release_refuses_totals_of_the_wrong_size() -> None:
    import pytest

    from dpsummary.private.fixed_point import MechanismError

    with pytest.raises(MechanismError):
        release_moments(kernel.zero_partial(9), Recording(), 5, bound=1.0, noise_multiplier=1.0)
