"""``dpsummary baseline --method bb-psvi|bb-sparsevi|... --model bnn``: the black-box dispatch.

Non-private (the transform is fitted from the data): a utility baseline, never publishable.
``dpsummary/cli/baseline.py`` only forwards here.
"""

from __future__ import annotations

import json
import time
from pathlib import Path
from typing import Any

import torch
import typer

from ..cli.common import UserError
from ..constructors.base import Summary
from ..models import DTYPE, Model, get_model_class
from ..models.bnn import BNN
from . import REGISTRY
from .evaluate import evaluate_variational

#: Hidden widths of the CLI's BNN (the paper's and the reference's one hidden layer of 100 units).
CLI_WIDTHS = (100,)
#: Methods whose predictive corrects r(psi) toward the coreset posterior by importance weights.
IMPORTANCE_METHODS = frozenset({"bb-psvi", "bb-sparsevi", "bb-sparsevi-incremental", "bb-sparsevi-pruning"})


def prepare(path: Path, *, model: str | None, target: str | None, test_fraction: float, seed: int
            ) -> tuple[torch.Tensor, torch.Tensor, Model, dict[str, Any]]:
    """Read a CSV, fit the transform (non-private), split, build the model (BNN by default)."""
    from .. import data as dmod

    table = dmod.read_csv(path)
    schema = dmod.infer_schema(table, target=target)
    tf = dmod.Transform.fit(table, schema)
    points = tf.to_points(table)
    kind = dmod.target_kind(schema)
    name = model or "bnn"
    if name == "bnn":
        if kind == "binary":
            mdl: Model = BNN(tf.num_features, widths=CLI_WIDTHS, likelihood="bernoulli")
        elif kind == "real":
            mdl = BNN(tf.num_features, widths=CLI_WIDTHS, likelihood="gaussian")
        else:
            raise UserError(f"--model bnn needs a binary or real target (this one is {kind})")
    else:
        mdl = get_model_class(name)(tf.num_features)
    if mdl.point_dim != points.shape[1]:
        raise UserError(f"model {name!r} does not fit this data (target kind {kind})")
    gen = torch.Generator().manual_seed(seed)
    perm = torch.randperm(points.shape[0], generator=gen)
    n_test = int(round(test_fraction * points.shape[0]))
    return points[perm[n_test:]], points[perm[:n_test]], mdl, tf.to_dict()


def blackbox_baseline(data: Path, *, model: str | None, method: str, size: int, seed: int, steps: int | None,
                      test_fraction: float, target: str | None, json_output: bool, out: Path | None) -> None:
    """Run one black-box constructor end to end and print (or ``--json``) its metrics."""
    if method not in REGISTRY:
        raise UserError(f"unknown black-box method {method!r}; choose one of {', '.join(REGISTRY)}")
    if size < 1:
        raise UserError("--size must be at least 1")
    if not 0.0 < test_fraction < 1.0:
        raise UserError("--test-fraction must lie in (0, 1) for the black-box methods")
    train, test, mdl, transform = prepare(data, model=model, target=target, test_fraction=test_fraction, seed=seed)
    kwargs: dict[str, Any] = {}
    if steps is not None:
        if method == "bb-sparsevi-incremental":
            raise UserError("--steps does not apply to bb-sparsevi-incremental (one step per point)")
        kwargs["round_steps" if method == "bb-sparsevi-pruning" else "steps"] = steps
    ctor = REGISTRY[method](**kwargs)
    gen = torch.Generator().manual_seed(seed)
    start = time.perf_counter()
    state = ctor.init(train, mdl, size, gen)
    for _ in range(ctor.num_steps(size)):
        state = ctor.step(state, train, mdl, gen)
    seconds = time.perf_counter() - start
    points, weights = ctor.result(state)
    mu, rho = ctor.variational(state)
    imp = method in IMPORTANCE_METHODS
    metrics = evaluate_variational(mdl, mu, rho, test, torch.Generator().manual_seed(seed + 1),
                                   points=points if imp else None, weights=weights if imp else None)
    if out is not None:
        keep = weights > 0
        Summary(points[keep].to(DTYPE), weights[keep].to(DTYPE), mdl, method, transform,
                {"variational": {"mu": mu.tolist(), "rho": rho.tolist()}}).save(out)
    payload = {"method": method, "size": size, "model": mdl.name, "spec": mdl.spec(), "metrics": metrics,
               "seconds": seconds, "out": str(out) if out else None}
    if json_output:
        typer.echo(json.dumps(payload, indent=2))
        return
    typer.echo(f"{method} coreset of size {size} for {mdl.name} on {data.name} (non-private baseline)")
    for k, v in metrics.items():
        typer.echo(f"  {k:<20} {v:.6g}")
    typer.echo(f"  {'seconds':<20} {seconds:.3g}")
    if out is not None:
        typer.echo(f"summary written to {out}")
