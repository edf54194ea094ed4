"""Empirical privacy self-test: does the implementation leak more than the accountant claims?

Proofs cover the algorithm; bugs live in the code. This package runs the product's own mechanism
(:meth:`dpsummary.private.mechanism.PrivateRecords.noisy_clipped_sum`: its Poisson coins, its
clipping, its OpenDP noise) on neighbouring data sets D and D + canary many times and derives a
statistically valid *lower* bound on epsilon. A lower bound above the accountant's epsilon proves
a violation; a lower bound below it proves nothing about privacy (it only shows that the audit
found no gross implementation bug). See ``docs/SELFTEST.md``.

Audits
------
1. White-box Clopper-Pearson audit (Jagielski, Ullman, Oprea 2020; Nasr et al. 2021, 2023).
   Two canary designs, each a pair (D, D + canary) fixed before any run:

   * ``dirac``: the other records' centred log-likelihood vectors are exactly zero, the canary's
     clipped vector has norm exactly C in a fixed direction c (verified numerically by
     :func:`check_canary_design`). This is the worst case of add/remove adjacency for the
     subsampled Gaussian mechanism; the Neyman-Pearson optimal statistic is the log-likelihood
     ratio summed over the T steps (:func:`dirac_score`).
   * ``swap``: the other records point in the opposite direction -c with norm C. Under correct
     Poisson sampling the canary's inclusion is independent of theirs; under fixed-size batches
     the canary *displaces* a record, the projection moves by 2C and the audit sees it
     (:func:`swap_score`).

   Each run is scored, a threshold is chosen on separate pilot runs, and the false-positive and
   false-negative counts of the main runs give Clopper-Pearson upper bounds pFP, pFN and

       eps_LB = max( ln((1 - delta - pFN) / pFP), ln((1 - delta - pFP) / pFN) ),

   valid with probability >= 1 - alpha whenever the mechanism is (eps, delta)-DP.

2. One-run audit (Steinke, Nasr, Jagielski 2023): m canaries, each included with probability
   1/2 in ONE data set, one execution of T steps; the auditor guesses membership for the k
   highest and k lowest scores (k from a small grid, Bonferroni-corrected), and
   :func:`one_run_epsilon_lower_bound` turns v correct out of r guesses into a lower bound.

   A third scenario, ``histogram``, audits the other mechanism a release runs on private
   records, :meth:`PrivateRecords.noisy_marginals` (DP-PSVI's initialisation histograms), with
   the same Clopper-Pearson machinery and its own calibration (one Gaussian mechanism at the
   claimed epsilon): D has records in category 0 of every column, the canary sits in category 1
   of every column, the worst case of add/remove (:func:`histogram_audit`).

   A fourth scenario, ``quality``, audits the release's handling of invalid records: the total
   per-record rules and the noisy data-quality counts (:func:`quality_audit`). D is a clean CSV; the
   canary is one record that every rule touches (undecodable bytes in a numeric field, an unseen
   category, a missing target). The audited path is the product's own: the pyarrow reader, the
   total encoding and ``noisy_quality_counts``; the observation is "refused" or the noisy counts.
   A release that refused on a single invalid record (injected bug ``refuse-invalid``, the old
   behaviour) is distinguishable with certainty and the lower bound exceeds any claim.

   A fifth scenario, ``csv-lines``, audits the record count under the CSV line neighbours of
   issue 24 (an unclosed quote after the header, in the middle and on the last line, a lone
   quote, a quoted newline, a bare CR; :func:`csv_lines_audit`): the product's reader must move
   the exact count by at most one, and the noisy count is audited against the neighbour that
   moved it most. The injected bug ``multiline-csv`` (a quoted field may run across lines, the
   old reading) swallows every record after an unclosed quote: detected with certainty.

   A sixth scenario, ``ranges``, audits the data-range histogram of the default mechanisms
   (the count's and the feature norm's clip bounds, the same :meth:`PrivateRecords.noisy_marginals`
   on their own layout): the canary's features are infinite and its count is not a number, the
   values the per-record binning must still put in exactly one bin of each column
   (:func:`ranges_audit`).

3. Gray-box replay (Cebere et al. 2026): the full DP-PSVI constructor on D and D + canary with
   identical (recorded, non-private) randomness: same control flow, same shapes, and the
   pre-noise sum moves by at most C (:func:`gray_box_replay`).

4. The BNN mechanism (``dp-bb-psvi``, :mod:`dpsummary.private.bnn`; :func:`bnn_checks`): the
   released noise's standard deviation against the analytic ``sigma * C`` through the release
   path (noise pool included), the accountant's epsilon for its events reproduced by Opacus's
   own RDP accountant, and the gray-box replay of the full private BB-PSVI loop on D and
   D + canary in sensitivity units (:func:`bnn_gray_box_replay`, the same verdict as 3).

Batching runs
-------------
A run is T calls of ``noisy_clipped_sum``. To make tens of thousands of runs affordable, K runs
share one call: the model is :class:`~dpsummary.models.GaussianMean` in K dimensions and the S = 2K
posterior draws are ``+e_j, -e_j``; a record ``x * e_j`` then has the centred log-likelihood
vector ``x * (e_{2j} - e_{2j+1})``, non-zero only in run j's two coordinates. Because the
product's coins are independent per record and its noise independent per coordinate, the
output's coordinates (2j, 2j+1) are distributed exactly as one run of the mechanism on run j's
records alone (cross-run leakage is floating-point rounding, checked to be below 1e-12 C).

Noise paths
-----------
``noise="opendp"`` (default) audits the product's noise (:class:`SystemRandomness`: OS-entropy
coins and OpenDP's discrete Gaussian). ``noise="numpy"`` keeps the product's coins, clipping and
mechanism code but replaces the noise by a vectorised numpy Gaussian (PCG64 seeded from OS
entropy), several times faster; results say which path was audited.

Bug injection
-------------
``inject`` replaces one piece of the product by a known bug, everything else unchanged:
``no-clip`` (:class:`NoClipRecords`), ``half-noise`` (:class:`HalfNoiseRandomness`),
``fixed-size`` (:class:`FixedSizeRandomness`: exactly round(qn) records per step, still
accounted as Poisson), ``fixed-seed`` (:class:`FixedSeedRandomness`: noise from a generator
re-seeded with one constant seed at every call) and ``no-scale`` (:class:`NoScaleLayout`: the
initialisation histograms forget their 1/sqrt(columns) scaling), ``refuse-invalid`` (the
release refuses when one record has an invalid value, the behaviour issue 13 removed) and
``multiline-csv`` (:func:`_multiline_csv`: a quoted CSV field runs across lines, the reading
issue 24 removed).

Layout
------
One module per concern. Each scenario is registered where the code it audits lives (a
:class:`~dpsummary.selftest.config.SelftestScenario`, returned by each mechanism's
``selftest_scenarios()`` in :mod:`dpsummary.mechanisms`), and :mod:`~dpsummary.selftest.driver`
runs the ones a configuration selects:

* ``statistics``: the lower bounds and canary scores (pure functions);
* ``randomness``: the injected bugs and the fast noise path;
* ``config``: configuration, result records, the scenario registration record;
* ``canaries``: the batched canary designs and their check through the product's code;
* ``audits``: the Clopper-Pearson audit shared by the single-mechanism scenarios;
* ``noisy_sum`` (DP-PSVI: dirac, swap, one-run, histogram), ``replay`` (DP-PSVI's gray-box
  replay, local and Spark), ``bootstrap_check`` (DP-PSVI's bootstrap reads no record),
  ``newton`` (noise-aware-newton), ``cells`` (noise-aware-cells), ``bnn`` (dp-bb-psvi), ``mixture`` (dp-kd-tree);
* ``records``: the pipeline's own record handling (quality counts, CSV line neighbours);
* ``driver``: :func:`run_selftest` and the verdict.

This ``__init__`` re-exports the public names, so ``dpsummary.selftest.X`` keeps working.
"""

from __future__ import annotations

from .bnn import (
    BNNCheckResult,
    bnn_checks,
    bnn_gray_box_replay,
    bnn_noise_check,
)
from .bootstrap_check import (
    BootstrapCheckResult,
    bootstrap_check,
)
from .canaries import (
    CanaryCheck,
    canary_draws,
    check_canary_design,
    histogram_design,
)
from .cells import cells_audit, cells_design
from .config import (
    CERTIFIES,
    DOES_NOT_CERTIFY,
    SCENARIOS,
    SUM_SCENARIOS,
    AuditContext,
    AuditResult,
    Design,
    MechanismChecks,
    OneRunResult,
    Progress,
    ReplayResult,
    Scenario,
    SelfTestConfig,
    SelftestScenario,
)
from .driver import (
    PIPELINE_SCENARIOS,
    SelfTestResult,
    registered_scenarios,
    run_selftest,
)
from .mixture import (
    MixtureCheckResult,
    mixture_checks,
)
from .newton import (
    newton_audit,
    newton_design,
)
from .noisy_sum import (
    histogram_audit,
    one_run_audit,
    sum_audits,
)
from .randomness import (
    INJECTIONS,
    NOISE_PATHS,
    FixedSeedRandomness,
    FixedSizeRandomness,
    HalfNoiseRandomness,
    Injection,
    NoClipRecords,
    NoisePath,
    NoScaleLayout,
    NumpyGaussianRandomness,
    base_randomness,
    make_mechanism,
)
from .ranges import range_design, ranges_audit
from .records import (
    CSV_LINE_NEIGHBOURS,
    QUALITY_CANARY,
    QUALITY_SCHEMA,
    csv_line_design,
    csv_lines_audit,
    quality_audit,
    quality_design,
    quality_outcome,
)
from .replay import (
    REPLAY_NOISE_MULTIPLIER,
    ReplayRandomness,
    gray_box_replay,
    spark_gray_box_replay,
)
from .statistics import (
    choose_threshold,
    clopper_pearson_upper,
    dirac_score,
    epsilon_lower_bound,
    error_counts,
    one_run_epsilon_lower_bound,
    one_run_p_value,
    swap_score,
)

__all__ = [
    "AuditContext",
    "AuditResult",
    "BNNCheckResult",
    "BootstrapCheckResult",
    "CERTIFIES",
    "CSV_LINE_NEIGHBOURS",
    "CanaryCheck",
    "DOES_NOT_CERTIFY",
    "Design",
    "FixedSeedRandomness",
    "FixedSizeRandomness",
    "HalfNoiseRandomness",
    "INJECTIONS",
    "Injection",
    "MechanismChecks",
    "MixtureCheckResult",
    "NOISE_PATHS",
    "NoClipRecords",
    "NoScaleLayout",
    "NoisePath",
    "NumpyGaussianRandomness",
    "OneRunResult",
    "PIPELINE_SCENARIOS",
    "Progress",
    "QUALITY_CANARY",
    "QUALITY_SCHEMA",
    "REPLAY_NOISE_MULTIPLIER",
    "ReplayRandomness",
    "ReplayResult",
    "SCENARIOS",
    "SUM_SCENARIOS",
    "Scenario",
    "SelfTestConfig",
    "SelfTestResult",
    "SelftestScenario",
    "base_randomness",
    "bnn_checks",
    "bnn_gray_box_replay",
    "bnn_noise_check",
    "bootstrap_check",
    "canary_draws",
    "check_canary_design",
    "choose_threshold",
    "clopper_pearson_upper",
    "csv_line_design",
    "csv_lines_audit",
    "dirac_score",
    "epsilon_lower_bound",
    "error_counts",
    "gray_box_replay",
    "histogram_audit",
    "histogram_design",
    "make_mechanism",
    "mixture_checks",
    "cells_audit",
    "cells_design",
    "newton_audit",
    "newton_design",
    "one_run_audit",
    "one_run_epsilon_lower_bound",
    "one_run_p_value",
    "quality_audit",
    "quality_design",
    "quality_outcome",
    "range_design",
    "ranges_audit",
    "registered_scenarios",
    "run_selftest",
    "spark_gray_box_replay",
    "sum_audits",
    "swap_score",
]
