"""The `kvgate` command. Each package contributes its commands through a `register(app)` function.

Part of the composition root (with kvgate.app): it names every package's commands, and hands
`kvgate serve` the app with billing wired in.

How a package adds a command (the kit is kvgate.cli_output, cli_dates, cli_database, cli_errors):

    # mypackage/cli.py
    def register(app: typer.Typer) -> None:
        things = typer.Typer(help="manage things", no_args_is_help=True)
        app.add_typer(things, name="things")

        @things.command("list")
        def list_things(output: OutputOption = OutputFormat.table) -> None:
            "list things (reads only: never creates a database)"
            rows = run_on_database(_load_things, write=False)   # write=True migrates/creates
            emit(rows, fmt=output, columns=["id", "name"])      # rows: the admin API's models

Raise KvgateError or ValueError for the user's mistakes (`error: ...`, exit 1; see cli_errors);
import heavy modules (torch, the engine) inside the command, so `kvgate --help` stays fast.
"""

from __future__ import annotations

import os
import sys
from collections.abc import Sequence
from importlib.metadata import PackageNotFoundError, version
from typing import Annotated, Any

import typer

from billing import cli as billing_cli
from gateway import cli as gateway_cli
from inference import cli as inference_cli
from kvgate.cli_database import set_verbose
from kvgate.cli_errors import UserErrorGroup
from kvgate.cli_output import Column, OutputFormat, OutputOption, emit
from web import cli as web_cli


def kvgate_version() -> str:
    try:
        return version("kvgate")
    except PackageNotFoundError:  # run from a source tree that was never installed
        from kvgate import __version__

        return __version__


def _print_version(value: bool) -> None:
    if value:
        print(f"kvgate {kvgate_version()}")
        raise typer.Exit()


def _root(
    verbose: Annotated[
        bool, typer.Option("--verbose", "-v", help="say on stderr which database each command opens")
    ] = False,
    show_version: Annotated[
        bool, typer.Option("--version", callback=_print_version, is_eager=True, help="print the version and exit")
    ] = False,
) -> None:
    set_verbose(verbose)


def _create_app(settings: Any, **options: Any) -> Any:
    """kvgate.app.create_app, imported when `kvgate serve` runs: `kvgate --help` does not pay for it."""
    from kvgate.app import create_app

    return create_app(settings, **options)


def build_app() -> typer.Typer:
    """The `kvgate` command with every package's commands."""
    app = typer.Typer(
        cls=UserErrorGroup,
        name="kvgate",
        help="kvgate: a multi-tenant prompt-caching LLM gateway. `kvgate COMMAND --help` for each command.",
        no_args_is_help=True,
        # A traceback's locals would print settings, tokens and keys.
        pretty_exceptions_show_locals=False,
    )
    app.callback()(_root)
    inference_cli.register(app)
    gateway_cli.register(app, app_factory=_create_app, banners=(web_cli.serve_banner,))
    billing_cli.register(app)
    web_cli.register(app)
    app.command("config")(config)
    return app


def config(output: OutputOption = OutputFormat.table) -> None:
    """Print the effective settings: every KVGATE_* setting, its value (secrets masked) and where it
    came from (default, .env in this directory, or the environment, which wins)."""
    from kvgate.settings_report import effective_settings
    from kvgate.settings_table import SETTINGS_CLASSES

    columns = [
        "setting",
        "part",
        Column("value", value=lambda row: "(unset)" if row.value is None else row.value),
        "source",
    ]
    emit(effective_settings(SETTINGS_CLASSES), fmt=output, columns=columns)


app = build_app()

# Files kvgate creates (the SQLite database and its -wal/-shm, the usage spool, the disk KV
# tier, which holds tenants' cached prompts) are readable by the owner only.
FILE_MODE_MASK = 0o077


def main(argv: Sequence[str] | None = None) -> int:
    # Before anything imports torch: its OpenMP runtime reads these once, when it loads.
    from inference.cpu_threads import set_openmp_defaults

    set_openmp_defaults()
    previous = os.umask(FILE_MODE_MASK)
    try:
        app(args=list(argv) if argv is not None else None, prog_name="kvgate")
    except SystemExit as exit_:
        return exit_.code if isinstance(exit_.code, int) else (0 if exit_.code is None else 1)
    finally:
        os.umask(previous)
    return 0


if __name__ == "__main__":
    sys.exit(main())
