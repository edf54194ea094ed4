"""Weighted pseudopoints whose posterior is a given Gaussian (post-processing of a DP target).

The noise-aware release (:mod:`dpsummary.noise_aware`) ends with a Gaussian ``N(m, S)``. Analysts
load releases into samplers as weighted pseudo-data (``prior x prod_j p(u_j | theta)^w_j``), so the
Gaussian is turned into ``size`` weighted pseudopoints whose weighted posterior matches it.

For a GLM the points are first constructed in closed form (:func:`exact_glm_pseudopoints`; the
front door :func:`pseudocoreset_of_gaussian` falls back to the fit below only where that does not
apply or is farther from the target, and says which).

The fit needs no data: at ``theta = m`` the pseudopoints' weighted log-likelihood must have
gradient ``P (m - mu0)`` (so ``m`` is the mode with the prior) and curvature ``S^-1 - P``. The loss
is the symmetric KL between ``N(m, S)`` and the Gaussian of one Newton step of the weighted
posterior from ``m`` (mode and curvature of the quadratic expansion at ``m``), minimised by Adam
over the points (features and soft targets) and log-weights. Points start at public draws
(features from the schema, targets from the model at ``m``), so the release looks like data.

Privacy: a function of the DP target and public values only (costs nothing). It is a
constructor in the sense of :class:`dpsummary.constructors.base.Constructor` whose "data" is the
target Gaussian.
"""

from __future__ import annotations

import math
from dataclasses import dataclass
from typing import Any, Protocol

import numpy as np
import torch

from ..gaussian import DTYPE, GaussianPosterior
from ..models import GLM, LogisticRegression, Model, PoissonRegression
from ..optim import Adam

#: Adam learning rate and the most steps a fit may take. The fit stops early once every
#: target's symmetric KL is at most :data:`DEFAULT_TOLERANCE` nats (checked every
#: :data:`CHECK_EVERY` steps), or when its best loss improved by less than
#: :data:`MIN_IMPROVEMENT` (relative) over the last :data:`PATIENCE` steps. The stopping rule
#: reads only the loss, a function of the (DP) target and public values: post-processing, free.
#: Measured (issue 27 review, adult's zero-configuration model space at epsilon 1, d = 49,
#: M = 50): a fixed 400 steps left 107 nats (the pseudocoreset was narrower than its noise-aware
#: target, coverage 0.92 against 0.98); 1,500 steps 13.5; 4,000 steps 1.06.
DEFAULT_STEPS = 6000
DEFAULT_LR = 0.05
DEFAULT_TOLERANCE = 0.05
CHECK_EVERY = 100
PATIENCE = 1000
MIN_IMPROVEMENT = 0.01


@dataclass(frozen=True)
class MatchState:
    features: torch.Tensor  # (size, F)
    target_param: torch.Tensor  # (size,) unconstrained target (if the model has one)
    log_weights: torch.Tensor  # (size,)
    step: int
    opt_state: dict


def _targets(model: Model, raw: torch.Tensor) -> torch.Tensor:
    name = model.name
    if name == "logistic":
        return torch.sigmoid(raw)
    if name == "poisson":
        return torch.nn.functional.softplus(raw)
    return raw


def _inverse_targets(model: Model, y: torch.Tensor) -> torch.Tensor:
    name = model.name
    if name == "logistic":
        y = y.clamp(1e-3, 1 - 1e-3)
        return torch.log(y) - torch.log1p(-y)
    if name == "poisson":
        y = y.clamp(min=1e-3)
        return y + torch.log(-torch.expm1(-y))
    return y


def points_of(model: Model, features: torch.Tensor, target_param: torch.Tensor) -> torch.Tensor:
    if not model.has_target:
        return features
    return torch.cat([features, _targets(model, target_param)[..., None]], -1)


def newton_gaussian(model: Model, points: torch.Tensor, weights: torch.Tensor, at: torch.Tensor
                    ) -> tuple[torch.Tensor, torch.Tensor]:
    """(mean, precision) of one Newton step of the weighted posterior from ``at``; differentiable
    in ``points`` and ``weights`` (uses the model's autograd score and curvature).

    Batched: ``points`` ``(B, n, point_dim)``, ``weights`` ``(B, n)`` and ``at`` ``(B, d)`` give
    ``(B, d)`` means and ``(B, d, d)`` precisions, one independent problem per row (unbatched
    shapes work as before)."""
    if points.dim() == 2:
        mean, precision = newton_gaussian(model, points[None], weights[None], at[None])
        return mean[0], precision[0]
    b, n, p = points.shape
    d = model.param_dim
    prior_prec = torch.eye(d, dtype=DTYPE) / model.prior_scale**2
    if isinstance(model, GLM):
        # Closed form through the linear predictor, kept on the autograd graph of the points.
        z = model.design(points.reshape(b * n, p)).reshape(b, n, d)
        eta = (z @ at[..., None])[..., 0]
        d1, d2 = model.eta_derivatives_graph(points[..., -1], eta)
        # Batched matrix products, not einsum: torch.einsum plans its contraction on every call,
        # which is most of the cost of these small products.
        grad = (z.transpose(1, 2) @ (weights * d1)[..., None])[..., 0]
        precision = (z * (weights * -d2)[..., None]).transpose(1, 2) @ z
    else:
        # Closed forms (linear, Gaussian mean) keep the points on the graph; the base class's
        # torch.func default does too for any other model.
        grad = torch.stack([weights[i] @ model.record_scores(points[i], at[i]) for i in range(b)])
        precision = torch.stack([torch.einsum("j,jab->ab", weights[i], model.record_curvatures(points[i], at[i]))
                                 for i in range(b)])
    grad = grad - (at - model.prior_mean) @ prior_prec
    precision = precision + prior_prec
    precision = 0.5 * (precision + precision.transpose(-1, -2))
    mean = at + torch.linalg.solve(precision, grad)
    return mean, precision


def nonnegative_kl(kl: float) -> float:
    """A symmetric KL as reported: never below 0. The exact construction matches the target to
    rounding, where the trace terms' difference from ``2 d`` can come out a few ulps negative
    (a release printed "symmetric KL -5.68e-14 nats", issue 49); a divergence is >= 0."""
    return max(kl, 0.0)


def _sym_kl(m1: torch.Tensor, prec1: torch.Tensor, target_mean: torch.Tensor, target_cov: torch.Tensor,
            target_prec: torch.Tensor) -> torch.Tensor:
    """Symmetric KL between ``N(m1, prec1^-1)`` and the targets, batched over the leading axis."""
    d = m1.shape[-1]
    cov1 = torch.linalg.inv(prec1)
    diff = m1 - target_mean
    # KL(1||t) + KL(t||1): log-determinants cancel.
    # tr(A B) for symmetric B is the sum of the elementwise product.
    quad = (diff * ((target_prec + prec1) @ diff[..., None])[..., 0]).sum(-1)
    return 0.5 * ((target_prec * cov1).sum((-2, -1)) + (prec1 * target_cov).sum((-2, -1)) - 2 * d + quad)


def _initial_parameters(model: Model, target: GaussianPosterior, size: int, features: torch.Tensor,
                        generator: torch.Generator) -> tuple[torch.Tensor, torch.Tensor, torch.Tensor]:
    """Features, unconstrained soft targets and log-weights to start from (see the module doc)."""
    m = target.mean.detach()
    target_prec = torch.cholesky_inverse(target.scale_tril)
    feats = features.detach().to(DTYPE).clone()
    if model.has_target:
        sim = model.simulate(m, size, generator, features=feats)[:, -1]
        mid = sim if model.name != "logistic" else 0.25 + 0.5 * sim
        tparam = _inverse_targets(model, mid)
    else:
        tparam = torch.zeros(size, dtype=DTYPE)
    # Initial weights: curvature of the pseudopoints at m matched in trace to S^-1 - P.
    d = model.param_dim
    prior_prec = torch.eye(d, dtype=DTYPE) / model.prior_scale**2
    need = float(torch.trace(target_prec - prior_prec).clamp(min=1e-6))
    with torch.no_grad():
        per_point = float(torch.einsum("jaa->", model.record_curvatures(points_of(model, feats, tparam), m)).clamp(min=1e-9))
    log_w = torch.full((size,), torch.log(torch.tensor(need / per_point)).item(), dtype=DTYPE)
    return feats, tparam, log_w


class _Problem(Protocol):
    """One batched matching problem as :func:`match_gaussians` drives it: the current loss of
    every target, snapshots of a target's parameters, and one Adam step on the live targets."""

    def losses(self) -> list[float]: ...

    def snapshot(self, i: int) -> Any: ...

    def as_torch(self, snap: Any) -> tuple[torch.Tensor, torch.Tensor, torch.Tensor]: ...

    def descend(self, live: list[bool]) -> None: ...


class _AutogradProblem:
    """Any model: the loss of :func:`newton_gaussian` and :func:`_sym_kl` through torch autograd,
    stepped by :class:`dpsummary.optim.Adam`."""

    def __init__(self, model: Model, starts: list[tuple[torch.Tensor, torch.Tensor, torch.Tensor]], m: torch.Tensor,
                 target_cov: torch.Tensor, target_prec: torch.Tensor, lr: float) -> None:
        self.model, self.m, self.target_cov, self.target_prec = model, m, target_cov, target_prec
        self.feats = torch.stack([s[0] for s in starts]).requires_grad_(True)
        self.tparam = torch.stack([s[1] for s in starts]).requires_grad_(True)
        self.log_w = torch.stack([s[2] for s in starts]).requires_grad_(True)
        self.opt = Adam([self.feats, self.tparam, self.log_w], lr=lr)
        self._losses: torch.Tensor | None = None

    def losses(self) -> list[float]:
        self.opt.zero_grad()
        pts = points_of(self.model, self.feats, self.tparam)
        mean, prec = newton_gaussian(self.model, pts, torch.exp(self.log_w), self.m)
        self._losses = _sym_kl(mean, prec, self.m, self.target_cov, self.target_prec)
        return [float(v) for v in self._losses.detach().tolist()]

    def snapshot(self, i: int) -> Any:
        return self.feats[i].detach().clone(), self.tparam[i].detach().clone(), self.log_w[i].detach().clone()

    def as_torch(self, snap: Any) -> tuple[torch.Tensor, torch.Tensor, torch.Tensor]:
        return snap

    def descend(self, live: list[bool]) -> None:
        assert self._losses is not None
        mask = torch.tensor(live)
        torch.where(mask, self._losses, torch.zeros_like(self._losses)).sum().backward()
        self.opt.step()


def _sigmoid(x: np.ndarray) -> np.ndarray:
    """``1 / (1 + exp(-x))`` without overflow."""
    e = np.exp(-np.abs(x))
    return np.where(x >= 0, 1.0 / (1.0 + e), e / (1.0 + e))


#: Models whose matching loss has the closed-form gradient of :class:`_GLMProblem` (exact
#: classes: a subclass may change the likelihood).
_CLOSED_FORM = (LogisticRegression, PoissonRegression)
#: torch.nn.functional.softplus's default threshold (above it, softplus(t) = t).
_SOFTPLUS_THRESHOLD = 20.0


class _GLMProblem:
    """Logistic and Poisson regression: the same loss as :class:`_AutogradProblem` (one Newton
    step of the weighted pseudopoints' posterior from the target mean, symmetric KL to the
    target), with its gradient in closed form, in numpy float64, stepped by Adam with torch's
    arithmetic (:meth:`descend`).

    Why: the fit takes hundreds of steps on arrays of a few hundred numbers, where each torch
    operation and the autograd graph cost more than the arithmetic (0.8 ms a step against about
    0.1 ms here; issue 29). Same objective, same optimiser, same stopping rule; trajectories
    agree with autograd's to rounding (tests/constructors/test_gaussian_target.py checks the
    gradient against autograd and the fits against each other).

    Gradient (per target; ``A`` the symmetrised precision, ``g`` the gradient at ``m``, ``delta =
    A^-1 g``, loss ``L = (tr(T A^-1) + tr(A S) - 2d + delta' (T + A) delta) / 2`` with ``T``, ``S``
    the target's precision and covariance): ``dL/dg = u = A^-1 (T + A) delta`` and ``dL/dA = G =
    sym(-A^-1 T A^-1 / 2 + S / 2 + delta delta' / 2 - u delta')``. With ``A = sum_j w_j c_j z_j z_j'
    + P`` and ``g = sum_j w_j r_j z_j - P (m - mu0)`` (``z_j = [1, x_j]``, ``eta_j = z_j m``, residual
    ``r_j = y_j - mu(eta_j)``, curvature weight ``c_j = mu'(eta_j)``): ``dL/dw_j = p_j r_j + q_j c_j``
    (``p_j = z_j u``, ``q_j = z_j' G z_j``), ``dL/dy_j = w_j p_j`` and ``dL/dz_j = w_j r_j u + 2 w_j c_j
    G z_j + w_j (p_j r'_j + q_j c'_j) m`` (derivatives in ``eta``)."""

    def __init__(self, model: Model, starts: list[tuple[torch.Tensor, torch.Tensor, torch.Tensor]], m: torch.Tensor,
                 target_cov: torch.Tensor, target_prec: torch.Tensor, lr: float) -> None:
        assert isinstance(model, GLM)
        self.logistic = model.name == "logistic"
        self.intercept = model.intercept
        self.params = [np.stack([s[k].detach().numpy() for s in starts]).astype(np.float64) for k in range(3)]
        self.m = m.detach().numpy().astype(np.float64)
        self.target_cov = target_cov.detach().numpy().astype(np.float64)
        self.target_prec = target_prec.detach().numpy().astype(np.float64)
        d = self.m.shape[1]
        self.prior_prec = 1.0 / model.prior_scale**2  # the prior precision is this times I
        self.prior_pull = (self.m - model.prior_mean.detach().numpy()[None, :]) * self.prior_prec
        self.eye = np.eye(d)
        self.lr, self.beta1, self.beta2, self.eps = float(lr), 0.9, 0.999, 1e-8
        self.moments = [(np.zeros_like(p), np.zeros_like(p)) for p in self.params]
        self.count = 0
        self._grads: list[np.ndarray] | None = None

    def losses(self) -> list[float]:
        feats, tparam, log_w = self.params
        m = self.m
        with np.errstate(over="ignore", invalid="ignore", divide="ignore"):
            if self.logistic:
                y = _sigmoid(tparam)
                dy = y * (1.0 - y)
            else:  # softplus, as torch.nn.functional.softplus (beta 1, threshold 20)
                y = np.where(tparam > _SOFTPLUS_THRESHOLD, tparam,
                             np.log1p(np.exp(np.minimum(tparam, _SOFTPLUS_THRESHOLD))))
                dy = np.where(tparam > _SOFTPLUS_THRESHOLD, 1.0, _sigmoid(tparam))
            z = np.concatenate([np.ones(feats.shape[:2] + (1,)), feats], 2) if self.intercept else feats
            eta = (z @ m[:, :, None])[..., 0]
            if self.logistic:
                s, s_neg = _sigmoid(eta), _sigmoid(-eta)
                r, c = y - s, s * s_neg
                dr, dc = -c, c * (s_neg - s)
            else:
                rate = np.exp(eta)
                r, c, dr, dc = y - rate, rate, -rate, rate
            w = np.exp(log_w)
            wr, wc = w * r, w * c
            zt = z.transpose(0, 2, 1)
            g = (zt @ wr[..., None])[..., 0] - self.prior_pull
            a = (zt * wc[:, None, :]) @ z + self.eye * self.prior_prec
            a = 0.5 * (a + a.transpose(0, 2, 1))
            try:
                a_inv = np.linalg.inv(a)
            except np.linalg.LinAlgError:
                return [math.nan] * a.shape[0]
            mean = m + (a_inv @ g[..., None])[..., 0]
            diff = mean - m
            tp, tc = self.target_prec, self.target_cov
            b_diff = ((tp + a) @ diff[..., None])[..., 0]
            d = m.shape[1]
            losses = 0.5 * ((tp * a_inv).sum((1, 2)) + (a * tc).sum((1, 2)) - 2 * d + (diff * b_diff).sum(1))
            u = (a_inv @ b_diff[..., None])[..., 0]
            grad_a = (-0.5 * a_inv @ tp @ a_inv + 0.5 * tc + 0.5 * diff[:, :, None] * diff[:, None, :]
                      - u[:, :, None] * diff[:, None, :])
            grad_a = 0.5 * (grad_a + grad_a.transpose(0, 2, 1))
            p = (z @ u[..., None])[..., 0]
            zg = z @ grad_a
            q = (zg * z).sum(2)
            grad_eta = w * (p * dr + q * dc)
            grad_z = wr[..., None] * u[:, None, :] + 2.0 * wc[..., None] * zg + grad_eta[..., None] * m[:, None, :]
            self._grads = [grad_z[..., 1:] if self.intercept else grad_z, w * p * dy, w * (p * r + q * c)]
        return [float(v) for v in losses]

    def snapshot(self, i: int) -> Any:
        return self.params[0][i].copy(), self.params[1][i].copy(), self.params[2][i].copy()

    def as_torch(self, snap: Any) -> tuple[torch.Tensor, torch.Tensor, torch.Tensor]:
        f, t, lw = snap
        return torch.from_numpy(f), torch.from_numpy(t), torch.from_numpy(lw)

    def descend(self, live: list[bool]) -> None:
        """One Adam step, torch's arithmetic (``torch.optim.adam``, single-tensor path, no weight
        decay); finished targets get a zero gradient, as their masked loss gives in autograd."""
        assert self._grads is not None
        keep = np.asarray(live, dtype=bool)
        self.count += 1
        bias1 = 1.0 - self.beta1**self.count
        bias2_sqrt = (1.0 - self.beta2**self.count) ** 0.5
        step_size = self.lr / bias1
        for param, grad, (avg, avg_sq) in zip(self.params, self._grads, self.moments, strict=True):
            grad = np.where(keep.reshape((-1,) + (1,) * (grad.ndim - 1)), grad, 0.0)
            avg += (1.0 - self.beta1) * (grad - avg)
            avg_sq *= self.beta2
            avg_sq += (1.0 - self.beta2) * grad * grad
            param -= step_size * avg / (np.sqrt(avg_sq) / bias2_sqrt + self.eps)


#: Symmetric KL (nats) above which a matched pseudocoreset is reported as a poor match (every
#: release that matches one also carries its Gaussian). Shared by the noise-aware mechanism and
#: DP-PSVI's bootstrap.
MATCH_KL_WARNING = 50.0


@dataclass(frozen=True)
class ExactMatch:
    """A pseudocoreset constructed in closed form (:func:`exact_glm_pseudopoints`): its points
    ``(size, point_dim)``, weights ``(size,)`` and the symmetric KL (nats) of its one-Newton-step
    Gaussian to the target (above 0 only where the target is wider than the prior,
    :func:`directions_wider_than_prior`, or a soft label had to be clamped)."""

    points: torch.Tensor
    weights: torch.Tensor
    kl: float


def exact_glm_pseudopoints(model: GLM, target: GaussianPosterior, *, size: int, generator: torch.Generator
                           ) -> ExactMatch | None:
    """Weighted pseudopoints of a GLM whose weighted posterior has mode ``m`` and curvature
    ``S^-1`` at it exactly, built in closed form (no optimisation), or None when the construction
    does not apply (fewer points than parameters, or an intercept direction the target does not
    inform). Post-processing of the target: costs no privacy.

    Why it exists: the Adam fit of :func:`match_gaussians` is a non-convex optimisation that can
    stall far from its target (measured on the calibration suite: 75 of 939 releases above 1 nat,
    up to 260 nats on adult at epsilon 3; on the strongly correlated simulation the pseudocoreset
    showed wrong-sign effects its Gaussian did not; benchmarks/notebook/noise_aware_variants.md).
    A GLM's curvature weight ``c(eta) = -d^2 log p / d eta^2`` does not depend on the target and
    its score is affine in it, so both conditions can be met directly:

    1. **Curvature.** Write ``K = S^-1 - P`` (the precision the pseudodata must carry; its
       negative part, where the target is wider than the prior, is dropped: no positive weights
       can widen a posterior beyond its prior) as ``K = sum_j k_j k_j^T`` with
       ``k_j = K^{1/2} q_j`` for a tight frame ``q_1..q_M`` of R^d (``Q Q^T = I``). With an
       intercept the frame is chosen so every ``k_j`` has the same first entry ``sqrt(K_00 / M)``
       (``q_j``'s component along ``K^{1/2} e_0`` is ``1 / sqrt(M)``; the rest is a random
       orthonormal frame orthogonal to the all-ones vector), so the design rows
       ``z_j = k_j / k_j[0]`` start with 1 and their features have the target's curvature-weighted
       mean and spread (they look like the data the target summarises). The weights
       ``w_j = (K_00 / M) / c(z_j^T m)`` then give ``sum_j w_j c_j z_j z_j^T = K``.
    2. **Mode.** The weighted score at ``m`` must cancel the prior's pull, ``sum_j w_j d1_j z_j =
       P (m - mu0)``; with ``w_j d1_j = (K_00 / M) z_j^T beta`` this is ``K beta = P (m - mu0)``,
       and each soft target solves its affine score equation (logistic: ``y_j = s_j +
       c_j z_j^T beta``; Poisson: ``y_j = e^eta_j (1 + z_j^T beta)``).

    The result is checked, not assumed: its one-Newton-step Gaussian is compared with the target
    (symmetric KL, as the Adam fit is judged), after the model's projection of the points (soft
    labels clamped to their range), so a construction that needed an out-of-range label shows
    it in the KL."""
    d = model.param_dim
    f = model.num_features
    if size < d:
        return None
    m = target.mean.detach().to(DTYPE)
    prior_prec = torch.eye(d, dtype=DTYPE) / model.prior_scale**2
    target_prec = torch.cholesky_inverse(target.scale_tril.detach().to(DTYPE))
    excess = 0.5 * (target_prec + target_prec.T) - prior_prec
    lam, vecs = torch.linalg.eigh(excess)
    root = (vecs * lam.clamp(min=0).sqrt()) @ vecs.T  # symmetric K^{1/2}
    # A random orthogonal M x M matrix whose first column is the all-ones direction (public
    # randomness: the generator is the release's non-private one).
    basis = torch.randn(size, size, generator=generator, dtype=DTYPE)
    basis[:, 0] = 1.0
    ortho, _ = torch.linalg.qr(basis)
    if model.intercept:
        r = root[:, 0]
        k00 = float(r @ r)
        if not k00 > 1e-12 * max(float(lam.max()), 1e-300):
            return None
        r_hat = r / math.sqrt(k00)
        # Orthonormal basis of the complement of r_hat.
        full, _ = torch.linalg.qr(torch.cat([r_hat[:, None], torch.eye(d, dtype=DTYPE)], 1))
        comp = full[:, 1:d]
        frame = r_hat[:, None] * (1.0 / math.sqrt(size)) + comp @ ortho[:, 1:d].T  # (d, M), Q Q^T = I
        k = root @ frame
        design = k / k[0:1, :]
        c_target = torch.full((size,), k00 / size, dtype=DTYPE)
    else:
        frame = ortho[:, :d].T
        k = root @ frame
        norms = k.norm(dim=0)
        if not bool((norms > 0).all()):
            return None
        scale = norms / math.sqrt(max(f, 1))
        design = k / scale
        c_target = scale**2
    design = design.T  # (M, d)
    eta = design @ m
    y0 = torch.zeros(size, dtype=DTYPE)
    d1_at0, d2 = model.eta_derivatives(y0, eta)
    d1_at1, _ = model.eta_derivatives(torch.ones(size, dtype=DTYPE), eta)
    curvature = -d2
    if not bool((curvature > 0).all()):
        return None
    weights = c_target / curvature
    beta = torch.linalg.pinv(root @ root, hermitian=True) @ (prior_prec @ (m - model.prior_mean.to(DTYPE)))
    score = c_target * (design @ beta) / weights  # the per-point d1 the mode condition needs
    y = (score - d1_at0) / (d1_at1 - d1_at0)
    features = design[:, 1:] if model.intercept else design
    points = model.project_points(torch.cat([features, y[:, None]], 1).clone())
    if not (bool(torch.isfinite(points).all()) and bool(torch.isfinite(weights).all())):
        return None
    mean, prec = newton_gaussian(model, points, weights, m)
    kl = float(_sym_kl(mean, prec, m, target.cov.detach().to(DTYPE), target_prec))
    if not math.isfinite(kl):
        return None
    return ExactMatch(points, weights, nonnegative_kl(kl))


def match_gaussian(
    model: Model,
    target: GaussianPosterior,
    *,
    size: int,
    initial_features: torch.Tensor,
    generator: torch.Generator,
    steps: int = DEFAULT_STEPS,
    lr: float = DEFAULT_LR,
    tolerance: float = DEFAULT_TOLERANCE,
) -> tuple[torch.Tensor, torch.Tensor, float]:
    """Pseudopoints ``(size, point_dim)``, weights ``(size,)`` and the final symmetric KL (nats)
    between ``target`` and the one-Newton-step Gaussian of the weighted pseudopoints.

    ``initial_features`` ``(size, num_features)`` are public draws (the schema's feature
    sampler); ``generator`` drives only the initial soft targets' draws. At most ``steps`` Adam
    steps; stops once the loss is at most ``tolerance`` nats or stalls (module constants)."""
    return match_gaussians(model, [target], size=size, initial_features=[initial_features], generator=generator,
                           steps=steps, lr=lr, tolerance=tolerance)[0]


def directions_wider_than_prior(model: Model, target: GaussianPosterior) -> int:
    """How many directions the target is wider in than the model's prior (negative eigenvalues
    of ``S^-1 - P`` beyond rounding). A weighted likelihood with positive weights only adds
    precision to the prior, so no pseudocoreset's posterior can follow the target there."""
    d = model.param_dim
    prior_prec = torch.eye(d, dtype=DTYPE) / model.prior_scale**2
    target_prec = torch.cholesky_inverse(target.scale_tril.detach().to(DTYPE))
    lam = torch.linalg.eigvalsh(0.5 * (target_prec + target_prec.T) - prior_prec)
    return int((lam < -1e-9 * max(float(lam.abs().max()), 1.0 / model.prior_scale**2)).sum())


#: How :func:`pseudocoreset_of_gaussian` built its points (artifacts' notes name it).
EXACT = "closed form"
FITTED = "Adam fit"


def pseudocoreset_of_gaussian(
    model: Model,
    target: GaussianPosterior,
    *,
    size: int,
    initial_features: torch.Tensor,
    generator: torch.Generator,
    tolerance: float = DEFAULT_TOLERANCE,
) -> tuple[torch.Tensor, torch.Tensor, float, str]:
    """Pseudopoints, weights, symmetric KL (nats) and how they were built (:data:`EXACT` or
    :data:`FITTED`) for a target Gaussian: for a GLM the closed-form construction
    (:func:`exact_glm_pseudopoints`) when it applies and is within ``tolerance``; otherwise the
    Adam fit (:func:`match_gaussian`), and of the two the one nearer the target. A rule on the
    (DP) target and public values only: post-processing, free."""
    exact = exact_glm_pseudopoints(model, target, size=size, generator=generator) if isinstance(model, GLM) else None
    if exact is not None and exact.kl <= tolerance:
        return exact.points, exact.weights, exact.kl, EXACT
    points, weights, loss = match_gaussian(model, target, size=size, initial_features=initial_features,
                                           generator=generator, tolerance=tolerance)
    if exact is not None and exact.kl < loss:
        return exact.points, exact.weights, exact.kl, EXACT
    return points, weights, loss, FITTED


def match_gaussians(
    model: Model,
    targets: list[GaussianPosterior],
    *,
    size: int,
    initial_features: list[torch.Tensor],
    generator: torch.Generator,
    steps: int = DEFAULT_STEPS,
    lr: float = DEFAULT_LR,
    tolerance: float = DEFAULT_TOLERANCE,
) -> list[tuple[torch.Tensor, torch.Tensor, float]]:
    """:func:`match_gaussian` for several targets at once, one result per target.

    The problems are independent and fitted in ONE batched optimisation (issue 15: the per-step
    cost here is the overhead of a few dozen small tensor operations, so two targets cost about
    what one does). Adam acts elementwise and the batched loss is the sum of the per-target
    losses, whose gradients do not mix, so each target follows the same trajectory as when fitted
    alone (up to floating-point summation order). A target whose loss turns non-finite keeps its
    best parameters so far and is ignored from then on, as the single fit stops there. A target
    whose best loss is at most ``tolerance``, or has stalled (improved by less than
    :data:`MIN_IMPROVEMENT` relative over :data:`PATIENCE` steps), is finished likewise; the fit
    ends when every target is finished or after ``steps`` steps."""
    if size < 1:
        raise ValueError("size must be at least 1")
    if len(targets) != len(initial_features) or not targets:
        raise ValueError("one initial feature array per target is needed")
    starts = [_initial_parameters(model, t, size, f, generator) for t, f in zip(targets, initial_features, strict=True)]
    m = torch.stack([t.mean.detach() for t in targets])
    target_cov = torch.stack([t.cov.detach() for t in targets])
    target_prec = torch.stack([torch.cholesky_inverse(t.scale_tril.detach()) for t in targets])
    target_prec = 0.5 * (target_prec + target_prec.transpose(-1, -2))
    problem: _Problem
    if type(model) in _CLOSED_FORM:
        problem = _GLMProblem(model, starts, m, target_cov, target_prec, lr)
    else:
        problem = _AutogradProblem(model, starts, m, target_cov, target_prec, lr)
    count = len(targets)
    best_loss = [float("inf")] * count
    best = [problem.snapshot(i) for i in range(count)]
    live = [True] * count
    history: list[list[float]] = []  # best losses at each check
    for step in range(steps):
        if step % CHECK_EVERY == 0:
            history.append(list(best_loss))
            back = PATIENCE // CHECK_EVERY
            for i in range(count):
                if not live[i]:
                    continue
                if best_loss[i] <= tolerance:
                    live[i] = False
                elif len(history) > back and best_loss[i] > (1.0 - MIN_IMPROVEMENT) * history[-1 - back][i]:
                    live[i] = False
            if not any(live):
                break
        values = problem.losses()
        for i, value in enumerate(values):
            if not live[i]:
                continue
            if not math.isfinite(value):
                live[i] = False
            elif value < best_loss[i]:
                best_loss[i] = value
                best[i] = problem.snapshot(i)
        if not any(live):
            break
        # Finished targets contribute nothing (their later values are never read).
        problem.descend(live)
    out = []
    for i in range(count):
        f, t, lw = problem.as_torch(best[i])
        points = model.project_points(points_of(model, f, t).detach().clone())
        out.append((points, torch.exp(lw), nonnegative_kl(best_loss[i])))
    return out
