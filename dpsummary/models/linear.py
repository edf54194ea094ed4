"""Bayesian linear regression with known noise: y = [1, x] theta + e, e ~ N(0, noise_scale^2).

Conjugate: weighted posterior precision P = I/s0^2 + X^T W X / noise^2, mean
P^{-1} (mu0/s0^2 + X^T W y / noise^2).
"""

from __future__ import annotations

import math
from typing import Any, ClassVar

import torch

from .base import DTYPE, Model


class LinearRegression(Model):
    name: ClassVar[str] = "linear"
    conjugate: ClassVar[bool] = True
    has_target: ClassVar[bool] = True

    def __init__(
        self,
        num_features: int,
        *,
        prior_scale: float = 1.0,
        noise_scale: float = 1.0,
        intercept: bool = True,
    ):
        super().__init__(num_features, prior_scale=prior_scale)
        if not noise_scale > 0:
            raise ValueError("noise_scale must be positive")
        self.noise_scale = float(noise_scale)
        self.intercept = bool(intercept)

    @property
    def param_dim(self) -> int:
        return self.num_features + int(self.intercept)

    def param_names(self, feature_names=None):
        names = super().param_names(feature_names)
        return (["intercept"] if self.intercept else []) + names

    def design(self, points: torch.Tensor) -> torch.Tensor:
        x = points[:, : self.num_features]
        if self.intercept:
            x = torch.cat([torch.ones(x.shape[0], 1, dtype=x.dtype), x], 1)
        return x

    def log_likelihood(self, points, theta):
        eta = self.design(points) @ theta.T
        resid = points[:, -1:] - eta
        return -0.5 * (resid / self.noise_scale) ** 2 - math.log(self.noise_scale) - 0.5 * math.log(
            2 * math.pi
        )

    def record_scores(self, points, theta):
        z = self.design(points)
        resid = points[:, -1] - z @ theta.detach()
        return (resid / self.noise_scale**2)[:, None] * z

    def record_curvatures(self, points, theta):
        z = self.design(points)
        return z[:, :, None] * z[:, None, :] / self.noise_scale**2

    def record_curvature_factors(self, points, theta):
        z = self.design(points)
        return torch.full((z.shape[0],), 1.0 / self.noise_scale**2, dtype=DTYPE), z

    def statistic_bounds(self, theta, *, feature_norm, target_bound):
        # |y - z.theta| <= |y| + ||z|| ||theta||; theta is public (the mechanism's anchor).
        r = math.sqrt(feature_norm**2 + (1.0 if self.intercept else 0.0))
        resid = float(target_bound) + r * float(theta.norm())
        return r * resid / self.noise_scale**2, r * r / self.noise_scale**2

    def simulate(self, theta, num, generator, features=None):
        if features is None:
            features = torch.randn(num, self.num_features, generator=generator, dtype=DTYPE)
        eta = self.design(torch.cat([features, torch.zeros(num, 1, dtype=DTYPE)], 1)) @ theta
        y = eta + self.noise_scale * torch.randn(num, generator=generator, dtype=DTYPE)
        return torch.cat([features, y[:, None]], 1)

    def exact_posterior(self, points, weights):
        from ..gaussian import GaussianPosterior

        x = self.design(points)
        y = points[:, -1]
        d = self.param_dim
        precision = torch.eye(d, dtype=DTYPE) / self.prior_scale**2 + (x.T * weights) @ x / self.noise_scale**2
        rhs = self.prior_mean / self.prior_scale**2 + x.T @ (weights * y) / self.noise_scale**2
        return GaussianPosterior.from_precision(precision, rhs)

    def spec(self) -> dict[str, Any]:
        return {**super().spec(), "noise_scale": self.noise_scale, "intercept": self.intercept}
