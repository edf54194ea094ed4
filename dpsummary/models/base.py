"""The model protocol shared by every constructor, the release and the exporters.

A model writes only its densities: ``log_likelihood(points, theta) -> (n, S)``, a Gaussian prior,
a simulator. Gradients with respect to points and parameters come from autograd, so a new model
needs no hand-written derivatives (``glm.py`` adds the GLM fast path for Newton's method, still
through autograd on the linear predictor).

Shapes and dtypes: ``points`` is ``(n, point_dim)``, ``theta`` is ``(S, param_dim)``, all float64.
Points live in *model space*: the output of :class:`dpsummary.data.Transform` (scaled numerics,
one-hot categories) with the target, if any, as the last column. The intercept, where a model has
one, is added by the model, not stored in the points.
"""

from __future__ import annotations

import math
from abc import ABC, abstractmethod
from collections.abc import Sequence
from typing import Any, ClassVar

import torch

from ..gaussian import DTYPE


class Model(ABC):
    """A Bayesian model with conditionally independent records and a Gaussian prior.

    Subclasses set ``name`` (the registry key) and implement :meth:`log_likelihood`,
    :meth:`simulate` and :meth:`spec`. The prior is ``N(prior_mean, prior_scale^2 I)``.
    """

    name: ClassVar[str]
    #: True when :meth:`exact_posterior` is available for every weighting.
    conjugate: ClassVar[bool] = False
    #: True when :meth:`exact_posterior` returns the exact weighted posterior's mean and
    #: covariance as a Gaussian (conjugate models, where that Gaussian is the posterior; linear
    #: regression with sigma estimated, where it is the posterior's moment match): references,
    #: Laplace starts and judges use it instead of a Laplace approximation.
    exact_moments: ClassVar[bool] = False
    #: True when the last point column is a target (regression models).
    has_target: ClassVar[bool] = False

    def __init__(self, num_features: int, *, prior_scale: float = 1.0,
                 prior_mean: Sequence[float] | None = None) -> None:
        if num_features < 1:
            raise ValueError("a model needs at least one feature")
        if not prior_scale > 0:
            raise ValueError("prior_scale must be positive")
        self.num_features = int(num_features)
        self.prior_scale = float(prior_scale)
        # None is the zero vector (and keeps older specs byte-identical); a declared centre is
        # checked against param_dim when first read, since subclasses set their dimension after.
        self._prior_centre: tuple[float, ...] | None = None
        if prior_mean is not None:
            centre = tuple(float(v) for v in prior_mean)
            if not all(math.isfinite(v) for v in centre):
                raise ValueError("prior_mean must be finite")
            self._prior_centre = centre

    # ---- dimensions -------------------------------------------------------------------------
    @property
    @abstractmethod
    def param_dim(self) -> int:
        """Dimension d of theta."""

    @property
    def point_dim(self) -> int:
        """Columns of one point in model space (features, then the target if any)."""
        return self.num_features + (1 if self.has_target else 0)

    def param_names(self, feature_names: list[str] | None = None) -> list[str]:
        """One name per coordinate of theta (for exporters and reports)."""
        names = feature_names or [f"x{i}" for i in range(self.num_features)]
        return list(names)

    # ---- densities --------------------------------------------------------------------------
    @abstractmethod
    def log_likelihood(self, points: torch.Tensor, theta: torch.Tensor) -> torch.Tensor:
        """Log-likelihood of every point under every parameter draw, shape ``(n, S)``.

        Includes all normalising constants. Must accept real-valued (soft) targets, because
        learned pseudopoints carry them.
        """

    @property
    def prior_mean(self) -> torch.Tensor:
        """The prior's centre: zeros unless the model was built with ``prior_mean`` (e.g. the
        Poisson release's declared intercept centre, :mod:`dpsummary.noise_aware` 5.)."""
        if self._prior_centre is None:
            return torch.zeros(self.param_dim, dtype=DTYPE)
        if len(self._prior_centre) != self.param_dim:
            raise ValueError(f"prior_mean has {len(self._prior_centre)} entries; the model has {self.param_dim} parameters")
        return torch.tensor(self._prior_centre, dtype=DTYPE)

    def with_prior_mean(self, centre: Sequence[float] | torch.Tensor) -> Model:
        """The same model with its prior centred at ``centre`` (a public value or a DP output)."""
        values = centre.tolist() if isinstance(centre, torch.Tensor) else list(centre)
        if len(values) != self.param_dim:
            raise ValueError(f"prior_mean needs {self.param_dim} entries, got {len(values)}")
        spec = {**self.spec(), "prior_mean": [float(v) for v in values]}
        del spec["name"]
        return type(self)(spec.pop("num_features"), **spec)

    def log_prior(self, theta: torch.Tensor) -> torch.Tensor:
        """Log density of the Gaussian prior, shape ``(S,)``, constants included."""
        d = self.param_dim
        z = (theta - self.prior_mean) / self.prior_scale
        return -0.5 * (z * z).sum(-1) - d * math.log(self.prior_scale) - 0.5 * d * math.log(2 * math.pi)

    def sample_prior(self, num: int, generator: torch.Generator) -> torch.Tensor:
        eps = torch.randn(num, self.param_dim, generator=generator, dtype=DTYPE)
        return self.prior_mean + self.prior_scale * eps

    # ---- per-record score and curvature (the noise-aware mechanism's statistics) ------------
    def record_scores(self, points: torch.Tensor, theta: torch.Tensor) -> torch.Tensor:
        """Per-record score ``grad_theta log p(x_i | theta)`` at one ``theta`` (d,), shape (n, d).

        The default differentiates :meth:`log_likelihood` record by record (``torch.func``);
        models with a closed form override it for speed."""
        def one(point: torch.Tensor, th: torch.Tensor) -> torch.Tensor:
            return self.log_likelihood(point[None], th[None])[0, 0]

        return torch.func.vmap(torch.func.grad(one, argnums=1), in_dims=(0, None))(points, theta.detach())

    def record_curvatures(self, points: torch.Tensor, theta: torch.Tensor) -> torch.Tensor:
        """Per-record curvature ``-hess_theta log p(x_i | theta)``, shape (n, d, d)."""
        def one(point: torch.Tensor, th: torch.Tensor) -> torch.Tensor:
            return -self.log_likelihood(point[None], th[None])[0, 0]

        return torch.func.vmap(torch.func.hessian(one, argnums=1), in_dims=(0, None))(points, theta.detach())

    def record_curvature_factors(self, points: torch.Tensor, theta: torch.Tensor
                                 ) -> tuple[torch.Tensor, torch.Tensor] | None:
        """``(c, z)`` with ``record_curvatures = c_i z_i z_i^T`` when every record's curvature is
        rank one (GLMs, linear regression), else None. Lets the mechanism clip and sum
        curvatures in O(n d^2) without forming (n, d, d) tensors (the released upper triangle's
        norm is ``dpsummary.private.kernel.upper_triangle_norm``)."""
        return None

    def statistic_bounds(self, theta: torch.Tensor, *, feature_norm: float, target_bound: float) -> tuple[float, float]:
        """Public bounds ``(score_bound, curvature_bound)`` on one record's score L2 norm and
        the L2 norm of its curvature's upper triangle, diagonal included (the vector the
        noise-aware mechanism releases; the Frobenius norm bounds it, and the GLMs use the
        tighter :meth:`~dpsummary.models.glm.GLM.rank_one_upper_bound`) at ``theta``, for
        features of L2 norm at most ``feature_norm``
        and targets of absolute value at most ``target_bound`` (model space). The noise-aware
        mechanism clips to these bounds anyway (a total per-record function); where the bound
        holds for every record in the public box, clipping never biases the statistics.
        Depends on public values only."""
        raise NotImplementedError(f"{self.name} declares no statistic bounds")

    # ---- simulation (costs no privacy) ------------------------------------------------------
    @abstractmethod
    def simulate(
        self,
        theta: torch.Tensor,
        num: int,
        generator: torch.Generator,
        features: torch.Tensor | None = None,
    ) -> torch.Tensor:
        """Draw ``num`` synthetic points given one parameter vector ``theta`` of shape ``(d,)``.

        ``features`` (``(num, num_features)``), when given, replaces the default public feature
        distribution (standard normal) — the release passes features drawn from the public
        schema so that synthetic points look like transformed records.
        """

    def project_points(self, points: torch.Tensor) -> torch.Tensor:
        """Map points back into the model's support after a gradient step (in place is fine)."""
        return points

    # ---- conjugacy --------------------------------------------------------------------------
    def exact_posterior(self, points: torch.Tensor, weights: torch.Tensor) -> Any:
        """The exact weighted posterior as a :class:`dpsummary.inference.GaussianPosterior`.

        Only for conjugate models; others raise ``NotImplementedError``.
        """
        raise NotImplementedError(f"{self.name} has no closed-form posterior")

    # ---- serialisation ----------------------------------------------------------------------
    def spec(self) -> dict[str, Any]:
        """A JSON-able description from which :func:`dpsummary.models.from_spec` rebuilds it."""
        out: dict[str, Any] = {"name": self.name, "num_features": self.num_features, "prior_scale": self.prior_scale}
        if self._prior_centre is not None:
            out["prior_mean"] = list(self._prior_centre)
        return out

    def __repr__(self) -> str:
        args = ", ".join(f"{k}={v!r}" for k, v in self.spec().items() if k != "name")
        return f"{type(self).__name__}({args})"

    def __eq__(self, other: object) -> bool:
        return isinstance(other, Model) and self.spec() == other.spec()

    def __hash__(self) -> int:
        return hash(repr(self.spec()))
