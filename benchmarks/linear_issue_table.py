"""Issue 51's table re-made on the new code: wooldridge/gpa2 (4,137 rows, 8 features, colgpa in
[0, 4]), the full-data posteriors with sigma fixed at 1 and estimated, and the suite's gpa2
releases (``calibration_linear.csv``) against the one with sigma estimated; then the two edge
cases (an exact linear relation, residuals that fill the public range) released at epsilon 1.

    python benchmarks/linear_issue_table.py [--csv benchmarks/results/calibration_linear.csv]

Prints markdown. Curator-side (reads the rows); the releases use OS entropy (their numbers vary
from run to run; the suite's rows are the committed record).
"""

from __future__ import annotations

import argparse
import csv
import math
import statistics
import sys
import tempfile
from pathlib import Path

import numpy as np
import torch

sys.path.insert(0, str(Path(__file__).resolve().parent))

import calibration as C  # noqa: E402


def full_data_rows() -> list[str]:
    from dpsummary import data as dmod
    from dpsummary.metrics import Z95, effects, full_posterior
    from dpsummary.models import LinearRegression

    spec = C.TABLES["gpa2"]
    path = C.table_csv(spec)
    tf = dmod.Transform.from_schema(dmod.Schema.model_validate(C.public_schema(spec, path)))
    pts = tf.to_points(dmod.read_csv(path, private=True)).to(torch.float64)
    k = tf.num_features
    est = full_posterior(LinearRegression(k), pts)
    fixed = full_posterior(LinearRegression(k, noise_scale=1.0), pts)
    p = k + 1
    sd_e = torch.sqrt(torch.diagonal(est.cov))[:p]
    sd_f = torch.sqrt(torch.diagonal(fixed.cov))
    x = pts[:, :k]
    design = torch.cat([torch.ones(len(pts), 1, dtype=torch.float64), x], 1)
    beta = torch.linalg.lstsq(design, pts[:, -1:]).solution[:, 0]
    resid_sd = float((pts[:, -1] - design @ beta).std())
    ratio = (sd_f / sd_e).numpy()
    eff_e = int((effects(est.mean[:p], sd_e) != 0).sum())
    eff_f = int((effects(fixed.mean, sd_f) != 0).sum())
    sigma = math.exp(float(est.mean[-1]))
    s_sd = float(est.cov[-1, -1]) ** 0.5
    return [
        f"| residual sd of the least-squares fit, in model space (public schema) | {resid_sd:.3f} |",
        f"| full-data sigma (posterior mean of log_sigma, exp), 95% interval | {sigma:.3f} "
        f"[{math.exp(float(est.mean[-1]) - Z95 * s_sd):.3f}, {math.exp(float(est.mean[-1]) + Z95 * s_sd):.3f}] |",
        f"| full-data posterior sd with the noise fixed at 1, over the same with sigma estimated | "
        f"{ratio.min():.2f}-{ratio.max():.2f}x (median {np.median(ratio):.2f}) |",
        f"| effects (95% interval excludes 0) in the full data: sigma estimated / fixed at 1 | {eff_e} / {eff_f} of {p} |",
    ]


def release_rows(csv_path: Path) -> list[str]:
    rows = [r for r in csv.DictReader(csv_path.open()) if r["table"] == "gpa2" and float(r["epsilon"]) == 1.0
            and r["outcome"] == "released"]
    out = []
    for mode in ("zero-config", "public"):
        mine = [r for r in rows if r["mode"] == mode]
        if not mine:
            continue

        def med(key: str, rs: list[dict[str, str]] = mine) -> str:
            vals = [float(r[key]) for r in rs if r.get(key) not in (None, "")]
            return f"{statistics.median(vals):.3g}" if vals else "-"

        runs = len(mine)
        out += [
            f"| {mode}, epsilon 1 ({runs} runs): median sd over the full-data posterior (sigma estimated), signed "
            f"Gaussian / sample() | {med('gaussian_width_ratio')}x / {med('sampled_width_ratio')}x |",
            f"| {mode}: the same over the idealised floor's (floor {med('floor_width_ratio')}x the full-data sd) | "
            f"{med('width_vs_floor')}x |",
            f"| {mode}: coverage of the full-data means (coefficients), signed Gaussian / sample() | "
            f"{med('gaussian_coverage')} / {med('sampled_coverage')} |",
            f"| {mode}: effects found / full data / floor | {med('sampled_effects_found')} / {med('effects_full')} / "
            f"{med('floor_effects_found')} |",
            f"| {mode}: sigma's 95% interval covers the full-data sigma (signed / sample()) | "
            f"{sum(float(r['gaussian_sigma_covered'] or 0) for r in mine):.0f} / "
            f"{sum(float(r['sampled_sigma_covered'] or 0) for r in mine):.0f} of {runs} |",
        ]
    return out


def edge_rows() -> list[str]:
    """The exact relation and the range-filling residuals, one release each at epsilon 1."""
    sys.path.insert(0, str(Path(__file__).resolve().parents[1] / "tests" / "mechanisms"))
    sys.path.insert(0, str(Path(__file__).resolve().parents[1] / "tests"))
    import os

    from test_noise_aware_linear import _csv, _full_sigma_interval, _policy

    import dpsummary
    from dpsummary.release import ReleaseRequest, run_release

    out = []
    with tempfile.TemporaryDirectory() as tmp:
        d = Path(tmp)
        os.environ["DPSUMMARY_HOME"] = str(d / "home")
        for noise in ("none", "fill"):
            data = _csv(d / f"{noise}.csv", 4000, noise=noise)
            pol = _policy(d / "p.toml")
            art = d / f"{noise}.json"
            run_release(ReleaseRequest(data=data, epsilon=1.0, policy=pol, out=art, ledger=d / "l.jsonl",
                                       target="y", force=True))
            rel = dpsummary.load(str(art), allow_unsigned=True)
            g = rel.signed_gaussian()
            assert g is not None
            m, s = float(g.mean[-1]), float(g.cov[-1, -1]) ** 0.5
            _, _, full_sigma = _full_sigma_interval(rel, data)
            finite = bool(torch.isfinite(rel.points).all() and torch.isfinite(rel.weights).all())
            out.append(f"| {'exact linear relation' if noise == 'none' else 'residuals fill the range'} (4,000 rows, "
                       f"epsilon 1): finite artifact {finite}; sigma 95% [{math.exp(m - 1.96 * s):.3g}, "
                       f"{math.exp(m + 1.96 * s):.3g}]; full-data sigma {full_sigma:.3g} |")
    return out


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--csv", type=Path, default=Path(__file__).resolve().parent / "results" / "calibration_linear.csv")
    a = ap.parse_args()
    torch.set_num_threads(1)
    print("| | value |\n|---|---|")
    print("\n".join(full_data_rows() + release_rows(a.csv) + edge_rows()))


if __name__ == "__main__":
    main()
