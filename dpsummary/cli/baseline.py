"""``dpsummary baseline``: a non-private summary and its metrics against the full-data posterior."""

from __future__ import annotations

import json
from pathlib import Path
from typing import Annotated

import typer

from .application import app
from .common import MODELS_HELP, UserError, check_model, configure_torch, guarded

METHODS = ("psvi", "sparsevi", "giga", "giga-realistic", "uniform", "lightweight")
#: Black-box coreset methods (dpsummary.blackbox.REGISTRY; --model bnn or any model).
BLACKBOX_METHODS = ("bb-psvi", "bb-sparsevi", "bb-sparsevi-incremental", "bb-sparsevi-pruning")


@app.command()
@guarded
def baseline(
    data: Annotated[Path, typer.Argument(help="CSV file with a header row.")],
    method: Annotated[str, typer.Option(help=f"One of: {', '.join(METHODS)}; black-box (e.g. --model bnn): {', '.join(BLACKBOX_METHODS)}.")] = "psvi",
    size: Annotated[int, typer.Option("--size", "-M", help="Coreset size M.")] = 50,
    model: Annotated[str | None, typer.Option(help=f"Model: {MODELS_HELP} (default: from the target's type).")] = None,
    target: Annotated[str | None, typer.Option(help="Target column (default: the last column).")] = None,
    no_target: Annotated[bool, typer.Option("--no-target", help="No target: Gaussian mean model.")] = False,
    out: Annotated[Path | None, typer.Option(help="Where to write the summary (JSON).")] = None,
    seed: Annotated[int, typer.Option(help="Seed for all randomness (non-private baseline).")] = 0,
    test_fraction: Annotated[float, typer.Option(help="Held-out fraction for predictive metrics.")] = 0.1,
    steps: Annotated[int | None, typer.Option(help="Optimisation steps (PSVI).")] = None,
    json_output: Annotated[bool, typer.Option("--json", help="Print metrics as JSON.")] = False,
    components: Annotated[int | None, typer.Option(help="Mixtures (--model gmm|dpgmm): K, or truncation T (default 10).")] = None,
) -> None:
    """Build a NON-PRIVATE coreset (utility baseline) and print its metrics.

    The baseline reads the data freely (transform fitted from the data): never publish its output.
    """
    check_model(model)
    configure_torch()
    if model in ("gmm", "dpgmm"):  # mixtures: implementation in dpsummary/mixtures/cli.py
        from ..mixtures.cli import mixture_baseline

        mixture_baseline(data, model=model, method=method, size=size, components=components, seed=seed,
                         test_fraction=test_fraction, json_output=json_output, out=out)
        return
    if method.startswith("bb-") or model == "bnn":  # black-box coresets: dpsummary/blackbox/cli.py
        from ..blackbox.cli import blackbox_baseline

        blackbox_baseline(data, model=model, method=method, size=size, seed=seed, steps=steps, target=target,
                          test_fraction=test_fraction, json_output=json_output, out=out)
        return
    if method not in METHODS:
        raise UserError(f"unknown method {method!r}; choose one of {', '.join(METHODS + BLACKBOX_METHODS)}")
    if size < 1:
        raise UserError("--size must be at least 1")
    if not 0.0 <= test_fraction < 1.0:
        raise UserError("--test-fraction must lie in [0, 1)")

    from ..experiment import prepare_public_dataset, run_constructor

    prepared = prepare_public_dataset(data, target=None if no_target else target, no_target=no_target, model=model,
                                      test_fraction=test_fraction, seed=seed)
    from rich.progress import Progress

    with Progress(transient=True) as bar:
        task = bar.add_task(f"{method} M={size}", total=None)

        def progress(done: int, total: int) -> None:
            bar.update(task, completed=done, total=total)

        result = run_constructor(prepared, method, size, seed=seed, steps=steps, progress=progress)
    if out is not None:
        result.summary.save(out)
    payload = {"method": method, "size": size, "model": prepared.model.name, "metrics": result.metrics,
               "seconds": result.seconds, "out": str(out) if out else None}
    if json_output:
        typer.echo(json.dumps(payload, indent=2))
        return
    typer.echo(f"{method} coreset of size {size} for {prepared.model.name} regression on {data.name}"
               if prepared.model.has_target else f"{method} coreset of size {size} ({prepared.model.name}) on {data.name}")
    for k, v in result.metrics.items():
        typer.echo(f"  {k:<20} {v:.6g}")
    typer.echo(f"  {'seconds':<20} {result.seconds:.3g}")
    if out is not None:
        typer.echo(f"summary written to {out}")
