"""`kvgate invoices list|show|finalize|push|push-due|finalize-due|pdf|html|csv`: monthly invoices."""

from __future__ import annotations

import argparse
from pathlib import Path
from typing import Any

from billing import invoices, operations
from billing.cli.common import command, group, json_flag, print_json, table
from billing.csv_export import invoice_lines_csv
from billing.invoice_schemas import InvoiceOut
from billing.periods import parse_month
from billing.render import render_html, render_pdf
from billing.service import BillingService


def register(subparsers: Any) -> None:
    inv = group(subparsers, "invoices", "monthly invoices")
    sub = inv.add_parser("list", help="invoices (drafts included)")
    sub.add_argument("--tenant")
    sub.add_argument("--status", choices=invoices.STATUSES)
    sub.add_argument("--month", help="YYYY-MM")
    json_flag(sub).set_defaults(handler=command(_list))
    for name, handler, text in (
        ("show", _show, "one invoice with its lines"),
        ("finalize", _finalize, "finalize a draft whose month has ended"),
        ("push", _push, "push a finalized invoice to Stripe (STRIPE_API_KEY)"),
    ):
        sub = inv.add_parser(name, help=text)
        sub.add_argument("invoice_id", type=int)
        sub.set_defaults(handler=command(handler))
    inv.add_parser("finalize-due", help="finalize every draft past month end plus the grace period").set_defaults(
        handler=command(_finalize_due)
    )
    inv.add_parser(
        "push-due", help="push every finalized invoice and credit note not yet in Stripe (catch-up)"
    ).set_defaults(handler=command(_push_due))
    sub = inv.add_parser("csv", help="an invoice's lines as CSV (exact and charged amounts)")
    sub.add_argument("invoice_id", type=int)
    sub.add_argument("--out", type=Path, help="default: standard output")
    sub.set_defaults(handler=command(_csv))
    for fmt in ("pdf", "html"):
        sub = inv.add_parser(fmt, help=f"write an invoice as {fmt.upper()}")
        sub.add_argument("invoice_id", type=int)
        sub.add_argument("--out", type=Path, help=f"default <number or draft-ID>.{fmt}")
        sub.set_defaults(handler=command(_render), format=fmt)


async def _list(service: BillingService, args: argparse.Namespace) -> None:
    month = parse_month(args.month) if args.month else None
    async with service.sessions() as session:
        views = await operations.list_invoices(
            session=session, tenant_id=args.tenant, status=args.status, month=month, limit=1000
        )
    out = [InvoiceOut.of(v, detail=False) for v in views]
    if args.json:
        print_json(out)
        return
    table(
        [o.model_dump() for o in out],
        ["id", "tenant_id", "month", "status", "number", "requests", "total_usd", "savings_usd", "amount_due_usd"],
    )


async def _show(service: BillingService, args: argparse.Namespace) -> None:
    async with service.sessions() as session:
        print_json(InvoiceOut.of(await invoices.view_invoice(session=session, invoice_id=args.invoice_id), detail=True))


async def _finalize(service: BillingService, args: argparse.Namespace) -> None:
    async with service.sessions() as session:
        view = await operations.finalize_invoice(
            session=session,
            invoice_id=args.invoice_id,
            number_prefix=service.settings.invoice_number_prefix,
            settings=service.settings,
        )
    print(f"invoice {view.invoice.id} finalized as {view.invoice.number}: {view.total_cents / 100:.2f} USD")
    await operations.auto_push(sessions=service.sessions, settings=service.settings, invoice_id=view.invoice.id)


async def _finalize_due(service: BillingService, args: argparse.Namespace) -> None:
    views = await service.finalize_due_invoices()
    for view in views:
        inv = view.invoice
        print(f"invoice {inv.id} ({inv.tenant_id}, {inv.period_start:%Y-%m}) -> {inv.number}")
    print(f"{len(views)} invoices finalized")


async def _render(service: BillingService, args: argparse.Namespace) -> None:
    async with service.sessions() as session:
        document = await operations.invoice_document(
            session=session, invoice_id=args.invoice_id, seller=service.settings.seller_name, settings=service.settings
        )
    out = args.out or Path(f"{document.number or f'draft-{document.invoice_id}'}.{args.format}")
    if args.format == "pdf":
        out.write_bytes(render_pdf(document))
    else:
        out.write_text(render_html(document))
    print(f"wrote {out}")


async def _push(service: BillingService, args: argparse.Namespace) -> None:
    result = await operations.push_to_stripe(
        sessions=service.sessions, settings=service.settings, invoice_id=args.invoice_id
    )
    print(
        f"invoice {result.invoice_id} -> Stripe {result.stripe_invoice_id} (customer {result.stripe_customer_id}): "
        f"{result.items_created} items created, {result.items_existing} already there"
    )


async def _push_due(service: BillingService, args: argparse.Namespace) -> None:
    results = await operations.push_due(sessions=service.sessions, settings=service.settings)
    for r in results:
        print(
            f"invoice {r.invoice_id} -> Stripe {r.stripe_invoice_id}: {r.items_created} items, "
            f"{r.credit_notes_created} credit notes created; amount due in Stripe {r.amount_due_cents} cents"
        )
    print(f"{len(results)} invoices pushed")


async def _csv(service: BillingService, args: argparse.Namespace) -> None:
    async with service.sessions() as session:
        view = await invoices.view_invoice(session=session, invoice_id=args.invoice_id)
    name = view.invoice.number or f"draft-{view.invoice.id}"
    text = invoice_lines_csv(invoice=name, lines=view.computation.lines)
    if args.out is None:
        print(text, end="")
        return
    args.out.write_text(text)
    print(f"wrote {args.out}")
