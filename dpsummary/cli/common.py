"""Shared CLI plumbing: one-line errors, exit codes, lazy console."""

from __future__ import annotations

import functools
import importlib.abc
import sys
from collections.abc import Callable
from typing import Any, NoReturn, TypeVar

import typer

from ..errors import EXIT_BAD_INPUT, EXIT_CHARGED, EXIT_INTERNAL, EXIT_POLICY

#: Exit codes (dpsummary.errors): 1 = internal error (a bug), 2 = bad input or usage,
#: 3 = refused by the policy or the budget, 4 = refused on a DP-decided check (charged).
EXIT_FAILED = EXIT_INTERNAL
__all__ = ["EXIT_BAD_INPUT", "EXIT_CHARGED", "EXIT_CLOSED_PIPE", "EXIT_FAILED", "EXIT_POLICY", "KEY_DEFAULT",
           "MODELS_HELP", "UserError", "check_model", "closed_pipe", "fail", "guarded", "one_line", "run_guarded", "user_facing_errors"]


#: How every reader command's ``--key`` help states its default (one wording everywhere).
KEY_DEFAULT = "default: keys/dpsummary.pub in the dpsummary home, $DPSUMMARY_HOME or ~/.config/dpsummary"


def _model_names() -> tuple[str, ...]:
    from ..model_names import MODEL_NAMES

    order = ("logistic", "poisson", "linear", "gaussian_mean", "bnn", "gmm", "dpgmm")
    return tuple(sorted(MODEL_NAMES, key=lambda m: (order.index(m) if m in order else len(order), m)))


#: The known ``--model`` names, for help texts (light: no torch).
MODELS_HELP = ", ".join(_model_names())


def check_model(model: str | None) -> None:
    """An unknown ``--model`` is a usage error (exit 2) listing the known models: a typo is not
    a policy refusal."""
    if model is not None and model not in _model_names():
        import difflib

        close = difflib.get_close_matches(model, _model_names(), n=1)
        hint = f" (did you mean {close[0]}?)" if close else ""
        raise UserError(f"unknown --model {model!r}{hint}; choose one of {MODELS_HELP}")


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


def _line(exc: BaseException) -> str:
    """The one line a user reads: for an error that carries its fix as data
    (:class:`~dpsummary.errors.FixedError`), its ``problem`` and its ``fix`` from the two fields;
    for any other, its first line as it is. A fix is never read out of message text (issue 49)."""
    from ..errors import FixedError

    if isinstance(exc, FixedError):
        lines = exc.problem.strip().splitlines()
        problem = lines[0] if lines else type(exc).__name__
        return f"{problem}; {exc.fix}" if exc.fix else problem
    return one_line(exc)


def describe(exc: BaseException) -> tuple[int, str]:
    """``(exit code, one-line message)`` for an exception that reached the command line."""
    from ..errors import Refusal

    if not isinstance(exc, user_facing_errors()):
        return EXIT_FAILED, f"error: internal error ({type(exc).__name__}): {one_line(exc)}"
    if isinstance(exc, Refusal) and not (isinstance(getattr(exc, "fix", None), str) and exc.fix.strip()):
        # Refusal.__init__ requires a fix; one without (a subclass that skipped it) is a bug.
        return EXIT_FAILED, f"error: internal error (a refusal without its fix): {one_line(exc)}"
    code = getattr(exc, "code", None)
    if not isinstance(code, int) or isinstance(code, bool):
        code = EXIT_BAD_INPUT
        for mod, name in _POLICY_ERRORS:
            t = getattr(sys.modules.get(mod), name, None)
            if isinstance(t, type) and isinstance(exc, t):
                code = EXIT_POLICY
    if code == EXIT_CHARGED:
        return code, f"error: {_line(exc)} (decided on noisy counts; the reserved budget stays charged)"
    return code, f"error: {_line(exc)}"


#: Exit status after a closed pipe (``dpsummary inspect X | head -1``): 128 + SIGPIPE, what a
#: process killed by SIGPIPE reports; no message, since the reader chose to stop reading.
EXIT_CLOSED_PIPE = 141


def closed_pipe() -> int:
    """Point stdout at ``os.devnull`` so that the interpreter's final flush of the closed pipe
    raises nothing (the Python documentation's recipe, "Note on SIGPIPE"); returns
    :data:`EXIT_CLOSED_PIPE`."""
    import os

    try:
        devnull = os.open(os.devnull, os.O_WRONLY)
        os.dup2(devnull, sys.stdout.fileno())
    except (OSError, ValueError, AttributeError):  # no file descriptor (a test runner's stdout)
        pass
    return EXIT_CLOSED_PIPE


def _flush_stdout() -> int | None:
    """Flush stdout now, while a closed pipe can still be handled: None, or the closed pipe's
    exit status."""
    try:
        sys.stdout.flush()
    except BrokenPipeError:
        return closed_pipe()
    except (OSError, ValueError):
        return None
    return None


def run_guarded(app: Any) -> None:
    """Run the Typer app; known errors become ``error: <one line>`` and a non-zero exit.

    Heavy packages' ``__init__`` run on first use only (:func:`defer_package_inits`); once the
    command is over, :func:`gc.freeze` spares the interpreter's exit its garbage collections
    over every object torch and scipy created (0.3 s of a release, issue 29)."""
    import gc

    defer_package_inits()
    try:
        app(standalone_mode=True)
    except SystemExit as done:
        piped = _flush_stdout()
        if piped is not None:
            sys.exit(piped)
        raise done from None
    except BrokenPipeError:
        sys.exit(closed_pipe())
    except KeyboardInterrupt:
        typer.echo("error: interrupted", err=True)
        sys.exit(130)
    except BaseException as exc:  # noqa: BLE001 - last-resort guard: never a traceback
        code, message = describe(exc)
        typer.echo(message, err=True)
        sys.exit(code)
    finally:
        # The process ends now: its objects stay until the exit frees them (modules are still
        # torn down, atexit handlers and finalisers of non-cyclic objects run as before); only
        # the exit's cycle collections, which would traverse them all, find nothing to do.
        gc.freeze()


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
        except BrokenPipeError:  # the reader closed the pipe: a normal end, no message
            raise typer.Exit(closed_pipe()) from None
        except BaseException as exc:  # noqa: BLE001 - never a traceback for the user
            code, message = describe(exc)
            typer.echo(message, err=True)
            raise typer.Exit(code) from None

    return wrapper  # type: ignore[return-value]


def configure_torch(*, accountant_worker: bool = False) -> None:
    """One intra-op thread by default (``DPSUMMARY_THREADS`` overrides).

    Every tensor here is small (M x S, d x d); measured on the 2-core machine, intra-op threading
    made element-wise kernels 10-50x slower whenever another process was busy, and bought nothing
    when idle.

    ``accountant_worker`` (a release, once its public checks passed): also start the PRV and PLD
    accountants' worker process (:func:`dpsummary.accounting.start_accountant_worker`), so that
    they load while torch does and run on the second core.
    """
    import os

    prefetch_imports()
    if accountant_worker:
        from ..accounting import start_accountant_worker

        start_accountant_worker()
    import torch

    torch.set_num_threads(max(1, int(os.environ.get("DPSUMMARY_THREADS", "1"))))


#: Libraries every data command needs after torch, imported on a background thread while the
#: main thread imports torch: module execution holds the GIL, but loading shared libraries and
#: reading files do not, so the two overlap (0.6 s of a release on this 2-core machine, issue 15).
PREFETCH_MODULES = ("numpy", "scipy.special", "pyarrow.csv", "opendp.measurements", "opendp.metrics")


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


#: Packages whose ``__init__`` the command line runs only when a name it defines is used
#: (:func:`defer_package_inits`). dp_accounting's imports its PLD accountant and mechanism
#: calibration, hence scipy.stats, scipy.signal and scipy.optimize (about 0.5 s of a release, and
#: more at exit), while a release needs only its event classes (``dp_accounting.dp_event``) in
#: its own process: the PLD and PRV accountants run in the accountant worker (issue 29).
DEFERRED_PACKAGES = ("dp_accounting",)


def defer_package_inits() -> None:
    """Import each package of :data:`DEFERRED_PACKAGES` (when something imports it) without
    running its ``__init__`` until a name that is not a submodule is read.

    A finder first on ``sys.meta_path`` gives the package the spec the import system would (its
    ``__path__`` included, so ``import pkg.sub`` and ``from pkg import sub`` load just that
    submodule) with a loader that leaves the module empty but for a module ``__getattr__``; the
    first read of any other attribute runs the real ``__init__`` into the same module object
    (once, under a lock) and answers from it. So every caller sees the package it would have
    seen, only initialised later or never. Nothing is imported by installing the finder. Worker
    processes and library users (no command line) import the package the ordinary way."""
    import sys

    if not any(isinstance(f, _DeferredInitFinder) for f in sys.meta_path):
        sys.meta_path.insert(0, _DeferredInitFinder())


class _DeferredInitFinder(importlib.abc.MetaPathFinder):
    """The meta-path finder of :func:`defer_package_inits`."""

    def find_spec(self, fullname: str, path: Any = None, target: Any = None) -> Any:
        import importlib.machinery

        if fullname not in DEFERRED_PACKAGES:
            return None
        spec = importlib.machinery.PathFinder.find_spec(fullname, path)
        if spec is None or spec.loader is None or spec.submodule_search_locations is None:
            return None
        spec.loader = _DeferredInitLoader(spec.loader)
        return spec


class _DeferredInitLoader(importlib.abc.Loader):
    """Loads a package of :data:`DEFERRED_PACKAGES` with its ``__init__`` deferred."""

    def __init__(self, loader: Any) -> None:
        self.loader = loader

    def create_module(self, spec: Any) -> None:
        return None  # the default module object

    def exec_module(self, module: Any) -> None:
        module.__getattr__ = _completing_getattr(module, self.loader)


def _completing_getattr(module: Any, loader: Any) -> Callable[[str], Any]:
    """The deferred package's module ``__getattr__`` (see :func:`defer_package_inits`);
    ``loader`` is the package's own loader, which runs its ``__init__``."""
    import importlib
    import importlib.util
    import sys
    import threading

    name = module.__name__
    lock = threading.RLock()
    state = {"running": False, "done": False}

    def getattr_(attr: str) -> Any:
        if attr.startswith("__"):
            raise AttributeError(f"module {name!r} has no attribute {attr!r}")
        sub = f"{name}.{attr}"
        if sub in sys.modules or importlib.util.find_spec(sub) is not None:
            return importlib.import_module(sub)
        with lock:
            if state["running"]:  # read by the package's own __init__: not defined yet
                raise AttributeError(f"partially initialised module {name!r} has no attribute {attr!r}")
            if not state["done"]:
                state["running"] = True
                try:
                    loader.exec_module(module)
                finally:
                    state["running"], state["done"] = False, True
        try:
            return module.__dict__[attr]
        except KeyError:
            raise AttributeError(f"module {name!r} has no attribute {attr!r}") from None

    return getattr_
