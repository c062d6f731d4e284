"""A tenant's budget over the admin API shows its keys' own limits and this month's spend."""

from __future__ import annotations

from datetime import UTC, datetime
from decimal import Decimal

from sqlalchemy import update

from billing.ledger import UsageCharge
from kvgate.tenancy import ApiKey
from kvgate.usage import TokenCounts
from tests.billing.conftest import make_tenant
from tests.billing.test_api import api  # noqa: F401 (the fixture)


async def test_budget_shows_each_keys_limit_and_spend(api, sessions, pricebook):  # noqa: F811
    tenant, keys = await make_tenant(sessions, keys=4)
    names = dict(zip(keys, ("limited", "open", "revoked-spent", "revoked-idle"), strict=True))
    async with sessions() as session:
        for key_id, name in names.items():
            revoked = datetime.now(UTC) if name.startswith("revoked") else None
            await session.execute(update(ApiKey).where(ApiKey.id == key_id).values(name=name, revoked_at=revoked))
        await session.commit()
    r = await api.put(f"/admin/v1/keys/{keys[0]}/budget", json={"monthly_limit_usd": "5"})
    assert r.status_code == 200, r.text
    now = datetime.now(UTC)
    cost = {}
    for i, key_id in enumerate(keys[:3]):
        counts = TokenCounts(input=1000 * (i + 1), output=100)
        await api.service.settle(
            UsageCharge(
                request_id=f"{tenant}-b{i}",
                tenant_id=tenant,
                api_key_id=key_id,
                model="m-test",
                endpoint="messages",
                status="ok",
                started_at=now,
                counts=counts,
            )
        )
        cost[key_id] = Decimal(pricebook.price_for("m-test", now).cost_pico(counts)).scaleb(-12)
    body = (await api.get(f"/admin/v1/tenants/{tenant}/budget")).json()
    shown = {k["api_key_id"]: k for k in body["keys"]}
    # The revoked key without spend this month is left out; the others are listed by name.
    assert [k["name"] for k in body["keys"]] == ["limited", "open", "revoked-spent"]
    assert shown[keys[0]]["monthly_limit_usd"] == "5" and not shown[keys[0]]["revoked"]
    assert Decimal(shown[keys[0]]["remaining_usd"]) == 5 - cost[keys[0]]
    assert shown[keys[1]]["monthly_limit_usd"] is None and shown[keys[1]]["remaining_usd"] is None
    assert shown[keys[2]]["revoked"] and keys[3] not in shown
    for key_id in keys[:3]:
        assert Decimal(shown[key_id]["spent_usd"]) == cost[key_id] > 0 and shown[key_id]["reserved_usd"] == "0"
    assert Decimal(body["month"]["spent_usd"]) == sum(cost.values())
