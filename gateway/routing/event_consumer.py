"""Feeds the router's BlockIndex from the engines' KV events on NATS JetStream.

One consumer per gateway process and model: an ephemeral ordered push consumer on
kv_events.model_subjects(model_id), delivering new messages only, so every gateway replica
reads every engine's events and keeps its own index (no shared state to diverge: each replica
converges to the engines' truth, resyncing where it missed something).

Each engine's batches carry `seq`, +1 per batch from 1 at the engine's start. Per engine the
consumer keeps the last seq it applied; a batch that does not follow it (a gap: events lost or
aged out of the stream; a seq going back: the engine restarted; or the first batch seen from an
engine) starts a resync: `GET {base_url}/kv/snapshot` (timeout, retries with backoff), whose
KVSnapshot replaces that engine's entries. Batches arriving meanwhile are buffered and applied
afterwards if newer than the snapshot's seq. A resync that keeps failing drops the engine's
entries and marks it uncovered, so the router falls back to remembering its own choices there
until the next batch from it tries again. At start (and through `resync()`, when the pool adds
an engine) every known engine is resynced, so idle engines' blocks are known too.

An undecodable message is logged, counted and skipped. NATS unreachable: logged, retried with
backoff, and `covers()` is false meanwhile, so the router falls back.
"""

from __future__ import annotations

import asyncio
import contextlib
import math
import time
from collections.abc import Callable, Mapping
from dataclasses import dataclass, field
from typing import TYPE_CHECKING

import httpx
import msgspec
import nats
import structlog
from nats.js.api import DeliverPolicy, StorageType, StreamConfig
from nats.js.errors import BadRequestError, NotFoundError

from gateway.routing.index import BlockIndex
from kvgate.kv_events import (
    STREAM_NAME,
    SUBJECT_PREFIX,
    KVEventBatch,
    KVSnapshot,
    SnapshotBlock,
    decode_batch,
    model_subjects,
)

if TYPE_CHECKING:
    from nats.aio.client import Client
    from nats.aio.msg import Msg
    from nats.js import JetStreamContext

    from gateway.routing.metrics import RoutingMetrics

log = structlog.get_logger("kvgate.gateway.routing")

STREAM_MAX_AGE_S = 3600.0
SNAPSHOT_SLICE = 5000  # blocks added to the index between yields to the event loop (a few ms each)


async def ensure_stream(js: JetStreamContext) -> None:
    """The KV event stream, created if missing (whoever comes first: an engine or a router)."""
    try:
        await js.stream_info(STREAM_NAME)
        return
    except NotFoundError:
        pass
    config = StreamConfig(
        name=STREAM_NAME, subjects=[f"{SUBJECT_PREFIX}.>"], max_age=STREAM_MAX_AGE_S, storage=StorageType.FILE
    )
    try:
        await js.add_stream(config)
    except BadRequestError:
        await js.stream_info(STREAM_NAME)  # created by another process in between: it exists now


class _SnapshotBlockJSON(msgspec.Struct):
    block_hash: str
    medium: str
    expires_at: float | None = None  # JSON has no infinity: msgspec writes an unending block's as null


class _SnapshotJSON(msgspec.Struct):
    engine_id: str
    seq: int
    blocks: list[_SnapshotBlockJSON]


def decode_snapshot(data: bytes) -> KVSnapshot:
    """A `GET /kv/snapshot` body (KVSnapshot as JSON); a null expiry (a block that never expires) reads as
    infinity. Raises msgspec.DecodeError on anything else."""
    raw = msgspec.json.decode(data, type=_SnapshotJSON)
    blocks = [
        SnapshotBlock(b.block_hash, b.medium, math.inf if b.expires_at is None else b.expires_at) for b in raw.blocks
    ]
    return KVSnapshot(raw.engine_id, raw.seq, blocks)


@dataclass
class _EngineState:
    last_seq: int | None = None  # None: nothing applied since the last (failed or missing) resync
    resyncing: bool = False
    buffer: list[KVEventBatch] = field(default_factory=list)
    failed: bool = False
    unknown_logged: bool = False


class KVEventConsumer:
    """start() in the app's lifespan, close() at its end; covers(engine_id) tells the router whether that
    engine's events reach the index.

    `engines` maps the engine ids that publish events to their base URLs (the pool's, from /kv/info);
    it is read at each use, so the pool may update it in place. `now` is the wall clock the events'
    expiries are in.
    """

    def __init__(
        self,
        index: BlockIndex,
        *,
        nats_url: str,
        model_id: str,
        engines: Mapping[str, str],
        metrics: RoutingMetrics | None = None,
        now: Callable[[], float] = time.time,
        snapshot_timeout_s: float = 10.0,
        resync_attempts: int = 5,
        backoff_s: float = 0.2,
        max_backoff_s: float = 10.0,
        engine_token: str | None = None,
    ) -> None:
        self.index = index
        self._headers = {"authorization": f"Bearer {engine_token}"} if engine_token else {}
        self.nats_url = nats_url
        self.model_id = model_id
        self.engines = engines
        self.metrics = metrics
        self._now = now
        self._timeout = snapshot_timeout_s
        self._attempts = resync_attempts
        self._backoff = backoff_s
        self._max_backoff = max_backoff_s
        self._states: dict[str, _EngineState] = {}
        self._tasks: set[asyncio.Task[None]] = set()
        self._runner: asyncio.Task[None] | None = None
        self._nc: Client | None = None
        self._http: httpx.AsyncClient | None = None
        self._subscribed = False
        self._connected = False

    # -- lifecycle ----------------------------------------------------------------------------------

    async def start(self) -> None:
        """Returns at once; connecting (and retrying) happens in the background."""
        self._http = httpx.AsyncClient(timeout=self._timeout, headers=self._headers)
        self._runner = asyncio.create_task(self._run(), name="kv-event-consumer")

    async def close(self) -> None:
        tasks = [*self._tasks, *([self._runner] if self._runner else [])]
        for task in tasks:
            task.cancel()
        await asyncio.gather(*tasks, return_exceptions=True)
        self._subscribed = self._connected = False
        await self._close_connection()
        if self._http is not None:
            await self._http.aclose()

    @property
    def subscribed(self) -> bool:
        """Connected to NATS and subscribed to the model's events."""
        return self._subscribed and self._connected

    def covers(self, engine_id: str) -> bool:
        """Whether the index follows this engine's events (else the router inserts what it routes there)."""
        state = self._states.get(engine_id)
        return self.subscribed and engine_id in self.engines and not (state is not None and state.failed)

    def last_seq(self, engine_id: str) -> int | None:
        """The last batch applied from this engine (a snapshot's seq counts); None before any."""
        state = self._states.get(engine_id)
        return state.last_seq if state is not None else None

    def buffered(self, engine_id: str) -> int:
        """Batches from this engine held back while its resync runs."""
        state = self._states.get(engine_id)
        return len(state.buffer) if state is not None else 0

    async def _run(self) -> None:
        delay = self._backoff
        while True:
            lost = asyncio.Event()
            try:
                await self._connect_and_subscribe(lost)
            except asyncio.CancelledError:
                raise
            except Exception as exc:  # NATS down, or JetStream off: retry; the router falls back meanwhile
                log.warning("kv_events_unavailable", url=self.nats_url, error=str(exc) or type(exc).__name__)
                await self._close_connection()
                await asyncio.sleep(delay)
                delay = min(delay * 2, self._max_backoff)
                continue
            delay = self._backoff
            # Subscribed to new events only: what engines hold already comes from their snapshots.
            for engine_id in list(self.engines):
                self.resync(engine_id)
            await lost.wait()
            self._subscribed = self._connected = False
            log.warning("kv_events_connection_lost", url=self.nats_url)
            await self._close_connection()

    async def _close_connection(self) -> None:
        nc, self._nc = self._nc, None
        if nc is not None and not nc.is_closed:
            with contextlib.suppress(Exception):
                await nc.close()

    async def _connect_and_subscribe(self, lost: asyncio.Event) -> None:
        async def disconnected() -> None:
            self._connected = False

        async def reconnected() -> None:
            # Back within nats-py's one retry (a NATS restart of a second): batches may have been missed
            # meanwhile, and the ephemeral consumer may not have survived the restart. Start afresh, as
            # for a lost connection: a new subscription, and every engine resynced.
            lost.set()

        async def closed() -> None:
            lost.set()

        async def error(exc: Exception) -> None:
            log.debug("kv_events_error", error=str(exc) or type(exc).__name__)

        # nats-py's own reconnection is cut short (one retry), so that a lost server ends up in the
        # loop above: a fresh subscription and resyncs, with backoff and a log line per attempt; a
        # reconnection that succeeds goes the same way.
        self._nc = await nats.connect(
            servers=[self.nats_url],
            connect_timeout=5,
            max_reconnect_attempts=1,
            reconnect_time_wait=1,
            disconnected_cb=disconnected,
            reconnected_cb=reconnected,
            closed_cb=closed,
            error_cb=error,
        )
        self._connected = True
        js = self._nc.jetstream()
        await ensure_stream(js)
        await js.subscribe(
            model_subjects(self.model_id),
            stream=STREAM_NAME,
            cb=self._on_message,
            ordered_consumer=True,
            deliver_policy=DeliverPolicy.NEW,
        )
        self._subscribed = True
        log.info("kv_events_subscribed", subject=model_subjects(self.model_id))

    async def _on_message(self, msg: Msg) -> None:
        try:
            self.handle(msg.data)
        except Exception as exc:  # a bug or a batch the index cannot take: one message lost, never the consumer
            log.exception("kv_events_message_failed", error=str(exc) or type(exc).__name__)

    # -- batches ------------------------------------------------------------------------------------

    def handle(self, data: bytes) -> None:
        """One message: decoded, checked against its engine's last seq, applied, buffered or resynced."""
        try:
            batch = decode_batch(data)
        except msgspec.DecodeError as exc:
            self._bad_message(str(exc))
            return
        if not batch.engine_id:
            self._bad_message("a batch without engine_id")
            return
        state = self._states.setdefault(batch.engine_id, _EngineState())
        if state.resyncing:
            state.buffer.append(batch)
            return
        self._apply_in_order(batch.engine_id, state, batch)

    def _apply_in_order(self, engine_id: str, state: _EngineState, batch: KVEventBatch) -> None:
        if batch.seq == 0:  # a relay without sequence numbers: nothing to check
            self.index.apply(engine_id, batch, now=self._now())
            return
        if state.last_seq is not None and batch.seq == state.last_seq + 1:
            self.index.apply(engine_id, batch, now=self._now())
            state.last_seq = batch.seq
            return
        if state.last_seq is not None:
            log.info("kv_events_gap", engine=engine_id, last_seq=state.last_seq, seq=batch.seq)
            if self.metrics is not None:
                self.metrics.event_gaps.labels(engine_id).inc()
        if engine_id not in self.engines:
            # No URL to resync from (the pool has not met this engine yet, or it is not in this pool):
            # keep what the events say from here on, dropping what a gap may have made stale.
            if not state.unknown_logged:
                state.unknown_logged = True
                log.info("kv_events_unknown_engine", engine=engine_id)
            if state.last_seq is not None:
                self.index.forget_engine(engine_id)
            self.index.apply(engine_id, batch, now=self._now())
            state.last_seq = batch.seq
            return
        state.buffer.append(batch)
        self.resync(engine_id)

    def _bad_message(self, why: str) -> None:
        log.warning("kv_events_bad_message", error=why)
        if self.metrics is not None:
            self.metrics.bad_messages.inc()

    # -- resync -------------------------------------------------------------------------------------

    def resync(self, engine_id: str) -> None:
        """Reload one engine's entries from its snapshot, in the background (no-op while one runs). The pool
        calls it when it adds an engine to `engines`; batches from engines not in it are applied as they
        come, without resyncs, and such engines are not covered."""
        state = self._states.setdefault(engine_id, _EngineState())
        if state.resyncing:
            return
        state.resyncing = True
        task = asyncio.create_task(self._resync(engine_id, state), name=f"kv-resync-{engine_id}")
        self._tasks.add(task)
        task.add_done_callback(self._tasks.discard)

    async def _resync(self, engine_id: str, state: _EngineState) -> None:
        snapshot = None
        delay = self._backoff
        # An engine the pool gave no URL for (not one of ours, or not yet known) cannot be resynced.
        attempts = self._attempts if engine_id in self.engines else 0
        for attempt in range(attempts):
            if attempt:
                await asyncio.sleep(delay)
                delay = min(delay * 2, self._max_backoff)
            try:
                snapshot = await self._fetch_snapshot(engine_id)
                break
            except asyncio.CancelledError:
                raise
            except Exception as exc:
                log.warning("kv_resync_failed", engine=engine_id, attempt=attempt + 1, error=str(exc) or repr(exc))
        if snapshot is not None:
            # In slices, yielding between them: the gateway keeps serving meanwhile, and this engine's
            # batches keep being buffered until the whole snapshot is in.
            self.index.forget_engine(engine_id)
            for start in range(0, len(snapshot.blocks), SNAPSHOT_SLICE):
                self.index.add_snapshot_blocks(
                    engine_id, snapshot.blocks[start : start + SNAPSHOT_SLICE], now=self._now()
                )
                await asyncio.sleep(0)
        pending, state.buffer = sorted(state.buffer, key=lambda b: b.seq), []
        state.resyncing = False
        if snapshot is None:
            # Stale entries would mislead: forget them; the next batch from this engine tries again.
            log.warning("kv_resync_gave_up", engine=engine_id, known=engine_id in self.engines)
            self.index.forget_engine(engine_id)
            state.last_seq, state.failed = None, True
            if self.metrics is not None:
                self.metrics.resyncs.labels(engine_id, "failed").inc()
            return
        state.last_seq, state.failed = snapshot.seq, False
        if self.metrics is not None:
            self.metrics.resyncs.labels(engine_id, "ok").inc()
        log.info("kv_resynced", engine=engine_id, seq=snapshot.seq, blocks=len(snapshot.blocks))
        for batch in pending:
            if batch.seq > snapshot.seq and not state.resyncing:
                self._apply_in_order(engine_id, state, batch)
            elif state.resyncing:
                state.buffer.append(batch)  # a gap after the snapshot started another resync: keep the rest

    async def _fetch_snapshot(self, engine_id: str) -> KVSnapshot:
        base_url = self.engines[engine_id]
        assert self._http is not None, "start() first"
        response = await self._http.get(f"{base_url.rstrip('/')}/kv/snapshot")
        response.raise_for_status()
        # Off the event loop: an engine with large tiers sends a large snapshot.
        snapshot = await asyncio.to_thread(decode_snapshot, response.content)
        if snapshot.engine_id != engine_id:
            raise ValueError(f"{base_url} answers as engine {snapshot.engine_id!r}, not {engine_id!r}")
        return snapshot
