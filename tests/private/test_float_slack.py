"""Issue 35 item 3: the float64 slack of noisy sums and scaled counts ("slack included" is true).

Exact integer sums convert to float64 exactly only up to 2^53 grid units (about 1.7 * 10^7
records at full norm), and a count times a float scale rounds by half an ulp of the product. The
per-record clip (kernel.effective_clip) and the count scale (noise.count_vector_scale) reserve
noise.float_slack for sums and counts over up to noise.MAX_RECORDS records; these tests put
neighbouring totals where the rounding is worst and check the released vectors stay within the
bound, and that the old slack (OpenDP's rounding only) did not.
"""

from __future__ import annotations

import math

import numpy as np
import pytest
import torch

from dpsummary.private import kernel, noise
from dpsummary.private.fixed_point import clip_rows, fixed_point_unit


def _one_record(bound: float, clip: float, dim: int) -> np.ndarray:
    """The kernel's integer contribution of one record at the full clip along the diagonal."""
    row = torch.full((1, dim), 10.0 * bound, dtype=torch.float64)
    return kernel.fixed_point_sum(clip_rows(row, clip).numpy(), fixed_point_unit(bound))


def _gap(bound: float, others: list[int], record: np.ndarray) -> float:
    """L2 distance between the released (float64) sums with and without the record."""
    without = np.empty(len(others), dtype=object)
    without[:] = others
    with_ = kernel.combine(without, record)
    return float(np.linalg.norm(kernel.finish(with_, bound) - kernel.finish(without, bound)))


@pytest.mark.parametrize("bound, dim", [(1.0, 1), (1.0, 100), (3.7, 5), (1e-3, 30)])
def test_sum_beyond_2_53_units_stays_within_the_bound(bound: float, dim: int) -> None:
    # Totals up to MAX_RECORDS records at full norm (2^41 * 2^28 units, far beyond 2^53), each
    # coordinate at an offset chosen to round one way with the record and the other without.
    unit = fixed_point_unit(bound)
    record = _one_record(bound, kernel.effective_clip(bound, dim), dim)
    limit = noise.rounding_slack(bound, dim)
    per_coord_max = int(noise.MAX_RECORDS * bound / math.sqrt(dim) / unit)
    rng = np.random.default_rng(7)
    worst = 0.0
    for exponent in (54, 60, 64, per_coord_max.bit_length() - 1):
        base = 1 << exponent
        ulp = 1 << max(exponent - 52, 0)
        for _ in range(40):
            offsets = rng.integers(0, ulp, dim).tolist()
            others = [min(base + o, per_coord_max) for o in offsets]
            worst = max(worst, _gap(bound, others, record))
    assert worst <= bound - limit
    # The rounding really happens (the test could fail): beyond 2^53 units the released gap is
    # not the record's exact norm.
    exact = float(np.linalg.norm(np.array([int(v) for v in record], dtype=np.float64) * unit))
    assert worst != exact


def test_the_old_slack_did_not_hold_at_4e9_records() -> None:
    # Before issue 35 the clip was bound - rounding_slack only: a sum over about 4.3e9 records at
    # full norm (2^60 units at bound 1, below the default n_max of 10^10) released neighbours
    # more than the bound apart.
    bound, dim = 1.0, 1
    old_record = _one_record(bound, bound - noise.rounding_slack(bound, dim), dim)
    r = int(old_record[0])
    base = 1 << 60  # ulp = 256 units
    gaps = [_gap(bound, [base - r + j], old_record) for j in range(0, 256, 3)]
    assert max(gaps) > bound  # the claim "sensitivity <= bound" failed
    new_record = _one_record(bound, kernel.effective_clip(bound, dim), dim)
    r2 = int(new_record[0])
    assert max(_gap(bound, [base - r2 + j], new_record) for j in range(0, 256, 3)) <= bound


@pytest.mark.parametrize("touches", [1, 4, 30])
def test_scaled_counts_up_to_max_records_move_by_at_most_one(touches: int) -> None:
    # A count of about 10^9 and of about 2^41 (MAX_RECORDS) on every touched coordinate: the
    # float64 products count * scale of two neighbours differ by at most 1 - OpenDP's slack.
    scale = noise.count_vector_scale(touches, touches)
    limit = 1.0 - noise.rounding_slack(1.0, touches)
    rng = np.random.default_rng(touches)
    for top in (10**9, noise.MAX_RECORDS):
        for _ in range(200):
            c = rng.integers(top - 10**6, top, touches).astype(np.float64)
            gap = float(np.linalg.norm(c * scale - (c - 1.0) * scale))
            assert gap <= limit


def test_scaled_counts_broke_the_old_slack_at_a_billion() -> None:
    # The old scale (OpenDP's slack only): one ulp of a count of 10^9 (2^-23) exceeds 2^-45, and
    # some neighbouring counts moved by more than 1 - slack, i.e. "slack included" was false.
    old = 1.0 - noise.rounding_slack(1.0, 1)
    c = np.arange(10**9, 10**9 + 4000, dtype=np.float64)
    assert np.max(c * old - (c - 1.0) * old) > old
    new = noise.count_vector_scale(1, 1)
    assert np.max(c * new - (c - 1.0) * new) <= old


def test_share_scales_reserve_the_same_slack() -> None:
    from dpsummary.private.preprocess import CountVector

    touches, share = 10, 0.3
    keys = [("y", "value", "a"), ("y", "value", "b"), *[(f"c{i}", "value", "v") for i in range(8)]]
    vec = CountVector(keys, np.zeros(len(keys)), touches)
    scales = vec.coordinate_scales("y", share)
    a, b = float(scales[0]), float(scales[-1])
    move = math.sqrt(2 * a * a + (touches - 2) * b * b)
    assert move == pytest.approx(1.0 - noise.rounding_slack(1.0, touches) - noise.float_slack(1.0), rel=1e-14)
    uniform = math.sqrt(touches) * vec.scale
    assert uniform == pytest.approx(move, rel=1e-14)


def test_policy_n_max_cap_is_covered_by_max_records() -> None:
    # The slack is sized for MAX_RECORDS records; a policy cannot set n_max above MAX_N_MAX and a
    # release refuses a noisy count above n_max, so a larger table would need count noise of
    # about 10^12 to be released.
    from dpsummary.policy import MAX_N_MAX, Policy

    assert noise.MAX_RECORDS >= 2 * MAX_N_MAX
    base = {"total_epsilon": 1.0, "total_delta": 1e-10, "max_epsilon_per_release": 0.5}
    assert Policy.model_validate({**base, "n_max": MAX_N_MAX}).n_max == MAX_N_MAX
    with pytest.raises(ValueError):
        Policy.model_validate({**base, "n_max": MAX_N_MAX + 1})
    # The slack itself stays negligible: under 0.05% of the bound.
    assert noise.float_slack(1.0) < 5e-4
