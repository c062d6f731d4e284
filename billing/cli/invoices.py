"""`kvgate invoices list|show|finalize|push|push-due|finalize-due|pdf|html|csv`: monthly invoices."""

from __future__ import annotations

from enum import StrEnum
from pathlib import Path
from typing import Annotated

import typer

from billing import invoices, operations
from billing.cli.common import TenantOption, run_billing
from billing.csv_export import invoice_lines_csv
from billing.invoice_schemas import InvoiceOut
from billing.periods import parse_month
from billing.render import InvoiceDocument, render_html, render_pdf
from billing.service import BillingService
from kvgate.cli_dates import MonthOption
from kvgate.cli_output import Column, OutputFormat, OutputOption, emit, emit_one

app = typer.Typer(help="monthly invoices", no_args_is_help=True)
Status = StrEnum("Status", {s: s for s in invoices.STATUSES})  # type: ignore[misc]
InvoiceId = Annotated[int, typer.Argument(min=1, help="the invoice's id (see `kvgate invoices list`)")]
OutFile = Annotated[Path | None, typer.Option("--out", help="file to write")]

LIST_COLUMNS = [
    "id",
    "tenant_id",
    "month",
    "status",
    "number",
    "requests",
    Column("total_usd", "total $"),
    Column("savings_usd", "saved $"),
    Column("credited_usd", "credited $"),
    Column("amount_due_usd", "due $"),
]
SHOW_FIELDS = [
    "id",
    "tenant_id",
    "month",
    "status",
    "number",
    "requests",
    "subtotal_usd",
    "tax_usd",
    "total_usd",
    "uncached_usd",
    "savings_usd",
    "savings_percent",
    "credited_usd",
    "amount_due_usd",
    "created_at",
    "finalized_at",
    "due_on",
    "paid_at",
    "stripe_invoice_id",
]
LINE_COLUMNS = [
    "position",
    "model",
    "category",
    "tokens",
    Column("unit_price_usd_per_mtok", "$/Mtok", money=True),
    Column("amount_usd", "amount $"),
    Column("exact_amount_usd", "exact $", money=True),
]


def register(root: typer.Typer) -> None:
    root.add_typer(app, name="invoices")


@app.command("list")
def list_invoices(
    tenant: TenantOption = None,
    status: Annotated[Status | None, typer.Option(help="only invoices in this state")] = None,
    month: MonthOption = None,
    output: OutputOption = OutputFormat.table,
) -> None:
    """Invoices, newest month first (drafts of months with usage included)."""

    async def load(service: BillingService) -> list[InvoiceOut]:
        async with service.sessions() as session:
            views = await operations.list_invoices(
                session=session,
                tenant_id=tenant,
                status=None if status is None else status.value,
                month=parse_month(month) if month else None,
                limit=1000,
            )
        return [InvoiceOut.of(v, detail=False) for v in views]

    emit(run_billing(load, write=False), fmt=output, columns=LIST_COLUMNS, model=InvoiceOut)


@app.command("show")
def show(invoice_id: InvoiceId, output: OutputOption = OutputFormat.table) -> None:
    """One invoice with its lines and credit notes."""

    async def load(service: BillingService) -> InvoiceOut:
        async with service.sessions() as session:
            return InvoiceOut.of(await invoices.view_invoice(session=session, invoice_id=invoice_id), detail=True)

    invoice = run_billing(load, write=False)
    if output != OutputFormat.table:
        emit_one(invoice, fmt=output)
        return
    emit_one(invoice, fmt=output, columns=SHOW_FIELDS)
    print()
    emit(invoice.lines or [], fmt=output, columns=LINE_COLUMNS, title="Lines")
    if invoice.credit_notes:
        print()
        emit(invoice.credit_notes, fmt=output, columns=["number", "amount_usd", "reason", "created_at"])


@app.command("finalize")
def finalize(invoice_id: InvoiceId) -> None:
    """Finalize a draft whose month has ended (and push it to Stripe when auto-push is on)."""

    async def action(service: BillingService) -> None:
        async with service.sessions() as session:
            view = await operations.finalize_invoice(
                session=session,
                invoice_id=invoice_id,
                number_prefix=service.settings.invoice_number_prefix,
                settings=service.settings,
            )
        print(f"invoice {view.invoice.id} finalized as {view.invoice.number}: {view.total_cents / 100:.2f} USD")
        await operations.auto_push(sessions=service.sessions, settings=service.settings, invoice_id=view.invoice.id)

    run_billing(action, write=True)


@app.command("finalize-due")
def finalize_due() -> None:
    """Finalize every draft past month end plus the grace period."""

    async def action(service: BillingService) -> None:
        views = await service.finalize_due_invoices()
        for view in views:
            inv = view.invoice
            print(f"invoice {inv.id} ({inv.tenant_id}, {inv.period_start:%Y-%m}) -> {inv.number}")
        print(f"{len(views)} invoices finalized")

    run_billing(action, write=True)


@app.command("push")
def push(invoice_id: InvoiceId) -> None:
    """Push a finalized invoice to Stripe (STRIPE_API_KEY)."""

    async def action(service: BillingService) -> None:
        r = await operations.push_to_stripe(sessions=service.sessions, settings=service.settings, invoice_id=invoice_id)
        print(
            f"invoice {r.invoice_id} -> Stripe {r.stripe_invoice_id} (customer {r.stripe_customer_id}): "
            f"{r.items_created} items created, {r.items_existing} already there"
        )

    run_billing(action, write=True)


@app.command("push-due")
def push_due() -> None:
    """Push every finalized invoice and credit note not yet in Stripe (catch-up)."""

    async def action(service: BillingService) -> None:
        results = await operations.push_due(sessions=service.sessions, settings=service.settings)
        for r in results:
            print(
                f"invoice {r.invoice_id} -> Stripe {r.stripe_invoice_id}: {r.items_created} items, "
                f"{r.credit_notes_created} credit notes created; amount due in Stripe {r.amount_due_cents} cents"
            )
        print(f"{len(results)} invoices pushed")

    run_billing(action, write=True)


@app.command("csv")
def lines_csv(invoice_id: InvoiceId, out: OutFile = None) -> None:
    """An invoice's lines as CSV (exact and charged amounts); default standard output."""

    async def load(service: BillingService) -> str:
        async with service.sessions() as session:
            view = await invoices.view_invoice(session=session, invoice_id=invoice_id)
        name = view.invoice.number or f"draft-{view.invoice.id}"
        return invoice_lines_csv(invoice=name, lines=view.computation.lines)

    text = run_billing(load, write=False)
    if out is None:
        print(text, end="")
        return
    out.write_text(text)
    print(f"wrote {out}")


def _render(invoice_id: int, out: Path | None, fmt: str) -> None:
    async def load(service: BillingService) -> InvoiceDocument:
        async with service.sessions() as session:
            return await operations.invoice_document(
                session=session, invoice_id=invoice_id, seller=service.settings.seller_name, settings=service.settings
            )

    document = run_billing(load, write=False)
    path = out or Path(f"{document.number or f'draft-{document.invoice_id}'}.{fmt}")
    if fmt == "pdf":
        path.write_bytes(render_pdf(document))
    else:
        path.write_text(render_html(document))
    print(f"wrote {path}")


@app.command("pdf")
def pdf(invoice_id: InvoiceId, out: OutFile = None) -> None:
    """Write an invoice as PDF (default <number or draft-ID>.pdf)."""
    _render(invoice_id, out, "pdf")


@app.command("html")
def html(invoice_id: InvoiceId, out: OutFile = None) -> None:
    """Write an invoice as HTML (default <number or draft-ID>.html)."""
    _render(invoice_id, out, "html")
