"""`kvgate budgets show|set|set-key`: spend limits."""

from __future__ import annotations

import argparse
from typing import Any

from billing import operations
from billing.cli.common import command, group, limit_pico, print_json
from billing.schemas import BudgetOut
from billing.service import BillingService


def register(subparsers: Any) -> None:
    bud = group(subparsers, "budgets", "spend limits")
    sub = bud.add_parser("show", help="a tenant's limits, spend and reservations this month")
    sub.add_argument("tenant_id")
    sub.set_defaults(handler=command(_show))
    sub = bud.add_parser("set", help="set a tenant's monthly limit and/or prepaid mode")
    sub.add_argument("tenant_id")
    sub.add_argument("--monthly-limit", required=True, help="USD, or 'none' for no limit")
    sub.add_argument("--prepaid", action=argparse.BooleanOptionalAction, default=None)
    sub.set_defaults(handler=command(_set))
    sub = bud.add_parser("set-key", help="set an API key's monthly limit")
    sub.add_argument("key_id")
    sub.add_argument("--monthly-limit", required=True, help="USD, or 'none'")
    sub.set_defaults(handler=command(_set_key))


async def _show(service: BillingService, args: argparse.Namespace) -> None:
    async with service.sessions() as session:
        print_json(BudgetOut.of(await operations.budget_status(session=session, tenant_id=args.tenant_id)))


async def _set(service: BillingService, args: argparse.Namespace) -> None:
    limit = limit_pico(args.monthly_limit)
    async with service.sessions() as session:
        status = await operations.set_tenant_budget(
            session=session, tenant_id=args.tenant_id, monthly_limit_pico=limit, prepaid=args.prepaid
        )
    print_json(BudgetOut.of(status))


async def _set_key(service: BillingService, args: argparse.Namespace) -> None:
    limit = limit_pico(args.monthly_limit)
    async with service.sessions() as session:
        await operations.set_key_budget(session=session, key_id=args.key_id, monthly_limit_pico=limit)
    print(f"key {args.key_id}: monthly limit {args.monthly_limit}")
