"""Speed benchmarks (issues 2 and 3): ``python benchmarks/speed.py`` -> benchmarks/results/speed.md.

Measures, median of 3 wall-clock runs on this machine:
* PSVI, M=100, S=100, T=500, B=200 on adult (non-private, public-bounds transform): total and per step;
* GIGA and SparseVI on adult at M=100: seconds per step (one point added per step);
* ``dpsummary release --epsilon 0.2 --size 100 --steps 500`` on adult, end to end in a fresh
  process (start-up, CSV parsing, DP count and schema estimation, DP initialisation histograms
  (the default policy's budget split), calibration, noise, signing, writing);
* ``dpsummary --help`` start-up.
The load average at the start of each measurement is recorded: other processes on the 2 cores
slow everything down, so read the numbers together with it.
"""

from __future__ import annotations

import os
import statistics
import subprocess
import sys
import tempfile
import time
from pathlib import Path

import torch

ROOT = Path(__file__).resolve().parents[1]
DATA = ROOT.parent / "shared" / "data" / "adult.csv"
OUT = ROOT / "benchmarks" / "results" / "speed.md"
sys.path.insert(0, str(ROOT))


def load() -> float:
    return os.getloadavg()[0]


def time_constructor(method: str, size: int, reps: int, **options: object) -> tuple[float, float, int]:
    from dpsummary.constructors import fit
    from dpsummary.experiment import make_constructor, prepare_public_dataset

    prep = prepare_public_dataset(DATA, transform="schema")
    times = []
    steps = 0
    for r in range(reps):
        c = make_constructor(method, **options)
        steps = c.num_steps(size)
        t = time.perf_counter()
        fit(c, prep.train, prep.model, size, generator=torch.Generator().manual_seed(r))
        times.append(time.perf_counter() - t)
    return statistics.median(times), min(times), steps


def time_command(args: list[str], reps: int, env: dict[str, str]) -> tuple[float, float]:
    times = []
    for _ in range(reps):
        t = time.perf_counter()
        subprocess.run(args, check=True, env=env, stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL)
        times.append(time.perf_counter() - t)
    return statistics.median(times), min(times)


def main() -> None:
    torch.set_num_threads(1)
    rows = []
    exe = str(Path(sys.executable).with_name("dpsummary"))
    with tempfile.TemporaryDirectory() as home:
        env = {**os.environ, "DPSUMMARY_HOME": home}
        policy = Path(home) / "speed.toml"
        # The default policy's budget split (so the DP initialisation histograms run, as in a
        # default release), with a budget large enough for the repeated runs.
        from dpsummary.policy import default_policy

        split = default_policy().budget_split
        policy.write_text("total_epsilon = 100.0\ntotal_delta = 1e-5\nmax_epsilon_per_release = 1.0\n"
                          "min_records = 200\nn_max = 1000000\n[budget_split]\n"
                          + "".join(f"{k} = {v!r}\n" for k, v in split.model_dump().items()))
        la = load()
        med, best = time_command([exe, "--help"], 3, env)
        rows.append(("dpsummary --help", med, best, "", la))
        la = load()
        med, best = time_command([exe, "release", "--epsilon", "0.2", "--size", "100", "--steps", "500",
                                  "--policy", str(policy), "--out", str(Path(home) / "a.json"), str(DATA)], 3, env)
        rows.append(("release adult, eps 0.2, M=100, T=500 (end to end)", med, best, f"{med / 500 * 1000:.1f} ms/step incl. everything", la))
    la = load()
    med, best, steps = time_constructor("psvi", 100, 3)
    rows.append(("PSVI adult M=100 S=100 T=500 B=200", med, best, f"{med / steps * 1000:.2f} ms/step", la))
    la = load()
    med, best, steps = time_constructor("giga", 100, 3)
    rows.append(("GIGA (optimal) adult M=100, J=100", med, best, f"{med / steps * 1000:.1f} ms/step (incl. full-data Laplace)", la))
    la = load()
    med, best, steps = time_constructor("sparsevi", 100, 1)
    rows.append(("SparseVI adult M=100 (1 run)", med, best, f"{med / steps:.2f} s/step (100 weight steps each)", la))
    lines = ["# Speed (wall clock, this 2-core machine)", "",
             "Reproduce: `python benchmarks/speed.py`. Median of 3 runs (SparseVI: 1 run), one torch thread.", "",
             "| what | median s | best s | note | load avg at start |", "|---|---|---|---|---|"]
    lines += [f"| {a} | {b:.2f} | {c:.2f} | {d} | {e:.2f} |" for a, b, c, d, e in rows]
    OUT.parent.mkdir(parents=True, exist_ok=True)
    OUT.write_text("\n".join(lines) + "\n")
    print("\n".join(lines))


if __name__ == "__main__":
    main()
