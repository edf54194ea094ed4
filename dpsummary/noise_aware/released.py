"""What one round of DP Newton releases, the callables that bind it to the records, and the
total linear algebra every posterior built from it shares (:class:`NonFiniteFit` instead of a
linear-algebra error).

Numbered references ("module docstring, N.") are to the package docstring,
:mod:`dpsummary.noise_aware`.
"""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass

import torch

from ..gaussian import GaussianPosterior

#: Name of the mechanism in artifacts, the CLI (``--mechanism``) and the benchmarks.
MECHANISM = "noise-aware-newton"


@dataclass(frozen=True)
class RoundRelease:
    """What one round's mechanisms released (DP outputs) and the public values around them."""

    anchor: torch.Tensor
    score: torch.Tensor
    curvature: torch.Tensor
    score_bound: float
    curvature_bound: float
    score_noise_std: float
    curvature_noise_std: float


#: ``release(theta, score_bound, curvature_bound, score_noise_multiplier,
#: curvature_noise_multiplier) -> (noisy score sum, noisy curvature sum)``: the mechanism,
#: bound to the private records by the caller (:meth:`PrivateRecords.noisy_score_statistics`).
ReleaseFn = Callable[[torch.Tensor, float, float, float, float], tuple[torch.Tensor, torch.Tensor]]
#: Public bounds at an anchor: ``theta -> (score_bound, curvature_bound)``.
BoundsFn = Callable[[torch.Tensor], tuple[float, float]]
#: A last round released otherwise than by a Newton round (objective perturbation,
#: :mod:`dpsummary.noise_aware.objective`): given the current anchor and the round's (score,
#: curvature) noise multipliers, the release read as a Newton round at its own anchor.
LastRoundFn = Callable[[torch.Tensor, tuple[float, float]], "RoundRelease"]


class NonFiniteFit(ArithmeticError):
    """The post-processing could not produce a finite Gaussian from the released statistics
    (e.g. a noise draw so large that the precision overflows). Decided on DP outputs and public
    values only; the release turns it into a charged refusal (docs/REFUSALS.md, ``non-finite-fit``)."""


def _checked(post: GaussianPosterior) -> GaussianPosterior:
    """``post`` when its mean and scale are finite and the scale non-degenerate, else raise."""
    diag = torch.diagonal(post.scale_tril)
    if not (bool(torch.isfinite(post.mean).all()) and bool(torch.isfinite(post.scale_tril).all())
            and bool((diag > 0).all())):
        raise NonFiniteFit("the noise-aware posterior is not finite")
    return post


def _from_precision(precision: torch.Tensor, rhs: torch.Tensor) -> GaussianPosterior:
    """:meth:`GaussianPosterior.from_precision`, total: a non-finite or numerically indefinite
    precision raises :class:`NonFiniteFit` instead of a linear-algebra error."""
    if not (bool(torch.isfinite(precision).all()) and bool(torch.isfinite(rhs).all())):
        raise NonFiniteFit("the released statistics gave a non-finite precision")
    try:
        post = GaussianPosterior.from_precision(precision, rhs)
    except (RuntimeError, ValueError) as exc:  # torch.linalg.LinAlgError is a RuntimeError
        raise NonFiniteFit("the noise-aware precision is numerically singular") from exc
    return _checked(post)


def psd_part(matrix: torch.Tensor) -> torch.Tensor:
    """The positive semi-definite part of a symmetric matrix (negative eigenvalues set to 0)."""
    sym = 0.5 * (matrix + matrix.T)
    vals, vecs = torch.linalg.eigh(sym)
    return (vecs * vals.clamp(min=0.0)) @ vecs.T


def _sym(m: torch.Tensor) -> torch.Tensor:
    return 0.5 * (m + m.T)
