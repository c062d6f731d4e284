"""Credit notes are documents of their own: numbered, dated, referring to their invoice, net/VAT/gross per
rate, with their own HTML and PDF (read back with pypdf); the issued invoice's PDF never changes."""

from __future__ import annotations

from decimal import Decimal

import pytest

from billing import operations
from billing.credit_note_documents import (
    NO_TAX_LABEL,
    RateShare,
    render_credit_note_html,
    render_credit_note_pdf,
    split_gross,
)
from billing.credit_notes import CreditNoteNotFoundError, issue_credit_note
from billing.invoices import invoice_document, view_invoice
from billing.render import render_pdf
from tests.billing.test_render import SELLER, flat, issued, pdf_text


async def _document(sessions, invoice_id: int):  # type: ignore[no-untyped-def]
    async with sessions() as session:
        view = await view_invoice(session=session, invoice_id=invoice_id)
        return view, await invoice_document(
            session=session,
            view=view,
            seller=SELLER.seller_profile(),
            payment_instructions=SELLER.payment_instructions,
            payment_terms_days=SELLER.payment_terms_days,
        )


async def test_the_issued_pdf_is_byte_stable_across_a_credit_note_which_prints_on_its_own(sessions, pricebook):
    view, doc, _ = await issued(sessions, pricebook, "standard")
    before = render_pdf(doc)
    gross = 50  # $0.50 at 19%: $0.50 / 1.19 = $0.4202 net, half-even $0.42, and $0.08 VAT
    async with sessions() as session:
        note = await issue_credit_note(
            session=session, invoice_id=view.invoice.id, amount_cents=gross, reason="outage", number_prefix="KVG"
        )
        await session.commit()
    after_view, after_doc = await _document(sessions, view.invoice.id)
    assert render_pdf(after_doc) == before  # the same bytes: an issued invoice stays as issued
    assert after_view.credited_cents == gross and after_view.amount_due_cents == view.total_cents - gross
    assert note.number.startswith("KVG-CN-")

    async with sessions() as session:
        credit = await operations.credit_note_document(
            session=session, credit_note_id=note.id, seller=SELLER.seller_name, settings=SELLER
        )
    assert (credit.net_cents, credit.vat_cents, credit.gross_cents) == (42, 8, 50)
    text, pages = pdf_text(render_credit_note_pdf(credit))
    one = flat(text)
    assert f"Credit note {note.number}" in one and f"Date {note.created_at.date().isoformat()}" in one
    assert f"Corrects invoice {view.invoice.number} of 2026-04-05" in one
    assert "VAT 19% $0.42 $0.08 $0.50" in one
    assert "Net -$0.42" in one and "VAT -$0.08" in one and "Total credited -$0.50" in one
    # The invoice stated its VAT in EUR too (tests/billing/test_render.py): so does the note, at its rate.
    assert credit.vat_eur_cents == 7 and "VAT in EUR: -EUR 0.07, at the invoice's rate of 1 USD = 0.9234 EUR" in one
    assert "Reason: outage" in one and "kvgate GmbH" in one and "VAT ID: BE0123456789" in one
    assert pages == 1 and "Amount due" not in one
    # The invoice itself carries no trace of the note, while the note names the invoice.
    assert note.number not in flat(pdf_text(before)[0]) and view.invoice.number in render_credit_note_html(credit)


async def test_a_tax_free_invoices_note_credits_net_only(sessions, pricebook):
    view, _, _ = await issued(sessions, pricebook, "reverse_charge")
    async with sessions() as session:
        note = await issue_credit_note(
            session=session, invoice_id=view.invoice.id, amount_cents=7, reason="goodwill", number_prefix="KVG"
        )
        await session.commit()
        credit = await operations.credit_note_document(session=session, credit_note_id=note.id, seller="kvgate")
        with pytest.raises(CreditNoteNotFoundError):
            await operations.credit_note_document(session=session, credit_note_id=note.id + 10_000, seller="kvgate")
    assert [(s.label, s.net_cents, s.vat_cents) for s in credit.shares] == [(NO_TAX_LABEL, 7, 0)]
    one = flat(pdf_text(render_credit_note_pdf(credit))[0])
    assert "Reverse charge" in one and "Total credited -$0.07" in one
    assert credit.vat_eur_cents is None and "VAT in EUR" not in one  # no VAT: none to state in EUR


VAT_19 = (RateShare("VAT 19%", Decimal(19), 1000, 190),)


def test_one_note_splits_at_the_invoices_rate_and_the_last_cent_takes_what_is_left():
    first = split_gross(1, invoice=VAT_19)
    assert [(s.net_cents, s.vat_cents) for s in first] == [(1, 0)]  # 1 / 1.19 = 0.84, half-even 1
    rest = split_gross(1189, invoice=VAT_19, earlier=first)
    # Credited in two notes, the invoice's net and VAT are reversed exactly, not to within a cent.
    assert (first[0].net_cents + rest[0].net_cents, first[0].vat_cents + rest[0].vat_cents) == (1000, 190)
    with pytest.raises(AssertionError):
        split_gross(1190, invoice=VAT_19, earlier=first)  # more than is left


def test_several_rates_share_the_gross_by_their_weight():
    rates = (RateShare("VAT 19%", Decimal(19), 1000, 190), RateShare("VAT 7%", Decimal(7), 1000, 70))
    shares = split_gross(245, invoice=rates)
    assert sum(s.gross_cents for s in shares) == 245
    assert [s.gross_cents for s in shares] == [129, 116]  # 245 x 1190/2260 and 245 x 1070/2260, both whole
    assert all(s.net_cents + s.vat_cents == s.gross_cents and s.vat_cents > 0 for s in shares)
