"""Stripe, against localstripe: one customer per tenant, items equal to our lines, pushing again is a no-op."""

from __future__ import annotations

import random
from datetime import UTC, datetime, timedelta

import pytest
import stripe

from billing import stripe_sync
from billing.invoices import InvoiceStateError, finalize_invoice, list_invoices, view_invoice
from billing.ledger import UsageCharge
from billing.settings import BillingSettings
from billing.settlement import settle_charge
from kvgate.usage import TokenCounts
from tests.billing.conftest import make_tenant


def client_for(url: str) -> stripe.StripeClient:
    settings = BillingSettings(stripe_api_key="sk_test_kvgate", stripe_api_base=url)
    client = stripe_sync.client_from_settings(settings)
    assert client is not None
    return client


async def finalized_invoice(sessions, pricebook, *, month: int, n: int = 12) -> tuple[str, int]:
    tenant, (key,) = await make_tenant(sessions)
    rng = random.Random(month)
    async with sessions() as session:
        for i in range(n):
            started = datetime(2026, month, 1, tzinfo=UTC) + timedelta(hours=rng.randrange(600))
            counts = TokenCounts(
                input=rng.randrange(10**5),
                cache_write_5m=rng.randrange(10**5),
                cache_write_1h=rng.randrange(10**4),
                cache_read=rng.randrange(10**6),
                output=rng.randrange(10**4),
            )
            charge = UsageCharge(
                request_id=f"{tenant}-{i}",
                tenant_id=tenant,
                api_key_id=key,
                model="m-test",
                endpoint="messages",
                status="ok",
                started_at=started,
                counts=counts,
            )
            await settle_charge(
                session=session,
                charge=charge,
                version=pricebook.price_for("m-test", started),
                source="live",
                now=started,
            )
        await session.commit()
    async with sessions() as session:
        (invoice,) = await list_invoices(session=session, tenant_id=tenant)
        await finalize_invoice(
            session=session, invoice_id=invoice.id, number_prefix="STR", now=datetime(2026, month + 1, 5, tzinfo=UTC)
        )
        await session.commit()
    return tenant, invoice.id


def stripe_items(client: stripe.StripeClient, customer: str) -> list:
    return list(client.v1.invoice_items.list(params={"customer": customer, "limit": 100}).auto_paging_iter())


async def test_push_creates_customer_once_and_items_equal_lines(sessions, pricebook, localstripe_url):
    client = client_for(localstripe_url)
    tenant, invoice_id = await finalized_invoice(sessions, pricebook, month=3)
    first = await stripe_sync.push_invoice(sessions=sessions, client=client, invoice_id=invoice_id)
    async with sessions() as session:
        view = await view_invoice(session=session, invoice_id=invoice_id)
    lines = view.computation.lines
    assert first.items_created == len(lines) == 5 and first.items_existing == 0
    remote = client.v1.invoices.retrieve(first.stripe_invoice_id)
    assert remote.customer == first.stripe_customer_id and remote.status == "open"  # finalized in Stripe
    assert remote.total == view.invoice.total_cents
    by_line = {int(item.metadata["kvgate_invoice_line_id"]): item for item in remote.lines.data}
    assert sorted(item.amount for item in by_line.values()) == sorted(line.amount_cents for line in lines)
    assert all(item.metadata["kvgate_invoice_id"] == str(invoice_id) for item in remote.lines.data)
    assert view.invoice.stripe_invoice_id == first.stripe_invoice_id

    again = await stripe_sync.push_invoice(sessions=sessions, client=client, invoice_id=invoice_id)
    assert (again.items_created, again.items_existing) == (0, len(lines))
    assert (again.stripe_customer_id, again.stripe_invoice_id) == (first.stripe_customer_id, first.stripe_invoice_id)
    customers = [
        c
        for c in client.v1.customers.list(params={"limit": 100}).auto_paging_iter()
        if c.metadata.to_dict().get("kvgate_tenant_id") == tenant
    ]
    assert len(customers) == 1
    invoices = list(client.v1.invoices.list(params={"customer": first.stripe_customer_id}).auto_paging_iter())
    assert [i.id for i in invoices] == [first.stripe_invoice_id]

    # The tenant's next invoice goes to the same customer.
    async with sessions() as session:
        assert len(await list_invoices(session=session, tenant_id=tenant)) == 1


async def test_interrupted_push_resumes_without_duplicates(sessions, pricebook, localstripe_url, monkeypatch):
    client = client_for(localstripe_url)
    _, invoice_id = await finalized_invoice(sessions, pricebook, month=4)
    real_record = stripe_sync._record_item
    calls = 0

    async def crash_after_second_item(*args, **kwargs):
        nonlocal calls
        calls += 1
        if calls == 3:  # the third item exists in Stripe, but we die before recording it
            raise ConnectionError("crashed")
        await real_record(*args, **kwargs)

    monkeypatch.setattr(stripe_sync, "_record_item", crash_after_second_item)
    with pytest.raises(ConnectionError):
        await stripe_sync.push_invoice(sessions=sessions, client=client, invoice_id=invoice_id)
    monkeypatch.setattr(stripe_sync, "_record_item", real_record)
    result = await stripe_sync.push_invoice(sessions=sessions, client=client, invoice_id=invoice_id)
    assert (result.items_created, result.items_existing) == (2, 3)
    remote = client.v1.invoices.retrieve(result.stripe_invoice_id)
    async with sessions() as session:
        view = await view_invoice(session=session, invoice_id=invoice_id)
    assert len(remote.lines.data) == len(view.computation.lines) and remote.total == view.invoice.total_cents


async def test_drafts_are_not_pushed(sessions, pricebook, localstripe_url):
    tenant, (key,) = await make_tenant(sessions)
    now = datetime(2026, 5, 2, tzinfo=UTC)
    async with sessions() as session:
        charge = UsageCharge(
            request_id=f"{tenant}-d",
            tenant_id=tenant,
            api_key_id=key,
            model="m-test",
            endpoint="messages",
            status="ok",
            started_at=now,
            counts=TokenCounts(input=5),
        )
        await settle_charge(
            session=session, charge=charge, version=pricebook.price_for("m-test", now), source="live", now=now
        )
        await session.commit()
        (invoice,) = await list_invoices(session=session, tenant_id=tenant)
    with pytest.raises(InvoiceStateError, match="draft"):
        await stripe_sync.push_invoice(sessions=sessions, client=client_for(localstripe_url), invoice_id=invoice.id)


def test_no_client_without_an_api_key():
    assert stripe_sync.client_from_settings(BillingSettings(stripe_api_key=None)) is None
