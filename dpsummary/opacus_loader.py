"""Opacus's accountants without ``import opacus`` (:func:`opacus_accountants`).

A module of its own, below :mod:`dpsummary.accounting` (which re-exports both functions), so the
accounting module stays within the project's module-size limit; it imports nothing of dpsummary.
"""

from __future__ import annotations

import threading
from typing import Any

#: Name under which :func:`opacus_accountants` loads Opacus's ``accountants`` package when Opacus
#: itself is not imported (see there).
_OPACUS_MIRROR = "dpsummary._opacus_accountants"
_OPACUS_MIRROR_LOCK = threading.Lock()  # the claim's accountants run on a second thread


class _OpacusAccountantBase:
    """What Opacus's RDP and PRV accountants use of their base class
    ``opacus.accountants.accountant.IAccountant``: ``__init__`` starting an empty ``history``
    (the rest of that class wires accountants to Opacus's DP optimiser, which is why importing
    it imports the optimiser package)."""

    def __init__(self) -> None:
        self.history: list[Any] = []


def opacus_accountants(submodule: str) -> Any:
    """A module of Opacus's ``opacus.accountants`` package (``"prv"``, ``"rdp"``,
    ``"analysis.rdp"``, ...), without ``import opacus``.

    Importing any Opacus module the usual way runs ``opacus/__init__``, which imports the whole
    privacy engine (DP optimisers, grad samplers, ``torch.distributed``): 0.65 s of a release's
    wall time plus about 0.3 s of interpreter shutdown (issue 29's profile), for accountants that
    are pure numpy/scipy. If Opacus is already imported (DP-VI, tests) its own modules are
    returned. Otherwise the files of the installed ``opacus/accountants`` directory are executed
    under the package name :data:`_OPACUS_MIRROR`, whose ``accountant`` module is
    :class:`_OpacusAccountantBase` (the one base-class member the RDP and PRV accountants use);
    every other module, relative import included, is Opacus's own file. Same code, same numbers:
    tests/test_accounting.py checks that both routes agree bit for bit."""
    import importlib
    import sys

    if "opacus.accountants" in sys.modules:
        return importlib.import_module(f"opacus.accountants.{submodule}")
    with _OPACUS_MIRROR_LOCK:
        if _OPACUS_MIRROR not in sys.modules:
            _install_opacus_mirror()
    return importlib.import_module(f"{_OPACUS_MIRROR}.{submodule}")


def _install_opacus_mirror() -> None:
    """Register the :data:`_OPACUS_MIRROR` package (see :func:`opacus_accountants`)."""
    import importlib.machinery
    import importlib.util
    import sys
    import types
    from pathlib import Path

    package = importlib.util.find_spec("opacus")
    if package is None or not package.submodule_search_locations:
        raise ImportError("opacus is not installed")
    location = str(Path(next(iter(package.submodule_search_locations))) / "accountants")
    mirror = types.ModuleType(_OPACUS_MIRROR, "opacus/accountants loaded without opacus/__init__")
    mirror.__spec__ = importlib.machinery.ModuleSpec(_OPACUS_MIRROR, None, is_package=True)
    mirror.__spec__.submodule_search_locations = [location]
    mirror.__path__ = [location]
    mirror.__package__ = _OPACUS_MIRROR
    base = types.ModuleType(f"{_OPACUS_MIRROR}.accountant")
    base.IAccountant = _OpacusAccountantBase  # type: ignore[attr-defined]
    sys.modules[f"{_OPACUS_MIRROR}.accountant"] = base
    sys.modules[_OPACUS_MIRROR] = mirror


def opacus_rdp_analysis() -> Any:
    """Opacus's RDP analysis module (``opacus.accountants.analysis.rdp``), without ``import opacus``
    (:func:`opacus_accountants`): pure numpy/scipy, four functions; the accountant of record is
    unchanged (tests/test_accounting.py checks both routes agree bit for bit)."""
    return opacus_accountants("analysis.rdp")
