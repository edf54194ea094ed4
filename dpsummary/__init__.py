"""dpsummary: differentially private Bayesian pseudocoresets with signed releases and a ledger.

Heavy libraries (torch, opacus, opendp) are imported lazily so ``dpsummary --help`` is fast.
"""

from __future__ import annotations

from typing import Any

__version__ = "0.1.0"


def load(path: str, key: str | None = None, **kwargs: Any) -> Any:
    """Load and verify a released artifact (see :func:`dpsummary.analyst.load`)."""
    from .analyst import load as _load

    return _load(path, key=key, **kwargs)
