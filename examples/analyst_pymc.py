"""An analyst's PyMC session on the bundled release (no privacy cost, no private data).

    python examples/analyst_pymc.py [--out out/examples]

1. load + verify the signed release with the curator's public key;
2. export it for PyMC (``pymc_model.py`` + ``release.json``) and reproduce the checks;
3. run PyMC's NUTS (4 chains), with the log-likelihood group;
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
        release.export("pymc", tmp)
        sys.path.insert(0, tmp)
        import pymc as pm
        import pymc_model as pmm  # the exported module

        data = pmm.load(Path(tmp) / "release.json")
        model = pmm.build_model(data)
        print(f"checks reproduced (max relative error {pmm.check(data, model):.1e})")
        with model:
            idata = pm.sample(1000, tune=1000, chains=4, cores=1, random_seed=0, progressbar=False)
            pm.compute_log_likelihood(idata, progressbar=False)  # weighted per-point terms
    print(az.summary(idata, var_names=["theta"])[["mean", "sd", "r_hat", "ess_bulk"]])

    compare_and_plot(release, idata, "PyMC", out_dir)

if __name__ == "__main__":
    main()
