"""What the billing commands share: running an action against the database, flags, tables, JSON."""

from __future__ import annotations

import argparse
import asyncio
import json
import sys
from collections.abc import Awaitable, Callable, Sequence
from datetime import UTC, datetime
from typing import Any

from pydantic import BaseModel

from billing.money import parse_usd
from billing.service import BillingService
from billing.settings import BillingSettings
from billing.stripe_sync import StripeSyncError
from billing.usage_queries import UsageFilter
from kvgate.db import migrate, open_database
from kvgate.errors import KvgateError
from kvgate.settings import KvgateSettings

Action = Callable[[BillingService, argparse.Namespace], Awaitable[None]]

# Errors that are the user's input or the data's state, printed as "error: ..." with exit status 1.
USER_ERRORS = (KvgateError, StripeSyncError, ValueError)


def group(subparsers: Any, name: str, text: str) -> Any:
    return subparsers.add_parser(name, help=text).add_subparsers(dest="action", required=True)


def json_flag(parser: argparse.ArgumentParser) -> argparse.ArgumentParser:
    parser.add_argument("--json", action="store_true", help="print JSON instead of a table")
    return parser


def filter_flags(parser: argparse.ArgumentParser) -> argparse.ArgumentParser:
    parser.add_argument("--tenant")
    parser.add_argument("--key")
    parser.add_argument("--model")
    parser.add_argument("--start", help="inclusive, ISO 8601 with offset")
    parser.add_argument("--end", help="exclusive, ISO 8601 with offset")
    return parser


def command(action: Action, *, seed: bool = True) -> Callable[[argparse.Namespace], int]:
    """The handler of a subcommand: migrate, start the billing service (seeding prices unless
    `seed` is False), run the action; a user error prints one line and exits 1."""

    def handler(args: argparse.Namespace) -> int:
        url = KvgateSettings().database_url
        migrate(url)

        async def run() -> None:
            async with open_database(url) as sessions:
                settings = BillingSettings()
                if "spool_path" not in settings.model_fields_set:
                    from billing.hooks import default_spool_path

                    settings = settings.model_copy(update={"spool_path": default_spool_path(url)})
                service = await BillingService.start(sessions=sessions, settings=settings, seed=seed)
                await action(service, args)

        try:
            asyncio.run(run())
        except USER_ERRORS as exc:
            print(f"error: {getattr(exc, 'message', None) or exc}", file=sys.stderr)
            return 1
        return 0

    return handler


def where(args: argparse.Namespace) -> UsageFilter:
    return UsageFilter(
        tenant_id=args.tenant, api_key_id=args.key, model=args.model, start=when(args.start), end=when(args.end)
    )


def when(text: str | None) -> datetime | None:
    if text is None:
        return None
    value = datetime.fromisoformat(text.replace("Z", "+00:00"))
    if value.tzinfo is None:
        raise ValueError(f"{text}: give a time zone, e.g. {text}Z")
    return value.astimezone(UTC)


def limit_pico(text: str) -> int | None:
    """A monthly limit as given: USD, or 'none' for no limit."""
    return None if text.strip().lower() == "none" else parse_usd(text, field="--monthly-limit")


def print_json(value: BaseModel | Sequence[BaseModel]) -> None:
    if isinstance(value, BaseModel):
        print(value.model_dump_json(indent=2))
    else:
        print(json.dumps([v.model_dump(mode="json") for v in value], indent=2))


def table(rows: Sequence[dict[str, Any]], columns: Sequence[str]) -> None:
    if not rows:
        print("(none)")
        return
    cells = [[str(row.get(c, "") if row.get(c) is not None else "") for c in columns] for row in rows]
    widths = [max(len(c), *(len(r[i]) for r in cells)) for i, c in enumerate(columns)]
    print("  ".join(c.ljust(w) for c, w in zip(columns, widths, strict=True)))
    for r in cells:
        print("  ".join(v.ljust(w) for v, w in zip(r, widths, strict=True)))
