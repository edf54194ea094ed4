"""Bayesian neural networks (feed-forward) and their mean-field Gaussian variational family.

:class:`BNN` is an ordinary :class:`~dpsummary.models.base.Model`: ``theta`` is the flat vector of
all weights and biases, the prior is ``N(0, prior_scale^2 I)``, and ``log_likelihood(points,
theta)`` is batched over the S rows of ``theta`` (one einsum per layer), so every generic code
path (autograd scores, ``torch.func.vmap`` over draws, NUTS through the torch log density) works on it unchanged.

Likelihoods (``likelihood=``):

* ``"bernoulli"`` — binary classification, one logit output; the target is the last column, a
  (soft) label in [0, 1] (the same convention as :class:`~dpsummary.models.glm.LogisticRegression`).
* ``"softmax"`` — K-class classification, K logits; the target is the last **K** columns, a
  probability vector (one-hot for records, soft for learned pseudopoints). This is the one
  documented extension of the protocol: :attr:`BNN.target_dim` target columns instead of one,
  reflected in :attr:`BNN.point_dim`.
* ``"gaussian"`` — regression with known noise sd ``noise_scale``; one real target column.

Layout of ``theta``: for each layer l (inputs, hidden widths..., outputs), the weight matrix
``W_l`` of shape ``(fan_in, fan_out)`` row-major, then its bias ``b_l`` (fan_out).

:class:`MeanFieldGaussian` is the variational family r(theta; psi) of the black-box coreset paper
(Manousakas, Ritter, Karaletsos 2022, Section 3.1): ``psi = (mu, rho)``, sd ``softplus(rho)``,
reparameterised draws ``mu + sd * eps`` with the standard-normal ``eps`` passed in explicitly (so
that callers own every random number and ``torch.func`` transforms stay pure).
"""

from __future__ import annotations

import math
from dataclasses import dataclass
from typing import Any, ClassVar

import torch

from .base import DTYPE, Model

LIKELIHOODS = ("bernoulli", "softmax", "gaussian")
ACTIVATIONS = ("relu", "tanh")


class BNN(Model):
    """Feed-forward Bayesian neural network with a Gaussian prior on every weight and bias.

    ``widths`` are the hidden layer widths (``()`` gives a GLM: logistic regression for
    ``"bernoulli"``), ``num_classes`` is used by ``"softmax"`` only (K >= 2). Defaults are small
    (one hidden layer of 4 units) so that generic code running over every registered model
    stays fast; the benchmarks pass ``widths=(100,)``.
    """

    name: ClassVar[str] = "bnn"
    has_target: ClassVar[bool] = True

    def __init__(
        self,
        num_features: int,
        *,
        prior_scale: float = 1.0,
        widths: tuple[int, ...] | list[int] = (4,),
        likelihood: str = "bernoulli",
        num_classes: int = 2,
        activation: str = "relu",
        noise_scale: float = 1.0,
    ) -> None:
        super().__init__(num_features, prior_scale=prior_scale)
        if likelihood not in LIKELIHOODS:
            raise ValueError(f"likelihood must be one of {LIKELIHOODS}")
        if activation not in ACTIVATIONS:
            raise ValueError(f"activation must be one of {ACTIVATIONS}")
        widths = tuple(int(w) for w in widths)
        if any(w < 1 for w in widths):
            raise ValueError("hidden widths must be positive")
        if likelihood == "softmax" and num_classes < 2:
            raise ValueError("softmax needs num_classes >= 2")
        if not noise_scale > 0:
            raise ValueError("noise_scale must be positive")
        self.widths = widths
        self.likelihood = likelihood
        self.num_classes = int(num_classes) if likelihood == "softmax" else (2 if likelihood == "bernoulli" else 1)
        self.activation = activation
        self.noise_scale = float(noise_scale)
        out = self.num_classes if likelihood == "softmax" else 1
        sizes = (self.num_features, *widths, out)
        self.layer_shapes: tuple[tuple[int, int], ...] = tuple(zip(sizes[:-1], sizes[1:], strict=True))

    # ---- dimensions -------------------------------------------------------------------------
    @property
    def target_dim(self) -> int:
        """Number of target columns at the end of a point (K for softmax, else 1)."""
        return self.num_classes if self.likelihood == "softmax" else 1

    @property
    def point_dim(self) -> int:
        return self.num_features + self.target_dim

    @property
    def param_dim(self) -> int:
        return sum(i * o + o for i, o in self.layer_shapes)

    def param_names(self, feature_names: list[str] | None = None) -> list[str]:
        names: list[str] = []
        for layer, (fan_in, fan_out) in enumerate(self.layer_shapes):
            names += [f"W{layer}[{i},{j}]" for i in range(fan_in) for j in range(fan_out)]
            names += [f"b{layer}[{j}]" for j in range(fan_out)]
        return names

    # ---- the network ------------------------------------------------------------------------
    def unflatten(self, theta: torch.Tensor) -> list[tuple[torch.Tensor, torch.Tensor]]:
        """Per-layer ``(W (S, fan_in, fan_out), b (S, fan_out))`` views of ``theta`` (S, d)."""
        layers = []
        offset = 0
        s = theta.shape[0]
        for fan_in, fan_out in self.layer_shapes:
            w = theta[:, offset : offset + fan_in * fan_out].reshape(s, fan_in, fan_out)
            offset += fan_in * fan_out
            b = theta[:, offset : offset + fan_out]
            offset += fan_out
            layers.append((w, b))
        return layers

    def forward(self, features: torch.Tensor, theta: torch.Tensor) -> torch.Tensor:
        """Network outputs (logits or regression means), shape ``(S, n, out)``."""
        act = torch.relu if self.activation == "relu" else torch.tanh
        layers = self.unflatten(theta)
        w, b = layers[0]
        h = torch.einsum("ni,sio->sno", features, w) + b[:, None, :]
        for w, b in layers[1:]:
            h = torch.baddbmm(b[:, None, :], act(h), w)
        return h

    def log_likelihood(self, points: torch.Tensor, theta: torch.Tensor) -> torch.Tensor:
        x = points[:, : self.num_features]
        y = points[:, self.num_features :]
        f = self.forward(x, theta)  # (S, n, out)
        if self.likelihood == "bernoulli":
            logit = f[..., 0]
            ll = torch.nn.functional.logsigmoid(logit) - (1 - y[:, 0]) * logit
        elif self.likelihood == "softmax":
            ll = (y[None] * torch.log_softmax(f, -1)).sum(-1)
        else:
            z = (y[None, :, 0] - f[..., 0]) / self.noise_scale
            ll = -0.5 * z * z - math.log(self.noise_scale) - 0.5 * math.log(2 * math.pi)
        return ll.T

    def predictive_probs(self, features: torch.Tensor, theta: torch.Tensor) -> torch.Tensor:
        """Class probabilities per draw, ``(S, n, K)`` (K = 2 for Bernoulli: [p(0), p(1)])."""
        f = self.forward(features, theta)
        if self.likelihood == "bernoulli":
            p1 = torch.sigmoid(f[..., 0])
            return torch.stack([1 - p1, p1], -1)
        if self.likelihood == "softmax":
            return torch.softmax(f, -1)
        raise ValueError("predictive_probs is for classification likelihoods")

    # ---- simulation -------------------------------------------------------------------------
    def simulate(self, theta, num, generator, features=None):
        if features is None:
            features = torch.randn(num, self.num_features, generator=generator, dtype=DTYPE)
        features = features.to(DTYPE)
        f = self.forward(features, theta.reshape(1, -1))[0]
        if self.likelihood == "bernoulli":
            y = (torch.rand(num, generator=generator, dtype=DTYPE) < torch.sigmoid(f[:, 0])).to(DTYPE)[:, None]
        elif self.likelihood == "softmax":
            idx = torch.multinomial(torch.softmax(f, -1), 1, generator=generator)[:, 0]
            y = torch.nn.functional.one_hot(idx, self.num_classes).to(DTYPE)
        else:
            y = f + self.noise_scale * torch.randn(num, 1, generator=generator, dtype=DTYPE)
        return torch.cat([features, y], 1)

    def project_points(self, points: torch.Tensor) -> torch.Tensor:
        """Soft labels back onto the simplex (softmax) or into [0, 1] (Bernoulli), in place."""
        if self.likelihood == "bernoulli":
            points[:, -1].clamp_(0.0, 1.0)
        elif self.likelihood == "softmax":
            y = points[:, self.num_features :].clamp_(min=0.0)
            total = y.sum(1, keepdim=True)
            y.copy_(torch.where(total > 0, y / total.clamp(min=1e-300), torch.full_like(y, 1.0 / self.num_classes)))
        return points

    # ---- public statistic bounds (noise-aware mechanism contract) ---------------------------
    def statistic_bounds(self, theta, *, feature_norm, target_bound):
        """Bounds on one record's score norm and curvature Frobenius norm at ``theta``.

        Norm propagation through the layers (ReLU and tanh are 1-Lipschitz with |a(x)| <= |x|
        and |a'| <= 1): ``||h_l|| <= ||W_l||_2 ||h_{l-1}|| + ||b_l||``; the output residual
        ``|dl/df|`` is at most 1 (Bernoulli, labels in [0, 1]), sqrt(2) (softmax) or
        ``(target_bound + |f|_max) / noise^2`` (Gaussian); back-propagated deltas shrink by at
        most ``||W_l||_2``. The curvature bound is given for one hidden ReLU layer (second
        derivatives of the network are then the 0/1 cross terms between the two layers) and
        is refused otherwise.
        """
        layers = self.unflatten(theta.detach().reshape(1, -1))
        ops = [float(torch.linalg.matrix_norm(w[0], ord=2)) for w, _ in layers]
        bnorms = [float(b[0].norm()) for _, b in layers]
        acts = [float(feature_norm)]
        for op, bn in zip(ops[:-1], bnorms[:-1], strict=True):
            acts.append(op * acts[-1] + bn)
        f_max = ops[-1] * acts[-1] + bnorms[-1]
        if self.likelihood == "bernoulli":
            resid, curv_out = 1.0, 0.25
        elif self.likelihood == "softmax":
            resid, curv_out = math.sqrt(2.0), 1.0
        else:
            resid = (float(target_bound) + f_max) / self.noise_scale**2
            curv_out = 1.0 / self.noise_scale**2
        def jacobian_sq(top: float) -> float:
            # sum_l ||delta_l||^2 (||a_{l-1}||^2 + 1) with ||delta_L|| <= top.
            deltas = [top]
            for op in reversed(ops[1:]):
                deltas.insert(0, deltas[0] * op)
            return sum(d * d * (a * a + 1.0) for d, a in zip(deltas, acts, strict=True))

        score = math.sqrt(jacobian_sq(resid))
        if len(self.widths) != 1 or self.activation != "relu":
            raise NotImplementedError("curvature bound only for one hidden ReLU layer")
        # Hessian = J^T H_out J + sum_o r_o hess f_o. ||J^T H_out J||_F <= ||H_out||_2 ||J||_F^2
        # with ||J||_F^2 = sum_o ||grad f_o||^2; for one hidden ReLU layer hess f_o has only the
        # cross entries 1[a_j > 0] x_k and 1[a_j > 0] (twice each): ||hess f_o||_F^2 <= 2 H (R^2 + 1).
        out_dim = self.layer_shapes[-1][1]
        j_sq = out_dim * jacobian_sq(1.0)
        cross = math.sqrt(2.0 * self.widths[0] * (float(feature_norm) ** 2 + 1.0))
        curvature = curv_out * j_sq + resid * math.sqrt(out_dim) * cross
        return score, curvature

    # ---- serialisation ----------------------------------------------------------------------
    def spec(self) -> dict[str, Any]:
        return {
            **super().spec(),
            "widths": list(self.widths),
            "likelihood": self.likelihood,
            "num_classes": self.num_classes,
            "activation": self.activation,
            "noise_scale": self.noise_scale,
        }


# ---------------------------------------------------------------------------------------------
# Mean-field Gaussian variational family r(theta; psi)
# ---------------------------------------------------------------------------------------------
@dataclass(frozen=True)
class MeanFieldGaussian:
    """Functional helpers for ``r(theta; mu, rho) = N(mu, diag(softplus(rho))^2)``.

    All methods are pure functions of tensors (no state, no randomness), so they compose with
    ``torch.func.grad``/``vmap``. ``prior_scale`` is the model's isotropic prior sd (mean 0).
    """

    prior_scale: float

    @staticmethod
    def sd(rho: torch.Tensor) -> torch.Tensor:
        return torch.nn.functional.softplus(rho)

    @staticmethod
    def rho_for(sd: float) -> float:
        """Inverse softplus: the rho whose sd is ``sd``."""
        return sd + math.log(-math.expm1(-sd))

    @staticmethod
    def sample(mu: torch.Tensor, rho: torch.Tensor, eps: torch.Tensor) -> torch.Tensor:
        """Reparameterised draws ``(S, d)`` from standard-normal ``eps`` (S, d)."""
        return mu + MeanFieldGaussian.sd(rho) * eps

    @staticmethod
    def log_prob(mu: torch.Tensor, rho: torch.Tensor, theta: torch.Tensor) -> torch.Tensor:
        """``log r(theta)`` per row, shape ``(S,)``."""
        sd = MeanFieldGaussian.sd(rho)
        z = (theta - mu) / sd
        return (-0.5 * z * z - torch.log(sd)).sum(-1) - 0.5 * mu.shape[-1] * math.log(2 * math.pi)

    def kl_to_prior(self, mu: torch.Tensor, rho: torch.Tensor) -> torch.Tensor:
        """Closed-form ``KL(r || N(0, prior_scale^2 I))``."""
        var = MeanFieldGaussian.sd(rho) ** 2
        s2 = self.prior_scale**2
        return 0.5 * ((var + mu * mu) / s2 - 1.0 - torch.log(var / s2)).sum()

    @staticmethod
    def init(model: BNN | Model, generator: torch.Generator, *, init_sd: float = 1e-3, dtype: torch.dtype = DTYPE,
             scheme: str = "he") -> tuple[torch.Tensor, torch.Tensor]:
        """Initial ``(mu, rho)``: random means per layer for a BNN (a zero mean is a saddle of
        every network), zero means otherwise; every sd equal to ``init_sd``.

        ``scheme="he"`` (default): weights ``N(0, 2/fan_in)`` (ReLU; ``1/fan_in`` for tanh),
        biases 0. ``scheme="uniform"``: weights and biases ``U(-1/sqrt(fan_in), 1/sqrt(fan_in))``,
        torch.nn.Linear's default and hence the authors' code's (``VILinear`` resets through it).
        """
        if scheme not in ("he", "uniform"):
            raise ValueError("scheme must be 'he' or 'uniform'")
        d = model.param_dim
        if isinstance(model, BNN):
            parts = []
            for fan_in, fan_out in model.layer_shapes:
                if scheme == "uniform":
                    bound = 1.0 / math.sqrt(fan_in)
                    parts.append((2 * torch.rand(fan_in * fan_out, generator=generator, dtype=dtype) - 1) * bound)
                    parts.append((2 * torch.rand(fan_out, generator=generator, dtype=dtype) - 1) * bound)
                    continue
                scale = math.sqrt(2.0 / fan_in) if model.activation == "relu" else math.sqrt(1.0 / fan_in)
                parts.append(scale * torch.randn(fan_in * fan_out, generator=generator, dtype=dtype))
                parts.append(torch.zeros(fan_out, dtype=dtype))
            mu = torch.cat(parts)
        else:
            mu = torch.zeros(d, dtype=dtype)
        rho = torch.full((d,), MeanFieldGaussian.rho_for(init_sd), dtype=dtype)
        return mu, rho
