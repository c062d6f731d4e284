"""A credit note as a document of its own: number, date, the invoice it corrects, net, VAT and gross per rate.

The invoice it refers to never changes (GoBD; Art. 219 VAT Directive treats a document that amends
an invoice as an invoice of its own). A note's gross amount is split back into net and VAT at the
invoice's rates:

- with one rate r, net = round_half_even(gross × 100 / (100 + r)) and VAT = gross − net;
- with several, the gross is first shared out in proportion to each rate's gross on the invoice
  (largest remainder, so the shares add up to the cent);
- the note that credits the invoice's last cent takes what is left of each rate's net and VAT, so a
  whole invoice credited in any number of notes reverses its net and VAT exactly.
"""

from __future__ import annotations

from dataclasses import dataclass
from datetime import date
from decimal import ROUND_HALF_EVEN, Decimal

from billing.models import CreditNote
from billing.render import InvoiceDocument, html_to_pdf, render_template
from billing.tax import TaxLine
from billing.vat_in_eur import eur_cents

NO_TAX_LABEL = "No VAT"


@dataclass(frozen=True)
class RateShare:
    """One VAT rate's part of a credit note (or of an invoice, as the base the notes are split against)."""

    label: str
    rate_percent: Decimal
    net_cents: int
    vat_cents: int

    @property
    def gross_cents(self) -> int:
        return self.net_cents + self.vat_cents


@dataclass(frozen=True)
class CreditNoteDocument:
    """Everything a credit note shows; built from the invoice's own (issued) document."""

    credit_note_id: int
    number: str
    issued_on: date
    reason: str
    invoice: InvoiceDocument
    shares: tuple[RateShare, ...]

    @property
    def title(self) -> str:
        return f"Credit note {self.number}"

    @property
    def net_cents(self) -> int:
        return sum(s.net_cents for s in self.shares)

    @property
    def vat_cents(self) -> int:
        return sum(s.vat_cents for s in self.shares)

    @property
    def gross_cents(self) -> int:
        return sum(s.gross_cents for s in self.shares)

    @property
    def vat_eur_cents(self) -> int | None:
        """The credited VAT in EUR, at the rate the invoice stated its VAT in EUR at (None where it stated none)."""
        fx = self.invoice.vat_eur
        return None if fx is None else eur_cents(self.vat_cents, fx.eur_per_unit)


def invoice_shares(invoice: InvoiceDocument) -> tuple[RateShare, ...]:
    """The invoice's net and VAT per rate; an invoice without tax is one share with no VAT."""
    if not invoice.tax_lines:
        return (RateShare(NO_TAX_LABEL, Decimal(0), invoice.subtotal_cents, 0),)
    return tuple(_share_of(line) for line in invoice.tax_lines)


def _share_of(line: TaxLine) -> RateShare:
    return RateShare(line.label, line.rate_percent, line.taxable_cents, line.amount_cents)


def split_gross(
    gross_cents: int, *, invoice: tuple[RateShare, ...], earlier: tuple[RateShare, ...] = ()
) -> tuple[RateShare, ...]:
    """A credit note's gross amount as net and VAT per rate. `earlier`: the shares of the invoice's notes
    before this one, summed per rate (same order as `invoice`)."""
    invoice_gross = sum(s.gross_cents for s in invoice)
    credited = sum(s.gross_cents for s in earlier)
    assert 0 < gross_cents <= invoice_gross - credited, "credit_notes.issue_credit_note bounds the amount"
    before = earlier or tuple(RateShare(s.label, s.rate_percent, 0, 0) for s in invoice)
    if credited + gross_cents == invoice_gross:  # the last cent: take exactly what is left
        return tuple(
            RateShare(s.label, s.rate_percent, s.net_cents - b.net_cents, s.vat_cents - b.vat_cents)
            for s, b in zip(invoice, before, strict=True)
        )
    parts = _largest_remainder(gross_cents, [s.gross_cents for s in invoice])
    return tuple(_net_and_vat(part, s) for part, s in zip(parts, invoice, strict=True))


def _net_and_vat(gross_cents: int, rate: RateShare) -> RateShare:
    net = (Decimal(gross_cents) * 100 / (100 + rate.rate_percent)).quantize(Decimal(1), rounding=ROUND_HALF_EVEN)
    return RateShare(rate.label, rate.rate_percent, int(net), gross_cents - int(net))


def _largest_remainder(total: int, weights: list[int]) -> list[int]:
    whole = sum(weights)
    if whole <= 0:
        return [total] + [0] * (len(weights) - 1)
    exact = [Decimal(total) * w / whole for w in weights]
    parts = [int(e) for e in exact]
    order = sorted(range(len(weights)), key=lambda i: (exact[i] - parts[i], -i), reverse=True)
    for i in order[: total - sum(parts)]:
        parts[i] += 1
    return parts


def credit_note_documents(invoice: InvoiceDocument, notes: list[CreditNote]) -> list[CreditNoteDocument]:
    """Each of an invoice's notes as a document, in issue order (each note's split depends on those before)."""
    base = invoice_shares(invoice)
    summed = tuple(RateShare(s.label, s.rate_percent, 0, 0) for s in base)
    documents = []
    for note in sorted(notes, key=lambda n: n.id):
        shares = split_gross(note.amount_cents, invoice=base, earlier=summed if documents else ())
        summed = tuple(
            RateShare(a.label, a.rate_percent, a.net_cents + b.net_cents, a.vat_cents + b.vat_cents)
            for a, b in zip(summed, shares, strict=True)
        )
        documents.append(
            CreditNoteDocument(
                credit_note_id=note.id,
                number=note.number,
                issued_on=note.created_at.date(),
                reason=note.reason,
                invoice=invoice,
                shares=shares,
            )
        )
    return documents


def render_credit_note_html(doc: CreditNoteDocument) -> str:
    return render_template("credit_note.html", doc=doc)


def render_credit_note_pdf(doc: CreditNoteDocument) -> bytes:
    return html_to_pdf(render_credit_note_html(doc))
