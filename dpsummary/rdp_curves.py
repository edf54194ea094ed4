"""RDP curves for the benchmarks: issue 50's objective perturbation with a continuous tilt.

:func:`objective_perturbation_rdp` is the RDP bound of :mod:`dpsummary.private.objective` for a
continuous Gaussian tilt (derived in that module's docstring; checked against exact divergences
in ``tests/private/test_objective_perturbation.py``). The release's tilt is dithered; its curve
is a ledger event's (:mod:`dpsummary.objective_event`). The benchmarks compose curves with
Gaussian ones (:func:`gaussian_rdp`) on :data:`~dpsummary.accounting.RDP_ORDERS` and convert
with Opacus's RDP-to-DP conversion (:func:`epsilon_of_rdp`), the one
:func:`dpsummary.accounting.epsilon_rdp` uses.
"""

from __future__ import annotations

import math
import warnings
from collections.abc import Sequence
from typing import Any

from .accounting import RDP_ORDERS, _check_delta, opacus_rdp_analysis


def objective_perturbation_rdp(*, noise_multiplier: float, jacobian_log_ratio: float,
                               orders: Sequence[float] = RDP_ORDERS) -> Any:
    """RDP of objective perturbation for a GLM with bounded score and rank-one curvature (issue 50's
    prototype, :mod:`dpsummary.private.objective`): on every order ``alpha``,
    ``jacobian_log_ratio + alpha / (2 z^2) + log(2 Phi((alpha - 1) / z)) / (alpha - 1)`` with
    ``z = noise sd / score bound`` and ``jacobian_log_ratio = -log(1 - beta / ridge)``
    (:func:`dpsummary.objective_event.objective_perturbation_jacobian`). The derivation is the mechanism module's
    docstring; a test checks it against the exact divergence of a one-dimensional instance.

    Not a ``DpEvent``: the release's tilt is dithered
    (:class:`dpsummary.objective_event.ObjectivePerturbationDpEvent`, whose curve bounds this one).
    :func:`epsilon_of_rdp` converts a composed curve."""
    import numpy as np
    from scipy.special import log_ndtr

    if not (noise_multiplier > 0 and math.isfinite(noise_multiplier)) or not jacobian_log_ratio >= 0:
        raise ValueError("the noise multiplier must be positive and finite and the Jacobian term non-negative")
    a = np.asarray(orders, dtype=float)
    z = float(noise_multiplier)
    return jacobian_log_ratio + a / (2.0 * z * z) + (math.log(2.0) + log_ndtr((a - 1.0) / z)) / (a - 1.0)


def gaussian_rdp(noise_multiplier: float, orders: Sequence[float] = RDP_ORDERS) -> Any:
    """RDP of a Gaussian mechanism of multiplier ``noise_multiplier`` (sensitivity 1): ``alpha / (2 z^2)``."""
    import numpy as np

    return np.asarray(orders, dtype=float) / (2.0 * float(noise_multiplier) ** 2)


def epsilon_of_rdp(rdp: Any, delta: float, orders: Sequence[float] = RDP_ORDERS) -> float:
    """Epsilon at ``delta`` of a composed RDP curve on ``orders``, by Opacus's RDP-to-DP conversion
    (the one :func:`dpsummary.accounting.epsilon_rdp` uses)."""
    _check_delta(delta)
    privacy_analysis = opacus_rdp_analysis()
    with warnings.catch_warnings():
        warnings.simplefilter("ignore")
        eps, _ = privacy_analysis.get_privacy_spent(orders=list(orders), rdp=rdp, delta=delta)
    return float(eps)
