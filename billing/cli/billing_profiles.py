"""`kvgate billing-profile show|set TENANT`: a tenant's buyer block and tax treatment on its invoices."""

from __future__ import annotations

from enum import StrEnum
from typing import Annotated, Any

import typer
from pydantic import ValidationError

from billing import operations, profiles
from billing.cli.common import run_billing
from billing.profile_schemas import BillingProfileBody
from billing.service import BillingService
from kvgate.cli_output import Column, OutputFormat, OutputOption, emit_one

app = typer.Typer(help="tenants' billing profiles (invoice buyer block, tax)", no_args_is_help=True)
Treatment = StrEnum("Treatment", {t: t for t in profiles.TREATMENTS})  # type: ignore[misc]


def _address(body: BillingProfileBody) -> str:
    a = body.address
    return "" if a is None else ", ".join(v for v in (a.line1, a.line2, a.postal_code, a.city, a.state, a.country) if v)


def _tax(body: BillingProfileBody) -> str:
    tax = body.tax
    rate = f" {tax.rate_percent}%" if tax.rate_percent is not None else ""
    return f"{tax.treatment}{rate}" + (f" ({tax.note})" if tax.note else "")


# The table flattens the nested blocks; JSON and CSV are the admin API's body.
SHOW_FIELDS = [
    "legal_name",
    "email",
    Column("address", value=_address),
    Column("tax_id", value=lambda b: "" if b.tax_id is None else f"{b.tax_id.type} {b.tax_id.value}"),
    Column("tax", value=_tax),
    "currency",
    "po_number",
]


def register(root: typer.Typer) -> None:
    root.add_typer(app, name="billing-profile")


@app.command("show")
def show(tenant_id: str, output: OutputOption = OutputFormat.table) -> None:
    """A tenant's billing profile (JSON and CSV: the admin API's GET /tenants/{id}/billing-profile)."""

    async def load(service: BillingService) -> BillingProfileBody:
        async with service.sessions() as session:
            return BillingProfileBody.of(await profiles.get_profile(session=session, tenant_id=tenant_id))

    emit_one(run_billing(load, write=False), fmt=output, columns=SHOW_FIELDS)


Text = Annotated[str | None, typer.Option()]


@app.command("set")
def set_profile(
    tenant_id: str,
    legal_name: Annotated[str, typer.Option(help="the buyer's legal name")],
    tax: Annotated[Treatment, typer.Option(help="tax treatment")],
    email: Text = None,
    line1: Annotated[str | None, typer.Option(help="address line 1")] = None,
    line2: Annotated[str | None, typer.Option(help="address line 2")] = None,
    city: Text = None,
    postal_code: Text = None,
    state: Text = None,
    country: Annotated[str | None, typer.Option(help="ISO 3166-1 alpha-2 code, e.g. DE")] = None,
    tax_id_type: Annotated[str | None, typer.Option(help="e.g. eu_vat")] = None,
    tax_id_value: Annotated[str | None, typer.Option(help="e.g. DE123456789")] = None,
    tax_rate: Annotated[str | None, typer.Option(help="percent, for --tax standard (e.g. 19)")] = None,
    tax_note: Annotated[str | None, typer.Option(help="why no tax is charged (required for --tax exempt)")] = None,
    currency: str = "usd",
    po_number: Text = None,
    output: OutputOption = OutputFormat.table,
) -> None:
    """Replace a tenant's billing profile (every field as given)."""
    address = None
    if line1:
        address = {
            "line1": line1,
            "line2": line2,
            "city": city,
            "postal_code": postal_code,
            "state": state,
            "country": country,
        }
    body = body_of(
        {
            "legal_name": legal_name,
            "email": email,
            "address": address,
            "tax_id": {"type": tax_id_type, "value": tax_id_value} if tax_id_value else None,
            "tax": {"treatment": tax.value, "rate_percent": tax_rate, "note": tax_note},
            "currency": currency,
            "po_number": po_number,
        }
    )

    async def action(service: BillingService) -> BillingProfileBody:
        async with service.sessions() as session:
            profile = await operations.set_billing_profile(
                session=session,
                tenant_id=tenant_id,
                profile=body.to_profile(),
                seller_country=service.settings.seller_address_country,
            )
        return BillingProfileBody.of(profile)

    emit_one(run_billing(action, write=True, seed=False), fmt=output, columns=SHOW_FIELDS)


def body_of(values: dict[str, Any]) -> BillingProfileBody:
    """The same body the admin API takes, so the CLI validates alike; bad input is a ValueError (exit 1)."""
    try:
        return BillingProfileBody.model_validate(values)
    except ValidationError as exc:
        first = exc.errors()[0]
        raise ValueError(f"{'.'.join(str(p) for p in first['loc'])}: {first['msg']}") from exc
