"""Why DP-PSVI falls behind PSVI on adult: ``python benchmarks/dp_diagnostics.py``.

Writes ``benchmarks/results/dp_diagnostics.md``. It runs the release's DP-PSVI (epsilon 0.2, delta
1e-7, record count and bounds public as in ``dp_release.toml``) on adult and, every 50 steps,
measures against the private records what the mechanism hides (this script reads the data freely:
a diagnostic for maintainers, never something a release may do):

* the clip norm C against the quantiles of the real records' centred log-likelihood norms and the
  fraction of records clipped;
* ``|full|``: the norm of the exact full-data term (sum of all records' centred vectors);
  ``|resid|``: of its residual against the pseudocoreset's term (what the gradient follows);
  ``|clip bias|``: of the full term minus the clipped sum; ``|noise/q|``: the expected norm of the
  noise after scaling by 1/q (sigma * C * sqrt(S) / q);

and, at the end, the coefficients whose summary-posterior mean is furthest from the full-data
posterior mean, in full-posterior standard deviations.
"""

from __future__ import annotations

import argparse
import dataclasses
import sys
from pathlib import Path

import torch

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT))

from dpsummary import accounting as acc  # noqa: E402
from dpsummary.constructors import fit  # noqa: E402
from dpsummary.constructors.dppsvi import DPPSVI  # noqa: E402
from dpsummary.constructors.psvi import centred_loglik, posterior_draws  # noqa: E402
from dpsummary.data import Transform  # noqa: E402
from dpsummary.experiment import prepare_public_dataset  # noqa: E402
from dpsummary.mechanisms.base import (  # noqa: E402
    DEFAULT_EXPECTED_BATCH,
    DEFAULT_NUM_SAMPLES,
    DEFAULT_STEPS,
)
from dpsummary.mechanisms.dp_psvi_setup import (  # noqa: E402
    dp_psvi_constructor,
)
from dpsummary.metrics import summary_posterior  # noqa: E402
from dpsummary.private.mechanism import PrivateRecords  # noqa: E402
from dpsummary.private.noise import quantize_sample_rate  # noqa: E402

sys.path.insert(0, str(Path(__file__).resolve().parent))  # benchmarks/: data_paths
from data_paths import SHARED_DATA  # noqa: E402

DATA = SHARED_DATA / "adult.csv"
OUT = ROOT / "benchmarks" / "results" / "dp_diagnostics.md"


class Probe:
    """Wraps DP-PSVI's step: every ``every`` steps, measure the data term it is about to privatise."""

    def __init__(self, inner: DPPSVI, train: torch.Tensor, every: int) -> None:
        self.inner, self.train, self.every = inner, train, every
        self.name = inner.name
        self.rows: list[str] = []

    def init(self, data, model, size, generator):  # type: ignore[no-untyped-def]
        return self.inner.init(data, model, size, generator)

    def num_steps(self, size: int) -> int:
        return self.inner.num_steps(size)

    def result(self, state):  # type: ignore[no-untyped-def]
        return self.inner.result(state)

    def step(self, state, data, model, generator):  # type: ignore[no-untyped-def]
        t = state.step
        if t % self.every == 0 or t == self.inner.steps - 1:
            # Separate draws (own generator) so the run itself is unchanged by the probe.
            _, theta = posterior_draws(state, model, self.inner.num_samples, torch.Generator().manual_seed(t))
            clip = self.inner.clip_norm(model, state, theta)
            with torch.no_grad():
                g = centred_loglik(model, self.train, theta)
                norms = g.norm(dim=1)
                full = g.sum(0)
                clipped = (g * torch.clamp(clip / norms.clamp(min=1e-300), max=1.0)[:, None]).sum(0)
                coreset = state.weights.detach() @ centred_loglik(model, state.points.detach(), theta)
            noise = self.inner.noise_multiplier * clip * theta.shape[0] ** 0.5 / self.inner.sample_rate
            self.rows.append(
                f"| {t} | {clip:.3g} | {float(norms.median()):.3g} | {float(norms.quantile(0.9)):.3g} | "
                f"{float(norms.quantile(0.99)):.3g} | {float((norms > clip).double().mean()):.3f} | "
                f"{float(full.norm()):.4g} | {float((full - coreset).norm()):.4g} | "
                f"{float((full - clipped).norm()):.4g} | {noise:.4g} |"
            )
        return self.inner.step(state, data, model, generator)


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--seeds", type=int, nargs="+", default=[0, 1])
    ap.add_argument("--size", type=int, default=100)
    ap.add_argument("--epsilon", type=float, default=0.2)
    ap.add_argument("--every", type=int, default=100)
    ap.add_argument("--reference-theta-scales", type=float, nargs="+", default=[0.0],
                    help="clip-reference target rule(s) to run: 0 = the default (prior mean); "
                         "0.3 = the rule before the collapse fix")
    args = ap.parse_args()
    torch.set_num_threads(1)
    scales = " ".join(f"{r:g}" for r in args.reference_theta_scales)
    lines = ["# DP-PSVI diagnostics on adult (maintainers only: reads the private data)", "",
             f"Reproduce: `python benchmarks/dp_diagnostics.py --seeds {' '.join(map(str, args.seeds))} "
             f"--size {args.size} --reference-theta-scales {scales}`. Epsilon {args.epsilon:g}, delta 1e-7, "
             f"M = {args.size}, "
             f"T = {DEFAULT_STEPS}, S = {DEFAULT_NUM_SAMPLES}, expected batch {DEFAULT_EXPECTED_BATCH}. "
             "Norms are over the S posterior draws of that step; |noise/q| is the expected norm of the "
             "privacy noise after the 1/q scaling.", ""]
    runs = [(r, seed) for r in args.reference_theta_scales for seed in args.seeds]
    for ref_scale, seed in runs:
        prep = prepare_public_dataset(DATA, seed=seed, transform="schema")
        n = prep.train.shape[0]
        tf = Transform.from_dict(prep.transform)
        q = quantize_sample_rate(min(1.0, DEFAULT_EXPECTED_BATCH / n))
        sigma = acc.calibrate_noise_multiplier(target_epsilon=args.epsilon, delta=1e-7, sample_rate=q,
                                               steps=DEFAULT_STEPS)
        constructor = dataclasses.replace(
            dp_psvi_constructor(transform=tf, model=prep.model, noise_multiplier=sigma, sample_rate=q,
                                record_count=n), reference_theta_scale=ref_scale)
        probe = Probe(constructor, prep.train, args.every)
        summary = fit(probe, PrivateRecords(prep.train), prep.model, args.size,
                      generator=torch.Generator().manual_seed(seed))
        rule = "default: prior mean" if ref_scale == 0 else f"{ref_scale:g} x a prior draw"
        lines += [f"## seed {seed}, clip-reference targets at {rule} (sigma {sigma:.4g}, q {q:.4g})", "",
                  "| step | C | real norm median | q90 | q99 | fraction clipped | \\|full\\| | \\|resid\\| | "
                  "\\|clip bias\\| | \\|noise/q\\| |", "|---|---|---|---|---|---|---|---|---|---|", *probe.rows, ""]
        post = summary_posterior(prep.model, summary.points, summary.weights)
        full = prep.full_posterior
        sd = full.cov.diagonal().sqrt()
        z = (post.mean - full.mean) / sd
        names = prep.model.param_names(tf.feature_names)
        lines += ["Coefficients furthest from the full-data posterior mean:", "",
                  "| coefficient | full mean | full sd | summary mean | z |", "|---|---|---|---|---|"]
        for i in z.abs().argsort(descending=True)[:6].tolist():
            lines.append(f"| {names[i]} | {float(full.mean[i]):.3f} | {float(sd[i]):.3g} | "
                         f"{float(post.mean[i]):.3f} | {float(z[i]):.1f} |")
        lines.append("")
    OUT.parent.mkdir(parents=True, exist_ok=True)
    OUT.write_text("\n".join(lines) + "\n")
    print("\n".join(lines))


if __name__ == "__main__":
    main()
