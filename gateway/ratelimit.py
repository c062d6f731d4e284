"""Per-key rate limits: requests per minute and input tokens per minute, as token buckets.

Each limit is a bucket holding at most `limit` units that refills at limit/60 per
second. A request is admitted when the request bucket has a unit and the
input-token bucket is not empty; it takes the request unit and reserves up to its
prompt's size of input tokens (what is left, if less). How many of its tokens
count is only known when it ends, because cache reads do not count (as at
Anthropic) and the engine finds the cache hit: the reservation is then settled
to prompt minus cache reads, refunding units or leaving the bucket in debt, which
refuses further requests until it refills. Checking and taking happen in one
step (one event-loop turn in memory, one Lua script in Redis), so concurrent
requests cannot take the same units: once the bucket is empty every other
request is refused, and the overshoot is bounded by the one request that took
the last units.

The gateway takes the request unit before it reads the body (acquire with no
input tokens), so a key over its limit costs no parsing or tokenizing, and
reserves the input tokens once the prompt is tokenized (reserve).
"""

from __future__ import annotations

import math
import time
from collections.abc import Callable
from dataclasses import dataclass
from datetime import UTC, datetime
from typing import Protocol

import structlog

WINDOW_S = 60.0
log = structlog.get_logger("kvgate.ratelimit")


@dataclass(frozen=True)
class Limits:
    requests_per_minute: int | None = None
    input_tokens_per_minute: int | None = None

    @property
    def enabled(self) -> bool:
        return self.requests_per_minute is not None or self.input_tokens_per_minute is not None


@dataclass(frozen=True)
class BucketView:
    limit: int
    remaining: int
    reset_at: float  # epoch seconds when the bucket is full again


@dataclass(frozen=True)
class Decision:
    allowed: bool
    retry_after_s: float
    requests: BucketView | None
    input_tokens: BucketView | None
    reserved_input_tokens: int = 0

    def headers(self) -> dict[str, str]:
        out: dict[str, str] = {}
        for name, view in (("requests", self.requests), ("input-tokens", self.input_tokens)):
            if view is None:
                continue
            out[f"anthropic-ratelimit-{name}-limit"] = str(view.limit)
            out[f"anthropic-ratelimit-{name}-remaining"] = str(max(0, view.remaining))
            out[f"anthropic-ratelimit-{name}-reset"] = _rfc3339(view.reset_at)
        return out


def _rfc3339(epoch_s: float) -> str:
    return datetime.fromtimestamp(math.ceil(epoch_s), UTC).strftime(_RFC3339)


_RFC3339 = "%Y-%m-%dT%H:%M:%SZ"
_ANTHROPIC_PREFIX = "anthropic-ratelimit-"
_OPENAI_BUCKETS = {"requests": "requests", "input-tokens": "tokens"}


def openai_rate_headers(headers: list[tuple[bytes, bytes]], *, now: float) -> list[tuple[bytes, bytes]]:
    """Decision.headers() as OpenAI's routes send them: x-ratelimit-{limit,remaining,reset}-{requests,tokens},
    the reset as the time until the bucket is full ("6m0s"); other headers as they are."""
    out: list[tuple[bytes, bytes]] = []
    for name, value in headers:
        bucket, _, field = name.decode("latin-1").lower().removeprefix(_ANTHROPIC_PREFIX).rpartition("-")
        if not name.lower().startswith(_ANTHROPIC_PREFIX.encode()) or bucket not in _OPENAI_BUCKETS:
            out.append((name, value))
            continue
        if field == "reset":
            at = datetime.strptime(value.decode("latin-1"), _RFC3339).replace(tzinfo=UTC).timestamp()
            value = _duration(max(0, math.ceil(at - now))).encode()
        out.append((f"x-ratelimit-{field}-{_OPENAI_BUCKETS[bucket]}".encode(), value))
    return out


def _duration(seconds: int) -> str:
    """Seconds as OpenAI writes a reset: "0s", "17s", "6m0s", "1h0m0s"."""
    hours, rest = divmod(seconds, 3600)
    minutes, secs = divmod(rest, 60)
    if hours:
        return f"{hours}h{minutes}m{secs}s"
    return f"{minutes}m{secs}s" if minutes else f"{secs}s"


class RateLimiter(Protocol):
    async def acquire(self, *, key_id: str, limits: Limits, input_tokens: int) -> Decision:
        """If admitted, take one request unit and reserve up to `input_tokens`; else take nothing."""
        ...

    async def reserve(self, *, key_id: str, limits: Limits, input_tokens: int) -> Decision:
        """Reserve up to `input_tokens` (what is left, if less) for an admitted request; never refuses."""
        ...

    async def adjust(self, *, key_id: str, limits: Limits, requests: int, input_tokens: int) -> None:
        """Give units back (positive) or take more (negative, possibly into debt)."""
        ...


def _refill(tokens: float, last: float, now: float, limit: int) -> float:
    return min(float(limit), tokens + max(0.0, now - last) * limit / WINDOW_S)


def _view(limit: int, tokens: float, now: float) -> BucketView:
    return BucketView(limit, math.floor(tokens), now + (limit - tokens) * WINDOW_S / limit)


def _decision(limits: Limits, req: float, itok: float, wait: float, reserved: int, now: float) -> Decision:
    rpm, itpm = limits.requests_per_minute, limits.input_tokens_per_minute
    return Decision(
        allowed=wait == 0.0,
        retry_after_s=wait,
        requests=_view(rpm, req, now) if rpm else None,
        input_tokens=_view(itpm, itok, now) if itpm else None,
        reserved_input_tokens=reserved,
    )


def _wait_s(limit: int, tokens: float, cost: int) -> float:
    return max(0.0, (cost - tokens) * WINDOW_S / limit)


class MemoryRateLimiter:
    """Buckets in this process (one gateway process; use Redis for several)."""

    def __init__(self, clock: Callable[[], float] = time.time) -> None:
        self._clock = clock
        self._buckets: dict[tuple[str, str], tuple[float, float]] = {}

    def _level(self, key: tuple[str, str], limit: int, now: float) -> float:
        tokens, last = self._buckets.get(key, (float(limit), now))
        return _refill(tokens, last, now, limit)

    async def acquire(self, *, key_id: str, limits: Limits, input_tokens: int) -> Decision:
        now = self._clock()
        rpm, itpm = limits.requests_per_minute, limits.input_tokens_per_minute
        req = self._level((key_id, "req"), rpm, now) if rpm else 0.0
        itok = self._level((key_id, "itok"), itpm, now) if itpm else 0.0
        wait = max(_wait_s(rpm, req, 1) if rpm else 0.0, _wait_s(itpm, itok, 1) if itpm else 0.0)
        reserved = 0
        if wait == 0.0:
            req -= 1
            reserved = max(0, min(input_tokens, math.floor(itok)))
            itok -= reserved
        if rpm:
            self._buckets[(key_id, "req")] = (req, now)
        if itpm:
            self._buckets[(key_id, "itok")] = (itok, now)
        return _decision(limits, req, itok, wait, reserved, now)

    async def reserve(self, *, key_id: str, limits: Limits, input_tokens: int) -> Decision:
        now = self._clock()
        rpm, itpm = limits.requests_per_minute, limits.input_tokens_per_minute
        req = self._level((key_id, "req"), rpm, now) if rpm else 0.0
        itok = self._level((key_id, "itok"), itpm, now) if itpm else 0.0
        reserved = 0
        if itpm:
            reserved = max(0, min(input_tokens, math.floor(itok)))
            itok -= reserved
            self._buckets[(key_id, "itok")] = (itok, now)
        return _decision(limits, req, itok, 0.0, reserved, now)

    async def adjust(self, *, key_id: str, limits: Limits, requests: int, input_tokens: int) -> None:
        now = self._clock()
        for kind, limit, delta in (
            ("req", limits.requests_per_minute, requests),
            ("itok", limits.input_tokens_per_minute, input_tokens),
        ):
            if limit is None or delta == 0:
                continue
            level = self._level((key_id, kind), limit, now)
            self._buckets[(key_id, kind)] = (min(float(limit), level + delta), now)


# KEYS: request bucket, input-token bucket. ARGV: now, then (limit, amount) for each
# bucket (limit 0 = no such limit), then mode. "acquire": admit if every bucket has
# at least one unit, then take 1 request and reserve up to `amount` input tokens.
# "reserve": the same taking without the admission check (the request amount is 0).
# "adjust": add each amount unconditionally (negative amounts may leave debt).
# Returns the levels after, as strings (Lua integers would truncate), the wait in
# seconds, and the input tokens reserved.
_LUA = """
local now = tonumber(ARGV[1])
local mode = ARGV[6]
local levels = {}
local wait = 0
for i = 1, 2 do
  local limit = tonumber(ARGV[2 * i])
  if limit > 0 then
    local state = redis.call('HMGET', KEYS[i], 't', 'ts')
    local tokens = tonumber(state[1]) or limit
    local last = tonumber(state[2]) or now
    if now > last then tokens = math.min(limit, tokens + (now - last) * limit / 60.0) end
    levels[i] = tokens
    if mode == 'acquire' and tokens < 1 then
      wait = math.max(wait, (1 - tokens) * 60.0 / limit)
    end
  end
end
local reserved = 0
for i = 1, 2 do
  local limit = tonumber(ARGV[2 * i])
  local amount = tonumber(ARGV[2 * i + 1])
  if limit > 0 then
    if mode == 'acquire' or mode == 'reserve' then
      if wait == 0 then
        local take = amount
        if i == 2 then
          take = math.max(0, math.min(amount, math.floor(levels[i])))
          reserved = take
        end
        levels[i] = levels[i] - take
      end
    else
      levels[i] = math.min(limit, levels[i] + amount)
    end
    redis.call('HSET', KEYS[i], 't', tostring(levels[i]), 'ts', tostring(now))
    redis.call('EXPIRE', KEYS[i], 600)
  end
end
return {tostring(levels[1] or 0), tostring(levels[2] or 0), tostring(wait), tostring(reserved)}
"""


class RedisRateLimiter:
    """Buckets in Redis, shared by every gateway process pointing at it.

    While Redis cannot be reached (an error, or no answer within `timeout_s`), each process
    limits with buckets of its own (MemoryRateLimiter) rather than failing the request or
    letting everything through, and tries Redis again after `retry_s`; one log line per outage.
    A request admitted by one and settled by the other settles where it ends (a small error,
    bounded by that request's own units).
    """

    def __init__(
        self,
        url: str,
        *,
        prefix: str = "kvgate:rl:",
        clock: Callable[[], float] = time.time,
        timeout_s: float = 2.0,
        retry_s: float = 1.0,
    ) -> None:
        from redis.asyncio import Redis

        self._redis = Redis.from_url(url, socket_connect_timeout=timeout_s, socket_timeout=timeout_s)
        self._script = self._redis.register_script(_LUA)
        self._prefix = prefix
        self._clock = clock
        self._fallback = MemoryRateLimiter(clock)
        self._retry_s = retry_s
        self._down_until: float | None = None  # monotonic; None while Redis answers

    async def close(self) -> None:
        await self._redis.aclose()

    @property
    def using_fallback(self) -> bool:
        return self._down_until is not None

    async def _run(
        self, key_id: str, limits: Limits, req: int, itok: int, mode: str
    ) -> tuple[float, float, float, int] | None:
        """The script's answer, or None when Redis is away (the caller uses the fallback)."""
        if self._down_until is not None and time.monotonic() < self._down_until:
            return None
        now = self._clock()
        keys = [f"{self._prefix}{key_id}:req", f"{self._prefix}{key_id}:itok"]
        args = [now, limits.requests_per_minute or 0, req, limits.input_tokens_per_minute or 0, itok, mode]
        try:
            out = await self._script(keys=keys, args=args)
        except Exception as exc:  # redis' ConnectionError and TimeoutError, OSError: all mean "away"
            if self._down_until is None:
                log.warning("rate_limit_redis_unavailable", error=str(exc), fallback="per-process buckets")
            self._down_until = time.monotonic() + self._retry_s
            return None
        if self._down_until is not None:
            log.info("rate_limit_redis_back")
            self._down_until = None
        return float(out[0]), float(out[1]), float(out[2]), int(float(out[3]))

    async def acquire(self, *, key_id: str, limits: Limits, input_tokens: int) -> Decision:
        now = self._clock()
        out = await self._run(key_id, limits, 1, input_tokens, "acquire")
        if out is None:
            return await self._fallback.acquire(key_id=key_id, limits=limits, input_tokens=input_tokens)
        req, itok, wait, reserved = out
        return _decision(limits, req, itok, wait, reserved, now)

    async def reserve(self, *, key_id: str, limits: Limits, input_tokens: int) -> Decision:
        now = self._clock()
        out = await self._run(key_id, limits, 0, input_tokens, "reserve")
        if out is None:
            return await self._fallback.reserve(key_id=key_id, limits=limits, input_tokens=input_tokens)
        req, itok, _, reserved = out
        return _decision(limits, req, itok, 0.0, reserved, now)

    async def adjust(self, *, key_id: str, limits: Limits, requests: int, input_tokens: int) -> None:
        if not (requests or input_tokens):
            return
        if await self._run(key_id, limits, requests, input_tokens, "adjust") is None:
            await self._fallback.adjust(key_id=key_id, limits=limits, requests=requests, input_tokens=input_tokens)
