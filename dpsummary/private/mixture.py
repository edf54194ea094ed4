"""Private mixture summaries (issue 17, beyond the poster): the parts of two mechanisms that read
records or draw privacy noise. Their output is a weighted pseudo-data summary that weighted CAVI
(:mod:`dpsummary.mixtures.vi`) then fits; ``benchmarks/results/mixtures_private.md`` measures
both. Their public plans and post-processing live outside this package:
:mod:`dpsummary.mixtures.kdtree` (the tree's public design :class:`~dpsummary.mixtures.kdtree.TreePlan`,
the released :class:`~dpsummary.mixtures.kdtree.NoisyTree`, its pseudo-points) and
:mod:`dpsummary.mixtures.dp_summary` (the stage function
:func:`~dpsummary.mixtures.dp_summary.release_mixture_summary` and the DP-EM driver).

* **Noisy adaptive kd-tree** (:func:`noisy_tree`, :func:`leaf_moments`: the mechanism of
  ``dpsummary release --model gmm|dpgmm``, ``dp-kd-tree``), below.
* **DP-EM** (:func:`noisy_statistics`, one round), the baseline, documented next: it does not
  work at useful budgets (docs/MIXTURES.md).

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
   anyway (:func:`dpsummary.private.mechanism.clip_rows`, the OpenDP rounding and float64 slacks
   of :func:`dpsummary.private.kernel.effective_clip` kept aside)
   so the invariant does not depend on the algebra;
2. the rows are summed exactly on the fixed-point grid
   (:func:`dpsummary.private.mechanism.exact_clipped_sum`) and ONE Gaussian mechanism adds noise
   of standard deviation ``sigma * sqrt(3)`` from the privacy randomness (OpenDP, OS entropy):
   add/remove one record moves the sum by at most ``sqrt(3)`` in L2, so the round is
   ``GaussianDpEvent(sigma)``;
3. the noisy statistics are repaired (counts floored at 0, the implied Wishart scale projected
   onto the positive-definite cone) and the M-step gives the next factors.

The T rounds compose to ``SelfComposedDpEvent(GaussianDpEvent(sigma), T)``;
:func:`dpsummary.mixtures.dp_summary.calibrate` chooses sigma with
:func:`dpsummary.accounting.calibrate_noise_multiplier`. The summary: for each component with
expected weight above ``min_weight``, P pseudopoints whose weighted count, mean and covariance
equal the component's released ones (:func:`dpsummary.mixtures.dp_summary.pseudo_points`), so
weighted VI on them (any analyst, no further privacy cost) sees the
released mixture as data.
"""

from __future__ import annotations

import math

import numpy as np
import torch

from ..mixtures.kdtree import MAX_NODES_PER_LEVEL, NoisyTree, TreePlan
from ..mixtures.vi import MixturePosterior, Statistics, responsibilities
from . import kernel, noise
from .mechanism import (
    MechanismError,
    PrivacyRandomness,
    PrivateRecords,
    clip_rows,
    exact_clipped_sum,
)

#: L2 bound of one record's statistics vector (see module docstring).
STATISTICS_SENSITIVITY = math.sqrt(3.0)


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
    # OpenDP's rounding slack and the float64 slack of the exact sum (kernel.effective_clip).
    clipped = clip_rows(torch.from_numpy(rows), kernel.effective_clip(STATISTICS_SENSITIVITY, k * block)).numpy()
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


# ---------------------------------------------------------------------------------------------
# Noisy adaptive kd-tree (module docstring): the private mixture summary proposed for release.
# ---------------------------------------------------------------------------------------------

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
    OpenDP's rounding slack and the float64 rounding of ``count * scale``; ``m`` = number of
    released nodes, public), noise of sd ``noise_multiplier`` from the privacy randomness,
    scaled back. Returns the noisy counts (noise sd ``noise_multiplier / scale`` on the count
    scale, scale = 1 - 2^-45 sqrt(m) - float_slack(1))."""
    counts = np.asarray(counts, dtype=np.float64)
    scale = noise.count_vector_scale(1, counts.shape[0])
    noisy = randomness.gaussian(counts * scale, noise_std=noise_multiplier, clip_norm=1.0)
    return np.asarray(noisy, dtype=np.float64) / scale


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
    # One record moves one leaf's sum: OpenDP's rounding slack and the float64 slack of that sum.
    rows = clip_rows(torch.from_numpy(rows), kernel.effective_clip(1.0, 2 * d)).numpy()
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
