"""`kvgate usage list|summary|export|reverse`: the usage ledger."""

from __future__ import annotations

import argparse
import json
import sys
from pathlib import Path
from typing import Any

from billing import operations
from billing.cli.common import command, filter_flags, group, json_flag, print_json, table, where
from billing.csv_export import iter_csv
from billing.money import format_usd_exact
from billing.schemas import UsageOut
from billing.service import BillingService
from billing.usage_queries import GROUP_BYS, iter_usage, list_usage, summarize


def register(subparsers: Any) -> None:
    usage = group(subparsers, "usage", "the usage ledger")
    sub = filter_flags(usage.add_parser("list", help="ledger entries"))
    sub.add_argument("--limit", type=int, default=100)
    json_flag(sub).set_defaults(handler=command(_list))
    sub = filter_flags(usage.add_parser("summary", help="totals by day, model or key"))
    sub.add_argument("--group-by", choices=GROUP_BYS, default="day")
    json_flag(sub).set_defaults(handler=command(_summary))
    sub = filter_flags(usage.add_parser("export", help="CSV of every matching entry"))
    sub.add_argument("--out", type=Path, help="file to write (default stdout)")
    sub.set_defaults(handler=command(_export))
    sub = usage.add_parser("reverse", help="cancel a request's charge with a reversal entry")
    sub.add_argument("request_id")
    sub.add_argument("--reason", required=True)
    sub.set_defaults(handler=command(_reverse))


async def _list(service: BillingService, args: argparse.Namespace) -> None:
    async with service.sessions() as session:
        rows = [UsageOut.of(r) for r in await list_usage(session=session, where=where(args), limit=args.limit)]
    if args.json:
        print_json(rows)
        return
    table(
        [r.model_dump() for r in rows],
        ["request_id", "tenant_id", "model", "started_at", "input_tokens", "cache_write_5m_tokens",
         "cache_write_1h_tokens", "cache_read_tokens", "output_tokens", "cost_usd"],
    )  # fmt: skip


async def _summary(service: BillingService, args: argparse.Namespace) -> None:
    async with service.sessions() as session:
        rows = await summarize(session=session, where=where(args), group_by=[args.group_by])
    out = [
        {
            args.group_by: {"day": r.day, "model": r.model, "key": r.api_key_id}[args.group_by],
            "requests": r.requests,
            "input": r.counts.input,
            "cache_write": r.counts.cache_writes,
            "cache_read": r.counts.cache_read,
            "output": r.counts.output,
            "cost_usd": format_usd_exact(r.cost_pico),
            "uncached_usd": format_usd_exact(r.uncached_cost_pico),
        }
        for r in rows
    ]
    if args.json:
        print(json.dumps(out, indent=2))
        return
    table(out, list(out[0]) if out else [args.group_by])


async def _export(service: BillingService, args: argparse.Namespace) -> None:
    async with service.sessions() as session:
        rows = [row async for row in iter_usage(session=session, where=where(args))]
    if args.out is None:
        for chunk in iter_csv(rows):
            sys.stdout.write(chunk)
        return
    with args.out.open("w", newline="") as fh:
        for chunk in iter_csv(rows):
            fh.write(chunk)
    print(f"wrote {len(rows)} entries to {args.out}")


async def _reverse(service: BillingService, args: argparse.Namespace) -> None:
    async with service.sessions() as session:
        result = await operations.reverse_usage(session=session, request_id=args.request_id, reason=args.reason)
    state = "reversed" if result.inserted else "already reversed"
    print(f"{args.request_id}: {state}, {format_usd_exact(result.cost_pico)} USD in {result.billing_month:%Y-%m}")
