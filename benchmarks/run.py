"""The one benchmark harness: ``python benchmarks/run.py CONFIG [--smoke]``.

Everything, from scratch (several hours on 2 cores): ``python benchmarks/run.py --all``, then
``python benchmarks/speed.py``, ``python benchmarks/ledger_stress.py`` and
``python benchmarks/selftest_full.py`` for the pages they write, and
``python benchmarks/run.py --report-only`` to regenerate BENCHMARKS.md.

A config (``benchmarks/configs/*.toml``) names data sets, methods, sizes, epsilons and seeds; the
harness runs the grid, appends one tidy row per run to ``<results>/<name>.csv``, rewrites the grid
tables page ``<results>/coresets.md`` and regenerates ``BENCHMARKS.md``, the index of every
benchmark (``benchmarks/index.py``; ``--report-only`` does just that).

Data sets: ``adult``, ``german_credit``, ``bike_rentals`` (``../shared/data``; private-data
stand-ins, read NON-privately here to measure utility), and synthetic ``gaussian_mean:d=200``
(N=1000, the DP-PSVI paper's setting) and ``linear:d=100`` (N=2000).
Methods: ``uniform``, ``lightweight``, ``giga``, ``giga-realistic``, ``sparsevi``, ``psvi``
(non-private), ``dp-psvi`` (one row per epsilon), ``dp-vi`` (one row per epsilon, when
``dpsummary.dpvi`` exists). The reference posterior is exact (conjugate models) or Laplace on
the full training split (GLMs); the ``reference`` column says which.
"""

from __future__ import annotations

import argparse
import csv
import math
import os
import resource
import statistics
import sys
import time
import tomllib
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import torch

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(Path(__file__).resolve().parent))  # benchmarks/: data_paths
from data_paths import SHARED_DATA  # noqa: E402

DATA = SHARED_DATA
RESULTS = ROOT / "benchmarks" / "results"

sys.path.insert(0, str(ROOT))
sys.path.insert(0, str(ROOT / "benchmarks"))

from dpsummary.constructors import fit  # noqa: E402
from dpsummary.experiment import PreparedData, make_constructor, prepare_public_dataset  # noqa: E402
from dpsummary.metrics import evaluate, full_posterior  # noqa: E402
from dpsummary.models import DTYPE, GaussianMean, LinearRegression  # noqa: E402


@dataclass(frozen=True)
class Config:
    name: str
    datasets: list[str]
    methods: list[str]
    sizes: list[int]
    seeds: list[int]
    epsilons: list[float]
    steps: int | None
    delta: float
    transform: str
    description: str
    method_options: dict[str, dict[str, Any]]
    variants: dict[str, dict[str, Any]]

    @classmethod
    def load(cls, path: Path, smoke: bool) -> Config:
        raw = tomllib.loads(path.read_text())
        if smoke:
            raw.update(raw.pop("smoke", {}))
        raw.pop("smoke", None)
        return cls(
            name=raw["name"] + ("-smoke" if smoke else ""),
            datasets=raw["datasets"],
            methods=raw["methods"],
            sizes=raw["sizes"],
            seeds=raw.get("seeds", [0]),
            epsilons=raw.get("epsilons", []),
            steps=raw.get("steps"),
            delta=raw.get("delta", 1e-7),
            transform=raw.get("transform", "schema"),
            description=raw.get("description", ""),
            method_options=raw.get("method_options", {}),
            variants=raw.get("variants", {}),
        )


def synthetic(name: str, seed: int) -> PreparedData:
    kind, _, arg = name.partition(":")
    d = int(arg.split("=")[1]) if arg else 200
    g = torch.Generator().manual_seed(10_000 + seed)
    if kind == "gaussian_mean":
        model: Any = GaussianMean(d)
        theta = model.sample_prior(1, g)[0]
        pts = model.simulate(theta, 1000 + 200, g)
    elif kind == "linear":
        model = LinearRegression(d)
        theta = model.sample_prior(1, g)[0]
        pts = model.simulate(theta, 2000 + 200, g)
    else:
        raise ValueError(f"unknown synthetic data set {name!r}")
    train, test = pts[:-200], pts[-200:]
    return PreparedData(train, test, model, {}, full_posterior(model, train))


def load_dataset(name: str, seed: int, transform: str) -> PreparedData:
    if ":" in name or name in ("gaussian_mean", "linear"):
        return synthetic(name, seed)
    return prepare_public_dataset(DATA / f"{name}.csv", seed=seed, transform=transform)


def base_method(method: str) -> str:
    """``dp-psvi@LABEL`` is DP-PSVI with the options of ``[variants.LABEL]`` in the config."""
    return method.partition("@")[0]


def dp_psvi_variant(options: dict[str, Any]) -> tuple[dict[str, Any], dict[str, Any]]:
    """Split a ``[variants.LABEL]`` table into harness options (``expected_batch``, ``steps``,
    ``accountant``, ``noise_multiplier``: a fixed sigma, for noise-free diagnostics that are NOT
    private; ``initialisation``: the budget share of the DP initialisation histograms, 0 for the
    uniform public start) and :class:`~dpsummary.constructors.dppsvi.DPPSVI` field overrides (``learning_rate``
    sets both learning rates; ``adam_beta1`` passes ``torch.optim.Adam(betas=(b1, 0.999))``)."""
    harness_keys = ("expected_batch", "steps", "accountant", "noise_multiplier", "initialisation")
    harness = {k: v for k, v in options.items() if k in harness_keys}
    fields = {k: v for k, v in options.items() if k not in harness_keys}
    if "learning_rate" in fields:
        fields["points_lr"] = fields["weights_lr"] = fields.pop("learning_rate")
    if "adam_beta1" in fields:
        beta1 = float(fields.pop("adam_beta1"))
        fields["optimizer"] = lambda groups: torch.optim.Adam(groups, betas=(beta1, 0.999))
    return harness, fields


def run_one(prep: PreparedData, method: str, size: int, seed: int, cfg: Config, epsilon: float | None) -> dict[str, Any]:
    gen = torch.Generator().manual_seed(seed)
    start = time.perf_counter()
    extra: dict[str, Any] = {}
    if base_method(method) == "dp-psvi":
        import dataclasses

        from dpsummary import accounting as acc
        from dpsummary.data import Transform
        from dpsummary.mechanisms.base import (
            DEFAULT_EXPECTED_BATCH,
            DEFAULT_STEPS,
        )
        from dpsummary.mechanisms.dp_psvi_setup import (
            dp_psvi_constructor,
            initial_samplers,
            plan_initialisation,
        )
        from dpsummary.policy import default_policy
        from dpsummary.private.mechanism import PrivateRecords
        from dpsummary.private.noise import quantize_sample_rate

        label = method.partition("@")[2]
        if label and label not in cfg.variants:
            raise ValueError(f"method {method!r} names no [variants.{label}] table")
        harness, fields = dp_psvi_variant(cfg.variants.get(label, {}))
        n = prep.train.shape[0]  # declared public here (as a policy's record_count would be)
        steps = int(harness.get("steps", cfg.steps or DEFAULT_STEPS))
        q = quantize_sample_rate(min(1.0, float(harness.get("expected_batch", DEFAULT_EXPECTED_BATCH)) / n))
        assert epsilon is not None
        tf = Transform.from_dict(prep.transform) if prep.transform else None
        if tf is None:
            raise ValueError("dp-psvi needs a public transform (real data sets only)")
        accountant = harness.get("accountant", "rdp")
        # As a release under the default policy with a public count and schema: the
        # initialisation share of the budget split, rescaled without count and preprocessing.
        share = float(harness.get("initialisation", default_policy().budget_split.normalised(
            count=False, preprocessing=False)["initialisation"]))
        init_sigma, layout, before = plan_initialisation(
            tf, prep.model.name, prior_events=[], target_epsilon=share * epsilon, delta=cfg.delta,
            accountant=accountant)
        if "noise_multiplier" in harness:
            sigma = float(harness["noise_multiplier"])
        else:
            sigma = acc.calibrate_noise_multiplier(target_epsilon=epsilon, delta=cfg.delta, sample_rate=q,
                                                   steps=steps, accountant=accountant, prior_events=before)
        records = PrivateRecords(prep.train)
        init_start = initial_samplers(records, tf, layout, init_sigma)
        if init_sigma is not None:
            extra["init_noise_multiplier"] = init_sigma
        constructor = dp_psvi_constructor(transform=tf, model=prep.model, noise_multiplier=sigma, sample_rate=q,
                                          record_count=n, steps=steps, init_features=init_start.features,
                                          init_targets=init_start.targets)
        if fields:
            constructor = dataclasses.replace(constructor, **fields)
        summary = fit(constructor, records, prep.model, size, generator=gen)
        extra.update({"noise_multiplier": sigma, "sample_rate": q})
        post_points, post_weights = summary.points, summary.weights
    elif method == "dp-vi":
        from dpsummary import dpvi

        assert epsilon is not None
        kwargs = {"steps": cfg.steps} if cfg.steps else {}
        result = dpvi.fit_dpvi(prep.train, prep.model, epsilon=epsilon, delta=cfg.delta, generator=gen, **kwargs)
        seconds = time.perf_counter() - start
        metrics = dpvi.evaluate_posterior(prep.model, result.posterior, prep.full_posterior, test=prep.test)
        return {**metrics, "seconds": seconds, "noise_multiplier": result.noise_multiplier,
                "sample_rate": result.sample_rate}
    else:
        constructor = make_constructor(method, steps=cfg.steps, **cfg.method_options.get(method, {}))
        summary = fit(constructor, prep.train, prep.model, size, generator=gen)
        post_points, post_weights = summary.points, summary.weights
    seconds = time.perf_counter() - start
    metrics = evaluate(prep.model, post_points, post_weights, prep.full_posterior, test=prep.test,
                       generator=torch.Generator().manual_seed(seed + 1))
    return {**metrics, "seconds": seconds, **extra}


FIELDS = ["config", "dataset", "model", "reference", "method", "epsilon", "size", "seed", "forward",
          "reverse", "forward_normalised", "reverse_normalised", "mean_error", "test_loglik", "accuracy",
          "rmse", "seconds", "peak_rss_mb", "noise_multiplier", "sample_rate", "error"]


def run(cfg: Config, out: Path) -> None:
    out.parent.mkdir(parents=True, exist_ok=True)
    new = not out.exists()
    with out.open("a", newline="") as fh:
        writer = csv.DictWriter(fh, fieldnames=FIELDS, extrasaction="ignore")
        if new:
            writer.writeheader()
        for dataset in cfg.datasets:
            for seed in cfg.seeds:
                prep = load_dataset(dataset, seed, cfg.transform)
                reference = "exact" if prep.model.conjugate else "laplace"
                for method in cfg.methods:
                    eps_list: list[float | None] = (list(cfg.epsilons) if base_method(method) in ("dp-psvi", "dp-vi")
                                                    else [None])
                    sizes: list[int] = [0] if method == "dp-vi" else cfg.sizes
                    for eps in eps_list:
                        for size in sizes:
                            row: dict[str, Any] = {"config": cfg.name, "dataset": dataset, "model": prep.model.name,
                                                   "reference": reference, "method": method,
                                                   "epsilon": "" if eps is None else eps, "size": size, "seed": seed}
                            try:
                                row.update(run_one(prep, method, size, seed, cfg, eps))
                            except Exception as exc:  # noqa: BLE001 - recorded, not hidden
                                row["error"] = f"{type(exc).__name__}: {exc}"
                            row["peak_rss_mb"] = resource.getrusage(resource.RUSAGE_SELF).ru_maxrss / 1024
                            writer.writerow(row)
                            fh.flush()
                            print(f"{dataset} {method} eps={row['epsilon']} M={size} seed={seed}: "
                                  f"KL={row.get('forward', float('nan')):.4g} "
                                  f"t={row.get('seconds', float('nan')):.2f}s {row.get('error', '')}", flush=True)


def _median_iqr(values: list[float]) -> str:
    vals = sorted(v for v in values if math.isfinite(v))
    if not vals:
        return "n/a"
    if len(vals) == 1:
        return f"{vals[0]:.3g}"
    q = statistics.quantiles(vals, n=4, method="inclusive")
    return f"{statistics.median(vals):.3g} [{q[0]:.3g}, {q[2]:.3g}]"


def report(results: Path, target: Path) -> None:
    """Regenerate ``<results>/coresets.md`` (the grid tables: medians [quartiles] over seeds per
    (dataset, method, eps, M), the issues' targets and the plots) and ``target`` (BENCHMARKS.md, the
    index of every benchmark: ``benchmarks/index.py``)."""
    import index  # benchmarks/index.py

    page = results / "coresets.md"
    lines = ["# Coreset harness: the grid tables", "",
             "Generated by `python benchmarks/run.py --report-only` from `benchmarks/results/*.csv` (the files with "
             "the harness's columns). Everything from scratch: `python benchmarks/run.py --all`.",
             "Each cell: median [25%, 75%] over seeds. KL fwd = KL(summary || full), the divergence PSVI minimises;",
             "KL rev = KL(full || summary); `/prior` = divided by the same-direction KL of the prior.", ""]
    for path in sorted(results.glob("*.csv")):
        rows = list(csv.DictReader(path.open()))
        # Only the coreset-grid tables (one row per dataset/method/eps/M/seed); other benchmarks'
        # CSVs (trust, scale, mixtures, bnn, ...) have their own pages, indexed by BENCHMARKS.md.
        if not rows or not {"method", "dataset", "epsilon", "size", "forward"} <= rows[0].keys():
            continue
        lines += [f"## {path.stem}", ""]
        cfg_path = ROOT / "benchmarks" / "configs" / f"{path.stem.removesuffix('-smoke')}.toml"
        if cfg_path.exists():
            desc = tomllib.loads(cfg_path.read_text()).get("description", "")
            if desc:
                lines += [desc.strip(), ""]
            lines += [f"Reproduce: `python benchmarks/run.py {cfg_path.relative_to(ROOT)}`", ""]
        errors = [r for r in rows if r.get("error")]
        groups: dict[tuple[str, str, str, str], list[dict[str, str]]] = {}
        for r in rows:
            if r.get("error"):
                continue
            groups.setdefault((r["dataset"], r["method"], r["epsilon"], r["size"]), []).append(r)
        lines.append("| dataset | method | eps | M | seeds | KL fwd | KL fwd /prior | KL rev /prior | test loglik | seconds |")
        lines.append("|---|---|---|---|---|---|---|---|---|---|")

        def key(k: tuple[str, str, str, str]) -> tuple[str, str, float, int]:
            return (k[0], k[1], float(k[2]) if k[2] else math.inf, int(k[3]))

        for k in sorted(groups, key=key):
            g = groups[k]

            def col(name: str, g: list[dict[str, str]] = g) -> str:
                return _median_iqr([float(r[name]) for r in g if r.get(name) not in (None, "")])

            lines.append(f"| {k[0]} | {k[1]} | {k[2] or '-'} | {k[3]} | {len(g)} | {col('forward')} | "
                         f"{col('forward_normalised')} | {col('reverse_normalised')} | {col('test_loglik')} | {col('seconds')} |")
        if errors:
            lines += ["", f"{len(errors)} run(s) failed: " + "; ".join(sorted({e['error'] for e in errors}))[:500]]
        lines.append("")
    from targets import targets_markdown  # benchmarks/targets.py

    lines += [targets_markdown(results)]
    try:
        from plots import make_plots  # benchmarks/plots.py

        pngs = make_plots(results, results / "plots")
    except Exception as exc:  # noqa: BLE001 - plots are optional; the tables are the record
        pngs = []
        lines += [f"(plots not generated: {type(exc).__name__}: {exc})", ""]
    if pngs:
        lines += ["## Plots", ""] + [f"![{p.stem}]({os.path.relpath(p, page.parent)})" for p in pngs] + [""]
    _write(page, "\n".join(lines) + "\n")
    _write(target, index.index_markdown(results, target))


def _write(path: Path, text: str) -> None:
    """Write ``text`` atomically (a reader never sees half a page)."""
    tmp = path.with_name(path.name + ".tmp")
    tmp.write_text(text)
    tmp.replace(path)


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("config", nargs="?", type=Path)
    ap.add_argument("--smoke", action="store_true", help="run the config's reduced [smoke] grid")
    ap.add_argument("--results", type=Path, default=RESULTS)
    ap.add_argument("--report-only", action="store_true")
    ap.add_argument("--all", action="store_true", help="run every config in benchmarks/configs, then the report")
    ap.add_argument("--fresh", action="store_true", help="delete this config's previous results first")
    args = ap.parse_args()
    torch.set_default_dtype(DTYPE)
    torch.set_num_threads(1)  # small tensors; two configs can run side by side on 2 cores
    if not args.report_only:
        if args.config is None and not args.all:
            ap.error("a config is required unless --report-only or --all")
        configs = sorted((ROOT / "benchmarks" / "configs").glob("*.toml")) if args.all else [args.config]
        for path in configs:
            cfg = Config.load(path, args.smoke)
            out = args.results / f"{cfg.name}.csv"
            if (args.fresh or args.all) and out.exists():
                out.unlink()
            run(cfg, out)
    if not args.smoke:
        report(args.results, ROOT / "BENCHMARKS.md")


if __name__ == "__main__":
    main()
