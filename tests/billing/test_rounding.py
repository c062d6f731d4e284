"""The one rounding rule, as a property over random ledgers, and the figures derived from exact amounts.

Rule (docs/billing.md): each line's exact pico-dollar sum is rounded half-even to the cent once; the subtotal
is the sum of the rounded lines; tax is the rate on the subtotal, rounded half-even once; the savings
percentage comes from the exact amounts; the exact usage is shown beside the subtotal where they differ by a
cent or more.
"""

from __future__ import annotations

from datetime import UTC, date, datetime, timedelta
from decimal import ROUND_HALF_EVEN, Decimal

from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st
from sqlalchemy import func, select

from billing.invoice_lines import InvoiceLine
from billing.invoices import list_invoices, view_invoice
from billing.ledger import UsageCharge
from billing.models import LedgerEntry
from billing.profiles import BillingProfile, TaxTreatment, set_profile
from billing.render import InvoiceDocument, render_html
from billing.settlement import settle_charge
from kvgate.usage import Category, TokenCounts
from tests.billing.conftest import make_tenant

MARCH = datetime(2026, 3, 1, tzinfo=UTC)
APRIL_5 = datetime(2026, 4, 5, tzinfo=UTC)


def half_even_cents(pico: int) -> int:
    return int((Decimal(pico) / Decimal(10**10)).quantize(Decimal(1), rounding=ROUND_HALF_EVEN))


tokens = st.integers(min_value=0, max_value=50_000)
requests = st.lists(
    st.tuples(
        st.sampled_from(["m-test", "SmolLM2-135M-Instruct", "some-unpriced-model"]),
        st.integers(min_value=0, max_value=30 * 86400),
        tokens,
        st.sampled_from([0, 0, 1000, 7777, 40_000]),
        st.sampled_from([0, 0, 123_456]),
        st.integers(min_value=0, max_value=4000),
    ),
    min_size=1,
    max_size=25,
)


@settings(max_examples=25, deadline=None, suppress_health_check=list(HealthCheck))
@given(ledger=requests, rate=st.sampled_from([None, Decimal(19), Decimal("7.7"), Decimal(0)]))
async def test_invoice_totals_over_random_ledgers(sessions, pricebook, ledger, rate):
    tenant, (key,) = await make_tenant(sessions)
    async with sessions() as session:
        if rate is not None:
            tax = TaxTreatment(treatment="standard", rate_percent=rate)
            await set_profile(session=session, tenant_id=tenant, profile=BillingProfile(legal_name="P", tax=tax))
        for i, (model, offset, inp, write, read, out) in enumerate(ledger):
            started = MARCH + timedelta(seconds=offset)
            charge = UsageCharge(
                request_id=f"{tenant}-{i}",
                tenant_id=tenant,
                api_key_id=key,
                model=model,
                endpoint="messages",
                status="ok",
                started_at=started,
                counts=TokenCounts(input=inp, cache_write_5m=write, cache_read=read, output=out),
            )
            version = pricebook.price_for(model, started)
            await settle_charge(session=session, charge=charge, version=version, source="live", now=APRIL_5)
        await session.commit()
        (invoice,) = await list_invoices(session=session, tenant_id=tenant)
        view = await view_invoice(session=session, invoice_id=invoice.id)
        per_request = await session.scalar(
            select(func.sum(LedgerEntry.cost_pico)).where(LedgerEntry.tenant_id == tenant)
        )
    lines = view.computation.lines
    # The exact sum of the lines is the sum of the per-request costs, to the pico-dollar.
    assert sum(line.exact_amount_pico for line in lines) == per_request == view.computation.exact_total_pico
    # Each line is rounded once, half-even; the subtotal is the sum of the rounded lines.
    assert all(line.amount_cents == half_even_cents(line.exact_amount_pico) for line in lines)
    assert view.subtotal_cents == sum(half_even_cents(line.exact_amount_pico) for line in lines)
    # Tax on the subtotal, rounded once; total and amount due follow.
    expected_tax = 0 if rate is None else int((view.subtotal_cents * rate / 100).quantize(1, ROUND_HALF_EVEN))
    assert view.tax_cents == expected_tax
    assert view.total_cents == view.subtotal_cents + expected_tax == view.amount_due_cents
    # Rounding each line moves the subtotal by at most half a cent per line.
    assert abs(view.subtotal_cents * 10**10 - per_request) <= len(lines) * 10**10 // 2


def small_line(position: int, tokens: int) -> InvoiceLine:
    return InvoiceLine(
        position=position,
        model="m-test",
        category=Category.CACHE_READ,
        price_version_id=1,
        tokens=tokens,
        unit_price_usd_per_mtok=Decimal("0.3"),
        exact_amount_pico=tokens * 300_000,
        amount_cents=half_even_cents(tokens * 300_000),
    )


def document(lines: tuple[InvoiceLine, ...], *, uncached_pico: int) -> InvoiceDocument:
    exact = sum(line.exact_amount_pico for line in lines)
    return InvoiceDocument(
        invoice_id=1,
        number="KVG-000001",
        status="finalized",
        tenant_id="t",
        tenant_name="T",
        period_start=date(2026, 3, 1),
        period_end=date(2026, 4, 1),
        issued_at=APRIL_5,
        lines=lines,
        requests=len(lines),
        total_cents=sum(line.amount_cents for line in lines),
        uncached_cents=half_even_cents(uncached_pico),
        exact_total_pico=exact,
        exact_uncached_pico=uncached_pico,
    )


def test_many_small_lines_show_the_exact_usage_beside_the_rounded_subtotal():
    # Six lines of $0.0046 each: every one rounds to $0.00, but together they are $0.0276.
    lines = tuple(small_line(i + 1, 15_333) for i in range(6))
    doc = document(lines, uncached_pico=10**11)
    assert doc.subtotal_cents == 0 and doc.exact_total_pico == 6 * 15_333 * 300_000
    html = " ".join(render_html(doc).split())
    assert "Exact usage before rounding: $0.0275994" in html
    # One line of $0.0046: rounding hides less than a cent, and the exact figure is still printed.
    single = document(lines[:1], uncached_pico=10**11)
    assert single.exact_differs and "Exact usage before rounding: $0.0045999" in " ".join(render_html(single).split())
    # Usage that is whole cents already: nothing extra to say.
    whole = document((small_line(1, 500_000),), uncached_pico=10**12)  # 500,000 tokens at $0.30/Mtok: $0.15
    assert whole.exact_total_pico == 15 * 10**10 and whole.subtotal_cents == 15 and not whole.exact_differs
    assert "Exact usage" not in render_html(whole)


def test_savings_percent_comes_from_exact_amounts():
    # Exact: $0.0276 of $0.054 uncached -> 48.9% saved; from cents it would be (5 - 0) / 5 = 100%.
    lines = tuple(small_line(i + 1, 15_333) for i in range(6))
    doc = document(lines, uncached_pico=540_000_000_00)
    assert doc.uncached_cents == 5 and doc.savings_cents == 5
    exact = Decimal(100) * (540_000_000_00 - doc.exact_total_pico) / 540_000_000_00
    assert doc.savings_percent == exact.quantize(Decimal("0.1")) == Decimal("48.9")
