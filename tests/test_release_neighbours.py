"""No single record decides whether a release happens (issue 13).

For a data set D and each neighbour D + {one poisoned record}, the release runs with identical
non-private randomness (``--seed``) and must take the same path: both release, through the same
stage boundaries, with the same ledger stages and, when the count and schema are public, the same
accounted events and noise multipliers (public outputs). Only DP outputs (noisy counts, the
pseudopoints) may differ.

The zero-configuration variant estimates the schema privately: there a poisoned record changes the
noisy histograms by at most its sensitivity, and the table is large enough (3,000 rows at epsilon
1.5) that every category and the target are selected far above the threshold, so the path is the
same except with probability below 1e-9.

Issue 24 adds the neighbours that break a CSV reader which lets a quoted field run across lines
(an unclosed quote after the header, in the middle and on the last line, a line of only a quote,
a quoted field holding a newline) or splits a line at a bare CR. A CSV record is one physical
line, so each neighbour adds one line (the quoted newline: two, each ragged) and the exact
number of records read, captured from the reader itself, differs from the base's by at most one.
"""

from __future__ import annotations

from pathlib import Path

import pytest
from release_support import ledger_lines, write_csv, write_policy

from dpsummary.data import BatchStream
from dpsummary.plan import ReleaseRequest
from dpsummary.release import run_release

#: One poisoned record per kind the issue lists (bytes, appended as one line of the CSV).
POISON: dict[str, bytes] = {
    "nan-name": b"3.0,Nan,yes",
    "inf-numeric": b"inf,a,no",
    "minus-infinity": b"-Infinity,b,yes",
    "nan-numeric": b"NaN,c,no",
    "ragged-short": b"3.0,a",
    "ragged-long": b"3.0,a,yes,extra",
    "non-numeric": b"abc,a,yes",
    "missing-target": b"3.0,a,",
    "unseen-target": b"3.0,a,maybe",
    "unseen-category": b"3.0,zzz,yes",
    "nbsp-category": "3.0,b\u00a0,yes".encode(),
    "invalid-utf8": b"3.0,\xff\xfe,yes",
}

#: Issue 24: (lines inserted, where: "header" = right after the header, "middle", "last" = the
#: last line, without a final newline). A quoted newline is two physical lines.
LINE_POISON: dict[str, tuple[bytes, str]] = {
    "unclosed-quote-after-header": (b'3.0,"a,yes', "header"),
    "unclosed-quote-middle": (b'3.0,"a,yes', "middle"),
    "unclosed-quote-last": (b'3.0,a,"yes', "last"),
    "unclosed-quote-in-kept-width": (b'"3.0,a,yes', "middle"),
    "bare-cr-splitting": (b"3.0,a,yes\r4.0,b,no", "middle"),
    "bare-cr-in-field": (b"3.0,a\r,yes", "middle"),
    "lone-quote": (b'"', "middle"),
    "quoted-newline": (b'3.0,"a\nb",yes', "middle"),
}


def _run(data: Path, policy: Path, out: Path, ledger: Path) -> tuple[list[str], object]:
    seen: list[str] = []
    req = ReleaseRequest(data=data, epsilon=1.5, policy=policy, out=out, seed=7, steps=5, size=3,
                         ledger=ledger)
    result = run_release(req, checkpoint=seen.append)
    return seen, result


def _with_poison(base: Path, dest: Path, poison: bytes, where: str = "end") -> Path:
    """``base`` with ``poison`` inserted as its own line(s): appended (``end``), right after the
    header, before the middle line, or as the last line without a final newline."""
    if where == "end":
        dest.write_bytes(base.read_bytes() + poison + b"\n")
        return dest
    lines = base.read_bytes().split(b"\n")[:-1]  # write_csv ends the file with a newline
    at = {"header": 1, "middle": len(lines) // 2}
    if where == "last":
        dest.write_bytes(b"\n".join(lines) + b"\n" + poison)
    else:
        dest.write_bytes(b"\n".join(lines[:at[where]] + [poison] + lines[at[where]:]) + b"\n")
    return dest


@pytest.fixture
def reads(monkeypatch: pytest.MonkeyPatch) -> list[tuple[int, int]]:
    """(records read, ragged lines) of every streaming pass the releases make, from the reader."""
    seen: list[tuple[int, int]] = []
    real_iter = BatchStream.__iter__

    def counting(self: BatchStream):  # type: ignore[no-untyped-def]
        rows = 0
        for batch in real_iter(self):
            rows += batch.num_rows
            yield batch
        seen.append((rows, self.ragged_rows))

    monkeypatch.setattr(BatchStream, "__iter__", counting)
    return seen


def _release_reads(reads: list[tuple[int, int]], start: int) -> tuple[int, int]:
    """The one (records, ragged) of a release's passes (every pass of a release reads the same)."""
    mine = set(reads[start:])
    assert len(mine) == 1, mine
    return mine.pop()


@pytest.mark.parametrize("public", [True, False], ids=["public-schema", "zero-config"])
def test_each_poisoned_neighbour_releases_like_the_base(tmp_path: Path, public: bool,
                                                        reads: list[tuple[int, int]]) -> None:
    n = 600 if public else 3000
    base = write_csv(tmp_path / "base.csv", n, seed=1)
    policy = write_policy(tmp_path / "p.toml", n=n if public else None, schema=public, total_epsilon=100.0, total_delta=1e-3,
                          cap=2.0)
    ledger = tmp_path / "ledger.jsonl"
    path0, res0 = _run(base, policy, tmp_path / "base.json", ledger)
    rows0, ragged0 = _release_reads(reads, 0)
    assert (rows0, ragged0) == (n, 0)
    claim0 = _claim(tmp_path / "base.json")
    stages0 = _stages(ledger)
    neighbours = {name: (poison, "end") for name, poison in POISON.items()} | LINE_POISON
    for name, (poison, where) in neighbours.items():
        data = _with_poison(base, tmp_path / f"{name}.csv", poison, where)
        before, passes = len(ledger_lines_at(ledger)), len(reads)
        path1, res1 = _run(data, policy, tmp_path / f"{name}.json", ledger)
        rows1, ragged1 = _release_reads(reads, passes)
        lines_added = poison.count(b"\n") + 1
        assert abs(rows1 - rows0) <= 1, name  # the exact record count moves by at most one
        assert abs(rows1 - rows0) + abs(ragged1 - ragged0) <= lines_added, name
        assert path1 == path0, name
        assert _stages(ledger, start=before) == stages0, name
        claim1 = _claim(tmp_path / f"{name}.json")
        assert claim1["mechanism"].keys() == claim0["mechanism"].keys(), name
        if public:
            # Every public output is identical: the events, hence epsilon, sigma and q.
            assert claim1["events"] == claim0["events"], name
            assert claim1["epsilon"] == claim0["epsilon"], name
            assert res1.noise_multiplier == res0.noise_multiplier, name  # type: ignore[attr-defined]
            assert res1.sample_rate == res0.sample_rate, name  # type: ignore[attr-defined]
            # Issue 24: nothing computed from the records is in the ledger: a neighbour's entries
            # equal the base's but for the release id, the chain, the start time and the
            # artifact's digest (which binds the release to its DP output).
            assert _public_entries(ledger, start=before) == _public_entries(ledger), name
    assert all(e["content_id"] is None for e in ledger_lines_at(ledger))


#: Ledger fields that identify a release or its place in the chain, not its data.
_PER_RELEASE = frozenset({"seq", "prev_hash", "ref", "release_id", "time", "artifact_digest", "sig"})


def _public_entries(ledger: Path, start: int = 0) -> list[dict]:
    entries = ledger_lines_at(ledger)[start:]
    first = entries[0]["release_id"]
    return [{k: v for k, v in e.items() if k not in _PER_RELEASE} for e in entries if e["release_id"] == first]


def ledger_lines_at(path: Path) -> list[dict]:
    return ledger_lines(path.parent) if path.name == "ledger.jsonl" else []


def _stages(ledger: Path, start: int = 0) -> list[tuple[str, str]]:
    entries = ledger_lines_at(ledger)[start:]
    first = entries[0]["release_id"]
    return [(e["kind"], e["stage"]) for e in entries if e["release_id"] == first]


def _claim(path: Path) -> dict:
    from dpsummary.artifact import read_artifact

    _body, claim, _env = read_artifact(path, allow_unsigned=True)
    return claim
