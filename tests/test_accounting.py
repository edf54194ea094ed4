"""Tests for dpsummary.accounting."""

from __future__ import annotations

import json

import dp_accounting as dpa
import numpy as np
import pytest

from dpsummary import accounting as A


def test_event_json_round_trip_and_stability():
    ev = dpa.ComposedDpEvent(
        [
            A.gaussian_event(3.0),
            A.subsampled_gaussian_event(1.0, 0.01, 500),
            dpa.NoOpDpEvent(),
            dpa.SelfComposedDpEvent(dpa.GaussianDpEvent(2), 3),
        ]
    )
    j = A.event_to_json(ev)
    text = json.dumps(j, sort_keys=True)
    back = A.event_from_json(json.loads(text))
    assert back == dpa.ComposedDpEvent(
        [
            A.gaussian_event(3.0),
            A.subsampled_gaussian_event(1.0, 0.01, 500),
            dpa.NoOpDpEvent(),
            dpa.SelfComposedDpEvent(dpa.GaussianDpEvent(2.0), 3),
        ]
    )
    assert json.dumps(A.event_to_json(back), sort_keys=True) == text
    assert j["class_name"] == "ComposedDpEvent"
    assert j["events"][1]["event"]["sampling_probability"] == 0.01


@pytest.mark.parametrize(
    "bad",
    [
        dpa.LaplaceDpEvent(1.0),
        dpa.PoissonSampledDpEvent(0.1, dpa.LaplaceDpEvent(1.0)),
        dpa.SampledWithReplacementDpEvent(100, 10, dpa.GaussianDpEvent(1.0)),
        dpa.ComposedDpEvent([dpa.GaussianDpEvent(1.0), dpa.NonPrivateDpEvent()]),
        dpa.GaussianDpEvent(0.0),
        dpa.PoissonSampledDpEvent(1.5, dpa.GaussianDpEvent(1.0)),
    ],
)
def test_unsupported_events_rejected(bad):
    with pytest.raises(A.UnsupportedEventError):
        A.event_to_json(bad)
    with pytest.raises(A.UnsupportedEventError):
        A.epsilon_rdp([bad], 1e-5)


@pytest.mark.parametrize(
    "bad_json",
    [
        {"module_name": "os", "class_name": "system"},
        {"module_name": "dp_accounting.dp_event", "class_name": "LaplaceDpEvent", "noise_multiplier": 1.0},
        {"module_name": "dp_accounting.dp_event", "class_name": "GaussianDpEvent"},
        {"module_name": "dp_accounting.dp_event", "class_name": "GaussianDpEvent", "noise_multiplier": "x"},
        {"module_name": "dp_accounting.dp_event", "class_name": "GaussianDpEvent", "noise_multiplier": 1.0, "x": 1},
        [],
    ],
)
def test_malformed_json_rejected(bad_json):
    with pytest.raises(A.UnsupportedEventError):
        A.event_from_json(bad_json)


def test_history_round_trip():
    hist = [(3.0, 1.0, 1), (1.2, 0.01, 500), (0.9, 0.02, 7)]
    assert A.events_to_history(A.history_to_events(hist)) == hist


def test_rdp_reproduces_opacus_stepped_accountant_exactly():
    from opacus.accountants import RDPAccountant

    acc = RDPAccountant()
    acc.step(noise_multiplier=4.0, sample_rate=1.0)  # DP count
    for _ in range(300):
        acc.step(noise_multiplier=1.1, sample_rate=0.01)
    for _ in range(200):  # second release, identical parameters: Opacus merges
        acc.step(noise_multiplier=1.1, sample_rate=0.01)
    expected = acc.get_epsilon(delta=1e-6, alphas=A.RDP_ORDERS)
    events = [
        A.gaussian_event(4.0),
        A.subsampled_gaussian_event(1.1, 0.01, 300),
        A.subsampled_gaussian_event(1.1, 0.01, 200),
    ]
    assert A.events_to_history(events) == acc.history
    assert A.epsilon_rdp_opacus(events, 1e-6) == expected  # bit for bit
    assert A.epsilon_rdp(events, 1e-6) == pytest.approx(expected, rel=1e-9, abs=0)  # vectorised


def test_composition_is_one_accountant_not_sum():
    r1 = [A.subsampled_gaussian_event(1.0, 0.01, 500)]
    r2 = [A.subsampled_gaussian_event(1.5, 0.02, 300)]
    e1, e2 = A.epsilon_rdp(r1, 1e-6), A.epsilon_rdp(r2, 1e-6)
    both = A.epsilon_rdp(r1 + r2, 1e-6)
    from opacus.accountants import RDPAccountant

    acc = RDPAccountant()
    acc.history = [(1.0, 0.01, 500), (1.5, 0.02, 300)]
    assert A.epsilon_rdp_opacus(r1 + r2, 1e-6) == acc.get_epsilon(delta=1e-6, alphas=A.RDP_ORDERS)
    assert both == pytest.approx(acc.get_epsilon(delta=1e-6, alphas=A.RDP_ORDERS), rel=1e-9, abs=0)
    assert max(e1, e2) < both < e1 + e2


# (q, sigma) grid for the vectorised RDP series: tiny to full sampling rates, noise from far below
# 1 (where Opacus's series overflows at high orders) to very large (where A_alpha - 1 cancels).
_RDP_GRID = [(q, s) for q in (1e-4, 0.004109, 0.0182, 0.05, 0.3, 0.7, 0.99, 1.0)
             for s in (0.3, 0.5, 0.7, 1.0, 2.7, 9.5, 50.0, 300.0)]


@pytest.mark.parametrize(("q", "sigma"), _RDP_GRID)
def test_vectorised_rdp_series_matches_opacus_per_order(q, sigma):
    import warnings

    from opacus.accountants.analysis import rdp as privacy_analysis

    fast = np.asarray(A._rdp_one_step_fast(q, sigma))
    with warnings.catch_warnings():
        warnings.simplefilter("ignore")
        ref = np.asarray(privacy_analysis.compute_rdp(q=q, noise_multiplier=sigma, steps=1, orders=A.RDP_ORDERS))
    # Same overflow behaviour: +inf where one series term overflows, NaN where several do.
    assert np.array_equal(np.isposinf(fast), np.isposinf(ref))
    assert np.array_equal(np.isnan(fast), np.isnan(ref))
    finite = np.isfinite(ref)
    # Near-zero orders are cancellations (log of 1 + tiny) in both: compare on an absolute scale.
    assert np.all(np.abs(fast[finite] - ref[finite]) <= 1e-12 * np.maximum(1.0, np.abs(ref[finite])))


@pytest.mark.parametrize(("q", "sigma"), _RDP_GRID)
@pytest.mark.parametrize("steps", [1, 500, 100_000])
def test_vectorised_rdp_epsilon_matches_opacus(q, sigma, steps):
    for delta in (1e-5, 1e-9):
        ev = [A.gaussian_event(3.0), A.subsampled_gaussian_event(sigma, q, steps)]
        exact = A.epsilon_rdp_opacus(ev, delta)
        assert A.epsilon_rdp(ev, delta) == pytest.approx(exact, rel=1e-9, abs=0)


@pytest.mark.parametrize(("target", "q", "steps"), [(0.2, 0.004109, 500), (1.0, 0.0182, 500), (8.0, 0.3, 50)])
def test_calibrated_sigma_meets_target_under_opacus_itself(target, q, steps):
    prior = [A.gaussian_event(200.0)]
    sigma = A.calibrate_noise_multiplier(target_epsilon=target, delta=1e-7, sample_rate=q, steps=steps,
                                         prior_events=prior)
    exact = A.epsilon_rdp_opacus([*prior, A.subsampled_gaussian_event(sigma, q, steps)], 1e-7)
    assert exact <= target
    # ... and it is the smallest such sigma to the calibration tolerance.
    smaller = A.epsilon_rdp_opacus([*prior, A.subsampled_gaussian_event(sigma * (1 - 2e-4), q, steps)], 1e-7)
    assert smaller > target


def test_tight_accountants_below_rdp():
    ev = [A.subsampled_gaussian_event(1.0, 0.01, 500)]
    eps = A.epsilons(ev, 1e-6)
    assert eps["pld"] <= eps["rdp"]
    assert eps["prv"] <= eps["rdp"]
    # PLD and PRV are independent implementations of near-tight accounting: they agree closely.
    assert abs(eps["pld"] - eps["prv"]) < 0.02 * eps["rdp"]


def test_plain_gaussian_matches_analytic():
    # Balle & Wang analytic Gaussian via dp_accounting
    exact = dpa.get_epsilon_gaussian(3.0, 1e-5)
    assert A.epsilon_pld([A.gaussian_event(3.0)], 1e-5) == pytest.approx(exact, rel=1e-3)
    assert exact <= A.epsilon_prv([A.gaussian_event(3.0)], 1e-5) <= exact + 2 * A.PRV_EPS_ERROR
    assert A.epsilon_rdp([A.gaussian_event(3.0)], 1e-5) >= exact


def test_extended_orders_beat_default_grid():
    # Notes: q=0.1, T=500, delta=1e-5, target 0.2: default grid binds at its largest order.
    from opacus.accountants import RDPAccountant

    acc = RDPAccountant()
    acc.history = [(42.5, 0.1, 500)]
    with pytest.warns(UserWarning):
        default_eps = acc.get_epsilon(delta=1e-5)
    ext = A.epsilon_rdp([A.subsampled_gaussian_event(42.5, 0.1, 500)], 1e-5)
    assert ext < default_eps
    assert A.rdp_optimal_order([A.subsampled_gaussian_event(42.5, 0.1, 500)], 1e-5) > 63
    sigma = A.calibrate_noise_multiplier(
        target_epsilon=0.2, delta=1e-5, sample_rate=0.1, steps=500
    )
    # Opacus's coarse search reports 42.5 (default grid) / 41.25 (orders to 2048); the fine
    # bisection with the extended grid does better than both.
    assert sigma < 41.25


@pytest.mark.parametrize("accountant", ["rdp", "pld"])
def test_calibration_within_tolerance(accountant):
    rel_tol = 1e-4 if accountant == "rdp" else 1e-3
    kw = dict(target_epsilon=0.5, delta=1e-6, sample_rate=0.01, steps=200)
    sigma = A.calibrate_noise_multiplier(**kw, accountant=accountant, rel_tol=rel_tol)
    ev = lambda s: [A.subsampled_gaussian_event(s, 0.01, 200)]  # noqa: E731
    assert A.epsilon(ev(sigma), 1e-6, accountant) <= 0.5
    assert A.epsilon(ev(sigma * (1 - 2 * rel_tol)), 1e-6, accountant) > 0.5


def test_calibration_with_prior_events_and_budget_split():
    delta = 1e-6
    s_count = A.calibrate_gaussian(target_epsilon=0.02, delta=delta)
    count = [A.gaussian_event(s_count)]
    assert A.epsilon_rdp(count, delta) <= 0.02
    s_pre = A.calibrate_gaussian(target_epsilon=0.05, delta=delta, prior_events=count)
    pre = [*count, A.gaussian_event(s_pre)]
    assert A.epsilon_rdp(pre, delta) <= 0.05
    s_opt = A.calibrate_noise_multiplier(
        target_epsilon=0.2, delta=delta, sample_rate=0.01, steps=300, prior_events=pre
    )
    total = A.epsilon_rdp([*pre, A.subsampled_gaussian_event(s_opt, 0.01, 300)], delta)
    assert 0.2 * (1 - 1e-3) < total <= 0.2


def test_calibration_impossible():
    with pytest.raises(ValueError, match="already spend"):
        A.calibrate_gaussian(
            target_epsilon=0.1, delta=1e-6, prior_events=[A.gaussian_event(1.0)]
        )
    with pytest.raises(ValueError, match="noise multiplier >"):
        A.calibrate_noise_multiplier(
            target_epsilon=1e-9, delta=1e-12, sample_rate=1.0, steps=10**6
        )


def test_versions():
    v = A.accountant_versions()
    assert v["opacus"].startswith("1.6") and v["dp-accounting"].startswith("0.6")


def test_composed_epsilon_adds_selection_slack():
    import math

    events = [A.subsampled_gaussian_event(1.0, 0.01, 100)]
    base = A.epsilon(events, 5e-7, "rdp")
    assert A.composed_epsilon(events, delta=5e-7) == base  # no extra delta: no slack
    x = 1e-7
    got = A.composed_epsilon(events, delta=5e-7, extra_delta=x, accountant="rdp")
    # Bit-identical to the release claim's formula (epsilon - log1p(-delta_selection)).
    assert got == base - math.log1p(-x)
    assert got > base
    # A source's several extra deltas: summed in order, the single-delta form is the same float.
    assert A.composed_epsilon(events, delta=5e-7, extra_deltas=[x]) == got
    assert A.composed_epsilon(events, delta=5e-7, extra_deltas=[x, 2e-7]) == pytest.approx(
        base - math.log1p(-x) - math.log1p(-2e-7), rel=1e-15)
    assert A.selection_slack([]) == 0.0
    for bad in (-1e-9, 1.0, 2.0):
        with pytest.raises(ValueError):
            A.composed_epsilon(events, delta=5e-7, extra_delta=bad)


def test_prv_without_opacus_package_import_matches_opacus_prv_accountant() -> None:
    """The release loads Opacus's PRV accountant without ``import opacus`` (issue 29: 0.65 s of
    import and 0.3 s of shutdown); its epsilons must be Opacus's own PRVAccountant's, bit for bit,
    for plain and Poisson-subsampled Gaussians, and the RDP route must agree too."""
    import subprocess
    import sys

    code = (
        "import sys, warnings\n"
        "from dpsummary import accounting as acc\n"
        "cases = [([acc.gaussian_event(s) for s in (294.39, 172.09, 126.34, 146.7, 103.73, 46.39)], 9e-12),\n"
        "         ([acc.subsampled_gaussian_event(1.1, 0.01, 300), acc.gaussian_event(5.0)], 1e-6),\n"
        "         ([acc.subsampled_gaussian_event(0.8, 0.02, 1000)], 1e-5)]\n"
        "got = [acc.epsilon(ev, d, 'prv') for ev, d in cases]\n"
        "rdp = [acc.epsilon_rdp_opacus(ev, d) for ev, d in cases]\n"
        "print('opacus' in sys.modules)\n"
        "from opacus.accountants import PRVAccountant\n"
        "warnings.simplefilter('ignore')\n"
        "from threadpoolctl import threadpool_limits\n"
        "ref = []\n"
        "for ev, d in cases:\n"
        "    a = PRVAccountant(); a.history = acc.events_to_history(ev)\n"
        "    with threadpool_limits(limits=1):  # as dpsummary computes it, whatever the machine's threads\n"
        "        ref.append(a.get_epsilon(delta=d, eps_error=acc.PRV_EPS_ERROR, delta_error=d * acc.PRV_DELTA_ERROR_FRACTION))\n"
        "print(got == ref and all(g > 0 for g in got))\n"
        "from opacus.accountants import RDPAccountant\n"
        "def opacus_rdp(ev, d):\n"
        "    a = RDPAccountant(); a.history = acc.events_to_history(ev)\n"
        "    return a.get_privacy_spent(delta=d, alphas=acc.RDP_ORDERS)[0]\n"
        "print(rdp == [opacus_rdp(ev, d) for ev, d in cases])\n"
    )
    out = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, check=True).stdout.split()
    assert out == ["False", "True", "True"]


def test_standalone_opacus_rdp_module_matches_opacus_and_skips_its_package_import() -> None:
    """The release loads Opacus's RDP analysis file without ``import opacus`` (0.85 s); the
    numbers must be those of Opacus's own module, bit for bit."""
    import subprocess
    import sys

    code = (
        "import sys\n"
        "from dpsummary import accounting as acc\n"
        "ev = [acc.subsampled_gaussian_event(1.1, 0.01, 300)]\n"
        "a = acc.epsilon(ev, 1e-6, accountant='rdp')\n"
        "b = acc._rdp_one_step(0.01, 1.1)\n"
        "print('opacus' in sys.modules)\n"
        "import opacus.accountants.analysis.rdp as real\n"
        "import numpy as np\n"
        "c = real.compute_rdp(q=0.01, noise_multiplier=1.1, steps=1, orders=acc.RDP_ORDERS)\n"
        "print(repr(a)); print(np.array_equal(b, c, equal_nan=True))\n"
    )
    out = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, check=True).stdout.split()
    assert out[0] == "False"
    assert out[2] == "True"
    from dpsummary import accounting as acc

    assert float(out[1]) == acc.epsilon([acc.subsampled_gaussian_event(1.1, 0.01, 300)], 1e-6, accountant="rdp")


def test_accountant_worker_answers_the_in_process_floats_and_falls_back_when_gone() -> None:
    """The PRV/PLD worker process (issue 29) returns exactly the floats this process computes
    (JSON carries them exactly); once it is gone, ``epsilon`` answers None and the caller
    computes in process."""
    history = [(294.390625, 1.0, 1), (172.09375, 1.0, 1), (126.3359375, 1.0, 1), (146.69828782073816, 1.0, 2),
               (1.1, 0.01, 300)]
    worker = A._AccountantWorker()
    try:
        for accountant, delta in (("prv", 9e-12), ("pld", 9e-12), ("prv", 1e-6), ("pld", 1e-5)):
            assert worker.epsilon(accountant, history, delta) == A._in_process(accountant, history, delta)
        assert worker.epsilon("rdp", history, 1e-6) is None  # only prv and pld: an error answer
    finally:
        worker.close()
    worker._proc.wait(timeout=30)  # closing stdin ends its loop
    assert worker._proc.returncode == 0
    assert worker.epsilon("prv", history, 1e-6) is None


def test_epsilon_uses_a_started_worker_with_identical_results(monkeypatch: pytest.MonkeyPatch) -> None:
    events = [A.gaussian_event(s) for s in (294.39, 172.09, 126.34, 146.7, 103.73, 46.39)]
    expected = {a: A.epsilon(events, 9e-12, a) for a in ("prv", "pld")}
    asked: list[str] = []
    worker = A._AccountantWorker()
    real = worker.epsilon

    def counting(accountant: str, history: list, delta: float) -> float | None:
        asked.append(accountant)
        return real(accountant, history, delta)

    monkeypatch.setattr(worker, "epsilon", counting)
    monkeypatch.setattr(A, "_WORKER", worker)
    try:
        assert {a: A.epsilon(events, 9e-12, a) for a in ("prv", "pld")} == expected
    finally:
        worker.close()
    assert asked == ["prv", "pld"]


# ---- budget parts: the Gaussian's exact privacy profile (issue 37) ----------------------------
def test_part_calibration_is_the_exact_gaussian_profile_and_agrees_with_pld():
    from dp_accounting import dp_event as dpe

    from dpsummary import accounting as acc

    # The NAPSU-MQ problem's record-count share at epsilon 0.1 (delta 5e-10): RDP cannot certify
    # it at any noise; the exact profile gives the multiplier PLD gives, up to PLD's discretisation.
    with pytest.raises(ValueError):
        acc.calibrate_gaussian(target_epsilon=0.00588, delta=5e-10, accountant="rdp")
    sigma = acc.calibrate_part(target_epsilon=0.00588, delta=5e-10)
    assert sigma == pytest.approx(acc.calibrate_gaussian(target_epsilon=0.00588, delta=5e-10, accountant="pld"),
                                  rel=2e-3)
    # Smallest such multiplier: delta met at sigma, not at a slightly smaller one.
    assert acc.gaussian_delta(sigma, 0.00588) <= 5e-10 < acc.gaussian_delta(sigma * (1 - 1e-6), 0.00588)
    # Cumulative shares with prior parts: the composition meets the cumulative target (PLD,
    # pessimistic, within its discretisation) and the prior's multiplier is kept.
    first = acc.calibrate_part(target_epsilon=0.02, delta=1e-11)
    second = acc.calibrate_part(target_epsilon=0.05, delta=1e-11, prior_events=[dpe.GaussianDpEvent(first)])
    composed = acc.epsilon([dpe.GaussianDpEvent(first), dpe.GaussianDpEvent(second)], 1e-11, "pld")
    assert composed == pytest.approx(0.05, rel=1e-3)
    combined = (first**-2 + second**-2) ** -0.5
    assert acc.gaussian_delta(combined, 0.05) <= 1e-11


def test_part_calibration_refuses_what_it_cannot_compose():
    from dp_accounting import dp_event as dpe

    from dpsummary import accounting as acc

    with pytest.raises(TypeError):
        acc.calibrate_part(target_epsilon=0.1, delta=1e-9,
                           prior_events=[dpe.PoissonSampledDpEvent(0.1, dpe.GaussianDpEvent(1.0))])
    with pytest.raises(ValueError, match="already spend"):
        acc.calibrate_part(target_epsilon=0.1, delta=1e-9, prior_events=[dpe.GaussianDpEvent(1.0)])
    with pytest.raises(ValueError):
        acc.calibrate_part(target_epsilon=0.0, delta=1e-9)


def test_a_split_gaussian_is_calibrated_as_the_one_gaussian_it_composes_to() -> None:
    """Shares 0.05 / 0.95 of one Gaussian (the cells' count histogram and cells): the split's
    sigma is the single Gaussian's (within the re-check's nudges) and its events meet the target."""
    import math as m

    prior = [A.gaussian_event(40.0)]
    target, delta = 1.0, 1e-6
    single = A.calibrate_gaussian(target_epsilon=target, delta=delta, prior_events=prior)
    sigma, events = A.calibrate_split_gaussian(
        lambda s: [A.gaussian_event(s / m.sqrt(0.05)), A.gaussian_event(s / m.sqrt(0.95))],
        target_epsilon=target, delta=delta, prior_events=prior)
    assert len(events) == 2 and single <= sigma <= single * (1 + 1e-3)
    assert A.epsilon([*prior, *events], delta, "rdp") <= target * (1 + 1e-6)
