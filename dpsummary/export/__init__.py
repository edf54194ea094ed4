"""Exporters: hand a release to any sampler.

``export(release, to, out)`` with ``to`` one of :data:`FORMATS`:

* ``json``: the sampler-neutral document ``release.json`` (docs/FORMAT.md) and ``reference.py``
  (NumPy/SciPy log density + emcee recipe);
* ``stan``: one Stan program for every family + data in Stan JSON (:mod:`.stan`);
* ``pymc``: a PyMC model with a ``pm.CustomDist`` likelihood (:mod:`.pymc`);
* ``numpyro``: a NumPyro model (``plate`` + ``handlers.scale``), also a BlackJAX log density
  (:mod:`.numpyro`).

A Bayesian neural network release (``model.name == "bnn"``) exports to ``json`` and ``numpyro``
only (the network is written out in both templates); ``stan`` and ``pymc`` refuse it with
:class:`UnsupportedExport`.

Every directory also holds ``release.json``, whose ``checks`` block the adapter reproduces.
A release whose mechanism records that its intervals are not validated on real tables (DP-PSVI,
:mod:`dpsummary.caveats`) carries the caveat into every export: ``release.json``'s
``interval_calibration`` field, a ``WARNING`` comment atop each program written, and a
``warning:`` line each program prints when run. Likewise a release whose sampling cannot be
trusted: at export dpsummary's NUTS samples it once (``release.json``'s ``sampling_check``), and any
failed diagnostic becomes a ``WARNING`` comment atop each program. Files are written atomically.
Exporting costs no privacy.
"""

from __future__ import annotations

from pathlib import Path
from typing import Any

FORMATS = ("json", "stan", "pymc", "numpyro")
#: Formats that can express a Bayesian neural network release (the others refuse it).
BNN_FORMATS = ("json", "numpyro")


class UnsupportedExport(ValueError):
    """The format cannot express this release's model (a one-line, public message)."""


def export(release: Any, to: str, out: str | Path) -> list[Path]:
    """Write the adapter for ``to`` into directory ``out``; returns the files written."""
    from . import neutral

    if to not in FORMATS:
        raise ValueError(f"unknown export format {to!r}; choose one of {', '.join(FORMATS)}")
    if getattr(release.model, "name", None) == "bnn" and to not in BNN_FORMATS:
        raise UnsupportedExport(f"--to {to} cannot express a BNN release; use --to numpyro or --to json")
    if not getattr(release.model, "parameter_draws", True):
        raise UnsupportedExport(
            f"a {release.model.name} release is weighted pseudo-data for mixture VI, which no sampler format "
            "expresses; load it with dpsummary.load and use Release.mixture or Release.fit_mixture()")
    try:
        doc = neutral.to_neutral(release)
    except NotImplementedError as exc:
        raise UnsupportedExport(f"--to {to}: {exc}") from None
    # Issue 48: our sampler's diagnostics on this release ride along (release.json's
    # "sampling_check"), and a failure becomes a WARNING comment atop every program written.
    doc["sampling_check"] = neutral.sampling_check(release)
    if to == "json":
        return neutral.write(release, out, neutral=doc)
    if to == "stan":
        from . import stan

        return stan.write(release, out, neutral=doc)
    if to == "pymc":
        from . import pymc

        return pymc.write(release, out, neutral=doc)
    from . import numpyro

    return numpyro.write(release, out, neutral=doc)


__all__ = ["BNN_FORMATS", "FORMATS", "UnsupportedExport", "export"]
