"""The admin API under /admin/v1, on SQLite and PostgreSQL."""

from __future__ import annotations

import hashlib
import re

import httpx
import sqlalchemy as sa

from tests.gateway.harness import GatewayServer


def test_admin_routes_need_the_admin_token(any_gateway: GatewayServer) -> None:
    base = any_gateway.base_url
    for headers in ({}, {"authorization": "Bearer wrong"}, {"authorization": "Basic dGVzdA=="}):
        response = httpx.get(f"{base}/admin/v1/tenants", headers=headers)
        assert response.status_code == 401
        assert response.json()["error"]["type"] == "authentication_error"
        assert response.headers["request-id"] == response.json()["request_id"]
    # A tenant's API key is not an admin token.
    key = any_gateway.new_key()
    assert httpx.get(f"{base}/admin/v1/tenants", headers={"authorization": f"Bearer {key.key}"}).status_code == 401
    assert any_gateway.admin.get("/admin/v1/tenants").status_code == 200


def test_tenant_and_key_lifecycle(any_gateway: GatewayServer) -> None:
    admin = any_gateway.admin
    created = admin.post("/admin/v1/tenants", json={"name": "Acme Robotics"})
    assert created.status_code == 201
    tenant = created.json()
    assert tenant["name"] == "Acme Robotics" and tenant["status"] == "active" and tenant["id"].startswith("ten_")
    assert tenant["id"] in [t["id"] for t in admin.get("/admin/v1/tenants").json()["data"]]

    made = admin.post(f"/admin/v1/tenants/{tenant['id']}/keys", json={"name": "ci", "requests_per_minute": 60})
    assert made.status_code == 201
    key = made.json()
    assert re.fullmatch(r"kvg-[A-Za-z0-9_-]{40,}", key["key"])
    assert key["prefix"] == key["key"][:12] and key["requests_per_minute"] == 60 and key["revoked_at"] is None

    listed = admin.get(f"/admin/v1/tenants/{tenant['id']}/keys").json()["data"]
    assert [k["id"] for k in listed] == [key["id"]]
    assert "key" not in listed[0] and "key_hash" not in listed[0]
    # The database keeps the hash and the prefix, never the key.
    with any_gateway.db.connect() as conn:
        row = conn.execute(sa.text("SELECT * FROM api_keys WHERE id = :i"), {"i": key["id"]}).mappings().one()
    assert row["key_hash"] == hashlib.sha256(key["key"].encode()).hexdigest()
    assert key["key"] not in [str(v) for v in row.values()]

    client = any_gateway.anthropic(key["key"])
    client.messages.create(model=any_gateway.model, max_tokens=1, messages=[{"role": "user", "content": "hi"}])
    used = admin.get(f"/admin/v1/tenants/{tenant['id']}/keys").json()["data"][0]
    assert used["last_used_at"] is not None

    revoked = admin.post(f"/admin/v1/keys/{key['id']}/revoke")
    assert revoked.status_code == 200 and revoked.json()["revoked_at"] is not None
    suspended = admin.post(f"/admin/v1/tenants/{tenant['id']}/suspend")
    assert suspended.status_code == 200 and suspended.json()["status"] == "suspended"
    assert admin.post(f"/admin/v1/tenants/{tenant['id']}/activate").json()["status"] == "active"


def test_admin_errors(any_gateway: GatewayServer) -> None:
    admin = any_gateway.admin
    for method, path in (
        ("POST", "/admin/v1/tenants/ten_nope/suspend"),
        ("POST", "/admin/v1/tenants/ten_nope/keys"),
        ("GET", "/admin/v1/tenants/ten_nope/keys"),
        ("POST", "/admin/v1/keys/key_nope/revoke"),
    ):
        response = admin.request(method, path, json={"name": "x"} if method == "POST" else None)
        assert response.status_code == 404, path
        assert response.json()["error"]["type"] == "not_found_error"
    for bad in ({}, {"name": ""}, {"name": "x" * 201}, {"name": "x", "extra": 1}):
        response = admin.post("/admin/v1/tenants", json=bad)
        assert response.status_code == 400 and response.json()["error"]["type"] == "invalid_request_error"
    tenant = any_gateway.new_tenant()
    naive = admin.post(f"/admin/v1/tenants/{tenant}/keys", json={"name": "k", "expires_at": "2030-01-01T00:00:00"})
    assert naive.status_code == 400  # expiry must say its timezone


def test_usage_records_land_in_the_database(any_gateway: GatewayServer) -> None:
    key = any_gateway.new_key()
    raw = any_gateway.openai(key).chat.completions.with_raw_response.create(
        model=any_gateway.model, max_tokens=2, messages=[{"role": "user", "content": "hello"}]
    )
    completion = raw.parse()
    row = any_gateway.usage_record(raw.headers["request-id"])
    assert row is not None and row["endpoint"] == "chat.completions" and row["status"] == "ok"
    assert (row["backend"], row["engine_id"], row["predicted_cached_tokens"]) == ("embedded", "embedded", None)
    assert (
        row["input_tokens"] + row["cache_write_5m_tokens"] + row["cache_read_tokens"] == completion.usage.prompt_tokens
    )
    assert row["output_tokens"] == completion.usage.completion_tokens


def test_a_tenants_scheduling_weight_is_set_changed_and_bounded(any_gateway: GatewayServer) -> None:
    admin = any_gateway.admin
    assert admin.post("/admin/v1/tenants", json={"name": "plain"}).json()["scheduling_weight"] == 1
    tenant = admin.post("/admin/v1/tenants", json={"name": "premium", "scheduling_weight": 3}).json()
    assert tenant["scheduling_weight"] == 3
    changed = admin.patch(f"/admin/v1/tenants/{tenant['id']}", json={"scheduling_weight": 5})
    assert changed.status_code == 200 and changed.json()["scheduling_weight"] == 5
    assert admin.get(f"/admin/v1/tenants/{tenant['id']}").json()["scheduling_weight"] == 5
    for bad in (0, 101, "high", None):
        refused = admin.patch(f"/admin/v1/tenants/{tenant['id']}", json={"scheduling_weight": bad})
        assert refused.status_code == 400, (bad, refused.text)
    assert admin.patch("/admin/v1/tenants/ten_missing", json={"scheduling_weight": 2}).status_code == 404
    # Requests of the tenant still run with its weight.
    key = admin.post(f"/admin/v1/tenants/{tenant['id']}/keys", json={"name": "w"}).json()["key"]
    reply = any_gateway.anthropic(key).messages.create(
        model=any_gateway.model, max_tokens=2, messages=[{"role": "user", "content": "hi"}]
    )
    assert reply.usage.output_tokens >= 1


def test_wrong_admin_tokens_lock_out_their_address_and_no_other() -> None:
    from gateway.admin_attempts import FREE_FAILURES, MAX_LOCKOUT_S, AdminAttempts
    from kvgate.errors import RateLimitError

    now = [1000.0]
    attempts = AdminAttempts(clock=lambda: now[0])
    for _ in range(FREE_FAILURES):
        attempts.check("10.0.0.1")  # free guesses: no lock-out yet
        attempts.failed("10.0.0.1")
    attempts.check("10.0.0.1")
    attempts.failed("10.0.0.1")
    try:
        attempts.check("10.0.0.1")
        raise AssertionError("locked out after the free failures")
    except RateLimitError as exc:
        assert exc.headers["retry-after"] == "2"
    attempts.check("10.0.0.2")  # another address is not slowed
    now[0] += 2.5
    attempts.check("10.0.0.1")
    attempts.failed("10.0.0.1")  # each further failure doubles the wait, up to the cap
    now[0] += 3.0
    try:
        attempts.check("10.0.0.1")
        raise AssertionError("the second lock-out is longer")
    except RateLimitError:
        pass
    for _ in range(30):
        now[0] += MAX_LOCKOUT_S + 1
        attempts.failed("10.0.0.1")
    now[0] += MAX_LOCKOUT_S + 1
    attempts.check("10.0.0.1")  # capped: never locked for longer than MAX_LOCKOUT_S
    attempts.succeeded("10.0.0.1")  # a right token clears the address
    attempts.failed("10.0.0.1")
    attempts.check("10.0.0.1")


def test_the_admin_api_answers_429_after_repeated_wrong_tokens(gateway: GatewayServer) -> None:
    import time

    from gateway.admin_attempts import FREE_FAILURES

    base = gateway.base_url
    wrong = {"authorization": "Bearer a-wrong-admin-token"}
    statuses = [httpx.get(f"{base}/admin/v1/tenants", headers=wrong).status_code for _ in range(FREE_FAILURES + 1)]
    assert statuses == [401] * (FREE_FAILURES + 1)
    locked = gateway.admin.get("/admin/v1/tenants")  # even the right token waits out the lock-out
    assert locked.status_code == 429 and int(locked.headers["retry-after"]) >= 1
    assert locked.json()["error"]["type"] == "rate_limit_error"
    time.sleep(int(locked.headers["retry-after"]) + 0.2)
    assert gateway.admin.get("/admin/v1/tenants").status_code == 200  # and clears the address
    assert httpx.get(f"{base}/admin/v1/tenants", headers=wrong).status_code == 401
    assert gateway.admin.get("/admin/v1/tenants").status_code == 200


def test_a_short_configured_admin_token_is_refused() -> None:
    import pytest

    from gateway.settings import GatewaySettings

    with pytest.raises(ValueError, match="at least 16"):
        GatewaySettings(admin_token="short")
    assert GatewaySettings(admin_token="x" * 16).admin_token is not None
