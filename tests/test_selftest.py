"""The empirical privacy self-test (issue 7), in reduced form.

Statistical tolerances. Privacy noise is OS entropy, so these tests are randomised; each states
the probability that it gives a false result, all below 1e-4:

* the real mechanism is never reported above its claim: Clopper-Pearson validity with
  Bonferroni over the audits bounds that probability by alpha = 1e-5 for a correct
  implementation (exactly the property under test);
* each injected bug is reported above the claim: the failure probabilities come from the
  distribution of the lower bound for that bug and configuration, measured by simulating the
  same statistic, pilot threshold and bound 300 times (numbers next to each test); all are
  far below 1e-4 under a normal approximation, and no simulated repetition failed.

Runtime: about 30-60 s on 2 shared cores (numpy noise path for the bug sweeps, the product's
OpenDP noise for the real mechanism).
"""

from __future__ import annotations

import json
import math

import numpy as np
import pytest
import torch
from scipy import stats

from dpsummary import selftest as st
from dpsummary.private import noise

CLAIM = 2.0


def _cfg(**kw) -> st.SelfTestConfig:
    base = dict(epsilon=CLAIM, delta=1e-2, noise="numpy", one_run_canaries=0, replay=False, bnn=False)
    base.update(kw)
    return st.SelfTestConfig(**base)


# --------------------------------------------------------------------------- formulas


def test_clopper_pearson_and_epsilon_bound():
    # Zero successes: the one-sided upper bound is 1 - alpha^(1/n) exactly.
    assert st.clopper_pearson_upper(0, 1000, 0.05) == pytest.approx(1 - 0.05 ** (1 / 1000), rel=1e-9)
    assert st.clopper_pearson_upper(5, 5, 0.05) == 1.0
    # Coverage: the bound exceeds the true rate with probability >= 1 - alpha (exact check).
    n, p, a = 200, 0.03, 0.05
    ks = np.arange(n + 1)
    covered = np.array([st.clopper_pearson_upper(int(k), n, a) >= p for k in ks])
    assert float(stats.binom.pmf(ks, n, p)[covered].sum()) >= 1 - a
    lb, pfp, pfn = st.epsilon_lower_bound(0, 10_000, 3_000, 10_000, delta=1e-2, alpha=0.05)
    assert lb == pytest.approx(math.log((1 - 1e-2 - pfn) / pfp))
    assert st.epsilon_lower_bound(5_000, 10_000, 5_000, 10_000, delta=1e-2, alpha=0.05)[0] == 0.0


def test_one_run_bound():
    # Perfect guessing with delta = 0 reduces to p^r <= alpha, p = e^eps / (1 + e^eps).
    lb = st.one_run_epsilon_lower_bound(1000, 100, 100, delta=0.0, alpha=0.05)
    assert lb == pytest.approx(math.log(0.05 ** 0.01 / (1 - 0.05 ** 0.01)), abs=1e-3)
    # Coin-flip guesses give nothing; more correct guesses never give less.
    assert st.one_run_epsilon_lower_bound(1000, 200, 100, delta=1e-6, alpha=0.05) == 0.0
    vals = [st.one_run_epsilon_lower_bound(1000, 200, v, delta=1e-6, alpha=0.05) for v in (120, 150, 180)]
    assert vals == sorted(vals) and vals[-1] > 0
    # The delta term only ever raises the p-value.
    assert st.one_run_p_value(1000, 200, 150, 1.0, 1e-5) >= st.one_run_p_value(1000, 200, 150, 1.0, 0.0)


def test_dirac_score_is_the_likelihood_ratio():
    q, sigma = noise.quantize_sample_rate(0.1), 0.8
    u = np.linspace(-3, 4, 15)
    p0 = stats.norm.pdf(u, 0, sigma)
    p1 = (1 - q) * p0 + q * stats.norm.pdf(u, 1, sigma)
    assert np.allclose(st.dirac_score(u, sample_rate=q, noise_multiplier=sigma), np.log(p1 / p0))
    # swap: a shift of 2C around the centred background
    v = u + q * 10
    p1s = (1 - q) * stats.norm.pdf(v, 0, sigma) + q * stats.norm.pdf(v, 2, sigma)
    assert np.allclose(st.swap_score(u, sample_rate=q, noise_multiplier=sigma, background=10),
                       np.log(p1s / stats.norm.pdf(v, 0, sigma)))


# --------------------------------------------------------------------------- design and hooks


def test_canary_design_is_dirac_through_product_code():
    check = st.check_canary_design(st.Design(), k=16)
    assert check.ok
    # The mechanism clips at the kernel's effective clip: C minus OpenDP's rounding slack and the
    # float slack for sums over up to 2^41 records (issue 35), about 4.9e-4 C below C.
    from dpsummary.private.kernel import effective_clip

    assert check.canary_clipped_norm == pytest.approx(effective_clip(1.0, 32), abs=1e-9)
    assert 1.0 - 1e-3 <= check.canary_clipped_norm <= 1.0
    assert check.dirac_background_max_norm == 0.0 and check.cross_run_leak_max <= 1e-12


def test_histogram_canary_is_the_worst_case_through_product_code():
    # The canary adds 1 to one bin of every column; after the layout's scaling that moves the
    # noised vector by the sensitivity 1 (within the noise grid's slack), and the no-scale bug
    # by sqrt(columns).
    for columns in (1, 4, 9):
        layout, without, with_canary = st.histogram_design(columns, background=10)
        shift = layout.counts(with_canary) - layout.counts(without)
        assert sorted(set(shift.tolist())) == [0.0, 1.0] and shift.sum() == columns
        moved = float(np.linalg.norm(shift * layout.scale))
        # Below 1 by the float slack the count scale reserves (issue 35: 2^-52 (2^41 + 1), ~4.9e-4).
        assert 1.0 - 1e-3 <= moved <= 1.0
        bug = st.NoScaleLayout(layout.columns, layout.num_features)
        assert float(np.linalg.norm(shift * bug.scale)) == pytest.approx(math.sqrt(columns), rel=1e-3)
    with pytest.raises(ValueError, match="scenarios"):
        st.SelfTestConfig(scenarios=()).validated()


def test_injection_hooks_do_what_they_say():
    q = noise.quantize_sample_rate(0.1)
    fixed = st.FixedSizeRandomness(st.NumpyGaussianRandomness(), blocks=[(0, 11), (11, 21), (21, 121)])
    for _ in range(20):
        m = fixed.coins(121, q)
        assert (m[:11].sum(), m[11:21].sum(), m[21:].sum()) == (1, 1, 10)
    seeded = st.FixedSeedRandomness(st.NumpyGaussianRandomness(), block_dim=2)
    a = seeded.gaussian(np.zeros(6), noise_std=1.0, clip_norm=1.0)
    b = seeded.gaussian(np.zeros(6), noise_std=1.0, clip_norm=1.0)
    assert np.array_equal(a, b) and np.array_equal(a[:2], a[2:4])
    # no-clip keeps the noise standard deviation sigma * C: zero records, pure noise.
    records = st.NoClipRecords(torch.zeros(20, 3, dtype=torch.float64), randomness=st.NumpyGaussianRandomness())
    from dpsummary.models import GaussianMean

    draws = st.canary_draws(3)
    vals = np.stack([records.noisy_clipped_sum(GaussianMean(3), draws, sample_rate=q, clip_norm=0.5,
                                               noise_multiplier=2.0).numpy() for _ in range(300)])
    # variance ratio within 6 sd of chi2(k)/k: false failure < 1e-8
    assert abs(vals.var() / 1.0 - 1) < 6 * math.sqrt(2 / vals.size)


def test_gray_box_replay():
    r = st.gray_box_replay(steps=6)
    assert r.ok and r.calls == (6, 6) and r.shapes_equal and r.first_step_clip_equal
    assert r.first_step_delta <= r.first_step_clip + 1e-9 and r.lockstep_max_ratio <= 1 + 1e-9
    bad = st.gray_box_replay(steps=4, inject="no-clip")
    assert not bad.ok and bad.lockstep_max_ratio > 10


# --------------------------------------------------------------------------- the audits


def test_real_mechanism_never_exceeds_its_claim():
    # The product's own noise (OpenDP) and coins. alpha = 1e-5: a correct implementation is
    # reported above its claim with probability <= 1e-5 (Clopper-Pearson + Bonferroni).
    r = st.run_selftest(_cfg(noise="opendp", runs=1500, alpha=1e-5, one_run_canaries=200, replay=True))
    assert not r.violation, r.verdict
    assert all(a.epsilon_lower_bound <= r.claimed_epsilon for a in r.audits)
    assert r.one_run is not None and r.one_run.epsilon_lower_bound <= r.one_run.claimed_epsilon
    assert r.claimed_epsilon == pytest.approx(CLAIM, rel=1e-3) and r.claimed_epsilon <= CLAIM
    assert "OpenDP" in r.noise_path_audited and r.runs_per_second > 0
    # The initialisation histograms are audited too, calibrated on their own to the same claim.
    (hist,) = [a for a in r.audits if a.scenario == "histogram"]
    assert hist.mechanism == "noisy_marginals" and hist.claimed_epsilon <= CLAIM
    assert hist.claimed_epsilon == pytest.approx(CLAIM, rel=1e-3) and hist.noise_multiplier != r.noise_multiplier


def test_no_clip_is_detected():
    # Simulated (300 repetitions, this configuration): dirac lower bound mean 4.85, sd 0.51, min
    # 3.12 (claim 2), z = 5.6: failure probability ~1e-8 (normal approximation), below 1e-4. The
    # replay detects it deterministically.
    r = st.run_selftest(_cfg(inject="no-clip", runs=2000, scenarios=("dirac",), replay=True))
    assert r.audits[0].epsilon_lower_bound > CLAIM and r.violation
    assert r.replay is not None and not r.replay.ok


def test_half_noise_is_detected():
    # Simulated (300 repetitions): lower bound mean 3.90, sd 0.33, min 3.10 (claim 2), z = 5.8:
    # failure probability ~1e-8 (normal approximation), below 1e-4.
    r = st.run_selftest(_cfg(inject="half-noise", runs=10_000, scenarios=("dirac",)))
    assert r.audits[0].epsilon_lower_bound > CLAIM and r.violation


def test_fixed_size_sampling_is_detected():
    # Fixed-size batches accounted as Poisson, seen by the swap canary. Simulated (300
    # repetitions): lower bound mean 3.94, sd 0.34, min 2.99 (claim 2), z = 5.7: failure
    # probability ~1e-8 (normal approximation), below 1e-4.
    r = st.run_selftest(_cfg(inject="fixed-size", runs=10_000, scenarios=("swap",)))
    assert r.audits[0].epsilon_lower_bound > CLAIM and r.violation


def test_unscaled_histograms_are_detected():
    # The initialisation histograms without their 1/sqrt(columns) scaling: 9 columns move the
    # noised vector by 3 instead of 1. Simulated (300 repetitions, this configuration): histogram
    # lower bound mean 3.93, sd 0.32, min 3.07 (claim 2), z = 5.9: failure probability ~2e-9
    # (normal approximation), below 1e-4.
    r = st.run_selftest(_cfg(inject="no-scale", runs=2000, scenarios=("histogram",), histogram_columns=9))
    assert r.audits[0].scenario == "histogram" and r.audits[0].epsilon_lower_bound > CLAIM and r.violation


def test_fixed_seed_noise_is_detected():
    # Identical noise at every step and run: every run without the canary scores the same, so no
    # false positive is possible at the pilot threshold and eps_LB >= ln((1 - delta - pFN) / pFP)
    # with pFP = 1 - (alpha/2)^(1/1000) = 3.7e-3 and pFN ~ 0.35 (canary never sampled in 10
    # steps): about 5.1. Failure needs pFN > 0.99: probability < 1e-100.
    r = st.run_selftest(_cfg(inject="fixed-seed", runs=1000, scenarios=("dirac",)))
    assert r.audits[0].false_positives == 0
    assert r.audits[0].epsilon_lower_bound > CLAIM and r.violation


def test_cli_selftest_json_and_exit_codes():
    from typer.testing import CliRunner

    import dpsummary.cli.selftest  # noqa: F401  (registers the command)
    from dpsummary.cli import app

    runner = CliRunner()
    ok = runner.invoke(app, ["selftest", "--runs", "300", "--noise", "numpy", "--one-run-canaries", "0",
                             "--no-replay", "--alpha", "1e-5", "--json"])
    assert ok.exit_code == 0, ok.output
    data = json.loads(ok.stdout)
    assert data["violation"] is False and data["config"]["inject"] == "none"
    # The BNN mechanism's checks run by default (noise scale, accountant, replay).
    assert data["bnn"]["ok"] is True and data["bnn"]["replay"]["ok"] is True
    # fixed-seed with 500 runs: pFP <= 1 - 0.0125^(1/500) ~ 8.7e-3, LB ~ 4.2 > 2 (same argument
    # as above): exit code 1 with a plain-language verdict.
    bad = runner.invoke(app, ["selftest", "--runs", "500", "--noise", "numpy", "--one-run-canaries", "0",
                              "--no-replay", "--no-bnn", "--inject", "fixed-seed"])
    assert bad.exit_code == 1 and "VIOLATION DETECTED" in bad.stdout
    assert runner.invoke(app, ["selftest", "--runs", "5"]).exit_code == 2


def test_bnn_no_clip_bug_fails_the_selftest():
    """The no-clip bug in the BNN mechanism alone (white-box audits of the GLM sum skipped by a
    tiny run count would not see it): the BNN replay fails, so the self-test reports a violation.
    Deterministic (recorded randomness in the replay)."""
    r = st.bnn_checks(inject="no-clip")
    assert not r.ok and r.failed == ["gray-box replay"] and r.replay.lockstep_max_ratio > 10


def test_noise_aware_clipping_bug_is_detected():
    # The noise-aware mechanism's score release with clipping disabled at unchanged noise:
    # the canary (raw score 3.5x the bound) moves the release by 3.5 sensitivities instead of 1.
    # Measured (numpy noise, this configuration): lower bound 3.84 with the bug against a claim
    # of 2, and 1.32 without it; the bug's mean shift is 3.5x the clean one, so a bound below the
    # claim needs an FP/FN deviation of many binomial sds (failure rate well below 1e-4).
    r = st.run_selftest(_cfg(inject="no-clip", runs=2000, scenarios=("newton",)))
    assert r.audits[0].scenario == "newton" and r.audits[0].mechanism == "noisy_score_statistics"
    assert r.audits[0].epsilon_lower_bound > CLAIM and r.violation


def test_cells_half_noise_is_detected():
    # noise-aware-cells' one release with half its noise: the canary (at the largest design row,
    # target 5 clipped to 1) moves the release by 2 noise sds instead of 1. Simulated (numpy
    # noise, 4 repetitions at 20,000 runs per side): lower bound mean 3.42, sd 0.28, min 3.03
    # against a claim of 2 (1.18 without the bug at 4,000 runs): z ~ 5, failure rate ~1e-6
    # (normal approximation), below 1e-4.
    r = st.run_selftest(_cfg(inject="half-noise", runs=20_000, scenarios=("cells",)))
    assert r.audits[0].scenario == "cells" and r.audits[0].mechanism == "noisy_cell_statistics"
    assert r.audits[0].epsilon_lower_bound > CLAIM and r.violation


def test_range_canary_lands_in_one_bin_of_each_column_through_product_code():
    # The data-range histogram's canary (features (inf, -inf), a count that is not a number)
    # falls in exactly one bin of each of the two columns, the last, so after the layout's
    # 1/sqrt(2) scaling it moves the noised vector by the sensitivity 1 (within the noise grid's
    # slack), and the no-scale bug by sqrt(2).
    layout, without, with_canary = st.range_design(10)
    shift = layout.counts(with_canary) - layout.counts(without)
    assert sorted(set(shift.tolist())) == [0.0, 1.0] and shift.sum() == 2
    ends = np.cumsum([c.num_bins for c in layout.columns]) - 1
    assert shift[ends].tolist() == [1.0, 1.0]
    assert 1.0 - 1e-3 <= float(np.linalg.norm(shift * layout.scale)) <= 1.0
    bug = st.NoScaleLayout(layout.columns, layout.num_features)
    assert float(np.linalg.norm(shift * bug.scale)) == pytest.approx(math.sqrt(2), rel=1e-3)


def test_ranges_half_noise_is_detected():
    # The data-range histogram with half its noise: the canary moves the release by 2 noise sds
    # instead of 1. Simulated (numpy noise, 10 repetitions at 10,000 runs per side): lower bound
    # mean 3.25, sd 0.25, min 2.87 against a claim of 2 (mean 1.13, max 1.65 without the bug):
    # z ~ 5, failure rate ~3e-7 (normal approximation), below 1e-4. (The no-scale bug moves it by
    # only sqrt(2) with two columns: mean 2.02 at 20,000 runs, not reliably detected.)
    r = st.run_selftest(_cfg(inject="half-noise", runs=10_000, scenarios=("ranges",)))
    assert r.audits[0].scenario == "ranges" and r.audits[0].mechanism == "noisy_marginals"
    assert r.audits[0].epsilon_lower_bound > CLAIM and r.violation


def test_refuse_on_one_invalid_record_is_detected():
    # The removed behaviour (one invalid value refuses the release): with the canary the release
    # always refuses (score +inf), without it never, so the audit separates the two sides
    # perfectly: FP = FN = 0 and the Clopper-Pearson bound is ln((1 - delta) / pFP) with pFP =
    # 1 - (alpha/2)^(1/1000) ~ 3.7e-3: about 5.6 > claim 2, deterministically.
    r = st.run_selftest(_cfg(inject="refuse-invalid", runs=1000, scenarios=("quality",)))
    assert r.audits[0].scenario == "quality" and r.audits[0].false_negatives == 0
    assert r.audits[0].epsilon_lower_bound > CLAIM and r.violation


def test_quality_handling_without_the_bug_passes():
    # Clean: the canary adds 1 to each of the four counts (sensitivity 1 after scaling), so the
    # audit reports a violation with probability at most alpha = 1e-4 (its construction).
    r = st.run_selftest(_cfg(runs=2000, scenarios=("quality",), alpha=1e-4))
    assert not r.violation


def test_multiline_csv_reading_is_detected():
    # Issue 24's bug restored (a quoted field runs across lines): the unclosed quote after the
    # header swallows all 10 background records, so the exact count moves by 10 (a violation on
    # its own) and the noisy counts sit 10 apart, about 7.7 sigma at the claim's sigma (~1.3):
    # both sides separate (FP = FN = 0 up to a 1e-13 normal tail), so the bound is
    # ln((1 - delta) / pFP) with pFP = 1 - (alpha/2)^(1/1000): about 5.6 > claim 2.
    from dpsummary.data import BatchStream

    reader = BatchStream._csv
    r = st.run_selftest(_cfg(inject="multiline-csv", runs=1000, scenarios=("csv-lines",)))
    (audit,) = r.audits
    assert audit.scenario == "csv-lines" and audit.mechanism == "noisy_record_count"
    assert audit.sensitivity == st.Design().background
    assert audit.epsilon_lower_bound > CLAIM and r.violation
    assert BatchStream._csv is reader  # the product's reader is back


def test_csv_line_neighbours_without_the_bug_pass():
    # The product's reader: every line neighbour moves the exact count by at most one (the
    # bare CR inside a field keeps its record: exactly one), and the Gaussian count at the
    # claim's sigma is reported above its claim with probability at most alpha = 1e-4.
    r = st.run_selftest(_cfg(runs=2000, scenarios=("csv-lines",), alpha=1e-4))
    (audit,) = r.audits
    assert audit.sensitivity == 1.0 and not r.violation, r.verdict


def test_cli_selftest_injects_the_multiline_csv_reading():
    from typer.testing import CliRunner

    import dpsummary.cli.selftest  # noqa: F401  (registers the command)
    from dpsummary.cli import app

    bad = CliRunner().invoke(app, ["selftest", "--runs", "300", "--noise", "numpy", "--one-run-canaries", "0",
                                   "--no-replay", "--no-bnn", "--no-mixture", "--no-histogram", "--no-quality",
                                   "--no-newton", "--alpha", "1e-5", "--json", "--inject", "multiline-csv"])
    assert bad.exit_code == 1, bad.output
    data = json.loads(bad.stdout)
    (lines,) = [a for a in data["audits"] if a["scenario"] == "csv-lines"]
    assert lines["violation"] is True and lines["sensitivity"] == st.Design().background


def test_every_mechanism_registers_its_scenarios():
    """``selftest`` runs what the mechanisms register (issue 30): every registered mechanism has
    scenarios, every audit scenario of the configuration is registered by someone, and each
    result field is filled by exactly one registered scenario."""
    from dpsummary.mechanisms import REGISTRY

    registered = st.registered_scenarios()
    assert {s.mechanism for s in registered} == {*REGISTRY, "pipeline"}
    for name, mech in REGISTRY.items():
        assert mech.selftest_scenarios() and all(s.mechanism == name for s in mech.selftest_scenarios())
    everything = st.SelfTestConfig()
    for scenario in st.SCENARIOS:
        only = st.SelfTestConfig(scenarios=(scenario,), one_run_canaries=0, replay=False, bnn=False, mixture=False,
                                 bootstrap=False)
        chosen = [s for s in registered if s.enabled(only)]
        assert len(chosen) == 1 and chosen[0].slot == "audits", scenario
    slots = [s.slot for s in registered if s.enabled(everything) and s.slot != "audits"]
    assert sorted(slots) == sorted(["one_run", "replay", "bnn", "mixture", "bootstrap"])


def test_strict_utf8_decoding_of_parquet_is_detected():
    # Issue 35's bug restored (a Parquet string column's invalid UTF-8 raises): the canary side
    # always refuses (score +inf), D never, so the Parquet quality audit separates the sides
    # perfectly (FP = FN = 0): bound ln((1 - delta) / pFP), about 5.6 > claim 2, deterministically.
    r = st.run_selftest(_cfg(inject="strict-utf8", runs=1000, scenarios=("quality",)))
    by_name = {a.scenario: a for a in r.audits}
    assert set(by_name) == {"quality", "quality-parquet"}
    assert by_name["quality-parquet"].false_negatives == 0 and by_name["quality-parquet"].violation
    assert by_name["quality-parquet"].epsilon_lower_bound > CLAIM and r.violation
    assert not by_name["quality"].violation or by_name["quality"].epsilon_lower_bound <= CLAIM * 2
    from dpsummary.data import stream

    assert stream._decode_utf8.__name__ == "_decode_utf8"  # the product's decoder is back


def test_parquet_quality_handling_without_the_bug_passes():
    # Clean: the Parquet canary adds 1 to each of the four counts, like the CSV one; the audit
    # reports a violation with probability at most alpha = 1e-4 (its construction).
    r = st.run_selftest(_cfg(runs=2000, scenarios=("quality",), alpha=1e-4))
    assert [a.scenario for a in r.audits] == ["quality", "quality-parquet"] and not r.violation


def test_objective_perturbation_projection_bug_is_detected_and_the_product_passes():
    # noise-aware-objective's perturbed mode with the projection into the public ball disabled at
    # unchanged noise: the canary (x = 10, ten times the bound) pulls the mode ~7x harder.
    # Measured (numpy noise, 6 repetitions at 2,000 runs per side): lower bound mean 3.36, sd
    # 0.44, min 2.73 with the bug against a claim of 2; 0.42 (sd 0.16) without it. At 4,000 runs
    # the sd shrinks by about sqrt(2): z ~ 4.4, failure rate ~1e-5 (normal approximation).
    bug = st.run_selftest(_cfg(inject="no-clip", runs=4000, scenarios=("objective",)))
    (audit,) = [a for a in bug.audits if a.scenario == "objective"]
    assert audit.mechanism == "perturbed_mode" and audit.epsilon_lower_bound > CLAIM and bug.violation
    clean = st.run_selftest(_cfg(runs=4000, scenarios=("objective",)))
    (audit,) = [a for a in clean.audits if a.scenario == "objective"]
    assert audit.epsilon_lower_bound < CLAIM and not clean.violation
    # RDP only: another accountant does not select it.
    assert not [a for a in st.run_selftest(_cfg(runs=10, accountant="pld", scenarios=("objective",))).audits
                if a.scenario == "objective"]
