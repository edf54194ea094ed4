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
"""

from __future__ import annotations

from pathlib import Path

import pytest
from release_support import ledger_lines, write_csv, write_policy

from dpsummary.release import ReleaseRequest, run_release

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


def _run(data: Path, policy: Path, out: Path, ledger: Path) -> tuple[list[str], object]:
    seen: list[str] = []
    req = ReleaseRequest(data=data, epsilon=1.5, policy=policy, out=out, seed=7, steps=5, size=3,
                         ledger=ledger)
    result = run_release(req, checkpoint=seen.append)
    return seen, result


def _with_poison(base: Path, dest: Path, poison: bytes) -> Path:
    dest.write_bytes(base.read_bytes() + poison + b"\n")
    return dest


@pytest.mark.parametrize("public", [True, False], ids=["public-schema", "zero-config"])
def test_each_poisoned_neighbour_releases_like_the_base(tmp_path: Path, public: bool) -> None:
    n = 600 if public else 3000
    base = write_csv(tmp_path / "base.csv", n, seed=1)
    policy = write_policy(tmp_path / "p.toml", n=n if public else None, schema=public, total_epsilon=100.0, total_delta=1e-3,
                          cap=2.0)
    ledger = tmp_path / "ledger.jsonl"
    path0, res0 = _run(base, policy, tmp_path / "base.json", ledger)
    claim0 = _claim(tmp_path / "base.json")
    stages0 = _stages(ledger)
    for name, poison in POISON.items():
        data = _with_poison(base, tmp_path / f"{name}.csv", poison)
        before = len(ledger_lines_at(ledger))
        path1, res1 = _run(data, policy, tmp_path / f"{name}.json", ledger)
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
