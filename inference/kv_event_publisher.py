"""Sends an engine's KV event batches to NATS JetStream, from a thread of its own, never holding the engine up.

The engine thread hands over each batch (`submit`: a deque append, and a wake-up of this
thread's event loop when it sleeps). This thread encodes each batch (msgpack, kvgate.kv_events)
and publishes it on the engine's subject, awaiting JetStream's ack, in seq order.

Failures never reach the engine: while NATS is unreachable, or when a publish fails or
times out, that batch is dropped and its seq stays consumed, so a router sees the gap and
resyncs from GET /kv/snapshot. The connection is re-made with exponential backoff (0.1 s
doubling to 5 s); the stream is created (idempotently) after every connect. A queue of
more than `max_queue` batches (NATS too slow) drops the oldest.
"""

from __future__ import annotations

import asyncio
import collections
import contextlib
import threading
from typing import TYPE_CHECKING, Any
from urllib.parse import urlsplit, urlunsplit

import structlog

from kvgate import kv_events
from kvgate.kv_events import KVEventBatch

if TYPE_CHECKING:
    from inference.engine import Engine


def credentials_hidden(url: str) -> str:
    """The URL as logs may show it: a token or password (nats://TOKEN@host) replaced by ***."""
    parts = urlsplit(url)
    if "@" not in parts.netloc:
        return url
    return urlunsplit(parts._replace(netloc="***@" + parts.netloc.rsplit("@", 1)[1]))


log = structlog.get_logger(__name__)

STREAM_MAX_AGE_S = 3600.0


async def ensure_stream(js: Any) -> None:
    """Create kv_events.STREAM_NAME (subjects "kvgate.kv.>", file storage, 1 h max age) unless it exists."""
    from nats.js.api import StorageType
    from nats.js.errors import BadRequestError, NotFoundError

    try:
        await js.stream_info(kv_events.STREAM_NAME)
        return
    except NotFoundError:
        pass
    try:
        await js.add_stream(
            name=kv_events.STREAM_NAME,
            subjects=[f"{kv_events.SUBJECT_PREFIX}.>"],
            max_age=STREAM_MAX_AGE_S,
            storage=StorageType.FILE,
        )
    except BadRequestError:
        await js.stream_info(kv_events.STREAM_NAME)  # created by another process meanwhile


class KVEventPublisher:
    """Publishes KVEventBatches on one subject; `published` and `dropped` count batches."""

    def __init__(
        self,
        url: str,
        subject: str,
        *,
        max_queue: int = 1024,
        connect_timeout_s: float = 2.0,
        publish_timeout_s: float = 2.0,
        max_backoff_s: float = 5.0,
    ) -> None:
        self.url = url
        self.subject = subject
        self.max_queue = max_queue
        self.connect_timeout_s = connect_timeout_s
        self.publish_timeout_s = publish_timeout_s
        self.max_backoff_s = max_backoff_s
        self.published = 0
        self.dropped = 0
        self.last_published_seq = 0
        self._queue: collections.deque[KVEventBatch] = collections.deque()
        self._loop = asyncio.new_event_loop()
        self._wake = asyncio.Event()
        self._wake_pending = False
        self._closing = False
        self._nc: Any = None
        self._js: Any = None
        self._stream_ok = False
        self._down = False  # a connection attempt failed, or the connection was lost: batches are dropped
        self._connected = threading.Event()
        self._thread = threading.Thread(target=self._run, name="kvgate-kv-events", daemon=True)

    @property
    def connected(self) -> bool:
        nc = self._nc
        return nc is not None and nc.is_connected

    def start(self) -> None:
        self._thread.start()

    def wait_connected(self, timeout_s: float) -> bool:
        """Block until connected to NATS (tests, start-up logs); False on timeout."""
        return self._connected.wait(timeout_s)

    # -- the engine thread ----------------------------------------------------------------

    def submit(self, batch: KVEventBatch) -> None:
        """Queue a batch for publishing; never blocks and never raises."""
        if len(self._queue) >= self.max_queue:
            with contextlib.suppress(IndexError):
                self._queue.popleft()
                self.dropped += 1
        self._queue.append(batch)
        if not self._wake_pending:
            self._wake_pending = True
            try:
                self._loop.call_soon_threadsafe(self._wake.set)
            except RuntimeError:  # the loop is closed: the publisher is gone
                self._queue.clear()
                self.dropped += 1

    def close(self, timeout_s: float = 5.0) -> None:
        """Publish what is queued (within timeout_s), then disconnect and stop the thread."""
        if not self._thread.is_alive():
            return
        self._closing = True
        with contextlib.suppress(RuntimeError):
            self._loop.call_soon_threadsafe(self._wake.set)
        self._thread.join(timeout_s)
        if self._thread.is_alive():
            log.warning("kv_events_publisher_stuck_at_close", queued=len(self._queue))

    # -- its own thread -------------------------------------------------------------------

    def _run(self) -> None:
        asyncio.set_event_loop(self._loop)
        try:
            self._loop.run_until_complete(self._main())
        finally:
            self._loop.close()

    async def _main(self) -> None:
        connector = asyncio.create_task(self._connect_loop())
        try:
            while True:
                await self._wake.wait()
                self._wake.clear()
                self._wake_pending = False
                while self._queue:
                    if self._js is None and not self._down and not self._closing:
                        break  # the first connection is being made: hold the batches (the connector wakes us)
                    await self._publish(self._queue.popleft())
                if self._closing:
                    break
        finally:
            connector.cancel()
            with contextlib.suppress(BaseException):
                await connector
            if self._nc is not None:
                with contextlib.suppress(Exception):
                    await asyncio.wait_for(self._nc.close(), self.connect_timeout_s)

    async def _publish(self, batch: KVEventBatch) -> None:
        js = self._js
        if js is None or not self.connected:
            self.dropped += 1
            return
        try:
            if not self._stream_ok:
                await ensure_stream(js)
                self._stream_ok = True
            await js.publish(self.subject, kv_events.encode_batch(batch), timeout=self.publish_timeout_s)
        except Exception as exc:
            # The stream may be gone (a NATS restart with memory storage): make sure of it next time.
            self._stream_ok = False
            self.dropped += 1
            log.warning("kv_events_publish_failed", seq=batch.seq, error=repr(exc))
            return
        self.published += 1
        self.last_published_seq = batch.seq

    def _mark(self, *, down: bool) -> None:
        self._down = down
        self._wake.set()  # held batches go out, or are dropped

    async def _connect_loop(self) -> None:
        import nats

        backoff = 0.1
        failures = 0
        while not self._closing:
            closed = asyncio.Event()

            async def on_closed() -> None:
                closed.set()  # noqa: B023 (each connection gets its own event)

            async def on_error(exc: Exception) -> None:
                log.debug("kv_events_nats_error", error=repr(exc))

            try:
                nc = await nats.connect(
                    self.url,
                    connect_timeout=self.connect_timeout_s,
                    allow_reconnect=False,  # reconnects are ours, with backoff
                    # nats-py retries a refused first connect up to this many times anyway; keep it short.
                    max_reconnect_attempts=1,
                    reconnect_time_wait=0.1,
                    closed_cb=on_closed,
                    disconnected_cb=on_closed,
                    error_cb=on_error,
                )
            except Exception as exc:
                if failures == 0:
                    log.warning("kv_events_nats_unreachable", url=credentials_hidden(self.url), error=repr(exc))
                failures += 1
                self._mark(down=True)
                await asyncio.sleep(backoff)
                backoff = min(backoff * 2, self.max_backoff_s)
                continue
            self._nc, self._js, self._stream_ok = nc, nc.jetstream(), False
            log.info(
                "kv_events_nats_connected",
                url=credentials_hidden(self.url),
                subject=self.subject,
                after_failures=failures,
            )
            backoff, failures = 0.1, 0
            self._connected.set()
            self._mark(down=False)
            await closed.wait()
            self._connected.clear()
            self._js = None
            self._mark(down=True)
            with contextlib.suppress(Exception):
                await nc.close()
            log.warning("kv_events_nats_disconnected", url=credentials_hidden(self.url))


def attach_publisher(engine: Engine) -> KVEventPublisher | None:
    """Start publishing the engine's KV events to its NATS server; None when it collects none."""
    if engine.kv_events is None or engine.settings.nats_url is None:
        return None
    subject = engine.kv_events_subject
    assert subject is not None
    publisher = KVEventPublisher(engine.settings.nats_url, subject)
    publisher.start()
    engine.kv_events.set_sink(publisher.submit)
    engine.kv_event_publisher = publisher
    return publisher
