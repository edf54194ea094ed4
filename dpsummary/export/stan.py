"""Stan exporter: ONE Stan program for every family (selected by the ``family`` data flag) plus
the data in Stan's JSON format, for CmdStan(Py/R), BridgeStan or PyStan 3.

Soft labels and non-integer counts are data of type ``vector`` (never ``int``) and every
likelihood term is an explicit ``target +=`` formula with its constants. Zero-weight points are
dropped (they do not change the posterior). Files: ``release.stan``, ``release.data.json``,
``release.json`` (the neutral document, whose ``checks`` any run can reproduce) and
``run_pystan.py`` (compiles with PyStan 3, reproduces the checks, samples).

The in-process log density of the *Stan program itself* needs a compiled model:
:func:`pystan_log_density` builds it with PyStan (about 1-2 minutes the first time, then cached
by httpstan) and returns ``theta -> log density``; :func:`stanc_check` only type-checks (0.1 s).

The program's parameter is ``z`` and ``theta = loc + L * z`` a transformed parameter (the
document's ``sampler_frame``, the Gaussian ``Release.sample()`` whitens by; the prior's frame
when it has none): the posterior of ``theta`` is unchanged, and in ``z`` it is about as round as
a standard normal, which Stan's diagonal mass-matrix adaptation needs on a well-determined,
correlated posterior. A log density at ``theta`` is read at ``z = L^-1 (theta - loc)``.
"""

from __future__ import annotations

import json
import shutil
import subprocess
import tempfile
from pathlib import Path
from typing import Any

import numpy as np

from ..constructors.base import write_atomic
from .neutral import frame_arrays

#: family -> value of the ``family`` data flag.
FAMILY_CODES = {"gaussian_mean": 1, "linear": 2, "logistic": 3, "poisson": 4}

STAN_PROGRAM = """// Weighted posterior of a dpsummary release: ONE program for every model family.
//
//   log p_w(theta) = sum_n w[n] * log p(x_n | theta) + log N(theta | prior_mean, prior_scale^2 I)
//
// Weights are likelihood exponents. Every term is a `target +=` explicit formula with all its
// constants (a `~` statement would drop them) that accepts real-valued targets: pseudopoints
// carry soft labels (logistic) and non-integer counts (Poisson), which bernoulli/poisson would
// reject as data. Data in Stan JSON: see release.data.json and dpsummary docs/FORMAT.md.
// Works with CmdStan(Py/R), BridgeStan and PyStan 3. Sampling a release costs no privacy.
data {
  int<lower=1, upper=4> family;     // 1 gaussian_mean, 2 linear, 3 logistic, 4 poisson
  int<lower=0> N;                   // number of points (zero-weight points are dropped)
  int<lower=1> K;                   // features per point (gaussian_mean: coordinates)
  int<lower=0, upper=1> intercept;  // 1: theta[1] is the intercept (regression families)
  int<lower=0, upper=1> sigma_param;  // 1: theta[D] is log sigma (linear, sigma estimated)
  int<lower=1> D;                   // dimension of theta: K + intercept + sigma_param (gaussian_mean: K)
  matrix[N, K] X;                   // features (gaussian_mean: the points themselves)
  vector[N] y;                      // targets, real-valued (ignored for gaussian_mean)
  vector<lower=0>[N] w;             // weights: likelihood exponents
  real<lower=0> noise_scale;        // gaussian_mean and linear (unused otherwise)
  vector[D] prior_mean;
  real<lower=0> prior_scale;
  vector[D] loc;                    // sampler frame: theta = loc + L * z (release.json's sampler_frame)
  matrix[D, D] L;                   // lower triangular; any invertible frame gives the same posterior
}
transformed data {
  real log_2pi = log(2 * pi());
}
parameters {
  vector[D] z;                      // theta in the frame: about as round as a standard normal
}
transformed parameters {
  vector[D] theta = loc + L * z;    // a linear map: its Jacobian is a constant, left out
}
model {
  target += normal_lpdf(theta | prior_mean, prior_scale);
  if (family == 1) {
    vector[N] sq = rows_dot_self((X - rep_matrix(theta', N)) / noise_scale);
    target += dot_product(w, -0.5 * sq - K * log(noise_scale) - 0.5 * K * log_2pi);
  } else {
    vector[N] eta = X * theta[(1 + intercept):(K + intercept)];
    if (intercept == 1) {
      eta += theta[1];
    }
    if (family == 2) {
      real s = sigma_param == 1 ? exp(theta[D]) : noise_scale;
      target += dot_product(w, -0.5 * square((y - eta) / s) - log(s) - 0.5 * log_2pi);
    } else if (family == 3) {
      target += dot_product(w, y .* log_inv_logit(eta) + (1 - y) .* log1m_inv_logit(eta));
    } else {
      target += dot_product(w, y .* eta - exp(eta) - lgamma(y + 1));
    }
  }
}
"""


def stan_data(neutral: dict[str, Any]) -> dict[str, Any]:
    """The Stan data dictionary (Stan JSON) of a neutral document."""
    m, d = neutral["model"], neutral["data"]
    n, k = int(d["num_points"]), int(m["num_features"])
    fam = m["family"]
    x = np.asarray(d["features"], dtype=np.float64).reshape(n, k)
    y = np.zeros(n) if d["target"] is None else np.asarray(d["target"], dtype=np.float64)
    noise = m.get("noise_scale")
    loc, tril = frame_arrays(neutral)
    return {
        "family": FAMILY_CODES[fam],
        "N": n,
        "K": k,
        "intercept": int(bool(m.get("intercept", False))),
        "sigma_param": int(m.get("noise_parameter") == "log_sigma"),
        "D": int(neutral["parameters"]["dim"]),
        "X": x.tolist(),
        "y": y.tolist(),
        "w": [float(v) for v in d["weights"]],
        "noise_scale": 1.0 if noise is None else float(noise),
        "prior_mean": [float(v) for v in neutral["prior"]["mean"]],
        "prior_scale": float(neutral["prior"]["scale"]),
        "loc": loc.tolist(),
        "L": tril.tolist(),
    }


RUN_PYSTAN = '''"""Compile release.stan with PyStan 3 (offline, system C++ compiler), reproduce the checks
block of release.json, sample with NUTS and print posterior means. Costs no privacy."""

import json
from pathlib import Path

import numpy as np
import stan

here = Path(__file__).parent
data = json.loads((here / "release.data.json").read_text())
doc = json.loads((here / "release.json").read_text())
if (doc.get("interval_calibration") or {}).get("warning"):
    print(f"warning: {doc['interval_calibration']['warning']}")
checks = doc["checks"]
posterior = stan.build((here / "release.stan").read_text(), data=data, random_seed=0)
loc, frame = np.asarray(data["loc"]), np.asarray(data["L"])
for c in checks["values"]:
    z = np.linalg.solve(frame, np.asarray(c["theta"]) - loc)  # the program's parameter is z
    got = posterior.log_prob(z.tolist(), adjust_transform=False)
    assert abs(got - c["log_density"]) <= checks["relative_tolerance"] * max(1.0, abs(c["log_density"]))
print("checks reproduced")
fit = posterior.sample(num_chains=4, num_samples=1000, num_warmup=1000)
theta = np.asarray(fit["theta"])  # (D, draws * chains)
names = doc["parameters"]["names"]
for name, mean, sd in zip(names, theta.mean(1), theta.std(1)):
    print(f"{name:>30s}  {mean: .4f}  ({sd:.4f})")
'''


def write(release: Any, out: str | Path, *, neutral: dict[str, Any] | None = None) -> list[Path]:
    """Write ``release.stan``, ``release.data.json``, ``release.json`` and ``run_pystan.py``."""
    from .neutral import caveat_header, dump, to_neutral

    doc = neutral if neutral is not None else to_neutral(release)
    out = Path(out)
    files = {
        "release.stan": caveat_header(doc, "//") + STAN_PROGRAM.encode(),
        "release.data.json": json.dumps(stan_data(doc), indent=1).encode(),
        "release.json": dump(doc),
        "run_pystan.py": caveat_header(doc, "#") + RUN_PYSTAN.encode(),
    }
    written = []
    for name, payload in files.items():
        write_atomic(out / name, payload)
        written.append(out / name)
    return written


def stanc_path() -> Path | None:
    """The ``stanc`` binary shipped inside the httpstan wheel, if installed."""
    try:
        import httpstan
    except ImportError:
        return None
    p = Path(httpstan.__file__).parent / "stanc"
    return p if p.exists() else None


def stanc_check(program: str = STAN_PROGRAM) -> None:
    """Type-check a Stan program with httpstan's ``stanc`` (no C++ compile); raises on error."""
    exe = stanc_path() or (Path(s) if (s := shutil.which("stanc")) else None)
    if exe is None:
        raise RuntimeError("stanc not found: install httpstan (pip install pystan)")
    with tempfile.TemporaryDirectory() as tmp:
        src = Path(tmp) / "release.stan"
        src.write_text(program)
        res = subprocess.run([str(exe), str(src), f"--o={Path(tmp) / 'release.hpp'}"],
                             capture_output=True, text=True, timeout=60)
    if res.returncode != 0:
        raise RuntimeError(f"stanc rejected the program: {res.stderr.strip() or res.stdout.strip()}")


def pystan_posterior(neutral: dict[str, Any], *, random_seed: int = 0) -> Any:
    """``stan.build`` of the program on the document's data (compiles once, then cached)."""
    import stan

    return stan.build(STAN_PROGRAM, data=stan_data(neutral), random_seed=random_seed)


def pystan_log_density(neutral: dict[str, Any], posterior: Any = None) -> Any:
    """``theta (d,) -> float``: the compiled Stan program's log density (constants included),
    read at the ``z`` of that theta (``z`` is unconstrained, so no Jacobian)."""
    post = posterior if posterior is not None else pystan_posterior(neutral)
    loc, tril = frame_arrays(neutral)

    def at(theta: Any) -> float:
        z = np.linalg.solve(tril, np.asarray(theta, dtype=np.float64).ravel() - loc)
        return float(post.log_prob([float(v) for v in z], adjust_transform=False))

    return at
