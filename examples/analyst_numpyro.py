"""An analyst's NumPyro session on the bundled release (no privacy cost, no private data).

    python examples/analyst_numpyro.py [--out out/examples]

1. load + verify the signed release with the curator's public key;
2. export it for NumPyro (``numpyro_model.py`` + ``release.json``) and reproduce the checks;
3. run NUTS (4 chains);
4. compare with the full-data posterior (Laplace, non-private, computed here from the public
   example CSV only to show how close the private release gets) in an ArviZ forest plot.
"""

from __future__ import annotations

import sys
import tempfile
from pathlib import Path

import arviz as az
from _analyst_common import compare_and_plot, load_release, parse_out_dir  # noqa: E402


def main() -> None:
    out_dir = parse_out_dir()
    release = load_release()  # raises if unsigned or tampered

    with tempfile.TemporaryDirectory() as tmp:
        release.export("numpyro", tmp)
        sys.path.insert(0, tmp)
        import numpyro_model as nm  # the exported module (enables float64 in JAX)

        data = nm.load(Path(tmp) / "release.json")
        print(f"checks reproduced (max relative error {nm.check(data):.1e})")
        mcmc = nm.run_nuts(data, num_warmup=1000, num_samples=1000, num_chains=4, seed=0)
    idata = az.from_numpyro(mcmc, coords={"param": release.param_names}, dims={"theta": ["param"]})
    print(az.summary(idata, var_names=["theta"])[["mean", "sd", "r_hat", "ess_bulk"]])

    compare_and_plot(release, idata, "NumPyro", out_dir)

if __name__ == "__main__":
    main()
