"""The tenant invoices API (/v1/organization/invoices) for keys with "invoices:read": a tenant sees its own
invoices, lines and PDF, and another tenant's invoice is a 404 exactly like an unknown one.

The router is mounted here behind a stand-in for the gateway's scope check (which leaves the caller's
principal in request.state.principal); without a principal it refuses (fails closed).
"""

from __future__ import annotations

import io
from dataclasses import dataclass
from datetime import UTC, datetime, timedelta
from types import SimpleNamespace

import httpx
import pytest
from fastapi import Depends, FastAPI, Request
from pypdf import PdfReader

from billing.api import admin_router, tenant_invoices_router
from billing.hooks import GatewayBilling
from billing.ledger import UsageCharge
from billing.service import BillingService
from billing.settings import BillingSettings
from gateway.api.errors import install_error_handlers
from kvgate.tenancy import KEY_SCOPES, SCOPE_INVOICES_READ
from kvgate.usage import TokenCounts
from tests.billing.conftest import make_tenant


@dataclass(frozen=True)
class FakePrincipal:
    tenant_id: str
    api_key_id: str
    scopes: tuple[str, ...] = (SCOPE_INVOICES_READ,)
    requests_per_minute: int | None = None
    input_tokens_per_minute: int | None = None
    expires_at: datetime | None = None


async def as_tenant(request: Request) -> None:
    tenant = request.headers.get("x-test-tenant")
    if tenant:
        request.state.principal = FakePrincipal(tenant_id=tenant, api_key_id="key_x")


@pytest.fixture
async def api(sessions, pricebook, tmp_path):
    app = FastAPI()
    install_error_handlers(app)
    app.include_router(admin_router, prefix="/admin/v1")
    app.include_router(tenant_invoices_router, dependencies=[Depends(as_tenant)])
    service = BillingService(
        sessions=sessions, settings=BillingSettings(spool_path=tmp_path / "s"), pricebook=pricebook
    )
    app.state.gateway = SimpleNamespace(billing=GatewayBilling(service))
    async with httpx.AsyncClient(transport=httpx.ASGITransport(app=app), base_url="http://billing.test") as client:
        client.service = service  # type: ignore[attr-defined]
        yield client


async def tenant_with_invoice(api, sessions) -> tuple[str, int]:
    tenant, (key,) = await make_tenant(sessions)
    for i in range(3):
        await api.service.settle(
            UsageCharge(
                request_id=f"{tenant}-{i}",
                tenant_id=tenant,
                api_key_id=key,
                model="m-test",
                endpoint="messages",
                status="ok",
                started_at=datetime(2026, 3, 2, tzinfo=UTC) + timedelta(hours=i),
                counts=TokenCounts(input=100_000, cache_read=400_000, output=9_000),
            )
        )
    (invoice,) = (await api.get("/admin/v1/invoices", params={"tenant_id": tenant})).json()["data"]
    assert (await api.post(f"/admin/v1/invoices/{invoice['id']}/finalize")).status_code == 200
    return tenant, invoice["id"]


async def test_a_tenant_reads_its_own_invoices_and_not_anothers(api, sessions):
    assert SCOPE_INVOICES_READ in KEY_SCOPES
    a, a_invoice = await tenant_with_invoice(api, sessions)
    b, b_invoice = await tenant_with_invoice(api, sessions)
    as_a = {"x-test-tenant": a}
    listed = (await api.get("/v1/organization/invoices", headers=as_a)).json()
    assert listed["object"] == "list" and [i["id"] for i in listed["data"]] == [a_invoice]
    shown = await api.get(f"/v1/organization/invoices/{a_invoice}", headers=as_a)
    assert shown.status_code == 200 and shown.json()["number"] and len(shown.json()["lines"]) == 3
    pdf = await api.get(f"/v1/organization/invoices/{a_invoice}/pdf", headers=as_a)
    text = "".join(p.extract_text() for p in PdfReader(io.BytesIO(pdf.content)).pages)
    assert pdf.status_code == 200 and shown.json()["number"] in text
    # B's invoice is a 404 for A, as an unknown id is; B itself reads it.
    for path in (f"/v1/organization/invoices/{b_invoice}", f"/v1/organization/invoices/{b_invoice}/pdf"):
        assert (await api.get(path, headers=as_a)).status_code == 404
        assert (await api.get(path, headers={"x-test-tenant": b})).status_code == 200
    assert (await api.get("/v1/organization/invoices/999999999", headers=as_a)).status_code == 404


async def test_without_a_principal_the_router_refuses(api, sessions):
    _, invoice_id = await tenant_with_invoice(api, sessions)
    assert (await api.get("/v1/organization/invoices")).status_code == 401
    assert (await api.get(f"/v1/organization/invoices/{invoice_id}")).status_code == 401
