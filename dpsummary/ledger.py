"""The privacy ledger: an append-only, hash-chained, signed JSON Lines file.

Entries
-------
Each line is ``canonical_json(entry) + "\\n"`` (see :func:`dpsummary.artifact.canonical_json`)::

    {seq, prev_hash, time, kind: "reserve" | "commit" | "abort" | "settle", ref, release_id, stage,
     source_id, content_id, adjacency, events, delta, extra_delta, accountant, epsilon, hold_epsilon,
     artifact_digest, reason, software, keyid, sig}

* ``seq`` counts lines from 0; ``prev_hash`` is ``sha256:`` of the previous line's bytes
  (its canonical JSON including ``sig``), 64 zeros for the first line.
* ``sig`` is base64 Ed25519 over ``canonical_json(entry without "sig")``.
* ``events`` (reserve only) are dp_accounting events as JSON (:func:`accounting.event_to_json`);
  commit/abort/settle entries carry ``[]`` and point at their reserve entry with ``ref``.
* ``extra_delta`` (reserve) is delta spent outside the events (partition selection of DP schema
  estimation), in [0, 1); see the charging rule.
* ``epsilon`` stores, for information only, the reserve's standalone epsilon under its
  accountant at its delta; the audit recomputes it and never trusts it.
* ``content_id`` is always ``null``: an entry carries nothing computed from the records (the
  ledger is the document auditors receive). A release is bound to what it published by
  ``artifact_digest`` (the digest of the signed artifact, post-processing of released values).
  Ledgers written before this change may carry ``hmac-sha256:`` content ids (an HMAC of the
  input file under ``keys/curator.secret``, which no longer exists in new installations): they
  verify and audit unchanged; with the secret, such an id tests a guessed input file exactly,
  so a curator who still has ``curator.secret`` should destroy it (SECURITY.md).

Charging rule
-------------
A reserve entry is written (and fsynced) BEFORE the caller touches private data, so every
events list in a reserve entry is charged to its source for ever: committed, aborted and
never-finished (crashed) reservations all count. The budget of a source is the composition of
all its charged events under ONE accountant (the policy's accountant of record), evaluated at
the policy's ``total_delta`` minus the source's ``extra_delta``s, plus ``-log(1 - x)`` for each
such ``x``: :func:`dpsummary.accounting.composed_epsilon`, the one computation shared with the
audit and the artifact's claim; never the sum of per-release epsilons.

A reserve may also carry ``hold_epsilon`` > 0: an advance claim on the rest of that release's
budget (the release reserves its DP count first, then its optimisation once the count is
known). A hold is active until a later reserve entry of the same ``release_id`` replaces it,
the holding reservation is aborted, or a ``settle`` entry (``ref`` = the holding reserve's
seq, no events, a short reason) ends it; an active hold counts as ``hold_epsilon`` added on top
of the composed epsilon (a conservative, basic-composition bound). Settling never checks a
budget, so it cannot be refused.

Sessions, holds and crashes
---------------------------
A release runs inside :meth:`Ledger.session`: on every exit (normal or by exception) the
session aborts each of its reservations not yet finished and settles the release's active
hold, each step attempted even if an earlier one failed. While a session is open its process
holds an exclusive OS lock on ``<ledger>.live/<release_id>.lock`` (released by the OS when the
process dies). :meth:`Ledger.recover`, run under the ledger lock by every reserve, settles each
active hold whose liveness lock can be taken at once (its owner is gone): reason "owner gone".
The charged events of a crashed release stay charged; only its advance hold ends.

Times
-----
Ledger entries are published to auditors, so no entry carries a data-dependent time: every
entry of a session carries the session's ``started`` time (captured by the release before any
record is read, second granularity), commit, abort and settle included; entries written outside
a session carry the current time floored to :data:`TIME_GRANULARITY_S` (an hour). The torn-tail
quarantine file ``<ledger>.torn`` is curator-local and keeps a fine time for forensics.

Concurrency and crash safety
----------------------------
One exclusive lock (``filelock.FileLock`` on ``<ledger>.lock``) covers the whole cycle: read,
verify the chain and signatures, repair a torn tail, check the budget, append, fsync. Appends
are one ``write`` on an ``O_APPEND`` descriptor followed by ``fsync``.

A crash (SIGKILL, power loss) can leave at most one *torn tail*: bytes after the last newline.
Readers report it as a ``torn-tail`` problem of severity ``"warning"``, distinct from
tampering. The next writer, under the lock, repairs it: if the tail is a complete, validly
signed, correctly chained entry missing only its newline, the newline is added (the entry
stays); otherwise the tail is moved to ``<ledger>.torn`` (appended there with its offset, for
forensics) and the file is truncated to the last newline. Dropping such a tail cannot
under-count: :meth:`Ledger.reserve` returns only after its line is completely written and
fsynced, so a torn reserve belongs to a caller that never received a reservation and never
touched the data; and a torn commit/abort changes no charge (its reserve stays charged).

Limitation: deleting whole lines at the END of the file cannot be detected from the file alone;
anchor :meth:`Ledger.head` (seq and hash) elsewhere (e.g. print it, keep it in the artifact).
"""

from __future__ import annotations

import base64
import binascii
import contextlib
import datetime as _dt
import hashlib
import json
import os
import re
import secrets
from collections.abc import Sequence
from dataclasses import asdict, dataclass, field
from pathlib import Path
from typing import TYPE_CHECKING, Any, Literal

from filelock import FileLock, Timeout

from . import accounting as acc
from . import keys as _keys
from .artifact import canonical_json, published_timestamp

if TYPE_CHECKING:
    from .policy import Policy

ADJACENCY = "add/remove one record"
GENESIS_HASH = "sha256:" + "0" * 64
KINDS = ("reserve", "commit", "abort", "settle")
#: Public granularity of times written outside a release session (seconds).
TIME_GRANULARITY_S = 3600
LOCK_TIMEOUT_S = 600.0
# Release ids that may name a liveness lock file (no path separators, no dots).
_SAFE_RELEASE_ID = re.compile(r"[A-Za-z0-9_-]{1,128}")
ENTRY_FIELDS = frozenset(
    {
        "seq", "prev_hash", "time", "kind", "ref", "release_id", "stage", "source_id",
        "content_id", "adjacency", "events", "delta", "extra_delta", "accountant", "epsilon",
        "hold_epsilon", "artifact_digest", "reason", "software", "keyid", "sig",
    }
)

__all__ = [
    "ADJACENCY",
    "BudgetExceeded",
    "Ledger",
    "LedgerError",
    "LedgerState",
    "Problem",
    "ReleaseSession",
    "Reservation",
    "Spent",
    "TIME_GRANULARITY_S",
    "check_session_time",
    "coarse_now",
    "open_holds",
    "read_ledger",
    "spent_in_entries",
    "verify_ledger",
]


class LedgerError(Exception):
    """The ledger is unreadable, fails verification, or was used incorrectly (one line)."""


class BudgetExceeded(LedgerError):
    """The reservation would exceed the policy's budget. The message names only epsilons."""


@dataclass(frozen=True)
class Problem:
    """One verification finding. ``line`` is 1-based; ``severity`` is "error" (tampering,
    corruption, foreign key) or "warning" (a torn tail left by a crash: repairable)."""

    line: int
    seq: int | None
    kind: str
    message: str
    severity: Literal["error", "warning"] = "error"

    def as_dict(self) -> dict[str, Any]:
        return asdict(self)


@dataclass
class LedgerState:
    """The parsed ledger: valid entries (in order), problems found, and the torn tail if any."""

    entries: list[dict[str, Any]]
    problems: list[Problem]
    last_hash: str
    valid_length: int  # bytes up to and including the last newline
    torn_tail: bytes = b""

    @property
    def errors(self) -> list[Problem]:
        return [p for p in self.problems if p.severity == "error"]


@dataclass
class Spent:
    """Budget spent by one source: composed epsilon per accountant (one accountant over all
    charged events, at ``delta``; only ``"rdp"`` when the events include objective perturbation's,
    which no other accountant composes), the naive sum of per-reservation epsilons, active holds."""

    source_id: str
    delta: float
    composed: dict[str, float]
    naive_sum: float
    reservations: int
    active_holds: float = 0.0
    release_ids: list[str] = field(default_factory=list)

    def as_dict(self) -> dict[str, Any]:
        return asdict(self)


def _now() -> str:
    """Fine current time: curator-local files only (the torn-tail quarantine)."""
    return _dt.datetime.now(_dt.UTC).isoformat(timespec="microseconds")


def coarse_now() -> str:
    """The current time floored to :data:`TIME_GRANULARITY_S` (for published entries)."""
    now = int(_dt.datetime.now(_dt.UTC).timestamp())
    floored = now - now % TIME_GRANULARITY_S
    return _dt.datetime.fromtimestamp(floored, _dt.UTC).isoformat(timespec="seconds")


def check_session_time(started: str) -> str:
    """Validate a session start time: ISO-8601 UTC at whole seconds (no finer part)."""
    try:
        t = _dt.datetime.fromisoformat(started)
    except (TypeError, ValueError):
        raise LedgerError(f"session start time {started!r} is not ISO-8601") from None
    if t.tzinfo is None or t.utcoffset() != _dt.timedelta(0) or t.microsecond:
        raise LedgerError("session start time must be UTC at whole seconds")
    return started


def _line_hash(line: bytes) -> str:
    return "sha256:" + hashlib.sha256(line).hexdigest()


def _signing_bytes(entry: dict[str, Any]) -> bytes:
    return canonical_json({k: v for k, v in entry.items() if k != "sig"})


def _check_entry_shape(e: Any) -> str | None:
    """None if ``e`` is a structurally valid entry, else a short reason."""
    if not isinstance(e, dict):
        return "not a JSON object"
    if set(e) != ENTRY_FIELDS:
        missing = sorted(ENTRY_FIELDS - set(e))
        extra = sorted(set(e) - ENTRY_FIELDS)
        return f"fields missing {missing} / unexpected {extra}"
    typed = {
        "seq": int, "prev_hash": str, "time": str, "kind": str, "release_id": str,
        "source_id": str, "adjacency": str, "events": list, "accountant": str,
        "keyid": str, "sig": str, "software": dict,
    }
    for k, t in typed.items():
        if not isinstance(e[k], t) or isinstance(e[k], bool):
            return f"field {k!r} has the wrong type"
    if e["kind"] not in KINDS:
        return "unknown kind"
    if not isinstance(e["delta"], float | int) or isinstance(e["delta"], bool):
        return "field 'delta' has the wrong type"
    if (not isinstance(e["extra_delta"], float | int) or isinstance(e["extra_delta"], bool)
            or not (0 <= e["extra_delta"] < 1)):
        return "field 'extra_delta' has the wrong type or lies outside [0, 1)"
    if e["kind"] == "reserve":
        if e["ref"] is not None:
            return "reserve entry with a ref"
    elif not isinstance(e["ref"], int) or isinstance(e["ref"], bool):
        return "commit/abort/settle entry without ref"
    if e["kind"] != "reserve" and e["events"]:
        return "commit/abort/settle entry with events"
    return None


def read_ledger(path: str | Path, public_key: _keys.Ed25519PublicKey) -> LedgerState:
    """Parse and verify a ledger file (missing file: empty ledger).

    Checks per line: canonical JSON, entry shape, ``keyid`` equals ``public_key``'s id (else
    ``foreign-key``), signature, ``seq`` equals the line index (``seq``: gap, reorder,
    duplicate), ``prev_hash`` chains to the previous line (``broken-chain``), commit/abort refers
    to an earlier reserve of the same release and source that is not already finished
    (``bad-ref``). An unterminated final segment is a ``torn-tail`` warning. Only lines without
    problems are returned in ``entries``; all lines still advance the chain.
    """
    p = Path(path)
    try:
        data = p.read_bytes()
    except FileNotFoundError:
        return LedgerState([], [], GENESIS_HASH, 0)
    except OSError as exc:
        raise LedgerError(f"cannot read ledger {p}: {exc.strerror}") from None
    kid = _keys.key_id(public_key)
    nl = data.rfind(b"\n")
    body, tail = (data[: nl + 1], data[nl + 1 :]) if nl >= 0 else (b"", data)
    lines = body.split(b"\n")[:-1] if body else []
    problems: list[Problem] = []
    entries: list[dict[str, Any]] = []
    prev = GENESIS_HASH
    reserves: dict[int, dict[str, Any]] = {}
    finished: set[int] = set()
    settled: set[int] = set()
    for i, line in enumerate(lines):
        lineno = i + 1
        try:
            e = json.loads(line.decode("utf-8"))
            shape = _check_entry_shape(e)
            if shape is None and canonical_json(e) != line:
                shape = "not in canonical form"
        except (UnicodeDecodeError, json.JSONDecodeError, ValueError, RecursionError):
            e, shape = None, "not valid JSON"
        if shape is not None or e is None:
            problems.append(Problem(lineno, None, "malformed", f"line {lineno}: {shape}"))
            prev = _line_hash(line)
            continue
        seq = e["seq"]
        ok = True
        if e["keyid"] != kid:
            problems.append(Problem(lineno, seq, "foreign-key", f"line {lineno}: signed by another key ({e['keyid']})"))
            ok = False
        else:
            try:
                sig = base64.b64decode(e["sig"].encode("ascii"), validate=True)
                if base64.b64encode(sig).decode("ascii") != e["sig"]:
                    sig = b""  # non-canonical base64 would give one entry two encodings
            except (binascii.Error, ValueError, UnicodeEncodeError):
                sig = b""
            if not _keys.verify(public_key, _signing_bytes(e), sig):
                problems.append(Problem(lineno, seq, "bad-signature", f"line {lineno}: signature does not verify"))
                ok = False
        if seq != i:
            problems.append(Problem(lineno, seq, "seq", f"line {lineno}: seq {seq}, expected {i} (gap, reorder or duplicate)"))
            ok = False
        if e["prev_hash"] != prev:
            problems.append(Problem(lineno, seq, "broken-chain", f"line {lineno}: prev_hash does not match line {lineno - 1}"))
            ok = False
        if ok and e["kind"] == "reserve":
            try:
                acc.events_from_json(e["events"])
            except ValueError as exc:
                problems.append(Problem(lineno, seq, "malformed", f"line {lineno}: bad events ({exc})"))
                ok = False
        if ok and e["kind"] != "reserve":
            r = reserves.get(e["ref"])
            if r is None or r["release_id"] != e["release_id"] or r["source_id"] != e["source_id"]:
                problems.append(Problem(lineno, seq, "bad-ref", f"line {lineno}: refers to no matching reserve"))
                ok = False
            elif e["kind"] == "settle":
                if not (isinstance(r["hold_epsilon"], float | int) and r["hold_epsilon"] > 0) or e["ref"] in settled:
                    problems.append(Problem(lineno, seq, "bad-ref", f"line {lineno}: settles no open hold"))
                    ok = False
            elif e["ref"] in finished:
                problems.append(Problem(lineno, seq, "bad-ref", f"line {lineno}: reservation {e['ref']} finished twice"))
                ok = False
        prev = _line_hash(line)
        if ok:
            entries.append(e)
            if e["kind"] == "reserve":
                reserves[seq] = e
            elif e["kind"] == "settle":
                settled.add(e["ref"])
            else:
                finished.add(e["ref"])
    if tail:
        problems.append(
            Problem(len(lines) + 1, None, "torn-tail",
                    f"line {len(lines) + 1}: unterminated final line ({len(tail)} bytes), left by an interrupted write",
                    severity="warning")
        )
    return LedgerState(entries, problems, prev, len(body), tail)


def verify_ledger(path: str | Path, public_key: _keys.Ed25519PublicKey) -> list[Problem]:
    """All problems of the ledger (empty list: the ledger verifies). See :func:`read_ledger`."""
    return read_ledger(path, public_key).problems


# --------------------------------------------------------------------------- budget helpers


def charged_extra_delta(entries: Sequence[dict[str, Any]], source_id: str) -> float:
    """Sum of the delta that reserves of ``source_id`` spend outside their events (e.g. the
    partition selection of DP schema estimation); composition runs at total_delta minus this."""
    return float(sum(e["extra_delta"] for e in entries if e["kind"] == "reserve" and e["source_id"] == source_id))


def _charged_extra_deltas(entries: Sequence[dict[str, Any]], source_id: str) -> list[float]:
    return [float(e["extra_delta"]) for e in entries
            if e["kind"] == "reserve" and e["source_id"] == source_id and e["extra_delta"] > 0]


def _charged_events(entries: Sequence[dict[str, Any]], source_id: str) -> list[Any]:
    out: list[Any] = []
    for e in entries:
        if e["kind"] == "reserve" and e["source_id"] == source_id:
            out.extend(acc.events_from_json(e["events"]))
    return out


def _active_holds(entries: Sequence[dict[str, Any]], source_id: str) -> dict[str, float]:
    """``{release_id: hold_epsilon}`` of holds still active for the source."""
    holds: dict[str, float] = {}
    hold_seq: dict[str, int] = {}
    for e in entries:
        if e["source_id"] != source_id:
            continue
        rid = e["release_id"]
        if e["kind"] == "reserve":
            holds.pop(rid, None)  # a later reserve of the same release replaces its hold
            h = e["hold_epsilon"]
            if isinstance(h, float | int) and h > 0:
                holds[rid] = float(h)
                hold_seq[rid] = e["seq"]
        elif e["kind"] in ("abort", "settle") and rid in holds and e["ref"] == hold_seq.get(rid):
            holds.pop(rid)
    return holds


def open_holds(entries: Sequence[dict[str, Any]]) -> list[dict[str, Any]]:
    """Every active hold of every source: ``{source_id, release_id, hold_epsilon, since_seq}``."""
    out = []
    for sid in sorted({e["source_id"] for e in entries}):
        seqs = {e["release_id"]: e["seq"] for e in entries
                if e["kind"] == "reserve" and e["source_id"] == sid and e["hold_epsilon"]}
        for rid, h in _active_holds(entries, sid).items():
            out.append({"source_id": sid, "release_id": rid, "hold_epsilon": h, "since_seq": seqs.get(rid)})
    return out


def _hold_reserves(entries: Sequence[dict[str, Any]]) -> list[dict[str, Any]]:
    """The reserve entries whose holds are still active (any source)."""
    by_seq = {e["seq"]: e for e in entries if e["kind"] == "reserve"}
    out = []
    for h in open_holds(entries):
        seq = h["since_seq"]
        if seq is not None and seq in by_seq:
            out.append(by_seq[seq])
    return out


class Reservation:
    """A charged reservation; finish it with :meth:`commit` or :meth:`abort` (either way, and
    also if neither is ever called, its events stay charged)."""

    def __init__(self, ledger: Ledger, entry: dict[str, Any], *, time: str | None = None):
        self.ledger = ledger
        self.time = time
        self.seq: int = entry["seq"]
        self.release_id: str = entry["release_id"]
        self.source_id: str = entry["source_id"]
        self.entry = entry
        self.finished = False

    def commit(self, artifact_digest: str | None = None) -> dict[str, Any]:
        """Record success (with the artifact's digest, if an artifact was written)."""
        return self._finish("commit", artifact_digest=artifact_digest)

    def abort(self, reason: str = "") -> dict[str, Any]:
        """Record failure. The reservation's events STAY charged."""
        return self._finish("abort", reason=reason)

    def _finish(self, kind: str, **kw: Any) -> dict[str, Any]:
        if self.finished:
            raise LedgerError(f"reservation {self.seq} is already finished")
        e = self.ledger._append(kind=kind, base=self.entry, time=self.time, **kw)
        self.finished = True
        return e


class Ledger:
    """A ledger file written with one signing key. See the module docstring for the design."""

    def __init__(
        self,
        path: str | Path,
        private_key: _keys.Ed25519PrivateKey,
        keyid: str | None = None,
        *,
        lock_timeout: float = LOCK_TIMEOUT_S,
    ):
        self.path = Path(path)
        self.private_key = private_key
        self.public_key = private_key.public_key()
        self.keyid = keyid if keyid is not None else _keys.key_id(private_key)
        if self.keyid != _keys.key_id(private_key):
            raise LedgerError("keyid does not belong to the ledger's signing key")
        self.lock = FileLock(str(self.path) + ".lock", timeout=lock_timeout)
        self.lock_timeout = lock_timeout

    # ------------------------------------------------------------------ reading

    def state(self) -> LedgerState:
        return read_ledger(self.path, self.public_key)

    def head(self) -> tuple[int, str]:
        """``(number of entries, hash of the last line)``: anchor it to detect tail deletion."""
        st = self.state()
        return len(st.entries), st.last_hash

    def spent(
        self,
        source_id: str,
        delta: float | None = None,
        accountants: Sequence[acc.Accountant] = acc.ACCOUNTANTS,
    ) -> Spent:
        """Composed epsilon under each of ``accountants`` over every charged event of
        ``source_id`` at ``delta`` (default: the largest delta recorded for the source) minus
        the source's ``extra_delta``s, with their slack added
        (:func:`dpsummary.accounting.composed_epsilon`, the budget check's computation); the
        naive sum of the per-reservation epsilons (each under its own accountant and delta);
        and ``active_holds``, the sum of the source's active holds (not included in
        ``composed``). ``Spent.delta`` is the delta the events were composed at."""
        st = self._read_verified()
        return _spent(st.entries, source_id, delta, accountants)

    # ------------------------------------------------------------------ writing

    def _read_verified(self) -> LedgerState:
        st = self.state()
        if st.errors:
            raise LedgerError(f"ledger {self.path} fails verification: {st.errors[0].message}")
        return st

    def repair(self) -> list[Problem]:
        """Under the lock, repair a torn tail (see module docstring); returns what was found."""
        with self.lock:
            st = self.state()
            self._repair_locked(st)
            return st.problems

    def _repair_locked(self, st: LedgerState) -> LedgerState:
        if not st.torn_tail:
            return st
        tail = st.torn_tail
        try:
            e = json.loads(tail.decode("utf-8"))
            complete = (
                _check_entry_shape(e) is None
                and canonical_json(e) == tail
                and e["keyid"] == self.keyid
                and e["seq"] == len(st.entries)
                and e["prev_hash"] == st.last_hash
                and _keys.verify(self.public_key, _signing_bytes(e), base64.b64decode(e["sig"]))
            )
        except (UnicodeDecodeError, ValueError, binascii.Error, RecursionError):
            complete = False
        if complete and not st.errors:
            with open(self.path, "ab") as fh:
                fh.write(b"\n")
                fh.flush()
                os.fsync(fh.fileno())
        else:
            quarantine = self.path.with_name(self.path.name + ".torn")
            record = canonical_json(
                {"time": _now(), "offset": st.valid_length, "bytes_b64": base64.b64encode(tail).decode("ascii")}
            )
            fd = os.open(quarantine, os.O_WRONLY | os.O_APPEND | os.O_CREAT, 0o600)
            try:
                os.write(fd, record + b"\n")
                os.fsync(fd)
            finally:
                os.close(fd)
            with open(self.path, "r+b") as fh:
                fh.truncate(st.valid_length)
                fh.flush()
                os.fsync(fh.fileno())
        return self.state()

    def _write_line(self, entry: dict[str, Any]) -> None:
        line = canonical_json(entry) + b"\n"
        created = not self.path.exists()
        self.path.parent.mkdir(parents=True, exist_ok=True)
        fd = os.open(self.path, os.O_WRONLY | os.O_APPEND | os.O_CREAT, 0o600)
        try:
            view = memoryview(line)
            while view:
                n = os.write(fd, view)
                view = view[n:]
            os.fsync(fd)
        finally:
            os.close(fd)
        # The ledger's file times are the time this entry publishes (a release's recorded start,
        # whole seconds), never the moment of the write, which would time the run (issue 35).
        stamp = published_timestamp(entry.get("time"))
        if stamp is not None:
            with contextlib.suppress(OSError):
                os.utime(self.path, (stamp, stamp))
        if created:
            with contextlib.suppress(OSError):
                dfd = os.open(self.path.parent, os.O_RDONLY)
                try:
                    os.fsync(dfd)
                finally:
                    os.close(dfd)

    def _sign_entry(self, entry: dict[str, Any]) -> dict[str, Any]:
        entry = {k: v for k, v in entry.items() if k != "sig"}
        sig = _keys.sign(self.private_key, canonical_json(entry))
        entry["sig"] = base64.b64encode(sig).decode("ascii")
        return entry

    def _new_entry(self, st: LedgerState, *, time: str | None = None, **fields: Any) -> dict[str, Any]:
        entry: dict[str, Any] = {
            "seq": len(st.entries),
            "prev_hash": st.last_hash,
            "time": time if time is not None else coarse_now(),
            "kind": "reserve",
            "ref": None,
            "release_id": "",
            "stage": None,
            "source_id": "",
            "content_id": None,
            "adjacency": ADJACENCY,
            "events": [],
            "delta": 0.0,
            "extra_delta": 0.0,
            "accountant": "rdp",
            "epsilon": None,
            "hold_epsilon": 0.0,
            "artifact_digest": None,
            "reason": None,
            "software": {"dpsummary": _dpsummary_version(), **acc.accountant_versions()},
            "keyid": self.keyid,
        }
        entry.update(fields)
        return self._sign_entry(entry)

    def _append(self, *, kind: str, base: dict[str, Any], time: str | None = None, **kw: Any) -> dict[str, Any]:
        with self.lock:
            st = self._repair_locked(self._read_verified())
            if any(e["kind"] in ("commit", "abort") and e["ref"] == base["seq"] for e in st.entries):
                raise LedgerError(f"reservation {base['seq']} is already finished")
            entry = self._new_entry(
                st,
                time=time,
                kind=kind,
                ref=base["seq"],
                release_id=base["release_id"],
                stage=base["stage"],
                source_id=base["source_id"],
                delta=base["delta"],
                extra_delta=0.0,
                accountant=base["accountant"],
                artifact_digest=kw.get("artifact_digest"),
                reason=(str(kw.get("reason"))[:200] if kind == "abort" else None),
            )
            self._write_line(entry)
            return entry

    # ------------------------------------------------------------------ holds and sessions

    def live_lock_path(self, release_id: str) -> Path:
        """The liveness lock a release session holds while it runs:
        ``<ledger>.live/<release_id>.lock``. Only for ids of letters, digits, ``_`` and ``-``
        (others raise :class:`LedgerError`: they could name a path outside the directory)."""
        if not _SAFE_RELEASE_ID.fullmatch(release_id):
            raise LedgerError("a release session needs a release id of letters, digits, '_' or '-'")
        return self.path.with_name(self.path.name + ".live") / f"{release_id}.lock"

    def _settle_locked(self, st: LedgerState, hold: dict[str, Any], reason: str, time: str | None) -> LedgerState:
        entry = self._new_entry(
            st, time=time, kind="settle", ref=hold["seq"], release_id=hold["release_id"], stage=hold["stage"],
            source_id=hold["source_id"], delta=hold["delta"],
            accountant=hold["accountant"], reason=reason[:200],
        )
        self._write_line(entry)
        return self.state()

    def settle(self, *, source_id: str, release_id: str, reason: str, time: str | None = None) -> bool:
        """End the release's active hold, if any (never checks budgets, so never refused).
        Returns True if a hold was settled."""
        with self.lock:
            st = self._repair_locked(self._read_verified())
            for hold in _hold_reserves(st.entries):
                if hold["source_id"] == source_id and hold["release_id"] == release_id:
                    self._settle_locked(st, hold, reason, time)
                    return True
        return False

    def _recover_locked(self, st: LedgerState) -> LedgerState:
        for hold in _hold_reserves(st.entries):
            if not _SAFE_RELEASE_ID.fullmatch(hold["release_id"]):
                # No session can run under such an id, so no live process owns this hold.
                st = self._settle_locked(st, hold, "owner gone", None)
                continue
            lock = FileLock(str(self.live_lock_path(hold["release_id"])), timeout=0)
            try:
                lock.acquire(timeout=0)
            except Timeout:
                continue  # its session is alive
            try:
                st = self._settle_locked(st, hold, "owner gone", None)
                # Unlinked while still held, so no stray lock files pile up in <ledger>.live.
                with contextlib.suppress(OSError):
                    self.live_lock_path(hold["release_id"]).unlink()
            finally:
                lock.release()
        return st

    def recover(self) -> int:
        """Settle every active hold whose session is gone (crash recovery); returns how many.

        Under the ledger lock, for each active hold: try the release's liveness lock without
        waiting; if it can be taken, no live process owns the hold (its session ended without
        settling, or its process died), so a ``settle`` entry with reason "owner gone" and the
        current time floored to :data:`TIME_GRANULARITY_S` is appended. The crashed release's
        charged events stay charged. :meth:`reserve` runs this first, so callers rarely need to.
        """
        with self.lock:
            st = self._repair_locked(self._read_verified())
            before = len(st.entries)
            return len(self._recover_locked(st).entries) - before

    def session(
        self, *, source_id: str, policy: Policy, release_id: str, started: str
    ) -> ReleaseSession:
        """A release's session (context manager, :class:`ReleaseSession`); see the module
        docstring. ``started`` is the release's start, ISO-8601 UTC at whole seconds (e.g.
        ``"2026-11-23T10:00:00Z"``), captured before any record is read; it stamps every entry
        of the session. Raises :class:`LedgerError` for a malformed ``started`` or release id."""
        self.live_lock_path(release_id)  # validates the id before anything is written
        if not source_id:
            raise LedgerError("source_id must be non-empty")
        return ReleaseSession(self, source_id=source_id, policy=policy, release_id=release_id,
                              started=check_session_time(started))

    def reserve(
        self,
        *,
        source_id: str,
        events: Sequence[Any],
        delta: float,
        policy: Policy,
        release_id: str | None = None,
        stage: str | None = None,
        hold_epsilon: float = 0.0,
        extra_delta: float = 0.0,
        time: str | None = None,
    ) -> Reservation:
        """Charge ``events`` to ``source_id`` if the policy's budget allows; else
        :class:`BudgetExceeded`. Under the lock: verify the ledger (refuse to extend a ledger
        that fails verification), repair a torn tail, compose the new events with every event
        already charged to the source (one accountant, the policy's, at ``total_delta``), add
        active holds of other releases, check ``total_epsilon`` and the per-release cap
        (composed over all reservations with this ``release_id``), then append and fsync the
        reserve entry. Returns only after the entry is durable.

        Before checking, the reserve settles every hold whose owner is gone (:meth:`recover`).
        A hold only lasts while a live :class:`ReleaseSession` of its release holds the
        liveness lock: a ``hold_epsilon`` reserved by a direct call (no session) is settled by
        the next reserve. ``time`` (for sessions: their ``started``) defaults to the current
        time floored to :data:`TIME_GRANULARITY_S`. ``extra_delta`` is delta the caller spends
        outside ``events`` (partition selection); it comes off ``total_delta`` and adds its
        slack via :func:`dpsummary.accounting.composed_epsilon`.
        """
        if not source_id:
            raise LedgerError("source_id must be non-empty")
        if not (0 < delta < 1):
            raise LedgerError("delta must lie in (0, 1)")
        if delta > policy.total_delta:
            raise BudgetExceeded(f"delta {delta:.3g} exceeds the policy's total_delta {policy.total_delta:.3g}")
        if hold_epsilon < 0:
            raise LedgerError("hold_epsilon must be >= 0")
        if not (0 <= extra_delta < 1):
            raise LedgerError("extra_delta must lie in [0, 1)")
        events = list(events)
        events_json = acc.events_to_json(events)  # validates: only accountable events
        accountant = policy.accountant
        rid = release_id or secrets.token_hex(8)
        with self.lock:
            st = self._recover_locked(self._repair_locked(self._read_verified()))
            charged = _charged_events(st.entries, source_id)
            extras = [*_charged_extra_deltas(st.entries, source_id), float(extra_delta)]
            total_delta = policy.total_delta - sum(extras)
            if total_delta <= 0:
                raise BudgetExceeded(f"delta budget of source {source_id!r} exhausted (total_delta {policy.total_delta:.3g})")
            if accountant != "rdp" and acc.rdp_only([*charged, *events]):
                # Objective perturbation's events (this reserve's or charged before) compose
                # under RDP only; a public fact of the policy and the ledger, checked before charging.
                raise LedgerError(f"source {source_id!r} would hold objective-perturbation events, which only the rdp "
                                  f"accountant composes, but the policy's accountant is {accountant}: set accountant: "
                                  "rdp in the policy")
            composed = acc.composed_epsilon([*charged, *events], delta=total_delta, extra_deltas=extras,
                                            accountant=accountant)
            holds = _active_holds(st.entries, source_id)
            holds.pop(rid, None)
            other_holds = sum(holds.values())
            need = composed
            if hold_epsilon > 0:
                need = max(need, acc.composed_epsilon(charged, delta=total_delta, extra_deltas=extras,
                                                      accountant=accountant) + hold_epsilon)
            need += other_holds
            if need > policy.total_epsilon:
                # What is left, for the message: composed from what is already charged (public).
                spent_now = acc.composed_epsilon(charged, delta=total_delta, extra_deltas=extras[:-1],
                                                 accountant=accountant) if charged else 0.0
                left = max(policy.total_epsilon - spent_now - other_holds, 0.0)
                raise BudgetExceeded(
                    f"privacy budget of source {source_id!r} exhausted: epsilon would reach "
                    f"{need:.4g} > total {policy.total_epsilon:g} ({accountant}, delta {total_delta:.3g}); "
                    f"{left:.4g} of {policy.total_epsilon:g} is left under {accountant}: pass a smaller --epsilon "
                    "(about that much fits; composition is sub-additive) or release nothing more from this "
                    "source (`dpsummary audit LEDGER --key PUB` shows its spending)"
                )
            release_events = [
                *(
                    ev
                    for e in st.entries
                    if e["kind"] == "reserve" and e["release_id"] == rid and e["source_id"] == source_id
                    for ev in acc.events_from_json(e["events"])
                ),
                *events,
            ]
            per_release = acc.epsilon(release_events, delta, accountant)
            if per_release > policy.max_epsilon_per_release * (1 + 1e-12):
                raise BudgetExceeded(
                    f"release epsilon {per_release:.4g} exceeds the per-release cap "
                    f"{policy.max_epsilon_per_release:g} ({accountant})"
                )
            entry = self._new_entry(
                st,
                time=time,
                kind="reserve",
                release_id=rid,
                stage=stage,
                source_id=source_id,
                events=events_json,
                delta=float(delta),
                accountant=accountant,
                epsilon={accountant: acc.epsilon(events, delta, accountant)},
                hold_epsilon=float(hold_epsilon),
                extra_delta=float(extra_delta),
            )
            self._write_line(entry)
        return Reservation(self, entry, time=time)


class ReleaseSession:
    """One release's use of the ledger; see :meth:`Ledger.session` and the module docstring.

    Contract: ``with ledger.session(...) as s:`` takes the release's liveness lock (a second
    live session of the same ``release_id`` is refused with :class:`LedgerError`); inside,
    :meth:`reserve` charges stages. Every entry the session writes (reserve, commit, abort,
    settle) carries ``started``, never the current time, so the ledger shows no duration of a
    stage that read records. On exit, normal or by exception: every reservation not yet
    finished is aborted (reason: the exception's type name, or "not finished"), then the
    release's active hold, if any, is settled; each step is attempted even if an earlier one
    raised, errors of these steps are swallowed (a hold left by a failed settle is recovered as
    "owner gone" once the liveness lock is released) and the original exception propagates.
    Exit never raises of its own."""

    def __init__(self, ledger: Ledger, *, source_id: str, policy: Policy, release_id: str, started: str) -> None:
        self.ledger = ledger
        self.source_id = source_id
        self.policy = policy
        self.release_id = release_id
        self.started = started
        self.reservations: list[Reservation] = []
        self._live: FileLock | None = None

    def __enter__(self) -> ReleaseSession:
        path = self.ledger.live_lock_path(self.release_id)
        path.parent.mkdir(parents=True, exist_ok=True)
        self._live = FileLock(str(path), timeout=0)
        try:
            self._live.acquire(timeout=0)
        except Timeout:
            raise LedgerError(f"release {self.release_id} already has a live session") from None
        return self

    def reserve(self, *, events: Sequence[Any], delta: float, stage: str, hold_epsilon: float = 0.0,
                extra_delta: float = 0.0) -> Reservation:
        """:meth:`Ledger.reserve` for this release (same checks, same exceptions), stamped with
        the session's ``started`` time and tracked so that exit aborts it if unfinished. Only
        inside ``with``: the liveness lock is what keeps a hold from being recovered."""
        if self._live is None or not self._live.is_locked:
            raise LedgerError("reserve on a release session outside its with block")
        r = self.ledger.reserve(source_id=self.source_id, events=events, delta=delta, policy=self.policy,
                                release_id=self.release_id, stage=stage,
                                hold_epsilon=hold_epsilon, extra_delta=extra_delta, time=self.started)
        self.reservations.append(r)
        return r

    def __exit__(self, exc_type: Any, exc: Any, tb: Any) -> None:
        reason = exc_type.__name__ if exc_type is not None else "not finished"
        try:
            for r in self.reservations:
                if not r.finished:
                    with contextlib.suppress(Exception):
                        r.abort(reason=reason)
            with contextlib.suppress(Exception):
                self.ledger.settle(source_id=self.source_id, release_id=self.release_id,
                                   reason="release ended" if exc_type is None else f"release ended: {reason}",
                                   time=self.started)
        finally:
            if self._live is not None:
                with contextlib.suppress(Exception):
                    self._live.release()
                with contextlib.suppress(OSError):
                    self.ledger.live_lock_path(self.release_id).unlink()


def _spent(
    entries: Sequence[dict[str, Any]],
    source_id: str,
    delta: float | None,
    accountants: Sequence[acc.Accountant] = acc.ACCOUNTANTS,
) -> Spent:
    mine = [e for e in entries if e["kind"] == "reserve" and e["source_id"] == source_id]
    if delta is None:
        delta = max((float(e["delta"]) for e in mine), default=1e-6)
    extras = _charged_extra_deltas(entries, source_id)
    delta = max(delta - sum(extras), 1e-300)
    charged = _charged_events(entries, source_id)
    # Objective perturbation's events compose under RDP only: the other accountants are left out.
    composed: dict[str, float] = {
        a: acc.composed_epsilon(charged, delta=delta, extra_deltas=extras, accountant=a)
        for a in acc.composable(charged, accountants)
    }
    naive = sum(
        acc.epsilon(acc.events_from_json(e["events"]), float(e["delta"]), _accountant(e))
        for e in mine
    )
    return Spent(
        source_id=source_id,
        delta=delta,
        composed=composed,
        naive_sum=naive,
        reservations=len(mine),
        active_holds=sum(_active_holds(entries, source_id).values()),
        release_ids=sorted({e["release_id"] for e in mine}),
    )


def spent_in_entries(
    entries: Sequence[dict[str, Any]],
    source_id: str,
    delta: float | None = None,
    accountants: Sequence[acc.Accountant] = acc.ACCOUNTANTS,
) -> Spent:
    """:meth:`Ledger.spent`'s computation on given entries (already read and verified, e.g. by
    :func:`read_ledger`), so a caller can compare the ledger with and without one release's
    entries. Public ledger content only; the same charging rule."""
    return _spent(entries, source_id, delta, accountants)


def _accountant(e: dict[str, Any]) -> acc.Accountant:
    a = e["accountant"]
    if a not in acc.ACCOUNTANTS:
        raise LedgerError(f"entry {e['seq']}: unknown accountant {a!r}")
    return a


def _dpsummary_version() -> str:
    from . import __version__

    return __version__
