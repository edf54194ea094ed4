"""Noise-aware private posterior from noisy score statistics (the default release mechanism).

The paper's DP-PSVI privatises an S-dimensional log-likelihood vector at every one of hundreds of
subsampled steps. Most of that budget buys nothing an analyst sees, and the released posterior
ignores the noise it was built from, so its intervals are overconfident (issue 14). This module
spends the budget on the few statistics a Gaussian posterior approximation is made of and then
accounts for the noise in the posterior itself:

1. **Rounds of DP Newton** (Ganesh, Haghifam, Steinke and Thakurta 2023). Round k releases, at a
   public anchor ``a_k`` (the prior mean, then the previous round's noise-aware mean), the noisy
   sums ``s = sum_i grad log p(x_i | a_k) + xi`` and ``H = sum_i -hess log p(x_i | a_k) + E``
   (:mod:`dpsummary.private.score_stats`, two Gaussian mechanisms, clipped to public bounds).
   Conjugate models are exactly quadratic, so one round is their whole answer.
2. **Noise-aware likelihood of the released statistic** (Bernstein and Sheldon 2018; Kulkarni,
   Jaelkoe, Koskela, Kaski and Honkela 2021, Sec. 3, for GLMs). Around the anchor the log-
   likelihood is quadratic, so the score sum is ``S = H (theta_hat - a)`` with the data's MLE
   ``theta_hat ~ N(theta, H^-1)`` given the parameter, hence given theta the released statistic
   is ``s ~ N(H (theta - a), H + Sigma_xi)``. With the Gaussian prior this gives the posterior
   ``precision = H V^-1 H + P``, ``mean = precision^-1 (H V^-1 (s + H a) + P mu0)``, with
   ``V = H + Sigma_xi``. Without noise (Sigma_xi = 0) it is exactly the full-data Laplace
   posterior; with noise it widens exactly in the directions the noise hides, and shrinks to the
   prior where the noise dominates. ``Sigma_xi`` holds the score noise ``(sigma_s C_s)^2 I`` and
   the curvature noise's effect ``E u`` on the statistic (``u = theta_hat - a``), whose
   covariance for symmetric noise of entry variance tau^2 is ``tau^2 (|u|^2 I + u u^T)``; u is
   plugged in from the posterior itself (two fixed-point passes).

Everything after the mechanisms is post-processing of DP outputs and public parameters (the
schema's bounds, the prior, the noise multipliers), so it costs no privacy. The raw (not noise-
aware) posterior ``N((H + P)^-1 (s + H a + P mu0), (H + P)^-1)`` is kept for comparison.

The noise-aware posterior is the release's target; :mod:`dpsummary.constructors.gaussian_target`
turns it into weighted pseudopoints any sampler can use.
"""

from __future__ import annotations

import math
from collections.abc import Callable, Sequence
from dataclasses import dataclass, field
from typing import Any

import torch

from . import accounting as acc
from .gaussian import DTYPE, GaussianPosterior
from .models import Model

#: Convergence check of the rounds (public): a last step larger than this many posterior sds
#: in some coordinate is reported in the release's notes.
UNCONVERGED_SDS = 3.0
#: Name of the mechanism in artifacts, the CLI (``--mechanism``) and the benchmarks.
MECHANISM = "noise-aware-newton"


@dataclass(frozen=True)
class Schedule:
    """How the budget is divided over the mechanisms, as shares of the zero-concentrated
    privacy parameter rho = 1 / (2 sigma^2): Gaussian mechanisms compose additively in rho (and
    exactly as one Gaussian in RDP and PLD), so share w_j means noise multiplier
    ``sigma / sqrt(w_j)`` where ``sigma`` is the single-Gaussian calibration of the whole
    budget. ``rounds[k] = (score_share, curvature_share)``; shares sum to 1.

    Default rule (written down before any real table was run; chosen on simulated logistic and
    Poisson tables only, benchmarks/trust.py --tune): conjugate models one round (their
    likelihood is exactly quadratic), others :data:`DEFAULT_ROUNDS`."""

    rounds: tuple[tuple[float, float], ...]

    def __post_init__(self) -> None:
        flat = [w for pair in self.rounds for w in pair]
        if not self.rounds or any(not (w > 0) for w in flat) or abs(sum(flat) - 1.0) > 1e-9:
            raise ValueError("schedule shares must be positive and sum to 1")

    @classmethod
    def default(cls, model: Model) -> Schedule:
        if model.conjugate:
            return cls(((0.5, 0.5),))
        return cls(DEFAULT_ROUNDS)

    def noise_multipliers(self, sigma: float) -> list[tuple[float, float]]:
        """Per-round (score, curvature) noise multipliers for single-Gaussian calibration sigma."""
        return [(sigma / math.sqrt(s), sigma / math.sqrt(c)) for s, c in self.rounds]

    def events(self, sigma: float) -> list[Any]:
        """The accountant's events: one Gaussian event per released statistic."""
        return [acc.gaussian_event(m) for pair in self.noise_multipliers(sigma) for m in pair]

    def as_dict(self) -> dict[str, Any]:
        return {"rounds": [list(r) for r in self.rounds]}


#: Three rounds (benchmarks/results/trust_schedule.md); the last round, whose statistics the posterior is built from, gets 70% of the
#: budget, and its score (which sets the posterior mean) the larger part of that.
DEFAULT_ROUNDS: tuple[tuple[float, float], ...] = ((0.05, 0.1), (0.05, 0.1), (0.5, 0.2))


def calibrate(
    schedule: Schedule, *, target_epsilon: float, delta: float, prior_events: Sequence[Any] = (),
    accountant: acc.Accountant = "rdp",
) -> tuple[float, list[Any]]:
    """Single-Gaussian noise multiplier for the schedule's share of the budget, and its events.

    The schedule's events compose to exactly one Gaussian of multiplier ``sigma`` (RDP: orders
    add; PLD: Gaussian PLDs compose to a Gaussian), so calibrating that Gaussian calibrates them;
    the result is re-checked on the actual event list."""
    sigma = acc.calibrate_gaussian(target_epsilon=target_epsilon, delta=delta, prior_events=prior_events,
                                   accountant=accountant)
    events = schedule.events(sigma)
    # Re-check on the real events; nudge sigma up if rounding made the composition exceed.
    for _ in range(50):
        if acc.epsilon([*prior_events, *events], delta, accountant) <= target_epsilon * (1 + 1e-6):
            return sigma, events
        sigma *= 1.0 + 1e-4
        events = schedule.events(sigma)
    raise RuntimeError("noise-aware calibration could not be confirmed by the accountant")


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


@dataclass(frozen=True)
class NoiseAwareFit:
    """The result: the noise-aware posterior (the release's target), the raw one, the rounds."""

    posterior: GaussianPosterior
    raw_posterior: GaussianPosterior
    rounds: list[RoundRelease]
    noise_multipliers: list[tuple[float, float]]
    notes: list[str] = field(default_factory=list)


#: ``release(theta, score_bound, curvature_bound, score_noise_multiplier,
#: curvature_noise_multiplier) -> (noisy score sum, noisy curvature sum)``: the mechanism,
#: bound to the private records by the caller (:meth:`PrivateRecords.noisy_score_statistics`).
ReleaseFn = Callable[[torch.Tensor, float, float, float, float], tuple[torch.Tensor, torch.Tensor]]
#: Public bounds at an anchor: ``theta -> (score_bound, curvature_bound)``.
BoundsFn = Callable[[torch.Tensor], tuple[float, float]]


def psd_part(matrix: torch.Tensor) -> torch.Tensor:
    """The positive semi-definite part of a symmetric matrix (negative eigenvalues set to 0)."""
    sym = 0.5 * (matrix + matrix.T)
    vals, vecs = torch.linalg.eigh(sym)
    return (vecs * vals.clamp(min=0.0)) @ vecs.T


def _sym(m: torch.Tensor) -> torch.Tensor:
    return 0.5 * (m + m.T)


def noise_aware_posterior(
    model: Model, release: RoundRelease, *, passes: int = 2
) -> tuple[GaussianPosterior, GaussianPosterior]:
    """(noise-aware, raw) Gaussian posteriors from one round's release (module docstring, 2.)."""
    d = model.param_dim
    eye = torch.eye(d, dtype=DTYPE)
    prior_prec = eye / model.prior_scale**2
    mu0 = model.prior_mean
    a = release.anchor
    h = psd_part(release.curvature)
    s = release.score
    raw = GaussianPosterior.from_precision(_sym(h + prior_prec), s + h @ a + prior_prec @ mu0)
    tau2 = release.curvature_noise_std**2
    score_var = release.score_noise_std**2
    post = raw
    for _ in range(max(passes, 1)):
        u = post.mean - a
        spread = float(u @ u) + float(torch.diagonal(post.cov).sum())
        sigma_xi = score_var * eye + tau2 * (spread * eye + torch.outer(u, u))
        v = _sym(h + sigma_xi)
        hv = torch.linalg.solve(v, h).T  # H V^-1 (H, V symmetric)
        precision = _sym(hv @ h + prior_prec)
        post = GaussianPosterior.from_precision(precision, hv @ (s + h @ a) + prior_prec @ mu0)
    return post, raw


@dataclass(frozen=True)
class State:
    """Explicit state of the rounds: the next anchor and what has been released so far."""

    anchor: torch.Tensor
    rounds: tuple[RoundRelease, ...]


def init(model: Model) -> State:
    return State(anchor=model.prior_mean.clone(), rounds=())


def step(state: State, model: Model, release: ReleaseFn, bounds: BoundsFn,
         multipliers: tuple[float, float]) -> State:
    """One round: release statistics at the current anchor; the next anchor is the noise-aware
    mean (post-processing), which shrinks noise-dominated directions to the prior instead of
    following a noisy Newton step out of the region where the quadratic expansion holds."""
    score_bound, curvature_bound = bounds(state.anchor)
    s_mult, c_mult = multipliers
    score, curvature = release(state.anchor, score_bound, curvature_bound, s_mult, c_mult)
    rel = RoundRelease(anchor=state.anchor, score=score, curvature=curvature, score_bound=score_bound,
                       curvature_bound=curvature_bound, score_noise_std=s_mult * score_bound,
                       curvature_noise_std=c_mult * curvature_bound)
    post, _ = noise_aware_posterior(model, rel)
    return State(anchor=post.mean, rounds=(*state.rounds, rel))


def fit(model: Model, release: ReleaseFn, bounds: BoundsFn, *, schedule: Schedule, sigma: float) -> NoiseAwareFit:
    """Run every round of ``schedule`` at single-Gaussian calibration ``sigma`` and return the
    noise-aware posterior of the last round (earlier rounds only place the anchor)."""
    multipliers = schedule.noise_multipliers(sigma)
    state = init(model)
    for mult in multipliers:
        state = step(state, model, release, bounds, mult)
    posterior, raw = noise_aware_posterior(model, state.rounds[-1])
    notes = [
        f"{MECHANISM}: {len(multipliers)} round(s) of noisy score and curvature sums, noise-aware "
        "Gaussian posterior (Kulkarni et al. 2021 style) by post-processing",
    ]
    # The posterior is a quadratic expansion at the last anchor; if the last round still moved
    # the estimate by many posterior sds, the rounds had not converged and the expansion may not
    # hold there (e.g. Poisson with large counts, whose intercept is far from the prior mean).
    # Post-processing of released values: say so in the release.
    moved = float(((posterior.mean - state.rounds[-1].anchor).abs() / torch.diagonal(posterior.cov).sqrt()).max())
    if moved > UNCONVERGED_SDS:
        notes.append(
            f"warning: the last Newton round moved the estimate by {moved:.1f} posterior sds (> "
            f"{UNCONVERGED_SDS:g}): the rounds had not converged, so the noise-aware intervals may "
            "not cover; treat this release with caution"
        )
    return NoiseAwareFit(posterior=posterior, raw_posterior=raw, rounds=list(state.rounds),
                         noise_multipliers=multipliers, notes=notes)


def public_bounds(model: Model, *, feature_norm: float, target_bound: float) -> BoundsFn:
    """The model's public per-record bounds for features of norm <= ``feature_norm``."""
    def bounds(theta: torch.Tensor) -> tuple[float, float]:
        return model.statistic_bounds(theta, feature_norm=feature_norm, target_bound=target_bound)

    return bounds


def schema_bounds(transform: Any) -> tuple[float, float]:
    """``(feature_norm, target_bound)`` in model space implied by a public schema transform
    (:meth:`dpsummary.data.Transform.from_schema`): every bounded numeric feature lies in
    [-1, 1], each categorical column is one-hot with at most one 1 (the "other" bucket is all
    zeros); a binary target is 0/1, a real one is scaled into [-1, 1], a count lies below its
    public upper bound. Unbounded numerics (fitted transforms) are bounded by their scaled
    clip range if known, else by 3 (and clipped by the mechanism)."""
    sq = 0.0
    for col in transform.schema.feature_columns:
        if col.kind == "numeric":
            if col.lower is not None and col.upper is not None:
                c, s = transform.centres[col.name], transform.scales[col.name]
                sq += max(abs(col.lower - c), abs(col.upper - c)) ** 2 / s**2
            else:
                sq += 9.0
        else:
            sq += 1.0
    kind = transform.target_kind
    target_bound = 1.0
    if kind == "count":
        col = transform.schema.target_column
        target_bound = float(col.upper) if col is not None and col.upper is not None else 1e3
    elif kind == "real":
        col = transform.schema.target_column
        if col is not None and col.lower is not None and col.upper is not None:
            c, s = transform.centres[col.name], transform.scales[col.name]
            target_bound = max(abs(col.lower - c), abs(col.upper - c)) / s
        else:
            target_bound = 3.0
    return math.sqrt(max(sq, 1e-12)), target_bound
