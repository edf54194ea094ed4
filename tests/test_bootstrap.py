"""The parametric bootstrap of DP-PSVI (dpsummary.bootstrap, issue 28)."""

from __future__ import annotations

import json
from pathlib import Path

import numpy as np
import pytest
import torch

from dpsummary.bootstrap import (
    BootstrapConfig,
    BootstrapError,
    MechanismSettings,
    ParametricBootstrap,
    Replicate,
    SimulationRandomness,
    calibrate,
    fit_linear,
    linear_posterior,
    synthetic_table,
    widening_factor,
)
from dpsummary.data import ColumnSpec, Schema, Transform
from dpsummary.models import LogisticRegression, PoissonRegression


def _settings(kind: str = "logistic", steps: int = 10) -> MechanismSettings:
    target = (ColumnSpec(name="y", kind="categorical", categories=["0", "1"], positive="1") if kind == "logistic"
              else ColumnSpec(name="y", kind="numeric", lower=0.0, upper=5.0, integer=True))
    tf = Transform.from_schema(Schema(columns=[ColumnSpec(name="a", kind="numeric", lower=-1.0, upper=1.0),
                                               ColumnSpec(name="b", kind="categorical", categories=["u", "v"]),
                                               target], target="y"))
    model = LogisticRegression(tf.num_features) if kind == "logistic" else PoissonRegression(tf.num_features)
    return MechanismSettings(model=model, transform=tf, size=4, steps=steps, num_samples=10, noise_multiplier=1.5,
                             sample_rate=0.25, record_count=300.4)


def _raw_summary(settings: MechanismSettings) -> object:
    from dpsummary.constructors.base import Summary

    gen = torch.Generator().manual_seed(0)
    pts = settings.model.simulate(torch.zeros(settings.model.param_dim, dtype=torch.float64), settings.size, gen,
                                  features=settings.transform.sample_public_features(settings.size, gen))
    return Summary(pts, torch.full((settings.size,), 50.0, dtype=torch.float64), settings.model, "dp-psvi",
                   settings.transform.to_dict())


def test_simulation_randomness_is_seeded_and_poisson() -> None:
    a = SimulationRandomness(np.random.default_rng(5))
    b = SimulationRandomness(np.random.default_rng(5))
    ia, ib = a.sample_indices(10_000, 0.1), b.sample_indices(10_000, 0.1)
    assert np.array_equal(ia, ib)
    assert np.all(np.diff(ia) > 0) and ia[0] >= 0 and ia[-1] < 10_000
    # Binomial(10^4, 0.1): sd 30; 6 sd (failure rate ~1e-9).
    assert abs(ia.size - 1000) < 180
    noisy = a.gaussian(np.zeros(20_000), noise_std=2.0, clip_norm=1.0)
    assert abs(noisy.std() - 2.0) < 0.1  # se ~0.01


def test_synthetic_table_respects_the_public_range() -> None:
    s = _settings("poisson")
    table = synthetic_table(s, torch.tensor([1.5, 1.0, 0.5, 0.0], dtype=torch.float64), 500, torch.Generator().manual_seed(1))
    assert table.shape == (500, s.model.point_dim)
    assert float(table[:, -1].max()) <= 5.0 and float(table[:, -1].min()) >= 0.0
    assert float(table[:, 0].abs().max()) <= 1.0


def test_bootstrap_is_reproducible_from_its_seed_and_records_its_calibration() -> None:
    s = _settings()
    raw = _raw_summary(s)
    cfg = BootstrapConfig(replicates=5, rounds=2, workers=1, seed=42)
    first = ParametricBootstrap(s, cfg).fit(raw)
    second = ParametricBootstrap(s, cfg).fit(raw)
    assert torch.equal(first.summary.weights, second.summary.weights)
    assert torch.equal(first.summary.points, second.summary.points)
    assert first.summary.info["posterior"] == "calibrated"
    assert first.summary.points.shape == raw.points.shape  # type: ignore[attr-defined]
    assert bool(torch.isfinite(first.summary.weights).all())
    rec = first.record(s)
    assert rec["replicates"] == 10 and rec["rounds"] == 2 and rec["simulation_seed"] == 42
    # Never wider than the prior (N(0, 1) here).
    assert max(rec["gaussian"]["sd"]) <= 1.0
    json.dumps(rec)  # the artifact's record is plain JSON
    other = ParametricBootstrap(s, BootstrapConfig(replicates=5, rounds=2, workers=1, seed=43)).fit(raw)
    assert other.calibration.posterior.mean.tolist() != first.calibration.posterior.mean.tolist()


def _linear_replicates(slope: float, noise: float, b: int, d: int, seed: int) -> tuple[torch.Tensor, torch.Tensor]:
    g = torch.Generator().manual_seed(seed)
    truths = torch.randn(b, d, generator=g, dtype=torch.float64)
    means = 0.3 + slope * truths + noise * torch.randn(b, d, generator=g, dtype=torch.float64)
    return truths, means


def test_fit_linear_recovers_slope_and_inflates_noise_for_monte_carlo() -> None:
    truths, means = _linear_replicates(0.8, 0.1, 400, 6, 1)
    fit = fit_linear(truths, means)
    # B = 400: slope se ~0.005 per coordinate, 10 se tolerance.
    assert torch.allclose(fit.slope, torch.full((6,), 0.8, dtype=torch.float64), atol=0.05)
    assert torch.allclose(fit.intercept, torch.full((6,), 0.3, dtype=torch.float64), atol=0.05)
    # Residual sd ~0.1, inflated by t_398 / z (about 1.003); 0.1 +- 15% covers sampling (se ~4%).
    assert bool(((fit.noise_var.sqrt() - 0.1).abs() < 0.015).all())
    small = fit_linear(*_linear_replicates(0.8, 0.1, 6, 6, 2))
    assert float(small.noise_var.mean()) > 0  # t_4 inflation: (2.776 / 1.96)^2 ~ 2
    with pytest.raises(BootstrapError):
        fit_linear(truths[:3], means[:3])


def test_linear_posterior_is_the_prior_when_the_mechanism_ignores_the_truth() -> None:
    model = LogisticRegression(2)
    g = torch.Generator().manual_seed(4)
    truths = torch.randn(40, 3, generator=g, dtype=torch.float64)
    means = 5.0 + 0.2 * torch.randn(40, 3, generator=g, dtype=torch.float64)  # output independent of truth
    post = linear_posterior(model, fit_linear(truths, means), torch.full((3,), 5.0, dtype=torch.float64))
    sd = torch.sqrt(torch.diagonal(post.cov))
    # Slope shrunk to ~0 (its se ~0.03): the posterior is within 10% of the prior N(0, 1).
    assert bool((sd > 0.9).all()) and bool((sd <= 1.0).all())
    assert bool((post.mean.abs() < 0.5).all())


def test_calibration_covers_on_a_simulated_biased_overconfident_mechanism() -> None:
    """A mechanism that shrinks the truth by 0.5, adds noise sd 0.3 and shifts by 0.3: the raw
    means' errors are ~0.5 sd-of-truth wide. The leave-one-out coverage of the calibrated rule
    over 20 replicates is ~95%; >= 85% fails with probability well under 1e-3 (per-replicate
    coverage of 8 coordinates; se of the pooled share ~0.02)."""
    model = LogisticRegression(7)
    truths, means = _linear_replicates(0.5, 0.3, 20, 8, 5)
    reps = [Replicate(t, torch.zeros(1, 8, dtype=torch.float64), torch.zeros(1, dtype=torch.float64), m)
            for t, m in zip(truths, means, strict=True)]
    cal = calibrate(model, reps, means[0])
    assert cal.loo_coverage >= 0.85
    assert 0.3 < cal.fit.slope_pooled < 0.7
    # Fresh draws from the same mechanism: the calibrated 95% intervals contain the truth.
    fresh_t, fresh_m = _linear_replicates(0.5, 0.3, 200, 8, 6)
    hits = []
    for t, m in zip(fresh_t, fresh_m, strict=True):
        post = linear_posterior(model, cal.fit, m)
        sd = torch.sqrt(torch.diagonal(post.cov))
        hits.append(float(((post.mean - t).abs() <= 1.96 * sd).double().mean()))
    # 1600 coordinate-draws: nominal >= 0.95 (prior and MC inflation make it conservative);
    # 0.88 is > 5 se below.
    assert float(np.mean(hits)) >= 0.88


def test_widening_factor_restores_held_out_coverage() -> None:
    g = torch.Generator().manual_seed(8)
    # Held-out |errors| / sd of an interval 1.5x too narrow: the factor is ~1.5 (4000 draws:
    # the 95% quantile's se is ~2%, 10% tolerance) and never below 1 for honest intervals.
    z = (1.5 * torch.randn(200, 20, generator=g, dtype=torch.float64)).abs()
    assert widening_factor(z) == pytest.approx(1.5, rel=0.1)
    assert widening_factor(0.5 * z) == 1.0


def test_match_falls_back_to_fewer_steps_when_its_posterior_fails(monkeypatch: pytest.MonkeyPatch) -> None:
    """The public matching rule: the closed form (a GLM with a point per parameter; 0 steps),
    else MATCH_STEPS, else MATCH_STEPS_FALLBACK when Newton fails on the matched pseudocoreset
    (recorded); none usable -> BootstrapError (a charged refusal)."""
    import dpsummary.inference as inference
    from dpsummary.bootstrap import MATCH_STEPS, MATCH_STEPS_FALLBACK

    s = _settings()
    raw = _raw_summary(s)
    boot = ParametricBootstrap(s, BootstrapConfig(replicates=5, rounds=1, workers=1, seed=4))
    first = boot.fit(raw)  # unpatched: the calibration to match
    # Unpatched, the closed form carries the calibrated Gaussian within the match tolerance.
    from dpsummary.constructors.gaussian_target import DEFAULT_TOLERANCE

    assert first.calibration.match_steps == 0 and first.calibration.match_symmetric_kl <= DEFAULT_TOLERANCE
    real = inference.coreset_posterior
    calls: list[int] = []

    def flaky(*args: object, **kwargs: object) -> object:
        calls.append(1)
        if len(calls) <= failures:
            raise inference.NewtonFailure("line search failed")
        return real(*args, **kwargs)  # type: ignore[arg-type]

    monkeypatch.setattr(inference, "coreset_posterior", flaky)
    for failures, steps in ((1, MATCH_STEPS), (2, MATCH_STEPS_FALLBACK)):
        calls.clear()
        _, cal = boot.finish(first.calibration, raw, torch.Generator().manual_seed(0))
        assert cal.match_steps == steps and len(calls) == failures + 1

    def broken(*args: object, **kwargs: object) -> object:
        raise inference.NewtonFailure("line search failed")

    monkeypatch.setattr(inference, "coreset_posterior", broken)
    with pytest.raises(BootstrapError, match="usable pseudocoreset"):
        boot.finish(first.calibration, raw, torch.Generator().manual_seed(0))


def test_worker_processes_need_no_main_guard(tmp_path: Path) -> None:
    """A library call from a script WITHOUT ``if __name__ == "__main__"`` (issue 28's crash under
    'spawn'): two worker processes finish and agree with the in-process run."""
    import subprocess
    import sys

    from dpsummary.bootstrap import worker_start_method

    if worker_start_method() != "fork":
        pytest.skip("worker processes default to one in-process worker off Linux")
    script = tmp_path / "noguard.py"
    script.write_text(
        "import sys, torch\n"
        f"sys.path.insert(0, {str(Path(__file__).resolve().parent)!r})\n"
        "from test_bootstrap import _raw_summary, _settings\n"
        "from dpsummary.bootstrap import BootstrapConfig, ParametricBootstrap\n"
        "s = _settings()\n"
        "r = _raw_summary(s)\n"
        "a = ParametricBootstrap(s, BootstrapConfig(replicates=5, rounds=1, workers=2, seed=9)).fit(r)\n"
        "b = ParametricBootstrap(s, BootstrapConfig(replicates=5, rounds=1, workers=1, seed=9)).fit(r)\n"
        "print(a.workers, torch.equal(a.summary.weights, b.summary.weights))\n")
    out = subprocess.run([sys.executable, str(script)], capture_output=True, text=True, timeout=300, check=False)
    assert out.returncode == 0, out.stderr[-2000:]
    assert out.stdout.split() == ["2", "True"]


def test_analyst_selects_calibrated_by_default_and_raw_on_request(tmp_path: Path) -> None:
    from dpsummary.analyst import Release, ReleaseFormatError

    s = _settings()
    raw = _raw_summary(s)
    res = ParametricBootstrap(s, BootstrapConfig(replicates=5, rounds=1, workers=1, seed=1)).fit(raw)
    body = {"format": "dpsummary.release/v1", "summary": res.summary.to_dict(),
            "raw_summary": raw.to_dict(), "posterior": {"default": "calibrated"},  # type: ignore[attr-defined]
            "feature_names": s.transform.feature_names}
    default = Release.from_body(body)
    assert default.summary.info["posterior"] == "calibrated"
    assert torch.equal(Release.from_body(body, posterior="calibrated").weights, default.weights)
    assert torch.equal(Release.from_body(body, posterior="raw").weights, raw.weights)  # type: ignore[attr-defined]
    body.pop("posterior")
    with pytest.raises(ReleaseFormatError, match="no calibrated posterior"):
        Release.from_body(body, posterior="calibrated")


def test_bootstrap_never_reads_a_record() -> None:
    from dpsummary.selftest import bootstrap_check

    result = bootstrap_check()
    assert result.ok, result


def test_default_workers_stay_in_process_when_a_fork_unsafe_runtime_is_loaded(
        monkeypatch: pytest.MonkeyPatch) -> None:
    """With JAX loaded (a notebook, or a test process that ran the exporters), forking could
    deadlock the children: the default is one in-process worker (the release's notice says so)."""
    import sys
    import types

    from dpsummary.bootstrap import fork_unsafe_runtime

    monkeypatch.delitem(sys.modules, "jax", raising=False)
    monkeypatch.delitem(sys.modules, "jaxlib", raising=False)
    assert not fork_unsafe_runtime()
    monkeypatch.setitem(sys.modules, "jax", types.ModuleType("jax"))
    assert fork_unsafe_runtime()
    assert BootstrapConfig(replicates=7).resolved_workers() == 1
    assert BootstrapConfig(replicates=7, workers=2).resolved_workers() == 2


# ---- issue 35: the synthetic table's memory does not grow with the record count -----------------
def _init_settings(record_count: float, steps: int = 6) -> MechanismSettings:
    """Logistic settings WITH the DP initialisation (so a replicate makes a full pass first)."""
    import dataclasses

    from dpsummary.postprocess.marginals import layout_for

    s = _settings("logistic", steps=steps)
    return dataclasses.replace(s, record_count=record_count, init_noise_multiplier=2.0,
                               init_layout=layout_for(s.transform, count_target=True))


def _replay(s: MechanismSettings, seed: int, *, materialise: bool, block_rows: int) -> Replicate:
    from dpsummary.bootstrap import SyntheticStore, replay_mechanism
    from dpsummary.private.mechanism import PrivateRecords
    from dpsummary.private.store import RecordStore

    truth = torch.tensor([0.8, -0.5, 0.3, 0.1], dtype=torch.float64)
    num = int(round(s.record_count))
    rand = SimulationRandomness(np.random.default_rng(seed), np.random.default_rng([seed, 1]))
    touched = rand.plan_samples(num, s.sample_rate, s.steps)
    syn = SyntheticStore(s, truth, num, table_seed=seed + 99, touched=touched, block_rows=block_rows)
    store: RecordStore = syn
    if materialise:
        store = RecordStore.from_array(np.concatenate([syn.block(b) for b in range(-(-num // block_rows))]))
    return replay_mechanism(s, truth, PrivateRecords(store, randomness=rand), torch.Generator().manual_seed(seed))


@pytest.mark.parametrize("with_init", [True, False])
def test_streamed_synthetic_table_replays_bit_for_bit_like_the_materialised_table(with_init: bool) -> None:
    # The streamed store (blocks regenerated, only the planned rows kept) and the materialised
    # table made of the same blocks give the same replicate to the bit: the memory bound changes
    # nothing about what the mechanism sees. with_init: a full pass (the DP histograms) first.
    s = _init_settings(1000.0) if with_init else _settings("logistic", steps=6)
    for seed in (1, 2):
        a = _replay(s, seed, materialise=False, block_rows=128)
        b = _replay(s, seed, materialise=True, block_rows=128)
        assert torch.equal(a.points, b.points) and torch.equal(a.weights, b.weights)
    # A different seed gives a different replicate (the comparison can fail).
    c = _replay(s, 3, materialise=False, block_rows=128)
    assert not torch.equal(a.points, c.points)


def test_synthetic_store_refuses_rows_outside_the_planned_samples() -> None:
    from dpsummary.bootstrap import SyntheticStore

    s = _settings()
    store = SyntheticStore(s, torch.zeros(4, dtype=torch.float64), 1000, table_seed=1,
                           touched=np.array([3, 10, 500]), block_rows=64)
    assert store.gather(np.array([3, 500])).shape == (2, s.model.point_dim)
    with pytest.raises(BootstrapError):
        store.gather(np.array([4]))
    store.close()
    with pytest.raises(RuntimeError):
        store.gather(np.array([3]))


def test_blocks_have_the_distribution_of_a_table_drawn_at_once() -> None:
    # Rows are i.i.d. (per-row features, per-row targets), so blocks with seeds of their own are
    # distributed as one table drawn at once. 20,000 rows each, 6-sigma bands on the means.
    from dpsummary.bootstrap import SyntheticStore

    s = _settings("poisson")
    truth = torch.tensor([0.6, 0.4, -0.3, 0.2], dtype=torch.float64)
    n = 20_000
    once = synthetic_table(s, truth, n, torch.Generator().manual_seed(5)).numpy()
    store = SyntheticStore(s, truth, n, table_seed=6, touched=np.zeros(0, dtype=np.int64), block_rows=500)
    blocks = np.concatenate(list(store.chunks()))
    assert blocks.shape == once.shape
    se = np.sqrt(once.var(0) / n + blocks.var(0) / n) + 1e-12
    assert np.all(np.abs(once.mean(0) - blocks.mean(0)) < 6 * se)
    assert not np.array_equal(once, blocks)


def test_replicates_are_distributed_as_before_at_small_n() -> None:
    # Old path (one materialised table, coins drawn step by step) against run_replicate (streamed
    # table, coins drawn ahead) over 24 seeds each: the replicates' posterior means agree within
    # 5 standard errors per coordinate and their spreads within a factor 1.8.
    from dpsummary.bootstrap import ReplicateJob, run_replicate
    from dpsummary.private.mechanism import PrivateRecords

    s = _settings("logistic", steps=8)
    truth = torch.tensor([0.8, -0.5, 0.3, 0.1], dtype=torch.float64)
    old, new = [], []
    for seed in range(24):
        gen = torch.Generator().manual_seed(seed)
        table = synthetic_table(s, truth, 300, gen)
        from dpsummary.bootstrap import replay_mechanism

        old.append(replay_mechanism(s, truth, PrivateRecords(table, randomness=SimulationRandomness(
            np.random.default_rng(seed))), gen).mean)
        new.append(run_replicate(ReplicateJob(s, truth, 1000 + seed)).mean)
    a, b = torch.stack(old), torch.stack(new)
    se = torch.sqrt(a.var(0) / 24 + b.var(0) / 24)
    assert bool(((a.mean(0) - b.mean(0)).abs() < 5 * se).all())
    ratio = b.std(0) / a.std(0)
    assert bool(((ratio > 1 / 1.8) & (ratio < 1.8)).all())


def test_a_replicate_at_a_billion_records_never_builds_the_table(monkeypatch: pytest.MonkeyPatch) -> None:
    # Before issue 35 a replicate materialised round(N~) rows (here 10^9 x 5 float64 = 40 GB).
    # Now the largest table ever generated is one block, and the rows kept are the planned samples.
    import dpsummary.bootstrap as boot
    from dpsummary.bootstrap import ReplicateJob, run_replicate

    monkeypatch.setattr(boot, "SYNTHETIC_BLOCK_ROWS", 256)
    sizes: list[int] = []
    original = boot.synthetic_table

    def recording(st: MechanismSettings, truth: torch.Tensor, num: int, g: torch.Generator) -> torch.Tensor:
        sizes.append(num)
        return original(st, truth, num, g)

    monkeypatch.setattr(boot, "synthetic_table", recording)
    import dataclasses

    s = dataclasses.replace(_settings("logistic", steps=3), record_count=1e9, sample_rate=2e-7,
                            count_noise_multiplier=5.0)
    rep = run_replicate(ReplicateJob(s, torch.zeros(4, dtype=torch.float64), 7))
    assert bool(torch.isfinite(rep.mean).all())
    assert sizes and max(sizes) <= 256
    # Expected 3 x 200 sampled rows, each in its own block: about 600 blocks, never the 4e6 of a pass.
    assert 300 < len(sizes) < 1000
