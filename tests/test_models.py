"""Models: densities against scipy, autograd gradients, exact posteriors, GLM derivatives, specs."""

from __future__ import annotations

import numpy as np
import pytest
import torch
from scipy import stats

from dpsummary.inference import laplace
from dpsummary.models import (
    DTYPE,
    GLM,
    REGISTRY,
    GaussianMean,
    LinearRegression,
    LogisticRegression,
    Model,
    PoissonRegression,
    from_spec,
)


@pytest.fixture(autouse=True, scope="module")
def _single_thread():
    """Small-tensor work is fastest single-threaded; on a loaded 2-core machine torch's default
    intra-op threads spin against each other (measured: 10x slower). Restored afterwards."""
    old = torch.get_num_threads()
    torch.set_num_threads(1)
    yield
    torch.set_num_threads(old)

GEN_SEED = 0


def gen(seed: int = GEN_SEED) -> torch.Generator:
    return torch.Generator().manual_seed(seed)


def make(name: str, num_features: int = 3) -> Model:
    return REGISTRY[name](num_features)


def sample(model: Model, n: int, seed: int = 0) -> tuple[torch.Tensor, torch.Tensor]:
    g = gen(seed)
    theta = model.sample_prior(4, g)
    data = model.simulate(theta[0], n, g)
    return data, theta


all_models = pytest.mark.parametrize("name", sorted(REGISTRY))


# ---- log-likelihoods against scipy.stats ---------------------------------------------------
def scipy_loglik(model: Model, points: np.ndarray, theta: np.ndarray) -> np.ndarray:
    out = np.empty((points.shape[0], theta.shape[0]))
    for s, th in enumerate(theta):
        if isinstance(model, GaussianMean):
            out[:, s] = stats.multivariate_normal(th, model.noise_scale**2 * np.eye(model.num_features)).logpdf(points)
            continue
        x = points[:, : model.num_features]
        y = points[:, -1]
        eta = x @ th[1:] + th[0]
        if isinstance(model, LinearRegression):
            out[:, s] = stats.norm(eta, model.noise_scale).logpdf(y)
        elif isinstance(model, LogisticRegression):
            out[:, s] = stats.bernoulli(1 / (1 + np.exp(-eta))).logpmf(y)
        elif isinstance(model, PoissonRegression):
            out[:, s] = stats.poisson(np.exp(eta)).logpmf(y)
        else:  # pragma: no cover
            raise AssertionError(model)
    return out


@pytest.mark.parametrize(
    "model",
    [
        GaussianMean(3, noise_scale=0.7),
        LinearRegression(3, noise_scale=1.3),
        LogisticRegression(3),
        PoissonRegression(3, prior_scale=0.5),
    ],
    ids=lambda m: m.name,
)
def test_loglik_matches_scipy(model: Model) -> None:
    data, theta = sample(model, 25)
    ll = model.log_likelihood(data, theta)
    assert ll.shape == (25, 4) and ll.dtype == DTYPE
    np.testing.assert_allclose(ll.numpy(), scipy_loglik(model, data.numpy(), theta.numpy()), rtol=1e-10, atol=1e-10)


@all_models
def test_log_prior_matches_scipy(name: str) -> None:
    model = REGISTRY[name](2, prior_scale=1.7)
    theta = model.sample_prior(5, gen())
    ref = stats.multivariate_normal(model.prior_mean.numpy(), 1.7**2 * np.eye(model.param_dim)).logpdf(theta.numpy())
    np.testing.assert_allclose(model.log_prior(theta).numpy(), ref, rtol=1e-12)


# ---- autograd gradients against finite differences -----------------------------------------
def soft_points(model: Model, n: int) -> torch.Tensor:
    """Points with soft targets strictly inside the support, so the density is smooth in them."""
    data, _ = sample(model, n)
    data = data.clone()
    if isinstance(model, LogisticRegression):
        data[:, -1] = torch.linspace(0.1, 0.9, n, dtype=DTYPE)
    elif isinstance(model, PoissonRegression):
        data[:, -1] = torch.linspace(0.5, 4.0, n, dtype=DTYPE)
    return data


@all_models
def test_gradcheck_points_and_theta(name: str) -> None:
    model = make(name, 2)
    points = soft_points(model, 5).requires_grad_(True)
    theta = (0.5 * model.sample_prior(3, gen(1))).requires_grad_(True)
    assert torch.autograd.gradcheck(model.log_likelihood, (points, theta))
    assert torch.autograd.gradgradcheck(model.log_likelihood, (points, theta))
    assert torch.autograd.gradcheck(model.log_prior, (theta,))


@pytest.mark.parametrize("name", ["logistic", "poisson"])
def test_glm_eta_derivatives_against_finite_differences(name: str) -> None:
    model = make(name)
    assert isinstance(model, GLM)
    y = soft_points(model, 7)[:, -1]
    eta = torch.linspace(-2.0, 2.0, 7, dtype=DTYPE)
    d1, d2 = model.eta_derivatives(y, eta)
    h = 1e-5
    f = model.log_lik_eta
    fd1 = (f(y, eta + h) - f(y, eta - h)) / (2 * h)
    fd2 = (f(y, eta + h) - 2 * f(y, eta) + f(y, eta - h)) / h**2
    torch.testing.assert_close(d1, fd1, rtol=1e-7, atol=1e-8)
    torch.testing.assert_close(d2, fd2, rtol=1e-4, atol=1e-5)
    # Closed forms: logistic y - sigma, -sigma(1 - sigma); Poisson y - e^eta, -e^eta.
    if name == "logistic":
        s = torch.sigmoid(eta)
        torch.testing.assert_close(d1, y - s)
        torch.testing.assert_close(d2, -s * (1 - s))
    else:
        torch.testing.assert_close(d1, y - eta.exp())
        torch.testing.assert_close(d2, -eta.exp())


@pytest.mark.parametrize("name", ["logistic", "poisson"])
def test_glm_closed_form_derivatives_match_autograd_including_their_graph(name: str) -> None:
    """The closed-form overrides of eta_derivatives_graph (a speed path) agree with the
    autograd default in value AND in their own gradients (pseudopoint fits differentiate them)."""
    model = make(name)
    assert isinstance(model, GLM)
    y = soft_points(model, 9)[:, -1].clone().requires_grad_(True)
    eta = torch.linspace(-3.0, 3.0, 9, dtype=DTYPE).requires_grad_(True)
    closed = model.eta_derivatives_graph(y, eta)
    auto = model.autograd_eta_derivatives(y, eta)
    for c, a in zip(closed, auto, strict=True):
        torch.testing.assert_close(c, a, rtol=1e-12, atol=1e-12)
        gc = torch.autograd.grad(c.sum(), (y, eta), retain_graph=True, allow_unused=True)
        ga = torch.autograd.grad(a.sum(), (y, eta), retain_graph=True, allow_unused=True)
        for u, v in zip(gc, ga, strict=True):
            torch.testing.assert_close(u if u is not None else torch.zeros(9, dtype=DTYPE),
                                       v if v is not None else torch.zeros(9, dtype=DTYPE), rtol=1e-10, atol=1e-12)


# ---- exact posteriors against brute force --------------------------------------------------
@pytest.mark.parametrize(
    "model", [GaussianMean(3, prior_scale=2.0, noise_scale=0.5), LinearRegression(3, noise_scale=0.8)], ids=lambda m: m.name
)
def test_exact_posterior_against_newton_on_autograd_hessian(model: Model) -> None:
    """The posterior is Gaussian, so Laplace (autograd Hessian, generic path) is exact."""
    data, _ = sample(model, 30)
    weights = 0.1 + 2 * torch.rand(30, generator=gen(2), dtype=DTYPE)
    exact = model.exact_posterior(data, weights)
    # Generic Newton path: hide conjugacy/GLM structure from laplace().
    brute = laplace(_Opaque(model), data, weights)
    torch.testing.assert_close(exact.mean, brute.mean, rtol=1e-8, atol=1e-10)
    torch.testing.assert_close(exact.cov, brute.cov, rtol=1e-8, atol=1e-12)


def test_exact_posterior_against_grid_1d() -> None:
    """A 1-d Gaussian-mean posterior against normalised quadrature of prior x likelihood."""
    model = GaussianMean(1, prior_scale=1.5, noise_scale=2.0)
    data, _ = sample(model, 10)
    weights = torch.linspace(0.5, 1.5, 10, dtype=DTYPE)
    exact = model.exact_posterior(data, weights)
    grid = torch.linspace(-8, 8, 20001, dtype=DTYPE)[:, None]
    logp = weights @ model.log_likelihood(data, grid) + model.log_prior(grid)
    p = torch.exp(logp - logp.max())
    p = p / p.sum()
    mean = (p * grid[:, 0]).sum()
    var = (p * (grid[:, 0] - mean) ** 2).sum()
    torch.testing.assert_close(exact.mean[0], mean, rtol=0, atol=1e-8)
    torch.testing.assert_close(exact.cov[0, 0], var, rtol=1e-6, atol=0)


class _Opaque(Model):
    """Wraps a model so laplace() takes its generic autograd-Hessian path."""

    name = "opaque"

    def __init__(self, inner: Model) -> None:
        super().__init__(inner.num_features, prior_scale=inner.prior_scale)
        self.inner = inner

    @property
    def param_dim(self) -> int:
        return self.inner.param_dim

    def log_likelihood(self, points, theta):
        return self.inner.log_likelihood(points, theta)

    def simulate(self, theta, num, generator, features=None):  # pragma: no cover
        return self.inner.simulate(theta, num, generator, features)


# ---- specs, simulation, soft targets --------------------------------------------------------
@pytest.mark.parametrize(
    "model",
    [
        GaussianMean(4, prior_scale=2.5, noise_scale=0.3),
        LinearRegression(2, prior_scale=0.5, noise_scale=2.0, intercept=False),
        LogisticRegression(5, prior_scale=3.0, intercept=False),
        PoissonRegression(1, prior_scale=0.2),
        PoissonRegression(2, prior_mean=[5.0, 0.0, 0.0]),
    ],
    ids=lambda m: m.name,
)
def test_spec_round_trip(model: Model) -> None:
    import json

    spec = json.loads(json.dumps(model.spec()))
    rebuilt = from_spec(spec)
    assert rebuilt == model and type(rebuilt) is type(model)
    assert rebuilt.spec() == model.spec()
    assert hash(rebuilt) == hash(model)
    assert len(model.param_names()) == model.param_dim


@all_models
def test_simulate_shapes(name: str) -> None:
    model = make(name, 3)
    theta = model.sample_prior(1, gen())[0]
    assert theta.shape == (model.param_dim,)
    data = model.simulate(theta, 40, gen(1))
    assert data.shape == (40, model.point_dim) and data.dtype == DTYPE
    assert torch.isfinite(data).all()
    features = torch.randn(40, 3, generator=gen(2), dtype=DTYPE)
    data2 = model.simulate(theta, 40, gen(3), features=features)
    assert data2.shape == (40, model.point_dim)
    if model.has_target:
        torch.testing.assert_close(data2[:, :3], features)
    if name == "logistic":
        assert set(data[:, -1].tolist()) <= {0.0, 1.0}
    if name == "poisson":
        assert (data[:, -1] >= 0).all() and (data[:, -1] == data[:, -1].round()).all()


def test_soft_labels_and_fractional_counts() -> None:
    theta = torch.tensor([[0.3, -0.5, 0.8]], dtype=DTYPE)
    x = torch.tensor([[0.2, -1.0], [1.5, 0.4]], dtype=DTYPE)
    eta = 0.3 + x @ theta[0, 1:]
    # Logistic: soft label y in [0, 1] gives the cross-entropy y log s + (1 - y) log(1 - s).
    y = torch.tensor([0.25, 0.9], dtype=DTYPE)
    ll = LogisticRegression(2).log_likelihood(torch.cat([x, y[:, None]], 1), theta)[:, 0]
    s = torch.sigmoid(eta)
    torch.testing.assert_close(ll, y * torch.log(s) + (1 - y) * torch.log(1 - s))
    # Poisson: non-integer counts through lgamma.
    c = torch.tensor([2.5, 0.3], dtype=DTYPE)
    llp = PoissonRegression(2).log_likelihood(torch.cat([x, c[:, None]], 1), theta)[:, 0]
    torch.testing.assert_close(llp, c * eta - eta.exp() - torch.lgamma(c + 1))
    # Projection keeps learned targets in the support.
    pts = torch.tensor([[0.0, 0.0, 1.7], [0.0, 0.0, -0.4]], dtype=DTYPE)
    assert LogisticRegression(2).project_points(pts.clone())[:, -1].tolist() == [1.0, 0.0]
    assert PoissonRegression(2).project_points(pts.clone())[:, -1].tolist() == [1.7, 0.0]


def test_invalid_arguments() -> None:
    with pytest.raises(ValueError):
        GaussianMean(0)
    with pytest.raises(ValueError):
        LogisticRegression(2, prior_scale=0.0)
    with pytest.raises(ValueError):
        LinearRegression(2, noise_scale=-1.0)
    with pytest.raises(ValueError):
        from_spec({"name": "nope", "num_features": 1})


@pytest.mark.parametrize("name", sorted(n for n, c in REGISTRY.items() if getattr(c, "parameter_draws", True)))
def test_record_scores_and_curvatures_match_autograd(name):
    """Contract over every model: closed-form per-record scores/curvatures (and rank-one factors)
    equal the base class's autograd defaults; public statistic bounds hold in the unit box."""
    from dpsummary.models import REGISTRY, Model

    model = REGISTRY[name](3)
    g = torch.Generator().manual_seed(0)
    theta = torch.randn(model.param_dim, generator=g, dtype=torch.float64) * 0.3
    x = torch.rand(40, 3, generator=g, dtype=torch.float64) * 2 - 1
    pts = model.simulate(theta, 40, g, features=x)
    if model.has_target and name == "poisson":
        pts[:, -1].clamp_(max=5)
    if name == "linear":
        pts[:, -1].clamp_(-1, 1)
    assert torch.allclose(model.record_scores(pts, theta), Model.record_scores(model, pts, theta), atol=1e-10)
    curv = model.record_curvatures(pts, theta)
    assert torch.allclose(curv, Model.record_curvatures(model, pts, theta), atol=1e-10)
    factors = model.record_curvature_factors(pts, theta)
    if factors is not None:
        c, z = factors
        assert torch.allclose(c[:, None, None] * z[:, :, None] * z[:, None, :], curv, atol=1e-12)
    if getattr(model, "estimates_sigma", False):
        # Linear regression with sigma estimated releases its moment matrix, not scores (issue 51).
        with pytest.raises(NotImplementedError):
            model.statistic_bounds(theta, feature_norm=3**0.5, target_bound=5.0)
        return
    sb, cb = model.statistic_bounds(theta, feature_norm=3**0.5, target_bound=5.0)
    if name not in ("poisson", "gaussian_mean"):  # Poisson caps the rate; gaussian_mean draws outside the box
        assert float(model.record_scores(pts, theta).norm(dim=1).max()) <= sb
        assert float(curv.flatten(1).norm(dim=1).max()) <= cb


def test_prior_mean_centres_the_prior_and_is_declared_in_the_spec() -> None:
    """A re-centred prior (the Poisson release's, dpsummary.noise_aware 5.) moves log_prior and
    sample_prior, is part of the spec and of equality, and must match the parameter count."""
    base = PoissonRegression(2)
    centred = base.with_prior_mean([5.0, 0.0, 0.0])
    assert "prior_mean" not in base.spec() and centred.spec()["prior_mean"] == [5.0, 0.0, 0.0]
    assert centred != base
    theta = torch.tensor([[5.0, 0.0, 0.0]], dtype=torch.float64)
    assert float(centred.log_prior(theta)[0]) == pytest.approx(float(base.log_prior(torch.zeros(1, 3, dtype=torch.float64))[0]))
    draws = centred.sample_prior(4000, gen())
    assert abs(float(draws[:, 0].mean()) - 5.0) < 0.1  # 0.1 = 6.3 sds of the mean: fails ~never
    with pytest.raises(ValueError):
        base.with_prior_mean([1.0, 2.0])
    with pytest.raises(ValueError):
        PoissonRegression(2, prior_mean=[float("nan"), 0.0, 0.0])


# ---- the censored Poisson statistic model (issue 50's thirty-second rule) ---------------------
@pytest.mark.parametrize("bound", [1.0, 2.0, 5.0, 37.6])
def test_censored_poisson_is_the_likelihood_of_the_count_censored_at_k(bound: float) -> None:
    """A count at or above K = floor(bound) has log-likelihood log P(Y >= K) (scipy's logsf at
    K - 1); below K the Poisson log-pmf. Closed-form derivatives match autograd of that
    likelihood, and both match central finite differences of it."""
    model = PoissonRegression(2).censored(bound)
    k = float(int(bound))
    assert model.censor_count == k
    eta = torch.linspace(-6.0, 4.0, 41, dtype=DTYPE)
    mu = eta.exp().numpy()
    for y_value in (0.0, k - 1.0, k, k + 3.0):
        if y_value < 0:
            continue
        y = torch.full_like(eta, y_value)
        got = model.log_lik_eta(y, eta).numpy()
        want = stats.poisson.logsf(k - 1, mu) if y_value >= k else stats.poisson.logpmf(y_value, mu)
        np.testing.assert_allclose(got, want, rtol=1e-8, atol=1e-10)
        d1, d2 = model.eta_derivatives_graph(y, eta)
        a1, a2 = model.autograd_eta_derivatives(y, eta)
        torch.testing.assert_close(d1, a1.detach(), rtol=1e-8, atol=1e-10)
        torch.testing.assert_close(d2, a2.detach(), rtol=1e-7, atol=1e-10)
        step = 1e-5
        up, down = model.log_lik_eta(y, eta + step), model.log_lik_eta(y, eta - step)
        torch.testing.assert_close(d1, (up - down) / (2 * step), rtol=1e-5, atol=1e-7)


def test_censored_poisson_weights_stay_within_the_poisson_statistic_bounds() -> None:
    """A censored record's score weight h lies in (0, K] and its curvature weight in [0, mu], so
    PoissonRegression.statistic_bounds hold unchanged; finite from eta -60 to 12 and K up to 1e6
    (the incomplete gamma underflows there, the series takes over)."""
    eta = torch.linspace(-60.0, 12.0, 721, dtype=DTYPE)
    for bound in (1.0, 2.0, 10.0, 1000.0, 1e6):
        model = PoissonRegression(1).censored(bound)
        k = model.censor_count
        d1, d2 = model.eta_derivatives(torch.full_like(eta, k), eta)
        assert bool(torch.isfinite(d1).all()) and bool(torch.isfinite(d2).all())
        assert bool((d1 >= 0).all()) and bool((d1 <= k).all())
        assert bool((-d2 >= 0).all()) and bool((-d2 <= eta.exp() * (1 + 1e-12)).all())
        # mu -> 0: h -> K and the curvature weight -> K mu / (K + 1) (the series' first term).
        low = eta < -30
        torch.testing.assert_close(d1[low], torch.full_like(d1[low], k), rtol=1e-9, atol=0.0)
        torch.testing.assert_close(-d2[low], k * eta[low].exp() / (k + 1), rtol=1e-6, atol=0.0)


def test_censored_poisson_is_never_rebuilt_from_a_spec() -> None:
    """The censored model is the rounds' statistic model only: its spec names no registered model."""
    model = PoissonRegression(3, prior_scale=2.0).censored(5.0)
    assert model.spec()["censor_at"] == 5.0 and model.prior_scale == 2.0
    with pytest.raises(ValueError, match="unknown model"):
        from_spec(model.spec())
    assert PoissonRegression(3).censored(0.0).censor_count == 1.0  # a clip at the bin of 0
    for bad in (-1.0, float("inf"), float("nan")):
        with pytest.raises(ValueError, match="censor_at"):
            PoissonRegression(3).censored(bad)
