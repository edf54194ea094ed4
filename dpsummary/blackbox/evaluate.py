"""Predictive evaluation of black-box coresets and baselines, and the full-data MCMC (NUTS) reference.

The coreset posterior is used as in the paper (supplement C, eq. 18): draws ``theta_s`` from the
fitted mean-field ``r(theta; psi*)``, self-normalised importance weights ``wt_s`` toward the
weighted-coreset posterior (eq. 6), and the predictive ``p(y | x) ~= sum_s wt_s p(y | x, theta_s)``.
``importance=False`` uses equal weights (plain VI predictive; the full-data VI baseline).

Metrics: accuracy, mean test log predictive density, expected calibration error (ECE, equal-width
confidence bins on the top-class probability, Guo et al. 2017) for classification; RMSE and log
predictive density for Gaussian regression.
"""

from __future__ import annotations

import math

import torch

from ..models import DTYPE, Model
from ..models.bnn import BNN, MeanFieldGaussian
from .objective import importance_log_weights, loglik_matrix


def draws_and_weights(model: Model, mu: torch.Tensor, rho: torch.Tensor, generator: torch.Generator, *,
                      num_samples: int = 200, points: torch.Tensor | None = None,
                      weights: torch.Tensor | None = None) -> tuple[torch.Tensor, torch.Tensor]:
    """``(theta (S, d), wt (S,))``: draws from r and their importance weights toward the
    weighted-coreset posterior (uniform when ``points`` is None)."""
    family = MeanFieldGaussian(model.prior_scale)
    eps = torch.randn(num_samples, model.param_dim, generator=generator, dtype=mu.dtype)
    theta = family.sample(mu, rho, eps)
    if points is None or weights is None:
        return theta, torch.full((num_samples,), 1.0 / num_samples, dtype=mu.dtype)
    core_ll = loglik_matrix(model, points, theta) @ weights
    return theta, torch.softmax(importance_log_weights(mu, rho, theta, core_ll, model, family), 0)


def class_probs(model: Model, theta: torch.Tensor, wt: torch.Tensor, features: torch.Tensor) -> torch.Tensor:
    """Posterior predictive class probabilities ``(n, K)``."""
    if isinstance(model, BNN):
        per_draw = model.predictive_probs(features, theta)  # (S, n, K)
    else:  # a GLM with a Bernoulli likelihood (logistic): p(1) = sigmoid(eta)
        ones = torch.ones(features.shape[0], 1, dtype=DTYPE)
        ll1 = model.log_likelihood(torch.cat([features, ones], 1), theta).T.exp()
        per_draw = torch.stack([1 - ll1, ll1], -1)
    return torch.einsum("s,snk->nk", wt, per_draw)


def expected_calibration_error(probs: torch.Tensor, labels: torch.Tensor, bins: int = 10) -> float:
    """ECE: sum over confidence bins of (bin share) * |accuracy - mean confidence|."""
    conf, pred = probs.max(1)
    correct = (pred == labels).to(DTYPE)
    edges = torch.linspace(0.0, 1.0, bins + 1, dtype=DTYPE)
    ece = 0.0
    for lo, hi in zip(edges[:-1], edges[1:], strict=True):
        inside = (conf > lo) & (conf <= hi)
        if inside.any():
            share = float(inside.to(DTYPE).mean())
            ece += share * abs(float(correct[inside].mean()) - float(conf[inside].mean()))
    return ece


def labels_of(model: Model, points: torch.Tensor) -> torch.Tensor:
    """Integer class labels of (hard-labelled) points."""
    if isinstance(model, BNN) and model.likelihood == "softmax":
        return points[:, model.num_features:].argmax(1)
    return (points[:, -1] > 0.5).to(torch.int64)


def predictive_metrics(model: Model, theta: torch.Tensor, wt: torch.Tensor, test: torch.Tensor) -> dict[str, float]:
    """Accuracy, test log-likelihood (mean log predictive density) and ECE on ``test``."""
    x = test[:, : model.num_features]
    if isinstance(model, BNN) and model.likelihood == "gaussian":
        ll = loglik_matrix(model, test, theta)  # (S, n)
        lpd = torch.logsumexp(ll + wt.log()[:, None], 0)
        mean = torch.einsum("s,sn->n", wt, model.forward(x, theta)[..., 0])
        rmse = float(((mean - test[:, -1]) ** 2).mean().sqrt())
        return {"test_ll": float(lpd.mean()), "rmse": rmse}
    probs = class_probs(model, theta, wt, x).clamp(min=1e-300)
    y = labels_of(model, test)
    return {
        "accuracy": float((probs.argmax(1) == y).to(DTYPE).mean()),
        "test_ll": float(probs.gather(1, y[:, None]).log().mean()),
        "ece": expected_calibration_error(probs, y),
    }


def evaluate_variational(model: Model, mu: torch.Tensor, rho: torch.Tensor, test: torch.Tensor,
                         generator: torch.Generator, *, points: torch.Tensor | None = None,
                         weights: torch.Tensor | None = None, num_samples: int = 200) -> dict[str, float]:
    """Metrics of the (importance-corrected when ``points`` is given) variational predictive."""
    theta, wt = draws_and_weights(model, mu, rho, generator, num_samples=num_samples, points=points, weights=weights)
    out = predictive_metrics(model, theta, wt, test)
    out["ess"] = float(1.0 / (wt * wt).sum())
    return out


def hmc_reference(model: Model, data: torch.Tensor, generator: torch.Generator, *, init: torch.Tensor,
                  num_samples: int = 200, num_warmup: int = 300, init_scale: torch.Tensor | None = None) -> torch.Tensor:
    """Full-data NUTS draws ``(num_samples, d)`` (:mod:`dpsummary.sampling`, one chain, small
    problems: every gradient touches all N records). ``init`` (d,) is the chain's start and
    whitening centre, e.g. the full-data VI mean (the prior's centre is a saddle of a BNN
    posterior); ``init_scale`` (d,) the whitening scale (default 0.1 prior sds)."""
    from ..gaussian import GaussianPosterior
    from ..sampling import NutsSettings, sample_posterior

    ones = torch.ones(data.shape[0], dtype=DTYPE)
    scale = init_scale if init_scale is not None else torch.full_like(init, 0.1 * model.prior_scale)
    start = GaussianPosterior(mean=init.detach().to(DTYPE), scale_tril=torch.diag(scale.detach().to(DTYPE)))
    seed = int(torch.randint(2**62, (1,), generator=generator))
    draws = sample_posterior(model, data, ones, start=start, seed=seed,
                             settings=NutsSettings(chains=1, num_warmup=max(num_warmup, 100), draws_per_chain=num_samples))
    return torch.as_tensor(draws.flat(), dtype=DTYPE)


def mean_std(values: list[float]) -> tuple[float, float]:
    m = sum(values) / len(values)
    sd = math.sqrt(sum((v - m) ** 2 for v in values) / max(len(values) - 1, 1))
    return m, sd
