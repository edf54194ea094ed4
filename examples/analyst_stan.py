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

import argparse
import tempfile
from pathlib import Path

import arviz as az
import matplotlib

matplotlib.use("Agg")
import matplotlib.pyplot as plt  # noqa: E402
import numpy as np  # noqa: E402

import dpsummary  # noqa: E402
from dpsummary.data import read_csv  # noqa: E402
from dpsummary.metrics import full_posterior  # noqa: E402

HERE = Path(__file__).resolve().parent
ARTIFACT = HERE / "release" / "german_credit.dpsummary.json"
KEY = HERE / "release" / "curator.pub"


def full_data_idata(release, draws: int = 4000) -> az.InferenceData:
    """The non-private reference: Laplace on the whole example CSV, same public transform."""
    import torch

    points = release.transform.to_points(read_csv(HERE / "german_credit.csv"))
    post = full_posterior(release.model, points)
    theta = post.sample(draws, torch.Generator().manual_seed(0)).numpy()
    return az.from_dict(posterior={"theta": theta[None]}, coords={"param": release.param_names},
                        dims={"theta": ["param"]})


def main() -> None:
    ap = argparse.ArgumentParser()
    ap.add_argument("--out", type=Path, default=HERE.parent / "out" / "examples")
    args = ap.parse_args()
    release = dpsummary.load(ARTIFACT, key=KEY)  # raises if unsigned or tampered
    print(release)

    with tempfile.TemporaryDirectory() as tmp:
        release.export("stan", tmp)
        import json

        import stan

        program = (Path(tmp) / "release.stan").read_text()
        data = json.loads((Path(tmp) / "release.data.json").read_text())
        checks = json.loads((Path(tmp) / "release.json").read_text())["checks"]
    posterior = stan.build(program, data=data, random_seed=0)
    worst = max(abs(posterior.log_prob(c["theta"], adjust_transform=False) - c["log_density"])
                / max(1.0, abs(c["log_density"])) for c in checks["values"])
    assert worst <= checks["relative_tolerance"]
    print(f"checks reproduced (max relative error {worst:.1e})")
    fit = posterior.sample(num_chains=4, num_samples=1000, num_warmup=1000)
    idata = az.from_pystan(posterior=fit, coords={"param": release.param_names}, dims={"theta": ["param"]})
    print(az.summary(idata, var_names=["theta"])[["mean", "sd", "r_hat", "ess_bulk"]])

    full = full_data_idata(release)
    args.out.mkdir(parents=True, exist_ok=True)
    axes = az.plot_forest([idata, full], model_names=[f"private release (eps={release.epsilon['rdp']:.2g}, NUTS)",
                                                      "full data (Laplace, non-private)"],
                          var_names=["theta"], combined=True, hdi_prob=0.9, figsize=(8, 6))
    axes[0].set_title("German credit, logistic regression: Stan on the released pseudocoreset")
    png = args.out / "analyst_stan.png"
    plt.savefig(png, dpi=110, bbox_inches="tight")
    print(f"wrote {png}")
    gap = np.abs(idata.posterior["theta"].mean(("chain", "draw")).values
                 - full.posterior["theta"].mean(("chain", "draw")).values)
    print(f"largest |mean difference| to the full-data posterior: {gap.max():.3f}")


if __name__ == "__main__":
    main()
