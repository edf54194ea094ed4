"""How good is a summary? KL to the full-data posterior, predictive scores, mean error.

* KL between the summary's posterior and the full-data posterior, both directions: exact for the
  conjugate models (both posteriors are Gaussian), and between Gaussian fits otherwise (Laplace, or
  the moments of MCMC draws) — the papers' convention. ``prior_normalised`` divides by the KL
  between the prior and the full-data posterior in the same direction, as the papers plot it.
* Held-out predictive log-likelihood (Monte Carlo over posterior draws, log-mean-exp per record)
  and accuracy (logistic) or RMSE (linear, Poisson).
* Standardised error of the posterior mean: ||Sigma_full^{-1/2} (mu_summary - mu_full)||.
"""

from __future__ import annotations

import math
from dataclasses import asdict, dataclass

import torch

from .inference import GaussianPosterior, coreset_posterior, laplace, prior_posterior
from .models import DTYPE, GLM, LinearRegression, LogisticRegression, Model


def gaussian_kl(p: GaussianPosterior, q: GaussianPosterior) -> float:
    """KL(p || q) between two multivariate Gaussians."""
    d = p.dim
    # tr(Sq^-1 Sp) = ||Lq^-1 Lp||_F^2 ; Mahalanobis via Lq.
    a = torch.linalg.solve_triangular(q.scale_tril, p.scale_tril, upper=False)
    diff = torch.linalg.solve_triangular(q.scale_tril, (p.mean - q.mean)[:, None], upper=False)[:, 0]
    logdet_q = 2 * torch.log(torch.diagonal(q.scale_tril)).sum()
    logdet_p = 2 * torch.log(torch.diagonal(p.scale_tril)).sum()
    kl = 0.5 * ((a * a).sum() + (diff * diff).sum() - d + logdet_q - logdet_p)
    return float(kl)


def full_posterior(model: Model, data: torch.Tensor) -> GaussianPosterior:
    """The full-data reference: exact for conjugate models, Laplace otherwise."""
    weights = torch.ones(data.shape[0], dtype=DTYPE)
    if model.conjugate:
        return model.exact_posterior(data, weights)
    return laplace(model, data, weights)


def summary_posterior(model: Model, points: torch.Tensor, weights: torch.Tensor) -> GaussianPosterior:
    if points.shape[0] == 0:
        return prior_posterior(model)
    return coreset_posterior(model, points, weights)


@dataclass(frozen=True)
class KLReport:
    forward: float  # KL(summary || full) -- the reverse KL the papers minimise
    reverse: float  # KL(full || summary)
    forward_normalised: float
    reverse_normalised: float

    def as_dict(self) -> dict[str, float]:
        return asdict(self)


def kl_report(summary_post: GaussianPosterior, full_post: GaussianPosterior, prior: GaussianPosterior) -> KLReport:
    fwd = gaussian_kl(summary_post, full_post)
    rev = gaussian_kl(full_post, summary_post)
    return KLReport(
        forward=fwd,
        reverse=rev,
        forward_normalised=fwd / gaussian_kl(prior, full_post),
        reverse_normalised=rev / gaussian_kl(full_post, prior),
    )


def predictive_scores(
    model: Model, posterior: GaussianPosterior, test: torch.Tensor, *, num_samples: int = 200, generator: torch.Generator
) -> dict[str, float]:
    """Mean held-out log predictive density, plus accuracy (logistic) or RMSE (regressions)."""
    theta = posterior.sample(num_samples, generator)
    ll = model.log_likelihood(test, theta)  # (n, S)
    lpd = torch.logsumexp(ll, 1) - math.log(num_samples)
    out = {"test_loglik": float(lpd.mean())}
    if isinstance(model, (GLM, LinearRegression)):
        eta = model.design(test) @ theta.T
        y = test[:, -1]
        if isinstance(model, LogisticRegression):
            prob = torch.sigmoid(eta).mean(1)
            out["accuracy"] = float(((prob > 0.5).to(DTYPE) == (y > 0.5).to(DTYPE)).to(DTYPE).mean())
        elif isinstance(model, LinearRegression):
            out["rmse"] = float(torch.sqrt(((eta.mean(1) - y) ** 2).mean()))
        else:
            out["rmse"] = float(torch.sqrt(((torch.exp(eta).mean(1) - y) ** 2).mean()))
    return out


def standardised_mean_error(summary_post: GaussianPosterior, full_post: GaussianPosterior) -> float:
    diff = torch.linalg.solve_triangular(full_post.scale_tril, (summary_post.mean - full_post.mean)[:, None], upper=False)
    return float(diff.norm())


def evaluate(
    model: Model,
    points: torch.Tensor,
    weights: torch.Tensor,
    full_post: GaussianPosterior,
    *,
    test: torch.Tensor | None = None,
    generator: torch.Generator | None = None,
) -> dict[str, float]:
    """All metrics of one summary against a precomputed full-data posterior."""
    post = summary_posterior(model, points, weights)
    out: dict[str, float] = dict(kl_report(post, full_post, prior_posterior(model)).as_dict())
    out["mean_error"] = standardised_mean_error(post, full_post)
    if test is not None:
        gen = generator if generator is not None else torch.Generator().manual_seed(0)
        out.update(predictive_scores(model, post, test, generator=gen))
    return out


# ---- trust: what an analyst checks (issue 14) --------------------------------------------------
#: Two-sided 95% normal quantile for the central credible interval of a Gaussian summary.
Z95 = 1.959963984540054


@dataclass(frozen=True)
class TrustReport:
    """A summary's posterior judged as an analyst would, coordinate by coordinate.

    ``kl_*`` raw KL in both directions (and divided by the prior's, as the papers plot it);
    ``mean_error_sd_*`` |m_summary - m_full| / sd_full per coordinate (median, max);
    ``coverage`` share of coordinates whose central 95% interval contains the full-data mean;
    ``width_ratio`` median sd_summary / sd_full; ``true_coverage`` share containing the true
    parameter (simulated data only); ``headroom`` median sd_summary / sd_ideal where sd_ideal is
    the width an idealised one-shot Gaussian mechanism on the full-data score would need."""

    kl_summary_full: float
    kl_full_summary: float
    kl_summary_full_over_prior: float
    kl_full_summary_over_prior: float
    mean_error_sd_median: float
    mean_error_sd_max: float
    coverage: float
    width_ratio: float
    true_coverage: float | None = None
    headroom: float | None = None

    def as_dict(self) -> dict[str, float | None]:
        return asdict(self)


def ideal_one_shot_sd(full_post: GaussianPosterior, *, noise_std: float) -> torch.Tensor:
    """Per-coordinate sd of ``N(m_full, Sigma_full + Sigma_full (noise_std^2 I) Sigma_full)``:
    the posterior widened by one Gaussian mechanism on the full-data score with per-coordinate
    noise ``noise_std`` (= single-Gaussian noise multiplier times the score bound), mapped to
    parameters through the full-data curvature (Sigma_full^-1 ~ Hessian + prior precision)."""
    cov = full_post.cov
    return torch.sqrt(torch.diagonal(cov + noise_std**2 * cov @ cov))


def trust_report(
    summary_post: GaussianPosterior,
    full_post: GaussianPosterior,
    prior: GaussianPosterior,
    *,
    truth: torch.Tensor | None = None,
    ideal_sd: torch.Tensor | None = None,
) -> TrustReport:
    """The analyst's checks of ``summary_post`` against ``full_post`` (see :class:`TrustReport`)."""
    kl = kl_report(summary_post, full_post, prior)
    sd_s = torch.sqrt(torch.diagonal(summary_post.cov))
    sd_f = torch.sqrt(torch.diagonal(full_post.cov))
    gap = (summary_post.mean - full_post.mean).abs()
    err = gap / sd_f
    true_cov = None
    if truth is not None:
        true_cov = float(((summary_post.mean - truth).abs() <= Z95 * sd_s).to(DTYPE).mean())
    headroom = None if ideal_sd is None else float((sd_s / ideal_sd).median())
    return TrustReport(
        kl_summary_full=kl.forward, kl_full_summary=kl.reverse,
        kl_summary_full_over_prior=kl.forward_normalised, kl_full_summary_over_prior=kl.reverse_normalised,
        mean_error_sd_median=float(err.median()), mean_error_sd_max=float(err.max()),
        coverage=float((gap <= Z95 * sd_s).to(DTYPE).mean()), width_ratio=float((sd_s / sd_f).median()),
        true_coverage=true_cov, headroom=headroom,
    )
