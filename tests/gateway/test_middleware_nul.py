"""NUL characters never reach PostgreSQL (a database error there): refused with a 400 up front."""

from __future__ import annotations

import httpx

from tests.gateway.harness import ADMIN_TOKEN, GatewayServer


def test_nul_in_paths_queries_and_admin_bodies_is_a_clear_400(gateway: GatewayServer) -> None:
    admin = {"Authorization": f"Bearer {ADMIN_TOKEN}"}
    base = gateway.base_url
    ok = httpx.get(f"{base}/admin/v1/tenants", params={"name": "x"}, headers=admin)
    assert ok.status_code == 200
    for response in (
        httpx.get(f"{base}/admin/v1/tenants", params={"name": "x\x00y"}, headers=admin),
        httpx.get(f"{base}/admin/v1/tenants/ten%00x", headers=admin),
        httpx.post(f"{base}/admin/v1/tenants", json={"name": "a\x00b"}, headers=admin),
    ):
        assert response.status_code == 400, response.text
        assert response.json()["error"]["type"] == "invalid_request_error"
    created = httpx.post(f"{base}/admin/v1/tenants", json={"name": "fine"}, headers=admin)
    assert created.status_code == 201
