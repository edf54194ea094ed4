"""The black-box objective: gradients through the unrolled inner loop against finite differences."""

from __future__ import annotations

import pytest
import torch

from dpsummary.blackbox.objective import (
    InnerConfig,
    bilevel_loss,
    inner_elbo_grad,
    inner_fit,
    loglik_matrix,
    neg_inner_elbo,
    outer_gradient,
)
from dpsummary.models import DTYPE, LogisticRegression
from dpsummary.models.bnn import BNN, MeanFieldGaussian


def tiny_problem(model, seed: int = 0):
    g = torch.Generator().manual_seed(seed)
    theta = model.sample_prior(1, g)[0]
    data = model.simulate(theta, 30, g)
    points = model.simulate(theta, 4, g)
    if model.likelihood == "bernoulli" if isinstance(model, BNN) else True:
        points[:, -1] = torch.tensor([0.2, 0.7, 0.4, 0.9], dtype=DTYPE)  # soft labels, smooth interior
    weights = torch.tensor([3.0, 5.0, 7.0, 9.0], dtype=DTYPE)
    mu, rho = MeanFieldGaussian.init(model, g, init_sd=0.3)
    config = InnerConfig(steps=3, lr=0.05, num_samples=4)
    inner_eps = torch.randn(3, 4, model.param_dim, generator=g, dtype=DTYPE)
    outer_eps = torch.randn(5, model.param_dim, generator=g, dtype=DTYPE)
    return data, points, weights, mu, rho, config, inner_eps, outer_eps


@pytest.mark.parametrize("model", [BNN(1, widths=(2,), activation="tanh"), LogisticRegression(2),
                                   BNN(2, widths=(3,), likelihood="softmax", num_classes=2)],
                         ids=["bnn", "logistic", "bnn-relu-softmax"])
def test_outer_gradient_matches_finite_differences(model) -> None:
    """d(-ELBO_PSVI-IS-BB)/d(points, weights) through 3 unrolled Adam steps, against central
    differences of the same function with the same noise (fully deterministic)."""
    data, points, weights, mu, rho, config, inner_eps, outer_eps = tiny_problem(model)
    family = MeanFieldGaussian(model.prior_scale)
    g_pts, g_w, loss, _ = outer_gradient(points, weights, mu, rho, data, 30, inner_eps, outer_eps, model, family,
                                         config)

    def f(p: torch.Tensor, w: torch.Tensor) -> float:
        return float(bilevel_loss(p, w, mu, rho, data, 30, inner_eps, outer_eps, model, family, config)[0])

    assert abs(float(loss) - f(points, weights)) < 1e-12
    h = 1e-6
    fd_w = torch.zeros_like(weights)
    for i in range(weights.numel()):
        e = torch.zeros_like(weights)
        e[i] = h
        fd_w[i] = (f(points, weights + e) - f(points, weights - e)) / (2 * h)
    fd_p = torch.zeros_like(points)
    for i in range(points.shape[0]):
        for j in range(points.shape[1]):
            e = torch.zeros_like(points)
            e[i, j] = h
            fd_p[i, j] = (f(points + e, weights) - f(points - e, weights)) / (2 * h)
    torch.testing.assert_close(g_w, fd_w, rtol=1e-5, atol=1e-8)
    torch.testing.assert_close(g_pts, fd_p, rtol=1e-5, atol=1e-8)
    # The unrolled inner loop matters: the gradient with psi* held fixed differs.
    assert float((g_w).abs().max()) > 0


def test_gradient_flows_through_inner_loop() -> None:
    """With the inner loop unrolled the weight gradient differs from the one at fixed psi."""
    model = BNN(1, widths=(2,), activation="tanh")
    data, points, weights, mu, rho, config, inner_eps, outer_eps = tiny_problem(model)
    family = MeanFieldGaussian(model.prior_scale)
    g_unrolled = outer_gradient(points, weights, mu, rho, data, 30, inner_eps, outer_eps, model, family, config)[1]
    zero = InnerConfig(steps=0, lr=0.05, num_samples=4)
    g_fixed = outer_gradient(points, weights, mu, rho, data, 30, inner_eps[:0], outer_eps, model, family, zero)[1]
    assert not torch.allclose(g_unrolled, g_fixed, rtol=1e-3)


def test_vmap_and_batched_loglik_agree() -> None:
    model = BNN(3, widths=(5, 4), likelihood="softmax", num_classes=3)
    g = torch.Generator().manual_seed(1)
    theta = model.sample_prior(6, g)
    pts = model.simulate(theta[0], 9, g)
    a = loglik_matrix(model, pts, theta, use_vmap=True)
    b = loglik_matrix(model, pts, theta, use_vmap=False)
    assert a.shape == (6, 9)
    torch.testing.assert_close(a, b, rtol=1e-12, atol=1e-12)


def test_inner_fit_improves_the_inner_elbo() -> None:
    model = BNN(2, widths=(8,))
    g = torch.Generator().manual_seed(2)
    theta = model.sample_prior(1, g)[0]
    pts = model.simulate(theta, 40, g)
    w = torch.full((40,), 2.0, dtype=DTYPE)
    mu, rho = MeanFieldGaussian.init(model, g, init_sd=0.1)
    family = MeanFieldGaussian(1.0)
    eps_eval = torch.randn(200, model.param_dim, generator=g, dtype=DTYPE)
    before = float(neg_inner_elbo(mu, rho, pts, w, eps_eval, model, family))
    cfg = InnerConfig(steps=100, lr=0.02, num_samples=8)
    mu2, rho2, mom = inner_fit(mu, rho, pts, w, torch.randn(100, 8, model.param_dim, generator=g, dtype=DTYPE),
                               model, family, cfg)
    after = float(neg_inner_elbo(mu2, rho2, pts, w, eps_eval, model, family))
    assert after < before - 1.0, (before, after)
    assert mom.count == 100


def test_mean_field_kl_and_log_prob() -> None:
    """Closed-form KL equals the Monte Carlo average of log r - log prior (tolerance 3 SE)."""
    model = BNN(2, widths=(3,), prior_scale=1.5)
    g = torch.Generator().manual_seed(3)
    mu = 0.5 * torch.randn(model.param_dim, generator=g, dtype=DTYPE)
    rho = torch.randn(model.param_dim, generator=g, dtype=DTYPE) - 1.0
    fam = MeanFieldGaussian(1.5)
    theta = fam.sample(mu, rho, torch.randn(200_000, model.param_dim, generator=g, dtype=DTYPE))
    diff = fam.log_prob(mu, rho, theta) - model.log_prior(theta)
    se = float(diff.std()) / diff.numel() ** 0.5
    assert abs(float(diff.mean()) - float(fam.kl_to_prior(mu, rho))) < 3 * se


@pytest.mark.parametrize("model", [
    BNN(2, widths=(6,)),
    BNN(2, widths=(6,), activation="tanh"),
    BNN(3, widths=(5, 4), likelihood="softmax", num_classes=3),
    BNN(7, widths=(9, 8), likelihood="softmax", num_classes=6),  # wide output: the einsum branch
    BNN(2, widths=(3, 2), likelihood="gaussian", noise_scale=0.7),
    BNN(2, widths=()),
], ids=["relu", "tanh", "softmax-deep", "softmax-wide", "gaussian", "glm"])
def test_closed_form_inner_gradient_matches_autodiff(model) -> None:
    """The hand-written inner gradient (bnn_weighted_score) equals torch.func.grad of -ELBO_IP,
    including a KL weight != 1 (deterministic; float64 rounding only)."""
    g = torch.Generator().manual_seed(4)
    pts = model.simulate(model.sample_prior(1, g)[0], 7, g)
    w = 3 * torch.rand(7, generator=g, dtype=DTYPE)
    mu, rho = MeanFieldGaussian.init(model, g, init_sd=0.3)
    eps = torch.randn(4, model.param_dim, generator=g, dtype=DTYPE)
    fam = MeanFieldGaussian(model.prior_scale)
    got = inner_elbo_grad(mu, rho, pts, w, eps, model, fam, 0.3)
    want = torch.func.grad(neg_inner_elbo, argnums=(0, 1))(mu, rho, pts, w, eps, model, fam, 0.3)
    for a, b in zip(got, want, strict=True):
        torch.testing.assert_close(a, b, rtol=1e-10, atol=1e-12)
