"""`kvgate engine serve` is wired into the kvgate command."""

from __future__ import annotations

import typer
from typer.testing import CliRunner

from kvgate.cli import app


def serve_params(*argv: str) -> dict[str, object]:
    """The options `kvgate engine serve ARGV` would run with (parsed, not run)."""
    root = typer.main.get_command(app)
    with typer.Context(root) as ctx:
        engine = root.get_command(ctx, "engine")  # type: ignore[attr-defined]
        serve = engine.get_command(ctx, "serve")
        assert serve is not None and "vLLM" in (serve.help or "")
        return serve.make_context("serve", list(argv), parent=ctx).params


def test_engine_serve_parses_host_and_port() -> None:
    params = serve_params("--host", "0.0.0.0", "--port", "9001")
    assert (params["host"], params["port"]) == ("0.0.0.0", 9001)
    defaults = serve_params()
    assert (defaults["host"], defaults["port"]) == ("127.0.0.1", 8001)


def test_engine_needs_a_subcommand() -> None:
    result = CliRunner().invoke(app, ["engine"])
    assert result.exit_code != 0 and "serve" in result.output
    assert CliRunner().invoke(app, ["engine", "serve", "--help"]).exit_code == 0
