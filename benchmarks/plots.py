"""Plots of the harness's tidy result tables (``benchmarks/results/*.csv``, columns ``FIELDS`` of
``benchmarks/run.py``): ``make_plots(results_dir, out_dir) -> [png paths]``.

For every results file (one per config) it writes, when the file has the rows for it:

* ``<config>-kl-vs-size.png``: KL against the summary size M, one panel per data set, one line
  per method (DP-PSVI one line per epsilon), log-log axes;
* ``<config>-kl-vs-epsilon.png``: the DP-PSVI paper's Figure 4 layout: KL against epsilon, one
  panel per data set, DP-PSVI at each size M against DP-VI, log-log axes.

Every line is the median over seeds with a band from the 25% to the 75% quantile. The KL is
``forward`` = KL(summary posterior || full-data posterior) unless ``metric`` says otherwise.
Failed rows (``error`` set), non-finite values and unreadable files are skipped, never fatal:
the function must work on partial results while a long run is still writing them.
"""

from __future__ import annotations

import csv
import math
from collections import defaultdict
from collections.abc import Iterable
from pathlib import Path
from typing import Any

Row = dict[str, str]


def _read_rows(path: Path) -> list[Row]:
    try:
        with path.open(newline="") as fh:
            rows = list(csv.DictReader(fh))
    except (OSError, UnicodeDecodeError, csv.Error):
        return []
    return [r for r in rows if isinstance(r, dict) and r.get("method") and not r.get("error")]


def _float(value: str | None) -> float | None:
    if value in (None, ""):
        return None
    try:
        v = float(value)  # type: ignore[arg-type]
    except (TypeError, ValueError):
        return None
    return v if math.isfinite(v) else None


def _quartiles(values: list[float]) -> tuple[float, float, float]:
    vals = sorted(values)
    n = len(vals)

    def q(p: float) -> float:  # linear interpolation, as statistics.quantiles(method="inclusive")
        pos = p * (n - 1)
        lo = math.floor(pos)
        hi = min(lo + 1, n - 1)
        return vals[lo] + (vals[hi] - vals[lo]) * (pos - lo)

    return q(0.25), q(0.5), q(0.75)


def _series(rows: Iterable[Row], x_field: str, metric: str) -> tuple[list[float], list[float], list[float], list[float]]:
    """(x, lower quartile, median, upper quartile) over seeds, sorted by x; positive values only."""
    by_x: dict[float, list[float]] = defaultdict(list)
    for r in rows:
        x, y = _float(r.get(x_field)), _float(r.get(metric))
        if x is None or y is None or x <= 0 or y <= 0:
            continue
        by_x[x].append(y)
    xs = sorted(by_x)
    lo, med, hi = [], [], []
    for x in xs:
        a, b, c = _quartiles(by_x[x])
        lo.append(a)
        med.append(b)
        hi.append(c)
    return xs, lo, med, hi


def _plot_line(ax: Any, series: tuple[list[float], list[float], list[float], list[float]], label: str, **style: Any) -> bool:
    xs, lo, med, hi = series
    if not xs:
        return False
    (line,) = ax.plot(xs, med, marker="o", markersize=3, label=label, **style)
    if len(xs) > 1:
        ax.fill_between(xs, lo, hi, color=line.get_color(), alpha=0.2, linewidth=0)
    else:
        ax.errorbar(xs, med, yerr=[[med[0] - lo[0]], [hi[0] - med[0]]], color=line.get_color(), capsize=3)
    return True


def _eps_label(eps: str) -> str:
    v = _float(eps)
    return f"{v:g}" if v is not None else eps


def _figure(num_panels: int) -> tuple[Any, list[Any]]:
    import matplotlib.pyplot as plt

    cols = min(num_panels, 3)
    rows = math.ceil(num_panels / cols)
    fig, axes = plt.subplots(rows, cols, figsize=(5.2 * cols, 4.0 * rows), squeeze=False)
    flat = [ax for row in axes for ax in row]
    for ax in flat[num_panels:]:
        ax.set_visible(False)
    return fig, flat[:num_panels]


def _save(fig: Any, path: Path) -> Path:
    import matplotlib.pyplot as plt

    fig.tight_layout()
    fig.savefig(path, dpi=110)
    plt.close(fig)
    return path


def _ylabel(metric: str) -> str:
    return {
        "forward": "KL(summary || full)",
        "reverse": "KL(full || summary)",
        "forward_normalised": "KL(summary || full) / KL(prior || full)",
        "reverse_normalised": "KL(full || summary) / KL(full || prior)",
    }.get(metric, metric)


def plot_kl_vs_size(rows: list[Row], path: Path, *, metric: str = "forward", title: str = "") -> Path | None:
    """KL against M per method (and per epsilon for DP methods), one panel per data set."""
    rows = [r for r in rows if (_float(r.get("size")) or 0) > 0]
    datasets = sorted({r["dataset"] for r in rows if r.get("dataset")})
    if not datasets:
        return None
    fig, axes = _figure(len(datasets))
    drew = False
    for ax, ds in zip(axes, datasets, strict=True):
        groups: dict[tuple[str, str], list[Row]] = defaultdict(list)
        for r in rows:
            if r.get("dataset") == ds:
                groups[(r["method"], r.get("epsilon", ""))].append(r)
        for (method, eps) in sorted(groups, key=lambda k: (k[0], _float(k[1]) or math.inf)):
            label = method if not eps else f"{method} eps={_eps_label(eps)}"
            style = {"linestyle": "--"} if eps else {}
            drew |= _plot_line(ax, _series(groups[(method, eps)], "size", metric), label, **style)
        ax.set_xscale("log")
        ax.set_yscale("log")
        ax.set_xlabel("summary size M")
        ax.set_ylabel(_ylabel(metric))
        ax.set_title(ds)
        ax.grid(True, which="both", alpha=0.3)
        if ax.get_legend_handles_labels()[0]:
            ax.legend(fontsize=7)
    if title:
        fig.suptitle(title)
    if not drew:
        import matplotlib.pyplot as plt

        plt.close(fig)
        return None
    return _save(fig, path)


def plot_kl_vs_epsilon(rows: list[Row], path: Path, *, metric: str = "forward", title: str = "") -> Path | None:
    """Figure 4 layout: KL against epsilon, DP-PSVI at each M against DP-VI, per data set."""
    rows = [r for r in rows if r.get("method") in ("dp-psvi", "dp-vi") and _float(r.get("epsilon"))]
    datasets = sorted({r["dataset"] for r in rows if r.get("dataset")})
    if not datasets or len({_float(r.get("epsilon")) for r in rows}) < 2:
        return None  # a curve against epsilon needs two epsilons at least
    fig, axes = _figure(len(datasets))
    drew = False
    for ax, ds in zip(axes, datasets, strict=True):
        mine = [r for r in rows if r.get("dataset") == ds]
        sizes = sorted({int(s) for r in mine if r["method"] == "dp-psvi" and (s := _float(r.get("size")))})
        for m in sizes:
            sel = [r for r in mine if r["method"] == "dp-psvi" and _float(r.get("size")) == m]
            drew |= _plot_line(ax, _series(sel, "epsilon", metric), f"DP-PSVI M={m}")
        sel = [r for r in mine if r["method"] == "dp-vi"]
        drew |= _plot_line(ax, _series(sel, "epsilon", metric), "DP-VI", color="black", linestyle="--")
        ax.set_xscale("log")
        ax.set_yscale("log")
        ax.set_xlabel("epsilon")
        ax.set_ylabel(_ylabel(metric))
        ax.set_title(ds)
        ax.grid(True, which="both", alpha=0.3)
        if ax.get_legend_handles_labels()[0]:
            ax.legend(fontsize=8)
    if title:
        fig.suptitle(title)
    if not drew:
        import matplotlib.pyplot as plt

        plt.close(fig)
        return None
    return _save(fig, path)


def make_plots(results_dir: Path, out_dir: Path, *, metric: str = "forward") -> list[Path]:
    """Write the PNGs for every ``*.csv`` in ``results_dir`` into ``out_dir``; returns their paths.

    Missing directories, empty, partial or malformed files produce fewer plots, not errors.
    """
    import matplotlib

    matplotlib.use("Agg")
    results_dir, out_dir = Path(results_dir), Path(out_dir)
    if not results_dir.is_dir():
        return []
    written: list[Path] = []
    for csv_path in sorted(results_dir.glob("*.csv")):
        rows = _read_rows(csv_path)
        if not rows:
            continue
        out_dir.mkdir(parents=True, exist_ok=True)
        name = csv_path.stem
        for fn, suffix in ((plot_kl_vs_size, "kl-vs-size"), (plot_kl_vs_epsilon, "kl-vs-epsilon")):
            try:
                p = fn(rows, out_dir / f"{name}-{suffix}.png", metric=metric, title=name)
            except (KeyError, ValueError, TypeError) as exc:  # a malformed file must not stop the others
                print(f"plots: skipped {name} {suffix}: {type(exc).__name__}: {exc}")
                continue
            if p is not None:
                written.append(p)
    return written


if __name__ == "__main__":
    import sys

    here = Path(__file__).resolve().parent
    res = Path(sys.argv[1]) if len(sys.argv) > 1 else here / "results"
    out = Path(sys.argv[2]) if len(sys.argv) > 2 else res / "plots"
    for p in make_plots(res, out):
        print(p)
