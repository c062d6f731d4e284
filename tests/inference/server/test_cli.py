"""`kvgate engine serve` is wired into the kvgate command."""

from __future__ import annotations

import pytest

from kvgate.cli import build_parser


def test_engine_serve_parses_host_and_port() -> None:
    args = build_parser().parse_args(["engine", "serve", "--host", "0.0.0.0", "--port", "9001"])
    assert (args.host, args.port) == ("0.0.0.0", 9001)
    assert args.handler.__module__ == "inference.cli"
    defaults = build_parser().parse_args(["engine", "serve"])
    assert (defaults.host, defaults.port) == ("127.0.0.1", 8001)


def test_engine_needs_a_subcommand() -> None:
    with pytest.raises(SystemExit):
        build_parser().parse_args(["engine"])
