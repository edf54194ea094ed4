"""``noise-aware-cells``' mechanism (dpsummary/private/cells.py): the per-record cell rule, the
exact statistics, the sensitivity of the one released vector and its noise's scale."""

from __future__ import annotations

import math

import numpy as np
import pytest

from dpsummary.cells.domain import CellDomain
from dpsummary.private.cells import cell_indices
from dpsummary.private.fixed_point import fixed_point_unit
from dpsummary.private.mechanism import PrivateRecords

#: A numeric column with levels -1, 0, 1 and a categorical one with two categories and the zero level.
DOMAIN = CellDomain(("a", "c"), (((-1.0,), (0.0,), (1.0,)), ((1.0, 0.0), (0.0, 1.0), (0.0, 0.0))))


def _design() -> np.ndarray:
    feats = DOMAIN.features()
    return np.concatenate([np.ones((feats.shape[0], 1)), feats], axis=1)


def _records(n: int, seed: int) -> np.ndarray:
    rng = np.random.default_rng(seed)
    a = rng.choice([-1.0, 0.0, 1.0], n)
    c = np.zeros((n, 2))
    k = rng.integers(0, 3, n)
    c[k == 0, 0] = 1.0
    c[k == 1, 1] = 1.0
    y = (rng.random(n) < 0.4).astype(float)
    return np.column_stack([a, c, y])


class Recording:
    """Returns the exact vector (noise 0) or adds seeded Gaussian noise; records what it was given."""

    def __init__(self, seed: int | None = None) -> None:
        self.rng = None if seed is None else np.random.default_rng(seed)
        self.given: list[tuple[np.ndarray, float, float]] = []

    def gaussian(self, values: np.ndarray, *, noise_std: float, clip_norm: float) -> np.ndarray:
        values = np.array(values, dtype=np.float64)
        self.given.append((values, noise_std, clip_norm))
        return values if self.rng is None else values + noise_std * self.rng.standard_normal(values.shape)


def test_every_record_gets_the_nearest_level_of_each_column() -> None:
    rows = np.array([[0.4, 1.0, 0.0], [0.6, 0.0, 1.0], [-7.0, 0.0, 0.0], [0.5, 0.0, 0.0], [np.nan, 0.2, 0.1]])
    idx = cell_indices(rows, DOMAIN)
    # cell = 3 * level(a) + level(c); a 0.5 is a tie between 0 and 1: the first listed (0) wins;
    # a non-finite coordinate counts as 0; (0.2, 0.1) is nearest the zero level.
    np.testing.assert_array_equal(idx, [3 * 1 + 0, 3 * 2 + 1, 3 * 0 + 2, 3 * 1 + 2, 3 * 1 + 2])


def test_without_noise_the_release_is_the_exact_counts_and_statistic() -> None:
    rows = _records(500, seed=1)
    rec = Recording()
    out = PrivateRecords(rows, randomness=rec).noisy_cell_statistics(DOMAIN, _design(), target_bound=1.0,
                                                                     count_share=0.3, noise_multiplier=2.0)
    idx = cell_indices(rows[:, :-1], DOMAIN)
    np.testing.assert_allclose(out.counts, np.bincount(idx, minlength=9), rtol=0, atol=1e-9)
    exact_t = _design()[idx].T @ rows[:, -1]
    # Each record's T row is rounded toward zero on the public grid (one unit per coordinate in
    # unit space, i.e. unit / b in T's units): the exact-sum rule's documented cost.
    radius = float(np.sqrt((_design() ** 2).sum(1)).max())
    per_record = fixed_point_unit(1.0) * radius / math.sqrt(0.7) * 1.01
    assert np.all(out.statistic <= exact_t + 1e-12)
    np.testing.assert_allclose(out.statistic, exact_t, rtol=0, atol=rows.shape[0] * per_record)
    (values, std, clip), = rec.given
    assert clip == 1.0 and std == 2.0 and values.shape == (9 + 4,)


def test_the_noise_multipliers_are_the_analytic_ones() -> None:
    """counts at sigma / sqrt(f), T at R sigma / sqrt(1 - f), up to the kernel's tiny clip slack."""
    sigma, f = 1.7, 0.3
    radius = float(np.sqrt((_design() ** 2).sum(1)).max())
    out = PrivateRecords(_records(50, seed=2), randomness=Recording()).noisy_cell_statistics(
        DOMAIN, _design(), target_bound=1.0, count_share=f, noise_multiplier=sigma)
    assert out.counts_noise_std == pytest.approx(sigma / math.sqrt(f), rel=1e-3)
    assert out.statistic_noise_std == pytest.approx(radius * sigma / math.sqrt(1 - f), rel=1e-3)
    assert out.counts_noise_std >= sigma / math.sqrt(f)  # the slack only ever adds noise


def test_the_empirical_noise_matches_the_declared_scale() -> None:
    """400 seeded releases: the sample sd of the counts' and T's errors is within 10% of the declared
    sd (for 400 x 9 and 400 x 4 Gaussian draws the relative sd of the sample sd is about 1.2% and
    1.8%: failure rate far below 1e-9)."""
    rows = _records(200, seed=3)
    rec = Recording(seed=4)
    exact = PrivateRecords(rows, randomness=Recording()).noisy_cell_statistics(
        DOMAIN, _design(), target_bound=1.0, count_share=0.3, noise_multiplier=1.0)
    errs_n, errs_t = [], []
    for _ in range(400):
        out = PrivateRecords(rows, randomness=rec).noisy_cell_statistics(DOMAIN, _design(), target_bound=1.0,
                                                                         count_share=0.3, noise_multiplier=1.0)
        errs_n.append(out.counts - exact.counts)
        errs_t.append(out.statistic - exact.statistic)
    assert np.std(errs_n) == pytest.approx(out.counts_noise_std, rel=0.1)
    assert np.std(errs_t) == pytest.approx(out.statistic_noise_std, rel=0.1)


@pytest.mark.parametrize("extra", [[1.0, 0.0, 1.0, 1.0], [0.3, 0.0, 0.0, 1.0], [1e6, 5.0, -3.0, 50.0],
                                   [0.0, 0.0, 0.0, np.nan]])
def test_one_record_moves_the_released_vector_by_at_most_one(extra: list[float]) -> None:
    """Add/remove one record (even an extreme one, clipped by the per-record rule): the vector
    handed to the noise moves by at most its declared sensitivity 1."""
    rows = _records(300, seed=5)
    a, b = Recording(), Recording()
    for recs, rec in ((rows, a), (np.vstack([rows, extra]), b)):
        PrivateRecords(recs, randomness=rec).noisy_cell_statistics(DOMAIN, _design(), target_bound=1.0,
                                                                   count_share=0.3, noise_multiplier=1.0)
    move = float(np.linalg.norm(b.given[0][0] - a.given[0][0]))
    assert 0.0 < move <= 1.0
