"""The issues' stated targets, evaluated from the result tables (never typed in by hand).

``targets_markdown(results_dir)`` returns a Markdown section; ``benchmarks/run.py`` includes it
in BENCHMARKS.md. Each line says the target, the measured medians, and MET / NOT MET.
"""

from __future__ import annotations

import csv
import statistics
from collections import defaultdict
from pathlib import Path

Key = tuple[str, str, str, str]  # dataset, method, epsilon, size


def _load(path: Path) -> dict[Key, dict[str, list[float]]]:
    out: dict[Key, dict[str, list[float]]] = defaultdict(lambda: defaultdict(list))
    if not path.exists():
        return out
    for r in csv.DictReader(path.open()):
        if r.get("error"):
            continue
        k = (r["dataset"], r["method"], r["epsilon"], r["size"])
        for m in ("forward", "reverse", "forward_normalised", "reverse_normalised", "test_loglik"):
            if r.get(m):
                out[k][m].append(float(r[m]))
    return out


def _med(d: dict[Key, dict[str, list[float]]], k: Key, m: str = "forward") -> float | None:
    vals = d.get(k, {}).get(m, [])
    return statistics.median(vals) if vals else None


def _fmt(x: float | None) -> str:
    return "n/a" if x is None else f"{x:.4g}"


def _verdict(ok: bool | None) -> str:
    return "n/a (missing runs)" if ok is None else ("MET" if ok else "NOT MET")


def targets_markdown(results: Path) -> str:
    lines = ["## Targets from the issues, evaluated from the tables above", "",
             "Medians over seeds; KL = KL(summary || full) unless said otherwise.", ""]
    g = _load(results / "gaussian_mean.csv")
    for d in ("gaussian_mean:d=200", "gaussian_mean:d=500"):
        psvi1 = _med(g, (d, "psvi", "", "1"))
        others = {m: _med(g, (d, m, "", "100")) for m in ("sparsevi", "giga", "giga-realistic")}
        ok = None if psvi1 is None or None in others.values() else all(psvi1 < v for v in others.values() if v is not None)
        lines.append(f"- {d}: PSVI at M=1 {_fmt(psvi1)} vs at M=100 "
                     + ", ".join(f"{m} {_fmt(v)}" for m, v in others.items()) + f": {_verdict(ok)}")
    c = _load(results / "coresets_real.csv")
    for ds in ("adult", "bike_rentals"):
        for size in ("10", "20", "50"):
            p = _med(c, (ds, "psvi", "", size))
            others = {m: _med(c, (ds, m, "", size)) for m in ("uniform", "lightweight", "giga", "giga-realistic", "sparsevi")}
            present = {m: v for m, v in others.items() if v is not None}
            ok = None if p is None or not present else all(p <= v for v in present.values())
            lines.append(f"- {ds} M={size}: PSVI {_fmt(p)} at or below every other constructor ("
                         + ", ".join(f"{m} {_fmt(v)}" for m, v in others.items()) + f"): {_verdict(ok)}")
    r = _load(results / "dp_release.csv")
    for size in ("10", "50", "100"):
        dp = _med(r, ("adult", "dp-psvi", "0.2", size))
        ps = _med(r, ("adult", "psvi", "", size))
        un = _med(r, ("adult", "uniform", "", size))
        ok = None if None in (dp, ps, un) else (dp <= 2 * ps and dp < un)  # type: ignore[operator]
        ratio = "n/a" if dp is None or ps is None else f"{dp / ps:.2f}x"
        lines.append(f"- adult eps=0.2 M={size}: DP-PSVI {_fmt(dp)} within 2x of PSVI {_fmt(ps)} ({ratio}) "
                     f"and below uniform {_fmt(un)}: {_verdict(ok)}")
    rs = _load(results / "dp_release_seeds.csv")
    for size in ("10", "50", "100"):
        dp, ps = _med(rs, ("adult", "dp-psvi", "0.2", size)), _med(rs, ("adult", "psvi", "", size))
        if dp is not None and ps is not None:
            n = len(rs[("adult", "dp-psvi", "0.2", size)]["forward"])
            lines.append(f"  - robustness check, not the issue's grid (`dp_release_seeds`, {n} further seeds): "
                         f"adult eps=0.2 M={size}: DP-PSVI {_fmt(dp)} vs PSVI {_fmt(ps)} ({dp / ps:.2f}x): "
                         f"{'within' if dp <= 2 * ps else 'NOT within'} 2x")
    lv = _load(results / "dp_levers.csv")
    if lv:
        sizes = sorted({int(k[3]) for k in lv if k[1] == "psvi"})
        lines += ["", "DP-PSVI levers on adult at epsilon 0.2 (`dp_levers`): median KL(summary || full) divided "
                  "by non-private PSVI's median at the same M (`@no-noise*` rows are not private: diagnostics).", "",
                  "| method | " + " | ".join(f"M={m}" for m in sizes) + " |", "|---|" + "---|" * len(sizes)]
        for method in sorted({k[1] for k in lv if k[1] != "psvi"}):
            cells = []
            for m in sizes:
                dp, ps = _med(lv, ("adult", method, "0.2", str(m))), _med(lv, ("adult", "psvi", "", str(m)))
                cells.append("n/a" if dp is None or ps is None else f"{dp / ps:.2f}x")
            lines.append(f"| {method} | " + " | ".join(cells) + " |")
        lines.append("")
    f4 = _load(results / "fig4.csv")
    for ds in ("adult", "german_credit"):
        for eps in ("0.05", "0.1", "0.2", "0.5"):
            vi = _med(f4, (ds, "dp-vi", eps, "0"))
            vi_r = _med(f4, (ds, "dp-vi", eps, "0"), "reverse")
            for size in ("50", "100"):
                dp = _med(f4, (ds, "dp-psvi", eps, size))
                dp_r = _med(f4, (ds, "dp-psvi", eps, size), "reverse")
                ok = None if dp is None or vi is None else dp < vi
                ok_r = None if dp_r is None or vi_r is None else dp_r < vi_r
                lines.append(f"- fig4 {ds} eps={eps} M={size}: DP-PSVI below DP-VI in KL(summary||full) "
                             f"{_fmt(dp)} vs {_fmt(vi)}: {_verdict(ok)}; in KL(full||summary) {_fmt(dp_r)} vs "
                             f"{_fmt(vi_r)}: {_verdict(ok_r)}")
    return "\n".join(lines) + "\n"
