"""Invoice documents: a finalized invoice rendered to PDF (WeasyPrint, from the page's own HTML) and read back
with pypdf, field by field, for a 19% standard, a reverse-charge and an exempt buyer; drafts carry a watermark."""

from __future__ import annotations

import io
import re
from datetime import UTC, date, datetime
from decimal import Decimal

import pytest
from pypdf import PdfReader

from billing.credit_notes import issue_credit_note
from billing.exchange_rates import set_rate
from billing.invoices import finalize_invoice, invoice_document, list_invoices, view_invoice
from billing.profiles import Address, BillingProfile, TaxId, TaxTreatment, set_profile
from billing.render import render_html, render_pdf, unit_price_text
from billing.settings import BillingSettings
from billing.settlement import settle_charge
from billing.vat_in_eur import MissingExchangeRateError
from tests.billing.conftest import make_tenant
from tests.billing.test_invoices import generated_month

APRIL_5 = datetime(2026, 4, 5, tzinfo=UTC)
RATE_DAY, EUR_PER_USD, ECB = date(2026, 4, 2), Decimal("0.9234"), "ECB euro reference rate"
SELLER = BillingSettings(
    seller_name="kvgate GmbH",
    seller_email="billing@kvgate.test",
    seller_address_line1="Torstraße 5",
    seller_address_city="Berlin",
    seller_address_postal_code="10119",
    seller_address_country="DE",
    seller_tax_id_type="eu_vat",
    seller_tax_id_value="DE999999999",
    seller_register="Amtsgericht Berlin-Charlottenburg, HRB 123456 B",
    seller_managing_directors="Ada Lovelace, Grace Hopper",
    payment_terms_days=30,
    payment_instructions="IBAN DE02 1001 0010 0123 4567 89, BIC PBNKDEFF.",
)
BUYER_ADDRESS = Address(line1="Rue de la Loi 16", city="Bruxelles", postal_code="1000", country="BE")
TREATMENTS = {
    "standard": TaxTreatment(treatment="standard", rate_percent=Decimal(19)),
    "reverse_charge": TaxTreatment(treatment="reverse_charge"),
    "exempt": TaxTreatment(treatment="exempt", note="Exempt under §4 Nr. 8 UStG."),
}


def pdf_text(pdf: bytes) -> tuple[str, int]:
    pages = PdfReader(io.BytesIO(pdf)).pages
    return "\n".join(page.extract_text() for page in pages), len(pages)


def flat(text: str) -> str:
    return re.sub(r"\s+", " ", text)


async def issued(sessions, pricebook, treatment: str, *, credit_cents: int = 0):
    tenant, (key,) = await make_tenant(sessions)
    profile = BillingProfile(
        legal_name=f"Käufer {treatment} SA",
        email="ap@kaeufer.test",
        address=BUYER_ADDRESS,
        tax_id=TaxId(type="eu_vat", value="BE0123456789"),
        tax=TREATMENTS[treatment],
        po_number="PO-2026-7",
    )
    async with sessions() as session:
        await set_profile(session=session, tenant_id=tenant, profile=profile)
        for charge in generated_month(tenant, key, seed=5)[:40]:
            if charge.model != "m-test":
                continue
            version = pricebook.price_for(charge.model, charge.started_at)
            await settle_charge(session=session, charge=charge, version=version, source="live", now=APRIL_5)
        await session.commit()
        (invoice,) = await list_invoices(session=session, tenant_id=tenant)
        draft = await invoice_document(
            session=session, view=await view_invoice(session=session, invoice_id=invoice.id), seller="kvgate"
        )
        # A German seller's VAT in USD is stated in EUR too, at the operator's rate (billing/vat_in_eur.py).
        await set_rate(session, currency="usd", on=RATE_DAY, eur_per_unit=EUR_PER_USD, source=ECB)
        view = await finalize_invoice(
            session=session,
            invoice_id=invoice.id,
            number_prefix="REN",
            now=APRIL_5,
            seller=SELLER.seller_profile(),
            payment_terms_days=SELLER.payment_terms_days,
        )
        if credit_cents:
            await issue_credit_note(
                session=session, invoice_id=invoice.id, amount_cents=credit_cents, reason="outage", number_prefix="REN"
            )
        await session.commit()
        view = await view_invoice(session=session, invoice_id=invoice.id)
        # A later edit of the profile does not change the issued invoice.
        await set_profile(session=session, tenant_id=tenant, profile=BillingProfile(legal_name="Renamed Ltd"))
        await session.commit()
        view = await view_invoice(session=session, invoice_id=invoice.id)
        document = await invoice_document(
            session=session,
            view=view,
            seller=SELLER.seller_profile(),
            payment_instructions=SELLER.payment_instructions,
            payment_terms_days=SELLER.payment_terms_days,
        )
    return view, document, draft


def usd(cents: int) -> str:
    return f"${cents // 100:,}.{cents % 100:02d}"


async def test_a_finalized_19_percent_invoice_prints_every_field(sessions, pricebook):
    view, doc, _ = await issued(sessions, pricebook, "standard", credit_cents=5)
    subtotal = view.subtotal_cents
    tax = int((Decimal(subtotal) * Decimal("0.19")).to_integral_value())  # half-even, like Python's round
    assert view.tax_cents == tax > 0 and view.total_cents == subtotal + tax
    text, pages = pdf_text(render_pdf(doc))
    one = flat(text)
    assert f"Invoice {view.invoice.number}" in one
    assert "Issue date 2026-04-05" in one and "Due date 2026-05-05" in one
    assert "March 2026 (2026-03-01 to 2026-03-31, UTC)" in one and "PO number PO-2026-7" in one
    for line in (
        "kvgate GmbH",
        "Torstraße 5",
        "10119 Berlin",
        "billing@kvgate.test",
        "VAT ID: DE999999999",
        "Register: Amtsgericht Berlin-Charlottenburg, HRB 123456 B",
        "Managing directors: Ada Lovelace, Grace Hopper",
    ):
        assert line in one, line
    for line in ("Käufer standard SA", "Rue de la Loi 16", "1000 Bruxelles", "VAT ID: BE0123456789"):
        assert line in one, line
    assert "Renamed Ltd" not in one  # the buyer as issued
    assert one.count("Register:") == 1  # the seller's particulars; a buyer's profile has none
    for line in view.computation.lines:
        row = f"{line.model} {'Input' if line.category.value == 'input' else ''}"
        assert row.strip() in one
        assert f"{line.tokens:,} {unit_price_text(line.unit_price_usd_per_mtok)} {usd(line.amount_cents)}" in one
    assert "Unit price (USD / Mtok)" in one and "3.0000" in one and "15.0000" in one
    assert f"Subtotal {usd(subtotal)}" in one
    assert f"VAT 19% on {usd(subtotal)} {usd(tax)}" in one
    assert f"Total {usd(subtotal + tax)}" in one
    eur = int((Decimal(tax) * EUR_PER_USD).to_integral_value())  # half-even to the euro cent
    assert f"VAT in EUR: VAT 19% EUR {eur // 100:,}.{eur % 100:02d}," in one
    assert f"at 1 USD = 0.9234 EUR ({ECB}, 2026-04-02; Art. 230" in one
    # The credit note issued after finalization is a document of its own (tests/billing/test_credit_notes.py):
    # the issued invoice shows neither it nor an amount due that it changes.
    assert "-$0.05" not in one and "Credit note" not in one and "Amount due" not in one
    assert "IBAN DE02 1001 0010 0123 4567 89" in one and "by 2026-05-05" in one
    assert f"caching saved {usd(doc.savings_cents)} ({doc.savings_percent}%)" in one
    assert f"Page 1 of {pages}" in one
    assert "DRAFT" not in one and "Reverse charge" not in one


@pytest.mark.parametrize(
    ("treatment", "note"),
    [("reverse_charge", "Reverse charge: VAT to be accounted for by the recipient"), ("exempt", "§4 Nr. 8 UStG")],
)
async def test_reverse_charge_and_exempt_invoices_charge_no_tax_and_say_why(sessions, pricebook, treatment, note):
    view, doc, _ = await issued(sessions, pricebook, treatment)
    assert view.tax_lines == () and view.total_cents == view.subtotal_cents
    one = flat(pdf_text(render_pdf(doc))[0])
    assert note in one
    assert "Tax $0.00" in one and "VAT 19%" not in one
    assert "VAT in EUR" not in one and doc.vat_eur is None  # no VAT charged: nothing to state in EUR
    assert f"Total {usd(view.subtotal_cents)}" in one and f"Please pay {usd(view.subtotal_cents)}" in one


async def test_a_draft_carries_a_watermark_and_no_number(sessions, pricebook):
    _, issued_doc, draft = await issued(sessions, pricebook, "standard")
    text = flat(pdf_text(render_pdf(draft))[0])
    assert "DRAFT" in text and "not issued (draft)" in text and "VAT 19%" in text
    assert 'class="watermark"' in render_html(draft) and 'class="watermark"' not in render_html(issued_doc)


def test_the_page_and_the_pdf_come_from_the_same_html():
    from billing.render import InvoiceDocument

    doc = InvoiceDocument(
        invoice_id=9,
        number=None,
        status="draft",
        tenant_id="t",
        tenant_name="Łódź Кофейня Ελλάδα",
        period_start=date(2026, 3, 1),
        period_end=date(2026, 4, 1),
        issued_at=None,
        lines=(),
        requests=0,
        total_cents=0,
        uncached_cents=0,
    )
    html = render_html(doc)
    text = pdf_text(render_pdf(doc))[0]
    assert "Łódź Кофейня Ελλάδα" in html and "Łódź Кофейня Ελλάδα" in text
    assert "Page 1 of 1" in text and "Page 1 of 1" not in html  # page numbers are the PDF's @page box


def test_unit_prices_have_four_decimals():
    assert [unit_price_text(Decimal(v)) for v in ("3", "3.75", "0.3", "0.1875")] == [
        "3.0000",
        "3.7500",
        "0.3000",
        "0.1875",
    ]
    assert unit_price_text(Decimal("0.000125")) == "0.000125"  # finer than four decimals: every digit


async def test_finalizing_vat_in_usd_needs_an_eur_rate_and_takes_the_latest_on_the_issue_date(sessions, pricebook):
    """Refused (409, naming the rate to load, nothing written) until a rate dated on or before the issue date
    is loaded; then the invoice states its VAT in EUR at that rate, and a later rate or correction never
    changes it."""
    tenant, (key,) = await make_tenant(sessions)
    april_1 = datetime(2026, 4, 1, 12, tzinfo=UTC)  # earlier than any rate the other tests load
    profile = BillingProfile(legal_name="Käufer GmbH", address=BUYER_ADDRESS, tax=TREATMENTS["standard"])
    async with sessions() as session:
        await set_profile(session=session, tenant_id=tenant, profile=profile)
        for charge in generated_month(tenant, key, seed=6)[:20]:
            if charge.model == "m-test":
                version = pricebook.price_for(charge.model, charge.started_at)
                await settle_charge(session=session, charge=charge, version=version, source="live", now=APRIL_5)
        await session.commit()
        (invoice,) = await list_invoices(session=session, tenant_id=tenant)
        invoice_id = invoice.id  # the row expires at the rollback below

        async def finalize() -> object:
            return await finalize_invoice(
                session=session, invoice_id=invoice_id, number_prefix="FX", now=april_1, seller=SELLER.seller_profile()
            )

        with pytest.raises(MissingExchangeRateError, match=r"kvgate exchange-rates set USD 2026-04-01") as refused:
            await finalize()
        assert refused.value.status == 409
        await session.rollback()
        assert (await view_invoice(session=session, invoice_id=invoice_id)).invoice.status == "draft"
        await set_rate(session, currency="usd", on=date(2026, 3, 31), eur_per_unit=Decimal("0.9"), source="ECB")
        await set_rate(session, currency="usd", on=date(2026, 4, 2), eur_per_unit=Decimal("2"), source="later")
        await finalize()
        await session.commit()
        await set_rate(session, currency="usd", on=date(2026, 3, 31), eur_per_unit=Decimal("5"), source="corrected")
        await session.commit()
        view = await view_invoice(session=session, invoice_id=invoice_id)
        doc = await invoice_document(session=session, view=view, seller=SELLER.seller_profile())
    assert doc.vat_eur is not None and (doc.vat_eur.eur_per_unit, doc.vat_eur.source) == (Decimal("0.9"), "ECB")
    tax = view.tax_cents
    assert tax > 0 and doc.vat_eur.total_eur_cents == int((Decimal(tax) * Decimal("0.9")).to_integral_value())
    assert f'data-eur-cents="{doc.vat_eur.total_eur_cents}"' in render_html(doc)
