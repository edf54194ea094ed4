"""The analyst's side of a release: load, verify, inspect, sample, predict, export.

    import dpsummary
    rel = dpsummary.load("credit.dpsummary.json", key="dpsummary.pub")   # verifies the signature
    rel.claim["epsilon"]                 # the privacy guarantee the curator signed
    draws = rel.sample(2000, seed=0)     # (2000, d) numpy posterior draws (NUTS, with diagnostics)
    p = rel.posterior_predictive([{"age": "35", ...}], draws)   # (2000, 1) P(y = 1 | row)

**What a release is.** A weighted pseudocoreset: points ``x_m`` in model space (the public
feature transform applied, the target, if any, as the last column) and weights ``w_m``. The
weights are *likelihood exponents*: the release's posterior is

    p_w(theta) ∝ prior(theta) * prod_m p(x_m | theta) ** w_m

so a point of weight 12.5 counts as 12.5 copies of itself. Weights are not probabilities, need
not be integers, and pseudopoints may carry soft labels (logistic, in [0, 1]) and non-integer
counts (Poisson): every density here accepts them.

**Privacy.** Everything in this module is post-processing of the signed release: loading,
verifying, sampling (any number of times, with any sampler), predicting and exporting cost no
privacy and never touch the private data. The guarantee is the ``claim`` the curator signed.
"""

from __future__ import annotations

import secrets
import warnings
from collections.abc import Iterable, Mapping, Sequence
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any, Literal, overload

import numpy as np
import torch

from .constructors.base import Summary
from .data import Transform
from .gaussian import GaussianPosterior
from .models import (
    DTYPE,
    GLM,
    GaussianMean,
    LinearRegression,
    LogisticRegression,
    Model,
    PoissonRegression,
)
from .models.bnn import BNN

__all__ = ["RELEASE_FORMAT", "Release", "ReleaseFormatError", "load"]

#: The ``format`` of a release body (see ``dpsummary.release``).
RELEASE_FORMAT = "dpsummary.release/v1"

SampleMethod = Literal["auto", "exact", "laplace", "nuts", "vi"]
#: NUTS draws kept per chain at the least (Release.sample thins to the number asked for).
MIN_DRAWS_PER_CHAIN = 1000
#: ``sample(method="laplace")`` warns when a coordinate's Laplace sd is below this fraction of the
#: signed Gaussian's. The pseudocoreset is built so that its *exact* posterior has the signed
#: moments (issue 48); a logistic or Poisson likelihood skews that posterior, so the curvature at
#: its mode can be larger than its spread: 0.75-0.93x the signed widths on 11 cells of the
#: calibration suite (issue 50, 2026-11-29), on one of which the Laplace intervals missed and the
#: draws did not. At 0.95 a central 95% interval still covers about 94%.
LAPLACE_NARROW_RATIO = 0.95
PredictiveKind = Literal["mean", "sample", "log_likelihood"]


class ReleaseFormatError(ValueError):
    """A verified artifact whose body is not a usable release (wrong format, bad shapes)."""


@dataclass(frozen=True, eq=False)
class Release:
    """A loaded (and, unless loaded with ``allow_unsigned``, verified) release.

    Attributes: ``summary`` (the core :class:`~dpsummary.constructors.base.Summary`), ``claim``
    (the signed privacy claim: epsilon per accountant, delta, adjacency, sampling, events,
    mechanism), ``feature_names`` (one per feature column of a point), ``param_names`` (one per
    coordinate of theta), ``transform`` (the public :class:`~dpsummary.data.Transform` mapping
    raw rows to model space, or None), ``envelope`` (``verified``, ``keyid`` and digests from
    :func:`dpsummary.artifact.read_artifact`), ``body`` (the raw release body) and ``path``.

    Weights are likelihood exponents (see the module docstring); using a release in any way costs
    no privacy.
    """

    summary: Summary
    claim: dict[str, Any] = field(default_factory=dict)
    feature_names: list[str] = field(default_factory=list)
    param_names: list[str] = field(default_factory=list)
    transform: Transform | None = None
    envelope: dict[str, Any] = field(default_factory=dict)
    body: dict[str, Any] = field(default_factory=dict)
    path: Path | None = None

    # ---- construction -----------------------------------------------------------------------
    @classmethod
    def from_summary(
        cls,
        summary: Summary,
        *,
        claim: Mapping[str, Any] | None = None,
        feature_names: Sequence[str] | None = None,
        envelope: Mapping[str, Any] | None = None,
        body: Mapping[str, Any] | None = None,
        path: Path | None = None,
    ) -> Release:
        """Wrap a core :class:`Summary` (e.g. a non-private baseline) as a release.

        Checks that points and weights are finite, of matching shapes, and weights >= 0.
        """
        model = summary.model
        pts, w = summary.points, summary.weights
        if pts.dim() != 2 or pts.shape[1] != model.point_dim:
            raise ReleaseFormatError(
                f"points must have shape (M, {model.point_dim}) for {model.name}, got {tuple(pts.shape)}"
            )
        if w.dim() != 1 or w.shape[0] != pts.shape[0]:
            raise ReleaseFormatError("weights must be a vector with one entry per point")
        if not bool(torch.isfinite(pts).all()) or not bool(torch.isfinite(w).all()):
            raise ReleaseFormatError("points and weights must be finite")
        if bool((w < 0).any()):
            raise ReleaseFormatError("weights must be non-negative")
        transform = Transform.from_dict(summary.transform) if summary.transform else None
        if transform is not None and transform.num_features != model.num_features:
            raise ReleaseFormatError("the transform's feature count does not match the model")
        names = list(feature_names) if feature_names is not None else (
            transform.feature_names if transform is not None else [f"x{i}" for i in range(model.num_features)]
        )
        if len(names) != model.num_features:
            raise ReleaseFormatError("feature_names must have one name per feature")
        return cls(
            summary=summary,
            claim=dict(claim or {}),
            feature_names=list(names),
            param_names=model.param_names(list(names)),
            transform=transform,
            envelope=dict(envelope or {}),
            body=dict(body or {}),
            path=path,
        )

    @classmethod
    def from_body(
        cls,
        body: Mapping[str, Any],
        claim: Mapping[str, Any] | None = None,
        envelope: Mapping[str, Any] | None = None,
        path: Path | None = None,
        *,
        posterior: str = "default",
    ) -> Release:
        """Build from a release body (``format: dpsummary.release/v1``) and its claim.

        ``posterior``: ``"default"`` (the release's own summary: noise-aware when its mechanism
        is; for ``dp-psvi`` releases the one calibrated by parametric bootstrap,
        :mod:`dpsummary.bootstrap`) or ``"raw"`` (the summary of the same noisy statistics without
        accounting for the noise: narrower, not calibrated; only artifacts that carry one, i.e.
        dp-psvi releases and noise-aware releases written before issue 25; otherwise a
        :class:`ReleaseFormatError`). ``"noise_aware"`` / ``"calibrated"`` insist on that kind of
        default."""
        if body.get("format") != RELEASE_FORMAT:
            raise ReleaseFormatError(f"not a {RELEASE_FORMAT} release body")
        if posterior not in ("default", "noise_aware", "calibrated", "raw"):
            raise ReleaseFormatError("posterior must be 'default', 'noise_aware', 'calibrated' or 'raw'")
        if posterior == "calibrated" and (body.get("posterior") or {}).get("default") != "calibrated":
            raise ReleaseFormatError("this release has no calibrated posterior (only dp-psvi releases are "
                                     "calibrated by parametric bootstrap)")
        if posterior == "raw" and "raw_summary" not in body:
            raise ReleaseFormatError("this release carries no raw summary (noise-aware releases dropped it in "
                                     "issue 25); load the default posterior")
        key = "raw_summary" if posterior == "raw" else "summary"
        if posterior == "noise_aware" and (body.get("posterior") or {}).get("default") != "noise_aware":
            raise ReleaseFormatError("this release has no noise-aware posterior (its mechanism is not noise-aware)")
        try:
            summary = Summary.from_dict(body[key])
        except (KeyError, TypeError, ValueError, RuntimeError) as exc:
            raise ReleaseFormatError(f"malformed summary in the release: {exc}") from None
        rel = cls.from_summary(
            summary, claim=claim, feature_names=body.get("feature_names"), envelope=envelope,
            body=body, path=path,
        )
        declared = body.get("param_names")
        if declared is not None and list(declared) != rel.param_names:
            raise ReleaseFormatError("param_names in the release do not match its model")
        return rel

    # ---- description ------------------------------------------------------------------------
    @property
    def model(self) -> Model:
        return self.summary.model

    @property
    def noise_aware(self) -> bool:
        """True when the loaded summary accounts for the privacy noise (the default of releases
        made by the noise-aware mechanism)."""
        return self.summary.info.get("posterior") == "noise_aware"

    @property
    def points(self) -> torch.Tensor:
        """``(M, point_dim)`` float64 points in model space (features, then the target)."""
        return self.summary.points

    @property
    def weights(self) -> torch.Tensor:
        """``(M,)`` float64 likelihood exponents (>= 0; samplers may drop zero-weight points)."""
        return self.summary.weights

    @property
    def dim(self) -> int:
        """Dimension d of theta."""
        return self.model.param_dim

    @property
    def parameter_names(self) -> list[str]:
        """One name per coordinate of theta, as ``inspect`` prints them (:attr:`param_names`); a
        linear release's last is ``log_sigma`` (``sigma = exp(log_sigma)``, model-space units)."""
        return list(self.param_names)

    @property
    def prior(self) -> dict[str, Any]:
        """The prior: independent normals, ``{"family": "normal", "mean": [...], "scale": s}``."""
        return {
            "family": "normal",
            "independent": True,
            "mean": self.model.prior_mean.tolist(),
            "scale": self.model.prior_scale,
        }

    @property
    def interval_calibration(self) -> dict[str, Any] | None:
        """What the release's mechanism records about its intervals (:mod:`dpsummary.caveats`):
        ``None`` when it records no caveat, else a dict with ``status``
        (``"not-validated-on-real-tables"`` for DP-PSVI; ``"unknown"`` for a dp-psvi artifact
        written before the record existed), ``reason``, ``validated_on`` and ``evidence``. When
        not None, treat the intervals as possibly overconfident on a real table;
        :func:`load` warns once (:class:`~dpsummary.caveats.IntervalCalibrationWarning`)."""
        from .caveats import interval_calibration

        return interval_calibration(self.claim)

    @property
    def verified(self) -> bool:
        """Whether the signature was verified when loading."""
        return bool(self.envelope.get("verified", False))

    @property
    def epsilon(self) -> dict[str, float]:
        """The claimed epsilon under each accountant (``rdp``, ``prv``, ``pld``)."""
        return dict(self.claim.get("epsilon", {}))

    @property
    def delta(self) -> float | None:
        return self.claim.get("delta")

    def nonzero(self) -> tuple[torch.Tensor, torch.Tensor]:
        """Points and weights without zero-weight points (the same posterior)."""
        keep = self.weights > 0
        return self.points[keep], self.weights[keep]

    def __repr__(self) -> str:
        eps = ", ".join(f"{k}={v:.3g}" for k, v in self.epsilon.items()) or "n/a"
        return (
            f"Release(model={self.model!r}, points={self.summary.size}, "
            f"total_weight={float(self.weights.sum()):.4g}, epsilon[{eps}], verified={self.verified})"
        )

    # ---- densities --------------------------------------------------------------------------
    @overload
    def log_density(self, theta: torch.Tensor) -> torch.Tensor: ...

    @overload
    def log_density(self, theta: np.ndarray | Sequence[float] | Sequence[Sequence[float]]) -> np.ndarray: ...

    def log_density(self, theta: Any) -> Any:
        """Unnormalised log posterior ``sum_m w_m log p(x_m | theta) + log prior(theta)``.

        All normalising constants of the likelihood and of the prior are included, on the
        constrained (natural) scale of theta: this is the reference every exporter reproduces.
        ``theta`` has shape ``(..., d)``; the result has shape ``(...)``. A torch tensor gives a
        float64 torch tensor (differentiable); anything else gives a float64 numpy array
        (``float(...)`` it for one theta, e.g. for emcee).
        """
        if isinstance(theta, torch.Tensor):
            return self._log_density_torch(theta)
        arr = np.asarray(theta, dtype=np.float64)
        with torch.no_grad():
            out = self._log_density_torch(torch.from_numpy(np.ascontiguousarray(arr)))
        return out.numpy()

    def _log_density_torch(self, theta: torch.Tensor) -> torch.Tensor:
        d = self.dim
        if theta.dim() == 0 or theta.shape[-1] != d:
            raise ValueError(f"theta must have shape (..., {d}), got {tuple(theta.shape)}")
        theta = theta.to(DTYPE)
        batch = theta.shape[:-1]
        flat = theta.reshape(-1, d)
        points, weights = self.nonzero()
        value = self.model.log_prior(flat)
        if points.shape[0] > 0:
            value = value + weights @ self.model.log_likelihood(points, flat)
        return value.reshape(batch)

    def log_likelihood(self, theta: torch.Tensor) -> torch.Tensor:
        """Unweighted per-point log-likelihoods, ``(M, S)`` for theta of shape ``(S, d)``."""
        return self.model.log_likelihood(self.points, theta.to(DTYPE).reshape(-1, self.dim))

    # ---- sampling ---------------------------------------------------------------------------
    @property
    def mixture(self) -> dict[str, Any] | None:
        """Mixture releases (``--model gmm|dpgmm``): the published weighted-CAVI fit on the
        pseudo-points, in the CSV's units (``columns``, ``weights``, ``means``,
        ``covariances``), or None for other models."""
        info = self.summary.info.get("mixture")
        return dict(info) if info else None

    def fit_mixture(self, *, n_components: int | None = None, seed: int = 0, covariance_scale: float = 0.01,
                    max_iter: int = 500) -> Any:
        """Weighted CAVI (:func:`dpsummary.mixtures.vi.fit_cavi`) on a mixture release's
        pseudo-points, in its model space (the transform's; ``transform.scales`` map back to the
        CSV), with the release's weight process and the public prior the release itself used
        (``covariance_scale`` x identity); costs no privacy. Returns the
        :class:`~dpsummary.mixtures.vi.MixtureFit`."""
        import numpy as np

        from .mixtures.vi import MixturePrior, fit_cavi

        model = self.model
        process = getattr(model, "process", None)
        if process is None:
            raise ValueError("fit_mixture is for mixture releases (--model gmm|dpgmm)")
        k = int(n_components) if n_components is not None else int(getattr(model, "n_components", 10))
        d = model.num_features
        prior = MixturePrior(process=process, n_components=k, weight_concentration=1.0 / k, mean_precision=1.0,
                             mean=np.zeros(d), degrees_of_freedom=float(d),
                             covariance=covariance_scale * np.eye(d))
        points, weights = self.nonzero()
        return fit_cavi(points.numpy(), weights.numpy(), prior, np.random.default_rng(seed), max_iter=max_iter)

    def signed_gaussian(self) -> GaussianPosterior | None:
        """The Gaussian the release signs beside its pseudocoreset (the noise-aware posterior of
        the default mechanism; per-coordinate sds of a calibrated dp-psvi release), or None."""
        post = self.body.get("posterior") or {}
        default = post.get("default")
        g = (post.get("gaussians") or {}).get(default) if isinstance(default, str) else None
        if not isinstance(g, dict) or "mean" not in g:
            return None
        mean = torch.tensor(g["mean"], dtype=DTYPE)
        if "cov" in g:
            cov = torch.tensor(g["cov"], dtype=DTYPE)
            tril = torch.linalg.cholesky(0.5 * (cov + cov.T))
        elif "sd" in g:
            tril = torch.diag(torch.tensor(g["sd"], dtype=DTYPE))
        else:
            return None
        return GaussianPosterior(mean=mean, scale_tril=tril)

    def sample(
        self,
        num_samples: int = 1000,
        *,
        seed: int | None = None,
        method: SampleMethod = "auto",
        chains: int = 4,
        num_warmup: int = 1000,
        return_draws: bool = False,
        inference_data: bool = False,
        vi_steps: int = 2000,
    ) -> Any:
        """Draws from the release's weighted posterior: a numpy array ``(num_samples, d)`` float64
        (columns in the order of :attr:`param_names`).

        ``method``:
        * ``"nuts"`` (the default for logistic and Poisson releases, and for any model without a
          closed form): NUTS with mass-matrix adaptation (BlackJAX, :mod:`dpsummary.sampling`;
          dense, or diagonal above 50 parameters at the default warm-up) on the pseudocoreset's
          exact weighted posterior, whitened and warm-started by the release's signed Gaussian
          (or the pseudocoreset's Laplace approximation). ``chains`` chains of
          ``max(ceil(num_samples / chains), 1000)`` kept draws after ``num_warmup`` warm-up steps
          each; the diagnostics use all of them, and ``num_samples`` draws are returned, thinned
          evenly over the chains (chain after chain).
          Rank-normalised split R-hat, bulk and tail ESS and divergences are computed on every
          run; a :class:`~dpsummary.sampling.SamplingWarning` names any that fails (R-hat > 1.01,
          ESS < 400, a divergence) and the fix.
        * ``"exact"`` (independent draws of the exact posterior: conjugate models (Gaussian mean)
          and linear regression, sigma estimated, by quadrature over log sigma; their default),
          ``"laplace"`` (the Gaussian approximation at the pseudocoreset posterior's mode; a
          :class:`~dpsummary.sampling.SamplingWarning` says when it is narrower than the signed
          Gaussian, :data:`LAPLACE_NARROW_RATIO`),
          ``"vi"`` (Bayesian neural networks' default: mean-field Gaussian VI on the weighted
          pseudodata, :meth:`fit_variational`, ``vi_steps`` Adam steps).
        * ``"auto"``: exact if available, VI for a BNN, else NUTS.

        ``return_draws=True`` (NUTS) returns the :class:`~dpsummary.sampling.Draws` (per-chain
        values and their ``diagnostics``) instead of the array; ``inference_data=True`` (NUTS)
        an ArviZ ``InferenceData`` with one variable per parameter, named as ``inspect`` names
        them (needs ArviZ). ``seed`` makes the draws reproducible; sampling randomness is not
        privacy randomness. Sampling costs no privacy, whatever the number of draws.
        """
        from .sampling import NutsSettings, SamplingWarning, sample_posterior, warning_text

        if num_samples < 1:
            raise ValueError("num_samples must be at least 1")
        if not getattr(self.model, "parameter_draws", True):
            raise ValueError(f"a {self.model.name} release is fitted by weighted variational inference, not sampled: "
                             "use Release.fit_mixture() (or read Release.mixture for the published fit)")
        if method == "hmc":
            raise ValueError("method='hmc' was replaced by method='nuts' (NUTS with diagnostics, dpsummary.sampling)")
        if method not in ("auto", "exact", "laplace", "nuts", "vi"):
            raise ValueError(f"unknown method {method!r}; use 'auto', 'exact', 'laplace', 'nuts' or 'vi'")
        exact_draws = getattr(self.model, "exact_draws", None)
        if method == "auto":
            method = ("exact" if self.model.conjugate or exact_draws is not None
                      else ("vi" if isinstance(self.model, BNN) else "nuts"))
        if (return_draws or inference_data) and method != "nuts":
            raise ValueError("return_draws and inference_data are for method='nuts' (MCMC draws with diagnostics)")
        gen = torch.Generator().manual_seed(seed if seed is not None else int(torch.seed() % (2**63)))
        points, weights = self.nonzero()
        if method == "vi":
            if not isinstance(self.model, BNN):
                raise ValueError("method='vi' is for BNN releases; use 'nuts' or 'laplace'")
            mu, sd = self.fit_variational(seed=int(torch.randint(2**62, (1,), generator=gen)), steps=int(vi_steps))
            eps = torch.randn(num_samples, self.dim, generator=gen, dtype=DTYPE)
            return (mu + sd * eps).numpy()
        if method == "laplace" and isinstance(self.model, BNN):
            raise ValueError("a BNN posterior is multimodal; use method='vi' or 'nuts'")
        if method == "exact":
            if exact_draws is not None:  # linear regression: iid draws by quadrature over log sigma
                return exact_draws(points, weights, num_samples, gen).numpy()
            if not self.model.conjugate:
                raise ValueError(f"{self.model.name} has no exact posterior; use method='nuts'")
            return self.model.exact_posterior(points, weights).sample(num_samples, gen).numpy()
        if method == "laplace":
            from .metrics import summary_posterior

            laplace = summary_posterior(self.model, points, weights)
            text = self._laplace_narrower(laplace)
            if text is not None:
                name = self.path.name if self.path is not None else "release"
                warnings.warn(f"{name}: {text}", SamplingWarning, stacklevel=2)
            return laplace.sample(num_samples, gen).numpy()
        # At least MIN_DRAWS_PER_CHAIN draws per chain, whatever num_samples: fewer leave the tail
        # ESS near the 400 the diagnostics ask for (4 x 250 draws fell below it now and then), and
        # the extra draws cost little; the draws returned are then thinned evenly across chains.
        per_chain = max(-(-num_samples // chains) if chains >= 1 else 0, MIN_DRAWS_PER_CHAIN)
        settings = NutsSettings(chains=chains, num_warmup=num_warmup, draws_per_chain=per_chain)
        draws = sample_posterior(self.model, points, weights, start=self.sampler_frame(), settings=settings,
                                 seed=seed, names=list(self.param_names))
        text = warning_text(draws)
        if text is not None:
            name = self.path.name if self.path is not None else "release"
            warnings.warn(f"{name}: {text}", SamplingWarning, stacklevel=2)
        if inference_data:
            return draws.to_inference_data()
        if return_draws:
            return draws
        flat = draws.flat()
        return flat[np.linspace(0, flat.shape[0] - 1, num_samples).round().astype(int)] if num_samples < flat.shape[0] else flat

    def _laplace_narrower(self, laplace: GaussianPosterior) -> str | None:
        """Why ``laplace`` (the pseudocoreset posterior's Gaussian at its mode) should not be
        read as the release's posterior, or None: a coordinate's sd below
        :data:`LAPLACE_NARROW_RATIO` of the signed Gaussian's (public values only)."""
        signed = self.signed_gaussian()
        if signed is None or signed.mean.shape != laplace.mean.shape:
            return None
        ratio = torch.sqrt(torch.diagonal(laplace.cov) / torch.diagonal(signed.cov))
        worst = int(torch.argmin(ratio))
        if not float(ratio[worst]) < LAPLACE_NARROW_RATIO:
            return None
        names = list(self.param_names)
        name = names[worst] if len(names) == int(ratio.shape[0]) else f"coordinate {worst}"
        return (f"the Laplace approximation is narrower than the release's posterior ({name}: sd "
                f"{float(ratio[worst]):.2f}x the signed Gaussian's), so its intervals can miss; use method='nuts' "
                "(the default), which draws the posterior the pseudocoreset was matched to")

    def sampler_frame(self) -> GaussianPosterior:
        """The Gaussian ``N(loc, L L^T)`` by which :meth:`sample`'s NUTS and every exported
        program (docs/FORMAT.md, ``sampler_frame``) whiten and warm-start their chains: they
        sample ``z`` and read ``theta = loc + L z``, which leaves the posterior unchanged and
        makes it about as round as a standard normal. It is the signed Gaussian when the release
        carries a full covariance (noise-aware releases), else the pseudocoreset's Laplace
        approximation, else (a BNN, or a Newton failure) the VI fit; for linear regression with
        sigma estimated, the pseudocoreset posterior's exact moments. Computed from the artifact
        alone (no privacy cost)."""
        if self.model.exact_moments and not self.model.conjugate:
            # Linear regression with sigma estimated: the pseudocoreset posterior's exact moments
            # (quadrature) are the best whitening, and cheap.
            points, weights = self.nonzero()
            return self.model.exact_posterior(points, weights)
        signed = self.signed_gaussian()
        post = self.body.get("posterior") or {}
        full = "cov" in ((post.get("gaussians") or {}).get(post.get("default"), {}) or {})
        if signed is not None and full:
            return signed
        if not isinstance(self.model, BNN):
            from .inference import NewtonFailure, coreset_posterior

            points, weights = self.nonzero()
            try:
                return coreset_posterior(self.model, points, weights)
            except (NewtonFailure, RuntimeError):
                if signed is not None:
                    return signed
                raise
        mu, sd = self.fit_variational(seed=0)
        return GaussianPosterior(mean=mu.detach().to(DTYPE), scale_tril=torch.diag(sd.detach().to(DTYPE)))

    def fit_variational(self, *, steps: int = 2000, seed: int = 0, lr: float = 0.01, num_draws: int = 10,
                        ) -> tuple[torch.Tensor, torch.Tensor]:
        """Mean-field Gaussian VI on the weighted pseudodata (BNN releases): ``steps`` Adam steps
        on ``-ELBO = KL(r || prior) - E_r[sum_m w_m log p(x_m | theta)]`` with ``num_draws``
        reparameterised draws each (:func:`dpsummary.blackbox.objective.inner_fit`), started
        from the released variational posterior when the artifact has one. Returns ``(mean, sd)``
        of the fitted Gaussian, each ``(d,)``. Deterministic for a given ``seed``; no privacy."""
        from .blackbox.objective import InnerConfig, inner_fit
        from .models.bnn import MeanFieldGaussian

        model = self.model
        if not isinstance(model, BNN):
            raise ValueError("fit_variational is for BNN releases")
        if steps < 0:
            raise ValueError("steps must be non-negative")
        gen = torch.Generator().manual_seed(seed)
        family = MeanFieldGaussian(model.prior_scale)
        start = self.summary.info.get("variational") or {}
        if "mu" in start and "rho" in start:
            mu = torch.tensor(start["mu"], dtype=DTYPE).reshape(self.dim)
            rho = torch.tensor(start["rho"], dtype=DTYPE).reshape(self.dim)
        else:
            mu, rho = MeanFieldGaussian.init(model, gen)
        points, weights = self.nonzero()
        moments = None
        done = 0
        with torch.no_grad():
            while done < steps:
                chunk = min(100, steps - done)
                eps = torch.randn(chunk, num_draws, self.dim, generator=gen, dtype=DTYPE)
                mu, rho, moments = inner_fit(mu, rho, points, weights, eps, model, family,
                                             InnerConfig(steps=chunk, lr=lr, num_samples=num_draws), moments)
                done += chunk
        return mu.clone(), MeanFieldGaussian.sd(rho).clone()

    def posterior_mode(self) -> torch.Tensor:
        """The mode of the weighted posterior (Newton's method; exact for conjugate models)."""
        from .metrics import summary_posterior

        points, weights = self.nonzero()
        return summary_posterior(self.model, points, weights).mean

    # ---- new data ---------------------------------------------------------------------------
    def map_rows(self, rows: Iterable[Mapping[str, str]]) -> tuple[torch.Tensor, torch.Tensor | None]:
        """Raw rows (dicts of strings) -> ``(features (n, F), target (n,) or None)`` in model
        space, with the release's public transform."""
        if self.transform is None:
            raise ValueError("this release carries no feature transform; pass model-space features")
        return self.transform.transform_rows(rows)

    def posterior_predictive(
        self,
        new: Any,
        draws: torch.Tensor | np.ndarray,
        *,
        kind: PredictiveKind = "mean",
        seed: int | None = None,
    ) -> np.ndarray:
        """Posterior predictive quantities for new records, one row per draw: a numpy float64
        array, like :meth:`sample`'s draws.

        ``new``: raw rows (a list of dicts of strings, mapped with :meth:`map_rows`), or a
        ``(n, F)`` array of model-space features, or for ``kind="log_likelihood"`` a
        ``(n, point_dim)`` array of model-space points (features then target). For the Gaussian
        mean model (no features) ``new`` is a number of new points, or points for
        ``log_likelihood``.

        ``kind``:
        * ``"mean"``: E[y | x, theta] per draw — P(y = 1) for logistic, the rate for Poisson,
          the mean for linear regression (in the target's original units when the transform is
          known), theta for the Gaussian mean. Shape ``(S, n)`` (``(S, n, d)`` Gaussian mean).
        * ``"sample"``: one simulated target per draw and record, same shape and units.
        * ``"log_likelihood"``: log p(y_i | x_i, theta_s), shape ``(S, n)``; rows must carry
          the target. Useful for held-out scores.
        ``seed``: the ``"sample"`` kind's simulation noise (non-private; None: fresh OS entropy).
        """
        out = self._predictive(new, draws, kind=kind, seed=seed)
        return np.asarray(out.detach().cpu().numpy(), dtype=np.float64)

    def _predictive(self, new: Any, draws: torch.Tensor | np.ndarray, *, kind: PredictiveKind,
                    seed: int | None) -> torch.Tensor:
        """:meth:`posterior_predictive` in torch."""
        th = torch.as_tensor(np.asarray(draws, dtype=np.float64)) if not isinstance(draws, torch.Tensor) else draws
        th = th.to(DTYPE).reshape(-1, self.dim)
        gen = torch.Generator().manual_seed(seed if seed is not None else secrets.randbits(63))
        model = self.model
        if isinstance(model, GaussianMean):
            if kind == "log_likelihood":
                pts = torch.as_tensor(np.asarray(new, dtype=np.float64)).reshape(-1, model.point_dim)
                return model.log_likelihood(pts, th).T
            n = int(new) if np.ndim(new) == 0 else int(np.shape(new)[0])
            mean = th[:, None, :].expand(th.shape[0], n, model.num_features)
            if kind == "mean":
                return mean.clone()
            if kind == "sample":
                eps = torch.randn(mean.shape, generator=gen, dtype=DTYPE)
                return mean + model.noise_scale * eps
            raise ValueError(f"unknown kind {kind!r}")

        x, y = self._features_and_target(new, need_target=kind == "log_likelihood")
        if kind == "log_likelihood":
            assert y is not None
            return model.log_likelihood(torch.cat([x, y[:, None]], 1), th).T
        if isinstance(model, BNN):
            return self._bnn_predictive(model, x, th, kind, gen)
        assert isinstance(model, GLM | LinearRegression)
        coef = model.split(th)[0] if isinstance(model, LinearRegression) else th
        eta = (model.design(torch.cat([x, torch.zeros(x.shape[0], 1, dtype=DTYPE)], 1)) @ coef.T).T
        if isinstance(model, LogisticRegression):
            mean = torch.sigmoid(eta)
            out = mean if kind == "mean" else (torch.rand(mean.shape, generator=gen, dtype=DTYPE) < mean).to(DTYPE)
        elif isinstance(model, PoissonRegression):
            mean = torch.exp(eta)
            out = mean if kind == "mean" else torch.poisson(mean, generator=gen)
        elif isinstance(model, LinearRegression):
            sigma = torch.exp(model.split(th)[1])  # (S, 1): the draws' own sigma (issue 51)
            out = eta if kind == "mean" else eta + sigma * torch.randn(eta.shape, generator=gen, dtype=DTYPE)
            if self.transform is not None and self.transform.target_kind == "real":
                out = self.transform.inverse_target(out)
        else:  # pragma: no cover - every registered model is handled above
            raise NotImplementedError(f"no predictive for {model.name}")
        if kind not in ("mean", "sample"):
            raise ValueError(f"unknown kind {kind!r}")
        return out

    def _bnn_predictive(self, model: BNN, x: torch.Tensor, th: torch.Tensor, kind: str,
                        gen: torch.Generator) -> torch.Tensor:
        """BNN: ``mean`` is P(y = 1 | x, theta) (Bernoulli) or the network's output in the
        target's units (Gaussian); ``sample`` one simulated target per draw and record."""
        if kind not in ("mean", "sample"):
            raise ValueError(f"unknown kind {kind!r}")
        with torch.no_grad():
            if model.likelihood == "bernoulli":
                mean = model.predictive_probs(x, th)[..., 1]
                return mean if kind == "mean" else (torch.rand(mean.shape, generator=gen, dtype=DTYPE) < mean).to(DTYPE)
            if model.likelihood == "gaussian":
                out = model.forward(x, th)[..., 0]
                if kind == "sample":
                    out = out + model.noise_scale * torch.randn(out.shape, generator=gen, dtype=DTYPE)
                if self.transform is not None and self.transform.target_kind == "real":
                    out = self.transform.inverse_target(out)
                return out
        raise NotImplementedError("posterior_predictive for softmax BNN releases: use model.predictive_probs")

    def _features_and_target(self, new: Any, *, need_target: bool) -> tuple[torch.Tensor, torch.Tensor | None]:
        f = self.model.num_features
        if isinstance(new, Sequence) and new and isinstance(new[0], Mapping):
            target = self.transform.target if self.transform is not None else None
            rows = list(new) if need_target or target is None else [
                {k: v for k, v in r.items() if k != target} for r in new
            ]
            x, y = self.map_rows(rows)
            x = x.to(DTYPE)
        else:
            arr = torch.as_tensor(np.asarray(new, dtype=np.float64))
            if arr.dim() == 1:
                arr = arr[None, :]
            if arr.shape[1] == f + 1 and self.model.has_target:
                x, y = arr[:, :f], arr[:, f]
            elif arr.shape[1] == f:
                x, y = arr, None
            else:
                raise ValueError(f"expected {f} feature columns (or {f + 1} with the target), got {arr.shape[1]}")
        if need_target and y is None:
            raise ValueError("log_likelihood needs the target: pass rows with the target column or full points")
        return x, y

    # ---- export -----------------------------------------------------------------------------
    def to_neutral(self, **kwargs: Any) -> dict[str, Any]:
        """The sampler-neutral document (``docs/FORMAT.md``), with its ``checks`` block."""
        from .export.neutral import to_neutral

        return to_neutral(self, **kwargs)

    def export(self, to: str, out: str | Path) -> list[Path]:
        """Write a sampler adapter (``"json"``, ``"stan"``, ``"pymc"``, ``"numpyro"``) into ``out``."""
        from .export import export

        return export(self, to, out)


def load(
    path: str | Path,
    key: str | Path | Any | None = None,
    *,
    allow_unsigned: bool = False,
    posterior: str = "default",
) -> Release:
    """Load a released artifact and verify its signature.

    ``posterior="default"`` gives the release's summary (noise-aware for the default mechanism);
    ``posterior="raw"`` the summary that ignores the privacy noise (for comparison only; only
    artifacts that carry one: dp-psvi releases, noise-aware releases written before issue 25;
    others raise :class:`~dpsummary.analyst.ReleaseFormatError` in one line).

    ``key``: the curator's public key (a PEM file path, or an Ed25519 public key object); when
    omitted, the default key of this machine's dpsummary home is used if there is one. An
    unsigned, tampered-with or foreign-key artifact raises
    :class:`dpsummary.artifact.ArtifactError`. ``allow_unsigned=True`` accepts a file whose
    signature is missing or cannot be checked (``release.verified`` is then False); a signature
    by the given key that does not verify still fails, and so does any change to the content.

    A release whose mechanism records that its intervals are not validated on real tables
    (DP-PSVI, including dp-psvi artifacts written before that record existed) loads, and emits
    one :class:`~dpsummary.caveats.IntervalCalibrationWarning` (a ``UserWarning``) naming the
    artifact and the caveat; the record is ``release.interval_calibration``.

    Loading costs no privacy. The weights are likelihood exponents (see :class:`Release`).
    """
    from .artifact import read_artifact
    from .caveats import IntervalCalibrationWarning, warning_text
    from .keys import Ed25519PublicKey, load_public_key

    public_key: Ed25519PublicKey | None
    if key is None:
        public_key = None
    elif isinstance(key, str | Path):
        public_key = load_public_key(key)
    elif isinstance(key, Ed25519PublicKey):
        public_key = key
    else:
        raise TypeError("key must be a path to a PEM public key or an Ed25519PublicKey")
    p = Path(path)
    body, claim, info = read_artifact(p, public_key, allow_unsigned=allow_unsigned)
    release = Release.from_body(body, claim, info, p, posterior=posterior)
    caveat = warning_text(claim)
    if caveat is not None:
        # The artifact's name is in the message, so Python's once-per-message filter still
        # shows one warning per artifact loaded.
        warnings.warn(f"{p.name}: {caveat}", IntervalCalibrationWarning, stacklevel=_outside_package_level())
    return release


def _outside_package_level() -> int:
    """The ``stacklevel`` (for a ``warnings.warn`` in the caller) of the first frame outside the
    dpsummary package, so the warning names the analyst's line, not ``dpsummary.load``'s wrapper."""
    import sys

    package = str(Path(__file__).resolve().parent)
    level, frame = 1, sys._getframe(1)
    while frame.f_back is not None and str(Path(frame.f_code.co_filename).resolve()).startswith(package):
        level, frame = level + 1, frame.f_back
    return level
