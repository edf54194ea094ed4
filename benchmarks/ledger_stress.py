"""Ledger stress with the REAL command (issue 4): ``python benchmarks/ledger_stress.py``.

1. Concurrency: 20 ``dpsummary release`` processes start at once against one ledger whose policy
   admits exactly k of them. Expect exactly k commits, 20 - k refusals *before touching data*
   (no reservation of theirs in the ledger), a ledger that verifies, and a composed total within
   budget.
2. Crash safety: ``dpsummary release`` killed with SIGKILL at random moments (>= 20 trials, spread
   over start-up, reservation, optimisation and writing). After every kill the ledger must verify
   (a torn last line is reported and repaired by the next writer) and every reservation that was
   written stays charged (never under-counts).
Writes benchmarks/results/ledger_stress.md.
"""

from __future__ import annotations

import json
import os
import random
import signal
import subprocess
import sys
import tempfile
import time
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
OUT = ROOT / "benchmarks" / "results" / "ledger_stress.md"
sys.path.insert(0, str(ROOT))

POLICY = """source_id = "stress"
total_epsilon = {total}
total_delta = 1e-6
max_epsilon_per_release = 1.0
min_records = 10
n_max = 100000
record_count_public = true
record_count = 1000
[schema]
target = "credit_risk"
[[schema.columns]]
name = "duration_months"
kind = "numeric"
lower = 0
upper = 80
[[schema.columns]]
name = "credit_amount"
kind = "numeric"
lower = 0
upper = 20000
[[schema.columns]]
name = "age"
kind = "numeric"
lower = 18
upper = 80
[[schema.columns]]
name = "credit_risk"
kind = "categorical"
categories = ["bad", "good"]
"""


def main() -> None:
    from dpsummary import keys
    from dpsummary.audit import audit
    from dpsummary.ledger import read_ledger, verify_ledger
    from dpsummary.policy import load_policy

    exe = str(Path(sys.executable).with_name("dpsummary"))
    data = ROOT / "examples" / "german_credit.csv"
    lines = ["# Ledger stress with the real `dpsummary release`", "", "Reproduce: `python benchmarks/ledger_stress.py`", ""]
    with tempfile.TemporaryDirectory() as home:
        env = {**os.environ, "DPSUMMARY_HOME": home, "OMP_NUM_THREADS": "1"}
        subprocess.run([exe, "keygen"], env=env, check=True, stdout=subprocess.DEVNULL)
        pub = keys.load_public_key(Path(home) / "keys" / "dpsummary.pub")
        # --- concurrency: each release costs 0.5; RDP composition of k releases must fit ------
        k_target = 3
        pol_path = Path(home) / "conc.toml"
        pol_path.write_text(POLICY.format(total=1.0))
        ledger = Path(home) / "conc.jsonl"
        procs = [subprocess.Popen([exe, "release", "--epsilon", "0.5", "--policy", str(pol_path), "--ledger", str(ledger),
                                   "--steps", "30", "--size", "5", "--out", str(Path(home) / f"c{i}.json"), str(data)],
                                  env=env, stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True) for i in range(20)]
        results = [(p.wait(), p.stderr.read()) for p in procs]
        ok = sum(rc == 0 for rc, _ in results)
        refused = [err for rc, err in results if rc != 0]
        st = read_ledger(ledger, pub)
        reserves = [e for e in st.entries if e["kind"] == "reserve"]
        commits = [e for e in st.entries if e["kind"] == "commit"]
        rep = audit(ledger, pub, load_policy(pol_path))
        lines += ["## 20 concurrent releases, epsilon 0.5 each, policy total 1.0", "",
                  f"- committed: {ok} (reservations in ledger: {len(reserves)}, commits: {len(commits)})",
                  f"- refused: {len(refused)}; all refusals name the budget: {all('budget' in e for e in refused)}",
                  f"- ledger problems: {len(verify_ledger(ledger, pub))}; audit ok: {rep.ok}; composed RDP "
                  f"{rep.sources[0].composed_rdp:.4f} <= 1.0 (naive sum {rep.sources[0].naive_sum_rdp:.4f})",
                  f"- refusals before touching data: every reservation belongs to a committed release: "
                  f"{len(reserves) == len(commits) == ok}", ""]
        del k_target
        # --- crash safety ------------------------------------------------------------------------
        pol2 = Path(home) / "crash.toml"
        pol2.write_text(POLICY.format(total=1000.0))
        ledger2 = Path(home) / "crash.jsonl"
        rng = random.Random(0)
        trials = []
        for i in range(24):
            before = read_ledger(ledger2, pub).entries if ledger2.exists() else []
            p = subprocess.Popen([exe, "release", "--epsilon", "0.3", "--policy", str(pol2), "--ledger", str(ledger2),
                                  "--steps", "200", "--size", "5", "--out", str(Path(home) / f"k{i}.json"), str(data)],
                                 env=env, stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL)
            delay = rng.uniform(0.5, 12.0)
            time.sleep(delay)
            killed = p.poll() is None
            if killed:
                p.send_signal(signal.SIGKILL)
            p.wait()
            st2 = read_ledger(ledger2, pub)
            problems = [pr for pr in st2.problems if pr.severity == "error"]
            new = st2.entries[len(before):]
            reserved = [e for e in new if e["kind"] == "reserve"]
            trials.append({"delay_s": round(delay, 2), "killed": killed, "new_reserves": len(reserved),
                           "new_commits": sum(e["kind"] == "commit" for e in new), "errors": len(problems),
                           "still_charged": all(any(e["seq"] == r["seq"] for e in st2.entries) for r in reserved)})
        spent = json.dumps(trials[-1])
        rep2 = audit(ledger2, pub, load_policy(pol2))
        killed_n = sum(t["killed"] for t in trials)
        lines += [f"## SIGKILL at random moments: {len(trials)} trials ({killed_n} killed mid-run)", "",
                  "| delay s | killed | new reserves | new commits | ledger errors | reserved stays charged |",
                  "|---|---|---|---|---|---|"]
        lines += [f"| {t['delay_s']} | {t['killed']} | {t['new_reserves']} | {t['new_commits']} | {t['errors']} | {t['still_charged']} |" for t in trials]
        lines += ["", f"Final audit ok: {rep2.ok}; composed RDP {rep2.sources[0].composed_rdp:.4f} over "
                  f"{rep2.sources[0].reservations} reservations (every reservation charged, committed or not).", ""]
        del spent
    OUT.parent.mkdir(parents=True, exist_ok=True)
    OUT.write_text("\n".join(lines) + "\n")
    print("\n".join(lines))


if __name__ == "__main__":
    main()
