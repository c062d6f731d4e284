"""User errors on the command line: `error: <message>` on one line of stderr, exit status 1.

A user error is the user's input or the data's state (a tenant not found, a malformed amount), not a
bug: KvgateError and ValueError, plus what a package adds with `add_user_errors` (billing adds its
StripeSyncError). Anything else is a bug and keeps its traceback.

The root app uses `UserErrorGroup` (typer.Typer(cls=UserErrorGroup)): every command under it is
covered, so commands just raise.
"""

from __future__ import annotations

import sys
from typing import Any

import typer
from typer.core import TyperGroup

from kvgate.errors import KvgateError

_USER_ERRORS: list[type[BaseException]] = [KvgateError, ValueError]


def add_user_errors(*types: type[BaseException]) -> None:
    """Treat these exception types as user errors too (a package's own, from its `register`)."""
    for error_type in types:
        if error_type not in _USER_ERRORS:
            _USER_ERRORS.append(error_type)


def user_errors() -> tuple[type[BaseException], ...]:
    return tuple(_USER_ERRORS)


def message(exc: BaseException) -> str:
    """The error's message, on one line."""
    text = getattr(exc, "message", None) or str(exc) or type(exc).__name__
    return " ".join(str(text).split())


def fail(text: str) -> typer.Exit:
    """Print `error: text` to stderr; return the Exit(1) to raise: `raise fail("...")`."""
    print(f"error: {' '.join(text.split())}", file=sys.stderr)
    return typer.Exit(1)


class UserErrorGroup(TyperGroup):
    """The root command group: a user error raised by any command under it is one line, exit 1."""

    def invoke(self, ctx: typer.Context) -> Any:
        try:
            return super().invoke(ctx)
        except user_errors() as exc:
            raise fail(message(exc)) from None
