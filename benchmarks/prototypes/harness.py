"""Shared loop of the prototypes: synthetic tables, the release's DP-PSVI, KL ratio to PSVI.

Exactly the setting of ``benchmarks/tune_dp_defaults.py`` (synthetic tables only, public bounds,
the default policy's initialisation share, expected batch 200, 500 steps, delta 1e-7); a
prototype supplies ``build(constructor, eps, q, before, steps, prep) -> constructor`` that turns
the release's constructor into its variant (recalibrating sigma itself when it changes the
events; ``prep`` is the prepared synthetic data set, for oracle experiments).
"""

from __future__ import annotations

import json
import statistics
import sys
import tempfile
from collections import defaultdict
from collections.abc import Callable
from pathlib import Path
from typing import Any

import torch

ROOT = Path(__file__).resolve().parents[2]
sys.path.insert(0, str(ROOT))
sys.path.insert(0, str(ROOT / "benchmarks"))

from tune_dp_defaults import synthetic_table, write_csv  # noqa: E402

from dpsummary.accounting import calibrate_noise_multiplier  # noqa: E402
from dpsummary.constructors import fit  # noqa: E402
from dpsummary.data import Transform  # noqa: E402
from dpsummary.experiment import make_constructor, prepare_public_dataset  # noqa: E402
from dpsummary.mechanisms.base import (  # noqa: E402
    DEFAULT_EXPECTED_BATCH,
    DEFAULT_STEPS,
)
from dpsummary.mechanisms.dp_psvi_setup import (  # noqa: E402
    dp_psvi_constructor,
    initial_samplers,
    plan_initialisation,
)
from dpsummary.metrics import evaluate  # noqa: E402
from dpsummary.policy import default_policy  # noqa: E402
from dpsummary.private.mechanism import PrivateRecords  # noqa: E402
from dpsummary.private.noise import quantize_sample_rate  # noqa: E402

Build = Callable[[Any, float, float, list[Any], int, Any], Any]


def run(kind: str, seeds: int, variants: dict[str, Build | None], out: Path) -> list[dict[str, Any]]:
    """Every variant (None = the release's constructor) at eps 0.2 and 1, M 50 and 100."""
    torch.set_num_threads(1)
    share = default_policy().budget_split.normalised(count=False, preprocessing=False)["initialisation"]
    rows: list[dict[str, Any]] = []
    with tempfile.TemporaryDirectory() as tmp:
        for seed in range(seeds):
            path = Path(tmp) / f"{kind}-{seed}.csv"
            write_csv(path, *synthetic_table(kind, 20_000, seed))
            prep = prepare_public_dataset(path, target="y", seed=seed, transform="schema")
            tf = Transform.from_dict(prep.transform)
            n = prep.train.shape[0]
            q = quantize_sample_rate(DEFAULT_EXPECTED_BATCH / n)
            for size in (50, 100):
                psvi = fit(make_constructor("psvi"), prep.train, prep.model, size,
                           generator=torch.Generator().manual_seed(seed))
                base = evaluate(prep.model, psvi.points, psvi.weights, prep.full_posterior)["forward"]
                for eps in (0.2, 1.0):
                    init_sigma, layout, before = plan_initialisation(
                        tf, prep.model.name, prior_events=[], target_epsilon=share * eps, delta=1e-7,
                        accountant="rdp")
                    sigma = calibrate_noise_multiplier(target_epsilon=eps, delta=1e-7, sample_rate=q,
                                                       steps=DEFAULT_STEPS, prior_events=before)
                    for name, build in variants.items():
                        records = PrivateRecords(prep.train)
                        start = initial_samplers(records, tf, layout, init_sigma)
                        c = dp_psvi_constructor(transform=tf, model=prep.model, noise_multiplier=sigma,
                                                sample_rate=q, record_count=n, steps=DEFAULT_STEPS,
                                                init_features=start.features, init_targets=start.targets)
                        if build is not None:
                            c = build(c, eps, q, list(before), DEFAULT_STEPS, prep)
                        s = fit(c, records, prep.model, size, generator=torch.Generator().manual_seed(seed))
                        kl = evaluate(prep.model, s.points, s.weights, prep.full_posterior)["forward"]
                        row = {"kind": kind, "seed": seed, "size": size, "eps": eps, "name": name,
                               "ratio": kl / base}
                        rows.append(row)
                        print(row, flush=True)
    out.write_text(json.dumps(rows, indent=1))
    return rows


def summary(rows: list[dict[str, Any]]) -> str:
    """Median ratio per (kind, eps, M, variant) as a markdown table."""
    cells: dict[tuple[str, float, int], dict[str, list[float]]] = defaultdict(lambda: defaultdict(list))
    names: list[str] = []
    for r in rows:
        cells[(r["kind"], r["eps"], r["size"])][r["name"]].append(r["ratio"])
        if r["name"] not in names:
            names.append(r["name"])
    lines = ["| kind | eps | M | " + " | ".join(names) + " |", "|---|---|---|" + "---|" * len(names)]
    for key in sorted(cells):
        lines.append(f"| {key[0]} | {key[1]:g} | {key[2]} | " + " | ".join(
            f"{statistics.median(cells[key][n]):.2f}" if cells[key][n] else "-" for n in names) + " |")
    return "\n".join(lines)
