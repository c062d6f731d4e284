"""Auth-cache evictions over Redis pub/sub (gateway/auth_invalidation.py), against the real Redis.

Two AuthInvalidation instances stand for two gateway processes, each on its own channel per
test; the Redis connection of one goes through a proxy that the test cuts and restores.
"""

from __future__ import annotations

import asyncio
import time
import uuid
from collections.abc import AsyncIterator, Callable

import pytest

from gateway.auth_cache import PrincipalCache
from gateway.auth_invalidation import AuthInvalidation, Eviction, publish_eviction
from gateway.services.keys import Principal
from tests.billing.tcp_proxy import CuttableProxy
from tests.gateway.harness import free_port

REDIS_URL = "redis://127.0.0.1:6379/0"
WAIT_S = 60.0  # generous: a loaded machine


async def _redis_up() -> bool:
    from redis.asyncio import Redis

    client = Redis.from_url(REDIS_URL, socket_connect_timeout=1)
    try:
        return bool(await client.ping())
    except Exception:
        return False
    finally:
        await client.aclose()


async def until(condition: Callable[[], bool], what: str) -> None:
    deadline = time.monotonic() + WAIT_S
    while not condition():
        assert time.monotonic() < deadline, f"timed out waiting for {what}"
        await asyncio.sleep(0.01)


@pytest.fixture
async def channel() -> str:
    if not await _redis_up():
        pytest.skip("Redis is not reachable at 127.0.0.1:6379")
    return f"kvgate-test:auth:{uuid.uuid4().hex}"


@pytest.fixture
async def pair(channel: str) -> AsyncIterator[tuple[AuthInvalidation, AuthInvalidation]]:
    """Two gateways' invalidation, both subscribed."""
    one = AuthInvalidation(PrincipalCache(3600), REDIS_URL, channel=channel)
    two = AuthInvalidation(PrincipalCache(3600), REDIS_URL, channel=channel)
    one.start()
    two.start()
    try:
        await asyncio.wait_for(asyncio.gather(one.subscribed.wait(), two.subscribed.wait()), WAIT_S)
        yield one, two
    finally:
        await one.aclose()
        await two.aclose()


def principal(key: str, tenant: str = "ten_a") -> Principal:
    return Principal(tenant_id=tenant, api_key_id=key)


async def test_an_eviction_on_one_gateway_reaches_the_other(pair: tuple[AuthInvalidation, AuthInvalidation]) -> None:
    one, two = pair
    for cache in (one.cache, two.cache):
        cache.put("h1", principal("key_1"))
        cache.put("h2", principal("key_2"))
        cache.put("h3", principal("key_3", tenant="ten_b"))
    await one.evict(Eviction(key_id="key_1"))
    assert one.cache.get("h1") is None  # here at once, before any message
    await until(lambda: two.cache.get("h1") is None, "the eviction to reach the other gateway")
    assert two.cache.get("h2") is not None and two.cache.get("h3") is not None  # only that key
    await one.evict(Eviction(tenant_id="ten_a"))
    await until(lambda: two.cache.get("h2") is None, "the tenant's eviction")
    assert two.cache.get("h3") is not None


async def test_the_cli_path_publishes_to_every_gateway(
    pair: tuple[AuthInvalidation, AuthInvalidation], channel: str
) -> None:
    one, two = pair
    for cache in (one.cache, two.cache):
        cache.put("h", principal("key_cli"))
    assert await publish_eviction(REDIS_URL, Eviction(key_id="key_cli"), channel=channel)
    await until(lambda: one.cache.get("h") is None and two.cache.get("h") is None, "both to evict")
    # Unreachable Redis: a False, quickly, and nothing raised (the database change stands).
    dead = f"redis://127.0.0.1:{free_port()}/0"
    assert not await publish_eviction(dead, Eviction(key_id="key_cli"), channel=channel)
    assert not await publish_eviction(None, Eviction(key_id="key_cli"))


async def test_no_fresh_entries_until_subscribed_nor_while_disconnected(channel: str) -> None:
    proxy = CuttableProxy("127.0.0.1", 6379)
    await proxy.start()
    cut_off = AuthInvalidation(PrincipalCache(3600), f"redis://127.0.0.1:{proxy.port}/0", channel=channel)
    other = AuthInvalidation(PrincipalCache(3600), REDIS_URL, channel=channel)
    cache = cut_off.cache
    try:
        proxy.cut()
        cut_off.start()
        other.start()
        cache.put("h", principal("key_1"))
        assert cache.get("h") is None and cache.fresh_suspended  # not subscribed: the database decides
        assert cache.get_stale("h") is not None  # still there for a database outage
        proxy.restore()
        await asyncio.wait_for(asyncio.gather(cut_off.subscribed.wait(), other.subscribed.wait()), WAIT_S)
        assert cache.get("h") is None  # stored before it listened: it may have missed an eviction
        cache.put("h", principal("key_1"))
        assert cache.get("h") is not None  # fresh again

        proxy.cut()  # Redis goes away: the subscriber notices, and stops trusting its cache
        await until(lambda: cache.fresh_suspended, "the subscriber to notice the cut")
        assert cache.get("h") is None
        # A revocation it cannot hear; once back, nothing stored before counts as fresh.
        await other.evict(Eviction(key_id="key_1"))
        proxy.restore()
        await until(lambda: cut_off.subscribed.is_set(), "the subscriber to reconnect")
        assert cache.get("h") is None
        cache.put("h", principal("key_2"))
        await other.evict(Eviction(key_id="key_2"))  # and it hears evictions again
        await until(lambda: cache.get("h") is None, "the eviction after the reconnect")
    finally:
        await cut_off.aclose()
        await other.aclose()
        await proxy.stop()


async def test_a_connection_that_goes_silent_is_noticed_and_replaced(channel: str) -> None:
    """A blackholed connection (no reset, nothing arrives): the pings go unanswered, the subscriber gives up on it."""
    proxy = CuttableProxy("127.0.0.1", 6379)
    await proxy.start()
    url = f"redis://127.0.0.1:{proxy.port}/0"
    stalled = AuthInvalidation(PrincipalCache(3600), url, channel=channel, ping_every_s=0.2, silence_limit_s=2.0)
    other = AuthInvalidation(PrincipalCache(3600), REDIS_URL, channel=channel)
    try:
        stalled.start()
        other.start()
        await asyncio.wait_for(asyncio.gather(stalled.subscribed.wait(), other.subscribed.wait()), WAIT_S)
        await asyncio.sleep(3.0)  # longer than the silence limit: the pongs keep a live connection heard
        assert stalled.subscribed.is_set() and not stalled.cache.fresh_suspended
        proxy.stall()
        await until(lambda: stalled.cache.fresh_suspended, "the subscriber to notice the silence")
        proxy.restore()
        await until(lambda: stalled.subscribed.is_set(), "the subscriber to reconnect")
        stalled.cache.put("h", principal("key_1"))
        await other.evict(Eviction(key_id="key_1"))
        await until(lambda: stalled.cache.get("h") is None, "an eviction on the new connection")
    finally:
        await stalled.aclose()
        await other.aclose()
        await proxy.stop()


def test_a_lookup_that_read_before_an_eviction_does_not_store_its_answer() -> None:
    cache = PrincipalCache(3600)
    before = cache.generation
    cache.evict(key_id="key_1")  # arrives while the lookup reads the row
    cache.put("h", principal("key_1"), generation=before)
    assert cache.get("h") is None and cache.get_stale("h") is None
    cache.put("h", principal("key_1"), generation=cache.generation)
    assert cache.get("h") is not None


def test_messages_that_are_not_evictions_are_ignored() -> None:
    assert Eviction.decode(Eviction(key_id="k").encode()) == Eviction(key_id="k")
    assert Eviction.decode(Eviction(tenant_id="t").encode()) == Eviction(tenant_id="t")
    for junk in (b"", b"not json", b"[]", b"{}", b'{"key_id": 5}', b'{"other": "x"}'):
        assert Eviction.decode(junk) is None, junk


async def test_without_redis_it_evicts_here_only() -> None:
    local = AuthInvalidation(PrincipalCache(3600), None)
    local.start()
    assert not local.enabled and not local.cache.fresh_suspended
    local.cache.put("h", principal("key_1"))
    assert local.cache.get("h") is not None
    await local.evict(Eviction(key_id="key_1"))
    assert local.cache.get("h") is None
    await local.aclose()
