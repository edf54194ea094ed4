"""DP initialisation histograms (``dpsummary.private.marginals``, ``dpsummary.postprocess.marginals``): public bins, sensitivity,
analytic noise scale, and the post-processing sampler.

Statistical tolerances: each randomised check states its failure probability under a correct
implementation (all below 1e-6).
"""

from __future__ import annotations

import math

import numpy as np
import pytest
import torch
from scipy import stats

from dpsummary.data import ColumnSpec, RawTable, Schema, Transform
from dpsummary.models import DTYPE
from dpsummary.postprocess.marginals import NoisyMarginals, layout_for
from dpsummary.private.marginals import NUM_INTERIOR_BINS
from dpsummary.private.mechanism import MechanismError, PrivateRecords
from dpsummary.private.noise import float_slack, rounding_slack


class RecordingRandomness:
    """Deterministic stand-in for OS entropy, to replay neighbouring data sets."""

    def __init__(self, seed: int) -> None:
        self.rng = np.random.default_rng(seed)
        self.inputs: list[np.ndarray] = []

    def coins(self, num_records: int, sample_rate: float) -> np.ndarray:
        return self.rng.random(num_records) < sample_rate

    def gaussian(self, values, *, noise_std, clip_norm):
        self.inputs.append(np.array(values, copy=True))
        return values + noise_std * self.rng.standard_normal(len(values))

SCHEMA = Schema(
    columns=[
        ColumnSpec(name="age", kind="numeric", lower=18, upper=90, integer=True),
        ColumnSpec(name="gain", kind="numeric", lower=0, upper=10_000),
        ColumnSpec(name="colour", kind="categorical", categories=["blue", "green", "red"]),
        ColumnSpec(name="y", kind="categorical", categories=["no", "yes"]),
    ],
    target="y",
)


def transform() -> Transform:
    return Transform.from_schema(SCHEMA, invalid_numeric="missing")


def points(n: int, seed: int = 0) -> torch.Tensor:
    rng = np.random.default_rng(seed)
    gain = np.where(rng.random(n) < 0.1, rng.uniform(0, 20_000, n), 0.0)  # zero-inflated, some clipped
    cols = {
        "age": [str(a) for a in rng.integers(18, 91, n)],
        "gain": [f"{g:.0f}" for g in gain],
        "colour": rng.choice(["blue", "green", "red", "", "purple"], n, p=[0.5, 0.3, 0.1, 0.05, 0.05]).tolist(),
        "y": rng.choice(["no", "yes"], n).tolist(),
    }
    return transform().to_points(RawTable(header=list(cols), columns=cols))


def test_layout_is_public_and_every_record_falls_in_one_bin_per_column():
    lay = layout_for(transform())
    assert [c.name for c in lay.columns] == ["age", "gain", "colour"]
    assert lay.touches == 3
    assert lay.num_bins == 2 * (NUM_INTERIOR_BINS + 2) + 4  # colour: 3 categories + "none"
    pts = points(2000)
    for col in lay.columns:
        bins = col.record_bins(pts)
        assert bins.shape == (2000,) and bins.min() >= 0 and bins.max() < col.num_bins
    counts = lay.counts(pts)
    assert all(part.sum() == 2000 for part in lay.split(counts))
    gain = lay.columns[1]
    # Zero gains sit exactly at the lower bound, clipped ones at the upper bound: point bins.
    assert lay.split(counts)[1][0] == pytest.approx(2000 * 0.9, rel=0.1)
    assert lay.split(counts)[1][-1] > 0
    assert gain.lower == pytest.approx(-1.0) and gain.upper == pytest.approx(1.0)
    # Missing and unseen colours land in the "none" bin.
    assert lay.split(counts)[2][-1] == pytest.approx(2000 * 0.1, rel=0.3)


@pytest.mark.parametrize("seed", range(5))
def test_adding_one_record_moves_the_scaled_counts_by_at_most_one(seed):
    lay = layout_for(transform())
    pts = points(500, seed)
    smaller, larger = pts[:-1], pts
    diff = (lay.counts(larger) - lay.counts(smaller)) * lay.scale
    # Exactly one unit per column: L2 distance (1 - slack) <= 1 (OpenDP's and the float64 slack).
    assert np.count_nonzero(diff) == lay.touches
    assert float(np.linalg.norm(diff)) == pytest.approx(1.0 - rounding_slack(1.0, lay.num_bins) - float_slack(1.0))
    assert float(np.linalg.norm(diff)) <= 1.0


def test_gray_box_replay_changes_the_noise_input_by_at_most_one():
    lay = layout_for(transform())
    pts = points(300, seed=3)
    a, b = RecordingRandomness(11), RecordingRandomness(11)
    PrivateRecords(pts[:-1], randomness=a).noisy_marginals(lay, noise_multiplier=2.0)
    PrivateRecords(pts, randomness=b).noisy_marginals(lay, noise_multiplier=2.0)
    assert len(a.inputs) == len(b.inputs) == 1
    assert float(np.linalg.norm(a.inputs[0] - b.inputs[0])) <= 1.0


def test_noise_has_the_analytic_scale():
    # Pure noise around known counts: residuals / (sigma / scale) are N(0, 1). With K = 200 x 24
    # values, the variance ratio is chi2(K)/K; accept within 6 sds (failure prob ~2e-9), and a
    # KS test at p > 1e-6.
    lay = layout_for(transform())
    pts = points(400, seed=5)
    raw = lay.counts(pts)
    sigma = 3.0
    std = sigma / lay.scale
    assert std == pytest.approx(sigma * math.sqrt(3) / (1 - rounding_slack(1.0, lay.num_bins) - float_slack(1.0)))
    res = np.stack([
        PrivateRecords(pts).noisy_marginals(lay, noise_multiplier=sigma).noisy_counts - raw for _ in range(200)
    ]) / std
    k = res.size
    assert abs(float((res**2).mean()) - 1) < 6 * math.sqrt(2 / k)
    assert abs(float(res.mean())) < 6 / math.sqrt(k)
    assert stats.kstest(res.ravel(), "norm").pvalue > 1e-6


def test_mechanism_refuses_a_layout_that_does_not_match():
    lay = layout_for(transform())
    with pytest.raises(MechanismError, match="does not match"):
        PrivateRecords(torch.zeros(10, 2, dtype=DTYPE)).noisy_marginals(lay, noise_multiplier=1.0)
    with pytest.raises(MechanismError, match="positive"):
        PrivateRecords(points(10)).noisy_marginals(lay, noise_multiplier=0.0)


def _marginals(counts: np.ndarray, sigma: float) -> NoisyMarginals:
    return NoisyMarginals(layout_for(transform()), counts, sigma)


def test_sampler_follows_the_surviving_mass_and_keeps_the_public_rest():
    tf = transform()
    lay = layout_for(tf)
    pts = points(20_000, seed=1)
    m = _marginals(lay.counts(pts), 0.01)  # noise negligible: thresholds near zero
    assert m.fallback_columns() == []
    draw = m.sampler(tf.sample_public_features)(50_000, torch.Generator().manual_seed(0))
    assert draw.shape == (50_000, tf.num_features)
    gain = draw[:, 1]
    # 90% of records have zero gain: about 90% of draws sit exactly at the lower bound
    # (binomial sd 0.0013; 6 sds plus the data's own deviation from 0.9).
    frac_zero = float((gain == -1.0).to(DTYPE).mean())
    data_zero = float((pts[:, 1] == -1.0).to(DTYPE).mean())
    assert abs(frac_zero - data_zero) < 6 * math.sqrt(0.09 / 50_000)
    assert float(draw[:, 0].min()) >= -1 and float(draw[:, 0].max()) <= 1
    colour = draw[:, 2:5]
    assert set(colour.sum(1).tolist()) <= {0.0, 1.0}
    assert float(colour[:, 0].mean()) == pytest.approx(float(pts[:, 2].mean()), abs=0.02)


def test_sampler_drops_noise_only_bins_and_falls_back_when_nothing_survives():
    tf = transform()
    lay = layout_for(tf)
    sigma = 50.0
    m = _marginals(np.zeros(lay.num_bins), sigma)
    # Threshold: z * s with z = Phi^-1(1 - 0.01 / num_bins).
    assert m.threshold == pytest.approx(stats.norm.isf(0.01 / lay.num_bins) * sigma / lay.scale)
    assert m.fallback_columns() == ["age", "gain", "colour"]
    assert "from the public box instead" in m.describe()
    counts = np.zeros(lay.num_bins)
    counts[lay.num_bins - 4] = 10 * m.threshold  # only colour = "blue" is far above the noise
    m2 = _marginals(counts, sigma)
    assert m2.fallback_columns() == ["age", "gain"]
    draw = m2.sampler(tf.sample_public_features)(1000, torch.Generator().manual_seed(0))
    assert bool((draw[:, 2] == 1).all())
    # The fallback columns come from the public sampler: uniform over the scaled bounds.
    assert abs(float(draw[:, 0].mean())) < 6 * math.sqrt(1 / 3 / 1000)


COUNT_SCHEMA = Schema(
    columns=[
        ColumnSpec(name="age", kind="numeric", lower=18, upper=90, integer=True),
        ColumnSpec(name="colour", kind="categorical", categories=["blue", "green", "red"]),
        ColumnSpec(name="rentals", kind="numeric", lower=0, upper=400, integer=True),
    ],
    target="rentals",
)


def count_points(n: int, seed: int = 0) -> tuple[Transform, torch.Tensor]:
    tf = Transform.from_schema(COUNT_SCHEMA, invalid_numeric="missing")
    rng = np.random.default_rng(seed)
    cols = {
        "age": [str(a) for a in rng.integers(18, 91, n)],
        "colour": rng.choice(["blue", "green", "red"], n).tolist(),
        "rentals": [str(v) for v in rng.poisson(25, n)],
    }
    return tf, tf.to_points(RawTable(header=list(cols), columns=cols))


def test_count_target_is_histogrammed_only_when_asked_and_keeps_sensitivity_one():
    tf, pts = count_points(50)
    plain = layout_for(tf)
    assert [c.name for c in plain.columns] == ["age", "colour"] and not any(c.target for c in plain.columns)
    lay = layout_for(tf, count_target=True)
    target = lay.columns[-1]
    assert target.target and target.name == "rentals" and target.kind == "numeric"
    assert (target.start, target.lower, target.upper) == (tf.num_features, 0.0, 400.0)
    assert lay.touches == 3 and lay.num_features == tf.point_dim
    # One more record moves the scaled counts by at most 1 (the accountant's sensitivity).
    diff = (lay.counts(pts) - lay.counts(pts[:-1])) * lay.scale
    assert float(np.linalg.norm(diff)) == pytest.approx(1.0 - rounding_slack(1.0, lay.num_bins) - float_slack(1.0))
    # Binary targets are never histogrammed (logistic regression keeps its simulated targets).
    assert not any(c.target for c in layout_for(transform(), count_target=True).columns)


def test_target_sampler_draws_the_targets_scale_and_features_ignore_it():
    tf, pts = count_points(20_000, seed=2)
    lay = layout_for(tf, count_target=True)
    m = NoisyMarginals(lay, lay.counts(pts), 0.01)
    draw = m.target_sampler()(50_000, torch.Generator().manual_seed(0))
    assert draw.shape == (50_000,) and float(draw.min()) >= 0 and float(draw.max()) <= 400
    # Poisson(25) counts fall in the interior bins [0, 50) and [50, 100): uniform within bins,
    # so the mean of the draws is about 25 (bin [0, 50) holds > 99.99% of the mass; its mean is
    # 25 +- 50 / sqrt(12 * 50_000), 6 sds = 0.39).
    assert abs(float(draw.mean()) - 25.0) < 0.5
    feats = m.sampler(tf.sample_public_features)(100, torch.Generator().manual_seed(0))
    assert feats.shape == (100, tf.num_features)
    # No surviving target bin: no target sampler (targets are then simulated).
    empty = NoisyMarginals(lay, np.zeros(lay.num_bins), 50.0)
    assert empty.target_sampler() is None and "rentals" in empty.fallback_columns()
    assert "targets simulated from the model instead" in empty.describe()
    assert "rentals" not in empty.describe().partition("public box instead")[2]
    assert "features and targets" in m.describe()


# ---- the count target's clip bound (dpsummary.postprocess.count_range) ------------------------
def _counts(n: int, seed: int) -> torch.Tensor:
    """Model-space points of a Poisson table: one feature, then the raw count."""
    rng = np.random.default_rng(seed)
    return torch.tensor(np.c_[rng.uniform(-1, 1, n), rng.poisson(5.0, n)], dtype=DTYPE)


def _neighbours_differ_by_at_most_one(lay, pts, *, touched):
    """Removing the last record changes ``touched`` coordinates of the count vector, and the
    scaled vector (the mechanism's input, as the mechanism sees it) by at most 1 in L2."""
    diff = (lay.counts(pts) - lay.counts(pts[:-1])) * lay.scale
    assert np.count_nonzero(diff) == touched and float(np.linalg.norm(diff)) <= 1.0
    a, b = RecordingRandomness(3), RecordingRandomness(3)
    PrivateRecords(pts[:-1], randomness=a).noisy_marginals(lay, noise_multiplier=2.0)
    PrivateRecords(pts, randomness=b).noisy_marginals(lay, noise_multiplier=2.0)
    assert float(np.linalg.norm(a.inputs[0] - b.inputs[0])) <= 1.0


def test_count_edges_are_the_public_grid_below_the_bound():
    from dpsummary.postprocess.count_range import count_edges

    assert count_edges(10_000) == (0.0, 1.0, 2.0, 5.0, 10.0, 20.0, 50.0, 100.0, 200.0, 500.0, 1000.0, 2000.0, 5000.0)
    assert count_edges(1.0) == (0.0,) and count_edges(7.0) == (0.0, 1.0, 2.0, 5.0)
    assert len(count_edges(1e9)) == 1 + 3 * 9
    with pytest.raises(ValueError, match="finite"):
        count_edges(float("inf"))
    with pytest.raises(ValueError, match="increasing"):
        from dpsummary.private.marginals import ColumnBins

        ColumnBins("y", "edges", 1, 1, edges=(0.0, 0.0))


@pytest.mark.parametrize("seed", range(3))
def test_count_histogram_puts_every_record_in_one_bin_and_has_sensitivity_one(seed):
    from dpsummary.postprocess.count_range import count_layout

    lay = count_layout(1, "y", 10_000)
    pts = _counts(500, seed)
    pts[0, 1] = float("nan")  # a value that is not a number still lands in exactly one bin
    bins = lay.columns[0].record_bins(pts)
    assert bins.min() >= 0 and bins.max() < lay.num_bins and lay.counts(pts).sum() == 500
    assert bins[0] == lay.num_bins - 1
    _neighbours_differ_by_at_most_one(lay, pts, touched=1)


def test_clip_bound_is_the_edge_of_the_noisy_quantile_bin_capped_at_the_schema():
    """Post-processing on given noisy counts: the bin holding the 99.9% quantile of the mass
    above the noise threshold gives its upper edge; nothing above the noise keeps the schema's
    bound; a quantile in the open top bin is the schema's bound."""
    from dpsummary.postprocess.count_range import clip_bound, count_layout

    lay = count_layout(1, "y", 10_000)  # 14 bins: (-inf, 0], (0, 1], (1, 2], (2, 5], (5, 10], ...
    sigma = 1e-3 * lay.scale  # raw noise sd 1e-3: the threshold is a few thousandths of a record
    counts = np.zeros(lay.num_bins)
    counts[[3, 4, 5]] = [5000.0, 4000.0, 9.0]  # (2, 5], (5, 10], (10, 20]: 9 of 9,009 above 10 is 0.1%
    clip = clip_bound(NoisyMarginals(lay, counts, sigma), 10_000)
    assert clip.surviving and clip.bound == 10.0 and clip.schema_bound == 10_000
    counts[5] = 20.0  # now more than 0.1% lie above 10
    assert clip_bound(NoisyMarginals(lay, counts, sigma), 10_000).bound == 20.0
    assert clip_bound(NoisyMarginals(lay, counts, sigma), 15.0).bound == 15.0  # capped at the schema
    top = np.zeros(lay.num_bins)
    top[-1] = 100.0  # all mass above the last edge
    assert clip_bound(NoisyMarginals(lay, top, sigma), 10_000).bound == 10_000
    none = clip_bound(NoisyMarginals(lay, np.full(lay.num_bins, -1.0), sigma), 10_000)
    assert not none.surviving and none.bound == 10_000 and "no bin" in none.note()


# ---- the features' norm clip bound (issue 37's thirteenth rule) -------------------------------
def test_norm_edges_halve_in_quarter_steps_below_the_bound():
    from dpsummary.postprocess.count_range import NORM_OCTAVES, NORM_STEPS, norm_edges

    edges = norm_edges(4.0)
    assert len(edges) == NORM_STEPS * NORM_OCTAVES
    assert edges[-1] == pytest.approx(4.0 * 2**-0.25) and edges[0] == pytest.approx(4.0 / 2**NORM_OCTAVES)
    assert np.allclose(np.diff(np.log2(edges)), 1.0 / NORM_STEPS)
    for bad in (0.0, -1.0, float("inf"), float("nan")):
        with pytest.raises(ValueError, match="positive and finite"):
            norm_edges(bad)


@pytest.mark.parametrize("seed", range(3))
def test_range_histogram_puts_every_record_in_one_bin_per_column_and_has_sensitivity_one(seed):
    """The feature norm's and the count's bins in one layout: a record in exactly one bin of each
    (K = 2), so neighbouring count vectors differ in two coordinates by one each, and the scaled
    difference (the mechanism's input) has L2 norm at most 1."""
    from dpsummary.postprocess.count_range import range_layout

    lay = range_layout(1, feature_bound=1.0, count=("y", 10_000))
    assert lay.touches == 2 and [c.kind for c in lay.columns] == ["norm", "edges"]
    pts = _counts(500, seed)
    pts[0, 0] = float("nan")  # a feature that is not a number still lands in exactly one bin
    norm_bins = lay.columns[0].record_bins(pts)
    assert norm_bins[0] == lay.columns[0].num_bins - 1
    expected = np.searchsorted(lay.columns[0].edges, np.abs(pts[1:, 0].numpy()), side="left")
    assert np.array_equal(norm_bins[1:], expected)
    assert [p.sum() for p in lay.split(lay.counts(pts))] == [500.0, 500.0]
    _neighbours_differ_by_at_most_one(lay, pts, touched=2)


def test_norm_bins_read_the_whole_feature_block():
    from dpsummary.postprocess.count_range import range_layout

    lay = range_layout(3, feature_bound=math.sqrt(3))
    assert lay.num_features == 3 and lay.touches == 1
    pts = torch.tensor([[0.0, 0.0, 0.0, 1.0], [1.0, 1.0, 1.0, 0.0], [0.3, -0.4, 0.0, 1.0]], dtype=DTYPE)
    bins = lay.columns[0].record_bins(pts)
    edges = np.asarray(lay.columns[0].edges)
    assert bins[0] == 0 and bins[1] == len(edges)  # the box's corner lies above the last edge
    assert edges[bins[2] - 1] < 0.5 <= edges[bins[2]]


def test_norm_clip_is_the_edge_of_the_noisy_quantile_bin_and_capped_at_the_box():
    from dpsummary.postprocess.count_range import norm_clip, range_layout

    lay = range_layout(2, feature_bound=2.0, count=("y", 100))
    norm_col, count_col = lay.columns
    sigma = 1e-3 * lay.scale
    counts = np.zeros(lay.num_bins)
    counts[norm_col.num_bins + 2] = 10_000.0  # every count in (1, 2]
    counts[[10, 11, 12]] = [5000.0, 4990.0, 10.0]  # 10 of 10,000 norms in bin 12: the 99.9% quantile in 11
    clip = norm_clip(NoisyMarginals(lay, counts, sigma), 2.0)
    assert clip.surviving and clip.bound == pytest.approx(norm_col.edges[11]) and clip.schema_bound == 2.0
    assert "clipped at L2 norm" in clip.note()
    counts[12] = 30.0  # now more than 0.1% lie in bin 12
    assert norm_clip(NoisyMarginals(lay, counts, sigma), 2.0).bound == pytest.approx(norm_col.edges[12])
    top = np.zeros(lay.num_bins)
    top[norm_col.num_bins - 1] = 100.0  # every norm in the top bin: the box's bound
    assert norm_clip(NoisyMarginals(lay, top, sigma), 2.0).bound == 2.0
    none = norm_clip(NoisyMarginals(lay, np.full(lay.num_bins, -1.0), sigma), 2.0)
    assert not none.surviving and none.bound == 2.0 and "no bin" in none.note()
    assert count_col.target
