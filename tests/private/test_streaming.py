"""Issue 15, large N on one machine: the shared kernel, the exact O(qN) Poisson sampler, the
record store and the streaming reader/encoder (statistical tolerances stated per check)."""

from __future__ import annotations

import os
import stat

import numpy as np
import pytest
import torch
from scipy import stats

from dpsummary.data import (
    BatchStream,
    ColumnSpec,
    Schema,
    Transform,
    encode_batch,
    read_table,
    stream_pass,
)
from dpsummary.models import DTYPE, GaussianMean, LogisticRegression
from dpsummary.private import kernel, noise, sampling
from dpsummary.private.mechanism import PrivateRecords, draw_sample, exact_clipped_sum
from dpsummary.private.preprocess import SchemaCounts, build_count_vector
from dpsummary.private.source import PrivateSource
from dpsummary.private.store import RecordStore


def _rows(n: int, seed: int = 0, d: int = 5) -> tuple[LogisticRegression, np.ndarray]:
    g = torch.Generator().manual_seed(seed)
    model = LogisticRegression(d)
    theta = model.sample_prior(1, g)[0]
    return model, model.simulate(theta, n, g).numpy()


# ---- kernel ----------------------------------------------------------------------------------
def test_dppsvi_partials_combine_bit_identically_under_any_partition() -> None:
    model, rows = _rows(3000)
    theta = model.sample_prior(40, torch.Generator().manual_seed(1))
    whole = kernel.dppsvi_partial(rows, model, theta, clip_norm=0.7)
    rng = np.random.default_rng(3)
    for _ in range(3):
        perm = rng.permutation(len(rows))
        cuts = np.sort(rng.choice(np.arange(1, len(rows)), 5, replace=False))
        parts = [kernel.dppsvi_partial(rows[p], model, theta, clip_norm=0.7) for p in np.split(perm, cuts)]
        assert list(kernel.combine(*parts)) == list(whole)
    # The local mechanism's pre-noise sum is the kernel's finished sum, released in units of C:
    # each record clip(v / C, 1) (kernel normalise_by), the same vectors as clip(v, C) / C.
    unit = kernel.dppsvi_partial(rows, model, theta, clip_norm=1.0, normalise_by=0.7)
    assert np.array_equal(kernel.finish(unit, 1.0), _pre_noise_sum(rows, model, theta, 0.7))
    np.testing.assert_allclose(kernel.finish(unit, 1.0) * 0.7, kernel.finish(whole, 0.7), rtol=1e-6, atol=1e-6)


def _pre_noise_sum(rows: np.ndarray, model: LogisticRegression, theta: torch.Tensor, clip: float) -> np.ndarray:
    class AllIn:
        def __init__(self) -> None:
            self.seen: list[np.ndarray] = []

        def coins(self, n: int, q: float) -> np.ndarray:
            return np.ones(n, dtype=bool)

        def gaussian(self, values: np.ndarray, *, noise_std: float, clip_norm: float) -> np.ndarray:
            self.seen.append(np.array(values))
            return np.array(values)

    rnd = AllIn()
    PrivateRecords(torch.from_numpy(rows), randomness=rnd).noisy_clipped_sum(
        model, theta, sample_rate=1.0, clip_norm=clip, noise_multiplier=1.0)
    return rnd.seen[0]


def test_score_partials_partition_invariant_and_per_record_bounded() -> None:
    model, rows = _rows(5000, seed=2)
    theta = torch.full((model.param_dim,), 0.3, dtype=DTYPE)
    kw = {"score_bound": 1.0, "curvature_bound": 0.5}  # small: clipping bites
    whole = kernel.score_partial(rows, model, theta, **kw)
    parts = kernel.score_partial(rows[:1234], model, theta, **kw) + kernel.score_partial(rows[1234:], model, theta, **kw)
    assert list(parts.score) == list(whole.score) and list(parts.curvature) == list(whole.curvature)
    # Every single record's rounded contribution is within the bounds.
    for i in range(0, 5000, 250):
        one = kernel.score_partial(rows[i:i + 1], model, theta, **kw)
        assert np.linalg.norm(kernel.finish(one.score, 1.0)) <= 1.0
        assert np.linalg.norm(kernel.finish(one.curvature, 0.5)) <= 0.5


def test_score_partial_generic_curvature_path() -> None:
    model = GaussianMean(3)
    rows = np.random.default_rng(0).normal(size=(500, 3))
    theta = torch.zeros(3, dtype=DTYPE)
    a = kernel.score_partial(rows, model, theta, score_bound=2.0, curvature_bound=5.0)
    b = kernel.score_partial(rows[:100], model, theta, score_bound=2.0, curvature_bound=5.0) + kernel.score_partial(
        rows[100:], model, theta, score_bound=2.0, curvature_bound=5.0)
    assert list(a.curvature) == list(b.curvature)


def test_exact_clipped_sum_is_the_kernel() -> None:
    rows = np.random.default_rng(5).normal(size=(1000, 4)) * 0.1
    unit = 2.0 ** -28
    assert np.array_equal(exact_clipped_sum(rows, 1.0), kernel.finish(kernel.fixed_point_sum(rows, unit), 1.0))


# ---- sampling --------------------------------------------------------------------------------
@pytest.mark.parametrize("rate", [0.3, 0.01, 1e-3])
def test_gap_digits_give_the_geometric_distribution(rate: float) -> None:
    q = noise.quantize_sample_rate(rate)
    gaps = sampling._gaps(sampling._distribution(int(q * 2**32)), 100_000)
    kmax = int(4 / q)
    obs = np.bincount(np.minimum(gaps, kmax), minlength=kmax + 1)
    p = q * (1 - q) ** np.arange(kmax + 1)
    p[-1] = (1 - q) ** kmax
    # Chi-square goodness of fit; a correct sampler fails with probability 1e-6.
    assert stats.chisquare(obs, p * len(gaps)).pvalue > 1e-6


def test_poisson_indices_batch_sizes_and_per_record_rate() -> None:
    q = noise.quantize_sample_rate(0.02)
    n, reps = 3000, 3000
    hits = np.zeros(n)
    sizes = []
    for _ in range(reps):
        idx = sampling.poisson_indices(n, q)
        assert np.all(np.diff(idx) > 0) and (idx.size == 0 or (idx[0] >= 0 and idx[-1] < n))
        hits[idx] += 1
        sizes.append(idx.size)
    # Binomial(n, q) batch sizes: mean within 6 standard errors, variance within 15%.
    mean_se = np.sqrt(n * q * (1 - q) / reps)
    assert abs(np.mean(sizes) - n * q) < 6 * mean_se
    assert abs(np.var(sizes) / (n * q * (1 - q)) - 1) < 0.15
    # First and last records included at rate q (no edge effect): 6-sigma bounds.
    se = np.sqrt(q * (1 - q) / reps)
    for block in (hits[:300], hits[-300:]):
        assert abs(block.mean() / reps - q) < 6 * se / np.sqrt(300)


def test_poisson_indices_edges() -> None:
    assert sampling.poisson_indices(0, 0.5).size == 0
    assert np.array_equal(sampling.poisson_indices(7, 1.0), np.arange(7))
    with pytest.raises(ValueError):
        sampling.poisson_indices(10, 0.1)  # not a multiple of 2^-32


def test_draw_sample_accepts_coin_only_replay_doubles() -> None:
    class Coins:
        def coins(self, n: int, q: float) -> np.ndarray:
            return np.arange(n) % 3 == 0

    assert np.array_equal(draw_sample(Coins(), 10, 0.5), [0, 3, 6, 9])


# ---- store -----------------------------------------------------------------------------------
def test_store_spills_to_an_anonymous_private_file_and_reads_back(tmp_path, monkeypatch) -> None:
    monkeypatch.setenv("TMPDIR", str(tmp_path))
    import tempfile

    monkeypatch.setattr(tempfile, "tempdir", None)
    rows = np.random.default_rng(0).normal(size=(5000, 6))
    store = RecordStore(6, memory_bytes=1000)
    for part in np.array_split(rows, 7):
        store.append(part)
    store.seal()
    assert store._fd is not None
    # Nothing of the store is left in the temporary directory: the file was unlinked at once.
    assert list(tmp_path.iterdir()) == []
    mode = os.fstat(store._fd).st_mode
    assert stat.S_IMODE(mode) == 0o600
    assert np.array_equal(np.concatenate(list(store.chunks(999))), rows)
    idx = np.array([0, 1, 2, 17, 18, 4000, 4999])
    assert np.array_equal(store.gather(idx), rows[idx])
    store.close()
    with pytest.raises(RuntimeError):
        store.gather(idx)


# ---- streaming reader and encoder --------------------------------------------------------------
def _consume(path, tf):
    class C:
        def __init__(self) -> None:
            self.rows, self.ind, self.bad = [], [], []

        def add(self, b) -> None:
            e = encode_batch(b, tf)
            self.rows.append(e.rows)
            self.ind.append(e.indicators)
            self.bad.append(e.undecodable)

        def discard(self) -> None:
            pass

    c, ragged = stream_pass(path, C)
    return np.concatenate(c.rows), np.concatenate(c.ind), np.concatenate(c.bad), ragged


def test_streaming_encoder_matches_encode_total_on_messy_csv(tmp_path) -> None:
    text = ("age,colour,y\n 30 ,red,1\nnan,blue,0\n\n41,\u00a0red\u00a0,1\n5,green,2\n"
            "7,x,1,extra\n1e3,red,0\n-inf,blue,1\n,red,\n")
    p = tmp_path / "m.csv"
    p.write_bytes(text.encode() + b"12,r\xffd,1\n")
    table, report = read_table(p, private=True)
    schema = Schema(columns=[ColumnSpec(name="age", kind="numeric", lower=0, upper=100),
                             ColumnSpec(name="colour", kind="categorical", categories=["red", "blue"]),
                             ColumnSpec(name="y", kind="numeric", lower=0, upper=1, integer=True)], target="y")
    tf = Transform.from_schema(schema)
    pts, q = tf.encode_total(table)
    rows, ind, bad, ragged = _consume(p, tf)
    assert np.array_equal(rows, pts.numpy())
    assert np.array_equal(ind, q.indicators)
    assert np.array_equal(bad, report.undecodable) and ragged == report.ragged_rows


def test_fallback_reader_for_unparsable_csv(tmp_path) -> None:
    p = tmp_path / "q.csv"
    p.write_text('a,b\n1,"never closed\n2,3\n')
    out = list(BatchStream(p, fallback=True))
    assert sum(b.num_rows for b in out) <= 2
    src = PrivateSource.open(p)  # never refuses
    assert np.isfinite(src.noisy_record_count(noise_multiplier=1.0))


def test_schema_counts_stream_equals_build_count_vector(tmp_path) -> None:
    rng = np.random.default_rng(0)
    lines = ["a,b,c"] + [f"{rng.integers(0, 50)},{rng.choice(['u', 'v', 'nan', '', 'w '])},{rng.normal():.3f}"
                         for _ in range(3000)]
    p = tmp_path / "s.csv"
    p.write_text("\n".join(lines) + "\n")
    table, _ = read_table(p, private=True)
    ref = build_count_vector(table)
    counts = SchemaCounts(["a", "b", "c"])
    from dpsummary.data import batch_columns, text_column

    for batch in BatchStream(p):
        for name, col in batch_columns(batch).items():
            counts.add(name, text_column(col)[0])
    vec = counts.vector()
    assert vec.keys == ref.keys and np.array_equal(vec.counts, ref.counts) and vec.touches == ref.touches


def test_sampler_tie_paths_are_exact() -> None:
    # When the first 64 uniform bits equal the threshold (probability ~2^-64), the comparison
    # continues with more bits: success probability = the fractional part of x 2^64.
    q = noise.quantize_sample_rate(0.01)
    dist = sampling._distribution(int(q * 2**32))
    i = 3
    t64 = dist.threshold(i, 64, tail=False)
    frac = (dist.threshold(i, 128, tail=False) - (t64 << 64)) / 2**64
    wins = sum(dist.bernoulli_slow(i, t64, tail=False) for _ in range(4000))
    # Binomial(4000, frac): 6-sigma bound.
    assert abs(wins / 4000 - frac) < 6 * np.sqrt(frac * (1 - frac) / 4000) + 1e-9


def test_sampler_forced_ties_terminate(monkeypatch) -> None:
    q = noise.quantize_sample_rate(0.01)
    dist = sampling._distribution(int(q * 2**32))
    calls = {"n": 0}
    real = sampling._uniform64

    def tied(shape):
        calls["n"] += 1
        if calls["n"] == 1:  # the digit words: all exactly at their thresholds
            return np.broadcast_to(dist.digit_thresholds, shape).copy()
        if calls["n"] == 2:  # the tail words: exactly at the tail threshold
            return np.full(shape, np.uint64(dist.tail_threshold))
        return real(shape)

    monkeypatch.setattr(sampling, "_uniform64", tied)
    gaps = sampling._gaps(dist, 5)
    assert gaps.shape == (5,) and np.all(gaps >= 0)
