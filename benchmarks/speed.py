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

``--readme`` (issue 29) times the README's main job exactly as a curator types it,
``dpsummary release --epsilon 0.2 examples/adult.csv`` (zero configuration, packaged default
policy, default mechanism; only ``--out`` added, so nothing is written into the repository),
each run a fresh process with a fresh dpsummary home (the signing key copied in: a returning
curator, a new ledger), interleaved with ``python -c "import torch"`` in the same run, plus
``dpsummary --help``; medians, their ratio and the load average are written to the
"README job" section of speed.md. ``--compare TREE`` also times (interleaved) the same job from
another checkout of the repository (``git archive <commit> | tar -x -C TREE``), checks that its
artifact's epsilons are identical, and profiles both stage by stage (one extra fresh process
each, with hooks on the release's checkpoints; see :func:`stage_child`).
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


README_SECTION = ("<!-- readme-job -->", "<!-- /readme-job -->")
README_JOB = ["release", "--epsilon", "0.2", "examples/adult.csv"]


def _python_env(tree: Path | None, home: Path) -> dict[str, str]:
    env = {**os.environ, "DPSUMMARY_HOME": str(home), "OMP_NUM_THREADS": "1"}
    env.pop("PYTHONPATH", None)
    if tree is not None:
        env["PYTHONPATH"] = str(tree)
    return env


def _timed(args: list[str], env: dict[str, str], cwd: Path) -> float:
    t = time.perf_counter()
    done = subprocess.run(args, env=env, cwd=cwd, stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL)
    wall = time.perf_counter() - t
    if done.returncode != 0:
        raise SystemExit(f"{' '.join(args)} exited {done.returncode}")
    return wall


class _Homes:
    """A fresh dpsummary home per run, each holding a copy of one signing key (created by the
    first, untimed, run: :meth:`seed`)."""

    def __init__(self, root: Path) -> None:
        self.root = root
        self.count = 0
        self.seed_home = root / "seed-home"

    def fresh(self) -> tuple[Path, Path]:
        """(home, artifact path) for one run."""
        import shutil

        self.count += 1
        home = self.root / f"home-{self.count}"
        if (self.seed_home / "keys").exists():
            shutil.copytree(self.seed_home / "keys", home / "keys")
        return home, self.root / f"artifact-{self.count}.json"


def _cwd(tree: Path | None) -> Path:
    """Where a tree's job runs: its own root (``python -c`` puts the working directory first on
    ``sys.path``, and the job's ``examples/adult.csv`` is relative to it)."""
    return ROOT if tree is None else tree


def _job_args(tree: Path | None, out: Path) -> list[str]:
    exe = [sys.executable, "-c", "import sys; from dpsummary.cli import main; sys.argv[0] = 'dpsummary'; main()"]
    return [*exe, *README_JOB, "--out", str(out)]


def claim_epsilons(artifact: Path) -> dict[str, float]:
    """The claim's epsilon per accountant, read from a signed artifact's payload."""
    import base64
    import json

    envelope = json.loads(artifact.read_text())
    return dict(json.loads(base64.b64decode(envelope["payload"]))["predicate"]["claim"]["epsilon"])


#: The stages of :func:`stage_child`'s profile: (label, first checkpoint, last checkpoint).
STAGES = (
    ("start-up, CLI, public planning (stage 0: accountants loaded, noise calibrated)", "start", "cp:planned-public"),
    ("torch imported and configured (prefetch thread, accountant worker started)", "cp:planned-public",
     "cp:reserved-stage1"),
    ("read and stage 1 (count, DP schema)", "cp:reserved-stage1", "cp:stage1"),
    ("stage-2 planning and reservation", "cp:stage1", "cp:reserved-stage2"),
    ("encode pass and quality counts", "cp:reserved-stage2", "cp:initialised"),
    ("noise-aware passes (rounds, noise, posterior)", "fit:start", "fit:end"),
    ("matching the pseudocoreset (gaussian_target)", "match:start", "match:end"),
    ("claim epsilons collected, artifact signed and written", "cp:optimised", "cp:written"),
    ("ledger commit, source total, table printed", "cp:written", "end"),
)


def stage_child(out: Path, args: list[str]) -> None:
    """Run one release in THIS process with timestamps: a hook on the release's checkpoints and
    on ``noise_aware.fit``, ``gaussian_target.match_gaussian`` and ``accounting.epsilons`` (the
    claim's three accountants, on a background thread and, with an accountant worker, partly in
    another process). Writes the marks as JSON to ``out``. Run under ``python -X importtime``
    by :func:`stage_profile`, which reads the big imports from that trace."""
    import importlib
    import json

    t0 = time.perf_counter()
    marks: dict[str, float] = {"start": 0.0}
    durations: dict[str, float] = {}

    def now() -> float:
        return time.perf_counter() - t0

    def wrap(module: str, name: str, label: str, *, record_marks: bool) -> None:
        mod = importlib.import_module(module)
        fn = getattr(mod, name)

        def wrapped(*a: object, **k: object) -> object:
            start = now()
            try:
                return fn(*a, **k)
            finally:
                durations[label] = durations.get(label, 0.0) + now() - start
                if record_marks:
                    marks[f"{label}:start"], marks[f"{label}:end"] = start, now()

        setattr(mod, name, wrapped)

    release = importlib.import_module("dpsummary.release")  # imports nothing heavy (checked by its tests)
    run_release = release.run_release

    def hooked(req: object, *, progress: object = None, notice: object = None, checkpoint: object = None) -> object:
        def mark(name: str) -> None:
            marks[f"cp:{name}"] = now()
            if callable(checkpoint):
                checkpoint(name)
            if name == "reserved-stage2":  # wrapped only now, so that nothing is imported earlier than it would be
                wrap("dpsummary.noise_aware", "fit", "fit", record_marks=True)
                wrap("dpsummary.constructors.gaussian_target", "match_gaussian", "match", record_marks=True)
                wrap("dpsummary.accounting", "epsilons", "claim epsilons (rdp, prv, pld; concurrent)",
                     record_marks=False)

        return run_release(req, progress=progress, notice=notice, checkpoint=mark)

    setattr(release, "run_release", hooked)  # noqa: B010 - a module attribute, patched in this process only
    from dpsummary.cli import main

    sys.argv = ["dpsummary", *args]
    try:
        main()
    except SystemExit as exc:
        if exc.code not in (0, None):
            raise
    marks["end"] = now()
    out.write_text(json.dumps({"marks": marks, "durations": durations, "wall_end": time.time()}))


#: Imports whose cumulative time the stage profile reports (``python -X importtime``).
PROFILED_IMPORTS = ("torch", "dp_accounting", "scipy.stats", "opacus", "pandas")


def _import_times(trace: str) -> dict[str, float]:
    """Seconds of each :data:`PROFILED_IMPORTS` module's own import, from an importtime trace
    (one line per module actually imported: ``import time: self | cumulative | name``; a
    module imported by two threads at once may miss its line, so only modules that one thread
    imports are listed)."""
    out: dict[str, float] = {}
    for line in trace.splitlines():
        parts = line.split("|")
        if line.startswith("import time:") and len(parts) == 3 and parts[2].strip() in PROFILED_IMPORTS:
            try:
                out[parts[2].strip()] = int(parts[1]) / 1e6
            except ValueError:
                continue
    return out


def stage_profile(tree: Path | None, homes: _Homes) -> tuple[list[tuple[str, float]], dict[str, float]]:
    """One fresh process of the README job under :func:`stage_child` (and ``-X importtime``):
    the stage rows (label, seconds), the interpreter's exit included, then the big imports
    (where they happen, on whichever thread, inside the stages), and the artifact's epsilons."""
    import json

    home, artifact = homes.fresh()
    out = homes.root / f"stages-{homes.count}.json"
    env = _python_env(tree, home)
    if tree is not None:  # the child imports this file from the tree under test's sys.path
        env["PYTHONPATH"] = f"{tree}{os.pathsep}{ROOT / 'benchmarks'}"
    else:
        env["PYTHONPATH"] = str(ROOT / "benchmarks")
    code = ("import sys; from pathlib import Path; import speed; "
            "speed.stage_child(Path(sys.argv[1]), sys.argv[2:])")
    done = subprocess.run([sys.executable, "-X", "importtime", "-c", code, str(out), *README_JOB, "--out",
                           str(artifact)], env=env, cwd=_cwd(tree), check=True, stdout=subprocess.DEVNULL,
                          stderr=subprocess.PIPE, text=True)
    exited = time.time()
    data = json.loads(out.read_text())
    marks, durations = data["marks"], data["durations"]
    rows = [(label, marks[b] - marks[a]) for label, a, b in STAGES if a in marks and b in marks]
    rows.append(("interpreter exit (module teardown)", exited - data["wall_end"]))
    rows.append(("whole process (importtime tracing adds a little)", marks["end"] + exited - data["wall_end"]))
    rows += [(label, value) for label, value in durations.items() if label.startswith("claim")]
    imports = _import_times(done.stderr)
    rows += [(f"of which `import {name}` (cumulative, in this process)", imports.get(name, 0.0))
             for name in PROFILED_IMPORTS]
    return rows, claim_epsilons(artifact)


#: What issue 29 changed on the README job's path (written under the tables above).
ISSUE_29_NOTES = (
    "What issue 29 changed on this path (the stage table's columns, compared with the earlier tree):",
    "",
    "- **Opacus without `import opacus`.** The claim's PRV bound used `opacus.accountants.PRVAccountant`; "
    "importing any Opacus module runs `opacus/__init__` (the DP optimisers, `torch.distributed`, sympy): "
    "0.65 s, plus 0.3 s at exit. `accounting.opacus_accountants` runs the same files of "
    "`opacus/accountants` under another package name with a stand-in for the one base-class member they "
    "use; the epsilons are Opacus's own, bit for bit (tests/test_accounting.py).",
    "- **PRV and PLD in a worker process.** `accounting.start_accountant_worker` (started by `release` "
    "once its public checks pass) evaluates both cross-check accountants in a child process that loads "
    "scipy.stats/scipy.signal while the release imports torch, and computes on the second core; public "
    "event parameters in, floats out (JSON carries them exactly); without it the same code runs in "
    "process. The release process no longer imports dp_accounting's PLD modules: the command line "
    "defers dp_accounting's `__init__` to the first use of a name it defines "
    "(`cli.common.defer_package_inits`), and `norm.isf(q)` became `-ndtri(q)` (scipy's own definition "
    "of it, so the thresholds are the same floats) in the schema and marginals code, so scipy.stats is "
    "not imported either.",
    "- **No pandas.** pyarrow imports pandas (0.2 s, and more at exit) on any Python-to-Arrow conversion "
    "and on every `Array.to_numpy`; the reader builds its constants and masks from buffers and reads "
    "numeric and boolean arrays from their buffers (`data.stream.arrow_to_numpy`, tested against "
    "`to_numpy`). The CSV blocks also come as one Arrow batch each (fewer per-batch calls).",
    "- **Matching.** `gaussian_target` fits logistic and Poisson pseudopoints with the loss's gradient in "
    "closed form in numpy (same loss, Adam with torch's arithmetic, same stopping rule and tolerance; "
    "gradient and fits checked against autograd in tests/constructors): about 0.1 ms a step instead of "
    "0.8 ms.",
    "- **Exit.** The command line calls `gc.freeze()` when the command is over, so the interpreter's exit "
    "does not traverse every object torch created in its final garbage collections (0.3 s).",
    "- **Unchanged.** torch is still imported (the GLMs, the noise-aware fit and the kernel are torch "
    "code): it is now most of the job; without it the rest would be about the time of "
    "`import torch`. The noise-aware kernel was already vectorised (about 35 ms a pass on adult).",
)


def readme_job(reps: int, compare: Path | None) -> None:
    """The README job against ``import torch`` (issue 29); see the module docstring."""
    rows: list[str] = []
    with tempfile.TemporaryDirectory() as tmp:
        homes = _Homes(Path(tmp))
        trees: list[tuple[str, Path | None]] = [("this tree", None)]
        if compare is not None:
            trees.append((f"tree {compare.name}", compare.resolve()))
        # Untimed: create the signing key, warm the file cache and the .pyc files of each tree.
        _timed(_job_args(None, homes.root / "seed.json"), _python_env(None, homes.seed_home), ROOT)
        for _label, tree in trees:
            home, artifact = homes.fresh()
            _timed(_job_args(tree, artifact), _python_env(tree, home), _cwd(tree))
        load_start = load()
        times: dict[str, list[float]] = {"torch": [], **{label: [] for label, _ in trees}}
        epsilons: dict[str, dict[str, float]] = {}
        for _ in range(reps):
            times["torch"].append(_timed([sys.executable, "-c", "import torch"], _python_env(None, homes.root), ROOT))
            for label, tree in trees:
                home, artifact = homes.fresh()
                times[label].append(_timed(_job_args(tree, artifact), _python_env(tree, home), _cwd(tree)))
                epsilons[label] = claim_epsilons(artifact)
        load_jobs = load()
        help_times = [_timed([str(Path(sys.executable).with_name("dpsummary")), "--help"],
                             _python_env(None, homes.root), ROOT) for _ in range(reps)]
        profiles = {label: stage_profile(tree, homes) for label, tree in trees}
        load_end = load()
    torch_med = statistics.median(times["torch"])
    rows += [
        README_SECTION[0],
        "## README job against `import torch` (issue 29)",
        "",
        f"Reproduce: `python benchmarks/speed.py --readme --reps {reps}"
        + (f" --compare {compare}` after `mkdir {compare} && git archive {compare.name} | tar -x -C {compare}` "
           "(the earlier tree, named after its commit)" if compare else "`"),
        "",
        "The job is the README's main command, `dpsummary release --epsilon 0.2 examples/adult.csv` "
        "(zero configuration, packaged default policy, default mechanism noise-aware-newton, M = 50), "
        "plus `--out` into a temporary directory; every run is a fresh process with a fresh "
        "`DPSUMMARY_HOME` holding a copy of one signing key (a returning curator, a new ledger). "
        "The runs of each row are interleaved with the other rows' (one of each per round), "
        f"{reps} rounds; wall clock of the whole process; one torch thread.",
        "",
        "| what | median s | min s | max s | ratio to `import torch` |",
        "|---|---|---|---|---|",
        f"| `python -c \"import torch\"` | {torch_med:.2f} | {min(times['torch']):.2f} | "
        f"{max(times['torch']):.2f} | 1.00 |",
    ]
    for label, _tree in trees:
        med = statistics.median(times[label])
        rows.append(f"| README job, {label} | {med:.2f} | {min(times[label]):.2f} | {max(times[label]):.2f} | "
                    f"{med / torch_med:.2f} |")
    rows.append(f"| `dpsummary --help` | {statistics.median(help_times):.2f} | {min(help_times):.2f} | "
                f"{max(help_times):.2f} | |")
    rows += ["", f"Load average (1 min): {load_start:.2f} before the timed rounds, {load_jobs:.2f} after them, "
             f"{load_end:.2f} at the end (the machine's 2 cores are shared with other jobs: read the ratio, "
             "measured in the same rounds, rather than the absolute times).", ""]
    if len(epsilons) > 1:
        same = all(e == epsilons["this tree"] for e in epsilons.values())
        if not same:
            raise SystemExit(f"the trees' artifacts claim different epsilons: {epsilons}")
    rows.append("Claimed epsilons of the artifacts (identical in every tree timed here, checked): "
                + ", ".join(f"{k} {v!r}" for k, v in sorted(epsilons["this tree"].items())) + ".")
    rows += ["", "Stage by stage (one more fresh process per tree, run under `python -X importtime`, with hooks "
             "on the release's checkpoints). The claim's accountants run concurrently with the later stages "
             "(a thread, and with this tree a worker process), so their row overlaps the others; the import "
             "rows are the time each import took where it happened (inside the stages above, on any thread; "
             "0 = not imported by the release's own process):", ""]
    labels = [label for label, _ in trees]
    rows += ["| stage | " + " | ".join(f"{label} s" for label in labels) + " |",
             "|---|" + "---|" * len(labels)]
    order: list[str] = []
    for label in labels:
        order += [name for name, _ in profiles[label][0] if name not in order]
    for name in order:
        cells = [next((f"{v:.3f}" for n, v in profiles[label][0] if n == name), "") for label in labels]
        rows.append(f"| {name} | " + " | ".join(cells) + " |")
    rows += ["", *ISSUE_29_NOTES, README_SECTION[1]]
    _write_section("\n".join(rows))
    print("\n".join(rows))


def _write_section(text: str) -> None:
    """Replace the README-job section of speed.md (or put it first), keeping the rest."""
    old = OUT.read_text() if OUT.exists() else ""
    begin, end = README_SECTION
    if begin in old and end in old:
        new = old[: old.index(begin)] + text + old[old.index(end) + len(end):]
    else:
        head, sep, rest = old.partition("\n\n")
        new = (head + sep if sep else "# Speed (wall clock, this 2-core machine)\n\n") + text + "\n\n" + rest
    OUT.write_text(new.rstrip("\n") + "\n")


def main() -> None:
    sys.path.insert(0, str(ROOT))  # not on import: stage_child imports this file under another tree
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--reps", type=int, default=3)
    parser.add_argument("--startup-only", action="store_true",
                        help="time only --help and the public refusal; print the rows, leave speed.md alone")
    parser.add_argument("--readme", action="store_true",
                        help="time the README job against `import torch` (issue 29); write that section of speed.md")
    parser.add_argument("--compare", type=Path, default=None,
                        help="with --readme: also time and profile the job from this other checkout (a "
                             "directory named after its commit, from `git archive <commit>`)")
    args = parser.parse_args()
    if args.readme:
        readme_job(args.reps, args.compare)
        return
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
    previous = OUT.read_text() if OUT.exists() else ""
    begin, end = README_SECTION
    if begin in previous and end in previous:  # the README-job section (--readme) stays
        section = previous[previous.index(begin): previous.index(end) + len(end)]
        lines[1:1] = ["", section]
    OUT.write_text("\n".join(lines) + "\n")
    print("\n".join(lines))


if __name__ == "__main__":
    main()
