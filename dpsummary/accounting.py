"""Privacy accounting: dp_accounting events, Opacus histories, three accountants, calibration.

Privacy model
-------------
Add/remove-one-record adjacency. Every mechanism in dpsummary but objective perturbation is a
(possibly Poisson-subsampled) Gaussian mechanism, so every such privacy cost is described by a list of Opacus history triples
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
* ``dpsummary.objective_event.ObjectivePerturbationDpEvent`` (objective perturbation's perturbed
  minimiser; **RDP only**: its curve is an RDP bound, so :func:`events_to_history`, which the PRV
  and PLD accountants read, refuses it and :func:`events_to_rdp_parts` carries it apart)

Composition of several releases on one data source is ONE accountant over the concatenated
histories (:func:`epsilon` over the concatenated event list), never the sum of the per-release
epsilons.

Accountants
-----------
* ``"rdp"``: Opacus :class:`~opacus.accountants.RDPAccountant` with the extended order grid
  :data:`RDP_ORDERS` (the default Opacus grid stops at 63 and binds at small epsilon). Its
  per-order series is evaluated vectorised (:func:`epsilon_rdp`, within 1e-9 of Opacus's loop,
  about 100x faster); Opacus's own loop (:func:`epsilon_rdp_opacus`) confirms calibrations and
  re-derives every epsilon in ``dpsummary audit``.
* ``"prv"``: Opacus PRV accountant (Gopi et al. 2021); returns its *upper* bound. It models
  Poisson-subsampled Gaussians only, which is all we produce (q = 1 for plain Gaussians).
* ``"pld"``: Google ``dp_accounting`` PLD accountant (pessimistic estimate): an independent
  implementation, used to cross-check Opacus.

Opacus is imported lazily (importing it costs seconds).
"""

from __future__ import annotations

import math
import threading
import warnings
from collections import namedtuple
from collections.abc import Callable, Iterable, Sequence
from functools import lru_cache
from typing import Any, Literal

# The event classes only: the command line defers dp_accounting's __init__ (cli.common.DEFERRED_PACKAGES).
from dp_accounting import dp_event as dpa

from .objective_event import ObjectivePerturbationDpEvent, objective_perturbation_rdp_event
from .opacus_loader import opacus_accountants as opacus_accountants
from .opacus_loader import opacus_rdp_analysis as opacus_rdp_analysis

Accountant = Literal["rdp", "prv", "pld"]
ACCOUNTANTS: tuple[Accountant, ...] = ("rdp", "prv", "pld")

Triple = tuple[float, float, int]

#: Opacus's default RDP orders (1.1 ... 10.9, 12 ... 63) extended up to 2048. At epsilon ~0.2
#: the optimal order often lies far above 63; the default grid then over-reports epsilon.
#: Note: Opacus's series for integer orders uses ``scipy.special.binom``, which overflows for
#: alpha >= 1030, so orders 1536 and 2048 evaluate to +inf or NaN and never bind: the effective
#: grid ends at 1024. They stay listed because claims record this grid.
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

#: dpsummary's own event types, by (module, class): objective perturbation (RDP only).
_OWN_EVENTS = {(ObjectivePerturbationDpEvent.__module__, "ObjectivePerturbationDpEvent"): ObjectivePerturbationDpEvent}


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


#: An RDP-only event and how many times it composes (see :func:`events_to_rdp_parts`).
Curve = tuple[ObjectivePerturbationDpEvent, int]


def _flatten(event: dpa.DpEvent, mult: int, out: list[Triple], curves: list[Curve] | None = None) -> None:
    if isinstance(event, dpa.NoOpDpEvent):
        return
    if isinstance(event, ObjectivePerturbationDpEvent):
        if curves is None:
            raise UnsupportedEventError("objective perturbation is accounted by the RDP accountant only")
        try:
            objective_perturbation_rdp_event(event, RDP_ORDERS[:1])
        except ValueError as exc:
            raise UnsupportedEventError(f"objective perturbation event: {exc}") from None
        curves.append((event, mult))
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
        inner_curves: list[Curve] | None = None if curves is None else []
        _flatten(event.event, 1, inner, inner_curves)
        # RDP/PRV/PLD composition is commutative: (A, B) x n accounts like (A x n, B x n).
        for s, q, t in inner:
            _append_triple(out, (s, q, t * event.count * mult))
        if curves is not None and inner_curves:
            curves.extend((e, t * event.count * mult) for e, t in inner_curves)
    elif isinstance(event, dpa.ComposedDpEvent):
        for e in event.events:
            _flatten(e, mult, out, curves)
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


def events_to_rdp_parts(events: Iterable[dpa.DpEvent]) -> tuple[list[Triple], list[Curve]]:
    """The history triples of :func:`events_to_history` and, apart, the RDP-only events
    (objective perturbation, :mod:`dpsummary.objective_event`) with their composition counts:
    what the RDP accountant composes. The PRV and PLD accountants use
    :func:`events_to_history`, which refuses RDP-only events."""
    out: list[Triple] = []
    curves: list[Curve] = []
    for e in events:
        if not isinstance(e, dpa.DpEvent):
            raise UnsupportedEventError(f"not a DpEvent: {type(e).__name__}")
        _flatten(e, 1, out, curves)
    return out, curves


def rdp_only(events: Iterable[dpa.DpEvent]) -> bool:
    """Whether any event can be composed by the RDP accountant alone (a public fact of the plan)."""
    return bool(events_to_rdp_parts(events)[1])


def composable(events: Sequence[dpa.DpEvent], accountants: Iterable[Accountant] = ACCOUNTANTS) -> tuple[Accountant, ...]:
    """Those of ``accountants`` that can compose ``events``: all, or ``"rdp"`` alone when an
    event is RDP only (:func:`rdp_only`)."""
    only = rdp_only(events)
    return tuple(a for a in accountants if a == "rdp" or not only)


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
    events_to_rdp_parts([event])  # validates the whole tree
    return _normalise_json(_nt_to_json(event.to_named_tuple()))


def _normalise_json(d: Any) -> Any:
    """Force float fields to float so that ``1`` and ``1.0`` serialise identically."""
    if isinstance(d, list):
        return [_normalise_json(v) for v in d]
    if not isinstance(d, dict):
        return d
    out = {k: _normalise_json(v) for k, v in d.items()}
    for k in ("noise_multiplier", "sampling_probability", "jacobian_log_ratio", "grid_ratio"):
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
    module, cls = str(module), str(cls)
    known = _SUPPORTED.get(cls) if module == _EVENT_MODULE else _OWN_EVENTS.get((module, cls))
    if known is None:
        # Never let ledger content choose a module to import (from_named_tuple imports it).
        raise UnsupportedEventError(f"unsupported event in JSON: {module!r}.{cls!r}")
    import attr

    expected = {f.name for f in attr.fields(known)}
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
    events_to_rdp_parts([event])
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


def _rdp_one_step(sample_rate: float, noise_multiplier: float) -> Any:
    """Opacus's ``compute_rdp`` for one step on :data:`RDP_ORDERS` (cached; read-only array)."""
    privacy_analysis = opacus_rdp_analysis()

    with warnings.catch_warnings():
        warnings.simplefilter("ignore")
        vec = privacy_analysis.compute_rdp(
            q=sample_rate, noise_multiplier=noise_multiplier, steps=1, orders=RDP_ORDERS
        )
    vec.setflags(write=False)
    return vec


def _rdp_privacy_spent(history: Sequence[Triple], delta: float, *, reference: bool = False,
                       curves: Sequence[Curve] = ()) -> tuple[float, float]:
    """``RDPAccountant(history).get_privacy_spent(delta, alphas=RDP_ORDERS)``: the one-step RDP
    vectors times their step counts, summed in history order, then Opacus's RDP-to-DP conversion.

    ``reference=True`` takes the one-step vectors from Opacus's own loop (:func:`_rdp_one_step`;
    Opacus's ``compute_rdp(steps=T)`` is its one-step vector times T, so this is bit-identical to
    the accountant); otherwise from the vectorised series (:func:`_rdp_one_step_fast`), which
    agrees with it to far below 1e-9 relative in epsilon (tested) at a hundredth of the cost.
    """
    privacy_analysis = opacus_rdp_analysis()

    one_step = _rdp_one_step if reference else _rdp_one_step_fast
    rdp = sum([one_step(q, s) * t for (s, q, t) in history]
              + [objective_perturbation_rdp_event(e, RDP_ORDERS) * t for e, t in curves])
    with warnings.catch_warnings():
        # Opacus warns when the optimum is at the grid's edge; see rdp_optimal_order.
        warnings.simplefilter("ignore")
        eps, best = privacy_analysis.get_privacy_spent(orders=RDP_ORDERS, rdp=rdp, delta=delta)
    return float(eps), float(best)


@lru_cache(maxsize=4096)
def _rdp_one_step_fast(sample_rate: float, noise_multiplier: float) -> Any:
    """Opacus's one-step RDP vector on :data:`RDP_ORDERS`, every order's series vectorised.

    This is how dpsummary evaluates RDP (release, ledger budget checks); :func:`_rdp_one_step`
    (Opacus itself) confirms every calibrated noise multiplier and serves ``dpsummary audit``.
    Opacus sums the integer-order series
    ``log A_alpha = logsumexp_i [log C(alpha, i) + i log q + (alpha - i) log(1 - q)
    + (i^2 - i) / (2 sigma^2)]`` (Mironov, Talwar and Zhang 2019, Section 3.3) term by term in
    Python, which costs about 30 ms per (q, sigma) at orders up to 2048. Here the same terms are
    built in one array and summed with a single logsumexp; the binomial coefficient is the same
    ``scipy.special.binom``, so orders whose coefficient overflows (alpha >= 1030: 1536 and 2048
    on our grid) come out +inf or NaN exactly as in Opacus (both are never the optimum).
    Fractional orders use :func:`_log_a_frac_vectorised`, falling back to Opacus's own loop for
    any order whose series does not converge within its window. Agreement with Opacus is tested
    per order (absolute 1e-12 relative to max(1, value): the
    near-zero orders are cancellations where both carry rounding) and on epsilon (1e-9 relative).
    """
    import numpy as np
    privacy_analysis = opacus_rdp_analysis()
    from scipy import special

    q, sigma = float(sample_rate), float(noise_multiplier)
    orders = np.asarray(RDP_ORDERS, dtype=np.float64)
    if q == 1.0:
        vec = orders / (2 * sigma**2)
    else:
        vec = np.empty_like(orders)
        is_int = np.array([float(a).is_integer() for a in RDP_ORDERS])
        with warnings.catch_warnings(), _np_errstate():
            warnings.simplefilter("ignore")
            frac = np.flatnonzero(~is_int)
            vec[frac] = _log_a_frac_vectorised(q, sigma, orders[frac]) / (orders[frac] - 1)
            # Where the vectorised series cannot answer (not converged within its window, or the
            # alternating signed sum cancelled numerically), Opacus's own loop does.
            for j in frac[~np.isfinite(vec[frac])]:
                vec[j] = privacy_analysis._compute_rdp(q, sigma, float(orders[j]))
            alphas = orders[is_int].astype(np.int64)
            owner = np.repeat(np.arange(alphas.size), alphas + 1)
            starts = np.concatenate([[0], np.cumsum(alphas + 1)[:-1]])
            i = np.arange(owner.size) - starts[owner]
            a = alphas[owner]
            terms = (np.log(special.binom(a, i)) + i * math.log(q) + (a - i) * math.log(1 - q)
                     + (i * i - i) / (2 * (sigma**2)))
            top = np.maximum.reduceat(terms, starts)
            finite_top = np.where(np.isfinite(top), top, 0.0)
            sums = np.add.reduceat(np.exp(terms - finite_top[owner]), starts)
            log_a = np.where(np.isinf(top), top, np.log(sums) + finite_top)
            # Opacus's running log-add turns a second +inf term into NaN (inf - inf): mirror it.
            overflowed = np.add.reduceat(np.isposinf(terms).astype(np.int64), starts)
            log_a = np.where(overflowed >= 2, np.nan, log_a)
            vec[is_int] = log_a / (alphas - 1)
    vec.setflags(write=False)
    return vec


#: Terms of the fractional-order series evaluated at once; orders whose series has not met
#: Opacus's stopping rule within the window fall back to Opacus's loop.
_FRAC_TERMS = 256


def _log_a_frac_vectorised(q: float, sigma: float, alphas: Any) -> Any:
    """Opacus's ``_compute_log_a_for_frac_alpha`` for many fractional orders at once (NaN where
    the series needs more than :data:`_FRAC_TERMS` terms or its signed sum is not positive in
    floating point; the caller then uses Opacus's loop for that order).

    The same two series (integrals below and above z0, Mironov et al. 2019, Section 3.3), term i
    with sign sign(C(alpha, i)), truncated after the first term whose two parts are both below
    exp(-30), exactly Opacus's do-until rule; the signed terms are summed relative to their
    maximum instead of by repeated log-add/log-sub.
    """
    import numpy as np
    from scipy import special

    a = np.asarray(alphas, dtype=np.float64)[:, None]
    i = np.arange(_FRAC_TERMS, dtype=np.float64)[None, :]
    j = a - i
    z0 = sigma**2 * math.log(1 / q - 1) + 0.5
    coef = special.binom(a, i)
    log_coef = np.log(np.abs(coef))
    log_t0 = log_coef + i * math.log(q) + j * math.log(1 - q)
    log_t1 = log_coef + j * math.log(q) + i * math.log(1 - q)
    log_e0 = math.log(0.5) + math.log(2) + special.log_ndtr(-((i - z0) / (math.sqrt(2) * sigma)) * 2**0.5)
    log_e1 = math.log(0.5) + math.log(2) + special.log_ndtr(-((z0 - j) / (math.sqrt(2) * sigma)) * 2**0.5)
    log_s0 = log_t0 + (i * i - i) / (2 * (sigma**2)) + log_e0
    log_s1 = log_t1 + (j * j - j) / (2 * (sigma**2)) + log_e1
    stop = np.maximum(log_s0, log_s1) < -30
    done = stop.any(axis=1)
    last = np.where(done, stop.argmax(axis=1), _FRAC_TERMS - 1)
    keep = i <= last[:, None]
    sign = np.sign(coef)

    def signed_logsum(log_s: Any) -> Any:
        log_s = np.where(keep, log_s, -np.inf)
        top = log_s.max(axis=1, keepdims=True)
        total = (sign * np.exp(log_s - top)).sum(axis=1)
        return np.log(total) + top[:, 0]

    log_a0, log_a1 = signed_logsum(log_s0), signed_logsum(log_s1)
    top = np.maximum(log_a0, log_a1)
    out = np.log1p(np.exp(np.minimum(log_a0, log_a1) - top)) + top
    return np.where(done, out, np.nan)


def epsilon_rdp(events: Sequence[dpa.DpEvent], delta: float) -> float:
    """Epsilon of Opacus's RDP accounting (``RDPAccountant`` semantics, orders
    :data:`RDP_ORDERS`) over the events' history, evaluated with the vectorised series: within
    1e-9 relative of the accountant stepped through the same mechanisms (tested). Noise
    multipliers are calibrated so that :func:`epsilon_rdp_opacus` (the bit-exact loop) meets the
    target, and ``dpsummary audit`` recomputes with that loop."""
    _check_delta(delta)
    history, curves = events_to_rdp_parts(events)
    if not history and not curves:
        return 0.0
    return _rdp_privacy_spent(history, delta, curves=curves)[0]


def epsilon_rdp_opacus(events: Sequence[dpa.DpEvent], delta: float) -> float:
    """:func:`epsilon_rdp` computed by Opacus's own per-order loop: bit for bit what
    ``RDPAccountant`` returns (about 30-100 ms per distinct (q, sigma); cached)."""
    _check_delta(delta)
    history, curves = events_to_rdp_parts(events)
    if not history and not curves:
        return 0.0
    return _rdp_privacy_spent(history, delta, reference=True, curves=curves)[0]


def rdp_optimal_order(events: Sequence[dpa.DpEvent], delta: float) -> float:
    """The RDP order at which :func:`epsilon_rdp` is attained (the grid edge means: extend it)."""
    _check_delta(delta)
    history, curves = events_to_rdp_parts(events)
    return _rdp_privacy_spent(history, delta, curves=curves)[1]


def epsilon_prv(events: Sequence[dpa.DpEvent], delta: float) -> float:
    """Upper bound on epsilon from Opacus's PRV accountant (eps_error :data:`PRV_EPS_ERROR`).

    Evaluated by the accountant worker process when one was started
    (:func:`start_accountant_worker`), else in this process; the same code either way."""
    _check_delta(delta)
    history = events_to_history(events)
    if not history:
        return 0.0
    return _from_worker("prv", history, delta)


def _prv_of_history(history: Sequence[Triple], delta: float) -> float:
    """Opacus's ``PRVAccountant(history).get_epsilon`` at :data:`PRV_EPS_ERROR` (upper bound)."""
    acc = opacus_accountants("prv").PRVAccountant()
    acc.history = list(history)
    with warnings.catch_warnings(), _np_errstate():
        warnings.simplefilter("ignore")  # log(0) warnings at q = 1 are harmless
        return float(
            acc.get_epsilon(
                delta=delta, eps_error=PRV_EPS_ERROR, delta_error=delta * PRV_DELTA_ERROR_FRACTION
            )
        )


class _AccountantWorker:
    """A child Python process that evaluates the PRV and PLD accountants for this one (see
    :func:`start_accountant_worker`). Requests and answers are JSON lines on its stdin and
    stdout; the history and delta are public, and JSON carries Python floats exactly (shortest
    round-trip ``repr``), so the answer is the float this process would compute. One request at
    a time."""

    def __init__(self) -> None:
        import os
        import subprocess
        import sys
        from pathlib import Path

        # The same interpreter and the same dpsummary as this process: its package directory
        # first on the path, and no working directory on it (-P).
        here = str(Path(__file__).resolve().parents[1])
        path = os.pathsep.join(p for p in (here, os.environ.get("PYTHONPATH")) if p)
        self._lock = threading.Lock()
        self._proc = subprocess.Popen(
            [sys.executable, "-P", "-c", "from dpsummary.accounting import serve_accountant_worker as s; s()"],
            stdin=subprocess.PIPE, stdout=subprocess.PIPE, stderr=subprocess.DEVNULL, text=True,
            env={**os.environ, "OMP_NUM_THREADS": "1", "PYTHONPATH": path},
        )

    def epsilon(self, accountant: str, history: Sequence[Triple], delta: float) -> float | None:
        """The worker's epsilon, or None if the worker is gone or answered anything but one."""
        import json

        with self._lock:
            stdin, stdout = self._proc.stdin, self._proc.stdout
            if stdin is None or stdout is None or self._proc.poll() is not None:
                return None
            request = {"accountant": accountant, "history": [list(h) for h in history], "delta": delta}
            try:
                stdin.write(json.dumps(request) + "\n")
                stdin.flush()
                reply = json.loads(stdout.readline() or "{}")
            except (OSError, ValueError):
                return None
        value = reply.get("epsilon") if isinstance(reply, dict) else None
        return float(value) if isinstance(value, float) else None

    def close(self) -> None:
        """End of input: the worker finishes its loop and exits (not waited for)."""
        stdin = self._proc.stdin
        if stdin is not None:
            try:
                stdin.close()
            except OSError:
                pass


_WORKER: _AccountantWorker | None = None


_WORKER_LOCK = threading.Lock()  # the claim's accountants run on a second thread


def start_accountant_worker() -> None:
    """Start (once per process) a child process that evaluates the PRV and PLD accountants for
    this one.

    Why: a release's claim needs the PRV bound (about 0.45 s of numpy/scipy) and the PLD
    epsilon, and the source's total the PLD one again; their libraries take about 0.6 s to
    import (scipy.stats, scipy.signal). In this process they contend for the interpreter lock
    with the release's own imports and passes; in a process of their own they load while the
    release imports torch and run on the second core (issue 29). Called by the ``release``
    command once its public checks pass. Without a worker (or if it fails) the accountants run
    in this process: the same code and the same floats, only slower. The worker sees public
    values only (noise multipliers, sampling rates, step counts and delta), never a record."""
    global _WORKER
    with _WORKER_LOCK:
        if _WORKER is not None:
            return
        import atexit

        _WORKER = _AccountantWorker()
        atexit.register(_WORKER.close)


def _in_process(accountant: str, history: Sequence[Triple], delta: float) -> float:
    """``accountant``'s epsilon of ``history`` at ``delta``, computed in this process with its
    numerical libraries held to one thread. Why: PRV's epsilon moved in its last bits with the
    BLAS thread count (1.0331178750604837 at one thread, ...844 at the machine's default), so
    without the limit the epsilon a ledger records would depend on the machine, not only on the
    event history (the worker runs single-threaded; ``threadpoolctl`` is how scikit-learn and
    NumPy's own docs hold a pool)."""
    from threadpoolctl import threadpool_limits

    if accountant not in ("prv", "pld"):
        raise ValueError(f"the worker evaluates prv and pld, not {accountant!r}")
    with threadpool_limits(limits=1):
        return _prv_of_history(history, delta) if accountant == "prv" else _pld_of_history(history, delta)


def _from_worker(accountant: str, history: Sequence[Triple], delta: float) -> float:
    """``accountant``'s epsilon of ``history`` at ``delta``: from the worker if one runs and
    answers, else computed here (identical code and float)."""
    worker = _WORKER
    if worker is not None:
        eps = worker.epsilon(accountant, history, delta)
        if eps is not None:
            return eps
    return _in_process(accountant, history, delta)


def serve_accountant_worker() -> None:
    """The worker's loop (see :class:`_AccountantWorker`): one JSON request per stdin line, one
    answer per stdout line, until stdin closes. Loads both accountants before the first request."""
    import json
    import sys

    out = sys.stdout
    sys.stdout = sys.stderr  # nothing but answers on the answer channel
    opacus_accountants("prv")
    from dp_accounting.pld import pld_privacy_accountant  # noqa: F401

    for line in sys.stdin:
        try:
            request = json.loads(line)
            history = [(float(s), float(q), int(t)) for s, q, t in request["history"]]
            answer: dict[str, Any] = {"epsilon": _in_process(str(request["accountant"]), history,
                                                             float(request["delta"]))}
        except Exception as exc:  # noqa: BLE001 - reported to the caller, which computes it itself
            answer = {"error": type(exc).__name__}
        out.write(json.dumps(answer) + "\n")
        out.flush()


def _np_errstate() -> Any:
    import numpy as np

    return np.errstate(divide="ignore", invalid="ignore", over="ignore")


def epsilon_pld(events: Sequence[dpa.DpEvent], delta: float) -> float:
    """Epsilon from ``dp_accounting``'s PLD accountant (pessimistic), an independent check.
    Evaluated by the accountant worker when one was started (:func:`start_accountant_worker`)."""
    _check_delta(delta)
    history = events_to_history(events)
    if not history:
        return 0.0
    return _from_worker("pld", history, delta)


def _pld_of_history(history: Sequence[Triple], delta: float) -> float:
    """``dp_accounting``'s PLD accountant over one canonical event per history triple."""
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


def selection_slack(extra_deltas: Iterable[float]) -> float:
    """The epsilon added by delta spent outside the Gaussian events: ``-log(1 - x)`` summed over
    every such delta ``x`` (DP schema estimation's partition selection is a
    ``(-log(1 - x), x)``-DP step under add/remove adjacency). Pure arithmetic on public
    parameters; summed in the given order so every caller gets the same float."""
    slack = 0.0
    for x in extra_deltas:
        x = float(x)
        if not (0.0 <= x < 1.0):
            raise ValueError(f"extra delta {x!r} outside [0, 1)")
        if x > 0:
            slack += -math.log1p(-x)
    return slack


def composed_epsilon(
    events: Sequence[dpa.DpEvent],
    *,
    delta: float,
    extra_delta: float = 0.0,
    extra_deltas: Iterable[float] = (),
    accountant: Accountant = "rdp",
) -> float:
    """THE composed epsilon of a source or of one release: ``epsilon(events, delta,
    accountant) - log1p(-extra_delta)`` (:func:`selection_slack` of ``extra_deltas`` then
    ``extra_delta``). The ledger's budget check and ``spent``, the audit's accountant of record
    and the artifact's claim all call it, so they agree to the bit.

    ``delta`` is the delta at which the events are composed: the caller passes its total delta
    MINUS the extra deltas (those are spent by the partition selection, not by the events).
    A release passes its one ``extra_delta``; a source passes the list of every charged
    reserve's ``extra_delta`` as ``extra_deltas``. Raises ``ValueError`` for an extra delta
    outside [0, 1) or an unknown accountant."""
    return epsilon(events, delta, accountant) + selection_slack([*extra_deltas, extra_delta])


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

    The returned sigma always satisfies the target under ``accountant`` as its library computes
    it (for RDP, Opacus's own loop, :func:`epsilon_rdp_opacus`): the bisection runs on the fast
    evaluation and :func:`_confirm` checks its upper end with the exact one. Raises
    ``ValueError`` when the target is unreachable (the prior events alone already reach it, or
    sigma would exceed :data:`MAX_SIGMA`).
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

    def of_record(sigma: float) -> float:
        events = [*prior, subsampled_gaussian_event(sigma, sample_rate, steps)]
        return epsilon_rdp_opacus(events, delta) if accountant == "rdp" else eps_at(sigma)

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
                return _confirm(hi, of_record, target_epsilon, rel_tol)
    # invariant: eps_at(lo) > target >= eps_at(hi)
    while (hi - lo) > rel_tol * hi:
        mid = 0.5 * (lo + hi)
        if eps_at(mid) <= target_epsilon:
            hi = mid
        else:
            lo = mid
    return _confirm(hi, of_record, target_epsilon, rel_tol)


def _confirm(sigma: float, of_record: Any, target_epsilon: float, rel_tol: float) -> float:
    """Raise ``sigma`` in steps of ``rel_tol / 10`` until the accountant of record, evaluated
    exactly as its library does (Opacus's own loop for RDP), agrees that it meets the target.
    The search above uses the vectorised series, which differs from the loop by rounding only,
    so a step is almost never needed."""
    for _ in range(1000):
        if of_record(sigma) <= target_epsilon:
            return sigma
        sigma *= 1.0 + rel_tol / 10
    raise RuntimeError("calibration could not be confirmed by the accountant of record")


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


def calibrate_split_gaussian(
    events_of: Callable[[float], list[dpa.DpEvent]],
    *,
    target_epsilon: float,
    delta: float,
    prior_events: Sequence[dpa.DpEvent] = (),
    accountant: Accountant = "rdp",
) -> tuple[float, list[dpa.DpEvent]]:
    """Single-Gaussian noise multiplier ``sigma`` for a stage that releases several Gaussian
    statistics whose multipliers split ``sigma`` by shares (``events_of(sigma)``: multipliers
    ``sigma / sqrt(share)``, shares summing to 1), and those events. They compose to exactly one
    Gaussian of multiplier ``sigma`` (RDP: orders add; PLD: Gaussian PLDs compose to a Gaussian),
    so calibrating that Gaussian calibrates them; the result is re-checked on the actual events
    and ``sigma`` nudged up where rounding made the composition exceed the target."""
    sigma = calibrate_gaussian(target_epsilon=target_epsilon, delta=delta, prior_events=prior_events,
                               accountant=accountant)
    for _ in range(50):
        events = events_of(sigma)
        if epsilon([*prior_events, *events], delta, accountant) <= target_epsilon * (1 + 1e-6):
            return sigma, events
        sigma *= 1.0 + 1e-4
    raise RuntimeError("the split Gaussian's calibration could not be confirmed by the accountant")


def gaussian_delta(sigma: float, epsilon: float) -> float:
    """Exact delta of the Gaussian mechanism of noise multiplier ``sigma`` (sensitivity 1) at
    ``epsilon``: ``Phi(-eps sigma + 1/(2 sigma)) - e^eps Phi(-eps sigma - 1/(2 sigma))`` (Balle
    and Wang 2018, Theorem 8; its privacy profile, which PLD computes up to discretisation)."""
    a, b = 1.0 / (2.0 * sigma), epsilon * sigma

    def phi(x: float) -> float:
        return 0.5 * math.erfc(-x / math.sqrt(2.0))

    return max(phi(a - b) - math.exp(epsilon) * phi(-a - b), 0.0)


def calibrate_part(*, target_epsilon: float, delta: float, prior_events: Sequence[dpa.DpEvent] = ()) -> float:
    """Noise multiplier of one budget part's plain Gaussian mechanism (record count, schema,
    quality counts, DP initialisation): the smallest whose composition with ``prior_events``
    (plain Gaussian mechanisms) is (``target_epsilon``, ``delta``)-DP by the Gaussian
    mechanism's exact privacy profile (:func:`gaussian_delta`: Gaussians of multipliers
    ``sigma_i`` compose to one of ``(sum sigma_i^-2)^-1/2``), whatever the accountant of record.

    Why not the accountant of record (issue 37): a part is a small share of a small epsilon at a
    tiny delta (the NAPSU-MQ problem at epsilon 0.1, delta 5e-10: a count share of epsilon 0.0059),
    below what RDP over a finite order list can certify at any noise (its epsilon never falls
    under about log(1/delta) / max order), so the release used to refuse. The exact profile has
    no such floor, and needs neither PLD's nor scipy's imports on the release path (issue 29).
    This only divides the budget: the accountant of record composes every event of the release,
    and the mechanism that comes last is calibrated under it to the whole target with every
    part as a prior event (:func:`calibrate_gaussian`), so the claim is unchanged in kind.
    Raises ``ValueError`` when the prior events alone exceed the target."""
    if not (target_epsilon > 0 and math.isfinite(target_epsilon)) or not 0.0 < delta < 1.0:
        raise ValueError("target_epsilon must be positive and finite and delta in (0, 1)")
    precision = 0.0
    for ev in prior_events:
        if not isinstance(ev, dpa.GaussianDpEvent):
            raise TypeError(f"calibrate_part composes plain Gaussian events only, not {type(ev).__name__}")
        precision += 1.0 / ev.noise_multiplier**2
    lo, hi = 1e-3, 1e7  # the combined multiplier: delta(sigma) decreases in sigma
    if gaussian_delta(hi, target_epsilon) > delta:
        raise ValueError(f"epsilon {target_epsilon:.3g} at delta {delta:.3g} needs noise multiplier > {hi:.0e}")
    for _ in range(200):
        mid = math.sqrt(lo * hi)
        if gaussian_delta(mid, target_epsilon) > delta:
            lo = mid
        else:
            hi = mid
        if hi / lo < 1.0 + 1e-10:
            break
    rest = 1.0 / hi**2 - precision
    if rest <= 0:
        raise ValueError(f"the earlier parts already spend epsilon {target_epsilon:.3g} at delta {delta:.3g}")
    return 1.0 / math.sqrt(rest)


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
