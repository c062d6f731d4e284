"""A bridge for a package whose commands are still argparse `register(subparsers)` functions: each of
its top-level commands becomes a typer command that hands its arguments to argparse unchanged.

Temporary, while billing/cli moves to typer (issue 14); nothing else should use it.
"""

from __future__ import annotations

import argparse
from collections.abc import Callable
from typing import Any

import typer

FORWARD = {"allow_extra_args": True, "ignore_unknown_options": True, "help_option_names": []}


def add_argparse_commands(app: typer.Typer, register: Callable[[Any], None]) -> None:
    """Add every command `register(subparsers)` defines to `app`, parsed by argparse as before."""
    parser = argparse.ArgumentParser(prog="kvgate")
    subparsers = parser.add_subparsers(dest="command", required=True)
    register(subparsers)
    helps = {action.dest: action.help for action in subparsers._choices_actions}
    for name in subparsers.choices:
        app.command(name, help=helps.get(name), context_settings=FORWARD, add_help_option=False)(
            _forwarder(parser, name)
        )


def _forwarder(parser: argparse.ArgumentParser, name: str) -> Callable[[typer.Context], None]:
    def forward(ctx: typer.Context) -> None:
        args = parser.parse_args([name, *ctx.args])
        code = args.handler(args) or 0
        if code:
            raise typer.Exit(code)

    return forward
