"""``dpsummary report``: the curator's (private, unpublishable) utility report of a release."""

from __future__ import annotations

from pathlib import Path
from typing import Annotated

import typer

from .application import app
from .common import KEY_DEFAULT, configure_torch, guarded


@app.command()
@guarded
def report(
    artifact: Annotated[Path, typer.Argument(help="A release artifact (.dpsummary.json).")],
    data: Annotated[Path, typer.Argument(help="The PRIVATE CSV the release was built from.")],
    out: Annotated[Path | None, typer.Option(help="HTML file to write (default: ARTIFACT with .report.html).")] = None,
    key: Annotated[Path | None, typer.Option(help=f"The curator's PUBLIC key (.pub) to verify with ({KEY_DEFAULT}).")] = None,
    allow_unsigned: Annotated[bool, typer.Option("--allow-unsigned", help="Report on an artifact whose signature is missing or cannot be checked (marked NOT VERIFIED).")] = False,
    seed: Annotated[int, typer.Option(help="Seed for the non-private baselines and Monte Carlo scores.")] = 0,
) -> None:
    """CURATOR ONLY: compare a release with the full-data posterior and non-private baselines.

    Reads the private data; the HTML report is NOT differentially private and must not be published.
    """
    configure_torch()
    from rich.console import Console

    from .. import keys
    from ..report import WARNING, build_report, write_report

    err = Console(stderr=True)
    err.print(f"[bold white on red] WARNING [/] [bold red]{WARNING}[/]")
    public = keys.load_public_key(key) if key is not None else None
    target = out or artifact.with_name(artifact.name.removesuffix(".json").removesuffix(".dpsummary") + ".report.html")
    with err.status("computing the full-data posterior and the baselines"):
        rep = build_report(artifact, data, public_key=public, allow_unsigned=allow_unsigned, seed=seed)
    path = write_report(rep, target)
    typer.echo(f"wrote {path} ({rep.records_used} records used, {rep.records_dropped} dropped)")
    err.print(f"[bold red]Reminder: {path} is curator-only. Do not publish it.[/]")
