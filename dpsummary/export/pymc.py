"""PyMC exporter: ``pymc_model.py`` (``build_model(data)``: a ``pm.CustomDist`` likelihood with
the explicit weighted formula, so soft labels and fractional counts are not silently truncated as
PyMC's Bernoulli/Poisson would, and ``pm.compute_log_likelihood`` still works) and
``release.json``. The module copied is :mod:`dpsummary.export.templates.pymc_model`, so
:func:`log_density_fn` tests exactly the shipped code.

PyMC compiles through pytensor: set ``PYTENSOR_FLAGS=compiledir=...`` to keep its cache where
you want it (CI keeps it inside the workspace).
"""

from __future__ import annotations

from pathlib import Path
from typing import Any

from ..constructors.base import write_atomic

TEMPLATE = Path(__file__).with_name("templates") / "pymc_model.py"


def write(release: Any, out: str | Path, *, neutral: dict[str, Any] | None = None) -> list[Path]:
    """Write ``pymc_model.py`` and ``release.json`` into ``out``."""
    from .neutral import caveat_header, dump, to_neutral

    doc = neutral if neutral is not None else to_neutral(release)
    out = Path(out)
    write_atomic(out / "release.json", dump(doc))
    write_atomic(out / "pymc_model.py", caveat_header(doc, "#") + TEMPLATE.read_bytes())
    return [out / "pymc_model.py", out / "release.json"]


def build_model(neutral: dict[str, Any]) -> Any:
    """The ``pm.Model`` of a neutral document."""
    from .templates import pymc_model as pmm

    return pmm.build_model(pmm.from_document(neutral))


def log_density_fn(neutral: dict[str, Any], model: Any = None) -> Any:
    """``theta (d,) -> float``: the PyMC model's joint log density (``compile_logp``)."""
    from .templates import pymc_model as pmm

    data = pmm.from_document(neutral)
    return pmm.logp_function(data, model)
