"""Speed benchmarks (issue 15): ``python benchmarks/speed.py`` -> benchmarks/results/speed.md.

Every row is a fresh ``dpsummary`` process, end to end (start-up and imports, CSV parsing, DP count,
schema and quality counts when not public, calibration, stage 2, noise, signing, ledger), on the
bundled adult table (48,842 rows), median of ``--reps`` runs (default 3):

* ``dpsummary --help``;
* a public refusal (``--target`` naming no column of the file): refused from the options and the
  header line before torch, scipy, opacus or the accountants load (issue 26), so it should cost
  about what ``--help`` costs;
* the README's zero-configuration release (``--epsilon 0.2``, default mechanism) at M=100;
* the same with ``--mechanism dp-psvi`` at M=100, T=500;
* both again with the schema and record count declared public in the policy.

DP-PSVI's cost per optimisation step is measured from the same end-to-end runs, as
``(t(T=500) - t(T=50)) / 450``: everything a step does (posterior draws, clip norm, Poisson sample,
kernel, noise, Adam), nothing else. The load average at the start of each row is recorded: other
processes on the 2 cores slow everything down, so read the numbers together with it.

The public-schema policy is written from adult's own schema, inferred non-privately here: it
stands for the schema a curator declares public, and is only used to time that path.
"""

from __future__ import annotations

import argparse
import os
import statistics
import subprocess
import sys
import tempfile
import time
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
DATA = ROOT / "examples" / "adult.csv"
OUT = ROOT / "benchmarks" / "results" / "speed.md"
sys.path.insert(0, str(ROOT))


def load() -> float:
    return os.getloadavg()[0]


_LEDGERS = iter(range(10**6))


def time_command(args: list[str], reps: int, env: dict[str, str], *, exit_code: int = 0) -> tuple[float, float]:
    """Median and best wall time of ``reps`` fresh processes, each of which must exit with
    ``exit_code``. A release gets a ledger of its own each time (same key): a curator's ledger
    composes every earlier release, so one shared ledger would make later rows slower for a
    reason that is not the release's own cost."""
    times = []
    for _ in range(reps):
        run = list(args)
        if "release" in run:
            run += ["--ledger", str(Path(env["DPSUMMARY_HOME"]) / f"ledger-{next(_LEDGERS)}.jsonl")]
        t = time.perf_counter()
        done = subprocess.run(run, env=env, stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL)
        times.append(time.perf_counter() - t)
        if done.returncode != exit_code:
            raise SystemExit(f"{' '.join(run)} exited {done.returncode}, expected {exit_code}")
    return statistics.median(times), min(times)


def time_constructor(method: str, size: int, reps: int) -> tuple[float, float, int]:
    import torch

    from dpsummary.constructors import fit
    from dpsummary.experiment import make_constructor, prepare_public_dataset

    torch.set_num_threads(1)
    prep = prepare_public_dataset(DATA, transform="schema")
    times = []
    steps = 0
    for r in range(reps):
        c = make_constructor(method)
        steps = c.num_steps(size)
        t = time.perf_counter()
        fit(c, prep.train, prep.model, size, generator=torch.Generator().manual_seed(r))
        times.append(time.perf_counter() - t)
    return statistics.median(times), min(times), steps


def _toml_value(v: object) -> str:
    if isinstance(v, bool):
        return "true" if v else "false"
    if isinstance(v, str):
        return '"' + v.replace("\\", "\\\\").replace('"', '\\"') + '"'
    if isinstance(v, list):
        return "[" + ", ".join(_toml_value(x) for x in v) + "]"
    return repr(v)


def write_policies(home: Path) -> tuple[Path, Path]:
    """(zero-config policy, public-schema policy), both with the packaged default's split and a
    budget large enough for the repeated runs."""
    from dpsummary import data as dmod
    from dpsummary.policy import default_policy

    split = default_policy().budget_split
    head = ("source_id = \"speed-benchmark\"\ntotal_epsilon = 1000.0\ntotal_delta = 1e-3\n"
            "max_epsilon_per_release = 1.0\nmin_records = 200\nn_max = 1000000\n")
    tables = "[budget_split]\n" + "".join(f"{k} = {v!r}\n" for k, v in split.model_dump().items())
    zero = home / "zero.toml"
    zero.write_text(head + tables)
    table = dmod.read_csv(DATA)
    schema = dmod.infer_schema(table, target="income")
    cols = []
    for c in schema.columns:
        fields = {k: v for k, v in c.model_dump().items() if v is not None and not (k == "integer" and v is False)}
        cols.append("[[schema.columns]]\n" + "".join(f"{k} = {_toml_value(v)}\n" for k, v in fields.items()))
    public = home / "public.toml"
    public.write_text(head + f"record_count_public = true\nrecord_count = {table.num_rows}\n" + tables
                      + f"\n[schema]\ntarget = {_toml_value(schema.target)}\n" + "\n".join(cols))
    return zero, public


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--reps", type=int, default=3)
    parser.add_argument("--startup-only", action="store_true",
                        help="time only --help and the public refusal; print the rows, leave speed.md alone")
    args = parser.parse_args()
    rows: list[tuple[str, float, float, str, float]] = []
    exe = str(Path(sys.executable).with_name("dpsummary"))
    with tempfile.TemporaryDirectory() as tmp:
        home = Path(tmp)
        env = {**os.environ, "DPSUMMARY_HOME": str(home / "home"), "OMP_NUM_THREADS": "1"}
        zero, public = write_policies(home)
        # First run creates the signing key (an fsync'd one-off): not part of a release's cost.
        subprocess.run([exe, "release", "--epsilon", "0.2", "--policy", str(zero), "--out", str(home / "w.json"),
                        str(DATA)], check=True, env=env, stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL)
        la = load()
        med, best = time_command([exe, "--help"], args.reps, env)
        rows.append(("dpsummary --help", med, best, "", la))
        la = load()
        med, best = time_command([exe, "release", "--epsilon", "0.2", "--target", "no_such_column",
                                  "--out", str(home / "r.json"), str(DATA)], args.reps, env, exit_code=2)
        rows.append(("public refusal: release --target no_such_column (exit 2)", med, best,
                     "refused before torch, scipy, opacus and the accountants load", la))
        if args.startup_only:
            print("\n".join(f"| {a} | {b:.2f} | {c:.2f} | {d} | {e:.2f} |" for a, b, c, d, e in rows))
            return
        for label, policy in (("zero configuration", zero), ("public schema and count", public)):
            # --force: every run replaces the previous row's artifact (a release refuses otherwise).
            base = [exe, "release", "--epsilon", "0.2", "--size", "100", "--policy", str(policy),
                    "--out", str(home / "a.json"), "--force", str(DATA)]
            la = load()
            med, best = time_command(base, args.reps, env)
            rows.append((f"release adult eps 0.2 M=100, default mechanism, {label}", med, best, "", la))
            la = load()
            med500, best500 = time_command(base + ["--mechanism", "dp-psvi", "--steps", "500"], args.reps, env)
            med50, _ = time_command(base + ["--mechanism", "dp-psvi", "--steps", "50"], args.reps, env)
            per_step = (med500 - med50) / 450 * 1000
            rows.append((f"release adult eps 0.2 M=100 T=500, dp-psvi, {label}", med500, best500,
                         f"{per_step:.2f} ms/step (from T=500 vs T=50)", la))
    la = load()
    med, best, steps = time_constructor("psvi", 100, args.reps)
    rows.append(("non-private PSVI adult M=100 S=100 T=500 B=200 (in process)", med, best,
                 f"{med / steps * 1000:.2f} ms/step", la))
    lines = ["# Speed (wall clock, this 2-core machine)", "",
             f"Reproduce: `python benchmarks/speed.py` (median of {args.reps} fresh processes per row; "
             "one torch thread; the signing key already exists).", "",
             "| what | median s | best s | note | load avg at start |", "|---|---|---|---|---|"]
    lines += [f"| {a} | {b:.2f} | {c:.2f} | {d} | {e:.2f} |" for a, b, c, d, e in rows]
    OUT.parent.mkdir(parents=True, exist_ok=True)
    OUT.write_text("\n".join(lines) + "\n")
    print("\n".join(lines))


if __name__ == "__main__":
    main()
