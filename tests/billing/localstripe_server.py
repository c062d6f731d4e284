"""localstripe 1.15, plus the three things kvgate's Stripe push uses that it lacks.

1. One-off invoices: localstripe only invoices customers with a subscription
   (POST /v1/invoices answers 404 "No upcoming invoices for customer" otherwise).
   Here, with pending_invoice_items_behavior=include and no subscription, the
   invoice takes the customer's pending items, as Stripe does.
2. POST /v1/invoices/{id}/finalize, using localstripe's own _finalize().
3. Credit notes (POST/GET /v1/credit_notes) as Stripe documents them for an open invoice: a
   pre-payment credit note of `amount` lowers the invoice's `amount_due` (and is refused beyond it);
   the invoice reports the sum as `pre_payment_credit_notes_amount`.

Run: python -m tests.billing.localstripe_server --port N (always from scratch).
Everything else is localstripe unchanged; docs/billing.md lists what it still cannot test.
"""

from __future__ import annotations

import argparse
import socket

from aiohttp import web
from localstripe import resources, server
from localstripe.errors import UserError

Invoice = resources.Invoice
_original_create = Invoice._api_create.__func__


def _api_create(
    cls,
    customer=None,
    subscription=None,
    tax_percent=None,
    default_tax_rates=None,  # type: ignore[no-untyped-def]
    description=None,
    metadata=None,
    pending_invoice_items_behavior=None,
):
    if subscription is None and pending_invoice_items_behavior == "include":
        if not isinstance(customer, str) or not customer.startswith("cus_"):
            raise UserError(400, "Bad request")
        return cls(customer=customer, description=description, metadata=metadata)
    return _original_create(
        cls,
        customer=customer,
        subscription=subscription,
        tax_percent=tax_percent,
        default_tax_rates=default_tax_rates,
        description=description,
        metadata=metadata,
        pending_invoice_items_behavior=pending_invoice_items_behavior,
    )


def _api_finalize(id, **kwargs):  # type: ignore[no-untyped-def]
    invoice = Invoice._api_retrieve(id)
    if invoice.status != "draft":
        raise UserError(400, "This invoice is already finalized")
    invoice._finalize()
    return invoice


class CreditNote(resources.StripeObject):
    object = "credit_note"
    _id_prefix = "cn_"

    def __init__(self, invoice=None, amount=None, memo=None, metadata=None, reason=None, **kwargs):  # type: ignore[no-untyped-def]
        if kwargs:
            raise UserError(400, "Unexpected " + ", ".join(kwargs.keys()))
        amount = resources.try_convert_to_int(amount)
        if not (isinstance(invoice, str) and invoice.startswith("in_") and isinstance(amount, int) and amount > 0):
            raise UserError(400, "Bad request")
        target = Invoice._api_retrieve(invoice)
        if target.status != "open":
            raise UserError(400, f"credit notes need an open invoice; this one is {target.status}")
        if amount > target.amount_due:
            raise UserError(400, "The credit note amount exceeds the invoice's amount due")
        super().__init__()
        self.invoice = invoice
        self.customer = target.customer
        self.currency = target.currency
        self.amount = amount
        self.memo = memo
        self.reason = reason
        self.metadata = metadata or {}
        self.status = "issued"
        self.type = "pre_payment"

    @classmethod
    def _api_list_all(cls, url, invoice=None, limit=None, starting_after=None):  # type: ignore[no-untyped-def]
        listing = resources.List(url, limit=limit, starting_after=starting_after)
        listing._list = [note for note in _credit_notes() if invoice is None or note.invoice == invoice]
        return listing


def _credit_notes() -> list[CreditNote]:
    return [obj for key, obj in resources.store.items() if key.startswith("credit_note:")]


def _credited(invoice) -> int:  # type: ignore[no-untyped-def]
    return sum(note.amount for note in _credit_notes() if note.invoice == invoice.id)


def main() -> None:
    parser = argparse.ArgumentParser()
    parser.add_argument("--port", type=int, required=True)
    args = parser.parse_args()
    Invoice._api_create = classmethod(_api_create)
    url = "/v1/invoices/{id}/finalize"
    server.app.router.add_route("POST", url, server.api_extra(_api_finalize, url))
    Invoice.pre_payment_credit_notes_amount = property(_credited)
    Invoice.amount_due = property(lambda invoice: max(0, invoice.total - _credited(invoice)))
    notes = "/v1/credit_notes"
    server.app.router.add_route("POST", notes, server.api_create(CreditNote, notes))
    server.app.router.add_route("GET", notes, server.api_list_all(CreditNote, notes))
    server.app.router.add_route("GET", notes + "/{id}", server.api_retrieve(CreditNote, notes + "/{id}"))
    sock = socket.socket(socket.AF_INET, socket.SOCK_STREAM)
    sock.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEADDR, 1)
    sock.bind(("127.0.0.1", args.port))
    web.run_app(server.app, sock=sock, print=None, access_log=None)


if __name__ == "__main__":
    main()
