"""`kvgate credit-notes create|list`: credit notes against finalized invoices."""

from __future__ import annotations

import argparse
from typing import Any

from billing import credit_notes, operations
from billing.cli.common import command, group, json_flag, print_json, table
from billing.invoice_schemas import CreditNoteOut
from billing.money import usd_to_cents
from billing.service import BillingService


def register(subparsers: Any) -> None:
    notes = group(subparsers, "credit-notes", "credit notes against finalized invoices")
    sub = notes.add_parser("create", help="credit part of a finalized invoice")
    sub.add_argument("invoice_id", type=int)
    sub.add_argument("amount_usd")
    sub.add_argument("--reason", required=True)
    sub.set_defaults(handler=command(_create))
    sub = notes.add_parser("list", help="credit notes")
    sub.add_argument("--invoice", type=int)
    sub.add_argument("--tenant")
    json_flag(sub).set_defaults(handler=command(_list))


async def _create(service: BillingService, args: argparse.Namespace) -> None:
    async with service.sessions() as session:
        note = await operations.issue_credit_note(
            session=session,
            invoice_id=args.invoice_id,
            amount_cents=usd_to_cents(args.amount_usd),
            reason=args.reason,
            number_prefix=service.settings.invoice_number_prefix,
        )
    print(f"credit note {note.number}: {note.amount_cents / 100:.2f} USD against invoice {note.invoice_id}")
    await operations.auto_push(sessions=service.sessions, settings=service.settings, invoice_id=note.invoice_id)


async def _list(service: BillingService, args: argparse.Namespace) -> None:
    async with service.sessions() as session:
        rows = await credit_notes.list_credit_notes(session=session, invoice_id=args.invoice, tenant_id=args.tenant)
    notes = [CreditNoteOut.of(n) for n in rows]
    if args.json:
        print_json(notes)
        return
    table([n.model_dump() for n in notes], ["number", "invoice_id", "amount_usd", "reason", "created_at"])
