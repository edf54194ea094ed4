"""``dpsummary selftest``: empirical privacy audit of dpsummary's own mechanism (docs/SELFTEST.md)."""

from __future__ import annotations

import json
from typing import TYPE_CHECKING, Annotated, Any, Literal

import typer

from .application import app
from .common import UserError, guarded

if TYPE_CHECKING:
    from ..selftest import SelfTestResult


@app.command()
@guarded
def selftest(
    epsilon: Annotated[float, typer.Option(help="Inflated claimed epsilon to audit (sigma is calibrated to it).")] = 2.0,
    delta: Annotated[float, typer.Option(help="delta of the audited claim.")] = 1e-2,
    runs: Annotated[int, typer.Option(help="Main runs per side (without / with the canary) per canary scenario.")] = 10_000,
    pilot_runs: Annotated[int | None, typer.Option(help="Pilot runs per side for the threshold (default runs/4).")] = None,
    alpha: Annotated[float, typer.Option(help="1 - confidence; split equally over the audits (Bonferroni).")] = 0.05,
    inject: Annotated[Literal["none", "no-clip", "half-noise", "fixed-size", "fixed-seed", "no-scale", "refuse-invalid", "multiline-csv", "strict-utf8"], typer.Option(help="Inject a known bug to see the self-test catch it.")] = "none",
    noise: Annotated[Literal["opendp", "numpy"], typer.Option(help="opendp: the product's noise (audited path); numpy: fast vectorised Gaussian, product coins and clipping.")] = "opendp",
    sample_rate: Annotated[float, typer.Option(help="Poisson sampling rate q of the audited mechanism.")] = 0.1,
    steps: Annotated[int, typer.Option(help="Mechanism steps T per run.")] = 10,
    accountant: Annotated[Literal["rdp", "prv", "pld"], typer.Option(help="Accountant that makes the claim.")] = "rdp",
    one_run_canaries: Annotated[int, typer.Option(help="Canaries of the one-run audit (0: skip it).")] = 1000,
    replay: Annotated[bool, typer.Option(help="Run the gray-box replay of the full DP-PSVI constructor.")] = True,
    histogram: Annotated[bool, typer.Option(help="Also audit the DP initialisation histograms (noisy_marginals).")] = True,
    quality: Annotated[bool, typer.Option(help="Also audit the invalid-record handling (total rules and noisy quality counts).")] = True,
    newton: Annotated[bool, typer.Option(help="Also audit the noise-aware mechanism's score release (the default release mechanism).")] = True,
    cells: Annotated[bool, typer.Option(help="Also audit noise-aware-cells' release (cell counts and T in one Gaussian mechanism).")] = True,
    ranges: Annotated[bool, typer.Option(help="Also audit the data-range histogram (the count's and the feature norm's clip bounds of the default mechanisms).")] = True,
    objective: Annotated[bool, typer.Option(help="Also audit noise-aware-objective's perturbed mode (objective perturbation; with --accountant rdp only).")] = True,
    csv_lines: Annotated[bool, typer.Option(help="Also audit the record count under the CSV line neighbours (unclosed quotes, bare CR).")] = True,
    bnn: Annotated[bool, typer.Option(help="Also check the BNN mechanism (dp-bb-psvi): noise scale, accountant reproduction, gray-box replay.")] = True,
    mixture: Annotated[bool, typer.Option(help="Also check the mixture mechanism (dp-kd-tree): noise scale, accountant reproduction, coupled neighbour replay.")] = True,
    bootstrap: Annotated[bool, typer.Option(help="Also check that DP-PSVI's parametric bootstrap never reads a record (closed and poisoned record store).")] = True,
    json_output: Annotated[bool, typer.Option("--json", help="Print the result as JSON.")] = False,
) -> None:
    """Audit the release mechanism empirically: a statistically valid LOWER bound on epsilon.

    A lower bound above the claimed epsilon proves an implementation bug; one below it is no
    proof of privacy. Runs at an inflated epsilon, where audits have power.
    """
    from rich.console import Console
    from rich.progress import BarColumn, Progress, TextColumn, TimeElapsedColumn

    from ..selftest import SelfTestConfig, run_selftest

    try:
        cfg = SelfTestConfig(
            epsilon=epsilon, delta=delta, runs=runs, pilot_runs=pilot_runs, alpha=alpha, inject=inject,
            noise=noise, sample_rate=sample_rate, steps=steps, accountant=accountant,
            one_run_canaries=one_run_canaries, replay=replay, bnn=bnn, mixture=mixture, bootstrap=bootstrap,
            scenarios=("dirac", "swap") + (("histogram",) if histogram else ()) + (("quality",) if quality else ())
            + (("newton",) if newton else ()) + (("csv-lines",) if csv_lines else ()) + (("cells",) if cells else ())
            + (("ranges",) if ranges else ()) + (("objective",) if objective else ()),
        ).validated()
    except ValueError as exc:
        raise UserError(str(exc)) from None
    err = Console(stderr=True)
    labels = {"pilot": "pilot runs", "main": "main runs", "histogram": "histogram audit", "quality": "quality audit", "newton": "newton audit", "csv-lines": "CSV line audit", "cells": "cells audit", "ranges": "ranges audit",
              "objective": "objective audit", "one-run": "one-run audit",
              "replay": "gray-box replay", "bnn": "BNN mechanism checks"}
    with Progress(TextColumn("{task.description}"), BarColumn(), TextColumn("{task.completed}/{task.total}"),
                  TimeElapsedColumn(), console=err, transient=True, disable=json_output) as bar:
        tasks: dict[str, Any] = {}

        def progress(stage: str, done: int, total: int) -> None:
            if stage not in tasks:
                tasks[stage] = bar.add_task(labels.get(stage, stage), total=total)
            bar.update(tasks[stage], completed=done, total=total)

        result = run_selftest(cfg, progress=progress)
    if json_output:
        typer.echo(json.dumps(result.as_dict(), indent=2, default=str))
    else:
        _print(result)
    if result.violation:
        raise typer.Exit(1)


def _print(r: SelfTestResult) -> None:
    from rich.console import Console
    from rich.table import Table

    con = Console()
    cfg = r.config
    head = Table(title="dpsummary selftest", show_header=False)
    head.add_column("what")
    head.add_column("value")
    head.add_row("injected bug", cfg["inject"])
    head.add_row("noise path audited", r.noise_path_audited)
    head.add_row("claimed epsilon (inflated)", f"{r.claimed_epsilon:.4f} at delta {cfg['delta']:g} ({cfg['accountant']})")
    head.add_row("noisy sum (dirac, swap, one-run)", f"q {cfg['sample_rate_quantised']:.6g} (Poisson), T {cfg['steps']}, sigma {r.noise_multiplier:.4f}, C {cfg['design']['clip_norm']:g}")
    head.add_row("confidence", f"{1 - cfg['alpha']:.4g} overall ({1 - r.alpha_per_audit:.4g} per audit, Bonferroni)")
    head.add_row("white-box runs", f"{r.white_box_runs} ({r.runs_per_second:.0f} runs/s), {r.elapsed_seconds:.1f} s total")
    con.print(head)
    t = Table(title="lower bounds (valid with the confidence above)")
    for col in ("audit", "sigma", "claim eps @ delta", "eps LB", "runs/side", "FP / FN", "violation"):
        t.add_column(col)
    for a in r.audits:
        sigma = "" if a.noise_multiplier is None else f"{a.noise_multiplier:.4f}"
        # csv-lines: the largest exact move of the record count over the line neighbours (<= 1).
        name = a.scenario if a.sensitivity is None else f"{a.scenario} (count moved {a.sensitivity:g})"
        t.add_row(name, sigma, f"{a.claimed_epsilon:.3f} @ {a.delta:g}", f"{a.epsilon_lower_bound:.3f}",
                  str(a.runs_per_side), f"{a.false_positives} / {a.false_negatives}",
                  "YES" if a.violation else "no")
    if r.one_run is not None:
        o = r.one_run
        t.add_row(f"one-run (m={o.canaries})", f"{r.noise_multiplier:.4f}", f"{o.claimed_epsilon:.3f} @ {o.delta:g}",
                  f"{o.epsilon_lower_bound:.3f}", "1 run", f"{o.correct}/{o.guesses} right",
                  "YES" if o.violation else "no")
    con.print(t)
    if r.replay is not None:
        p = r.replay
        con.print(f"gray-box replay: calls {p.calls[0]} vs {p.calls[1]}, shapes equal {p.shapes_equal}, "
                  f"step-1 |delta sum| {p.first_step_delta:.4g} <= C {p.first_step_clip:.4g}, "
                  f"lockstep max |delta|/C {p.lockstep_max_ratio:.4g}: {'ok' if p.ok else 'FAILED'}",
                  markup=False)
        ratios = ", ".join(f"{d / c:.3g}" for d, c in zip(p.per_step_delta, p.per_step_clip, strict=False))
        con.print(f"  independent replay, per-step |delta sum| / C_t (steps > 1 diverge by post-processing): {ratios}",
                  markup=False)
    if r.bnn is not None:
        b = r.bnn
        con.print(f"BNN mechanism (dp-bb-psvi): noise sd / (sigma C) {b.noise_sd_ratio:.4f} over {b.noise_samples} "
                  f"coordinates (tolerance +-{b.noise_tolerance:.3f}); RDP epsilon {b.accountant_epsilon:.6f} vs "
                  f"Opacus {b.opacus_epsilon:.6f}; replay calls {b.replay.calls[0]} vs {b.replay.calls[1]}, step-1 "
                  f"|delta sum| {b.replay.first_step_delta:.4g} <= C {b.replay.first_step_clip:.4g}, lockstep max "
                  f"|delta|/C {b.replay.lockstep_max_ratio:.4g}: {'ok' if b.ok else 'FAILED: ' + ', '.join(b.failed)}",
                  markup=False)
    if r.mixture is not None:
        x = r.mixture
        con.print(f"mixture mechanism (dp-kd-tree): noise sd / sigma {x.noise_sd_ratio:.4f} over {x.noise_samples} "
                  f"coordinates (tolerance +-{x.noise_tolerance:.3f}); RDP epsilon {x.accountant_epsilon:.6f} vs "
                  f"Opacus {x.opacus_epsilon:.6f}; coupled replay max move {x.replay_max_move:.4g} <= 1, same "
                  f"output {x.replay_same_output}: {'ok' if x.ok else 'FAILED: ' + ', '.join(x.failed)}",
                  markup=False)
    if r.bootstrap is not None:
        bs = r.bootstrap
        con.print(f"DP-PSVI parametric bootstrap: {bs.replicates} replicates with the record store closed "
                  f"(reading it raised: {bs.store_closed}) and again with every record poisoned (NaN): identical "
                  f"output {bs.identical}, finite {bs.finite}: {'ok' if bs.ok else 'FAILED'}", markup=False)
    con.print(r.verdict, markup=False)
    con.print(f"certifies: {r.certifies}", markup=False)
    con.print(f"does not certify: {r.does_not_certify}", markup=False)
