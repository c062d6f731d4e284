"""localstripe 1.15, plus the two things kvgate's Stripe push uses that it lacks.

1. One-off invoices: localstripe only invoices customers with a subscription
   (POST /v1/invoices answers 404 "No upcoming invoices for customer" otherwise).
   Here, with pending_invoice_items_behavior=include and no subscription, the
   invoice takes the customer's pending items, as Stripe does.
2. POST /v1/invoices/{id}/finalize, using localstripe's own _finalize().

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


def main() -> None:
    parser = argparse.ArgumentParser()
    parser.add_argument("--port", type=int, required=True)
    args = parser.parse_args()
    Invoice._api_create = classmethod(_api_create)
    url = "/v1/invoices/{id}/finalize"
    server.app.router.add_route("POST", url, server.api_extra(_api_finalize, url))
    sock = socket.socket(socket.AF_INET, socket.SOCK_STREAM)
    sock.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEADDR, 1)
    sock.bind(("127.0.0.1", args.port))
    web.run_app(server.app, sock=sock, print=None, access_log=None)


if __name__ == "__main__":
    main()
