"""Shared synthetic mixture for the mixture tests (fixed seed, small so every file runs fast)."""

from __future__ import annotations

import numpy as np
import pytest


def three_blobs(seed: int = 0) -> np.ndarray:
    """540 points in 2-d: two large well-separated blobs and one small (40 points) elongated one."""
    rng = np.random.default_rng(seed)
    return np.concatenate([
        rng.normal([0.0, 0.0], 1.0, (300, 2)),
        rng.normal([6.0, 0.0], 0.5, (200, 2)),
        rng.normal([0.0, 7.0], [1.0, 0.3], (40, 2)),
    ])


@pytest.fixture
def blobs() -> np.ndarray:
    return three_blobs()
