"""The noise path's imports (issue 15: import time is part of every release)."""

from __future__ import annotations


def test_noise_does_not_import_scikit_learn():
    """``opendp.prelude`` imports ``opendp.extras.sklearn`` (scikit-learn and scipy.stats, about
    1.7 s) whenever scikit-learn is installed; the noise path imports only what it uses."""
    import subprocess
    import sys

    code = ("import sys, numpy as np; import dpsummary.private.noise as n; "
            "n.add_gaussian_noise(np.zeros(2), noise_std=1.0, clip_norm=1.0); "
            "print(sorted(m for m in ('sklearn', 'opendp.extras.sklearn', 'opendp.prelude') if m in sys.modules))")
    out = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, check=True).stdout.strip()
    assert out == "[]"
