"""The analyst's checks (effects found, wrong signs) and the idealised floor of issue 27."""

from __future__ import annotations

import math

import numpy as np
import pytest
import torch

from dpsummary import accounting as acc
from dpsummary.gaussian import GaussianPosterior
from dpsummary.inference import prior_posterior
from dpsummary.metrics import (
    Z95,
    data_hessian,
    effects,
    full_posterior,
    idealised_floor,
    trust_report,
)
from dpsummary.models import DTYPE, LogisticRegression


def _gaussian(mean: list[float], sd: list[float]) -> GaussianPosterior:
    m = torch.tensor(mean, dtype=DTYPE)
    prec = torch.diag(1.0 / torch.tensor(sd, dtype=DTYPE) ** 2)
    return GaussianPosterior.from_precision(prec, prec @ m)


def _table(n: int, seed: int) -> tuple[LogisticRegression, torch.Tensor]:
    g = torch.Generator().manual_seed(seed)
    model = LogisticRegression(4)
    x = torch.rand(n, 4, generator=g, dtype=DTYPE) * 2 - 1
    theta = torch.tensor([-0.5, 1.0, -1.0, 0.0, 0.3], dtype=DTYPE)
    return model, model.simulate(theta, n, g, features=x)


def test_effects_sign_and_threshold() -> None:
    mean = torch.tensor([2.0, -2.0, 0.5, -0.1], dtype=DTYPE)
    sd = torch.tensor([1.0, 1.0, 1.0, 0.01], dtype=DTYPE)
    assert effects(mean, sd).tolist() == [1.0, -1.0, 0.0, -1.0]


def test_trust_report_counts_found_and_wrong_sign() -> None:
    full = _gaussian([1.0, -1.0, 1.0, 0.0], [0.1, 0.1, 0.1, 0.1])
    # coordinate 0 found, 1 missed (interval covers 0), 2 found with the WRONG sign, 3 not an effect.
    summ = _gaussian([1.0, -0.1, -1.0, 0.5], [0.2, 0.2, 0.2, 0.2])
    rep = trust_report(summ, full, _gaussian([0.0] * 4, [1.0] * 4))
    assert rep.effects_full == 3
    assert rep.effects_found == 1
    assert rep.effects_wrong_sign == 1
    assert rep.param_dim == 4
    assert rep.width_vs_floor is None and rep.effects_vs_floor is None


def test_floor_sd_matches_closed_form() -> None:
    model, pts = _table(3000, 0)
    full = full_posterior(model, pts)
    fl = idealised_floor(model, pts, full, epsilon=0.5, delta=1e-6, draws=50)
    m = full.mean
    h = data_hessian(model, pts, m)
    r = float(model.record_scores(pts, m).norm(dim=1).max())
    sigma = acc.calibrate_gaussian(target_epsilon=0.4, delta=1e-6)
    eye = torch.eye(model.param_dim, dtype=DTYPE)
    prec = h @ torch.linalg.solve(h + (sigma * r) ** 2 * eye, h) + eye / model.prior_scale**2
    expected = torch.sqrt(torch.diagonal(torch.linalg.inv(0.5 * (prec + prec.T))))
    assert torch.allclose(fl.sd, expected, rtol=1e-8)
    assert math.isclose(fl.noise_multiplier, sigma)
    assert math.isclose(fl.sensitivity, r)
    # The floor's curvature is the data Hessian at the mode, a sum of p(1-p) z z^T.
    w, z = model.record_curvature_factors(pts, m)
    assert torch.allclose(h, (z * w[:, None]).T @ z)


def test_floor_reaches_full_posterior_without_noise() -> None:
    """At a huge epsilon the floor's noise vanishes: its posterior is the full-data one, so it finds
    every full-data effect and covers (deterministic up to the 200 draws; sigma ~ 1e-3 here)."""
    model, pts = _table(3000, 1)
    full = full_posterior(model, pts)
    fl = idealised_floor(model, pts, full, epsilon=5000.0, delta=1e-6)
    sd_f = torch.sqrt(torch.diagonal(full.cov))
    n_eff = int((effects(full.mean, sd_f) != 0).sum())
    assert fl.width_ratio < 1.01
    assert fl.effects_found == n_eff
    assert fl.coverage == 1.0


def test_floor_shrinks_with_epsilon_and_report_ratios() -> None:
    model, pts = _table(3000, 2)
    full = full_posterior(model, pts)
    small = idealised_floor(model, pts, full, epsilon=0.2, delta=1e-6)
    large = idealised_floor(model, pts, full, epsilon=2.0, delta=1e-6)
    assert small.width_ratio > large.width_ratio > 1.0
    assert small.effects_found <= large.effects_found
    # A release exactly as wide as the full posterior and centred on it: width_vs_floor = 1 / floor width.
    rep = trust_report(full, full, prior_posterior(model), floor=large)
    assert math.isclose(rep.width_vs_floor or 0.0, 1.0 / large.width_ratio)
    assert rep.effects_found == rep.effects_full
    if large.effects_found > 0:
        assert math.isclose(rep.effects_vs_floor or 0.0, rep.effects_found / large.effects_found)
    assert Z95 > 1.95


def test_report_floor_from_claim() -> None:
    """`dpsummary report` computes the floor at the claim's epsilon (accountant of record) and delta."""
    from dpsummary.report import _floor

    model, pts = _table(2000, 3)
    full = full_posterior(model, pts)
    claim = {"epsilon": {"rdp": 0.5, "pld": 0.45}, "delta": 1e-6, "accountant_of_record": "rdp"}
    fl = _floor(model, pts, full, claim, seed=0)
    assert fl is not None
    direct = idealised_floor(model, pts, full, epsilon=0.5, delta=1e-6, generator=torch.Generator().manual_seed(0))
    assert torch.allclose(fl.sd, direct.sd) and fl.effects_found == direct.effects_found
    assert _floor(model, pts, full, {"delta": 1e-6}, seed=0) is None


def test_floor_counts_the_wrong_sign_effects_its_prior_shrinkage_makes():
    """Two features correlated 0.99 with effects of opposite sign (the calibration suite's
    sim_correlated in miniature): the full-data mean's small positive coefficient sits beside a
    large negative one, and the floor's noisy posterior, shrunk along their poorly identified
    difference, puts it confidently below 0 in every draw; without noise it makes none."""
    rng = np.random.default_rng(0)
    n = 5000
    z1, z2 = rng.normal(size=n), rng.normal(size=n)
    x2 = 0.99 * z1 + math.sqrt(1 - 0.99**2) * z2
    y = (rng.uniform(size=n) < 1 / (1 + np.exp(-(0.5 + 2.6 * z1 - 4.7 * x2)))).astype(float)
    pts = torch.tensor(np.c_[z1 / 4, x2 / 4, y], dtype=torch.float64)
    model = LogisticRegression(2)
    full = full_posterior(model, pts)
    assert float(full.mean[1]) > 0 > float(full.mean[2])
    noisy = idealised_floor(model, pts, full, epsilon=1.0, delta=1e-6)
    assert noisy.wrong_sign == pytest.approx(1.0)
    assert idealised_floor(model, pts, full, epsilon=1e4, delta=1e-6).wrong_sign == 0.0


def test_floor_handicaps_replace_sensitivity_and_multiplier() -> None:
    """``sensitivity`` and ``noise_multiplier`` replace R and sigma in the closed form: a larger
    (public) bound or a smaller share of the budget only widens the floor, and passing the floor's
    own values reproduces it exactly."""
    model, pts = _table(3000, 4)
    full = full_posterior(model, pts)
    base = idealised_floor(model, pts, full, epsilon=0.5, delta=1e-6, draws=50)
    same = idealised_floor(model, pts, full, epsilon=0.5, delta=1e-6, draws=50, sensitivity=base.sensitivity,
                           noise_multiplier=base.noise_multiplier)
    assert torch.equal(same.sd, base.sd) and same.coverage == base.coverage
    wide = idealised_floor(model, pts, full, epsilon=0.5, delta=1e-6, draws=50, sensitivity=3 * base.sensitivity,
                           noise_multiplier=2 * base.noise_multiplier)
    assert wide.sensitivity == 3 * base.sensitivity and wide.noise_multiplier == 2 * base.noise_multiplier
    assert bool((wide.sd > base.sd).all())
    h = data_hessian(model, pts, full.mean)
    eye = torch.eye(model.param_dim, dtype=DTYPE)
    tau = (6 * base.sensitivity * base.noise_multiplier) ** 2
    prec = h @ torch.linalg.solve(h + tau * eye, h) + eye / model.prior_scale**2
    assert torch.allclose(wide.sd, torch.sqrt(torch.diagonal(torch.linalg.inv(0.5 * (prec + prec.T)))), rtol=1e-8)
