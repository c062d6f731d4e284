"""Reading an engine's KV events back from the real NATS JetStream, replaying them, and the engine's own view."""

from __future__ import annotations

import asyncio
import uuid
from collections.abc import Iterable

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
