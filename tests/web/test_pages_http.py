"""The dashboard's forms over plain HTTP, on SQLite and PostgreSQL: CSRF on each, and id guessing.

Every refusal is paired with the same request succeeding for the right person with the right token.
"""

from __future__ import annotations

import re

import anthropic
import httpx
import pytest

from tests.web.conftest import Dashboard, csrf_token

pytestmark = pytest.mark.timeout(300)


def _works(dashboard: Dashboard, key) -> bool:
    try:
        dashboard.server.anthropic(key).messages.create(
            model=dashboard.server.model, max_tokens=1, messages=[{"role": "user", "content": "hi"}]
        )
    except anthropic.AuthenticationError:
        return False
    return True


def test_creating_a_key_needs_the_csrf_token(any_dashboard: Dashboard) -> None:
    member = any_dashboard.new_member(role="admin")
    with any_dashboard.client_for(member.login_url) as client:
        token = csrf_token(client.get("/keys").text)
        for data in ({"name": "k"}, {"name": "k", "csrf_token": "forged"}):
            refused = client.post("/keys", data=data)
            assert refused.status_code == 403 and "kvg-" not in refused.text
        assert "<td>k</td>" not in client.get("/keys").text
        created = client.post("/keys", data={"name": "k", "csrf_token": token, "scopes": "inference"})
        assert created.status_code == 201 and 'id="new-key">kvg-' in created.text
        bad = client.post("/keys", data={"name": " ", "csrf_token": token})
        assert bad.status_code == 400


def test_a_key_is_made_with_the_scopes_ticked(any_dashboard: Dashboard) -> None:
    member = any_dashboard.new_member(role="admin")
    with any_dashboard.client_for(member.login_url) as client:
        token = csrf_token(client.get("/keys").text)
        reader = client.post("/keys", data={"name": "reader", "csrf_token": token, "scopes": ["usage:read"]})
        assert reader.status_code == 201
        plaintext = re.search(r'id="new-key">(kvg-[^<]+)<', reader.text).group(1)
        usage = httpx.get(
            f"{any_dashboard.base_url}/v1/key", headers={"authorization": f"Bearer {plaintext}"}, timeout=60
        )
        assert usage.status_code == 200
        with pytest.raises(anthropic.PermissionDeniedError):  # no inference scope
            any_dashboard.server.anthropic(plaintext).messages.create(
                model=any_dashboard.server.model, max_tokens=1, messages=[{"role": "user", "content": "hi"}]
            )
        none = client.post("/keys", data={"name": "nothing", "csrf_token": token})
        assert none.status_code == 400 and "at least one scope" in none.text
        both = client.post("/keys", data={"name": "both", "csrf_token": token, "scopes": ["inference", "usage:read"]})
        assert both.status_code == 201
        assert '<td class="scopes">inference usage:read</td>' in client.get("/keys").text


def test_a_key_is_made_with_its_budget_token_limit_and_expiry(any_dashboard: Dashboard) -> None:
    member = any_dashboard.new_member(role="admin")
    limits = {"monthly_budget_usd": "2.50", "input_tokens_per_minute": "5000", "expires_in_days": "30"}
    with any_dashboard.client_for(member.login_url) as client:
        token = csrf_token(client.get("/keys").text)
        made = client.post("/keys", data={"name": "capped", "csrf_token": token, "scopes": ["inference"], **limits})
        assert made.status_code == 201, made.text
        plain = client.post("/keys", data={"name": "plain", "csrf_token": token, "scopes": ["inference"]})
        assert plain.status_code == 201
        for field, bad in (("monthly_budget_usd", "lots"), ("input_tokens_per_minute", "0"), ("expires_in_days", "-1")):
            refused = client.post("/keys", data={"name": "x", "csrf_token": token, "scopes": ["inference"], field: bad})
            assert refused.status_code == 400, field
    keys = {k["name"]: k for k in any_dashboard.admin.get(f"/admin/v1/tenants/{member.tenant_id}/keys").json()["data"]}
    assert "x" not in keys  # a refused form made no key
    capped, uncapped = keys["capped"], keys["plain"]
    assert capped["input_tokens_per_minute"] == 5000 and capped["expires_at"] is not None
    assert uncapped["input_tokens_per_minute"] is None and uncapped["expires_at"] is None
    budget = any_dashboard.admin.get(f"/admin/v1/tenants/{member.tenant_id}/budget").json()
    by_key = {k["api_key_id"]: k for k in budget["keys"]}
    assert by_key[capped["id"]]["monthly_limit_usd"] == "2.5"
    assert by_key.get(uncapped["id"], {}).get("monthly_limit_usd") is None


def test_another_tenants_key_id_in_a_revoke_form_is_not_found(any_dashboard: Dashboard) -> None:
    mine, theirs = any_dashboard.new_member(role="admin"), any_dashboard.new_member(role="admin")
    my_key = any_dashboard.new_key(mine.tenant_id, name="mine")
    their_key = any_dashboard.new_key(theirs.tenant_id, name="theirs")
    with any_dashboard.client_for(mine.login_url) as client:
        token = csrf_token(client.get("/keys").text)
        guessed = client.post(f"/keys/{their_key.key_id}/revoke", data={"csrf_token": token})
        assert guessed.status_code == 404
        assert client.post("/keys/key_does_not_exist/revoke", data={"csrf_token": token}).status_code == 404
        assert _works(any_dashboard, their_key)
        # Paired: the owner's own key, same form, same token, is revoked.
        assert client.post(f"/keys/{my_key.key_id}/revoke", data={"csrf_token": token}).status_code == 303
        assert not _works(any_dashboard, my_key)
    with any_dashboard.client_for(theirs.login_url) as owner:
        token = csrf_token(owner.get("/keys").text)
        assert owner.post(f"/keys/{their_key.key_id}/revoke").status_code == 403  # no token
        assert _works(any_dashboard, their_key)
        assert owner.post(f"/keys/{their_key.key_id}/revoke", data={"csrf_token": token}).status_code == 303
        assert not _works(any_dashboard, their_key)


def test_view_as_is_for_the_operator_with_the_csrf_token(any_dashboard: Dashboard) -> None:
    member = any_dashboard.new_member("Seen By Operator")
    with any_dashboard.operator_client() as operator:
        assert operator.get("/").status_code == 403  # no tenant chosen yet
        token = csrf_token(operator.get("/admin").text)
        assert operator.post("/admin/view-as", data={"tenant_id": member.tenant_id}).status_code == 403
        assert operator.post("/admin/view-as", data={"tenant_id": "ten_nope", "csrf_token": token}).status_code == 404
        chosen = operator.post("/admin/view-as", data={"tenant_id": member.tenant_id, "csrf_token": token})
        assert chosen.status_code == 303 and "kvgate_view_as=" in chosen.headers["set-cookie"]
        assert "Seen By Operator" in operator.get("/").text
    with any_dashboard.client_for(member.login_url) as client:
        token = csrf_token(client.get("/").text)
        other = any_dashboard.new_tenant()
        refused = client.post("/admin/view-as", data={"tenant_id": other, "csrf_token": token})
        assert refused.status_code == 403 and "kvgate_view_as" not in refused.headers.get("set-cookie", "")
        assert client.get("/admin").status_code == 403


def test_pages_set_a_strict_csp(any_dashboard: Dashboard) -> None:
    member = any_dashboard.new_member()
    with any_dashboard.client_for(member.login_url) as client:
        for path in ("/", "/keys"):
            response = client.get(path)
            assert response.status_code == 200
            csp = response.headers["content-security-policy"]
            assert "script-src 'self'" in csp and "frame-ancestors 'none'" in csp
            assert response.headers["cache-control"] == "no-store"


def test_billing_members_edit_the_billing_profile_and_viewers_cannot(any_dashboard: Dashboard) -> None:
    billing = any_dashboard.new_member(role="billing")
    viewer = any_dashboard.invite(billing.tenant_id, role="viewer")
    # The operator sets the tax (admin API); the tenant edits who the invoices are to.
    operator = {
        "legal_name": "Beispiel GmbH",
        "tax": {"treatment": "standard", "rate_percent": 19, "note": None},
        "currency": "eur",
    }
    put = any_dashboard.admin.put(f"/admin/v1/tenants/{billing.tenant_id}/billing-profile", json=operator)
    assert put.status_code == 200, put.text
    form = {
        "legal_name": "Beispiel GmbH",
        "email": "rechnung@beispiel.test",
        "line1": "Hauptstraße 1",
        "city": "Berlin",
        "postal_code": "10115",
        "country": "DE",
        "tax_id_type": "eu_vat",
        "tax_id_value": "DE123456789",
    }
    with any_dashboard.client_for(viewer.login_url) as client:
        shown = client.get("/billing-profile")
        assert shown.status_code == 200 and "disabled" in shown.text
        token = csrf_token(shown.text)
        assert client.post("/billing-profile", data={**form, "csrf_token": token}).status_code == 403
    with any_dashboard.client_for(billing.login_url) as client:
        shown = client.get("/billing-profile").text
        token = csrf_token(shown)
        assert 'name="treatment"' not in shown and 'name="rate_percent"' not in shown  # not offered
        assert "standard at 19%" in shown and "EUR" in shown  # shown, as the operator set it
        assert client.post("/billing-profile", data=form).status_code == 403  # no CSRF token
        bad = client.post("/billing-profile", data={**form, "email": "not-an-email", "csrf_token": token})
        assert bad.status_code == 400
        # A tenant setting its own tax or currency: 403, whatever the values.
        for field, value in (("treatment", "reverse_charge"), ("rate_percent", "0"), ("currency", "usd")):
            tried = client.post("/billing-profile", data={**form, field: value, "csrf_token": token})
            assert tried.status_code == 403, field
        saved = client.post("/billing-profile", data={**form, "csrf_token": token}, follow_redirects=False)
        assert saved.status_code == 303
        page = client.get("/billing-profile").text
        assert 'value="Beispiel GmbH"' in page and 'value="DE123456789"' in page
    admin_api = any_dashboard.admin.get(f"/admin/v1/tenants/{billing.tenant_id}/billing-profile").json()
    assert admin_api["tax"] == {"treatment": "standard", "rate_percent": 19, "note": None}
    assert admin_api["currency"] == "eur" and admin_api["tax_id"]["value"] == "DE123456789"
