"""The `kvgate` command. Each package contributes its subcommands through a `register` function.

Part of the composition root (with kvgate.app): it names every package's commands, and
hands `kvgate serve` the app with billing wired in.
"""

from __future__ import annotations

import argparse
import os
import sys
from collections.abc import Callable, Sequence

from billing import cli as billing_cli
from gateway import cli as gateway_cli
from inference import cli as inference_cli
from kvgate.app import create_app
from web import cli as web_cli


def build_parser() -> argparse.ArgumentParser:
    parser = argparse.ArgumentParser(prog="kvgate", description=__doc__.splitlines()[0])
    subparsers = parser.add_subparsers(dest="command", required=True)
    inference_cli.register(subparsers)
    gateway_cli.register(subparsers, app_factory=create_app, banners=(web_cli.serve_banner,))
    billing_cli.register(subparsers)
    web_cli.register(subparsers)
    return parser


# Files kvgate creates (the SQLite database and its -wal/-shm, the usage spool, the disk KV
# tier, which holds tenants' cached prompts) are readable by the owner only.
FILE_MODE_MASK = 0o077


def main(argv: Sequence[str] | None = None) -> int:
    # Before anything imports torch: its OpenMP runtime reads these once, when it loads.
    from inference.cpu_threads import set_openmp_defaults

    set_openmp_defaults()
    args = build_parser().parse_args(argv)
    handler: Callable[[argparse.Namespace], int | None] = args.handler
    previous = os.umask(FILE_MODE_MASK)
    try:
        return handler(args) or 0
    finally:
        os.umask(previous)


if __name__ == "__main__":
    sys.exit(main())
