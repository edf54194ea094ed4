"""Our R-hat and ESS against ArviZ's on the same draws (issue 48: to 1e-6), and the warnings."""

from __future__ import annotations

import numpy as np
import pytest

from dpsummary.sampling import diagnostics as D


def _draws(shape: tuple[int, int], seed: int, drift: float = 0.0) -> np.ndarray:
    rng = np.random.default_rng(seed)
    x = 0.1 * rng.standard_normal(shape).cumsum(1) + rng.standard_normal(shape)
    x[0] += drift
    return x


@pytest.mark.parametrize("shape", [(4, 1000), (2, 37), (1, 500), (4, 9), (3, 101)])
@pytest.mark.parametrize("drift", [0.0, 0.5])
def test_agrees_with_arviz(shape, drift):
    az = pytest.importorskip("arviz")
    x = _draws(shape, seed=shape[1], drift=drift)
    for ours, method in ((D.rhat, "rank"), (D.ess_bulk, "bulk"), (D.ess_tail, "tail")):
        theirs = float(np.asarray(az.rhat(x, method=method) if method == "rank" else az.ess(x, method=method)))
        a = ours(x)
        if np.isnan(theirs):
            assert np.isnan(a)
        else:
            assert a == pytest.approx(theirs, rel=1e-6, abs=1e-9), (ours.__name__, shape)


def test_ties_and_constants():
    az = pytest.importorskip("arviz")
    x = np.round(_draws((4, 200), seed=1), 1)  # many ties: average ranks
    assert D.rhat(x) == pytest.approx(float(az.rhat(x)), rel=1e-6)
    assert D.ess_bulk(x) == pytest.approx(float(az.ess(x)), rel=1e-6)
    assert D.ess(np.ones((2, 50))) == 100.0


def test_problems_name_the_failure_and_the_parameter():
    good = np.random.default_rng(0).standard_normal((4, 1000, 2))
    assert D.diagnose(good).problems(["a", "b"]) == []
    bad = good.copy()
    bad[0, :, 1] += 3.0  # one chain elsewhere in b
    probs = D.diagnose(bad, divergences=2).problems(["a", "b"])
    assert any(p.startswith("R-hat") and "(b)" in p for p in probs)
    assert "2 divergent transition(s)" in probs
    few = D.diagnose(good[:, :50])
    assert any("bulk ESS" in p for p in few.problems())
    one = D.diagnose(good[:1])
    assert "one chain" in one.problems()[0] and "nan" in one.summary()


def test_sample_warns_with_the_figures_and_the_fix():
    """A run whose diagnostics cannot pass (one chain: no R-hat) warns, naming the failed check and
    the fix; a default run of the same release does not."""
    import warnings

    from dpsummary.analyst import Release
    from dpsummary.constructors.base import Summary
    from dpsummary.models import from_spec
    from dpsummary.sampling import SamplingWarning

    rng = np.random.default_rng(0)
    x = rng.uniform(-1, 1, (20, 2))
    y = rng.uniform(0, 1, (20, 1))
    import torch

    rel = Release.from_summary(Summary(torch.as_tensor(np.hstack([x, y])), torch.full((20,), 5.0, dtype=torch.float64),
                                       from_spec({"name": "logistic", "num_features": 2}), "test"))
    with pytest.warns(SamplingWarning, match=r"one chain: R-hat needs at least 2 chains.*Fix: draw more"):
        rel.sample(40, seed=0, chains=1, num_warmup=100)
    with warnings.catch_warnings():
        warnings.simplefilter("error", SamplingWarning)
        rel.sample(1000, seed=0)
