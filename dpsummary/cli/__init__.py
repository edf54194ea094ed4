"""The ``dpsummary`` command line. Each command lives in its own module and imports heavy
libraries inside the command body, so ``dpsummary --help`` answers in well under a second."""

from __future__ import annotations

from . import baseline as _baseline  # noqa: F401  (registers commands)
from . import export as _export  # noqa: F401
from . import keys as _keys  # noqa: F401
from . import policy as _policy  # noqa: F401
from . import release as _release  # noqa: F401
from . import report as _report  # noqa: F401
from . import selftest as _selftest  # noqa: F401
from .application import app
from .common import run_guarded


def main() -> None:
    run_guarded(app)


__all__ = ["app", "main"]
