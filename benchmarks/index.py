"""BENCHMARKS.md: one short section per benchmark, generated from ``benchmarks/results/``.

Each section says the benchmark's question, the command that produces its results, its latest
headline (a few rows of its results table, read from the results file at generation time, or a
plot) and links to its full results. Nothing here is typed in by hand except the questions and
commands: a re-run of a benchmark changes its section on the next ``python benchmarks/run.py
--report-only``. The lab notebook (``benchmarks/notebook/``) is not a result and is not indexed.
"""

from __future__ import annotations

import dataclasses
import os
import re
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]


@dataclasses.dataclass(frozen=True)
class Headline:
    """Which rows of a results page make the headline: the first Markdown table in ``page``
    after the first line containing ``after`` (the page's start when empty), its rows containing
    ``grep`` (all when empty), at most ``rows`` of them, columns ``cols`` (all when empty)."""

    page: str
    after: str = ""
    rows: int = 4
    cols: tuple[int, ...] = ()
    grep: str = ""
    #: Instead of a table, the first ``rows`` bullet lines after ``after``.
    bullets: bool = False


@dataclasses.dataclass(frozen=True)
class Benchmark:
    title: str
    question: str
    command: str
    results: tuple[str, ...]
    headline: Headline | None = None
    plot: str = ""
    #: Generated headline lines, for benchmarks whose headline is computed (the calibration suite).
    special: str = ""


BENCHMARKS: tuple[Benchmark, ...] = (
    Benchmark("Calibration suite", "Can an analyst believe a release's 95% intervals on real tables? Every run is a "
              "real release judged against the full-data posterior and the idealised floor "
              "([docs/CALIBRATION.md](docs/CALIBRATION.md)).",
              "python benchmarks/calibration.py run --out benchmarks/results/calibration.csv; "
              "python benchmarks/calibration.py report ...; python benchmarks/headline.py; "
              "python benchmarks/refusal_reasons.py (the refused cells' measured reasons); "
              "python benchmarks/frontier.py --out benchmarks/results/frontier.md (the dishonest cells' frontier); "
              "python benchmarks/frontier.py --out benchmarks/results/frontier_wide.md --wide 2 --releases 1 --no-bias "
              "(where the width of honest cells wider than 2x the floor goes)",
              ("calibration.md", "calibration_dppsvi.md", "calibration_cells.md", "refusal_reasons.md", "frontier.md",
               "frontier_wide.md"),
              plot="calibration.png",
              special="calibration"),
    Benchmark("Sampling: the draws analysts get", "Do `Release.sample()` (BlackJAX NUTS) and the exporters' samplers "
              "(NumPyro, PyMC, Stan) draw the released posterior, and how fast? Each against an independent reference "
              "of the pseudocoreset's exact posterior (importance sampling, or a long NumPyro run), five seeds, with "
              "R-hat, ESS and seconds per 1,000 draws; and the exact posterior against the signed Gaussian.",
              "python benchmarks/sampling.py --tables napsu_adult,adult --epsilon 0.3 --seeds 5 --exporters; the exporters on real and simulated linear, Poisson and wide tables: --tables doctor_visits,gpa2,hmda,cps1988,islr_wage,slid,sim_linear_hetero,sim_linear_heavy,sim_linear_levels,german_credit,sim_small_wide --seeds 1 --epsilon 1 --exporters (each suite table's first release but adult's: --suite --skip adult --seeds 2 --epsilon 1 --out benchmarks/results/sampling_suite.csv)",
              ("sampling.md", "sampling_suite.md"), Headline("sampling.md", rows=2, cols=(0, 1, 3, 4, 6, 7, 8, 11))),
    Benchmark("Coreset harness (non-private and DP-PSVI grids)", "How close does each constructor's summary come "
              "to the full-data posterior (KL), by size M and epsilon? Six configs: coresets_real, gaussian_mean, "
              "dp_release, dp_release_seeds, dp_levers, fig4 (the DP-PSVI paper's Figure 4).",
              "python benchmarks/run.py benchmarks/configs/NAME.toml (all: --all)", ("coresets.md",),
              Headline("coresets.md", "## Targets from the issues", rows=3, grep="adult eps=0.2 M=", bullets=True),
              plot="plots/dp_release-kl-vs-epsilon.png"),
    Benchmark("Trust: the default against DP-VI", "Are the default mechanism's intervals honest (coverage >= 90%) and "
              "sharper than DP-VI's on adult and simulated tables?", "python benchmarks/trust.py run; "
              "python benchmarks/trust.py report", ("trust.md", "trust_schedule.md"),
              Headline("trust.md", "## Targets", rows=4)),
    Benchmark("Power", "Does the release find the effects the data shows, and how wide is it against the idealised "
              "floor, by epsilon?", "python benchmarks/power.py run --out benchmarks/results/power.csv ...",
              ("power.md",), Headline("power.md", "## Results: the frontier", rows=4, grep="| adult | 1 |"),
              plot="plots/power_frontier.png"),
    Benchmark("Poisson regression", "Does the default Poisson release converge and cover the full-data posterior "
              "(target: coverage >= 90%)?", "python benchmarks/poisson.py run --out benchmarks/results/poisson.csv; "
              "python benchmarks/poisson.py report ...", ("poisson.md", "poisson_tune.md", "poisson_diagnosis.md"),
              Headline("poisson.md", rows=4, cols=(0, 1, 2, 3, 9, 10, 11), grep="| 0.2 |")),
    Benchmark("DP-PSVI's parametric bootstrap", "Does the bootstrap calibrate DP-PSVI's intervals to 90% coverage?",
              "python benchmarks/dppsvi_bootstrap.py run ...; python benchmarks/dppsvi_bootstrap.py report ...",
              ("dppsvi_bootstrap.md", "dppsvi_feature_moments.md", "dppsvi_poisson_init.md"),
              Headline("dppsvi_bootstrap.md", "## Target: coverage", rows=4)),
    Benchmark("Speed", "How long does the README's job take, against `import torch` alone?",
              "python benchmarks/speed.py --readme --reps 7", ("speed.md",), Headline("speed.md", rows=3)),
    Benchmark("Scale on one machine", "How do wall time and memory grow from 10^5 to 10^7 rows (local engine)?",
              "python benchmarks/scale.py", ("scale.md",),
              Headline("scale.md", "## Main table", rows=4, cols=(0, 1, 2, 3, 7), grep="10,000,000")),
    Benchmark("Spark engine at scale", "What does `--engine spark` cost per pass at 10^6-10^7 rows (local[2]), and "
              "what would 10^8-10^9 rows cost on a cluster?", "python benchmarks/spark_scale.py --rows 1000000 ...",
              ("spark_scale.md", "spark_scale_cost.md", "spark_scale_id_column.md"),
              Headline("spark_scale.md", rows=2, cols=(0, 1, 4, 6, 7))),
    Benchmark("CSV reading", "How fast is the one-record-per-line CSV reader against the baseline and the standard "
              "library?", "python benchmarks/csv_reading.py --label issue24 --baseline-commit 8bc98b3 --stdlib "
              "--repeats 7", ("csv_reading.md",), Headline("csv_reading.md", rows=3, cols=(0, 2, 3, 4, 5))),
    Benchmark("Ledger stress", "Do concurrent and killed releases keep the ledger within budget and consistent?",
              "python benchmarks/ledger_stress.py", ("ledger_stress.md",),
              Headline("ledger_stress.md", "## 20 concurrent", rows=4, bullets=True)),
    Benchmark("Empirical privacy self-test", "Does the self-test catch injected privacy bugs, and never the real "
              "mechanism?", "python benchmarks/selftest_full.py", ("selftest.md",),
              Headline("selftest.md", "## Lower bounds", rows=4, cols=(0, 2, 5, 6, 10))),
    Benchmark("The packaged default policy", "What does the default's delta cost in noise, and how often does a "
              "release refuse near a public bound?", "python benchmarks/default_policy.py --draws 20000 "
              "--out benchmarks/results/default_policy.md", ("default_policy.md",),
              Headline("default_policy.md", rows=4)),
    Benchmark("Schema-estimation refusal rate", "How often does zero configuration refuse a healthy binary-target "
              "table?", "python benchmarks/schema_refusal_rate.py", ("schema_refusal_rate.md",),
              Headline("schema_refusal_rate.md", rows=5, cols=(0, 1, 2, 3))),
    Benchmark("Gaussian mixture coresets", "Do lightweight coresets match full-data VI for BGMM / DPGMM, and how "
              "much faster?", "python benchmarks/mixtures.py --n 100000 --seeds 5",
              ("mixtures.md", "mixtures_1e6.md", "mixtures_small_m.md"),
              Headline("mixtures.md", rows=3, cols=(0, 3, 4, 5, 10, 11))),
    Benchmark("Private mixture summaries", "Does the noisy kd-tree beat DP-EM for private mixtures?",
              "python benchmarks/mixtures.py --private --n 100000 --seeds 3 --epsilons 0.5,1,2,4,16",
              ("mixtures_private.md", "mixtures_private_moments.md", "mixtures_private_residual.md"),
              Headline("mixtures_private.md", rows=3, cols=(0, 2, 3, 6, 10), grep="| 1.0 |")),
    Benchmark("Bayesian neural networks", "Do black-box coresets (and the private dp-bb-psvi) reach the reference "
              "implementation's accuracy, and how do they compare with DP-SGD?", "python benchmarks/bnn.py grid",
              ("bnn.md",), Headline("bnn.md", "Our default method on the reference's data", rows=6,
                                     cols=(0, 1, 2, 3))),
    Benchmark("DP-PSVI default candidates", "Which DP-PSVI defaults (initialisation, levers, weights) win on "
              "synthetic tables only?", "python benchmarks/tune_dp_defaults.py --set init|levers|reference|weights",
              ("tune_dp_defaults.md", "tune_dp_defaults_levers.md", "tune_dp_defaults_reference.md",
               "tune_dp_defaults_weights.md"), Headline("tune_dp_defaults.md", rows=4)),
    Benchmark("DP-PSVI diagnostics (maintainers only: reads the data)", "Clip norm against the real norms, signal "
              "against noise, per step, on adult.", "python benchmarks/dp_diagnostics.py --seeds 0 1 --size 100",
              ("dp_diagnostics.md",)),
)


def _cells(line: str) -> list[str]:
    return [c.strip() for c in line.strip().strip("|").split("|")]


def _row(cells: list[str]) -> str:
    return "| " + " | ".join(cells) + " |"


def extract(text: str, h: Headline) -> list[str]:
    """The headline lines ``h`` selects from a results page's ``text`` ([] when absent)."""
    lines = text.splitlines()
    start = 0
    if h.after:
        hits = [i for i, line in enumerate(lines) if h.after in line]
        if not hits:
            return []
        start = hits[0] + 1
    if h.bullets:
        return [line for line in lines[start:] if line.startswith("- ") and h.grep in line][:h.rows]
    i = start
    while i < len(lines) and not lines[i].startswith("|"):
        i += 1
    table = []
    while i < len(lines) and lines[i].startswith("|"):
        table.append(lines[i])
        i += 1
    if len(table) < 3:
        return []
    body = [r for r in table[2:] if h.grep in r][:h.rows]
    pick = (lambda cs: [cs[j] for j in h.cols if j < len(cs)]) if h.cols else (lambda cs: cs)
    head = pick(_cells(table[0]))
    return [_row(head), _row(["---"] * len(head))] + [_row(pick(_cells(r))) for r in body]


def _link(results_dir: Path, name: str, target: Path) -> str:
    return f"[`{name}`]({os.path.relpath(results_dir / name, target.parent)})"


def index_markdown(results_dir: Path, target: Path) -> str:
    """The whole of BENCHMARKS.md."""
    import headline  # benchmarks/headline.py

    lines = ["# Benchmarks", "",
             "Generated by `python benchmarks/run.py --report-only` (`benchmarks/index.py`) from "
             "`benchmarks/results/`. One section per benchmark: its question, its command, its latest headline "
             "(a few rows of its results, read at generation time) and its full results. The research log "
             "(rules written before each run, candidates tried and dropped) is the lab notebook, "
             "`benchmarks/notebook/`, not a result.", ""]
    for b in BENCHMARKS:
        lines += [f"## {b.title}", "", b.question, "", f"Command: `{b.command}`", ""]
        if b.special == "calibration" and (results_dir / "calibration.csv").exists():
            lines += headline.headline(results_dir / "calibration.csv", link="docs/CALIBRATION.md") + [""]
        elif b.headline is not None:
            page = results_dir / b.headline.page
            got = extract(page.read_text(), b.headline) if page.exists() else []
            lines += (got or [f"(no headline: `{b.headline.page}` is missing or has no such table)"]) + [""]
        if b.plot and (results_dir / b.plot).exists():
            lines += [f"Plot: {_link(results_dir, b.plot, target)}", ""]
        present = [_link(results_dir, r, target) for r in b.results if (results_dir / r).exists()]
        missing = [r for r in b.results if not (results_dir / r).exists()]
        lines += ["Full results: " + (", ".join(present) if present else "none yet")
                  + (f" (not yet written: {', '.join(missing)})" if missing else ""), ""]
    text = "\n".join(lines).rstrip() + "\n"
    return re.sub(r"\n{3,}", "\n\n", text)
