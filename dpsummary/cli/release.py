"""``dpsummary release``: the private release (DP-PSVI), signed and entered in the ledger."""

from __future__ import annotations

import json
from pathlib import Path
from typing import Annotated, Any, Literal

import typer

from . import app
from .common import configure_torch, guarded


@app.command()
@guarded
def release(
    data: Annotated[Path, typer.Argument(help="The private CSV or Parquet file (header row required).")],
    epsilon: Annotated[float, typer.Option(help="Privacy budget of this release (required).")],
    delta: Annotated[float | None, typer.Option(help="Override delta (within the policy's rule).")] = None,
    model: Annotated[str | None, typer.Option(help="Model (default: from the target's type).")] = None,
    target: Annotated[str | None, typer.Option(help="Target column (default: the last column).")] = None,
    size: Annotated[int, typer.Option("--size", "-M", help="Number of pseudopoints.")] = 50,
    steps: Annotated[int, typer.Option(help="Optimisation steps T.")] = 500,
    sample_rate: Annotated[float | None, typer.Option(help="Poisson sampling rate q (default 200 / noisy count).")] = None,
    policy: Annotated[Path | None, typer.Option(help="Policy TOML (default: the packaged default policy, whatever the current directory; the release prints which it used).")] = None,
    out: Annotated[Path | None, typer.Option(help="Artifact path (default: DATA.dpsummary.json).")] = None,
    seed: Annotated[int | None, typer.Option(help="Seed for NON-private randomness only; privacy noise always comes from OS entropy.")] = None,
    ledger: Annotated[Path | None, typer.Option(help="Ledger file (default: in the dpsummary home).")] = None,
    key: Annotated[Path | None, typer.Option(help="Private signing key (default: created in the dpsummary home).")] = None,
    calibrate_to: Annotated[Literal["rdp", "prv", "pld"] | None, typer.Option(help="Accountant to calibrate sigma to; must equal the policy's accountant of record (set `accountant` in the policy to change it).")] = None,
    mechanism: Annotated[Literal["noise-aware-newton", "dp-psvi"], typer.Option(help="Stage-2 mechanism: noise-aware-newton (default: noisy score statistics, credible intervals that account for the privacy noise) or dp-psvi (the paper's mechanism, for reproduction; its intervals ignore the noise).")] = "noise-aware-newton",
    engine: Annotated[Literal["local", "spark"], typer.Option(help="Where the records are read and the mechanisms run: local (one machine, CSV or Parquet) or spark (a Parquet file or directory, through Apache Spark; needs the `spark` extra, Java 17 and the schema in the policy).")] = "local",
    spark_master: Annotated[str, typer.Option(help="Spark master URL for --engine spark (default local[2]; e.g. spark://host:7077, yarn, k8s://...).")] = "local[2]",
    spark_conf: Annotated[list[str] | None, typer.Option(help="Extra Spark configuration for --engine spark, key=value (repeatable).")] = None,
    json_output: Annotated[bool, typer.Option("--json", help="Print the result as JSON.")] = False,
) -> None:
    """Release a differentially private pseudocoreset of DATA (default mechanism: noise-aware
    noisy score statistics; --mechanism dp-psvi for the paper's DP-PSVI)."""
    configure_torch()
    from rich.console import Console
    from rich.progress import BarColumn, Progress, TextColumn, TimeElapsedColumn

    from ..release import ReleaseRequest, run_release

    err = Console(stderr=True)
    req = ReleaseRequest(
        data=data, epsilon=epsilon, delta=delta, model=model, target=target, size=size, steps=steps,
        sample_rate=sample_rate, policy=policy, out=out, seed=seed, ledger=ledger, key=key,
        calibrate_to=calibrate_to, mechanism=mechanism, **_engine_options(engine, spark_master, spark_conf),
    )
    label = "DP-PSVI" if mechanism == "dp-psvi" else "noise-aware"
    with Progress(TextColumn(label), BarColumn(), TextColumn("{task.completed}/{task.total}"),
                  TimeElapsedColumn(), console=err, transient=True, disable=json_output) as bar:
        task = bar.add_task("optimise", total=steps)

        def progress(done: int, total: int) -> None:
            bar.update(task, completed=done, total=total)

        result = run_release(req, progress=progress, notice=lambda m: err.print(f"note: {m}"))
    if json_output:
        typer.echo(json.dumps(result.as_dict(), indent=2))
        return
    _print_table(result)


def _engine_options(engine: str, master: str, conf: list[str] | None) -> dict[str, Any]:
    """The request's engine fields; a malformed --spark-conf is a public, one-line error."""
    from ..private.spark_engine import SparkEngineError, SparkOptions, parse_spark_conf

    if engine == "local":
        if conf or master != "local[2]":
            raise SparkEngineError("--spark-master and --spark-conf need --engine spark")
        return {}
    return {"engine": "spark", "spark": SparkOptions(master=master, conf=parse_spark_conf(conf))}


def _print_table(r: Any) -> None:
    from rich.console import Console
    from rich.table import Table

    t = Table(title="dpsummary release", show_header=False)
    t.add_column("what")
    t.add_column("value")
    t.add_row("epsilon (RDP)", f"{r.epsilons['rdp']:.4f}")
    t.add_row("epsilon (PRV)", f"{r.epsilons['prv']:.4f}")
    t.add_row("epsilon (PLD)", f"{r.epsilons['pld']:.4f}")
    t.add_row("delta", f"{r.delta:.3g}")
    t.add_row("noise multiplier sigma", f"{r.noise_multiplier:.4f}")
    t.add_row("mechanism", r.mechanism)
    if r.mechanism == "dp-psvi":
        t.add_row("sample rate q (Poisson)", f"{r.sample_rate:.6g}")
        t.add_row("steps T", str(r.steps))
    t.add_row("pseudopoints M", str(r.size))
    split = ", ".join(f"{k} {v:.4f}" for k, v in r.budget_split.items())
    t.add_row("budget split (epsilon of each part alone; composed, they give the epsilon above)", split)
    t.add_row(f"source '{r.source_id}' spent (composed)", ", ".join(f"{k} {v:.4f}" for k, v in r.composed_total.items()))
    t.add_row(f"source '{r.source_id}' spent (naive sum)", f"{r.naive_total:.4f}")
    t.add_row("policy", r.policy)
    t.add_row("artifact", str(r.out))
    t.add_row("artifact sha256", r.artifact_digest)
    t.add_row("ledger", str(r.ledger))
    Console().print(t)
    for note in r.notes:
        Console().print(f"note: {note}")
