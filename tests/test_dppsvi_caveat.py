"""Issue 37, item 4: DP-PSVI's intervals are calibrated on simulated tables only, so every dp-psvi
artifact records ``mechanism.interval_calibration`` and every reader says so: the release's last
note, ``dpsummary inspect``, ``dpsummary.load`` (a UserWarning and an attribute) and every
exporter. A dp-psvi artifact without the record (written before it) warns as status "unknown";
a noise-aware-newton artifact shows no such warning anywhere.

One small DP-PSVI release and one default release (600 rows, public schema) serve every test.
"""

from __future__ import annotations

import json
import warnings
from pathlib import Path
from typing import Any

import pytest
from release_support import write_csv, write_policy
from typer.testing import CliRunner

import dpsummary
from dpsummary import caveats
from dpsummary.cli import app
from dpsummary.export import FORMATS

runner = CliRunner()
CAVEAT = "dp-psvi's intervals are NOT validated on real tables"


def _flat(text: str) -> str:
    """The console wraps long lines: compare with whitespace collapsed."""
    return " ".join(text.split())


@pytest.fixture(scope="module")
def made(tmp_path_factory: pytest.TempPathFactory) -> dict[str, Any]:
    """A dp-psvi artifact, the same re-signed without its interval_calibration (a pre-issue-37
    artifact), and a default (noise-aware-newton) artifact, with the CLI output of the releases."""
    from dpsummary import keys
    from dpsummary.artifact import read_artifact, write_artifact

    root = tmp_path_factory.mktemp("caveat")
    home = root / "home"
    data = write_csv(root / "d.csv", 600)
    pol = write_policy(root / "p.toml", n=600)
    with pytest.MonkeyPatch.context() as mp:
        mp.setenv("DPSUMMARY_HOME", str(home))
        psvi = runner.invoke(app, ["release", str(data), "--epsilon", "1", "--policy", str(pol), "--out",
                                   str(root / "psvi.json"), "--steps", "20", "--size", "4", "--seed", "1",
                                   "--mechanism", "dp-psvi"])
        assert psvi.exit_code == 0, psvi.output
        default = runner.invoke(app, ["release", str(data), "--epsilon", "1", "--policy", str(pol), "--out",
                                      str(root / "newton.json"), "--size", "4", "--seed", "1"])
        assert default.exit_code == 0, default.output
    pub = home / "keys" / "dpsummary.pub"
    body, claim, _ = read_artifact(root / "psvi.json", keys.load_public_key(pub))
    old_claim = json.loads(json.dumps(claim))
    del old_claim["mechanism"]["interval_calibration"]
    write_artifact(root / "old.json", body, old_claim, keys.load_private_key(home / "keys" / "dpsummary.key"))
    return {"root": root, "pub": pub, "psvi": root / "psvi.json", "old": root / "old.json",
            "newton": root / "newton.json", "psvi_output": psvi.output, "newton_output": default.output}


def _load_quietly(path: Path, pub: Path, **kwargs: Any) -> dpsummary.analyst.Release:
    with warnings.catch_warnings():
        warnings.simplefilter("ignore", caveats.IntervalCalibrationWarning)
        return dpsummary.load(path, key=pub, **kwargs)


# ---- the record --------------------------------------------------------------------------------
def test_dp_psvi_claim_records_the_fixed_public_caveat(made: dict[str, Any]) -> None:
    rel = _load_quietly(made["psvi"], made["pub"])
    record = rel.claim["mechanism"]["interval_calibration"]
    # Fixed text, the same for every release: nothing in it can come from the data.
    assert record == caveats.DP_PSVI_INTERVAL_CALIBRATION
    assert record["status"] == "not-validated-on-real-tables"
    assert record["evidence"] == "benchmarks/results/calibration.md"
    assert rel.interval_calibration == record


def test_reader_rules() -> None:
    """Present: the record; dp-psvi without it: "unknown"; malformed: "unknown"; another
    mechanism without it: no caveat; another mechanism with it: the record (generic)."""
    read = caveats.interval_calibration
    assert read({"mechanism": {"name": "dp-psvi"}})["status"] == "unknown"  # type: ignore[index]
    assert read({"mechanism": {"name": "dp-psvi", "interval_calibration": "yes"}})["status"] == "unknown"  # type: ignore[index]
    assert read({"mechanism": {"name": "noise-aware-newton"}}) is None
    assert read({}) is None and read(None) is None
    other = {"status": "not-validated-on-real-tables", "reason": "r", "evidence": "e"}
    assert read({"mechanism": {"name": "x", "interval_calibration": other}}) == other
    assert caveats.warning_text({"mechanism": {"name": "noise-aware-newton"}}) is None
    assert "(interval calibration: unknown)" in caveats.warning_text({"mechanism": {"name": "dp-psvi"}})  # type: ignore[operator]


# ---- dpsummary release ---------------------------------------------------------------------------
def test_release_ends_with_a_warning_note_and_a_table_row(made: dict[str, Any]) -> None:
    out = _flat(made["psvi_output"])
    notes = out[out.index("Only the accountant of record's budget is enforced."):]  # the notes after the tables
    assert f"note: warning: {CAVEAT}" in notes
    assert notes.rstrip().endswith("evidence: benchmarks/results/calibration.md")  # the last line printed
    assert "interval calibration" in out and "not-validated-on-real-tables" in out


# ---- dpsummary inspect ---------------------------------------------------------------------------
def test_inspect_warns_on_its_second_line(made: dict[str, Any]) -> None:
    res = runner.invoke(app, ["inspect", str(made["psvi"]), "--key", str(made["pub"])])
    assert res.exit_code == 0, res.output
    lines = res.output.splitlines()
    assert lines[1].startswith(f"  WARNING: {CAVEAT}")
    assert any(line.startswith("  interval calibration: not-validated-on-real-tables") for line in lines)
    res = runner.invoke(app, ["inspect", str(made["psvi"]), "--key", str(made["pub"]), "--json"])
    payload = json.loads(res.stdout)
    assert payload["mechanism"]["interval_calibration"]["status"] == "not-validated-on-real-tables"
    assert any(r["what"] == "interval calibration" for r in payload["released"])


# ---- dpsummary.load ------------------------------------------------------------------------------
@pytest.mark.parametrize("posterior", ["default", "raw"])
def test_load_warns_once_and_exposes_the_record(made: dict[str, Any], posterior: str) -> None:
    with warnings.catch_warnings(record=True) as caught:
        warnings.simplefilter("always")
        rel = dpsummary.load(made["psvi"], key=made["pub"], posterior=posterior)
    ours = [w for w in caught if issubclass(w.category, caveats.IntervalCalibrationWarning)]
    assert len(ours) == 1 and issubclass(ours[0].category, UserWarning)
    message = str(ours[0].message)
    assert message.startswith(f"psvi.json: {CAVEAT}") and "benchmarks/results/calibration.md" in message
    assert ours[0].filename == __file__  # it points at the analyst's line, not at dpsummary's wrapper
    assert rel.interval_calibration is not None
    assert rel.interval_calibration["status"] == "not-validated-on-real-tables"


# ---- exporters -----------------------------------------------------------------------------------
@pytest.mark.parametrize("to", FORMATS)
def test_every_exporter_writes_the_caveat(made: dict[str, Any], to: str, tmp_path: Path) -> None:
    rel = _load_quietly(made["psvi"], made["pub"])
    files = rel.export(to, tmp_path)
    doc = json.loads((tmp_path / "release.json").read_text())
    field = doc["interval_calibration"]
    assert field["status"] == "not-validated-on-real-tables"
    assert field["warning"].startswith(CAVEAT)
    programs = [f for f in files if f.suffix in (".py", ".stan")]
    assert programs  # every format writes at least one program
    for f in programs:
        comment = "//" if f.suffix == ".stan" else "#"
        head = f.read_text().splitlines()[0]
        assert head.startswith(f"{comment} WARNING: {CAVEAT}"), f.name
        if f.suffix == ".py":  # the script prints it when run (release.stan's runner is run_pystan.py)
            assert 'print(f"warning: {' in f.read_text()
    if to == "json":  # the reference adapter reads the warning it prints (NumPy only: cheap to run here)
        from dpsummary.export.templates import reference

        assert reference.from_document(doc)["interval_warning"] == field["warning"]
        compile((tmp_path / "reference.py").read_text(), "reference.py", "exec")  # the header keeps it valid


def test_cli_export_says_so_in_one_line(made: dict[str, Any], tmp_path: Path) -> None:
    import dpsummary.cli.export  # noqa: F401  (registers the command)

    res = runner.invoke(app, ["export", str(made["psvi"]), "--to", "stan", "--out", str(tmp_path),
                              "--key", str(made["pub"])])
    assert res.exit_code == 0, res.output
    assert f"warning: {CAVEAT}" in res.output
    assert "IntervalCalibrationWarning" not in res.output  # not a raw Python warning


# ---- artifacts written before the record ---------------------------------------------------------
def test_dp_psvi_artifact_without_the_record_still_loads_and_warns_as_unknown(made: dict[str, Any],
                                                                             tmp_path: Path) -> None:
    with warnings.catch_warnings(record=True) as caught:
        warnings.simplefilter("always")
        rel = dpsummary.load(made["old"], key=made["pub"])
    ours = [w for w in caught if issubclass(w.category, caveats.IntervalCalibrationWarning)]
    assert len(ours) == 1 and "(interval calibration: unknown)" in str(ours[0].message)
    assert rel.verified and rel.interval_calibration is not None
    assert rel.interval_calibration["status"] == "unknown"
    res = runner.invoke(app, ["inspect", str(made["old"]), "--key", str(made["pub"])])
    assert res.exit_code == 0, res.output
    assert res.output.splitlines()[1].startswith(f"  WARNING: {CAVEAT} (interval calibration: unknown)")
    rel.export("json", tmp_path)
    assert json.loads((tmp_path / "release.json").read_text())["interval_calibration"]["status"] == "unknown"


# ---- the default mechanism: no such warning ------------------------------------------------------
def test_noise_aware_newton_artifact_shows_no_interval_warning(made: dict[str, Any], tmp_path: Path) -> None:
    from dpsummary.export import numpyro, pymc
    from dpsummary.export.templates import reference

    # (The default may print its own `note: warning:` on unconverged Newton rounds: a different,
    # per-release diagnostic, so look for this caveat's words.)
    assert "not validated" not in made["newton_output"].lower()
    assert "interval calibration" not in _flat(made["newton_output"])
    with warnings.catch_warnings():
        warnings.simplefilter("error", caveats.IntervalCalibrationWarning)
        rel = dpsummary.load(made["newton"], key=made["pub"])
    assert rel.claim["mechanism"]["name"] == "noise-aware-newton"
    assert "interval_calibration" not in rel.claim["mechanism"] and rel.interval_calibration is None
    res = runner.invoke(app, ["inspect", str(made["newton"]), "--key", str(made["pub"])])
    assert res.exit_code == 0, res.output
    assert "WARNING" not in res.output and "interval calibration" not in res.output
    for to in FORMATS:
        out = tmp_path / to
        rel.export(to, out)
        assert json.loads((out / "release.json").read_text())["interval_calibration"] is None
    # Without a caveat the programs are the templates byte for byte.
    assert (tmp_path / "json" / "reference.py").read_bytes() == Path(reference.__file__).read_bytes()
    assert (tmp_path / "numpyro" / "numpyro_model.py").read_bytes() == numpyro.TEMPLATE.read_bytes()
    assert (tmp_path / "pymc" / "pymc_model.py").read_bytes() == pymc.TEMPLATE.read_bytes()
    assert not (tmp_path / "stan" / "release.stan").read_text().startswith("// WARNING")
