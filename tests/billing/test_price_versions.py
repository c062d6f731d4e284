"""A new price version carries over what it leaves out from the model's version before it, and says so;
prices come back at fixed decimals. Over the admin API, on SQLite and PostgreSQL."""

from __future__ import annotations

import uuid
from decimal import Decimal

from billing.prices import PRICE_FIELDS
from billing.schemas import price_text
from tests.billing.test_api import api  # noqa: F401 (the fixture)

EVERY_FIELD = {
    "input_usd_per_mtok": "2",
    "output_usd_per_mtok": "8",
    "cache_write_5m_multiplier": "1.5",
    "cache_write_30m_multiplier": "1.75",
    "cache_write_1h_multiplier": "2.5",
    "cache_write_12h_multiplier": "4",
    "cache_write_24h_multiplier": "6",
    "cache_read_multiplier": "0.05",
}


async def test_a_new_version_carries_over_what_it_leaves_out(api):  # noqa: F811
    model = f"carry-{uuid.uuid4().hex[:8]}"
    first = await api.post(
        "/admin/v1/prices",
        json={
            "model": model,
            "effective_from": "2026-01-01T00:00:00Z",
            "input_usd_per_mtok": "3",
            "output_usd_per_mtok": "15",
            "cache_write_24h_multiplier": "8",
        },
    )
    assert first.status_code == 201, first.text
    # A model's first version: nothing to carry; the multipliers it leaves out are the defaults.
    assert first.json()["carried_over"] == [] and first.json()["carried_from_id"] is None
    assert first.json()["cache_write_5m_multiplier"] == "1.25" and "24h" in first.json()["ttl_classes"]

    second = await api.post(
        "/admin/v1/prices",
        json={"model": model, "effective_from": "2026-03-01T00:00:00Z", "input_usd_per_mtok": "2.5"},
    )
    body = second.json()
    assert second.status_code == 201, second.text
    assert body["carried_over"] == [name for name in PRICE_FIELDS if name != "input_usd_per_mtok"]
    assert body["carried_from_id"] == first.json()["id"]
    assert body["cache_write_24h_multiplier"] == "8.00" and "24h" in body["ttl_classes"]  # not dropped
    assert body["input_usd_per_mtok"] == "2.50" and body["output_usd_per_mtok"] == "15.00"

    # Every field given: nothing carried, so no warning.
    third = await api.post(
        "/admin/v1/prices", json={"model": model, "effective_from": "2026-05-01T00:00:00Z", **EVERY_FIELD}
    )
    assert third.status_code == 201 and third.json()["carried_over"] == [] and third.json()["carried_from_id"] is None
    assert third.json()["cache_read_multiplier"] == "0.05" and third.json()["cache_write_12h_multiplier"] == "4.00"

    # Inserted between two versions: carried from the one in force just before it, not the latest.
    between = await api.post(
        "/admin/v1/prices",
        json={"model": model, "effective_from": "2026-02-01T00:00:00Z", "cache_write_24h_multiplier": None},
    )
    assert between.status_code == 201, between.text
    assert between.json()["carried_from_id"] == first.json()["id"] and between.json()["input_usd_per_mtok"] == "3.00"
    # null stops offering the class (and is not carried).
    assert between.json()["cache_write_24h_multiplier"] is None and "24h" not in between.json()["ttl_classes"]
    assert "cache_write_24h_multiplier" not in between.json()["carried_over"]

    listed = (await api.get("/admin/v1/prices", params={"model": model})).json()["data"]
    assert [v["input_usd_per_mtok"] for v in listed] == ["3.00", "3.00", "2.50", "2.00"]


async def test_what_cannot_be_carried_is_a_400(api):  # noqa: F811
    model = f"carry-{uuid.uuid4().hex[:8]}"
    at = "2026-01-01T00:00:00Z"
    r = await api.post("/admin/v1/prices", json={"model": model, "effective_from": at, "input_usd_per_mtok": "1"})
    assert r.status_code == 400 and "output_usd_per_mtok" in r.json()["error"]["message"]
    full = {"model": model, "effective_from": at, "input_usd_per_mtok": "1", "output_usd_per_mtok": "2"}
    r = await api.post("/admin/v1/prices", json={**full, "cache_read_multiplier": None})
    assert r.status_code == 400 and "cache_read_multiplier cannot be null" in r.json()["error"]["message"]
    assert (await api.post("/admin/v1/prices", json=full)).status_code == 201


def test_prices_are_shown_at_fixed_decimals():
    assert [price_text(Decimal(v)) for v in ("3", "0.10", "0.1", "1.25", "0.075", "2.000")] == [
        "3.00",
        "0.10",
        "0.10",
        "1.25",
        "0.075",
        "2.00",
    ]
    assert price_text(None) is None
