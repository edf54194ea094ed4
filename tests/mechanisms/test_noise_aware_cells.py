"""``noise-aware-cells`` as a release (dpsummary/mechanisms/noise_aware_cells.py): a charged
release ends in a signed artifact that records what it released, one Gaussian event of the
stage's multiplier is all it charges, and its post-processing is reproducible from a seed."""

from __future__ import annotations

import dataclasses
import math
from pathlib import Path
from typing import Any

import numpy as np
import pytest
import torch
from release_support import write_csv, write_policy

from dpsummary import accounting as acc
from dpsummary.mechanisms import REGISTRY
from dpsummary.plan import ReleaseRequest
from dpsummary.release import plan_public, public_stage1, run_release

N = 1500


def _request(tmp: Path, *, seed: int | None = 0, count_public: bool = True, target: str = "binary") -> ReleaseRequest:
    tmp.mkdir(parents=True, exist_ok=True)
    data = write_csv(tmp / "d.csv", N, seed=5, target=target)
    policy = write_policy(tmp / "p.toml", n=N if count_public else None, x1_integer=True, total_epsilon=10.0,
                          target_kind=target)
    return ReleaseRequest(data=data, epsilon=1.0, policy=policy, out=tmp / "o.dpsummary.json",
                          ledger=tmp / "ledger.jsonl", mechanism="noise-aware-cells", seed=seed, size=4)


@pytest.mark.parametrize("count_public", [True, False])
def test_a_charged_release_ends_in_a_signed_artifact(tmp_path: Path, count_public: bool) -> None:
    from dpsummary.artifact import read_artifact

    req = _request(tmp_path, count_public=count_public)
    result = run_release(req)
    assert result.mechanism == "noise-aware-cells"
    body, claim, info = read_artifact(req.out)  # type: ignore[arg-type]
    assert info["verified"]
    mech = claim["mechanism"]
    assert mech["name"] == "noise-aware-cells"
    assert mech["domain"]["cells"] == 11 * 4  # x1's integers 0..10 x x2's three categories and "other"
    assert mech["count_share"] == 0.3
    sigma = mech["single_gaussian_noise_multiplier"]
    assert mech["counts_noise_multiplier"] == pytest.approx(sigma / math.sqrt(0.3))
    assert mech["statistic_noise_multiplier"] == pytest.approx(sigma / math.sqrt(0.7))
    # The design radius: ||[1, x1 = +-1, one-hot x2]|| = sqrt(3).
    assert mech["design_radius"] == pytest.approx(math.sqrt(3.0))
    # Stage 2 is one Gaussian event of the stage's multiplier (after the quality counts, if any).
    assert claim["events"][-1] == acc.events_to_json([acc_gaussian(sigma)])[0]
    gaussian = body["posterior"]["gaussians"]["noise_aware"]
    assert len(gaussian["mean"]) == 1 + 1 + 3
    assert body["posterior"]["pseudocoreset_match"] is not None
    assert np.all(np.isfinite(np.asarray(gaussian["cov"])))


def acc_gaussian(sigma: float) -> Any:
    from dp_accounting import dp_event as dpe

    return dpe.GaussianDpEvent(sigma)


class SeededNoise:
    """Seeded Gaussian noise (tests only: a release's noise is OS entropy and cannot be seeded)."""

    def __init__(self, seed: int) -> None:
        self.rng = np.random.default_rng(seed)

    def gaussian(self, values: np.ndarray, *, noise_std: float, clip_norm: float) -> np.ndarray:
        return np.asarray(values, dtype=np.float64) + noise_std * self.rng.standard_normal(np.shape(values))


def _run(tmp: Path, seed: int, noise_seed: int) -> Any:
    from dpsummary.data import read_csv
    from dpsummary.private.mechanism import PrivateRecords

    req = _request(tmp, seed=seed)
    mech = REGISTRY["noise-aware-cells"]
    public = plan_public(req, lambda _msg: None)
    plan = mech.plan(public, public_stage1(public))
    features, target = plan.transform.apply(read_csv(req.data, private=True))
    table = torch.cat([features, target[:, None]], dim=1)
    return mech.run(public, plan, PrivateRecords(table, randomness=SeededNoise(noise_seed)), record_count=float(N))


def test_fixed_seeds_reproduce_the_release(tmp_path: Path) -> None:
    one = _run(tmp_path / "a", seed=3, noise_seed=9)
    two = _run(tmp_path / "b", seed=3, noise_seed=9)
    assert one.extra["gaussians"] == two.extra["gaussians"]
    assert torch.equal(one.summary.points, two.summary.points)
    assert torch.equal(one.summary.weights, two.summary.weights)
    other = _run(tmp_path / "c", seed=4, noise_seed=9)  # another --seed: other imputations
    assert other.extra["gaussians"] != one.extra["gaussians"]


def test_the_posterior_is_near_the_full_data_fit_at_a_large_epsilon(tmp_path: Path) -> None:
    """At epsilon 1 on 1,500 records the cells' Gaussian sits within a few of its own sds of the
    generating effects' signs: x1's slope (0.5 per data unit, 2.5 in model units) is found."""
    out = _run(tmp_path, seed=0, noise_seed=1)
    mean = np.asarray(out.extra["gaussians"]["noise_aware"]["mean"])
    sd = np.sqrt(np.diag(np.asarray(out.extra["gaussians"]["noise_aware"]["cov"])))
    assert mean[1] - 2 * sd[1] > 0  # x1 (scaled to [-1, 1]): effect 2.5 model units


@pytest.mark.parametrize(("options", "match"), [({"engine": "spark"}, "local engine only"),
                                                ({"model": "linear"}, "logistic and Poisson regression only")])
def test_options_it_cannot_serve_refuse_on_the_options_alone(tmp_path: Path, options: dict[str, Any],
                                                              match: str) -> None:
    from dpsummary.errors import ReleaseError

    req = ReleaseRequest(data=tmp_path / "d.csv", epsilon=1.0, mechanism="noise-aware-cells", **options)
    with pytest.raises(ReleaseError, match=match) as info:
        REGISTRY["noise-aware-cells"].check_public(req, None)
    assert "noise-aware-newton" in info.value.fix


class InfiniteNoise:
    """Noise that overwhelms everything (tests only)."""

    def gaussian(self, values: np.ndarray, *, noise_std: float, clip_norm: float) -> np.ndarray:
        return np.full(np.shape(values), np.inf)


def test_statistics_that_give_no_finite_posterior_end_in_the_charged_refusal(tmp_path: Path) -> None:
    from dpsummary.data import read_csv
    from dpsummary.errors import ChargedRefusal
    from dpsummary.private.mechanism import PrivateRecords

    req = _request(tmp_path)
    mech = REGISTRY["noise-aware-cells"]
    public = plan_public(req, lambda _msg: None)
    plan = mech.plan(public, public_stage1(public))
    features, target = plan.transform.apply(read_csv(req.data, private=True))
    table = torch.cat([features, target[:, None]], dim=1)
    with pytest.raises(ChargedRefusal, match="no finite summary"):
        mech.run(public, plan, PrivateRecords(table, randomness=InfiniteNoise()), record_count=float(N))


def test_a_poisson_release_centres_its_prior_at_the_noisy_mean_count(tmp_path: Path) -> None:
    """A count target (public bound 60): the count's DP histogram (5% of the stage's Gaussian)
    clips it at a bin edge of the public grid far below 60 (the test data's counts have mean about
    exp(1.05); 1,500 records put hundreds in the low bins against a noise sd of about 20, so a
    bound of 60 here would take every bin below the threshold at once), T's sensitivity is the
    design radius times that bound, and the released model's prior is centred at the log of the
    noisy mean count (within 0.3 of 1.05: the noise on the centre is about 0.01 here)."""
    from dpsummary.artifact import read_artifact

    req = _request(tmp_path, target="count")
    run_release(req)
    body, claim, info = read_artifact(req.out)  # type: ignore[arg-type]
    assert info["verified"]
    mech = claim["mechanism"]
    assert mech["schema_target_bound"] == 60.0
    clip = mech["count_range"]
    assert clip["bin_above_noise"] and clip["schema_bound"] == 60.0
    assert mech["target_bound"] == clip["clip_bound"] and mech["target_bound"] in (5.0, 10.0, 20.0)
    single = mech["single_gaussian_noise_multiplier"]
    assert mech["count_range_share"] == 0.05
    assert clip["noise_multiplier"] == pytest.approx(single / math.sqrt(0.05))
    assert mech["cells_noise_multiplier"] == pytest.approx(single / math.sqrt(0.95))
    assert mech["statistic_noise_multiplier"] == pytest.approx(mech["cells_noise_multiplier"] / math.sqrt(0.7))
    centre = body["summary"]["model"]["prior_mean"]
    assert centre[1:] == [0.0] * (len(centre) - 1)
    assert abs(centre[0] - 1.05) < 0.3
    assert np.all(np.isfinite(np.asarray(body["posterior"]["gaussians"]["noise_aware"]["cov"])))


@pytest.mark.parametrize("mechanism", ["noise-aware-cells", "noise-aware-newton"])
def test_a_count_clip_in_the_bin_of_0_ends_in_a_signed_release(tmp_path: Path, mechanism: str,
                                                               monkeypatch: pytest.MonkeyPatch) -> None:
    """A DP count clip in the bin of 0 (every count 0, every bin above under the noise; forced
    here, since the histogram's noise comes from OS entropy and a noise bin survives the
    threshold about 1% of the time). ``noise-aware-cells`` used to stop there with a
    MechanismError after the budget was charged (T's sensitivity would be 0); it now clips at 1,
    the grid's first positive edge. The Newton rounds' bounds already use ``max(B, 1)``. Both end
    in a signed artifact that records the clip."""
    from dpsummary.artifact import read_artifact
    from dpsummary.postprocess import count_range as cr

    real = cr.clip_bound
    monkeypatch.setattr(cr, "clip_bound", lambda noisy, bound: dataclasses.replace(real(noisy, bound), bound=0.0))
    req = dataclasses.replace(_request(tmp_path, target="count"), mechanism=mechanism)
    lines = req.data.read_text().splitlines()
    req.data.write_text("\n".join([lines[0], *(line.rsplit(",", 1)[0] + ",0" for line in lines[1:])]) + "\n")
    run_release(req)
    body, claim, info = read_artifact(req.out)  # type: ignore[arg-type]
    assert info["verified"]
    mech = claim["mechanism"]
    assert mech["name"] == mechanism and mech["count_range"]["clip_bound"] == 0.0
    if mechanism == "noise-aware-cells":
        assert mech["target_bound"] == 1.0
    assert np.all(np.isfinite(np.asarray(body["posterior"]["gaussians"]["noise_aware"]["cov"])))


# ---- the default's choice (issue 50's thirty-first rule; dpsummary.release.choose_mechanism) ----
def _default_request(tmp: Path, *, epsilon: float, x1_integer: bool = True, schema: bool = True,
                     mechanism: str | None = None, count_public: bool = True) -> ReleaseRequest:
    tmp.mkdir(parents=True, exist_ok=True)
    data = write_csv(tmp / "d.csv", N, seed=5)
    policy = write_policy(tmp / "p.toml", n=N if count_public else None, x1_integer=x1_integer, schema=schema,
                          total_epsilon=20.0, cap=10.0)
    return ReleaseRequest(data=data, epsilon=epsilon, policy=policy, out=tmp / "o.dpsummary.json",
                          ledger=tmp / "ledger.jsonl", mechanism=mechanism, seed=0, size=4)


def test_records_per_cell_sds_is_the_mean_cell_count_over_its_noise_sd(tmp_path: Path) -> None:
    from dpsummary.mechanisms.noise_aware_cells import records_per_cell_sds

    public = plan_public(_request(tmp_path), lambda _m: None)
    released = public_stage1(public)  # the policy's public count: N
    plan = REGISTRY["noise-aware-cells"].plan(public, released)
    count_sd = plan.noise_multiplier / math.sqrt(0.3)
    assert records_per_cell_sds(plan, released.record_count) == pytest.approx((N / 44) / count_sd, rel=1e-12)
    # A Poisson plan's cells get the stage's Gaussian less the count histogram's share.
    poisson = plan_public(_request(tmp_path / "p", target="count"), lambda _m: None)
    pplan = REGISTRY["noise-aware-cells"].plan(poisson, public_stage1(poisson))
    share = pplan.settings["range_share"]
    assert share > 0
    expected = (N / 44) / (pplan.noise_multiplier / math.sqrt(1.0 - share) / math.sqrt(0.3))
    assert records_per_cell_sds(pplan, N) == pytest.approx(expected, rel=1e-12)


@pytest.mark.parametrize(("epsilon", "expected"), [(0.5, "noise-aware-newton"), (5.0, "noise-aware-cells")])
def test_the_default_runs_cells_only_with_enough_records_per_cell(tmp_path: Path, epsilon: float,
                                                                  expected: str) -> None:
    # N 1,500 over 44 cells: about 0.9 count-noise sds of records per cell at epsilon 0.5 and
    # about 12 at epsilon 5, either side of RECORDS_PER_CELL_SDS (3.38).
    from dpsummary.artifact import read_artifact
    from dpsummary.mechanisms.noise_aware_cells import RECORDS_PER_CELL_SDS, records_per_cell_sds

    req = _default_request(tmp_path, epsilon=epsilon)
    public = plan_public(req, lambda _m: None)
    assert public.mechanism_by_default and public.req.mechanism == "noise-aware-newton"
    cells_public = dataclasses.replace(public, req=dataclasses.replace(public.req, mechanism="noise-aware-cells"))
    rho = records_per_cell_sds(REGISTRY["noise-aware-cells"].plan(cells_public, public_stage1(public)), N)
    assert (rho >= RECORDS_PER_CELL_SDS) == (expected == "noise-aware-cells")
    said: list[str] = []
    result = run_release(req, notice=said.append)
    assert result.mechanism == expected
    _body, claim, _info = read_artifact(req.out)  # type: ignore[arg-type]
    assert claim["mechanism"]["name"] == expected
    assert any("mechanism: noise-aware-cells" in s for s in said) == (expected == "noise-aware-cells")


@pytest.mark.parametrize("case", ["named", "continuous", "no schema"])
def test_the_newton_rounds_run_when_asked_for_or_the_domain_rule_does_not_hold(tmp_path: Path, case: str) -> None:
    req = _default_request(tmp_path, epsilon=5.0, mechanism="noise-aware-newton" if case == "named" else None,
                           x1_integer=case != "continuous", schema=case != "no schema")
    public = plan_public(req, lambda _m: None)
    assert public.mechanism_by_default == (case != "named")
    assert run_release(req).mechanism == "noise-aware-newton"


def test_the_choice_reads_only_the_released_count(tmp_path: Path) -> None:
    # Post-processing: given the same released count, the choice is the same whatever the data;
    # 50 records over 44 cells are too few at epsilon 5, 1,500 and 15,000 enough.
    from dpsummary.release import choose_mechanism

    public = plan_public(_default_request(tmp_path, epsilon=5.0), lambda _m: None)
    released = public_stage1(public)
    chosen = [choose_mechanism(public, dataclasses.replace(released, record_count=float(n)), lambda _m: None)
              .req.mechanism for n in (50, N, 10 * N)]
    assert chosen == ["noise-aware-newton", "noise-aware-cells", "noise-aware-cells"]
