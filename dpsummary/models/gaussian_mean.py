"""Gaussian mean with known isotropic covariance: x_n ~ N(theta, noise_scale^2 I).

Conjugate: with prior N(mu0, s0^2 I) the weighted posterior is Gaussian with precision
(1/s0^2 + W/noise^2) I and mean Sigma (mu0/s0^2 + sum_n w_n x_n / noise^2), W = sum_n w_n
(DP-PSVI paper, Section 3 eq. (2) and Section 4).
"""

from __future__ import annotations

import math
from typing import Any, ClassVar

import torch

from .base import DTYPE, Model


class GaussianMean(Model):
    name: ClassVar[str] = "gaussian_mean"
    conjugate: ClassVar[bool] = True
    has_target: ClassVar[bool] = False

    def __init__(self, num_features: int, *, prior_scale: float = 1.0, noise_scale: float = 1.0):
        super().__init__(num_features, prior_scale=prior_scale)
        if not noise_scale > 0:
            raise ValueError("noise_scale must be positive")
        self.noise_scale = float(noise_scale)

    @property
    def param_dim(self) -> int:
        return self.num_features

    def log_likelihood(self, points: torch.Tensor, theta: torch.Tensor) -> torch.Tensor:
        d = self.num_features
        # ||x - theta||^2 expanded so the (n, S) result needs one matmul, not an (n, S, d) tensor.
        sq = (points * points).sum(1, keepdim=True) - 2 * points @ theta.T + (theta * theta).sum(1)
        return -0.5 * sq / self.noise_scale**2 - d * math.log(self.noise_scale) - 0.5 * d * math.log(
            2 * math.pi
        )

    def simulate(self, theta, num, generator, features=None):
        eps = torch.randn(num, self.num_features, generator=generator, dtype=DTYPE)
        return theta.reshape(1, -1) + self.noise_scale * eps

    def record_scores(self, points, theta):
        return (points - theta.detach()) / self.noise_scale**2

    def record_curvatures(self, points, theta):
        eye = torch.eye(self.param_dim, dtype=DTYPE) / self.noise_scale**2
        return eye.expand(points.shape[0], -1, -1)

    def statistic_bounds(self, theta, *, feature_norm, target_bound):
        return ((float(feature_norm) + float(theta.norm())) / self.noise_scale**2,
                math.sqrt(self.param_dim) / self.noise_scale**2)

    def exact_posterior(self, points: torch.Tensor, weights: torch.Tensor):
        from ..gaussian import GaussianPosterior

        total = weights.sum()
        precision = 1.0 / self.prior_scale**2 + total / self.noise_scale**2
        var = 1.0 / precision
        mean = var * (self.prior_mean / self.prior_scale**2 + (weights @ points) / self.noise_scale**2)
        d = self.param_dim
        return GaussianPosterior(mean=mean, scale_tril=torch.sqrt(var) * torch.eye(d, dtype=DTYPE))

    def spec(self) -> dict[str, Any]:
        return {**super().spec(), "noise_scale": self.noise_scale}
