"""A memory-bounded store of private records in model space (float64 rows).

The local engine reads the private file once, encodes each Arrow batch by the public total rules
(:func:`dpsummary.data.encode_batch`) and appends the model-space rows here; the mechanisms then
read the rows back in full passes (:meth:`RecordStore.chunks`: the noise-aware statistics, the
DP histograms) or gather the Poisson-sampled rows of one DP-PSVI step (:meth:`RecordStore.gather`,
sorted ``os.pread`` calls: no memory map, so resident memory does not grow with N).

Memory: rows stay in memory up to :data:`MEMORY_BYTES` (a public constant); beyond it they are
spilled to a temporary file and the memory buffer is dropped, so the store costs O(chunk) memory
whatever N is.

The temporary file holds raw-equivalent private data. It is created with mode 0600 inside a new
private directory (``tempfile.mkdtemp``: mode 0700) and UNLINKED AT ONCE, together with its
directory, while the open file descriptor keeps the data: no name of it exists on disk after
creation, so it disappears on every exit path (normal return, exception, ``SIGKILL``, power
loss leaves only unreferenced blocks that the file system frees), and :meth:`close` releases the
descriptor. Nothing about the store (its size, whether it spilled) is logged or returned; the
row count :attr:`RecordStore.num_rows` is private and read only inside the private package.
Set ``TMPDIR`` to a directory on an encrypted volume with the same access controls as the input
if the machine's default temporary directory is not one.
"""

from __future__ import annotations

import os
import tempfile
import weakref
from collections.abc import Iterator

import numpy as np

__all__ = ["MEMORY_BYTES", "RecordStore"]

#: Rows are kept in memory while the store is at most this large; beyond, a private temp file.
MEMORY_BYTES = 64 << 20
#: Rows per chunk of a full pass.
PASS_ROWS = 1 << 16


def _close_fd(fd: int) -> None:
    try:
        os.close(fd)
    except OSError:
        pass


def _private_file() -> int:
    """An anonymous read/write file: created 0600 in a new 0700 directory, then unlinked."""
    directory = tempfile.mkdtemp(prefix="dpsummary-store-")
    path = os.path.join(directory, "rows")
    try:
        fd = os.open(path, os.O_RDWR | os.O_CREAT | os.O_EXCL | getattr(os, "O_CLOEXEC", 0), 0o600)
    finally:
        try:
            os.unlink(path)
        except OSError:
            pass
        os.rmdir(directory)
    return fd


class RecordStore:
    """Append-then-read store of float64 rows of width ``dim`` (see the module docstring)."""

    __slots__ = ("__weakref__", "_buffer", "_closed", "_fd", "_finalizer", "_limit", "_memory", "_rows", "dim")

    def __init__(self, dim: int, *, memory_bytes: int | None = None) -> None:
        if dim < 1:
            raise ValueError("dim must be positive")
        self.dim = int(dim)
        self._buffer: list[np.ndarray] = []
        self._memory: np.ndarray | None = None
        self._rows = 0
        self._fd: int | None = None
        self._closed = False
        self._finalizer: weakref.finalize | None = None
        self._limit = MEMORY_BYTES if memory_bytes is None else memory_bytes

    @classmethod
    def from_array(cls, rows: np.ndarray) -> RecordStore:
        """An in-memory store over ``rows`` (n, dim) (tests, small tables, the self-test)."""
        arr = np.ascontiguousarray(rows, dtype=np.float64)
        if arr.ndim != 2:
            raise ValueError("rows must be a 2-d array")
        store = cls(max(arr.shape[1], 1), memory_bytes=1 << 62)
        store._memory = arr if arr.shape[1] else np.zeros((arr.shape[0], 1))
        store._rows = arr.shape[0]
        return store

    # ---- writing ------------------------------------------------------------------------------
    def append(self, rows: np.ndarray) -> None:
        """Append model-space rows (k, dim); call :meth:`seal` after the last one."""
        if self._closed or self._memory is not None:
            raise RuntimeError("the store is sealed")
        arr = np.ascontiguousarray(rows, dtype=np.float64)
        if arr.ndim != 2 or arr.shape[1] != self.dim:
            raise ValueError("rows do not match the store's width")
        if not arr.shape[0]:
            return
        self._rows += arr.shape[0]
        if self._fd is None and self._rows * self.dim * 8 <= self._limit:
            self._buffer.append(arr)
            return
        if self._fd is None:
            self._fd = _private_file()
            self._finalizer = weakref.finalize(self, _close_fd, self._fd)
            pending, self._buffer = self._buffer, []
            for part in pending:
                self._write_all(part)
        self._write_all(arr)

    def _write_all(self, arr: np.ndarray) -> None:
        assert self._fd is not None
        view = arr.data.cast("B")
        while view:
            written = os.write(self._fd, view)
            view = view[written:]

    def seal(self) -> RecordStore:
        """Finish writing; the store becomes readable."""
        if self._fd is None and self._memory is None:
            self._memory = (np.concatenate(self._buffer) if self._buffer
                            else np.zeros((0, self.dim), dtype=np.float64))
            self._buffer = []
        return self

    # ---- reading (private: callers are the mechanisms) ----------------------------------------
    @property
    def num_rows(self) -> int:
        """Exact number of rows. PRIVATE: only for the mechanisms."""
        return self._rows

    def _check_readable(self) -> None:
        if self._closed:
            raise RuntimeError("the store is closed")
        if self._fd is None and self._memory is None:
            raise RuntimeError("the store is not sealed")

    def chunks(self, rows: int = PASS_ROWS) -> Iterator[np.ndarray]:
        """All rows in order, ``rows`` at a time (a full pass in O(rows x dim) memory)."""
        self._check_readable()
        if self._memory is not None:
            for start in range(0, self._rows, rows):
                yield self._memory[start:start + rows]
            return
        assert self._fd is not None
        width = self.dim * 8
        for start in range(0, self._rows, rows):
            count = min(rows, self._rows - start)
            out = np.empty((count, self.dim), dtype=np.float64)
            self._read_into(out, start * width)
            yield out

    def gather(self, indices: np.ndarray) -> np.ndarray:
        """The rows at sorted, distinct ``indices`` (one ``os.pread`` per run of adjacent rows)."""
        self._check_readable()
        idx = np.asarray(indices, dtype=np.int64)
        if idx.ndim != 1 or (idx.size and (idx[0] < 0 or idx[-1] >= self._rows or np.any(np.diff(idx) <= 0))):
            raise ValueError("indices must be sorted, distinct and within the store")
        if self._memory is not None:
            return self._memory[idx]
        assert self._fd is not None
        if not idx.size:
            return np.zeros((0, self.dim), dtype=np.float64)
        width = self.dim * 8
        # Runs of consecutive indices: one read each.
        breaks = np.flatnonzero(np.diff(idx) != 1) + 1
        starts = np.concatenate([[0], breaks])
        ends = np.concatenate([breaks, [idx.size]])
        out = np.empty((idx.size, self.dim), dtype=np.float64)
        for at, first, count in zip(starts.tolist(), idx[starts].tolist(), (ends - starts).tolist(), strict=True):
            self._read_into(out[at:at + count], first * width)
        return out

    def _read_into(self, out: np.ndarray, offset: int) -> None:
        """Fill the C-contiguous ``out`` from the file at ``offset`` (``os.preadv``, no copy)."""
        assert self._fd is not None
        view = out.data.cast("B")
        while view:
            got = os.preadv(self._fd, [view], offset)
            if got <= 0:
                raise RuntimeError("the record store file is shorter than its rows")
            view, offset = view[got:], offset + got

    # ---- lifetime -----------------------------------------------------------------------------
    def close(self) -> None:
        """Release the rows (memory and the anonymous file's descriptor). Idempotent."""
        self._closed = True
        self._buffer = []
        self._memory = None
        if self._finalizer is not None:
            self._finalizer()
        self._fd = None

    def __enter__(self) -> RecordStore:
        return self

    def __exit__(self, *exc: object) -> None:
        self.close()
