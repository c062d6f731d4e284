"""`kvgate prices|usage|invoices|credit-notes|billing-profile|budgets|credits|exchange-rates|spool`: billing, on

Like `kvgate tenants`, these need no running server. Commands that write migrate the database
first (creating it if need be); commands that only read (list, show, summary, export, csv, pdf)
refuse to create one. Amounts are USD decimal strings; every listing takes `--output table|json|csv`,
its JSON and CSV named as the admin API's responses. One module per resource, each with its own
`register`; `common` holds what they share.
"""

from __future__ import annotations

import typer

from billing.cli import (
    billing_profiles,
    budgets,
    credit_notes,
    credits,
    exchange_rates,
    invoices,
    prices,
    spool,
    usage,
)
from billing.stripe_sync import StripeSyncError
from kvgate.cli_errors import add_user_errors


def register(app: typer.Typer) -> None:
    # Stripe refusing a push is the data's state, not a bug: one line, exit 1.
    add_user_errors(StripeSyncError)
    for module in (prices, usage, invoices, credit_notes, billing_profiles, budgets, credits, exchange_rates, spool):
        module.register(app)
