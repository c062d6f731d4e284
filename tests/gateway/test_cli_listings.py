"""`kvgate tenants list` and `kvgate keys list` in each output format, against the admin API's answer
for the same database: the same records under the same field names."""

from __future__ import annotations

import csv
import io
import json
import re

import pytest
from typer.testing import CliRunner, Result

from gateway.protocols.admin import KeyOut, TenantOut
from kvgate.cli import app
from tests.gateway.harness import GatewayServer


def kvgate(*argv: str) -> Result:
    result = CliRunner().invoke(app, list(argv))
    assert result.exit_code == 0, result.output
    return result


def test_listings_match_the_admin_api(gateway: GatewayServer, monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setenv("KVGATE_DATABASE_URL", gateway.database_url)
    tenant_id = re.search(r"created tenant (ten_\w+)", kvgate("tenants", "create", "Listing Co").stdout).group(1)  # type: ignore[union-attr]
    kvgate("keys", "create", tenant_id, "--name", "laptop", "--requests-per-minute", "60")
    kvgate("keys", "create", tenant_id, "--name", "ci-runner", "--scope", "usage:read")
    revoked_id = re.search(r"created key (key_\w+)", kvgate("keys", "create", tenant_id, "--name", "old").stdout).group(
        1
    )  # type: ignore[union-attr]
    kvgate("keys", "revoke", revoked_id)

    api_tenants = gateway.admin.get("/admin/v1/tenants").json()["data"]
    api_keys = gateway.admin.get(f"/admin/v1/tenants/{tenant_id}/keys").json()["data"]
    assert json.loads(kvgate("tenants", "list", "-o", "json").stdout) == api_tenants
    assert json.loads(kvgate("keys", "list", tenant_id, "--output", "json").stdout) == api_keys
    assert [key["name"] for key in api_keys] == ["laptop", "ci-runner", "old"]

    tenants_csv = list(csv.DictReader(io.StringIO(kvgate("tenants", "list", "-o", "csv").stdout)))
    assert list(tenants_csv[0]) == list(TenantOut.model_fields) == list(api_tenants[0])
    assert [row["id"] for row in tenants_csv] == [t["id"] for t in api_tenants]
    keys_csv = list(csv.DictReader(io.StringIO(kvgate("keys", "list", tenant_id, "-o", "csv").stdout)))
    assert list(keys_csv[0]) == list(KeyOut.model_fields) == list(api_keys[0])
    assert [(row["name"], row["scopes"], row["requests_per_minute"]) for row in keys_csv] == [
        ("laptop", "inference", "60"),
        ("ci-runner", "usage:read", ""),
        ("old", "inference", ""),
    ]

    tenants_table = kvgate("tenants", "list").stdout.splitlines()
    assert tenants_table[0].split() == ["id", "name", "status", "created_at"]
    assert any(line.startswith(tenant_id) and "Listing Co" in line and "active" in line for line in tenants_table)

    keys_table = kvgate("keys", "list", tenant_id).stdout.splitlines()
    assert keys_table[0].split()[:5] == ["id", "name", "prefix", "state", "scopes"]
    rows = {line.split()[1]: line for line in keys_table[2:]}
    assert set(rows) == {"laptop", "ci-runner", "old"}
    assert " active " in rows["laptop"] and " revoked " in rows["old"] and "usage:read" in rows["ci-runner"]
    # Aligned: every row is as long as the header's rule, and the rate limit is right-aligned under its header.
    rule = keys_table[1]
    assert set(rule) == {"─"} and all(len(line) <= len(rule) for line in keys_table)
    header_end = keys_table[0].index("req/min") + len("req/min")
    assert rows["laptop"][header_end - 2 : header_end] == "60"
