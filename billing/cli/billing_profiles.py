"""`kvgate billing-profile show|set TENANT`: a tenant's buyer block and tax treatment on its invoices."""

from __future__ import annotations

import argparse
from typing import Any

from pydantic import ValidationError

from billing import operations, profiles
from billing.cli.common import command, group, print_json
from billing.profile_schemas import BillingProfileBody
from billing.service import BillingService


def register(subparsers: Any) -> None:
    grp = group(subparsers, "billing-profile", "tenants' billing profiles (invoice buyer block, tax)")
    sub = grp.add_parser("show", help="a tenant's billing profile, as JSON")
    sub.add_argument("tenant_id")
    sub.set_defaults(handler=command(_show, seed=False))
    sub = grp.add_parser("set", help="replace a tenant's billing profile (every field as given)")
    sub.add_argument("tenant_id")
    sub.add_argument("--legal-name", required=True)
    sub.add_argument("--email")
    for flag in ("line1", "line2", "city", "postal-code", "state"):
        sub.add_argument(f"--{flag}", help=f"address {flag}")
    sub.add_argument("--country", help="ISO 3166-1 alpha-2 code, e.g. DE")
    sub.add_argument("--tax-id-type", help="e.g. eu_vat")
    sub.add_argument("--tax-id-value", help="e.g. DE123456789")
    sub.add_argument("--tax", choices=profiles.TREATMENTS, required=True, help="tax treatment")
    sub.add_argument("--tax-rate", help="percent, for --tax standard (e.g. 19)")
    sub.add_argument("--tax-note", help="why no tax is charged (required for --tax exempt)")
    sub.add_argument("--currency", default="usd")
    sub.add_argument("--po-number")
    sub.set_defaults(handler=command(_set, seed=False))


async def _show(service: BillingService, args: argparse.Namespace) -> None:
    async with service.sessions() as session:
        print_json(BillingProfileBody.of(await profiles.get_profile(session=session, tenant_id=args.tenant_id)))


def body_from_args(args: argparse.Namespace) -> BillingProfileBody:
    """The same body the admin API takes, so the CLI validates alike; bad input is a ValueError (exit 1)."""
    address = None
    if args.line1:
        address = {
            "line1": args.line1,
            "line2": args.line2,
            "city": args.city,
            "postal_code": args.postal_code,
            "state": args.state,
            "country": args.country,
        }
    tax_id = {"type": args.tax_id_type, "value": args.tax_id_value} if args.tax_id_value else None
    try:
        return BillingProfileBody.model_validate(
            {
                "legal_name": args.legal_name,
                "email": args.email,
                "address": address,
                "tax_id": tax_id,
                "tax": {"treatment": args.tax, "rate_percent": args.tax_rate, "note": args.tax_note},
                "currency": args.currency,
                "po_number": args.po_number,
            }
        )
    except ValidationError as exc:
        first = exc.errors()[0]
        raise ValueError(f"{'.'.join(str(p) for p in first['loc'])}: {first['msg']}") from exc


async def _set(service: BillingService, args: argparse.Namespace) -> None:
    body = body_from_args(args)
    async with service.sessions() as session:
        profile = await operations.set_billing_profile(
            session=session, tenant_id=args.tenant_id, profile=body.to_profile()
        )
    print_json(BillingProfileBody.of(profile))
