"""/billing-profile: the tenant's billing profile (who its invoices are to, and their tax); members with the
billing role (or admins) edit who the invoices are to (name, email, address, tax id, PO number), everyone
else reads it. Tax treatment, rate and currency are the seller's decision: shown, never taken from the
form (the operator sets them with the admin API or `kvgate billing-profile set`); a form that tries is a 403.
The same validation as the admin API's PUT."""

from __future__ import annotations

from typing import Annotated

from fastapi import APIRouter, Form, Request
from pydantic import ValidationError
from starlette.responses import RedirectResponse, Response

from billing import profiles, tax_rules
from billing.api.deps import ServiceDep
from billing.errors import BillingDomainError
from billing.profile_schemas import BillingProfileBody
from gateway.api.deps import GatewayDep
from web.deps import NotAllowed, TenantCsrfViewerDep, TenantViewerDep, Viewer
from web.rendering import page

router = APIRouter()
FIELDS = (
    "legal_name",
    "email",
    "line1",
    "line2",
    "city",
    "postal_code",
    "state",
    "country",
    "tax_id_type",
    "tax_id_value",
    "po_number",
)
OPERATOR_FIELDS = ("treatment", "rate_percent", "note", "currency")
"""Fields the form does not offer: a POST that carries them is a 403."""
Text = Annotated[str, Form(max_length=500)]


async def _render(
    request: Request, viewer: Viewer, gw: GatewayDep, *, status_code: int = 200, **extra: object
) -> Response:
    async with gw.sessions() as session:
        profile = await profiles.get_profile(session=session, tenant_id=viewer.tenant_id or "")
    return page(
        request,
        "billing_profile.html",
        status_code=status_code,
        viewer=viewer,
        active="invoices",
        profile=BillingProfileBody.of(profile),
        can_edit=viewer.can("billing"),
        **extra,
    )


@router.get("/billing-profile")
async def billing_profile_page(request: Request, viewer: TenantViewerDep, gw: GatewayDep) -> Response:
    return await _render(request, viewer, gw)


def _body(form: dict[str, str], current: profiles.BillingProfile) -> BillingProfileBody:
    """The buyer's fields from the form; tax and currency as the operator set them."""
    value = {k: (v.strip() or None) for k, v in form.items()}
    address = None
    if value["line1"]:
        address = {k: value[k] for k in ("line1", "line2", "city", "postal_code", "state", "country")}
    tax_id = {"type": value["tax_id_type"], "value": value["tax_id_value"]} if value["tax_id_value"] else None
    kept = BillingProfileBody.of(current)
    return BillingProfileBody.model_validate(
        {
            "legal_name": value["legal_name"],
            "email": value["email"],
            "address": address,
            "tax_id": tax_id,
            "tax": kept.tax.model_dump(),
            "currency": kept.currency,
            "po_number": value["po_number"],
        }
    )


@router.post("/billing-profile")
async def save_billing_profile(
    request: Request,
    viewer: TenantCsrfViewerDep,
    gw: GatewayDep,
    service: ServiceDep,
    legal_name: Text = "",
    email: Text = "",
    line1: Text = "",
    line2: Text = "",
    city: Text = "",
    postal_code: Text = "",
    state: Text = "",
    country: Text = "",
    tax_id_type: Text = "",
    tax_id_value: Text = "",
    po_number: Text = "",
) -> Response:
    if not viewer.can("billing"):
        raise NotAllowed("only members with the billing or admin role edit the billing profile")
    form = await request.form()
    if any(name in form for name in OPERATOR_FIELDS):
        raise NotAllowed("tax treatment, tax rate and currency are set by the seller, not on the dashboard")
    given = dict(
        zip(
            FIELDS,
            (
                legal_name,
                email,
                line1,
                line2,
                city,
                postal_code,
                state,
                country,
                tax_id_type,
                tax_id_value,
                po_number,
            ),
            strict=True,
        )
    )
    tenant_id = viewer.tenant_id or ""
    async with gw.sessions() as session:
        current = await profiles.get_profile(session=session, tenant_id=tenant_id)
    try:
        profile = _body(given, current).to_profile()
        # A move of the address can end what the treatment needs (reverse charge: an EU buyer abroad).
        tax_rules.check_treatment(profile, seller_country=service.settings.seller_address_country)
    except ValidationError as exc:
        first = exc.errors()[0]
        error = f"{'.'.join(str(p) for p in first['loc'])}: {first['msg']}"
        return await _render(request, viewer, gw, status_code=400, error=error)
    except BillingDomainError as exc:
        return await _render(request, viewer, gw, status_code=400, error=exc.message)
    async with gw.sessions() as session:
        await profiles.set_profile(session=session, tenant_id=tenant_id, profile=profile)
        await session.commit()
    return RedirectResponse("/billing-profile", status_code=303)
