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
    steps: Annotated[int | None, typer.Option(help="Optimisation steps T (default 500; 100 for --model bnn).")] = None,
    sample_rate: Annotated[float | None, typer.Option(help="Poisson sampling rate q (default 200 / noisy count).")] = None,
    policy: Annotated[Path | None, typer.Option(help="Policy TOML (default: the packaged default policy, whatever the current directory; the release prints which it used).")] = None,
    out: Annotated[Path | None, typer.Option(help="Artifact path (default: DATA.dpsummary.json).")] = None,
    seed: Annotated[int | None, typer.Option(help="Seed for NON-private randomness only; privacy noise always comes from OS entropy.")] = None,
    ledger: Annotated[Path | None, typer.Option(help="Ledger file (default: in the dpsummary home).")] = None,
    key: Annotated[Path | None, typer.Option(help="Private signing key (default: created in the dpsummary home).")] = None,
    calibrate_to: Annotated[Literal["rdp", "prv", "pld"] | None, typer.Option(help="Accountant to calibrate sigma to; must equal the policy's accountant of record (set `accountant` in the policy to change it).")] = None,
    mechanism: Annotated[Literal["noise-aware-newton", "dp-psvi", "dp-bb-psvi", "dp-kd-tree"] | None, typer.Option(help="Stage-2 mechanism, chosen from --model when omitted: noise-aware-newton (GLMs' default: noisy score statistics, credible intervals that account for the privacy noise), dp-psvi (GLMs: the paper's mechanism, for reproduction; its intervals ignore the noise), dp-bb-psvi (--model bnn only: DP black-box PSVI) or dp-kd-tree (--model gmm|dpgmm only: a noisy kd-tree of the numeric columns as weighted pseudo-points).")] = None,
    bnn_widths: Annotated[str | None, typer.Option(help="--model bnn only: hidden layer widths, comma-separated (public; default 20: one hidden ReLU layer of 20 units).")] = None,
    components: Annotated[int | None, typer.Option(help="--model gmm|dpgmm only: number of mixture components K (gmm) or the truncation T (dpgmm); public, default 10.")] = None,
    engine: Annotated[Literal["local", "spark"], typer.Option(help="Where the records are read and the mechanisms run: local (one machine, CSV or Parquet) or spark (a Parquet file or directory, through Apache Spark; needs the `spark` extra, Java 17 and the schema in the policy).")] = "local",
    spark_master: Annotated[str, typer.Option(help="Spark master URL for --engine spark (default local[2]; e.g. spark://host:7077, yarn, k8s://...).")] = "local[2]",
    spark_conf: Annotated[list[str] | None, typer.Option(help="Extra Spark configuration for --engine spark, key=value (repeatable).")] = None,
    json_output: Annotated[bool, typer.Option("--json", help="Print the result as JSON.")] = False,
) -> None:
    """Release a differentially private pseudocoreset of DATA (default mechanism: noise-aware
    noisy score statistics; --mechanism dp-psvi for the paper's DP-PSVI; --model bnn: a Bayesian
    neural network by DP black-box PSVI; --model gmm|dpgmm: a Gaussian mixture summary by a noisy
    kd-tree)."""
    configure_torch()
    from rich.console import Console
    from rich.progress import BarColumn, Progress, TextColumn, TimeElapsedColumn

    from ..release import DEFAULT_STEPS, ReleaseError, ReleaseRequest, run_release

    err = Console(stderr=True)
    if steps is None:
        from ..private.bnn import DEFAULT_STEPS as BNN_STEPS

        steps = BNN_STEPS if model == "bnn" else DEFAULT_STEPS
    widths: tuple[int, ...] | None = None
    if bnn_widths is not None:
        try:
            widths = tuple(int(w) for w in bnn_widths.split(","))
        except ValueError:
            raise ReleaseError("--bnn-widths must be comma-separated positive integers, e.g. 32,16") from None
    req = ReleaseRequest(
        data=data, epsilon=epsilon, delta=delta, model=model, target=target, size=size, steps=steps,
        sample_rate=sample_rate, policy=policy, out=out, seed=seed, ledger=ledger, key=key,
        calibrate_to=calibrate_to, mechanism=mechanism, bnn_widths=widths, components=components,
        **_engine_options(engine, spark_master, spark_conf),
    )
    label = {"dp-psvi": "DP-PSVI", "dp-bb-psvi": "DP BB-PSVI", "dp-kd-tree": "noisy kd-tree"}.get(
        mechanism or "", "noise-aware")
    if model == "bnn":
        label = "DP BB-PSVI"
    elif model in ("gmm", "dpgmm"):
        label = "noisy kd-tree"
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

    from ..release import SUBSAMPLED_MECHANISMS

    t = Table(title="dpsummary release", show_header=False)
    t.add_column("what")
    t.add_column("value")
    t.add_row("epsilon (RDP)", f"{r.epsilons['rdp']:.4f}")
    t.add_row("epsilon (PRV)", f"{r.epsilons['prv']:.4f}")
    t.add_row("epsilon (PLD)", f"{r.epsilons['pld']:.4f}")
    t.add_row("delta", f"{r.delta:.3g}")
    t.add_row("noise multiplier sigma", f"{r.noise_multiplier:.4f}")
    t.add_row("mechanism", r.mechanism)
    if r.mechanism in SUBSAMPLED_MECHANISMS:
        t.add_row("sample rate q (Poisson)", f"{r.sample_rate:.6g}")
        t.add_row("steps T", str(r.steps))
    elif r.mechanism == "dp-kd-tree":
        t.add_row("kd-tree levels (Gaussian releases)", str(r.steps))
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
