"""Privacy tests of the noise-aware mechanism (dpsummary.private.score_stats): sensitivity bound,
neighbouring replay with identical randomness, analytic noise scale, exact score sums."""

from __future__ import annotations

import math

import numpy as np
import pytest
import torch

from dpsummary.models import GaussianMean, LinearRegression, LogisticRegression, PoissonRegression
from dpsummary.private.mechanism import MechanismError, SystemRandomness
from dpsummary.private.score_stats import (
    noisy_score_statistics,
    symmetric_from_upper,
    upper_triangle,
)


class Recording:
    """Deterministic stand-in for OS entropy (replays neighbours); ``zero`` adds no noise."""

    def __init__(self, seed: int, zero: bool = False) -> None:
        self.rng = np.random.default_rng(seed)
        self.zero = zero
        self.inputs: list[np.ndarray] = []
        self.stds: list[float] = []

    def coins(self, num_records: int, sample_rate: float) -> np.ndarray:  # pragma: no cover - unused
        return self.rng.random(num_records) < sample_rate

    def gaussian(self, values, *, noise_std, clip_norm):
        self.inputs.append(np.array(values, copy=True))
        self.stds.append(noise_std)
        return values if self.zero else values + noise_std * self.rng.standard_normal(len(values))


def _data(model, n, seed=0, scale=3.0):
    g = torch.Generator().manual_seed(seed)
    x = (torch.rand(n, model.num_features, generator=g, dtype=torch.float64) * 2 - 1) * scale
    theta = torch.randn(model.param_dim, generator=g, dtype=torch.float64)
    return model.simulate(theta, n, g, features=x)


MODELS = [LogisticRegression(3), PoissonRegression(3), LinearRegression(3, noise_scale=1.0), GaussianMean(3)]


@pytest.mark.parametrize("model", MODELS, ids=lambda m: m.name)
def test_neighbours_differ_by_at_most_the_bounds(model):
    """Replay a data set and its neighbour without one (extreme) record, with zero noise: the
    released score sums differ by <= score_bound in L2, the curvature triangles by <=
    curvature_bound (clipping bites: the features lie outside the declared box)."""
    pts = _data(model, 300)
    theta = torch.full((model.param_dim,), 0.3, dtype=torch.float64)
    kw = dict(score_bound=0.7, curvature_bound=0.4, score_noise_multiplier=1.0, curvature_noise_multiplier=1.0)
    for drop in (0, 17, 299):
        a, b = Recording(0, zero=True), Recording(0, zero=True)
        noisy_score_statistics(pts, a, model, theta, **kw)
        noisy_score_statistics(torch.cat([pts[:drop], pts[drop + 1:]]), b, model, theta, **kw)
        assert np.linalg.norm(a.inputs[0] - b.inputs[0]) <= 0.7
        assert np.linalg.norm(a.inputs[1] - b.inputs[1]) <= 0.4 * (1 + 1e-12)
        assert np.linalg.norm(a.inputs[1] - b.inputs[1]) > 0.4 * 0.5  # the clip was active


def test_noise_scale_matches_analytic_values():
    """Noise std is noise_multiplier * bound for both releases (checked on 400 replays: the sample
    sd of 400 x d normal draws is within 10% of the truth with failure rate < 1e-9)."""
    model = LogisticRegression(2)
    pts = _data(model, 50)
    theta = torch.zeros(3, dtype=torch.float64)
    clean = Recording(0, zero=True)
    noisy_score_statistics(pts, clean, model, theta, score_bound=2.0, curvature_bound=1.5,
                           score_noise_multiplier=3.0, curvature_noise_multiplier=4.0)
    rnd = Recording(1)
    s_dev, c_dev = [], []
    for _ in range(400):
        st = noisy_score_statistics(pts, rnd, model, theta, score_bound=2.0, curvature_bound=1.5,
                                    score_noise_multiplier=3.0, curvature_noise_multiplier=4.0)
        s_dev.append(st.score.numpy() - clean.inputs[0])
        c_dev.append(upper_triangle(st.curvature).numpy() - clean.inputs[1])
    assert np.std(np.concatenate(s_dev)) == pytest.approx(6.0, rel=0.1)
    assert np.std(np.concatenate(c_dev)) == pytest.approx(6.0, rel=0.1)
    assert set(rnd.stds) == {6.0}


def test_system_randomness_and_exact_sums():
    """The product path (OpenDP noise from the OS) runs, and without noise the score sum equals
    the float sum of the clipped scores to within the fixed-point grid."""
    model = LogisticRegression(3)
    pts = _data(model, 1000, scale=0.5)
    theta = torch.zeros(4, dtype=torch.float64)
    st = noisy_score_statistics(pts, SystemRandomness(), model, theta, score_bound=2.0, curvature_bound=1.0,
                                score_noise_multiplier=5.0, curvature_noise_multiplier=5.0)
    assert st.score.shape == (4,) and torch.allclose(st.curvature, st.curvature.T)
    zero = Recording(0, zero=True)
    noisy_score_statistics(pts, zero, model, theta, score_bound=2.0, curvature_bound=1.0,
                           score_noise_multiplier=5.0, curvature_noise_multiplier=5.0)
    exact = model.record_scores(pts, theta).sum(0).numpy()  # |score| <= ||z|| < 2: no clipping
    assert np.allclose(zero.inputs[0], exact, atol=1000 * 2.0**-27)
    curv = symmetric_from_upper(torch.from_numpy(zero.inputs[1]), 4)
    assert torch.allclose(curv, model.record_curvatures(pts, theta).sum(0), atol=1e-9)


def test_invalid_parameters_refused():
    model = LogisticRegression(1)
    with pytest.raises(MechanismError):
        noisy_score_statistics(_data(model, 5), Recording(0), model, torch.zeros(2, dtype=torch.float64),
                               score_bound=math.inf, curvature_bound=1.0, score_noise_multiplier=1.0,
                               curvature_noise_multiplier=1.0)


@pytest.mark.parametrize("features", [1, 4, 19])
def test_glm_curvature_bound_is_the_released_triangles_and_never_clips_the_unit_box(features):
    """The curvature mechanism releases the upper triangle (diagonal included), so its sensitivity
    is that vector's norm: for a design row with coordinates in [-1, 1] it is at most
    ``rank_one_upper_bound`` (attained at a corner of the box, below the Frobenius norm r^2), so
    no record of the public box is clipped and a corner record moves the release by exactly it."""
    from dpsummary.private.kernel import upper_triangle_norm

    model = LogisticRegression(features)
    g = torch.Generator().manual_seed(features)
    x = torch.rand(400, features, generator=g, dtype=torch.float64) * 2 - 1
    x[0] = 1.0  # a corner of the box
    x[1, : features // 2 + 1] = -1.0  # one-hot-like mixes of corners and interior values
    z = model.design(x)
    r = model.design_norm_bound(math.sqrt(features))
    bound = model.rank_one_upper_bound(r)
    explicit = torch.stack([upper_triangle(torch.outer(row, row)).norm() for row in z])
    assert torch.allclose(upper_triangle_norm(torch.ones(400, dtype=torch.float64), z), explicit)
    assert float(explicit.max()) <= bound * (1 + 1e-12) and float(explicit[0]) == pytest.approx(bound)
    assert bound < r**2 and bound >= r**2 / math.sqrt(2)
    # Through the mechanism: at theta = 0 (weight 1/4) the corner record alone moves the released
    # triangle by its full bound (less the kernel's rounding and float margins, effective_clip).
    _, cb = model.statistic_bounds(torch.zeros(model.param_dim, dtype=torch.float64), feature_norm=math.sqrt(features),
                                   target_bound=1.0)
    pts = torch.cat([x, torch.ones(400, 1, dtype=torch.float64)], 1)
    kw = dict(score_bound=r, curvature_bound=cb, score_noise_multiplier=1.0, curvature_noise_multiplier=1.0)
    a, b = Recording(0, zero=True), Recording(0, zero=True)
    theta = torch.zeros(model.param_dim, dtype=torch.float64)
    noisy_score_statistics(pts, a, model, theta, **kw)
    noisy_score_statistics(pts[1:], b, model, theta, **kw)
    moved = np.linalg.norm(a.inputs[1] - b.inputs[1])
    assert cb * (1 - 1e-3) <= moved <= cb
