"""Convergence diagnostics of MCMC draws: rank-normalised split R-hat, bulk and tail ESS.

The estimators of Vehtari, Gelman, Simpson, Carpenter and Buerkner (2021), "Rank-normalization,
folding, and localization: an improved R-hat for assessing convergence of MCMC" (Bayesian
Analysis 16(2)), as ArviZ and Stan compute them:

* every chain is split in halves (first and last ``n // 2`` draws), so a chain that drifts shows
  as two chains that disagree;
* **R-hat** is the larger of the split R-hat of the rank-normalised draws (bulk) and of the
  rank-normalised absolute deviations from the median (folded: the tails' scale);
* **bulk ESS** is the ESS of the rank-normalised split draws; **tail ESS** the smaller ESS of
  the indicators ``x <= q05`` and ``x <= q95``;
* the ESS itself uses Geyer's initial positive then initial monotone sequence on the
  multi-chain autocorrelations (Stan's estimator).

Why our own code and not ArviZ: ArviZ 0.23 brings xarray, pandas, h5py and netCDF (about 440 MB)
into a core install that needs four functions of it. ``tests/sampling/test_diagnostics.py``
checks these against ArviZ to 1e-6 on the same draws wherever ArviZ is installed (CI installs it).

Thresholds (:data:`RHAT_MAX`, :data:`ESS_MIN`) are the ones Vehtari et al. recommend: R-hat below
1.01 and at least 100 ESS per chain for four chains (400).
"""

from __future__ import annotations

import math
from dataclasses import dataclass

import numpy as np

#: R-hat above this means the chains have not mixed (Vehtari et al. 2021, Section 4).
RHAT_MAX = 1.01
#: Bulk or tail ESS below this is too few for stable interval estimates (Vehtari et al. 2021).
ESS_MIN = 400.0


def _as_chains(draws: np.ndarray) -> np.ndarray:
    x = np.asarray(draws, dtype=float)
    if x.ndim == 1:
        x = x[None, :]
    if x.ndim != 2:
        raise ValueError("draws of one parameter must be (chains, draws)")
    return x


def split_chains(draws: np.ndarray) -> np.ndarray:
    """``(C, n)`` draws as ``(2C, n // 2)``: each chain's first and last halves (a middle draw of
    an odd-length chain is left out)."""
    x = _as_chains(draws)
    half = x.shape[1] // 2
    return np.concatenate([x[:, :half], x[:, x.shape[1] - half:]], axis=0)


def rank_normalise(draws: np.ndarray) -> np.ndarray:
    """Normal scores of the pooled ranks (average ranks for ties, Blom's offset 3/8)."""
    # scipy.stats is imported here, not at the top: a release imports this package (moment
    # matching) and stays free of scipy.stats unless it samples (tests/test_speed_imports.py).
    from scipy import stats

    x = np.asarray(draws, dtype=float)
    ranks = stats.rankdata(x, method="average").reshape(x.shape)
    return stats.norm.ppf((ranks - 0.375) / (x.size + 0.25))


def _autocovariance(x: np.ndarray) -> np.ndarray:
    """Per-chain autocovariances at every lag, ``(C, n)``, divided by n (FFT, zero-padded)."""
    n = x.shape[1]
    size = 1 << (2 * n - 1).bit_length()
    centred = x - x.mean(axis=1, keepdims=True)
    f = np.fft.rfft(centred, n=size, axis=1)
    return np.fft.irfft(f * np.conjugate(f), n=size, axis=1)[:, :n] / n


def ess(draws: np.ndarray) -> float:
    """Effective sample size of ``(C, n)`` draws of one quantity (no split, no ranks): Geyer's
    initial positive sequence of paired autocorrelations, made monotone; ``tau`` is floored at
    ``1 / log10(C n)`` as in Stan. Constant draws give ``C n``; non-finite draws NaN."""
    x = _as_chains(draws)
    if not np.isfinite(x).all():
        return math.nan
    chains, n = x.shape
    if n < 4:
        return math.nan
    if x.max() - x.min() < np.finfo(float).resolution:
        return float(x.size)
    acov = _autocovariance(x)
    mean_var = acov[:, 0].mean() * n / (n - 1.0)
    var_plus = mean_var * (n - 1.0) / n
    if chains > 1:
        var_plus += np.var(x.mean(axis=1), ddof=1)
    rho = 1.0 - (mean_var - acov.mean(axis=0)) / var_plus  # (n,) combined autocorrelations
    rho[0] = 1.0
    # Initial positive sequence: keep pairs (rho[t+1], rho[t+2]) while the previous pair's sum
    # is positive; the last pair examined ends the sequence.
    kept = np.zeros(n)
    kept[0], kept[1] = 1.0, rho[1]
    even, odd = 1.0, rho[1]
    t = 1
    while t < n - 3 and even + odd > 0.0:
        even, odd = rho[t + 1], rho[t + 2]
        if even + odd >= 0:
            kept[t + 1], kept[t + 2] = even, odd
        t += 2
    last = t - 2
    if even > 0:
        kept[last + 1] = even
    # Initial monotone sequence: no pair sum may exceed the one before it.
    t = 1
    while t <= last - 2:
        if kept[t + 1] + kept[t + 2] > kept[t - 1] + kept[t]:
            kept[t + 1] = kept[t + 2] = (kept[t - 1] + kept[t]) / 2.0
        t += 2
    total = chains * n
    tau = -1.0 + 2.0 * kept[: last + 1].sum() + kept[last + 1: last + 2].sum()
    tau = max(tau, 1.0 / math.log10(total))
    return float(total / tau)


def _split_rhat(x: np.ndarray) -> float:
    n = x.shape[1]
    between = n * np.var(x.mean(axis=1), ddof=1)
    within = np.var(x, axis=1, ddof=1).mean()
    return float(math.sqrt((between / within + n - 1) / n))


def rhat(draws: np.ndarray) -> float:
    """Rank-normalised split R-hat of ``(C, n)`` draws of one quantity (the larger of the bulk
    and folded versions). NaN for fewer than 2 chains or 4 draws, or non-finite draws."""
    x = _as_chains(draws)
    if x.shape[0] < 2 or x.shape[1] < 4 or not np.isfinite(x).all():
        return math.nan
    split = split_chains(x)
    bulk = _split_rhat(rank_normalise(split))
    folded = _split_rhat(rank_normalise(np.abs(split - np.median(split))))
    return max(bulk, folded)


def ess_bulk(draws: np.ndarray) -> float:
    """Bulk ESS: the ESS of the rank-normalised split chains."""
    x = _as_chains(draws)
    if x.shape[1] < 4 or not np.isfinite(x).all():
        return math.nan
    return ess(rank_normalise(split_chains(x)))


def ess_tail(draws: np.ndarray) -> float:
    """Tail ESS: the smaller ESS of the split-chain indicators of the 5% and 95% quantiles."""
    x = _as_chains(draws)
    if x.shape[1] < 4 or not np.isfinite(x).all():
        return math.nan
    return min(ess(split_chains((x <= np.quantile(x, p)).astype(float))) for p in (0.05, 0.95))


@dataclass(frozen=True)
class Diagnostics:
    """Per-parameter R-hat, bulk and tail ESS, and the run's divergent transitions."""

    rhat: np.ndarray  # (d,)
    ess_bulk: np.ndarray  # (d,)
    ess_tail: np.ndarray  # (d,)
    divergences: int
    chains: int
    draws_per_chain: int

    def problems(self, names: list[str] | None = None) -> list[str]:
        """What fails the thresholds, one phrase each (empty when the draws can be trusted).
        ``names`` (one per parameter) names the worst coordinate."""
        out: list[str] = []

        def worst(values: np.ndarray, largest: bool) -> str:
            i = int(np.nanargmax(values) if largest else np.nanargmin(values))
            return f" ({names[i]})" if names and i < len(names) else f" (parameter {i})"

        if self.chains < 2:
            out.append("one chain: R-hat needs at least 2 chains")
        elif not np.isfinite(self.rhat).all():
            out.append("R-hat is not finite (non-finite or constant draws)")
        elif float(self.rhat.max()) > RHAT_MAX:
            out.append(f"R-hat {float(self.rhat.max()):.3f} > {RHAT_MAX}{worst(self.rhat, True)}")
        for label, values in (("bulk", self.ess_bulk), ("tail", self.ess_tail)):
            if not np.isfinite(values).all():
                out.append(f"{label} ESS is not finite")
            elif float(values.min()) < ESS_MIN:
                out.append(f"{label} ESS {float(values.min()):.0f} < {ESS_MIN:.0f}{worst(values, False)}")
        if self.divergences:
            out.append(f"{self.divergences} divergent transition(s)")
        return out

    def summary(self) -> str:
        """One line: the worst figures (``nan`` where a figure is not defined, e.g. R-hat of one chain)."""
        def worst(values: np.ndarray, largest: bool) -> float:
            finite = values[np.isfinite(values)]
            if finite.size == 0:
                return math.nan
            return float(finite.max() if largest else finite.min())

        return (f"{self.chains} chains x {self.draws_per_chain} draws: max R-hat {worst(self.rhat, True):.3f}, "
                f"min bulk ESS {worst(self.ess_bulk, False):.0f}, min tail ESS {worst(self.ess_tail, False):.0f}, "
                f"{self.divergences} divergence(s)")


def diagnose(draws: np.ndarray, divergences: int = 0) -> Diagnostics:
    """:class:`Diagnostics` of ``(chains, draws, d)`` draws."""
    x = np.asarray(draws, dtype=float)
    if x.ndim != 3:
        raise ValueError("draws must be (chains, draws, d)")
    d = x.shape[2]
    return Diagnostics(
        rhat=np.array([rhat(x[:, :, j]) for j in range(d)]),
        ess_bulk=np.array([ess_bulk(x[:, :, j]) for j in range(d)]),
        ess_tail=np.array([ess_tail(x[:, :, j]) for j in range(d)]),
        divergences=int(divergences), chains=x.shape[0], draws_per_chain=x.shape[1])
