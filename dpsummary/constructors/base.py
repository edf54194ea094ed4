"""The one constructor interface shared by every baseline and by DP-PSVI.

A constructor is an ``init``/``step`` pair over explicit state (optax/blackjax style):

    state = constructor.init(data, model, size, generator)
    for _ in range(constructor.num_steps(size)):
        state = constructor.step(state, data, model, generator)
    points, weights = constructor.result(state)

:func:`fit` is the small front door that runs this loop (with an optional progress callback)
and wraps the result in a :class:`Summary`. ``data`` is a ``(N, point_dim)`` tensor in model space
for the non-private constructors; DP-PSVI receives a :class:`dpsummary.private.mechanism.PrivateRecords`
handle instead, which exposes only the accounted mechanism. ``generator`` drives only
non-private randomness.
"""

from __future__ import annotations

import json
import os
import tempfile
from collections.abc import Callable
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any, Generic, Protocol, TypeVar

import torch

from ..models import DTYPE, Model, from_spec

StateT = TypeVar("StateT")
DataT = TypeVar("DataT", contravariant=True)

#: Version of the plain summary format written by :meth:`Summary.save`.
SUMMARY_FORMAT = "dpsummary.summary/v1"


@dataclass(frozen=True)
class Summary:
    """A weighted (pseudo)coreset in model space: the product every constructor returns.

    ``weights`` are likelihood exponents: the summary's posterior is
    ``prior(theta) * prod_m p(points_m | theta) ** weights_m``. ``transform`` is the public
    feature transform (as a dict, see :class:`dpsummary.data.Transform`) when known.
    """

    points: torch.Tensor
    weights: torch.Tensor
    model: Model
    method: str
    transform: dict[str, Any] | None = None
    info: dict[str, Any] = field(default_factory=dict)

    @property
    def size(self) -> int:
        return int(self.weights.shape[0])

    def nonzero(self) -> Summary:
        """The same summary without zero-weight points (samplers reject zero weights)."""
        keep = self.weights > 0
        return Summary(self.points[keep], self.weights[keep], self.model, self.method, self.transform, self.info)

    def to_dict(self) -> dict[str, Any]:
        return {
            "format": SUMMARY_FORMAT,
            "method": self.method,
            "model": self.model.spec(),
            "points": self.points.tolist(),
            "weights": self.weights.tolist(),
            "transform": self.transform,
            "info": self.info,
        }

    @classmethod
    def from_dict(cls, d: dict[str, Any]) -> Summary:
        if d.get("format") != SUMMARY_FORMAT:
            raise ValueError(f"not a {SUMMARY_FORMAT} document")
        model = from_spec(d["model"])
        points = torch.tensor(d["points"], dtype=DTYPE).reshape(-1, model.point_dim)
        weights = torch.tensor(d["weights"], dtype=DTYPE)
        return cls(points, weights, model, d["method"], d.get("transform"), d.get("info", {}))

    def save(self, path: str | Path) -> None:
        """Write the summary as JSON, atomically (temporary file, fsync, rename)."""
        write_atomic(Path(path), json.dumps(self.to_dict(), indent=1).encode())

    @classmethod
    def load(cls, path: str | Path) -> Summary:
        return cls.from_dict(json.loads(Path(path).read_text()))


def write_atomic(path: Path, data: bytes) -> None:
    """Write ``data`` to ``path`` so that readers see the old file or the whole new one."""
    path = Path(path)
    path.parent.mkdir(parents=True, exist_ok=True)
    fd, tmp = tempfile.mkstemp(prefix=f".{path.name}.", dir=path.parent)
    try:
        with os.fdopen(fd, "wb") as fh:
            fh.write(data)
            fh.flush()
            os.fsync(fh.fileno())
        os.replace(tmp, path)
    except BaseException:
        if os.path.exists(tmp):
            os.unlink(tmp)
        raise


class Constructor(Protocol, Generic[DataT, StateT]):
    """What every coreset constructor implements (see module docstring)."""

    @property
    def name(self) -> str: ...

    def init(self, data: DataT, model: Model, size: int, generator: torch.Generator) -> StateT: ...

    def num_steps(self, size: int) -> int: ...

    def step(self, state: StateT, data: DataT, model: Model, generator: torch.Generator) -> StateT: ...

    def result(self, state: StateT) -> tuple[torch.Tensor, torch.Tensor]: ...


ProgressFn = Callable[[int, int], None]


def fit(
    constructor: Constructor[Any, Any],
    data: Any,
    model: Model,
    size: int,
    *,
    generator: torch.Generator,
    transform: dict[str, Any] | None = None,
    progress: ProgressFn | None = None,
) -> Summary:
    """Run ``constructor`` to completion and return its :class:`Summary`.

    ``progress(done, total)`` is called after every step (the CLI draws a bar with it).
    """
    if size < 1:
        raise ValueError("size must be at least 1")
    state = constructor.init(data, model, size, generator)
    total = constructor.num_steps(size)
    for t in range(total):
        state = constructor.step(state, data, model, generator)
        if progress is not None:
            progress(t + 1, total)
    points, weights = constructor.result(state)
    return Summary(
        points=points.detach().clone(),
        weights=weights.detach().clone(),
        model=model,
        method=constructor.name,
        transform=transform,
    )
