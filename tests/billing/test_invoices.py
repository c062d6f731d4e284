"""Invoices: a month of generated usage against an independent computation; finalization and immutability."""

from __future__ import annotations

import io
import random
from collections import defaultdict
from datetime import UTC, date, datetime, timedelta
from decimal import ROUND_HALF_EVEN, Decimal

import pytest
from pypdf import PdfReader
from sqlalchemy import text
from sqlalchemy.exc import DBAPIError

from billing import catalog
from billing.credit_notes import CreditNoteError, issue_credit_note
from billing.invoices import (
    InvoiceStateError,
    due_for_finalization,
    finalize_invoice,
    invoice_document,
    list_invoices,
    view_invoice,
)
from billing.ledger import UsageCharge
from billing.prices import PriceSpec
from billing.render import render_html, render_pdf
from billing.settlement import reverse_charge, settle_charge
from kvgate.usage import TokenCounts
from tests.billing.conftest import make_tenant

MARCH = date(2026, 3, 1)
APRIL_5 = datetime(2026, 4, 5, tzinfo=UTC)
CHANGE = datetime(2026, 3, 15, tzinfo=UTC)

# Unit prices as a person reads them off a price sheet: USD per Mtok for each category.
SHEET = {
    ("m-test", "old"): {
        "input": "3",
        "cache_write_5m": "3.75",
        "cache_write_1h": "6",
        "cache_write_24h": "4.5",
        "cache_read": "0.3",
        "output": "15",
    },
    ("m-change", "old"): {
        "input": "0.15",
        "cache_write_5m": "0.1875",
        "cache_write_1h": "0.3",
        "cache_read": "0.015",
        "output": "0.6",
    },
    ("m-change", "new"): {
        "input": "0.25",
        "cache_write_5m": "0.3125",
        "cache_write_1h": "0.5",
        "cache_read": "0.025",
        "output": "1.25",
    },
}


@pytest.fixture(scope="module")
async def priced(sessions, pricebook):
    async with sessions() as session:
        await catalog.seed_prices(
            session=session,
            specs=[
                PriceSpec(
                    model="m-change",
                    effective_from=datetime(2026, 1, 1, tzinfo=UTC),
                    input_usd_per_mtok=Decimal("0.15"),
                    output_usd_per_mtok=Decimal("0.6"),
                ),
                PriceSpec(
                    model="m-change",
                    effective_from=CHANGE,
                    input_usd_per_mtok=Decimal("0.25"),
                    output_usd_per_mtok=Decimal("1.25"),
                ),
            ],
            source="tests",
        )
        await session.commit()
        return await catalog.load_pricebook(session=session)


def generated_month(tenant: str, key: str, seed: int) -> list[UsageCharge]:
    rng = random.Random(seed)
    charges = []
    for i in range(300):
        model = rng.choice(["m-test", "m-change"])
        started = datetime(2026, 3, 1, tzinfo=UTC) + timedelta(seconds=rng.randrange(31 * 86400))
        counts = TokenCounts(
            input=rng.randrange(0, 3000),
            cache_write_5m=rng.choice([0, rng.randrange(0, 9000)]),
            cache_write_1h=rng.choice([0, 0, rng.randrange(0, 5000)]),
            cache_write_24h=rng.choice([0, 0, rng.randrange(0, 2000)]) if model == "m-test" else 0,
            cache_read=rng.choice([0, rng.randrange(0, 60000)]),
            output=rng.randrange(1, 800),
        )
        charges.append(
            UsageCharge(
                request_id=f"{tenant}-{i}",
                tenant_id=tenant,
                api_key_id=key,
                model=model,
                endpoint="messages",
                status="ok",
                started_at=started,
                counts=counts,
            )
        )
    return charges


def expected_lines(charges: list[UsageCharge]) -> tuple[dict[tuple[str, str, str], tuple[int, Decimal]], Decimal]:
    """The invoice, computed without billing's code: sum tokens, multiply by the sheet, round each line."""
    tokens: dict[tuple[str, str, str], int] = defaultdict(int)
    for c in charges:
        era = "new" if c.model == "m-change" and c.started_at >= CHANGE else "old"
        for category, n in c.counts.by_category().items():
            if n:
                tokens[(c.model, era, category.value)] += n
    lines = {}
    for key, n in tokens.items():
        exact = Decimal(n) * Decimal(SHEET[key[:2]][key[2]]) / Decimal(1_000_000)
        lines[key] = (n, exact.quantize(Decimal("0.01"), rounding=ROUND_HALF_EVEN))
    return lines, sum((amount for _, amount in lines.values()), Decimal(0))


async def record_all(sessions, book, charges, now=APRIL_5):
    async with sessions() as session:
        for c in charges:
            await settle_charge(
                session=session, charge=c, version=book.price_for(c.model, c.started_at), source="live", now=now
            )
        await session.commit()


async def test_month_of_usage_matches_independent_computation(sessions, priced):
    tenant, (key,) = await make_tenant(sessions)
    charges = generated_month(tenant, key, seed=11)
    await record_all(sessions, priced, charges)
    lines, total = expected_lines(charges)
    async with sessions() as session:
        (invoice,) = await list_invoices(session=session, tenant_id=tenant)
        view = await view_invoice(session=session, invoice_id=invoice.id)
    assert invoice.status == "draft" and invoice.period_start == MARCH
    got = {}
    for line in view.computation.lines:
        era = (
            "new"
            if line.model == "m-change" and priced.by_id(line.price_version_id).effective_from == CHANGE
            else "old"
        )
        got[(line.model, era, line.category.value)] = (line.tokens, Decimal(line.amount_cents) / 100)
        assert line.unit_price_usd_per_mtok == Decimal(SHEET[(line.model, era)][line.category.value])
    assert got == lines
    assert Decimal(view.computation.total_cents) / 100 == total
    assert view.computation.total_cents == sum(line.amount_cents for line in view.computation.lines)
    assert view.computation.requests == 300
    assert 0 < view.computation.savings_cents < view.computation.uncached_cents


async def test_finalized_invoice_is_numbered_frozen_and_renders(sessions, priced):
    tenant, (key,) = await make_tenant(sessions)
    charges = generated_month(tenant, key, seed=12)[:40]
    await record_all(sessions, priced, charges)
    async with sessions() as session:
        (invoice,) = await list_invoices(session=session, tenant_id=tenant)
        with pytest.raises(InvoiceStateError, match="runs until"):
            await finalize_invoice(
                session=session,
                invoice_id=invoice.id,
                number_prefix="KVG",
                now=datetime(2026, 3, 31, 23, 59, tzinfo=UTC),
            )
        draft_total = (await view_invoice(session=session, invoice_id=invoice.id)).computation.total_cents
        view = await finalize_invoice(session=session, invoice_id=invoice.id, number_prefix="KVG", now=APRIL_5)
        await session.commit()
    assert view.invoice.status == "finalized" and view.invoice.number.startswith("KVG-")
    assert view.computation.total_cents == draft_total == view.invoice.total_cents
    async with sessions() as session:
        with pytest.raises(InvoiceStateError, match="already finalized"):
            await finalize_invoice(session=session, invoice_id=invoice.id, number_prefix="KVG", now=APRIL_5)
    for statement in (
        "UPDATE invoices SET total_cents = total_cents + 1 WHERE id = :i",
        "UPDATE invoices SET status = 'draft' WHERE id = :i",
        "UPDATE invoices SET tax_cents = coalesce(tax_cents, 0) + 1 WHERE id = :i",
        "UPDATE invoices SET parties_json = '{}' WHERE id = :i",
        "UPDATE invoices SET due_on = NULL WHERE id = :i",
        "DELETE FROM invoices WHERE id = :i",
        "UPDATE invoice_lines SET amount_cents = 0 WHERE invoice_id = :i",
        "DELETE FROM invoice_lines WHERE invoice_id = :i",
    ):
        async with sessions() as session:
            with pytest.raises(DBAPIError, match=r"immutable|append-only"):
                await session.execute(text(statement), {"i": invoice.id})
    async with sessions() as session:  # status may still move on (payment), the amounts may not
        await session.execute(text("UPDATE invoices SET status = 'paid' WHERE id = :i"), {"i": invoice.id})
        await session.rollback()
    # A late record for March now lands on April's draft, leaving March's invoice as it was.
    late = UsageCharge(
        request_id=f"{tenant}-late",
        tenant_id=tenant,
        api_key_id=key,
        model="m-test",
        endpoint="messages",
        status="ok",
        started_at=datetime(2026, 3, 31, 23, tzinfo=UTC),
        counts=TokenCounts(input=1000, output=10),
    )
    await record_all(sessions, priced, [late])
    async with sessions() as session:
        again = await view_invoice(session=session, invoice_id=invoice.id)
        april = await list_invoices(session=session, tenant_id=tenant, month=date(2026, 4, 1))
        document = await invoice_document(session=session, view=again, seller="kvgate")
    assert again.computation.lines == view.computation.lines and len(april) == 1
    html = render_html(document)
    assert view.invoice.number in html and f"${draft_total // 100:,}.{draft_total % 100:02d}" in html
    pdf_text = "".join(page.extract_text() for page in PdfReader(io.BytesIO(render_pdf(document))).pages)
    assert f"Subtotal ${draft_total // 100:,}.{draft_total % 100:02d}" in pdf_text
    assert view.invoice.number in pdf_text


async def test_numbers_are_sequential_and_credit_notes_are_bounded(sessions, priced):
    numbers = []
    ids = []
    for _ in range(3):
        tenant, (key,) = await make_tenant(sessions)
        await record_all(sessions, priced, generated_month(tenant, key, seed=13)[:5])
        async with sessions() as session:
            (invoice,) = await list_invoices(session=session, tenant_id=tenant)
            view = await finalize_invoice(session=session, invoice_id=invoice.id, number_prefix="SEQ", now=APRIL_5)
            await session.commit()
        numbers.append(int(view.invoice.number.split("-")[-1]))
        ids.append(invoice.id)
    assert numbers == list(range(numbers[0], numbers[0] + 3))
    async with sessions() as session:
        total = (await view_invoice(session=session, invoice_id=ids[0])).invoice.total_cents
        note = await issue_credit_note(
            session=session, invoice_id=ids[0], amount_cents=total - 1, reason="goodwill", number_prefix="SEQ"
        )
        with pytest.raises(CreditNoteError, match="left to credit"):
            await issue_credit_note(session=session, invoice_id=ids[0], amount_cents=2, reason="x", number_prefix="SEQ")
        last = await issue_credit_note(
            session=session, invoice_id=ids[0], amount_cents=1, reason="rest", number_prefix="SEQ"
        )
        await session.commit()
        view = await view_invoice(session=session, invoice_id=ids[0])
        document = await invoice_document(session=session, view=view, seller="kvgate")
    assert view.credited_cents == total and view.amount_due_cents == 0 and document.number == view.invoice.number
    assert int(last.number.split("-")[-1]) == int(note.number.split("-")[-1]) + 1
    async with sessions() as session:
        with pytest.raises(DBAPIError, match="append-only"):
            await session.execute(text("UPDATE credit_notes SET amount_cents = 0 WHERE id = :i"), {"i": note.id})


async def test_finalization_waits_for_the_grace_period(sessions, priced):
    tenant, (key,) = await make_tenant(sessions)
    await record_all(sessions, priced, generated_month(tenant, key, seed=14)[:3])
    grace = timedelta(days=3)
    async with sessions() as session:
        (invoice,) = await list_invoices(session=session, tenant_id=tenant)
        assert invoice.id not in await due_for_finalization(
            session=session, now=datetime(2026, 4, 3, 23, tzinfo=UTC), grace=grace
        )
        assert invoice.id in await due_for_finalization(
            session=session, now=datetime(2026, 4, 4, 0, tzinfo=UTC), grace=grace
        )


async def test_reversals_reduce_the_draft(sessions, priced):
    tenant, (key,) = await make_tenant(sessions)
    charges = generated_month(tenant, key, seed=15)[:10]
    await record_all(sessions, priced, charges)
    async with sessions() as session:
        await reverse_charge(session=session, request_id=charges[0].request_id, reason="refund", now=APRIL_5)
        await session.commit()
        (invoice,) = await list_invoices(session=session, tenant_id=tenant)
        view = await view_invoice(session=session, invoice_id=invoice.id)
    _, total = expected_lines(charges[1:])
    assert view.computation.requests == 9 and Decimal(view.computation.total_cents) / 100 == total


async def test_background_finalization_after_grace(sessions, priced, tmp_path):
    """Last in this file: it finalizes every due draft in the shared test database, not just its own."""
    from billing.service import BillingService
    from billing.settings import BillingSettings

    tenant, (key,) = await make_tenant(sessions)
    january = [
        UsageCharge(
            request_id=f"{tenant}-{i}",
            tenant_id=tenant,
            api_key_id=key,
            model="m-test",
            endpoint="messages",
            status="ok",
            started_at=datetime(2027, 1, 10 + i, tzinfo=UTC),
            counts=TokenCounts(input=1000 * i),
        )
        for i in range(3)
    ]
    await record_all(sessions, priced, january, now=datetime(2027, 1, 20, tzinfo=UTC))
    settings = BillingSettings(spool_path=tmp_path / "s", invoice_grace_days=3)

    def service_at(when: datetime) -> BillingService:
        return BillingService(sessions=sessions, settings=settings, pricebook=priced, clock=lambda: when)

    assert tenant not in {
        v.invoice.tenant_id for v in await service_at(datetime(2027, 2, 3, tzinfo=UTC)).finalize_due_invoices()
    }
    done = await service_at(datetime(2027, 2, 4, tzinfo=UTC)).finalize_due_invoices()
    (mine,) = [v for v in done if v.invoice.tenant_id == tenant]
    assert (
        mine.invoice.status == "finalized" and mine.computation.total_cents == 1
    )  # 3,000 input tokens at $3/Mtok: $0.009
    assert not [
        v
        for v in await service_at(datetime(2027, 2, 4, tzinfo=UTC)).finalize_due_invoices()
        if v.invoice.tenant_id == tenant
    ]
