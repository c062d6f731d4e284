"""Usage buckets and rollups against the ledger they sum: written through billing's real ledger writer
(duplicates and reversals included), read back per bucket, group and filter, on SQLite and PostgreSQL."""

from __future__ import annotations

import dataclasses
import random
import uuid
from collections import defaultdict
from collections.abc import Iterable
from datetime import UTC, datetime, timedelta

import pytest
import sqlalchemy as sa
from alembic import command
from sqlalchemy import select

from billing import catalog, usage_rollups
from billing.ledger import UsageCharge
from billing.models import LedgerEntry, UsageRollup
from billing.prices import load_price_file
from billing.settlement import reverse_charge, settle_charge
from billing.usage_buckets import (
    BucketResult,
    UsageBucketError,
    ceil_to,
    floor_to,
    usage_breakdown,
    usage_buckets,
    usage_totals,
)
from kvgate.db import alembic_config, migrate, open_database, sync_url
from kvgate.usage import EntryKind, TokenCounts
from tests.billing.conftest import make_tenant
from tests.gateway.harness import pg_reachable, postgres_database

DAY0 = datetime(2026, 4, 1, tzinfo=UTC)
MODELS = ("m-test", "other")


def random_counts(rng: random.Random, *, ttl_classes_0006: bool = True) -> TokenCounts:
    """Counts in every category; with ttl_classes_0006=False, none in the 30m and 12h classes (before 0006)."""
    new = ttl_classes_0006
    return TokenCounts(
        input=rng.randrange(0, 5000),
        cache_write_5m=rng.choice((0, 0, rng.randrange(1, 4000))),
        cache_write_30m=rng.choice((0, 0, rng.randrange(1, 4000))) if new else 0,
        cache_write_1h=rng.choice((0, 0, rng.randrange(1, 4000))),
        cache_write_12h=rng.choice((0, 0, rng.randrange(1, 400))) if new else 0,
        cache_write_24h=rng.choice((0, 0, rng.randrange(1, 100))),
        cache_read=rng.choice((0, rng.randrange(1, 20000))),
        output=rng.randrange(1, 800),
    )


async def write_random_ledger(
    sessions, pricebook, tenant: str, keys: list[str | None], *, seed: int, n: int = 50, ttl_classes_0006: bool = True
):
    """n requests over three days through settle_charge, some sent twice, some reversed."""
    rng = random.Random(seed)
    charges = []
    for i in range(n):
        started = DAY0 + timedelta(seconds=rng.randrange(0, 3 * 86400))
        model = rng.choice(MODELS)
        counts = random_counts(rng, ttl_classes_0006=ttl_classes_0006)
        if pricebook.price_for(model, started).rates.cache_write_24h is None:
            counts = dataclasses.replace(counts, cache_write_24h=0)
        charges.append(
            UsageCharge(
                request_id=f"req-{tenant}-{i}",
                tenant_id=tenant,
                api_key_id=rng.choice(keys),
                model=model,
                endpoint=rng.choice(("messages", "chat.completions")),
                status=rng.choice(("ok", "ok", "ok", "cancelled", "error")),
                started_at=started,
                counts=counts,
            )
        )
    async with sessions() as session:
        for charge in charges + rng.sample(charges, 8):  # the sample are duplicates: no new entry
            version = pricebook.price_for(charge.model, charge.started_at)
            await settle_charge(session=session, charge=charge, version=version, source="live", now=charge.started_at)
        for charge in rng.sample(charges, 6):
            for _ in range(2):  # a repeated reversal is one entry too
                await reverse_charge(session=session, request_id=charge.request_id, reason="test", now=DAY0)
        await session.commit()


async def ledger_rows(sessions, tenant: str) -> list[LedgerEntry]:
    async with sessions() as session:
        return list((await session.scalars(select(LedgerEntry).where(LedgerEntry.tenant_id == tenant))).all())


def summed(entries: Iterable[LedgerEntry], *, model=None, api_key_id=None) -> BucketResult:
    total = BucketResult(
        model=model, api_key_id=api_key_id, requests=0, counts=TokenCounts(), cost_pico=0, uncached_cost_pico=0
    )
    for e in entries:
        total = total + BucketResult(
            model=model,
            api_key_id=api_key_id,
            requests=1 if e.kind == EntryKind.USAGE else 0,
            counts=TokenCounts.from_columns(e),
            cost_pico=e.cost_pico,
            uncached_cost_pico=e.uncached_cost_pico,
        )
    return total


def expected_buckets(entries, *, start, end, width, step, group_by=()):
    """The buckets computed in Python from ledger entries: {bucket start: [results sorted]}."""
    grouped: dict[datetime, dict[tuple, list]] = defaultdict(lambda: defaultdict(list))
    for e in entries:
        if start <= e.started_at < end:
            key = tuple(getattr(e, name) if name in group_by else None for name in ("model", "api_key_id"))
            grouped[floor_to(e.started_at, width)][key].append(e)
    expected = {}
    moment = start
    while moment < end:
        groups = grouped.get(moment, {})
        expected[moment] = [
            summed(groups[key], model=key[0], api_key_id=key[1])
            for key in sorted(groups, key=lambda k: (k[0] or "", k[1] or ""))
        ]
        moment += step
    return expected


def as_dict(buckets) -> dict[datetime, list[BucketResult]]:
    return {b.start: b.results for b in buckets}


async def test_rollups_equal_the_ledger(sessions, pricebook):
    tenant, keys = await make_tenant(sessions, keys=2)
    await write_random_ledger(sessions, pricebook, tenant, [*keys, None], seed=1)
    entries = await ledger_rows(sessions, tenant)
    assert sum(e.kind == EntryKind.REVERSAL for e in entries) == 6
    assert sum(e.kind == EntryKind.USAGE for e in entries) == 50
    assert await rollups_of(sessions, tenant) == rollups_from_ledger(entries)


async def rollups_of(sessions, tenant: str) -> dict[tuple, dict[str, int]]:
    async with sessions() as session:
        rows = (await session.scalars(select(UsageRollup).where(UsageRollup.tenant_id == tenant))).all()
    return {
        (r.hour, r.api_key_id, r.model, r.endpoint, r.status): {
            name: getattr(r, name) for name in ("requests", *usage_rollups.ROLLUP_SUMS)
        }
        for r in rows
    }


def rollups_from_ledger(entries) -> dict[tuple, dict[str, int]]:
    sums: dict[tuple, dict[str, int]] = {}
    for e in entries:
        key = (usage_rollups.hour_of(e.started_at), e.api_key_id or "", e.model, e.endpoint, e.status)
        total = sums.setdefault(key, dict.fromkeys(("requests", *usage_rollups.ROLLUP_SUMS), 0))
        total["requests"] += e.kind == EntryKind.USAGE
        for name in usage_rollups.ROLLUP_SUMS:
            total[name] += getattr(e, name)
    return sums


@pytest.mark.parametrize("width", ["1d", "1h"])
async def test_buckets_sum_to_the_ledger(sessions, pricebook, width):
    tenant, keys = await make_tenant(sessions, keys=2)
    await write_random_ledger(sessions, pricebook, tenant, [*keys, None], seed=2)
    entries = await ledger_rows(sessions, tenant)
    # A range wider than the data on both sides, so empty buckets are there too.
    start, end = DAY0 - timedelta(days=1), DAY0 + timedelta(days=5)
    step = timedelta(days=1) if width == "1d" else timedelta(hours=1)
    async with sessions() as session:
        buckets = await usage_buckets(session=session, tenant_id=tenant, start=start, end=end, width=width)
        by_model_key = await usage_buckets(
            session=session, tenant_id=tenant, start=start, end=end, width=width, group_by=["api_key_id", "model"]
        )
    assert len(buckets) == (end - start) / step
    assert [b.start for b in buckets] == [start + i * step for i in range(len(buckets))]
    assert all(b.end - b.start == step for b in buckets)
    assert buckets[0].results == [] and buckets[-1].results == []
    assert as_dict(buckets) == expected_buckets(entries, start=start, end=end, width=width, step=step)
    async with sessions() as session:
        from_ledger = await usage_buckets(
            session=session, tenant_id=tenant, start=start, end=end, width=width, from_ledger=True
        )
    assert from_ledger == buckets
    assert as_dict(by_model_key) == expected_buckets(
        entries, start=start, end=end, width=width, step=step, group_by=("model", "api_key_id")
    )
    # A request without a key is grouped under None, and the groups add up to the bucket.
    assert any(r.api_key_id is None for b in by_model_key for r in b.results)
    for plain, grouped in zip(buckets, by_model_key, strict=True):
        if grouped.results:
            total = grouped.results[0]
            for r in grouped.results[1:]:
                total = total + r
            assert dataclasses.replace(total, model=None, api_key_id=None) == plain.results[0]
    everything = summed(entries)
    assert sum(r.cost_pico for b in buckets for r in b.results) == everything.cost_pico
    assert sum(r.requests for b in buckets for r in b.results) == everything.requests == 50


async def test_minute_buckets_read_the_ledger(sessions, pricebook):
    tenant, (key,) = await make_tenant(sessions)
    await write_random_ledger(sessions, pricebook, tenant, [key], seed=3)
    entries = await ledger_rows(sessions, tenant)
    busiest = max(entries, key=lambda e: e.started_at).started_at
    start, end = floor_to(busiest, "1h"), ceil_to(busiest, "1h")
    step = timedelta(minutes=1)
    async with sessions() as session:
        buckets = await usage_buckets(
            session=session, tenant_id=tenant, start=start, end=end, width="1m", group_by=["model"]
        )
    assert len(buckets) == 60
    expected = expected_buckets(entries, start=start, end=end, width="1m", step=step, group_by=("model",))
    assert as_dict(buckets) == expected
    assert any(b.results for b in buckets)


async def test_group_by_and_filters(sessions, pricebook):
    tenant, keys = await make_tenant(sessions, keys=2)
    await write_random_ledger(sessions, pricebook, tenant, keys, seed=4)
    entries = await ledger_rows(sessions, tenant)
    start, end = DAY0, DAY0 + timedelta(days=3)
    step = timedelta(days=1)
    chosen = [e for e in entries if e.model == "m-test" and e.api_key_id == keys[0] and e.status == "ok"]
    assert chosen
    async with sessions() as session:
        by_model = await usage_buckets(
            session=session, tenant_id=tenant, start=start, end=end, width="1d", group_by=["model"]
        )
        filtered = await usage_buckets(
            session=session,
            tenant_id=tenant,
            start=start,
            end=end,
            width="1d",
            models=["m-test"],
            api_key_ids=[keys[0]],
            statuses=["ok"],
        )
        by_endpoint = await usage_buckets(
            session=session, tenant_id=tenant, start=start, end=end, width="1d", endpoints=["messages"]
        )
    assert {r.model for b in by_model for r in b.results} == set(MODELS)
    assert as_dict(by_model) == expected_buckets(
        entries, start=start, end=end, width="1d", step=step, group_by=("model",)
    )
    assert as_dict(filtered) == expected_buckets(chosen, start=start, end=end, width="1d", step=step)
    messages = [e for e in entries if e.endpoint == "messages"]
    assert as_dict(by_endpoint) == expected_buckets(messages, start=start, end=end, width="1d", step=step)
    assert as_dict(filtered) != as_dict(by_endpoint)


async def test_a_tenant_sees_only_its_own_usage(sessions, pricebook):
    tenant_a, keys_a = await make_tenant(sessions)
    tenant_b, _ = await make_tenant(sessions)
    await write_random_ledger(sessions, pricebook, tenant_a, keys_a, seed=5, n=10)
    start, end = DAY0, DAY0 + timedelta(days=3)
    async with sessions() as session:
        a = await usage_totals(session=session, tenant_id=tenant_a, start=start, end=end)
        b = await usage_totals(session=session, tenant_id=tenant_b, start=start, end=end)
        # Tenant B naming A's key still sees nothing of A's.
        b_with_a_key = await usage_buckets(
            session=session, tenant_id=tenant_b, start=start, end=end, width="1d", api_key_ids=keys_a
        )
    assert a.requests == 10
    assert b.requests == 0 and b.cost_pico == 0 and b.counts == TokenCounts()
    assert all(bucket.results == [] for bucket in b_with_a_key)


async def test_totals_over_any_range_are_exact(sessions, pricebook):
    tenant, keys = await make_tenant(sessions, keys=2)
    await write_random_ledger(sessions, pricebook, tenant, keys, seed=6)
    entries = await ledger_rows(sessions, tenant)
    rng = random.Random(6)
    async with sessions() as session:
        for _ in range(6):
            # Ranges cutting hours anywhere: whole hours from rollups, the edges from the ledger.
            start = DAY0 + timedelta(seconds=rng.randrange(0, 2 * 86400))
            end = start + timedelta(seconds=rng.randrange(1, 86400))
            total = await usage_totals(session=session, tenant_id=tenant, start=start, end=end)
            assert total == summed(e for e in entries if start <= e.started_at < end)
        start, end = DAY0 + timedelta(minutes=7), DAY0 + timedelta(days=2, minutes=13)
        per_key = await usage_breakdown(
            session=session, tenant_id=tenant, start=start, end=end, group_by=["api_key_id"]
        )
        inside = [e for e in entries if start <= e.started_at < end]
        assert per_key == [
            summed([e for e in inside if e.api_key_id == key], api_key_id=key)
            for key in sorted(keys)
            if any(e.api_key_id == key for e in inside)
        ]
        empty = await usage_totals(session=session, tenant_id=tenant, start=DAY0 - timedelta(days=9), end=DAY0)
        assert empty.requests == 0 and empty.cost_pico == 0


async def test_bad_arguments_are_refused(sessions):
    async with sessions() as session:
        with pytest.raises(UsageBucketError, match="width"):
            await usage_buckets(session=session, tenant_id="t", start=DAY0, end=DAY0 + timedelta(1), width="1w")
        with pytest.raises(UsageBucketError, match="time zone"):
            await usage_buckets(
                session=session, tenant_id="t", start=DAY0.replace(tzinfo=None), end=DAY0 + timedelta(1), width="1d"
            )
        with pytest.raises(UsageBucketError, match="after start"):
            await usage_totals(session=session, tenant_id="t", start=DAY0, end=DAY0)
        with pytest.raises(UsageBucketError, match="group_by"):
            await usage_breakdown(
                session=session, tenant_id="t", start=DAY0, end=DAY0 + timedelta(1), group_by=["status"]
            )
        with pytest.raises(UsageBucketError, match="buckets"):
            await usage_buckets(session=session, tenant_id="t", start=DAY0, end=DAY0 + timedelta(days=400), width="1m")
        # The same call with a valid width answers.
        ok = await usage_buckets(session=session, tenant_id="t", start=DAY0, end=DAY0 + timedelta(1), width="1d")
        assert len(ok) == 1


@pytest.fixture(params=["sqlite", pytest.param("postgres", marks=pytest.mark.postgres)])
def fresh_db_url(request, tmp_path):
    if request.param == "sqlite":
        yield f"sqlite:///{tmp_path / 'backfill.db'}"
        return
    if not pg_reachable():
        pytest.skip("PostgreSQL is not reachable at 127.0.0.1:5432")
    with postgres_database(prefix="kvgate_backfill_test") as url:
        yield url


async def test_migration_backfills_rollups_from_the_ledger(fresh_db_url, monkeypatch):
    """Entries written at revision 0002 (no rollups table yet) are rolled up by the upgrade to 0003.

    The ledger is written with today's models (rollups off, no tokens in the classes 0006 adds),
    then the database is taken down to 0002, which keeps the entries, and up to head again.
    """
    migrate(fresh_db_url, "head")
    tenant, keys = f"ten_{uuid.uuid4().hex[:12]}", [f"key_{uuid.uuid4().hex[:12]}" for _ in range(2)]
    engine = sa.create_engine(sync_url(fresh_db_url))
    try:
        with engine.begin() as conn:
            # Core inserts of 0002's columns.
            conn.execute(
                sa.text("INSERT INTO tenants (id, name, status, created_at) VALUES (:t, 'T', 'active', :c)"),
                {
                    "t": tenant,
                    "c": DAY0,
                },
            )
            for key in keys:
                conn.execute(
                    sa.text(
                        "INSERT INTO api_keys (id, tenant_id, name, key_hash, prefix, created_at)"
                        " VALUES (:k, :t, 'k', :h, 'kvg-x', :c)"
                    ),
                    {"k": key, "t": tenant, "h": uuid.uuid4().hex * 2, "c": DAY0},
                )
    finally:
        engine.dispose()

    async def no_rollups(session, entry) -> None:  # the writer as it was before 0003
        return None

    monkeypatch.setattr(usage_rollups, "add_entry", no_rollups)
    async with open_database(fresh_db_url) as sessions:
        async with sessions() as session:
            await catalog.seed_prices(session=session, specs=load_price_file(), source="tests")
            await session.commit()
            pricebook = await catalog.load_pricebook(session=session)
        await write_random_ledger(sessions, pricebook, tenant, [*keys, None], seed=7, n=30, ttl_classes_0006=False)
    monkeypatch.undo()
    command.downgrade(alembic_config(fresh_db_url), "0002_billing")
    engine = sa.create_engine(sync_url(fresh_db_url))
    try:
        assert "usage_rollups" not in sa.inspect(engine).get_table_names()
    finally:
        engine.dispose()
    migrate(fresh_db_url, "head")
    async with open_database(fresh_db_url) as sessions:
        entries = await ledger_rows(sessions, tenant)
        assert len(entries) == 30 + 6
        backfilled = await rollups_of(sessions, tenant)
        assert backfilled == rollups_from_ledger(entries)
        assert backfilled  # and the comparison has something in it
        async with sessions() as session:
            days = await usage_buckets(
                session=session, tenant_id=tenant, start=DAY0, end=DAY0 + timedelta(days=3), width="1d"
            )
        assert sum(r.cost_pico for b in days for r in b.results) == sum(e.cost_pico for e in entries)
