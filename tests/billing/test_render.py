"""Invoice PDFs: names outside Latin-1 print in DejaVu Sans where the system has it, else fall back to "?"."""

from __future__ import annotations

import io
from datetime import UTC, date, datetime
from decimal import Decimal
from pathlib import Path

import pytest
from pypdf import PdfReader

from billing.invoice_lines import InvoiceLine
from billing.render import InvoiceDocument, render_pdf, unicode_font_files

FONTS = unicode_font_files()
TENANT = "Łódź Кофейня Ελλάδα 珈琲"


def document() -> InvoiceDocument:
    line = InvoiceLine(
        position=1,
        model="SmolLM2-135M-Instruct",
        category="input",
        price_version_id=1,
        tokens=1_000_000,
        unit_price_usd_per_mtok=Decimal("0.50"),
        exact_amount_pico=500_000_000_000,
        amount_cents=50,
    )
    return InvoiceDocument(
        invoice_id=7,
        number="KVG-000007",
        status="open",
        tenant_id="t-1",
        tenant_name=TENANT,
        period_start=date(2026, 10, 1),
        period_end=date(2026, 11, 1),
        issued_at=datetime(2026, 11, 4, tzinfo=UTC),
        lines=(line,),
        requests=3,
        total_cents=50,
        uncached_cents=80,
    )


def pdf_text(pdf: bytes) -> str:
    return "".join(page.extract_text() for page in PdfReader(io.BytesIO(pdf)).pages)


@pytest.mark.skipif(FONTS is None, reason="DejaVu Sans is not installed (Debian: fonts-dejavu-core)")
def test_greek_cyrillic_and_latin_extended_names_print_with_the_unicode_font():
    text = pdf_text(render_pdf(document()))
    assert "Łódź Кофейня Ελλάδα ??" in text  # CJK is beyond DejaVu Sans: "?" rather than a blank
    assert "Total: $0.50" in text


def test_the_core_font_fallback_prints_what_latin_1_cannot_hold_as_question_marks():
    text = pdf_text(render_pdf(document(), font_files=None))
    assert "?ód? ??????? ?????? ??" in text
    assert "Total: $0.50" in text


def test_a_directory_without_both_styles_is_not_used(tmp_path: Path):
    (tmp_path / "DejaVuSans.ttf").write_bytes(b"")
    assert unicode_font_files([tmp_path]) is None
    (tmp_path / "DejaVuSans-Bold.ttf").write_bytes(b"")
    assert unicode_font_files([tmp_path]) == {"": tmp_path / "DejaVuSans.ttf", "B": tmp_path / "DejaVuSans-Bold.ttf"}
