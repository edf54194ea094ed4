"""The black-box coreset objective and its differentiable inner VI loop (Manousakas, Ritter and
Karaletsos 2022, Sections 3.1 and 3.4).

Notation (paper -> code): pseudopoints ``(u, z)`` -> ``points`` (features, then soft-label
columns), weights ``v`` -> ``weights``, variational parameters ``psi`` -> ``(mu, rho)`` of
:class:`dpsummary.models.bnn.MeanFieldGaussian`, Monte Carlo draws ``theta_k`` -> rows of
``mu + softplus(rho) * eps``.

* Inner problem (eq. 16): ``psi*(v, u, z) = argmax ELBO_IP(psi)``, the weighted-coreset ELBO
  ``E_r[v . log p(z | u, theta)] - KL(r || prior)`` (KL in closed form). Solved by
  ``inner_steps`` Adam steps written as pure tensor arithmetic, so that the whole unrolled loop
  is differentiable in the coreset parameters (iterative differentiation, Section 3.4), with no
  monkey-patching library and no anomaly detection. The inner gradient is closed-form tensor
  code for a :class:`~dpsummary.models.bnn.BNN` (hand-written back-propagation,
  :func:`bnn_weighted_score`; tested equal to autodiff) and ``torch.func.grad`` for any other
  model; the outer gradient is one reverse-mode autograd pass through the unrolled loop.
* Outer objective (eq. 9, ELBO_PSVI-IS-BB), maximised in the coreset parameters::

      sum_k wt_k [log p(y | x, theta_k) - v . log p(z | u, theta_k)]
        + (1/K) sum_k [v . log p(z | u, theta_k) + log p(theta_k) - log r(theta_k; psi*)]

  with self-normalised importance weights ``wt = softmax_k(v . log p(z|u,theta_k) +
  log p(theta_k) - log r(theta_k))`` (eq. 6), and the full-data log-likelihood estimated from a
  minibatch scaled by N/B. Gradients flow through ``wt``, through ``theta_k`` and through
  ``psi*`` (the unrolled inner loop).

Log-likelihood matrices come from one batched call over the Monte Carlo draws (the model
protocol's ``theta`` is ``(S, d)``), or from ``torch.func.vmap`` of a per-draw function
(:data:`USE_VMAP`); any :class:`~dpsummary.models.base.Model` (BNN or GLM) takes the same path.
"""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass

import torch
from torch.func import grad, vmap

from ..models import Model
from ..models.bnn import BNN, MeanFieldGaussian

#: ``True``: :func:`loglik_matrix` vmaps a per-draw function over the Monte Carlo draws;
#: ``False`` (default): it calls the model once with all S draws, which the model protocol
#: guarantees is batched (``theta`` is ``(S, d)``). Both give identical values
#: (tests/blackbox/test_objective.py); measured on the 2-core machine, a 100-unit BNN inner
#: step costs 5.5 ms vmapped and 3.5 ms batched, so vmap is kept for models that are not.
USE_VMAP = False


def loglik_matrix(model: Model, points: torch.Tensor, theta: torch.Tensor, *, use_vmap: bool | None = None
                  ) -> torch.Tensor:
    """``log p(points_n | theta_s)`` as an ``(S, n)`` matrix over the Monte Carlo draws."""
    if not (USE_VMAP if use_vmap is None else use_vmap):
        return model.log_likelihood(points, theta).T

    def one_draw(th: torch.Tensor) -> torch.Tensor:
        return model.log_likelihood(points, th[None])[:, 0]

    out: torch.Tensor = vmap(one_draw)(theta)
    return out


@dataclass(frozen=True)
class InnerConfig:
    """The inner VI loop: ``steps`` Adam steps of size ``lr`` with ``num_samples`` draws each."""

    steps: int = 20
    lr: float = 0.01
    num_samples: int = 10
    beta1: float = 0.9
    beta2: float = 0.999
    eps: float = 1e-8
    #: Multiplies the KL term of ``-ELBO_IP``. 1 is the paper's ELBO (eq. 16) and the default.
    #: The authors' released code sums the coreset log-likelihood over its ``mc_samples`` draws
    #: instead of averaging (``inner_elbo`` in ``psvi/inference/psvi_classes.py``), i.e. it
    #: uses ``1 / mc_samples``; kept only to measure that difference (benchmarks/bnn.py reference).
    kl_weight: float = 1.0


def neg_inner_elbo(mu: torch.Tensor, rho: torch.Tensor, points: torch.Tensor, weights: torch.Tensor,
                   eps: torch.Tensor, model: Model, family: MeanFieldGaussian, kl_weight: float = 1.0
                   ) -> torch.Tensor:
    """``-ELBO_IP`` (eq. 8/16) for draws ``mu + sd * eps``; closed-form KL to the prior.

    ``kl_weight`` (default 1, the paper's ELBO) scales the KL term; see :class:`InnerConfig`."""
    theta = family.sample(mu, rho, eps)
    expected = (loglik_matrix(model, points, theta) @ weights).mean()
    return kl_weight * family.kl_to_prior(mu, rho) - expected


#: Layer output widths up to this use broadcast products instead of batched matrix products:
#: ``bmm`` with a thin side is several times slower on CPU (measured, float64, S = 10, n = 50,
#: h = 100: 137 us vs 67 us for the output layer, 174 us vs 28 us for its back-propagation).
_THIN = 4


@dataclass(frozen=True)
class _Prepared:
    """Per-call constants of :func:`bnn_weighted_score`, computed once per inner loop (every
    slice or broadcast view of a differentiable tensor is one more node the outer backward
    pass walks, at every unrolled step)."""

    x: torch.Tensor  # (n, i)
    xt: torch.Tensor  # (i, n)
    y: torch.Tensor  # (n, 1, K) targets
    ysum: torch.Tensor | None  # (n, 1, 1) softmax: sum of the soft labels
    w: torch.Tensor  # (n, 1, 1) weights
    split: tuple[int, ...]  # theta column sizes, layer by layer: W_l then b_l


def _prepare(model: BNN, points: torch.Tensor, weights: torch.Tensor) -> _Prepared:
    x, y = points.split([model.num_features, model.target_dim], 1)
    split = tuple(size for i, o in model.layer_shapes for size in (i * o, o))
    ysum = y.sum(1)[:, None, None] if model.likelihood == "softmax" else None
    return _Prepared(x, x.T, y[:, None, :], ysum, weights[:, None, None], split)


def bnn_weighted_score(model: BNN, points: torch.Tensor, weights: torch.Tensor, theta: torch.Tensor
                       ) -> torch.Tensor:
    """``d/dtheta_s sum_n weights_n log p(y_n | x_n, theta_s)`` for every draw, shape ``(S, d)``.

    Hand-written back-propagation through :meth:`BNN.forward` (same layout as ``theta``), in plain
    tensor operations, so that it is itself differentiable by autograd or ``torch.func`` (the
    outer gradient differentiates through it). Equal to ``torch.func.grad`` of the weighted
    log-likelihood (tests/blackbox/test_objective.py); it exists for speed: one inner step is a
    few dozen kernels instead of a traced forward and backward pass. Activations are kept
    record-major, ``(n, S, h)``, so that the input layer is ONE plain ``(n, i) x (i, S h)``
    matrix product forward and backward (no broadcast batched product).
    """
    return _score(model, _prepare(model, points, weights), theta)


def _score(model: BNN, prep: _Prepared, theta: torch.Tensor) -> torch.Tensor:
    n, s = prep.x.shape[0], theta.shape[0]
    parts = theta.split(prep.split, 1)
    shapes = model.layer_shapes
    relu = model.activation == "relu"
    fan_in, width = shapes[0]
    w0 = parts[0].view(s, fan_in, width)
    h = torch.addmm(parts[1].reshape(1, s * width), prep.x, w0.transpose(0, 1).reshape(fan_in, s * width))
    h = h.view(n, s, width)
    acts: list[torch.Tensor] = []  # inputs of layers 1.., (n, S, h)
    pre: list[torch.Tensor] = []
    thin: list[tuple[torch.Tensor, ...]] = []  # per layer >= 1: rows of W^T (S, h) when thin
    for layer in range(1, len(shapes)):
        i, o = shapes[layer]
        w, b = parts[2 * layer].view(s, i, o), parts[2 * layer + 1]
        pre.append(h)
        a = torch.relu(h) if relu else torch.tanh(h)
        acts.append(a)
        if o <= _THIN:
            rows = w.transpose(1, 2).contiguous().unbind(1)  # o x (S, i), contiguous
            thin.append(rows)
            h = torch.stack([(a * r).sum(-1) for r in rows], -1) + b
        else:
            thin.append(())
            h = torch.einsum("nsh,sho->nso", a, w) + b
    f = h  # (n, S, out)
    if model.likelihood == "bernoulli":
        delta = prep.y - torch.sigmoid(f)
    elif model.likelihood == "softmax":
        assert prep.ysum is not None
        delta = prep.y - torch.softmax(f, -1) * prep.ysum
    else:
        delta = (prep.y - f) / model.noise_scale**2
    delta = delta * prep.w
    grads: list[torch.Tensor] = []
    for layer in range(len(shapes) - 1, 0, -1):
        i, o = shapes[layer]
        a = acts[layer - 1]
        rows = thin[layer - 1]
        grads.append(delta.sum(0))
        if rows:
            cols = delta.unbind(-1) if o > 1 else (delta,)
            if o == 1:
                grads.append((a * delta).sum(0))
                back = delta * rows[0]
            else:
                grads.append(torch.stack([(a * c[..., None]).sum(0) for c in cols], -1).reshape(s, -1))
                back = cols[0][..., None] * rows[0]
                for c, r in zip(cols[1:], rows[1:], strict=True):
                    back = torch.addcmul(back, c[..., None], r)
        else:
            w = parts[2 * layer].view(s, i, o)
            grads.append(torch.einsum("nsh,nso->sho", a, delta).reshape(s, -1))
            back = torch.einsum("nso,sho->nsh", delta, w)
        if relu:
            # One fused kernel for back * 1[pre > 0]; differentiable in ``back`` (autograd knows
            # threshold_backward's derivative), and 1[pre > 0] has derivative 0 a.e.
            delta = torch.ops.aten.threshold_backward(back, pre[layer - 1], 0.0)
        else:
            delta = back * (1 - a * a)
    d2 = delta.reshape(n, s * width)
    grads.append(d2.sum(0).view(s, width))
    grads.append((prep.xt @ d2).view(fan_in, s, width).transpose(0, 1).reshape(s, -1))
    grads.reverse()
    return torch.cat(grads, 1)


def inner_elbo_grad(mu: torch.Tensor, rho: torch.Tensor, points: torch.Tensor, weights: torch.Tensor,
                    eps: torch.Tensor, model: Model, family: MeanFieldGaussian, kl_weight: float = 1.0
                    ) -> tuple[torch.Tensor, torch.Tensor]:
    """``(d/dmu, d/drho)`` of :func:`neg_inner_elbo`: closed form (reparameterisation chain rule
    and the KL's derivative) around :func:`bnn_weighted_score` for a :class:`BNN`, else
    ``torch.func.grad``. Differentiable in every argument."""
    if not isinstance(model, BNN):
        g: tuple[torch.Tensor, torch.Tensor] = grad(neg_inner_elbo, argnums=(0, 1))(
            mu, rho, points, weights, eps, model, family, kl_weight)
        return g
    return _bnn_inner_grad(mu, rho, _prepare(model, points, weights), eps, model, family, kl_weight)


def _bnn_inner_grad(mu: torch.Tensor, rho: torch.Tensor, prep: _Prepared, eps: torch.Tensor, model: BNN,
                    family: MeanFieldGaussian, kl_weight: float) -> tuple[torch.Tensor, torch.Tensor]:
    # Few, fused kernels: per-kernel overhead, not arithmetic, dominates at these sizes (a
    # 100-step unrolled loop costs ~60% as much CPU with 2-unit, 1-draw tensors as at full size).
    sd = MeanFieldGaussian.sd(rho)
    theta = torch.addcmul(mu, sd, eps)
    score = _score(model, prep, theta)  # (S, d)
    c = kl_weight / family.prior_scale**2
    inv_s = 1.0 / eps.shape[0]
    g_mu = torch.add(mu * c, score.sum(0), alpha=-inv_s)
    g_sd = torch.add(sd * c - kl_weight / sd, (score * eps).sum(0), alpha=-inv_s)
    return g_mu, g_sd * torch.sigmoid(rho)


@dataclass
class AdamMoments:
    """Inner Adam state carried between outer steps (detached): moments and step count."""

    m_mu: torch.Tensor
    v_mu: torch.Tensor
    m_rho: torch.Tensor
    v_rho: torch.Tensor
    count: int = 0

    @classmethod
    def zeros(cls, d: int, like: torch.Tensor) -> AdamMoments:
        z = torch.zeros(d, dtype=like.dtype)
        return cls(z, z.clone(), z.clone(), z.clone(), 0)

    def detached(self) -> AdamMoments:
        return AdamMoments(self.m_mu.detach(), self.v_mu.detach(), self.m_rho.detach(), self.v_rho.detach(),
                           self.count)


def inner_fit(
    mu: torch.Tensor,
    rho: torch.Tensor,
    points: torch.Tensor,
    weights: torch.Tensor,
    eps: torch.Tensor,
    model: Model,
    family: MeanFieldGaussian,
    config: InnerConfig,
    moments: AdamMoments | None = None,
) -> tuple[torch.Tensor, torch.Tensor, AdamMoments]:
    """Unrolled inner VI (Section 3.4): ``config.steps`` Adam steps on ``-ELBO_IP``.

    ``eps`` is ``(steps, num_samples, d)`` standard-normal noise owned by the caller. The result
    is differentiable in ``points`` and ``weights`` (and in ``mu``, ``rho``) by ordinary autograd
    or by an enclosing ``torch.func`` transform. Adam is written out (bias-corrected moments,
    ``sqrt(v + eps^2)`` so its derivative stays finite where a gradient is exactly zero, e.g. a
    dead ReLU unit).
    """
    if eps.shape[0] != config.steps:
        raise ValueError("eps must have one slice of draws per inner step")
    d = mu.shape[0]
    mom = moments if moments is not None else AdamMoments.zeros(d, mu)
    count = mom.count
    # Adam runs on psi = [mu, rho] as one vector: half the kernels per step (and half the nodes
    # the outer backward pass walks) of updating mu and rho separately; arithmetic unchanged.
    psi = torch.cat([mu, rho])
    m = torch.cat([mom.m_mu, mom.m_rho])
    v = torch.cat([mom.v_mu, mom.v_rho])
    b1, b2, lr, tiny = config.beta1, config.beta2, config.lr, config.eps**2
    prep = _prepare(model, points, weights) if isinstance(model, BNN) else None
    for t in range(config.steps):
        mu_t, rho_t = psi.view(2, d).unbind(0)
        if prep is not None and isinstance(model, BNN):
            g_mu, g_rho = _bnn_inner_grad(mu_t, rho_t, prep, eps[t], model, family, config.kl_weight)
        else:
            g_mu, g_rho = inner_elbo_grad(mu_t, rho_t, points, weights, eps[t], model, family, config.kl_weight)
        g = torch.cat([g_mu, g_rho])
        count += 1
        m = torch.lerp(g, m, b1)  # b1 m + (1 - b1) g
        v = torch.addcmul(v * b2, g, g, value=1 - b2)
        c1, c2 = 1 - b1**count, 1 - b2**count
        # lr (m / c1) / sqrt(v / c2 + tiny) == (lr sqrt(c2) / c1) m / sqrt(v + tiny c2): 3 kernels
        psi = torch.addcdiv(psi, m, torch.sqrt(v + tiny * c2), value=-lr * c2**0.5 / c1)
    return psi[:d], psi[d:], AdamMoments(m[:d], v[:d], m[d:], v[d:], count)


def importance_log_weights(mu: torch.Tensor, rho: torch.Tensor, theta: torch.Tensor, coreset_ll: torch.Tensor,
                           model: Model, family: MeanFieldGaussian) -> torch.Tensor:
    """Unnormalised log importance weights ``v . log p(z|u,theta_k) + log p(theta_k) - log r(theta_k)``
    (eq. 6; supplement's "correction for sampling under coreset"), shape ``(K,)``."""
    return coreset_ll + model.log_prior(theta) - family.log_prob(mu, rho, theta)


#: The data term of the outer objective, in two calls: ``data_fit(theta)`` takes the records'
#: part at the draws ``theta`` (K, d) and returns ``finish(wt, coreset_ll)``, an estimate of
#: ``sum_k wt_k [log p(y | x, theta_k) - v . log p(z | u, theta_k)]`` (a scalar, differentiable
#: in ``wt`` and ``theta``) from the importance weights ``wt`` (K,) and the weighted coreset
#: log-likelihoods ``coreset_ll`` (K,). (Two calls keep each path's autograd graph, hence its
#: floating-point results, exactly as they were before the paths shared this code.) The only
#: place records enter the objective: :func:`minibatch_data_fit` (exact, non-private) or
#: :func:`statistic_data_fit` (from sums over records, exact or noisy: the private path).
DataFit = Callable[[torch.Tensor], Callable[[torch.Tensor, torch.Tensor], torch.Tensor]]


def minibatch_data_fit(batch: torch.Tensor, num_records: int, model: Model) -> DataFit:
    """The data term from a minibatch of records, its log-likelihood scaled by N/B (eq. 9)."""

    def data_fit(theta: torch.Tensor) -> Callable[[torch.Tensor, torch.Tensor], torch.Tensor]:
        data_ll = loglik_matrix(model, batch, theta).sum(1) * (num_records / batch.shape[0])  # (K,)

        def finish(wt: torch.Tensor, coreset_ll: torch.Tensor) -> torch.Tensor:
            return (wt * (data_ll - coreset_ll)).sum()

        return finish

    return data_fit


def statistic_data_fit(stat_l: torch.Tensor, stat_g: torch.Tensor, theta_fixed: torch.Tensor,
                       sample_rate: float) -> DataFit:
    """The data term from the gradient statistic of a (Poisson) sample of records taken at rate
    ``sample_rate``: ``stat_l`` (K,) the sums of ``log p(x | theta_k)`` and ``stat_g`` (K, d) the
    sums of their gradients in ``theta_k``, computed at the draws ``theta_fixed`` (noisy sums on
    the private path, :mod:`dpsummary.private.bnn`; exact sums in tests).

    The surrogate ``sum_k wt_k L_k / q + sum_k sg(wt_k) (theta_k - theta_fixed_k) . G_k / q``
    (sg = stop-gradient) has, at ``theta = theta_fixed``, the value and the gradient (through
    ``wt`` and through ``theta``) of the minibatch data term with the statistic in place of the
    records. Only post-processing of the statistic."""

    def data_fit(theta: torch.Tensor) -> Callable[[torch.Tensor, torch.Tensor], torch.Tensor]:
        def finish(wt: torch.Tensor, coreset_ll: torch.Tensor) -> torch.Tensor:
            data = (wt * stat_l).sum() + (wt.detach()[:, None] * (theta - theta_fixed) * stat_g).sum()
            return data / sample_rate - (wt * coreset_ll).sum()

        return finish

    return data_fit


def elbo_with(mu: torch.Tensor, rho: torch.Tensor, points: torch.Tensor, weights: torch.Tensor,
              data_fit: DataFit, eps: torch.Tensor, model: Model, family: MeanFieldGaussian) -> torch.Tensor:
    """``ELBO_PSVI-IS-BB`` (eq. 9) with the data term from ``data_fit`` (:data:`DataFit`).

    ``(mu, rho)`` should be the inner loop's output ``psi*``; ``eps`` is ``(K, d)``."""
    theta = family.sample(mu, rho, eps)
    coreset_ll = loglik_matrix(model, points, theta) @ weights  # (K,)
    finish = data_fit(theta)
    log_iw = importance_log_weights(mu, rho, theta, coreset_ll, model, family)
    wt = torch.softmax(log_iw, 0)
    return finish(wt, coreset_ll) + log_iw.mean()


def outer_elbo(
    mu: torch.Tensor,
    rho: torch.Tensor,
    points: torch.Tensor,
    weights: torch.Tensor,
    batch: torch.Tensor,
    num_records: int,
    eps: torch.Tensor,
    model: Model,
    family: MeanFieldGaussian,
) -> torch.Tensor:
    """``ELBO_PSVI-IS-BB`` (eq. 9; eq. 13 for BB-SparseVI) with the data term from ``batch``.

    ``(mu, rho)`` should be the inner loop's output ``psi*``; ``eps`` is ``(K, d)``. Returns a
    scalar estimate of a lower bound on ``log p(y | x)`` (up to the minibatch estimate).
    """
    return elbo_with(mu, rho, points, weights, minibatch_data_fit(batch, num_records, model), eps, model, family)


def coreset_loss(
    points: torch.Tensor,
    weights: torch.Tensor,
    mu0: torch.Tensor,
    rho0: torch.Tensor,
    data_fit: DataFit,
    num_records: int,
    inner_eps: torch.Tensor,
    outer_eps: torch.Tensor,
    model: Model,
    family: MeanFieldGaussian,
    config: InnerConfig,
    moments: AdamMoments | None = None,
) -> tuple[torch.Tensor, tuple[torch.Tensor, ...]]:
    """THE BB-PSVI outer loss, shared by the non-private and the private path:
    ``-ELBO_PSVI-IS-BB / N`` after the unrolled inner loop from ``(mu0, rho0)``, with the data
    term from ``data_fit`` (:data:`DataFit`).

    Returns ``(loss, (mu*, rho*, m_mu, v_mu, m_rho, v_rho))`` (a pytree of tensors, as
    ``torch.func`` requires of auxiliary outputs). Dividing by N only rescales (Adam is invariant
    to it) and keeps the value readable per record.
    """
    mu, rho, mom = inner_fit(mu0, rho0, points, weights, inner_eps, model, family, config, moments)
    elbo = elbo_with(mu, rho, points, weights, data_fit, outer_eps, model, family)
    return -elbo / num_records, (mu, rho, mom.m_mu, mom.v_mu, mom.m_rho, mom.v_rho)


def bilevel_loss(
    points: torch.Tensor,
    weights: torch.Tensor,
    mu0: torch.Tensor,
    rho0: torch.Tensor,
    batch: torch.Tensor,
    num_records: int,
    inner_eps: torch.Tensor,
    outer_eps: torch.Tensor,
    model: Model,
    family: MeanFieldGaussian,
    config: InnerConfig,
    moments: AdamMoments | None = None,
) -> tuple[torch.Tensor, tuple[torch.Tensor, ...]]:
    """:func:`coreset_loss` with the data term from the minibatch ``batch`` (the non-private
    path); differentiate ``loss`` in ``points``/``weights`` with ``torch.func.grad(...,
    has_aux=True)`` (see :func:`outer_gradient`)."""
    return coreset_loss(points, weights, mu0, rho0, minibatch_data_fit(batch, num_records, model), num_records,
                        inner_eps, outer_eps, model, family, config, moments)


def outer_gradient(
    points: torch.Tensor,
    weights: torch.Tensor,
    mu0: torch.Tensor,
    rho0: torch.Tensor,
    batch: torch.Tensor,
    num_records: int,
    inner_eps: torch.Tensor,
    outer_eps: torch.Tensor,
    model: Model,
    family: MeanFieldGaussian,
    config: InnerConfig,
    moments: AdamMoments | None = None,
) -> tuple[torch.Tensor, torch.Tensor, torch.Tensor, tuple[torch.Tensor, torch.Tensor, AdamMoments]]:
    """``(d loss / d points, d loss / d weights, loss, (mu*, rho*, moments))``.

    Reverse-mode autograd through the unrolled loop (one forward, one backward pass; the inner
    gradients are closed-form tensor code for a BNN, :func:`inner_elbo_grad`, so no nested
    transform is needed). Plain ``torch.autograd.grad`` here costs about half of
    ``torch.func.grad_and_value`` on the same graph (measured: benchmarks/results/bnn.md, speed);
    :func:`bilevel_loss` stays a pure function for callers that compose ``torch.func``.
    """
    with torch.enable_grad():
        pts = points.detach().requires_grad_(True)
        wts = weights.detach().requires_grad_(True)
        loss, aux = bilevel_loss(pts, wts, mu0.detach(), rho0.detach(), batch, num_records, inner_eps, outer_eps,
                                 model, family, config, moments)
        g_points, g_weights = torch.autograd.grad(loss, (pts, wts))
    count = (moments.count if moments is not None else 0) + config.steps
    mu, rho, m_mu, v_mu, m_rho, v_rho = (a.detach() for a in aux)
    return g_points, g_weights, loss.detach(), (mu, rho, AdamMoments(m_mu, v_mu, m_rho, v_rho, count))
