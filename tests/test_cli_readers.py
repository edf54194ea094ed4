"""What the curator, the analyst and the auditor read (issue 36), through the command line.

* ``inspect`` and ``report`` of a real release of EVERY registered mechanism show the model, the
  prior, the noise and the epsilons of the signed body and claim (the display must never
  disagree with what was signed); a Poisson release shows its centred prior.
* ``report``'s figures against an independent numpy computation (a Poisson release).
* a closed pipe is a normal end; ``verify`` formats delta; ``inspect`` shows public inputs as rows;
  a private key is refused where a public key is expected, without echoing it.
* ``audit`` prints the ledger's head, holds the file against ``--expect-head`` (a tail-truncated
  ledger fails), composes a strict-policy source at a delta it names, and a wrong key is one line.
* an unknown ``--model`` is a usage error listing the models; ``--version``; refusals name a fix.
"""

from __future__ import annotations

import importlib.util
import json
import os
import re
import subprocess
import sys
from pathlib import Path
from typing import Any

import numpy as np
import pytest
from release_support import write_csv, write_policy
from typer.testing import CliRunner

from dpsummary.cli import app
from dpsummary.mechanisms import REGISTRY

runner = CliRunner()
WIDE = {"COLUMNS": "200"}
_CONTRACT = Path(__file__).resolve().parent / "mechanisms" / "test_mechanism_contract.py"


def _contract() -> Any:
    """The mechanism contract suite's module: its per-mechanism small release requests (CASES)."""
    name = "_mechanism_contract_cases"
    if name in sys.modules:
        return sys.modules[name]
    spec = importlib.util.spec_from_file_location(name, _CONTRACT)
    assert spec is not None and spec.loader is not None
    module = importlib.util.module_from_spec(spec)
    sys.modules[name] = module  # dataclasses look their module up while it executes
    spec.loader.exec_module(module)
    return module


def _release(tmp: Path, name: str, **overrides: Any) -> tuple[Any, dict[str, Any], dict[str, Any]]:
    """A real (small) release of mechanism ``name``: (request, body, claim)."""
    from dpsummary.artifact import read_artifact
    from dpsummary.release import run_release

    req = _contract()._request(tmp, name, **overrides)
    run_release(req)
    body, claim, _ = read_artifact(req.out)
    return req, body, claim


def _flat(text: str) -> str:
    """Help text with rich's panel borders removed and whitespace collapsed (wrapping-proof)."""
    return " ".join(text.replace("│", " ").split())


def _num(x: float) -> str:
    return f"{x:.4g}"


def _noise_figures(mech: dict[str, Any]) -> list[str]:
    """Every noise multiplier the claim's mechanism section records, as the readers print them."""
    out = [_num(mech[k]) for k in ("count_noise_multiplier", "preprocessing_noise_multiplier",
                                   "quality_noise_multiplier") if isinstance(mech.get(k), float | int)]
    for pair in mech.get("noise_multipliers") or []:
        out += [_num(x) for x in pair]
    if isinstance(mech.get("noise_multiplier"), float | int):
        out.append(f"{mech['noise_multiplier']:.4f}")
    init = mech.get("initialisation")
    if isinstance(init, dict) and isinstance(init.get("noise_multiplier"), float | int):
        out.append(_num(init["noise_multiplier"]))
    return out


def _prior_figures(model: dict[str, Any], names: list[str]) -> list[str]:
    if "n_components" in model:  # a mixture: its prior is the weights' process (theta's is a placeholder)
        return [f"({model['process']})", f"{model['n_components']} components"]
    mean = model.get("prior_mean") or []
    shown = [f"{n} {_num(m)}" for n, m in zip(names, mean, strict=False) if m != 0]
    return [f"{_num(model['prior_scale'])}^2 I", *shown] if "prior_scale" in model else []


@pytest.mark.parametrize("name", list(REGISTRY))
def test_inspect_and_report_show_what_was_signed_for_every_mechanism(tmp_path: Path, name: str) -> None:
    overrides: dict[str, Any] = {}
    if name == "noise-aware-newton":  # the Poisson release's centred prior (item 1)
        overrides = {"target_kind": "count", "model": "poisson"}
    req, body, claim = _release(tmp_path, name, **overrides)
    model = body["summary"]["model"]
    res = runner.invoke(app, ["inspect", str(req.out)], env=WIDE)
    assert res.exit_code == 0, res.output
    text = res.output
    assert f"model {model['name']}" in text
    assert f"{len(body['summary']['weights'])} weighted pseudopoints" in text
    for figure in _prior_figures(model, body["param_names"]):
        assert figure in text, (figure, text)
    centred = any(m != 0 for m in model.get("prior_mean") or [])
    assert ("prior N(0," in text) == (not centred and "n_components" not in model)
    if name == "noise-aware-newton":  # the centred prior's display, whatever this release's noise gave
        from dpsummary.cli.render import inspect_lines

        shifted = json.loads(json.dumps(body))
        shifted["summary"]["model"]["prior_mean"] = [5.297] + [0.0] * (len(model["prior_mean"]) - 1)
        (line,) = [x for x in inspect_lines(shifted, claim) if "prior" in x]
        assert f"prior N(mu, {_num(model['prior_scale'])}^2 I), mu: {body['param_names'][0]} 5.297, 0 elsewhere" in line
    for accountant, eps in claim["epsilon"].items():
        assert f"{accountant} {eps:.4g}" in text
    assert f"delta {claim['delta']:.3g};" in text and "0000000" not in text
    for figure in _noise_figures(claim["mechanism"]):
        assert figure in text, (figure, text)
    shown = json.loads(runner.invoke(app, ["inspect", str(req.out), "--json"]).output)
    assert shown["model"] == model and shown["epsilon"] == claim["epsilon"] and shown["delta"] == claim["delta"]

    out = tmp_path / "r.html"
    rep = runner.invoke(app, ["report", str(req.out), str(req.data), "--out", str(out)], env=WIDE)
    if "n_components" in model:  # mixtures: a one-line refusal naming where they are compared
        assert rep.exit_code == 2 and "benchmarks/mixtures.py" in rep.output and not out.exists()
        return
    assert rep.exit_code == 0, rep.output
    page = out.read_text()
    assert f"M = {len(body['summary']['weights'])} pseudopoints, model {model['name']}" in page
    for accountant, eps in claim["epsilon"].items():
        assert f"{accountant.upper()} {eps:.4g}" in page
    assert f"delta {claim['delta']:.3g}</td>" in page
    for figure in [*_prior_figures(model, body["param_names"]), *_noise_figures(claim["mechanism"])]:
        assert figure in page, figure


def _numpy_points(data: Path, transform: dict[str, Any]) -> tuple[np.ndarray, np.ndarray]:
    """The design matrix and counts of ``write_csv``'s table through the artifact's public
    transform, computed here (clip to the bounds, centre and scale; one-hot categories)."""
    cols = {c["name"]: c for c in transform["schema"]["columns"]}
    rows = [line.split(",") for line in data.read_text().splitlines()[1:]]
    x1 = np.clip(np.array([float(r[0]) for r in rows]), cols["x1"]["lower"], cols["x1"]["upper"])
    feats = [(x1 - transform["centres"]["x1"]) / transform["scales"]["x1"]]
    feats += [np.array([r[1] == c for r in rows], dtype=float) for c in cols["x2"]["categories"]]
    y = np.clip(np.array([float(r[2]) for r in rows]), cols["y"]["lower"], cols["y"]["upper"])
    return np.column_stack(feats), y


def test_report_figures_match_an_independent_computation_for_poisson(tmp_path: Path) -> None:
    """Item 2: the report's log-likelihoods and RMSE, recomputed with numpy in closed form from
    each posterior's mean and covariance: E log-lik = y m - exp(m + v/2) - log y! with eta ~
    N(m, v); the predictive mean exp(m + v/2). The full-data posterior has the best E log-lik."""
    from scipy.special import gammaln, logsumexp

    from dpsummary.report import build_report

    req, body, _ = _release(tmp_path, "noise-aware-newton", target_kind="count", model="poisson")
    rep = build_report(req.out, req.data, baselines=())
    feats, y = _numpy_points(req.data, body["summary"]["transform"])
    names = rep.param_names
    assert rep.model.name == "poisson"
    design = np.column_stack([np.ones(len(y)), feats]) if names[0] == "intercept" else feats
    assert design.shape[1] == rep.model.param_dim
    assert rep.records_used == len(y)
    figures = {}
    draws_per_figure = 200  # the report's Monte Carlo draws per figure
    for r in rep.results:
        mean = r.posterior.mean.numpy()
        cov = r.posterior.cov.numpy()
        m, v = design @ mean, np.einsum("ij,jk,ik->i", design, cov, design)
        expected = float(np.mean(y * m - np.exp(m + v / 2) - gammaln(y + 1)))  # closed form
        draws = np.random.default_rng(0).multivariate_normal(mean, cov, size=100 * draws_per_figure)
        eta = design @ draws.T
        ll = y[:, None] * eta - np.exp(eta) - gammaln(y + 1)[:, None]
        # The spread of each figure over 100 independent sets of 200 draws: the report's own
        # figure (one such set) must lie within 5 of its sds of their mean.
        sets = np.split(np.arange(eta.shape[1]), 100)
        lpds = np.array([np.mean(logsumexp(ll[:, s], axis=1) - np.log(len(s))) for s in sets])
        rmses = np.array([np.sqrt(np.mean((np.exp(eta[:, s]).mean(1) - y) ** 2)) for s in sets])
        ells = np.array([ll[:, s].mean() for s in sets])
        assert ells.mean() == pytest.approx(expected, abs=5 * ells.std() / 10 + 1e-9)  # numpy agrees with itself
        for key, values in (("expected_loglik", ells), ("test_loglik", lpds), ("rmse", rmses)):
            assert abs(r.metrics[key] - values.mean()) <= 5 * values.std() + 1e-6 * abs(values.mean()), (
                r.name, key, r.metrics[key], values.mean(), values.std())
        figures[r.name] = expected
    assert figures["full"] == max(figures.values())
    # The page shows the same figures under labels that say which is which.
    from dpsummary.report import render_html

    page = render_html(rep)
    assert "E log-lik / record" in page and "log pred. density / record" in page
    full = next(r for r in rep.results if r.name == "full")
    assert f"<td>{full.metrics['expected_loglik']:.4g}</td>" in page


#: The installed console script's entry point, run in a fresh interpreter.
ENTRY = [sys.executable, "-c", "from dpsummary.cli import main; main()"]


@pytest.fixture
def released(tmp_path: Path) -> dict[str, Any]:
    """One small noise-aware release (public count and schema) in this test's dpsummary home."""
    req, body, claim = _release(tmp_path, "noise-aware-newton")
    home = Path(os.environ["DPSUMMARY_HOME"])
    return {"req": req, "body": body, "claim": claim, "pub": home / "keys" / "dpsummary.pub",
            "key": home / "keys" / "dpsummary.key", "ledger": req.ledger, "tmp": tmp_path}


def test_a_closed_pipe_is_a_normal_end(released: dict[str, Any]) -> None:
    """Item 3: ``dpsummary inspect X | head -1``: no message, the conventional 141 (or 0)."""
    for _ in range(3):
        proc = subprocess.Popen([*ENTRY, "inspect", str(released["req"].out)],
                                stdout=subprocess.PIPE, stderr=subprocess.PIPE)
        assert proc.stdout is not None and proc.stderr is not None
        first = proc.stdout.readline()
        proc.stdout.close()  # what `head -1` does after its line
        err = proc.stderr.read()
        code = proc.wait(timeout=120)
        assert first.startswith(str(released["req"].out).encode())
        assert code in (0, 141), (code, err)
        assert b"error" not in err and b"Traceback" not in err and b"Exception" not in err, err


def test_verify_formats_delta_and_inspect_shows_public_inputs_as_rows(released: dict[str, Any]) -> None:
    res = runner.invoke(app, ["verify", str(released["req"].out), "--key", str(released["pub"])], env=WIDE)
    assert res.exit_code == 0, res.output
    assert f"delta {released['claim']['delta']:.3g}" in res.output and "00000000" not in res.output
    text = runner.invoke(app, ["inspect", str(released["req"].out)], env=WIDE).output
    assert "{" not in text and "'" not in text.split("public inputs:")[1]
    inputs = released["claim"]["public_inputs"]
    assert f"    n max: {inputs['n_max']:,}" in text
    assert f"    record count: public: {inputs['record_count']:,}" in text
    assert "    schema: public, 3 columns: x1, x2, y" in text
    assert f"delta <= {inputs['delta_rule']['max_delta_times_n_max']:.4g} / n_max" in text


def test_a_private_key_is_refused_where_a_public_key_is_expected(released: dict[str, Any]) -> None:
    """Item 7: one line naming the fix; the key's content never appears."""
    secret = released["key"].read_text()
    body_lines = [line for line in secret.splitlines() if "-----" not in line]
    for args in (["verify", str(released["req"].out)], ["inspect", str(released["req"].out)],
                 ["export", str(released["req"].out), "--to", "json", "--out", str(released["tmp"] / "x")],
                 ["audit", str(released["ledger"])]):
        res = runner.invoke(app, [*args, "--key", str(released["key"])], env=WIDE)
        assert res.exit_code == 2, (args, res.output)
        lines = res.output.strip().splitlines()
        assert len(lines) == 1 and lines[0].startswith("error: ") and "PRIVATE key" in lines[0]
        assert "pass the public key (.pub)" in lines[0]
        assert not any(b in res.output for b in body_lines)


def _head(text: str) -> str:
    match = re.search(r"^head (\d+:sha256:[0-9a-f]{64}) ", text, re.M)
    assert match, text
    return match.group(1)


def test_audit_prints_the_head_and_a_truncated_ledger_fails_against_it(released: dict[str, Any]) -> None:
    """Item 8: the head in text and JSON; --expect-head holds the file; a wrong key is one line."""
    ledger, pub = released["ledger"], released["pub"]
    lines = ledger.read_bytes().splitlines(keepends=True)
    res = runner.invoke(app, ["audit", str(ledger), "--key", str(pub)], env=WIDE)
    assert res.exit_code == 0, res.output
    head = _head(res.output)
    assert head.startswith(f"{len(lines)}:sha256:")
    data = json.loads(runner.invoke(app, ["audit", str(ledger), "--key", str(pub), "--json"]).output)
    assert data["head"]["text"] == head and data["head"]["entries"] == len(lines)
    ok = runner.invoke(app, ["audit", str(ledger), "--key", str(pub), "--expect-head", head], env=WIDE)
    assert ok.exit_code == 0 and "matches" in ok.output
    # An earlier checkpoint still holds once the ledger grew (it only grows).
    assert len(lines) >= 2
    earlier = runner.invoke(app, ["audit", str(ledger), "--key", str(pub), "--expect-head",
                                  f"1:{_line_hash(lines[0])}"], env=WIDE)
    assert earlier.exit_code == 0, earlier.output
    # Tail truncation (the last line dropped): clean before, caught now.
    ledger.write_bytes(b"".join(lines[:-1]))
    assert runner.invoke(app, ["audit", str(ledger), "--key", str(pub)]).exit_code == 0
    cut = runner.invoke(app, ["audit", str(ledger), "--key", str(pub), "--expect-head", head], env=WIDE)
    assert cut.exit_code == 1 and "lines were removed from its end" in cut.output
    cut_json = json.loads(runner.invoke(app, ["audit", str(ledger), "--key", str(pub), "--json",
                                              "--expect-head", head]).output)
    assert cut_json["ok"] is False and "removed" in cut_json["head_problem"]
    bad = runner.invoke(app, ["audit", str(ledger), "--key", str(pub), "--expect-head", "3:abc"], env=WIDE)
    assert bad.exit_code == 2 and "ENTRIES:sha256:HEX" in bad.output
    # A wrong key: one error line, not one per entry.
    from dpsummary import keys

    other = keys.generate_keypair(released["tmp"] / "other", name="other")
    wrong = runner.invoke(app, ["audit", str(ledger), "--key", str(other.public_path)], env=WIDE)
    assert wrong.exit_code == 1
    assert len(wrong.output.strip().splitlines()) == 1 and "pass the public key (.pub)" in wrong.output


def _line_hash(line: bytes) -> str:
    import hashlib

    return "sha256:" + hashlib.sha256(line.rstrip(b"\n")).hexdigest()


def test_audit_without_policy_composes_a_strict_source_at_a_delta_it_names(tmp_path: Path) -> None:
    """Item 4: a source released under a policy with a larger delta than the default's total is
    not shown at delta 1e-300 / pld inf: it is composed at its recorded deltas, and says so."""
    from dpsummary.plan import ReleaseRequest
    from dpsummary.release import run_release

    data = write_csv(tmp_path / "d.csv", 2000, seed=3)
    pol = write_policy(tmp_path / "p.toml", n=2000, total_delta=1e-6, n_max=100_000)
    run_release(ReleaseRequest(data=data, epsilon=0.5, policy=pol, out=tmp_path / "o.json",
                               ledger=tmp_path / "ledger.jsonl", size=3, seed=0))
    pub = Path(os.environ["DPSUMMARY_HOME"]) / "keys" / "dpsummary.pub"
    res = runner.invoke(app, ["audit", str(tmp_path / "ledger.jsonl"), "--key", str(pub)], env=WIDE)
    assert "1e-300" not in res.output and " inf " not in res.output, res.output
    assert "the sum of its releases' recorded deltas" in res.output and "pass that policy with --policy" in res.output
    assert "budgets from the packaged default policy (no --policy given)" in res.output
    data_json = json.loads(runner.invoke(app, ["audit", str(tmp_path / "ledger.jsonl"), "--key", str(pub),
                                               "--json"]).output)
    (source,) = data_json["sources"]
    assert 0 < source["delta"] < 1 and np.isfinite(source["composed_pld"]) and source["delta_basis"]
    with_policy = runner.invoke(app, ["audit", str(tmp_path / "ledger.jsonl"), "--key", str(pub),
                                      "--policy", str(pol)], env=WIDE)
    assert with_policy.exit_code == 0 and f"budgets from policy {pol}" in with_policy.output


def test_unknown_model_is_a_usage_error_listing_the_models(tmp_path: Path) -> None:
    """Item 10: exit 2 (not a policy refusal), the known models listed; --help lists them too."""
    data = write_csv(tmp_path / "d.csv", 50)
    for command in (["release", str(data), "--epsilon", "0.2"], ["baseline", str(data)]):
        res = runner.invoke(app, [*command, "--model", "logistc"], env=WIDE)
        assert res.exit_code == 2, res.output
        assert "unknown --model 'logistc' (did you mean logistic?)" in res.output
        assert "logistic, poisson, linear, gaussian_mean, bnn, gmm, dpgmm" in res.output
        assert "not allowed by the policy" not in res.output
        assert "logistic, poisson, linear, gaussian_mean, bnn, gmm, dpgmm" in _flat(
            runner.invoke(app, [command[0], "--help"], env=WIDE).output)
    assert not (tmp_path / "d.dpsummary.json").exists()


def test_version_and_help_texts() -> None:
    from dpsummary import __version__

    res = runner.invoke(app, ["--version"])
    assert res.exit_code == 0 and res.output.strip() == f"dpsummary {__version__}"
    release = _flat(runner.invoke(app, ["release", "--help"], env=WIDE).output)
    assert "--mechanism dp-psvi and --model bnn only: optimisation steps" in release
    assert "--mechanism dp-psvi and --model bnn only: Poisson sampling rate" in release
    assert "zero configuration works as locally" in release and "the schema in the policy" not in release
    assert release.count("local[2]") == 1 and "KEY=VALUE" in release and "list[str]" not in release
    for command in ("export", "inspect", "report"):
        text = _flat(runner.invoke(app, [command, "--help"], env=WIDE).output)
        assert "--allow-unsigned" in text and "--no-allow-unsigned" not in text, command
        assert "default: keys/dpsummary.pub in the dpsummary home" in text, command
    baseline = _flat(runner.invoke(app, ["baseline", "--help"], env=WIDE).output)
    from dpsummary.blackbox import REGISTRY as BLACKBOX

    assert all(m in baseline for m in BLACKBOX if m.startswith("bb-"))


def test_refusals_name_their_fix(released: dict[str, Any], tmp_path: Path) -> None:
    """Item 11: missing file, a directory, no key, a wrong key and an exhausted budget."""
    art, pub = str(released["req"].out), str(released["pub"])
    cases = [
        (["release", str(tmp_path / "nope.csv"), "--epsilon", "0.2"], "pass an existing CSV or Parquet file as DATA"),
        (["release", str(tmp_path), "--epsilon", "0.2"], "DATA must be a CSV or Parquet file"),
        (["release", str(released["req"].data), "--epsilon", "0.2", "--key", str(tmp_path / "none.key"),
          "--out", str(tmp_path / "n.json")], "pass an existing private key with --key"),
        (["verify", art, "--key", str(tmp_path / "none.pub")], "pass the curator's public key file (.pub) with --key"),
        (["inspect", str(tmp_path / "nope.json")], "pass the path of a release artifact"),
        (["inspect", str(tmp_path)], "pass the path of a release artifact"),
        (["audit", str(tmp_path / "none.jsonl"), "--key", pub], "pass the ledger file"),
        (["audit", str(tmp_path), "--key", pub], "pass the ledger file"),
    ]
    from dpsummary import keys

    other = keys.generate_keypair(tmp_path / "other", name="other")
    cases.append((["verify", art, "--key", str(other.public_path)], "pass the public key (.pub) of the curator"))
    for args, fix in cases:
        res = runner.invoke(app, args, env=WIDE)
        assert res.exit_code != 0 and fix in res.output, (args, res.output)
        lines = [x for x in res.output.strip().splitlines() if x.startswith("error:")]
        assert res.exit_code != 0 and len(lines) == 1 and fix in lines[0], (args, res.output)
    # No key at all (a machine without the curator's key): inspect and export name --key.
    empty = {**WIDE, "DPSUMMARY_HOME": str(tmp_path / "empty-home")}
    for args in (["inspect", art], ["export", art, "--to", "json", "--out", str(tmp_path / "ex")]):
        res = runner.invoke(app, args, env=empty)
        assert res.exit_code == 2 and "pass the curator's public key (.pub) with --key" in res.output, res.output
    # The budget: how much is left, under which accountant.
    req = released["req"]
    pol = write_policy(tmp_path / "tight.toml", n=2000, total_epsilon=1.2, cap=1.0)
    res = runner.invoke(app, ["release", str(req.data), "--epsilon", "1.0", "--policy", str(pol), "--size", "3",
                              "--ledger", str(req.ledger), "--out", str(tmp_path / "b.json")], env=WIDE)
    assert res.exit_code == 3, res.output
    line = [x for x in res.output.splitlines() if x.startswith("error:")][0]
    assert re.search(r"[0-9.]+ of 1\.2 is left under rdp: pass a smaller --epsilon", line), line


def test_policy_init_writes_a_skeleton_from_the_header_only(tmp_path: Path) -> None:
    data = write_csv(tmp_path / "d.csv", 30)
    out = tmp_path / "p.toml"
    res = runner.invoke(app, ["policy", "init", str(data), "--out", str(out)], env=WIDE)
    assert res.exit_code == 0 and "no record was read" in res.output
    text = out.read_text()
    assert [m for m in re.findall(r'^name = "([^"]+)"', text, re.M)] == ["x1", "x2", "y"]
    assert 'target = "y"' in text
    again = runner.invoke(app, ["policy", "init", str(data), "--out", str(out)], env=WIDE)
    assert again.exit_code == 2 and "pass --force" in again.output
    assert runner.invoke(app, ["policy", "init", str(data), "--out", str(out), "--force"]).exit_code == 0
    # Unfilled, it is refused before any budget, naming what to do.
    res = runner.invoke(app, ["release", str(data), "--epsilon", "0.2", "--policy", str(out)], env=WIDE)
    assert res.exit_code == 3 and "fill in each [[schema.columns]] block" in res.output, res.output


def test_policy_init_reads_no_record(tmp_path: Path) -> None:
    """Only the header line: a file whose every later byte is garbage gives the same skeleton."""
    good = write_csv(tmp_path / "good.csv", 20)
    bad = tmp_path / "bad.csv"
    bad.write_bytes(good.read_text().splitlines()[0].encode() + b"\n" + bytes(range(256)) * 8)
    for path in (good, bad):
        assert runner.invoke(app, ["policy", "init", str(path), "--out", str(tmp_path / f"{path.stem}.toml")]
                             ).exit_code == 0
    assert ((tmp_path / "good.toml").read_text().replace("good.csv", "X").replace('"good"', '"X"')
            == (tmp_path / "bad.toml").read_text().replace("bad.csv", "X").replace('"bad"', '"X"'))


def _shared_data() -> list[Path]:
    folder = Path(__file__).resolve().parents[2] / "shared" / "data"
    return sorted(folder.glob("*.csv")) if folder.is_dir() else []


@pytest.mark.parametrize("data", _shared_data(), ids=lambda p: p.name)
def test_policy_init_on_every_shared_data_set(tmp_path: Path, data: Path) -> None:
    """Every column of the header, in order, with the last as target; the file parses as TOML
    and, unfilled, names the first column to fill in."""
    import tomllib

    from dpsummary.header import read_header
    from dpsummary.policy import PolicyError, load_policy

    out = tmp_path / "p.toml"
    res = runner.invoke(app, ["policy", "init", str(data), "--out", str(out)], env=WIDE)
    assert res.exit_code == 0, res.output
    parsed = tomllib.loads(out.read_text())
    header = read_header(data)
    assert [c["name"] for c in parsed["schema"]["columns"]] == header
    assert parsed["schema"]["target"] == header[-1]
    with pytest.raises(PolicyError, match=r"schema: columns\.0\.kind: required key missing"):
        load_policy(out)


def test_the_filled_german_credit_policy_passes_and_matches_the_skeleton(tmp_path: Path) -> None:
    """The README's walk: `policy init` on german_credit, filled in (examples/german_credit.policy.toml)."""
    from dpsummary.policy import load_policy

    root = Path(__file__).resolve().parents[1]
    filled = root / "examples" / "german_credit.policy.toml"
    pol = load_policy(filled)
    skeleton = tmp_path / "g.toml"
    assert runner.invoke(app, ["policy", "init", str(root / "examples" / "german_credit.csv"),
                               "--out", str(skeleton)]).exit_code == 0
    import tomllib

    names = [c["name"] for c in tomllib.loads(skeleton.read_text())["schema"]["columns"]]
    assert pol.data_schema is not None and pol.data_schema.names == names
    assert pol.data_schema.target == "credit_risk"


def test_schema_refusals_point_at_policy_init() -> None:
    from dpsummary.postprocess.schema import ReleasedColumn, schema_from_release

    empty = ReleasedColumn({"missing": 0.0, "text": 0.0, "integer": 0.0, "fraction": 0.0},
                           np.zeros(83), [], 10.0)
    with pytest.raises(Exception, match=r"dpsummary policy init DATA"):
        schema_from_release({"x": empty, "y": empty}, target="y", events=[], noise_multiplier=1.0, delta=1e-9,
                            touches=4, target_share=0.5, feature_threshold=5.0, max_categories=10,
                            target_classes=None)


def test_zero_config_bounds_note_says_values_are_clipped_and_how_many() -> None:
    """Item 5: the note counts (noisily, from the released grid) the values outside the bounds."""
    from dpsummary.postprocess.schema import (
        GRID_EDGES,
        NUM_GRID_BINS,
        ReleasedColumn,
        schema_from_release,
    )

    def grid_with(counts: dict[float, float]) -> np.ndarray:
        g = np.zeros(NUM_GRID_BINS)
        for value, n in counts.items():
            g[int(np.searchsorted(GRID_EDGES, value, side="left"))] += n
        return g

    # 10,000 values in (10, 20], 60 in (1, 2] (below the 1% quantile), 30 in (50, 100] (above 99%).
    feature = ReleasedColumn({"missing": 0.0, "text": 0.0, "integer": 10090.0, "fraction": 0.0},
                             grid_with({15.0: 10000.0, 1.5: 60.0, 70.0: 30.0}), [], 1.0)
    target = ReleasedColumn({"missing": 0.0, "text": 0.0, "integer": 10090.0, "fraction": 0.0},
                            grid_with({1.0: 5000.0, 2.0: 5090.0}), [], 1.0)
    result = schema_from_release({"x": feature, "y": target}, target="y", events=[], noise_multiplier=1.0,
                                 delta=1e-9, touches=4, target_share=0.5, feature_threshold=5.0,
                                 max_categories=10, target_classes=None)
    (note,) = [n for n in result.notes if n.startswith("x:")]
    assert "bounds [10, 20]" in note and "values outside are clipped to them: about 90 " in note, note


def test_release_table_says_what_m_means_for_a_kd_tree(tmp_path: Path) -> None:
    """Item 6: a dp-kd-tree release keeps one pseudopoint per surviving leaf, whatever --size says."""
    req = _contract()._request(tmp_path, "dp-kd-tree")
    res = runner.invoke(app, ["release", str(req.data), "--epsilon", "1", "--policy", str(req.policy), "--model", "gmm",
                              "--components", "2", "--size", "3", "--out", str(tmp_path / "m.json"),
                              "--ledger", str(req.ledger)], env=WIDE)
    assert res.exit_code == 0, res.output
    assert "pseudopoints M (kept kd-tree leaves; --size does not apply)" in res.output
    from dpsummary.cli.render import size_label

    assert size_label("noise-aware-newton") == "pseudopoints M (--size)"
