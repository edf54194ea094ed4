"""Privacy and contract tests of the noisy kd-tree mixture summary
(``dpsummary.mixtures.dp_summary.release_mixture_summary``)."""

from __future__ import annotations

import dp_accounting as dpa
import numpy as np
import pytest

from dpsummary.accounting import epsilon
from dpsummary.mixtures.dp_summary import fit_release, release_mixture_summary
from dpsummary.mixtures.kdtree import TreePlan, plan_tree, tree_pseudo_points
from dpsummary.private.mechanism import PrivateRecords, SystemRandomness
from dpsummary.private.mixture import cell_codes, noisy_tree, release_counts
from dpsummary.private.noise import count_vector_scale


class Recording:
    """No noise; records every vector the mechanism would noise (NON-PRIVATE test double)."""

    def __init__(self) -> None:
        self.released: list[np.ndarray] = []

    def gaussian(self, values: np.ndarray, *, noise_std: float, clip_norm: float) -> np.ndarray:
        assert clip_norm == 1.0
        self.released.append(np.array(values, dtype=np.float64))
        return np.asarray(values, dtype=np.float64)

    def coins(self, num_records: int, sample_rate: float) -> np.ndarray:  # pragma: no cover - unused
        raise AssertionError("the tree samples nothing")

    def sample_indices(self, num_records: int, sample_rate: float) -> np.ndarray:  # pragma: no cover
        raise AssertionError("the tree samples nothing")


class Replay(Recording):
    """Returns the noisy outputs of an earlier run whatever it is given (the coupling of the
    neighbouring run's noise), and records the exact vectors it was given."""

    def __init__(self, outputs: list[np.ndarray]) -> None:
        super().__init__()
        self.outputs = outputs

    def gaussian(self, values: np.ndarray, *, noise_std: float, clip_norm: float) -> np.ndarray:
        super().gaussian(values, noise_std=noise_std, clip_norm=clip_norm)
        out = self.outputs[len(self.released) - 1]
        assert out.shape == np.shape(values)  # same released nodes: decisions used noisy values only
        return out


def _standardised(blobs: np.ndarray) -> np.ndarray:
    return (blobs - blobs.mean(0)) / blobs.std(0)


def _plan(sigma: float = 2.0, leaf_moments: bool = False) -> TreePlan:
    return TreePlan(dim=2, bound=4.0, max_depth=10, noise_multiplier=sigma, leaf_moments=leaf_moments)


@pytest.mark.parametrize("leaf_moments", [False, True])
@pytest.mark.parametrize("extreme", [
    np.array([4.0, 4.0]), np.array([-4.0, 3.9]), np.array([1e6, -1e6]), np.array([np.nan, 0.0]),
    np.array([np.inf, 1.0]), np.array([0.0, 0.0]),
])
def test_neighbours_differ_by_at_most_one_per_level_and_output_depends_on_noisy_values_only(
    blobs: np.ndarray, extreme: np.ndarray, leaf_moments: bool
) -> None:
    """Add/remove one extreme record (corner, far outside the box, NaN, inf, the centre): with the
    neighbour's noise coupled to give the same noisy outputs, every released exact count vector
    differs by at most 1 in L2 (one entry by exactly 1, or none), the optional moments vector by
    at most 1 in L2 within one leaf's 2D entries, and the released pseudo-points are IDENTICAL
    (the split/keep decisions read only noisy counts)."""
    x = _standardised(blobs)
    plan = _plan(leaf_moments=leaf_moments)
    rec = Recording()
    a = release_mixture_summary(PrivateRecords(x, randomness=rec), plan=plan)
    for neighbour in (np.vstack([x, extreme]), x[1:]):
        replay = Replay([np.array(v) for v in rec.released])
        b = release_mixture_summary(PrivateRecords(neighbour, randomness=replay), plan=plan)
        assert len(replay.released) == len(rec.released)
        assert len(rec.released) == plan.max_depth + 1 + int(leaf_moments)  # every depth released here
        for i, (u, v) in enumerate(zip(rec.released, replay.released, strict=True)):
            diff = np.abs(u - v)
            assert np.linalg.norm(diff) <= 1.0 + 1e-12
            if leaf_moments and i == len(rec.released) - 1:  # per-leaf blocks of 2D sums
                assert np.count_nonzero(diff.reshape(-1, 2 * plan.dim).any(1)) <= 1
            else:
                assert np.count_nonzero(diff) <= 1
        np.testing.assert_array_equal(a.points, b.points)
        np.testing.assert_array_equal(a.weights, b.weights)


def test_noiseless_tree_keeps_the_mass_and_the_mean(blobs: np.ndarray) -> None:
    """Without noise (and a low threshold) every record lands in a kept leaf: the pseudo-points'
    total weight is N and their weighted mean is within a leaf width of the data mean; the
    released count vectors sum to N at every fully expanded depth."""
    x = _standardised(blobs)
    plan = TreePlan(dim=2, bound=4.0, max_depth=10, noise_multiplier=1.0, split_threshold=20.0, keep_threshold=0.5)
    rec = Recording()
    tree = noisy_tree(PrivateRecords(x, randomness=rec), plan)
    pts, w = tree_pseudo_points(tree)
    assert float(w.sum()) == pytest.approx(x.shape[0])
    # The root holds every record (all inside the box); released values are counts x the count
    # scale (OpenDP's rounding slack and issue 35's float slack: about 1 - 4.9e-4).
    assert float(rec.released[0][0]) == pytest.approx(x.shape[0] * count_vector_scale(1, 1), rel=1e-12)
    np.testing.assert_allclose(w @ pts / w.sum(), x.mean(0), atol=2 * 8.0 / 32)


def test_total_per_record_function() -> None:
    """NaN/inf rows fall in no cell (codes -1), finite out-of-box coordinates are clipped into
    the edge cells, and the release runs on such records."""
    plan = _plan()
    x = np.array([[np.nan, 0.0], [np.inf, 0.0], [-1e9, 1e9], [3.999, -4.0], [0.0, 0.0]])
    codes = cell_codes(x, plan)
    assert (codes[:2] == -1).all()
    cells = 1 << plan.splits(plan.max_depth)
    assert codes[2].tolist() == [0, cells[1] - 1] and codes[3].tolist() == [cells[0] - 1, 0]
    rec = Recording()
    noisy_tree(PrivateRecords(x, randomness=rec), plan)
    # The two non-finite rows are not counted (released: count x the count scale).
    assert rec.released[0][0] == pytest.approx(3.0 * count_vector_scale(1, 1), rel=1e-12)


def test_accountant_event_reproduces_epsilon() -> None:
    for d, eps, moments in ((2, 1.0, False), (5, 0.5, False), (6, 4.0, False), (5, 1.0, True)):
        plan = plan_tree(d, epsilon=eps, delta=1e-6, leaf_moments=moments)
        assert plan.max_depth == min(6 * d, 36)
        event = plan.event()
        assert event == dpa.SelfComposedDpEvent(dpa.GaussianDpEvent(plan.noise_multiplier),
                                                plan.max_depth + 1 + int(moments))
        spent = epsilon([event], 1e-6)
        assert eps * 0.995 <= spent <= eps, (d, eps, spent)


def test_one_gaussian_call_per_depth_at_most(blobs: np.ndarray) -> None:
    rec = Recording()
    plan = _plan()
    noisy_tree(PrivateRecords(_standardised(blobs), randomness=rec), plan)
    assert 1 <= len(rec.released) <= plan.releases


def test_noise_sd_matches_the_analytic_value() -> None:
    """Real OpenDP noise (OS entropy, not seedable) on 20,000 zero counts at sigma = 3: the sample
    sd is within 5 standard errors (se = sigma / sqrt(2 n), 0.5%) of sigma / scale and the mean
    within 5 se (sigma / sqrt(n)) of 0. Failure rate if the noise is right: ~1e-6 per check."""
    n, sigma = 20_000, 3.0
    noisy = release_counts(SystemRandomness(), np.zeros(n), sigma)
    sd = float(noisy.std(ddof=1))
    assert abs(sd - sigma) < 5 * sigma / np.sqrt(2 * n), sd
    assert abs(float(noisy.mean())) < 5 * sigma / np.sqrt(n)


def test_fit_release_recovers_the_small_blob(blobs: np.ndarray) -> None:
    """Noiseless utility check (NON-PRIVATE): weighted CAVI on the tree's pseudo-points finds a
    component near the small blob (40 of 540 points, mean (0, 7) in raw units)."""
    from dpsummary.mixtures import MixturePrior

    x = _standardised(blobs)
    plan = TreePlan(dim=2, bound=4.0, max_depth=12, noise_multiplier=1.0, split_threshold=5.0, keep_threshold=0.5)
    release = release_mixture_summary(PrivateRecords(x, randomness=Recording()), plan=plan)
    prior = MixturePrior("dirichlet_process", 5, 0.2, 1.0, np.zeros(2), 2.0, 0.01 * np.eye(2))
    post = fit_release(release, prior, np.random.default_rng(0))
    target = (np.array([0.0, 7.0]) - blobs.mean(0)) / blobs.std(0)
    heavy = post.expected_weights() > 0.03
    assert np.min(np.linalg.norm(post.means[heavy] - target, axis=1)) < 0.25


def test_noiseless_leaf_moments_are_the_leaf_means(blobs: np.ndarray) -> None:
    """Without noise the moments release gives every kept leaf the exact mean of its records
    (up to the 2^-28 fixed-point grid): the pseudo-points' weighted mean equals the data mean."""
    x = _standardised(blobs)
    plan = TreePlan(dim=2, bound=4.0, max_depth=10, noise_multiplier=1.0, split_threshold=20.0,
                    keep_threshold=0.5, leaf_moments=True)
    release = release_mixture_summary(PrivateRecords(x, randomness=Recording()), plan=plan)
    assert float(release.weights.sum()) == pytest.approx(x.shape[0])
    np.testing.assert_allclose(release.weights @ release.points / release.weights.sum(), x.mean(0), atol=1e-6)
