"""Billing settings, read from KVGATE_* environment variables (STRIPE_API_KEY as Stripe names it)."""

from __future__ import annotations

from functools import lru_cache
from pathlib import Path

from pydantic import AliasChoices, Field, SecretStr
from pydantic_settings import BaseSettings, SettingsConfigDict

from billing.prices import DEFAULT_PRICE_FILE
from billing.profiles import Address, BillingProfile, TaxId
from kvgate.settings import ENV_FILE


class BillingSettings(BaseSettings):
    model_config = SettingsConfigDict(env_prefix="KVGATE_", env_file=ENV_FILE, extra="ignore", populate_by_name=True)

    prices_file: Path = Field(DEFAULT_PRICE_FILE, description="TOML price catalog seeded into the database.")
    spool_path: Path = Field(
        Path(".kvgate/usage-spool.jsonl"),
        description="Local fsynced file for usage the database could not take; replayed when it returns.",
    )
    spool_replay_interval_s: float = Field(5.0, gt=0, description="How often to retry replaying the spool.")
    price_refresh_interval_s: float = Field(60.0, gt=0, description="How often to reload the price catalog.")
    invoice_grace_days: int = Field(
        3, ge=0, description="Days after a month ends before its invoices are finalized (late records)."
    )
    auto_finalize_invoices: bool = Field(
        True, description="Finalize drafts in the background once their month and grace period are over."
    )
    invoice_number_prefix: str = Field(
        "KVG",
        min_length=1,
        max_length=12,
        pattern=r"^[A-Z0-9]+$",
        description="Finalized invoices are PREFIX-000001...",
    )
    seller_name: str = Field("kvgate", description="Who the invoices are from: the seller's legal name.")
    seller_email: str | None = Field(None, description="The seller's billing contact, printed on invoices.")
    seller_address_line1: str | None = Field(None, description="Seller address: street and number.")
    seller_address_line2: str | None = Field(None, description="Seller address: second line.")
    seller_address_city: str | None = Field(None, description="Seller address: city.")
    seller_address_postal_code: str | None = Field(None, description="Seller address: postal code.")
    seller_address_state: str | None = Field(None, description="Seller address: state or region.")
    seller_address_country: str | None = Field(
        None, pattern=r"^[A-Z]{2}$", description="Seller address: ISO 3166 country code, e.g. DE."
    )
    seller_tax_id_type: str | None = Field(None, description="Seller tax ID type in Stripe's terms, e.g. eu_vat.")
    seller_tax_id_value: str | None = Field(None, description="Seller tax ID (VAT number), e.g. DE123456789.")
    seller_register: str | None = Field(
        None,
        max_length=200,
        description="Seller's register entry, printed on invoices, e.g. Amtsgericht Berlin HRB 12345.",
    )
    seller_managing_directors: str | None = Field(
        None, max_length=300, description="Seller's managing directors, printed on invoices (a company must name them)."
    )
    payment_terms_days: int = Field(14, ge=0, le=365, description="Invoices are due this many days after issue.")
    payment_instructions: str = Field(
        "Pay by card or bank transfer through the payment link sent with this invoice, quoting the invoice number.",
        max_length=1000,
        description="Printed under the totals of every invoice (bank details, payment link).",
    )
    reservation_timeout_s: float = Field(
        3600.0, gt=0, description="A reservation not settled by then (a crashed request) is released."
    )
    budget_fail_open: bool = Field(
        True,
        description="While the database cannot be reached, admit requests within each tenant's last-known "
        "budget, counting their spend in memory (usage is spooled); false: refuse them (529/503, retry-after).",
    )
    metrics_tenant_label: bool = Field(
        True,
        description="Label kvgate_spend_usd_total and kvgate_cache_savings_usd_total on /metrics by tenant; "
        "false: one series each, for deployments with many tenants.",
    )
    stripe_api_key: SecretStr | None = Field(
        None,
        validation_alias=AliasChoices("STRIPE_API_KEY", "KVGATE_STRIPE_API_KEY"),
        description="Set to sync customers and finalized invoices to Stripe.",
    )
    stripe_api_base: str | None = Field(None, description="Override Stripe's API address (localstripe in tests).")
    stripe_webhook_secret: SecretStr | None = Field(None, description="Endpoint secret for /webhooks/stripe.")
    stripe_currency: str = Field("usd", pattern=r"^[a-z]{3}$", description="Currency of Stripe invoice items.")
    stripe_auto_push: bool = Field(
        False, description="Push each invoice to Stripe as it is finalized, and credit notes as they are issued."
    )

    def seller_profile(self) -> BillingProfile:
        """The seller's block on every invoice (tax treatment is the buyer's, so the seller's is unused)."""
        address = (
            Address(
                line1=self.seller_address_line1,
                line2=self.seller_address_line2,
                city=self.seller_address_city or "",
                postal_code=self.seller_address_postal_code or "",
                state=self.seller_address_state,
                country=self.seller_address_country or "",
            )
            if self.seller_address_line1
            else None
        )
        tax_id = (
            TaxId(type=self.seller_tax_id_type or "tax_id", value=self.seller_tax_id_value)
            if self.seller_tax_id_value
            else None
        )
        return BillingProfile(
            legal_name=self.seller_name,
            email=self.seller_email,
            address=address,
            tax_id=tax_id,
            register=self.seller_register,
            managing_directors=self.seller_managing_directors,
        )


@lru_cache
def get_billing_settings() -> BillingSettings:
    return BillingSettings()
