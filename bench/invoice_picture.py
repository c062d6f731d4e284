"""Write docs/images/invoice-sample.png and credit-note-sample.png: page 1 of a sample finalized invoice's
PDF and of a credit note against it (for docs/billing.md).

Run: .venv/bin/python bench/invoice_picture.py. The documents are built in memory (no database): a German
seller billing a German buyer at 19% VAT, and a $5.00 credit note; rendered by billing.render.render_pdf and
billing.credit_note_documents.render_credit_note_pdf, and rasterized with pypdfium2.
"""

from __future__ import annotations

import argparse
from datetime import UTC, date, datetime
from decimal import Decimal
from pathlib import Path

import pypdfium2

from billing.credit_note_documents import credit_note_documents, render_credit_note_pdf
from billing.invoice_lines import InvoiceLine
from billing.models import CreditNote
from billing.money import round_to_cents
from billing.profiles import Address, BillingProfile, TaxId, TaxTreatment
from billing.render import InvoiceDocument, render_pdf
from billing.settings import BillingSettings
from billing.tax import tax_lines
from billing.vat_in_eur import EurTaxLine, VatInEur, eur_cents
from kvgate import REPO_ROOT
from kvgate.usage import Category

OUT = REPO_ROOT / "docs" / "images" / "invoice-sample.png"
CREDIT_NOTE_OUT = REPO_ROOT / "docs" / "images" / "credit-note-sample.png"
USAGE = (  # model, category, tokens, USD per Mtok
    ("SmolLM2-135M-Instruct", Category.INPUT, 1_204_311, "0.10"),
    ("SmolLM2-135M-Instruct", Category.CACHE_WRITE_5M, 2_310_000, "0.125"),
    ("SmolLM2-135M-Instruct", Category.CACHE_READ, 48_113_500, "0.01"),
    ("SmolLM2-135M-Instruct", Category.OUTPUT, 903_118, "0.40"),
    ("m-large", Category.INPUT, 310_442, "3"),
    ("m-large", Category.CACHE_READ, 6_200_000, "0.3"),
    ("m-large", Category.OUTPUT, 120_977, "15"),
)


def sample() -> InvoiceDocument:
    lines = []
    for position, (model, category, tokens, price) in enumerate(USAGE, start=1):
        exact = tokens * int(Decimal(price) * 10**6)
        lines.append(InvoiceLine(position, model, category, 1, tokens, Decimal(price), exact, round_to_cents(exact)))
    subtotal = sum(line.amount_cents for line in lines)
    settings = BillingSettings(
        seller_name="kvgate GmbH",
        seller_email="billing@kvgate.example",
        seller_address_line1="Torstraße 5",
        seller_address_city="Berlin",
        seller_address_postal_code="10119",
        seller_address_country="DE",
        seller_tax_id_type="eu_vat",
        seller_tax_id_value="DE999999999",
        payment_instructions="Bank transfer to IBAN DE02 1001 0010 0123 4567 89 (BIC PBNKDEFF), "
        "quoting the invoice number.",
    )
    buyer = BillingProfile(
        legal_name="Beispiel Kaffeerösterei GmbH",
        email="buchhaltung@beispiel.example",
        address=Address(line1="Hauptstraße 1", city="München", postal_code="80331", country="DE"),
        tax_id=TaxId(type="eu_vat", value="DE123456789"),
        tax=TaxTreatment(treatment="standard", rate_percent=Decimal(19)),
        po_number="PO-2026-031",
    )
    exact_total = sum(line.exact_amount_pico for line in lines)
    taxes = tax_lines(subtotal_cents=subtotal, treatment=buyer.tax)
    # An illustrative rate, not a published one: the operator loads real ones (billing/exchange_rates.py).
    rate = Decimal("0.9234")
    vat_eur = VatInEur(
        "usd",
        rate,
        date(2026, 4, 3),
        "example rate",
        tuple(EurTaxLine(t.label, eur_cents(t.amount_cents, rate)) for t in taxes),
    )
    return InvoiceDocument(
        invoice_id=42,
        number="KVG-000042",
        status="finalized",
        tenant_id="ten_beispiel",
        tenant_name=buyer.legal_name,
        period_start=date(2026, 3, 1),
        period_end=date(2026, 4, 1),
        issued_at=datetime(2026, 4, 4, 0, 5, tzinfo=UTC),
        lines=tuple(lines),
        requests=18_342,
        total_cents=subtotal,
        uncached_cents=round_to_cents(exact_total * 3),
        seller=settings.seller_name,
        seller_profile=settings.seller_profile(),
        buyer=buyer,
        tax_lines=taxes,
        vat_eur=vat_eur,
        due_on=date(2026, 4, 18),
        payment_terms_days=settings.payment_terms_days,
        payment_instructions=settings.payment_instructions,
        exact_total_pico=exact_total,
        exact_uncached_pico=exact_total * 3,
    )


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__)
    parser.add_argument("--out", type=Path, default=OUT)
    parser.add_argument("--credit-note-out", type=Path, default=CREDIT_NOTE_OUT)
    parser.add_argument("--scale", type=float, default=1.4, help="pixels per PDF point")
    args = parser.parse_args()
    invoice = sample()
    note = CreditNote(
        id=7,
        invoice_id=invoice.invoice_id,
        number="KVG-CN-000007",
        amount_cents=500,
        reason="service credit, outage 2026-03-12",
        created_at=datetime(2026, 4, 20, 9, 30, tzinfo=UTC),
    )
    (credit_note,) = credit_note_documents(invoice, [note])
    for pdf_bytes, out in (
        (render_pdf(invoice), args.out),
        (render_credit_note_pdf(credit_note), args.credit_note_out),
    ):
        image = pypdfium2.PdfDocument(pdf_bytes)[0].render(scale=args.scale).to_pil()
        out.parent.mkdir(parents=True, exist_ok=True)
        image.save(out, optimize=True)
        print(f"wrote {out} ({image.width}x{image.height})")


if __name__ == "__main__":
    main()
