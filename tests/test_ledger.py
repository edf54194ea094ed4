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
                        content_id="hmac-sha256:00", release_id=f"r{i}", stage="all")
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


def test_holds(tmp_path, key):
    one = A.epsilon_rdp(ev(), DELTA)
    pol = make_policy(total_epsilon=3 * one, per_release=3 * one)
    led = L.Ledger(tmp_path / "l.jsonl", *key)
    r1 = led.reserve(source_id="s", events=[dpa.GaussianDpEvent(100.0)], delta=DELTA, policy=pol,
                     release_id="A", hold_epsilon=2 * one)
    r1.commit()
    with pytest.raises(L.BudgetExceeded):  # A's hold blocks B
        led.reserve(source_id="s", events=ev(), delta=DELTA, policy=pol, release_id="B",
                    hold_epsilon=2 * one)
    led.reserve(source_id="s", events=ev(), delta=DELTA, policy=pol, release_id="A").commit()
    assert led.spent("s").active_holds == 0  # replaced by A's second stage
    led.reserve(source_id="s", events=ev(), delta=DELTA, policy=pol, release_id="B").commit()


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
