"""`kvgate prices list|seed|add`: the price catalog."""

from __future__ import annotations

import argparse
from datetime import UTC, datetime
from decimal import Decimal
from pathlib import Path
from typing import Any

from billing import catalog, operations
from billing.cli.common import command, group, json_flag, print_json, table, when
from billing.prices import PriceSpec
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
    sub.add_argument("--input", required=True, help="USD per million input tokens")
    sub.add_argument("--output", required=True, help="USD per million output tokens")
    sub.add_argument("--cache-write-5m-multiplier", default="1.25")
    sub.add_argument("--cache-write-1h-multiplier", default="2.0")
    sub.add_argument("--cache-read-multiplier", default="0.1")
    sub.add_argument("--cache-write-30m-multiplier", default="1.7")
    sub.add_argument("--cache-write-12h-multiplier", default="5.0")
    sub.add_argument("--cache-write-24h-multiplier", help="offer OpenAI-style 24h retention at this multiplier")
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


async def _add(service: BillingService, args: argparse.Namespace) -> None:
    spec = PriceSpec(
        model=args.model,
        effective_from=when(args.effective_from) or datetime.now(UTC),
        input_usd_per_mtok=Decimal(args.input),
        output_usd_per_mtok=Decimal(args.output),
        cache_write_5m_multiplier=Decimal(args.cache_write_5m_multiplier),
        cache_write_1h_multiplier=Decimal(args.cache_write_1h_multiplier),
        cache_read_multiplier=Decimal(args.cache_read_multiplier),
        cache_write_30m_multiplier=Decimal(args.cache_write_30m_multiplier),
        cache_write_12h_multiplier=Decimal(args.cache_write_12h_multiplier),
        cache_write_24h_multiplier=None
        if args.cache_write_24h_multiplier is None
        else Decimal(args.cache_write_24h_multiplier),
    )
    async with service.sessions() as session:
        version = await operations.add_price(session=session, spec=spec, source="cli")
    print(f"price version {version.id}: {version.model} from {version.effective_from.isoformat()}")
