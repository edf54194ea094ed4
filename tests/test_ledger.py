"""Tests for dpsummary.ledger: chain, signatures, budget, concurrency, crash safety."""

from __future__ import annotations

import json
import multiprocessing as mp
import os
import random
import signal
import time

import dp_accounting as dpa
import pytest

from dpsummary import accounting as A
from dpsummary import keys
from dpsummary import ledger as L
from dpsummary import policy as P

SIGMA = 5.0
DELTA = 1e-6


def _mp_context() -> mp.context.BaseContext:
    """Fork from a clean server process: by the time these tests run, other tests may have started
    JAX (multithreaded), and forking the pytest process itself could deadlock a child."""
    ctx = mp.get_context("forkserver")
    ctx.set_forkserver_preload(
        ["dpsummary.ledger", "dpsummary.keys", "dpsummary.policy", "dpsummary.models", "opacus.accountants", "pytest"]
    )
    return ctx


def make_policy(total_epsilon=10.0, per_release=5.0, accountant="rdp"):
    return P.parse_policy(
        {
            "total_epsilon": total_epsilon,
            "total_delta": DELTA,
            "max_epsilon_per_release": min(per_release, total_epsilon),
            "n_max": 10_000,
            "accountant": accountant,
        }
    )


@pytest.fixture(scope="module")
def keydir(tmp_path_factory):
    d = tmp_path_factory.mktemp("keys")
    info = keys.generate_keypair(d)
    other = keys.generate_keypair(d, "other")
    return info, other


@pytest.fixture()
def key(keydir):
    info, _ = keydir
    return keys.load_private_key(info.private_path), info.keyid


def ev():
    return [dpa.GaussianDpEvent(SIGMA)]


def fill(path, key, n=3, source="s1"):
    led = L.Ledger(path, *key)
    pol = make_policy()
    for i in range(n):
        r = led.reserve(source_id=source, events=ev(), delta=DELTA, policy=pol,
                        release_id=f"r{i}", stage="all")
        if i % 2:
            r.abort("boom")
        else:
            r.commit("sha256:" + "ab" * 32)
    return led


def test_reserve_commit_abort_and_spent(tmp_path, key):
    led = fill(tmp_path / "l.jsonl", key, n=3)
    assert L.verify_ledger(led.path, led.public_key) == []
    lines = led.path.read_bytes().splitlines()
    assert len(lines) == 6
    entries = [json.loads(x) for x in lines]
    assert [e["kind"] for e in entries] == ["reserve", "commit", "reserve", "abort", "reserve", "commit"]
    assert entries[1]["artifact_digest"].startswith("sha256:") and entries[1]["ref"] == 0
    assert entries[0]["adjacency"] == "add/remove one record"
    sp = led.spent("s1", delta=DELTA)
    # aborted reservations stay charged: 3 events composed under one accountant
    assert sp.reservations == 3
    assert sp.composed["rdp"] == A.epsilon_rdp([A.gaussian_event(SIGMA)] * 3, DELTA)
    assert sp.composed["pld"] <= sp.composed["rdp"] < sp.naive_sum
    assert set(sp.composed) == {"rdp", "prv", "pld"}
    # The release asks only for the accountants it shows; the numbers are the same.
    some = led.spent("s1", delta=DELTA, accountants=("rdp", "pld"))
    assert some.composed == {"rdp": sp.composed["rdp"], "pld": sp.composed["pld"]}
    assert some.naive_sum == sp.naive_sum
    assert led.spent("other").reservations == 0
    r = led.reserve(source_id="s1", events=ev(), delta=DELTA, policy=make_policy())
    r.commit(None)
    with pytest.raises(L.LedgerError, match="already finished"):
        r.commit(None)


def test_budget_exceeded_and_per_release_cap(tmp_path, key):
    one = A.epsilon_rdp(ev(), DELTA)
    two = A.epsilon_rdp(ev() * 2, DELTA)
    pol = make_policy(total_epsilon=(two + A.epsilon_rdp(ev() * 3, DELTA)) / 2, per_release=1.01 * one)
    led = L.Ledger(tmp_path / "l.jsonl", *key)
    for _ in range(2):
        led.reserve(source_id="s", events=ev(), delta=DELTA, policy=pol).commit()
    with pytest.raises(L.BudgetExceeded) as ei:
        led.reserve(source_id="s", events=ev(), delta=DELTA, policy=pol)
    assert "\n" not in str(ei.value)
    # another source has its own budget
    led.reserve(source_id="t", events=ev(), delta=DELTA, policy=pol)
    with pytest.raises(L.BudgetExceeded, match="per-release cap"):
        led.reserve(source_id="u", events=ev() * 2, delta=DELTA, policy=pol)
    assert L.verify_ledger(led.path, led.public_key) == []
    assert led.spent("s").reservations == 2


STARTED = "2026-11-23T10:00:00+00:00"


def test_holds(tmp_path, key):
    one = A.epsilon_rdp(ev(), DELTA)
    pol = make_policy(total_epsilon=3 * one, per_release=3 * one)
    led = L.Ledger(tmp_path / "l.jsonl", *key)
    with led.session(source_id="s", policy=pol, release_id="A", started=STARTED) as sa:
        sa.reserve(events=[dpa.GaussianDpEvent(100.0)], delta=DELTA, stage="one", hold_epsilon=2 * one).commit()
        with pytest.raises(L.BudgetExceeded):  # A's live hold blocks B
            led.reserve(source_id="s", events=ev(), delta=DELTA, policy=pol, release_id="B",
                        hold_epsilon=2 * one)
        sa.reserve(events=ev(), delta=DELTA, stage="two").commit()
        assert led.spent("s").active_holds == 0  # replaced by A's second stage
    led.reserve(source_id="s", events=ev(), delta=DELTA, policy=pol, release_id="B").commit()


def test_session_settles_hold_and_aborts_on_failure(tmp_path, key):
    """The phantom-hold bug: a failure between the stages must not leave the hold active."""
    one = A.epsilon_rdp(ev(), DELTA)
    pol = make_policy(total_epsilon=3 * one, per_release=3 * one)
    led = L.Ledger(tmp_path / "l.jsonl", *key)
    with pytest.raises(RuntimeError), led.session(source_id="s", policy=pol, release_id="A", started=STARTED) as sa:
        sa.reserve(events=[dpa.GaussianDpEvent(100.0)], delta=DELTA, stage="one", hold_epsilon=2 * one)
        raise RuntimeError("boom")
    st = led.state()
    kinds = [e["kind"] for e in st.entries]
    assert kinds == ["reserve", "abort"]  # aborting the holding reservation ends its hold
    assert st.entries[1]["reason"] == "RuntimeError"
    assert L._active_holds(st.entries, "s") == {} and L.open_holds(st.entries) == []
    assert {e["time"] for e in st.entries} == {STARTED}  # no time after the session's start
    assert L.verify_ledger(led.path, led.public_key) == []
    # The full budget minus what was charged is available again.
    led.reserve(source_id="s", events=ev() * 2, delta=DELTA, policy=pol, release_id="B").commit()


def test_settle_is_never_refused_even_when_the_second_stage_is(tmp_path, key):
    one = A.epsilon_rdp(ev(), DELTA)
    pol = make_policy(total_epsilon=3 * one, per_release=1.5 * one)
    led = L.Ledger(tmp_path / "l.jsonl", *key)
    with pytest.raises(L.BudgetExceeded), led.session(source_id="s", policy=pol, release_id="A",
                                                      started=STARTED) as sa:
        sa.reserve(events=[dpa.GaussianDpEvent(100.0)], delta=DELTA, stage="one", hold_epsilon=one).commit()
        sa.reserve(events=ev() * 4, delta=DELTA, stage="two")  # over the per-release cap
    assert led.spent("s").active_holds == 0


def test_outside_session_times_are_coarse(tmp_path, key):
    led = L.Ledger(tmp_path / "l.jsonl", *key)
    led.reserve(source_id="s", events=ev(), delta=DELTA, policy=make_policy()).commit()
    for e in led.state().entries:
        t = __import__("datetime").datetime.fromisoformat(e["time"])
        assert t.minute == 0 and t.second == 0 and t.microsecond == 0
    with pytest.raises(L.LedgerError, match="whole seconds"):
        led.session(source_id="s", policy=make_policy(), release_id="X", started="2026-11-23T10:00:00.5+00:00")


def _crash_with_hold(path: str, keyfile: str, started: str) -> None:  # runs in a child process
    priv = keys.load_private_key(keyfile)
    led = L.Ledger(path, priv)
    one = A.epsilon_rdp(ev(), DELTA)
    pol = make_policy(total_epsilon=3 * one, per_release=3 * one)
    sess = led.session(source_id="s", policy=pol, release_id="crashed", started=started)
    sess.__enter__()
    sess.reserve(events=[dpa.GaussianDpEvent(100.0)], delta=DELTA, stage="one", hold_epsilon=2 * one)
    os.kill(os.getpid(), signal.SIGKILL)


def test_recovery_settles_hold_of_killed_process(tmp_path, keydir):
    info, _ = keydir
    priv, keyid = keys.load_private_key(info.private_path), info.keyid
    path = tmp_path / "l.jsonl"
    proc = _mp_context().Process(target=_crash_with_hold, args=(str(path), str(info.private_path), STARTED))
    proc.start()
    proc.join(60)
    assert proc.exitcode == -signal.SIGKILL
    led = L.Ledger(path, priv, keyid)
    assert led.spent("s").active_holds > 0  # the hold outlived its owner...
    one = A.epsilon_rdp(ev(), DELTA)
    pol = make_policy(total_epsilon=3 * one, per_release=3 * one)
    led.reserve(source_id="s", events=ev() * 2, delta=DELTA, policy=pol, release_id="B").commit()  # ...until now
    entries = led.state().entries
    settles = [e for e in entries if e["kind"] == "settle"]
    assert len(settles) == 1 and settles[0]["reason"] == "owner gone"
    t = __import__("datetime").datetime.fromisoformat(settles[0]["time"])
    assert t.minute == 0 and t.second == 0  # written outside a session: hour granularity
    assert led.spent("s").active_holds == 0


def test_composed_epsilon_includes_selection_slack(tmp_path, key):
    led = L.Ledger(tmp_path / "l.jsonl", *key)
    led.reserve(source_id="s", events=ev(), delta=DELTA / 2, policy=make_policy(), extra_delta=1e-7).commit()
    spent = led.spent("s", delta=DELTA, accountants=("rdp",))
    expect = A.composed_epsilon(ev(), delta=DELTA - 1e-7, extra_deltas=[1e-7], accountant="rdp")
    assert spent.composed["rdp"] == expect
    assert expect > A.epsilon(ev(), DELTA - 1e-7, "rdp")


def test_refuses_to_extend_tampered_ledger(tmp_path, key):
    led = fill(tmp_path / "l.jsonl", key, n=2)
    lines = led.path.read_bytes().splitlines(keepends=True)
    led.path.write_bytes(b"".join([lines[1], lines[0], *lines[2:]]))
    with pytest.raises(L.LedgerError, match="fails verification"):
        led.reserve(source_id="s1", events=ev(), delta=DELTA, policy=make_policy())


@pytest.mark.parametrize("op", ["swap", "delete", "duplicate"])
def test_reorder_delete_duplicate_detected(tmp_path, key, op):
    led = fill(tmp_path / "l.jsonl", key, n=3)
    lines = led.path.read_bytes().splitlines(keepends=True)
    if op == "swap":
        lines[2], lines[3] = lines[3], lines[2]
    elif op == "delete":
        del lines[2]
    else:
        lines.insert(3, lines[2])
    led.path.write_bytes(b"".join(lines))
    kinds = {p.kind for p in L.verify_ledger(led.path, led.public_key)}
    assert kinds & {"seq", "broken-chain"}


def test_byte_flips_detected(tmp_path, key):
    led = fill(tmp_path / "l.jsonl", key, n=3)
    data = led.path.read_bytes()
    rng = random.Random(99)
    bad = tmp_path / "bad.jsonl"
    for pos in rng.sample(range(len(data)), 300):
        b = bytearray(data)
        b[pos] ^= 1 << rng.randrange(8)
        bad.write_bytes(bytes(b))
        assert L.verify_ledger(bad, led.public_key), f"flip at {pos} undetected"


def test_foreign_key_entry_detected(tmp_path, key, keydir):
    _, other = keydir
    led = fill(tmp_path / "l.jsonl", key, n=1)
    evil = L.Ledger(led.path, keys.load_private_key(other.private_path), other.keyid)
    with pytest.raises(L.LedgerError):  # evil's verification sees a foreign key
        evil.reserve(source_id="s1", events=ev(), delta=DELTA, policy=make_policy())
    probs = L.verify_ledger(led.path, led.public_key)
    assert probs == []


def test_torn_tail_repair(tmp_path, key):
    rng = random.Random(5)
    for trial in range(12):
        path = tmp_path / f"t{trial}.jsonl"
        led = fill(path, key, n=1)
        good = path.read_bytes()
        r = led.reserve(source_id="s1", events=ev(), delta=DELTA, policy=make_policy(), release_id="torn")
        full = path.read_bytes()
        last = full[len(good):]
        cut = len(last) - 1 if trial == 0 else rng.randrange(1, len(last) - 1)  # trial 0: only "\n" lost
        path.write_bytes(good + last[:cut])
        probs = L.verify_ledger(path, led.public_key)
        assert [p.kind for p in probs] == ["torn-tail"] and probs[0].severity == "warning"
        led.repair()
        assert L.verify_ledger(path, led.public_key) == []
        entries = led.state().entries
        if trial == 0:  # complete entry missing its newline: kept, so r can still commit
            assert entries[-1]["release_id"] == "torn"
            r.commit()
        else:
            assert len(entries) == 2
            assert (tmp_path / f"t{trial}.jsonl.torn").exists()
        led.reserve(source_id="s1", events=ev(), delta=DELTA, policy=make_policy()).commit()
        assert L.verify_ledger(path, led.public_key) == []


# --------------------------------------------------------------------------- multi-process


def _fake_release(path, keypath, keyid, total, per_release, barrier, results):
    key_ = keys.load_private_key(keypath)
    led = L.Ledger(path, key_, keyid)
    pol = make_policy(total_epsilon=total, per_release=per_release)
    barrier.wait()
    try:
        r = led.reserve(source_id="shared", events=ev(), delta=DELTA, policy=pol)
    except L.BudgetExceeded:
        results.put("refused")
        return
    r.commit("sha256:" + "00" * 32)
    results.put("ok")


def test_concurrent_reservations_exactly_k(tmp_path, keydir):
    info, _ = keydir
    k = 5
    total = (A.epsilon_rdp(ev() * k, DELTA) + A.epsilon_rdp(ev() * (k + 1), DELTA)) / 2
    ctx = _mp_context()
    barrier, results = ctx.Barrier(20), ctx.Queue()
    path = tmp_path / "l.jsonl"
    procs = [
        ctx.Process(target=_fake_release, args=(path, info.private_path, info.keyid, total, total, barrier, results))
        for _ in range(20)
    ]
    for p in procs:
        p.start()
    outcomes = [results.get(timeout=120) for _ in procs]
    for p in procs:
        p.join(timeout=60)
    assert outcomes.count("ok") == k and outcomes.count("refused") == 20 - k
    pub = keys.load_public_key(info.public_path)
    assert L.verify_ledger(path, pub) == []
    assert L.read_ledger(path, pub).entries.__len__() == 2 * k


def _crash_worker(path, keypath, keyid, side):
    key_ = keys.load_private_key(keypath)
    led = L.Ledger(path, key_, keyid)
    pol = make_policy(total_epsilon=1e6, per_release=1e6)
    i = 0
    while True:
        rid = f"{os.getpid()}-{i}"
        r = led.reserve(source_id="c", events=ev(), delta=DELTA, policy=pol, release_id=rid)
        fd = os.open(side, os.O_WRONLY | os.O_APPEND | os.O_CREAT)
        os.write(fd, (rid + "\n").encode())
        os.close(fd)
        r.commit("sha256:" + "11" * 32) if i % 2 == 0 else r.abort("x")
        i += 1


def test_sigkill_crash_safety(tmp_path, keydir):
    info, _ = keydir
    pub = keys.load_public_key(info.public_path)
    path, side = tmp_path / "l.jsonl", tmp_path / "returned.txt"
    make_policy()  # warm the heavy imports (models, opacus) so forked workers start at once
    A.epsilon_rdp(ev(), DELTA)
    ctx = _mp_context()
    rng = random.Random(2024)
    led = L.Ledger(path, keys.load_private_key(info.private_path), info.keyid)
    for _trial in range(24):
        p = ctx.Process(target=_crash_worker, args=(path, info.private_path, info.keyid, side))
        p.start()
        time.sleep(rng.uniform(0.4, 1.2))  # the forkserver child must start and warm its RDP cache
        os.kill(p.pid, signal.SIGKILL)
        p.join()
        probs = L.verify_ledger(path, pub)
        assert all(pr.kind == "torn-tail" for pr in probs), probs
        led.repair()
        assert L.verify_ledger(path, pub) == []
        # the lock of a killed holder is released by the OS: the next writer proceeds
    returned = set(side.read_text().split()) if side.exists() else set()
    reserved = {e["release_id"] for e in led.state().entries if e["kind"] == "reserve"}
    assert len(returned) >= 20  # the workers really ran between kills
    assert returned <= reserved  # never under-counts
    assert led.spent("c").reservations == len(reserved)


# --------------------------------------------------------------------------- sessions (issue 13)

STARTED_Z = "2026-11-23T10:00:00Z"


def _two_stage_session(led, pol, fail_at, rid="R"):
    """A two-stage release as release.py runs it, raising RuntimeError at ``fail_at``."""
    one = A.epsilon_rdp(ev(), DELTA)

    def boom(point):
        if point == fail_at:
            raise RuntimeError(point)

    with led.session(source_id="s", policy=pol, release_id=rid, started=STARTED_Z) as sess:
        boom("entered")
        r1 = sess.reserve(events=[dpa.GaussianDpEvent(100.0)], delta=DELTA, stage="one", hold_epsilon=2 * one)
        boom("reserved-1")
        r1.commit()
        boom("committed-1")
        r2 = sess.reserve(events=ev(), delta=DELTA, stage="two")
        boom("reserved-2")
        r2.commit("sha256:" + "cd" * 32)
        boom("committed-2")


@pytest.mark.parametrize("fail_at", ["entered", "reserved-1", "committed-1", "reserved-2", "committed-2", None])
def test_no_phantom_hold_on_any_failure_path(tmp_path, key, fail_at):
    one = A.epsilon_rdp(ev(), DELTA)
    pol = make_policy(total_epsilon=3 * one, per_release=3 * one)
    led = L.Ledger(tmp_path / "l.jsonl", *key)
    if fail_at is None:
        _two_stage_session(led, pol, fail_at)
    else:
        with pytest.raises(RuntimeError, match=fail_at):  # the original exception propagates
            _two_stage_session(led, pol, fail_at)
    st = led.state()
    assert L.verify_ledger(led.path, led.public_key) == []
    assert L._active_holds(st.entries, "s") == {} and L.open_holds(st.entries) == []
    assert {e["time"] for e in st.entries} <= {STARTED_Z}  # every entry carries the session start
    assert all(e["kind"] != "reserve" or any(f["ref"] == e["seq"] and f["kind"] in ("commit", "abort")
                                            for f in st.entries) for e in st.entries)  # all finished
    aborts = [e for e in st.entries if e["kind"] == "abort"]
    assert all(e["reason"] == "RuntimeError" for e in aborts)
    # The source's spending counts exactly the charged events, with no hold on top.
    charged = [ev_ for e in st.entries if e["kind"] == "reserve" for ev_ in A.events_from_json(e["events"])]
    spent = led.spent("s", delta=DELTA, accountants=("rdp",))
    assert spent.active_holds == 0 and spent.composed["rdp"] == A.composed_epsilon(charged, delta=DELTA)
    assert not list((tmp_path / "l.jsonl.live").glob("*.lock"))  # the liveness file is cleaned up


def test_session_settles_committed_hold_when_stage_two_never_comes(tmp_path, key):
    one = A.epsilon_rdp(ev(), DELTA)
    pol = make_policy(total_epsilon=3 * one, per_release=3 * one)
    led = L.Ledger(tmp_path / "l.jsonl", *key)
    _two_stage_session(led, pol, "nowhere")  # a release that... finishes normally
    with pytest.raises(RuntimeError), led.session(source_id="s", policy=pol, release_id="Q", started=STARTED_Z) as s:
        s.reserve(events=[dpa.GaussianDpEvent(100.0)], delta=DELTA, stage="one", hold_epsilon=one).commit()
        raise RuntimeError("between the stages")
    kinds = [(e["kind"], e["reason"]) for e in led.state().entries if e["release_id"] == "Q"]
    assert kinds == [("reserve", None), ("commit", None), ("settle", "release ended: RuntimeError")]
    assert led.spent("s").active_holds == 0


def test_session_exit_attempts_every_step(tmp_path, key, monkeypatch):
    one = A.epsilon_rdp(ev(), DELTA)
    pol = make_policy(total_epsilon=3 * one, per_release=3 * one)
    led = L.Ledger(tmp_path / "l.jsonl", *key)

    def broken_abort(self, reason=""):
        raise OSError("disk full")

    monkeypatch.setattr(L.Reservation, "abort", broken_abort)
    with pytest.raises(KeyError), led.session(source_id="s", policy=pol, release_id="A", started=STARTED_Z) as s:
        s.reserve(events=ev(), delta=DELTA, stage="one")  # its abort will fail
        s.reserve(events=[dpa.GaussianDpEvent(100.0)], delta=DELTA, stage="two", hold_epsilon=one)
        raise KeyError("original")
    # The aborts failed, yet the hold was still settled and the original exception propagated.
    entries = led.state().entries
    assert [e["kind"] for e in entries] == ["reserve", "reserve", "settle"]
    assert led.spent("s").active_holds == 0


def test_failed_settle_is_recovered_once_the_session_is_gone(tmp_path, key, monkeypatch):
    one = A.epsilon_rdp(ev(), DELTA)
    pol = make_policy(total_epsilon=3 * one, per_release=3 * one)
    led = L.Ledger(tmp_path / "l.jsonl", *key)

    def broken_settle(self, **kw):
        raise OSError("lock timeout")

    with monkeypatch.context() as m:
        m.setattr(L.Ledger, "settle", broken_settle)
        with led.session(source_id="s", policy=pol, release_id="A", started=STARTED_Z) as s:
            s.reserve(events=ev(), delta=DELTA, stage="one", hold_epsilon=one).commit()
    assert led.spent("s").active_holds == one  # the settle failed...
    assert led.recover() == 1  # ...and recovery ends it: its liveness lock was released
    (settle,) = [e for e in led.state().entries if e["kind"] == "settle"]
    t = __import__("datetime").datetime.fromisoformat(settle["time"])
    assert settle["reason"] == "owner gone" and (t.minute, t.second, t.microsecond) == (0, 0, 0)
    assert led.recover() == 0


def test_live_session_hold_is_not_recovered_and_is_exclusive(tmp_path, key):
    one = A.epsilon_rdp(ev(), DELTA)
    pol = make_policy(total_epsilon=3 * one, per_release=3 * one)
    led = L.Ledger(tmp_path / "l.jsonl", *key)
    other = L.Ledger(tmp_path / "l.jsonl", *key)  # another writer of the same file
    with led.session(source_id="s", policy=pol, release_id="A", started=STARTED_Z) as s:
        s.reserve(events=ev(), delta=DELTA, stage="one", hold_epsilon=one).commit()
        assert other.recover() == 0  # its owner is alive
        with pytest.raises(L.LedgerError, match="live session"), other.session(
                source_id="s", policy=pol, release_id="A", started=STARTED_Z):
            pass
        assert other.spent("s").active_holds == one


def test_session_input_checks(tmp_path, key):
    led = L.Ledger(tmp_path / "l.jsonl", *key)
    pol = make_policy()
    for bad in ("2026-11-23T10:00:00", "2026-11-23T10:00:00+01:00", "2026-11-23T10:00:00.25Z", "yesterday"):
        with pytest.raises(L.LedgerError, match="session start time"):
            led.session(source_id="s", policy=pol, release_id="A", started=bad)
    for rid in ("", "../x", "a/b", "a.b"):
        with pytest.raises(L.LedgerError, match="release id"):
            led.session(source_id="s", policy=pol, release_id=rid, started=STARTED_Z)
    sess = led.session(source_id="s", policy=pol, release_id="A", started=STARTED_Z)
    with pytest.raises(L.LedgerError, match="outside its with block"):
        sess.reserve(events=ev(), delta=DELTA, stage="one")
    assert not led.path.exists()  # nothing was written


def test_direct_hold_has_no_owner_and_is_settled_by_the_next_reserve(tmp_path, key):
    one = A.epsilon_rdp(ev(), DELTA)
    pol = make_policy(total_epsilon=3 * one, per_release=3 * one)
    led = L.Ledger(tmp_path / "l.jsonl", *key)
    led.reserve(source_id="s", events=ev(), delta=DELTA, policy=pol, release_id="A", hold_epsilon=2 * one).commit()
    led.reserve(source_id="s", events=ev(), delta=DELTA, policy=pol, release_id="B", hold_epsilon=one).commit()
    entries = led.state().entries
    assert [(e["kind"], e["release_id"]) for e in entries][2] == ("settle", "A")
    assert L._active_holds(entries, "s") == {"B": one}


def test_recovered_crash_charges_only_the_reserved_events(tmp_path, keydir):
    info, _ = keydir
    priv = keys.load_private_key(info.private_path)
    path = tmp_path / "l.jsonl"
    proc = _mp_context().Process(target=_crash_with_hold, args=(str(path), str(info.private_path), STARTED_Z))
    proc.start()
    proc.join(60)
    assert proc.exitcode == -signal.SIGKILL
    led = L.Ledger(path, priv)
    assert led.recover() == 1
    st = led.state()
    assert [e["kind"] for e in st.entries] == ["reserve", "settle"]
    assert st.entries[0]["time"] == STARTED_Z  # the crashed session's own entry
    spent = led.spent("s", delta=DELTA, accountants=("rdp",))
    assert spent.active_holds == 0
    assert spent.composed["rdp"] == A.composed_epsilon([dpa.GaussianDpEvent(100.0)], delta=DELTA)
    assert not list((tmp_path / "l.jsonl.live").glob("*.lock"))


def test_normal_exit_aborts_unfinished_reservations(tmp_path, key):
    led = L.Ledger(tmp_path / "l.jsonl", *key)
    with led.session(source_id="s", policy=make_policy(), release_id="A", started=STARTED_Z) as s:
        s.reserve(events=ev(), delta=DELTA, stage="one")  # never committed
    entries = led.state().entries
    assert [(e["kind"], e["reason"], e["time"]) for e in entries] == [
        ("reserve", None, STARTED_Z), ("abort", "not finished", STARTED_Z)]
    assert led.spent("s").reservations == 1  # still charged


def test_entries_carry_no_content_id_and_legacy_ones_still_verify(tmp_path, key):
    """Issue 24: nothing computed from the records goes into the ledger. A ledger written
    before carries HMAC content ids in signed entries: it verifies and audits unchanged, and
    finishing or settling such a reserve does not copy its content id into a new entry."""
    from dpsummary import audit as AU

    led = L.Ledger(tmp_path / "l.jsonl", *key)
    pol = make_policy()
    legacy_id = "hmac-sha256:" + "5e" * 32
    with led.lock:  # a reserve as dpsummary wrote it before issue 24 (signed with the content id)
        st = led._read_verified()
        legacy = led._new_entry(st, kind="reserve", release_id="old", stage="all", source_id="s1",
                                content_id=legacy_id, events=A.events_to_json(ev()), delta=DELTA,
                                epsilon={"rdp": A.epsilon(ev(), DELTA, "rdp")}, hold_epsilon=1.0)
        led._write_line(legacy)
    with led.session(source_id="s1", policy=pol, release_id="new", started="2026-11-23T10:00:00Z") as s:
        s.reserve(events=ev(), delta=DELTA, stage="all").commit("sha256:" + "cd" * 32)
    L.Reservation(led, legacy).commit("sha256:" + "ab" * 32)
    assert L.verify_ledger(led.path, led.public_key) == []
    entries = [json.loads(x) for x in led.path.read_bytes().splitlines()]
    # The session's reserve settled the legacy hold (no live owner); the legacy reserve committed.
    assert [(e["kind"], e["ref"]) for e in entries if e["ref"] == 0] == [("settle", 0), ("commit", 0)]
    assert [e["content_id"] for e in entries] == [legacy_id] + [None] * (len(entries) - 1)
    assert led.path.read_bytes().count(b"hmac-sha256") == 1
    assert led.spent("s1", delta=DELTA).reservations == 2
    rep = AU.audit(led.path, led.public_key, pol)
    assert rep.ok and not rep.problems
    assert [e.flags for e in rep.entries] == [["legacy-content-id"]] + [[]] * (len(entries) - 1)
    with pytest.raises(TypeError):
        led.reserve(source_id="s1", events=ev(), delta=DELTA, policy=pol, content_id=legacy_id)  # type: ignore[call-arg]


def test_objective_perturbation_events_are_charged_under_rdp_only(tmp_path, key):
    """An RDP-only event (objective perturbation) is charged and composed under the rdp
    accountant, with the other accountants left out of the source's spending; a policy whose
    accountant of record is another is refused before anything is written."""
    from dpsummary.objective_event import ObjectivePerturbationDpEvent

    op = ObjectivePerturbationDpEvent(noise_multiplier=6.0, jacobian_log_ratio=0.02, dim=5, grid_ratio=2.0**-40)
    led = L.Ledger(tmp_path / "l.jsonl", *key)
    led.reserve(source_id="s1", events=[*ev(), op], delta=DELTA, policy=make_policy(), release_id="r0").commit(None)
    sp = led.spent("s1", delta=DELTA)
    assert set(sp.composed) == {"rdp"}
    assert sp.composed["rdp"] == pytest.approx(A.epsilon_rdp([*ev(), op], DELTA), rel=1e-12)
    before = led.path.read_bytes()
    for accountant in ("prv", "pld"):
        with pytest.raises(L.LedgerError, match="only the rdp accountant"):
            led.reserve(source_id="s1", events=ev(), delta=DELTA, policy=make_policy(accountant=accountant))
    assert led.path.read_bytes() == before
    assert L.verify_ledger(led.path, led.public_key) == []
