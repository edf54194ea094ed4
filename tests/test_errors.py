"""Refusals carry their fix as data (issue 49): every place in dpsummary/ that builds a refusal
passes ``fix=``, a refusal cannot be built without one, and the CLI prints the field and never
reads a fix out of message text."""

from __future__ import annotations

import ast
from pathlib import Path

import pytest
from typer.testing import CliRunner

from dpsummary import errors
from dpsummary.cli import app
from dpsummary.cli.common import describe
from dpsummary.errors import ChargedRefusal, FixedError, PolicyRefusal, Refusal, ReleaseError
from dpsummary.header import DataError

PACKAGE_DIR = Path(__file__).resolve().parents[1] / "dpsummary"
runner = CliRunner()


def _trees() -> dict[Path, ast.Module]:
    return {p: ast.parse(p.read_text(encoding="utf-8"), filename=str(p)) for p in sorted(PACKAGE_DIR.rglob("*.py"))}


def _name(node: ast.expr) -> str | None:
    if isinstance(node, ast.Name):
        return node.id
    if isinstance(node, ast.Attribute):
        return node.attr
    return None


def refusal_classes(trees: dict[Path, ast.Module]) -> set[str]:
    """``Refusal`` and every class of dpsummary/ that derives from it (by name, transitively)."""
    found = {"Refusal"}
    classes = [n for tree in trees.values() for n in ast.walk(tree) if isinstance(n, ast.ClassDef)]
    while True:
        more = {c.name for c in classes if c.name not in found and any(_name(b) in found for b in c.bases)}
        if not more:
            return found
        found |= more


def refusal_variables(trees: dict[Path, ast.Module], classes: set[str]) -> set[str]:
    """Names bound to a refusal class rather than being one: parameters annotated
    ``type[<refusal>]`` and names assigned from ``refusal_kind(...)`` (mechanisms/base.py)."""
    names: set[str] = set()
    for tree in trees.values():
        for node in ast.walk(tree):
            if isinstance(node, ast.arg) and isinstance(node.annotation, ast.Subscript) \
                    and _name(node.annotation.value) == "type" and _name(node.annotation.slice) in classes:
                names.add(node.arg)
            elif isinstance(node, ast.Assign) and isinstance(node.value, ast.Call) \
                    and _name(node.value.func) == "refusal_kind":
                names |= {t.id for t in node.targets if isinstance(t, ast.Name)}
    return names


def refusal_calls(tree: ast.Module, callees: set[str]) -> list[ast.Call]:
    """Every call in ``tree`` that builds a refusal: ``X(...)`` for a refusal class or variable
    ``X``, and ``refusal_kind(...)(...)``."""
    out = []
    for node in ast.walk(tree):
        if not isinstance(node, ast.Call):
            continue
        func = node.func
        if _name(func) in callees or (isinstance(func, ast.Call) and _name(func.func) == "refusal_kind"):
            out.append(node)
    return out


def _without_fix(call: ast.Call) -> bool:
    fix = next((k.value for k in call.keywords if k.arg == "fix"), None)
    return fix is None or (isinstance(fix, ast.Constant) and not (isinstance(fix.value, str) and fix.value.strip()))


def test_every_refusal_in_dpsummary_is_built_with_its_fix() -> None:
    trees = _trees()
    classes = refusal_classes(trees)
    # The refusal types the pipeline, the mechanisms and the Spark engine raise are all seen.
    assert {"PolicyRefusal", "ChargedRefusal", "ReleaseError", "SparkEngineError"} <= classes, classes
    callees = classes | refusal_variables(trees, classes)
    assert "refuse" in callees
    calls = [(p, c) for p, tree in trees.items() for c in refusal_calls(tree, callees)]
    # The scan sees the raise sites of every file that refuses (not an empty pass).
    files = {p.relative_to(PACKAGE_DIR).as_posix() for p, _ in calls}
    assert {"release.py", "mechanisms/base.py", "mechanisms/glm.py", "spark/session.py"} <= files, files
    missing = [f"{p.relative_to(PACKAGE_DIR.parent)}:{c.lineno}" for p, c in calls if _without_fix(c)]
    assert not missing, f"refusals built without fix= (say what the user does about it): {missing}"


def test_the_scan_flags_a_refusal_without_its_fix() -> None:
    planted = ast.parse(
        "def check(req, refuse: type[ChargedRefusal]):\n"
        "    raise ReleaseError('bad --size')\n"
        "    raise ReleaseError('bad --size', fix='pass --size 1')\n"
        "    raise refuse('too few records', fix='')\n"
        "    raise refusal_kind(public)('too few records')\n"
        "    raise ValueError('not a refusal')\n"
    )
    trees = {Path("planted.py"): planted}
    classes = {"Refusal", "ReleaseError", "ChargedRefusal"}
    calls = refusal_calls(planted, classes | refusal_variables(trees, classes))
    assert [(c.lineno, _without_fix(c)) for c in calls] == [(2, True), (3, False), (4, True), (5, True)]


def test_a_refusal_cannot_be_built_without_a_fix() -> None:
    with pytest.raises(TypeError):
        ReleaseError("--size must be at least 1")  # type: ignore[call-arg]
    with pytest.raises(ValueError, match="must name its fix"):
        ChargedRefusal("too few records", fix="  ")
    exc = PolicyRefusal("epsilon 9 exceeds the cap 2", fix="lower --epsilon")
    assert (exc.problem, exc.fix, str(exc)) == ("epsilon 9 exceeds the cap 2", "lower --epsilon",
                                               "epsilon 9 exceeds the cap 2; lower --epsilon")


def test_errors_keep_their_fix_across_processes() -> None:
    """Worker pools pickle exceptions: both fields survive, and a refusal can be rebuilt."""
    import pickle

    for exc in (ChargedRefusal("no finite summary", fix="raise --epsilon"), DataError("not a file: x", fix="check"),
                DataError("column 'a' has no values")):
        back = pickle.loads(pickle.dumps(exc))
        assert (type(back), back.problem, back.fix, str(back)) == (type(exc), exc.problem, exc.fix, str(exc))


def test_the_cli_prints_the_fix_field() -> None:
    code, line = describe(ReleaseError("--out x is a directory", fix="give a file path"))
    assert (code, line) == (errors.EXIT_BAD_INPUT, "error: --out x is a directory; give a file path")
    code, line = describe(ChargedRefusal("no finite summary", fix="raise --epsilon"))
    assert code == errors.EXIT_CHARGED and line.startswith("error: no finite summary; raise --epsilon (decided on")


def test_the_cli_reads_no_fix_out_of_message_text() -> None:
    """A message that the old table of message fragments would have completed gets nothing
    appended unless the error carries the fix; the same message with the field gets that fix."""
    assert describe(DataError("data file not found: x.csv"))[1] == "error: data file not found: x.csv"
    assert describe(DataError("data file not found: x.csv", fix="check the path"))[1] == \
        "error: data file not found: x.csv; check the path"
    assert issubclass(DataError, FixedError) and issubclass(DataError, ValueError)


def test_a_refusal_that_skipped_its_fix_is_an_internal_error_at_the_cli() -> None:
    """The runtime check on the CLI path: a refusal without a fix (only a subclass that bypasses
    Refusal.__init__ can make one) is reported as a bug, not as a refusal with no advice."""

    class Broken(Refusal):
        def __init__(self, message: str) -> None:
            Exception.__init__(self, message)
            self.problem, self.fix = message, ""

    code, line = describe(Broken("something refused"))
    assert code == errors.EXIT_INTERNAL
    assert line == "error: internal error (a refusal without its fix): something refused"


def test_a_release_refusal_reaches_the_terminal_with_its_fix(tmp_path: Path) -> None:
    res = runner.invoke(app, ["release", str(tmp_path / "missing.csv"), "--epsilon", "1"])
    assert res.exit_code == errors.EXIT_BAD_INPUT, res.output
    assert res.output.strip() == f"error: data file not found: {tmp_path / 'missing.csv'}; {errors.DATA_NOT_FOUND_FIX}"
