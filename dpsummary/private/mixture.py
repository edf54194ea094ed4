"""Private mixture summaries (issue 17, beyond the poster): two mechanisms whose output is a
weighted pseudo-data summary that weighted CAVI (:mod:`dpsummary.mixtures.vi`) then fits;
``benchmarks/results/mixtures_private.md`` measures both.

* **Noisy adaptive kd-tree** (:func:`release_mixture_summary`, the mechanism of ``dpsummary
  release --model gmm|dpgmm``, ``dp-kd-tree``, orchestrated by :mod:`dpsummary.release`; design
  rule in :class:`TreePlan`), below.
* **DP-EM** (:func:`private_mixture`), the baseline, documented next: it does not work at useful
  budgets (docs/MIXTURES.md).

Noisy adaptive kd-tree (a Gaussian-noise, fixed-depth relative of PrivTree, Zhang, Xiao & Xie,
SIGMOD 2016, and of the noisy quadtrees of Cormode et al., ICDE 2012). The public box
``[-B, B]^D`` of the public standardised space is split at midpoints, cycling over the
coordinates (depth l splits coordinate ``l mod D``). Level by level, from the root (depth 0) to
the public maximum depth L, the counts of the *released* nodes of that depth are noised by ONE
Gaussian mechanism: every record lies in exactly one node of each depth, so adding or removing
one record changes exactly one released count by 1, or none (its node was not released): L2
sensitivity 1, ``GaussianDpEvent(sigma)`` per level. Which nodes of depth l+1 are released is
decided ONLY from the noisy counts of depth l (a node is split iff its noisy count is at least
``split_threshold * sigma``), so the run is an adaptive composition of L + 1 Gaussian mechanisms,
``SelfComposedDpEvent(GaussianDpEvent(sigma), L + 1)``, whatever the data. Unsplit nodes are
the leaves; a leaf whose noisy count is below ``keep_threshold * sigma`` is dropped (public rule),
the others become 2D pseudo-points at ``centre +- sqrt(D/3) h_j e_j`` (h_j the half-width along
coordinate j), each with weight ``count / (2D)``: their weighted mean and covariance are those of
the uniform distribution on the cell, so a component resolved into a few cells keeps its spread.
Children dropped below the keep threshold would lose their records' mass (a node split at 3
sigma has children near 1.5 sigma); post-processing of the released counts gives it back: a
split node whose two children are both dropped becomes a leaf with its own noisy count, and when
one child is dropped, the parent's noisy count minus the surviving child's becomes a leaf on the
dropped child's cell if it reaches the keep threshold too (kept unconditionally, the positive
part of a difference of two noisy counts biased the total mass upward by about 13% on a
3,000-record table; with the threshold, 3,003 ± 174 for 3,000).
Records are mapped into the box by a total per-record function: finite coordinates are clipped
to ``[-B, B]``, a record with any non-finite coordinate contributes to no count.

Why not a coreset: the lightweight coreset (poster, Algorithm 1) is made of private records and
cannot be released. What is released here is a post-processing of Gaussian mechanisms only.

Mechanism (DP-EM, Park, Foulds, Chaudhuri & Welling 2017, with the variational M-step of
:mod:`dpsummary.mixtures.vi`). Records are points in a *public* standardised space, each scaled
into the L2 ball of public radius ``B`` (a per-record map). For ``T`` rounds, given the current
(public) variational factors:

1. every record computes its responsibilities r_n (K,) and the vector
   ``v_n = concat_k r_nk (1, x_n / B, triu(x_n x_n^T) / B^2)``; since ``sum_k r_nk^2 <= 1``
   and ``||x_n|| <= B``, ``||v_n||_2 <= sqrt(3)``; rows are clipped to ``sqrt(3) - slack``
   anyway (:func:`dpsummary.private.mechanism.clip_rows`, the OpenDP rounding slack kept aside)
   so the invariant does not depend on the algebra;
2. the rows are summed exactly on the fixed-point grid
   (:func:`dpsummary.private.mechanism.exact_clipped_sum`) and ONE Gaussian mechanism adds noise
   of standard deviation ``sigma * sqrt(3)`` from the privacy randomness (OpenDP, OS entropy):
   add/remove one record moves the sum by at most ``sqrt(3)`` in L2, so the round is
   ``GaussianDpEvent(sigma)``;
3. the noisy statistics are repaired (counts floored at 0, the implied Wishart scale projected
   onto the positive-definite cone) and the M-step gives the next factors.

The T rounds compose to ``SelfComposedDpEvent(GaussianDpEvent(sigma), T)``;
:func:`calibrate` chooses sigma with :func:`dpsummary.accounting.calibrate_noise_multiplier`.
The summary: for each component with expected weight above ``min_weight``, P pseudopoints
whose weighted count, mean and covariance equal the component's released ones
(:func:`pseudo_points`), so weighted VI on them (any analyst, no further privacy cost) sees the
released mixture as data.
"""

from __future__ import annotations

import math
from dataclasses import dataclass

import dp_accounting as dpa
import numpy as np
import torch

from ..accounting import calibrate_noise_multiplier, gaussian_event
from ..mixtures.vi import (
    MixturePosterior,
    MixturePrior,
    Statistics,
    posterior_from_statistics,
    responsibilities,
)
from . import noise
from .mechanism import (
    MechanismError,
    PrivacyRandomness,
    PrivateRecords,
    SystemRandomness,
    clip_rows,
    exact_clipped_sum,
)

#: L2 bound of one record's statistics vector (see module docstring).
STATISTICS_SENSITIVITY = math.sqrt(3.0)


def calibrate(epsilon: float, delta: float, rounds: int) -> float:
    """The noise multiplier sigma for ``rounds`` Gaussian rounds at (epsilon, delta) (Opacus RDP,
    the accountant of record)."""
    return calibrate_noise_multiplier(target_epsilon=epsilon, delta=delta, sample_rate=1.0, steps=rounds)


def privacy_event(noise_multiplier: float, rounds: int) -> dpa.DpEvent:
    """The ``DpEvent`` of one run (for the ledger and :func:`dpsummary.accounting.epsilon`)."""
    return gaussian_event(noise_multiplier, rounds)


def project_to_ball(x: np.ndarray, radius: float) -> np.ndarray:
    """Scale every row with norm above ``radius`` onto the sphere (a per-record map)."""
    norms = np.linalg.norm(x, axis=1, keepdims=True)
    return np.asarray(x * np.minimum(1.0, radius / np.maximum(norms, 1e-300)))


def _layout(d: int) -> tuple[int, np.ndarray, np.ndarray]:
    """Length of one component's block (count, sum, upper triangle of the outer product)."""
    iu = np.triu_indices(d)
    return 1 + d + iu[0].shape[0], iu[0], iu[1]


def noisy_statistics(
    records: np.ndarray,
    posterior: MixturePosterior,
    *,
    radius: float,
    noise_multiplier: float,
    randomness: PrivacyRandomness,
) -> Statistics:
    """One DP-EM round (module docstring, steps 1-2): the Gaussian-noised weighted statistics of
    ``records`` (already projected into the public ball of ``radius``) under ``posterior``.
    Costs ``GaussianDpEvent(noise_multiplier)``."""
    n, d = records.shape
    k = posterior.n_components
    block, iu, ju = _layout(d)
    resp, _ = responsibilities(posterior, records)
    x = records / radius
    per_record = np.concatenate([np.ones((n, 1)), x, x[:, iu] * x[:, ju]], axis=1)  # (n, block)
    rows = (resp[:, :, None] * per_record[:, None, :]).reshape(n, k * block)
    slack = noise.rounding_slack(STATISTICS_SENSITIVITY, k * block)
    clipped = clip_rows(torch.from_numpy(rows), STATISTICS_SENSITIVITY - slack).numpy()
    total = exact_clipped_sum(clipped, STATISTICS_SENSITIVITY)
    noisy = randomness.gaussian(total, noise_std=noise_multiplier * STATISTICS_SENSITIVITY,
                                clip_norm=STATISTICS_SENSITIVITY)
    parts = np.asarray(noisy, dtype=np.float64).reshape(k, block)
    counts = parts[:, 0]
    sums = parts[:, 1:1 + d] * radius
    outer = np.zeros((k, d, d))
    outer[:, iu, ju] = parts[:, 1 + d:] * radius**2
    outer[:, ju, iu] = parts[:, 1 + d:] * radius**2
    return Statistics(counts, sums, outer)


def repair(
    prior: MixturePrior,
    stats: Statistics,
    *,
    min_count: float = 0.0,
    max_variance: float = math.inf,
    floor: float = 1e-3,
) -> Statistics:
    """Post-processing of noisy statistics (public thresholds only).

    Components whose noisy count is below ``min_count`` (callers pass a multiple of the count's
    noise sd: such a count is indistinguishable from noise) get all-zero statistics, i.e. the
    prior. For the others the implied W_k^-1 is projected so that its eigenvalues lie in
    ``[floor * lambda_min(W0^-1), nu_k * max_variance]`` (the data lie in a public ball, so no
    component variance can exceed its squared radius), which makes it positive definite."""
    keep = stats.counts >= max(min_count, 0.0)
    counts = np.where(keep, np.maximum(stats.counts, 0.0), 0.0)
    sums = np.where(keep[:, None], stats.sums, 0.0)
    beta = prior.mean_precision + counts
    means = (prior.mean_precision * prior.mean + sums) / beta[:, None]
    base = prior.covariance + prior.mean_precision * np.outer(prior.mean, prior.mean) \
        - beta[:, None, None] * np.einsum("ki,kj->kij", means, means)
    outer = np.where(keep[:, None, None], 0.5 * (stats.outer + np.swapaxes(stats.outer, 1, 2)), 0.0)
    scale_inv = base + outer
    lo = floor * float(np.linalg.eigvalsh(prior.covariance).min())
    hi = (prior.degrees_of_freedom + counts) * max_variance
    vals, vecs = np.linalg.eigh(scale_inv)
    clipped = np.minimum(np.maximum(vals, lo), np.maximum(hi, lo)[:, None])
    fixed = np.einsum("kij,kj,klj->kil", vecs, clipped, vecs)
    return Statistics(counts, sums, fixed - base)


@dataclass(frozen=True)
class PrivateMixtureSummary:
    """What the mechanism releases: the final (public) factors, the pseudo-data summary and the
    privacy cost. Everything here is a post-processing of the noisy statistics."""

    posterior: MixturePosterior
    points: np.ndarray
    weights: np.ndarray
    noise_multiplier: float
    rounds: int
    event: dpa.DpEvent


def pseudo_points(
    posterior: MixturePosterior,
    prior: MixturePrior,
    *,
    per_component: int,
    min_weight: float,
    rng: np.random.Generator,
) -> tuple[np.ndarray, np.ndarray]:
    """``per_component`` (>= D + 1) pseudopoints per component with expected weight at least
    ``min_weight``: a public standard-normal draw, re-centred and whitened so that its empirical
    mean is exactly 0 and covariance exactly I, then mapped to ``m_k + L_k z`` with
    ``L_k L_k^T = W_k^-1 / nu_k``. Weights ``N_k / per_component`` with ``N_k = nu_k - nu0``, so
    each component's weighted count, mean and covariance are reproduced exactly (up to the
    M-step's shrinkage towards the prior, negligible when N_k >> beta0, nu0)."""
    d = posterior.dim
    if per_component < d + 1:
        raise ValueError("per_component must be at least D + 1")
    weights = posterior.expected_weights()
    counts = np.maximum(posterior.degrees_of_freedom - prior.degrees_of_freedom, 0.0)
    covs = posterior.covariances()
    pts, wts = [], []
    for k in np.flatnonzero(weights >= min_weight):
        z = rng.normal(size=(per_component, d))
        z -= z.mean(0)
        z = z @ np.linalg.inv(np.linalg.cholesky(z.T @ z / per_component)).T
        pts.append(posterior.means[k] + z @ np.linalg.cholesky(covs[k]).T)
        wts.append(np.full(per_component, counts[k] / per_component))
    return np.concatenate(pts), np.concatenate(wts)


def private_mixture(
    records: np.ndarray,
    prior: MixturePrior,
    *,
    epsilon: float,
    delta: float,
    radius: float,
    rounds: int = 10,
    min_weight: float = 0.005,
    per_component: int = 64,
    init_rng: np.random.Generator,
    randomness: PrivacyRandomness | None = None,
) -> PrivateMixtureSummary:
    """Run DP-EM for ``rounds`` rounds at total (epsilon, delta) and release the summary.

    ``records`` are in the public standardised space (they are projected into the ball of public
    ``radius`` here); ``prior`` must be public (e.g. built from public bounds, never from the
    records). ``init_rng`` drives only public randomness: the initial component centres, drawn
    uniformly in the ball, each with a unit pseudo-count, and the pseudopoints' base draw. Privacy randomness comes from
    ``randomness`` (default: OS entropy).
    """
    rand = randomness if randomness is not None else SystemRandomness()
    sigma = calibrate(epsilon, delta, rounds)
    x = project_to_ball(np.asarray(records, dtype=np.float64), radius)
    k, d = prior.n_components, prior.dim
    direction = init_rng.normal(size=(k, d))
    radii = radius * init_rng.uniform(size=(k, 1)) ** (1 / d)
    centres = direction / np.linalg.norm(direction, axis=1, keepdims=True) * radii
    spread = (radius / 3.0) ** 2
    init = Statistics(np.ones(k), centres, np.einsum("ki,kj->kij", centres, centres) + spread * np.eye(d)[None])
    post = posterior_from_statistics(prior, init)
    for _ in range(rounds):
        stats = noisy_statistics(x, post, radius=radius, noise_multiplier=sigma, randomness=rand)
        # A count below 3 noise sd is noise; no variance exceeds radius^2 (public bounds).
        min_count = 3.0 * sigma * STATISTICS_SENSITIVITY
        post = posterior_from_statistics(prior, repair(prior, stats, min_count=min_count, max_variance=radius**2))
    points, weights = pseudo_points(post, prior, per_component=per_component, min_weight=min_weight,
                                    rng=init_rng)
    return PrivateMixtureSummary(post, points, weights, sigma, rounds, privacy_event(sigma, rounds))


# ---------------------------------------------------------------------------------------------
# Noisy adaptive kd-tree (module docstring): the private mixture summary proposed for release.
# ---------------------------------------------------------------------------------------------

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
    #: DP mean and per-coordinate variance (:func:`leaf_moments`).
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


def cell_codes(x: np.ndarray, plan: TreePlan) -> np.ndarray:
    """Per-record cell index along each coordinate at the maximum depth, shape (n, D), int64;
    a row with any non-finite coordinate gets -1 everywhere (it lies in no released node).
    Total per-record function: finite coordinates are clipped into the public box."""
    x = np.asarray(x, dtype=np.float64)
    if x.ndim != 2 or x.shape[1] != plan.dim:
        raise MechanismError("records do not have the plan's dimension")
    finite = np.isfinite(x).all(1)
    cells = (1 << plan.splits(plan.max_depth)).astype(np.float64)  # (D,)
    with np.errstate(invalid="ignore"):
        u = (np.clip(np.where(np.isfinite(x), x, 0.0), -plan.bound, plan.bound) + plan.bound) / (2 * plan.bound)
    codes = np.minimum(np.floor(u * cells), cells - 1).astype(np.int64)
    return np.where(finite[:, None], codes, -1)


def node_keys(cells: np.ndarray, plan: TreePlan, depth: int) -> np.ndarray:
    """One int64 key per row of per-coordinate cell indices at ``depth`` (mixed radix 2^s_j);
    rows with a negative index map to -1."""
    s = plan.splits(depth)
    offsets = np.concatenate([[0], np.cumsum(s)[:-1]]).astype(np.int64)
    keys = (cells << offsets).sum(1) if cells.size else np.zeros(cells.shape[0], dtype=np.int64)
    return np.where((cells < 0).any(1), -1, keys) if cells.size else keys


def _record_keys(codes: np.ndarray, plan: TreePlan, depth: int) -> np.ndarray:
    """Keys at ``depth`` of records whose max-depth cell indices are ``codes``."""
    shift = plan.splits(plan.max_depth) - plan.splits(depth)
    cells = np.where(codes >= 0, codes >> np.maximum(shift, 0), -1)
    return node_keys(cells, plan, depth)


def exact_node_counts(codes: np.ndarray, plan: TreePlan, depth: int, nodes: np.ndarray) -> np.ndarray:
    """EXACT counts of the records in each of ``nodes`` (per-coordinate cell indices at
    ``depth``, shape (m, D)). Each record adds 1 to at most one entry. PRIVATE: only for
    :func:`noisy_tree`; never returned to callers outside this module."""
    keys = node_keys(nodes, plan, depth)
    order = np.argsort(keys)
    sorted_keys = keys[order]
    rec = _record_keys(codes, plan, depth)
    pos = np.searchsorted(sorted_keys, rec)
    pos_c = np.minimum(pos, max(len(sorted_keys) - 1, 0))
    hit = (rec >= 0) & (len(sorted_keys) > 0) & (sorted_keys[pos_c] == rec) if len(sorted_keys) else np.zeros(rec.shape, bool)
    counts_sorted = np.bincount(pos_c[hit], minlength=len(sorted_keys)).astype(np.float64)
    counts = np.empty_like(counts_sorted)
    counts[order] = counts_sorted
    return counts


def release_counts(randomness: PrivacyRandomness, counts: np.ndarray, noise_multiplier: float) -> np.ndarray:
    """ONE Gaussian mechanism on a count vector in which one record changes at most one entry by
    1: scaled by :func:`noise.count_vector_scale` ``(1, m)`` (L2 sensitivity <= 1 including
    OpenDP's rounding slack; ``m`` = number of released nodes, public), noise of sd
    ``noise_multiplier`` from the privacy randomness, scaled back. Returns the noisy counts
    (noise sd ``noise_multiplier / scale`` on the count scale, scale = 1 - 2^-45 sqrt(m))."""
    counts = np.asarray(counts, dtype=np.float64)
    scale = noise.count_vector_scale(1, counts.shape[0])
    noisy = randomness.gaussian(counts * scale, noise_std=noise_multiplier, clip_norm=1.0)
    return np.asarray(noisy, dtype=np.float64) / scale


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


def _children(nodes: np.ndarray, plan: TreePlan, depth: int) -> np.ndarray:
    """The two children (depth + 1) of every node: coordinate ``depth mod D`` is split."""
    j = depth % plan.dim
    left = nodes.copy()
    left[:, j] *= 2
    right = left.copy()
    right[:, j] += 1
    return np.concatenate([left, right])


def noisy_tree(records: PrivateRecords, plan: TreePlan) -> NoisyTree:
    """Run the noisy kd-tree mechanism (module docstring) on ``records`` (already in the public
    standardised space). Costs exactly ``plan.event()`` (charged by the caller BEFORE calling).

    Privacy: per depth, one :func:`release_counts` over the released nodes; which nodes are
    released next depends only on the noisy counts and public plan values. The exact counts, the
    record count and the records never leave this function. A depth with no released node
    releases nothing (its budget is still charged: the accountant's event does not depend on the
    data)."""
    store = records._store  # noqa: SLF001 - the private package's mechanisms read the store
    randomness = records._randomness  # noqa: SLF001
    codes = np.concatenate([cell_codes(chunk, plan) for chunk in store.chunks()]) if store.num_rows \
        else np.zeros((0, plan.dim), dtype=np.int64)
    nodes = np.zeros((1, plan.dim), dtype=np.int64)
    leaves: list[np.ndarray] = []
    depths: list[np.ndarray] = []
    counts_out: list[np.ndarray] = []
    released: list[int] = []
    sigma = plan.noise_multiplier
    parents = np.zeros((0, plan.dim), dtype=np.int64)  # the split nodes of the previous depth
    parent_counts = np.zeros(0)
    for depth in range(plan.max_depth + 1):
        released.append(int(nodes.shape[0]))
        if nodes.shape[0] == 0:
            continue
        noisy = release_counts(randomness, exact_node_counts(codes, plan, depth, nodes), sigma)
        split = noisy >= plan.split_threshold * sigma if depth < plan.max_depth else np.zeros(len(noisy), bool)
        if 2 * int(split.sum()) > MAX_NODES_PER_LEVEL:  # public cap: split the largest noisy counts
            top = np.argsort(-noisy)[: MAX_NODES_PER_LEVEL // 2]
            split = np.zeros(len(noisy), bool)
            split[top] = True
        leaf = ~split & (noisy >= plan.keep_threshold * sigma)
        leaves.append(nodes[leaf])
        depths.append(np.full(int(leaf.sum()), depth, dtype=np.int64))
        counts_out.append(noisy[leaf])
        if depth > 0:
            # Mass of dropped children (post-processing of released counts only): a split node's
            # children that fall below the keep threshold would lose their records' mass (a node
            # split at 3 sigma has children near 1.5 sigma). The parent's noisy count minus its
            # surviving children's (kept or split further) goes to the dropped part of its cell:
            # the parent's whole cell when both children dropped, else the dropped child's cell
            # when that difference reaches the keep threshold (the rule every leaf follows).
            m = parents.shape[0]
            survive = (split | leaf).reshape(2, m)
            kept_mass = np.where(split | leaf, noisy, 0.0).reshape(2, m).sum(0)
            both = ~survive.any(0)
            leaves.append(parents[both])
            depths.append(np.full(int(both.sum()), depth - 1, dtype=np.int64))
            counts_out.append(parent_counts[both])
            one = survive.sum(0) == 1
            residual = parent_counts - kept_mass
            give = one & (residual > plan.keep_threshold * sigma)
            dropped_child = np.where(survive[0], 1, 0)  # index of the dropped child (left 0, right 1)
            child_nodes = nodes.reshape(2, m, plan.dim)
            cols = np.flatnonzero(give)
            leaves.append(child_nodes[dropped_child[cols], cols])
            depths.append(np.full(cols.size, depth, dtype=np.int64))
            counts_out.append(residual[cols])
        parents, parent_counts = nodes[split], noisy[split]
        nodes = _children(parents, plan, depth)
    return NoisyTree(plan, np.concatenate(leaves), np.concatenate(depths), np.concatenate(counts_out),
                     tuple(released))


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


def leaf_moments(records: PrivateRecords, tree: NoisyTree) -> tuple[np.ndarray, np.ndarray]:
    """The optional moments release (``plan.leaf_moments``): ONE Gaussian mechanism, noise sd
    sigma, on the concatenated per-leaf exact sums of ``v = [u, u^2] / sqrt(2D)``, u = (x - c)/h
    the record's position in its kept leaf's cell (|u_j| <= 1 after clipping into the box), so
    ``||v|| <= 1``; rows are clipped to ``1 - slack`` anyway and summed exactly on the public
    fixed-point grid (:func:`exact_clipped_sum`). One record changes one leaf's 2D entries:
    sensitivity 1. Returns per-leaf means and per-coordinate variances (m, D), clipped into the
    cell and into [0, h^2] (public post-processing)."""
    plan = tree.plan
    store = records._store  # noqa: SLF001
    randomness = records._randomness  # noqa: SLF001
    centres, half = tree.boxes()
    m, d = centres.shape
    x = np.concatenate(list(store.chunks())) if store.num_rows else np.zeros((0, d))
    codes = cell_codes(x, plan)
    leaf_of = np.full(x.shape[0], -1, dtype=np.int64)
    for depth in np.unique(tree.leaf_depths):
        at = np.flatnonzero(tree.leaf_depths == depth)
        keys = node_keys(tree.leaf_cells[at], plan, int(depth))
        order = np.argsort(keys)
        rec = _record_keys(codes, plan, int(depth))
        pos = np.minimum(np.searchsorted(keys[order], rec), len(at) - 1)
        hit = (rec >= 0) & (keys[order][pos] == rec)
        leaf_of[hit] = at[order[pos[hit]]]
    inside = leaf_of >= 0
    xc = np.clip(np.where(np.isfinite(x), x, 0.0), -plan.bound, plan.bound)
    u = np.zeros_like(xc)
    u[inside] = np.clip((xc[inside] - centres[leaf_of[inside]]) / half[leaf_of[inside]], -1.0, 1.0)
    rows = np.concatenate([u, u * u], axis=1) / math.sqrt(2 * d)
    slack = noise.rounding_slack(1.0, 2 * d)
    rows = clip_rows(torch.from_numpy(rows), 1.0 - slack).numpy()
    totals = np.zeros((m, 2 * d))
    order = np.argsort(leaf_of[inside], kind="stable")
    grouped = rows[inside][order]
    bounds = np.searchsorted(leaf_of[inside][order], np.arange(m + 1))
    for j in range(m):
        if bounds[j + 1] > bounds[j]:
            totals[j] = exact_clipped_sum(grouped[bounds[j]:bounds[j + 1]], 1.0)
    noisy = np.asarray(randomness.gaussian(totals.reshape(-1), noise_std=plan.noise_multiplier, clip_norm=1.0),
                       dtype=np.float64).reshape(m, 2 * d) * math.sqrt(2 * d)
    count = np.maximum(tree.leaf_counts, 1.0)[:, None]
    mean_u = np.clip(noisy[:, :d] / count, -1.0, 1.0)
    var_u = np.clip(noisy[:, d:] / count - mean_u**2, 0.0, 1.0)
    return centres + half * mean_u, (half**2) * var_u


@dataclass(frozen=True)
class MixtureRelease:
    """What :func:`release_mixture_summary` returns: the weighted pseudo-points (the releasable
    summary, in the public standardised space), and public notes (the plan, the accountant
    event, leaf and node numbers; all functions of noisy counts or public values)."""

    points: np.ndarray
    weights: np.ndarray
    event: dpa.DpEvent
    notes: dict[str, object]


def release_mixture_summary(records: PrivateRecords, *, plan: TreePlan) -> MixtureRelease:
    """THE stage function of ``dpsummary release --model gmm|dpgmm`` (:mod:`dpsummary.release`).

    Contract: ``records`` hold the private rows already mapped to the PUBLIC standardised space
    (a public affine map per column, from the policy's bounds or schema; never from the data),
    shape (n, plan.dim); ``plan`` comes from :func:`plan_tree` with the release's (epsilon, delta)
    share, and its :meth:`TreePlan.event` has been charged to the ledger before this call. The
    output ``points``/``weights`` are safe to publish (post-processing of the Gaussian
    mechanisms); weighted CAVI on them (:func:`fit_release`) costs no further privacy."""
    tree = noisy_tree(records, plan)
    points, weights = tree_pseudo_points(tree)
    if plan.leaf_moments and tree.leaf_counts.shape[0]:
        means, variances = leaf_moments(records, tree)
        m, d = means.shape
        offsets = np.sqrt(d * variances)  # 2D points at mean +- sqrt(D var_j) e_j: the leaf's mean and variances
        eye = np.eye(d)
        points = np.concatenate([means[:, None, :] + offsets[:, None, :] * eye[None],
                                 means[:, None, :] - offsets[:, None, :] * eye[None]], axis=1).reshape(m * 2 * d, d)
    notes: dict[str, object] = {**plan.to_dict(), "leaves": int(tree.leaf_counts.shape[0]),
                                "released_per_depth": list(tree.released_per_depth)}
    return MixtureRelease(points, weights, plan.event(), notes)


def fit_release(release: MixtureRelease, prior: MixturePrior, rng: np.random.Generator, *,
                max_iter: int = 500, tol: float = 1e-7) -> MixturePosterior:
    """Weighted CAVI on the released pseudo-points (post-processing; ``prior`` and ``rng`` must be
    public). Raises ``ValueError`` if nothing was released (all leaves below the keep threshold)."""
    from ..mixtures.vi import fit_cavi

    if release.weights.shape[0] == 0:
        raise ValueError("the release holds no pseudo-point (every leaf was below the keep threshold)")
    return fit_cavi(release.points, release.weights, prior, rng, max_iter=max_iter, tol=tol).posterior
