"""A Gaussian mixture as a :class:`~dpsummary.models.base.Model` (issue 17), so that the
model-free constructors (``lightweight``, ``uniform``) run on mixtures through
:func:`dpsummary.constructors.fit`, exactly as on the GLMs.

Points are feature vectors in model space with no target. ``theta`` is a flat vector per draw:
``K`` weight logits, ``K x D`` means, and for each component the ``D(D+1)/2`` entries of a lower
triangular ``L_k`` (row-major lower triangle, diagonal stored as its logarithm) with precision
``Lambda_k = L_k L_k^T``. :meth:`GaussianMixture.log_likelihood` is the exact mixture density
``log sum_k softmax(logits)_k N(x; mu_k, Lambda_k^-1)``.

Inference for mixtures is NOT done on this flat parametrisation: the Bayesian model (Dirichlet
or stick-breaking weights, Normal-Wishart components) and its weighted CAVI/SVI live in
:mod:`dpsummary.mixtures.vi`. The base class's Gaussian prior on ``theta`` exists only to
satisfy the protocol; the posterior over ``theta`` is multimodal (label switching), so
constructors that need Laplace approximations or posterior draws of ``theta`` (GIGA, Sparse VI,
PSVI, DP-PSVI, the noise-aware mechanism) do not apply: the model declares
``parameter_draws = False`` and :func:`dpsummary.constructors.applies` filters on it.
"""

from __future__ import annotations

import math
from typing import Any, ClassVar, Literal

import torch

from .base import DTYPE, Model

Process = Literal["dirichlet_distribution", "dirichlet_process"]


class GaussianMixture(Model):
    """Finite Bayesian Gaussian mixture (registry name ``gmm``: Dirichlet prior on the weights);
    :class:`DPGaussianMixture` is the truncated Dirichlet-process one (``dpgmm``)."""

    name: ClassVar[str] = "gmm"
    has_target: ClassVar[bool] = False
    #: Capability: the posterior over the flat ``theta`` cannot be approximated by Gaussian draws
    #: (label switching), so only model-free constructors apply (module docstring).
    parameter_draws: ClassVar[bool] = False

    #: The weight prior of this registry name (``spec()`` records it, ``from_spec`` checks it).
    default_process: ClassVar[Process] = "dirichlet_distribution"

    def __init__(self, num_features: int, *, prior_scale: float = 1.0, n_components: int = 10,
                 process: Process | None = None) -> None:
        super().__init__(num_features, prior_scale=prior_scale)
        if n_components < 1:
            raise ValueError("n_components must be at least 1")
        process = self.default_process if process is None else process
        if process != self.default_process:
            raise ValueError(f"model {self.name!r} has weight process {self.default_process!r}, not {process!r}")
        self.n_components = int(n_components)
        self.process: Process = process

    @property
    def _tri(self) -> int:
        d = self.num_features
        return d * (d + 1) // 2

    @property
    def param_dim(self) -> int:
        k, d = self.n_components, self.num_features
        return k * (1 + d + self._tri)

    def unpack(self, theta: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor, torch.Tensor]:
        """``theta`` (S, param_dim) -> log weights (S, K), means (S, K, D), precision Cholesky
        factors L (S, K, D, D) with positive diagonal."""
        s = theta.shape[0]
        k, d = self.n_components, self.num_features
        logits = theta[:, :k]
        means = theta[:, k:k + k * d].reshape(s, k, d)
        raw = theta[:, k + k * d:].reshape(s, k, self._tri)
        rows, cols = torch.tril_indices(d, d)
        diag = rows == cols
        entries = torch.where(diag, raw.exp(), raw)
        chol = torch.zeros(s, k, d, d, dtype=theta.dtype)
        chol = chol.index_put((torch.arange(s)[:, None, None], torch.arange(k)[None, :, None], rows[None, None, :],
                               cols[None, None, :]), entries)
        return torch.log_softmax(logits, dim=1), means, chol

    def log_likelihood(self, points: torch.Tensor, theta: torch.Tensor) -> torch.Tensor:
        log_w, means, chol = self.unpack(theta)
        d = self.num_features
        diff = points[None, None, :, :] - means[:, :, None, :]           # (S, K, n, D)
        z = diff @ chol                                                  # L^T (x - mu), row form
        log_det = torch.diagonal(chol, dim1=-2, dim2=-1).log().sum(-1)   # (S, K): 0.5 log|Lambda|
        comp = log_w[:, :, None] + log_det[:, :, None] - 0.5 * (z * z).sum(-1) - 0.5 * d * math.log(2 * math.pi)
        return torch.logsumexp(comp, dim=1).T                           # (n, S)

    def simulate(self, theta: torch.Tensor, num: int, generator: torch.Generator,
                 features: torch.Tensor | None = None) -> torch.Tensor:
        """``num`` draws from the mixture at ``theta`` (``features`` is ignored: no target)."""
        log_w, means, chol = self.unpack(theta.reshape(1, -1))
        comp = torch.multinomial(log_w[0].exp(), num, replacement=True, generator=generator)
        eps = torch.randn(num, self.num_features, generator=generator, dtype=DTYPE)
        # x = mu + L^-T eps has covariance (L L^T)^-1 = Lambda^-1.
        step = torch.linalg.solve_triangular(chol[0][comp].transpose(-1, -2), eps[:, :, None], upper=True)[:, :, 0]
        return means[0][comp] + step

    def spec(self) -> dict[str, Any]:
        return {**super().spec(), "n_components": self.n_components, "process": self.process}


class DPGaussianMixture(GaussianMixture):
    """Truncated Dirichlet-process Gaussian mixture (stick-breaking weights; ``n_components`` is
    the truncation T). Same likelihood as :class:`GaussianMixture`."""

    name: ClassVar[str] = "dpgmm"
    default_process: ClassVar[Process] = "dirichlet_process"


def mixture_model(num_features: int, *, n_components: int = 10, process: Process = "dirichlet_process",
                  prior_scale: float = 1.0) -> GaussianMixture:
    """The registered mixture model of a weight process (``gmm`` or ``dpgmm``)."""
    cls = DPGaussianMixture if process == "dirichlet_process" else GaussianMixture
    return cls(num_features, n_components=n_components, prior_scale=prior_scale)
