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

    from gateway.settings import GatewaySettings
    from kvgate.app import create_app

    url = f"sqlite:///{tmp_path / 'docs.db'}"
    pages = ("/docs", "/redoc")
    # The routes answer without the lifespan (no engine, no database touched).
    app = create_app(GatewaySettings(database_url=url))
    async with httpx.AsyncClient(transport=httpx.ASGITransport(app=app), base_url="http://gw.test") as client:
        for path in (*pages, "/openapi.json", "/docs/assets/swagger-ui-bundle.js"):
            r = await client.get(path)
            assert r.status_code == 404, (path, r.text)
            assert r.json()["type"] == "error"
    assert "/v1/messages" in app.openapi()["paths"]  # the schema still exists for tests (schemathesis)

    monkeypatch.setenv("KVGATE_EXPOSE_DOCS", "1")
    app = create_app(GatewaySettings(database_url=url))
    async with httpx.AsyncClient(transport=httpx.ASGITransport(app=app), base_url="http://gw.test") as client:
        assert "/v1/messages" in (await client.get("/openapi.json")).json()["paths"]
        for page in pages:
            r = await client.get(page)
            assert r.status_code == 200 and r.headers["content-type"].startswith("text/html"), page
            # Everything the page loads is on this server: no CDN, no other host, not even for a favicon.
            assert not re.search(r"https?:|//[a-z]", r.text), (page, r.text)
            assets = re.findall(r"""(?:src|href|spec-url)=["']([^"']+)["']|url: '([^']+)'""", r.text)
            loaded = {a or b for a, b in assets}
            assert "/openapi.json" in loaded and any(a.endswith(".js") for a in loaded), (page, loaded)
            for asset in loaded:
                assert asset.startswith("/") and not asset.startswith("//"), asset
                got = await client.get(asset)
                assert got.status_code == 200 and len(got.content) > 1000, (page, asset, got.status_code)
