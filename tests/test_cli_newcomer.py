"""Issue 26, what a newcomer trips over: help text, public refusals that load nothing heavy, no
silent overwrite, a spending display that names its deltas, ``inspect`` and the release table
from one renderer, and the repository's own hygiene (license string, benchmark data paths, one
check command for the README and CI)."""

from __future__ import annotations

import copy
import json
import os
import re
import subprocess
import sys
import tomllib
from pathlib import Path

import pytest
from release_support import ledger_lines
from release_support import write_csv as _write_csv
from release_support import write_policy as _policy
from typer.testing import CliRunner

from dpsummary.cli import app
from dpsummary.cli.render import SPENDING_NOTE, mechanism_rows

ROOT = Path(__file__).resolve().parents[1]
HEAVY = ("torch", "scipy", "opacus", "dp_accounting", "opendp")
runner = CliRunner()
WIDE = {"COLUMNS": "400"}  # rich wraps table cells at the terminal width; keep rows on one line


@pytest.fixture()
def home(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> Path:
    h = tmp_path / "home"
    monkeypatch.setenv("DPSUMMARY_HOME", str(h))
    return h


# ---- help text ---------------------------------------------------------------------------------
@pytest.mark.parametrize("command", [[], ["release"], ["inspect"], ["report"], ["verify"], ["keygen"]])
def test_help_shows_upper_case_arguments_and_untyped_flags(command: list[str]) -> None:
    res = runner.invoke(app, [*command, "--help"], env=WIDE)
    assert res.exit_code == 0, res.output
    assert "<bool>" not in res.output
    assert not re.search(r"\{[a-z_]+\}", res.output), res.output
    usage = next(line for line in res.output.splitlines() if "Usage:" in line)
    if command == ["release"]:
        assert usage.split("Usage:")[1].split() == ["dpsummary", "release", "[OPTIONS]", "DATA"]
        assert re.search(r"--epsilon\s+<float>", res.output)  # options that take a value keep a type
        assert re.search(r"--force\s+Replace", res.output)  # a flag: no type between name and help
    if command == ["report"]:
        assert usage.split("Usage:")[1].split()[-2:] == ["ARTIFACT", "DATA"]


# ---- public refusals: fast, one line, nothing heavy imported -------------------------------------
_PROBE = """
import json, sys
heavy = json.loads(sys.argv[2])
sys.argv = ["dpsummary", *json.loads(sys.argv[1])]
from dpsummary.cli import main
code = 0
try:
    main()
except SystemExit as exc:
    code = exc.code
print(json.dumps({"code": code, "heavy": [m for m in heavy if m in sys.modules]}))
"""


def _probe(args: list[str], tmp: Path) -> tuple[dict, str]:
    env = {**os.environ, "DPSUMMARY_HOME": str(tmp / "home"), "OMP_NUM_THREADS": "1", "COLUMNS": "200"}
    done = subprocess.run([sys.executable, "-c", _PROBE, json.dumps(args), json.dumps(HEAVY)],
                          capture_output=True, text=True, env=env, timeout=120)
    return json.loads(done.stdout.strip().splitlines()[-1]), done.stderr


def test_public_refusals_import_no_heavy_library(tmp_path: Path) -> None:
    data = _write_csv(tmp_path / "d.csv", 300)
    (tmp_path / "published.json").write_text("an artifact already published\n")
    (tmp_path / "bad.csv").write_bytes(b"\xff\xfe,b\n1,2\n")
    (tmp_path / "empty.csv").write_text("")
    cases = {
        "missing target column": ["release", str(data), "--epsilon", "0.2", "--target", "nope"],
        "header not UTF-8": ["release", str(tmp_path / "bad.csv"), "--epsilon", "0.2"],
        "empty file": ["release", str(tmp_path / "empty.csv"), "--epsilon", "0.2"],
        "missing file": ["release", str(tmp_path / "missing.csv"), "--epsilon", "0.2"],
        "existing output": ["release", str(data), "--epsilon", "0.2", "--out", str(tmp_path / "published.json")],
        "bad option": ["release", str(data), "--epsilon", "-1"],
        "bad size": ["release", str(data), "--epsilon", "0.2", "--size", "0"],
    }
    # Policy refusals (exit 3) are public too: the policy's model names are checked without torch.
    strict = tmp_path / "strict.toml"
    strict.write_text(Path(__file__).resolve().parents[1].joinpath("policies", "default.toml").read_text()
                      .replace('allowed_models = ["gaussian_mean", "linear", "logistic", "poisson", "bnn", "gmm", '
                               '"dpgmm"]', 'allowed_models = ["logistic"]'))
    assert 'allowed_models = ["logistic"]' in strict.read_text()
    policy_cases = {
        "epsilon over the cap": ["release", str(data), "--epsilon", "3"],
        "model not allowed": ["release", str(data), "--epsilon", "0.2", "--model", "poisson", "--policy", str(strict)],
    }
    codes = {**dict.fromkeys(cases, 2), **dict.fromkeys(policy_cases, 3)}
    for name, args in {**cases, **policy_cases}.items():
        result, stderr = _probe(args, tmp_path)
        assert result["code"] == codes[name], (name, stderr)
        assert result["heavy"] == [], (name, result["heavy"])
        errors = [line for line in stderr.splitlines() if line.startswith("error:")]
        assert len(errors) == 1 and "Traceback" not in stderr, (name, stderr)
    # Refusing an epsilon too small to calibrate needs the accountant's arithmetic (dp_accounting),
    # but nothing is read or charged.
    result, stderr = _probe(["release", str(data), "--epsilon", "0.0005"], tmp_path)
    assert result["code"] == 3 and "too small for the policy" in stderr, stderr
    assert "torch" not in result["heavy"], result["heavy"]
    assert not (tmp_path / "home" / "ledger.jsonl").exists()  # refused before any reservation
    assert (tmp_path / "published.json").read_text() == "an artifact already published\n"


def test_help_imports_no_heavy_library(tmp_path: Path) -> None:
    result, _ = _probe(["release", "--help"], tmp_path)
    assert result == {"code": 0, "heavy": []}


# ---- overwrite, spending, inspect: real releases ------------------------------------------------
def _release(data: Path, pol: Path, out: Path, *extra: str) -> dict:
    res = runner.invoke(app, ["release", str(data), "--epsilon", "0.5", "--policy", str(pol), "--out", str(out),
                              "--size", "5", "--json", *extra], env=WIDE)
    assert res.exit_code == 0, res.output
    return json.loads(res.stdout[res.stdout.index("{"):])


@pytest.fixture(scope="module")
def released(tmp_path_factory: pytest.TempPathFactory) -> dict:
    """Two releases of one source (the second replaces the first's artifact with --force), then a
    refused third without --force; the outputs and the ledger before the refusal."""
    tmp = tmp_path_factory.mktemp("newcomer")
    mp = pytest.MonkeyPatch()
    mp.setenv("DPSUMMARY_HOME", str(tmp / "home"))
    try:
        data = _write_csv(tmp / "d.csv", 600)
        pol = _policy(tmp / "p.toml", n=600, total_epsilon=3.0, cap=1.0, total_delta=1e-6)
        out = tmp / "d.dpsummary.json"
        first = _release(data, pol, out)
        first_digest = out.read_bytes()
        second = _release(data, pol, out, "--force")
        entries_before = ledger_lines(tmp / "home")
        refused = runner.invoke(app, ["release", str(data), "--epsilon", "0.5", "--policy", str(pol)], env=WIDE)
        table = runner.invoke(app, ["release", str(data), "--epsilon", "0.5", "--policy", str(pol), "--size", "5",
                                    "--out", str(tmp / "third.json")], env=WIDE)
        inspect = runner.invoke(app, ["inspect", str(tmp / "third.json")], env=WIDE)
        inspect_json = runner.invoke(app, ["inspect", str(tmp / "third.json"), "--json"], env=WIDE)
        from dpsummary.artifact import read_artifact

        _, claim, _ = read_artifact(tmp / "third.json", None)
        return {"tmp": tmp, "first": first, "second": second, "first_bytes": first_digest, "out": out,
                "entries_before": entries_before, "entries_after": ledger_lines(tmp / "home"), "refused": refused,
                "table": table, "inspect": inspect, "inspect_json": inspect_json, "claim": claim}
    finally:
        mp.undo()


def test_existing_artifact_is_refused_before_the_reservation_and_force_says_it_replaced(released: dict) -> None:
    refused = released["refused"]
    assert refused.exit_code == 2
    assert "already exists" in refused.output and "--force" in refused.output
    # The refusal wrote no ledger entry (it came before the reservation): every entry after it
    # belongs to the one release that followed.
    later = released["entries_after"][len(released["entries_before"]):]
    assert later and len({e["release_id"] for e in later}) == 1
    assert released["first"]["written"].endswith("(new file)")
    assert released["second"]["written"].endswith("(replaced the previous file, --force)")
    assert released["out"].read_bytes() != released["first_bytes"]


def test_spending_shows_release_cost_and_source_totals_with_their_deltas(released: dict) -> None:
    first, second = released["first"], released["second"]
    by_acc = {s["accountant"]: s for s in second["spending"]}
    first_by_acc = {s["accountant"]: s for s in first["spending"]}
    assert set(by_acc) == {"rdp", "prv", "pld"}
    rdp = by_acc["rdp"]
    assert rdp["of_record"] and rdp["budget_left"]["enforced"]
    assert rdp["release"] == {"epsilon": second["epsilon"]["rdp"], "delta": second["delta"]}
    assert rdp["source_before"]["delta"] == rdp["source_after"]["delta"] == 1e-6  # the policy's total_delta
    # "before" is the first release's "after" (same ledger, composed without the second release).
    for acc in ("rdp", "pld"):
        assert by_acc[acc]["source_before"]["epsilon"] == pytest.approx(first_by_acc[acc]["source_after"]["epsilon"],
                                                                         rel=1e-9)
        assert first_by_acc[acc]["source_before"]["epsilon"] == 0.0
        assert by_acc[acc]["source_after"]["epsilon"] > by_acc[acc]["source_before"]["epsilon"]
    assert rdp["budget_left"]["epsilon"] == pytest.approx(3.0 - rdp["source_after"]["epsilon"])
    # Sub-additive composition: two releases cost less than twice one, under RDP.
    assert rdp["source_after"]["epsilon"] < 2 * first_by_acc["rdp"]["source_after"]["epsilon"]
    # PRV is not composed here; it says where to find it instead of showing a number.
    assert by_acc["prv"]["source_after"]["epsilon"] is None


def test_release_table_names_each_delta_and_explains_the_totals(released: dict) -> None:
    out = released["table"].output
    assert released["table"].exit_code == 0, out
    assert "privacy spent" in out and "budget left" in out
    assert re.search(r"RDP \(of record\)\s*│\s*0\.\d{4} \(delta [0-9.e-]+\)\s*│\s*0\.\d{4} -> 0\.\d{4} "
                     r"\(delta 1e-06\)\s*│\s*\d\.\d{4} of 3 \(delta 1e-06\)", out), out
    assert " ".join(SPENDING_NOTE.split()) in " ".join(out.split())
    assert "naive sum" not in out


def test_inspect_and_the_release_table_come_from_one_renderer(released: dict) -> None:
    rows = mechanism_rows(released["claim"])
    assert rows[0][1].startswith("noise-aware-newton: 5 rounds")
    assert [label for label, _ in rows[1:7]] == ["round 1", "round 2", "round 3", "round 4", "round 5", "posterior"]
    assert "curvature's noise integrated out (200 imputed curvatures, each kept at its own trace" in rows[6][1]
    assert "drawn on the one-hot support of the curvature;" in rows[6][1]
    # How many exact relations a release projects off is post-processing of its noisy curvature
    # (OS entropy), so the count is set here rather than read from one release.
    one = copy.deepcopy(released["claim"])
    one["mechanism"]["exact_relations"] = [[1.0, -1.0]]
    assert ("each kept at its own trace, projected off 1 exact one-hot relation(s), drawn on the one-hot support "
            "of the curvature;") in mechanism_rows(one)[6][1]
    none = copy.deepcopy(released["claim"])
    none["mechanism"]["exact_relations"] = []
    assert "exact one-hot relation" not in mechanism_rows(none)[6][1]
    # A schema without a categorical column has no one-hot support: the row does not claim one.
    bare = copy.deepcopy(released["claim"])
    bare["mechanism"]["curvature_support"] = False
    assert "one-hot support" not in mechanism_rows(bare)[6][1]
    inspect = released["inspect"].output
    table = released["table"].output
    for label, text in rows:
        assert f"  {label}: {text}" in inspect
        assert re.search(rf"│ {re.escape(label)}\s*│ {re.escape(text)}\s*│", table), (label, text)
    assert "sigma None" not in inspect
    assert json.loads(released["inspect_json"].stdout)["released"] == [{"what": a, "detail": b} for a, b in rows]


def test_noise_aware_rows_give_each_rounds_noise_and_sensitivity(released: dict) -> None:
    mech = released["claim"]["mechanism"]
    rows = dict(mechanism_rows(released["claim"]))
    for i, (bounds, (s_sigma, c_sigma)) in enumerate(zip(mech["rounds"], mech["noise_multipliers"], strict=True)):
        text = rows[f"round {i + 1}"]
        assert f"noise sd {s_sigma * bounds['score_bound']:.4g}" in text
        assert f"noise sd {c_sigma * bounds['curvature_bound']:.4g}" in text


def _claim(mechanism: dict) -> dict:
    return {"mechanism": {"count_noise_multiplier": None, "preprocessing_noise_multiplier": None,
                          "quality_noise_multiplier": 12.5, **mechanism}}


def test_every_mechanism_is_described_from_its_claim() -> None:
    """The claim fields written by dpsummary.release for each mechanism (names as in the code)."""
    psvi = dict(mechanism_rows(_claim({"name": "dp-psvi", "noise_multiplier": 3.0, "sample_rate": 0.01, "steps": 500,
                                       "clip_norm_rule": "median rule", "initialisation": {"noise_multiplier": 7.0}})))
    assert "500 steps" in psvi["mechanism"] and "q = 0.01" in psvi["mechanism"]
    assert "multiplier 3 x sensitivity C_t" in psvi["steps 1..500"] and "median rule" in psvi["steps 1..500"]
    assert "multiplier 7" in psvi["initialisation"]
    bb = dict(mechanism_rows(_claim({"name": "dp-bb-psvi", "noise_multiplier": 2.0, "sample_rate": 0.05,
                                     "steps": 100, "clip_norm": 4.0, "statistic_dimension": 321})))
    assert "multiplier 2 x sensitivity 4 = noise sd 8" in bb["steps 1..100"]
    kd = dict(mechanism_rows(_claim({"name": "dp-kd-tree", "noise_multiplier": 9.0, "levels": 6,
                                     "split_threshold": 3.0, "keep_threshold": 2.0})))
    assert "6 levels" in kd["mechanism"] and "noise sd 9 records" in kd["levels 1..6"]
    for rows in (psvi, bb, kd):
        assert rows["data-quality counts"].startswith("1 Gaussian, multiplier 12.5")
        assert rows["record count"].startswith("not released")
    unknown = dict(mechanism_rows(_claim({"name": "future-mech", "noise_multiplier": 1.5})))
    assert "future-mech" in unknown["mechanism"] and "noise_multiplier 1.5" in unknown["mechanism"]


# ---- repository hygiene --------------------------------------------------------------------------
def test_license_is_an_spdx_string_with_a_setuptools_that_reads_it() -> None:
    meta = tomllib.loads((ROOT / "pyproject.toml").read_text())
    assert meta["project"]["license"] == "Apache-2.0"
    assert "setuptools>=77" in meta["build-system"]["requires"]  # PEP 639 strings: setuptools 77+


def test_benchmarks_find_shared_data_by_one_overridable_lookup(tmp_path: Path) -> None:
    for path in (ROOT / "benchmarks").glob("*.py"):
        assert not re.search(r"[\"']/(work|home|Users)/", path.read_text()), path
    code = "import sys; sys.path.insert(0, 'benchmarks'); import data_paths; print(data_paths.SHARED_DATA)"
    env = {**os.environ, "DPSUMMARY_SHARED_DATA": str(tmp_path)}
    assert subprocess.run([sys.executable, "-c", code], cwd=ROOT, env=env, capture_output=True, text=True,
                          check=True).stdout.strip() == str(tmp_path)
    env.pop("DPSUMMARY_SHARED_DATA")
    default = subprocess.run([sys.executable, "-c", code], cwd=ROOT, env=env, capture_output=True, text=True,
                             check=True).stdout.strip()
    assert Path(default) == ROOT.parent / "shared" / "data"


def test_readme_development_command_is_the_one_ci_runs() -> None:
    readme = (ROOT / "README.md").read_text()
    development = readme.split("## Development", 1)[1]
    assert "bash .ci/check" in development
    assert (ROOT / ".ci" / "run").read_text().rstrip().endswith("bash .ci/check")
    check = (ROOT / ".ci" / "check").read_text()
    assert "ruff check dpsummary tests benchmarks examples" in check
    assert "mypy dpsummary" in check and "python -m pytest" in check


# ---- issue 49, what a newcomer tripped on -------------------------------------------------------
def _income_csv(path: Path, n: int = 400) -> Path:
    """A small table whose header a newcomer would misspell: age, income, label."""
    import numpy as np

    rng = np.random.default_rng(49)
    age = rng.integers(18, 90, n)
    income = rng.uniform(0, 100, n)
    label = np.where(rng.random(n) < 1 / (1 + np.exp(-(income - 50) / 20)), "yes", "no")
    path.write_text("age,income,label\n" + "".join(f"{a},{i:.2f},{y}\n" for a, i, y in zip(age, income, label,
                                                                                           strict=True)))
    return path


def test_policy_init_writes_into_the_working_directory_and_says_where(
        tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    """Not into the data's folder (which may be read-only or shared): into the directory the
    command runs in, named after the data, and the line says the full path."""
    (tmp_path / "data").mkdir()
    work = tmp_path / "work"
    work.mkdir()
    data = _write_csv(tmp_path / "data" / "d.csv", 30)
    monkeypatch.chdir(work)
    res = runner.invoke(app, ["policy", "init", str(data)], env=WIDE)
    assert res.exit_code == 0, res.output
    written = work / "d.policy.toml"
    assert written.is_file() and not (tmp_path / "data" / "d.policy.toml").exists()
    assert f"wrote {written.resolve()} (in the current directory" in " ".join(res.output.split())
    # --out still wins, and the line then names that path without the working-directory note.
    res = runner.invoke(app, ["policy", "init", str(data), "--out", str(tmp_path / "p.toml")], env=WIDE)
    assert res.exit_code == 0 and (tmp_path / "p.toml").is_file()
    assert "current directory" not in res.output


def test_a_misspelt_target_lists_the_header_and_the_closest_column(tmp_path: Path, home: Path) -> None:
    data = _income_csv(tmp_path / "people.csv")
    for args in (["release", str(data), "--epsilon", "0.5", "--target", "incme"],
                 ["policy", "init", str(data), "--target", "incme", "--out", str(tmp_path / "p.toml")]):
        res = runner.invoke(app, args, env=WIDE)
        lines = [x for x in res.output.splitlines() if x.startswith("error:")]
        assert res.exit_code == 2 and len(lines) == 1, (args, res.output)
        assert "did you mean --target income?" in lines[0] and "age, income, label" in lines[0], lines[0]
    # Nothing close: the columns alone.
    res = runner.invoke(app, ["release", str(data), "--epsilon", "0.5", "--target", "zzz"], env=WIDE)
    assert res.exit_code == 2 and "did you mean" not in res.output and "age, income, label" in res.output


def test_spark_on_a_csv_names_the_conversion_and_the_conversion_works(
        tmp_path: Path, home: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    """The refusal gives a pyarrow one-liner; run as printed, it writes the Parquet file the
    message names, with the CSV's header."""
    from dpsummary.header import read_header
    from dpsummary.spark import session

    # The CSV check needs neither pyspark nor Java: the same refusal on a machine without them.
    monkeypatch.setattr(session, "spark_available", lambda: None)
    data = _income_csv(tmp_path / "people.csv", 50)
    pol = _policy(tmp_path / "p.toml", n=None, schema=False)
    res = runner.invoke(app, ["release", str(data), "--epsilon", "0.5", "--engine", "spark", "--policy", str(pol)],
                        env=WIDE)
    line = " ".join(res.output.split())
    assert res.exit_code == 2 and "--engine spark reads Parquet" in line, res.output
    command = re.search(r'python -c "([^"]+)"', line)
    assert command is not None, line
    parquet = tmp_path / "people.parquet"
    assert f"then pass {parquet}" in line and "--engine local" in line
    subprocess.run([sys.executable, "-c", command.group(1)], check=True, cwd=tmp_path)
    assert read_header(parquet) == ["age", "income", "label"]


def test_inspect_on_a_csv_says_it_reads_release_artifacts(tmp_path: Path, home: Path) -> None:
    data = _income_csv(tmp_path / "people.csv", 20)
    res = runner.invoke(app, ["inspect", str(data)], env=WIDE)
    line = " ".join(res.output.split())
    assert res.exit_code == 2 and "not UTF-8 JSON" not in line, res.output
    assert "people.csv is not a release artifact: it looks like a CSV table" in line, line
    assert "pass the path of a release artifact (the .dpsummary.json file `dpsummary release` wrote)" in line
    # A binary file is told apart from text, and no byte of either is repeated.
    blob = tmp_path / "blob.bin"
    blob.write_bytes(bytes(range(256)))
    res = runner.invoke(app, ["inspect", str(blob)], env=WIDE)
    assert res.exit_code == 2 and "not UTF-8 text" in res.output, res.output


def test_a_symmetric_kl_below_zero_by_rounding_prints_zero(
        tmp_path: Path, home: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    """The exact pseudocoreset matches its target to rounding, where the divergence can come out
    a few ulps negative (a release printed "symmetric KL -5.68e-14 nats"): the release says 0 and
    records 0."""
    from dpsummary.constructors import gaussian_target

    original = gaussian_target._sym_kl

    def rounded_below_zero(*args: object, **kwargs: object) -> object:
        return original(*args, **kwargs) * 0.0 - 5.68e-14  # type: ignore[operator]

    monkeypatch.setattr(gaussian_target, "_sym_kl", rounded_below_zero)
    # The KL is printed by the closed-form construction, which a GLM release uses where moment
    # matching (issue 48) does not apply: force that path.
    from dpsummary.constructors import moment_match

    monkeypatch.setattr(moment_match, "match_moments", lambda *args, **kwargs: None)
    data = _write_csv(tmp_path / "d.csv", 2000)
    pol = _policy(tmp_path / "p.toml", n=2000)
    out = tmp_path / "d.json"
    res = runner.invoke(app, ["release", str(data), "--epsilon", "1", "--policy", str(pol), "--out", str(out),
                              "--size", "5", "--seed", "0"], env=WIDE)
    assert res.exit_code == 0, res.output
    text = " ".join(res.output.split())
    assert "symmetric KL 0 nats" in text and "KL -" not in text, res.output
    shown = runner.invoke(app, ["inspect", str(out), "--json"], env=WIDE)
    assert shown.exit_code == 0 and "-5.68e-14" not in shown.output
