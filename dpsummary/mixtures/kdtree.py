"""The noisy kd-tree mixture summary's public parts (``dp-kd-tree``, ``dpsummary release --model
gmm|dpgmm``): the public design of a release (:class:`TreePlan`, :func:`plan_tree`: box, depth,
thresholds, noise multiplier and the accountant's event), the released tree (:class:`NoisyTree`:
functions of noisy counts only) and its weighted pseudo-points (:func:`tree_pseudo_points`:
post-processing). Nothing here reads a record or draws privacy noise: the mechanism is
:func:`dpsummary.private.mixture.noisy_tree` (design and privacy argument in
:mod:`dpsummary.private.mixture`).
"""

from __future__ import annotations

import math
from dataclasses import dataclass

import dp_accounting as dpa
import numpy as np

from ..accounting import calibrate_noise_multiplier, gaussian_event

#: Default public box half-width in the public standardised space: a standardised coordinate
#: leaves [-4, 4] with probability at most 1/16 (Chebyshev), ~6e-5 for a Gaussian.
DEFAULT_BOUND = 4.0
#: Default splits per coordinate at the maximum depth (64 cells per coordinate: cell width
#: 2B/64 = 0.125 sd at B = 4), and the cap on the total depth (the noise grows like sqrt(L)).
DEFAULT_LEVELS_PER_DIM = 6
DEFAULT_MAX_DEPTH = 36
#: Split a node iff its noisy count >= 3 sigma (a node with no record is split with probability
#: 0.13%); keep a leaf iff its noisy count >= 2 sigma (an empty leaf survives with probability
#: 2.3%). Fixed before any private measurement (docs/MIXTURES.md, "design rule").
DEFAULT_SPLIT_THRESHOLD = 3.0
DEFAULT_KEEP_THRESHOLD = 2.0
#: Public cap on the nodes released at one depth (memory); beyond it only the nodes with the
#: largest noisy counts are split (post-processing of noisy counts).
MAX_NODES_PER_LEVEL = 1 << 18


@dataclass(frozen=True)
class TreePlan:
    """The public design of one noisy kd-tree release (everything here is public).

    ``noise_multiplier`` is sigma, the standard deviation of the noise on every released count
    (count units; sensitivity 1). The run costs exactly :meth:`event`:
    ``max_depth + 1`` Gaussian mechanisms of noise multiplier sigma."""

    dim: int
    bound: float
    max_depth: int
    noise_multiplier: float
    split_threshold: float = DEFAULT_SPLIT_THRESHOLD
    keep_threshold: float = DEFAULT_KEEP_THRESHOLD
    #: Variant (off by default): one more Gaussian release, same sigma, of per-leaf sums of
    #: ``[(x - c)/h, ((x - c)/h)^2] / sqrt(2D)`` (L2 norm <= 1 per record), giving each leaf a
    #: DP mean and per-coordinate variance (:func:`dpsummary.private.mixture.leaf_moments`).
    leaf_moments: bool = False

    def __post_init__(self) -> None:
        if self.dim < 1 or self.max_depth < 0 or self.max_depth > 62:
            raise ValueError("need dim >= 1 and 0 <= max_depth <= 62")
        if not (self.bound > 0 and math.isfinite(self.bound)):
            raise ValueError("bound must be positive and finite")
        if not (self.noise_multiplier > 0 and math.isfinite(self.noise_multiplier)):
            raise ValueError("noise_multiplier must be positive and finite")
        if not (self.split_threshold > 0 and self.keep_threshold >= 0):
            raise ValueError("thresholds must be non-negative (split positive)")

    @property
    def releases(self) -> int:
        """Number of Gaussian mechanisms (one per depth 0..max_depth, plus the leaf moments)."""
        return self.max_depth + 1 + (1 if self.leaf_moments else 0)

    def event(self) -> dpa.DpEvent:
        """The run's ``DpEvent``: ``SelfComposedDpEvent(GaussianDpEvent(sigma), releases)``."""
        return gaussian_event(self.noise_multiplier, self.releases)

    def splits(self, depth: int) -> np.ndarray:
        """Number of midpoint splits of each coordinate at ``depth``, shape (D,)."""
        j = np.arange(self.dim)
        return depth // self.dim + (j < depth % self.dim).astype(np.int64)

    def to_dict(self) -> dict[str, object]:
        return {"mechanism": "noisy-kd-tree", "dim": self.dim, "bound": self.bound, "max_depth": self.max_depth,
                "noise_multiplier": self.noise_multiplier, "split_threshold": self.split_threshold,
                "keep_threshold": self.keep_threshold, "leaf_moments": self.leaf_moments}


def default_max_depth(dim: int, levels_per_dim: int = DEFAULT_LEVELS_PER_DIM, cap: int = DEFAULT_MAX_DEPTH) -> int:
    """The default depth rule: ``min(levels_per_dim * D, cap)``."""
    return min(levels_per_dim * dim, cap)


def plan_tree(
    dim: int,
    *,
    epsilon: float,
    delta: float,
    bound: float = DEFAULT_BOUND,
    max_depth: int | None = None,
    split_threshold: float = DEFAULT_SPLIT_THRESHOLD,
    keep_threshold: float = DEFAULT_KEEP_THRESHOLD,
    leaf_moments: bool = False,
    prior_events: tuple[dpa.DpEvent, ...] = (),
) -> TreePlan:
    """Calibrate sigma so that ``prior_events`` plus the tree's ``max_depth + 1`` Gaussian levels
    meet (epsilon, delta) under the accountant of record (Opacus RDP,
    :func:`dpsummary.accounting.calibrate_noise_multiplier`)."""
    depth = default_max_depth(dim) if max_depth is None else int(max_depth)
    steps = depth + 1 + (1 if leaf_moments else 0)
    sigma = calibrate_noise_multiplier(target_epsilon=epsilon, delta=delta, sample_rate=1.0, steps=steps,
                                       prior_events=list(prior_events))
    return TreePlan(dim, float(bound), depth, sigma, float(split_threshold), float(keep_threshold), leaf_moments)


@dataclass(frozen=True)
class NoisyTree:
    """The released leaves (public: functions of the noisy counts only): per-coordinate cell
    indices and depth of each kept leaf, and its noisy count; plus the number of nodes released
    at each depth (public)."""

    plan: TreePlan
    leaf_cells: np.ndarray   # (m, D) int64
    leaf_depths: np.ndarray  # (m,) int64
    leaf_counts: np.ndarray  # (m,) float64, noisy
    released_per_depth: tuple[int, ...]

    def boxes(self) -> tuple[np.ndarray, np.ndarray]:
        """Centres and half-widths of the kept leaves, each (m, D)."""
        p = self.plan
        s = np.stack([p.splits(int(d)) for d in self.leaf_depths]) if len(self.leaf_depths) else np.zeros((0, p.dim))
        half = p.bound / (1 << s.astype(np.int64)).astype(np.float64)
        centres = -p.bound + (2 * self.leaf_cells + 1) * half
        return centres, half


def tree_pseudo_points(tree: NoisyTree) -> tuple[np.ndarray, np.ndarray]:
    """The weighted pseudo-data of a released tree (post-processing): 2D points per kept leaf at
    ``centre +- sqrt(D/3) h_j e_j`` with weight ``count / (2D)`` each, so every leaf contributes
    its noisy count with the mean and covariance of the uniform distribution on its cell."""
    centres, half = tree.boxes()
    m, d = centres.shape
    offsets = math.sqrt(d / 3.0) * half  # (m, D)
    eye = np.eye(d)
    plus = centres[:, None, :] + offsets[:, None, :] * eye[None]
    minus = centres[:, None, :] - offsets[:, None, :] * eye[None]
    points = np.concatenate([plus, minus], axis=1).reshape(m * 2 * d, d)
    weights = np.repeat(tree.leaf_counts / (2 * d), 2 * d)
    return points, weights
