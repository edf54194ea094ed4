"""What a release's mechanism says about its own intervals, read the same way everywhere.

A mechanism whose intervals are not known to be calibrated on real tables records so in its
claim: ``claim.mechanism.interval_calibration`` (docs/FORMAT.md), a fixed, public record (the
same words for every release of that mechanism, nothing computed from the data). DP-PSVI
records :data:`DP_PSVI_INTERVAL_CALIBRATION`: its parametric bootstrap (docs/BOOTSTRAP.md)
calibrates on synthetic tables drawn from DP per-column histograms, which cannot carry a real
table's joint feature structure, and on real tables its intervals were measured overconfident
(issue 37; benchmarks/results/calibration.md). No per-table check from the DP outputs alone is
known to detect that, so the statement is about the mechanism, not the table.

:func:`interval_calibration` is the one reader: ``dpsummary inspect``, the release table,
``dpsummary.load`` (a :class:`IntervalCalibrationWarning`) and every exporter call it. A dp-psvi
artifact written before the field existed carries no record; it reads as status ``"unknown"``
and warns too (its intervals came from the same bootstrap). A mechanism that records nothing
(noise-aware-newton) has no caveat here: that is the absence of this mechanism-level warning,
not a claim of calibration (its coverage is measured by the calibration suite).

Leaf module: no dpsummary imports, so the analyst, the CLI and the exporters can all use it.
"""

from __future__ import annotations

from collections.abc import Mapping
from typing import Any

__all__ = ["DP_PSVI_INTERVAL_CALIBRATION", "FIELD", "IntervalCalibrationWarning", "interval_calibration",
           "warning_text"]

#: The claim's mechanism field.
FIELD = "interval_calibration"

#: Where the measurements behind the caveat are (the calibration suite's table, issue 37).
EVIDENCE = "benchmarks/results/calibration.md"

#: DP-PSVI's record (dpsummary.mechanisms.dp_psvi puts it in every claim).
DP_PSVI_INTERVAL_CALIBRATION: dict[str, str] = {
    "status": "not-validated-on-real-tables",
    "reason": ("the parametric bootstrap calibrates the intervals on synthetic tables drawn from DP "
               "per-column histograms, which cannot carry a real table's joint feature structure; on real "
               "tables the intervals may be overconfident (too narrow, off-centre, wrong-sign effects), and no "
               "check from the release's DP outputs is known to detect it"),
    "validated_on": "simulated tables only (benchmarks/results/dppsvi_bootstrap.md)",
    "evidence": EVIDENCE,
}

#: Mechanisms whose artifacts are read as unvalidated even when they predate the field.
_UNVALIDATED_MECHANISMS = frozenset({"dp-psvi"})

_UNKNOWN: dict[str, str] = {
    "status": "unknown",
    "reason": ("this dp-psvi artifact was written before releases recorded their interval calibration; "
               "DP-PSVI's bootstrap calibration is validated only on simulated tables, so on a real table its "
               "intervals may be overconfident"),
    "validated_on": DP_PSVI_INTERVAL_CALIBRATION["validated_on"],
    "evidence": EVIDENCE,
}


class IntervalCalibrationWarning(UserWarning):
    """``dpsummary.load`` of a release whose mechanism records that its intervals are not
    validated on real tables (or is DP-PSVI and records nothing). Filter it by this class."""


def interval_calibration(claim: Mapping[str, Any] | None) -> dict[str, Any] | None:
    """The caveat on a release's intervals, or None when its mechanism records none.

    ``claim``: the artifact's signed claim. Returns the claim's ``mechanism.interval_calibration``
    (a dict with at least ``status``, ``reason``, ``evidence``) when present; for a ``dp-psvi``
    claim without it (written before the field) a record with status ``"unknown"``; None
    otherwise. A malformed field (not an object) reads as status ``"unknown"``: a reader never
    drops a caveat silently."""
    mech = (claim or {}).get("mechanism")
    if not isinstance(mech, Mapping):
        return None
    if FIELD in mech:
        value = mech[FIELD]
        if isinstance(value, Mapping) and isinstance(value.get("status"), str):
            return dict(value)
        return {**_UNKNOWN, "reason": f"the artifact's {FIELD} record is malformed; treat its intervals as "
                                      "not validated on real tables"}
    if mech.get("name") in _UNVALIDATED_MECHANISMS:
        return dict(_UNKNOWN)
    return None


def warning_text(claim: Mapping[str, Any] | None) -> str | None:
    """One line for people (no ``warning:`` prefix), or None when there is no caveat."""
    caveat = interval_calibration(claim)
    if caveat is None:
        return None
    mech = (claim or {}).get("mechanism")
    name = mech.get("name") if isinstance(mech, Mapping) else None
    status = caveat.get("status")
    shown = "" if status == DP_PSVI_INTERVAL_CALIBRATION["status"] else f" (interval calibration: {status})"
    return (f"{name or 'this mechanism'}'s intervals are NOT validated on real tables{shown}: "
            f"{caveat.get('reason')}; evidence: {caveat.get('evidence')}")
