"""Billing profiles: who an invoice is to (a tenant's profile, in the database) and from (the seller, from settings).

A profile is what an invoice's buyer and seller blocks print and what decides its tax: `standard` at a
rate, `reverse_charge` (the buyer accounts for VAT; no tax line, a legal note instead), or `exempt`
(a note saying why). Finalizing an invoice copies both profiles into it, so a later edit never
changes an issued invoice.
"""

from __future__ import annotations

import json
from dataclasses import asdict, dataclass
from decimal import Decimal
from typing import Any, Literal

from sqlalchemy.ext.asyncio import AsyncSession

from billing.errors import BillingDomainError
from billing.models import BillingProfileRow
from kvgate.db import utcnow
from kvgate.errors import NotFoundError
from kvgate.tenancy import Tenant

TaxTreatmentName = Literal["standard", "reverse_charge", "exempt"]
TREATMENTS: tuple[TaxTreatmentName, ...] = ("standard", "reverse_charge", "exempt")
REVERSE_CHARGE_NOTE = (
    "Reverse charge: VAT to be accounted for by the recipient (Art. 196 Council Directive 2006/112/EC)."
)


class BillingProfileError(BillingDomainError, ValueError):
    pass


class UnknownTenantError(NotFoundError, BillingProfileError):
    pass


@dataclass(frozen=True)
class Address:
    line1: str
    city: str
    postal_code: str
    country: str
    line2: str | None = None
    state: str | None = None

    def lines(self) -> list[str]:
        """The address as printed: street lines, then postal code and city (and state), then country."""
        city = " ".join(p for p in (self.postal_code, self.city) if p)
        if self.state:
            city = f"{city}, {self.state}"
        return [p for p in (self.line1, self.line2, city, self.country) if p]


@dataclass(frozen=True)
class TaxId:
    type: str
    value: str


@dataclass(frozen=True)
class TaxTreatment:
    treatment: TaxTreatmentName = "exempt"
    rate_percent: Decimal | None = None
    note: str | None = None

    def __post_init__(self) -> None:
        if self.rate_percent is not None and not isinstance(self.rate_percent, Decimal):
            object.__setattr__(self, "rate_percent", Decimal(str(self.rate_percent)))  # 19 -> Decimal("19")
        if self.treatment not in TREATMENTS:
            raise BillingProfileError(f"tax.treatment must be one of {', '.join(TREATMENTS)}", field="tax.treatment")
        if self.treatment == "standard":
            if self.rate_percent is None or not Decimal(0) <= self.rate_percent <= Decimal(100):
                raise BillingProfileError(
                    "tax.rate_percent (0 to 100) is required for standard tax treatment", field="tax.rate_percent"
                )
        elif self.rate_percent is not None:
            raise BillingProfileError(
                f"tax.rate_percent applies only to standard treatment, not {self.treatment}", field="tax.rate_percent"
            )
        if self.treatment == "exempt" and not (self.note or "").strip():
            raise BillingProfileError(
                "tax.note (why no tax is charged) is required for exempt treatment", field="tax.note"
            )

    @property
    def legal_note(self) -> str | None:
        """What the invoice must say when it charges no tax."""
        if self.treatment == "reverse_charge":
            return self.note or REVERSE_CHARGE_NOTE
        if self.treatment == "exempt":
            return self.note
        return None


@dataclass(frozen=True)
class BillingProfile:
    legal_name: str
    email: str | None = None
    address: Address | None = None
    tax_id: TaxId | None = None
    tax: TaxTreatment = TaxTreatment(treatment="exempt", note="No tax charged.")
    currency: str = "usd"
    po_number: str | None = None
    # A company's particulars (§ 35a GmbHG, § 80 AktG): its register entry and managing directors.
    # Set for the seller (from settings); a buyer's profile leaves them empty.
    register: str | None = None
    managing_directors: str | None = None

    def to_json(self) -> str:
        return json.dumps(asdict(self), default=str, sort_keys=True)

    @classmethod
    def from_json(cls, text: str) -> BillingProfile:
        return cls.from_dict(json.loads(text))

    @classmethod
    def from_dict(cls, data: dict[str, Any]) -> BillingProfile:
        tax = data.get("tax") or {}
        rate = tax.get("rate_percent")
        return cls(
            legal_name=data["legal_name"],
            email=data.get("email"),
            address=Address(**data["address"]) if data.get("address") else None,
            tax_id=TaxId(**data["tax_id"]) if data.get("tax_id") else None,
            tax=TaxTreatment(
                treatment=tax.get("treatment", "exempt"),
                rate_percent=None if rate is None else Decimal(str(rate)),
                note=tax.get("note"),
            ),
            currency=data.get("currency") or "usd",
            po_number=data.get("po_number"),
            register=data.get("register"),
            managing_directors=data.get("managing_directors"),
        )


def default_profile(tenant: Tenant) -> BillingProfile:
    """A tenant without a profile is billed under its name, with no tax until an operator says otherwise."""
    return BillingProfile(legal_name=tenant.name, tax=TaxTreatment(treatment="exempt", note="Tax treatment not set."))


def _from_row(row: BillingProfileRow) -> BillingProfile:
    address = (
        Address(
            line1=row.address_line1,
            line2=row.address_line2,
            city=row.address_city or "",
            postal_code=row.address_postal_code or "",
            state=row.address_state,
            country=row.address_country or "",
        )
        if row.address_line1
        else None
    )
    return BillingProfile(
        legal_name=row.legal_name,
        email=row.email,
        address=address,
        tax_id=TaxId(type=row.tax_id_type, value=row.tax_id_value) if row.tax_id_type and row.tax_id_value else None,
        tax=TaxTreatment(
            treatment=row.tax_treatment,  # type: ignore[arg-type]
            rate_percent=row.tax_rate_percent,
            note=row.tax_note,
        ),
        currency=row.currency,
        po_number=row.po_number,
    )


async def _tenant(session: AsyncSession, tenant_id: str) -> Tenant:
    tenant = await session.get(Tenant, tenant_id)
    if tenant is None:
        raise UnknownTenantError(f"no tenant {tenant_id}")
    return tenant


async def get_profile(*, session: AsyncSession, tenant_id: str) -> BillingProfile:
    """The tenant's profile, or its default (name only, no tax) if none was set."""
    tenant = await _tenant(session, tenant_id)
    row = await session.get(BillingProfileRow, tenant_id)
    return default_profile(tenant) if row is None else _from_row(row)


async def has_profile(*, session: AsyncSession, tenant_id: str) -> bool:
    return await session.get(BillingProfileRow, tenant_id) is not None


async def set_profile(*, session: AsyncSession, tenant_id: str, profile: BillingProfile) -> BillingProfile:
    """Replace the tenant's profile (a PUT: every field as given). Caller commits."""
    await _tenant(session, tenant_id)
    address = profile.address
    values: dict[str, Any] = {
        "legal_name": profile.legal_name,
        "email": profile.email,
        "address_line1": address.line1 if address else None,
        "address_line2": address.line2 if address else None,
        "address_city": address.city if address else None,
        "address_postal_code": address.postal_code if address else None,
        "address_state": address.state if address else None,
        "address_country": address.country if address else None,
        "tax_id_type": profile.tax_id.type if profile.tax_id else None,
        "tax_id_value": profile.tax_id.value if profile.tax_id else None,
        "currency": profile.currency,
        "po_number": profile.po_number,
        "tax_treatment": profile.tax.treatment,
        "tax_rate_percent": profile.tax.rate_percent,
        "tax_note": profile.tax.note,
        "updated_at": utcnow(),
    }
    row = await session.get(BillingProfileRow, tenant_id)
    if row is None:
        session.add(BillingProfileRow(tenant_id=tenant_id, **values))
    else:
        for key, value in values.items():
            setattr(row, key, value)
    await session.flush()
    return profile
