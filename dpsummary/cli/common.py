"""Shared CLI plumbing: one-line errors, exit codes, lazy console."""

from __future__ import annotations

import functools
import sys
from collections.abc import Callable
from typing import Any, NoReturn, TypeVar

import typer

#: Exit codes: 1 = the operation was refused or failed, 2 = bad input/usage.
EXIT_FAILED = 1
EXIT_BAD_INPUT = 2


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
    types: list[type[BaseException]] = [UserError, FileNotFoundError, PermissionError, IsADirectoryError]
    for mod, names in (
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
        code = getattr(exc, "code", EXIT_BAD_INPUT) if isinstance(exc, user_facing_errors()) else EXIT_FAILED
        prefix = "" if isinstance(exc, user_facing_errors()) else f"internal error ({type(exc).__name__}): "
        typer.echo(f"error: {prefix}{one_line(exc)}", err=True)
        sys.exit(code if isinstance(code, int) else EXIT_FAILED)


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
            known = isinstance(exc, user_facing_errors())
            code = getattr(exc, "code", EXIT_BAD_INPUT) if known else EXIT_FAILED
            prefix = "" if known else f"internal error ({type(exc).__name__}): "
            typer.echo(f"error: {prefix}{one_line(exc)}", err=True)
            raise typer.Exit(code if isinstance(code, int) else EXIT_FAILED) from None

    return wrapper  # type: ignore[return-value]


def configure_torch() -> None:
    """One intra-op thread by default (``DPSUMMARY_THREADS`` overrides).

    Every tensor here is small (M x S, d x d); measured on the 2-core machine, intra-op threading
    made element-wise kernels 10-50x slower whenever another process was busy, and bought nothing
    when idle.
    """
    import os

    import torch

    torch.set_num_threads(max(1, int(os.environ.get("DPSUMMARY_THREADS", "1"))))
