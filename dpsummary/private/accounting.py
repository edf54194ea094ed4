"""Privacy accounting: dp_accounting events, Opacus histories, three accountants, calibration.

Privacy model
-------------
Add/remove-one-record adjacency. Every mechanism in dpsummary is a (possibly Poisson-subsampled)
Gaussian mechanism, so every privacy cost is described by a list of Opacus history triples
``(noise_multiplier, sample_rate, steps)``; a plain Gaussian mechanism (DP count, DP
preprocessing) is the triple ``(sigma, 1.0, 1)``.

The durable record of a cost is a ``dp_accounting`` ``DpEvent`` (immutable, with a meaning the
library promises never to change), serialised by :func:`event_to_json` into plain JSON. Only the
event types below are accepted; everything else raises :class:`UnsupportedEventError`, because
the Opacus accountants cannot account for it:

* ``GaussianDpEvent(sigma)``
* ``PoissonSampledDpEvent(q, GaussianDpEvent(sigma))``
* ``SelfComposedDpEvent(<supported>, count)``
* ``ComposedDpEvent([<supported>, ...])``
* ``NoOpDpEvent()`` (costs nothing)

Composition of several releases on one data source is ONE accountant over the concatenated
histories (:func:`epsilon` over the concatenated event list), never the sum of the per-release
epsilons.

Accountants
-----------
* ``"rdp"``: Opacus :class:`~opacus.accountants.RDPAccountant` with the extended order grid
  :data:`RDP_ORDERS` (the default Opacus grid stops at 63 and binds at small epsilon).
* ``"prv"``: Opacus PRV accountant (Gopi et al. 2021); returns its *upper* bound. It models
  Poisson-subsampled Gaussians only, which is all we produce (q = 1 for plain Gaussians).
* ``"pld"``: Google ``dp_accounting`` PLD accountant (pessimistic estimate): an independent
  implementation, used to cross-check Opacus.

Opacus is imported lazily (importing it costs seconds).
"""

from __future__ import annotations

import math
import warnings
from collections import namedtuple
from collections.abc import Iterable, Sequence
from functools import lru_cache
from typing import Any, Literal

import dp_accounting as dpa

Accountant = Literal["rdp", "prv", "pld"]
ACCOUNTANTS: tuple[Accountant, ...] = ("rdp", "prv", "pld")

Triple = tuple[float, float, int]

#: Opacus's default RDP orders (1.1 ... 10.9, 12 ... 63) extended up to 2048. At epsilon ~0.2
#: the optimal order often lies far above 63; the default grid then over-reports epsilon.
RDP_ORDERS: list[float] = (
    [1 + x / 10.0 for x in range(1, 100)]
    + [float(a) for a in range(12, 64)]
    + [float(a) for a in range(64, 1025, 16)]
    + [1536.0, 2048.0]
)

#: PRV accountant tolerances: the returned epsilon is an upper bound within ``eps_error``.
PRV_EPS_ERROR = 1e-3
PRV_DELTA_ERROR_FRACTION = 1e-3  # delta_error = delta * this
#: PLD discretisation (dp_accounting default is 1e-4).
PLD_VALUE_DISCRETIZATION = 1e-4
#: Calibration gives up above this noise multiplier (Opacus uses the same bound).
MAX_SIGMA = 1e6

_EVENT_MODULE = "dp_accounting.dp_event"
_SUPPORTED = {
    "GaussianDpEvent": dpa.GaussianDpEvent,
    "PoissonSampledDpEvent": dpa.PoissonSampledDpEvent,
    "SelfComposedDpEvent": dpa.SelfComposedDpEvent,
    "ComposedDpEvent": dpa.ComposedDpEvent,
    "NoOpDpEvent": dpa.NoOpDpEvent,
}


class UnsupportedEventError(ValueError):
    """An event (or its JSON) that dpsummary cannot account for."""


# --------------------------------------------------------------------------- events <-> triples


def gaussian_event(noise_multiplier: float, count: int = 1) -> dpa.DpEvent:
    """A plain Gaussian mechanism (sensitivity 1 in units of sigma), ``count`` times."""
    return subsampled_gaussian_event(noise_multiplier, 1.0, count)


def subsampled_gaussian_event(
    noise_multiplier: float, sample_rate: float, steps: int
) -> dpa.DpEvent:
    """The canonical event for ``steps`` Poisson-subsampled Gaussian steps.

    ``sample_rate == 1`` yields a bare ``GaussianDpEvent`` (no sampling); ``steps == 1`` omits the
    ``SelfComposedDpEvent`` wrapper. :func:`event_to_triples` inverts this exactly.
    """
    sigma, q, t = _check_triple(noise_multiplier, sample_rate, steps)
    inner: dpa.DpEvent = dpa.GaussianDpEvent(sigma)
    if q < 1.0:
        inner = dpa.PoissonSampledDpEvent(q, inner)
    return inner if t == 1 else dpa.SelfComposedDpEvent(inner, t)


def _check_triple(sigma: Any, q: Any, steps: Any) -> Triple:
    if isinstance(sigma, bool) or isinstance(q, bool) or isinstance(steps, bool):
        raise UnsupportedEventError("event parameters must be numbers, not booleans")
    try:
        s, r = float(sigma), float(q)
    except (TypeError, ValueError):
        raise UnsupportedEventError("event parameters must be numbers") from None
    if not (math.isfinite(s) and s > 0):
        raise UnsupportedEventError(f"noise multiplier must be positive and finite, got {sigma!r}")
    if not (0.0 < r <= 1.0):
        raise UnsupportedEventError(f"sampling probability must lie in (0, 1], got {q!r}")
    if not isinstance(steps, int) or steps < 1:
        raise UnsupportedEventError(f"step count must be a positive integer, got {steps!r}")
    return s, r, steps


def _append_triple(history: list[Triple], triple: Triple) -> None:
    """Append like ``opacus`` ``RDPAccountant.step``: merge with an identical predecessor."""
    if history and history[-1][0] == triple[0] and history[-1][1] == triple[1]:
        history[-1] = (triple[0], triple[1], history[-1][2] + triple[2])
    else:
        history.append(triple)


def _flatten(event: dpa.DpEvent, mult: int, out: list[Triple]) -> None:
    if isinstance(event, dpa.NoOpDpEvent):
        return
    if isinstance(event, dpa.GaussianDpEvent):
        _append_triple(out, _check_triple(event.noise_multiplier, 1.0, mult))
    elif isinstance(event, dpa.PoissonSampledDpEvent):
        if not isinstance(event.event, dpa.GaussianDpEvent):
            raise UnsupportedEventError(
                "only Gaussian mechanisms may be Poisson-subsampled, got "
                f"{type(event.event).__name__}"
            )
        _append_triple(
            out,
            _check_triple(event.event.noise_multiplier, event.sampling_probability, mult),
        )
    elif isinstance(event, dpa.SelfComposedDpEvent):
        if isinstance(event.count, bool) or not isinstance(event.count, int) or event.count < 0:
            raise UnsupportedEventError(f"self-composition count must be >= 0, got {event.count!r}")
        if event.count == 0:
            return
        inner: list[Triple] = []
        _flatten(event.event, 1, inner)
        # RDP/PRV/PLD composition is commutative: (A, B) x n accounts like (A x n, B x n).
        for s, q, t in inner:
            _append_triple(out, (s, q, t * event.count * mult))
    elif isinstance(event, dpa.ComposedDpEvent):
        for e in event.events:
            _flatten(e, mult, out)
    else:
        raise UnsupportedEventError(f"cannot account for {type(event).__name__}")


def events_to_history(events: Iterable[dpa.DpEvent]) -> list[Triple]:
    """Opacus history ``[(noise_multiplier, sample_rate, steps), ...]`` for a sequence of events.

    Identical consecutive mechanisms are merged exactly as Opacus's ``step`` merges them, so
    the history of the events recorded for a run equals the history of an Opacus accountant
    stepped through that run. Raises :class:`UnsupportedEventError` for other event types.
    """
    out: list[Triple] = []
    for e in events:
        if not isinstance(e, dpa.DpEvent):
            raise UnsupportedEventError(f"not a DpEvent: {type(e).__name__}")
        _flatten(e, 1, out)
    return out


def event_to_triples(event: dpa.DpEvent) -> list[Triple]:
    """History triples of one event (see :func:`events_to_history`)."""
    return events_to_history([event])


def history_to_events(history: Iterable[Sequence[Any]]) -> list[dpa.DpEvent]:
    """Inverse of :func:`events_to_history`: one canonical event per triple."""
    return [subsampled_gaussian_event(s, q, t) for s, q, t in history]


# --------------------------------------------------------------------------- JSON


def _nt_to_json(value: Any) -> Any:
    if hasattr(value, "_fields") and hasattr(value, "class_name"):
        return {f: _nt_to_json(getattr(value, f)) for f in value._fields}
    if isinstance(value, (list, tuple)):
        return [_nt_to_json(v) for v in value]
    if isinstance(value, bool) or value is None or isinstance(value, str):
        return value
    if isinstance(value, int):
        return value
    if isinstance(value, float):
        return value
    raise UnsupportedEventError(f"cannot serialise event field of type {type(value).__name__}")


def event_to_json(event: dpa.DpEvent) -> dict[str, Any]:
    """Serialise a supported event to a JSON-able dict (via ``to_named_tuple``).

    Format (stable): ``{"module_name": "dp_accounting.dp_event", "class_name": ..., <fields>}``
    with nested events as nested dicts, lists for ``ComposedDpEvent.events``, noise multipliers and
    probabilities as floats and counts as ints. Unsupported event types are rejected.
    """
    event_to_triples(event)  # validates the whole tree
    return _normalise_json(_nt_to_json(event.to_named_tuple()))


def _normalise_json(d: Any) -> Any:
    """Force float fields to float so that ``1`` and ``1.0`` serialise identically."""
    if isinstance(d, list):
        return [_normalise_json(v) for v in d]
    if not isinstance(d, dict):
        return d
    out = {k: _normalise_json(v) for k, v in d.items()}
    for k in ("noise_multiplier", "sampling_probability"):
        if k in out:
            out[k] = float(out[k])
    return out


def _json_to_nt(d: Any, depth: int = 0) -> Any:
    if depth > 64:
        raise UnsupportedEventError("event JSON nested too deeply")
    if isinstance(d, list):
        return [_json_to_nt(v, depth + 1) for v in d]
    if not isinstance(d, dict):
        return d
    module, cls = d.get("module_name"), d.get("class_name")
    if module != _EVENT_MODULE or cls not in _SUPPORTED:
        # Never let ledger content choose a module to import (from_named_tuple imports it).
        raise UnsupportedEventError(f"unsupported event in JSON: {module!r}.{cls!r}")
    import attr

    expected = {f.name for f in attr.fields(_SUPPORTED[cls])}
    fields = set(d) - {"module_name", "class_name"}
    if fields != expected:
        raise UnsupportedEventError(f"{cls} JSON has fields {sorted(fields)}, expected {sorted(expected)}")
    keys = ["module_name", "class_name", *sorted(fields)]
    nt_cls = namedtuple(f"_{cls}NT", keys)  # type: ignore[misc]  # noqa: PYI024
    return nt_cls(**{k: (d[k] if k in ("module_name", "class_name") else _json_to_nt(d[k], depth + 1)) for k in keys})


def event_from_json(d: dict[str, Any]) -> dpa.DpEvent:
    """Inverse of :func:`event_to_json`; validates the event (only supported types, sane values)."""
    if not isinstance(d, dict):
        raise UnsupportedEventError("event JSON must be an object")
    try:
        event = dpa.DpEvent.from_named_tuple(_json_to_nt(d))
    except UnsupportedEventError:
        raise
    except Exception as exc:  # attrs/type errors from malformed JSON
        raise UnsupportedEventError(f"malformed event JSON: {exc}") from None
    event_to_triples(event)
    return event


def events_to_json(events: Iterable[dpa.DpEvent]) -> list[dict[str, Any]]:
    return [event_to_json(e) for e in events]


def events_from_json(items: Iterable[dict[str, Any]]) -> list[dpa.DpEvent]:
    if not isinstance(items, list):
        raise UnsupportedEventError("events JSON must be a list")
    return [event_from_json(d) for d in items]


# --------------------------------------------------------------------------- epsilon


def _check_delta(delta: float) -> None:
    if not (0.0 < delta < 1.0):
        raise ValueError(f"delta must lie in (0, 1), got {delta!r}")


@lru_cache(maxsize=4096)
def _rdp_one_step(sample_rate: float, noise_multiplier: float) -> Any:
    """Opacus's ``compute_rdp`` for one step on :data:`RDP_ORDERS` (cached; read-only array)."""
    from opacus.accountants.analysis import rdp as privacy_analysis

    with warnings.catch_warnings():
        warnings.simplefilter("ignore")
        vec = privacy_analysis.compute_rdp(
            q=sample_rate, noise_multiplier=noise_multiplier, steps=1, orders=RDP_ORDERS
        )
    vec.setflags(write=False)
    return vec


def _rdp_privacy_spent(history: Sequence[Triple], delta: float) -> tuple[float, float]:
    """Exactly what ``RDPAccountant(history).get_privacy_spent(delta, alphas=RDP_ORDERS)``
    computes (Opacus's ``compute_rdp(steps=T)`` is its one-step vector times T, so caching the
    one-step vector is bit-identical), summed in history order, then Opacus's conversion."""
    from opacus.accountants.analysis import rdp as privacy_analysis

    rdp = sum([_rdp_one_step(q, s) * t for (s, q, t) in history])
    with warnings.catch_warnings():
        # Opacus warns when the optimum is at the grid's edge; see rdp_optimal_order.
        warnings.simplefilter("ignore")
        eps, best = privacy_analysis.get_privacy_spent(orders=RDP_ORDERS, rdp=rdp, delta=delta)
    return float(eps), float(best)


def epsilon_rdp(events: Sequence[dpa.DpEvent], delta: float) -> float:
    """Epsilon of Opacus's RDP accounting (``RDPAccountant`` semantics, orders
    :data:`RDP_ORDERS`) over the events' history; equal to the accountant stepped through the
    same mechanisms (tested bit for bit)."""
    _check_delta(delta)
    history = events_to_history(events)
    if not history:
        return 0.0
    return _rdp_privacy_spent(history, delta)[0]


def rdp_optimal_order(events: Sequence[dpa.DpEvent], delta: float) -> float:
    """The RDP order at which :func:`epsilon_rdp` is attained (the grid edge means: extend it)."""
    _check_delta(delta)
    return _rdp_privacy_spent(events_to_history(events), delta)[1]


def epsilon_prv(events: Sequence[dpa.DpEvent], delta: float) -> float:
    """Upper bound on epsilon from Opacus's PRV accountant (eps_error :data:`PRV_EPS_ERROR`)."""
    _check_delta(delta)
    history = events_to_history(events)
    if not history:
        return 0.0
    from opacus.accountants import PRVAccountant

    acc = PRVAccountant()
    acc.history = list(history)
    with warnings.catch_warnings(), _np_errstate():
        warnings.simplefilter("ignore")  # log(0) warnings at q = 1 are harmless
        return float(
            acc.get_epsilon(
                delta=delta, eps_error=PRV_EPS_ERROR, delta_error=delta * PRV_DELTA_ERROR_FRACTION
            )
        )


def _np_errstate() -> Any:
    import numpy as np

    return np.errstate(divide="ignore", invalid="ignore", over="ignore")


def epsilon_pld(events: Sequence[dpa.DpEvent], delta: float) -> float:
    """Epsilon from ``dp_accounting``'s PLD accountant (pessimistic), an independent check."""
    _check_delta(delta)
    history = events_to_history(events)
    if not history:
        return 0.0
    from dp_accounting.pld import pld_privacy_accountant

    acc = pld_privacy_accountant.PLDAccountant(
        value_discretization_interval=PLD_VALUE_DISCRETIZATION
    )
    for e in history_to_events(history):
        acc.compose(e)
    return float(acc.get_epsilon(delta))


def epsilon(events: Sequence[dpa.DpEvent], delta: float, accountant: Accountant = "rdp") -> float:
    """Epsilon of the composition of ``events`` at ``delta`` under the named accountant."""
    if accountant == "rdp":
        return epsilon_rdp(events, delta)
    if accountant == "prv":
        return epsilon_prv(events, delta)
    if accountant == "pld":
        return epsilon_pld(events, delta)
    raise ValueError(f"unknown accountant {accountant!r}; choose one of {', '.join(ACCOUNTANTS)}")


def epsilons(
    events: Sequence[dpa.DpEvent], delta: float, accountants: Iterable[Accountant] = ACCOUNTANTS
) -> dict[str, float]:
    """``{accountant: epsilon}`` for each accountant."""
    return {a: epsilon(events, delta, a) for a in accountants}


# --------------------------------------------------------------------------- calibration


def calibrate_noise_multiplier(
    *,
    target_epsilon: float,
    delta: float,
    sample_rate: float,
    steps: int,
    prior_events: Sequence[dpa.DpEvent] = (),
    accountant: Accountant = "rdp",
    rel_tol: float = 1e-4,
) -> float:
    """Smallest sigma (to relative tolerance ``rel_tol``) with
    ``epsilon(prior_events + [subsampled_gaussian_event(sigma, sample_rate, steps)]) <= target``.

    The returned sigma always satisfies the target under ``accountant`` (it is the upper end of
    the final bisection bracket). Raises ``ValueError`` when the target is unreachable (the prior
    events alone already reach it, or sigma would exceed :data:`MAX_SIGMA`).
    """
    if not (target_epsilon > 0 and math.isfinite(target_epsilon)):
        raise ValueError(f"target epsilon must be positive and finite, got {target_epsilon!r}")
    if not (0 < rel_tol < 1):
        raise ValueError("rel_tol must lie in (0, 1)")
    _check_delta(delta)
    _check_triple(1.0, sample_rate, steps)
    prior = list(prior_events)
    if prior:
        eps_prior = epsilon(prior, delta, accountant)
        if eps_prior >= target_epsilon:
            raise ValueError(
                f"prior releases already spend epsilon {eps_prior:.6g} >= target {target_epsilon:.6g}"
            )

    def eps_at(sigma: float) -> float:
        return epsilon(
            [*prior, subsampled_gaussian_event(sigma, sample_rate, steps)], delta, accountant
        )

    hi = 1.0
    while eps_at(hi) > target_epsilon:
        hi *= 2.0
        if hi > MAX_SIGMA:
            raise ValueError(
                f"epsilon {target_epsilon:.6g} at delta {delta:.3g} needs noise multiplier > {MAX_SIGMA:g}"
            )
    lo = hi / 2.0
    if hi == 1.0:
        lo = 1.0 / 2.0
        while eps_at(lo) <= target_epsilon:
            hi, lo = lo, lo / 2.0
            if lo < 1e-6:
                return hi
    # invariant: eps_at(lo) > target >= eps_at(hi)
    while (hi - lo) > rel_tol * hi:
        mid = 0.5 * (lo + hi)
        if eps_at(mid) <= target_epsilon:
            hi = mid
        else:
            lo = mid
    return hi


def calibrate_gaussian(
    *,
    target_epsilon: float,
    delta: float,
    prior_events: Sequence[dpa.DpEvent] = (),
    accountant: Accountant = "rdp",
    rel_tol: float = 1e-4,
) -> float:
    """Smallest noise multiplier for ONE plain Gaussian mechanism (q = 1) so that the composition
    with ``prior_events`` stays within ``target_epsilon``. Used to split a release budget:
    calibrate the count alone to its share, then preprocessing with the count as prior to the
    cumulative share, then the optimisation with both as prior to the full target."""
    return calibrate_noise_multiplier(
        target_epsilon=target_epsilon,
        delta=delta,
        sample_rate=1.0,
        steps=1,
        prior_events=prior_events,
        accountant=accountant,
        rel_tol=rel_tol,
    )


def accountant_versions() -> dict[str, str]:
    """Versions of the accounting libraries (recorded in artifacts and ledger entries)."""
    from importlib.metadata import PackageNotFoundError, version

    out: dict[str, str] = {}
    for dist in ("opacus", "dp-accounting"):
        try:
            out[dist] = version(dist)
        except PackageNotFoundError:  # pragma: no cover
            out[dist] = "unknown"
    return out


def accountant_description(accountant: Accountant) -> dict[str, Any]:
    """Parameters that identify an accountant's configuration (for claims and ledgers)."""
    if accountant == "rdp":
        return {"name": "opacus.RDPAccountant", "orders_max": max(RDP_ORDERS), "num_orders": len(RDP_ORDERS)}
    if accountant == "prv":
        return {
            "name": "opacus.PRVAccountant",
            "eps_error": PRV_EPS_ERROR,
            "delta_error": f"delta*{PRV_DELTA_ERROR_FRACTION:g}",
            "bound": "upper",
        }
    if accountant == "pld":
        return {
            "name": "dp_accounting.pld.PLDAccountant",
            "value_discretization_interval": PLD_VALUE_DISCRETIZATION,
            "estimate": "pessimistic",
        }
    raise ValueError(f"unknown accountant {accountant!r}")
