"""DP-VI: differentially private mean-field variational inference (Jälkö, Dikmen, Honkela 2017).

The DP-PSVI paper's main private competitor, here as a **utility baseline** for the benchmarks and
the curator's report. It is *not* a release path: Opacus adds torch's floating-point Gaussian noise
(from a generator seeded from OS entropy), which is not protected against the floating-point
attacks that :mod:`dpsummary.private.noise` closes for DP-PSVI, and nothing here signs, ledgers
or checks a policy.

Method
------
q(theta) = N(mu, diag(exp(2 rho))) for every model. The ELBO

    L(mu, rho) = sum_n E_q[log p(x_n | theta)] - KL(q || prior)

is maximised by DP-SGD (with Adam as the post-processing step rule):

* each step draws a Poisson sample of the records (every record independently with probability
  ``q``; coins from OS entropy via :func:`dpsummary.private.noise.poisson_mask`, with ``q`` a
  multiple of 2^-32 so the coins have exactly the probability the accountant is told);
* each sampled record's term ``E_q[log p(x_n | theta)]`` is estimated with ``num_draws``
  reparameterised draws theta_k = mu + exp(rho) * eps_k (eps_k ~ N(0, I) from the caller's
  generator, shared by the batch); its per-record gradient with respect to (mu, rho) is computed
  by Opacus (:class:`opacus.GradSampleModule`, functorch path), clipped to L2 norm ``clip_norm``
  and summed, and Gaussian noise of standard deviation ``noise_multiplier * clip_norm`` is added
  by :class:`opacus.optimizers.DPOptimizer`;
* the noisy sum is divided by the expected batch ``q N`` and multiplied by ``N`` (an unbiased
  estimate of the data term's gradient), and the gradient of ``-KL(q || prior)`` is added in
  closed form, *without clipping or noise*.

Why the KL term needs no clipping: ``KL(q || prior)`` is a function of (mu, rho) and of the
public prior only. (mu, rho) at step t are themselves the output of steps 1..t-1, already
differentially private; computing a function of them and of public constants is post-processing,
which costs no privacy. Only the data term touches records, and it is exactly the
Poisson-subsampled Gaussian mechanism with L2 sensitivity ``clip_norm`` under add/remove-one
adjacency (adding or removing one record changes the clipped sum by at most ``clip_norm``).

Accounting: ``steps`` compositions of that mechanism, i.e. the event
``subsampled_gaussian_event(noise_multiplier, q, steps)`` — the same event, accountant
(Opacus RDP on :data:`dpsummary.accounting.RDP_ORDERS`) and adjacency as the release's
optimisation stage. Sigma is calibrated with
:func:`dpsummary.accounting.calibrate_noise_multiplier`. An empty Poisson batch still adds
the noise (the accountant assumes every step is released).

Hyperparameters (the defaults below) were chosen on *synthetic* logistic-regression data only,
never on the benchmark data sets: features drawn like the public transform's output (numerics
uniform on [-1, 1] plus one-hot categoricals), theta from the prior; "small" N = 1000, d = 19 and
"large" N = 20000, d = 40; epsilon in {0.1, 1} (and 1e6 to see the optimiser alone), delta 1e-7,
T = 1000. Forward KL to the Laplace posterior (the large problem's mean-field floor is 11.9):

    expected batch B   clip C   lr      eps 1   eps 0.1   eps 1e6    (large problem)
    200                1.0      0.01    627     662/603*  660
    200                1.0      0.003   388     1763      -
    200                4.0      0.01    93      1062*     17.5
    500                2.0      0.01    81      541       -          <- the defaults
    1000               1.0      0.01    721     802*      -
    200                1.0      0.05    1378*   2688*     -

(* = first pass with a constant lr, before the decay below was added.)
On the small problem (noise-dominated) lr 0.01 beat 0.05 by 4-7x and C in {1, 4}, B in
{200, 1000} were within 20% of each other. The lessons: a clip norm below the typical per-record
gradient norm (about ||x|| ~ 3 here) biases the fixed point badly (the eps = 1e6 column), a larger
one buys noise; Adam's lr must be small because in the noise-dominated regime every step moves
about lr; iterate averaging over the second half and a linear lr decay to lr/10 (both
post-processing) reduce the remaining jitter.
"""

from __future__ import annotations

import math
import secrets
import warnings
from dataclasses import dataclass

import torch
from torch import nn

from .inference import GaussianPosterior, prior_posterior
from .models import DTYPE, Model

#: Optimisation steps T (one Poisson-subsampled Gaussian mechanism each).
DEFAULT_STEPS = 1000
#: Expected Poisson batch q N (q = this / N, capped at 1).
DEFAULT_EXPECTED_BATCH = 500
#: Per-record L2 clip norm of the gradient with respect to (mu, rho).
DEFAULT_CLIP_NORM = 2.0
#: Adam learning rate (on mu and rho alike).
DEFAULT_LEARNING_RATE = 0.01
#: Reparameterised draws per step (shared by the batch).
DEFAULT_NUM_DRAWS = 8
#: Initial q: mean at the prior mean, standard deviation prior_scale * this.
DEFAULT_INIT_SCALE = 0.1
#: The returned (mu, rho) is the average of the iterates over the last this fraction of steps
#: (Polyak averaging; post-processing of the private iterates, so free).
DEFAULT_AVERAGE_FRACTION = 0.5


@dataclass(frozen=True)
class DPVIResult:
    """The fitted mean-field posterior and the mechanism that produced it."""

    posterior: GaussianPosterior
    noise_multiplier: float
    sample_rate: float
    steps: int
    epsilon: float
    delta: float = 0.0
    clip_norm: float = DEFAULT_CLIP_NORM
    empty_batches: int = 0


class _ExpectedLogLik(nn.Module):
    """Per-record Monte Carlo estimate of E_q[log p(x_n | theta)], q = N(mu, diag(exp(2 rho))).

    Input rows are ``[x_n, eps_1, ..., eps_K]``: the point and the K standard-normal draws
    (identical in every row of a batch). The draws ride in the input because Opacus's functorch
    path re-runs ``forward`` on one row at a time from the recorded input (a buffer or attribute
    would be copied away); carrying them in each row keeps the per-record gradient exact.
    """

    def __init__(self, model: Model, num_draws: int, init_mean: torch.Tensor, init_log_scale: torch.Tensor) -> None:
        super().__init__()
        self.model = model
        self.num_draws = num_draws
        self.mu = nn.Parameter(init_mean.clone())
        self.rho = nn.Parameter(init_log_scale.clone())

    def forward(self, rows: torch.Tensor) -> torch.Tensor:
        p = self.model.point_dim
        d = self.mu.shape[0]
        points = rows[:, :p]
        eps = rows[0, p:].reshape(self.num_draws, d)  # shared draws (all rows carry the same)
        theta = self.mu + torch.exp(self.rho) * eps  # (K, d)
        return self.model.log_likelihood(points, theta).mean(1)  # (B,)


def _kl_to_prior_grad(model: Model, mu: torch.Tensor, rho: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor]:
    """Gradient of KL(N(mu, diag(exp(2 rho))) || N(m0, s0^2 I)) in closed form (data-free)."""
    s0sq = model.prior_scale**2
    g_mu = (mu - model.prior_mean) / s0sq
    g_rho = torch.exp(2 * rho) / s0sq - 1.0
    return g_mu, g_rho


def default_sample_rate(num_records: int, expected_batch: int = DEFAULT_EXPECTED_BATCH) -> float:
    from .private.noise import quantize_sample_rate

    return quantize_sample_rate(min(1.0, expected_batch / max(num_records, 1)))


def fit_dpvi(
    train: torch.Tensor,
    model: Model,
    *,
    epsilon: float,
    delta: float,
    generator: torch.Generator,
    steps: int = DEFAULT_STEPS,
    sample_rate: float | None = None,
    clip_norm: float = DEFAULT_CLIP_NORM,
    lr: float = DEFAULT_LEARNING_RATE,
    num_draws: int = DEFAULT_NUM_DRAWS,
    init_scale: float = DEFAULT_INIT_SCALE,
    average_fraction: float = DEFAULT_AVERAGE_FRACTION,
    noise_multiplier: float | None = None,
) -> DPVIResult:
    """Fit q = N(mu, diag(exp(2 rho))) by DP-SGD at (epsilon, delta) (add/remove adjacency).

    ``train`` is ``(N, point_dim)`` in model space; N is treated as public (as a policy's
    ``record_count``), so ``sample_rate`` defaults to ``DEFAULT_EXPECTED_BATCH / N`` (quantised
    to a multiple of 2^-32). ``generator`` drives the non-private randomness (the
    reparameterisation draws); Poisson coins come from OS entropy and the Gaussian noise from a
    torch generator seeded from OS entropy. ``noise_multiplier`` overrides the calibration
    (tests only; ``epsilon`` is then recomputed from it).
    """
    from opacus import GradSampleModule
    from opacus.optimizers import DPOptimizer

    from . import accounting as acc
    from .private.noise import poisson_mask, quantize_sample_rate

    if train.ndim != 2 or train.shape[1] != model.point_dim:
        raise ValueError(f"train must be (N, {model.point_dim}); got {tuple(train.shape)}")
    n = int(train.shape[0])
    if n < 1:
        raise ValueError("no training records")
    if steps < 1 or num_draws < 1 or not clip_norm > 0 or not lr > 0:
        raise ValueError("steps, num_draws, clip_norm and lr must be positive")
    if not 0 < average_fraction <= 1:
        raise ValueError("average_fraction must lie in (0, 1]")
    q = quantize_sample_rate(sample_rate if sample_rate is not None else min(1.0, DEFAULT_EXPECTED_BATCH / n))
    if noise_multiplier is None:
        sigma = acc.calibrate_noise_multiplier(target_epsilon=epsilon, delta=delta, sample_rate=q, steps=steps)
    else:
        sigma = float(noise_multiplier)
    spent = acc.epsilon([acc.subsampled_gaussian_event(sigma, q, steps)], delta)

    d = model.param_dim
    module = _ExpectedLogLik(
        model, num_draws, model.prior_mean.to(DTYPE),
        torch.full((d,), math.log(model.prior_scale * init_scale), dtype=DTYPE),
    )
    gsm = GradSampleModule(module, batch_first=True, loss_reduction="sum")
    params = [module.mu, module.rho]
    adam = torch.optim.Adam(params, lr=lr)
    # Constant lr for the first half, then linear decay to lr / 10 (post-processing, data-free).
    sched = torch.optim.lr_scheduler.LambdaLR(
        adam, lambda t: 1.0 if t < steps // 2 else 1.0 - 0.9 * (t - steps // 2) / max(1, steps - steps // 2))
    expected_batch = q * n
    noise_gen = torch.Generator().manual_seed(secrets.randbits(63))
    dp_opt = DPOptimizer(adam, noise_multiplier=sigma, max_grad_norm=clip_norm, expected_batch_size=1,
                         loss_reduction="sum", generator=noise_gen)
    data = train.detach().to(DTYPE)
    empty = 0
    avg_start = min(steps - 1, int(steps * (1.0 - average_fraction)))
    mu_sum = torch.zeros(d, dtype=DTYPE)
    rho_sum = torch.zeros(d, dtype=DTYPE)
    with warnings.catch_warnings():
        warnings.filterwarnings("ignore", module="opacus")
        warnings.filterwarnings("ignore", message="Full backward hook is firing")
        for t in range(steps):
            dp_opt.zero_grad(set_to_none=True)
            eps = torch.randn(num_draws * d, generator=generator, dtype=DTYPE)
            mask = torch.from_numpy(poisson_mask(n, q))
            batch = data[mask]
            if batch.shape[0] == 0:
                # Nothing to clip, but the step is still released: give Opacus an empty
                # per-sample gradient so it adds the noise (it would skip the step otherwise).
                empty += 1
                for prm in params:
                    prm.grad_sample = torch.zeros((0, *prm.shape), dtype=DTYPE)  # type: ignore[attr-defined]
            else:
                rows = torch.cat([batch, eps.expand(batch.shape[0], -1)], 1)
                loss = -gsm(rows).sum()
                loss.backward()
            if not dp_opt.pre_step():  # clip, sum, add N(0, sigma^2 C^2) (no accumulation here)
                raise RuntimeError("DPOptimizer skipped a step")
            with torch.no_grad():
                # Noisy sum of clipped gradients of -sum_batch E_q[log p] -> estimate of -sum_all.
                g_mu, g_rho = _kl_to_prior_grad(model, module.mu, module.rho)
                assert module.mu.grad is not None and module.rho.grad is not None
                module.mu.grad.mul_(n / expected_batch).add_(g_mu)
                module.rho.grad.mul_(n / expected_batch).add_(g_rho)
            adam.step()
            sched.step()
            if t >= avg_start:
                mu_sum += module.mu.detach()
                rho_sum += module.rho.detach()
    gsm._close()
    mu = mu_sum / (steps - avg_start)
    scale = torch.exp(rho_sum / (steps - avg_start))
    post = GaussianPosterior(mean=mu, scale_tril=torch.diag(scale))
    return DPVIResult(posterior=post, noise_multiplier=sigma, sample_rate=q, steps=steps, epsilon=spent,
                      delta=delta, clip_norm=clip_norm, empty_batches=empty)


def evaluate_posterior(
    model: Model,
    posterior: GaussianPosterior,
    full_post: GaussianPosterior,
    *,
    test: torch.Tensor | None = None,
    generator: torch.Generator | None = None,
) -> dict[str, float]:
    """The metrics of :func:`dpsummary.metrics.evaluate` for a posterior approximation (not a
    coreset): KL both ways and prior-normalised, standardised mean error, test log-likelihood and
    accuracy or RMSE."""
    from .metrics import kl_report, predictive_scores, standardised_mean_error

    out: dict[str, float] = dict(kl_report(posterior, full_post, prior_posterior(model)).as_dict())
    out["mean_error"] = standardised_mean_error(posterior, full_post)
    if test is not None:
        gen = generator if generator is not None else torch.Generator().manual_seed(1)
        out.update(predictive_scores(model, posterior, test, generator=gen))
    return out


__all__ = ["DPVIResult", "default_sample_rate", "evaluate_posterior", "fit_dpvi"]
