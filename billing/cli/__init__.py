"""`kvgate prices|usage|invoices|credit-notes|billing-profile|budgets|credits|spool`: billing on the database.

Like `kvgate tenants`, these migrate the database first and need no running server.
Amounts are USD decimal strings; lists print a table, or JSON with --json.
One module per resource, each with its own `register`; `common` holds what they share.
"""

from __future__ import annotations

from typing import Any

from billing.cli import billing_profiles, budgets, credit_notes, credits, invoices, prices, spool, usage


def register(subparsers: Any) -> None:
    for module in (prices, usage, invoices, credit_notes, billing_profiles, budgets, credits, spool):
        module.register(subparsers)
