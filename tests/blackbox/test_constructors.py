"""Contract of the black-box constructors (init/step/result, shapes, determinism, supports) and
the cross-check against today's PSVI on a logistic model."""

from __future__ import annotations

from functools import cache

import pytest
import torch

from dpsummary.blackbox import (
    BBPSVI,
    REGISTRY,
    BBPruning,
    BBSparseVI,
    BBSparseVIIncremental,
    InnerConfig,
)
from dpsummary.blackbox.constructors import FullDataVI, RandomSubsetVI
from dpsummary.blackbox.evaluate import evaluate_variational, expected_calibration_error
from dpsummary.constructors import PSVI, Summary, Uniform, fit
from dpsummary.metrics import evaluate, full_posterior
from dpsummary.models import DTYPE, LogisticRegression, Model
from dpsummary.models.bnn import BNN

FAST = InnerConfig(steps=3, lr=0.05, num_samples=4)
CTORS = {
    "bb-psvi": lambda: BBPSVI(steps=3, inner=FAST, batch_size=32, warmup_steps=5),
    "bb-sparsevi": lambda: BBSparseVI(steps=3, inner=FAST, batch_size=32, warmup_steps=5),
    "bb-sparsevi-incremental": lambda: BBSparseVIIncremental(inner=FAST, weight_steps=2, batch_size=32,
                                                             num_samples=8, warmup_steps=5),
    "bb-sparsevi-pruning": lambda: BBPruning(factors=(3.0,), round_steps=2, inner=FAST, batch_size=32,
                                             warmup_steps=5),
    "random-subset-vi": lambda: RandomSubsetVI(steps=2, inner=FAST),
    "full-data-vi": lambda: FullDataVI(steps=2, inner=FAST, batch_size=32),
}
MODELS = {
    "bernoulli": lambda: BNN(2, widths=(6,)),
    "softmax": lambda: BNN(2, widths=(6, 5), likelihood="softmax", num_classes=3, activation="tanh"),
    "gaussian": lambda: BNN(2, widths=(6,), likelihood="gaussian", noise_scale=0.5),
    "logistic": lambda: LogisticRegression(2),
}


@cache
def problem(model_name: str) -> tuple[Model, torch.Tensor]:
    model = MODELS[model_name]()
    g = torch.Generator().manual_seed(5)
    return model, model.simulate(model.sample_prior(1, g)[0], 120, g)


def test_registry_names_match() -> None:
    assert set(REGISTRY) == set(CTORS)
    for name, factory in REGISTRY.items():
        assert factory().name == name


@pytest.mark.parametrize("model_name", list(MODELS))
@pytest.mark.parametrize("method", list(CTORS))
def test_result_contract(method: str, model_name: str) -> None:
    model, data = problem(model_name)
    size = 6
    summary = fit(CTORS[method](), data, model, size, generator=torch.Generator().manual_seed(0))
    assert isinstance(summary, Summary) and summary.method == method
    k = summary.size
    assert summary.points.shape == (k, model.point_dim) and summary.weights.shape == (k,)
    assert summary.points.dtype == DTYPE and summary.weights.dtype == DTYPE
    assert torch.isfinite(summary.points).all() and torch.isfinite(summary.weights).all()
    assert (summary.weights >= 0).all() and (summary.weights > 0).any()
    if method == "full-data-vi":
        assert k == data.shape[0]
    else:
        assert 1 <= k <= (size if method != "bb-sparsevi-pruning" else size)
    if method in ("bb-sparsevi", "bb-sparsevi-incremental", "bb-sparsevi-pruning", "random-subset-vi"):
        assert (summary.points[:, None, :] == data[None]).all(-1).any(1).all()  # records of the data
    if model_name == "softmax":  # soft labels stay on the simplex
        y = summary.points[:, model.num_features:]
        assert (y >= 0).all()
        torch.testing.assert_close(y.sum(1), torch.ones(k, dtype=DTYPE))
    if model_name in ("bernoulli", "logistic"):
        assert ((summary.points[:, -1] >= 0) & (summary.points[:, -1] <= 1)).all()


@pytest.mark.parametrize("method", list(CTORS))
def test_deterministic_given_seed(method: str) -> None:
    model, data = problem("bernoulli")
    runs = []
    for _ in range(2):
        ctor = CTORS[method]()
        g = torch.Generator().manual_seed(11)
        state = ctor.init(data, model, 5, g)
        for _ in range(ctor.num_steps(5)):
            state = ctor.step(state, data, model, g)
        runs.append((*ctor.result(state), *ctor.variational(state)))
    for a, b in zip(*runs, strict=True):
        torch.testing.assert_close(a, b, rtol=0, atol=0)


def test_bb_psvi_moves_points_labels_and_weights() -> None:
    model, data = problem("bernoulli")
    ctor = BBPSVI(steps=5, inner=FAST, batch_size=32, warmup_steps=5)
    g = torch.Generator().manual_seed(0)
    state = ctor.init(data, model, 6, g)
    p0, w0 = (t.detach().clone() for t in ctor.result(state))
    for _ in range(5):
        state = ctor.step(state, data, model, g)
    p1, w1 = ctor.result(state)
    assert not torch.equal(p0[:, :2], p1[:, :2]) and not torch.equal(p0[:, 2], p1[:, 2])
    assert not torch.equal(w0, w1)
    assert len(state.losses) == 5 and all(map(lambda v: v == v, state.losses))
    frozen = BBPSVI(steps=5, inner=FAST, batch_size=32, warmup_steps=5, learn_labels=False)
    state = frozen.init(data, model, 6, torch.Generator().manual_seed(0))
    labels = state.points.detach()[:, 2].clone()
    state = frozen.step(state, data, model, torch.Generator().manual_seed(1))
    assert torch.equal(state.points.detach()[:, 2], labels)


def test_pruning_shrinks_to_size() -> None:
    model, data = problem("bernoulli")
    ctor = BBPruning(factors=(4.0, 2.0), round_steps=2, inner=FAST, batch_size=32, warmup_steps=2)
    g = torch.Generator().manual_seed(0)
    state = ctor.init(data, model, 5, g)
    assert state.bb.points.shape[0] == 20 and state.sizes == (20, 10, 5)
    for _ in range(ctor.num_steps(5)):
        state = ctor.step(state, data, model, g)
    assert state.round == 2 and ctor.result(state)[0].shape[0] == 5


def test_ece_formula() -> None:
    probs = torch.tensor([[0.9, 0.1], [0.8, 0.2], [0.4, 0.6], [0.3, 0.7]], dtype=DTYPE)
    labels = torch.tensor([0, 1, 1, 1])
    # bins: 0.9 -> (0.8, 0.9] correct; 0.8 -> (0.7, 0.8] wrong; 0.6 (0.5, 0.6] right; 0.7 (0.6, 0.7] right.
    expected = 0.25 * (0.1 + 0.8 + 0.4 + 0.3)
    assert abs(expected_calibration_error(probs, labels) - expected) < 1e-12
    assert expected_calibration_error(torch.tensor([[1.0, 0.0]], dtype=DTYPE), torch.tensor([0])) == 0.0


def test_bnn_predictive_beats_chance_on_separable_data() -> None:
    """A real learning signal: full-data VI on a noiseless linear boundary reaches > 90%."""
    model = BNN(2, widths=(8,))
    g = torch.Generator().manual_seed(0)
    x = torch.randn(300, 2, generator=g, dtype=DTYPE)
    data = torch.cat([x, (x[:, :1] + x[:, 1:] > 0).to(DTYPE)], 1)
    ctor = FullDataVI(steps=15, inner=InnerConfig(steps=20, lr=0.05, num_samples=4), batch_size=64)
    state = ctor.init(data[:200], model, 1, g)
    for _ in range(15):
        state = ctor.step(state, data[:200], model, g)
    m = evaluate_variational(model, state.mu, state.rho, data[200:], torch.Generator().manual_seed(1))
    assert m["accuracy"] > 0.9 and m["test_ll"] > -0.4, m


# ---- cross-check against today's PSVI on logistic regression -----------------------------------
# Calibration (N = 200, M = 10, 6 seeds, 100 steps; see the issue-16 report): PSVI's KL(summary ||
# full) / KL(prior || full) ranged 0.002-0.016, BB-PSVI's 0.0035-0.027, uniform subsampling's
# 0.36-6.7: 0 of 6 seeds break the bound below (failure rate 0/6; the test is deterministic, fixed
# seeds). At 40 steps one seed of three reached 0.054 (not converged), so the test keeps 100. It
# asks, on 3 seeds, that BB-PSVI stay within 5x of PSVI or below 0.05 on every seed, and on
# average below 5% of uniform's: it fails if the black-box gradient is wrong (weights or points
# drift) or the inner fit does not track the coreset posterior.
def test_bb_psvi_kl_comparable_to_psvi_on_logistic() -> None:
    model = LogisticRegression(2)
    kls: dict[str, list[float]] = {"psvi": [], "bb": [], "uniform": []}
    for seed in range(3):
        g = torch.Generator().manual_seed(1000 + seed)
        data = model.simulate(model.sample_prior(1, g)[0], 200, g)
        full = full_posterior(model, data)
        ctors = {"psvi": PSVI(steps=100, num_samples=30, batch_size=100),
                 "bb": BBPSVI(steps=100, inner=InnerConfig(steps=10, lr=0.05, num_samples=10), batch_size=100,
                              points_lr=0.05, warmup_steps=100, init_sd=0.1),
                 "uniform": Uniform()}
        for name, ctor in ctors.items():
            s = fit(ctor, data, model, 10, generator=torch.Generator().manual_seed(seed))
            kls[name].append(evaluate(model, s.points, s.weights, full)["forward_normalised"])
    for bb, ps in zip(kls["bb"], kls["psvi"], strict=True):
        assert bb <= max(5 * ps, 0.05), kls
    assert sum(kls["bb"]) < 0.05 * sum(kls["uniform"]), kls


def test_lr_decay_reaches_its_fraction() -> None:
    model, data = problem("bernoulli")
    ctor = BBPSVI(steps=4, inner=FAST, batch_size=32, warmup_steps=2, lr_decay=0.01)
    g = torch.Generator().manual_seed(0)
    state = ctor.init(data, model, 5, g)
    for _ in range(4):
        state = ctor.step(state, data, model, g)
    lrs = [grp["lr"] for grp in state.optimizer.param_groups]
    assert lrs[0] == pytest.approx(0.01 * ctor.weights_lr) and lrs[-1] == pytest.approx(0.01 * ctor.points_lr)
    with pytest.raises(ValueError):
        BBPSVI(lr_decay=0.0).init(data, model, 5, g)


def test_reference_settings_options_float32() -> None:
    """float32 data run in float32 throughout; fresh inner moments each outer step; the uniform
    (torch.nn.Linear) initial means lie in +-1/sqrt(fan_in); fixed labels stay."""
    model = BNN(2, widths=(8,), likelihood="softmax", num_classes=2)
    g = torch.Generator().manual_seed(5)
    data = model.simulate(model.sample_prior(1, g)[0], 60, g).to(torch.float32)
    ctor = BBPSVI(steps=2, inner=InnerConfig(steps=3, lr=1e-3, kl_weight=0.1), batch_size=16, learn_labels=False,
                  learn_total=False, init_sd=1e-6, warmup_steps=0, reset_inner_moments=True, init_scheme="uniform")
    state = ctor.init(data, model, 6, g)
    labels0 = state.points.detach()[:, 2:].clone()
    assert float(state.mu[:16].abs().max()) <= 2 ** -0.5 and float(state.mu[24:32].abs().max()) <= 8 ** -0.5
    for _ in range(2):
        state = ctor.step(state, data, model, g)
    assert state.mu.dtype == state.points.dtype == state.weights.dtype == torch.float32
    assert state.moments.count == 3  # restarted, not 6
    assert torch.isfinite(state.mu).all() and torch.isfinite(state.points).all()
    assert torch.equal(state.points.detach()[:, 2:], labels0)
    torch.testing.assert_close(float(state.weights.detach().sum()), 60.0, rtol=1e-5, atol=0)
