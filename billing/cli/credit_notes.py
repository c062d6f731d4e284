"""`kvgate credit-notes create|list`: credit notes against finalized invoices."""

from __future__ import annotations

from typing import Annotated

import typer

from billing import credit_notes, operations
from billing.cli.common import TenantOption, run_billing
from billing.invoice_schemas import CreditNoteOut
from billing.money import usd_to_cents
from billing.service import BillingService
from kvgate.cli_output import Column, OutputFormat, OutputOption, emit

app = typer.Typer(help="credit notes against finalized invoices", no_args_is_help=True)
COLUMNS = ["id", "number", "invoice_id", Column("amount_usd", "amount $"), "reason", "created_at"]


def register(root: typer.Typer) -> None:
    root.add_typer(app, name="credit-notes")


@app.command("create")
def create(
    invoice_id: Annotated[int, typer.Argument(min=1)],
    amount_usd: Annotated[str, typer.Argument(help="USD, e.g. 12.50")],
    reason: Annotated[str, typer.Option(help="printed on the credit note")],
) -> None:
    """Credit part of a finalized invoice."""

    async def action(service: BillingService) -> None:
        async with service.sessions() as session:
            note = await operations.issue_credit_note(
                session=session,
                invoice_id=invoice_id,
                amount_cents=usd_to_cents(amount_usd),
                reason=reason,
                number_prefix=service.settings.invoice_number_prefix,
            )
        print(f"credit note {note.number}: {note.amount_cents / 100:.2f} USD against invoice {note.invoice_id}")
        await operations.auto_push(sessions=service.sessions, settings=service.settings, invoice_id=note.invoice_id)

    run_billing(action, write=True)


@app.command("list")
def list_notes(
    invoice: Annotated[int | None, typer.Option(help="only this invoice's")] = None,
    tenant: TenantOption = None,
    output: OutputOption = OutputFormat.table,
) -> None:
    """Credit notes (JSON and CSV: the admin API's GET /credit-notes fields)."""

    async def load(service: BillingService) -> list[CreditNoteOut]:
        async with service.sessions() as session:
            rows = await credit_notes.list_credit_notes(session=session, invoice_id=invoice, tenant_id=tenant)
        return [CreditNoteOut.of(n) for n in rows]

    emit(run_billing(load, write=False), fmt=output, columns=COLUMNS, model=CreditNoteOut)
