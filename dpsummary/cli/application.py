"""The one Typer application of the ``dpsummary`` command line. Every command module registers
its commands on :data:`app` (a module of its own, so that the command modules and
``dpsummary.cli`` do not import each other)."""

from __future__ import annotations

from .formatting import App

app = App(
    name="dpsummary",
    help="Differentially private Bayesian pseudocoresets: private releases, baselines, ledger and audit.",
    no_args_is_help=True,
    add_completion=False,
    pretty_exceptions_enable=False,
)

__all__ = ["app"]
