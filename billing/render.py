"""An invoice as a person reads it: HTML and PDF from the same frozen document."""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass
from datetime import date, datetime, timedelta
from pathlib import Path
from typing import Literal

import jinja2
from fpdf import FPDF
from fpdf.fonts import FontFace

from billing.invoice_lines import CacheSavings, InvoiceLine
from billing.money import format_usd
from kvgate.usage import CATEGORY_LABELS


@dataclass(frozen=True)
class CreditNoteSummary:
    number: str
    amount_cents: int
    reason: str
    created_at: datetime


@dataclass(frozen=True)
class InvoiceDocument(CacheSavings):
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
    credit_notes: tuple[CreditNoteSummary, ...] = ()
    seller: str = "kvgate"

    @property
    def title(self) -> str:
        return f"Invoice {self.number}" if self.number else f"Draft invoice #{self.invoice_id}"

    @property
    def credited_cents(self) -> int:
        return sum(note.amount_cents for note in self.credit_notes)

    @property
    def amount_due_cents(self) -> int:
        return self.total_cents - self.credited_cents

    @property
    def period_label(self) -> str:
        last_day = self.period_end - timedelta(days=1)
        return f"{self.period_start:%B %Y} ({self.period_start:%Y-%m-%d} to {last_day:%Y-%m-%d}, UTC)"


_HTML = jinja2.Environment(autoescape=True, undefined=jinja2.StrictUndefined).from_string(
    """<!doctype html>
<html lang="en"><head><meta charset="utf-8"><title>{{ doc.title }}</title>
<style>
body{font-family:system-ui,sans-serif;margin:2rem;color:#111}
table{border-collapse:collapse;width:100%}th,td{padding:.3rem .6rem;border-bottom:1px solid #ddd}
td.n,th.n{text-align:right;font-variant-numeric:tabular-nums}.status{text-transform:uppercase;color:#555}
tfoot td{font-weight:600}
</style></head><body>
<h1>{{ doc.title }} <span class="status">{{ doc.status }}</span></h1>
<p>From {{ doc.seller }} to <strong>{{ doc.tenant_name }}</strong> (tenant {{ doc.tenant_id }})<br>
Period: {{ doc.period_label }}<br>
{% if doc.issued_at %}Issued: {{ doc.issued_at.strftime("%Y-%m-%d %H:%M UTC") }}<br>{% endif %}
Requests: {{ "{:,}".format(doc.requests) }}</p>
<table><thead><tr><th>#</th><th>Model</th><th>Category</th><th class="n">Tokens</th>
<th class="n">Unit price (USD / Mtok)</th><th class="n">Amount</th></tr></thead><tbody>
{% for line in doc.lines %}<tr><td>{{ line.position }}</td><td>{{ line.model }}</td>
<td>{{ labels[line.category] }}</td>
<td class="n">{{ "{:,}".format(line.tokens) }}</td><td class="n">{{ line.unit_price_usd_per_mtok }}</td>
<td class="n">{{ usd(line.amount_cents) }}</td></tr>
{% else %}<tr><td colspan="6">No usage in this period.</td></tr>{% endfor %}
</tbody><tfoot>
<tr><td colspan="5">Total</td><td class="n" id="total">{{ usd(doc.total_cents) }}</td></tr>
{% for note in doc.credit_notes %}<tr><td colspan="5">Credit note {{ note.number }}: {{ note.reason }}</td>
<td class="n">-{{ usd(note.amount_cents) }}</td></tr>{% endfor %}
{% if doc.credit_notes %}<tr><td colspan="5">Amount due</td>
<td class="n">{{ usd(doc.amount_due_cents) }}</td></tr>{% endif %}
</tfoot></table>
<p>Without prompt caching this usage would have cost {{ usd(doc.uncached_cents) }}:
caching saved {{ usd(doc.savings_cents) }} ({{ doc.savings_percent }}%).</p>
<p><small>Line amounts are exact token x rate sums rounded half-even to the cent;
the total is the sum of the lines.</small></p>
</body></html>
"""
)


def render_html(doc: InvoiceDocument) -> str:
    return _HTML.render(doc=doc, usd=format_usd, labels=CATEGORY_LABELS)


# Where Debian's fonts-dejavu-core (and most distributions) keep DejaVu Sans: a TrueType font
# covering Latin, Greek and Cyrillic. Without it the PDF falls back to the core Helvetica font.
UNICODE_FONT_DIRS = (
    Path("/usr/share/fonts/truetype/dejavu"),
    Path("/usr/share/fonts/TTF"),
    Path("/usr/share/fonts/dejavu"),
)
UNICODE_FONT_FILES = {"": "DejaVuSans.ttf", "B": "DejaVuSans-Bold.ttf"}

_ASCII_PUNCTUATION = str.maketrans(
    {
        "\u2014": "-",
        "\u2013": "-",
        "\u2018": "'",
        "\u2019": "'",
        "\u201c": '"',
        "\u201d": '"',
        "\u2026": "...",
        "\u00a0": " ",
    }
)


def unicode_font_files(dirs: Sequence[Path] = UNICODE_FONT_DIRS) -> dict[str, Path] | None:
    """DejaVu Sans regular and bold, from the first directory that has both; None if none does."""
    for directory in dirs:
        files = {style: directory / name for style, name in UNICODE_FONT_FILES.items()}
        if all(f.is_file() for f in files.values()):
            return files
    return None


class _PdfText:
    """The PDF's font family, and text reduced to what that font can draw (the rest becomes "?")."""

    def __init__(self, pdf: FPDF, font_files: dict[str, Path] | None) -> None:
        if font_files is None:
            self.family, self._cmap = "Helvetica", None  # core font: Latin-1 only, nothing to embed
            return
        for style, path in font_files.items():
            pdf.add_font("DejaVu", style, str(path))
        self.family, self._cmap = "DejaVu", pdf.fonts["dejavu"].cmap

    def __call__(self, text: str) -> str:
        if self._cmap is None:
            return text.translate(_ASCII_PUNCTUATION).encode("latin-1", "replace").decode("latin-1")
        return "".join(c if ord(c) in self._cmap else "?" for c in text)


def render_pdf(doc: InvoiceDocument, *, font_files: dict[str, Path] | Literal["auto"] | None = "auto") -> bytes:
    """The invoice as PDF, in DejaVu Sans where the system has it (font_files: "auto" finds it; None forces
    the Latin-1 core font). Characters the font cannot draw are printed as "?"."""
    pdf = FPDF(orientation="P", unit="mm", format="A4")
    printable = _PdfText(pdf, unicode_font_files() if font_files == "auto" else font_files)
    pdf.set_title(printable(doc.title))
    pdf.set_author(printable(doc.seller))
    pdf.set_auto_page_break(auto=True, margin=15)
    pdf.add_page()
    pdf.set_font(printable.family, "B", 16)
    pdf.cell(0, 10, printable(f"{doc.title} ({doc.status.upper()})"), new_x="LMARGIN", new_y="NEXT")
    pdf.set_font(printable.family, size=10)
    header = [
        f"From {doc.seller} to {doc.tenant_name} (tenant {doc.tenant_id})",
        f"Period: {doc.period_label}",
        f"Issued: {doc.issued_at:%Y-%m-%d %H:%M} UTC" if doc.issued_at else "Not issued: draft",
        f"Requests: {doc.requests:,}",
    ]
    for text in header:
        pdf.cell(0, 6, printable(text), new_x="LMARGIN", new_y="NEXT")
    pdf.ln(4)
    pdf.set_font(printable.family, size=9)
    with pdf.table(
        col_widths=(8, 52, 34, 30, 34, 26),
        text_align=("RIGHT", "LEFT", "LEFT", "RIGHT", "RIGHT", "RIGHT"),
        headings_style=FontFace(emphasis="BOLD"),
        line_height=6,
    ) as table:
        table.row(["#", "Model", "Category", "Tokens", "USD / Mtok", "Amount"])
        for line in doc.lines:
            table.row(
                [
                    str(line.position),
                    printable(line.model),
                    CATEGORY_LABELS[line.category],
                    f"{line.tokens:,}",
                    str(line.unit_price_usd_per_mtok),
                    format_usd(line.amount_cents),
                ]
            )
    pdf.ln(3)
    pdf.set_font(printable.family, "B", 11)
    pdf.cell(0, 7, f"Total: {format_usd(doc.total_cents)}", align="R", new_x="LMARGIN", new_y="NEXT")
    pdf.set_font(printable.family, size=10)
    for note in doc.credit_notes:
        text = f"Credit note {note.number} ({note.reason}): -{format_usd(note.amount_cents)}"
        pdf.cell(0, 6, printable(text), align="R", new_x="LMARGIN", new_y="NEXT")
    if doc.credit_notes:
        pdf.set_font(printable.family, "B", 11)
        due = f"Amount due: {format_usd(doc.amount_due_cents)}"
        pdf.cell(0, 7, due, align="R", new_x="LMARGIN", new_y="NEXT")
        pdf.set_font(printable.family, size=10)
    pdf.ln(4)
    pdf.multi_cell(
        0,
        5,
        f"Without prompt caching this usage would have cost {format_usd(doc.uncached_cents)}: "
        f"caching saved {format_usd(doc.savings_cents)} ({doc.savings_percent}%).",
    )
    return bytes(pdf.output())
