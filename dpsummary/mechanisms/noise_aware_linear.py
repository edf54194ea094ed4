"""``noise-aware-newton`` for linear regression with sigma estimated (issue 51): two Gaussian
releases of sufficient statistics instead of score/curvature rounds.

Linear regression is conjugate in its coefficients, and its noise scale needs a residual sum of
squares, which no score at a public anchor carries; so the mechanism releases sufficient
statistics themselves (Bernstein and Sheldon 2019), by Gaussian mechanisms:

1. **Anchor round** (share :data:`ANCHOR_SHARE` of the stage-2 Gaussian): the moment matrix of
   ``[1, x, y]`` (:meth:`~dpsummary.private.mechanism.PrivateRecords.noisy_moment_matrix`,
   sensitivity :func:`~dpsummary.noise_aware.linear.moment_bound` of the public box): the design
   block (count, ``X^T 1``, ``X^T X``) the final posterior uses, and a noise-aware posterior
   whose mean is the public anchor ``a`` and whose sigma sets the residual clip (post-processing).
2. **Anchored round** (the rest): the VECTOR ``[sum_i w_i clip(r_i, c_r), sum_i min(r_i^2, R^2) /
   s]``, ``w_i = [1, x_i]``, ``r_i = y_i - w_i . a``
   (:meth:`~dpsummary.private.mechanism.PrivateRecords.noisy_residual_vector`, sensitivity
   :func:`~dpsummary.noise_aware.linear.residual_bound`). ``R = 2 B`` (``B`` the target's public
   bound: the largest residual of a fit whose values stay in the target's range) bounds the
   residual sum of squares that identifies sigma; the clip ``c_r`` (:func:`clip_rule`: a few
   sds of the residual at the anchor, from the anchor round's DP output) bounds ``X^T r``, which
   carries the coefficients. Why
   not a second moment matrix of ``[1, x, r]`` (the first version): its ``X^T X`` block makes
   one record's sensitivity ``||x||^2``, and measured on wooldridge/gpa2 at epsilon 1 the
   coefficients came out 6x the idealised floor's width; the floor's score noise is about ``||x||
   max|r|``, which this vector's ``X^T r`` block matches when ``c_r`` is a few residual sds.

The posterior (post-processing, :func:`~dpsummary.noise_aware.linear.residual_posterior`):
the design block's noise integrated out by imputation, ``X^T r`` and ``r^T r`` by their
noise-aware likelihood, then a pseudocoreset whose exact posterior has its moments
(:func:`~dpsummary.constructors.linear_match.match_linear`). Both releases compose to one
Gaussian of the plan's noise multiplier ``sigma`` (shares ``s``: multipliers ``sigma /
sqrt(s)``). The shares, ``R`` and the clip rule are public rules (benchmarks/notebook/
linear_sigma.md), not tuned on the suite.
"""

from __future__ import annotations

import math
from typing import TYPE_CHECKING, Any

from ..errors import ChargedRefusal
from .base import NON_FINITE_FIT_FIX, NON_FINITE_FIT_MESSAGE, MechanismPlan

if TYPE_CHECKING:
    import torch

#: The ``settings["statistic"]`` of a linear plan.
MOMENTS = "moments"
#: Share of the stage-2 Gaussian spent on the anchor round; the anchored round gets the rest.
ANCHOR_SHARE = 0.5
#: The residual range ``R`` (the residual sum of squares' clip), in units of the target's public bound.
RESIDUAL_BOUND_FACTOR = 2.0
#: The clip of the residuals in ``X^T r``, in units of the residual's sd at the anchor
#: (:func:`clip_rule`): a Gaussian residual exceeds 4 sds one time in 16,000 (about the largest
#: of a few thousand), so the clip rarely binds where the residuals are near normal and matches
#: the idealised floor's sensitivity, the largest ``|r_i| ||w_i||``; heavier tails are clipped
#: (the notebook's rule; the heavy-tailed simulation and cps1988's wages test it).
RESIDUAL_CLIP_SDS = 4.0
#: z of the anchor round's upper limit for log sigma.
_Z_UPPER = 1.959963984540054
#: Imputations of the anchor round's posterior (only its mean is used).
ANCHOR_IMPUTATIONS = 30

#: Each imputed design block drawn on the schema's one-hot support
#: (:func:`dpsummary.noise_aware.design_support`; issue 50's forty-first rule,
#: benchmarks/notebook/noise_aware_variants.md). Post-processing of the first round's DP output
#: and the public schema; a schema without a categorical column has no support.
DESIGN_SUPPORT = False


def shares() -> tuple[float, float]:
    """The two rounds' shares of the stage-2 Gaussian (public)."""
    return ANCHOR_SHARE, 1.0 - ANCHOR_SHARE


def events(sigma: float) -> list[Any]:
    """The two rounds' Gaussian events at stage-2 multiplier ``sigma``."""
    from dp_accounting import dp_event as dpe

    return [dpe.GaussianDpEvent(sigma / math.sqrt(s)) for s in shares()]

DESCRIPTION = ("linear regression, sigma estimated: two Gaussian mechanisms over ALL records; the first releases the "
               "upper triangle (diagonal included) of the sum of z z^T with z = [1, x, y] in model space (the noisy "
               "record count, X^T X, X^T y and y^T y), each record's upper triangle clipped to L2 moment_bound (the "
               "public box's, so a record in the box is never clipped); the second releases the vector sum of "
               "[w clip(r, residual_clip), min(r^2, residual_range^2) / square_scale], w = [1, x], r = y - w . a at the "
               "first release's noise-aware mean a, residual_clip = min(residual_range, 4 x the residual's sd at a "
               "from the first release: its upper 95% limit for sigma and the anchor's expected error), each record's vector clipped to L2 residual_vector_bound; the posterior of "
               "(coefficients, log_sigma) integrates the noise out by multiple imputation of the first release's design "
               "block (PSD part; projected off the public one-hot relations the first release cannot tell from exact) and, given each, the noise-aware "
               "likelihood of X^T r and r^T r (quadrature over log sigma), moment-matched; the pseudocoreset's exact "
               "posterior is matched to it (post-processing)")


def start_dtype() -> Any:
    from ..gaussian import DTYPE

    return DTYPE


def clip_rule(model: Any, start: Any, first: torch.Tensor, residual_range: float) -> float:
    """The anchored round's residual clip (public: post-processing of the anchor round's DP
    output): ``min(R,`` :data:`RESIDUAL_CLIP_SDS` ``x s)`` with ``s^2 = sigma_hi^2 + tr(C D) / n``:
    ``sigma_hi`` the upper end of the anchor round's 95% interval for sigma, ``C`` its covariance
    of the coefficients and ``D / n`` its design block (PSD part) over its noisy count, so ``s^2``
    is the residual's variance at the anchor (noise plus the anchor's expected error ``w . (beta -
    a)``, averaged over the records): a clip at a few sds of the noise alone would bind wherever
    the anchor is poor and pull ``X^T r`` toward the anchor. Falls back to ``R`` when a term is not
    finite."""
    import torch

    sd_ls = math.sqrt(max(float(start.cov[-1, -1]), 0.0))
    upper = min(float(start.mean[-1]) + _Z_UPPER * sd_ls, 300.0)
    p = model.num_coefficients
    k0 = 0 if model.intercept else 1
    block = 0.5 * (first[:-1, :-1] + first[:-1, :-1].T).to(start.cov.dtype)
    lam, vec = torch.linalg.eigh(block)
    design = ((vec * torch.clamp(lam, min=0.0)) @ vec.T)[k0:, k0:]
    count = max(float(first[0, 0]), 1.0)
    spread = float(torch.trace(start.cov[:p, :p] @ design)) / count
    scale = math.sqrt(math.exp(2.0 * upper) + max(spread, 0.0))
    clip = RESIDUAL_CLIP_SDS * scale
    if not (math.isfinite(clip) and clip > 0):
        return residual_range
    return min(residual_range, clip)


def is_linear(model: Any) -> bool:
    """True for the models this path serves (linear regression with sigma estimated)."""
    from ..models import LinearRegression

    return isinstance(model, LinearRegression) and model.estimates_sigma


def linear_summaries(plan: MechanismPlan, records: Any, size: int, generator: torch.Generator
                     ) -> tuple[Any, dict[str, Any]]:
    """The release's summary and the claim's extra fields (see the module docstring). Total: a
    fit without a finite Gaussian or pseudocoreset ends in a :class:`ChargedRefusal`."""
    import torch

    from .. import noise_aware
    from ..constructors.base import Summary
    from ..constructors.linear_match import match_linear

    model, tf = plan.model, plan.transform
    requested = size
    size = max(size, model.param_dim)
    feature_norm, target_bound = noise_aware.schema_bounds(tf)
    bound = noise_aware.moment_bound(feature_norm=feature_norm, target_bound=target_bound)
    residual_range = RESIDUAL_BOUND_FACTOR * target_bound
    s1, s2 = shares()
    m1, m2 = plan.noise_multiplier / math.sqrt(s1), plan.noise_multiplier / math.sqrt(s2)
    first = records.noisy_moment_matrix(bound=bound, noise_multiplier=m1)
    residual_clip = residual_range
    relations = noise_aware.exact_relations(noise_aware.one_hot_relations(tf, intercept=model.intercept),
                                            first.matrix[:-1, :-1], first.noise_std)
    support = noise_aware.design_support(tf) if DESIGN_SUPPORT else None
    try:
        start = noise_aware.linear_posterior(model, first.matrix, first.noise_std, generator=generator,
                                             draws=ANCHOR_IMPUTATIONS, relations=relations, support=support)
        anchor = start.mean[:model.num_coefficients].detach()
        residual_clip = clip_rule(model, start, first.matrix, residual_range)
    except (noise_aware.NonFiniteFit, ArithmeticError, RuntimeError, ValueError):
        anchor = torch.zeros(model.num_coefficients, dtype=start_dtype())  # a public fallback: the prior's centre
    full_anchor = anchor if model.intercept else torch.cat([torch.zeros(1, dtype=anchor.dtype), anchor])
    scale = noise_aware.square_scale(feature_norm=feature_norm, residual_clip=residual_clip,
                                     residual_range=residual_range)
    bound2 = noise_aware.residual_bound(feature_norm=feature_norm, residual_clip=residual_clip,
                                       residual_range=residual_range, scale=scale)
    second = records.noisy_residual_vector(bound=bound2, noise_multiplier=m2, anchor=full_anchor,
                                           residual_clip=residual_clip, residual_range=residual_range,
                                           square_scale=scale)
    try:
        posterior = noise_aware.residual_posterior(model, first.matrix, first.noise_std, second.vector,
                                                   second.noise_std, scale, anchor, generator=generator,
                                                   relations=relations, support=support)
        match = match_linear(model, posterior, size=size, generator=generator)
    except (noise_aware.NonFiniteFit, ArithmeticError, RuntimeError, ValueError):
        raise ChargedRefusal(NON_FINITE_FIT_MESSAGE, fix=NON_FINITE_FIT_FIX) from None
    if not (bool(torch.isfinite(match.points).all()) and bool(torch.isfinite(match.weights).all())):
        raise ChargedRefusal(NON_FINITE_FIT_MESSAGE, fix=NON_FINITE_FIT_FIX)
    summary = Summary(match.points, match.weights, match.model, noise_aware.MECHANISM, tf.to_dict(),
                      {"posterior": "noise_aware", "match_symmetric_kl": 0.0, "match_method": match.method})
    sd = torch.sqrt(torch.diagonal(posterior.cov))
    # Clamped exponent: the note must not overflow after the charge (a finite Gaussian can still
    # put log sigma's interval beyond float range; decided on DP outputs only).
    lo, hi = (math.exp(min(float(posterior.mean[-1]) + z * float(sd[-1]), 700.0))
              for z in (-1.959963984540054, 1.959963984540054))
    notes = [f"sigma (the residual sd in model space, target scaled into [-1, 1]) estimated privately: 95% interval "
             f"[{lo:.3g}, {hi:.3g}] (noise-aware Gaussian of log_sigma)"]
    if size != requested:
        notes.append(f"pseudocoreset of {size} points, one per parameter (--size {requested} is fewer, and fewer points "
                     "than parameters cannot carry the posterior)")
    if match.carrier_prior_scale is not None:
        notes.append(f"the noise-aware Gaussian is close to or wider than the prior in some direction, so the "
                     f"pseudocoreset carries it under a prior of scale {match.carrier_prior_scale:.4g}")
    if match.sd_ratio_max > 1.03:
        notes.append(f"the pseudocoreset's exact posterior is up to {match.sd_ratio_max:.3g}x wider than the noise-aware "
                     "Gaussian (the intercept: one total weight sets both its precision and sigma's, and sigma's noise-"
                     "aware interval is the wider need); the artifact also carries the Gaussian")
    notes.append(match.note())
    gaussians = {"noise_aware": {"mean": posterior.mean.tolist(), "cov": posterior.cov.tolist()}}
    return summary, {
        "gaussians": gaussians, "notes": notes,
        "pseudocoreset_match": {**match.claim(), "model_prior_scale": model.prior_scale},
        "noise_multipliers": [[m1], [m2]],
        "shares": [s1, s2],
        "anchor": anchor.tolist(),
        "exact_relations": relations.tolist(),
        "design_support": support is not None,
        "bounds": {"feature_norm": feature_norm, "target_bound": target_bound, "moment_bound": bound,
                   "residual_range": residual_range, "residual_clip": residual_clip, "square_scale": scale,
                   "residual_vector_bound": bound2},
        "prior_mean": match.model.prior_mean.tolist(),
        "statistic": MOMENTS,
    }
