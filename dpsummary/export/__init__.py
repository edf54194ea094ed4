"""Exporters: hand a release to any sampler.

``export(release, to, out)`` with ``to`` one of :data:`FORMATS`:

* ``json``: the sampler-neutral document ``release.json`` (docs/FORMAT.md) and ``reference.py``
  (NumPy/SciPy log density + emcee recipe);
* ``stan``: one Stan program for every family + data in Stan JSON (:mod:`.stan`);
* ``pymc``: a PyMC model with a ``pm.CustomDist`` likelihood (:mod:`.pymc`);
* ``numpyro``: a NumPyro model (``plate`` + ``handlers.scale``), also a BlackJAX log density
  (:mod:`.numpyro`).

Every directory also holds ``release.json``, whose ``checks`` block the adapter reproduces.
Files are written atomically. Exporting costs no privacy.
"""

from __future__ import annotations

from pathlib import Path
from typing import Any

FORMATS = ("json", "stan", "pymc", "numpyro")


def export(release: Any, to: str, out: str | Path) -> list[Path]:
    """Write the adapter for ``to`` into directory ``out``; returns the files written."""
    from . import neutral

    if to not in FORMATS:
        raise ValueError(f"unknown export format {to!r}; choose one of {', '.join(FORMATS)}")
    doc = neutral.to_neutral(release)
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


__all__ = ["FORMATS", "export"]
