"""The short-lived cache of authenticated keys: TTL, eviction, and expiry checked on every use."""

from __future__ import annotations

import asyncio
from datetime import timedelta

import pytest

from gateway.auth_cache import PrincipalCache
from gateway.services.keys import Principal
from kvgate.db import utcnow
from kvgate.errors import AuthenticationError


class Ticker:
    def __init__(self) -> None:
        self.now = 100.0

    def __call__(self) -> float:
        return self.now


def test_entries_live_for_the_ttl() -> None:
    tick = Ticker()
    cache = PrincipalCache(2.0, clock=tick)
    principal = Principal(tenant_id="ten_a", api_key_id="key_a")
    cache.put("h", principal)
    assert cache.get("h") == principal
    tick.now += 1.9
    assert cache.get("h") == principal
    tick.now += 0.2
    assert cache.get("h") is None


def test_eviction_by_key_and_by_tenant() -> None:
    cache = PrincipalCache(60)
    cache.put("a1", Principal(tenant_id="ten_a", api_key_id="key_1"))
    cache.put("a2", Principal(tenant_id="ten_a", api_key_id="key_2"))
    cache.put("b1", Principal(tenant_id="ten_b", api_key_id="key_3"))
    cache.evict(key_id="key_1")
    assert cache.get("a1") is None and cache.get("a2") is not None
    cache.evict(tenant_id="ten_a")
    assert cache.get("a2") is None and cache.get("b1") is not None


def test_zero_ttl_disables_and_size_is_bounded() -> None:
    off = PrincipalCache(0)
    off.put("h", Principal(tenant_id="t", api_key_id="k"))
    assert off.get("h") is None
    small = PrincipalCache(60, max_entries=2)
    for i in range(3):
        small.put(f"h{i}", Principal(tenant_id="t", api_key_id=f"k{i}"))
    assert small.get("h0") is None and small.get("h2") is not None


def test_a_cached_key_still_expires_on_time() -> None:
    principal = Principal(tenant_id="t", api_key_id="k", expires_at=utcnow() + timedelta(seconds=1))
    principal.check_expiry(utcnow())
    with pytest.raises(AuthenticationError, match="expired"):
        principal.check_expiry(utcnow() + timedelta(seconds=2))


def test_last_known_good_entries_outlive_the_fresh_ttl_up_to_the_stale_ttl() -> None:
    tick = Ticker()
    cache = PrincipalCache(2.0, stale_ttl_s=600.0, clock=tick)
    principal = Principal(tenant_id="ten_a", api_key_id="key_a")
    cache.put("h", principal)
    tick.now += 2.5
    assert cache.get("h") is None  # not fresh: the database is asked again
    assert cache.get_stale("h") == principal  # but it is what an outage falls back on
    tick.now += 597.4
    assert cache.get_stale("h") == principal
    tick.now += 0.2
    assert cache.get_stale("h") is None  # bounded: 600 s after the database last accepted it
    cache.put("h", principal)
    cache.discard("h")  # the database refused the key
    assert cache.get_stale("h") is None
    cache.put("h", principal)
    cache.evict(key_id="key_a")  # revoked through the admin API
    assert cache.get_stale("h") is None
    assert PrincipalCache(2.0, stale_ttl_s=0).stale_ttl_s == 2.0  # 0: nothing beyond the fresh TTL


async def test_concurrent_misses_of_one_key_share_one_lookup() -> None:
    cache = PrincipalCache(2.0)
    release = asyncio.Event()
    calls: list[str] = []

    async def lookup(name: str) -> Principal:
        calls.append(name)
        await release.wait()
        return Principal(tenant_id="ten_a", api_key_id=name)

    first = [asyncio.ensure_future(cache.load("h", lambda: lookup("key_h"))) for _ in range(5)]
    other = asyncio.ensure_future(cache.load("g", lambda: lookup("key_g")))
    await asyncio.sleep(0)
    release.set()
    assert {p.api_key_id for p in await asyncio.gather(*first)} == {"key_h"}
    assert (await other).api_key_id == "key_g"
    assert sorted(calls) == ["key_g", "key_h"]  # one lookup per key, not one per caller
    await cache.load("h", lambda: lookup("key_h"))
    assert len(calls) == 3  # the finished lookup is not reused: the next miss asks again


async def test_a_shared_lookup_outlives_a_cancelled_caller_and_its_error_reaches_every_caller() -> None:
    cache = PrincipalCache(2.0)
    release = asyncio.Event()

    async def refused() -> Principal:
        await release.wait()
        raise AuthenticationError("invalid x-api-key")

    leaving = asyncio.ensure_future(cache.load("h", refused))
    staying = asyncio.ensure_future(cache.load("h", refused))
    await asyncio.sleep(0)
    leaving.cancel()
    release.set()
    with pytest.raises(AuthenticationError):
        await staying
    assert leaving.cancelled()


async def test_eviction_makes_later_misses_look_up_afresh() -> None:
    cache = PrincipalCache(2.0)
    release = asyncio.Event()
    calls = 0

    async def lookup() -> Principal:
        nonlocal calls
        calls += 1
        await release.wait()
        return Principal(tenant_id="ten_a", api_key_id="key_a")

    before = asyncio.ensure_future(cache.load("h", lookup))
    await asyncio.sleep(0)
    joined = asyncio.ensure_future(cache.load("h", lookup))
    await asyncio.sleep(0)
    assert calls == 1
    cache.evict(key_id="key_a")  # revoked while the lookup was on its way
    after = asyncio.ensure_future(cache.load("h", lookup))
    await asyncio.sleep(0)
    release.set()
    await asyncio.gather(before, joined, after)
    assert calls == 2
