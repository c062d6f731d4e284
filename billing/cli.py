"""`kvgate prices|usage|invoices|credit-notes|budgets|credits|spool ...`: billing on the database directly.

Like `kvgate tenants`, these migrate the database first and need no running server.
Amounts are USD decimal strings; lists print a table, or JSON with --json.
"""

from __future__ import annotations

import argparse
import asyncio
import json
import sys
from collections.abc import Awaitable, Callable, Sequence
from datetime import UTC, datetime
from decimal import Decimal
from pathlib import Path
from typing import Any

from pydantic import BaseModel

from billing import api, budgets, catalog, credit_notes, invoices, stripe_sync
from billing.csv_export import iter_csv
from billing.ledger import LedgerError
from billing.money import MoneyError, format_usd_exact, usd_to_cents, usd_to_pico
from billing.periods import parse_month
from billing.prices import PriceError, PriceSpec, load_price_file
from billing.render import render_html, render_pdf
from billing.service import BillingService
from billing.settings import BillingSettings
from billing.settlement import reverse_charge
from billing.usage_queries import GROUP_BYS, UsageFilter, UsageQueryError, iter_usage, list_usage, summarize
from kvgate.db import migrate, open_database
from kvgate.errors import KvgateError
from kvgate.settings import KvgateSettings

Action = Callable[[BillingService, argparse.Namespace], Awaitable[None]]

# Errors that are the user's input or the data's state, printed as "error: ..." with exit status 1.
_USER_ERRORS = (
    PriceError,
    MoneyError,
    LedgerError,
    UsageQueryError,
    budgets.BudgetError,
    invoices.InvoiceError,
    credit_notes.CreditNoteError,
    stripe_sync.StripeSyncError,
    KvgateError,
    ValueError,
)


def register(subparsers: Any) -> None:
    prices = _group(subparsers, "prices", "the price catalog")
    sub = prices.add_parser("list", help="price versions")
    sub.add_argument("--model")
    _json(sub).set_defaults(handler=_command(_prices_list))
    sub = prices.add_parser("seed", help="load a TOML price file (idempotent; new prices become new versions)")
    sub.add_argument("--file", type=Path, help="default KVGATE_PRICES_FILE or billing/prices.toml")
    sub.set_defaults(handler=_command(_prices_seed))
    sub = prices.add_parser("add", help="add a price version (a change never edits an old version)")
    sub.add_argument("model")
    sub.add_argument("--effective-from", required=True, help="ISO 8601 with offset, e.g. 2026-04-01T00:00:00Z")
    sub.add_argument("--input", required=True, help="USD per million input tokens")
    sub.add_argument("--output", required=True, help="USD per million output tokens")
    sub.add_argument("--cache-write-5m-multiplier", default="1.25")
    sub.add_argument("--cache-write-1h-multiplier", default="2.0")
    sub.add_argument("--cache-read-multiplier", default="0.1")
    sub.add_argument("--cache-write-24h-multiplier", help="offer OpenAI-style 24h retention at this multiplier")
    sub.set_defaults(handler=_command(_prices_add))

    usage = _group(subparsers, "usage", "the usage ledger")
    sub = _filters(usage.add_parser("list", help="ledger entries"))
    sub.add_argument("--limit", type=int, default=100)
    _json(sub).set_defaults(handler=_command(_usage_list))
    sub = _filters(usage.add_parser("summary", help="totals by day, model or key"))
    sub.add_argument("--group-by", choices=GROUP_BYS, default="day")
    _json(sub).set_defaults(handler=_command(_usage_summary))
    sub = _filters(usage.add_parser("export", help="CSV of every matching entry"))
    sub.add_argument("--out", type=Path, help="file to write (default stdout)")
    sub.set_defaults(handler=_command(_usage_export))
    sub = usage.add_parser("reverse", help="cancel a request's charge with a reversal entry")
    sub.add_argument("request_id")
    sub.add_argument("--reason", required=True)
    sub.set_defaults(handler=_command(_usage_reverse))

    inv = _group(subparsers, "invoices", "monthly invoices")
    sub = inv.add_parser("list", help="invoices (drafts included)")
    sub.add_argument("--tenant")
    sub.add_argument("--status", choices=invoices.STATUSES)
    sub.add_argument("--month", help="YYYY-MM")
    _json(sub).set_defaults(handler=_command(_invoices_list))
    for name, handler, text in (
        ("show", _invoices_show, "one invoice with its lines"),
        ("finalize", _invoices_finalize, "finalize a draft whose month has ended"),
        ("push", _invoices_push, "push a finalized invoice to Stripe (STRIPE_API_KEY)"),
    ):
        sub = inv.add_parser(name, help=text)
        sub.add_argument("invoice_id", type=int)
        sub.set_defaults(handler=_command(handler))
    inv.add_parser("finalize-due", help="finalize every draft past month end plus the grace period").set_defaults(
        handler=_command(_invoices_finalize_due)
    )
    for fmt in ("pdf", "html"):
        sub = inv.add_parser(fmt, help=f"write an invoice as {fmt.upper()}")
        sub.add_argument("invoice_id", type=int)
        sub.add_argument("--out", type=Path, help=f"default <number or draft-ID>.{fmt}")
        sub.set_defaults(handler=_command(_invoices_render), format=fmt)

    notes = _group(subparsers, "credit-notes", "credit notes against finalized invoices")
    sub = notes.add_parser("create", help="credit part of a finalized invoice")
    sub.add_argument("invoice_id", type=int)
    sub.add_argument("amount_usd")
    sub.add_argument("--reason", required=True)
    sub.set_defaults(handler=_command(_credit_notes_create))
    sub = notes.add_parser("list", help="credit notes")
    sub.add_argument("--invoice", type=int)
    sub.add_argument("--tenant")
    _json(sub).set_defaults(handler=_command(_credit_notes_list))

    bud = _group(subparsers, "budgets", "spend limits")
    sub = bud.add_parser("show", help="a tenant's limits, spend and reservations this month")
    sub.add_argument("tenant_id")
    sub.set_defaults(handler=_command(_budgets_show))
    sub = bud.add_parser("set", help="set a tenant's monthly limit and/or prepaid mode")
    sub.add_argument("tenant_id")
    sub.add_argument("--monthly-limit", required=True, help="USD, or 'none' for no limit")
    sub.add_argument("--prepaid", action=argparse.BooleanOptionalAction, default=None)
    sub.set_defaults(handler=_command(_budgets_set))
    sub = bud.add_parser("set-key", help="set an API key's monthly limit")
    sub.add_argument("key_id")
    sub.add_argument("--monthly-limit", required=True, help="USD, or 'none'")
    sub.set_defaults(handler=_command(_budgets_set_key))

    credits = _group(subparsers, "credits", "prepaid credit")
    sub = credits.add_parser("grant", help="add prepaid credit to a tenant")
    sub.add_argument("tenant_id")
    sub.add_argument("amount_usd")
    sub.add_argument("--note", default="")
    sub.add_argument("--idempotency-key")
    sub.set_defaults(handler=_command(_credits_grant))

    spool = _group(subparsers, "spool", "usage spooled while the database was away")
    spool.add_parser("status", help="records waiting").set_defaults(handler=_command(_spool_status))
    spool.add_parser("replay", help="replay them now (exactly once)").set_defaults(handler=_command(_spool_replay))


def _group(subparsers: Any, name: str, text: str) -> Any:
    return subparsers.add_parser(name, help=text).add_subparsers(dest="action", required=True)


def _json(parser: argparse.ArgumentParser) -> argparse.ArgumentParser:
    parser.add_argument("--json", action="store_true", help="print JSON instead of a table")
    return parser


def _filters(parser: argparse.ArgumentParser) -> argparse.ArgumentParser:
    parser.add_argument("--tenant")
    parser.add_argument("--key")
    parser.add_argument("--model")
    parser.add_argument("--start", help="inclusive, ISO 8601 with offset")
    parser.add_argument("--end", help="exclusive, ISO 8601 with offset")
    return parser


def _command(action: Action) -> Callable[[argparse.Namespace], int]:
    def handler(args: argparse.Namespace) -> int:
        url = KvgateSettings().database_url
        migrate(url)

        async def run() -> None:
            async with open_database(url) as sessions:
                settings = BillingSettings()
                if "spool_path" not in settings.model_fields_set:
                    from billing.hooks import default_spool_path

                    settings = settings.model_copy(update={"spool_path": default_spool_path(url)})
                seed = action is not _prices_seed
                service = await BillingService.start(sessions=sessions, settings=settings, seed=seed)
                await action(service, args)

        try:
            asyncio.run(run())
        except _USER_ERRORS as exc:
            print(f"error: {getattr(exc, 'message', None) or exc}", file=sys.stderr)
            return 1
        return 0

    return handler


def _where(args: argparse.Namespace) -> UsageFilter:
    return UsageFilter(
        tenant_id=args.tenant, api_key_id=args.key, model=args.model, start=_when(args.start), end=_when(args.end)
    )


def _when(text: str | None) -> datetime | None:
    if text is None:
        return None
    value = datetime.fromisoformat(text.replace("Z", "+00:00"))
    if value.tzinfo is None:
        raise ValueError(f"{text}: give a time zone, e.g. {text}Z")
    return value.astimezone(UTC)


def _limit(text: str) -> int | None:
    return None if text.strip().lower() == "none" else usd_to_pico(text)


def _print_json(value: BaseModel | Sequence[BaseModel]) -> None:
    if isinstance(value, BaseModel):
        print(value.model_dump_json(indent=2))
    else:
        print(json.dumps([v.model_dump(mode="json") for v in value], indent=2))


def _table(rows: Sequence[dict[str, Any]], columns: Sequence[str]) -> None:
    if not rows:
        print("(none)")
        return
    cells = [[str(row.get(c, "") if row.get(c) is not None else "") for c in columns] for row in rows]
    widths = [max(len(c), *(len(r[i]) for r in cells)) for i, c in enumerate(columns)]
    print("  ".join(c.ljust(w) for c, w in zip(columns, widths, strict=True)))
    for r in cells:
        print("  ".join(v.ljust(w) for v, w in zip(r, widths, strict=True)))


# -- prices -----------------------------------------------------------------------------------


async def _prices_list(service: BillingService, args: argparse.Namespace) -> None:
    async with service.sessions() as session:
        versions = [api.PriceOut.of(v) for v in await catalog.list_versions(session=session, model=args.model)]
    if args.json:
        _print_json(versions)
        return
    _table(
        [v.model_dump() for v in versions],
        ["id", "model", "effective_from", "input_usd_per_mtok", "output_usd_per_mtok", "ttl_classes"],
    )


async def _prices_seed(service: BillingService, args: argparse.Namespace) -> None:
    path = args.file or service.settings.prices_file
    async with service.sessions() as session:
        result = await catalog.seed_prices(session=session, specs=load_price_file(path), source=path.name)
        await session.commit()
    print(f"{len(result.created)} new price versions, {result.unchanged} unchanged ({path})")


async def _prices_add(service: BillingService, args: argparse.Namespace) -> None:
    spec = PriceSpec(
        model=args.model,
        effective_from=_when(args.effective_from) or datetime.now(UTC),
        input_usd_per_mtok=Decimal(args.input),
        output_usd_per_mtok=Decimal(args.output),
        cache_write_5m_multiplier=Decimal(args.cache_write_5m_multiplier),
        cache_write_1h_multiplier=Decimal(args.cache_write_1h_multiplier),
        cache_read_multiplier=Decimal(args.cache_read_multiplier),
        cache_write_24h_multiplier=None
        if args.cache_write_24h_multiplier is None
        else Decimal(args.cache_write_24h_multiplier),
    )
    async with service.sessions() as session:
        version = await catalog.add_version(session=session, spec=spec, source="cli")
        await session.commit()
    print(f"price version {version.id}: {version.model} from {version.effective_from.isoformat()}")


# -- usage ------------------------------------------------------------------------------------


async def _usage_list(service: BillingService, args: argparse.Namespace) -> None:
    async with service.sessions() as session:
        rows = [api.UsageOut.of(r) for r in await list_usage(session=session, where=_where(args), limit=args.limit)]
    if args.json:
        _print_json(rows)
        return
    _table(
        [r.model_dump() for r in rows],
        ["request_id", "tenant_id", "model", "started_at", "input_tokens", "cache_write_5m_tokens",
         "cache_write_1h_tokens", "cache_read_tokens", "output_tokens", "cost_usd"],
    )  # fmt: skip


async def _usage_summary(service: BillingService, args: argparse.Namespace) -> None:
    async with service.sessions() as session:
        rows = await summarize(session=session, where=_where(args), group_by=args.group_by)
    out = [
        {
            args.group_by: r.key,
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
    _table(out, list(out[0]) if out else [args.group_by])


async def _usage_export(service: BillingService, args: argparse.Namespace) -> None:
    async with service.sessions() as session:
        rows = [row async for row in iter_usage(session=session, where=_where(args))]
    if args.out is None:
        for chunk in iter_csv(rows):
            sys.stdout.write(chunk)
        return
    with args.out.open("w", newline="") as fh:
        for chunk in iter_csv(rows):
            fh.write(chunk)
    print(f"wrote {len(rows)} entries to {args.out}")


async def _usage_reverse(service: BillingService, args: argparse.Namespace) -> None:
    async with service.sessions() as session:
        result = await reverse_charge(session=session, request_id=args.request_id, reason=args.reason)
        await session.commit()
    state = "reversed" if result.inserted else "already reversed"
    print(f"{args.request_id}: {state}, {format_usd_exact(result.cost_pico)} USD in {result.billing_month:%Y-%m}")


# -- invoices -----------------------------------------------------------------------------------


async def _invoices_list(service: BillingService, args: argparse.Namespace) -> None:
    async with service.sessions() as session:
        await invoices.ensure_drafts(session=session)
        await session.commit()
        rows = await invoices.list_invoices(
            session=session,
            tenant_id=args.tenant,
            status=args.status,
            month=parse_month(args.month) if args.month else None,
            limit=1000,
        )
        out = [
            api.invoice_out(await invoices.view_invoice(session=session, invoice_id=r.id), detail=False) for r in rows
        ]
    if args.json:
        _print_json(out)
        return
    _table(
        [o.model_dump() for o in out],
        ["id", "tenant_id", "month", "status", "number", "requests", "total_usd", "savings_usd", "amount_due_usd"],
    )


async def _invoices_show(service: BillingService, args: argparse.Namespace) -> None:
    async with service.sessions() as session:
        _print_json(
            api.invoice_out(await invoices.view_invoice(session=session, invoice_id=args.invoice_id), detail=True)
        )


async def _invoices_finalize(service: BillingService, args: argparse.Namespace) -> None:
    async with service.sessions() as session:
        view = await invoices.finalize_invoice(
            session=session, invoice_id=args.invoice_id, number_prefix=service.settings.invoice_number_prefix
        )
        await session.commit()
    print(f"invoice {view.invoice.id} finalized as {view.invoice.number}: {view.computation.total_cents / 100:.2f} USD")


async def _invoices_finalize_due(service: BillingService, args: argparse.Namespace) -> None:
    views = await service.finalize_due_invoices()
    for view in views:
        inv = view.invoice
        print(f"invoice {inv.id} ({inv.tenant_id}, {inv.period_start:%Y-%m}) -> {inv.number}")
    print(f"{len(views)} invoices finalized")


async def _invoices_render(service: BillingService, args: argparse.Namespace) -> None:
    async with service.sessions() as session:
        view = await invoices.view_invoice(session=session, invoice_id=args.invoice_id)
        document = await invoices.invoice_document(session=session, view=view, seller=service.settings.seller_name)
    out = args.out or Path(f"{document.number or f'draft-{document.invoice_id}'}.{args.format}")
    if args.format == "pdf":
        out.write_bytes(render_pdf(document))
    else:
        out.write_text(render_html(document))
    print(f"wrote {out}")


async def _invoices_push(service: BillingService, args: argparse.Namespace) -> None:
    client = stripe_sync.client_from_settings(service.settings)
    if client is None:
        raise ValueError("Stripe is not configured: set STRIPE_API_KEY")
    result = await stripe_sync.push_invoice(
        sessions=service.sessions, client=client, invoice_id=args.invoice_id, currency=service.settings.stripe_currency
    )
    print(
        f"invoice {result.invoice_id} -> Stripe {result.stripe_invoice_id} (customer {result.stripe_customer_id}): "
        f"{result.items_created} items created, {result.items_existing} already there"
    )


# -- credit notes, budgets, credits ---------------------------------------------------------------


async def _credit_notes_create(service: BillingService, args: argparse.Namespace) -> None:
    async with service.sessions() as session:
        note = await credit_notes.issue_credit_note(
            session=session,
            invoice_id=args.invoice_id,
            amount_cents=usd_to_cents(args.amount_usd),
            reason=args.reason,
            number_prefix=service.settings.invoice_number_prefix,
        )
        await session.commit()
    print(f"credit note {note.number}: {note.amount_cents / 100:.2f} USD against invoice {note.invoice_id}")


async def _credit_notes_list(service: BillingService, args: argparse.Namespace) -> None:
    async with service.sessions() as session:
        notes = [
            api.credit_note_out(n)
            for n in await credit_notes.list_credit_notes(
                session=session, invoice_id=args.invoice, tenant_id=args.tenant
            )
        ]
    if args.json:
        _print_json(notes)
        return
    _table([n.model_dump() for n in notes], ["number", "invoice_id", "amount_usd", "reason", "created_at"])


async def _budgets_show(service: BillingService, args: argparse.Namespace) -> None:
    from kvgate.tenancy import Tenant

    async with service.sessions() as session:
        if await session.get(Tenant, args.tenant_id) is None:
            raise ValueError(f"no tenant {args.tenant_id}")
        _print_json(await api.budget_out(session, args.tenant_id))


async def _budgets_set(service: BillingService, args: argparse.Namespace) -> None:
    async with service.sessions() as session:
        await budgets.set_tenant_budget(
            session=session,
            tenant_id=args.tenant_id,
            monthly_limit_pico=_limit(args.monthly_limit),
            prepaid=args.prepaid,
        )
        await session.commit()
        _print_json(await api.budget_out(session, args.tenant_id))


async def _budgets_set_key(service: BillingService, args: argparse.Namespace) -> None:
    from kvgate.tenancy import ApiKey

    async with service.sessions() as session:
        key = await session.get(ApiKey, args.key_id)
        if key is None:
            raise ValueError(f"no API key {args.key_id}")
        await budgets.set_key_budget(
            session=session, tenant_id=key.tenant_id, api_key_id=key.id, monthly_limit_pico=_limit(args.monthly_limit)
        )
        await session.commit()
    print(f"key {args.key_id}: monthly limit {args.monthly_limit}")


async def _credits_grant(service: BillingService, args: argparse.Namespace) -> None:
    async with service.sessions() as session:
        grant, created = await budgets.grant_credit(
            session=session,
            tenant_id=args.tenant_id,
            amount_pico=usd_to_pico(args.amount_usd),
            note=args.note,
            idempotency_key=args.idempotency_key,
        )
        await session.commit()
    state = "granted" if created else "already granted"
    print(f"{state}: {format_usd_exact(grant.amount_pico)} USD to {args.tenant_id} (grant {grant.id})")


async def _spool_status(service: BillingService, args: argparse.Namespace) -> None:
    print(f"{service.spool.pending()} records waiting in {service.spool.path}")


async def _spool_replay(service: BillingService, args: argparse.Namespace) -> None:
    result = await service.replay_spool()
    print(
        f"replayed {result.records} records from {result.files} files: {result.applied} new, {result.corrupt} corrupt"
    )
