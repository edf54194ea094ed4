"""The Gaussian posterior approximation shared by the models and the inference routines.

A leaf module (imports only torch), so :mod:`dpsummary.models` and :mod:`dpsummary.inference`
both use it without importing each other.
"""

from __future__ import annotations

import math
from dataclasses import dataclass

import torch

DTYPE = torch.float64


@dataclass(frozen=True)
class GaussianPosterior:
    """N(mean, scale_tril scale_tril^T); ``scale_tril`` is lower triangular (d, d)."""

    mean: torch.Tensor
    scale_tril: torch.Tensor

    @classmethod
    def from_precision(cls, precision: torch.Tensor, rhs: torch.Tensor) -> GaussianPosterior:
        """The Gaussian with precision P and mean P^{-1} rhs."""
        chol_p = torch.linalg.cholesky(precision)
        mean = torch.cholesky_solve(rhs[:, None], chol_p)[:, 0]
        return cls(mean=mean, scale_tril=_precision_chol_to_scale_tril(chol_p))

    @property
    def dim(self) -> int:
        return self.mean.shape[0]

    @property
    def cov(self) -> torch.Tensor:
        return self.scale_tril @ self.scale_tril.T

    def sample(self, num: int, generator: torch.Generator) -> torch.Tensor:
        eps = torch.randn(num, self.dim, generator=generator, dtype=DTYPE)
        return self.mean + eps @ self.scale_tril.T

    def log_prob(self, theta: torch.Tensor) -> torch.Tensor:
        diff = theta - self.mean
        z = torch.linalg.solve_triangular(self.scale_tril, diff.T, upper=False).T
        logdet = torch.log(torch.diagonal(self.scale_tril)).sum()
        return -0.5 * (z * z).sum(-1) - logdet - 0.5 * self.dim * math.log(2 * math.pi)


def _precision_chol_to_scale_tril(chol_p: torch.Tensor) -> torch.Tensor:
    # If P = L L^T then Sigma = L^{-T} L^{-1}; a lower-triangular factor of Sigma is obtained from
    # the Cholesky of Sigma itself (cheap at the sizes used here and numerically clean).
    eye = torch.eye(chol_p.shape[0], dtype=chol_p.dtype)
    linv = torch.linalg.solve_triangular(chol_p, eye, upper=False)
    cov = linv.T @ linv
    return torch.linalg.cholesky(0.5 * (cov + cov.T))
