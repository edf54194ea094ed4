"""Objective perturbation's ledger event (:mod:`dpsummary.objective_event`): its JSON, and the
accountants, which compose it under RDP only."""

from __future__ import annotations

import json
import math

import dp_accounting as dpa
import numpy as np
import pytest

from dpsummary import accounting as A
from dpsummary import rdp_curves
from dpsummary.objective_event import (
    ObjectivePerturbationDpEvent,
    dithered_objective_perturbation_rdp,
    objective_perturbation_jacobian,
)
from dpsummary.private.noise import TILT_GRID_RATIO

DELTA = 1e-6


def op(z: float = 4.0, dim: int = 10) -> ObjectivePerturbationDpEvent:
    return ObjectivePerturbationDpEvent(noise_multiplier=z, jacobian_log_ratio=0.05, dim=dim, grid_ratio=TILT_GRID_RATIO)


def test_the_event_round_trips_through_json_among_the_librarys_events() -> None:
    event = dpa.ComposedDpEvent([A.gaussian_event(5.0), dpa.SelfComposedDpEvent(op(), 2)])
    text = json.dumps(A.event_to_json(event), sort_keys=True)
    back = A.event_from_json(json.loads(text))
    assert back == event
    assert json.dumps(A.event_to_json(back), sort_keys=True) == text
    assert '"module_name": "dpsummary.objective_event"' in text


@pytest.mark.parametrize("edit", [
    {"module_name": "os"},                      # another module: never imported
    {"class_name": "GaussianDpEvent"},          # a class of another module
    {"dim": True},                              # a boolean is not a dimension
    {"dim": 2.5},
    {"noise_multiplier": -1.0},
    {"grid_ratio": 2.0},
    {"extra": 1},
])
def test_malformed_event_json_is_refused(edit: dict) -> None:
    good = A.event_to_json(op())
    with pytest.raises(A.UnsupportedEventError):
        A.event_from_json({**good, **edit})


def test_rdp_composes_the_curve_and_prv_and_pld_refuse_it() -> None:
    """The RDP accountant's epsilon is the conversion of the summed curves (Gaussian's and the
    dithered bound), by the vectorised series and by Opacus's loop alike; self-composition counts;
    the PRV and PLD accountants (and the triple history they read) refuse it."""
    events = [A.gaussian_event(5.0), op(), op()]
    curve = rdp_curves.gaussian_rdp(5.0) + 2 * dithered_objective_perturbation_rdp(
        noise_multiplier=4.0, jacobian_log_ratio=0.05, dim=10, grid_ratio=TILT_GRID_RATIO, orders=A.RDP_ORDERS)
    expected = rdp_curves.epsilon_of_rdp(curve, DELTA)
    assert A.epsilon(events, DELTA, "rdp") == pytest.approx(expected, rel=1e-12)
    assert A.epsilon_rdp_opacus(events, DELTA) == pytest.approx(expected, rel=1e-9)
    assert A.epsilon([A.gaussian_event(5.0), dpa.SelfComposedDpEvent(op(), 2)], DELTA) == pytest.approx(expected, rel=1e-12)
    assert A.epsilon([op()], DELTA) < A.epsilon([op(), op()], DELTA)
    for accountant in ("prv", "pld"):
        with pytest.raises(A.UnsupportedEventError, match="RDP accountant only"):
            A.epsilon(events, DELTA, accountant)
    with pytest.raises(A.UnsupportedEventError):
        A.events_to_history(events)
    assert A.rdp_only(events) and not A.rdp_only([A.gaussian_event(5.0)])


def test_the_curve_is_monotone_in_its_parameters() -> None:
    """More noise costs less; a larger Jacobian term, grid or dimension never costs less."""
    base = dict(noise_multiplier=4.0, jacobian_log_ratio=0.05, dim=10, grid_ratio=1e-3, orders=A.RDP_ORDERS)
    ref = dithered_objective_perturbation_rdp(**base)
    for change, worse in (({"noise_multiplier": 5.0}, False), ({"jacobian_log_ratio": 0.1}, True),
                          ({"grid_ratio": 1e-2}, True), ({"dim": 40}, True)):
        other = dithered_objective_perturbation_rdp(**{**base, **change})
        assert np.all(other >= ref) if worse else np.all(other <= ref), change
    assert objective_perturbation_jacobian(curvature_bound=1.0, ridge=4.0) == pytest.approx(-math.log(0.75))
