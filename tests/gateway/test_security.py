"""API key format and hashing; per-tenant salts that a client cannot steer across tenants."""

from __future__ import annotations

import hashlib
import re

from gateway.security import (
    display_prefix,
    generate_api_key,
    hash_secret,
    looks_like_api_key,
    tenant_salt,
)


def test_api_keys_are_kvg_and_at_least_40_url_safe_random_chars() -> None:
    keys = {generate_api_key() for _ in range(200)}
    assert len(keys) == 200
    for key in keys:
        assert re.fullmatch(r"kvg-[A-Za-z0-9_-]{40,}", key), key
        assert looks_like_api_key(key)
    assert not looks_like_api_key("kvg-short")
    assert not looks_like_api_key("sk-" + "a" * 60)


def test_only_hash_and_prefix_derive_from_the_key() -> None:
    key = generate_api_key()
    assert hash_secret(key) == hashlib.sha256(key.encode()).hexdigest()
    assert display_prefix(key) == key[:12] and len(display_prefix(key)) < len(key) // 3


def test_salt_is_an_hmac_of_the_tenant_and_differs_per_tenant_and_secret() -> None:
    a = tenant_salt("secret", "ten_a")
    assert a == tenant_salt("secret", "ten_a")  # stable: the tenant's keys share the cache
    assert a != tenant_salt("secret", "ten_b")
    assert a != tenant_salt("other-secret", "ten_a")
    assert re.fullmatch(r"[0-9a-f]{64}", a)


def test_client_salt_only_partitions_inside_the_tenant() -> None:
    base = tenant_salt("s", "ten_a")
    inside = tenant_salt("s", "ten_a", "team-1")
    assert inside != base
    assert inside == tenant_salt("s", "ten_a", "team-1")
    # Naming another tenant's salt (or id) as the client value reaches nothing of theirs.
    assert tenant_salt("s", "ten_a", base) != base
    assert tenant_salt("s", "ten_a", "ten_b") != tenant_salt("s", "ten_b")
    # The separator keeps (tenant, value) pairs that concatenate alike apart.
    assert tenant_salt("s", "ten_a", "bc") != tenant_salt("s", "ten_ab", "c")


# -- what the server exposes and the files it leaves ------------------------------------------------


async def test_docs_and_schema_are_served_only_when_asked_for(monkeypatch, tmp_path) -> None:
    import httpx

    from gateway.app import create_app
    from gateway.settings import GatewaySettings

    url = f"sqlite:///{tmp_path / 'docs.db'}"
    # The routes answer without the lifespan (no engine, no database touched).
    app = create_app(GatewaySettings(database_url=url))
    async with httpx.AsyncClient(transport=httpx.ASGITransport(app=app), base_url="http://gw.test") as client:
        for path in ("/docs", "/redoc", "/openapi.json"):
            r = await client.get(path)
            assert r.status_code == 404, (path, r.text)
            assert r.json()["type"] == "error"
    assert "/v1/messages" in app.openapi()["paths"]  # the schema still exists for tests (schemathesis)

    monkeypatch.setenv("KVGATE_EXPOSE_DOCS", "1")
    app = create_app(GatewaySettings(database_url=url))
    async with httpx.AsyncClient(transport=httpx.ASGITransport(app=app), base_url="http://gw.test") as client:
        assert "/v1/messages" in (await client.get("/openapi.json")).json()["paths"]
        assert (await client.get("/docs")).status_code == 200
        assert (await client.get("/redoc")).status_code == 200
