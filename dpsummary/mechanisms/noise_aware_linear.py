"""``noise-aware-newton`` for linear regression with sigma estimated (issue 51): two releases of
a noisy moment matrix instead of score/curvature rounds.

Linear regression is conjugate in its coefficients, and its noise scale needs ``y^T y``, which
no score at a public anchor carries; so the mechanism releases the sufficient statistics
themselves (Bernstein and Sheldon 2019), by Gaussian mechanisms
(:meth:`~dpsummary.private.mechanism.PrivateRecords.noisy_moment_matrix`, sensitivity
:func:`~dpsummary.noise_aware.linear.moment_bound` of the public box):

1. **Anchor round** (share :data:`ANCHOR_SHARE` of the stage-2 Gaussian): the moment matrix of
   ``[1, x, y]``; its noise-aware posterior mean (post-processing) is the public anchor ``a``.
2. **Anchored round** (the rest): the moment matrix of ``[1, x, r]`` with the residual
   ``r = y - [1, x] . a`` clipped to ``[-2 B, 2 B]`` (``B`` the target's public bound: the largest
   residual of a fit whose values stay in the target's range; a larger residual is clipped like a
   record outside the public box). Why: the noise on ``X^T X`` moves the coefficients by
   ``(X^T X)^-1 E (X^T X)^-1 X^T r``, which is small when the residuals are (the same reason the
   GLM rounds re-anchor; measured on wooldridge/gpa2 at epsilon 1, one release at ``a = 0`` gave
   coefficient sds 60-270x the full-data posterior's).

The two design blocks (count, ``X^T 1``, ``X^T X``) estimate the same statistic and are pooled by
inverse noise variance. Post-processing: the noise-aware posterior of ``(beta, log sigma)``
(:func:`~dpsummary.noise_aware.linear.linear_posterior`) and a pseudocoreset whose exact
posterior has its moments (:func:`~dpsummary.constructors.linear_match.match_linear`). Both
releases compose to one Gaussian of the plan's noise multiplier ``sigma`` (shares ``s``:
multipliers ``sigma / sqrt(s)``). The shares and the residual bound are public rules set on
one measured table, not tuned on the suite.
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
ANCHOR_SHARE = 0.3
#: The residual clip, in units of the target's public bound.
RESIDUAL_BOUND_FACTOR = 2.0
#: Imputations of the anchor round's posterior (only its mean is used).
ANCHOR_IMPUTATIONS = 30


def shares() -> tuple[float, float]:
    """The two rounds' shares of the stage-2 Gaussian (public)."""
    return ANCHOR_SHARE, 1.0 - ANCHOR_SHARE


def events(sigma: float) -> list[Any]:
    """The two rounds' Gaussian events at stage-2 multiplier ``sigma``."""
    from dp_accounting import dp_event as dpe

    return [dpe.GaussianDpEvent(sigma / math.sqrt(s)) for s in shares()]

DESCRIPTION = ("linear regression, sigma estimated: two Gaussian mechanisms each release the upper triangle (diagonal "
               "included) of the sum over ALL records of z z^T, first with z = [1, x, y] in model space (the noisy record "
               "count, X^T X, X^T y and y^T y), then with z = [1, x, r], r = y - [1, x] . a clipped to +-residual_bound at "
               "the first release's noise-aware mean a; each record's upper triangle clipped to L2 moment_bound (the "
               "public box's, so a record in the box is never clipped); the design blocks pooled; the posterior of (coefficients, log_sigma) integrates the noise out by "
               "multiple imputation of the design block (PSD part) and, given each, the noise-aware likelihood of X^T r "
               "and r^T r (quadrature over log sigma), moment-matched; the pseudocoreset's exact posterior "
               "is matched to it (post-processing)")


def start_dtype() -> Any:
    from ..gaussian import DTYPE

    return DTYPE


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
    residual_bound = RESIDUAL_BOUND_FACTOR * target_bound
    bound2 = noise_aware.moment_bound(feature_norm=feature_norm, target_bound=residual_bound)
    s1, s2 = shares()
    m1, m2 = plan.noise_multiplier / math.sqrt(s1), plan.noise_multiplier / math.sqrt(s2)
    first = records.noisy_moment_matrix(bound=bound, noise_multiplier=m1)
    try:
        start = noise_aware.linear_posterior(model, first.matrix, first.noise_std, generator=generator,
                                             draws=ANCHOR_IMPUTATIONS)
        anchor = start.mean[:model.num_coefficients].detach()
    except (noise_aware.NonFiniteFit, ArithmeticError, RuntimeError, ValueError):
        anchor = torch.zeros(model.num_coefficients, dtype=start_dtype())  # a public fallback: the prior's centre
    full_anchor = anchor if model.intercept else torch.cat([torch.zeros(1, dtype=anchor.dtype), anchor])
    second = records.noisy_moment_matrix(bound=bound2, noise_multiplier=m2, anchor=full_anchor,
                                         residual_bound=residual_bound)
    try:
        matrix, tau = noise_aware.pooled_moments(first.matrix, first.noise_std, second.matrix, second.noise_std)
        posterior = noise_aware.linear_posterior(model, matrix, tau, generator=generator, anchor=anchor)
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
        "bounds": {"feature_norm": feature_norm, "target_bound": target_bound, "moment_bound": bound,
                   "residual_bound": residual_bound, "anchored_moment_bound": bound2},
        "prior_mean": match.model.prior_mean.tolist(),
        "statistic": MOMENTS,
    }
