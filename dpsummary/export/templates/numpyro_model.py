"""NumPyro model of a dpsummary release (also a BlackJAX log density). Needs numpyro, jax.

Reads the sampler-neutral ``release.json`` beside this file (dpsummary docs/FORMAT.md). The
likelihood is written as explicit formulas inside ``plate`` + ``handlers.scale(scale=w)``: a
pseudocoreset carries soft labels and non-integer counts, which ``dist.Bernoulli`` and
``dist.Poisson`` would score as -inf, and ``scale`` raises the likelihood of point m to the
power w_m (weights are likelihood exponents; zero-weight points are already dropped from the
file because NumPyro rejects a zero scale). float64 is switched on (JAX defaults to float32).

The free parameter is ``z``, and ``theta = loc + L z`` a deterministic site (``sampler_frame`` in
the file: the Gaussian ``Release.sample()`` whitens by; the prior's frame when the file has none).
The map is linear, so the posterior of ``theta`` is unchanged; in ``z`` it is about as round as a
standard normal, which NUTS's diagonal mass-matrix adaptation needs on a well-determined,
correlated posterior. ``mcmc.get_samples()["theta"]`` holds the draws.

    python numpyro_model.py [release.json]     # reproduce the checks, run NUTS, print means

    from numpyro_model import load, model, make_logdensity_fn
    data = load("release.json")
    mcmc = numpyro.infer.MCMC(numpyro.infer.NUTS(model), num_warmup=1000, num_samples=1000)
    mcmc.run(jax.random.PRNGKey(0), data)
    logdensity = make_logdensity_fn(data)   # theta (d,) -> scalar: blackjax.nuts(logdensity, ...)

A Bayesian neural network release (family ``bnn``) is the same model with ``eta`` replaced by
the network written out in :func:`network` (widths, activation and likelihood from
``model.spec``); NUTS on a network posterior is slow and multimodal: expect to need long runs.

Sampling a release costs no privacy.
"""

from __future__ import annotations

import json
import sys
from pathlib import Path
from typing import Any

import jax

jax.config.update("jax_enable_x64", True)

import jax.numpy as jnp  # noqa: E402
import numpy as np  # noqa: E402
import numpyro  # noqa: E402
import numpyro.distributions as dist  # noqa: E402
from jax.scipy.special import gammaln  # noqa: E402
from numpyro import handlers  # noqa: E402
from numpyro.infer.util import log_density as _numpyro_log_density  # noqa: E402


def load(path: str | Path) -> dict[str, Any]:
    """Read ``release.json`` (see :func:`from_document`)."""
    return from_document(json.loads(Path(path).read_text()))


def from_document(doc: dict[str, Any]) -> dict[str, Any]:
    """The neutral document as float64 JAX arrays (zero weights are never in the file)."""
    if doc.get("format") != "dpsummary.neutral/v1":
        raise ValueError("not a dpsummary.neutral/v1 document")
    m, d = doc["model"], doc["data"]
    n, k = int(d["num_points"]), int(m["num_features"])
    w = np.asarray(d["weights"], dtype=np.float64).reshape(n)
    if not np.all(w > 0):
        raise ValueError("weights must be strictly positive (NumPyro rejects zero scales)")
    return {
        "family": m["family"],
        "spec": dict(m.get("spec") or {}),
        "intercept": bool(m.get("intercept", False)),
        "noise_scale": None if m.get("noise_scale") is None else float(m["noise_scale"]),
        # log_sigma: theta's last entry is log sigma (linear regression, sigma estimated).
        "noise_parameter": m.get("noise_parameter"),
        "dim": int(doc["parameters"]["dim"]),
        "names": list(doc["parameters"]["names"]),
        "X": jnp.asarray(np.asarray(d["features"], dtype=np.float64).reshape(n, k)),
        "y": None if d["target"] is None else jnp.asarray(np.asarray(d["target"], dtype=np.float64)),
        "w": jnp.asarray(w),
        "prior_mean": jnp.asarray(np.asarray(doc["prior"]["mean"], dtype=np.float64)),
        "prior_scale": float(doc["prior"]["scale"]),
        **frame(doc),
        "checks": [(np.asarray(c["theta"], dtype=np.float64), float(c["log_density"]))
                   for c in doc["checks"]["values"]],
        "rtol": float(doc["checks"]["relative_tolerance"]),
        # The release's caveat on its intervals (None: its mechanism records none); main() prints it.
        "interval_warning": (doc.get("interval_calibration") or {}).get("warning"),
    }


def frame(doc: dict[str, Any]) -> dict[str, Any]:
    """``loc`` and ``L`` of the document's ``sampler_frame``, or the prior's frame (its mean and
    scale times I) for a file without one."""
    dim = int(doc["parameters"]["dim"])
    fr = doc.get("sampler_frame")
    if fr is None:
        loc = np.asarray(doc["prior"]["mean"], dtype=np.float64)
        tril = float(doc["prior"]["scale"]) * np.eye(dim)
    else:
        loc = np.asarray(fr["loc"], dtype=np.float64).reshape(dim)
        tril = np.asarray(fr["scale_tril"], dtype=np.float64).reshape(dim, dim)
    return {"loc": jnp.asarray(loc), "L": jnp.asarray(tril)}


def to_frame(data: dict[str, Any], theta: Any) -> jnp.ndarray:
    """``z`` with ``loc + L z = theta``."""
    r = jnp.asarray(theta, dtype=jnp.float64) - data["loc"]
    return jax.scipy.linalg.solve_triangular(data["L"], r, lower=True)


def network(spec: dict[str, Any], x: jnp.ndarray, theta: jnp.ndarray) -> jnp.ndarray:
    """A BNN release's feed-forward network f(x; theta), shape (M,) (one output): for each layer,
    W (fan_in x fan_out, row-major) then its bias b; the activation between layers only."""
    act = jax.nn.relu if spec["activation"] == "relu" else jnp.tanh
    sizes = [int(spec["num_features"]), *[int(w) for w in spec["widths"]], 1]
    h, offset = x, 0
    for i, (fan_in, fan_out) in enumerate(zip(sizes[:-1], sizes[1:], strict=True)):
        w = theta[offset:offset + fan_in * fan_out].reshape(fan_in, fan_out)
        offset += fan_in * fan_out
        b = theta[offset:offset + fan_out]
        offset += fan_out
        h = h @ w + b
        if i < len(sizes) - 2:
            h = act(h)
    return h[:, 0]


def point_log_lik(data: dict[str, Any], theta: jnp.ndarray) -> jnp.ndarray:
    """Unweighted log p(x_m | theta), shape (M,), constants included, real-valued targets."""
    x, y, fam = data["X"], data["y"], data["family"]
    if fam == "bnn":
        spec = data["spec"]
        f = network(spec, x, theta)
        if spec["likelihood"] == "bernoulli":  # soft labels y in [0, 1]
            return y * jax.nn.log_sigmoid(f) + (1.0 - y) * jax.nn.log_sigmoid(-f)
        if spec["likelihood"] == "gaussian":
            s = float(spec["noise_scale"])
            return -0.5 * ((y - f) / s) ** 2 - jnp.log(s) - 0.5 * jnp.log(2 * jnp.pi)
        raise ValueError(f"unsupported BNN likelihood {spec['likelihood']!r}")
    if fam == "gaussian_mean":
        s = data["noise_scale"]
        k = x.shape[1]
        r = (x - theta) / s
        return -0.5 * jnp.sum(r * r, -1) - k * jnp.log(s) - 0.5 * k * jnp.log(2 * jnp.pi)
    k = x.shape[1]
    eta = theta[0] + x @ theta[1:k + 1] if data["intercept"] else x @ theta[:k]
    if fam == "linear":
        sd = jnp.exp(theta[-1]) if data.get("noise_parameter") == "log_sigma" else data["noise_scale"]
        return -0.5 * ((y - eta) / sd) ** 2 - jnp.log(sd) - 0.5 * jnp.log(2 * jnp.pi)
    if fam == "logistic":
        return y * jax.nn.log_sigmoid(eta) + (1.0 - y) * jax.nn.log_sigmoid(-eta)
    if fam == "poisson":
        return y * eta - jnp.exp(eta) - gammaln(y + 1.0)
    raise ValueError(f"unknown family {fam!r}")


def model(data: dict[str, Any]) -> None:
    """theta ~ N(prior_mean, prior_scale^2 I); point m contributes w_m * log p(x_m | theta).
    Sampled in the frame: ``z`` free (flat), ``theta = loc + L z`` (the density in ``z`` is the
    density of ``theta`` at that point: the map's Jacobian is a constant)."""
    dim = data["loc"].shape[0]
    z = numpyro.sample("z", dist.ImproperUniform(dist.constraints.real_vector, (), event_shape=(dim,)))
    theta = numpyro.deterministic("theta", data["loc"] + data["L"] @ z)
    numpyro.factor("prior", dist.Normal(data["prior_mean"], data["prior_scale"]).log_prob(theta).sum())
    with numpyro.plate("points", data["w"].shape[0]), handlers.scale(scale=data["w"]):
        numpyro.factor("loglik", point_log_lik(data, theta))


def log_density(data: dict[str, Any], theta: Any) -> float:
    """The model's joint log density at theta (what NUTS sees at ``z`` for that theta), as a float."""
    value, _ = _numpyro_log_density(model, (data,), {}, {"z": to_frame(data, theta)})
    return float(value)


def make_logdensity_fn(data: dict[str, Any]) -> Any:
    """``theta (d,) -> scalar`` built from the NumPyro model, for BlackJAX (jit-able)."""

    def logdensity(theta: jnp.ndarray) -> jnp.ndarray:
        return _numpyro_log_density(model, (data,), {}, {"z": to_frame(data, theta)})[0]

    return logdensity


def check(data: dict[str, Any]) -> float:
    """Assert the model reproduces the checks block; returns the largest relative error."""
    worst = 0.0
    for theta, ref in data["checks"]:
        got = log_density(data, theta)
        err = abs(got - ref) / max(1.0, abs(ref))
        worst = max(worst, err)
        if not err <= data["rtol"]:
            raise AssertionError(f"log density {got!r} != reference {ref!r}")
    return worst


def run_nuts(data: dict[str, Any], *, num_warmup: int = 1000, num_samples: int = 1000,
             num_chains: int = 4, seed: int = 0) -> Any:
    """NUTS on the model; returns the MCMC object (``mcmc.get_samples()["theta"]``)."""
    from numpyro.infer import MCMC, NUTS

    mcmc = MCMC(NUTS(model), num_warmup=num_warmup, num_samples=num_samples, num_chains=num_chains,
                chain_method="vectorized", progress_bar=False)
    mcmc.run(jax.random.PRNGKey(seed), data)
    return mcmc


def main(argv: list[str] | None = None) -> None:
    args = sys.argv[1:] if argv is None else argv
    data = load(Path(args[0]) if args else Path(__file__).with_name("release.json"))
    if data["interval_warning"]:
        print(f"warning: {data['interval_warning']}")
    print(f"checks reproduced (max relative error {check(data):.2e})")
    theta = np.asarray(run_nuts(data).get_samples()["theta"])
    for name, mean, sd in zip(data["names"], theta.mean(0), theta.std(0), strict=True):
        print(f"{name:>30s}  {mean: .4f}  ({sd:.4f})")


if __name__ == "__main__":
    main()
