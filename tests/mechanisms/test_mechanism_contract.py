"""The contract every registered mechanism passes (issue 30), parametrised over
:data:`dpsummary.mechanisms.REGISTRY`, in the style of dp_accounting's abstract accountant tests:

1. **event declaration**: the events a mechanism's plan declares are exactly what the ledger
   reserves and what the claim lists, and they reproduce the epsilon the ledger charges (at or
   below the requested epsilon);
2. **neighbour replay**: run on D and on D + one extreme record with coupled randomness (the same
   coins for the shared records, the added record always sampled, and D's noisy outputs handed
   back to the neighbour's run, so both runs take the same path), every vector the mechanism asks
   to be noised moves by at most the sensitivity it declares for it (``clip_norm``), and both
   runs make the same calls with the same shapes;
3. **refusal before reading**: the mechanism's own public-fact refusal charges nothing and never
   opens the records;
4. **settlement on failure**: a failure injected at every checkpoint of ``run_release`` leaves no
   artifact, no open hold and no unfinished reservation, and what was reserved stays charged;
5. **finite claim**: a release ends in a signed artifact whose claim (and body) is finite and
   names the mechanism.

A new mechanism adds one entry to :data:`CASES` (a small request for it and one of its public
refusals); :func:`test_every_registered_mechanism_has_a_case` fails until it does. Every case is
small (2,000 rows, a few steps, a tiny model). Deterministic apart from the privacy noise, which
cannot be seeded: the only noise-dependent outcome is the data-quality refusal, which at this
size needs the noisy dropped count above 1,000 with noise sd about 60 (probability far below
1e-9 per release).
"""

from __future__ import annotations

import json
import math
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import numpy as np
import pytest
import torch
from release_support import ledger_lines, write_csv, write_policy

from dpsummary import accounting as acc
from dpsummary import keys
from dpsummary.errors import Refusal
from dpsummary.ledger import Ledger
from dpsummary.mechanisms import REGISTRY
from dpsummary.mechanisms.base import all_finite
from dpsummary.plan import ReleaseRequest
from dpsummary.release import CHECKPOINTS, plan_public, public_stage1, run_release

N = 2000
#: Every budget part in use, so each declared part is exercised (DP-PSVI runs its DP initialisation).
SPLIT = "[budget_split]\ncount = 0.05\npreprocessing = 0.15\nquality = 0.05\ninitialisation = 0.1\noptimisation = 0.65\n"
ALLOW = 'allowed_models = ["logistic", "poisson", "bnn", "gmm", "dpgmm"]'


@dataclass(frozen=True)
class Case:
    """A small release request for the mechanism, and one of its own public refusals."""

    request: dict[str, Any]
    refusal: dict[str, Any]
    refusal_target: str = "binary"
    refusal_match: str = ""
    #: :func:`release_support.write_policy` options of the request's policy (not the refusal's).
    policy: dict[str, Any] = field(default_factory=dict)


CASES: dict[str, Case] = {
    "noise-aware-newton": Case({}, {"model": "logistic"}, "count", "needs a binary target"),
    "dp-psvi": Case({"mechanism": "dp-psvi", "steps": 3}, {"model": "logistic", "mechanism": "dp-psvi"}, "count",
                    "needs a binary target"),
    "dp-bb-psvi": Case({"model": "bnn", "bnn_widths": (3,), "steps": 3}, {"model": "bnn"}, "count",
                       "needs a binary or real target"),
    "dp-kd-tree": Case({"model": "gmm", "components": 2}, {"model": "gmm", "target": "y"}, "binary",
                       "has no meaning"),
    # Its own public refusal: the test schema's x1 is continuous (not a discrete domain).
    "noise-aware-cells": Case({"mechanism": "noise-aware-cells"}, {"mechanism": "noise-aware-cells"}, "binary",
                              "needs discrete features", policy={"x1_integer": True}),
    "noise-aware-objective": Case({"mechanism": "noise-aware-objective", "model": "logistic"},
                                  {"mechanism": "noise-aware-objective", "model": "poisson"}, "count",
                                  "is for logistic regression"),
}
NAMES = list(REGISTRY)


def _request(tmp: Path, name: str, *, count_public: bool = True, target_kind: str = "binary",
             refusal: bool = False, **overrides: Any) -> ReleaseRequest:
    data = write_csv(tmp / f"d-{target_kind}.csv", N, seed=3, target=target_kind)
    options = {} if refusal else CASES[name].policy
    policy = write_policy(tmp / f"p-{target_kind}-{count_public}-{refusal}.toml", n=N if count_public else None,
                          target_kind=target_kind,
                          extra=ALLOW, tail=SPLIT, total_epsilon=100.0, cap=2.0, **options)
    kw: dict[str, Any] = {"size": 3, "seed": 0, **CASES[name].request, **overrides}
    return ReleaseRequest(data=data, epsilon=1.0, policy=policy, out=tmp / "o.dpsummary.json",
                          ledger=tmp / "ledger.jsonl", **kw)


def _ledger(req: ReleaseRequest) -> Ledger:
    info, _ = keys.resolve_signing_key(None)
    assert req.ledger is not None
    return Ledger(req.ledger, keys.load_private_key(info.private_path), info.keyid)


def _claim_and_body(path: Path) -> tuple[dict[str, Any], dict[str, Any]]:
    from dpsummary.artifact import read_artifact

    body, claim, _env = read_artifact(path, allow_unsigned=True)
    return claim, body


def test_every_registered_mechanism_has_a_case() -> None:
    assert set(CASES) == set(REGISTRY), "add a Case for every registered mechanism"
    for key, mech in REGISTRY.items():
        assert key == mech.name
    general = [m.name for m in REGISTRY.values() if not m.models]
    assert general, "a default mechanism (one that serves any model) must exist"
    claimed = [model for m in REGISTRY.values() for model in m.models]
    assert len(claimed) == len(set(claimed)), "a model is claimed by two mechanisms"


# ---- 1 and 5: declared events, the ledger's charge, a finite claim ----------------------------
@pytest.mark.parametrize("name", NAMES)
def test_declared_events_are_what_the_ledger_charges_and_the_claim_is_finite(tmp_path: Path, name: str) -> None:
    req = _request(tmp_path, name)
    mech = REGISTRY[name]
    public = plan_public(req, lambda _msg: None)
    assert public.req.mechanism == name  # the request resolves to this mechanism
    plan = mech.plan(public, public_stage1(public))  # public count and schema: a pure function of public values
    assert plan.mechanism == name
    assert [p for p, _ in plan.parts][-1] == "optimisation"
    assert {p for p, _ in plan.parts} <= {"quality", "initialisation", "optimisation"}

    result = run_release(req)
    assert result.mechanism == name
    entries = ledger_lines(tmp_path)
    (reserve,) = [e for e in entries if e["kind"] == "reserve"]
    assert reserve["stage"] == name
    assert reserve["events"] == acc.events_to_json(plan.events)
    claim, body = _claim_and_body(req.out)  # type: ignore[arg-type]
    assert claim["events"] == acc.events_to_json(plan.events)
    assert claim["sampling"] == mech.sampling
    declared = acc.epsilon(plan.events, public.delta, public.accountant)
    assert reserve["epsilon"][public.accountant] == pytest.approx(declared, rel=1e-9)
    assert claim["epsilon"][public.accountant] == pytest.approx(declared, rel=1e-9)
    spent = _ledger(req).spent("test-source")
    assert spent.composed[public.accountant] == pytest.approx(declared, rel=1e-6)
    assert declared <= req.epsilon * (1 + 1e-3)
    # The budget split's parts are the declared parts' standalone epsilons.
    for part, event in plan.parts:
        assert claim["budget_split"][part] == pytest.approx(acc.epsilon([event], public.delta, public.accountant))
    # A finite claim that names the mechanism and reports every noise it ran.
    assert all_finite(claim) and all_finite(body)
    json.dumps(claim, allow_nan=False)
    section = claim["mechanism"]
    assert section["name"] == name
    for key in ("count_noise_multiplier", "preprocessing_noise_multiplier", "quality_noise_multiplier"):
        assert key in section
    assert plan.quality_noise_multiplier is not None  # SPLIT gives the quality counts a share
    assert section["quality_noise_multiplier"] == plan.quality_noise_multiplier


# ---- 2: neighbour replay -------------------------------------------------------------------
class CoupledRandomness:
    """Test randomness: seeded coins for the ``shared`` records (any record beyond them, the added
    neighbour, is always sampled: the worst case), seeded noise, and a record of every vector the
    mechanism asks to be noised with the sensitivity it declares for it (``clip_norm``). With
    ``outputs`` (a first run's noisy vectors) it hands those back instead of noise, so a
    neighbour's run takes exactly the first run's path whenever its decisions read only the
    noisy outputs.

    Objective perturbation's tilt (:meth:`tilt`) is no sum, so it is coupled as its proof couples
    it: the first run draws it; a neighbour's run takes ``coupled_tilt(first tilt)``, the tilt
    that makes the first run's iterate the neighbour's minimiser too (the change of variables of
    :mod:`dpsummary.private.objective`). The iterate then moves by at most its declared
    sensitivity, the output perturbation's ``2 gamma / ridge``, like any other release."""

    def __init__(self, shared: int, outputs: list[np.ndarray] | None = None,
                 coupled_tilt: Any = None) -> None:
        self.shared = shared
        self.outputs = outputs
        self.coupled_tilt = coupled_tilt
        self.tilts: list[np.ndarray] = []
        #: The index in ``given`` of the first release after each tilt (the perturbed iterate).
        self.after_tilt: list[int] = []
        self._coins = np.random.default_rng(11)
        self._noise = np.random.default_rng(12)
        self.given: list[np.ndarray] = []
        self.sensitivities: list[float] = []
        self.returned: list[np.ndarray] = []

    def coins(self, num_records: int, sample_rate: float) -> np.ndarray:
        base = self._coins.random(self.shared) < sample_rate
        return np.concatenate([base, np.ones(num_records - self.shared, dtype=bool)])

    def sample_indices(self, num_records: int, sample_rate: float) -> np.ndarray:
        return np.flatnonzero(self.coins(num_records, sample_rate))

    def gaussian(self, values: np.ndarray, *, noise_std: float, clip_norm: float) -> np.ndarray:
        values = np.array(values, dtype=np.float64)
        self.given.append(values)
        self.sensitivities.append(float(clip_norm))
        if self.outputs is not None:
            k = len(self.given) - 1
            out = self.outputs[k] if k < len(self.outputs) and self.outputs[k].shape == values.shape \
                else np.full(values.shape, np.nan)
        else:
            out = values + noise_std * self._noise.standard_normal(values.shape)
        self.returned.append(np.array(out))
        return out

    def tilt(self, dim: int, *, noise_std: float) -> np.ndarray:
        self.after_tilt.append(len(self.given))
        k = len(self.tilts)
        b = (noise_std * self._noise.standard_normal(dim) if self.coupled_tilt is None
             else np.asarray(self.coupled_tilt(k), dtype=np.float64))
        self.tilts.append(b)
        return b


def _model_space(req: ReleaseRequest, transform: Any) -> torch.Tensor:
    from dpsummary.data import read_csv

    features, target = transform.apply(read_csv(req.data, private=True))
    return features if target is None else torch.cat([features, target[:, None]], dim=1)


#: An extreme record in the CSV's units (x1 far outside its public bounds [0, 10]).
EXTREME = "1000.0,b,yes"


@pytest.mark.parametrize("name", NAMES)
def test_neighbour_replay_moves_each_noised_vector_by_at_most_its_sensitivity(tmp_path: Path, name: str) -> None:
    from dpsummary.private.mechanism import PrivateRecords

    req = _request(tmp_path, name)
    mech = REGISTRY[name]
    public = plan_public(req, lambda _msg: None)
    plan = mech.plan(public, public_stage1(public))
    table = _model_space(req, plan.transform)
    extra_path = write_csv(tmp_path / "extreme.csv", 1, seed=3, extra_rows=[EXTREME])
    extreme = _model_space(ReleaseRequest(data=extra_path, epsilon=1.0), plan.transform)[-1:]
    neighbour = torch.cat([table, extreme])

    first = CoupledRandomness(shared=table.shape[0])
    mech.run(public, plan, PrivateRecords(table, randomness=first), record_count=float(N))

    def coupled_tilt(k: int) -> np.ndarray:
        """The tilt under which the first run's k-th iterate also zeroes the neighbour's gradient:
        the first tilt plus the added record's log-likelihood score there (its total map applied)."""
        from dpsummary import noise_aware
        from dpsummary.private.objective import _design_and_target

        iterate = torch.from_numpy(first.given[first.after_tilt[k]])
        z, y = _design_and_target(extreme, plan.model, noise_aware.schema_bounds(plan.transform)[0])
        return first.tilts[k] + float(y[0] - torch.sigmoid(z[0] @ iterate)) * z[0].numpy()

    second = CoupledRandomness(shared=table.shape[0], outputs=first.returned, coupled_tilt=coupled_tilt)
    mech.run(public, plan, PrivateRecords(neighbour, randomness=second), record_count=float(N))

    assert first.given, "the mechanism released nothing"
    assert [g.shape for g in first.given] == [g.shape for g in second.given], "the neighbour took another path"
    assert first.sensitivities == second.sensitivities
    moves = [float(np.linalg.norm(b - a)) / s for a, b, s in zip(first.given, second.given, first.sensitivities,
                                                                    strict=True)]
    assert max(moves) <= 1.0 + 1e-9, max(moves)
    assert max(moves) > 0.0, "the extreme record never reached a release (the replay is blind)"


# ---- 3: refusal before reading ---------------------------------------------------------------
@pytest.mark.parametrize("name", NAMES)
def test_public_refusal_charges_nothing_and_opens_no_record(tmp_path: Path, name: str,
                                                             monkeypatch: pytest.MonkeyPatch) -> None:
    import dpsummary.release as release_mod
    from dpsummary.private.source import PrivateSource

    case = CASES[name]

    def never(*_a: Any, **_k: Any) -> Any:
        raise AssertionError("the records were opened before a public refusal")

    monkeypatch.setattr(PrivateSource, "open", classmethod(never))
    monkeypatch.setattr(release_mod, "read_source", never)
    req = _request(tmp_path, name, target_kind=case.refusal_target, refusal=True,
                   **{**{k: None for k in ("model", "mechanism")},
                                                                  **case.refusal})
    with pytest.raises(Refusal, match=case.refusal_match) as info:
        run_release(req)
    assert info.value.kind == "public"
    assert ledger_lines(tmp_path) == []
    assert not req.out.exists()  # type: ignore[union-attr]


# ---- 4: settlement on failure at every checkpoint ------------------------------------------
class Injected(RuntimeError):
    pass


@pytest.mark.parametrize("where", CHECKPOINTS)
@pytest.mark.parametrize("name", NAMES)
def test_failure_at_every_checkpoint_settles_the_ledger(tmp_path: Path, name: str, where: str) -> None:
    req = _request(tmp_path, name, count_public=False)  # a noisy count: stage 1 runs too
    seen: list[str] = []

    def fail_at(checkpoint: str) -> None:
        seen.append(checkpoint)
        if checkpoint == where:
            raise Injected(checkpoint)

    with pytest.raises(Injected):
        run_release(req, checkpoint=fail_at)
    assert seen == list(CHECKPOINTS[: CHECKPOINTS.index(where) + 1]), "checkpoints out of order"
    assert not req.out.exists()  # type: ignore[union-attr]
    entries = ledger_lines(tmp_path)
    reserves = [e for e in entries if e["kind"] == "reserve"]
    if where == "planned-public":
        assert entries == []
        return
    assert reserves
    assert {e["seq"] for e in reserves} <= {e["ref"] for e in entries if e["kind"] in ("commit", "abort")}
    spent = _ledger(req).spent("test-source")
    assert spent.active_holds == 0
    assert spent.composed["rdp"] > 0 and math.isfinite(spent.composed["rdp"])


# ---- options and models belong to one mechanism ------------------------------------------------
@pytest.mark.parametrize("name", [n for n in NAMES if REGISTRY[n].options])
def test_a_mechanism_s_options_are_refused_with_any_other(tmp_path: Path, name: str) -> None:
    """``options`` only its mechanism reads: with another mechanism they are a public refusal
    (never silently ignored), before any record is read or any budget reserved."""
    mine = CASES[name].request
    other = next(n for n in NAMES if n != name and not REGISTRY[n].models)
    for option in REGISTRY[name].options:
        req = _request(tmp_path, other, **{option: mine[option]})
        with pytest.raises(Refusal, match=f"--{option.replace('_', '-')} needs") as info:
            run_release(req)
        assert info.value.kind == "public"
    assert ledger_lines(tmp_path) == []
