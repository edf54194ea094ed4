"""The ``dpsummary`` command line. Each command lives in its own module and imports heavy
libraries inside the command body, so ``dpsummary --help`` answers in well under a second."""

from __future__ import annotations

import typer

from .common import run_guarded

app = typer.Typer(
    name="dpsummary",
    help="Differentially private Bayesian pseudocoresets: private releases, baselines, ledger and audit.",
    no_args_is_help=True,
    add_completion=False,
    pretty_exceptions_enable=False,
)

from . import baseline as _baseline  # noqa: E402,F401  (registers commands)
from . import export as _export  # noqa: E402,F401
from . import keys as _keys  # noqa: E402,F401
from . import release as _release  # noqa: E402,F401
from . import report as _report  # noqa: E402,F401
from . import selftest as _selftest  # noqa: E402,F401


def main() -> None:
    run_guarded(app)


__all__ = ["app", "main"]
