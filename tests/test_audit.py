"""Tests for dpsummary.audit."""

from __future__ import annotations

import base64
import json

import dp_accounting as dpa
import pytest

from dpsummary import accounting as A
from dpsummary import audit as AU
from dpsummary import keys
from dpsummary import ledger as L
from dpsummary import policy as P
from dpsummary.artifact import canonical_json

DELTA = 1e-6


def _policy(total=10.0):
    return P.parse_policy(
        {"total_epsilon": total, "total_delta": DELTA, "max_epsilon_per_release": min(5.0, total),
         "n_max": 10_000, "source_id": "s"}
    )


def _setup(tmp_path):
    info = keys.generate_keypair(tmp_path / "k")
    priv = keys.load_private_key(info.private_path)
    led = L.Ledger(tmp_path / "l.jsonl", priv, info.keyid)
    for i in range(3):
        led.reserve(source_id="s", events=[dpa.GaussianDpEvent(5.0),
                                           A.subsampled_gaussian_event(2.0, 0.05, 10)],
                    delta=DELTA, policy=_policy(), release_id=f"r{i}").commit("sha256:" + "0" * 64)
    return led, info


def test_clean_audit(tmp_path):
    led, _ = _setup(tmp_path)
    rep = AU.audit(led.path, led.public_key, _policy())
    assert rep.ok and not rep.mismatches and not rep.problems
    (src,) = rep.sources
    events = [dpa.GaussianDpEvent(5.0), A.subsampled_gaussian_event(2.0, 0.05, 10)] * 3
    assert src.composed_rdp == A.epsilon_rdp(events, DELTA)
    assert src.composed_pld <= src.composed_rdp < src.naive_sum_rdp
    assert "within budget" in rep.render_text()
    assert json.loads(rep.to_json())["ok"] is True
    over = AU.audit(led.path, led.public_key, _policy(total=src.composed_rdp * 0.9))
    assert not over.ok and "OVER BUDGET" in over.render_text()


def test_edited_epsilon_resigned_with_other_key_flagged(tmp_path):
    led, _ = _setup(tmp_path)
    evil = keys.load_private_key(keys.generate_keypair(tmp_path / "evil").private_path)
    lines = led.path.read_bytes().splitlines()
    e = json.loads(lines[2])
    assert e["kind"] == "reserve"
    e["epsilon"] = {"rdp": 0.001}
    e["keyid"] = keys.key_id(evil)
    e.pop("sig")
    e["sig"] = base64.b64encode(keys.sign(evil, canonical_json(e))).decode()
    lines[2] = canonical_json(e)
    led.path.write_bytes(b"\n".join(lines) + b"\n")
    rep = AU.audit(led.path, led.public_key, _policy())
    assert not rep.ok
    row = rep.entries[2]
    assert "foreign-key" in row.flags and "stored-epsilon-mismatch" in row.flags
    assert any("line 3 (seq 2)" in m for m in rep.mismatches)
    assert "mismatch: line 3" in rep.render_text()


def test_audit_reports_open_holds_as_warning(tmp_path):
    import dp_accounting as dpa

    from dpsummary import audit as audit_mod
    from dpsummary import keys as K
    from dpsummary import ledger as L
    from dpsummary import policy as P

    info = K.generate_keypair(tmp_path)
    priv = K.load_private_key(info.private_path)
    led = L.Ledger(tmp_path / "l.jsonl", priv)
    pol = P.parse_policy({"total_epsilon": 5.0, "total_delta": 1e-6, "max_epsilon_per_release": 5.0,
                          "n_max": 1000, "min_records": 1})
    session = led.session(source_id="s", policy=pol, release_id="live", started="2026-11-23T10:00:00+00:00")
    with session as sess:
        sess.reserve(events=[dpa.GaussianDpEvent(50.0)], delta=1e-6, stage="one", hold_epsilon=1.0).commit()
        rep = audit_mod.audit(led.path, priv.public_key(), pol)
        assert rep.ok  # an open hold is a warning, not a failure
        assert [h["release_id"] for h in rep.open_holds] == ["live"]
        assert "open hold of release live" in rep.render_text()
        assert rep.to_dict()["open_holds"][0]["hold_epsilon"] == 1.0
    assert audit_mod.audit(led.path, priv.public_key(), pol).open_holds == []


def test_ledger_audit_and_accounting_agree_on_composed_epsilon(tmp_path):
    """One computation: the ledger's running total, the audit's accountant of record and
    accounting.composed_epsilon (what the artifact's claim calls) include the selection slack."""
    info = keys.generate_keypair(tmp_path / "k")
    priv = keys.load_private_key(info.private_path)
    led = L.Ledger(tmp_path / "l.jsonl", priv, info.keyid)
    pol = _policy()
    sel = 1e-7
    events = [dpa.GaussianDpEvent(5.0), A.subsampled_gaussian_event(2.0, 0.05, 10)]
    for i in range(2):
        with led.session(source_id="s", policy=pol, release_id=f"r{i}", started="2026-11-23T10:00:00Z") as sess:
            sess.reserve(events=events, delta=DELTA - sel, stage="all", extra_delta=sel).commit()
    expect = A.composed_epsilon(events * 2, delta=DELTA - 2 * sel, extra_deltas=[sel, sel], accountant="rdp")
    assert expect > A.epsilon(events * 2, DELTA - 2 * sel, "rdp")  # the slack is in
    spent = led.spent("s", delta=DELTA, accountants=("rdp", "pld"))
    assert spent.composed["rdp"] == expect
    (src,) = AU.audit(led.path, led.public_key, pol).sources
    assert src.composed_of_record == expect
    assert src.composed_rdp == pytest.approx(expect, rel=1e-9)  # Opacus' own recomputation
    assert src.composed_pld == pytest.approx(spent.composed["pld"], rel=1e-12)


def test_objective_perturbation_events_audit_under_rdp_alone(tmp_path):
    """A reserve holding objective perturbation's event is accountable (no flag): the auditor's
    RDP column recomputes it, the PLD columns say "-" (PLD cannot compose it), and a policy whose
    accountant of record is not RDP reports the source over budget with the reason."""
    from dpsummary.objective_event import ObjectivePerturbationDpEvent

    info = keys.generate_keypair(tmp_path / "k")
    led = L.Ledger(tmp_path / "l.jsonl", keys.load_private_key(info.private_path), info.keyid)
    op = ObjectivePerturbationDpEvent(noise_multiplier=6.0, jacobian_log_ratio=0.02, dim=5, grid_ratio=2.0**-40)
    events = [dpa.GaussianDpEvent(5.0), op]
    led.reserve(source_id="s", events=events, delta=DELTA, policy=_policy(), release_id="r0").commit("sha256:" + "0" * 64)
    rep = AU.audit(led.path, led.public_key, _policy())
    assert rep.ok and not rep.mismatches
    reserve = next(e for e in rep.entries if e.kind == "reserve")
    assert reserve.flags == [] and reserve.epsilon_pld is None
    assert reserve.epsilon_rdp == pytest.approx(A.epsilon_rdp(events, DELTA), rel=1e-9)
    (src,) = rep.sources
    assert src.composed_pld is None and src.composed_rdp == pytest.approx(A.epsilon_rdp(events, DELTA), rel=1e-9)
    other = P.parse_policy({"total_epsilon": 10.0, "total_delta": DELTA, "max_epsilon_per_release": 5.0,
                            "n_max": 10_000, "source_id": "s", "accountant": "pld"})
    bad = AU.audit(led.path, led.public_key, other)
    assert not bad.ok and "only the RDP accountant composes" in bad.render_text()
