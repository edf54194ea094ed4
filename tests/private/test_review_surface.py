"""The privacy review surface stated in SECURITY.md ("What a privacy reviewer reads") matches the
code (issue 30): every module of ``dpsummary/private/`` is listed, every listed file exists, and
every stated line count is within :data:`TOLERANCE` of ``wc -l`` today, so the table cannot
silently drift as the package grows. The privacy boundary also may not import the pipeline,
the optimisers or the self-test (it is the bottom layer).

Refresh the counts with ``python tests/private/test_review_surface.py --write`` (without
``--write`` it prints the refreshed section).
"""

from __future__ import annotations

import ast
import re
from pathlib import Path

ROOT = Path(__file__).resolve().parents[2]
PRIVATE = ROOT / "dpsummary" / "private"
SECTION = "## What a privacy reviewer reads"
#: A stated count may be off by this share of itself, or by :data:`SLACK_LINES` for tiny files.
TOLERANCE = 0.10
SLACK_LINES = 5
ROW = re.compile(r"^\| `(dpsummary/[^`]+\.py)` \| ([\d,]+) \| (.+) \|\s*$")
TOTAL = re.compile(r"^\| \*\*(.+?)\*\* \| \*\*([\d,]+)\*\* \|")
#: Packages of dpsummary the privacy boundary must not import (module level or deferred): the
#: pipeline, the mechanisms' public runs and post-processing, the self-test, the CLI.
FORBIDDEN = ("dpsummary.release", "dpsummary.mechanisms", "dpsummary.selftest", "dpsummary.cli",
             "dpsummary.constructors", "dpsummary.blackbox", "dpsummary.bootstrap", "dpsummary.ledger",
             "dpsummary.artifact", "dpsummary.report", "dpsummary.export", "dpsummary.analyst")


def line_count(path: Path) -> int:
    """What ``wc -l`` prints: the number of newline characters."""
    return path.read_bytes().count(b"\n")


def section_lines() -> list[str]:
    text = (ROOT / "SECURITY.md").read_text(encoding="utf-8")
    assert SECTION in text, f"SECURITY.md has no section {SECTION!r}"
    body = text.split(SECTION, 1)[1]
    return body.split("\n## ", 1)[0].splitlines()


def stated_rows() -> dict[str, tuple[int, str]]:
    rows: dict[str, tuple[int, str]] = {}
    for line in section_lines():
        m = ROW.match(line)
        if m:
            assert m.group(1) not in rows, f"{m.group(1)} is listed twice"
            rows[m.group(1)] = (int(m.group(2).replace(",", "")), m.group(3).strip())
    return rows


def stated_totals() -> dict[str, int]:
    return {m.group(1): int(m.group(2).replace(",", "")) for line in section_lines() if (m := TOTAL.match(line))}


def close(stated: int, actual: int) -> bool:
    return abs(actual - stated) <= max(TOLERANCE * stated, SLACK_LINES)


def test_every_private_module_is_listed_and_every_listed_file_exists() -> None:
    rows = stated_rows()
    private = {p.relative_to(ROOT).as_posix() for p in PRIVATE.glob("*.py")}
    listed_private = {f for f in rows if f.startswith("dpsummary/private/")}
    assert private - listed_private == set(), f"not in SECURITY.md's review table: {sorted(private - listed_private)}"
    assert listed_private - private == set(), f"listed but gone: {sorted(listed_private - private)}"
    missing = [f for f in rows if not (ROOT / f).is_file()]
    assert not missing, f"SECURITY.md lists files that do not exist: {missing}"
    assert not [f for f, (_, what) in rows.items() if len(what) < 20], "every row says what the file does"
    # The accountant and the ledger are part of what a reviewer reads.
    assert {"dpsummary/accounting.py", "dpsummary/ledger.py"} <= set(rows)


def test_stated_line_counts_match_the_code() -> None:
    rows = stated_rows()
    drift = {f: (n, line_count(ROOT / f)) for f, (n, _) in rows.items() if not close(n, line_count(ROOT / f))}
    assert not drift, ("SECURITY.md's line counts drifted (stated, actual); rerun "
                       f"`python tests/private/test_review_surface.py --write`: {drift}")


def test_stated_totals_add_up() -> None:
    rows, totals = stated_rows(), stated_totals()
    private = sum(n for f, (n, _) in rows.items() if f.startswith("dpsummary/private/"))
    assert totals.get("dpsummary/private/ total") == private, totals
    assert totals.get("total to read") == sum(n for n, _ in rows.values()), totals
    actual = sum(line_count(p) for p in PRIVATE.glob("*.py"))
    assert close(private, actual), (private, actual)


def _imported(path: Path) -> set[str]:
    """dpsummary modules imported anywhere in ``path`` (relative imports resolved)."""
    package = ["dpsummary", "private"]
    out: set[str] = set()
    for node in ast.walk(ast.parse(path.read_text(encoding="utf-8"))):
        if isinstance(node, ast.Import):
            out |= {a.name for a in node.names}
        elif isinstance(node, ast.ImportFrom):
            base = package[: len(package) - node.level + 1] if node.level else []
            source = ".".join([*base, node.module] if node.module else base)
            out |= {source} | {f"{source}.{a.name}" for a in node.names}
    return {m for m in out if m.startswith("dpsummary")}


def test_the_privacy_boundary_imports_no_pipeline_and_no_post_processing_run() -> None:
    bad = {p.name: sorted(m for m in _imported(p) if m.startswith(FORBIDDEN))
           for p in sorted(PRIVATE.glob("*.py"))}
    bad = {k: v for k, v in bad.items() if v}
    assert not bad, f"dpsummary/private/ imports outside its layer: {bad}"


def test_the_checks_can_fail() -> None:
    """The tolerance is tight enough to catch a file that grew or shrank by a fifth."""
    assert close(100, 110) and close(1, 6)
    assert not close(100, 120) and not close(100, 80) and not close(1, 7)


def refreshed_section() -> tuple[str, str]:
    """(old section, the same section with every listed count and both totals set to today's
    ``wc -l``). New files of ``dpsummary/private/`` are not added: write their row by hand."""
    text = (ROOT / "SECURITY.md").read_text(encoding="utf-8")
    old = SECTION + text.split(SECTION, 1)[1].split("\n## ", 1)[0]
    out, private, other = [], 0, 0
    for line in old.split("\n"):
        row, total = ROW.match(line), TOTAL.match(line)
        if row:
            n = line_count(ROOT / row.group(1))
            private, other = (private + n, other) if row.group(1).startswith("dpsummary/private/") else (private, other + n)
            line = f"| `{row.group(1)}` | {n:,} | {row.group(3).strip()} |"
        elif total:
            n = private if total.group(1) == "dpsummary/private/ total" else private + other
            line = f"| **{total.group(1)}** | **{n:,}** |" + line[total.end():]
        out.append(line)
    return old, "\n".join(out)


if __name__ == "__main__":
    import sys

    old, new = refreshed_section()
    if sys.argv[1:] == ["--write"]:
        path = ROOT / "SECURITY.md"
        tmp = path.with_suffix(".md.tmp")
        tmp.write_text(path.read_text(encoding="utf-8").replace(old, new, 1), encoding="utf-8")
        tmp.replace(path)
    else:
        print(new)
