"""Auth-cache evictions shared by every gateway process, over Redis pub/sub (KVGATE_REDIS_URL).

Each gateway caches the keys it authenticated (gateway/auth_cache.py). When a key is revoked
or its scopes change, or a tenant is suspended, through the admin API of any gateway or the
CLI, the change is published on CHANNEL as one small JSON message ({"key_id": ...} or
{"tenant_id": ...}: ids, never a key or its hash), and every gateway evicts the matching
entries as the message arrives, so a revoked key stops everywhere at once rather than
after each process's fresh TTL.

Pub/sub delivers only to those listening, so a gateway that is not subscribed could miss a
revocation. Until its subscription is confirmed (at start, and after every disconnect) its
cache has no fresh entries (PrincipalCache.suspend_freshness: every request asks the
database, as with KVGATE_AUTH_CACHE_TTL_S=0), and entries cached before it listens again
are not fresh either. The subscriber reconnects with exponential backoff, and pings Redis
to notice a connection that died silently.

Without KVGATE_REDIS_URL none of this runs: the cache works as before, one process's
changes reaching the others within the fresh TTL.
"""

from __future__ import annotations

import asyncio
import json
import time
from typing import Any, NamedTuple

import structlog

from gateway.auth_cache import PrincipalCache

log = structlog.get_logger("kvgate.auth_invalidation")

CHANNEL = "kvgate:auth:evict"
# Subscriber's reconnect backoff, seconds.
BACKOFF_MIN_S = 0.1
BACKOFF_MAX_S = 5.0
# How often a quiet subscription pings Redis, and how long it waits for any message (pongs included)
# before it counts the connection as dead.
PING_EVERY_S = 5.0
SILENCE_LIMIT_S = 15.0
# A publish that cannot reach Redis gives up after this long: the change is in the database already.
PUBLISH_TIMEOUT_S = 2.0


class Eviction(NamedTuple):
    """What to drop from every gateway's auth cache: one key's entries, or a tenant's."""

    key_id: str | None = None
    tenant_id: str | None = None

    def encode(self) -> bytes:
        return json.dumps({k: v for k, v in self._asdict().items() if v is not None}).encode()

    @classmethod
    def decode(cls, data: bytes | str) -> Eviction | None:
        """The eviction a message holds; None for anything else (logged, never raised)."""
        try:
            body = json.loads(data)
            key_id, tenant_id = body.get("key_id"), body.get("tenant_id")
        except (ValueError, AttributeError):
            return None
        if not all(v is None or isinstance(v, str) for v in (key_id, tenant_id)) or (key_id, tenant_id) == (None, None):
            return None
        return cls(key_id=key_id, tenant_id=tenant_id)


def _redis(url: str) -> Any:
    from redis.asyncio import Redis

    return Redis.from_url(url, socket_connect_timeout=PUBLISH_TIMEOUT_S)


async def publish_eviction(redis_url: str | None, eviction: Eviction, *, channel: str = CHANNEL) -> bool:
    """Tell every gateway listening on `redis_url` to evict (the CLI's path); False if Redis was not reached."""
    if not redis_url:
        return False
    client = _redis(redis_url)
    try:
        await asyncio.wait_for(client.publish(channel, eviction.encode()), PUBLISH_TIMEOUT_S)
        return True
    except Exception as exc:  # the change is in the database; gateways see it within their TTL
        log.warning("auth_eviction_not_published", error=str(exc), **eviction._asdict())
        return False
    finally:
        await client.aclose()


class AuthInvalidation:
    """One gateway's side: evicts here at once, publishes to the others, applies theirs.

    With `redis_url` None, evict() only evicts here and start()/aclose() do nothing.
    """

    def __init__(
        self,
        cache: PrincipalCache,
        redis_url: str | None,
        *,
        channel: str = CHANNEL,
        ping_every_s: float = PING_EVERY_S,
        silence_limit_s: float = SILENCE_LIMIT_S,
    ) -> None:
        self.cache = cache
        self._url = redis_url
        self._channel = channel
        self._ping_every_s = ping_every_s
        self._silence_limit_s = silence_limit_s
        self._publisher: Any = None
        self._task: asyncio.Task[None] | None = None
        self.subscribed = asyncio.Event()

    @property
    def enabled(self) -> bool:
        return self._url is not None

    def start(self) -> None:
        """Subscribe in the background; the cache has no fresh entries until the subscription holds."""
        if self._url is None or self._task is not None:
            return
        self.cache.suspend_freshness()
        self._publisher = _redis(self._url)
        self._task = asyncio.get_running_loop().create_task(self._listen_forever())

    async def evict(self, eviction: Eviction) -> None:
        """Evict here, then publish (a failed publish is logged: the change is in the database already)."""
        self.cache.evict(key_id=eviction.key_id, tenant_id=eviction.tenant_id)
        if self._publisher is None:
            return
        try:
            await asyncio.wait_for(self._publisher.publish(self._channel, eviction.encode()), PUBLISH_TIMEOUT_S)
        except Exception as exc:  # the admin's change stands; others see it within their TTL
            log.warning("auth_eviction_not_published", error=str(exc), **eviction._asdict())

    async def aclose(self) -> None:
        if self._task is not None:
            self._task.cancel()
            await asyncio.gather(self._task, return_exceptions=True)
            self._task = None
        if self._publisher is not None:
            await self._publisher.aclose()
            self._publisher = None

    async def _listen_forever(self) -> None:
        assert self._url is not None
        backoff = BACKOFF_MIN_S
        while True:
            try:
                await self._listen_once()
            except asyncio.CancelledError:
                raise
            except Exception as exc:  # any failure means: reconnect
                log.warning("auth_invalidation_disconnected", error=str(exc), retry_in_s=backoff)
            finally:
                if self.subscribed.is_set():
                    backoff = BACKOFF_MIN_S  # it held for a while: start the backoff afresh
                self.subscribed.clear()
                self.cache.suspend_freshness()
            await asyncio.sleep(backoff)
            backoff = min(backoff * 2, BACKOFF_MAX_S)

    async def _listen_once(self) -> None:
        client = _redis(self._url or "")
        pubsub = client.pubsub()
        try:
            await pubsub.subscribe(self._channel)
            last_heard = time.monotonic()
            last_ping = last_heard
            while True:
                message = await pubsub.get_message(timeout=min(1.0, self._ping_every_s))
                now = time.monotonic()
                if message is not None:
                    last_heard = now
                    self._on_message(message)
                elif now - last_heard > self._silence_limit_s:
                    raise ConnectionError(f"no answer from Redis for {self._silence_limit_s:g} s")
                if now - last_ping >= self._ping_every_s:
                    await pubsub.ping()  # its pong is a message: what keeps a live connection heard
                    last_ping = now
        finally:
            await pubsub.aclose()
            await client.aclose()

    def _on_message(self, message: dict[str, Any]) -> None:
        kind = message.get("type")
        if kind == "subscribe":
            # From here on every eviction reaches us; entries stored before may have missed one.
            self.cache.resume_freshness()
            self.subscribed.set()
            log.info("auth_invalidation_subscribed", channel=self._channel)
        elif kind == "message":
            eviction = Eviction.decode(message.get("data", b""))
            if eviction is None:
                log.warning("auth_eviction_unreadable", data=str(message.get("data"))[:200])
                return
            self.cache.evict(key_id=eviction.key_id, tenant_id=eviction.tenant_id)
