"""The `kvgate` command. Each package contributes its subcommands through a `register` function."""

from __future__ import annotations

import argparse
import importlib
import os
import sys
from collections.abc import Callable, Sequence

# Modules that expose `register(subparsers)`; each adds its own subcommands.
COMMAND_MODULES = ("inference.cli", "gateway.cli", "billing.cli")


def build_parser() -> argparse.ArgumentParser:
    parser = argparse.ArgumentParser(prog="kvgate", description=__doc__)
    subparsers = parser.add_subparsers(dest="command", required=True)
    for name in COMMAND_MODULES:
        try:
            module = importlib.import_module(name)
        except ModuleNotFoundError as exc:
            if exc.name != name:
                raise
            continue
        module.register(subparsers)
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
