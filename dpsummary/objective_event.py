"""Objective perturbation's privacy event (issue 50): the ledger's record of one perturbed
minimiser with the release's dithered tilt, and its RDP curve.

:class:`ObjectivePerturbationDpEvent` is a ``dp_accounting`` ``DpEvent`` of our own (immutable,
serialised like the library's, its module whitelisted by :mod:`dpsummary.accounting`). Only the
RDP accountant can compose it: its curve (:func:`dithered_objective_perturbation_rdp`) is an RDP
bound, not a privacy-loss distribution, so the PRV and PLD accountants refuse it
(:class:`dpsummary.accounting.UnsupportedEventError`), a public fact a release checks before it
charges. Imports nothing of dpsummary (``accounting`` imports it).
"""

from __future__ import annotations

import math
from collections.abc import Sequence
from typing import Any

import attr
from dp_accounting import dp_event as dpa

#: Objective perturbation's tilt grid (:func:`dpsummary.private.noise.dithered_gaussian`): 2^k with
#: k = floor(log2(noise sd)) - TILT_GRID_BITS, so the grid is at most :data:`TILT_GRID_RATIO` of the
#: tilt's sd, the public bound the event records and the RDP curve uses.
TILT_GRID_BITS = 40
TILT_GRID_RATIO = 2.0**-TILT_GRID_BITS


@attr.s(frozen=True, slots=True, auto_attribs=True)
class ObjectivePerturbationDpEvent(dpa.DpEvent):
    """One release of :func:`dpsummary.private.objective.perturbed_mode`'s exact perturbed
    minimiser under add/remove adjacency: tilt sd ``noise_multiplier`` times the score bound
    ``L``, Jacobian term ``jacobian_log_ratio`` (:func:`objective_perturbation_jacobian` of the
    public ridge), ``dim`` coordinates, and tilt grid at most ``grid_ratio`` of the tilt sd
    (:data:`TILT_GRID_RATIO`). The output perturbation that accounts for
    the solver's tolerance is a separate ``GaussianDpEvent`` composed with it."""

    noise_multiplier: float
    jacobian_log_ratio: float
    dim: int
    grid_ratio: float


def objective_perturbation_rdp_event(event: ObjectivePerturbationDpEvent, orders: Sequence[float]) -> Any:
    """The event's RDP curve on ``orders`` (:func:`dithered_objective_perturbation_rdp`);
    ``ValueError`` for parameters no release could have recorded."""
    if isinstance(event.dim, bool) or not isinstance(event.dim, int):
        raise ValueError("the event's dim must be an integer")
    for value in (event.noise_multiplier, event.jacobian_log_ratio, event.grid_ratio):
        if isinstance(value, bool) or not isinstance(value, (int, float)) or not math.isfinite(value):
            raise ValueError("the event's parameters must be finite numbers")
    return dithered_objective_perturbation_rdp(noise_multiplier=float(event.noise_multiplier),
                                               jacobian_log_ratio=float(event.jacobian_log_ratio), dim=event.dim,
                                               grid_ratio=float(event.grid_ratio), orders=orders)


def dithered_objective_perturbation_rdp(*, noise_multiplier: float, jacobian_log_ratio: float, dim: int,
                                        grid_ratio: float, orders: Sequence[float]) -> Any:
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
