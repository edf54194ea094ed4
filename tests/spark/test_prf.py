"""Keyed PRF coins (dpsummary/private/prf.py): exact Bernoulli(q) per (row, step), partition
invariance, the key stays secret. No Spark needed.

Statistical tests use fixed test keys (deterministic in CI); each is a test at level 1e-4, so
with a fresh random key the whole module would fail by chance with probability below 5e-4.
"""

from __future__ import annotations

import logging
import pickle

import numpy as np
import pytest
from scipy import stats

from dpsummary.private.noise import quantize_sample_rate
from dpsummary.private.prf import StepCoins, parquet_row_id

ALPHA = 1e-4


def _chi2_binomial(samples: np.ndarray, n: int, p: float) -> float:
    """p-value of a chi-square goodness-of-fit test of integer samples against Binomial(n, p),
    with bins merged so every expected count is at least 5."""
    k = np.arange(n + 1)
    expected = stats.binom.pmf(k, n, p) * samples.size
    observed = np.bincount(samples, minlength=n + 1)[: n + 1].astype(float)
    exp_bins, obs_bins, e_acc, o_acc = [], [], 0.0, 0.0
    for e, o in zip(expected, observed, strict=True):
        e_acc += e
        o_acc += o
        if e_acc >= 5:
            exp_bins.append(e_acc)
            obs_bins.append(o_acc)
            e_acc = o_acc = 0.0
    exp_bins[-1] += e_acc
    obs_bins[-1] += o_acc
    exp_arr, obs_arr = np.array(exp_bins), np.array(obs_bins)
    stat = float(((obs_arr - exp_arr) ** 2 / exp_arr).sum())
    return float(stats.chi2.sf(stat, df=len(exp_arr) - 1))


def test_step_batch_sizes_are_binomial() -> None:
    q = quantize_sample_rate(0.05)
    steps, n = 600, 3000
    coins = StepCoins(q, steps, bytes(range(32)))
    _, st = coins.membership(np.arange(n))
    sizes = np.bincount(st, minlength=steps)
    assert _chi2_binomial(sizes, n, q) > ALPHA


def test_rows_are_in_binomial_T_q_steps_and_steps_are_independent() -> None:
    q = quantize_sample_rate(0.1)
    steps, n = 50, 20000
    coins = StepCoins(q, steps, bytes(reversed(range(32))))
    pos, st = coins.membership(np.arange(n) + 123_456)
    per_row = np.bincount(pos, minlength=n)
    assert _chi2_binomial(per_row, steps, q) > ALPHA
    # Pairwise independence: rows in both step 0 and step 1 ~ Binomial(n, q^2).
    both = np.intersect1d(pos[st == 0], pos[st == 1]).size
    assert stats.binomtest(both, n, q * q).pvalue > ALPHA


def test_rate_is_exact_for_tiny_and_unit_rates() -> None:
    ids = np.arange(1000)
    pos, _ = StepCoins(1.0, 3, bytes(32)).membership(ids)
    assert pos.size == 3000
    pos, _ = StepCoins(2.0**-32, 3, bytes(32)).membership(ids)
    assert pos.size <= 1
    with pytest.raises(ValueError):
        StepCoins(0.1, 3, bytes(32))  # not a multiple of 2^-32


def test_invariant_to_partitioning_and_order() -> None:
    q = quantize_sample_rate(0.02)
    coins = StepCoins.generate(q, 500)
    ids = parquet_row_id(np.repeat([0, 1, 2], 4000), np.tile(np.arange(4000), 3))
    pos, st = coins.membership(ids)
    whole = set(zip(ids[pos].tolist(), st.tolist(), strict=True))
    rng = np.random.default_rng(0)
    shuffled = rng.permutation(ids)
    parts = np.array_split(shuffled, 7)
    pieces: set[tuple[int, int]] = set()
    for part in parts:
        p, s = coins.membership(part)
        pieces |= set(zip(part[p].tolist(), s.tolist(), strict=True))
    assert pieces == whole
    # A run crossing a nonce segment boundary and chunk boundaries gives the same coins.
    per_nonce = (1 << 32) // -(-500 // 16)
    edge = np.arange(per_nonce - 20000, per_nonce + 20000, dtype=np.int64)
    p1, s1 = coins.membership(edge)
    sampled = set(edge[::997].tolist())
    singles = set()
    for i in sampled:
        _, s = coins.membership(np.array([i]))
        singles |= {(i, int(t)) for t in s}
    got = {(int(edge[p]), int(s)) for p, s in zip(p1, s1, strict=True) if int(edge[p]) in sampled}
    assert got == singles


def test_key_is_os_entropy_and_never_shown(caplog: pytest.LogCaptureFixture) -> None:
    a, b = StepCoins.generate(0.5, 4), StepCoins.generate(0.5, 4)
    assert a._key != b._key and len(a._key) == 32
    with caplog.at_level(logging.DEBUG):
        logging.getLogger("dpsummary").info("coins %s %r", a, a)
    for text in (repr(a), str(a), f"{a}", caplog.text):
        assert a._key.hex() not in text and "<secret>" in repr(a)
    # Replay (tests, Spark workers) needs pickling; the copy draws identical coins.
    clone = pickle.loads(pickle.dumps(a))
    ids = np.arange(5000)
    assert all(np.array_equal(x, y) for x, y in zip(a.membership(ids), clone.membership(ids), strict=True))
