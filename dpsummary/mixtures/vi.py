"""Weighted variational inference for Bayesian Gaussian mixtures (BGMM) and truncated
Dirichlet-process mixtures (DPGMM), numpy float64.

Model (Bishop 2006, Section 10.2; Blei & Jordan 2006 for the stick-breaking prior)::

    pi        ~ Dirichlet(alpha0, ..., alpha0)                    (process="dirichlet_distribution")
    v_k       ~ Beta(1, gamma),  pi_k = v_k prod_{j<k} (1 - v_j)   (process="dirichlet_process")
    Lambda_k  ~ Wishart(W0, nu0),   mu_k | Lambda_k ~ N(m0, (beta0 Lambda_k)^-1)
    z_n       ~ Categorical(pi),    x_n | z_n = k ~ N(mu_k, Lambda_k^-1)

Mean-field family q(z) q(pi or v) prod_k q(mu_k, Lambda_k): categorical responsibilities, a
Dirichlet (or one Beta per stick) and Normal-Wishart factors. The truncation follows
scikit-learn's ``BayesianGaussianMixture``: T sticks, each with its own Beta factor (the T-th stick
is not pinned to 1 as in Blei & Jordan), so that our fixed points equal scikit-learn's (see
``docs/MIXTURES.md``).

**Weights.** Every point carries a weight ``w_n >= 0`` (a coreset weight, poster Algorithm 1):
the log-likelihood is ``sum_n w_n log p(x_n | theta)``. In coordinate ascent the responsibilities
``r_n`` of a point do not depend on its weight, but every sufficient statistic is weighted
(poster, "weight modification": ``phi_n = gamma_n phi_n``), so integer weights are *exactly* the
same as repeating rows. All global factors are affine in the weighted statistics
``(N_k, sum_n w_n r_nk x_n, sum_n w_n r_nk x_n x_n^T)``, which is what both CAVI and SVI update.

API (optax/blackjax style, explicit state, explicit ``numpy.random.Generator``, no global RNG)::

    state = cavi_init(x, w, prior, rng)            # k-means++ responsibilities, then an M-step
    state = cavi_step(state, x, w, prior)          # E-step, M-step, ELBO
    result = fit_cavi(x, w, prior, rng)            # the loop, with an ELBO trace

    state = svi_init(x, w, prior, rng)
    state = svi_step(state, x, w, prior, rng, batch_size=256)
    result = fit_svi(x, w, prior, rng, steps=500)

The ELBO is the full evidence lower bound, constants included (Bishop eqs. 10.70-10.77, with
weighted statistics), for the model above.
"""

from __future__ import annotations

import math
import time
from dataclasses import dataclass
from typing import Literal

import numpy as np
from scipy.linalg import solve_triangular
from scipy.special import digamma, gammaln, logsumexp, multigammaln

Process = Literal["dirichlet_distribution", "dirichlet_process"]
PROCESSES: tuple[Process, ...] = ("dirichlet_distribution", "dirichlet_process")
LOG_2PI = math.log(2.0 * math.pi)


def _as_points(x: np.ndarray) -> np.ndarray:
    arr = np.asarray(x, dtype=np.float64)
    if arr.ndim != 2 or arr.shape[0] < 1 or arr.shape[1] < 1:
        raise ValueError("points must be a non-empty (N, D) array")
    if not np.all(np.isfinite(arr)):
        raise ValueError("points must be finite")
    return arr


def _as_weights(weights: np.ndarray | None, n: int) -> np.ndarray:
    if weights is None:
        return np.ones(n)
    w = np.asarray(weights, dtype=np.float64)
    if w.shape != (n,):
        raise ValueError(f"weights must have shape ({n},), got {w.shape}")
    if not (np.all(np.isfinite(w)) and np.all(w >= 0) and w.sum() > 0):
        raise ValueError("weights must be finite, non-negative and not all zero")
    return w


@dataclass(frozen=True)
class MixturePrior:
    """Hyperparameters, named after scikit-learn's ``BayesianGaussianMixture`` arguments.

    ``weight_concentration`` is alpha0 (Dirichlet) or gamma (stick-breaking Beta(1, gamma));
    ``mean`` is m0, ``mean_precision`` beta0, ``degrees_of_freedom`` nu0 (> D - 1) and
    ``covariance`` the *inverse* Wishart scale W0^-1 (scikit-learn's ``covariance_prior``).
    """

    process: Process
    n_components: int
    weight_concentration: float
    mean_precision: float
    mean: np.ndarray
    degrees_of_freedom: float
    covariance: np.ndarray

    def __post_init__(self) -> None:
        d = self.mean.shape[0]
        if self.process not in PROCESSES:
            raise ValueError(f"process must be one of {PROCESSES}")
        if self.n_components < 1:
            raise ValueError("n_components must be at least 1")
        if not (self.weight_concentration > 0 and self.mean_precision > 0):
            raise ValueError("weight_concentration and mean_precision must be positive")
        if not self.degrees_of_freedom > d - 1:
            raise ValueError("degrees_of_freedom must exceed D - 1")
        if self.covariance.shape != (d, d):
            raise ValueError("covariance prior must be (D, D)")
        np.linalg.cholesky(self.covariance)  # raises LinAlgError unless positive definite

    @property
    def dim(self) -> int:
        return int(self.mean.shape[0])

    @classmethod
    def default(
        cls,
        process: Process,
        n_components: int,
        x: np.ndarray,
        weights: np.ndarray | None = None,
        *,
        weight_concentration: float | None = None,
        covariance_scale: float = 1.0,
    ) -> MixturePrior:
        """scikit-learn's defaults, computed from the *weighted* data: alpha0 (or gamma) = 1/K,
        beta0 = 1, m0 = weighted mean, nu0 = D, W0^-1 = ``covariance_scale`` x weighted covariance
        (normalised by the total weight; scikit-learn's ``np.cov`` uses N - 1, a factor N/(N-1)
        apart). With scale 1 the prior dominates the covariance of a tight component that holds
        a few hundred points; the benchmarks use 0.01 (prior component sd 10% of the data's)."""
        pts = _as_points(x)
        w = _as_weights(weights, pts.shape[0])
        mean = w @ pts / w.sum()
        diff = pts - mean
        cov = (diff * w[:, None]).T @ diff / w.sum()
        cov = cov + 1e-6 * np.eye(pts.shape[1]) * max(float(np.trace(cov)) / pts.shape[1], 1e-12)
        if not covariance_scale > 0:
            raise ValueError("covariance_scale must be positive")
        cov = covariance_scale * cov
        return cls(
            process=process,
            n_components=n_components,
            weight_concentration=1.0 / n_components if weight_concentration is None else weight_concentration,
            mean_precision=1.0,
            mean=mean,
            degrees_of_freedom=float(pts.shape[1]),
            covariance=cov,
        )


@dataclass(frozen=True)
class Statistics:
    """Weighted sufficient statistics per component: ``counts`` (K,) = sum_n w_n r_nk,
    ``sums`` (K, D) = sum_n w_n r_nk x_n, ``outer`` (K, D, D) = sum_n w_n r_nk x_n x_n^T."""

    counts: np.ndarray
    sums: np.ndarray
    outer: np.ndarray

    def interpolate(self, other: Statistics, step: float) -> Statistics:
        """``(1 - step) * self + step * other`` (the SVI natural-gradient step)."""
        return Statistics(
            (1 - step) * self.counts + step * other.counts,
            (1 - step) * self.sums + step * other.sums,
            (1 - step) * self.outer + step * other.outer,
        )


def weighted_statistics(x: np.ndarray, weights: np.ndarray, resp: np.ndarray, scale: float = 1.0) -> Statistics:
    """Statistics of points ``x`` with weights ``weights`` and responsibilities ``resp`` (N, K),
    all multiplied by ``scale`` (N / batch size in SVI)."""
    wr = resp * (weights * scale)[:, None]
    counts = wr.sum(0)
    sums = wr.T @ x
    outer = np.einsum("nk,ni,nj->kij", wr, x, x, optimize=True)
    return Statistics(counts, sums, outer)


@dataclass(frozen=True)
class MixturePosterior:
    """The global variational factors.

    ``weight_concentration``: (K,) Dirichlet parameters, or (K, 2) Beta parameters (a_k, b_k)
    of the sticks. ``mean_precision`` beta_k, ``means`` m_k, ``degrees_of_freedom`` nu_k and
    ``scale_inv`` W_k^-1 (with its Cholesky factor) of the Normal-Wishart factors.
    """

    process: Process
    weight_concentration: np.ndarray
    mean_precision: np.ndarray
    means: np.ndarray
    degrees_of_freedom: np.ndarray
    scale_inv: np.ndarray
    scale_inv_chol: np.ndarray

    @property
    def n_components(self) -> int:
        return int(self.means.shape[0])

    @property
    def dim(self) -> int:
        return int(self.means.shape[1])

    def expected_log_weights(self) -> np.ndarray:
        """E_q[ln pi_k] (Bishop 10.66; Blei & Jordan 2006 eq. 18 for the sticks)."""
        c = self.weight_concentration
        if self.process == "dirichlet_distribution":
            return np.asarray(digamma(c) - digamma(c.sum()))
        a, b = c[:, 0], c[:, 1]
        dsum = digamma(a + b)
        log_v = digamma(a) - dsum
        log_1mv = digamma(b) - dsum
        return np.asarray(log_v + np.concatenate(([0.0], np.cumsum(log_1mv)[:-1])))

    def expected_weights(self) -> np.ndarray:
        """E_q[pi] normalised to sum 1 (scikit-learn's ``weights_``)."""
        c = self.weight_concentration
        if self.process == "dirichlet_distribution":
            return np.asarray(c / c.sum())
        a, b = c[:, 0], c[:, 1]
        frac_rest = b / (a + b)
        w = a / (a + b) * np.concatenate(([1.0], np.cumprod(frac_rest[:-1])))
        return np.asarray(w / w.sum())

    def log_det_scale(self) -> np.ndarray:
        """ln |W_k| from the Cholesky factor of W_k^-1."""
        return -2.0 * np.log(np.diagonal(self.scale_inv_chol, axis1=1, axis2=2)).sum(1)

    def expected_log_det_precision(self) -> np.ndarray:
        """E_q[ln |Lambda_k|] (Bishop 10.65)."""
        d = self.dim
        i = np.arange(d)
        psi = digamma(0.5 * (self.degrees_of_freedom[:, None] - i[None, :])).sum(1)
        return np.asarray(psi + d * math.log(2.0) + self.log_det_scale())

    def covariances(self) -> np.ndarray:
        """(nu_k W_k)^-1 = W_k^-1 / nu_k, the inverse of E_q[Lambda_k] (scikit-learn's
        ``covariances_``): the covariance this summary reports for each component."""
        return np.asarray(self.scale_inv / self.degrees_of_freedom[:, None, None])

    def mahalanobis(self, x: np.ndarray) -> np.ndarray:
        """(N, K) matrix of (x_n - m_k)^T W_k (x_n - m_k)."""
        out = np.empty((x.shape[0], self.n_components))
        for k in range(self.n_components):
            y = solve_triangular(self.scale_inv_chol[k], (x - self.means[k]).T, lower=True)
            out[:, k] = (y * y).sum(0)
        return out


def posterior_from_statistics(prior: MixturePrior, stats: Statistics) -> MixturePosterior:
    """The optimal global factors given weighted statistics (the M-step; Bishop 10.58-10.63,
    Blei & Jordan 2006 eqs. 14-15 for the sticks), written affinely in the statistics."""
    n = stats.counts
    if prior.process == "dirichlet_distribution":
        conc = prior.weight_concentration + n
    else:
        tail = np.concatenate((np.cumsum(n[::-1])[-2::-1], [0.0]))  # sum_{j>k} N_j
        conc = np.stack((1.0 + n, prior.weight_concentration + tail), axis=1)
    beta = prior.mean_precision + n
    means = (prior.mean_precision * prior.mean + stats.sums) / beta[:, None]
    dof = prior.degrees_of_freedom + n
    m0m0 = np.outer(prior.mean, prior.mean)
    scale_inv = (
        prior.covariance + stats.outer + prior.mean_precision * m0m0
        - beta[:, None, None] * np.einsum("ki,kj->kij", means, means)
    )
    scale_inv = 0.5 * (scale_inv + np.swapaxes(scale_inv, 1, 2))
    chol = np.linalg.cholesky(scale_inv)
    return MixturePosterior(prior.process, conc, beta, means, dof, scale_inv, chol)


def expected_log_joint(posterior: MixturePosterior, x: np.ndarray) -> np.ndarray:
    """(N, K): E_q[ln pi_k] + E_q[ln N(x_n | mu_k, Lambda_k^-1)] (Bishop 10.46, 10.64-10.66)."""
    d = posterior.dim
    log_gauss = 0.5 * (
        posterior.expected_log_det_precision()[None, :]
        - d * LOG_2PI
        - d / posterior.mean_precision[None, :]
        - posterior.degrees_of_freedom[None, :] * posterior.mahalanobis(x)
    )
    return np.asarray(log_gauss + posterior.expected_log_weights()[None, :])


def responsibilities(posterior: MixturePosterior, x: np.ndarray) -> tuple[np.ndarray, np.ndarray]:
    """The E-step: responsibilities r (N, K) and ``r * ln r`` summed per point (N,)."""
    log_r = expected_log_joint(posterior, x)
    log_r -= log_r.max(1, keepdims=True)  # log-softmax, in place (one N x K array)
    r = np.exp(log_r)
    norm = r.sum(1, keepdims=True)
    r /= norm
    log_r -= np.log(norm)
    # log_r is finite, so r * log_r is 0 where exp underflowed to r = 0.
    return r, np.einsum("nk,nk->n", r, log_r)


def _log_wishart_norm(scale_log_det: np.ndarray, dof: np.ndarray | float, d: int) -> np.ndarray:
    """ln B(W, nu) (Bishop B.79) from ln |W|."""
    dof = np.asarray(dof, dtype=np.float64)
    mg = np.vectorize(lambda a: multigammaln(a, d))(0.5 * dof)
    return np.asarray(-0.5 * dof * scale_log_det - 0.5 * dof * d * math.log(2.0) - mg)


def elbo(prior: MixturePrior, posterior: MixturePosterior, stats: Statistics, weighted_neg_entropy: float) -> float:
    """The evidence lower bound (Bishop 10.70-10.77 with weighted statistics).

    ``stats`` are the weighted statistics of the responsibilities that ``posterior`` was
    computed against, and ``weighted_neg_entropy = sum_n w_n sum_k r_nk ln r_nk``.
    """
    d = posterior.dim
    n = stats.counts
    e_log_pi = posterior.expected_log_weights()
    e_log_det = posterior.expected_log_det_precision()
    beta, m, nu = posterior.mean_precision, posterior.means, posterior.degrees_of_freedom
    w_inv_chol = posterior.scale_inv_chol

    def trace_w(a: np.ndarray) -> np.ndarray:
        # Tr(W_k A_k) with W_k = (L L^T)^-1: Tr(L^-T L^-1 A).
        out = np.empty(a.shape[0])
        for k in range(a.shape[0]):
            y = solve_triangular(w_inv_chol[k], a[k], lower=True)
            z = solve_triangular(w_inv_chol[k], y.T, lower=True)
            out[k] = np.trace(z)
        return out

    # E[ln p(X | Z, mu, Lambda)] + E[ln p(Z | pi)], from the statistics.
    centred = (stats.outer - np.einsum("ki,kj->kij", stats.sums, m) - np.einsum("ki,kj->kij", m, stats.sums)
               + n[:, None, None] * np.einsum("ki,kj->kij", m, m))
    data = float((n * (e_log_pi + 0.5 * e_log_det - 0.5 * d * LOG_2PI - 0.5 * d / beta)).sum()
                 - 0.5 * (nu * trace_w(centred)).sum())
    # E[ln p(pi)] - E[ln q(pi)].
    c = posterior.weight_concentration
    if posterior.process == "dirichlet_distribution":
        a0, k = prior.weight_concentration, posterior.n_components
        weights_term = (gammaln(k * a0) - k * gammaln(a0) + (a0 - 1) * e_log_pi.sum()
                        - (gammaln(c.sum()) - gammaln(c).sum() + ((c - 1) * e_log_pi).sum()))
    else:
        g = prior.weight_concentration
        a, b = c[:, 0], c[:, 1]
        dsum = digamma(a + b)
        e_log_v, e_log_1mv = digamma(a) - dsum, digamma(b) - dsum
        weights_term = ((gammaln(1 + g) - gammaln(g) + (g - 1) * e_log_1mv).sum()
                        - (gammaln(a + b) - gammaln(a) - gammaln(b) + (a - 1) * e_log_v + (b - 1) * e_log_1mv).sum())
    # E[ln p(mu, Lambda)] - E[ln q(mu, Lambda)] (Bishop 10.74, 10.77).
    b0, m0, nu0 = prior.mean_precision, prior.mean, prior.degrees_of_freedom
    dm = m - m0
    dm_outer = np.einsum("ki,kj->kij", dm, dm)
    w0_inv = np.broadcast_to(prior.covariance, posterior.scale_inv.shape)
    w0_log_det = -float(np.linalg.slogdet(prior.covariance)[1])
    log_p = (0.5 * (d * math.log(b0 / (2 * math.pi)) + e_log_det - d * b0 / beta - b0 * nu * trace_w(dm_outer))
             + _log_wishart_norm(np.array(w0_log_det), nu0, d)
             + 0.5 * (nu0 - d - 1) * e_log_det - 0.5 * nu * trace_w(np.ascontiguousarray(w0_inv)))
    log_q = (0.5 * e_log_det + 0.5 * d * np.log(beta / (2 * math.pi)) - 0.5 * d
             + _log_wishart_norm(posterior.log_det_scale(), nu, d) + 0.5 * (nu - d - 1) * e_log_det - 0.5 * nu * d)
    return float(data - weighted_neg_entropy + weights_term + (log_p - log_q).sum())


# --------------------------------------------------------------------------- initialisation


def kmeans_responsibilities(
    x: np.ndarray, weights: np.ndarray, n_components: int, rng: np.random.Generator, iterations: int = 20
) -> np.ndarray:
    """One-hot (N, K) responsibilities from weighted k-means++ seeding and Lloyd iterations.

    Seeding draws the first centre with probability proportional to ``w_n`` and each further
    centre proportional to ``w_n d(x_n, centres)^2`` (uniform over weight if all distances vanish).
    """
    n = x.shape[0]
    p = weights / weights.sum()
    centres = [x[rng.choice(n, p=p)]]
    d2 = ((x - centres[0]) ** 2).sum(1)
    for _ in range(1, n_components):
        score = weights * d2
        probs = score / score.sum() if score.sum() > 0 else p
        c = x[rng.choice(n, p=probs)]
        centres.append(c)
        d2 = np.minimum(d2, ((x - c) ** 2).sum(1))
    cen = np.array(centres)
    labels = np.zeros(n, dtype=np.int64)
    for it in range(iterations):
        dist = (x * x).sum(1)[:, None] - 2 * x @ cen.T + (cen * cen).sum(1)[None, :]
        new_labels = dist.argmin(1)
        if it > 0 and np.array_equal(new_labels, labels):
            break
        labels = new_labels
        mass = np.bincount(labels, weights=weights, minlength=n_components)
        for k in np.flatnonzero(mass > 0):
            sel = labels == k
            cen[k] = weights[sel] @ x[sel] / mass[k]
    resp = np.zeros((n, n_components))
    resp[np.arange(n), labels] = 1.0
    return resp


# --------------------------------------------------------------------------- CAVI


@dataclass(frozen=True)
class CAVIState:
    """Global factors after ``iteration`` coordinate-ascent sweeps, and their ELBO."""

    posterior: MixturePosterior
    elbo: float
    iteration: int


def cavi_init(
    x: np.ndarray,
    weights: np.ndarray | None,
    prior: MixturePrior,
    rng: np.random.Generator,
    *,
    resp: np.ndarray | None = None,
) -> CAVIState:
    """Initial global factors: an M-step from ``resp`` (default: weighted k-means++ labels).
    The initial ELBO is that of (resp, factors)."""
    pts = _as_points(x)
    w = _as_weights(weights, pts.shape[0])
    if pts.shape[1] != prior.dim:
        raise ValueError("points and prior differ in dimension")
    if resp is None:
        resp = kmeans_responsibilities(pts, w, prior.n_components, rng)
    resp = np.asarray(resp, dtype=np.float64)
    if resp.shape != (pts.shape[0], prior.n_components):
        raise ValueError("resp must have shape (N, K)")
    stats = weighted_statistics(pts, w, resp)
    post = posterior_from_statistics(prior, stats)
    neg_ent = float(w @ np.where(resp > 0, resp * np.log(np.where(resp > 0, resp, 1.0)), 0.0).sum(1))
    return CAVIState(post, elbo(prior, post, stats, neg_ent), 0)


def cavi_step(state: CAVIState, x: np.ndarray, weights: np.ndarray | None, prior: MixturePrior) -> CAVIState:
    """One sweep: responsibilities given the factors, then factors given the weighted statistics
    (poster, weighted CAVI). The returned ELBO never decreases (coordinate ascent)."""
    pts = _as_points(x)
    w = _as_weights(weights, pts.shape[0])
    resp, neg_ent = responsibilities(state.posterior, pts)
    stats = weighted_statistics(pts, w, resp)
    post = posterior_from_statistics(prior, stats)
    return CAVIState(post, elbo(prior, post, stats, float(w @ neg_ent)), state.iteration + 1)


@dataclass(frozen=True)
class MixtureFit:
    """The result of a front door: final factors, ELBO per iteration (index 0 = initial state),
    whether the tolerance was met, and wall time in seconds."""

    posterior: MixturePosterior
    elbo_trace: np.ndarray
    converged: bool
    seconds: float

    @property
    def elbo(self) -> float:
        return float(self.elbo_trace[-1])


def fit_cavi(
    x: np.ndarray,
    weights: np.ndarray | None,
    prior: MixturePrior,
    rng: np.random.Generator,
    *,
    max_iter: int = 500,
    tol: float = 1e-8,
    resp: np.ndarray | None = None,
) -> MixtureFit:
    """Run CAVI until the ELBO gain falls below ``tol * max(1, |ELBO|)`` or ``max_iter`` sweeps."""
    start = time.perf_counter()
    state = cavi_init(x, weights, prior, rng, resp=resp)
    trace = [state.elbo]
    converged = False
    for _ in range(max_iter):
        state = cavi_step(state, x, weights, prior)
        trace.append(state.elbo)
        if abs(trace[-1] - trace[-2]) < tol * max(1.0, abs(trace[-1])):
            converged = True
            break
    return MixtureFit(state.posterior, np.array(trace), converged, time.perf_counter() - start)


# --------------------------------------------------------------------------- SVI


@dataclass(frozen=True)
class SVIState:
    """Stochastic VI state (Hoffman et al. 2013): full-data-scale statistics whose M-step gives
    the factors, and the number of steps taken."""

    statistics: Statistics
    posterior: MixturePosterior
    iteration: int


def svi_init(
    x: np.ndarray, weights: np.ndarray | None, prior: MixturePrior, rng: np.random.Generator,
    *, resp: np.ndarray | None = None,
) -> SVIState:
    """Same starting factors as :func:`cavi_init` (k-means++ responsibilities)."""
    pts = _as_points(x)
    w = _as_weights(weights, pts.shape[0])
    if resp is None:
        resp = kmeans_responsibilities(pts, w, prior.n_components, rng)
    stats = weighted_statistics(pts, w, resp)
    return SVIState(stats, posterior_from_statistics(prior, stats), 0)


def svi_step(
    state: SVIState,
    x: np.ndarray,
    weights: np.ndarray | None,
    prior: MixturePrior,
    rng: np.random.Generator,
    *,
    batch_size: int = 256,
    delay: float = 1.0,
    forgetting: float = 0.7,
) -> SVIState:
    """One natural-gradient step: a uniform mini-batch (with replacement) of ``batch_size``
    points (all N points, unsampled, when ``batch_size >= N``), their responsibilities, weighted statistics scaled by N / batch_size (an unbiased
    estimate of the full weighted statistics), and a step of size (t + delay)^-forgetting
    towards the factors those statistics imply. The natural parameters of all factors are
    affine in the statistics, so interpolating statistics is the natural-gradient step."""
    pts = _as_points(x)
    w = _as_weights(weights, pts.shape[0])
    n = pts.shape[0]
    # batch_size >= N: the full data, no sampling (then delay=0, forgetting=0 is a CAVI sweep).
    idx = np.arange(n) if batch_size >= n else rng.integers(0, n, size=batch_size)
    resp, _ = responsibilities(state.posterior, pts[idx])
    target = weighted_statistics(pts[idx], w[idx], resp, scale=n / idx.shape[0])
    rho = (state.iteration + 1 + delay) ** (-forgetting)
    stats = state.statistics.interpolate(target, rho)
    return SVIState(stats, posterior_from_statistics(prior, stats), state.iteration + 1)


def full_elbo(prior: MixturePrior, posterior: MixturePosterior, x: np.ndarray, weights: np.ndarray | None) -> float:
    """The ELBO of ``posterior`` with optimal responsibilities over the whole weighted data
    (one E-step; used to score SVI, whose state holds no responsibilities)."""
    pts = _as_points(x)
    w = _as_weights(weights, pts.shape[0])
    resp, neg_ent = responsibilities(posterior, pts)
    return elbo(prior, posterior, weighted_statistics(pts, w, resp), float(w @ neg_ent))


def fit_svi(
    x: np.ndarray,
    weights: np.ndarray | None,
    prior: MixturePrior,
    rng: np.random.Generator,
    *,
    steps: int = 500,
    batch_size: int = 256,
    delay: float = 1.0,
    forgetting: float = 0.7,
    elbo_every: int = 50,
    resp: np.ndarray | None = None,
) -> MixtureFit:
    """Run ``steps`` SVI steps from :func:`svi_init` (``resp`` as there); the trace holds the full
    ELBO every ``elbo_every`` steps (and at the start and end). ``converged`` is True (a fixed
    budget of steps)."""
    start = time.perf_counter()
    state = svi_init(x, weights, prior, rng, resp=resp)
    trace = [full_elbo(prior, state.posterior, x, weights)]
    for t in range(steps):
        state = svi_step(state, x, weights, prior, rng, batch_size=batch_size, delay=delay, forgetting=forgetting)
        if (t + 1) % elbo_every == 0 or t + 1 == steps:
            trace.append(full_elbo(prior, state.posterior, x, weights))
    return MixtureFit(state.posterior, np.array(trace), True, time.perf_counter() - start)


# --------------------------------------------------------------------------- prediction


def log_predictive_density(posterior: MixturePosterior, x: np.ndarray) -> np.ndarray:
    """ln p(x_new | data) under q: a mixture of Student-t densities with weights E_q[pi]
    (Bishop 10.81-10.82), shape (N,)."""
    pts = _as_points(x)
    d = posterior.dim
    nu, beta = posterior.degrees_of_freedom, posterior.mean_precision
    dof_t = nu + 1 - d
    # Student precision L_k = dof_t beta / (1 + beta) W_k; quadratic = that factor * mahalanobis.
    factor = dof_t * beta / (1 + beta)
    quad = posterior.mahalanobis(pts) * factor[None, :]
    log_det_l = d * np.log(factor) + posterior.log_det_scale()
    log_t = (gammaln(0.5 * (dof_t + d)) - gammaln(0.5 * dof_t) - 0.5 * d * np.log(dof_t * math.pi)
             + 0.5 * log_det_l)[None, :] - 0.5 * (dof_t + d)[None, :] * np.log1p(quad / dof_t[None, :])
    return np.asarray(logsumexp(log_t + np.log(posterior.expected_weights())[None, :], axis=1))


def expected_log_density(posterior: MixturePosterior, x: np.ndarray) -> np.ndarray:
    """ln sum_k exp(E_q[ln pi_k] + E_q[ln N(x | mu_k, Lambda_k^-1)]), shape (N,): the
    normaliser of the E-step, which is exactly what scikit-learn's
    ``BayesianGaussianMixture.score_samples`` returns (a Jensen lower bound on the log
    predictive density of :func:`log_predictive_density`)."""
    return np.asarray(logsumexp(expected_log_joint(posterior, _as_points(x)), axis=1))
