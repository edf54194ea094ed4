"""Refusals the product makes on purpose, and their exit codes.

Every refusal is one line that says what to fix, never a traceback and never "internal error"
(that prefix is kept for real bugs); the fix is a field of the error (:class:`FixedError`), set
where it is raised. Each refusal is either

* **public**: decided before the ledger reservation from public facts only (the options, the
  policy, the key, the file's existence and header, the ledger's budget), so it reveals nothing
  about any record and charges nothing; or
* **charged**: decided after the reservation on differentially private outputs only (noisy
  counts, the DP schema), so whether it happens is itself a DP output, and the budget reserved
  for it stays spent.

``docs/REFUSALS.md`` catalogues every refusal of ``dpsummary release`` with its kind and code.
"""

from __future__ import annotations

from typing import Any, ClassVar, Literal

#: Exit codes of the CLI.
EXIT_OK = 0
#: A bug: anything not raised on purpose (printed as "internal error").
EXIT_INTERNAL = 1
#: Bad input or usage: options, files, keys, policy files (public, before the reservation).
EXIT_BAD_INPUT = 2
#: Refused by the policy or the ledger's budget (public, before any data is read).
EXIT_POLICY = 3
#: Refused on a DP-decided check after the reservation (charged).
EXIT_CHARGED = 4


#: Fixes shared by the refusals of a data file that is missing or not a file (the pipeline's
#: :class:`ReleaseError` and the header reader's :class:`dpsummary.header.DataError`).
DATA_NOT_FOUND_FIX = "pass an existing CSV or Parquet file as DATA (check the path)"
NOT_A_FILE_FIX = "DATA must be a CSV or Parquet file (a directory of Parquet files only with --engine spark)"


class FixedError(Exception):
    """An error that carries its fix as data: ``problem`` (what is wrong, one line) and ``fix``
    (what the user does about it, one line). ``str()`` is ``"problem; fix"``, the line a user
    reads; the CLI builds that line from the two fields and never reads a fix out of message text
    (issue 49). Input errors of other modules (:class:`dpsummary.policy.PolicyError`,
    :class:`dpsummary.header.DataError`, :class:`dpsummary.keys.KeyFileError`,
    :class:`dpsummary.artifact.ArtifactError`) mix it in with ``fix`` optional; every
    :class:`Refusal` must have one."""

    problem: str
    fix: str | None

    def __init__(self, problem: str, *, fix: str | None = None) -> None:
        problem = str(problem)
        if fix is not None and not fix.strip():
            raise ValueError("an error's fix must say something (or be None)")
        super().__init__(f"{problem}; {fix}" if fix else problem)
        self.problem = problem
        self.fix = fix

    def __reduce__(self) -> tuple[Any, ...]:
        # Pickled across processes (worker pools) with both fields: the default would call
        # cls(str(self)) and lose the fix (or fail, for a Refusal, whose fix is required).
        return _restore, (type(self), self.problem, self.fix)


def _restore(cls: type[FixedError], problem: str, fix: str | None) -> FixedError:
    return cls(problem, fix=fix)


class Refusal(FixedError):
    """A refusal made on purpose: one line, and its ``fix`` (required, a keyword argument;
    ``tests/test_refusal_fixes.py`` checks every raise site)."""

    code: ClassVar[int] = EXIT_BAD_INPUT
    kind: ClassVar[Literal["public", "charged"]] = "public"
    fix: str

    def __init__(self, problem: str, *, fix: str) -> None:
        if not isinstance(fix, str) or not fix.strip():
            raise ValueError("a refusal must name its fix")
        super().__init__(problem, fix=fix)


class PolicyRefusal(Refusal):
    """The policy or the ledger forbids the request (public, before data is read)."""

    code = EXIT_POLICY


class ChargedRefusal(Refusal):
    """Decided on DP outputs after the budget was reserved; the reservation stays charged."""

    code = EXIT_CHARGED
    kind = "charged"


class ReleaseError(Refusal):
    """A release refused on public facts (options, file, header); one line, reveals no data.
    Raised by the pipeline (:mod:`dpsummary.release`) and by the mechanisms' public checks."""
