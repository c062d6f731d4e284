"""An invoice as a person reads it: one HTML template, served as the page and printed to PDF by WeasyPrint.

There is one layout. `render_html` fills billing/templates/invoice.html from an `InvoiceDocument`;
`render_pdf` hands that same HTML to WeasyPrint, whose paged-media CSS adds page numbers (and the
draft watermark repeats on every page). WeasyPrint needs Pango from the system (Debian:
libpango-1.0-0 libpangoft2-1.0-0, which `make install` adds when missing and it may).
"""

from __future__ import annotations

from dataclasses import dataclass
from datetime import date, datetime, timedelta
from decimal import Decimal
from functools import cache
from pathlib import Path

import jinja2

from billing.errors import NotConfiguredError
from billing.invoice_lines import CacheSavings, InvoiceLine
from billing.money import PICO_PER_CENT, format_usd, format_usd_exact
from billing.profiles import BillingProfile
from billing.tax import TaxLine
from billing.vat_in_eur import VatInEur
from kvgate.usage import CATEGORY_LABELS

TEMPLATES = Path(__file__).parent / "templates"
UNIT_PRICE_DECIMALS = 4  # catalog prices have at most four decimals of USD per Mtok
_TAX_ID_LABELS = {"eu_vat": "VAT ID", "gb_vat": "VAT ID", "ch_vat": "VAT ID", "de_stn": "Tax number"}


def party_lines(profile: BillingProfile) -> list[str]:
    """A buyer or seller block: legal name, address, email, tax ID."""
    lines = [profile.legal_name]
    if profile.address is not None:
        lines += profile.address.lines()
    if profile.email:
        lines.append(profile.email)
    if profile.tax_id is not None:
        label = _TAX_ID_LABELS.get(profile.tax_id.type, f"Tax ID ({profile.tax_id.type})")
        lines.append(f"{label}: {profile.tax_id.value}")
    if profile.register:
        lines.append(f"Register: {profile.register}")
    if profile.managing_directors:
        lines.append(f"Managing directors: {profile.managing_directors}")
    return lines


@dataclass(frozen=True)
class InvoiceDocument(CacheSavings):
    """Everything the invoice shows. `total_cents` is the sum of the rounded lines (the subtotal, before tax),
    kept under that name for the callers that read it; `invoice_total_cents` adds the tax."""

    invoice_id: int
    number: str | None
    status: str
    tenant_id: str
    tenant_name: str
    period_start: date
    period_end: date
    issued_at: datetime | None
    lines: tuple[InvoiceLine, ...]
    requests: int
    total_cents: int
    uncached_cents: int
    seller: str = "kvgate"
    seller_profile: BillingProfile | None = None
    buyer: BillingProfile | None = None
    tax_lines: tuple[TaxLine, ...] = ()
    due_on: date | None = None
    payment_terms_days: int = 14
    payment_instructions: str = ""
    exact_total_pico: int | None = None
    exact_uncached_pico: int | None = None
    vat_eur: VatInEur | None = None  # the VAT also in EUR, as fixed at finalization (billing/vat_in_eur.py)

    @property
    def title(self) -> str:
        return f"Invoice {self.number}" if self.number else f"Draft invoice #{self.invoice_id}"

    @property
    def is_draft(self) -> bool:
        return self.status == "draft"

    @property
    def subtotal_cents(self) -> int:
        return self.total_cents

    @property
    def tax_cents(self) -> int:
        return sum(t.amount_cents for t in self.tax_lines)

    @property
    def invoice_total_cents(self) -> int:
        return self.total_cents + self.tax_cents

    @property
    def period_label(self) -> str:
        last_day = self.period_end - timedelta(days=1)
        return f"{self.period_start:%B %Y} ({self.period_start:%Y-%m-%d} to {last_day:%Y-%m-%d}, UTC)"

    @property
    def issue_date_text(self) -> str:
        return self.issued_at.date().isoformat() if self.issued_at else "not issued (draft)"

    @property
    def due_date_text(self) -> str:
        return self.due_on.isoformat() if self.due_on else f"{self.payment_terms_days} days after issue"

    @property
    def seller_block(self) -> list[str]:
        return party_lines(self.seller_profile or BillingProfile(legal_name=self.seller))

    @property
    def buyer_block(self) -> list[str]:
        return party_lines(self.buyer) if self.buyer else [self.tenant_name]

    @property
    def tax_note(self) -> str | None:
        return self.buyer.tax.legal_note if self.buyer else None

    @property
    def exact_differs(self) -> bool:
        """Whether the exact usage differs from the subtotal at all: rounding each line to the cent can
        hide usage worth several cents in sum, so any difference is printed (the invoice is the record)."""
        if self.exact_total_pico is None:
            return False
        return self.exact_total_pico != self.total_cents * PICO_PER_CENT

    @property
    def exact_total_text(self) -> str:
        return format_usd_exact(self.exact_total_pico or 0)


def unit_price_text(price: Decimal) -> str:
    """USD per Mtok at four decimals ('3.0000', '0.3000'); a rare finer price keeps all its digits."""
    fixed = price.quantize(Decimal(1).scaleb(-UNIT_PRICE_DECIMALS))
    return f"{fixed:,.{UNIT_PRICE_DECIMALS}f}" if fixed == price else format(price.normalize(), "f")


@cache
def _environment() -> jinja2.Environment:
    return jinja2.Environment(
        loader=jinja2.FileSystemLoader(TEMPLATES), autoescape=True, undefined=jinja2.StrictUndefined
    )


def render_template(name: str, **context: object) -> str:
    """A billing document (invoice or credit note): a whole HTML document with the shared CSS inline, so
    it prints as it shows."""
    css = (TEMPLATES / "invoice.css").read_text()
    return _environment().get_template(name).render(css=css, usd=format_usd, **context)


def render_html(doc: InvoiceDocument) -> str:
    """The invoice: the dashboard's invoice page shows this same document."""
    return render_template("invoice.html", doc=doc, labels=CATEGORY_LABELS, unit_price=unit_price_text)


def html_to_pdf(html: str) -> bytes:
    """A4 with page numbers. WeasyPrint adds no creation date unless the HTML asks for one, so the same
    HTML prints to the same bytes: an issued document's PDF is reproducible (tests/billing/test_credit_notes.py)."""
    try:
        import weasyprint
    except OSError as exc:  # WeasyPrint loads Pango when imported
        raise NotConfiguredError(
            f"PDF invoices need Pango (Debian: apt-get install libpango-1.0-0 libpangoft2-1.0-0): {exc}"
        ) from exc
    document = weasyprint.HTML(string=html, base_url=str(TEMPLATES))
    return bytes(document.write_pdf() or b"")  # title and author come from the HTML's <title> and <meta>


def render_pdf(doc: InvoiceDocument) -> bytes:
    """The same HTML as `render_html`, as an A4 PDF."""
    return html_to_pdf(render_html(doc))
