"""What the three analyst examples share: the bundled release, the non-private reference, the plot.

Not part of the package: examples import it as a sibling module (``python examples/analyst_*.py``).
"""

from __future__ import annotations

import argparse
from pathlib import Path
from typing import Any

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


def parse_out_dir() -> Path:
    ap = argparse.ArgumentParser()
    ap.add_argument("--out", type=Path, default=HERE.parent / "out" / "examples")
    return ap.parse_args().out


def load_release() -> Any:
    """Load and verify the bundled release (raises if unsigned or tampered)."""
    release = dpsummary.load(ARTIFACT, key=KEY)
    print(release)
    return release


def full_data_idata(release: Any, draws: int = 4000) -> az.InferenceData:
    """The non-private reference: Laplace on the whole example CSV, same public transform."""
    import torch

    points = release.transform.to_points(read_csv(HERE / "german_credit.csv"))
    post = full_posterior(release.model, points)
    theta = post.sample(draws, torch.Generator().manual_seed(0)).numpy()
    return az.from_dict(posterior={"theta": theta[None]}, coords={"param": release.param_names},
                        dims={"theta": ["param"]})


def compare_and_plot(release: Any, idata: az.InferenceData, sampler: str, out_dir: Path) -> Path:
    """Forest plot of the release's NUTS draws against the full-data posterior; prints the gap."""
    full = full_data_idata(release)
    out_dir.mkdir(parents=True, exist_ok=True)
    axes = az.plot_forest([idata, full], model_names=[f"private release (eps={release.epsilon['rdp']:.2g}, NUTS)",
                                                      "full data (Laplace, non-private)"],
                          var_names=["theta"], combined=True, hdi_prob=0.9, figsize=(8, 6))
    axes[0].set_title(f"German credit, logistic regression: {sampler} on the released pseudocoreset")
    png = out_dir / f"analyst_{sampler.lower()}.png"
    plt.savefig(png, dpi=110, bbox_inches="tight")
    print(f"wrote {png}")
    gap = np.abs(idata.posterior["theta"].mean(("chain", "draw")).values
                 - full.posterior["theta"].mean(("chain", "draw")).values)
    print(f"largest |mean difference| to the full-data posterior: {gap.max():.3f}")
    return png
