"""Refusals the product makes on purpose, and their exit codes.

Every refusal is one line that says what to fix, never a traceback and never "internal error"
(that prefix is kept for real bugs). Each refusal is either

* **public**: decided before the ledger reservation from public facts only (the options, the
  policy, the key, the file's existence and header, the ledger's budget), so it reveals nothing
  about any record and charges nothing; or
* **charged**: decided after the reservation on differentially private outputs only (noisy
  counts, the DP schema), so whether it happens is itself a DP output, and the budget reserved
  for it stays spent.

``docs/REFUSALS.md`` catalogues every refusal of ``dpsummary release`` with its kind and code.
"""

from __future__ import annotations

from typing import ClassVar, Literal

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


class Refusal(Exception):
    """A refusal made on purpose; the message is one line and names the fix."""

    code: ClassVar[int] = EXIT_BAD_INPUT
    kind: ClassVar[Literal["public", "charged"]] = "public"


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
