"""Stripe, against localstripe: one customer per tenant (with its billing profile), items equal to our lines and tax,
credit notes as Stripe credit notes, pushing again is a no-op, and Stripe's amount due always equals ours."""

from __future__ import annotations

import random
from datetime import UTC, datetime, timedelta

import pytest
import stripe

from billing import operations, stripe_sync
from billing.credit_notes import issue_credit_note
from billing.invoices import InvoiceStateError, finalize_invoice, list_invoices, view_invoice
from billing.ledger import UsageCharge
from billing.profiles import Address, BillingProfile, TaxId, TaxTreatment, set_profile
from billing.settings import BillingSettings
from billing.settlement import settle_charge
from kvgate.usage import TokenCounts
from tests.billing.conftest import make_tenant


def client_for(url: str) -> stripe.StripeClient:
    settings = BillingSettings(stripe_api_key="sk_test_kvgate", stripe_api_base=url)
    client = stripe_sync.client_from_settings(settings)
    assert client is not None
    return client


async def finalized_invoice(
    sessions, pricebook, *, month: int, n: int = 12, profile: BillingProfile | None = None
) -> tuple[str, int]:
    tenant, (key,) = await make_tenant(sessions)
    rng = random.Random(month)
    async with sessions() as session:
        if profile is not None:
            await set_profile(session=session, tenant_id=tenant, profile=profile)
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


GERMAN = BillingProfile(
    legal_name="Beispiel GmbH",
    email="rechnung@beispiel.test",
    address=Address(line1="Hauptstraße 1", city="Berlin", postal_code="10115", country="DE"),
    tax_id=TaxId(type="eu_vat", value="DE123456789"),
    tax=TaxTreatment(treatment="standard", rate_percent=19),
)


async def kvgate_due(sessions, invoice_id: int) -> int:
    async with sessions() as session:
        return (await view_invoice(session=session, invoice_id=invoice_id)).amount_due_cents


async def credit(sessions, invoice_id: int, cents: int) -> None:
    async with sessions() as session:
        await issue_credit_note(
            session=session, invoice_id=invoice_id, amount_cents=cents, reason="outage", number_prefix="STR"
        )
        await session.commit()


async def test_customer_carries_the_billing_profile_and_tax_is_an_item(sessions, pricebook, localstripe_url):
    client = client_for(localstripe_url)
    tenant, invoice_id = await finalized_invoice(sessions, pricebook, month=6, profile=GERMAN)
    result = await stripe_sync.push_invoice(sessions=sessions, client=client, invoice_id=invoice_id)
    customer = client.v1.customers.retrieve(result.stripe_customer_id)
    assert customer.name == "Beispiel GmbH" and customer.email == "rechnung@beispiel.test"
    assert customer.address.city == "Berlin" and customer.address.country == "DE"
    tax_ids = client.v1.customers.tax_ids.list(result.stripe_customer_id).data
    assert [(t.type, t.value) for t in tax_ids] == [("eu_vat", "DE123456789")]
    async with sessions() as session:
        view = await view_invoice(session=session, invoice_id=invoice_id)
    remote = client.v1.invoices.retrieve(result.stripe_invoice_id)
    assert view.tax_cents > 0 and remote.total == view.total_cents == view.subtotal_cents + view.tax_cents
    assert remote.amount_due == result.amount_due_cents == view.amount_due_cents
    # An edited profile reaches the customer on the next push; the tax ID is added, not duplicated.
    async with sessions() as session:
        new_address = Address(line1="Neue Straße 2", city="Hamburg", postal_code="20095", country="DE")
        edited = BillingProfile(
            legal_name="Beispiel AG",
            email="ap@beispiel.test",
            address=new_address,
            tax_id=GERMAN.tax_id,
            tax=GERMAN.tax,
        )
        await set_profile(session=session, tenant_id=tenant, profile=edited)
        await session.commit()
    await stripe_sync.push_invoice(sessions=sessions, client=client, invoice_id=invoice_id)
    customer = client.v1.customers.retrieve(result.stripe_customer_id)
    assert (customer.name, customer.email, customer.address.city) == ("Beispiel AG", "ap@beispiel.test", "Hamburg")
    assert len(client.v1.customers.tax_ids.list(result.stripe_customer_id).data) == 1


async def test_a_credit_note_lowers_the_stripe_amount_due(sessions, pricebook, localstripe_url):
    client = client_for(localstripe_url)
    _, invoice_id = await finalized_invoice(sessions, pricebook, month=7)
    first = await stripe_sync.push_invoice(sessions=sessions, client=client, invoice_id=invoice_id)
    before = client.v1.invoices.retrieve(first.stripe_invoice_id).amount_due
    assert before == await kvgate_due(sessions, invoice_id) > 1
    await credit(sessions, invoice_id, 1)
    assert client.v1.invoices.retrieve(first.stripe_invoice_id).amount_due == before  # not pushed yet
    again = await stripe_sync.push_invoice(sessions=sessions, client=client, invoice_id=invoice_id)
    assert again.credit_notes_created == 1
    after = client.v1.invoices.retrieve(first.stripe_invoice_id).amount_due
    assert after == before - 1 == await kvgate_due(sessions, invoice_id)
    notes = client.v1.credit_notes.list(params={"invoice": first.stripe_invoice_id}).data
    assert [(n.amount, n.metadata["kvgate_credit_note_id"] != "") for n in notes] == [(1, True)]


async def test_amount_due_agrees_after_any_sequence_of_finalize_credit_and_push(sessions, pricebook, localstripe_url):
    client = client_for(localstripe_url)
    rng = random.Random(2026)
    for month, profile in ((8, GERMAN), (9, None)):
        _, invoice_id = await finalized_invoice(sessions, pricebook, month=month, profile=profile)
        pushed = None
        for _ in range(8):
            step = rng.choice(["credit", "push", "push", "credit-push"])
            due = await kvgate_due(sessions, invoice_id)
            if step.startswith("credit") and due > 1:
                await credit(sessions, invoice_id, rng.randrange(1, max(2, due // 4)))
            if step.endswith("push") or (pushed is None and step == "push"):
                pushed = await stripe_sync.push_invoice(sessions=sessions, client=client, invoice_id=invoice_id)
                remote = client.v1.invoices.retrieve(pushed.stripe_invoice_id)
                assert remote.amount_due == pushed.amount_due_cents == await kvgate_due(sessions, invoice_id)
        final = await stripe_sync.push_invoice(sessions=sessions, client=client, invoice_id=invoice_id)
        assert final.items_created == final.credit_notes_created == 0 or pushed is None
        remote = client.v1.invoices.retrieve(final.stripe_invoice_id)
        assert remote.amount_due == await kvgate_due(sessions, invoice_id)
        async with sessions() as session:
            view = await view_invoice(session=session, invoice_id=invoice_id)
        notes = client.v1.credit_notes.list(params={"invoice": final.stripe_invoice_id, "limit": 100}).data
        assert sorted(n.amount for n in notes) == sorted(n.amount_cents for n in view.credit_notes)


async def test_auto_push_on_finalize_and_push_due_catches_up(sessions, pricebook, localstripe_url, tmp_path):
    settings = BillingSettings(
        stripe_api_key="sk_test_kvgate", stripe_api_base=localstripe_url, stripe_auto_push=True, spool_path=tmp_path
    )
    client = client_for(localstripe_url)
    # Auto push: finalizing through operations pushes at once.
    tenant, (key,) = await make_tenant(sessions)
    started = datetime(2026, 10, 3, tzinfo=UTC)
    async with sessions() as session:
        charge = UsageCharge(
            request_id=f"{tenant}-a",
            tenant_id=tenant,
            api_key_id=key,
            model="m-test",
            endpoint="messages",
            status="ok",
            started_at=started,
            counts=TokenCounts(input=200_000, output=30_000),
        )
        version = pricebook.price_for("m-test", started)
        await settle_charge(session=session, charge=charge, version=version, source="live", now=started)
        await session.commit()
        (invoice,) = await list_invoices(session=session, tenant_id=tenant)
        await operations.finalize_invoice(
            session=session, invoice_id=invoice.id, number_prefix="AUT", settings=settings
        )
    pushed = await operations.auto_push(sessions=sessions, settings=settings, invoice_id=invoice.id)
    assert pushed is not None and pushed.amount_due_cents == await kvgate_due(sessions, invoice.id)
    # Without the setting nothing is pushed.
    off = settings.model_copy(update={"stripe_auto_push": False})
    assert await operations.auto_push(sessions=sessions, settings=off, invoice_id=invoice.id) is None
    # push-due: an invoice finalized but never pushed, and a credit note issued while Stripe was not told.
    _, missed = await finalized_invoice(sessions, pricebook, month=11)
    await credit(sessions, invoice.id, 2)
    results = {r.invoice_id: r for r in await operations.push_due(sessions=sessions, settings=settings)}
    assert missed in results and invoice.id in results and results[invoice.id].credit_notes_created == 1
    for invoice_id, result in results.items():
        assert client.v1.invoices.retrieve(result.stripe_invoice_id).amount_due == await kvgate_due(
            sessions, invoice_id
        )
    assert not {missed, invoice.id} & {
        r.invoice_id for r in await operations.push_due(sessions=sessions, settings=settings)
    }
