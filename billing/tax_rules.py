"""Which tax treatments a buyer may be given: the checks the operator's edits pass (tenants never set tax).

Reverse charge (Art. 196 of the VAT Directive) is for a business buyer in another EU member
state than the seller's, identified by its VAT number: a buyer outside the EU is outside EU VAT
(exempt, with a note), and one in the seller's own country is charged the seller's VAT.
"""

from __future__ import annotations

from billing.profiles import BillingProfile, BillingProfileError

# ISO 3166 codes of the EU member states (Greece's VAT numbers say EL; its address says GR).
EU_COUNTRIES = frozenset(
    {
        *("AT", "BE", "BG", "CY", "CZ", "DE", "DK", "EE", "ES", "FI", "FR", "GR", "HR", "HU"),
        *("IE", "IT", "LT", "LU", "LV", "MT", "NL", "PL", "PT", "RO", "SE", "SI", "SK"),
    }
)


def check_treatment(profile: BillingProfile, *, seller_country: str | None) -> None:
    """Raise BillingProfileError where the profile's treatment does not fit its buyer."""
    if profile.tax.treatment != "reverse_charge":
        return
    country = (profile.address.country if profile.address else "").upper()
    if country not in EU_COUNTRIES:
        raise BillingProfileError(
            "tax.treatment reverse_charge needs a buyer address in an EU member state", field="tax.treatment"
        )
    if seller_country and country == seller_country.upper():
        raise BillingProfileError(
            f"tax.treatment reverse_charge needs a buyer outside the seller's country ({country}): "
            "charge the seller's VAT (standard) instead",
            field="tax.treatment",
        )
    if profile.tax_id is None or not profile.tax_id.value.strip():
        raise BillingProfileError("tax.treatment reverse_charge needs the buyer's VAT id (tax_id)", field="tax_id")
