"""Usage summaries over the admin API: several group-bys at once, key names, hit rate, savings,
and cache writes per TTL class, checked against sums computed here from the charges themselves."""

from __future__ import annotations

from collections import defaultdict
from datetime import UTC, datetime, timedelta
from decimal import Decimal

from sqlalchemy import update

from billing.ledger import UsageCharge
from kvgate.tenancy import ApiKey
from kvgate.usage import TokenCounts
from tests.billing.conftest import make_tenant
from tests.billing.test_api import api  # noqa: F401 (the fixture)

MARCH = datetime(2026, 3, 1, tzinfo=UTC)


async def seed(api, sessions):  # noqa: F811
    """Two named keys and keyless requests, on two models, with writes in three TTL classes."""
    tenant, keys = await make_tenant(sessions, keys=2)
    names = {keys[0]: "alpha", keys[1]: "beta"}
    async with sessions() as session:
        for key_id, name in names.items():
            await session.execute(update(ApiKey).where(ApiKey.id == key_id).values(name=name))
        await session.commit()
    charges = []
    for i in range(12):
        charge = UsageCharge(
            request_id=f"{tenant}-s{i}",
            tenant_id=tenant,
            api_key_id=None if i % 4 == 3 else keys[i % 2],
            model="m-test" if i % 3 else "other",
            endpoint="messages",
            status="ok",
            started_at=MARCH + timedelta(days=i % 3, hours=i),
            counts=TokenCounts(
                input=100 + i, cache_write_5m=1000, cache_write_1h=200 * i, cache_read=3000 * i, output=10 + i
            ),
        )
        charges.append(charge)
        await api.service.settle(charge)
    return tenant, names, charges


async def test_two_group_bys_at_once(api, sessions, pricebook):  # noqa: F811
    tenant, names, charges = await seed(api, sessions)
    r = await api.get(
        "/admin/v1/usage/summary", params=[("tenant_id", tenant), ("group_by", "key"), ("group_by", "model")]
    )
    assert r.status_code == 200, r.text
    body = r.json()
    assert body["group_by"] == ["model", "key"]  # canonical order, whatever order they were asked in
    expected: dict[tuple[str, str | None], list[UsageCharge]] = defaultdict(list)
    for charge in charges:
        expected[(charge.model, charge.api_key_id)].append(charge)
    got = {(row["model"], row["api_key_id"]): row for row in body["data"]}
    assert set(got) == set(expected) and len(got) == 6
    for group, members in expected.items():
        row = got[group]
        counts = sum((c.counts for c in members), TokenCounts())
        prices = [pricebook.price_for(c.model, c.started_at) for c in members]
        cost = sum(p.cost_pico(c.counts) for p, c in zip(prices, members, strict=True))
        uncached = sum(p.uncached_cost_pico(c.counts) for p, c in zip(prices, members, strict=True))
        assert row["day"] is None and row["requests"] == len(members)
        assert row["api_key_name"] == names.get(group[1])  # None for keyless requests
        assert row["cache_write_5m_tokens"] == counts.cache_write_5m == 1000 * len(members)
        assert row["cache_write_1h_tokens"] == counts.cache_write_1h
        assert row["cache_write_24h_tokens"] == 0 and row["input_tokens"] == counts.input
        assert Decimal(row["cost_usd"]) == Decimal(cost).scaleb(-12)
        assert Decimal(row["uncached_cost_usd"]) == Decimal(uncached).scaleb(-12)
        assert Decimal(row["saved_usd"]) == Decimal(uncached - cost).scaleb(-12) > 0
        assert row["hit_rate"] == round(counts.cache_read / counts.prompt_tokens, 4)
    # Three at once: every request still counted once.
    three = [("tenant_id", tenant), ("group_by", "day"), ("group_by", "model"), ("group_by", "key")]
    rows = (await api.get("/admin/v1/usage/summary", params=three)).json()["data"]
    assert sum(row["requests"] for row in rows) == 12 and all(row["day"].startswith("2026-03-0") for row in rows)
    order = [(r["day"], r["model"], r["api_key_id"] is None, r["api_key_id"] or "") for r in rows]
    assert order == sorted(order)  # by day, model, then key, keyless requests last


async def test_one_group_by_as_before(api, sessions):  # noqa: F811
    tenant, names, _ = await seed(api, sessions)
    r = await api.get("/admin/v1/usage/summary", params={"tenant_id": tenant, "group_by": "key"})
    body = r.json()
    assert r.status_code == 200 and body["group_by"] == ["key"]
    assert {(row["api_key_id"], row["api_key_name"]) for row in body["data"]} == {*names.items(), (None, None)}
    assert all(row["model"] is None and row["day"] is None for row in body["data"])
    default = (await api.get("/admin/v1/usage/summary", params={"tenant_id": tenant})).json()
    assert default["group_by"] == ["day"] and [row["day"] for row in default["data"]] == [
        "2026-03-01",
        "2026-03-02",
        "2026-03-03",
    ]


async def test_hit_rate_is_null_without_prompt_tokens(api, sessions):  # noqa: F811
    tenant, keys = await make_tenant(sessions)
    await api.service.settle(
        UsageCharge(
            request_id=f"{tenant}-empty",
            tenant_id=tenant,
            api_key_id=keys[0],
            model="m-test",
            endpoint="messages",
            status="ok",
            started_at=MARCH,
            counts=TokenCounts(output=5),
        )
    )
    (row,) = (await api.get("/admin/v1/usage/summary", params={"tenant_id": tenant})).json()["data"]
    assert row["hit_rate"] is None and row["saved_usd"] == "0" and row["output_tokens"] == 5


async def test_a_bad_group_by_is_a_400(api):  # noqa: F811
    for params in ([("group_by", "week")], [("group_by", "model"), ("group_by", "week")]):
        r = await api.get("/admin/v1/usage/summary", params=params)
        assert r.status_code == 400 and r.json()["type"] == "error", r.text
    assert (await api.get("/admin/v1/usage/summary", params=[("group_by", "model")])).status_code == 200
