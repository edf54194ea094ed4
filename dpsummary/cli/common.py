"""Shared CLI plumbing: one-line errors, exit codes, lazy console."""

from __future__ import annotations

import functools
import sys
from collections.abc import Callable
from typing import Any, NoReturn, TypeVar

import typer

from ..errors import EXIT_BAD_INPUT, EXIT_CHARGED, EXIT_INTERNAL, EXIT_POLICY

#: Exit codes (dpsummary.errors): 1 = internal error (a bug), 2 = bad input or usage,
#: 3 = refused by the policy or the budget, 4 = refused on a DP-decided check (charged).
EXIT_FAILED = EXIT_INTERNAL
__all__ = ["EXIT_BAD_INPUT", "EXIT_CHARGED", "EXIT_FAILED", "EXIT_POLICY", "UserError", "fail", "guarded",
           "one_line", "run_guarded", "user_facing_errors"]


class UserError(Exception):
    """An error whose message is a complete, one-line explanation for the user."""

    def __init__(self, message: str, code: int = EXIT_BAD_INPUT) -> None:
        super().__init__(message)
        self.code = code


def fail(message: str, code: int = EXIT_BAD_INPUT) -> NoReturn:
    typer.echo(f"error: {message}", err=True)
    raise typer.Exit(code)


def one_line(exc: BaseException) -> str:
    text = str(exc).strip().splitlines()
    return text[0] if text else type(exc).__name__


def user_facing_errors() -> tuple[type[BaseException], ...]:
    """Exception types whose message is safe and meaningful to show as a one-line error."""
    from ..errors import Refusal

    types: list[type[BaseException]] = [UserError, Refusal, FileNotFoundError, PermissionError,
                                        IsADirectoryError]
    for mod, names in (
        ("dpsummary.header", ("DataError",)),  # dpsummary.data re-exports this class
        ("dpsummary.data", ("DataError",)),
        ("dpsummary.policy", ("PolicyError",)),
        ("dpsummary.keys", ("KeyFileError",)),
        ("dpsummary.artifact", ("ArtifactError",)),
        ("dpsummary.ledger", ("LedgerError", "BudgetExceeded")),
    ):
        module = sys.modules.get(mod)
        if module is None:
            continue
        for name in names:
            t = getattr(module, name, None)
            if isinstance(t, type) and issubclass(t, BaseException):
                types.append(t)
    return tuple(types)


#: Exceptions of other modules that are refusals by the policy or the ledger's budget.
_POLICY_ERRORS = (("dpsummary.policy", "PolicyError"), ("dpsummary.ledger", "BudgetExceeded"))


def describe(exc: BaseException) -> tuple[int, str]:
    """``(exit code, one-line message)`` for an exception that reached the command line."""
    if not isinstance(exc, user_facing_errors()):
        return EXIT_FAILED, f"error: internal error ({type(exc).__name__}): {one_line(exc)}"
    code = getattr(exc, "code", None)
    if not isinstance(code, int) or isinstance(code, bool):
        code = EXIT_BAD_INPUT
        for mod, name in _POLICY_ERRORS:
            t = getattr(sys.modules.get(mod), name, None)
            if isinstance(t, type) and isinstance(exc, t):
                code = EXIT_POLICY
    if code == EXIT_CHARGED:
        return code, f"error: {one_line(exc)} (decided on noisy counts; the reserved budget stays charged)"
    return code, f"error: {one_line(exc)}"


def run_guarded(app: Any) -> None:
    """Run the Typer app; known errors become ``error: <one line>`` and a non-zero exit."""
    try:
        app(standalone_mode=True)
    except SystemExit:
        raise
    except KeyboardInterrupt:
        typer.echo("error: interrupted", err=True)
        sys.exit(130)
    except BaseException as exc:  # noqa: BLE001 - last-resort guard: never a traceback
        code, message = describe(exc)
        typer.echo(message, err=True)
        sys.exit(code)


F = TypeVar("F", bound=Callable[..., Any])


def guarded(fn: F) -> F:
    """Decorator for command bodies: known errors print one line and exit non-zero."""

    @functools.wraps(fn)
    def wrapper(*args: Any, **kwargs: Any) -> Any:
        try:
            return fn(*args, **kwargs)
        except (typer.Exit, typer.Abort, SystemExit):
            raise
        except KeyboardInterrupt:
            typer.echo("error: interrupted", err=True)
            raise typer.Exit(130) from None
        except BaseException as exc:  # noqa: BLE001 - never a traceback for the user
            code, message = describe(exc)
            typer.echo(message, err=True)
            raise typer.Exit(code) from None

    return wrapper  # type: ignore[return-value]


def configure_torch() -> None:
    """One intra-op thread by default (``DPSUMMARY_THREADS`` overrides).

    Every tensor here is small (M x S, d x d); measured on the 2-core machine, intra-op threading
    made element-wise kernels 10-50x slower whenever another process was busy, and bought nothing
    when idle.
    """
    import os

    prefetch_imports()
    import torch

    torch.set_num_threads(max(1, int(os.environ.get("DPSUMMARY_THREADS", "1"))))


#: Libraries every data command needs after torch, imported on a background thread while the
#: main thread imports torch: module execution holds the GIL, but loading shared libraries and
#: reading files do not, so the two overlap (0.6 s of a release on this 2-core machine, issue 15).
PREFETCH_MODULES = ("numpy", "scipy.special", "dp_accounting", "pyarrow.csv", "opendp.measurements", "opendp.metrics")


def prefetch_imports() -> None:
    """Start importing :data:`PREFETCH_MODULES` on a daemon thread (once per process).

    Safe by construction: these modules import neither torch nor dpsummary, so the import system's
    per-module locks never see a cycle between the two threads (a thread that needs a module the
    other is loading waits for it). A failed prefetch is ignored here; the real import later
    raises the real error where the module is used.
    """
    import threading

    global _PREFETCH_STARTED
    if _PREFETCH_STARTED:
        return
    _PREFETCH_STARTED = True

    def run() -> None:
        import importlib

        for name in PREFETCH_MODULES:
            try:
                importlib.import_module(name)
            except Exception:  # noqa: BLE001, S112 - reported by the real import, not here
                continue

    threading.Thread(target=run, name="dpsummary-prefetch", daemon=True).start()


_PREFETCH_STARTED = False
