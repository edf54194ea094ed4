"""``dpsummary baseline --model gmm|dpgmm``: a NON-PRIVATE mixture coreset and the full-data fit.

Called from :mod:`dpsummary.cli.baseline` (a small dispatch on ``--model``). The numeric columns
of the CSV are standardised with the data's own mean and sd (non-private, a baseline), a
held-out fraction is set aside, weighted CAVI is run on the coreset and on the full training
data from the same seed, and both mixtures are printed in the CSV's units with the held-out log
predictive density and the component errors after Hungarian matching.
"""

from __future__ import annotations

import json
import time
from pathlib import Path
from typing import Any

import numpy as np
import torch

from ..cli.common import UserError
from ..models.gmm import mixture_model
from . import MODEL_PROCESSES
from .coresets import CORESET_METHODS, build_coreset
from .metrics import match_components
from .table import NumericTable, read_numeric_table
from .vi import MixtureFit, MixturePrior, fit_cavi, log_predictive_density

#: Components with an expected weight below this are reported as empty and not printed.
EMPTY_WEIGHT = 1e-3


def _describe(fit: MixtureFit, table: NumericTable) -> list[dict[str, Any]]:
    post = fit.posterior
    weights = post.expected_weights()
    means = table.to_raw_means(post.means)
    covs = table.to_raw_covariances(post.covariances())
    order = np.argsort(-weights)
    return [{"component": int(k), "weight": float(weights[k]), "mean": means[k].tolist(),
             "covariance": covs[k].tolist()} for k in order if weights[k] >= EMPTY_WEIGHT]


def mixture_baseline(
    data: Path,
    *,
    model: str,
    method: str,
    size: int,
    components: int | None,
    seed: int,
    test_fraction: float,
    max_iter: int = 500,
    json_output: bool = False,
    out: Path | None = None,
) -> dict[str, Any]:
    """Run the baseline, print it (text or ``--json``) and return the payload.

    Bad options raise :class:`UserError`; unreadable data raises ``DataError`` (both one-line).
    """
    import typer

    if model not in MODEL_PROCESSES:
        raise UserError(f"unknown mixture model {model!r}; choose gmm or dpgmm")
    if method not in CORESET_METHODS:
        raise UserError(f"--method {method!r} is not available for mixtures; choose one of {', '.join(CORESET_METHODS)}")
    n_components = 10 if components is None else components
    if n_components < 1:
        raise UserError("--components must be at least 1")
    if size < 1:
        raise UserError("--size must be at least 1")
    if not 0.0 <= test_fraction < 1.0:
        raise UserError("--test-fraction must lie in [0, 1)")
    table = read_numeric_table(data)
    rng = np.random.default_rng(seed)
    perm = rng.permutation(table.values.shape[0])
    n_test = int(round(test_fraction * table.values.shape[0]))
    test, train = table.values[perm[:n_test]], table.values[perm[n_test:]]
    if train.shape[0] < 2:
        raise UserError("fewer than two training rows remain after the held-out split")
    process = MODEL_PROCESSES[model]
    prior = MixturePrior.default(process, n_components, train)

    start = time.perf_counter()
    # The shared GLM constructor through constructors.fit, on the mixture as a Model.
    coreset = build_coreset(method, train, size, torch.Generator().manual_seed(seed),
                            model=mixture_model(train.shape[1], n_components=n_components, process=process))
    core_fit = fit_cavi(coreset.points, coreset.weights, prior, np.random.default_rng([seed, 2]), max_iter=max_iter)
    core_seconds = time.perf_counter() - start
    full_fit = fit_cavi(train, None, prior, np.random.default_rng([seed, 2]), max_iter=max_iter)

    core_desc, full_desc = _describe(core_fit, table), _describe(full_fit, table)
    payload: dict[str, Any] = {
        "model": model, "method": method, "size": size, "distinct_points": int(coreset.weights.shape[0]),
        "components": n_components, "columns": table.names, "train_rows": int(train.shape[0]),
        "test_rows": int(test.shape[0]), "dropped_rows": table.dropped_rows,
        "coreset": {"components": core_desc, "elbo": core_fit.elbo, "seconds": core_seconds,
                    "iterations": len(core_fit.elbo_trace) - 1},
        "full": {"components": full_desc, "elbo": full_fit.elbo, "seconds": full_fit.seconds,
                 "iterations": len(full_fit.elbo_trace) - 1},
    }
    if test.shape[0]:
        payload["coreset"]["heldout_lpd"] = float(log_predictive_density(core_fit.posterior, test).mean())
        payload["full"]["heldout_lpd"] = float(log_predictive_density(full_fit.posterior, test).mean())
    # Errors of the coreset's components against the full fit's non-empty ones (standardised units).
    ref_w = full_fit.posterior.expected_weights()
    active = np.flatnonzero(ref_w >= EMPTY_WEIGHT)
    match = match_components(full_fit.posterior.means[active], core_fit.posterior.means)
    payload["mean_error_vs_full"] = float(np.linalg.norm(
        core_fit.posterior.means[match] - full_fit.posterior.means[active], axis=1).mean())
    if out is not None:
        from ..constructors.base import write_atomic

        write_atomic(out, json.dumps({"format": "dpsummary.mixture-baseline/v1", **payload,
                                      "coreset_points": table.to_raw_means(coreset.points).tolist(),
                                      "coreset_weights": coreset.weights.tolist()}, indent=1).encode())
    if json_output:
        typer.echo(json.dumps(payload, indent=2))
        return payload
    typer.echo(f"NON-PRIVATE {method} coreset of size {size} ({payload['distinct_points']} distinct points) "
               f"for a {model.upper()} with {n_components} components on {data.name}")
    typer.echo(f"columns (standardised for fitting, reported in CSV units): {', '.join(table.names)}")
    for title, key in (("coreset", "coreset"), ("full data", "full")):
        part = payload[key]
        lpd = f", held-out log predictive density {part['heldout_lpd']:.4f}" if "heldout_lpd" in part else ""
        typer.echo(f"\n{title} fit: ELBO {part['elbo']:.6g}, {part['iterations']} CAVI sweeps, "
                   f"{part['seconds']:.3g} s{lpd}")
        for comp in part["components"]:
            mean = ", ".join(f"{v:.4g}" for v in comp["mean"])
            typer.echo(f"  weight {comp['weight']:.4f}  mean [{mean}]")
            for row in comp["covariance"]:
                typer.echo("      cov [" + ", ".join(f"{v:.4g}" for v in row) + "]")
    typer.echo(f"\nmean error of matched coreset components vs full fit (standardised units): "
               f"{payload['mean_error_vs_full']:.4g}")
    if out is not None:
        typer.echo(f"coreset written to {out} (NON-PRIVATE: never publish it)")
    return payload
