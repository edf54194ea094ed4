"""NumPyro exporter: ``numpyro_model.py`` (the model: ``plate`` + ``handlers.scale(scale=w)``
around explicit-formula factors; also ``make_logdensity_fn`` for BlackJAX) and ``release.json``.

Traps handled: soft labels and non-integer counts (``dist.Bernoulli``/``dist.Poisson`` would
score them -inf, so the likelihood is an explicit formula in a ``numpyro.factor``), zero weights
(NumPyro rejects a zero scale; the neutral document drops zero-weight points), float32 (the
module enables ``jax_enable_x64`` on import; note this switches JAX to float64 for the whole
process). The module copied is :mod:`dpsummary.export.templates.numpyro_model`, so
:func:`log_density_fn` tests exactly the shipped code.
"""

from __future__ import annotations

from pathlib import Path
from typing import Any

from ..constructors.base import write_atomic

TEMPLATE = Path(__file__).with_name("templates") / "numpyro_model.py"


def write(release: Any, out: str | Path, *, neutral: dict[str, Any] | None = None) -> list[Path]:
    """Write ``numpyro_model.py`` and ``release.json`` into ``out``."""
    from .neutral import caveat_header, dump, to_neutral

    doc = neutral if neutral is not None else to_neutral(release)
    out = Path(out)
    write_atomic(out / "release.json", dump(doc))
    write_atomic(out / "numpyro_model.py", caveat_header(doc, "#") + TEMPLATE.read_bytes())
    return [out / "numpyro_model.py", out / "release.json"]


def log_density_fn(neutral: dict[str, Any]) -> Any:
    """``theta (d,) -> float``: the NumPyro model's joint log density (float64)."""
    from .templates import numpyro_model as nm

    data = nm.from_document(neutral)
    return lambda theta: nm.log_density(data, theta)


def blackjax_logdensity_fn(neutral: dict[str, Any]) -> Any:
    """``theta (d,) jax array -> scalar``: the same density as a pure JAX function (BlackJAX)."""
    from .templates import numpyro_model as nm

    return nm.make_logdensity_fn(nm.from_document(neutral))
