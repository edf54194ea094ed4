"""A GLM pseudocoreset whose exact weighted posterior has the signed Gaussian's moments.

Why (issue 48, item 5): the closed-form construction (:func:`exact_glm_pseudopoints`) matches the
target Gaussian ``N(m, S)`` at the mode: the pseudocoreset's *Laplace approximation* is the
target. Analysts' samplers draw its *exact* weighted posterior, which a logistic or Poisson
likelihood skews and widens: measured on a german_credit release (public schema, epsilon 1,
d = 62) its sds were 1.06-1.15x the signed ones and a mean 0.2 sd away; where the target is wider
than the prior (``sim_correlated``) the pseudocoreset cannot carry it at all (sds 0.60x). So the
posterior the suite judged and the posterior analysts drew were two objects.

What this does (post-processing of the DP target and public values: it costs no privacy):

1. **Carrier prior.** A weighted likelihood with positive weights only narrows its prior, so
   where the target is wider than (or close to) the model's prior ``N(mu0, s0^2 I)`` the release
   carries a wider prior scale ``s0' = sqrt(CARRIER_MARGIN * lambda_max(S))``. The posterior it
   carries is still the one computed under the model's prior; the artifact records both scales,
   and the judges' full-data reference uses the model's (see :func:`carrier_model`).
2. **Moment matching.** With the construction's random frame held fixed, the target given to
   the construction is moved until the exact posterior's moments (estimated by NUTS,
   :mod:`dpsummary.sampling`) equal the signed ones: ``m_t <- m_t + (m - mu)`` and, in
   ``S_t <- D S_t D`` with ``D = diag(sd_S / sd_exact)`` (correlations kept; whitened by ``S``
   its eigenvalues are kept in ``[MIN_RELATIVE_VARIANCE, carrier prior)``). It stops when every
   mean is within its tolerance and every sd within its own (:func:`tolerances`: the larger of
   :data:`MEAN_TOLERANCE` / :data:`SD_TOLERANCE` and what the estimate's Monte Carlo error can
   resolve at that dimension), or after :data:`MAX_ITERATIONS`; only coordinates outside their
   tolerance are moved (inside, a move would feed the estimate's noise back). The best iterate
   (ranked on the fixed tolerances) is kept. Where NUTS estimates the moments, the first iteration pools :data:`VERIFY_RUNS` runs; a
   match that stops there records that estimate (nothing was chosen among noisy estimates), one
   that iterated is measured again by :data:`VERIFY_RUNS` fresh runs. That is what the artifact
   records (the issue's criterion: 0.05 sd and 3%).

   Why the noise-aware tolerances (``benchmarks/notebook/moment_match_stopping.md``): at d = 106
   (adult, public schema) the largest of 106 Monte Carlo errors of 8,000 NUTS draws is about
   0.036 sd, above the fixed 0.03; the loop never stopped, moved the construction by its own
   noise (iteration 3 measured worse than iteration 1, which already met the criterion) and ran
   eight iterations and two verifications: about 20 minutes of NUTS per release.

The stopping rule reads only the target, public values and draws from the pseudocoreset's
posterior: no record is touched. The sampler's randomness comes from the release's non-private
generator.
"""

from __future__ import annotations

import math
from dataclasses import dataclass
from typing import TypeVar

import numpy as np
import torch

from ..gaussian import DTYPE, GaussianPosterior
from ..models import GLM, Model
from .gaussian_target import exact_glm_pseudopoints

ModelT = TypeVar("ModelT", bound=Model)

#: Tolerances of the iteration (tighter than the issue's 0.05 sd / 3%, which the final figures
#: are held to, so that the Monte Carlo error of the check leaves room).
MEAN_TOLERANCE = 0.03
SD_TOLERANCE = 0.02
MAX_ITERATIONS = 8
#: NUTS per iteration (where importance sampling does not reach IS_MIN_ESS: d ~ 30 and more):
#: the whitened start is already close, so a short warm-up suffices; 4 x 2,000 draws keep an sd
#: estimate's error near 0.8%. Measured on german_credit (public, epsilon 1, d = 62): 5 iterations
#: of 4,000 draws ended at 0.072 sd / sds 0.984-1.046x (outside), 8 of 8,000 at 0.045 sd /
#: 0.987-1.026x (within), in 69 s. At this warm-up the sampler adapts a diagonal mass matrix from
#: d = 11 on (its last window of 100 draws cannot estimate a dense one:
#: :func:`dpsummary.sampling.nuts.mass_matrix_is_dense`); dense, at d = 106 every draw ran to the
#: maximum tree depth and a run took 80-86 s instead of 1-4 s (session 65).
MATCH_WARMUP = 300
MATCH_DRAWS_PER_CHAIN = 2000
#: Independent NUTS runs (of 8,000 draws each) that measure the chosen pseudocoreset's agreement
#: where importance sampling does not reach IS_MIN_ESS.
VERIFY_RUNS = 2
#: Importance-sampling draws, and the effective draws below which NUTS estimates the moments.
#: What the artifact's ``pseudocoreset_match.method`` says; ``estimator`` says how the exact
#: posterior's moments were read (importance sampling or NUTS).
MATCH_METHOD = "exact-posterior moments"
IS_DRAWS = 100_000
IS_MIN_ESS = 20_000.0
#: The carrier prior is needed where the target's largest variance is above the prior's over
#: CARRIER_NEEDED (a widening of up to 10% must stay possible), and then its variance is
#: CARRIER_MARGIN times that largest variance. Widening more than needed costs agreement: a
#: wider prior leaves more of the posterior to the non-Gaussian likelihood (measured on
#: german_credit, epsilon 1: sds 1.06-1.13x the target's under the model's prior, 1.14-1.24x
#: under a prior 1.19x wider).
CARRIER_NEEDED = 1.2
CARRIER_MARGIN = 1.25
#: Floor of the construction target's variances relative to the signed ones (whitened).
MIN_RELATIVE_VARIANCE = 0.2
#: The issue's agreement criterion between the exact posterior and the signed Gaussian.
AGREEMENT_MEAN_SD = 0.05
AGREEMENT_SD_RATIO = 0.03
#: Each update moves this fraction of the way (Monte Carlo noise in the moments is not chased).
DAMPING = 0.8


@dataclass(frozen=True)
class MomentMatch:
    """The matched pseudocoreset, the model it is released under (carrier prior) and the
    measured agreement of its exact posterior with the signed Gaussian."""

    points: torch.Tensor
    weights: torch.Tensor
    model: Model
    iterations: int
    max_mean_error_sd: float
    sd_ratio_min: float
    sd_ratio_max: float
    draws: int
    carrier_prior_scale: float | None
    estimator: str = "NUTS"
    #: How the pseudocoreset was matched (linear regression: exact moments by quadrature).
    method: str = MATCH_METHOD

    @property
    def agrees(self) -> bool:
        return (self.max_mean_error_sd <= AGREEMENT_MEAN_SD
                and abs(self.sd_ratio_min - 1.0) <= AGREEMENT_SD_RATIO and abs(self.sd_ratio_max - 1.0) <= AGREEMENT_SD_RATIO)

    def claim(self) -> dict[str, str | float | int | bool | None]:
        """What the artifact records (public: functions of the DP target and public values)."""
        return {"method": self.method, "estimator": self.estimator, "iterations": self.iterations,
                "max_mean_error_sd": round(self.max_mean_error_sd, 4), "sd_ratio_min": round(self.sd_ratio_min, 4),
                "sd_ratio_max": round(self.sd_ratio_max, 4), "draws": self.draws, "agrees": self.agrees,
                "carrier_prior_scale": self.carrier_prior_scale}

    def note(self) -> str:
        verdict = "within" if self.agrees else "OUTSIDE"
        return (f"pseudocoreset's exact posterior matched to the noise-aware Gaussian's moments in {self.iterations} "
                f"iteration(s): means within {self.max_mean_error_sd:.3f} sd, sds {self.sd_ratio_min:.3f}-{self.sd_ratio_max:.3f}x "
                f"({verdict} 0.05 sd and 3%, measured by {self.estimator}, {self.draws} effective draws)")


def carrier_model(model: ModelT, target: GaussianPosterior) -> tuple[ModelT, float | None]:
    """The model with the prior scale the pseudocoreset is released under: the model's own where
    the target is narrower than ``prior / CARRIER_NEEDED`` in every direction, else widened to
    ``sqrt(CARRIER_MARGIN * lambda_max(S))``. Returns ``(model, widened scale or None)``."""
    cov = target.cov.detach().to(DTYPE)
    lam_max = float(torch.linalg.eigvalsh(0.5 * (cov + cov.T)).max())
    if lam_max * CARRIER_NEEDED < model.prior_scale**2:
        return model, None
    scale = math.sqrt(CARRIER_MARGIN * lam_max)
    spec = {**model.spec(), "prior_scale": scale}
    del spec["name"]
    return type(model)(spec.pop("num_features"), **spec), scale


@dataclass(frozen=True)
class ExactMoments:
    """An estimate of the exact weighted posterior's moments: ``mean`` and ``sd`` (d,), the
    effective draws (the smallest coordinate's), how they were read, and per-coordinate Monte
    Carlo standard errors of the mean (``sd / sqrt(ESS)``) and of the sd (``sd / sqrt(2 ESS)``,
    the Gaussian value; ESS per coordinate: NUTS's bulk ESS summed over pooled runs, importance
    sampling's Kish ESS)."""

    mean: np.ndarray
    sd: np.ndarray
    draws: int
    estimator: str
    se_mean: np.ndarray
    se_sd: np.ndarray


def exact_moments(model: Model, points: torch.Tensor, weights: torch.Tensor, target: GaussianPosterior, *,
                  settings: object, generator: torch.Generator, nuts_runs: int = 1) -> ExactMoments:
    """The moments of the exact weighted posterior ``prior x prod p^w`` (:class:`ExactMoments`).

    Importance sampling from a multivariate t (5 degrees of freedom, 1.3x the target's scale)
    when it reaches :data:`IS_MIN_ESS` effective draws (low dimensions: its sd estimates are
    then about 4x more precise than 4,000 NUTS draws'), else ``nuts_runs`` NUTS runs pooled."""
    from ..sampling import NutsSettings, sample_posterior
    from ..sampling.reference import importance_moments

    est = importance_moments(model, points, weights, target, draws=IS_DRAWS, generator=generator)
    if est.ess >= IS_MIN_ESS:
        sd = est.sd.numpy()
        return ExactMoments(est.mean.numpy(), sd, int(est.ess), "importance sampling", sd / math.sqrt(est.ess),
                            sd / math.sqrt(2.0 * est.ess))
    cfg = settings if isinstance(settings, NutsSettings) else NutsSettings(num_warmup=MATCH_WARMUP, draws_per_chain=MATCH_DRAWS_PER_CHAIN)
    runs = [sample_posterior(model, points, weights, start=target, settings=cfg,
                             seed=int(torch.randint(2**62, (1,), generator=generator))) for _ in range(nuts_runs)]
    flat = np.concatenate([r.flat() for r in runs], axis=0)
    ess = np.sum([np.where(np.isfinite(r.diagnostics.ess_bulk), r.diagnostics.ess_bulk, 1.0) for r in runs], axis=0)
    ess = np.clip(ess, 1.0, float(flat.shape[0]))
    sd = flat.std(0, ddof=1)
    return ExactMoments(flat.mean(0), sd, int(flat.shape[0]), "NUTS", sd / np.sqrt(ess), sd / np.sqrt(2.0 * ess))


def tolerances(est: ExactMoments, target_sd: np.ndarray) -> tuple[np.ndarray, np.ndarray]:
    """Per-coordinate tolerances of the mean error (in target sds) and of the sd ratio's
    distance from 1: the larger of :data:`MEAN_TOLERANCE` / :data:`SD_TOLERANCE` and ``q_d``
    standard errors of the estimate, ``q_d = Phi^-1(1 - 0.025 / d)`` (Bonferroni: an estimate
    with no systematic error is within every tolerance with probability at least 0.95)."""
    from statistics import NormalDist

    d = max(int(target_sd.shape[0]), 1)
    q = NormalDist().inv_cdf(1.0 - 0.025 / d)
    return (np.maximum(MEAN_TOLERANCE, q * est.se_mean / target_sd),
            np.maximum(SD_TOLERANCE, q * est.se_sd / target_sd))


def match_moments(model: GLM, target: GaussianPosterior, *, size: int, generator: torch.Generator,
                  settings: object | None = None) -> MomentMatch | None:
    """The moment-matched pseudocoreset of ``target`` (see the module docstring), or None when
    the closed-form construction does not apply (then the caller keeps its own construction and
    says so)."""
    from ..sampling import NutsSettings

    cfg = settings if isinstance(settings, NutsSettings) else NutsSettings(num_warmup=MATCH_WARMUP, draws_per_chain=MATCH_DRAWS_PER_CHAIN)
    carrier, widened = carrier_model(model, target)
    m = target.mean.detach().to(DTYPE).numpy()
    s_cov = target.cov.detach().to(DTYPE).numpy()
    s_cov = 0.5 * (s_cov + s_cov.T)
    sd = np.sqrt(np.diag(s_cov))
    chol = np.linalg.cholesky(s_cov)
    inv_chol = np.linalg.inv(chol)
    cap = 0.99 * carrier.prior_scale**2 / float(np.linalg.eigvalsh(s_cov).max())  # whitened variance cap
    frame_seed = int(torch.randint(2**62, (1,), generator=generator))
    cur_mean, cur_cov = m.copy(), s_cov.copy()  # the construction's target
    best: tuple[float, MomentMatch] | None = None
    it = 0
    for it in range(1, MAX_ITERATIONS + 1):
        cur = GaussianPosterior(mean=torch.as_tensor(cur_mean, dtype=DTYPE),
                                scale_tril=torch.linalg.cholesky(torch.as_tensor(cur_cov, dtype=DTYPE)))
        built = exact_glm_pseudopoints(carrier, cur, size=size, generator=torch.Generator().manual_seed(frame_seed))
        if built is None:
            return None
        est = exact_moments(carrier, built.points, built.weights, target, settings=cfg, generator=generator,
                            nuts_runs=VERIFY_RUNS if it == 1 else 1)
        mean_err = (est.mean - m) / sd
        ratio = est.sd / sd
        mean_tol, sd_tol = tolerances(est, sd)
        # Stop on the noise-aware tolerances; rank iterates on the fixed ones (ranking on the
        # noise-aware ones would favour the noisier single-run estimates).
        within = bool(np.all(np.abs(mean_err) <= mean_tol) and np.all(np.abs(ratio - 1.0) <= sd_tol))
        score = max(float(np.max(np.abs(mean_err))) / MEAN_TOLERANCE, float(np.max(np.abs(ratio - 1.0))) / SD_TOLERANCE)
        result = MomentMatch(points=built.points, weights=built.weights, model=carrier, iterations=it,
                             max_mean_error_sd=float(np.max(np.abs(mean_err))), sd_ratio_min=float(ratio.min()),
                             sd_ratio_max=float(ratio.max()), draws=est.draws, carrier_prior_scale=widened,
                             estimator=est.estimator)
        if best is None or score < best[0]:
            best = (score, result)
        if within or not np.isfinite(score):
            break
        # Means shift additively; sds scale multiplicatively, correlations kept (a full covariance
        # estimated from a few thousand draws is too noisy to feed back at d ~ 100: its
        # eigenvalues scatter by about 2 sqrt(d / draws)). Only coordinates outside their
        # tolerance move: inside it the error is what the estimate's noise can make.
        move_mean = np.abs(mean_err) > mean_tol
        move_sd = np.abs(ratio - 1.0) > sd_tol
        cur_mean = cur_mean - DAMPING * np.where(move_mean, mean_err * sd, 0.0)
        scale = np.where(move_sd, np.clip(ratio ** -DAMPING, 0.5, 2.0), 1.0)
        cur_cov = cur_cov * np.outer(scale, scale)
        lam, vec = np.linalg.eigh(inv_chol @ cur_cov @ inv_chol.T)
        cur_cov = chol @ ((vec * np.clip(lam, MIN_RELATIVE_VARIANCE, cap)) @ vec.T) @ chol.T
        cur_cov = 0.5 * (cur_cov + cur_cov.T)
    assert best is not None
    chosen = best[1]
    if it == 1 and chosen.estimator == "NUTS":
        # Stopped at the first iterate, whose estimate pooled VERIFY_RUNS runs: nothing was chosen
        # among noisy estimates, so its figures are recorded as measured.
        return chosen
    # The figures recorded are not the chosen iterate's own (choosing the best of noisy estimates
    # flatters them): VERIFY_RUNS fresh NUTS runs of the chosen pseudocoreset measure them again.
    est = exact_moments(carrier, chosen.points, chosen.weights, target, settings=cfg, generator=generator,
                        nuts_runs=VERIFY_RUNS)
    ratio = est.sd / sd
    return MomentMatch(points=chosen.points, weights=chosen.weights, model=chosen.model, iterations=it,
                       max_mean_error_sd=float(np.max(np.abs(est.mean - m) / sd)), sd_ratio_min=float(ratio.min()),
                       sd_ratio_max=float(ratio.max()), draws=est.draws, carrier_prior_scale=widened,
                       estimator=est.estimator)
