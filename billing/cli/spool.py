"""`kvgate spool status|replay`: usage spooled while the database was away."""

from __future__ import annotations

import argparse
from typing import Any

from billing.cli.common import command, group
from billing.service import BillingService


def register(subparsers: Any) -> None:
    spool = group(subparsers, "spool", "usage spooled while the database was away")
    spool.add_parser("status", help="records waiting").set_defaults(handler=command(_status))
    spool.add_parser("replay", help="replay them now (exactly once)").set_defaults(handler=command(_replay))


async def _status(service: BillingService, args: argparse.Namespace) -> None:
    print(f"{service.spool.pending()} records waiting in {service.spool.path}")


async def _replay(service: BillingService, args: argparse.Namespace) -> None:
    result = await service.replay_spool()
    print(
        f"replayed {result.records} records from {result.files} files: {result.applied} new, {result.corrupt} corrupt"
    )
