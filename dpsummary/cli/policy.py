"""``dpsummary policy init DATA``: a commented policy skeleton whose public schema lists every
column of DATA's header, for the curator to fill in.

The header is public (a release reads it before any reservation); the command reads nothing
else, so it costs no privacy and writes no ledger entry. Kinds, bounds and categories are left
for the curator: they must come from public knowledge (a codebook, the domain), never from the
records, and a skeleton left unfilled is refused by ``dpsummary release`` (one line naming the
first column to fill in) rather than guessed.
"""

from __future__ import annotations

import json
from pathlib import Path
from typing import Annotated

import typer

from .application import app
from .common import UserError, guarded
from .formatting import App

policy_app = App(
    name="policy",
    help="Write a release policy: `policy init DATA` makes a skeleton with DATA's columns.",
    no_args_is_help=True,
    add_completion=False,
    pretty_exceptions_enable=False,
)
app.add_typer(policy_app)


def _toml_string(text: str) -> str:
    """A TOML basic string (JSON's escaping is valid TOML for every character)."""
    return json.dumps(text, ensure_ascii=False)


def skeleton(header: list[str], *, data_name: str, target: str | None) -> str:
    """The policy text for a table with ``header``: the packaged default's budget fields, and a
    ``[schema]`` whose ``target`` and column names are set and whose every column's kind,
    bounds or categories are commented out, to be filled in from public knowledge."""
    lines = [
        f"# dpsummary release policy for {data_name}, written by `dpsummary policy init` from the file's",
        "# header line only (no record was read). Everything here is PUBLIC: it is copied into every",
        "# artifact. Never derive a value (bounds, categories, counts) from the private records; take",
        "# it from a codebook, the data's documentation or the domain (ages 18-100, months 1-12, ...).",
        "#",
        "# Fill in every column below, then: dpsummary release --epsilon 0.5 --policy THIS_FILE DATA",
        "# A column left unfilled is refused before any budget is spent. Field by field meaning:",
        "# policies/default.toml (the packaged default these budget values copy).",
        "",
        "# The data source the budget attaches to (every release charged to it is composed).",
        f"source_id = {_toml_string(Path(data_name).stem)}",
        "total_epsilon = 1.0",
        "total_delta = 1e-10",
        "max_epsilon_per_release = 0.5",
        "min_records = 200",
        "# A public upper bound on the number of records (delta <= 0.1 / n_max); a tighter bound",
        "# that is truly public gives less noise.",
        "n_max = 10_000_000_000",
        "# Is the exact record count public? Then set record_count_public = true and record_count.",
        "record_count_public = false",
        'accountant = "rdp"',
        'allowed_models = ["gaussian_mean", "linear", "logistic", "poisson", "bnn", "gmm", "dpgmm"]',
        "",
        "[delta_rule]",
        "max_delta_times_n_max = 0.1",
        "",
        "# With a public schema no budget goes to schema estimation (preprocessing = 0).",
        "[budget_split]",
        "count = 0.10",
        "preprocessing = 0.0",
        "quality = 0.05",
        "initialisation = 0.20",
        "optimisation = 0.65",
        "",
        "[data_quality]",
        'missing_numeric = "impute"',
        'unseen_category = "other"',
        "max_dropped_fraction = 0.5",
        "",
        "# One [[schema.columns]] per header column, in header order. For each, uncomment ONE kind:",
        '#   numeric:     kind = "numeric", lower = ..., upper = ... (values outside are clipped),',
        "#                integer = true for counts and codes",
        '#   categorical: kind = "categorical", categories = ["...", ...] (every public category;',
        '#                unseen ones go to "other" per [data_quality]); for a binary target,',
        '#                positive = "..." names the class encoded as 1',
        "# Delete a column's block to leave the column out of the release.",
        "[schema]",
    ]
    if target is None:
        lines.append("# no target: a Gaussian mean model of the columns (set target = \"...\" for a regression)")
    else:
        lines.append(f"target = {_toml_string(target)}")
    for name in header:
        note = "   # the target" if name == target else ""
        lines += [
            "",
            "[[schema.columns]]",
            f"name = {_toml_string(name)}{note}",
            '# kind = "numeric"',
            "# lower = ",
            "# upper = ",
            "# integer = true",
            '# kind = "categorical"',
            '# categories = ["", ""]',
        ]
    return "\n".join(lines) + "\n"


def _write_atomic(path: Path, data: bytes) -> None:
    """Write ``data`` beside ``path``, fsync, then rename over it: a reader sees the old file or
    the whole new one (torch-free, so `policy init` answers at once)."""
    import contextlib
    import os
    import tempfile

    fd, tmp = tempfile.mkstemp(prefix=f".{path.name}.", dir=path.resolve().parent)
    try:
        with os.fdopen(fd, "wb") as fh:
            fh.write(data)
            fh.flush()
            os.fsync(fh.fileno())
        os.chmod(tmp, 0o644)
        os.replace(tmp, path)
    finally:
        with contextlib.suppress(FileNotFoundError):
            os.unlink(tmp)


@policy_app.command("init")
@guarded
def init(
    data: Annotated[Path, typer.Argument(help="The data file (CSV or Parquet): only its header line is read.")],
    out: Annotated[Path | None, typer.Option(
        help="Policy file to write (default: DATA's name with .policy.toml, in the current directory).")] = None,
    target: Annotated[str | None, typer.Option(help="Target column (default: the last column, as `release` does).")] = None,
    no_target: Annotated[bool, typer.Option("--no-target", help="No target column (a Gaussian mean model).")] = False,
    force: Annotated[bool, typer.Option("--force", help="Replace an existing policy file.")] = False,
) -> None:
    """Write a commented policy skeleton listing every column of DATA's header.

    Reads the header line only (public; no record, no budget). Fill in each column's kind and its
    bounds or categories from public knowledge, then pass the file to `release --policy`.
    """
    from ..header import read_header

    header = read_header(data)
    if no_target and target is not None:
        raise UserError("--target and --no-target exclude each other; pass one")
    chosen = None if no_target else (target if target is not None else header[-1])
    if chosen is not None and chosen not in header:
        import difflib

        close = difflib.get_close_matches(chosen, header, n=1)
        hint = f"did you mean --target {close[0]}? " if close else ""
        raise UserError(f"--target {chosen!r} is not a column of {data}'s header; {hint}pass one of: "
                        f"{', '.join(header)}")
    # The working directory, not the data's folder: the data may sit in a read-only or shared
    # place, and a curator expects a new file where they ran the command (issue 49).
    path = out if out is not None else Path(data.name.split(".")[0] + ".policy.toml")
    if path.is_dir():
        raise UserError(f"--out {path} is a directory; give a file path")
    if path.exists() and not force:
        raise UserError(f"{path} already exists; pass --force to replace it, or --out to write elsewhere")
    if not path.resolve().parent.is_dir():
        raise UserError(f"--out {path}: the folder {path.resolve().parent} does not exist; create it or choose another --out")
    _write_atomic(path, skeleton(header, data_name=data.name, target=chosen).encode("utf-8"))
    where = "" if out is not None else " (in the current directory; --out writes elsewhere)"
    typer.echo(f"wrote {path.resolve()}{where}: a policy skeleton with the {len(header)} columns of {data.name}'s "
               f"header (target {chosen!r}); no record was read")
    typer.echo(f"next: fill in each column's kind and its bounds or categories from public knowledge, then "
               f"`dpsummary release --epsilon 0.5 --policy {path} {data}`")
