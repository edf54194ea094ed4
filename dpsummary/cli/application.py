"""The one Typer application of the ``dpsummary`` command line. Every command module registers
its commands on :data:`app` (a module of its own, so that the command modules and
``dpsummary.cli`` do not import each other)."""

from __future__ import annotations

from typing import Annotated

import typer

from .formatting import App

app = App(
    name="dpsummary",
    help="Differentially private Bayesian pseudocoresets.\n\n"
         "Curator: policy init, release, inspect, report. Analyst: verify, inspect, export. "
         "Auditor: audit, selftest. Non-private utility: baseline.",
    no_args_is_help=True,
    add_completion=False,
    pretty_exceptions_enable=False,
)


def _version(value: bool) -> None:
    if value:
        from .. import __version__

        typer.echo(f"dpsummary {__version__}")
        raise typer.Exit(0)


@app.callback()
def main_options(
    version: Annotated[bool, typer.Option("--version", callback=_version, is_eager=True,
                                          help="Print the version and exit.")] = False,
) -> None:
    """Differentially private Bayesian pseudocoresets: private releases, baselines, ledger and audit."""


__all__ = ["app"]
