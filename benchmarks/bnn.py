"""Black-box coresets for Bayesian neural networks (issue 16): grid, speed and long-run curve.

Every method uses the same network (one hidden ReLU layer of ``--width`` units, N(0, 1) prior,
mean-field Gaussian family) and the same train/test split per seed:

* ``bb-psvi``       learned pseudopoints, soft labels and weights (Section 3.1/3.2)
* ``bb-sparsevi``   batch BB-SparseVI: weights on M random records (supplement Algorithm 4)
* ``random-subset`` M uniform records weighted N/M, mean-field VI on them
* ``full-vi``       mean-field VI on all training records (minibatches)
* ``hmc``           full-data NUTS (dpsummary.blackbox.evaluate.hmc_reference) started at the full-VI mean (2-D data only)

Data: ``halfmoon`` = sklearn.datasets.make_moons(1000, noise=0.1, random_state=seed) and
``four_blobs`` = make_blobs(1000, centers=4, cluster_std=1.5, random_state=seed), 800/200 split;
``german_credit`` = ``../shared/data/german_credit.csv`` (``benchmarks/data_paths.py``), numeric columns standardised and
categorical ones one-hot (dpsummary.data.Transform.fit), 80/20 split per seed.

Usage (the exact commands behind benchmarks/results/bnn.md are written there)::

    nice -n 10 python benchmarks/bnn.py grid  --datasets halfmoon four_blobs german_credit
    nice -n 10 python benchmarks/bnn.py curve --steps 1000
"""

from __future__ import annotations

import argparse
import csv
import os
import sys
import time
from collections.abc import Callable
from pathlib import Path
from typing import Any

os.environ.setdefault("OMP_NUM_THREADS", "1")

import numpy as np  # noqa: E402
import torch  # noqa: E402

from dpsummary.blackbox import BBPSVI, BBSparseVI, FullDataVI, InnerConfig, RandomSubsetVI  # noqa: E402
from dpsummary.blackbox.evaluate import (  # noqa: E402
    draws_and_weights,
    evaluate_variational,
    hmc_reference,
    mean_std,
    predictive_metrics,
)
from dpsummary.models import DTYPE, Model  # noqa: E402
from dpsummary.models.bnn import BNN, MeanFieldGaussian  # noqa: E402

sys.path.insert(0, str(Path(__file__).resolve().parent))  # benchmarks/: data_paths
from data_paths import SHARED_DATA  # noqa: E402

RESULTS = Path(__file__).resolve().parent / "results"
GERMAN = SHARED_DATA / "german_credit.csv"


# ---- data --------------------------------------------------------------------------------------
def load(name: str, seed: int, width: int) -> tuple[torch.Tensor, torch.Tensor, Model]:
    if name in ("halfmoon", "halfmoon_ref", "four_blobs"):
        from sklearn.datasets import make_blobs, make_moons

        if name in ("halfmoon", "halfmoon_ref"):
            # halfmoon_ref: the authors' data (random_state=42 for every seed; first 800 / last
            # 200), with our network and settings; isolates the data from the other differences.
            x, y = make_moons(1000, noise=0.1, random_state=42 if name == "halfmoon_ref" else seed)
            pts = torch.tensor(np.c_[x, y], dtype=DTYPE)
            model: Model = BNN(2, widths=(width,))
        else:
            x, y = make_blobs(1000, centers=4, cluster_std=1.5, random_state=seed)
            x = (x - x.mean(0)) / x.std(0)
            pts = torch.tensor(np.c_[x, np.eye(4)[y]], dtype=DTYPE)
            model = BNN(2, widths=(width,), likelihood="softmax", num_classes=4)
        return pts[:800], pts[800:], model
    if name == "german_credit":
        from dpsummary import data as dmod

        table = dmod.read_csv(GERMAN)
        schema = dmod.infer_schema(table)
        tf = dmod.Transform.fit(table, schema)
        pts = tf.to_points(table)
        perm = torch.randperm(pts.shape[0], generator=torch.Generator().manual_seed(seed))
        n_test = pts.shape[0] // 5
        return pts[perm[n_test:]], pts[perm[:n_test]], BNN(tf.num_features, widths=(width,))
    raise ValueError(name)


# ---- methods -----------------------------------------------------------------------------------
def make(method: str, steps: int, inner: InnerConfig) -> Any:
    if method == "bb-psvi":
        return BBPSVI(steps=steps, inner=inner)
    if method == "bb-sparsevi":
        return BBSparseVI(steps=steps, inner=inner)
    if method == "random-subset":
        return RandomSubsetVI(steps=steps + 10, inner=inner)  # + the BB methods' 200 warm-up steps
    if method == "full-vi":
        return FullDataVI(steps=steps + 10, inner=inner)
    raise ValueError(method)


def run(method: str, train: torch.Tensor, test: torch.Tensor, model: Model, size: int, seed: int, steps: int,
        inner: InnerConfig, *, on_step: Callable[[int, Any, Any], None] | None = None, ctor: Any = None
        ) -> dict[str, Any]:
    ctor = make(method, steps, inner) if ctor is None else ctor
    gen = torch.Generator().manual_seed(seed)
    w0, c0 = time.perf_counter(), time.process_time()
    state = ctor.init(train, model, size, gen)
    w1, c1 = time.perf_counter(), time.process_time()
    total = ctor.num_steps(size)
    for t in range(total):
        state = ctor.step(state, train, model, gen)
        if on_step is not None:
            on_step(t + 1, ctor, state)
    w2, c2 = time.perf_counter(), time.process_time()
    points, weights = (a.detach().to(DTYPE) for a in ctor.result(state))
    mu, rho = (a.detach().to(DTYPE) for a in ctor.variational(state))
    imp = method.startswith("bb-")
    m = evaluate_variational(model, mu, rho, test, torch.Generator().manual_seed(10_000 + seed),
                             points=points if imp else None, weights=weights if imp else None)
    # The same draws with equal weights: r(psi*)'s own predictive (= m for the VI baselines).
    plain = evaluate_variational(model, mu, rho, test, torch.Generator().manual_seed(10_000 + seed))
    return {"method": method, "M": size if method != "full-vi" else train.shape[0], "seed": seed,
            "accuracy": m["accuracy"], "test_ll": m["test_ll"], "ece": m["ece"], "ess": m["ess"],
            "accuracy_r": plain["accuracy"], "test_ll_r": plain["test_ll"], "ece_r": plain["ece"],
            "wall_s": w2 - w0, "cpu_s": c2 - c0, "step_wall_s": (w2 - w1) / max(total, 1),
            "step_cpu_s": (c2 - c1) / max(total, 1), "steps": total, "_mu": mu}


def run_hmc(train: torch.Tensor, test: torch.Tensor, model: Model, seed: int, init: torch.Tensor) -> dict[str, Any]:
    gen = torch.Generator().manual_seed(seed)
    w0, c0 = time.perf_counter(), time.process_time()
    draws = hmc_reference(model, train, gen, init=init, num_samples=200, num_warmup=300)
    w1, c1 = time.perf_counter(), time.process_time()
    wt = torch.full((draws.shape[0],), 1.0 / draws.shape[0], dtype=DTYPE)
    m = predictive_metrics(model, draws, wt, test)
    return {"method": "hmc", "M": train.shape[0], "seed": seed, "accuracy": m["accuracy"], "test_ll": m["test_ll"],
            "ece": m["ece"], "ess": float("nan"), "accuracy_r": m["accuracy"], "test_ll_r": m["test_ll"],
            "ece_r": m["ece"], "wall_s": w1 - w0, "cpu_s": c1 - c0, "step_wall_s": float("nan"),
            "step_cpu_s": float("nan"), "steps": 500}


FIELDS = ["dataset", "method", "M", "seed", "accuracy", "test_ll", "ece", "ess", "accuracy_r", "test_ll_r", "ece_r",
          "wall_s", "cpu_s", "step_wall_s",
          "step_cpu_s", "steps"]


def grid(args: argparse.Namespace) -> None:
    inner = InnerConfig(steps=args.inner_steps)
    out = RESULTS / args.out
    rows: list[dict[str, Any]] = []
    for seed in range(args.first_seed, args.first_seed + args.seeds):  # seed-major: partial runs cover every set
        for ds in args.datasets:
            train, test, model = load(ds, seed, args.width)
            full = run("full-vi", train, test, model, 1, seed, args.steps, inner)
            rows.append({"dataset": ds, **full})
            print(ds, seed, "full-vi", {k: round(v, 4) for k, v in full.items() if isinstance(v, float)}, flush=True)
            if args.hmc and model.num_features <= 2:
                h = run_hmc(train, test, model, seed, full["_mu"])
                rows.append({"dataset": ds, **h})
                print(ds, seed, "hmc", {k: round(v, 4) for k, v in h.items() if isinstance(v, float)}, flush=True)
            for size in args.sizes:
                for method in ("bb-psvi", "bb-sparsevi", "random-subset"):
                    r = run(method, train, test, model, size, seed, args.steps, inner)
                    rows.append({"dataset": ds, **r})
                    print(ds, seed, method, size, {k: round(v, 4) for k, v in r.items() if isinstance(v, float)},
                          flush=True)
            write_csv(out, rows)
    write_csv(out, rows)


def write_csv(path: Path, rows: list[dict[str, Any]]) -> None:
    path.parent.mkdir(parents=True, exist_ok=True)
    with path.open("w", newline="") as fh:
        w = csv.DictWriter(fh, FIELDS, extrasaction="ignore")
        w.writeheader()
        for r in rows:
            w.writerow({k: (f"{v:.6g}" if isinstance(v, float) else v) for k, v in r.items() if k in FIELDS})


def curve(args: argparse.Namespace) -> None:
    """BB-PSVI test metrics every ``--every`` outer iterations up to ``--steps`` (no degradation?)."""
    inner = InnerConfig(steps=args.inner_steps)
    rows: list[dict[str, Any]] = []
    for ds in args.datasets:
        for seed in range(args.seeds):
            # "reference": the authors' data and settings (see ``reference``), float32 training.
            ref = ds == "reference"
            train, test, model = load_reference() if ref else load(ds, seed, args.width)
            test = test.to(DTYPE)
            for size in args.sizes:
                def on_step(t: int, ctor: Any, state: Any, ds: str = ds, seed: int = seed, size: int = size,
                            model: Model = model, test: torch.Tensor = test) -> None:
                    if t % args.every and t != 1:
                        return
                    pts, w = (a.detach().to(DTYPE) for a in ctor.result(state))
                    mu, rho = (a.detach().to(DTYPE) for a in ctor.variational(state))
                    g = torch.Generator().manual_seed(10_000 + seed)
                    theta, wt = draws_and_weights(model, mu, rho, g, num_samples=200, points=pts, weights=w)
                    m = predictive_metrics(model, theta, wt, test)
                    r = predictive_metrics(model, theta, torch.full_like(wt, 1.0 / wt.numel()), test)
                    rows.append({"dataset": ds, "seed": seed, "M": size, "step": t, **m,
                                 **{f"{k}_r": v for k, v in r.items()}, "weight_sum": float(w.sum())})
                    print(rows[-1], flush=True)
                run("bb-psvi", train, test, model, size, seed, args.steps, inner, on_step=on_step,
                    ctor=reference_ctor("bb-psvi", 1.0, args.steps) if ref else None)
            path = RESULTS / args.out
            with path.open("w", newline="") as fh:
                wr = csv.DictWriter(fh, ["dataset", "seed", "M", "step", "accuracy", "test_ll", "ece", "accuracy_r",
                                         "test_ll_r", "ece_r", "weight_sum"])
                wr.writeheader()
                for r in rows:
                    wr.writerow({k: (f"{v:.6g}" if isinstance(v, float) else v) for k, v in r.items()})


def calibrate_sigma(epsilon: float, delta: float, q: float, steps: int) -> float:
    """The smallest noise multiplier (bisection, 1e-3 relative) with RDP epsilon <= ``epsilon``."""
    from dpsummary.accounting import epsilon as eps_of
    from dpsummary.blackbox.dp_bb_psvi import privacy_events

    lo, hi = 0.3, 200.0
    while hi / lo > 1.001:
        mid = (lo * hi) ** 0.5
        if eps_of(privacy_events(mid, q, steps), delta, "rdp") <= epsilon:
            hi = mid
        else:
            lo = mid
    return hi


def dpsgd(train: torch.Tensor, test: torch.Tensor, model: BNN, sigma: float, q: float, steps: int, clip: float,
          seed: int, lr: float) -> dict[str, float]:
    """Opacus DP-SGD on the same architecture (a point-estimate MLP: Opacus trains weights, not
    a posterior), Poisson sampling at rate q, ``steps`` steps, noise multiplier sigma, clip C."""
    from opacus import PrivacyEngine

    from dpsummary.blackbox.evaluate import expected_calibration_error, labels_of

    torch.manual_seed(seed)  # Opacus draws its noise and coins from the global RNG
    width = model.widths[0]
    net = torch.nn.Sequential(torch.nn.Linear(model.num_features, width), torch.nn.ReLU(),
                              torch.nn.Linear(width, 1)).double()
    x, y = train[:, : model.num_features], train[:, -1:]
    loader = torch.utils.data.DataLoader(torch.utils.data.TensorDataset(x, y), batch_size=max(1, int(q * len(x))))
    opt = torch.optim.SGD(net.parameters(), lr=lr)
    net, opt, loader = PrivacyEngine(accountant="rdp").make_private(
        module=net, optimizer=opt, data_loader=loader, noise_multiplier=sigma, max_grad_norm=clip,
        poisson_sampling=True)
    done = 0
    while done < steps:
        for xb, yb in loader:
            if done == steps:
                break
            opt.zero_grad()
            if len(xb):
                torch.nn.functional.binary_cross_entropy_with_logits(net(xb), yb, reduction="sum").div(q * len(x)
                                                                                                     ).backward()
            opt.step()
            done += 1
    with torch.no_grad():
        p1 = torch.sigmoid(net(test[:, : model.num_features]))[:, 0]
    probs = torch.stack([1 - p1, p1], 1).clamp(min=1e-300)
    lab = labels_of(model, test)
    return {"accuracy": float((probs.argmax(1) == lab).double().mean()),
            "test_ll": float(probs.gather(1, lab[:, None]).log().mean()),
            "ece": expected_calibration_error(probs, lab)}


def private(args: argparse.Namespace) -> None:
    """DP BB-PSVI (dpsummary.blackbox.dp_bb_psvi) vs Opacus DP-SGD at the same (sigma, q, T), halfmoon."""
    from dpsummary.blackbox import dp_bb_psvi as pb
    from dpsummary.blackbox.core import WeightParam, make_state

    inner = InnerConfig(steps=args.inner_steps)
    q, steps, delta, clip = args.sample_rate, args.steps, 1e-5, args.clip
    rows = []
    for seed in range(args.seeds):
        train, test, model = load("halfmoon", seed, args.width)
        assert isinstance(model, BNN)
        for eps in args.epsilons:
            sigma = calibrate_sigma(eps, delta, q, steps)
            gen = torch.Generator().manual_seed(seed)
            n_public = train.shape[0]  # the record count, public here (the release would spend on it)
            state = make_state(model, pb.public_init(model, args.size, gen),
                               WeightParam.softmax(args.size, float(n_public), learn_total=False), n_public, gen,
                               learn_points=True, learn_labels=True, points_lr=0.01, weights_lr=0.1, total_lr=0.0,
                               inner=inner, init_sd=1e-3, warmup_steps=200)
            w0 = time.perf_counter()
            for _ in range(steps):
                state = pb.private_step(state, train, model, gen, inner=inner, outer_samples=10, sample_rate=q,
                                        clip_norm=clip, noise_multiplier=sigma)
            secs = time.perf_counter() - w0
            m = evaluate_variational(model, state.mu, state.rho, test, torch.Generator().manual_seed(10_000 + seed))
            rows.append({"method": "dp-bb-psvi", "epsilon": eps, "sigma": sigma, "seed": seed, **m, "wall_s": secs})
            print(rows[-1], flush=True)
            w0 = time.perf_counter()
            d = dpsgd(train, test, model, sigma, q, steps, args.sgd_clip, seed, args.sgd_lr)
            rows.append({"method": "opacus-dp-sgd", "epsilon": eps, "sigma": sigma, "seed": seed, **d,
                         "wall_s": time.perf_counter() - w0})
            print(rows[-1], flush=True)
            with (RESULTS / args.out).open("w", newline="") as fh:
                wr = csv.DictWriter(fh, ["method", "epsilon", "sigma", "seed", "accuracy", "test_ll", "ece", "wall_s"],
                                    extrasaction="ignore")
                wr.writeheader()
                for r in rows:
                    wr.writerow({k: (f"{v:.6g}" if isinstance(v, float) else v) for k, v in r.items()})


def speed(args: argparse.Namespace) -> None:
    """Seconds per BB-PSVI outer iteration at the reference's settings (its halfmoon, 100 units,
    2-class softmax, M = 50, minibatch 128, 10 draws, inner lr 1e-3, fresh inner moments) for
    several unrolled inner-loop lengths (the reference's default and measured setting is 100),
    in float64 (our default) and float32 (the reference's dtype); wall and CPU time, load."""
    from dataclasses import replace

    train32, _test, model = load_reference()
    for dtype in (torch.float64, torch.float32):
        train = train32.to(dtype)
        for inner_steps in args.inner_list:
            base = reference_ctor("bb-psvi", 1.0, args.steps)
            ctor = replace(base, inner=replace(base.inner, steps=inner_steps))
            gen = torch.Generator().manual_seed(0)
            state = ctor.init(train, model, 50, gen)
            state = ctor.step(state, train, model, gen)  # first call pays one-off set-up
            load0 = os.getloadavg()[0]
            w0, c0 = time.perf_counter(), time.process_time()
            for _ in range(args.steps):
                state = ctor.step(state, train, model, gen)
            print(f"{str(dtype)[6:]} inner {inner_steps:>3}: {(time.perf_counter() - w0) / args.steps:.3f} s wall, "
                  f"{(time.process_time() - c0) / args.steps:.3f} s CPU per outer iteration "
                  f"(load average {load0:.2f} -> {os.getloadavg()[0]:.2f})", flush=True)


# ---- the reference's settings (issue 16 targets; rule in benchmarks/results/bnn.md) ------------
def load_reference() -> tuple[torch.Tensor, torch.Tensor, BNN]:
    """The authors' halfmoon: make_moons(1000, noise=0.1, random_state=42) in float32, train =
    first 800, test = last 200, two one-hot label columns for the 2-class softmax network."""
    from sklearn.datasets import make_moons

    x, y = make_moons(n_samples=1000, noise=0.1, random_state=42)
    pts = torch.tensor(np.c_[x, np.eye(2)[y]], dtype=torch.float32)
    return pts[:800], pts[800:], BNN(2, widths=(100,), likelihood="softmax", num_classes=2)


def reference_ctor(method: str, kl_weight: float, outer: int) -> Any:
    """Constructors at the reference's settings (authors' code defaults, see the rule)."""
    inner = InnerConfig(steps=100, lr=1e-3, num_samples=10, kl_weight=kl_weight)
    if method == "bb-psvi":
        return BBPSVI(steps=outer, inner=inner, batch_size=128, outer_samples=10, points_lr=1e-4, weights_lr=1e-3,
                      learn_labels=False, learn_total=False, init_sd=1e-6, warmup_steps=0, reset_inner_moments=True,
                      init_scheme="uniform")
    two = InnerConfig(steps=outer, lr=1e-3, num_samples=10, kl_weight=kl_weight)  # 2 x outer Adam steps
    if method == "full-vi":
        return FullDataVI(steps=2, inner=two, batch_size=128, init_sd=1e-6, init_scheme="uniform")
    if method == "random-subset":
        return RandomSubsetVI(steps=2, inner=two, init_sd=1e-6, init_scheme="uniform")
    raise ValueError(method)


def reference_metrics(model: BNN, mu: torch.Tensor, rho: torch.Tensor, test: torch.Tensor, seed: int, *,
                      points: torch.Tensor | None, weights: torch.Tensor | None, mean_logit: bool) -> dict[str, float]:
    """Test metrics computed as the authors' code does: per test batch of 128, 10 fresh draws;
    BB-PSVI: importance-weighted mixture of the draws' class probabilities (psvi_classes
    ``evaluate``); VI baselines: softmax of the draws' mean logit (baselines ``run_mfvi``)."""
    gen = torch.Generator().manual_seed(20_000 + seed)
    ll, correct = [], []
    for start in range(0, test.shape[0], 128):
        chunk = test[start:start + 128]
        theta, wt = draws_and_weights(model, mu, rho, gen, num_samples=10, points=points, weights=weights)
        x, lab = chunk[:, :2], chunk[:, 2:].argmax(1)
        if mean_logit:
            logp = torch.log_softmax(model.forward(x, theta).mean(0), -1)
        else:
            logp = torch.einsum("s,snk->nk", wt, model.predictive_probs(x, theta)).clamp(min=1e-300).log()
        ll.append(logp.gather(1, lab[:, None])[:, 0])
        correct.append((logp.argmax(1) == lab).to(DTYPE))
    return {"accuracy_ref": float(torch.cat(correct).mean()), "test_ll_ref": float(torch.cat(ll).mean())}


def reference(args: argparse.Namespace) -> None:
    """BB-PSVI (M = 50), full-data VI and random subset (M = 50) at the reference's settings,
    on the reference's data split; metrics both as the authors' code computes them (10 draws)
    and as the grid does (200 draws, float64). ``--kl-weights 1 0.1``: 1 is the paper's ELBO,
    0.1 reproduces the authors' code's sum over its 10 draws."""
    train32, test32, model = load_reference()
    test = test32.to(DTYPE)
    rows: list[dict[str, Any]] = []
    for kl_weight in args.kl_weights:
        for seed in range(args.first_seed, args.first_seed + args.seeds):
            for method in args.methods:
                ctor = reference_ctor(method, kl_weight, args.steps)
                gen = torch.Generator().manual_seed(seed)
                w0, c0 = time.perf_counter(), time.process_time()
                state = ctor.init(train32, model, 50, gen)
                for _ in range(ctor.num_steps(50)):
                    state = ctor.step(state, train32, model, gen)
                wall, cpu = time.perf_counter() - w0, time.process_time() - c0
                pts, w = (a.detach().to(DTYPE) for a in ctor.result(state))
                mu, rho = (a.detach().to(DTYPE) for a in ctor.variational(state))
                bb = method == "bb-psvi"
                ref = reference_metrics(model, mu, rho, test, seed, points=pts if bb else None,
                                        weights=w if bb else None, mean_logit=not bb)
                ours = evaluate_variational(model, mu, rho, test, torch.Generator().manual_seed(10_000 + seed),
                                            points=pts if bb else None, weights=w if bb else None)
                sd = MeanFieldGaussian.sd(rho)
                rows.append({"method": method, "kl_weight": kl_weight, "seed": seed, **ref, "accuracy": ours["accuracy"],
                             "test_ll": ours["test_ll"], "ece": ours["ece"], "ess": ours["ess"],
                             "sd_median": float(sd.median()), "wall_s": wall, "cpu_s": cpu,
                             "load": os.getloadavg()[0]})
                print({k: (round(v, 4) if isinstance(v, float) else v) for k, v in rows[-1].items()}, flush=True)
                with (RESULTS / args.out).open("w", newline="") as fh:
                    wr = csv.DictWriter(fh, list(rows[0]))
                    wr.writeheader()
                    for r in rows:
                        wr.writerow({k: (f"{v:.6g}" if isinstance(v, float) else v) for k, v in r.items()})


def table(args: argparse.Namespace) -> None:
    """Print markdown tables (mean +- sd over seeds) from bnn.csv."""
    seen: dict[tuple[str, ...], dict[str, str]] = {}
    for name in args.inputs:  # the first file wins on (dataset, method, M, seed) duplicates
        for r in csv.DictReader((RESULTS / name).open()):
            seen.setdefault((r["dataset"], r["method"], r["M"], r["seed"]), r)
    rows = list(seen.values())
    for ds in dict.fromkeys(r["dataset"] for r in rows):
        print(f"\n### {ds}\n")
        print("| method | M | seeds | accuracy | test log-lik | ECE | accuracy (r) | test log-lik (r) | ECE (r) "
              "| wall s (run) | s / outer step (wall, cpu) |")
        print("|---|---|---|---|---|---|---|---|---|---|---|")
        keys = dict.fromkeys((r["method"], r["M"]) for r in rows if r["dataset"] == ds)
        order = {"bb-psvi": 0, "bb-sparsevi": 1, "random-subset": 2, "full-vi": 3, "hmc": 4}
        for method, size in sorted(keys, key=lambda k: (order[k[0]], int(k[1]))):
            sel = [r for r in rows if r["dataset"] == ds and r["method"] == method and r["M"] == size]

            def fmt(key: str, digits: int = 3, sel: list[dict[str, str]] = sel) -> str:
                m, s = mean_std([float(r[key]) for r in sel])
                return f"{m:.{digits}f} ± {s:.{digits}f}"
            step = "-" if method == "hmc" else (f"{mean_std([float(r['step_wall_s']) for r in sel])[0]:.3f}, "
                                                 f"{mean_std([float(r['step_cpu_s']) for r in sel])[0]:.3f}")
            print(f"| {method} | {size} | {len(sel)} | {fmt('accuracy')} | {fmt('test_ll')} | {fmt('ece')} | "
                  f"{fmt('accuracy_r')} | {fmt('test_ll_r')} | {fmt('ece_r')} | {fmt('wall_s', 1)} | {step} |")


def main(argv: list[str] | None = None) -> None:
    torch.set_num_threads(1)
    p = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    p.add_argument("mode", choices=["grid", "curve", "table", "private", "speed", "reference"])
    p.add_argument("--datasets", nargs="+", default=["halfmoon", "four_blobs", "german_credit"])
    p.add_argument("--sizes", nargs="+", type=int, default=[10, 20, 50, 100])
    p.add_argument("--seeds", type=int, default=5)
    p.add_argument("--first-seed", type=int, default=0)
    p.add_argument("--steps", type=int, default=20, help="outer iterations (BB methods)")
    p.add_argument("--inner-steps", type=int, default=20)
    p.add_argument("--width", type=int, default=100)
    p.add_argument("--every", type=int, default=50)
    p.add_argument("--hmc", action=argparse.BooleanOptionalAction, default=True)
    p.add_argument("--out", default="bnn.csv", help="CSV file name under benchmarks/results/")
    p.add_argument("--inputs", nargs="+", default=["bnn.csv"], help="CSV files read by 'table'")
    p.add_argument("--epsilons", nargs="+", type=float, default=[0.5, 1.0, 2.0, 5.0])
    p.add_argument("--sample-rate", type=float, default=0.1)
    p.add_argument("--clip", type=float, default=5.0, help="DP BB-PSVI per-record statistic clip norm")
    p.add_argument("--sgd-clip", type=float, default=1.0)
    p.add_argument("--sgd-lr", type=float, default=0.5)
    p.add_argument("--size", type=int, default=50)
    p.add_argument("--inner-list", nargs="+", type=int, default=[20, 50, 100], help="speed mode: inner steps")
    p.add_argument("--kl-weights", nargs="+", type=float, default=[1.0], help="reference mode: InnerConfig.kl_weight")
    p.add_argument("--methods", nargs="+", default=["bb-psvi", "full-vi", "random-subset"], help="reference mode")
    args = p.parse_args(argv)
    {"grid": grid, "curve": curve, "table": table, "private": private, "speed": speed,
     "reference": reference}[args.mode](args)


if __name__ == "__main__":
    main(sys.argv[1:])
