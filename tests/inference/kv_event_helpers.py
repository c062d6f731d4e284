"""Reading an engine's KV events back from the real NATS JetStream, replaying them, and the engine's own view."""

from __future__ import annotations

import asyncio
import threading
import uuid
from collections.abc import Iterable
from typing import Any

import nats

from inference.engine import Engine
from inference.hashing import BlockHash
from kvgate import kv_events
from kvgate.kv_events import AllBlocksCleared, BlockRemoved, BlockStored, KVEventBatch, KVSnapshot

NATS_URL = "nats://127.0.0.1:4222"
State = dict[tuple[str, BlockHash], float]  # (medium, hash) -> expires_at


def unique_engine_id() -> str:
    return f"test-{uuid.uuid4().hex[:16]}"


async def read_batches_async(subject: str, *, until_seq: int, timeout_s: float = 60.0) -> list[KVEventBatch]:
    """Every batch on subject, from the start of the stream, until one with seq >= until_seq."""
    nc = await nats.connect(NATS_URL)
    try:
        sub = await nc.jetstream().subscribe(subject, ordered_consumer=True)
        batches: list[KVEventBatch] = []
        loop = asyncio.get_running_loop()
        deadline = loop.time() + timeout_s
        while not batches or batches[-1].seq < until_seq:
            msg = await sub.next_msg(timeout=max(0.1, deadline - loop.time()))
            batches.append(kv_events.decode_batch(msg.data))
        await sub.unsubscribe()
        return batches
    finally:
        await nc.close()


def read_batches(subject: str, *, until_seq: int, timeout_s: float = 60.0) -> list[KVEventBatch]:
    return asyncio.run(read_batches_async(subject, until_seq=until_seq, timeout_s=timeout_s))


async def purge_async(subject: str) -> None:
    nc = await nats.connect(NATS_URL)
    try:
        await nc.jetstream().purge_stream(kv_events.STREAM_NAME, subject=subject)
    finally:
        await nc.close()


def purge(subject: str) -> None:
    asyncio.run(purge_async(subject))


def replay(batches: Iterable[KVEventBatch], state: State | None = None) -> State:
    """Apply batches in order, as a router would; checks that no event carries token ids."""
    state = {} if state is None else state
    for batch in batches:
        for event in batch.events:
            if isinstance(event, AllBlocksCleared):
                state.clear()
            elif isinstance(event, BlockStored):
                assert event.token_ids == [], "token ids left the engine"
                assert event.medium is not None and event.expires_at is not None
                for h in event.block_hashes:
                    state[(event.medium, h)] = event.expires_at
            elif isinstance(event, BlockRemoved):
                assert event.medium is not None
                for h in event.block_hashes:
                    state.pop((event.medium, h), None)
    return state


def snapshot_state(snapshot: KVSnapshot) -> State:
    return {(b.medium, bytes.fromhex(b.block_hash)): b.expires_at for b in snapshot.blocks}


def live_blocks(engine: Engine) -> set[tuple[str, BlockHash]]:
    """What the engine really holds live, by medium: the truth the events must add up to."""
    now = engine.clock.now()
    out = {(engine.pool.medium, h) for h, b in engine.pool.cached.items() if b.ref_count > 0 or b.expires_at > now}
    for tier in engine.tiers.tiers if engine.tiers is not None else []:
        tier.flush()
        out |= {(tier.medium, e.block_hash) for e in tier.index if not e.expired(now)}  # type: ignore[attr-defined]
    return out


def stored_events(batches: Iterable[KVEventBatch], medium: str) -> list[BlockStored]:
    return [e for b in batches for e in b.events if isinstance(e, BlockStored) and e.medium == medium]


def removed_hashes(batches: Iterable[KVEventBatch], medium: str) -> list[BlockHash]:
    return [
        h
        for b in batches
        for e in b.events
        if isinstance(e, BlockRemoved) and e.medium == medium
        for h in e.block_hashes
    ]


class CuttableProxy:
    """A TCP proxy to NATS on a free loopback port, whose link can be cut and restored (NATS itself is shared)."""

    def __init__(self, target: tuple[str, int] = ("127.0.0.1", 4222)) -> None:
        self.target = target
        self.loop = asyncio.new_event_loop()
        self.server: asyncio.Server | None = None
        self.writers: set[asyncio.StreamWriter] = set()
        self.port = 0
        self.thread = threading.Thread(target=self.loop.run_forever, name="test-nats-proxy", daemon=True)
        self.thread.start()
        self.restore()

    @property
    def url(self) -> str:
        return f"nats://127.0.0.1:{self.port}"

    def _run(self, coro: Any) -> Any:
        return asyncio.run_coroutine_threadsafe(coro, self.loop).result(timeout=30)

    def restore(self) -> None:
        """Accept connections again (on the same port)."""
        self._run(self._listen())

    def cut(self) -> None:
        """Stop accepting and close every open connection."""
        self._run(self._cut())

    def close(self) -> None:
        self.cut()
        self.loop.call_soon_threadsafe(self.loop.stop)
        self.thread.join(timeout=10)

    async def _listen(self) -> None:
        self.server = await asyncio.start_server(self._handle, "127.0.0.1", self.port)
        self.port = self.server.sockets[0].getsockname()[1]

    async def _cut(self) -> None:
        if self.server is not None:
            self.server.close()
            self.server = None
        for writer in list(self.writers):
            writer.close()
        self.writers.clear()

    async def _handle(self, reader: asyncio.StreamReader, writer: asyncio.StreamWriter) -> None:
        up_reader, up_writer = await asyncio.open_connection(*self.target)
        self.writers |= {writer, up_writer}

        async def pipe(src: asyncio.StreamReader, dst: asyncio.StreamWriter) -> None:
            try:
                while data := await src.read(65536):
                    dst.write(data)
                    await dst.drain()
            except (ConnectionError, OSError):
                pass
            finally:
                dst.close()

        await asyncio.gather(pipe(reader, up_writer), pipe(up_reader, writer))
