"""The sampler-neutral export (``dpsummary.neutral/v1``, documented field by field in
docs/FORMAT.md) and its ``checks`` block.

The document is plain JSON: model family and link, fixed likelihood parameters, prior, one name
per coordinate of theta, the points (features and targets separately) with strictly positive
weights (zero-weight points are dropped: they do not change the posterior and several samplers
reject a zero weight), the public preprocessing, the privacy claim, and ``checks``: test values
of theta with the reference log density (:meth:`dpsummary.analyst.Release.log_density`,
constants included, natural scale) that any adapter must reproduce to a relative 1e-6.

``dpsummary export --to json`` writes ``release.json`` and ``reference.py`` (a NumPy/SciPy-only
copy of the log density with the emcee recipe, :mod:`dpsummary.export.templates.reference`).
"""

from __future__ import annotations

import json
from pathlib import Path
from typing import Any, Protocol

import numpy as np
import torch

from ..caveats import interval_calibration, warning_text
from ..constructors.base import write_atomic
from ..models import DTYPE, GLM, GaussianMean, LinearRegression
from ..models.bnn import BNN


class Release(Protocol):
    """What an exporter reads of a loaded release (:class:`dpsummary.analyst.Release` provides
    it). A protocol, so the exporters do not import the analyst module that calls them."""

    @property
    def model(self) -> Any: ...
    @property
    def dim(self) -> int: ...
    @property
    def prior(self) -> dict[str, Any]: ...
    @property
    def summary(self) -> Any: ...
    @property
    def claim(self) -> dict[str, Any]: ...
    @property
    def feature_names(self) -> list[str]: ...
    @property
    def param_names(self) -> list[str]: ...
    @property
    def transform(self) -> Any: ...
    @property
    def envelope(self) -> dict[str, Any]: ...
    @property
    def body(self) -> dict[str, Any]: ...

    def nonzero(self) -> tuple[torch.Tensor, torch.Tensor]: ...
    def log_density(self, theta: Any) -> Any: ...
    def sampler_frame(self) -> Any: ...
    def sample(self, num_samples: int = ..., *, seed: int | None = ..., return_draws: bool = ...) -> Any: ...  # noqa: E501

NEUTRAL_FORMAT = "dpsummary.neutral/v1"
#: Relative tolerance (against max(1, |reference|)) every adapter must meet at the checks.
CHECK_RTOL = 1e-6

LINKS = {"gaussian_mean": "identity", "linear": "identity", "logistic": "logit", "poisson": "log",
         "bnn": "feed-forward network f(x; theta) (model.spec: widths, activation; layer l: W_l (fan_in x fan_out, "
                "row-major) then b_l; activation between layers, none after the last)"}
LIKELIHOODS = {
    "gaussian_mean": "-0.5*||x - theta||^2/noise_scale^2 - K*log(noise_scale) - 0.5*K*log(2*pi)",
    "linear": ("-0.5*((y - eta)/sigma)^2 - log(sigma) - 0.5*log(2*pi), eta from theta's coefficients; "
               "sigma = exp(theta[-1]) (parameter log_sigma) when noise_scale is null, else noise_scale"),
    "logistic": "y*log_sigmoid(eta) + (1 - y)*log_sigmoid(-eta)",
    "poisson": "y*eta - exp(eta) - lgamma(y + 1)",
    "bnn": ("bernoulli: y*log_sigmoid(f) + (1 - y)*log_sigmoid(-f); gaussian: "
            "-0.5*((y - f)/noise_scale)^2 - log(noise_scale) - 0.5*log(2*pi)"),
}


def check_thetas(release: Release, *, num_random: int = 2, seed: int = 0) -> list[tuple[str, np.ndarray]]:
    """Deterministic test values of theta: the prior mean, the posterior mode, draws of the
    Gaussian approximation, and prior draws (a fixed seed, so exports are reproducible)."""
    d = release.dim
    gen = torch.Generator().manual_seed(seed)
    model = release.model
    out: list[tuple[str, np.ndarray]] = [("prior mean", model.prior_mean.numpy().copy())]
    if isinstance(model, BNN):
        # No Laplace mode for a network (multimodal, d in the hundreds): the released variational
        # mean when there is one, then prior draws.
        var = release.summary.info.get("variational") or {}
        if "mu" in var:
            out.append(("released variational mean", np.asarray(var["mu"], dtype=np.float64).reshape(d)))
        for i, th in enumerate(model.sample_prior(num_random + 1, gen)):
            out.append((f"prior draw {i + 1}", th.numpy().copy()))
        return out
    try:
        from ..metrics import summary_posterior

        pts, w = release.nonzero()
        approx = summary_posterior(model, pts, w)
        out.append(("posterior mode", approx.mean.numpy().copy()))
        for i, th in enumerate(approx.sample(num_random, gen)):
            out.append((f"posterior approximation draw {i + 1}", th.numpy().copy()))
    except (RuntimeError, ValueError):  # Newton failed: prior-only checks are still valid
        out.append(("unit vector", np.ones(d)))
    for i, th in enumerate(model.sample_prior(num_random, gen)):
        out.append((f"prior draw {i + 1}", th.numpy().copy()))
    return out


def to_neutral(release: Release, *, num_random_checks: int = 2, seed: int = 0) -> dict[str, Any]:
    """The neutral document of a release (a JSON-able dict)."""
    model = release.model
    pts, w = release.nonzero()
    k = model.num_features
    if isinstance(model, GaussianMean):
        features, target = pts, None
        noise: float | None = model.noise_scale
        intercept = False
    elif isinstance(model, BNN):
        if model.target_dim != 1:
            raise NotImplementedError("no neutral export for softmax BNNs")
        features, target = pts[:, :k], pts[:, k]
        noise = model.noise_scale if model.likelihood == "gaussian" else None
        intercept = False
    elif isinstance(model, GLM | LinearRegression):
        features, target = pts[:, :k], pts[:, k]
        # A linear model with sigma estimated has noise_scale None: log_sigma is theta's last entry.
        noise = model.noise_scale if isinstance(model, LinearRegression) else None
        intercept = bool(model.intercept)
    else:  # pragma: no cover - every registered model is handled above
        raise NotImplementedError(f"no neutral export for model {model.name!r}")
    checks = []
    for label, th in check_thetas(release, num_random=num_random_checks, seed=seed):
        value = float(release.log_density(torch.as_tensor(th, dtype=DTYPE)))
        checks.append({"label": label, "theta": th.tolist(), "log_density": value})
    tr = release.transform
    env = release.envelope
    caveat = interval_calibration(release.claim)
    return {
        "format": NEUTRAL_FORMAT,
        "release_id": release.body.get("release_id"),
        "created": release.body.get("created"),
        # The mechanism's caveat on its intervals (dpsummary.caveats), with the one-line warning
        # every adapter prints; null when the mechanism records none.
        "interval_calibration": None if caveat is None else {**caveat, "warning": warning_text(release.claim)},
        "model": {
            "family": model.name,
            "link": LINKS[model.name],
            "log_likelihood": LIKELIHOODS[model.name],
            "num_features": k,
            "intercept": intercept,
            "noise_scale": noise,
            # Issue 51: the coordinate of theta that is log sigma (linear regression), or null.
            "noise_parameter": ("log_sigma" if isinstance(model, LinearRegression) and model.estimates_sigma
                                else None),
            "spec": model.spec(),
        },
        "prior": release.prior,
        "parameters": {"dim": release.dim, "names": list(release.param_names)},
        "feature_names": list(release.feature_names),
        "target_name": None if tr is None else tr.target,
        "data": {
            "num_points": int(pts.shape[0]),
            "features": features.tolist(),
            "target": None if target is None else target.tolist(),
            "weights": w.tolist(),
        },
        "dropped_zero_weight_points": int(release.summary.size - pts.shape[0]),
        "preprocessing": None if tr is None else tr.to_dict(),
        "privacy": {
            "claim": release.claim,
            "verified": bool(env.get("verified", False)),
            "keyid": env.get("keyid"),
            "artifact_digest": env.get("artifact_digest"),
            "subject_digest": env.get("subject_digest"),
        },
        "checks": {
            "relative_tolerance": CHECK_RTOL,
            "error": "|value - log_density| / max(1, |log_density|)",
            "scale": "constrained (theta as is, no Jacobian)",
            "constants": "included",
            "values": checks,
        },
        "sampler_frame": sampler_frame(release),
    }


def sampler_frame(release: Release) -> dict[str, Any] | None:
    """The whitening every exported program samples in (:meth:`dpsummary.analyst.Release.sampler_frame`,
    as ``Release.sample()`` does): ``theta = loc + scale_tril @ z`` with ``z`` the programs' free
    parameter. Any invertible frame leaves the posterior unchanged (the map is linear, its
    Jacobian a constant); this one makes it about as round as a standard normal, which a
    sampler adapting a diagonal mass matrix needs on a well-determined, correlated posterior
    (a linear release of 4,000 records mixed to R-hat 1.22 in PyMC without it). None when the
    release has none (a failed Laplace fit): the programs then use the prior's frame. Computed
    from the artifact alone."""
    try:
        frame = release.sampler_frame()
    except (RuntimeError, ValueError, ArithmeticError):
        return None
    loc = frame.mean.detach().to(DTYPE).numpy()
    tril = np.tril(frame.scale_tril.detach().to(DTYPE).numpy())
    if not (np.isfinite(loc).all() and np.isfinite(tril).all() and np.all(np.diagonal(tril) > 0)):
        return None
    return {"loc": loc.tolist(), "scale_tril": tril.tolist(),
            "about": "theta = loc + scale_tril @ z; the programs sample z and report theta (Release.sampler_frame)"}


def frame_arrays(doc: dict[str, Any]) -> tuple[np.ndarray, np.ndarray]:
    """``(loc, scale_tril)`` of a document's ``sampler_frame``, or the prior's frame
    ``(prior mean, prior scale x I)`` for a document without one (older files, a failed fit)."""
    d = int(doc["parameters"]["dim"])
    frame = doc.get("sampler_frame")
    if frame is None:
        return np.asarray(doc["prior"]["mean"], dtype=np.float64), float(doc["prior"]["scale"]) * np.eye(d)
    return (np.asarray(frame["loc"], dtype=np.float64).reshape(d),
            np.asarray(frame["scale_tril"], dtype=np.float64).reshape(d, d))


def sampling_check(release: Release, seed: int = 0) -> dict[str, Any] | None:
    """What dpsummary's own NUTS found on the release's weighted posterior at export time
    (``Release.sample``'s defaults, fixed ``seed``): its diagnostics line and the checks that
    failed (R-hat > 1.01, ESS < 400, divergences), plus the release's recorded agreement of that
    posterior with its signed Gaussian (``pseudocoreset_match``). None for releases whose
    default draws are not MCMC (conjugate models: exact draws; BNNs: VI). Issue 48: a release
    whose sampling cannot be trusted says so in every exported program."""
    import warnings

    model = release.model
    if (model.conjugate or hasattr(model, "exact_draws") or isinstance(model, BNN)
            or not getattr(model, "parameter_draws", True)):
        return None
    with warnings.catch_warnings():
        warnings.simplefilter("ignore")  # recorded in the document instead
        draws = release.sample(1000, seed=seed, return_draws=True)
    match = (release.body.get("posterior") or {}).get("pseudocoreset_match")
    problems = draws.problems()
    if isinstance(match, dict) and match.get("agrees") is False:
        problems.append(f"the exact posterior differs from the signed Gaussian beyond 0.05 sd / 3% (means within "
                        f"{match.get('max_mean_error_sd')} sd, sds {match.get('sd_ratio_min')}-{match.get('sd_ratio_max')}x)")
    return {"sampler": "dpsummary NUTS (BlackJAX), seed 0", "diagnostics": draws.diagnostics.summary(),
            "problems": problems, "pseudocoreset_match": match}


def caveat_header(doc: dict[str, Any], comment: str) -> bytes:
    """Comment lines (``comment`` is ``#`` or ``//``) stating the document's interval caveat and
    any sampling problem found at export, to put above an exported program; empty bytes when the
    release carries neither, so such a release exports its template byte for byte."""
    import textwrap

    texts = []
    caveat = doc.get("interval_calibration")
    if caveat:
        texts.append(f"WARNING: {caveat.get('warning')}. The full record is release.json's "
                     '"interval_calibration" (dpsummary docs/FORMAT.md).')
    check = doc.get("sampling_check")
    if check and check.get("problems"):
        texts.append(f"WARNING: sampling this release may not give its posterior: {'; '.join(check['problems'])} "
                     f"[{check.get('diagnostics')}]. Check R-hat, ESS and divergences of your own run; draw more "
                     "or warm up longer. The record is release.json's \"sampling_check\".")
    if not texts:
        return b""
    lines = [line for t in texts for line in [*textwrap.wrap(t, 96), ""]]
    return "".join(f"{comment} {line}\n" for line in lines).replace(" \n", "\n").encode()


def dump(doc: dict[str, Any]) -> bytes:
    """Serialise a neutral document (floats round-trip exactly)."""
    return (json.dumps(doc, indent=1, allow_nan=False) + "\n").encode()


def log_density(doc: dict[str, Any], theta: Any) -> np.ndarray:
    """The reference adapter's (NumPy/SciPy) log density of a neutral document at theta
    ``(..., d)``: what ``reference.py`` computes, in process (also the emcee target)."""
    from .templates import reference

    return reference.log_density(reference.from_document(doc), theta)


def write(release: Release, out: str | Path, *, neutral: dict[str, Any] | None = None) -> list[Path]:
    """Write ``release.json`` and ``reference.py`` (NumPy/SciPy + emcee recipe) into ``out``."""
    from .templates import reference

    doc = neutral if neutral is not None else to_neutral(release)
    out = Path(out)
    write_atomic(out / "release.json", dump(doc))
    write_atomic(out / "reference.py", caveat_header(doc, "#") + Path(reference.__file__).read_bytes())
    return [out / "release.json", out / "reference.py"]
