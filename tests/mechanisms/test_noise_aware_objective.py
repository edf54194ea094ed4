"""``noise-aware-objective`` (issue 50's objective perturbation as a release option): its public
refusals, its calibration, its claim and ledger under RDP alone, and its last round's reading.
The contract every mechanism passes (events, neighbour replay with the coupled tilt, refusal
before reading, settlement) is in ``test_mechanism_contract.py``."""

from __future__ import annotations

import math
from pathlib import Path

import pytest
import torch
from release_support import ledger_lines, write_csv, write_policy

from dpsummary import accounting as acc
from dpsummary.errors import Refusal
from dpsummary.models import DTYPE, LogisticRegression
from dpsummary.noise_aware.objective import (
    OP_JACOBIAN_SHARE,
    OP_OUTPUT_MULTIPLIER,
    TILT_GRID_RATIO,
    calibrate_objective,
    objective_round,
    objective_schedule,
)
from dpsummary.objective_event import ObjectivePerturbationDpEvent
from dpsummary.plan import ReleaseRequest
from dpsummary.release import run_release

N = 2000


def _request(tmp: Path, *, accountant: str = "rdp", **kw: object) -> ReleaseRequest:
    data = write_csv(tmp / "d.csv", N, seed=3, target="binary")
    policy = write_policy(tmp / f"p-{accountant}.toml", n=N, extra=f'accountant = "{accountant}"', total_epsilon=10.0)
    options = {"mechanism": "noise-aware-objective", "model": "logistic", "size": 3, "seed": 0, **kw}
    return ReleaseRequest(data=data, epsilon=1.0, policy=policy, out=tmp / "o.dpsummary.json",
                          ledger=tmp / "ledger.jsonl", **options)  # type: ignore[arg-type]


def test_the_plan_sizes_the_ridge_from_epsilon_and_calibrates_to_it() -> None:
    """The ridge's Jacobian term is OP_JACOBIAN_SHARE of epsilon; the shares are today's first
    round, then the rest split as today's last round; the calibrated scale meets the target under
    RDP (Opacus's loop for the Gaussian parts) and 1e-4 less does not; other accountants refuse."""
    from dpsummary.noise_aware import Schedule

    model = LogisticRegression(3)
    plan = objective_schedule(model, epsilon=0.5, feature_norm=math.sqrt(3))
    assert plan.jacobian == pytest.approx(OP_JACOBIAN_SHARE * 0.5, rel=1e-12)
    assert plan.design_norm == pytest.approx(2.0)
    base = Schedule.default(model).rounds
    assert plan.schedule.rounds[0] == base[0]
    assert sum(sum(r) for r in plan.schedule.rounds) == pytest.approx(1.0)
    assert plan.schedule.rounds[1][0] / plan.schedule.rounds[1][1] == pytest.approx(base[-1][0] / base[-1][1])
    prior = [acc.gaussian_event(30.0)]
    sigma, events = calibrate_objective(plan, target_epsilon=0.5, delta=1e-8, prior_events=prior)
    assert acc.epsilon_rdp_opacus([*prior, *events], 1e-8) <= 0.5
    assert acc.epsilon([*prior, *plan.events(sigma * (1 - 1e-4))], 1e-8) > 0.5
    (op,) = [e for e in events if isinstance(e, ObjectivePerturbationDpEvent)]
    assert op.grid_ratio == TILT_GRID_RATIO and op.dim == 4
    assert acc.gaussian_event(OP_OUTPUT_MULTIPLIER) in events
    with pytest.raises(ValueError, match="RDP accountant only"):
        calibrate_objective(plan, target_epsilon=0.5, delta=1e-8, accountant="pld")
    with pytest.raises(ValueError, match="logistic"):
        from dpsummary.models import PoissonRegression

        objective_schedule(PoissonRegression(3), epsilon=0.5, feature_norm=1.0)


def test_the_last_round_reads_the_perturbed_mode_as_a_newton_round() -> None:
    """The round the posterior reads: anchor at the mode, its score and noise as released, the
    score bound L and the curvature released at the mode with the model's bound there."""
    from dpsummary.noise_aware import public_bounds

    model = LogisticRegression(2)
    plan = objective_schedule(model, epsilon=1.0, feature_norm=1.0)
    calls: list[tuple] = []
    mode = torch.tensor([0.3, -0.2, 0.1], dtype=DTYPE)

    def perturb(centre, ridge, tilt_mult, out_mult):
        calls.append(("perturb", centre, ridge, tilt_mult, out_mult))
        return mode, torch.ones(3, dtype=DTYPE), 7.0

    def curvature(theta, bound, mult):
        calls.append(("curvature", theta, bound, mult))
        return torch.eye(3, dtype=DTYPE)

    bounds = public_bounds(model, feature_norm=1.0, target_bound=1.0)
    anchor = torch.tensor([0.5, 0.0, 0.0], dtype=DTYPE)
    rel = objective_round(plan, perturb, curvature, bounds)(anchor, (2.0, 3.0))
    assert calls[0][2] == plan.ridge and calls[0][3:] == (2.0, OP_OUTPUT_MULTIPLIER)
    assert torch.equal(calls[0][1], anchor)
    assert torch.equal(rel.anchor, mode) and rel.score_noise_std == 7.0 and rel.score_bound == plan.design_norm
    assert rel.curvature_bound == bounds(mode)[1] and rel.curvature_noise_std == 3.0 * bounds(mode)[1]


def test_a_release_is_charged_and_claimed_under_rdp_alone(tmp_path: Path) -> None:
    """End to end: the artifact's claim names the mechanism and states its epsilon under RDP alone
    (within the request), the ledger's reserve holds the objective-perturbation event, and the
    audit recomputes it (PLD: not applicable)."""
    from dpsummary import audit, keys
    from dpsummary.artifact import read_artifact
    from dpsummary.policy import load_policy

    req = _request(tmp_path)
    result = run_release(req)
    assert result.mechanism == "noise-aware-objective"
    _body, claim, _env = read_artifact(req.out, allow_unsigned=True)  # type: ignore[arg-type]
    assert set(claim["epsilon"]) == {"rdp"} and claim["epsilon"]["rdp"] <= 1.0 + 1e-9
    assert claim["mechanism"]["name"] == "noise-aware-objective"
    assert claim["mechanism"]["schedule"]["objective_perturbation"]["jacobian_share"] == OP_JACOBIAN_SHARE
    reserve = [e for e in ledger_lines(tmp_path) if e["kind"] == "reserve"][-1]
    assert any(ev.get("class_name") == "ObjectivePerturbationDpEvent"
               for ev in reserve["events"][-1]["events"])
    info, _ = keys.resolve_signing_key(None)
    report = audit.audit(req.ledger, keys.load_public_key(info.public_path), load_policy(req.policy))  # type: ignore[arg-type]
    assert report.ok and report.sources[0].composed_pld is None


@pytest.mark.parametrize(("kw", "match"), [
    ({"accountant": "pld"}, "accounted by the rdp accountant only"),
    ({"engine": "spark"}, "runs on --engine local only"),
    ({"model": "poisson"}, "is for logistic regression"),
])
def test_public_refusals_charge_nothing(tmp_path: Path, kw: dict, match: str) -> None:
    req = _request(tmp_path, **kw)
    with pytest.raises(Refusal, match=match) as info:
        run_release(req)
    assert info.value.kind == "public"
    assert ledger_lines(tmp_path) == [] and not req.out.exists()  # type: ignore[union-attr]
