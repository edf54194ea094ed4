"""The noise-aware posterior of ``noise-aware-cells`` (dpsummary/cells/posterior.py):
without noise it is the full-data Laplace posterior; with noise it is wider and reproducible."""

from __future__ import annotations

import numpy as np
import pytest
import torch

from dpsummary.cells.posterior import cells_posterior
from dpsummary.gaussian import DTYPE
from dpsummary.models import LogisticRegression, PoissonRegression

#: 12 cells of 3 features: 2 x 3 x 2 levels.
CELLS = torch.tensor([[a, b, c] for a in (-1.0, 1.0) for b in (-1.0, 0.0, 1.0) for c in (0.0, 1.0)], dtype=DTYPE)


def _data(n: int, seed: int, poisson: bool = False) -> tuple[torch.Tensor, torch.Tensor, torch.Tensor]:
    """(records' cell index, their features, their targets) from a known logistic (0/1) or
    Poisson (counts) model."""
    gen = torch.Generator().manual_seed(seed)
    idx = torch.randint(0, CELLS.shape[0], (n,), generator=gen)
    x = CELLS[idx]
    eta = -0.5 + x @ torch.tensor([0.8, -0.4, 1.2], dtype=DTYPE)
    if poisson:
        return idx, x, torch.poisson(torch.exp(eta + 1.0), generator=gen)
    y = (torch.rand(n, generator=gen, dtype=DTYPE) < torch.sigmoid(eta)).to(DTYPE)
    return idx, x, y


def _laplace(model: LogisticRegression | PoissonRegression, x: torch.Tensor, y: torch.Tensor
             ) -> tuple[torch.Tensor, torch.Tensor]:
    """The full-data posterior's mode and Laplace covariance (Newton on the records themselves)."""
    z = torch.cat([torch.ones(x.shape[0], 1, dtype=DTYPE), x], 1)
    prior = torch.eye(z.shape[1], dtype=DTYPE) / model.prior_scale**2

    def moments(eta: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor]:
        if isinstance(model, PoissonRegression):
            return torch.exp(eta), torch.exp(eta)
        p = torch.sigmoid(eta)
        return p, p * (1 - p)

    theta = torch.zeros(z.shape[1], dtype=DTYPE)
    for _ in range(60):
        m, v = moments(z @ theta)
        prec = (z.T * v) @ z + prior
        theta = theta + torch.linalg.solve(prec, z.T @ (y - m) - prior @ theta)
    _m, v = moments(z @ theta)
    return theta, torch.linalg.inv((z.T * v) @ z + prior)


def _design() -> torch.Tensor:
    return torch.cat([torch.ones(CELLS.shape[0], 1, dtype=DTYPE), CELLS], 1)


def _exact(idx: torch.Tensor, y: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor]:
    counts = torch.bincount(idx, minlength=CELLS.shape[0]).to(DTYPE)
    return counts, _design().T @ torch.zeros(CELLS.shape[0], dtype=DTYPE).index_add_(0, idx, y)


@pytest.mark.parametrize("poisson", [False, True])
@pytest.mark.parametrize("prior_scale", [1.0, 5.0])
def test_without_noise_it_is_the_full_data_laplace_posterior(prior_scale: float, poisson: bool) -> None:
    model = (PoissonRegression if poisson else LogisticRegression)(3, prior_scale=prior_scale)
    idx, x, y = _data(3000, seed=1, poisson=poisson)
    counts, t = _exact(idx, y)
    post = cells_posterior(model, _design(), counts, t, counts_noise_std=0.0, statistic_noise_std=0.0,
                           generator=torch.Generator().manual_seed(0), imputations=3)
    mean, cov = _laplace(model, x, y)
    torch.testing.assert_close(post.mean, mean, rtol=0, atol=1e-8)
    torch.testing.assert_close(post.cov, cov, rtol=1e-8, atol=1e-12)


def test_noise_widens_it_and_a_seed_reproduces_it() -> None:
    model = LogisticRegression(3)
    idx, _x, y = _data(3000, seed=2)
    counts, t = _exact(idx, y)
    gen = torch.Generator().manual_seed(7)
    noisy_counts = counts + 5.0 * torch.randn(counts.shape, generator=gen, dtype=DTYPE)
    noisy_t = t + 20.0 * torch.randn(t.shape, generator=gen, dtype=DTYPE)
    kw = {"counts_noise_std": 5.0, "statistic_noise_std": 20.0}
    one = cells_posterior(model, _design(), noisy_counts, noisy_t, generator=torch.Generator().manual_seed(3), **kw)
    two = cells_posterior(model, _design(), noisy_counts, noisy_t, generator=torch.Generator().manual_seed(3), **kw)
    assert torch.equal(one.mean, two.mean) and torch.equal(one.scale_tril, two.scale_tril)
    exact = cells_posterior(model, _design(), counts, t, counts_noise_std=0.0, statistic_noise_std=0.0,
                            generator=torch.Generator().manual_seed(3), imputations=1)
    assert bool((torch.diagonal(one.cov) > torch.diagonal(exact.cov)).all())


def test_non_finite_statistics_raise_the_non_finite_fit() -> None:
    from dpsummary.noise_aware import NonFiniteFit

    counts = torch.full((CELLS.shape[0],), float("nan"), dtype=DTYPE)
    with pytest.raises(NonFiniteFit):
        cells_posterior(LogisticRegression(3), _design(), counts, torch.zeros(4, dtype=DTYPE), counts_noise_std=1.0,
                        statistic_noise_std=1.0, generator=torch.Generator().manual_seed(0))


def test_the_cells_model_is_what_the_moments_mean() -> None:
    """The target moments of a logistic model are p and p (1 - p)."""
    from dpsummary.cells.posterior import target_moments

    eta = torch.tensor([-2.0, 0.0, 3.0], dtype=DTYPE)
    m, slope, v = target_moments(LogisticRegression(1), eta)
    p = torch.sigmoid(eta)
    np.testing.assert_allclose(m.numpy(), p.numpy(), atol=1e-12)
    np.testing.assert_allclose(v.numpy(), (p * (1 - p)).numpy(), atol=1e-12)
    np.testing.assert_allclose(slope.numpy(), v.numpy(), atol=1e-12)
    # A logistic target is not clipped by a bound (it is 0/1 already).
    assert all(torch.equal(a, b) for a, b in zip(target_moments(LogisticRegression(1), eta, 1.0), (m, slope, v),
                                                 strict=True))


@pytest.mark.parametrize("bound", [0.0, 1.0, 2.0, 2.5, 7.0])
def test_clipped_poisson_moments_match_the_sums(bound: float) -> None:
    """Issue 50's thirty-third rule: the closed forms of min(Y, B)'s mean, variance and the
    mean's derivative in eta against sums over the Poisson pmf (and a central difference)."""
    from scipy import stats

    from dpsummary.cells.posterior import clipped_poisson_moments

    eta = torch.linspace(-5.0, 3.0, 17, dtype=DTYPE)
    mean, slope, var = clipped_poisson_moments(eta, bound)
    ks = np.arange(0, 400)
    for i, e in enumerate(eta.tolist()):
        pmf = stats.poisson.pmf(ks, np.exp(e))
        clipped = np.minimum(ks, bound)
        m = float(pmf @ clipped)
        assert float(mean[i]) == pytest.approx(m, rel=1e-9, abs=1e-12)
        assert float(var[i]) == pytest.approx(float(pmf @ clipped**2) - m * m, rel=1e-7, abs=1e-12)
    step = 1e-6
    up, _, _ = clipped_poisson_moments(eta + step, bound)
    down, _, _ = clipped_poisson_moments(eta - step, bound)
    torch.testing.assert_close(slope, (up - down) / (2 * step), rtol=1e-6, atol=1e-9)


def test_clipped_poisson_moments_are_the_poissons_far_below_the_bound() -> None:
    from dpsummary.cells.posterior import clipped_poisson_moments

    eta = torch.linspace(-5.0, 3.0, 9, dtype=DTYPE)
    for got in clipped_poisson_moments(eta, 1e4):
        torch.testing.assert_close(got, eta.exp(), rtol=1e-10, atol=0.0)


def test_a_clipped_count_gives_the_full_data_posterior_back() -> None:
    """Poisson counts with mean 5 clipped at 2 (55% of the records above it), no noise: read with
    the Poisson's own moments the released T puts every coordinate 40-130 full-data sds off; read
    with the clipped count's, every coordinate is within 2.5 of the release's own sds of the
    full-data mean (measured over data seeds 0-3: at most 1.1), at 1.5-2.9x its width."""
    model = PoissonRegression(3)
    idx, x, y = _data(20_000, seed=0, poisson=True)
    full_mean, full_cov = _laplace(model, x, y)
    counts, t = _exact(idx, torch.clamp(y, max=2.0))
    kwargs = dict(counts_noise_std=0.0, statistic_noise_std=0.0, imputations=2)
    plain = cells_posterior(model, _design(), counts, t, generator=torch.Generator().manual_seed(0), **kwargs)
    clipped = cells_posterior(model, _design(), counts, t, generator=torch.Generator().manual_seed(0),
                              target_bound=2.0, **kwargs)
    full_sd = full_cov.diagonal().sqrt()
    assert float(((plain.mean - full_mean).abs() / full_sd).min()) > 30
    assert float(((clipped.mean - full_mean).abs() / clipped.cov.diagonal().sqrt()).max()) < 2.5
    ratio = clipped.cov.diagonal().sqrt() / full_sd
    assert float(ratio.min()) > 1.0 and float(ratio.max()) < 4.0
