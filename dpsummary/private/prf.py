"""Keyed cryptographic coins per (row id, step): Poisson subsampling that any partitioning replays.

DP-PSVI's T steps each include every record independently with probability ``q`` (Poisson
subsampling; ``q`` a multiple of 2^-32, :func:`~dpsummary.private.noise.quantize_sample_rate`).
The local engine draws those coins from ``os.urandom`` step by step. A distributed engine
(:mod:`dpsummary.private.spark_engine`) instead decides, in ONE pass over the data, every step
that includes each row, on whatever executor holds the row; the coins must then be a function of
the row alone, identical whatever the partitioning, and still CSPRNG-grade. This module gives
exactly that:

* a per-release 256-bit key from OS entropy (:func:`secrets.token_bytes`), never seedable,
  never logged, never written (its ``repr`` hides it);
* the coin of (row id ``r``, step ``t``) is the 32-bit word ``w(r, t)`` of the ChaCha20
  keystream under that key, at a position that depends only on ``(r, t)``, and the row is in
  step ``t``'s batch iff ``w(r, t) < q * 2^32``. Under the standard assumption that ChaCha20 is
  a PRF, the words are independent uniform 32-bit integers, so inclusion is EXACTLY an
  independent Bernoulli(q) per (row, step) (the same rule, ``u32 < ticks``, as
  :func:`~dpsummary.private.noise.poisson_mask`), each row is in Binomial(T, q) steps, and each
  step's batch size is Binomial(N, q). (Geometric gaps drawn from float uniforms would need a
  logarithm and be exact only up to floating-point error; comparing integer words is exact.)

Keystream layout: row ``r`` owns ``B = ceil(T / 16)`` consecutive 64-byte ChaCha20 blocks (16
words each, the first T used). With ``R = floor(2^32 / B)`` rows per nonce, row ``r`` lives under
the 96-bit nonce ``b"dps1" || uint64_le(r // R)`` at block counter ``(r % R) * B``; the 32-bit
counter never overflows (``cryptography`` refuses to let it). Consecutive row ids are consecutive
keystream, so a batch of rows is one vectorised keystream call (about 0.8 GB/s here: 4T bytes per
row, ~4 microseconds per row at T = 500 including the comparison).

Row ids must be a deterministic function of the row's position in the input, never of its
content, and distinct rows must have distinct ids. :func:`parquet_row_id` composes the index of
the row's file in the sorted list of input files with the row's index inside the file (Spark's
``_metadata.row_index`` for Parquet, the file order of pyarrow's reader locally): it does not
depend on how the files are split into partitions or in what order partitions run.

Privacy caveats. The coins are independent of the data, so the per-step batches are exactly a
Poisson subsample as the accountant assumes (neighbouring data sets shift later rows' ids, which
changes nothing in distribution: every (id, step) coin is i.i.d.). The key is shipped inside the
task closure to the workers that evaluate the coins (on a cluster, turn on Spark's RPC and I/O
encryption); anyone holding the key and the data could recompute the batches, so it lives in
memory for one release only. Which steps include a row, and how many rows a step has, are private:
nothing here logs or returns counts to anywhere but the caller.
"""

from __future__ import annotations

import math
import secrets
from dataclasses import dataclass, field

import numpy as np

from .noise import RATE_RESOLUTION_BITS

#: Length of the PRF key in bytes (256 bits, OS entropy).
KEY_BYTES = 32
#: Domain-separation prefix of every nonce (4 bytes): version 1 of the coin layout.
_DOMAIN = b"dps1"
#: ChaCha20 words per 64-byte block.
_WORDS_PER_BLOCK = 16
#: Bits of a row id given to the row's index inside its file (2^40 rows per file).
ROW_INDEX_BITS = 40
#: Rows per vectorised keystream call (memory: 4 * T bytes per row, 32 MB at T = 500).
CHUNK_ROWS = 16384


def parquet_row_id(file_index: np.ndarray | int, row_index: np.ndarray | int) -> np.ndarray:
    """The row id of row ``row_index`` of the ``file_index``-th input file (files sorted by path):
    ``file_index * 2^40 + row_index`` as int64. Position only, never content."""
    f = np.asarray(file_index, dtype=np.int64)
    r = np.asarray(row_index, dtype=np.int64)
    if np.any(r < 0) or np.any(r >= (1 << ROW_INDEX_BITS)) or np.any(f < 0) or np.any(f >= (1 << 22)):
        raise ValueError("row index or file index out of the row-id range")
    return (f << np.int64(ROW_INDEX_BITS)) | r


@dataclass(frozen=True)
class StepCoins:
    """Keyed Poisson coins for ``steps`` steps at rate ``sample_rate`` (a multiple of 2^-32).

    Create with :meth:`generate` (OS entropy). Tests replay the same coins on neighbouring data
    sets or different partitionings by reusing one instance; nothing reachable from the CLI takes
    a key from outside."""

    sample_rate: float
    steps: int
    _key: bytes = field(repr=False)

    def __post_init__(self) -> None:
        ticks = self.sample_rate * 2**RATE_RESOLUTION_BITS
        if not (0 < self.sample_rate <= 1) or ticks != math.floor(ticks):
            raise ValueError("sample_rate must lie in (0, 1] and be a multiple of 2^-32; quantise it first")
        if self.steps < 1:
            raise ValueError("steps must be at least 1")
        if not isinstance(self._key, bytes) or len(self._key) != KEY_BYTES:
            raise ValueError("the PRF key must be 32 bytes")

    @classmethod
    def generate(cls, sample_rate: float, steps: int) -> StepCoins:
        """A fresh 256-bit key from the OS CSPRNG (never seedable)."""
        return cls(sample_rate, steps, secrets.token_bytes(KEY_BYTES))

    def __repr__(self) -> str:  # the key never appears in a repr, a log line or a traceback
        return f"StepCoins(sample_rate={self.sample_rate!r}, steps={self.steps}, key=<secret>)"

    __str__ = __repr__

    @property
    def _ticks(self) -> int:
        return int(self.sample_rate * 2**RATE_RESOLUTION_BITS)

    @property
    def _blocks_per_row(self) -> int:
        return -(-self.steps // _WORDS_PER_BLOCK)

    def _keystream(self, first_row: int, num_rows: int) -> np.ndarray:
        """Words (num_rows, T) of rows first_row .. first_row + num_rows - 1 (one nonce segment)."""
        from cryptography.hazmat.primitives.ciphers import Cipher, algorithms

        bpr = self._blocks_per_row
        per_nonce = (1 << 32) // bpr
        segment, offset = divmod(first_row, per_nonce)
        if offset + num_rows > per_nonce:
            raise ValueError("a keystream run crosses a nonce segment")
        nonce = (offset * bpr).to_bytes(4, "little") + _DOMAIN + segment.to_bytes(8, "little")
        enc = Cipher(algorithms.ChaCha20(self._key, nonce), mode=None).encryptor()
        words = np.frombuffer(enc.update(bytes(num_rows * bpr * 64)), dtype="<u4")
        return words.reshape(num_rows, bpr * _WORDS_PER_BLOCK)[:, : self.steps]

    def _runs(self, row_ids: np.ndarray) -> list[tuple[int, int, int]]:
        """Split ``row_ids`` (in the given order) into runs (start position, first id, length) of
        consecutive ids inside one nonce segment, at most CHUNK_ROWS long."""
        ids = np.asarray(row_ids, dtype=np.int64)
        if ids.ndim != 1:
            raise ValueError("row ids must be a 1-d array")
        if ids.size == 0:
            return []
        if ids.min() < 0:
            raise ValueError("row ids must be non-negative")
        per_nonce = (1 << 32) // self._blocks_per_row
        seg = ids // per_nonce
        breaks = np.flatnonzero((np.diff(ids) != 1) | (np.diff(seg) != 0)) + 1
        starts = np.concatenate([[0], breaks])
        ends = np.concatenate([breaks, [ids.size]])
        runs = []
        for s, e in zip(starts.tolist(), ends.tolist(), strict=True):
            for a in range(s, e, CHUNK_ROWS):
                b = min(a + CHUNK_ROWS, e)
                runs.append((a, int(ids[a]), b - a))
        return runs

    def membership(self, row_ids: np.ndarray) -> tuple[np.ndarray, np.ndarray]:
        """Every (row, step) inclusion of these rows: two int64 arrays ``(positions, steps)``,
        ``positions`` indexing into ``row_ids``, sorted by position then step. Private: the
        caller must never log their lengths."""
        ticks = np.uint32(self._ticks) if self._ticks < (1 << 32) else None
        pos_parts: list[np.ndarray] = []
        step_parts: list[np.ndarray] = []
        for start, first, length in self._runs(row_ids):
            if ticks is None:  # q = 1: every row in every step
                hit = np.ones((length, self.steps), dtype=bool)
            else:
                hit = self._keystream(first, length) < ticks
            r, t = np.nonzero(hit)
            pos_parts.append(r.astype(np.int64) + start)
            step_parts.append(t.astype(np.int64))
        if not pos_parts:
            return np.zeros(0, np.int64), np.zeros(0, np.int64)
        return np.concatenate(pos_parts), np.concatenate(step_parts)

    def mask(self, row_ids: np.ndarray, step: int) -> np.ndarray:
        """Boolean inclusion mask of these rows in ``step`` (0-based); for replay and tests."""
        if not 0 <= step < self.steps:
            raise ValueError("step out of range")
        ids = np.asarray(row_ids, dtype=np.int64)
        out = np.zeros(ids.shape[0], dtype=bool)
        pos, steps = self.membership(ids)
        out[pos[steps == step]] = True
        return out
