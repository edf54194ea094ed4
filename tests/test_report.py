"""The curator's utility report: a small in-process release, then ``dpsummary report`` on it."""

from __future__ import annotations

import base64
import re
from html.parser import HTMLParser
from pathlib import Path

import numpy as np
import pytest
from typer.testing import CliRunner

N = 400


def write_csv(path: Path, n: int = N, seed: int = 0, *, bad_targets: int = 0) -> Path:
    rng = np.random.default_rng(seed)
    x1 = rng.uniform(0, 10, n)
    x2 = rng.choice(["a", "b", "c"], n)
    eta = 0.5 * (x1 - 5) + (x2 == "b")
    y = np.where(rng.random(n) < 1 / (1 + np.exp(-eta)), "yes", "no").astype(object)
    y[:bad_targets] = ""  # records the public transform cannot map (missing target)
    lines = ["x1,x2,y"] + [f"{a:.3f},{b},{c}" for a, b, c in zip(x1, x2, y, strict=True)]
    path.write_text("\n".join(lines) + "\n")
    return path


def write_policy(path: Path, n: int = N) -> Path:
    """The shared test policy (public schema x1, x2, y and public count ``n``)."""
    from release_support import write_policy as shared_policy

    return shared_policy(path, n=n)


def make_release(tmp_path: Path, *, bad_targets: int = 0) -> tuple[Path, Path]:
    """A signed release of a small CSV (public schema and count) and the CSV it came from."""
    from dpsummary.plan import ReleaseRequest
    from dpsummary.release import run_release

    release_csv = write_csv(tmp_path / "d.csv")
    pol = write_policy(tmp_path / "p.toml")
    out = tmp_path / "d.dpsummary.json"
    run_release(ReleaseRequest(data=release_csv, epsilon=1.0, policy=pol, out=out, steps=15, size=5, seed=1))
    data = release_csv if not bad_targets else write_csv(tmp_path / "d_bad.csv", bad_targets=bad_targets)
    return out, data


class _Collect(HTMLParser):
    def __init__(self) -> None:
        super().__init__()
        self.stack: list[str] = []
        self.imgs: list[str] = []
        self.links: list[str] = []
        self.tags: list[str] = []

    def handle_starttag(self, tag: str, attrs: list[tuple[str, str | None]]) -> None:
        self.tags.append(tag)
        a = dict(attrs)
        if tag == "img":
            self.imgs.append(a.get("src") or "")
        for k in ("href", "src"):
            if a.get(k) and tag != "img":
                self.links.append(a[k] or "")
        if tag not in ("meta", "img", "br", "link"):
            self.stack.append(tag)

    def handle_endtag(self, tag: str) -> None:
        assert self.stack and self.stack[-1] == tag, f"unbalanced </{tag}> (open: {self.stack[-3:]})"
        self.stack.pop()


def check_page(text: str) -> _Collect:
    p = _Collect()
    p.feed(text)
    p.close()
    assert p.stack == [], f"unclosed tags {p.stack}"
    assert text.startswith("<!DOCTYPE html>")
    assert len(p.imgs) >= 2
    for src in p.imgs:
        assert src.startswith("data:image/png;base64,"), "images must be inline"
        png = base64.b64decode(src.split(",", 1)[1], validate=True)
        assert png[:8] == b"\x89PNG\r\n\x1a\n" and len(png) > 5000
    assert p.links == [], "a self-contained page loads nothing"
    return p


def test_report_html_well_formed_with_plots_and_warning(tmp_path: Path) -> None:
    from dpsummary.report import WARNING, build_report, render_html

    art, data = make_release(tmp_path, bad_targets=7)
    rep = build_report(art, data, psvi_steps=30)
    assert rep.verified
    assert rep.records_total == N and rep.records_used == N - 7 and rep.records_dropped == 7
    names = [r.name for r in rep.results]
    assert names == ["full", "release", "uniform", "lightweight", "psvi", "prior"]
    by = {r.name: r.metrics for r in rep.results}
    assert by["full"]["forward"] == pytest.approx(0.0, abs=1e-9)
    for name in ("release", "uniform", "psvi"):
        assert np.isfinite(by[name]["forward"]) and by[name]["forward"] > 0
    page = render_html(rep)
    check_page(page)
    assert page.count(WARNING) >= 2  # top and bottom
    assert "7 dropped" in page
    assert "KL(summary||full)" in page
    for label in ("release", "uniform", "psvi", "full data"):
        assert label in page


def test_report_cli_prints_warning_and_writes_page(tmp_path: Path) -> None:
    import dpsummary.cli.report  # noqa: F401  (registers the command until the CLI imports it)
    from dpsummary.cli import app

    art, data = make_release(tmp_path)
    out = tmp_path / "r.html"
    res = CliRunner().invoke(app, ["report", str(art), str(data), "--out", str(out)])
    assert res.exit_code == 0, res.output
    said = " ".join(res.output.split())
    assert "CURATOR-ONLY" in said and "NOT differentially private" in said and "Do not publish" in said
    assert "0 dropped" in said
    check_page(out.read_text())
    # Bad input is a one-line error, no traceback.
    res = CliRunner().invoke(app, ["report", str(tmp_path / "missing.json"), str(data)])
    assert res.exit_code != 0 and "Traceback" not in res.output
    assert re.search(r"^error: ", res.output, re.M)


def test_report_refuses_unverifiable_artifact_unless_allowed(tmp_path: Path) -> None:
    from dpsummary.artifact import ArtifactError
    from dpsummary.keys import generate_keypair, load_public_key
    from dpsummary.report import build_report

    art, data = make_release(tmp_path)
    other = generate_keypair(tmp_path / "other")
    with pytest.raises(ArtifactError):
        build_report(art, data, public_key=load_public_key(other.public_path), baselines=())
    rep = build_report(art, data, public_key=None, allow_unsigned=True, baselines=())
    assert [r.name for r in rep.results] == ["full", "release", "prior"]
