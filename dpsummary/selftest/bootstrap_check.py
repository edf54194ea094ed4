"""DP-PSVI's parametric bootstrap never reads a record (``--bootstrap``). Registered by
:mod:`dpsummary.mechanisms.dp_psvi`."""

from __future__ import annotations

from dataclasses import dataclass

import torch

from ..private.mechanism import PrivateRecords


@dataclass(frozen=True)
class BootstrapCheckResult:
    """:func:`bootstrap_check`: DP-PSVI's parametric bootstrap (:mod:`dpsummary.bootstrap`) gives
    bit-identical output with the record store closed and with the records poisoned (NaN)."""

    replicates: int
    #: Reading the closed store raised (the check really ran with the records unreachable).
    store_closed: bool
    #: Calibrated summary and Gaussian identical after poisoning the records in place.
    identical: bool
    finite: bool

    @property
    def ok(self) -> bool:
        return self.store_closed and self.identical and self.finite


def bootstrap_check(*, replicates: int = 5, steps: int = 15) -> BootstrapCheckResult:
    """Run a small DP-PSVI release path (logistic, public schema, DP initialisation) on an
    in-memory table, CLOSE its record store, run the bootstrap (seeded, one process); then
    overwrite the table's memory with NaN and run it again. The bootstrap receives only the
    release's outputs and public settings, so both runs must agree bit for bit (any read of a
    record would raise on the closed store or spread NaN)."""
    from ..bootstrap import BootstrapConfig, MechanismSettings, ParametricBootstrap
    from ..constructors.base import fit
    from ..data import ColumnSpec, Schema, Transform
    from ..mechanisms.dp_psvi_setup import (
        dp_psvi_constructor,
        initial_samplers,
        plan_initialisation,
    )
    from ..models import LogisticRegression
    from ..private.noise import quantize_sample_rate

    schema = Schema(columns=[ColumnSpec(name="a", kind="numeric", lower=-1.0, upper=1.0),
                             ColumnSpec(name="b", kind="categorical", categories=["u", "v", "w"]),
                             ColumnSpec(name="y", kind="categorical", categories=["0", "1"], positive="1")],
                    target="y")
    tf = Transform.from_schema(schema)
    model = LogisticRegression(tf.num_features)
    gen = torch.Generator().manual_seed(11)
    n = 400
    table = model.simulate(torch.tensor([0.3, 1.0, -0.5, 0.0, 0.2], dtype=torch.float64), n, gen,
                           features=tf.sample_public_features(n, gen))
    q = quantize_sample_rate(0.2)
    init_sigma, layout, _ = plan_initialisation(tf, "logistic", prior_events=[], target_epsilon=0.5, delta=1e-5,
                                                accountant="rdp")
    records = PrivateRecords(table)
    try:
        start = initial_samplers(records, tf, layout, init_sigma)
        constructor = dp_psvi_constructor(transform=tf, model=model, noise_multiplier=2.0, sample_rate=q,
                                          record_count=float(n), steps=steps, num_samples=20,
                                          init_features=start.features, init_targets=start.targets)
        raw = fit(constructor, records, model, 5, generator=gen, transform=tf.to_dict())
    finally:
        records.close()
    try:
        records.noisy_marginals(layout, noise_multiplier=1.0)  # reads every record
        closed = False
    except Exception:
        closed = True
    settings = MechanismSettings(model=model, transform=tf, size=5, steps=steps, num_samples=20, noise_multiplier=2.0,
                                 sample_rate=q, record_count=float(n), init_noise_multiplier=init_sigma,
                                 init_layout=layout, init_marginals=start.marginals)
    config = BootstrapConfig(replicates=replicates, rounds=1, workers=1, seed=3)
    first = ParametricBootstrap(settings, config).fit(raw)
    table.fill_(float("nan"))  # poison every record in place
    second = ParametricBootstrap(settings, config).fit(raw)
    identical = (torch.equal(first.summary.points, second.summary.points)
                 and torch.equal(first.summary.weights, second.summary.weights)
                 and torch.equal(first.calibration.posterior.mean, second.calibration.posterior.mean)
                 and torch.equal(first.calibration.posterior.scale_tril, second.calibration.posterior.scale_tril))
    finite = bool(torch.isfinite(first.summary.points).all() and torch.isfinite(first.summary.weights).all())
    return BootstrapCheckResult(replicates, closed, identical, finite)
