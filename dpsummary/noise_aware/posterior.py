"""The noise-aware posterior of one round's release (module docstring, 2.) and its variant with
the released curvature's noise integrated out by multiple imputation (7.). Post-processing of
DP outputs.

Numbered references ("module docstring, N.") are to the package docstring,
:mod:`dpsummary.noise_aware`.
"""

from __future__ import annotations

import math
from collections.abc import Callable

import torch

from ..gaussian import DTYPE, GaussianPosterior
from ..models import Model
from .relations import relation_projector
from .released import NonFiniteFit, RoundRelease, _checked, _from_precision, _sym, psd_part
from .support import CurvatureSupport, support_draw


def prior_precision(model: Model) -> torch.Tensor:
    """The prior's precision matrix: ``I / prior_scale^2`` (every model of the package), or the
    model's ``prior_precision_matrix`` when it has one (a non-isotropic Gaussian prior, e.g. the
    analyst's prior carried into a reparametrised working frame; benchmarks/prototypes)."""
    full = getattr(model, "prior_precision_matrix", None)
    if full is not None:
        return full.detach().to(DTYPE)
    return torch.eye(model.param_dim, dtype=DTYPE) / model.prior_scale**2


def noise_aware_posterior(
    model: Model, release: RoundRelease, *, passes: int = 2, start: str = "raw",
    prior_mean: torch.Tensor | None = None,
) -> tuple[GaussianPosterior, GaussianPosterior]:
    """(noise-aware, raw) Gaussian posteriors from one round's release (module docstring, 2.).

    ``passes`` fixed-point passes for ``u``, the first from the raw posterior (``start="raw"``)
    or from ``u = 0`` (``start="anchor"``). Raises :class:`NonFiniteFit` when no finite
    Gaussian results."""
    if start not in ("raw", "anchor"):
        raise ValueError("start must be 'raw' or 'anchor'")
    d = model.param_dim
    eye = torch.eye(d, dtype=DTYPE)
    prior_prec = prior_precision(model)
    mu0 = model.prior_mean if prior_mean is None else prior_mean.detach().to(DTYPE)
    a = release.anchor
    h = psd_part(release.curvature)
    s = release.score
    if not (bool(torch.isfinite(h).all()) and bool(torch.isfinite(s).all())):
        raise NonFiniteFit("the released statistics are not finite")
    raw = _from_precision(_sym(h + prior_prec), s + h @ a + prior_prec @ mu0)
    tau2 = release.curvature_noise_std**2
    score_var = release.score_noise_std**2
    post = raw
    for k in range(max(passes, 1)):
        u = post.mean - a
        spread = float(u @ u) + float(torch.diagonal(post.cov).sum())
        if k == 0 and start == "anchor":
            # The first pass assumes the anchor is the data's MLE (u = 0); later passes plug in
            # the posterior's own u. Avoids starting from the raw posterior, whose mean a noisy
            # curvature can throw arbitrarily far (issue 25).
            u = torch.zeros_like(u)
            spread = 0.0
        sigma_xi = score_var * eye + tau2 * (spread * eye + torch.outer(u, u))
        v = _sym(h + sigma_xi)
        try:
            hv = torch.linalg.solve(v, h).T  # H V^-1 (H, V symmetric)
        except RuntimeError as exc:  # singular V: only with zero noise and zero curvature
            raise NonFiniteFit("the noise-aware statistic covariance is singular") from exc
        precision = _sym(hv @ h + prior_prec)
        post = _from_precision(precision, hv @ (s + h @ a) + prior_prec @ mu0)
    return post, raw


#: Draws of the true curvature in :func:`imputed_posterior` (public).
IMPUTATIONS = 200


def symmetric_noise(dim: int, tau: float, generator: torch.Generator) -> torch.Tensor:
    """Noise of the curvature mechanism's structure (:mod:`dpsummary.private.score_stats`):
    i.i.d. ``N(0, tau^2)`` on the upper triangle, diagonal included, mirrored. Post-processing
    randomness (the caller's non-private generator), never privacy noise."""
    upper = torch.triu(torch.randn(dim, dim, generator=generator, dtype=DTYPE) * tau)
    return upper + torch.triu(upper, 1).T


def trace_kept_spectrum(vals: torch.Tensor) -> torch.Tensor:
    """Eigenvalues of the nearest (Frobenius) PSD matrix with the same trace as the symmetric
    matrix of eigenvalues ``vals``: ``max(vals - kappa, 0)`` at the ``kappa >= 0`` that makes them
    sum to ``sum(vals)`` (all 0 when that sum is not positive; ``kappa = 0`` when the positive part
    already sums to no more). Taking the plain PSD part adds the negative eigenvalues' magnitude
    to the trace, which a noise-dominated draw has in abundance (issue 37's twenty-seventh rule)."""
    total = float(vals.sum())
    positive = vals.clamp(min=0.0)
    if total <= 0.0 or not math.isfinite(total):
        return torch.zeros_like(vals)
    if float(positive.sum()) <= total:
        return positive
    # sum(max(v - kappa, 0)) is piecewise linear and decreasing in kappa: solve on the sorted values.
    desc = torch.sort(vals, descending=True).values
    csum = torch.cumsum(desc, 0)
    kappa = 0.0
    for k in range(desc.shape[0]):
        candidate = (float(csum[k]) - total) / (k + 1)
        if candidate >= 0.0 and (k + 1 == desc.shape[0] or candidate >= float(desc[k + 1])) and candidate <= float(desc[k]):
            kappa = candidate
            break
    return (vals - kappa).clamp(min=0.0)


def imputed_posterior(
    model: Model, release: RoundRelease, *, generator: torch.Generator, draws: int = IMPUTATIONS,
    prior_mean: torch.Tensor | None = None,
    spectrum: Callable[[torch.Tensor], torch.Tensor] | None = None,
    relations: torch.Tensor | None = None,
    support: CurvatureSupport | None = None,
) -> GaussianPosterior:
    """The noise-aware posterior with the released curvature's noise integrated out (module
    docstring, 7.): ``draws`` draws of the true curvature from its flat-prior posterior given the
    release (the released matrix plus fresh noise of the mechanism's structure, PSD part), the
    noise-aware posterior given each draw (the curvature then known, so only the score noise
    enters), and the moment-matched mixture. ``spectrum`` maps each draw's eigenvalues to the
    curvature used (default: the PSD part; e.g. :func:`trace_kept_spectrum`, the nearest PSD
    matrix with the draw's own trace, module docstring 16., the logistic and Poisson default since
    issue 50's thirty-seventh rule; the benchmarks' other spectral candidates). ``relations``
    (rows of ``(r, d)``; the exact ones, :func:`~dpsummary.noise_aware.exact_relations`):
    each draw is projected off their span before its spectrum is taken, so along them the
    posterior is the prior (module docstring, 17.). ``support``
    (:func:`~dpsummary.noise_aware.curvature_support`): each draw is taken under a flat prior on
    the curvature's public support instead of everywhere (:func:`~dpsummary.noise_aware.support_draw`;
    module docstring, 18.). Raises :class:`NonFiniteFit` when fewer than half the draws give a
    finite Gaussian. Post-processing of DP outputs with non-private randomness."""
    dim = release.curvature.shape[0]
    # Given the curvature H = Q diag(lam) Q^T (one draw) and no curvature noise, the posterior of
    # module docstring 2. is diagonal in Q (the prior precision is isotropic): precision
    # lam^2 / (lam + v) + 1/s^2 with v the score noise variance, so one eigendecomposition per
    # draw gives it exactly (the same formula as noise_aware_posterior with tau = 0, O(d^3) once).
    prior_var = model.prior_scale**2
    full_prior = getattr(model, "prior_precision_matrix", None)
    mu0 = (model.prior_mean if prior_mean is None else prior_mean).detach().to(DTYPE)
    score_var = release.score_noise_std**2
    a, s = release.anchor, release.score
    if not (bool(torch.isfinite(release.curvature).all()) and bool(torch.isfinite(s).all())):
        raise NonFiniteFit("the released statistics are not finite")
    proj = relation_projector(relations, dim)
    means: list[torch.Tensor] = []
    cov_sum = torch.zeros(dim, dim, dtype=DTYPE)  # a running sum: 200 d x d matrices would not fit for large d
    for _ in range(draws):
        if support is None:
            draw = _sym(release.curvature + symmetric_noise(dim, release.curvature_noise_std, generator))
        else:
            draw = support_draw(release.curvature, release.curvature_noise_std, support, generator)
        if proj is not None:
            draw = _sym(proj @ draw @ proj)
        vals, vecs = torch.linalg.eigh(draw)
        lam = vals.clamp(min=0.0) if spectrum is None else spectrum(vals)  # the PSD part by default
        denom = lam + score_var
        gain = torch.where(denom > 0, lam / torch.where(denom > 0, denom, 1.0), torch.zeros_like(lam))
        if full_prior is None:
            precision = lam * gain + 1.0 / prior_var
            rhs = gain * (vecs.T @ s + lam * (vecs.T @ a)) + (vecs.T @ mu0) / prior_var
            mean = vecs @ (rhs / precision)
            cov = (vecs / precision) @ vecs.T
        else:  # a non-isotropic prior: the same posterior, solved in full (O(d^3) per draw)
            p_full = full_prior.detach().to(DTYPE)
            prec_full = _sym((vecs * (lam * gain)) @ vecs.T + p_full)
            rhs_full = vecs @ (gain * (vecs.T @ s + lam * (vecs.T @ a))) + p_full @ mu0
            try:
                cov = torch.linalg.inv(prec_full)
            except RuntimeError:
                continue
            mean = cov @ rhs_full
        if bool(torch.isfinite(mean).all()) and bool(torch.isfinite(cov).all()):
            means.append(mean)
            cov_sum += cov
    if len(means) < max(draws // 2, 2):
        raise NonFiniteFit("too few imputed curvatures gave a finite posterior")
    stacked = torch.stack(means)
    cov = _sym(cov_sum / len(means) + torch.cov(stacked.T))
    if not bool(torch.isfinite(cov).all()):
        raise NonFiniteFit("the imputed posterior is not finite")
    try:
        tril = torch.linalg.cholesky(cov)
    except RuntimeError as exc:
        raise NonFiniteFit("the imputed posterior covariance is not positive definite") from exc
    return _checked(GaussianPosterior(stacked.mean(0), tril))
