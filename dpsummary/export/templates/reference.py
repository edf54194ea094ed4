"""Reference log density of a dpsummary release, in plain NumPy/SciPy (no dpsummary needed).

Reads the sampler-neutral ``release.json`` (format ``dpsummary.neutral/v1``, see the dpsummary
docs/FORMAT.md) and evaluates the unnormalised weighted posterior, constants included:

    log p_w(theta) = sum_m w_m log p(x_m | theta) + log N(theta | prior_mean, prior_scale^2 I)

Weights are likelihood exponents. Use it with any sampler that takes a Python log density, for
example emcee (``python reference.py release.json`` runs the recipe below)::

    import emcee, numpy as np
    data = load("release.json")
    check(data)                                   # reproduces the checks block (rel. 1e-6)
    nwalkers, d = 4 * data["dim"], data["dim"]
    start = data["checks"][1]["theta"] + 1e-3 * np.random.default_rng(0).standard_normal((nwalkers, d))
    sampler = emcee.EnsembleSampler(nwalkers, d, lambda th: log_density(data, th), vectorize=True)
    sampler.run_mcmc(start, 3000)
    draws = sampler.get_chain(discard=1000, thin=10, flat=True)

Sampling a release costs no privacy.
"""

from __future__ import annotations

import json
import sys
from pathlib import Path
from typing import Any

import numpy as np
from scipy.special import gammaln

FAMILIES = ("gaussian_mean", "linear", "logistic", "poisson")


def load(path: str | Path) -> dict[str, Any]:
    """Read ``release.json`` (see :func:`from_document`)."""
    return from_document(json.loads(Path(path).read_text()))


def from_document(doc: dict[str, Any]) -> dict[str, Any]:
    """The neutral document as arrays: family, X (M, K), y (M,) or None, w (M,), prior, checks."""
    if doc.get("format") != "dpsummary.neutral/v1":
        raise ValueError("not a dpsummary.neutral/v1 document")
    m = doc["model"]
    k = int(m["num_features"])
    d = doc["data"]
    n = int(d["num_points"])
    return {
        "family": m["family"],
        "spec": dict(m.get("spec") or {}),
        "intercept": bool(m.get("intercept", False)),
        "noise_scale": m.get("noise_scale"),
        "noise_parameter": m.get("noise_parameter"),
        "num_features": k,
        "dim": int(doc["parameters"]["dim"]),
        "names": list(doc["parameters"]["names"]),
        "X": np.asarray(d["features"], dtype=np.float64).reshape(n, k),
        "y": None if d["target"] is None else np.asarray(d["target"], dtype=np.float64).reshape(n),
        "w": np.asarray(d["weights"], dtype=np.float64).reshape(n),
        "prior_mean": np.asarray(doc["prior"]["mean"], dtype=np.float64),
        "prior_scale": float(doc["prior"]["scale"]),
        "checks": [
            {"theta": np.asarray(c["theta"], dtype=np.float64), "log_density": float(c["log_density"])}
            for c in doc["checks"]["values"]
        ],
        "rtol": float(doc["checks"]["relative_tolerance"]),
        # The release's caveat on its intervals (None: its mechanism records none); main() prints it.
        "interval_warning": (doc.get("interval_calibration") or {}).get("warning"),
    }


def _log_sigmoid(z: np.ndarray) -> np.ndarray:
    return -np.logaddexp(0.0, -z)


def network(spec: dict[str, Any], x: np.ndarray, theta: np.ndarray) -> np.ndarray:
    """A BNN release's network f(x; theta) for theta (S, d): shape (S, M). Layer l: W_l
    (fan_in x fan_out, row-major) then b_l; the activation between layers only."""
    act = (lambda h: np.maximum(h, 0.0)) if spec["activation"] == "relu" else np.tanh
    sizes = [int(spec["num_features"]), *[int(w) for w in spec["widths"]], 1]
    s = theta.shape[0]
    h = np.broadcast_to(x, (s, *x.shape))
    offset = 0
    for i, (fan_in, fan_out) in enumerate(zip(sizes[:-1], sizes[1:], strict=True)):
        w = theta[:, offset:offset + fan_in * fan_out].reshape(s, fan_in, fan_out)
        offset += fan_in * fan_out
        b = theta[:, offset:offset + fan_out]
        offset += fan_out
        h = h @ w + b[:, None, :]
        if i < len(sizes) - 2:
            h = act(h)
    return h[..., 0]


def point_log_lik(data: dict[str, Any], theta: np.ndarray) -> np.ndarray:
    """Unweighted log p(x_m | theta) for theta (S, d): shape (S, M)."""
    theta = np.atleast_2d(theta)
    x, y, fam = data["X"], data["y"], data["family"]
    if fam == "bnn":
        spec = data["spec"]
        f = network(spec, x, theta)
        if spec["likelihood"] == "bernoulli":  # soft labels y in [0, 1]
            return y * _log_sigmoid(f) + (1.0 - y) * _log_sigmoid(-f)
        if spec["likelihood"] == "gaussian":
            s = float(spec["noise_scale"])
            return -0.5 * ((y - f) / s) ** 2 - np.log(s) - 0.5 * np.log(2 * np.pi)
        raise ValueError(f"unsupported BNN likelihood {spec['likelihood']!r}")
    if fam == "gaussian_mean":
        s = float(data["noise_scale"])
        k = x.shape[1]
        r = (x[None, :, :] - theta[:, None, :]) / s
        return -0.5 * (r * r).sum(-1) - k * np.log(s) - 0.5 * k * np.log(2 * np.pi)
    k = x.shape[1]
    if data["intercept"]:
        eta = theta[:, :1] + theta[:, 1:k + 1] @ x.T
    else:
        eta = theta[:, :k] @ x.T
    if fam == "linear":
        # log_sigma (theta's last entry) when sigma is estimated: one sd per draw, (S, 1).
        s = np.exp(theta[:, -1:]) if data.get("noise_parameter") == "log_sigma" else float(data["noise_scale"])
        return -0.5 * ((y - eta) / s) ** 2 - np.log(s) - 0.5 * np.log(2 * np.pi)
    if fam == "logistic":  # soft labels y in [0, 1]
        return y * _log_sigmoid(eta) + (1.0 - y) * _log_sigmoid(-eta)
    if fam == "poisson":  # real-valued counts y >= 0
        return y * eta - np.exp(eta) - gammaln(y + 1.0)
    raise ValueError(f"unknown family {fam!r}")


def log_prior(data: dict[str, Any], theta: np.ndarray) -> np.ndarray:
    theta = np.atleast_2d(theta)
    s, d = data["prior_scale"], data["dim"]
    z = (theta - data["prior_mean"]) / s
    return -0.5 * (z * z).sum(-1) - d * np.log(s) - 0.5 * d * np.log(2 * np.pi)


def log_density(data: dict[str, Any], theta: Any) -> np.ndarray:
    """Weighted log posterior (constants included) for theta of shape (..., d) -> (...)."""
    th = np.asarray(theta, dtype=np.float64)
    flat = th.reshape(-1, data["dim"])
    out = point_log_lik(data, flat) @ data["w"] + log_prior(data, flat)
    return out.reshape(th.shape[:-1])


def check(data: dict[str, Any], fn: Any = None) -> float:
    """Assert ``fn(theta)`` (default: :func:`log_density`) reproduces the checks block; returns
    the largest relative error."""
    fn = fn or (lambda th: log_density(data, th))
    worst = 0.0
    for c in data["checks"]:
        got = float(fn(c["theta"]))
        err = abs(got - c["log_density"]) / max(1.0, abs(c["log_density"]))
        worst = max(worst, err)
        if not err <= data["rtol"]:
            raise AssertionError(f"log density {got!r} != reference {c['log_density']!r}")
    return worst


def run_emcee(data: dict[str, Any], *, steps: int = 3000, burn: int = 1000, seed: int = 0) -> np.ndarray:
    """The emcee recipe: an affine-invariant ensemble on the reference density, flat draws."""
    import emcee

    d = data["dim"]
    nwalkers = max(4 * d, 8)
    rng = np.random.default_rng(seed)
    start = data["checks"][1]["theta"] + 1e-3 * rng.standard_normal((nwalkers, d))
    sampler = emcee.EnsembleSampler(nwalkers, d, lambda th: log_density(data, th), vectorize=True)
    sampler.random_state = np.random.RandomState(seed).get_state()
    sampler.run_mcmc(start, steps, progress=False)
    return sampler.get_chain(discard=burn, thin=5, flat=True)


def main(argv: list[str] | None = None) -> None:
    args = sys.argv[1:] if argv is None else argv
    path = Path(args[0]) if args else Path(__file__).with_name("release.json")
    data = load(path)
    if data["interval_warning"]:
        print(f"warning: {data['interval_warning']}")
    print(f"checks reproduced (max relative error {check(data):.2e})")
    draws = run_emcee(data)
    for name, mean, sd in zip(data["names"], draws.mean(0), draws.std(0), strict=True):
        print(f"{name:>30s}  {mean: .4f}  ({sd:.4f})")


if __name__ == "__main__":
    main()
