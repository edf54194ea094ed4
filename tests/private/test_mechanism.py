"""The DP-PSVI mechanism as the accountant assumes it (issue: the private release).

Statistical tolerances: every randomised check below uses a bound whose failure probability
under a correct implementation is stated next to it (all below 1e-6 unless noted).
"""

from __future__ import annotations

import math

import numpy as np
import pytest
import torch
from scipy import stats

from dpsummary.models import DTYPE, LogisticRegression, PoissonRegression
from dpsummary.private import noise
from dpsummary.private.mechanism import PrivateRecords, clip_rows


class RecordingRandomness:
    """Deterministic stand-in for OS entropy, used only to replay neighbouring data sets."""

    def __init__(self, seed: int, zero_noise: bool = False) -> None:
        self.rng = np.random.default_rng(seed)
        self.zero_noise = zero_noise
        self.inputs: list[np.ndarray] = []
        self.masks: list[np.ndarray] = []
        self.forced_extra: bool | None = None

    def coins(self, num_records: int, sample_rate: float) -> np.ndarray:
        mask = self.rng.random(num_records) < sample_rate
        self.masks.append(mask)
        return mask

    def gaussian(self, values, *, noise_std, clip_norm):
        self.inputs.append(np.array(values, copy=True))
        z = self.rng.standard_normal(len(values))
        return values + (0 if self.zero_noise else noise_std) * z


def _data(n: int, seed: int = 0, d: int = 4) -> tuple[LogisticRegression, torch.Tensor, torch.Tensor]:
    g = torch.Generator().manual_seed(seed)
    model = LogisticRegression(d)
    theta = model.sample_prior(1, g)[0]
    points = model.simulate(theta, n, g)
    draws = model.sample_prior(30, g)
    return model, points, draws


def test_clip_rows_bounds_every_norm_and_zeroes_nonfinite():
    g = torch.Generator().manual_seed(1)
    v = torch.randn(500, 20, generator=g, dtype=DTYPE) * torch.logspace(-3, 3, 500, dtype=DTYPE)[:, None]
    v[7, 3] = float("inf")
    v[8, 0] = float("nan")
    c = clip_rows(v, 1.5)
    norms = c.norm(dim=1)
    assert bool((norms <= 1.5 * (1 + 1e-12)).all())
    assert float(norms[7]) == 0.0 and float(norms[8]) == 0.0
    small = v.norm(dim=1) < 1.5
    small[7] = small[8] = False
    assert torch.allclose(c[small], v[small])


def test_clipping_bounds_each_records_contribution():
    # Replay D and D + one extreme record with identical randomness and zero noise: the noisy-sum
    # input moves by at most C whatever the added record is (an outlier, soft label, huge counts).
    model = PoissonRegression(3)
    g = torch.Generator().manual_seed(3)
    theta = model.sample_prior(1, g)[0]
    points = model.simulate(theta, 300, g)
    draws = model.sample_prior(25, g)
    for extra in ([50.0, -40.0, 30.0, 1e4], [0.0, 0.0, 0.0, 0.0], [1e3, 1e3, 1e3, 0.5]):
        rec = torch.tensor([extra], dtype=DTYPE)
        outs = []
        for data in (points, torch.cat([points, rec])):
            rnd = RecordingRandomness(seed=11, zero_noise=True)
            # the same coins for the shared records, the extra record always included
            base = rnd.coins

            def coins(n, q, base=base):
                m = base(300, q)
                return np.concatenate([m, [True] * (n - 300)])

            rnd.coins = coins  # type: ignore[method-assign]
            PrivateRecords(data, randomness=rnd).noisy_clipped_sum(
                model, draws, sample_rate=0.5, clip_norm=2.0, noise_multiplier=1.0
            )
            outs.append(rnd.inputs[0])
        assert np.linalg.norm(outs[1] - outs[0]) <= 2.0 + 1e-9


def test_gray_box_replay_neighbours_same_control_flow():
    # One record added, identical non-private and privacy randomness: same number of calls,
    # same shapes, and the pre-noise sum moves by at most C at every step.
    from dpsummary.constructors import fit
    from dpsummary.constructors.dppsvi import DPPSVI

    model, points, _ = _data(400, seed=5)
    canary = torch.tensor([[3.0, -3.0, 3.0, -3.0, 1.0]], dtype=DTYPE)
    runs = []
    for data in (points, torch.cat([points, canary])):
        rnd = RecordingRandomness(seed=2)
        base = rnd.coins

        def coins(n, q, base=base):
            return np.concatenate([base(400, q), [True] * (n - 400)])

        rnd.coins = coins  # type: ignore[method-assign]
        clips: list[float] = []

        class Recording(DPPSVI):
            def clip_norm(self, model, state, theta, clips=clips):
                c = super().clip_norm(model, state, theta)
                clips.append(c)
                return c

        constructor = Recording(noise_multiplier=1.0, sample_rate=noise.quantize_sample_rate(0.25),
                                record_count=400.0, steps=8, num_samples=20)
        fit(constructor, PrivateRecords(data, randomness=rnd), model, 5, generator=torch.Generator().manual_seed(9))
        runs.append((rnd.inputs, clips))
    (in0, c0), (in1, c1) = runs
    assert len(in0) == len(in1) == 8
    # The first step sees identical public state; afterwards the trajectories differ (post-processing
    # of different noisy outputs), so compare the per-step sensitivity with that step's own C.
    assert c0[0] == c1[0]
    # The mechanism releases the sum in units of the step's C (each record clip(v / C, 1)):
    # neighbouring pre-noise inputs differ by at most 1 in those units, i.e. by C.
    assert np.linalg.norm(in1[0] - in0[0]) <= 1.0 + 1e-12
    assert np.linalg.norm(in1[0] - in0[0]) > 0.5  # the canary is clipped: it moves the sum by ~1
    for a, b in zip(in0, in1, strict=True):
        assert a.shape == b.shape


def test_batch_size_is_binomial():
    # Realised batch sizes over many calls follow Binomial(N, q): chi-square goodness of fit on
    # binned counts (p-value threshold 1e-6, so a correct sampler fails with probability 1e-6).
    n, q, calls = 1000, noise.quantize_sample_rate(0.03), 4000
    sizes = np.array([int(noise.poisson_mask(n, q).sum()) for _ in range(calls)])
    edges = np.array([-0.5, 19.5, 23.5, 26.5, 29.5, 32.5, 35.5, 39.5, n + 0.5])
    observed = np.histogram(sizes, bins=edges)[0]
    cdf = stats.binom.cdf(np.floor(edges[1:]), n, q) - stats.binom.cdf(np.floor(edges[:-1]), n, q)
    expected = calls * cdf
    chi2 = float(((observed - expected) ** 2 / expected).sum())
    assert stats.chi2.sf(chi2, len(expected) - 1) > 1e-6
    # And the mean matches exactly the quantised rate: |z| < 5 (failure probability < 6e-7).
    z = (sizes.mean() - n * q) / math.sqrt(n * q * (1 - q) / calls)
    assert abs(z) < 5


def test_sample_rate_quantisation_is_exact():
    q = noise.quantize_sample_rate(0.1)
    assert q <= 0.1 and (q * 2**32).is_integer()
    with pytest.raises(ValueError):
        noise.poisson_mask(10, 0.1 + 1e-12)


def test_noise_has_analytic_scale():
    # Zero every record's vector: the released sum is pure noise with std sigma * C. With K draws
    # of dimension S, the sample variance ratio is chi2(K S)/(K S); accept within 6 standard
    # deviations of that distribution (failure probability ~2e-9).
    _, points, _ = _data(50, seed=7)
    constant = torch.zeros_like(points)
    draws = torch.randn(30, 4, generator=torch.Generator().manual_seed(1), dtype=DTYPE)
    const_model = LogisticRegression(4, intercept=False)
    records = PrivateRecords(constant)
    # With zero features and labels the log-likelihood is -log 2 for every draw: centred vectors are 0.
    sigma, clip = 1.7, 0.8
    vals = torch.stack([
        records.noisy_clipped_sum(const_model, draws, sample_rate=0.5, clip_norm=clip, noise_multiplier=sigma)
        for _ in range(200)
    ])
    k = vals.numel()
    ratio = float((vals**2).mean()) / (sigma * clip) ** 2
    assert abs(ratio - 1) < 6 * math.sqrt(2 / k)
    assert abs(float(vals.mean())) < 6 * sigma * clip / math.sqrt(k)
    # Normality: Kolmogorov-Smirnov on the standardised values (p > 1e-6).
    assert stats.kstest((vals / (sigma * clip)).flatten().numpy(), "norm").pvalue > 1e-6


def test_noise_is_not_seedable():
    a = noise.add_gaussian_noise(np.zeros(16), noise_std=1.0, clip_norm=1.0)
    torch.manual_seed(0)
    np.random.seed(0)  # noqa: NPY002 - proving global seeds do not reach privacy noise
    b = noise.add_gaussian_noise(np.zeros(16), noise_std=1.0, clip_norm=1.0)
    assert not np.array_equal(a, b)


def test_noisy_count_scale():
    records = PrivateRecords(torch.zeros(123, 3, dtype=DTYPE))
    vals = np.array([records.noisy_count(noise_multiplier=4.0) for _ in range(400)])
    assert abs(vals.mean() - 123) < 6 * 4.0 / math.sqrt(400)
    assert abs(vals.var() / 16.0 - 1) < 6 * math.sqrt(2 / 400)


def test_count_vector_scale_gives_sensitivity_one():
    # One record changes `touches` coordinates by 1: after scaling the move is 1 minus exactly the
    # OpenDP rounding slack and the float64 slack of count * scale (the one rule shared by the
    # schema and initialisation histograms and the indicator counts).
    for touches, dim in ((1, 1), (4, 12), (30, 500)):
        move = math.sqrt(touches) * noise.count_vector_scale(touches, dim)
        assert move == pytest.approx(1.0 - noise.rounding_slack(1.0, dim) - noise.float_slack(1.0), rel=1e-15)
        assert move < 1.0
