"""The schedule's options on how the last round's release becomes the posterior (module
docstring, 8., 9., 10., 13. and 14.): the last split chosen by a preposterior, the rounds or
their curvatures pooled, the expansion's error integrated out, and their public constants.
Post-processing of DP outputs.

Numbered references ("module docstring, N.") are to the package docstring,
:mod:`dpsummary.noise_aware`.
"""

from __future__ import annotations

import dataclasses
import math
from collections.abc import Sequence

import torch

from ..gaussian import DTYPE, GaussianPosterior
from ..models import Model
from .bounds import eta_change
from .posterior import imputed_posterior, symmetric_noise
from .released import NonFiniteFit, RoundRelease, _checked, _sym, psd_part

#: ``Schedule.last_split = "preposterior"`` (module docstring, 13.; issue 37's twenty-fourth
#: rule, written before its run): the last round's candidate splits as the score's fraction of
#: its total share (the default's 0.45:0.15, then 0.375:0.225 and 0.3:0.3), the preposterior's
#: draws of the true curvature, the imputations per simulated release, and its fixed seed
#: (post-processing randomness, public). All public.
LAST_SPLITS: tuple[float, ...] = (0.75, 0.625, 0.5)
#: ``Schedule.merge_rounds`` (module docstring, 14.; issue 37's twenty-fifth rule, written before
#: its run): the placement rounds left are merged into the last once a round's step moves the
#: linear predictor by at most this curvature-weighted rms change (the ninth rule's
#: ``POOL_RMS_ETA``). Public.
MERGE_RMS_ETA = 0.25
PREPOSTERIOR_DRAWS = 8
PREPOSTERIOR_IMPUTATIONS = 32
PREPOSTERIOR_SEED = 37


def preposterior_split(model: Model, previous: RoundRelease, *, anchor: torch.Tensor, bounds: tuple[float, float],
                       candidates: Sequence[tuple[float, float]]) -> tuple[int, list[float]]:
    """Which of ``candidates`` (the last round's (score, curvature) noise multipliers) is
    expected to give the narrowest released posterior, judged from the round before it (module
    docstring, 13.): :data:`PREPOSTERIOR_DRAWS` draws of the true curvature from its flat-prior
    posterior given ``previous``'s released curvature (as :func:`imputed_posterior` draws it);
    for each draw and candidate a simulated last release at ``anchor`` taken as the mode (score:
    the candidate's score noise alone; curvature: the draw plus the candidate's curvature noise)
    and its imputed posterior's summed log marginal sds; the mean over draws. Common random
    numbers across candidates, a fixed public seed. Returns the index of the smallest (ties: the
    first) and every candidate's value. Post-processing of DP outputs and public values: costs no
    privacy, and the candidates compose to the same Gaussian, so the choice reveals nothing the
    accountant does not already charge."""
    g = torch.Generator().manual_seed(PREPOSTERIOR_SEED)
    dim = previous.curvature.shape[0]
    score_bound, curvature_bound = bounds
    truths = [psd_part(_sym(previous.curvature + symmetric_noise(dim, previous.curvature_noise_std, g)))
              for _ in range(PREPOSTERIOR_DRAWS)]
    unit_curvature = [symmetric_noise(dim, 1.0, g) for _ in range(PREPOSTERIOR_DRAWS)]
    unit_score = [torch.randn(dim, generator=g, dtype=DTYPE) for _ in range(PREPOSTERIOR_DRAWS)]
    seeds = [int(torch.randint(2**31 - 1, (1,), generator=g)) for _ in range(PREPOSTERIOR_DRAWS)]
    values: list[float] = []
    for s_mult, c_mult in candidates:
        score_sd, tau = s_mult * score_bound, c_mult * curvature_bound
        total = 0.0
        for truth, e, xi, seed in zip(truths, unit_curvature, unit_score, seeds, strict=True):
            simulated = RoundRelease(anchor=anchor, score=score_sd * xi, curvature=truth + tau * e,
                                     score_bound=score_bound, curvature_bound=curvature_bound,
                                     score_noise_std=score_sd, curvature_noise_std=tau)
            try:
                post = imputed_posterior(model, simulated, generator=torch.Generator().manual_seed(seed),
                                         draws=PREPOSTERIOR_IMPUTATIONS)
            except NonFiniteFit:
                total = math.inf
                break
            total += 0.5 * float(torch.log(torch.diagonal(post.cov)).sum())
        values.append(total / PREPOSTERIOR_DRAWS if math.isfinite(total) else math.inf)
    best = min(range(len(candidates)), key=lambda i: (values[i], i))
    return best, values


#: ``Schedule.pool``: earlier rounds whose anchor changes the linear predictor of any record of
#: the public box by at most this much from the last anchor are pooled with the last round
#: (public; written before its run, benchmarks/results/noise_aware_variants.md, eighth rule).
POOL_ETA = 0.25


def pooled_release(model: Model, rounds: Sequence[RoundRelease], *, feature_norm: float,
                   pool_eta: float = POOL_ETA) -> RoundRelease:
    """The last round's release pooled with every earlier round whose anchor lies within
    ``pool_eta`` of the last anchor in linear-predictor change over the public box (module
    docstring, 9.): the curvatures averaged with weights ``1 / tau_k^2`` (noise sd
    ``(sum 1 / tau_k^2)^-1/2``), each score moved to the last anchor through the pooled curvature
    (``s_k - H (a - a_k)``, the quadratic expansion over a step of at most ``pool_eta``) and
    averaged with weights ``1 / sigma_k^2``. When the noise hides the data the anchors barely move
    and every round is pooled, so the placement rounds' budget is not lost; when the anchors
    travel, only the last round (or the last few) is used. Post-processing of DP outputs."""
    last = rounds[-1]
    chosen = [r for r in rounds if eta_change(model, last.anchor - r.anchor, feature_norm) <= pool_eta]
    if len(chosen) < 2 or any(not (r.score_noise_std > 0 and r.curvature_noise_std > 0) for r in chosen):
        return last
    wc = [1.0 / r.curvature_noise_std**2 for r in chosen]
    curvature = _sym(sum((w * r.curvature for w, r in zip(wc, chosen, strict=True)), torch.zeros_like(last.curvature))
                     / sum(wc))
    ws = [1.0 / r.score_noise_std**2 for r in chosen]
    score = sum((w * (r.score - curvature @ (last.anchor - r.anchor)) for w, r in zip(ws, chosen, strict=True)),
                torch.zeros_like(last.score)) / sum(ws)
    return RoundRelease(anchor=last.anchor, score=score, curvature=curvature, score_bound=last.score_bound,
                        curvature_bound=last.curvature_bound, score_noise_std=sum(ws) ** -0.5,
                        curvature_noise_std=sum(wc) ** -0.5)


#: ``Schedule.pool_curvature``: earlier rounds' curvatures are pooled with the last round's
#: when their anchor lies within this curvature-weighted rms change of the linear predictor of
#: the last anchor (public; written before its run, noise_aware_variants.md, ninth rule).
POOL_RMS_ETA = 0.25


def rms_eta(release: RoundRelease, delta: torch.Tensor) -> float | None:
    """The curvature-weighted rms change of the linear predictor, ``sqrt(d^T H d / H_00)``, for
    a parameter change ``d``, read off ``release``'s curvature ``H`` (its intercept entry
    ``H_00`` is the sum of the curvature weights); None when ``H_00`` is not clearly (2 noise
    sds) above its noise. Post-processing of a DP output."""
    h = release.curvature
    h00 = float(h[0, 0])
    if not (h00 > 2.0 * release.curvature_noise_std and math.isfinite(h00)):
        return None
    return math.sqrt(max(float(delta @ h @ delta), 0.0) / h00)


def pooled_curvature_release(model: Model, rounds: Sequence[RoundRelease], *,
                             pool_eta: float = POOL_RMS_ETA) -> RoundRelease:
    """The last round's release with its curvature pooled (module docstring, 10.): the released
    curvatures of every round whose anchor lies within ``pool_eta`` of the last anchor in
    curvature-weighted rms change of the linear predictor (:func:`rms_eta`, read off the last
    round's curvature), averaged with weights ``1 / tau_k^2`` (noise sd ``(sum 1 / tau_k^2)^-1/2``).
    The score stays the last round's. Needs a model with an intercept (else the last round as
    released). Post-processing of DP outputs."""
    last = rounds[-1]
    if not getattr(model, "intercept", False) or not last.curvature_noise_std > 0:
        return last
    chosen = []
    for r in rounds:
        eta = rms_eta(last, last.anchor - r.anchor)
        if eta is not None and eta <= pool_eta and r.curvature_noise_std > 0:
            chosen.append(r)
    if len(chosen) < 2:
        return last
    wc = [1.0 / r.curvature_noise_std**2 for r in chosen]
    curvature = _sym(sum((w * r.curvature for w, r in zip(wc, chosen, strict=True)), torch.zeros_like(last.curvature))
                     / sum(wc))
    return dataclasses.replace(last, curvature=curvature, curvature_noise_std=sum(wc) ** -0.5)


#: ``Schedule.expansion = "data"``: the linear predictor change used is at most this many
#: curvature-weighted rms changes (public; written before its run, benchmarks/results/noise_aware_variants.md).
EXPANSION_RMS_FACTOR = 3.0


def expansion_range(eta: float) -> tuple[float, float]:
    """``(L, U)``: the range of the factor ``1 / c`` by which a Newton step read with the
    anchor's curvature must be scaled when the path-averaged curvature is ``c`` times it and
    every record's linear predictor changes by at most ``eta`` along the step (curvature
    weights with ``|d log w / d eta| <= 1``, :data:`EXPANSION_BIAS_SDS`):
    ``L = eta / (e^eta - 1)``, ``U = eta / (1 - e^-eta)``; both 1 at ``eta = 0``."""
    if eta < 1e-8:
        return 1.0 - eta / 2.0, 1.0 + eta / 2.0
    eta = min(eta, 700.0)
    return eta / math.expm1(eta), eta / -math.expm1(-eta)


def expansion_aware(model: Model, posterior: GaussianPosterior, release: RoundRelease, *, feature_norm: float,
                    eta_rule: str = "box") -> GaussianPosterior:
    """The released posterior with the quadratic expansion's error integrated out (issue 37,
    module docstring, 8.). The last round's posterior reads its released score with the curvature
    at its anchor ``a``; the step ``d = m - a`` it takes is right only if the curvature along the
    step equals the anchor's. With the linear predictors changing by at most ``eta`` along ``d``
    the true step is ``d / c`` with ``1 / c`` in :func:`expansion_range` ``(eta)``. Taking ``1 / c``
    log-uniform on that range (scale-invariant: nothing says which end) and moment-matching gives
    mean ``a + E[1/c] d`` and covariance ``cov + Var(1/c) d d^T``.

    ``eta_rule``: ``"box"`` - ``eta`` is the step's largest change over the public feature box
    (:func:`eta_change`; a bound); ``"data"`` - at most :data:`EXPANSION_RMS_FACTOR` times the
    curvature-weighted rms change ``sqrt(d^T H d / H_00)`` of the released curvature ``H`` (an
    estimate, tighter when the public box is much wider than the data; the box bound when the
    model has no intercept or ``H_00`` is not clearly above its noise). Post-processing of DP
    outputs and public values."""
    a = release.anchor
    d = posterior.mean - a
    eta = eta_change(model, d, feature_norm)
    if eta_rule == "data" and getattr(model, "intercept", False):
        h = release.curvature
        h00 = float(h[0, 0])
        if h00 > 2.0 * release.curvature_noise_std:
            rms = math.sqrt(max(float(d @ h @ d), 0.0) / h00)
            eta = min(eta, EXPANSION_RMS_FACTOR * rms)
    elif eta_rule not in ("box", "data"):
        raise ValueError("eta_rule must be 'box' or 'data'")
    lo, hi = expansion_range(eta)
    if hi - lo < 1e-12:
        return posterior
    span = math.log(hi / lo)
    first = (hi - lo) / span
    second = (hi * hi - lo * lo) / (2.0 * span)
    var = max(second - first * first, 0.0)
    mean = a + first * d
    cov = _sym(posterior.cov + var * torch.outer(d, d))
    try:
        tril = torch.linalg.cholesky(cov)
    except RuntimeError as exc:
        raise NonFiniteFit("the expansion-aware covariance is not positive definite") from exc
    return _checked(GaussianPosterior(mean, tril))
