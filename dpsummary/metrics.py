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

import dataclasses
import math
from dataclasses import asdict, dataclass

import numpy as np
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
    if model.conjugate or model.exact_moments:
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
        coef = model.split(theta)[0] if isinstance(model, LinearRegression) else theta  # log_sigma is not a coefficient
        eta = model.design(test) @ coef.T
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
    parameter (simulated data only); ``effects_full`` coordinates whose full-data 95% interval
    excludes 0; ``effects_found`` those whose summary interval excludes 0 too, with the same
    sign; ``effects_wrong_sign`` coordinates whose summary interval excludes 0 on the side
    opposite to the full-data mean (a false finding). With an :class:`IdealisedFloor`:
    ``floor_width_ratio`` the floor's median sd / sd_full, ``width_vs_floor`` = width_ratio /
    floor_width_ratio, ``floor_effects_found`` the floor's mean effects found and
    ``effects_vs_floor`` = effects_found / floor_effects_found."""

    kl_summary_full: float
    kl_full_summary: float
    kl_summary_full_over_prior: float
    kl_full_summary_over_prior: float
    mean_error_sd_median: float
    mean_error_sd_max: float
    coverage: float
    width_ratio: float
    effects_full: int
    effects_found: int
    effects_wrong_sign: int
    param_dim: int
    true_coverage: float | None = None
    floor_width_ratio: float | None = None
    width_vs_floor: float | None = None
    floor_effects_found: float | None = None
    effects_vs_floor: float | None = None

    def as_dict(self) -> dict[str, float | None]:
        return asdict(self)


def effects(mean: torch.Tensor, sd: torch.Tensor) -> torch.Tensor:
    """Sign (+1, -1) of each coordinate whose central 95% interval excludes 0, else 0."""
    return torch.where(mean.abs() > Z95 * sd, torch.sign(mean), torch.zeros_like(mean))


@dataclass(frozen=True)
class IdealisedFloor:
    """The most an honest mechanism could show at a budget (issue 27's definition).

    On the release's own model-space rows, with the release's prior: the full-data posterior mode
    ``m`` and the data Hessian ``H`` at ``m`` (prior excluded); sensitivity ``R`` = the largest
    per-record score norm at ``m``; ONE Gaussian mechanism on the summed score at ``m`` with noise
    sd ``sigma R``, ``sigma`` calibrated by the accountant of record to ``share`` (0.8) of the
    release's epsilon at its delta; ``H`` known exactly and free. Its noise-aware posterior has
    precision ``H (H + sigma^2 R^2 I)^-1 H + P`` (its sds do not depend on the noise draw) and
    mean ``precision^-1 (H V^-1 (s + H m) + P mu0)``, ``V = H + sigma^2 R^2 I``, for the released
    score ``s``. No real mechanism can run it (``m`` and ``H`` are private): it bounds power,
    not honesty (its prior shrinkage can pull coverage below 0.9).

    ``sd`` per-coordinate posterior sd; ``width_ratio`` median sd / sd_full; ``effects_found``
    and ``coverage`` means over ``draws`` noise draws; ``wrong_sign`` the mean number of
    wrong-sign effects per draw (intervals excluding 0 on the side opposite to the full-data mean,
    :func:`trust_report`'s definition): where the prior's shrinkage flips a weakly identified
    coordinate, the floor makes them too; ``noise_multiplier`` sigma; ``sensitivity`` R.
    Curator-only (computed from the records)."""

    sd: torch.Tensor
    width_ratio: float
    effects_found: float
    coverage: float
    noise_multiplier: float
    sensitivity: float
    draws: int
    wrong_sign: float = 0.0


def data_hessian(model: Model, points: torch.Tensor, theta: torch.Tensor) -> torch.Tensor:
    """``sum_i -hess log p(x_i | theta)`` (no prior) for GLM-like models."""
    if isinstance(model, GLM):
        w, z = model.record_curvature_factors(points, theta)
        return (z * w[:, None]).T @ z
    return model.record_curvatures(points, theta).sum(0)


def idealised_floor(
    model: Model,
    points: torch.Tensor,
    full_post: GaussianPosterior,
    *,
    epsilon: float,
    delta: float,
    accountant: str = "rdp",
    share: float = 0.8,
    draws: int = 200,
    generator: torch.Generator | None = None,
    sensitivity: float | None = None,
    noise_multiplier: float | None = None,
) -> IdealisedFloor:
    """Compute the :class:`IdealisedFloor` of a release at ``(epsilon, delta)`` on ``points``.

    ``sensitivity`` and ``noise_multiplier`` replace the floor's ``R`` (the largest record score
    norm at the mode) and its calibrated ``sigma``: the same known-curvature mechanism with a
    handicap a real mechanism pays (a public score bound, a smaller share of the budget), for
    decomposing a release's distance from the floor (``benchmarks/frontier.py``). Not the floor
    the suite judges against when either is given.

    Linear regression with sigma estimated (issue 51): the floor of the coefficients at the
    full-data sigma (``exp`` of the full-data posterior's log_sigma mean), i.e. the known-noise
    model's floor on the coefficient block; log_sigma's floor sd is the full-data posterior's
    (the floor does not bound sigma's width), and ``width_ratio``, ``effects_found``,
    ``coverage`` and ``wrong_sign`` are the coefficients'."""
    from . import accounting as acc

    if isinstance(model, LinearRegression) and model.estimates_sigma:
        return _linear_floor(model, points, full_post, epsilon=epsilon, delta=delta, accountant=accountant,
                             share=share, draws=draws, generator=generator, sensitivity=sensitivity,
                             noise_multiplier=noise_multiplier)
    gen = generator if generator is not None else torch.Generator().manual_seed(0)
    m = full_post.mean.detach().to(DTYPE)
    d = m.shape[0]
    h = data_hessian(model, points, m)
    h = 0.5 * (h + h.T)
    scores = model.record_scores(points, m)
    r = float(scores.norm(dim=1).max()) if sensitivity is None else float(sensitivity)
    g = scores.sum(0)
    sigma = (acc.calibrate_gaussian(target_epsilon=share * epsilon, delta=delta,
                                    accountant=accountant)  # type: ignore[arg-type]
             if noise_multiplier is None else float(noise_multiplier))
    eye = torch.eye(d, dtype=DTYPE)
    prior_prec = eye / model.prior_scale**2
    v = h + (sigma * r) ** 2 * eye
    hv = torch.linalg.solve(v, h).T  # H V^-1
    precision = 0.5 * (hv @ h + (hv @ h).T) + prior_prec
    cov = torch.linalg.inv(precision)
    sd = torch.sqrt(torch.diagonal(cov))
    noise = torch.randn(draws, d, generator=gen, dtype=DTYPE) * (sigma * r)
    rhs = (hv @ (g[None, :] + noise + (h @ m)[None, :]).T).T + (prior_prec @ model.prior_mean)[None, :]
    means = rhs @ cov  # cov symmetric: (cov @ rhs^T)^T
    sd_f = torch.sqrt(torch.diagonal(full_post.cov))
    truth_eff = effects(full_post.mean, sd_f)
    drawn_eff = effects(means, sd.expand_as(means))
    found = ((drawn_eff == truth_eff) & (truth_eff != 0)).sum(1).to(DTYPE)
    wrong = ((drawn_eff != 0) & (drawn_eff == -torch.sign(full_post.mean))).sum(1).to(DTYPE)
    covered = ((means - full_post.mean).abs() <= Z95 * sd).to(DTYPE).mean(1)
    return IdealisedFloor(sd=sd, width_ratio=float((sd / sd_f).median()), effects_found=float(found.mean()),
                          coverage=float(covered.mean()), noise_multiplier=float(sigma), sensitivity=r,
                          draws=draws, wrong_sign=float(wrong.mean()))


def _linear_floor(model: LinearRegression, points: torch.Tensor, full_post: GaussianPosterior, **kw: object
                  ) -> IdealisedFloor:
    """:func:`idealised_floor` of a linear model with sigma estimated (see there)."""
    p = model.num_coefficients
    sigma = math.exp(float(full_post.mean[-1]))
    known = LinearRegression(model.num_features, prior_scale=model.prior_scale, noise_scale=sigma,
                             intercept=model.intercept, prior_mean=model.prior_mean[:p].tolist())
    cov = full_post.cov
    block = GaussianPosterior(mean=full_post.mean[:p], scale_tril=torch.linalg.cholesky(cov[:p, :p]))
    inner = idealised_floor(known, points, block, **kw)  # type: ignore[arg-type]
    sd = torch.cat([inner.sd, torch.sqrt(cov[-1:, -1])])
    return dataclasses.replace(inner, sd=sd)


def draws_report(
    draws: np.ndarray,
    full_post: GaussianPosterior,
    *,
    floor: IdealisedFloor | None = None,
) -> dict[str, float | int | None]:
    """The analyst's checks of posterior DRAWS ``(S, d)`` (what ``Release.sample()`` or an
    exporter's sampler returns) against ``full_post``, with the intervals an analyst reads off
    draws: the central 95% interval between the 2.5% and 97.5% quantiles, per coordinate.

    ``coverage`` share of coordinates whose interval contains the full-data mean; ``width_ratio``
    median interval width over the full-data posterior's (``2 * Z95 * sd_full``); ``effects_found``
    coordinates whose full-data interval excludes 0 and whose draws' interval does too, same sign;
    ``effects_wrong_sign`` draws' intervals excluding 0 on the side opposite the full-data mean;
    ``mean_error_sd_max`` the largest |mean of draws - full mean| / sd_full; with ``floor``,
    ``width_vs_floor`` and ``effects_vs_floor`` as in :class:`TrustReport`."""
    x = np.asarray(draws, dtype=np.float64).reshape(-1, int(full_post.mean.shape[0]))
    lo, hi = np.quantile(x, [0.025, 0.975], axis=0)
    m_f = full_post.mean.detach().numpy()
    sd_f = np.sqrt(np.diagonal(full_post.cov.detach().numpy()))
    full_eff = effects(full_post.mean, torch.as_tensor(sd_f)).numpy()
    eff = np.where(lo > 0, 1.0, np.where(hi < 0, -1.0, 0.0))
    found = int(((eff == full_eff) & (full_eff != 0)).sum())
    wrong = int(((eff != 0) & (eff == -np.sign(m_f))).sum())
    # The same median as TrustReport.width_ratio: torch.median, the LOWER middle value for an
    # even number of coordinates (numpy's average of the two made d = 4 tables 4x "wider").
    width = float(torch.median(torch.as_tensor((hi - lo) / (2 * Z95 * sd_f))))
    out: dict[str, float | int | None] = {
        "coverage": float(((lo <= m_f) & (m_f <= hi)).mean()), "width_ratio": width,
        "effects_full": int((full_eff != 0).sum()), "effects_found": found, "effects_wrong_sign": wrong,
        "mean_error_sd_max": float(np.max(np.abs(x.mean(0) - m_f) / sd_f)),
        "width_vs_floor": None, "effects_vs_floor": None}
    if floor is not None:
        out["width_vs_floor"] = width / floor.width_ratio
        out["effects_vs_floor"] = found / floor.effects_found if floor.effects_found > 0 else None
    return out


def trust_report(
    summary_post: GaussianPosterior,
    full_post: GaussianPosterior,
    prior: GaussianPosterior,
    *,
    truth: torch.Tensor | None = None,
    floor: IdealisedFloor | None = None,
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
    full_eff = effects(full_post.mean, sd_f)
    sum_eff = effects(summary_post.mean, sd_s)
    found = int(((sum_eff == full_eff) & (full_eff != 0)).sum())
    wrong = int(((sum_eff != 0) & (sum_eff == -torch.sign(full_post.mean))).sum())
    width = float((sd_s / sd_f).median())
    fw = fv = fe = ev = None
    if floor is not None:
        fw = floor.width_ratio
        fv = width / fw
        fe = floor.effects_found
        ev = found / fe if fe > 0 else None
    return TrustReport(
        kl_summary_full=kl.forward, kl_full_summary=kl.reverse,
        kl_summary_full_over_prior=kl.forward_normalised, kl_full_summary_over_prior=kl.reverse_normalised,
        mean_error_sd_median=float(err.median()), mean_error_sd_max=float(err.max()),
        coverage=float((gap <= Z95 * sd_s).to(DTYPE).mean()), width_ratio=width,
        effects_full=int((full_eff != 0).sum()), effects_found=found, effects_wrong_sign=wrong,
        param_dim=int(full_post.mean.shape[0]), true_coverage=true_cov,
        floor_width_ratio=fw, width_vs_floor=fv, floor_effects_found=fe, effects_vs_floor=ev,
    )
