"""Billing's admin API and Stripe webhook over HTTP (ASGI): right answers, clear errors, never a 500."""

from __future__ import annotations

import csv
import hashlib
import hmac
import io
import json
import time
import uuid
from datetime import UTC, datetime, timedelta
from decimal import Decimal
from types import SimpleNamespace

import httpx
import pytest
import stripe
from fastapi import FastAPI
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st
from pypdf import PdfReader
from sqlalchemy import func, select

from billing.api import admin_router, public_router
from billing.hooks import GatewayBilling
from billing.ledger import UsageCharge
from billing.models import WebhookEvent
from billing.service import BillingService
from billing.settings import BillingSettings
from gateway.api.errors import install_error_handlers
from kvgate.usage import TokenCounts
from tests.billing.conftest import make_tenant

SECRET = "whsec_kvgate_test"
MARCH = datetime(2026, 3, 1, tzinfo=UTC)


@pytest.fixture
async def api(sessions, pricebook, tmp_path):
    app = FastAPI()
    install_error_handlers(app)
    app.include_router(admin_router, prefix="/admin/v1")
    app.include_router(public_router)
    settings = BillingSettings(spool_path=tmp_path / "spool.jsonl", stripe_webhook_secret=SECRET)
    service = BillingService(sessions=sessions, settings=settings, pricebook=pricebook)
    app.state.gateway = SimpleNamespace(billing=GatewayBilling(service))
    async with httpx.AsyncClient(transport=httpx.ASGITransport(app=app), base_url="http://billing.test") as client:
        client.service = service  # type: ignore[attr-defined]
        yield client


async def seed_usage(api, sessions, n=20):
    tenant, keys = await make_tenant(sessions, keys=2)
    charges = []
    for i in range(n):
        charge = UsageCharge(
            request_id=f"{tenant}-{i}",
            tenant_id=tenant,
            api_key_id=keys[i % 2],
            model="m-test" if i % 3 else "other",
            endpoint="messages",
            status="ok",
            started_at=MARCH + timedelta(days=i % 10, hours=i),
            counts=TokenCounts(input=100 + i, cache_write_5m=1000, cache_read=5000 * i, output=10 + i),
        )
        charges.append(charge)
        await api.service.settle(charge)
    return tenant, keys, charges


def sign(payload: bytes, secret: str = SECRET, ts: int | None = None) -> str:
    ts = ts or int(time.time())
    digest = hmac.new(secret.encode(), f"{ts}.".encode() + payload, hashlib.sha256).hexdigest()
    return f"t={ts},v1={digest}"


async def test_usage_list_filters_and_pages(api, sessions):
    tenant, keys, charges = await seed_usage(api, sessions)
    r = await api.get("/admin/v1/usage", params={"tenant_id": tenant})
    assert r.status_code == 200 and len(r.json()["data"]) == 20
    r = await api.get("/admin/v1/usage", params={"tenant_id": tenant, "api_key_id": keys[0], "model": "m-test"})
    assert {row["api_key_id"] for row in r.json()["data"]} == {keys[0]}
    assert len(r.json()["data"]) == sum(1 for i in range(20) if i % 2 == 0 and i % 3)
    window = {"tenant_id": tenant, "start": "2026-03-02T00:00:00Z", "end": "2026-03-03T00:00:00+00:00"}
    r = await api.get("/admin/v1/usage", params=window)
    assert sorted(row["request_id"] for row in r.json()["data"]) == sorted(
        c.request_id
        for c in charges
        if datetime(2026, 3, 2, tzinfo=UTC) <= c.started_at < datetime(2026, 3, 3, tzinfo=UTC)
    )
    first = await api.get("/admin/v1/usage", params={"tenant_id": tenant, "limit": 7})
    rest = await api.get("/admin/v1/usage", params={"tenant_id": tenant, "after_id": first.json()["next_after_id"]})
    ids = [row["request_id"] for row in first.json()["data"] + rest.json()["data"]]
    assert len(ids) == len(set(ids)) == 20


async def test_summaries_and_csv_add_up(api, sessions, pricebook):
    tenant, _, charges = await seed_usage(api, sessions)
    expected = sum(pricebook.price_for(c.model, c.started_at).cost_pico(c.counts) for c in charges)
    for group_by, n_groups in (("day", 10), ("model", 2), ("key", 2)):
        r = await api.get("/admin/v1/usage/summary", params={"tenant_id": tenant, "group_by": group_by})
        assert r.status_code == 200, r.text
        data = r.json()["data"]
        assert len(data) == n_groups and sum(row["requests"] for row in data) == 20
        assert sum(Decimal(row["cost_usd"]) for row in data) == Decimal(expected).scaleb(-12)
        assert sum(row["cache_read_tokens"] for row in data) == sum(c.counts.cache_read for c in charges)
    day = (await api.get("/admin/v1/usage/summary", params={"tenant_id": tenant, "group_by": "day"})).json()["data"]
    assert day[0]["day"] == "2026-03-01" and day[0]["model"] is None
    r = await api.get("/admin/v1/usage/export.csv", params={"tenant_id": tenant})
    assert r.status_code == 200 and r.headers["content-type"].startswith("text/csv")
    rows = list(csv.DictReader(io.StringIO(r.text)))
    assert len(rows) == 20 and sum(Decimal(row["cost_usd"]) for row in rows) == Decimal(expected).scaleb(-12)


async def test_invoice_routes(api, sessions):
    tenant, _, _ = await seed_usage(api, sessions)
    listed = (await api.get("/admin/v1/invoices", params={"tenant_id": tenant})).json()["data"]
    assert len(listed) == 1 and listed[0]["status"] == "draft" and listed[0]["lines"] is None
    invoice_id = listed[0]["id"]
    shown = (await api.get(f"/admin/v1/invoices/{invoice_id}")).json()
    assert Decimal(shown["total_usd"]) == sum(Decimal(line["amount_usd"]) for line in shown["lines"])
    draft_pdf = await api.get(f"/admin/v1/invoices/{invoice_id}/pdf")
    draft_text = "".join(p.extract_text() for p in PdfReader(io.BytesIO(draft_pdf.content)).pages)
    assert draft_pdf.status_code == 200 and "DRAFT" in draft_text
    # March 2026 is over (the test clock is the real one), so it can be finalized now.
    r = await api.post(f"/admin/v1/invoices/{invoice_id}/finalize")
    assert r.status_code == 200 and r.json()["number"].startswith("KVG-")
    assert r.json()["due_on"] is not None
    r = await api.post(f"/admin/v1/invoices/{invoice_id}/finalize")
    assert r.status_code == 409 and r.json()["error"]["type"] == "conflict_error"
    pdf = await api.get(f"/admin/v1/invoices/{invoice_id}/pdf")
    text = " ".join(" ".join(p.extract_text() for p in PdfReader(io.BytesIO(pdf.content)).pages).split())
    total = Decimal(shown["total_usd"])
    assert pdf.headers["content-type"] == "application/pdf" and f"Total ${total:,.2f}" in text
    assert "DRAFT" not in text
    html = await api.get(f"/admin/v1/invoices/{invoice_id}/html")
    assert f"${total:,.2f}" in html.text
    r = await api.post(f"/admin/v1/invoices/{invoice_id}/credit-notes", json={"amount_usd": "0.01", "reason": "sorry"})
    assert r.status_code == 201 and r.json()["number"].startswith("KVG-CN-")
    r = await api.post(f"/admin/v1/invoices/{invoice_id}/credit-notes", json={"amount_usd": "1000000", "reason": "x"})
    assert r.status_code == 400 and "left to credit" in r.json()["error"]["message"]
    r = await api.get("/admin/v1/credit-notes", params={"tenant_id": tenant})
    assert len(r.json()["data"]) == 1
    shown = (await api.get(f"/admin/v1/invoices/{invoice_id}")).json()
    assert Decimal(shown["amount_due_usd"]) == total - Decimal("0.01")


async def test_running_month_cannot_be_finalized_or_credited(api, sessions):
    tenant, (key,) = await make_tenant(sessions)
    now = datetime.now(UTC)
    await api.service.settle(
        UsageCharge(
            request_id=f"{tenant}-now",
            tenant_id=tenant,
            api_key_id=key,
            model="m-test",
            endpoint="messages",
            status="ok",
            started_at=now,
            counts=TokenCounts(input=9),
        )
    )
    (invoice,) = (await api.get("/admin/v1/invoices", params={"tenant_id": tenant})).json()["data"]
    r = await api.post(f"/admin/v1/invoices/{invoice['id']}/finalize")
    assert r.status_code == 409 and "runs until" in r.json()["error"]["message"]
    r = await api.post(f"/admin/v1/invoices/{invoice['id']}/credit-notes", json={"amount_usd": "1", "reason": "x"})
    assert r.status_code == 409


async def test_budget_credit_price_and_reversal_routes(api, sessions):
    tenant, keys, charges = await seed_usage(api, sessions, n=3)
    r = await api.put(f"/admin/v1/tenants/{tenant}/budget", json={"monthly_limit_usd": "12.50", "prepaid": False})
    assert r.status_code == 200 and r.json()["monthly_limit_usd"] == "12.5"
    assert (await api.get(f"/admin/v1/tenants/{tenant}/budget")).json()["month"]["limit_usd"] == "12.5"
    r = await api.put(f"/admin/v1/keys/{keys[0]}/budget", json={"monthly_limit_usd": "1"})
    assert r.status_code == 200 and r.json()["tenant_id"] == tenant
    body = {"amount_usd": "5", "note": "top-up", "idempotency_key": f"k-{tenant}"}
    assert (await api.post(f"/admin/v1/tenants/{tenant}/credits", json=body)).status_code == 201
    assert (await api.post(f"/admin/v1/tenants/{tenant}/credits", json=body)).status_code == 200
    assert (await api.get(f"/admin/v1/tenants/{tenant}/budget")).json()["credit_granted_usd"] == "5"
    price = {
        "model": f"p-{tenant}",
        "effective_from": "2026-06-01T00:00:00Z",
        "input_usd_per_mtok": 0.3,
        "output_usd_per_mtok": "1.2",
    }
    r = await api.post("/admin/v1/prices", json=price)
    assert r.status_code == 201 and r.json()["input_usd_per_mtok"] == "0.30"
    assert (await api.post("/admin/v1/prices", json=price)).status_code == 409
    assert api.service.price_for(f"p-{tenant}", datetime(2026, 7, 1, tzinfo=UTC)).id == r.json()["id"]
    r = await api.post("/admin/v1/prices", json={**price, "input_usd_per_mtok": "0.00001"})
    assert r.status_code == 400 and "pico-dollar" in r.json()["error"]["message"]
    r = await api.post(f"/admin/v1/usage/{charges[0].request_id}/reverse", json={"reason": "refund"})
    assert r.status_code == 200 and r.json()["created"] and r.json()["cost_usd"].startswith("-")
    r = await api.post(f"/admin/v1/usage/{charges[0].request_id}/reverse", json={"reason": "refund"})
    assert r.status_code == 200 and not r.json()["created"]


@pytest.mark.parametrize(
    ("method", "path", "params", "body", "status"),
    [
        ("get", "/admin/v1/usage", {"start": "2026-03-01T00:00:00"}, None, 400),  # no time zone
        ("get", "/admin/v1/usage", {"start": "yesterday"}, None, 400),
        ("get", "/admin/v1/usage", {"start": "2026-03-02T00:00:00Z", "end": "2026-03-01T00:00:00Z"}, None, 400),
        ("get", "/admin/v1/usage", {"limit": 0}, None, 400),
        ("get", "/admin/v1/usage/summary", {"group_by": "week"}, None, 400),
        ("get", "/admin/v1/invoices", {"month": "2026-13"}, None, 400),
        ("get", "/admin/v1/invoices/abc", None, None, 400),
        ("get", "/admin/v1/invoices/999999999", None, None, 404),
        ("get", "/admin/v1/invoices/999999999/pdf", None, None, 404),
        ("post", "/admin/v1/invoices/999999999/finalize", None, None, 404),
        ("get", "/admin/v1/tenants/nope/budget", None, None, 404),
        ("put", "/admin/v1/tenants/nope/budget", None, {"monthly_limit_usd": "1"}, 404),
        ("put", "/admin/v1/keys/nope/budget", None, {"monthly_limit_usd": "1"}, 404),
        ("post", "/admin/v1/usage/nope/reverse", None, {"reason": "x"}, 404),
        ("post", "/admin/v1/prices", None, {"model": "x"}, 400),
        (
            "post",
            "/admin/v1/prices",
            None,
            {"model": "x", "effective_from": "2026-01-01T00:00:00", "input_usd_per_mtok": 1, "output_usd_per_mtok": 1},
            400,
        ),
        ("post", "/admin/v1/invoices/1/credit-notes", None, {"amount_usd": "ten", "reason": "x"}, 400),
        ("post", "/admin/v1/invoices/1/stripe", None, None, 400),  # Stripe not configured: not retryable
    ],
)
async def test_bad_input_gets_a_clear_error(api, method, path, params, body, status):
    r = await api.request(method, path, params=params, json=body)
    assert r.status_code == status, r.text
    assert r.json()["type"] == "error" and r.json()["error"]["message"]


async def test_bad_money_in_budgets_is_refused(api, sessions):
    tenant, _ = await make_tenant(sessions)
    for bad in ("-1", "1.0000000000001", "1e3", ""):
        r = await api.put(f"/admin/v1/tenants/{tenant}/budget", json={"monthly_limit_usd": bad})
        assert r.status_code == 400, (bad, r.text)
    assert (
        await api.put(f"/admin/v1/tenants/{tenant}/budget", json={"monthly_limit_usd": "0.000001"})
    ).status_code == 200


@settings(max_examples=60, deadline=None, suppress_health_check=list(HealthCheck))
@given(
    path=st.sampled_from(
        [
            "/admin/v1/usage",
            "/admin/v1/usage/summary",
            "/admin/v1/invoices",
            "/admin/v1/credit-notes",
            "/admin/v1/usage/export.csv",
            "/admin/v1/prices",
        ]
    ),
    params=st.dictionaries(
        st.sampled_from(
            [
                "tenant_id",
                "api_key_id",
                "model",
                "start",
                "end",
                "limit",
                "after_id",
                "group_by",
                "month",
                "status",
                "offset",
                "invoice_id",
            ]
        ),
        st.one_of(
            st.text(max_size=50),
            st.integers(-(2**70), 2**70).map(str),
            st.datetimes(timezones=st.just(UTC)).map(lambda d: d.isoformat()),
        ),
        max_size=5,
    ),
)
async def test_fuzzed_queries_never_500(api, path, params):
    r = await api.get(path, params=params)
    assert r.status_code < 500, r.text


async def test_webhook_signature_and_exactly_once(api, sessions):
    tenant, _, _ = await seed_usage(api, sessions, n=2)
    (invoice,) = (await api.get("/admin/v1/invoices", params={"tenant_id": tenant})).json()["data"]
    await api.post(f"/admin/v1/invoices/{invoice['id']}/finalize")
    event = {
        "id": f"evt_{tenant}",
        "type": "invoice.payment_succeeded",
        "object": "event",
        "data": {"object": {"id": "in_x", "object": "invoice", "metadata": {"kvgate_invoice_id": str(invoice["id"])}}},
    }
    payload = json.dumps(event).encode()

    async def stored() -> int:
        async with sessions() as session:
            return await session.scalar(select(func.count()).where(WebhookEvent.event_id == f"evt_{tenant}"))

    for bad in (sign(payload, secret="whsec_wrong"), sign(payload, ts=int(time.time()) - 3600), "", "t=1,v1=00"):
        r = await api.post("/webhooks/stripe", content=payload, headers={"stripe-signature": bad})
        assert r.status_code == 400 and "signature" in r.json()["error"]["message"]
    tampered = payload.replace(b"payment_succeeded", b"payment_failed")
    r = await api.post("/webhooks/stripe", content=tampered, headers={"stripe-signature": sign(payload)})
    assert r.status_code == 400
    assert await stored() == 0
    assert (await api.get(f"/admin/v1/invoices/{invoice['id']}")).json()["status"] == "finalized"

    r = await api.post("/webhooks/stripe", content=payload, headers={"stripe-signature": sign(payload)})
    assert r.status_code == 200 and r.json()["outcome"] == f"invoice {invoice['id']} paid"
    assert (await api.get(f"/admin/v1/invoices/{invoice['id']}")).json()["status"] == "paid"
    r = await api.post("/webhooks/stripe", content=payload, headers={"stripe-signature": sign(payload)})
    assert r.json()["outcome"] == "duplicate" and await stored() == 1

    failed = {**event, "id": f"evt2_{tenant}", "type": "invoice.payment_failed"}
    body = json.dumps(failed).encode()
    r = await api.post("/webhooks/stripe", content=body, headers={"stripe-signature": sign(body)})
    assert r.json()["outcome"] == f"invoice {invoice['id']} paid"  # a late failure does not unpay


async def test_webhook_marks_failed_payments(api, sessions):
    tenant, _, _ = await seed_usage(api, sessions, n=2)
    (invoice,) = (await api.get("/admin/v1/invoices", params={"tenant_id": tenant})).json()["data"]
    await api.post(f"/admin/v1/invoices/{invoice['id']}/finalize")
    event = {
        "id": f"evt_f_{tenant}",
        "type": "invoice.payment_failed",
        "data": {"object": {"id": "in_y", "metadata": {"kvgate_invoice_id": str(invoice["id"])}}},
    }
    body = json.dumps(event).encode()
    r = await api.post("/webhooks/stripe", content=body, headers={"stripe-signature": sign(body)})
    assert r.status_code == 200
    assert (await api.get(f"/admin/v1/invoices/{invoice['id']}")).json()["status"] == "payment_failed"
    ignored = json.dumps({"id": f"evt_i_{tenant}", "type": "customer.created", "data": {"object": {}}}).encode()
    r = await api.post("/webhooks/stripe", content=ignored, headers={"stripe-signature": sign(ignored)})
    assert r.json()["outcome"] == "ignored"


async def test_webhook_voids_an_invoice_and_a_void_invoice_stays_void(api, sessions):
    tenant, _, _ = await seed_usage(api, sessions, n=2)
    (invoice,) = (await api.get("/admin/v1/invoices", params={"tenant_id": tenant})).json()["data"]
    await api.post(f"/admin/v1/invoices/{invoice['id']}/finalize")
    obj = {"id": "in_v", "metadata": {"kvgate_invoice_id": str(invoice["id"])}}
    for n, kind in enumerate(("invoice.voided", "invoice.paid")):
        body = json.dumps({"id": f"evt_v{n}_{tenant}", "type": kind, "data": {"object": obj}}).encode()
        r = await api.post("/webhooks/stripe", content=body, headers={"stripe-signature": sign(body)})
        assert r.status_code == 200 and r.json()["outcome"] == f"invoice {invoice['id']} void"
    assert (await api.get(f"/admin/v1/invoices/{invoice['id']}")).json()["status"] == "void"
    listed = (await api.get("/admin/v1/invoices", params={"tenant_id": tenant, "status": "void"})).json()["data"]
    assert [i["id"] for i in listed] == [invoice["id"]]


json_values = st.recursive(
    st.none()
    | st.booleans()
    | st.integers(-(2**80), 2**80)
    | st.floats(allow_nan=False, allow_infinity=False)
    | st.text(max_size=30),
    lambda inner: st.lists(inner, max_size=3) | st.dictionaries(st.text(max_size=10), inner, max_size=3),
    max_leaves=6,
)


@settings(max_examples=80, deadline=None, suppress_health_check=list(HealthCheck))
@given(
    target=st.sampled_from(
        [
            ("get", "/admin/v1/invoices/{}"),
            ("get", "/admin/v1/invoices/{}/pdf"),
            ("post", "/admin/v1/invoices/{}/finalize"),
            ("post", "/admin/v1/invoices/{}/credit-notes"),
            ("put", "/admin/v1/tenants/{}/budget"),
            ("put", "/admin/v1/keys/{}/budget"),
            ("post", "/admin/v1/tenants/{}/credits"),
            ("post", "/admin/v1/prices"),
            ("post", "/admin/v1/usage/{}/reverse"),
        ]
    ),
    ident=st.one_of(
        st.integers(-(2**70), 2**70).map(str), st.text(alphabet="abc_-0123456789", min_size=1, max_size=20)
    ),
    body=st.one_of(
        json_values,
        st.fixed_dictionaries(
            {},
            optional={
                "amount_usd": json_values,
                "reason": json_values,
                "monthly_limit_usd": json_values,
                "prepaid": json_values,
                "model": json_values,
                "effective_from": json_values,
                "input_usd_per_mtok": json_values,
                "output_usd_per_mtok": json_values,
                "note": json_values,
                "idempotency_key": json_values,
            },
        ),
    ),
)
async def test_fuzzed_ids_and_bodies_never_500(api, target, ident, body):
    method, path = target
    r = await api.request(method, path.format(ident), json=body)
    assert r.status_code < 500, r.text


# -- money the database cannot hold (64-bit pico-dollars top out at $9,223,372.04) -----------------


async def test_credit_grants_and_limits_beyond_what_the_database_holds_are_400s_naming_the_field(api, sessions):
    tenant, (key,) = await make_tenant(sessions)
    credits = f"/admin/v1/tenants/{tenant}/credits"
    for amount in ("9200000", "9223372.036854775808", "9000000.000000000001", "999999999999"):
        r = await api.post(credits, json={"amount_usd": amount})
        assert r.status_code == 400, (amount, r.text)
        assert r.json()["error"]["message"].startswith("amount_usd: "), r.text
    r = await api.post(credits, json={"amount_usd": "9000000"})  # the largest amount kvgate stores
    assert r.status_code == 201 and r.json()["amount_usd"] == "9000000", r.text
    r = await api.post(credits, json={"amount_usd": "0.01"})  # the tenant's total would pass it
    assert r.status_code == 400 and r.json()["error"]["message"].startswith("amount_usd: "), r.text
    assert (await api.get(f"/admin/v1/tenants/{tenant}/budget")).json()["credit_granted_usd"] == "9000000"
    for path in (f"/admin/v1/tenants/{tenant}/budget", f"/admin/v1/keys/{key}/budget"):
        r = await api.put(path, json={"monthly_limit_usd": "9200000"})
        assert r.status_code == 400 and r.json()["error"]["message"].startswith("monthly_limit_usd: "), r.text
        assert (await api.put(path, json={"monthly_limit_usd": "9000000"})).status_code == 200
    # A limit at the cap still admits requests: the check cannot overflow.
    r = await api.put(f"/admin/v1/tenants/{tenant}/budget", json={"monthly_limit_usd": "9000000", "prepaid": True})
    assert r.status_code == 200, r.text
    reservation = await api.service.admit(
        request_id=f"{tenant}-big",
        tenant_id=tenant,
        api_key_id=key,
        model="m-test",
        prompt_tokens=10**6,
        max_output_tokens=10**6,
    )
    assert reservation is not None
    # Prices are bounded the same way (a cost must fit the ledger's 64-bit column).
    price = {"model": f"p-{tenant}", "effective_from": "2026-01-01T00:00:00Z", "output_usd_per_mtok": "1"}
    for bad in ("1e30", "10000.0001", "NaN", "-1"):
        r = await api.post("/admin/v1/prices", json={**price, "input_usd_per_mtok": bad})
        assert r.status_code == 400, (bad, r.text)


# -- signed Stripe webhooks with odd payloads ---------------------------------------------------------


def stripe_signed(payload: bytes) -> dict[str, str]:
    """Signed as Stripe signs: the stripe library's own helper."""
    return {"stripe-signature": stripe.WebhookSignature.generate_signature_header(payload.decode(), SECRET)}


@pytest.mark.parametrize(
    ("payload", "status"),
    [
        (b"[]", 400),
        (b'"evt"', 400),
        (b"null", 400),
        (b"{}", 400),
        (b'{"id": "evt_1"}', 400),
        (b'{"type": "invoice.paid"}', 400),
        (b'{"id": 12, "type": "invoice.paid"}', 400),
        (b'{"id": "evt_x", "type": ["invoice.paid"]}', 400),
        (b'{"id": "evt_\\u0000", "type": "invoice.paid"}', 400),
        (b'{"id": "evt_\\ud800", "type": "invoice.paid"}', 400),
        (b'{"id": "' + b"e" * 10_000 + b'", "type": "invoice.paid"}', 400),
        (b'{"id": "evt_y", "type": "invoice.paid\\u0000"}', 400),
        (b"[" * 100_000 + b"]" * 100_000, 400),
        (b'{"id": "evt_big", "type": "invoice.paid", "n": ' + b"9" * 5000 + b"}", 400),
        (b"not json", 400),
    ],
    ids=lambda v: v.decode()[:40] if isinstance(v, bytes) else str(v),
)
async def test_signed_webhooks_that_are_not_stripe_events_are_400s(api, payload, status):
    r = await api.post("/webhooks/stripe", content=payload, headers=stripe_signed(payload))
    assert r.status_code == status, r.text
    assert r.json()["type"] == "error"


@pytest.mark.parametrize(
    "obj",
    [
        None,
        [],
        "in_1",
        {"id": 5},
        {"id": "in_\u0000"},
        {"id": "in_\ud800"},
        {"id": "in_" + "x" * 5000},
        {"metadata": []},
        {"metadata": {"kvgate_invoice_id": "²"}},
        {"metadata": {"kvgate_invoice_id": "9" * 40}},
        {"metadata": {"kvgate_invoice_id": 7}},
        {"metadata": {"kvgate_invoice_id": "-1"}},
        {"metadata": {"kvgate_invoice_id": "1\u0000"}},
    ],
)
async def test_signed_invoice_events_with_unexpected_objects_are_acknowledged_not_500s(api, obj):
    event = {"id": f"evt_odd_{uuid.uuid4().hex}", "type": "invoice.paid", "data": {"object": obj}}
    payload = json.dumps(event).encode()
    r = await api.post("/webhooks/stripe", content=payload, headers=stripe_signed(payload))
    assert r.status_code == 200, r.text
    assert r.json()["outcome"] in ("unknown invoice", "ignored: no invoice object")
    again = await api.post("/webhooks/stripe", content=payload, headers=stripe_signed(payload))
    assert again.json()["outcome"] == "duplicate"  # stored once, like any event


@settings(max_examples=60, deadline=None, suppress_health_check=list(HealthCheck))
@given(
    event=st.one_of(
        json_values,
        st.fixed_dictionaries(
            {},
            optional={
                "id": st.one_of(json_values, st.text(max_size=300)),
                "type": st.one_of(st.sampled_from(["invoice.paid", "invoice.payment_failed"]), json_values),
                "data": st.one_of(
                    json_values,
                    st.fixed_dictionaries(
                        {},
                        optional={
                            "object": st.one_of(
                                json_values,
                                st.fixed_dictionaries(
                                    {},
                                    optional={
                                        "id": json_values,
                                        "metadata": json_values
                                        | st.dictionaries(
                                            st.just("kvgate_invoice_id"), json_values | st.text(max_size=25)
                                        ),
                                    },
                                ),
                            )
                        },
                    ),
                ),
            },
        ),
    )
)
async def test_fuzzed_signed_webhooks_never_500(api, event):
    payload = json.dumps(event).encode()
    r = await api.post("/webhooks/stripe", content=payload, headers=stripe_signed(payload))
    assert r.status_code in (200, 400), r.text


@pytest.mark.parametrize(
    "path", ["/admin/v1/usage", "/admin/v1/invoices", "/admin/v1/credit-notes", "/admin/v1/usage/summary"]
)
async def test_a_nul_in_a_text_filter_is_a_400_not_a_database_error(api, sessions, path):
    tenant, _ = await make_tenant(sessions)
    assert (await api.get(path, params={"tenant_id": tenant})).status_code == 200
    r = await api.get(path, params={"tenant_id": "\x00"})
    assert r.status_code == 400, r.text
    assert (await api.get("/admin/v1/prices", params={"model": "a\x00b"})).status_code == 400
