"""``dpsummary export``: verify a released artifact and write a sampler adapter for it."""

from __future__ import annotations

from pathlib import Path
from typing import Annotated, Literal

import typer

from .application import app
from .common import KEY_DEFAULT, UserError, guarded


@app.command()
@guarded
def export(
    artifact: Annotated[Path, typer.Argument(help="The released artifact (signed JSON).")],
    to: Annotated[Literal["stan", "pymc", "numpyro", "json"], typer.Option("--to", help="Target sampler: stan, pymc, numpyro or json (sampler-neutral + emcee recipe).")],
    out: Annotated[Path, typer.Option("--out", help="Directory to write the adapter into (created if needed).")],
    key: Annotated[Path | None, typer.Option("--key", help=f"The curator's PUBLIC key (.pub) to verify with ({KEY_DEFAULT}).")] = None,
    allow_unsigned: Annotated[bool, typer.Option("--allow-unsigned", help="Accept an artifact whose signature is missing or cannot be checked.")] = False,
) -> None:
    """Write ARTIFACT's weighted posterior for Stan, PyMC, NumPyro/BlackJAX or any sampler (JSON).

    The signature is verified first. Exporting and sampling cost no privacy.
    """
    if out.exists() and not out.is_dir():
        raise UserError(f"--out must be a directory: {out}")
    import warnings

    from ..analyst import load
    from ..caveats import IntervalCalibrationWarning
    from ..export import UnsupportedExport
    from ..export import export as do_export

    with warnings.catch_warnings():  # said below as one `warning:` line, not as a Python warning
        warnings.simplefilter("ignore", IntervalCalibrationWarning)
        release = load(artifact, key, allow_unsigned=allow_unsigned)
    try:
        files = do_export(release, to, out)
    except UnsupportedExport as exc:
        raise UserError(str(exc)) from None
    if not release.verified:
        typer.echo("warning: the artifact's signature was NOT verified (--allow-unsigned)", err=True)
    if release.interval_calibration is not None:
        from ..caveats import warning_text

        typer.echo(f"warning: {warning_text(release.claim)} (written into every exported file)", err=True)
    typer.echo(f"{to} adapter for {release.model.name} ({release.summary.size} points, "
               f"epsilon {', '.join(f'{k}={v:.4g}' for k, v in release.epsilon.items()) or 'n/a'}):")
    for f in files:
        typer.echo(f"  {f}")
