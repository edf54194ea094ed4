"""An analyst's Stan (PyStan 3) session on the bundled release (no privacy cost, no private data).

    python examples/analyst_stan.py [--out out/examples]

1. load + verify the signed release with the curator's public key;
2. export it for Stan (``release.stan`` + ``release.data.json``: the same files work with
   CmdStanPy/CmdStanR/BridgeStan), compile with PyStan 3 (offline; 1-2 minutes the first time,
   then cached by httpstan) and reproduce the checks;
3. run NUTS (4 chains);
4. compare with the full-data posterior (Laplace, non-private, computed here from the public
   example CSV only to show how close the private release gets) in an ArviZ forest plot.
"""

from __future__ import annotations

import tempfile
from pathlib import Path

import arviz as az
import numpy as np
from _analyst_common import compare_and_plot, load_release, parse_out_dir  # noqa: E402


def main() -> None:
    out_dir = parse_out_dir()
    release = load_release()  # raises if unsigned or tampered

    with tempfile.TemporaryDirectory() as tmp:
        release.export("stan", tmp)
        import json

        import stan

        program = (Path(tmp) / "release.stan").read_text()
        data = json.loads((Path(tmp) / "release.data.json").read_text())
        checks = json.loads((Path(tmp) / "release.json").read_text())["checks"]
    posterior = stan.build(program, data=data, random_seed=0)
    # The program samples z, theta = loc + L z (release.json's sampler_frame): a check's theta is
    # read at its z.
    loc, frame = np.asarray(data["loc"]), np.asarray(data["L"])
    worst = max(abs(posterior.log_prob(np.linalg.solve(frame, np.asarray(c["theta"]) - loc).tolist(),
                                       adjust_transform=False) - c["log_density"])
                / max(1.0, abs(c["log_density"])) for c in checks["values"])
    assert worst <= checks["relative_tolerance"]
    print(f"checks reproduced (max relative error {worst:.1e})")
    fit = posterior.sample(num_chains=4, num_samples=1000, num_warmup=1000)
    idata = az.from_pystan(posterior=fit, coords={"param": release.param_names}, dims={"theta": ["param"]})
    print(az.summary(idata, var_names=["theta"])[["mean", "sd", "r_hat", "ess_bulk"]])

    compare_and_plot(release, idata, "Stan", out_dir)

if __name__ == "__main__":
    main()
