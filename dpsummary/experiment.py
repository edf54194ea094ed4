"""Non-private experiment plumbing shared by ``dpsummary baseline`` and the benchmarks.

Everything here reads data freely (the transform is fitted from the data): it exists to measure
utility, never to produce something publishable.
"""

from __future__ import annotations

import time
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import torch

from .constructors.base import ProgressFn, Summary, fit
from .inference import GaussianPosterior
from .metrics import evaluate, full_posterior
from .models import DTYPE, Model, get_model_class


@dataclass(frozen=True)
class PreparedData:
    train: torch.Tensor
    test: torch.Tensor
    model: Model
    transform: dict[str, Any]
    full_posterior: GaussianPosterior


def model_for(name: str, num_features: int, **kwargs: Any) -> Model:
    return get_model_class(name)(num_features, **kwargs)


def prepare_public_dataset(
    path: str | Path,
    *,
    target: str | None = None,
    no_target: bool = False,
    model: str | None = None,
    test_fraction: float = 0.1,
    seed: int = 0,
    transform: str = "fit",
) -> PreparedData:
    """Read a CSV, build the transform, split, pick the model. Non-private.

    ``transform="fit"`` standardises with the data's mean and sd (the baselines' convention);
    ``transform="schema"`` uses :meth:`Transform.from_schema` on the inferred schema, i.e. the
    bounds a curator would declare public in a policy — the space DP-PSVI works in, so that
    private and non-private runs are compared on equal terms.
    """
    from . import data as dmod

    table = dmod.read_csv(path)
    schema = dmod.infer_schema(table, target=dmod.NO_TARGET if no_target else target)
    if transform == "fit":
        tf = dmod.Transform.fit(table, schema)
    elif transform == "schema":
        tf = dmod.Transform.from_schema(schema)
    else:
        raise ValueError("transform must be 'fit' or 'schema'")
    points = tf.to_points(table)
    kind = dmod.target_kind(schema)
    model_name = model or dmod.default_model_name(kind)
    mdl = model_for(model_name, tf.num_features)
    if mdl.point_dim != points.shape[1]:
        raise dmod.DataError(f"model {model_name!r} does not fit this data (target kind {kind})")
    gen = torch.Generator().manual_seed(seed)
    perm = torch.randperm(points.shape[0], generator=gen)
    n_test = int(round(test_fraction * points.shape[0]))
    test, train = points[perm[:n_test]], points[perm[n_test:]]
    return PreparedData(train, test, mdl, tf.to_dict(), full_posterior(mdl, train))


@dataclass(frozen=True)
class RunResult:
    summary: Summary
    metrics: dict[str, float]
    seconds: float


def make_constructor(method: str, *, steps: int | None = None, **options: Any) -> Any:
    """A constructor from the registry; ``steps`` applies to PSVI, ``options`` to any."""
    from .constructors import REGISTRY

    try:
        factory = REGISTRY[method]
    except KeyError:
        raise ValueError(f"unknown method {method!r}") from None
    kwargs = {"steps": steps} if steps is not None and method == "psvi" else {}
    return factory(**kwargs, **options)


def run_constructor(
    prepared: PreparedData,
    method: str,
    size: int,
    *,
    seed: int = 0,
    steps: int | None = None,
    progress: ProgressFn | None = None,
) -> RunResult:
    constructor = make_constructor(method, steps=steps)
    gen = torch.Generator().manual_seed(seed)
    start = time.perf_counter()
    summary = fit(constructor, prepared.train, prepared.model, size, generator=gen,
                  transform=prepared.transform, progress=progress)
    seconds = time.perf_counter() - start
    metrics = evaluate(prepared.model, summary.points, summary.weights, prepared.full_posterior,
                       test=prepared.test, generator=torch.Generator().manual_seed(seed + 1))
    return RunResult(summary, metrics, seconds)


__all__ = ["DTYPE", "PreparedData", "RunResult", "make_constructor", "prepare_public_dataset", "run_constructor"]
