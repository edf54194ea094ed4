"""``noise-aware-newton`` for linear regression with sigma estimated (issue 51): one release of
the noisy moment matrix of ``[1, x, y]`` instead of Newton rounds.

Linear regression is conjugate in its coefficients, and its noise scale needs ``y^T y``, which
no score at a public anchor carries; so the mechanism releases the sufficient statistics
themselves (Bernstein and Sheldon 2019): ONE Gaussian mechanism
(:meth:`~dpsummary.private.mechanism.PrivateRecords.noisy_moment_matrix`, sensitivity
:func:`~dpsummary.noise_aware.linear.moment_bound` of the public box, noise multiplier
calibrated to the whole stage-2 budget). Post-processing: the noise-aware posterior of
``(beta, log sigma)`` (:func:`~dpsummary.noise_aware.linear.linear_posterior`) and a
pseudocoreset whose exact posterior has its moments
(:func:`~dpsummary.constructors.linear_match.match_linear`).
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

DESCRIPTION = ("linear regression, sigma estimated: ONE Gaussian mechanism releases the upper triangle (diagonal included) "
               "of the sum over ALL records of z z^T with z = [1, x, y] in model space (the noisy record count, X^T X, "
               "X^T y and y^T y), each record's upper triangle clipped to L2 moment_bound (the public box's, so a record "
               "in the box is never clipped); the posterior of (coefficients, log_sigma) integrates the noise out by "
               "multiple imputation of the true statistics (PSD, y^T y truncated at the residual floor) and the exact "
               "posterior given each (quadrature over log sigma), moment-matched; the pseudocoreset's exact posterior "
               "is matched to it (post-processing)")


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
    released = records.noisy_moment_matrix(bound=bound, noise_multiplier=plan.noise_multiplier)
    try:
        posterior = noise_aware.linear_posterior(model, released.matrix, released.noise_std, generator=generator)
        match = match_linear(model, posterior, size=size, generator=generator)
    except (noise_aware.NonFiniteFit, ArithmeticError, RuntimeError, ValueError):
        raise ChargedRefusal(NON_FINITE_FIT_MESSAGE, fix=NON_FINITE_FIT_FIX) from None
    if not (bool(torch.isfinite(match.points).all()) and bool(torch.isfinite(match.weights).all())):
        raise ChargedRefusal(NON_FINITE_FIT_MESSAGE, fix=NON_FINITE_FIT_FIX)
    summary = Summary(match.points, match.weights, match.model, noise_aware.MECHANISM, tf.to_dict(),
                      {"posterior": "noise_aware", "match_symmetric_kl": 0.0, "match_method": match.method})
    sd = torch.sqrt(torch.diagonal(posterior.cov))
    lo, hi = (math.exp(float(posterior.mean[-1]) + z * float(sd[-1])) for z in (-1.959963984540054, 1.959963984540054))
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
        "noise_multipliers": [[plan.noise_multiplier]],
        "bounds": {"feature_norm": feature_norm, "target_bound": target_bound, "moment_bound": bound},
        "prior_mean": match.model.prior_mean.tolist(),
        "statistic": MOMENTS,
    }
