"""Help text that reads like git's, pip's or Typer's own examples.

Typer (0.29) renders a required argument as ``{data}`` in the usage line and gives every option a
type column, flags included (``--json <bool>``). Here, through Typer's documented ``cls`` hooks
(no monkey-patching): arguments are shown by their upper-case name (``DATA``; ``[DATA]`` when
optional, ``DATA...`` when repeated) in the usage line and the arguments panel, and flags, which
take no value, get no type. Options that take a value keep theirs (``--epsilon <float>``).
"""

from __future__ import annotations

from typing import Any

import typer
from typer.core import TyperArgument, TyperCommand, TyperGroup, TyperOption

__all__ = ["App", "Command", "Group"]


def _tidy(param: Any) -> None:
    """Upper-case an argument's display name; drop a flag's value type (an empty metavar)."""
    if param.metavar is not None:
        return
    if isinstance(param, TyperArgument):
        param.metavar = (param.name or "").upper()
    elif isinstance(param, TyperOption) and param.is_flag:
        param.metavar = ""


def _usage_pieces(command: TyperCommand | TyperGroup, ctx: Any) -> list[str]:
    pieces = [command.options_metavar] if command.options_metavar else []
    for param in command.get_params(ctx):
        if isinstance(param, TyperArgument):
            name = param.metavar or (param.name or "").upper()
            name = name if param.required else f"[{name}]"
            pieces.append(name + ("..." if param.nargs != 1 else ""))
        else:
            pieces.extend(param.get_usage_pieces(ctx))
    return pieces


class _TidyHelp:
    """Shared by :class:`Command` and :class:`Group`: tidy every parameter and the help option."""

    params: list[Any]

    def __init__(self, *args: Any, **kwargs: Any) -> None:
        super().__init__(*args, **kwargs)
        for param in self.params:
            _tidy(param)

    def get_help_option(self, ctx: Any) -> Any:
        option = super().get_help_option(ctx)  # type: ignore[misc]
        if option is not None:
            _tidy(option)
        return option


class Command(_TidyHelp, TyperCommand):
    """A command whose help shows ``DATA``, not ``{data}``, and flags without ``<bool>``."""

    def collect_usage_pieces(self, ctx: Any) -> list[str]:
        return _usage_pieces(self, ctx)


class Group(_TidyHelp, TyperGroup):
    """The top-level group, with the same help conventions as :class:`Command`."""

    def collect_usage_pieces(self, ctx: Any) -> list[str]:
        return [*_usage_pieces(self, ctx), self.subcommand_metavar]


class App(typer.Typer):
    """``typer.Typer`` whose group and commands default to :class:`Group` and :class:`Command`."""

    def __init__(self, **kwargs: Any) -> None:
        kwargs.setdefault("cls", Group)
        super().__init__(**kwargs)

    def command(self, *args: Any, **kwargs: Any) -> Any:
        kwargs.setdefault("cls", Command)
        return super().command(*args, **kwargs)
