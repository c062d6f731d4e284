"""`kvgate credits grant`: prepaid credit."""

from __future__ import annotations

import argparse
from typing import Any

from billing import operations
from billing.cli.common import command, group
from billing.money import format_usd_exact, parse_usd
from billing.service import BillingService


def register(subparsers: Any) -> None:
    credits = group(subparsers, "credits", "prepaid credit")
    sub = credits.add_parser("grant", help="add prepaid credit to a tenant")
    sub.add_argument("tenant_id")
    sub.add_argument("amount_usd")
    sub.add_argument("--note", default="")
    sub.add_argument("--idempotency-key")
    sub.set_defaults(handler=command(_grant))


async def _grant(service: BillingService, args: argparse.Namespace) -> None:
    async with service.sessions() as session:
        grant, created = await operations.grant_credit(
            session=session,
            tenant_id=args.tenant_id,
            amount_pico=parse_usd(args.amount_usd, field="amount_usd"),
            note=args.note,
            idempotency_key=args.idempotency_key,
        )
    state = "granted" if created else "already granted"
    print(f"{state}: {format_usd_exact(grant.amount_pico)} USD to {args.tenant_id} (grant {grant.id})")
