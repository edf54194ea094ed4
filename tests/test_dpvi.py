"""DP-VI baseline (``dpsummary.dpvi``): utility at large epsilon, accounting, Poisson sampling."""

from __future__ import annotations

import numpy as np
import pytest
import torch

from dpsummary import dpvi
from dpsummary.metrics import full_posterior
from dpsummary.models import DTYPE, LogisticRegression


def _problem(n: int = 2000, d: int = 4, seed: int = 0) -> tuple[LogisticRegression, torch.Tensor, torch.Tensor]:
    g = torch.Generator().manual_seed(seed)
    model = LogisticRegression(d)
    theta = model.sample_prior(1, g)[0]
    x = torch.rand(n + 200, d, generator=g, dtype=DTYPE) * 2 - 1
    pts = model.simulate(theta, n + 200, g, features=x)
    return model, pts[:n], pts[n:]


def test_large_epsilon_approaches_the_posterior() -> None:
    model, train, test = _problem()
    full = full_posterior(model, train)
    # A clip norm above every per-record gradient norm (||x|| <= sqrt(5) here): no clipping bias.
    res = dpvi.fit_dpvi(train, model, epsilon=1e5, delta=1e-6, generator=torch.Generator().manual_seed(0),
                        steps=600, clip_norm=10.0, lr=0.02)
    sd = torch.sqrt(torch.diagonal(full.cov))
    # The mean within a fraction of a posterior standard deviation in every coordinate.
    assert ((res.posterior.mean - full.mean).abs() / sd).max() < 0.5
    ev = dpvi.evaluate_posterior(model, res.posterior, full, test=test)
    assert set(ev) >= {"forward", "reverse", "forward_normalised", "reverse_normalised", "mean_error",
                       "test_loglik", "accuracy"}
    assert ev["forward_normalised"] < 0.02 and ev["reverse_normalised"] < 0.05
    # Mean-field scales close to the full posterior's marginal scales (within a factor 2).
    ratio = torch.diagonal(res.posterior.scale_tril) / sd
    assert ratio.min() > 0.5 and ratio.max() < 2.0
    # At a strong privacy level the fit is visibly worse: the noise is really there.
    noisy = dpvi.fit_dpvi(train, model, epsilon=0.05, delta=1e-6, generator=torch.Generator().manual_seed(0),
                          steps=600, clip_norm=10.0, lr=0.02)
    assert dpvi.evaluate_posterior(model, noisy.posterior, full)["forward"] > ev["forward"]


def test_recorded_mechanism_reproduces_the_accountant() -> None:
    from opacus.accountants import RDPAccountant

    from dpsummary import accounting as acc
    from dpsummary.accounting import RDP_ORDERS

    model, train, _ = _problem(n=1000)
    res = dpvi.fit_dpvi(train, model, epsilon=0.5, delta=1e-7, generator=torch.Generator().manual_seed(1),
                        steps=40)
    assert res.steps == 40
    assert res.sample_rate == pytest.approx(min(1.0, dpvi.DEFAULT_EXPECTED_BATCH / 1000), abs=2**-32)
    assert (res.sample_rate * 2**32).is_integer()  # exactly the coin probability
    assert res.epsilon <= 0.5 + 1e-12 and res.epsilon == pytest.approx(0.5, rel=1e-3)
    # Opacus's accountant stepped through the run gives the recorded epsilon ...
    a = RDPAccountant()
    for _ in range(res.steps):
        a.step(noise_multiplier=res.noise_multiplier, sample_rate=res.sample_rate)
    assert a.get_epsilon(1e-7, alphas=RDP_ORDERS) == pytest.approx(res.epsilon, abs=1e-9)
    # ... and sigma is the calibrated (near-smallest) one for the target: a little less noise overspends.
    less = acc.subsampled_gaussian_event(res.noise_multiplier * (1 - 1e-3), res.sample_rate, res.steps)
    assert acc.epsilon([less], 1e-7) > 0.5


def test_sampling_is_poisson_and_empty_batches_still_add_noise(monkeypatch: pytest.MonkeyPatch) -> None:
    from dpsummary.private import noise

    model, train, _ = _problem(n=3000)
    calls: list[tuple[int, float, int]] = []
    real = noise.poisson_mask

    def spy(n: int, q: float) -> np.ndarray:
        mask = real(n, q)
        calls.append((n, q, int(mask.sum())))
        return mask

    monkeypatch.setattr(noise, "poisson_mask", spy)
    res = dpvi.fit_dpvi(train, model, epsilon=1.0, delta=1e-7, generator=torch.Generator().manual_seed(2),
                        steps=200, sample_rate=0.05)
    assert len(calls) == 200
    assert all(n == 3000 and q == res.sample_rate for n, q, _ in calls)
    sizes = np.array([k for _, _, k in calls])
    # Independent coins: the batch size is Binomial(3000, 0.05) (mean 150, sd 11.9), not fixed.
    assert sizes.std() > 5 and len(set(sizes.tolist())) > 10
    assert abs(sizes.mean() - 150) < 4 * 11.9 / np.sqrt(200) + 1

    # A step whose Poisson batch is empty is still released with its noise (the accountant counts it).
    monkeypatch.setattr(noise, "poisson_mask", lambda n, q: np.zeros(n, dtype=bool))
    runs = [dpvi.fit_dpvi(train, model, epsilon=1.0, delta=1e-7, generator=torch.Generator().manual_seed(3),
                          steps=30, sample_rate=0.05) for _ in range(2)]
    assert runs[0].empty_batches == 30
    # Noise from OS entropy: the same seed does not reproduce it.
    assert not torch.equal(runs[0].posterior.mean, runs[1].posterior.mean)


def test_works_for_every_model() -> None:
    from dpsummary.models import GaussianMean, LinearRegression, PoissonRegression

    g = torch.Generator().manual_seed(4)
    for model in (GaussianMean(3), LinearRegression(3), PoissonRegression(3)):
        theta = model.sample_prior(1, g)[0] * 0.3
        data = model.simulate(theta, 500, g)
        full = full_posterior(model, data)
        res = dpvi.fit_dpvi(data, model, epsilon=1e5, delta=1e-6, generator=torch.Generator().manual_seed(0),
                            steps=400)
        ev = dpvi.evaluate_posterior(model, res.posterior, full, test=data[:100])
        assert np.isfinite(ev["forward"]) and ev["forward_normalised"] < 0.05, (model.name, ev)


def test_bad_arguments() -> None:
    model, train, _ = _problem(n=100)
    with pytest.raises(ValueError):
        dpvi.fit_dpvi(train[:, :2], model, epsilon=1.0, delta=1e-7, generator=torch.Generator())
    with pytest.raises(ValueError):
        dpvi.fit_dpvi(train, model, epsilon=1.0, delta=1e-7, generator=torch.Generator(), steps=0)
