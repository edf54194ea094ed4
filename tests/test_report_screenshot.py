"""The report page renders in headless Chromium (Debian's ``chromium`` package): a screenshot of
it is a non-blank PNG showing the warning banner's red. Skipped when Chromium is not installed.

To look at the page yourself: ``DPSUMMARY_KEEP_SCREENSHOT=/tmp/report.png pytest
tests/test_report_screenshot.py`` keeps the screenshot.
"""

from __future__ import annotations

import os
import shutil
import subprocess
from pathlib import Path

import numpy as np
import pytest

CHROMIUM = next((p for p in ("/usr/bin/chromium", shutil.which("chromium") or "",
                             shutil.which("chromium-browser") or "") if p and Path(p).exists()), None)

pytestmark = pytest.mark.skipif(CHROMIUM is None, reason="headless Chromium not installed (apt-get install chromium)")


def screenshot(html: Path, png: Path, profile: Path, size: tuple[int, int] = (1200, 3200)) -> None:
    assert CHROMIUM is not None
    cmd = [CHROMIUM, "--headless", "--no-sandbox", "--disable-gpu", "--disable-quic", "--no-first-run",
           "--disable-background-networking", "--disable-component-update", "--disable-sync",
           "--hide-scrollbars", f"--user-data-dir={profile}", f"--screenshot={png}",
           f"--window-size={size[0]},{size[1]}", html.resolve().as_uri()]
    proc = subprocess.run(cmd, capture_output=True, text=True, timeout=120)
    assert png.exists(), f"chromium wrote no screenshot (exit {proc.returncode}): {proc.stderr[-2000:]}"


def test_report_page_renders_in_headless_chromium(tmp_path: Path) -> None:
    import matplotlib.image as mpimg
    from test_report import make_release  # tests/ is on sys.path (rootdir import mode)

    from dpsummary.report import build_report, write_report

    art, data = make_release(tmp_path)
    page = write_report(build_report(art, data, psvi_steps=30), tmp_path / "report.html")
    png = tmp_path / "shot.png"
    screenshot(page, png, tmp_path / "profile")
    img = mpimg.imread(png)[..., :3]  # floats in [0, 1]
    assert img.shape[0] >= 1000 and img.shape[1] >= 1000
    # Not blank: many distinct colours and a fair share of non-white pixels.
    flat = (img.reshape(-1, 3) * 255).astype(np.uint8)
    assert len(np.unique(flat, axis=0)) > 50
    assert (img.min(axis=2) < 0.9).mean() > 0.05
    # The warning banner (#b00020) is rendered near the top of the page.
    top = img[: img.shape[0] // 4]
    red = (top[..., 0] > 0.6) & (top[..., 1] < 0.15) & (top[..., 2] < 0.25)
    assert red.sum() > 5000, "no red warning banner near the top"
    # The inline plots decoded: the KL chart's blue/orange bars are on the page.
    blue = (np.abs(img[..., 0] - 0.12) < 0.08) & (np.abs(img[..., 1] - 0.47) < 0.08) & (np.abs(img[..., 2] - 0.71) < 0.08)
    assert blue.sum() > 500, "the plots did not render"
    keep = os.environ.get("DPSUMMARY_KEEP_SCREENSHOT")
    if keep:
        shutil.copy(png, keep)
