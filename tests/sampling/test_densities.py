"""The JAX log densities NUTS runs equal the torch definition (weighted_log_posterior)."""

from __future__ import annotations

import numpy as np
import pytest
import torch

from dpsummary.constructors.base import Summary
from dpsummary.inference import weighted_log_posterior
from dpsummary.models import DTYPE, from_spec
from dpsummary.sampling.densities import glm_data, glm_log_density, torch_log_density

jax = pytest.importorskip("jax")


def _points(name: str, m: int = 9, k: int = 3) -> tuple[torch.Tensor, torch.Tensor, object]:
    g = torch.Generator().manual_seed(5)
    spec = {"name": name, "num_features": k}
    if name == "linear":
        spec["noise_scale"] = 0.7
    model = from_spec({**spec, "prior_scale": 1.3} if name != "bnn" else {**spec, "widths": [3]})
    x = torch.rand(m, k, generator=g, dtype=DTYPE) * 2 - 1
    y = {"logistic": torch.rand(m, 1, generator=g, dtype=DTYPE),           # soft labels
         "poisson": 3 * torch.rand(m, 1, generator=g, dtype=DTYPE),        # fractional counts
         "linear": torch.randn(m, 1, generator=g, dtype=DTYPE),
         "bnn": (torch.rand(m, 1, generator=g, dtype=DTYPE) > 0.5).to(DTYPE)}.get(name)
    pts = x if y is None else torch.cat([x, y], 1)
    w = 0.5 + 3 * torch.rand(m, generator=g, dtype=DTYPE)
    Summary(pts, w, model, "test")  # the points are valid for the model
    return pts, w, model


@pytest.mark.parametrize("name", ["logistic", "poisson", "linear"])
def test_glm_density_equals_torch_up_to_a_constant(name):
    pts, w, model = _points(name)
    data = glm_data(model, pts, w)  # type: ignore[arg-type]
    assert data is not None and data.family == name
    with jax.enable_x64(True):
        f = glm_log_density(data.family, *(jax.numpy.asarray(a) for a in data.arrays()))
        thetas = np.random.default_rng(0).normal(size=(5, model.param_dim))  # type: ignore[attr-defined]
        ours = np.array([float(f(jax.numpy.asarray(t))) for t in thetas])
    ref = weighted_log_posterior(model, pts, w, torch.as_tensor(thetas)).numpy()  # type: ignore[arg-type]
    diff = ours - ref
    np.testing.assert_allclose(diff, diff[0], atol=1e-9)  # equal up to the normalising constant


@pytest.mark.parametrize("name", ["bnn", "gaussian_mean"])
def test_torch_callback_density_and_gradient(name):
    pts, w, model = _points(name)
    assert glm_data(model, pts, w) is None  # type: ignore[arg-type]
    f = torch_log_density(model, pts, w)  # type: ignore[arg-type]
    theta = np.random.default_rng(1).normal(size=model.param_dim)  # type: ignore[attr-defined]
    previous = bool(jax.config.jax_enable_x64)
    jax.config.update("jax_enable_x64", True)
    try:
        value, grad = jax.value_and_grad(f)(jax.numpy.asarray(theta))
    finally:
        jax.config.update("jax_enable_x64", previous)
    th = torch.as_tensor(theta).requires_grad_(True)
    lp = weighted_log_posterior(model, pts, w, th[None])[0]  # type: ignore[arg-type]
    (g,) = torch.autograd.grad(lp, th)
    assert float(value) == pytest.approx(float(lp), rel=1e-12)
    np.testing.assert_allclose(np.asarray(grad), g.numpy(), rtol=1e-10)
