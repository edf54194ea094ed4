"""Contract tests shared by every coreset constructor on every registered model.

Small simulated problems (2 features, N = 200) and reduced optimisation budgets keep the whole
module to a few seconds per constructor.
"""

from __future__ import annotations

from collections.abc import Callable
from functools import cache
from typing import Any

import pytest
import torch

from dpsummary.constructors import (
    GIGA,
    PSVI,
    REGISTRY,
    Lightweight,
    SparseVI,
    Summary,
    Uniform,
    applies,
    fit,
)
from dpsummary.metrics import evaluate, full_posterior
from dpsummary.models import DTYPE, Model
from dpsummary.models import REGISTRY as MODELS


@pytest.fixture(autouse=True, scope="module")
def _single_thread():
    """Small-tensor work is fastest single-threaded; on a loaded 2-core machine torch's default
    intra-op threads spin against each other (measured: 10x slower). Restored afterwards."""
    old = torch.get_num_threads()
    torch.set_num_threads(1)
    yield
    torch.set_num_threads(old)

N = 200
NUM_FEATURES = 2

# Reduced budgets: the contract does not need converged optimisers.
CONSTRUCTORS: dict[str, Callable[[], Any]] = {
    "uniform": Uniform,
    "lightweight": Lightweight,
    "giga": GIGA,
    "giga-realistic": lambda: GIGA(weighting="realistic", name="giga-realistic"),
    "sparsevi": lambda: SparseVI(inner_steps=8, num_samples=20, batch_size=100),
    "psvi": lambda: PSVI(steps=40, num_samples=30, batch_size=100),
}
#: Constructors whose points are records of the data set (all but the pseudocoreset).
SUBSET_METHODS = {"uniform", "lightweight", "giga", "giga-realistic", "sparsevi"}


@cache
def problem(model_name: str, seed: int) -> tuple[Model, torch.Tensor]:
    model = MODELS[model_name](NUM_FEATURES)
    g = torch.Generator().manual_seed(1000 + seed)
    theta = model.sample_prior(1, g)[0]
    return model, model.simulate(theta, N, g)


def run(method: str, model_name: str, size: int, seed: int = 0, data_seed: int = 0) -> Summary:
    model, data = problem(model_name, data_seed)
    return fit(CONSTRUCTORS[method](), data, model, size, generator=torch.Generator().manual_seed(seed))


#: (method, model) pairs filtered by declared capability (``constructors.applies``), not by name:
#: on the Gaussian mixture (``parameter_draws = False``) only the model-free constructors run.
pairs = pytest.mark.parametrize(("method", "model_name"), [
    (m, n) for m in CONSTRUCTORS for n in sorted(MODELS) if applies(CONSTRUCTORS[m](), MODELS[n](NUM_FEATURES))
])
#: The KL metric compares with the Gaussian (Laplace/exact) posterior of theta: only models that
#: support parameter draws.
kl_pairs = pytest.mark.parametrize(("method", "model_name"), [
    (m, n) for m in CONSTRUCTORS for n in sorted(MODELS)
    if getattr(MODELS[n], "parameter_draws", True) and applies(CONSTRUCTORS[m](), MODELS[n](NUM_FEATURES))
])


def test_registry_lists_every_method() -> None:
    assert set(REGISTRY) == {"uniform", "lightweight", "giga", "giga-realistic", "sparsevi", "psvi"}
    assert REGISTRY["giga"]().weighting == "optimal"
    realistic = REGISTRY["giga-realistic"]()
    assert realistic.weighting == "realistic" and realistic.name == "giga-realistic"
    for name, factory in REGISTRY.items():
        assert factory().name == name


@pairs
def test_result_contract(method: str, model_name: str) -> None:
    size = 6
    model, data = problem(model_name, 0)
    summary = run(method, model_name, size)
    assert isinstance(summary, Summary)
    assert summary.method == CONSTRUCTORS[method]().name
    assert summary.model == model
    k = summary.size
    assert 1 <= k <= size
    assert summary.points.shape == (k, model.point_dim)
    assert summary.weights.shape == (k,)
    assert summary.points.dtype == DTYPE and summary.weights.dtype == DTYPE
    assert torch.isfinite(summary.points).all()
    assert torch.isfinite(summary.weights).all()
    if method == "psvi":
        assert (summary.weights > 0).all()
    else:
        assert (summary.weights >= 0).all()
        assert (summary.weights > 0).any()
    if method in SUBSET_METHODS:
        # Every point is a record, and no record appears twice (duplicates are merged).
        match = (summary.points[:, None, :] == data[None, :, :]).all(-1)
        assert match.any(1).all()
        rows = match.to(torch.int64).argmax(1)
        assert rows.unique().numel() == k


@pairs
def test_deterministic_given_seed(method: str, model_name: str) -> None:
    a = run(method, model_name, 5, seed=7)
    b = run(method, model_name, 5, seed=7)
    torch.testing.assert_close(a.points, b.points, rtol=0, atol=0)
    torch.testing.assert_close(a.weights, b.weights, rtol=0, atol=0)


@pytest.mark.parametrize("method", ["uniform", "psvi"])
def test_fixed_size_methods_return_size_points(method: str) -> None:
    assert run(method, "logistic", 7).size == 7


def test_lightweight_weights_estimate_n() -> None:
    # Duplicate draws are merged, but sum_m w_m stays an unbiased estimate of N.
    totals = torch.stack([run("lightweight", "logistic", 20, seed=s).weights.sum() for s in range(40)])
    assert abs(float(totals.mean()) - N) < 0.1 * N


def test_lightweight_proposal_formula() -> None:
    from dpsummary.constructors.lightweight import lightweight_proposal

    data = torch.tensor([[0.0, 0.0], [2.0, 0.0], [0.0, 4.0], [2.0, 4.0]], dtype=DTYPE)
    q = lightweight_proposal(data)
    d2 = ((data - data.mean(0)) ** 2).sum(1)
    torch.testing.assert_close(q, 1 / 8 + d2 / (2 * d2.sum()))
    torch.testing.assert_close(q.sum(), torch.tensor(1.0, dtype=DTYPE))


def test_giga_hilbert_error_decreases() -> None:
    """GIGA's objective ||L(w) - L|| (in the projection) is non-increasing in the iterations."""
    model, data = problem("logistic", 0)
    ctor = GIGA()
    state = ctor.init(data, model, 30, torch.Generator().manual_seed(0))
    feats = state.features * state.norms[:, None]
    target = feats.sum(0)
    errors = []
    for _ in range(30):
        state = ctor.step(state, data, model, torch.Generator())
        align = max(float(state.ell_w @ state.ell), 0.0)
        w = state.weights * state.total_norm / state.norms[state.active] * align
        errors.append(float((w @ feats[state.active] - target).norm() / target.norm()))
    assert all(b <= a + 1e-10 for a, b in zip(errors, errors[1:], strict=False))
    assert errors[-1] < 0.7 * errors[0]


def test_giga_realistic_weighting_is_valid_gaussian() -> None:
    model, data = problem("logistic", 0)
    for seed in range(5):
        pi_hat = GIGA(weighting="realistic").weighting_distribution(data, model, torch.Generator().manual_seed(seed))
        assert torch.isfinite(pi_hat.mean).all()
        assert (torch.linalg.eigvalsh(pi_hat.cov) > 0).all()


# KL(summary || full) must fall from M = 3 to M = 30 (seed-averaged, prior-normalised): mean
# KL(30) < mean KL(3), unless mean KL(30) < 1% of KL(prior || full) (the summary is then
# essentially exact: the Gaussian-mean pseudocoresets and GIGA match that posterior with 3
# points). Calibration with these budgets over 4 disjoint groups of 3 seeds for all 24
# combinations (96 averages): the largest ratio KL(30) / KL(3) above the floor was 0.70 (PSVI,
# logistic; all others <= 0.53), so the strict bound leaves a 30% margin and the test essentially
# never fails by chance; it is deterministic anyway (fixed seeds).
KL_SEEDS = range(3)


@kl_pairs
def test_kl_decreases_with_size(method: str, model_name: str) -> None:
    kls = {3: 0.0, 30: 0.0}
    for seed in KL_SEEDS:
        model, data = problem(model_name, seed)
        full = full_posterior(model, data)
        for size in kls:
            s = run(method, model_name, size, seed=seed, data_seed=seed)
            kls[size] += evaluate(model, s.points, s.weights, full)["forward_normalised"] / len(KL_SEEDS)
    assert kls[30] < max(kls[3], 1e-2), kls
