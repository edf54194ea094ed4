"""Prototype (not a product path): DP-PSVI with a phased noise schedule, on SYNTHETIC tables.

Question: with the same total privacy budget, does spending it unevenly over the T steps help?
Each profile lists (fraction of the steps, noise factor); the base sigma is bisected so that the
composition of the phases' Poisson-subsampled Gaussian events (after the initialisation
histograms) meets the target under the RDP accountant. Everything else is the release's DP-PSVI,
run through the product's ``PrivateRecords.noisy_clipped_sum`` with the phase's sigma. Result
(``benchmarks/results/prototypes.md``): no profile beats the constant schedule beyond run-to-run
spread, so the product keeps one sigma.

    python benchmarks/prototypes/noise_schedule.py logistic 5 out.json increasing
"""

from __future__ import annotations

import dataclasses
import sys
from pathlib import Path
from typing import Any

import torch
from harness import run, summary

from dpsummary import accounting as acc
from dpsummary.constructors.dppsvi import DPPSVI
from dpsummary.constructors.psvi import PSVIState, apply_gradient, posterior_draws

PROFILE_SETS: dict[str, dict[str, tuple[tuple[float, float], ...]]] = {
    # more noise early, less late (the late, small-learning-rate steps get more of the budget)
    "decreasing": {
        "constant": ((1.0, 1.0),),
        "60%x2,40%x1": ((0.6, 2.0), (0.4, 1.0)),
        "80%x2.5,20%x1": ((0.8, 2.5), (0.2, 1.0)),
        "50%x2,30%x1.3,20%x1": ((0.5, 2.0), (0.3, 1.3), (0.2, 1.0)),
    },
    # less noise early, more late (the late steps' noise is damped by the decayed learning rate)
    "increasing": {
        "constant": ((1.0, 1.0),),
        "50%x1,50%x2": ((0.5, 1.0), (0.5, 2.0)),
        "30%x1,70%x2": ((0.3, 1.0), (0.7, 2.0)),
        "50%x1,50%x1.5": ((0.5, 1.0), (0.5, 1.5)),
    },
}


@dataclasses.dataclass(frozen=True)
class PhasedDPPSVI(DPPSVI):
    phases: tuple[tuple[int, float], ...] = ()  # (steps, sigma) in order

    def sigma_at(self, step: int) -> float:
        end = 0
        for steps, sigma in self.phases:
            end += steps
            if step < end:
                return sigma
        return self.phases[-1][1]

    def step(self, state: PSVIState, data: Any, model: Any, generator: torch.Generator) -> PSVIState:
        posterior, theta = posterior_draws(state, model, self.num_samples, generator, diagonal=self.diagonal)
        clip = self.clip_norm(model, state, theta)
        noisy = data.noisy_clipped_sum(model, theta, sample_rate=self.sample_rate, clip_norm=clip,
                                       noise_multiplier=self.sigma_at(state.step))
        return apply_gradient(state, model, theta, noisy / self.sample_rate, posterior)


def phases_for(profile: tuple[tuple[float, float], ...], eps: float, q: float, steps: int,
               before: list[Any]) -> tuple[tuple[int, float], ...]:
    counts = [round(f * steps) for f, _ in profile]
    counts[-1] = steps - sum(counts[:-1])

    def events(base: float) -> list[Any]:
        return [*before, *(acc.subsampled_gaussian_event(base * k, q, n)
                           for n, (_, k) in zip(counts, profile, strict=True))]

    lo, hi = 0.05, 50.0
    while hi - lo > 1e-4 * hi:
        mid = 0.5 * (lo + hi)
        if acc.epsilon(events(mid), 1e-7) <= eps:
            hi = mid
        else:
            lo = mid
    return tuple((n, hi * k) for n, (_, k) in zip(counts, profile, strict=True))


def variant(profile: tuple[tuple[float, float], ...]) -> Any:
    def build(c: DPPSVI, eps: float, q: float, before: list[Any], steps: int, prep: Any = None) -> DPPSVI:
        phases = phases_for(profile, eps, q, steps, before)
        fields = {f.name: getattr(c, f.name) for f in dataclasses.fields(c)}
        fields["noise_multiplier"] = phases[0][1]
        return PhasedDPPSVI(**fields, phases=phases)

    return build


if __name__ == "__main__":
    kind, seeds, out = sys.argv[1], int(sys.argv[2]), Path(sys.argv[3])
    profiles = PROFILE_SETS[sys.argv[4] if len(sys.argv) > 4 else "increasing"]
    print(summary(run(kind, seeds, {name: variant(p) for name, p in profiles.items()}, out)))
