"""Tenants, keys, server state and usage records on the database, on SQLite and PostgreSQL."""

from __future__ import annotations

import asyncio
from dataclasses import replace
from datetime import timedelta

import pytest
from sqlalchemy import func, select
from sqlalchemy.ext.asyncio import AsyncSession, async_sessionmaker

from gateway.security import hash_secret
from gateway.services import keys, server_state, tenants
from gateway.usage import DatabaseUsageRecorder
from kvgate.db import utcnow
from kvgate.errors import AuthenticationError, NotFoundError, PermissionDeniedError
from kvgate.tenancy import ApiKey, UsageRecord
from kvgate.usage import TokenCounts, UsageEvent

Sessions = async_sessionmaker[AsyncSession]


async def test_a_key_authenticates_to_its_tenant_and_stores_only_a_hash(gw_sessions: Sessions) -> None:
    async with gw_sessions() as session:
        tenant = await tenants.create_tenant(session, name="acme")
        key, plaintext = await keys.create_key(session, tenant_id=tenant.id, name="ci", requests_per_minute=7)
        principal = await keys.authenticate(session, presented=plaintext)
        assert (principal.tenant_id, principal.api_key_id, principal.requests_per_minute) == (tenant.id, key.id, 7)
        stored = await session.get(ApiKey, key.id)
        assert stored is not None and stored.key_hash == hash_secret(plaintext)
        assert plaintext not in (stored.key_hash, stored.prefix, stored.name) and plaintext.startswith(stored.prefix)
        assert stored.last_used_at is not None


async def test_unknown_revoked_and_expired_keys_are_401_suspended_tenants_403(gw_sessions: Sessions) -> None:
    async with gw_sessions() as session:
        tenant = await tenants.create_tenant(session, name="t")
        _, good = await keys.create_key(session, tenant_id=tenant.id, name="good")
        revoked, revoked_plain = await keys.create_key(session, tenant_id=tenant.id, name="revoked")
        _, expired_plain = await keys.create_key(
            session, tenant_id=tenant.id, name="expired", expires_at=utcnow() - timedelta(seconds=1)
        )
        _, later_plain = await keys.create_key(
            session, tenant_id=tenant.id, name="later", expires_at=utcnow() + timedelta(days=1)
        )
        await keys.revoke_key(session, key_id=revoked.id)

        await keys.authenticate(session, presented=good)
        await keys.authenticate(session, presented=later_plain)
        with pytest.raises(AuthenticationError):
            await keys.authenticate(session, presented=good[:-1] + ("A" if good[-1] != "A" else "B"))
        with pytest.raises(AuthenticationError, match="revoked"):
            await keys.authenticate(session, presented=revoked_plain)
        with pytest.raises(AuthenticationError, match="expired"):
            await keys.authenticate(session, presented=expired_plain)

        await tenants.set_tenant_status(session, tenant_id=tenant.id, suspended=True)
        with pytest.raises(PermissionDeniedError):
            await keys.authenticate(session, presented=good)
        await tenants.set_tenant_status(session, tenant_id=tenant.id, suspended=False)
        await keys.authenticate(session, presented=good)


async def test_listing_and_not_found(gw_sessions: Sessions) -> None:
    async with gw_sessions() as session:
        tenant = await tenants.create_tenant(session, name="lister")
        made = [(await keys.create_key(session, tenant_id=tenant.id, name=f"k{i}"))[0].id for i in range(3)]
        assert [k.id for k in await keys.list_keys(session, tenant_id=tenant.id)] == made
        assert tenant.id in [t.id for t in await tenants.list_tenants(session)]
        with pytest.raises(NotFoundError):
            await keys.create_key(session, tenant_id="ten_missing", name="x")
        with pytest.raises(NotFoundError):
            await keys.revoke_key(session, key_id="key_missing")
        with pytest.raises(NotFoundError):
            await tenants.set_tenant_status(session, tenant_id="ten_missing", suspended=True)


async def test_secret_and_admin_token_are_generated_once(gw_sessions: Sessions) -> None:
    async with gw_sessions() as session:
        assert await server_state.ensure_secret(session, configured="from-env") == "from-env"
        first = await server_state.ensure_secret(session, configured=None)
        assert first == await server_state.ensure_secret(session, configured=None)

        verifier, token = await server_state.ensure_admin_token(session, configured=None)
        again, none = await server_state.ensure_admin_token(session, configured=None)
        assert token is not None and none is None  # printed once, on the first start only
        assert verifier.verify(token) and again.verify(token)
        assert not again.verify(token + "x")
        configured, _ = await server_state.ensure_admin_token(session, configured="env-token")
        assert configured.verify("env-token") and not configured.verify(token)


def _event(request_id: str) -> UsageEvent:
    return UsageEvent(
        request_id=request_id,
        tenant_id="ten_x",
        api_key_id="key_x",
        model="m",
        endpoint="messages",
        started_at=utcnow(),
        counts=TokenCounts(input=10, cache_write_5m=32, cache_write_1h=16, cache_read=48, output=5),
        ttft_ms=12,
        latency_ms=40,
        status="ok",
    )


async def test_usage_records_are_insert_or_ignore_by_request_id(gw_sessions: Sessions, gw_db_url: str) -> None:
    recorder = DatabaseUsageRecorder(gw_db_url)
    event = _event(f"req_{utcnow().timestamp()}")
    results = await asyncio.gather(
        *(recorder.record(replace(event, counts=replace(event.counts, output=n))) for n in range(5))
    )
    await recorder.aclose()
    assert sorted(results) == [False, False, False, False, True]
    async with gw_sessions() as session:
        count = await session.scalar(select(func.count()).where(UsageRecord.request_id == event.request_id))
        row = await session.get(UsageRecord, event.request_id)
    assert count == 1 and row is not None
    assert (row.input_tokens, row.cache_write_5m_tokens, row.cache_write_1h_tokens, row.cache_read_tokens) == (
        10,
        32,
        16,
        48,
    )
    assert row.started_at.tzinfo is not None
    assert event.counts.prompt_tokens == 10 + 32 + 16 + 48


async def test_concurrent_records_share_commits_and_each_lands_once(gw_sessions: Sessions, gw_db_url: str) -> None:
    recorder = DatabaseUsageRecorder(gw_db_url, max_batch=16)
    stamp = utcnow().timestamp()
    events = [_event(f"req_batch_{stamp}_{i}") for i in range(100)]
    assert all(await asyncio.gather(*(recorder.record(e) for e in events)))
    assert not any(await asyncio.gather(*(recorder.record(e) for e in events[:10])))
    await recorder.aclose()
    async with gw_sessions() as session:
        count = await session.scalar(select(func.count()).where(UsageRecord.request_id.like(f"req_batch_{stamp}_%")))
    assert count == 100
