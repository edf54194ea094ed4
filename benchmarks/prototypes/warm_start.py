"""Prototype (not a product path, NOT private): an ORACLE warm start for the initial targets.

Question: 85-90% of DP-PSVI's KL on adult at M = 100 is the mean term (``NOTES.md``). Would
starting the pseudopoints' targets from the right feature-target relation, instead of simulating
them at a shrunk prior draw, let DP-PSVI keep the mean closer under noise, perhaps with a smaller
learning rate or fewer (hence less noisy) steps? The oracle uses the full-data posterior mean
theta_hat (computed from the records, so this is an upper bound on what a DP estimate of theta
could give, before paying for it): initial targets are the soft labels sigmoid(x theta_hat) at the
initial features, or labels sampled from them.

    python benchmarks/prototypes/warm_start.py logistic 5 out.json
"""

from __future__ import annotations

import dataclasses
import sys
from pathlib import Path
from typing import Any

import torch
from harness import run, summary

from dpsummary.accounting import calibrate_noise_multiplier
from dpsummary.constructors.dppsvi import DPPSVI
from dpsummary.constructors.psvi import PSVIState
from dpsummary.inference import coreset_posterior


@dataclasses.dataclass(frozen=True)
class WarmStartDPPSVI(DPPSVI):
    theta_hat: tuple[float, ...] = ()
    soft: bool = True

    def init(self, data: Any, model: Any, size: int, generator: torch.Generator) -> PSVIState:
        state = super().init(data, model, size, generator)
        theta = torch.tensor(self.theta_hat, dtype=state.latent.dtype)
        with torch.no_grad():
            points = state.points.detach().clone()
            eta = model.design(points[:, :-1]) @ theta
            p = torch.sigmoid(eta)
            points[:, -1] = p if self.soft else (torch.rand(p.shape, generator=generator, dtype=p.dtype) < p).to(p.dtype)
            state.latent.copy_(points / state.point_scale)
        state.posterior = coreset_posterior(model, state.points.detach(), state.weights.detach())
        return state


def variant(soft: bool, **fields: Any) -> Any:
    def build(c: DPPSVI, eps: float, q: float, before: list[Any], steps: int, prep: Any = None) -> DPPSVI:
        values = {f.name: getattr(c, f.name) for f in dataclasses.fields(c)}
        values.update(fields)
        if "steps" in fields:
            values["noise_multiplier"] = calibrate_noise_multiplier(
                target_epsilon=eps, delta=1e-7, sample_rate=q, steps=fields["steps"], prior_events=before)
        theta_hat = tuple(float(v) for v in prep.full_posterior.mean)
        return WarmStartDPPSVI(**values, theta_hat=theta_hat, soft=soft)

    return build


if __name__ == "__main__":
    kind, seeds, out = sys.argv[1], int(sys.argv[2]), Path(sys.argv[3])
    variants = {
        "constant": None,
        "oracle, sampled labels": variant(False),
        "oracle, soft labels": variant(True),
        "oracle soft, lr 0.025": variant(True, points_lr=0.025, weights_lr=0.025),
        "oracle soft, 250 steps": variant(True, steps=250),
    }
    print(summary(run(kind, seeds, variants, out)))
