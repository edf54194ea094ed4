"""RDP curves that are not (yet) ledger events: issue 50's objective perturbation.

:func:`objective_perturbation_rdp` (a continuous tilt) and :func:`dithered_objective_perturbation_rdp`
(the tilt the release draws) are the RDP bounds of :mod:`dpsummary.private.objective`
(derived in that module's docstring; checked against exact divergences in
``tests/private/test_objective_perturbation.py``). No ``DpEvent`` describes it, so the ledger and
``dpsummary audit`` cannot account for it and no release may use it; the benchmarks compose it
with Gaussian curves (:func:`gaussian_rdp`) on :data:`~dpsummary.accounting.RDP_ORDERS` and
convert with Opacus's RDP-to-DP conversion (:func:`epsilon_of_rdp`), the one
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
    (:func:`objective_perturbation_jacobian`). The derivation is the mechanism module's
    docstring; a test checks it against the exact divergence of a one-dimensional instance.

    Not a ``DpEvent``: no ledger or ``dpsummary audit`` accounts for it yet, so no release may
    use it; :func:`epsilon_of_rdp` converts a composed curve."""
    import numpy as np
    from scipy.special import log_ndtr

    if not (noise_multiplier > 0 and math.isfinite(noise_multiplier)) or not jacobian_log_ratio >= 0:
        raise ValueError("the noise multiplier must be positive and finite and the Jacobian term non-negative")
    a = np.asarray(orders, dtype=float)
    z = float(noise_multiplier)
    return jacobian_log_ratio + a / (2.0 * z * z) + (math.log(2.0) + log_ndtr((a - 1.0) / z)) / (a - 1.0)


def dithered_objective_perturbation_rdp(*, noise_multiplier: float, jacobian_log_ratio: float, dim: int,
                                        grid_ratio: float, orders: Sequence[float] = RDP_ORDERS) -> Any:
    """RDP of objective perturbation whose tilt is a dithered discrete Gaussian ``g (K + U)``
    (:func:`dpsummary.private.noise.dithered_gaussian`; ``K`` discrete Gaussian of scale
    ``s = sigma / g`` per coordinate, ``U`` uniform on the unit cell, ``grid_ratio >= g / sigma``),
    the tilt the release can draw exactly. On every order ``alpha`` (``t = alpha - 1``) and for
    every Hoelder split ``p = 1 + eta``, ``q = (1 + eta) / eta``:

        J + (1/z + r sqrt(d))^2 / 2 + p t / (2 z^2) + [log 2 / p + d log 2 / q + d q t^2 r^2 / 2] / t,

    ``z = sigma / L``, ``r = g / sigma``, ``d = dim``; this function returns the minimum over a
    grid of ``eta`` (each is a bound).

    Derivation (the continuous proof's steps, :mod:`dpsummary.private.objective`, with the density
    ``p(b) = P(K = round(b / g)) / g^d``, piecewise constant). At an output ``theta`` the tilts of
    neighbours differ by ``c zeta`` (``|c| <= 1``, ``||zeta|| <= L``); with ``k = round(b / g)`` and
    ``k' = round((b + c zeta) / g)`` the log density ratio is ``(||k'||^2 - ||k||^2) / (2 s^2)``.
    ``v = k' - k`` is within 1 of ``c zeta / g`` in every coordinate, so ``||v|| <= L / g + sqrt(d)``
    and ``k^T v <= |k^T zeta| / g + ||k||_1``: the loss is at most
    ``J + L |w| / sigma^2 + ||k||_1 / s^2 + (L + g sqrt(d))^2 / (2 sigma^2)`` with ``w = g k^T zeta / ||zeta||``.
    Under ``theta ~ M(D)``, ``k`` is exactly ``K``, whose coordinates are independent and
    sub-Gaussian with variance proxy ``s^2`` (Canonne, Kamath and Steinke 2020), so
    ``E exp(u |w|) <= 2 exp(u^2 sigma^2 / 2)`` and ``E exp(m |K_j|) <= 2 exp(m^2 s^2 / 2)``;
    Hoelder's inequality with ``(p, q)`` separates the two terms and gives the bound. The other
    direction has the same bound without ``J``. As ``r -> 0`` it tends to the continuous bound
    with ``log 2`` in place of ``log(2 Phi(t / z))``: at the release's ``r = 2^-40`` the calibrated
    multipliers exceed the continuous curve's by less than 2e-6 relative at epsilon 0.05-3 (tested
    to 1e-5), and on one-dimensional instances with 1-8 grid steps per sd the exact divergence,
    which there exceeds the continuous curve, stays below this one
    (``tests/private/test_objective_perturbation.py``)."""
    import numpy as np

    if not (noise_multiplier > 0 and math.isfinite(noise_multiplier)) or not jacobian_log_ratio >= 0:
        raise ValueError("the noise multiplier must be positive and finite and the Jacobian term non-negative")
    if not (dim >= 1 and 0 < grid_ratio <= 1):
        raise ValueError("dim must be positive and the grid ratio in (0, 1]")
    t = np.asarray(orders, dtype=float)[None, :] - 1.0
    eta = np.logspace(-16, 4, 801)[:, None]
    p, q = 1.0 + eta, (1.0 + eta) / eta
    z, r, d = float(noise_multiplier), float(grid_ratio), float(dim)
    holder = p * t / (2.0 * z * z) + (math.log(2.0) / p + d * math.log(2.0) / q + d * q * t * t * r * r / 2.0) / t
    return jacobian_log_ratio + (1.0 / z + r * math.sqrt(d)) ** 2 / 2.0 + holder.min(axis=0)


def objective_perturbation_jacobian(*, curvature_bound: float, ridge: float) -> float:
    """``-log(1 - beta / ridge)``: the bound on the log determinant ratio of neighbouring
    objectives' Hessians (``beta`` bounds one record's rank-one curvature, ``L^2 / 4`` for
    logistic regression with ``||z|| <= L``; ``ridge > beta``)."""
    if not (0 <= curvature_bound < ridge):
        raise ValueError("the ridge must exceed the record curvature bound")
    return -math.log1p(-curvature_bound / ridge)


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
