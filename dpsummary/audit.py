"""Ledger audit: verify, recompute every epsilon from the recorded events, compare with policy.

:func:`audit` never trusts a number stored in the ledger. It verifies the chain and the
signatures (:func:`dpsummary.ledger.read_ledger`), recomputes each reserve entry's epsilon
from its dp_accounting events with Opacus RDP and with dp_accounting PLD (an independent
implementation), flags stored epsilons that differ from the recomputation by more than
:data:`EPS_MISMATCH_TOL`, composes all charged events per source (one accountant over all
events, at the policy's ``total_delta`` minus the delta the source's reserves spent outside
their events, plus that delta's epsilon slack: :func:`dpsummary.accounting.composed_epsilon`,
the ledger's and the artifact claim's own computation) and compares with the policy's
``total_epsilon``. Open holds (a release in progress, or a crashed one not yet recovered) are
listed per source as warnings; they do not make the audit fail.

Entries with verification problems (foreign key, bad signature, broken chain, ...) are
reported with their flags and their events are still recomputed per entry (an auditor should
see what a tampered entry claims), but only verified entries enter the per-source composition;
any error-severity problem makes the audit fail (``ok = False``).

Entries written before dpsummary stopped hashing input files (issue 24) carry a ``content_id``
(an HMAC of the input file under ``curator.secret``): they verify as before, are flagged
``legacy-content-id``, and do not make the audit fail. New entries carry ``null``.
"""

from __future__ import annotations

import json
from dataclasses import asdict, dataclass, field
from pathlib import Path
from typing import TYPE_CHECKING, Any

from . import accounting as acc
from . import keys as _keys
from .ledger import GENESIS_HASH, Problem, _line_hash, open_holds, read_ledger

if TYPE_CHECKING:
    from .policy import Policy

EPS_MISMATCH_TOL = 1e-6
#: The ledger decides budgets with the vectorised RDP series; the audit recomputes with Opacus's
#: own loop. The two agree to far below this relative tolerance (tests/test_accounting.py).
RDP_AGREEMENT_TOL = 1e-9

__all__ = ["AuditReport", "EntryRow", "Head", "SourceRow", "audit", "parse_head", "wrong_key_message"]


@dataclass(frozen=True)
class Head:
    """A ledger's head: how many lines it holds and the hash of the last one (``sha256:<hex>`` of
    the line's bytes, the hash the next entry's ``prev_hash`` chains to). Written
    ``<entries>:sha256:<hex>``; an auditor who publishes it can later hold the file against it
    (``--expect-head``): the ledger only grows, so line ``entries`` must still hash to it."""

    entries: int
    last_hash: str

    def __str__(self) -> str:
        return f"{self.entries}:{self.last_hash}"


def parse_head(text: str) -> Head:
    """Parse ``<entries>:sha256:<64 hex>`` (what :class:`Head` prints); ValueError (one line) otherwise."""
    count, _, digest = text.strip().partition(":")
    hexpart = digest.removeprefix("sha256:")
    if not (count.isdigit() and digest.startswith("sha256:") and len(hexpart) == 64
            and all(c in "0123456789abcdef" for c in hexpart)):
        raise ValueError(f"--expect-head {text!r} is not a ledger head; give it as printed by `dpsummary audit` "
                         "(ENTRIES:sha256:HEX)")
    return Head(int(count), digest)


@dataclass
class EntryRow:
    line: int
    seq: int | None
    kind: str
    release_id: str
    source_id: str
    stage: str | None
    delta: float | None
    stored_epsilon: dict[str, float] | None
    epsilon_rdp: float | None
    epsilon_pld: float | None
    verified: bool
    flags: list[str] = field(default_factory=list)


@dataclass
class SourceRow:
    source_id: str
    reservations: int
    delta: float
    composed_rdp: float
    #: None when the source's events include one only the RDP accountant composes (objective
    #: perturbation, :mod:`dpsummary.objective_event`): PLD cannot, and the column says so ("-").
    composed_pld: float | None
    naive_sum_rdp: float
    total_epsilon: float
    within_budget: bool  # under the policy's accountant of record
    accountant: str
    composed_of_record: float
    #: Why the source is composed at ``delta`` (which policy's total_delta, or the ledger's own
    #: recorded deltas when no policy was given and the default's total cannot cover them).
    delta_basis: str = ""


@dataclass
class AuditReport:
    ledger: str
    keyid: str
    ok: bool
    problems: list[Problem]
    entries: list[EntryRow]
    sources: list[SourceRow]
    mismatches: list[str]
    #: Holds still open (``{source_id, release_id, hold_epsilon, since_seq}``): a warning (a
    #: release running now, or one whose process died and was not yet recovered), not a failure.
    open_holds: list[dict[str, Any]] = field(default_factory=list)
    #: The ledger's head as read (:class:`Head`), and the check against ``--expect-head``.
    head: Head = field(default_factory=lambda: Head(0, GENESIS_HASH))
    expected_head: Head | None = None
    head_problem: str | None = None
    #: Which policy the sources were compared with (a path, or the packaged default).
    policy: str = ""

    @property
    def wrong_key(self) -> bool:
        """True when the ledger has lines and every one of them is signed by another key."""
        lines = {e.line for e in self.entries}
        foreign = {p.line for p in self.problems if p.kind == "foreign-key"}
        return bool(lines) and lines <= foreign

    def to_dict(self) -> dict[str, Any]:
        return {
            "ledger": self.ledger,
            "keyid": self.keyid,
            "ok": self.ok,
            "head": {"entries": self.head.entries, "last_hash": self.head.last_hash, "text": str(self.head)},
            "expected_head": None if self.expected_head is None else str(self.expected_head),
            "head_problem": self.head_problem,
            "policy": self.policy,
            "problems": [p.as_dict() for p in self.problems],
            "entries": [asdict(e) for e in self.entries],
            "sources": [asdict(s) for s in self.sources],
            "mismatches": list(self.mismatches),
            "open_holds": list(self.open_holds),
        }

    def to_json(self) -> str:
        return json.dumps(self.to_dict(), indent=2, sort_keys=True)

    def render_text(self) -> str:
        """A plain-text report (the CLI may render its own table from :meth:`to_dict`)."""

        def f(x: float | None) -> str:
            return "-" if x is None else f"{x:.6g}"

        out = [f"ledger {self.ledger} (key {self.keyid}): {'OK' if self.ok else 'PROBLEMS FOUND'}",
               f"head {self.head} ({self.head.entries} entries; hash of the last line) - publish it, and later "
               "pass it as --expect-head to detect lines removed from the end"]
        if self.expected_head is not None:
            out.append(f"expected head {self.expected_head}: "
                       + ("matches (the ledger holds it; later lines may follow)" if self.head_problem is None
                          else f"FAILED: {self.head_problem}"))
        hdr = ("line", "seq", "kind", "release", "source", "stage", "stored eps", "rdp", "pld", "flags")
        rows: list[tuple[str, ...]] = [hdr]
        for e in self.entries:
            stored = (
                ",".join(f"{k}={v:.6g}" for k, v in e.stored_epsilon.items())
                if e.stored_epsilon
                else "-"
            )
            rows.append(
                (
                    str(e.line), "-" if e.seq is None else str(e.seq), e.kind, e.release_id[:12],
                    e.source_id, e.stage or "-", stored, f(e.epsilon_rdp), f(e.epsilon_pld),
                    ";".join(e.flags) or "ok",
                )
            )
        out.append(_table(rows))
        srows: list[tuple[str, ...]] = [("source", "reserves", "delta", "composed rdp", "composed pld", "naive sum rdp", "total", "status")]
        for s in self.sources:
            srows.append(
                (
                    s.source_id, str(s.reservations), f"{s.delta:.3g}" if s.delta > 0 else "none left",
                    f(s.composed_rdp), f(s.composed_pld), f(s.naive_sum_rdp), f"{s.total_epsilon:g}",
                    "within budget" if s.within_budget else
                    (f"OVER BUDGET ({s.accountant})" if s.delta > 0 else "OVER BUDGET (delta)"),
                )
            )
        out.append(_table(srows))
        out.append(f"budgets from {self.policy}")
        out.extend(f"source {s.source_id}: {s.delta_basis}" for s in self.sources if s.delta_basis)
        for p in self.problems:
            out.append(f"{p.severity}: {p.kind}: {p.message}")
        out.extend(f"mismatch: {m}" for m in self.mismatches)
        out.extend(
            f"warning: open hold of release {h['release_id']} on source {h['source_id']!r}: epsilon "
            f"{h['hold_epsilon']:.6g} since seq {h['since_seq']} (a release in progress, or a crashed one: "
            "the next reserve settles it if its owner is gone)"
            for h in self.open_holds
        )
        return "\n".join(out)


def _table(rows: list[tuple[str, ...]]) -> str:
    widths = [max(len(r[i]) for r in rows) for i in range(len(rows[0]))]
    lines = ["  ".join(c.ljust(w) for c, w in zip(r, widths, strict=True)).rstrip() for r in rows]
    lines.insert(1, "  ".join("-" * w for w in widths))
    return "\n".join(lines)


def _raw_lines(path: Path) -> list[bytes]:
    try:
        data = path.read_bytes()
    except FileNotFoundError:
        return []
    nl = data.rfind(b"\n")
    return data[: nl + 1].split(b"\n")[:-1] if nl >= 0 else []


def audit(
    ledger_path: str | Path, public_key: _keys.Ed25519PublicKey, policy: Policy, *,
    policy_given: bool = True, policy_name: str = "", expect_head: Head | None = None,
) -> AuditReport:
    """Audit a ledger against ``policy`` (see module docstring). ``ok`` is True iff the ledger
    verifies with no error-severity problem, no stored epsilon mismatches, every source is
    within the policy's total under its accountant of record, and (when ``expect_head`` is
    given) the ledger still holds that head: at least ``expect_head.entries`` lines, the last of
    them hashing to ``expect_head.last_hash`` (a tail-truncated or rewritten ledger fails).

    ``policy_given=False`` (no ``--policy``; ``policy`` is then the packaged default): the
    ledger records no policy, so a source whose reserves spent more delta than the default's
    ``total_delta`` (a source released under a stricter policy) is composed at the sum of its
    releases' recorded deltas instead (a valid delta for the composition by basic composition
    of the deltas), and its row says so (``delta_basis``), rather than at an exhausted delta."""
    path = Path(ledger_path)
    st = read_ledger(path, public_key)
    raw = _raw_lines(path)
    head = Head(len(raw), _line_hash(raw[-1]) if raw else GENESIS_HASH)
    head_problem: str | None = None
    if expect_head is not None:
        if len(raw) < expect_head.entries:
            head_problem = (f"the ledger holds {len(raw)} lines, fewer than the {expect_head.entries} of the expected "
                            "head: lines were removed from its end")
        elif (_line_hash(raw[expect_head.entries - 1]) if expect_head.entries else GENESIS_HASH) != expect_head.last_hash:
            head_problem = f"line {expect_head.entries} does not hash to the expected head: the ledger was rewritten"
    bad_lines: dict[int, list[str]] = {}
    for p in st.problems:
        bad_lines.setdefault(p.line, []).append(p.kind)
    rows: list[EntryRow] = []
    mismatches: list[str] = []
    verified_events: dict[str, list[Any]] = {}
    counts: dict[str, int] = {}
    naive: dict[str, float] = {}
    deltas: dict[str, float] = {}
    extra_deltas: dict[str, float] = {}
    extra_list: dict[str, list[float]] = {}
    release_deltas: dict[str, dict[str, float]] = {}
    for i, line in enumerate(raw):
        lineno = i + 1
        try:
            e = json.loads(line.decode("utf-8"))
        except (UnicodeDecodeError, ValueError, RecursionError):
            e = None
        flags = list(bad_lines.get(lineno, []))
        if not isinstance(e, dict):
            rows.append(EntryRow(lineno, None, "?", "", "", None, None, None, None, None, False, flags or ["malformed"]))
            continue
        seq = e.get("seq") if isinstance(e.get("seq"), int) else None
        kind = str(e.get("kind", "?"))
        source = str(e.get("source_id", ""))
        delta = e.get("delta") if isinstance(e.get("delta"), float | int) else None
        stored = e.get("epsilon") if isinstance(e.get("epsilon"), dict) else None
        if e.get("content_id") is not None:
            # Written before issue 24: an HMAC of the input file under curator.secret. It verifies
            # (the signature covers it) and changes no charge; the flag tells the curator to
            # destroy the secret, which makes the id useless to anyone (SECURITY.md).
            flags.append("legacy-content-id")
        eps_rdp = eps_pld = None
        events: list[Any] | None = None
        if kind == "reserve":
            try:
                events = acc.events_from_json(e.get("events"))  # type: ignore[arg-type]
                if delta is None or not (0 < delta < 1):
                    raise ValueError("bad delta")
                eps_rdp = acc.epsilon_rdp_opacus(events, float(delta))
                # RDP-only events (objective perturbation) have no PLD: the column shows "-".
                eps_pld = None if acc.rdp_only(events) else acc.epsilon_pld(events, float(delta))
            except ValueError as exc:
                flags.append(f"unaccountable ({exc})")
                events = None
            if stored is not None and events is not None and delta is not None:
                for name, value in stored.items():
                    if name not in acc.ACCOUNTANTS or not isinstance(value, float | int):
                        flags.append("stored-epsilon-malformed")
                        continue
                    recomputed = {"rdp": eps_rdp, "pld": eps_pld}.get(name)
                    if recomputed is None:
                        try:
                            recomputed = acc.epsilon(events, float(delta), name)
                        except acc.UnsupportedEventError:
                            # A stored epsilon under an accountant that cannot compose these events.
                            flags.append("stored-epsilon-malformed")
                            continue
                    if abs(float(value) - recomputed) > EPS_MISMATCH_TOL:
                        flags.append("stored-epsilon-mismatch")
                        mismatches.append(
                            f"line {lineno} (seq {seq}): stored {name} epsilon {float(value):.9g} "
                            f"but events give {recomputed:.9g}"
                        )
        verified = lineno not in bad_lines
        if verified and events is not None:
            verified_events.setdefault(source, []).extend(events)
            counts[source] = counts.get(source, 0) + 1
            naive[source] = naive.get(source, 0.0) + (eps_rdp or 0.0)
            deltas[source] = max(deltas.get(source, 0.0), float(delta or 0.0))
            rid = str(e.get("release_id", ""))
            per_release = release_deltas.setdefault(source, {})
            per_release[rid] = max(per_release.get(rid, 0.0), float(delta or 0.0))
            extra = e.get("extra_delta")
            extra_deltas[source] = extra_deltas.get(source, 0.0) + (float(extra) if isinstance(extra, float | int) else 0.0)
            if isinstance(extra, float | int) and extra > 0:
                extra_list.setdefault(source, []).append(float(extra))
        rows.append(
            EntryRow(
                lineno, seq, kind, str(e.get("release_id", "")), source,
                e.get("stage") if isinstance(e.get("stage"), str) else None,
                float(delta) if delta is not None else None,
                {k: float(v) for k, v in stored.items() if isinstance(v, float | int)} if stored else None,
                eps_rdp, eps_pld, verified, flags,
            )
        )
    sources: list[SourceRow] = []
    wanted = sorted(verified_events)
    if policy.source_id is not None and policy.source_id not in wanted:
        wanted.append(policy.source_id)
    for s in wanted:
        ev = verified_events.get(s, [])
        # Delta spent outside the events (partition selection) comes off the source's total and
        # adds its epsilon slack: the same computation as the ledger's and the claim's.
        extra = extra_deltas.get(s, 0.0)
        d = policy.total_delta - extra
        basis = ""
        recorded = sum(release_deltas.get(s, {}).values())
        if not policy_given and d < recorded:
            d = recorded
            basis = (f"composed at delta {d:.3g}, the sum of its releases' recorded deltas (plus {extra:.3g} spent "
                     f"on partition selection): they exceed the default policy's total_delta "
                     f"{policy.total_delta:.3g}, so it was released under another policy; pass that policy "
                     "with --policy to compare with its budget")
        slack = acc.selection_slack(extra_list.get(s, []))
        pld: float | None
        if d > 0 and acc.rdp_only(ev) and policy.accountant != "rdp":
            # Objective perturbation's events compose under RDP only: a policy whose accountant of
            # record is another cannot have charged them, so the source is reported over budget.
            rdp = acc.epsilon_rdp_opacus(ev, d) + slack
            pld, of_record = None, float("inf")
            basis = basis or (f"holds objective-perturbation events, which only the RDP accountant composes; the "
                              f"policy's accountant of record is {policy.accountant}")
        elif d <= 0:
            # The source's partition selection alone spent the policy's total_delta: no delta is
            # left to compose at, so it is over its delta budget (no epsilon is finite there).
            inf = float("inf")
            rdp = pld = of_record = inf
            basis = basis or (f"over its delta budget: partition selection spent {extra:.3g}, the policy's "
                              f"total_delta is {policy.total_delta:.3g}")
            d = 0.0
        else:
            # The accountant of record goes through acc.composed_epsilon (the ledger's and the
            # claim's computation); the two independent columns (Opacus RDP, dp-accounting PLD) add
            # the same slack to their own recomputation.
            rdp = acc.epsilon_rdp_opacus(ev, d) + slack
            pld = None if acc.rdp_only(ev) else acc.epsilon_pld(ev, d) + slack
            of_record = acc.composed_epsilon(ev, delta=d, extra_deltas=extra_list.get(s, []),
                                             accountant=policy.accountant)
        sources.append(
            SourceRow(
                source_id=s, reservations=counts.get(s, 0), delta=d, composed_rdp=rdp,
                composed_pld=pld, naive_sum_rdp=naive.get(s, 0.0),
                total_epsilon=policy.total_epsilon,
                within_budget=of_record <= policy.total_epsilon * (1 + RDP_AGREEMENT_TOL),
                accountant=policy.accountant, composed_of_record=of_record, delta_basis=basis,
            )
        )
    ok = (not st.errors and not mismatches and all(s.within_budget for s in sources)
          and head_problem is None)
    name = policy_name or ("the packaged default policy (no --policy given)" if not policy_given else "the policy")
    return AuditReport(
        ledger=str(path), keyid=_keys.key_id(public_key), ok=ok, problems=st.problems,
        entries=rows, sources=sources, mismatches=mismatches, open_holds=open_holds(st.entries),
        head=head, expected_head=expect_head, head_problem=head_problem, policy=name,
    )


def wrong_key_message(report: AuditReport) -> str:
    """The one line for a ledger no line of which is signed by the given key."""
    others = sorted({p.message.rsplit("(", 1)[-1].rstrip(")") for p in report.problems if p.kind == "foreign-key"})
    return (f"no entry of {report.ledger} is signed by key {report.keyid} (its entries are signed by "
            f"{', '.join(others[:3])}); pass the public key (.pub) of the curator who wrote this ledger with --key")
