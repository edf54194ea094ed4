"""The README and docs/ as a newcomer meets them (issue 49): short, linked, nothing dangling."""

from __future__ import annotations

import re
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
PAGES = [ROOT / "README.md", ROOT / "BENCHMARKS.md", ROOT / "SECURITY.md", ROOT / "benchmarks" / "notebook" / "README.md",
         *sorted((ROOT / "docs").glob("*.md"))]
LINK = re.compile(r"\]\(([^)#\s]+)(?:#[^)]*)?\)")
#: Repository paths written in backticks that must exist (generated outputs and examples excluded).
PATH = re.compile(r"`((?:docs|benchmarks/results|benchmarks/notebook)/[\w./-]+\.md)`")


def test_readme_first_screen_then_set_up() -> None:
    lines = (ROOT / "README.md").read_text().splitlines()
    assert len(lines) <= 250
    setup = next(i for i, line in enumerate(lines) if line.startswith("## Set-up"))
    assert setup <= 40, f"the set-up section starts at line {setup + 1}"
    first = "\n".join(lines[:setup])
    assert "dpsummary release --epsilon 0.2 data.csv" in first
    assert first.index("<!-- headline:start -->") < first.index("<!-- headline:end -->")
    assert "(docs/CALIBRATION.md)" in first and "(docs/ARCHITECTURE.md)" in "\n".join(lines)
    setup_text = "\n".join(lines[setup:setup + 20])
    assert "pip install -e . && .venv/bin/dpsummary release --epsilon 0.2 examples/adult.csv" in setup_text
    assert "bash .ci/run" in setup_text


def test_architecture_page_is_short() -> None:
    assert len((ROOT / "docs" / "ARCHITECTURE.md").read_text().splitlines()) <= 150


def test_no_prototypes_folder_beside_the_harness() -> None:
    assert not (ROOT / "benchmarks" / "prototypes").exists()


def test_every_link_and_named_page_exists() -> None:
    missing = []
    for page in PAGES:
        text = page.read_text()
        for target in LINK.findall(text):
            if "://" in target or target.startswith("mailto:"):
                continue
            if not (page.parent / target).exists():
                missing.append(f"{page.relative_to(ROOT)}: ({target})")
        for target in PATH.findall(text):
            if not (ROOT / target).exists():
                missing.append(f"{page.relative_to(ROOT)}: `{target}`")
    assert not missing, "\n".join(missing)
