"""Modules by concept (issue 49): no module of dpsummary/ over 1,000 lines, the pieces of
dpsummary/noise_aware/ at most 600 each, and the package re-exports every public name of its
pieces, so ``from dpsummary.noise_aware import X`` works for whatever piece X lives in."""

from __future__ import annotations

import importlib
from pathlib import Path

PACKAGE_DIR = Path(__file__).resolve().parents[1] / "dpsummary"
MODULE_LIMIT = 1000
NOISE_AWARE_LIMIT = 600


def _lines(path: Path) -> int:
    return len(path.read_text(encoding="utf-8").splitlines())


def test_no_module_over_a_thousand_lines() -> None:
    big = sorted((str(p.relative_to(PACKAGE_DIR.parent)), n) for p in PACKAGE_DIR.rglob("*.py")
                 if (n := _lines(p)) > MODULE_LIMIT)
    assert not big, f"modules over {MODULE_LIMIT} lines (split them by concept): {big}"


def test_noise_aware_pieces_are_small() -> None:
    pieces = sorted((PACKAGE_DIR / "noise_aware").glob("*.py"))
    assert len(pieces) > 1, "dpsummary/noise_aware/ is no longer a package of pieces: update this test"
    big = [(p.name, n) for p in pieces if (n := _lines(p)) > NOISE_AWARE_LIMIT]
    assert not big, f"noise_aware pieces over {NOISE_AWARE_LIMIT} lines: {big}"


def test_noise_aware_re_exports_every_public_name_of_its_pieces() -> None:
    package = importlib.import_module("dpsummary.noise_aware")
    missing = []
    for piece in sorted((PACKAGE_DIR / "noise_aware").glob("*.py")):
        if piece.stem == "__init__":
            continue
        module = importlib.import_module(f"dpsummary.noise_aware.{piece.stem}")
        for name, value in vars(module).items():
            if name.startswith("_") or getattr(value, "__module__", module.__name__) != module.__name__:
                continue
            if isinstance(value, type(module)):
                continue
            if getattr(package, name, None) is not value:
                missing.append(f"{piece.stem}.{name}")
    assert not missing, f"not re-exported by dpsummary/noise_aware/__init__.py: {missing}"
