"""Per-key token buckets, in memory and in Redis: exact under concurrency, refill, debt."""

from __future__ import annotations

import asyncio
import uuid
from collections.abc import AsyncIterator

import pytest

from gateway.ratelimit import Limits, MemoryRateLimiter, RateLimiter, RedisRateLimiter

REDIS_URL = "redis://127.0.0.1:6379/0"


class FakeTime:
    def __init__(self) -> None:
        self.now = 1_000_000.0

    def __call__(self) -> float:
        return self.now


async def _redis_up() -> bool:
    from redis.asyncio import Redis

    client = Redis.from_url(REDIS_URL, socket_connect_timeout=1)
    try:
        return bool(await client.ping())
    except Exception:
        return False
    finally:
        await client.aclose()


@pytest.fixture(params=["memory", "redis"])
async def limiter_and_time(request: pytest.FixtureRequest) -> AsyncIterator[tuple[RateLimiter, FakeTime]]:
    clock = FakeTime()
    if request.param == "memory":
        yield MemoryRateLimiter(clock=clock), clock
        return
    if not await _redis_up():
        pytest.skip("Redis is not reachable at 127.0.0.1:6379")
    limiter = RedisRateLimiter(REDIS_URL, prefix=f"kvgate-test:{uuid.uuid4().hex}:", clock=clock)
    try:
        yield limiter, clock
    finally:
        await limiter.close()


async def test_requests_per_minute_is_exact_under_concurrency(limiter_and_time) -> None:
    limiter, _ = limiter_and_time
    limits = Limits(requests_per_minute=10)
    decisions = await asyncio.gather(*(limiter.acquire(key_id="k", limits=limits, input_tokens=0) for _ in range(50)))
    assert sum(d.allowed for d in decisions) == 10
    refused = [d for d in decisions if not d.allowed]
    assert all(5.9 <= d.retry_after_s <= 6.1 for d in refused)  # one unit refills in 60/10 s
    assert refused[0].requests is not None and refused[0].requests.remaining == 0
    # Another key has its own bucket.
    assert (await limiter.acquire(key_id="other", limits=limits, input_tokens=0)).allowed


async def test_buckets_refill_with_time(limiter_and_time) -> None:
    limiter, clock = limiter_and_time
    limits = Limits(requests_per_minute=2)
    assert (await limiter.acquire(key_id="k", limits=limits, input_tokens=0)).allowed
    assert (await limiter.acquire(key_id="k", limits=limits, input_tokens=0)).allowed
    assert not (await limiter.acquire(key_id="k", limits=limits, input_tokens=0)).allowed
    clock.now += 29.0
    assert not (await limiter.acquire(key_id="k", limits=limits, input_tokens=0)).allowed
    clock.now += 1.5
    assert (await limiter.acquire(key_id="k", limits=limits, input_tokens=0)).allowed


async def test_input_tokens_reserve_settle_and_debt(limiter_and_time) -> None:
    limiter, _ = limiter_and_time
    limits = Limits(input_tokens_per_minute=1000)
    first = await limiter.acquire(key_id="k", limits=limits, input_tokens=600)
    assert first.allowed and first.reserved_input_tokens == 600
    second = await limiter.acquire(key_id="k", limits=limits, input_tokens=600)
    assert second.allowed and second.reserved_input_tokens == 400  # what was left
    assert not (await limiter.acquire(key_id="k", limits=limits, input_tokens=1)).allowed
    # The first request turned out to be mostly cache reads: 100 tokens count.
    await limiter.adjust(key_id="k", limits=limits, requests=0, input_tokens=600 - 100)
    third = await limiter.acquire(key_id="k", limits=limits, input_tokens=200)
    assert third.allowed and third.reserved_input_tokens == 200


async def test_a_prompt_larger_than_the_bucket_leaves_debt(limiter_and_time) -> None:
    limiter, clock = limiter_and_time
    limits = Limits(input_tokens_per_minute=1000)
    big = await limiter.acquire(key_id="k", limits=limits, input_tokens=5000)
    assert big.allowed and big.reserved_input_tokens == 1000
    await limiter.adjust(key_id="k", limits=limits, requests=0, input_tokens=1000 - 5000)
    refused = await limiter.acquire(key_id="k", limits=limits, input_tokens=1)
    assert not refused.allowed
    assert 240 <= refused.retry_after_s <= 241  # 4001 tokens at 1000/min
    clock.now += 241
    assert (await limiter.acquire(key_id="k", limits=limits, input_tokens=1)).allowed


async def test_concurrent_token_reservations_never_exceed_the_bucket(limiter_and_time) -> None:
    limiter, _ = limiter_and_time
    limits = Limits(requests_per_minute=1000, input_tokens_per_minute=1000)
    decisions = await asyncio.gather(*(limiter.acquire(key_id="k", limits=limits, input_tokens=300) for _ in range(20)))
    admitted = [d for d in decisions if d.allowed]
    assert sum(d.reserved_input_tokens for d in admitted) == 1000
    assert len(admitted) == 4  # 300 + 300 + 300 + the last 100


async def test_headers_name_limits_remaining_and_reset(limiter_and_time) -> None:
    limiter, _ = limiter_and_time
    decision = await limiter.acquire(
        key_id="k", limits=Limits(requests_per_minute=5, input_tokens_per_minute=100), input_tokens=30
    )
    headers = decision.headers()
    assert headers["anthropic-ratelimit-requests-limit"] == "5"
    assert headers["anthropic-ratelimit-requests-remaining"] == "4"
    assert headers["anthropic-ratelimit-input-tokens-limit"] == "100"
    assert headers["anthropic-ratelimit-input-tokens-remaining"] == "70"
    assert headers["anthropic-ratelimit-requests-reset"].endswith("Z")


async def test_no_limits_means_no_buckets() -> None:
    assert not Limits().enabled
    assert Limits(requests_per_minute=1).enabled


async def test_reserve_takes_what_is_left_and_never_refuses(limiter_and_time) -> None:
    limiter, _ = limiter_and_time
    limits = Limits(requests_per_minute=10, input_tokens_per_minute=1000)
    admitted = await limiter.acquire(key_id="k", limits=limits, input_tokens=0)  # the request unit, up front
    assert admitted.allowed and admitted.reserved_input_tokens == 0
    assert admitted.requests is not None and admitted.requests.remaining == 9
    first = await limiter.reserve(key_id="k", limits=limits, input_tokens=700)
    assert first.allowed and first.reserved_input_tokens == 700
    assert first.input_tokens is not None and first.input_tokens.remaining == 300
    assert first.requests is not None and first.requests.remaining == 9  # reserving takes no request unit
    second = await limiter.reserve(key_id="k", limits=limits, input_tokens=700)
    assert second.allowed and second.reserved_input_tokens == 300  # what was left
    empty = await limiter.reserve(key_id="k", limits=limits, input_tokens=5)
    assert empty.allowed and empty.reserved_input_tokens == 0
    # An empty input-token bucket refuses the next request at admission, before its body is read.
    assert not (await limiter.acquire(key_id="k", limits=limits, input_tokens=0)).allowed


async def test_redis_away_means_per_process_buckets_never_an_error() -> None:
    """Redis cut (refused) or stalled (no answer): each process limits on its own until it answers again."""
    from tests.billing.tcp_proxy import CuttableProxy

    if not await _redis_up():
        pytest.skip("Redis is not reachable at 127.0.0.1:6379")
    proxy = CuttableProxy("127.0.0.1", 6379)
    await proxy.start()
    url = f"redis://127.0.0.1:{proxy.port}/0"
    prefix = f"kvgate-test:{uuid.uuid4().hex}:"
    limits = Limits(requests_per_minute=2)
    try:
        shared = RedisRateLimiter(url, prefix=prefix)
        assert (await shared.acquire(key_id="k", limits=limits, input_tokens=0)).allowed
        assert not shared.using_fallback
        await shared.close()
        for fault in (proxy.cut, proxy.stall):
            fault()
            away = RedisRateLimiter(url, prefix=prefix, timeout_s=0.5, retry_s=0.0)
            try:
                decisions = [await away.acquire(key_id="k", limits=limits, input_tokens=0) for _ in range(3)]
                assert away.using_fallback
                assert [d.allowed for d in decisions] == [True, True, False]  # still a limit, in this process
                await away.adjust(key_id="k", limits=limits, requests=1, input_tokens=0)  # no error either
            finally:
                await away.close()
            proxy.restore()
        # Back: the shared bucket again, where the first acquire took its unit.
        back = RedisRateLimiter(url, prefix=prefix)
        try:
            assert (await back.acquire(key_id="k", limits=limits, input_tokens=0)).allowed
            assert not (await back.acquire(key_id="k", limits=limits, input_tokens=0)).allowed
            assert not back.using_fallback
        finally:
            await back.close()
    finally:
        await proxy.stop()
