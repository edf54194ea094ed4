"""Shared helpers for the release tests: small synthetic CSVs, policies with a public schema, and
the ledger's lines."""

from __future__ import annotations

import json
import math
from pathlib import Path
from typing import Any

import numpy as np


def write_csv(path: Path, n: int, seed: int = 0, *, target: str = "binary", extra_rows: list[str] | None = None) -> Path:
    """``x1`` numeric in [0, 10], ``x2`` in {a, b, c}, target ``y`` (binary yes/no, count or real)."""
    rng = np.random.default_rng(seed)
    x1 = rng.uniform(0, 10, n)
    x2 = rng.choice(["a", "b", "c"], n)
    eta = 0.5 * (x1 - 5) + (x2 == "b")
    if target == "binary":
        y = np.where(rng.random(n) < 1 / (1 + np.exp(-eta)), "yes", "no")
    elif target == "count":
        y = rng.poisson(np.exp(0.2 * eta + 1)).astype(int)
    elif target == "constant":
        y = np.array(["yes"] * n)
    else:
        y = eta + rng.normal(size=n)
    lines = ["x1,x2,y"] + [f"{a:.3f},{b},{c}" for a, b, c in zip(x1, x2, y, strict=True)]
    path.write_text("\n".join(lines + list(extra_rows or [])) + "\n")
    return path


def write_policy(path: Path, *, n: int | None, target_kind: str = "binary", extra: str = "",
                 schema: bool = True, tail: str = "", total_epsilon: float = 3.0, cap: float = 2.0,
                 min_records: int = 50, n_max: int = 100000, total_delta: float = 1e-6,
                 x1_integer: bool = False) -> Path:
    """A test policy (budget ``total_epsilon``, per-release cap ``cap``); public schema unless
    ``schema=False``; public record count ``n`` unless None. ``extra``: top-level TOML lines;
    ``tail``: tables appended at the end. ``x1_integer``: ``x1`` declared integer (a discrete
    schema: 11 levels x 4 of x2 = 44 cells, the domain of ``noise-aware-cells``)."""
    y = {
        "binary": 'kind = "categorical"\ncategories = ["no", "yes"]',
        "count": 'kind = "numeric"\ninteger = true\nlower = 0\nupper = 60',
        "real": 'kind = "numeric"\nlower = -8\nupper = 8',
    }[target_kind]
    count = f"record_count_public = true\nrecord_count = {n}\n" if n is not None else ""
    text = f"""source_id = "test-source"
total_epsilon = {total_epsilon}
total_delta = {total_delta}
max_epsilon_per_release = {cap}
min_records = {min_records}
n_max = {n_max}
{count}{extra}
"""
    if schema:
        text += f"""
[schema]
target = "y"
[[schema.columns]]
name = "x1"
kind = "numeric"
{"integer = true" + chr(10) if x1_integer else ""}lower = 0
upper = 10
[[schema.columns]]
name = "x2"
kind = "categorical"
categories = ["a", "b", "c"]
[[schema.columns]]
name = "y"
{y}
"""
    path.write_text(text + tail)
    return path


def finite(value: object) -> bool:
    """Whether every float in a JSON-like value (dicts, lists, scalars) is finite."""
    if isinstance(value, float):
        return math.isfinite(value)
    if isinstance(value, dict):
        return all(finite(v) for v in value.values())
    if isinstance(value, list):
        return all(finite(v) for v in value)
    return True


def ledger_lines(home: Path) -> list[dict]:
    p = home / "ledger.jsonl"
    return [json.loads(x) for x in p.read_text().splitlines()] if p.exists() else []


def mentions_number(text: str, number: int) -> bool:
    """Whether ``number`` appears in ``text`` as a number of its own (``900`` or ``900.0``), not
    as digits inside another number (an epsilon ``0.2056202900...``) or a hex digest."""
    import re

    return re.search(rf"(?<![\w.]){number}(?![\d])", text) is not None


def write_linear_policy(path: Path) -> Path:
    """:func:`write_policy` for a linear release: public count 4,000, a real target ``y`` in
    [-8, 8], and ``x2`` numeric in [-5, 5] instead of categorical (the linear mechanism's tests,
    local and Spark)."""
    write_policy(path, n=4000, target_kind="real")
    text = path.read_text().replace('name = "x2"\nkind = "categorical"\ncategories = ["a", "b", "c"]',
                                    'name = "x2"\nkind = "numeric"\nlower = -5\nupper = 5')
    path.write_text(text)
    return path


def seeded_privacy_randomness(monkeypatch: Any, seed: int) -> None:
    """Replace the release's OS-entropy privacy randomness by a seeded stand-in for one test, so
    a test that judges a release's posterior is deterministic (with OS noise a 95% interval, or a
    sampler's divergence check, fails a fixed share of releases by design): every Gaussian noise
    draw (:func:`dpsummary.private.noise.add_gaussian_noise`, also under its name in
    :mod:`dpsummary.private.preprocess`; the noise pools are bypassed) and every Poisson sample
    (:class:`~dpsummary.private.mechanism.SystemRandomness`'s ``coins`` and ``sample_indices``)
    come from one ``numpy`` generator seeded with ``seed``. Tests only: a release never seeds
    its privacy randomness."""
    import numpy as np

    from dpsummary.private import noise, preprocess
    from dpsummary.private.mechanism import SystemRandomness

    rng = np.random.default_rng(seed)

    def gaussian(values: Any, *, noise_std: float, clip_norm: float) -> Any:
        v = np.asarray(values, dtype=np.float64)
        return v + noise_std * rng.standard_normal(v.shape)

    def coins(self: Any, num_records: int, sample_rate: float) -> Any:
        return rng.random(num_records) < sample_rate

    def sample_indices(self: Any, num_records: int, sample_rate: float) -> Any:
        return np.flatnonzero(rng.random(num_records) < sample_rate).astype(np.int64)

    monkeypatch.setattr(noise, "add_gaussian_noise", gaussian)
    monkeypatch.setattr(preprocess, "add_gaussian_noise", gaussian)
    monkeypatch.setattr(SystemRandomness, "prepare_gaussian", lambda self, **_kw: None)
    monkeypatch.setattr(SystemRandomness, "coins", coins)
    monkeypatch.setattr(SystemRandomness, "sample_indices", sample_indices)
