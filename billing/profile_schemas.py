"""The billing profile's wire shape: the same body for PUT and GET, shared by the API, the CLI and the dashboard."""

from __future__ import annotations

from decimal import Decimal
from typing import Annotated, Literal

from pydantic import Field, PlainSerializer

from billing.profiles import Address, BillingProfile, TaxId, TaxTreatment
from billing.schemas import StrictBody

# A tax rate goes out as the JSON number it came in as (19, 7.7), from an exact Decimal.
RatePercent = Annotated[
    Decimal,
    Field(ge=0, le=100, max_digits=7, decimal_places=4),
    PlainSerializer(lambda d: int(d) if d == d.to_integral_value() else float(d), when_used="json"),
]
ShortText = Annotated[str, Field(min_length=1, max_length=200)]


class AddressBody(StrictBody):
    line1: ShortText
    line2: Annotated[str, Field(max_length=200)] | None = None
    city: Annotated[str, Field(min_length=1, max_length=100)]
    postal_code: Annotated[str, Field(min_length=1, max_length=20)]
    state: Annotated[str, Field(max_length=100)] | None = None
    country: Annotated[str, Field(pattern=r"^[A-Z]{2}$", description="ISO 3166-1 alpha-2, e.g. DE")]


class TaxIdBody(StrictBody):
    type: Annotated[str, Field(pattern=r"^[a-z][a-z_]{1,31}$", description="Stripe's tax ID type, e.g. eu_vat")]
    value: Annotated[str, Field(min_length=1, max_length=64)]


class TaxBody(StrictBody):
    treatment: Literal["standard", "reverse_charge", "exempt"]
    rate_percent: RatePercent | None = None
    note: Annotated[str, Field(max_length=500)] | None = None


class BillingProfileBody(StrictBody):
    """PUT and GET /admin/v1/tenants/{id}/billing-profile: the same shape both ways."""

    legal_name: ShortText
    email: Annotated[str, Field(pattern=r"^[^@\s]+@[^@\s]+\.[^@\s]+$", max_length=320)] | None = None
    address: AddressBody | None = None
    tax_id: TaxIdBody | None = None
    tax: TaxBody
    currency: Annotated[str, Field(pattern=r"^[a-z]{3}$")] = "usd"
    po_number: Annotated[str, Field(max_length=64)] | None = None

    def to_profile(self) -> BillingProfile:
        """The domain profile; an inconsistent tax block (standard without a rate) is a 400 naming it."""
        return BillingProfile(
            legal_name=self.legal_name,
            email=self.email,
            address=Address(**self.address.model_dump()) if self.address else None,
            tax_id=TaxId(**self.tax_id.model_dump()) if self.tax_id else None,
            tax=TaxTreatment(**self.tax.model_dump()),
            currency=self.currency,
            po_number=self.po_number,
        )

    @classmethod
    def of(cls, profile: BillingProfile) -> BillingProfileBody:
        return cls.model_validate(
            {
                "legal_name": profile.legal_name,
                "email": profile.email,
                "address": None if profile.address is None else profile.address.__dict__,
                "tax_id": None if profile.tax_id is None else profile.tax_id.__dict__,
                "tax": profile.tax.__dict__,
                "currency": profile.currency,
                "po_number": profile.po_number,
            }
        )
