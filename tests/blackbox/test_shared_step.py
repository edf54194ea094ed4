"""One BB-PSVI step for both paths (issue 30): the non-private constructors (minibatch data term)
and the private mechanism (data term from the noisy gradient statistic) share the loss
(:func:`dpsummary.blackbox.objective.coreset_loss`) and the update
(:func:`dpsummary.blackbox.core.apply_outer_gradient`).

Regression against outputs recorded from the code BEFORE the two copies were merged
(``data/bbpsvi_steps_before_issue30.json``, floats as ``float.hex``; re-record with
``python tests/blackbox/test_shared_step.py OUT.json`` only for an intended change of the
algorithm). Every scenario is seeded: the non-private steps by their ``torch.Generator``, the
private ones by the self-test's seeded :class:`~dpsummary.selftest.ReplayRandomness` (coins and
noise; the release itself draws them from OS entropy). When recorded, the merged code reproduced
every value bit for bit on the recording machine (re-recorded once, for issue 35's float slack:
clips reserve ``noise.float_slack``, which moves the private paths by up to 5e-2 relative in a
near-zero coordinate; with the slack set to 0 the old record is reproduced bit for bit); the tolerance below only allows for
floating-point differences between CPUs, far below what any change of the algorithm moves.
"""

from __future__ import annotations

import json
import sys
from pathlib import Path

import pytest
import torch

from dpsummary.blackbox import BBPSVI, BBSparseVI
from dpsummary.blackbox import dp_bb_psvi as dpb
from dpsummary.blackbox.core import WeightParam, make_state, outer_step
from dpsummary.blackbox.objective import InnerConfig
from dpsummary.models.bnn import BNN
from dpsummary.private import bnn as pb
from dpsummary.private.mechanism import PrivateRecords
from dpsummary.selftest import ReplayRandomness

RECORDED = Path(__file__).parent / "data" / "bbpsvi_steps_before_issue30.json"


def _hexes(t: torch.Tensor) -> list[str]:
    return [float(x).hex() for x in t.detach().flatten().tolist()]


def scenarios() -> dict[str, dict[str, list[str]]]:
    """Both paths, a few steps each, every value as ``float.hex``."""
    out: dict[str, dict[str, list[str]]] = {}
    model = BNN(2, widths=(5,))
    g = torch.Generator().manual_seed(0)
    data = model.simulate(model.sample_prior(1, g)[0], 80, g)
    inner = InnerConfig(steps=3, num_samples=2)
    # Non-private outer_step, inner moments continued and reset; learning-rate decay on.
    for reset in (False, True):
        g = torch.Generator().manual_seed(3)
        state = make_state(model, data[:6], WeightParam.softmax(6, 80.0, learn_total=True), 80, g,
                           learn_points=True, learn_labels=False, points_lr=0.05, weights_lr=0.1, total_lr=0.01,
                           inner=inner, init_sd=1e-3, warmup_steps=5, lr_decay=0.5, steps=4)
        for _ in range(4):
            state = outer_step(state, data, model, g, inner=inner, batch_size=20, outer_samples=3,
                               reset_moments=reset)
        rec = {k: _hexes(v) for k, v in dict(points=state.points, weights=state.weights, mu=state.mu,
                                             rho=state.rho, m=state.moments.m_mu).items()}
        rec["losses"] = [float(x).hex() for x in state.losses]
        out[f"outer_step_reset{reset}"] = rec
    # Non-private constructors (BB-SparseVI learns weights only: projected weights).
    for name, ctor in (("bbpsvi", BBPSVI(steps=3, batch_size=25, inner=InnerConfig(steps=3, num_samples=2),
                                         warmup_steps=4)),
                       ("bbsparsevi", BBSparseVI(steps=2, batch_size=25, inner=InnerConfig(steps=2, num_samples=2),
                                                 warmup_steps=2))):
        g = torch.Generator().manual_seed(5)
        st = ctor.init(data, model, 5, g)
        for _ in range(ctor.num_steps(5)):
            st = ctor.step(st, data, model, g)
        p, w = ctor.result(st)
        out[name] = {"points": _hexes(p), "weights": _hexes(w)}
    # Private: the release's fit_private on PrivateRecords, seeded coins, noise on and off.
    for zero in (False, True):
        recs = PrivateRecords(data, randomness=ReplayRandomness(7, shared=80, zero_noise=zero))
        fit = dpb.fit_private(recs, model, size=5, steps=4, sample_rate=0.3, noise_multiplier=1.0, clip_norm=2.0,
                             record_count=80.0,
                             initial_points=dpb.public_init(model, 5, torch.Generator().manual_seed(2)),
                             generator=torch.Generator().manual_seed(11), inner=InnerConfig(steps=3, num_samples=2),
                             outer_samples=3, warmup_steps=5)
        out[f"fit_private_zero{zero}"] = {k: _hexes(getattr(fit, k)) for k in ("points", "weights", "mu", "rho")}
    # Private steps on a learned-total state (the benchmark's path).
    recs = PrivateRecords(data, randomness=ReplayRandomness(9, shared=80))
    g = torch.Generator().manual_seed(13)
    state = make_state(model, dpb.public_init(model, 6, g), WeightParam.softmax(6, 80.0, learn_total=True), 80, g,
                       learn_points=True, learn_labels=True, points_lr=0.05, weights_lr=0.1, total_lr=0.01,
                       inner=inner, init_sd=1e-3, warmup_steps=5)
    for _ in range(3):
        state = dpb.private_step(state, recs, model, g, inner=inner, outer_samples=3, sample_rate=0.5, clip_norm=1.0,
                                noise_multiplier=1.0)
    out["private_step"] = {k: _hexes(v) for k, v in dict(points=state.points, weights=state.weights, mu=state.mu,
                                                        rho=state.rho).items()}
    return out


@pytest.fixture(scope="module")
def computed() -> dict[str, dict[str, list[str]]]:
    return scenarios()


RECORDED_VALUES: dict[str, dict[str, list[str]]] = json.loads(RECORDED.read_text())


@pytest.mark.parametrize("scenario", sorted(RECORDED_VALUES))
def test_both_paths_reproduce_the_outputs_recorded_before_the_merge(computed, scenario: str) -> None:
    want = RECORDED_VALUES[scenario]
    got = computed[scenario]
    assert sorted(got) == sorted(want)
    for field, values in want.items():
        expected = torch.tensor([float.fromhex(v) for v in values], dtype=torch.float64)
        actual = torch.tensor([float.fromhex(v) for v in got[field]], dtype=torch.float64)
        torch.testing.assert_close(actual, expected, rtol=1e-10, atol=1e-12, msg=f"{scenario}.{field}")


def test_the_private_step_is_the_shared_step() -> None:
    """private_step is statistic_step with the mechanism as the statistic: the same state after a
    step whether the statistic comes through private_step or is handed to statistic_step."""
    from dpsummary.blackbox.core import statistic_step

    model = BNN(2, widths=(4,))
    g = torch.Generator().manual_seed(1)
    data = model.simulate(model.sample_prior(1, g)[0], 40, g)
    inner = InnerConfig(steps=2, num_samples=2)

    def fresh() -> tuple:
        gen = torch.Generator().manual_seed(4)
        st = make_state(model, dpb.public_init(model, 4, gen), WeightParam.softmax_fixed(4, 40.0), 40, gen,
                        learn_points=True, learn_labels=True, points_lr=0.05, weights_lr=0.1, total_lr=0.0,
                        inner=inner, init_sd=1e-3, warmup_steps=3)
        return st, gen, PrivateRecords(data, randomness=ReplayRandomness(2, shared=40))

    a, ga, ra = fresh()
    a = dpb.private_step(a, ra, model, ga, inner=inner, outer_samples=2, sample_rate=0.5, clip_norm=1.0,
                        noise_multiplier=1.0)
    b, gb, rb = fresh()

    def mechanism(theta: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor]:
        s = pb.statistic(rb, model, theta, sample_rate=0.5, clip_norm=1.0, noise_multiplier=1.0)
        return s.L, s.G

    b = statistic_step(b, mechanism, model, gb, inner=inner, outer_samples=2, sample_rate=0.5)
    assert torch.equal(a.points, b.points) and torch.equal(a.weights, b.weights)
    assert torch.equal(a.mu, b.mu) and a.step == b.step == 1
    assert not torch.equal(a.points, fresh()[0].points)  # the step moved the coreset


if __name__ == "__main__":
    Path(sys.argv[1]).write_text(json.dumps(scenarios(), indent=0))
