"""Prototype (not a product path, NOT private): adaptive clipping on SYNTHETIC tables.

Question: would DP-PSVI gain from tracking a quantile of the REAL records' norms (Andrew et al.
2021, "Differentially private learning with adaptive clipping") instead of the public synthetic
reference rule? C_t = exp(m_t) x (the release's synthetic-reference clip norm at step t). Each step
also releases the count of unclipped sampled records, as one Gaussian mechanism over the combined
vector [a clip(g)/C, b (1[|g| <= C] - 1/2)] with a^2 + (b/2)^2 = 1 and b = 0.3 (so the sum's noise
grows by 1/a, about 1%), and m_t moves geometrically towards the target quantile (rate 0.2).

This script reads the records directly and uses torch's Gaussian instead of the product's
mechanism: it measures utility only. Result (``benchmarks/results/prototypes.md``): at the median
the clip bias is catastrophic for logistic regression (60-100x PSVI); at the 0.95 quantile it is
within run-to-run spread of the current rule, so the product keeps its rule.

    python benchmarks/prototypes/adaptive_clip.py logistic 5 out.json
"""

from __future__ import annotations

import dataclasses
import math
import sys
from pathlib import Path
from typing import Any

import numpy as np
import torch
from harness import run, summary

from dpsummary.constructors.dppsvi import DPPSVI
from dpsummary.constructors.psvi import PSVIState, apply_gradient, posterior_draws
from dpsummary.private.mechanism import clip_rows
from dpsummary.private.noise import poisson_mask


@dataclasses.dataclass(frozen=True)
class AdaptiveClipDPPSVI(DPPSVI):
    quantile: float = 0.5
    count_weight: float = 0.3
    adapt_rate: float = 0.2
    expected_batch: float = 200.0

    def step(self, state: PSVIState, data: Any, model: Any, generator: torch.Generator) -> PSVIState:
        posterior, theta = posterior_draws(state, model, self.num_samples, generator, diagonal=self.diagonal)
        log_mult = float(state.info.get("log_clip_multiplier", 0.0))
        clip = self.clip_norm(model, state, theta) * math.exp(log_mult)
        points = data._points  # prototype only: bypasses the product's mechanism
        batch = points[torch.from_numpy(poisson_mask(points.shape[0], self.sample_rate))]
        with torch.no_grad():
            ll = model.log_likelihood(batch, theta)
            centred = ll - ll.mean(1, keepdim=True)
            unclipped = (centred.norm(dim=1) <= clip).double()
            total = clip_rows(centred, clip).sum(0)
        b = self.count_weight
        a = math.sqrt(1.0 - (b / 2.0) ** 2)
        sigma = self.noise_multiplier
        noisy = total + torch.randn(total.shape, dtype=total.dtype) * sigma * clip / a
        count = float((unclipped - 0.5).sum()) + float(np.random.default_rng().standard_normal()) * sigma / b
        fraction = 0.5 + count / self.expected_batch
        state.info["log_clip_multiplier"] = log_mult - self.adapt_rate * (fraction - self.quantile)
        return apply_gradient(state, model, theta, noisy / self.sample_rate, posterior)


def variant(quantile: float) -> Any:
    def build(c: DPPSVI, eps: float, q: float, before: list[Any], steps: int, prep: Any = None) -> DPPSVI:
        fields = {f.name: getattr(c, f.name) for f in dataclasses.fields(c)}
        return AdaptiveClipDPPSVI(**fields, quantile=quantile, expected_batch=q * c.record_count)

    return build


if __name__ == "__main__":
    kind, seeds, out = sys.argv[1], int(sys.argv[2]), Path(sys.argv[3])
    variants = {"constant": None, "ada q0.5": variant(0.5), "ada q0.8": variant(0.8), "ada q0.95": variant(0.95)}
    print(summary(run(kind, seeds, variants, out)))
