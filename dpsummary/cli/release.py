"""``dpsummary release``: the private release (DP-PSVI), signed and entered in the ledger."""

from __future__ import annotations

import json
from dataclasses import dataclass
from pathlib import Path
from typing import Annotated, Any, Literal

import typer

from .application import app
from .common import MODELS_HELP, check_model, configure_torch, guarded


@app.command()
@guarded
def release(
    data: Annotated[Path, typer.Argument(help="The private CSV or Parquet file (header row required).")],
    epsilon: Annotated[float, typer.Option(help="Privacy budget of this release (required).")],
    delta: Annotated[float | None, typer.Option(help="Override delta (within the policy's rule).")] = None,
    model: Annotated[str | None, typer.Option(help=f"Model: {MODELS_HELP} (default: from the target's type).")] = None,
    target: Annotated[str | None, typer.Option(help="Target column (default: the last column).")] = None,
    positive_class: Annotated[str | None, typer.Option(help="The target's class to predict, encoded 1 (every other non-missing value is 0; compared as text, or by value when it is a number: 1 matches 1.0). Public: without a schema in the policy the target is then not estimated, so a rare class cannot make the release refuse. --model logistic or bnn.")] = None,
    size: Annotated[int, typer.Option("--size", "-M", help="Number of pseudopoints (the default mechanism uses at least one per "
                                                             "parameter).")] = 50,
    steps: Annotated[int | None, typer.Option(help="--mechanism dp-psvi and --model bnn only: optimisation steps T (default 500; 100 for --model bnn).")] = None,
    sample_rate: Annotated[float | None, typer.Option(help="--mechanism dp-psvi and --model bnn only: Poisson sampling rate q (default 200 / noisy count).")] = None,
    policy: Annotated[Path | None, typer.Option(help="Policy TOML (default: the packaged default policy, whatever the current directory; the release prints which it used).")] = None,
    out: Annotated[Path | None, typer.Option(help="Artifact path (default: DATA.dpsummary.json).")] = None,
    seed: Annotated[int | None, typer.Option(help="Seed for NON-private randomness only; privacy noise always comes from OS entropy.")] = None,
    ledger: Annotated[Path | None, typer.Option(help="Ledger file (default: in the dpsummary home).")] = None,
    key: Annotated[Path | None, typer.Option(help="PRIVATE signing key (default: keys/dpsummary.key in the dpsummary home, $DPSUMMARY_HOME or ~/.config/dpsummary; created on first use).")] = None,
    calibrate_to: Annotated[Literal["rdp", "prv", "pld"] | None, typer.Option(help="Accountant to calibrate sigma to; must equal the policy's accountant of record (set `accountant` in the policy to change it).")] = None,
    mechanism: Annotated[Literal["noise-aware-newton", "dp-psvi", "dp-bb-psvi", "dp-kd-tree", "noise-aware-cells", "noise-aware-objective"] | None, typer.Option(help="Stage-2 mechanism, chosen from --model when omitted: noise-aware-newton (GLMs' default: noisy score statistics, credible intervals that account for the privacy noise), dp-psvi (GLMs: the paper's mechanism, for reproduction; its intervals ignore the noise), dp-bb-psvi (--model bnn only: DP black-box PSVI), dp-kd-tree (--model gmm|dpgmm only: a noisy kd-tree of the numeric columns as weighted pseudo-points) or noise-aware-cells (logistic or Poisson over a small public discrete feature domain declared in the policy's schema: noisy cell counts and T = sum x y in one Gaussian mechanism; the default runs it instead of noise-aware-newton when the table has enough records per cell for the budget) or noise-aware-objective (--model logistic only, an option: one Newton round, then objective perturbation of the log-likelihood for the mode; RDP accountant and --engine local only).")] = None,
    bnn_widths: Annotated[str | None, typer.Option(help="--model bnn only: hidden layer widths, comma-separated (public; default 20: one hidden ReLU layer of 20 units).")] = None,
    components: Annotated[int | None, typer.Option(help="--model gmm|dpgmm only: number of mixture components K (gmm) or the truncation T (dpgmm); public, default 10.")] = None,
    engine: Annotated[Literal["local", "spark"], typer.Option(help="Where the records are read and the mechanisms run: local (one machine, CSV or Parquet) or spark (a Parquet file or directory, through Apache Spark; needs the `spark` extra and Java 17; zero configuration works as locally).")] = "local",
    spark_master: Annotated[str, typer.Option(metavar="URL", help="Spark master URL for --engine spark (e.g. spark://host:7077, yarn, k8s://...).")] = "local[2]",
    spark_conf: Annotated[list[str] | None, typer.Option(metavar="KEY=VALUE", help="Extra Spark configuration for --engine spark (repeatable).")] = None,
    force: Annotated[bool, typer.Option("--force", help="Replace an existing artifact at the output path (without it, an existing file is refused before any budget is spent).")] = False,
    json_output: Annotated[bool, typer.Option("--json", help="Print the result as JSON.")] = False,
) -> None:
    """Release a differentially private summary of DATA, signed and entered in the ledger.

    Default mechanism: noise-aware noisy score statistics (noisy cell counts instead on a small
    public discrete domain with enough records per cell); --mechanism dp-psvi for the paper's
    DP-PSVI; --model bnn: a Bayesian neural network by DP black-box PSVI; --model gmm|dpgmm: a
    Gaussian mixture summary by a noisy kd-tree. A table the zero-configuration release cannot
    describe takes a schema in the policy: `dpsummary policy init DATA` writes a skeleton.
    """
    # Nothing heavy yet: the public checks of stage 0 (options, file, header, target, output path,
    # policy) refuse first; torch and the accountants load once they pass (`stage` below).
    from rich.console import Console
    from rich.progress import BarColumn, Progress, TextColumn, TimeElapsedColumn

    from ..plan import DEFAULT_STEPS, ReleaseRequest
    from ..release import ReleaseError, default_out, run_release

    err = Console(stderr=True)
    check_model(model)
    if steps is None and model == "bnn":
        # Imports torch: --model bnn only.
        from ..blackbox.dp_bb_psvi import DEFAULT_STEPS as BNN_STEPS

        steps = BNN_STEPS
    elif steps is None:
        steps = DEFAULT_STEPS
    widths: tuple[int, ...] | None = None
    if bnn_widths is not None:
        try:
            widths = tuple(int(w) for w in bnn_widths.split(","))
        except ValueError:
            raise ReleaseError("--bnn-widths must be comma-separated positive integers",
                               fix="pass e.g. --bnn-widths 32,16") from None
    req = ReleaseRequest(
        data=data, epsilon=epsilon, delta=delta, model=model, target=target, size=size, steps=steps,
        sample_rate=sample_rate, policy=policy, out=out, seed=seed, ledger=ledger, key=key,
        calibrate_to=calibrate_to, mechanism=mechanism, bnn_widths=widths, components=components, force=force,
        positive_class=positive_class,
        **_engine_options(engine, spark_master, spark_conf),
    )
    replacing = force and default_out(req).exists()
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

        def stage(name: str) -> None:
            if name == "planned-public":  # every public check passed: load torch (and prefetch the rest)
                configure_torch(accountant_worker=True)

        result = run_release(req, progress=progress, notice=lambda m: err.print(f"note: {m}"), checkpoint=stage)
    view = _release_view(result, req)
    # The view read the artifact and the ledger back (the last reads of this command): put
    # their access and modification times back to the release's recorded start (issue 47).
    from ..artifact import stamp_published_time

    stamp_published_time((result.out, result.ledger), view.created)
    written = f"{result.out} ({'replaced the previous file, --force' if replacing else 'new file'})"
    if json_output:
        typer.echo(json.dumps({**result.as_dict(), "written": written,
                               "spending": [s.as_dict() for s in view.spending]}, indent=2))
        return
    _print_table(result, view, written)


def _engine_options(engine: str, master: str, conf: list[str] | None) -> dict[str, Any]:
    """The request's engine fields; a malformed --spark-conf is a public, one-line error."""
    from ..spark.session import SparkEngineError, SparkOptions, parse_spark_conf

    if engine == "local":
        if conf or master != "local[2]":
            raise SparkEngineError("--spark-master and --spark-conf need --engine spark",
                                   fix="add --engine spark, or leave them out")
        return {}
    return {"engine": "spark", "spark": SparkOptions(master=master, conf=parse_spark_conf(conf))}


@dataclass(frozen=True)
class _ReleaseView:
    """What the release table shows beyond :class:`~dpsummary.release.ReleaseResult`: the
    artifact's claim (read back and verified) and the spending per accountant."""

    claim: dict[str, Any]
    spending: list[Any]
    created: str = ""  # the release's recorded start (the artifact body's ``created``)


def _release_view(r: Any, req: Any) -> _ReleaseView:
    """Read the just-written artifact back (verified with the signing key's public half) and the
    ledger: the table is rendered from the same claim ``dpsummary inspect`` reads."""
    from .. import keys
    from .. import policy as pmod
    from ..artifact import read_artifact
    from .render import source_spending

    key_info, _ = keys.resolve_signing_key(req.key)
    public = keys.load_public_key(key_info.public_path)
    body, claim, _ = read_artifact(r.out, public)
    pol = pmod.load_policy(req.policy) if req.policy is not None else pmod.default_policy()
    spending = source_spending(
        ledger_path=r.ledger, public_key=public, source_id=r.source_id, release_id=body["release_id"],
        policy=pol, release_epsilons=r.epsilons, release_delta=r.delta, composed=tuple(r.composed_total),
    )
    return _ReleaseView(claim=claim, spending=spending, created=str(body.get("created", "")))


def _print_table(r: Any, view: _ReleaseView, written: str) -> None:
    from rich.console import Console
    from rich.table import Table

    from .render import SPENDING_COLUMNS, SPENDING_NOTE, mechanism_rows, size_label, spending_rows

    console = Console()
    t = Table(title="dpsummary release", show_header=False)
    t.add_column("what")
    t.add_column("value")
    for label, text in mechanism_rows(view.claim):
        t.add_row(label, text)
    t.add_row(size_label((view.claim.get("mechanism") or {}).get("name")), str(r.size))
    split = ", ".join(f"{k} {v:.4f}" for k, v in r.budget_split.items())
    t.add_row("budget split (epsilon of each part alone)", split)
    t.add_row("policy", r.policy)
    t.add_row("artifact written", written)
    t.add_row("artifact sha256", r.artifact_digest)
    t.add_row("ledger", str(r.ledger))
    console.print(t)
    spent = Table(title=f"privacy spent (epsilon; source {r.source_id!r}, add/remove one record)")
    for column in SPENDING_COLUMNS:
        spent.add_column(column)
    for row in spending_rows(view.spending):
        spent.add_row(*row)
    console.print(spent)
    console.print(SPENDING_NOTE)
    for note in r.notes:
        console.print(f"note: {note}")
