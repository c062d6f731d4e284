"""`kvgate prices list|seed|add`: the price catalog."""

from __future__ import annotations

import argparse
import sys
from datetime import UTC, datetime
from decimal import Decimal
from pathlib import Path
from typing import Any

from billing import catalog, operations
from billing.cli.common import command, group, json_flag, print_json, table, when
from billing.prices import PRICE_FIELDS, PriceChange
from billing.schemas import PriceOut
from billing.service import BillingService


def register(subparsers: Any) -> None:
    prices = group(subparsers, "prices", "the price catalog")
    sub = prices.add_parser("list", help="price versions")
    sub.add_argument("--model")
    json_flag(sub).set_defaults(handler=command(_list))
    sub = prices.add_parser("seed", help="load a TOML price file (idempotent; new prices become new versions)")
    sub.add_argument("--file", type=Path, help="default KVGATE_PRICES_FILE or billing/prices.toml")
    sub.set_defaults(handler=command(_seed, seed=False))
    sub = prices.add_parser("add", help="add a price version (a change never edits an old version)")
    sub.add_argument("model")
    sub.add_argument("--effective-from", required=True, help="ISO 8601 with offset, e.g. 2026-04-01T00:00:00Z")
    sub.add_argument("--input", help="USD per million input tokens")
    sub.add_argument("--output", help="USD per million output tokens")
    for name in MULTIPLIERS:
        sub.add_argument(f"--{name.replace('_', '-')}")
    sub.set_defaults(handler=command(_add))


async def _list(service: BillingService, args: argparse.Namespace) -> None:
    async with service.sessions() as session:
        versions = [PriceOut.of(v) for v in await catalog.list_versions(session=session, model=args.model)]
    if args.json:
        print_json(versions)
        return
    table(
        [v.model_dump() for v in versions],
        ["id", "model", "effective_from", "input_usd_per_mtok", "output_usd_per_mtok", "ttl_classes"],
    )


async def _seed(service: BillingService, args: argparse.Namespace) -> None:
    path = args.file or service.settings.prices_file
    async with service.sessions() as session:
        result = await operations.seed_prices(session=session, path=path)
    print(f"{len(result.created)} new price versions, {result.unchanged} unchanged ({path})")


MULTIPLIERS = [n for n in PRICE_FIELDS if n.endswith("multiplier")]


async def _add(service: BillingService, args: argparse.Namespace) -> None:
    given: dict[str, Decimal | None] = {}
    for name in PRICE_FIELDS:
        text = getattr(args, name.removesuffix("_usd_per_mtok"))
        if text is not None:
            given[name] = None if text.lower() == "none" else Decimal(text)
    change = PriceChange(model=args.model, effective_from=when(args.effective_from) or datetime.now(UTC), given=given)
    async with service.sessions() as session:
        added = await operations.add_price(session=session, change=change, source="cli")
    version = added.version
    if added.carried_over:
        names = ", ".join(added.carried_over)
        print(f"warning: carried over from version {added.carried_from}: {names}", file=sys.stderr)
    print(f"price version {version.id}: {version.model} from {version.effective_from.isoformat()}")
