"""Billing profiles over the admin API (the issue's fixed shape) and the CLI; the seller's from settings."""

from __future__ import annotations

from types import SimpleNamespace

import httpx
import pytest
from fastapi import FastAPI

from billing.api import admin_router
from billing.hooks import GatewayBilling
from billing.service import BillingService
from billing.settings import BillingSettings
from gateway.api.errors import install_error_handlers
from kvgate.cli import main
from tests.billing.conftest import make_tenant

GERMAN = {
    "legal_name": "Beispiel GmbH",
    "email": "rechnung@beispiel.de",
    "address": {
        "line1": "Hauptstraße 1",
        "line2": None,
        "city": "Berlin",
        "postal_code": "10115",
        "state": None,
        "country": "DE",
    },
    "tax_id": {"type": "eu_vat", "value": "DE123456789"},
    "tax": {"treatment": "standard", "rate_percent": 19, "note": None},
    "currency": "eur",
    "po_number": "PO-42",
}


@pytest.fixture
async def api(sessions, pricebook, tmp_path):
    app = FastAPI()
    install_error_handlers(app)
    app.include_router(admin_router, prefix="/admin/v1")
    service = BillingService(
        sessions=sessions, settings=BillingSettings(spool_path=tmp_path / "s"), pricebook=pricebook
    )
    app.state.gateway = SimpleNamespace(billing=GatewayBilling(service))
    async with httpx.AsyncClient(transport=httpx.ASGITransport(app=app), base_url="http://billing.test") as client:
        yield client


async def test_put_then_get_returns_the_same_profile(api, sessions):
    tenant, _ = await make_tenant(sessions)
    url = f"/admin/v1/tenants/{tenant}/billing-profile"
    before = (await api.get(url)).json()
    assert before["legal_name"].startswith("Tenant ") and before["tax"]["treatment"] == "exempt"
    r = await api.put(url, json=GERMAN)
    assert r.status_code == 200, r.text
    assert r.json() == GERMAN
    assert (await api.get(url)).json() == GERMAN
    # A PUT replaces: the reverse-charge profile drops the rate and keeps what it gives.
    reverse = GERMAN | {"tax": {"treatment": "reverse_charge", "rate_percent": None, "note": None}, "po_number": None}
    assert (await api.put(url, json=reverse)).json() == reverse
    assert (await api.get(url)).json() == reverse


async def test_minimal_body_from_the_issue_is_accepted(api, sessions):
    tenant, _ = await make_tenant(sessions)
    body = {
        "legal_name": "Acme Inc",
        "email": "ap@acme.test",
        "address": {"line1": "1 Main St", "city": "Springfield", "postal_code": "12345", "country": "US"},
        "tax_id": {"type": "us_ein", "value": "12-3456789"},
        "tax": {"treatment": "exempt", "note": "Sale for resale; certificate on file."},
    }
    r = await api.put(f"/admin/v1/tenants/{tenant}/billing-profile", json=body)
    assert r.status_code == 200, r.text
    got = r.json()
    assert got["address"]["city"] == "Springfield" and got["tax"]["note"].startswith("Sale for resale")


@pytest.mark.parametrize(
    ("tax", "param"),
    [
        ({"treatment": "standard"}, "tax.rate_percent"),
        ({"treatment": "exempt"}, "tax.note"),
        ({"treatment": "reverse_charge", "rate_percent": 19}, "tax.rate_percent"),
    ],
)
async def test_an_inconsistent_tax_block_is_a_400_naming_the_field(api, sessions, tax, param):
    tenant, _ = await make_tenant(sessions)
    r = await api.put(f"/admin/v1/tenants/{tenant}/billing-profile", json=GERMAN | {"tax": tax})
    assert r.status_code == 400, r.text
    assert param in r.json()["error"]["message"]
    assert (await api.put(f"/admin/v1/tenants/{tenant}/billing-profile", json=GERMAN)).status_code == 200


async def test_bad_fields_and_unknown_tenants_are_clear_errors(api, sessions):
    tenant, _ = await make_tenant(sessions)
    url = f"/admin/v1/tenants/{tenant}/billing-profile"
    bad_country = GERMAN | {"address": GERMAN["address"] | {"country": "Germany"}}
    assert (await api.put(url, json=bad_country)).status_code in (400, 422)
    assert (await api.put(url, json=GERMAN | {"tax": {"treatment": "zero"}})).status_code in (400, 422)
    assert (await api.put(url, json=GERMAN)).status_code == 200
    assert (await api.get("/admin/v1/tenants/ten_nobody/billing-profile")).status_code == 404
    assert (await api.put("/admin/v1/tenants/ten_nobody/billing-profile", json=GERMAN)).status_code == 404


@pytest.fixture
async def german_seller_api(sessions, pricebook, tmp_path):
    app = FastAPI()
    install_error_handlers(app)
    app.include_router(admin_router, prefix="/admin/v1")
    settings = BillingSettings(spool_path=tmp_path / "s", seller_address_country="DE")
    service = BillingService(sessions=sessions, settings=settings, pricebook=pricebook)
    app.state.gateway = SimpleNamespace(billing=GatewayBilling(service))
    async with httpx.AsyncClient(transport=httpx.ASGITransport(app=app), base_url="http://billing.test") as client:
        yield client


REVERSE = {"treatment": "reverse_charge", "rate_percent": None, "note": None}
FRENCH = GERMAN | {
    "address": GERMAN["address"] | {"city": "Paris", "postal_code": "75001", "country": "FR"},
    "tax_id": {"type": "eu_vat", "value": "FR12345678901"},
    "tax": REVERSE,
}


@pytest.mark.parametrize(
    ("body", "named"),
    [
        (GERMAN | {"tax": REVERSE}, "outside the seller's country"),  # a German buyer of a German seller
        (FRENCH | {"address": FRENCH["address"] | {"country": "US"}}, "EU member state"),
        (FRENCH | {"tax_id": None}, "VAT id"),
    ],
    ids=["same-country", "outside-eu", "no-vat-id"],
)
async def test_reverse_charge_needs_an_eu_business_buyer_abroad(german_seller_api, sessions, body, named):
    tenant, _ = await make_tenant(sessions)
    url = f"/admin/v1/tenants/{tenant}/billing-profile"
    refused = await german_seller_api.put(url, json=body)
    assert refused.status_code == 400 and named in refused.json()["error"]["message"], refused.text
    accepted = await german_seller_api.put(url, json=FRENCH)  # a French business buying from Germany
    assert accepted.status_code == 200 and accepted.json()["tax"]["treatment"] == "reverse_charge"


def test_seller_profile_comes_from_settings():
    settings = BillingSettings(
        seller_name="kvgate GmbH",
        seller_email="billing@kvgate.test",
        seller_address_line1="Torstraße 5",
        seller_address_city="Berlin",
        seller_address_postal_code="10119",
        seller_address_country="DE",
        seller_tax_id_type="eu_vat",
        seller_tax_id_value="DE999999999",
    )
    seller = settings.seller_profile()
    assert seller.legal_name == "kvgate GmbH" and seller.tax_id is not None and seller.tax_id.value == "DE999999999"
    assert seller.address is not None and seller.address.lines() == ["Torstraße 5", "10119 Berlin", "DE"]
    assert BillingSettings().seller_profile().address is None


def test_cli_sets_and_shows_a_profile(tmp_path, monkeypatch, capsys):
    import asyncio
    import json

    from kvgate.db import migrate, open_database
    from kvgate.tenancy import Tenant

    url = f"sqlite:///{tmp_path / 'cli.db'}"
    monkeypatch.setenv("KVGATE_DATABASE_URL", url)
    migrate(url)

    async def seed() -> None:
        async with open_database(url) as factory, factory() as session:
            session.add(Tenant(id="ten_cli", name="CLI Co", status="active"))
            await session.commit()

    asyncio.run(seed())
    argv = ["billing-profile", "set", "ten_cli", "--legal-name", "CLI GmbH", "--email", "a@b.de", "--line1", "Weg 1"]
    argv += ["--city", "Köln", "--postal-code", "50667", "--country", "DE", "--tax", "standard", "--tax-rate", "19"]
    assert main(argv) == 0
    capsys.readouterr()
    assert main(["billing-profile", "show", "ten_cli", "-o", "json"]) == 0
    shown = json.loads(capsys.readouterr().out)
    assert shown["legal_name"] == "CLI GmbH" and shown["tax"] == {
        "treatment": "standard",
        "rate_percent": 19,
        "note": None,
    }
    assert main(["billing-profile", "set", "ten_cli", "--legal-name", "X", "--tax", "standard"]) == 1
    assert "rate_percent" in capsys.readouterr().err
