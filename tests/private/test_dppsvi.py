"""DP-PSVI's public clip-norm reference (dpsummary.constructors.dppsvi).

Statistical tolerances: each randomised bound states its failure probability under a correct
implementation; the generators are seeded, so the outcome is fixed for a given torch version.
"""

from __future__ import annotations

import math

import torch

from dpsummary.constructors.dppsvi import DPPSVI
from dpsummary.models import DTYPE, LogisticRegression
from dpsummary.private.mechanism import PrivateRecords


def _uniform_features(n: int, g: torch.Generator, d: int = 5) -> torch.Tensor:
    return torch.rand(n, d, generator=g, dtype=DTYPE) * 2 - 1


def _constructor(**kwargs: object) -> DPPSVI:
    return DPPSVI(noise_multiplier=1.0, sample_rate=0.5, record_count=100.0, steps=1, clip_rule="synthetic",
                  num_reference=4000, feature_sampler=_uniform_features, **kwargs)  # type: ignore[arg-type]


def test_default_reference_targets_carry_no_relation_to_features() -> None:
    model = LogisticRegression(5)
    records = PrivateRecords(torch.zeros(10, 6, dtype=DTYPE))
    state = _constructor().init(records, model, 3, torch.Generator().manual_seed(0))
    ref = state.info["clip_reference"]
    x, y = ref[:, :-1], ref[:, -1]
    n = ref.shape[0]
    # Targets ~ Bernoulli(0.5) independently of x: the mean is within 5 standard errors of 1/2
    # (failure probability 6e-7) and every feature-target correlation within 5/sqrt(n) (each
    # about 6e-7, so 3e-6 for the 5 features).
    assert abs(float(y.mean()) - 0.5) < 5 * 0.5 / math.sqrt(n)
    for j in range(x.shape[1]):
        r = float(torch.corrcoef(torch.stack([x[:, j], y]))[0, 1])
        assert abs(r) < 5 / math.sqrt(n)


def test_a_reference_the_posterior_can_explain_collapses_the_clip_norm() -> None:
    """Why the reference's targets must not depend on the features: under posterior draws around a
    confident theta*, records whose targets theta* generated are predicted well, their centred
    log-likelihood vectors are short, and the clip norm taken from them collapses; coin-flip
    targets keep it at the scale of the posterior's spread."""
    model = LogisticRegression(5)
    g = torch.Generator().manual_seed(1)
    theta_star = torch.tensor([0.5, 4.0, -4.0, 3.0, -3.0, 4.0], dtype=DTYPE)
    draws = theta_star + 0.05 * torch.randn(100, 6, generator=g, dtype=DTYPE)
    records = PrivateRecords(torch.zeros(10, 6, dtype=DTYPE))
    c = _constructor()
    state = c.init(records, model, 3, torch.Generator().manual_seed(2))
    coin_flip_clip = c.clip_norm(model, state, draws)
    explained = model.simulate(theta_star, 4000, g, features=_uniform_features(4000, g))
    state.info["clip_reference"] = explained
    explained_clip = c.clip_norm(model, state, draws)
    assert explained_clip < 0.25 * coin_flip_clip


def test_target_sampler_sets_initial_and_reference_targets() -> None:
    # Count targets drawn from a released marginal (here: always 30) replace the simulated ones,
    # for the pseudopoints and for the clip-norm reference records alike; features are untouched.
    from dpsummary.models import PoissonRegression

    model = PoissonRegression(5)
    records = PrivateRecords(torch.zeros(10, 6, dtype=DTYPE))

    def thirty(n: int, g: torch.Generator) -> torch.Tensor:
        return torch.full((n,), 30.0, dtype=DTYPE)

    state = _constructor(target_sampler=thirty).init(records, model, 7, torch.Generator().manual_seed(0))
    assert bool((state.points[:, -1] == 30.0).all())
    assert bool((state.info["clip_reference"][:, -1] == 30.0).all())
    plain = _constructor().init(records, model, 7, torch.Generator().manual_seed(0))
    assert torch.equal(plain.points[:, :-1], state.points[:, :-1])
    assert not bool((plain.points[:, -1] == 30.0).all())
