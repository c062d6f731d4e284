"""The engine's KV events, read back from the real NATS JetStream: stores, evictions, expiry, tiers, restarts."""

from __future__ import annotations

import asyncio
import random
import socket
import time
from collections.abc import Callable, Iterator
from pathlib import Path
from typing import Any

import pytest

from inference.async_engine import AsyncEngine
from inference.clock import ManualClock
from inference.engine import Engine
from inference.kv_event_publisher import KVEventPublisher, attach_publisher
from inference.settings import EngineSettings
from inference.types import CacheRegion, CacheSpec
from kvgate import kv_events
from kvgate.kv_events import AllBlocksCleared, KVEventBatch
from tests.inference.helpers import GREEDY, checked, random_prompt
from tests.inference.kv_event_helpers import (
    NATS_URL,
    CuttableProxy,
    live_blocks,
    purge,
    purge_async,
    read_batches,
    read_batches_async,
    removed_hashes,
    replay,
    snapshot_state,
    stored_events,
    unique_engine_id,
)
from tests.inference.tiers.helpers import ONE_TOKEN, committed_hashes, location, push_down

Evented = Callable[..., tuple[Engine, KVEventPublisher]]


@pytest.fixture
def evented(make_engine: Callable[..., Engine], tiny_llama_dir: Path) -> Iterator[Evented]:
    """evented(url=NATS_URL, **settings): an engine on a manual clock publishing its KV events, and its publisher."""
    made: list[tuple[Engine, KVEventPublisher]] = []

    def make(*, url: str = NATS_URL, **overrides: Any) -> tuple[Engine, KVEventPublisher]:
        engine = make_engine(tiny_llama_dir, nats_url=url, engine_id=unique_engine_id(), **overrides)
        publisher = attach_publisher(engine)
        assert publisher is not None
        made.append((engine, publisher))
        return engine, publisher

    yield make
    for engine, publisher in made:
        engine.close()
        publisher.close()
        purge(engine.kv_events_subject)  # type: ignore[arg-type]


def published(engine: Engine) -> list[KVEventBatch]:
    """Sweep expiries now, flush, and read every batch the engine has published so far."""
    engine.kv_events_tick(sweep=True)
    assert engine.kv_events is not None and engine.kv_events_subject is not None
    return read_batches(engine.kv_events_subject, until_seq=engine.kv_events.seq)


def assert_consistent(engine: Engine, batches: list[KVEventBatch]) -> None:
    """Seqs run 1, 2, 3...; the replay is exactly what the engine holds live, and what its snapshot says."""
    assert [b.seq for b in batches] == list(range(1, len(batches) + 1))
    assert all(b.engine_id == engine.engine_id for b in batches)
    state = replay(batches)
    assert set(state) == live_blocks(engine)
    assert engine.kv_events is not None
    snapshot = engine.kv_events.snapshot()
    assert snapshot.seq == batches[-1].seq and snapshot_state(snapshot) == state


def test_a_requests_blocks_are_published_as_a_chain_on_the_engines_subject(evented):
    engine, publisher = evented()
    assert engine.kv_events_subject == kv_events.subject(engine.model_id, engine.engine_id)
    rng = random.Random(1601)
    prompt = random_prompt(rng, 50)  # 3 committed blocks
    checked(engine.generate(prompt, GREEDY, CacheSpec(salt="tenant-a")))
    batches = published(engine)
    assert isinstance(batches[0].events[0], AllBlocksCleared)
    hashes = committed_hashes(engine, prompt, "tenant-a")
    (stored,) = stored_events(batches, "CPU")
    assert stored.block_hashes == hashes and stored.parent_block_hash is None
    assert stored.token_ids == [] and stored.block_size == 16
    assert stored.ttl_s == 300 and stored.expires_at == engine.clock.now() + 300

    # A longer prompt sharing the prefix stores only its new blocks, chained on the last shared one.
    longer = prompt[:48] + random_prompt(rng, 40)
    out = checked(engine.generate(longer, GREEDY, CacheSpec(salt="tenant-a")))
    assert out.usage.cached_tokens == 48
    batches = published(engine)
    new = stored_events(batches, "CPU")[1:]
    assert [h for e in new for h in e.block_hashes] == committed_hashes(engine, longer, "tenant-a")[3:]
    assert new[0].parent_block_hash == hashes[-1]
    # Regions: only the blocks they cover, with their TTL; another salt: other hashes.
    checked(engine.generate(prompt, GREEDY, CacheSpec(salt="tenant-b", regions=(CacheRegion(end=32, ttl_s=3600),))))
    batches = published(engine)
    regioned = [e for e in stored_events(batches, "CPU") if e.ttl_s == 3600]  # one per prefill pass
    tenant_b = committed_hashes(engine, prompt, "tenant-b")[:2]
    assert [h for e in regioned for h in e.block_hashes] == tenant_b and not set(tenant_b) & set(hashes)
    assert regioned[0].parent_block_hash is None and regioned[-1].parent_block_hash in (None, tenant_b[0])
    assert_consistent(engine, batches)
    assert publisher.published == len(batches) and publisher.dropped == 0


def test_evicted_blocks_are_published_removed(evented):
    engine, _ = evented(kv_cache_blocks=8)
    rng = random.Random(1602)
    first = random_prompt(rng, 50)
    checked(engine.generate(first, ONE_TOKEN))
    hashes = committed_hashes(engine, first)
    assert removed_hashes(published(engine), "CPU") == []
    for _ in range(4):  # 4 blocks each: the 8-block pool reuses first's blocks
        checked(engine.generate(random_prompt(rng, 50), ONE_TOKEN))
    assert all(location(engine, h) is None for h in hashes)
    batches = published(engine)
    assert set(hashes) <= set(removed_hashes(batches, "CPU"))
    assert_consistent(engine, batches)


def test_ttl_expiry_is_published_and_an_expired_block_is_never_a_hit(evented):
    engine, _ = evented()
    clock: ManualClock = engine.clock  # type: ignore[assignment]
    prompt = random_prompt(random.Random(1603), 50)
    t0 = clock.now()
    checked(engine.generate(prompt, ONE_TOKEN))
    hashes = committed_hashes(engine, prompt)
    clock.advance(200)
    assert checked(engine.generate(prompt, ONE_TOKEN)).usage.cached_tokens == 48  # used again: lives to t0 + 500
    clock.advance(99)  # just before the first published expiry: a refresh, not a removal
    batches = published(engine)
    assert removed_hashes(batches, "CPU") == []
    assert stored_events(batches, "CPU")[-1].expires_at == t0 + 500
    assert_consistent(engine, batches)

    clock.advance(202)  # past it: removed, though nothing has freed the blocks yet
    assert all(engine.pool.cached[h].expires_at < clock.now() for h in hashes)
    batches = published(engine)
    assert sorted(removed_hashes(batches, "CPU")) == sorted(hashes)
    assert_consistent(engine, batches)
    out = checked(engine.generate(prompt, ONE_TOKEN))
    assert out.usage.cached_tokens == 0 and out.usage.cache_write_tokens == 48  # stored again, and said so
    assert stored_events(published(engine), "CPU")[-1].block_hashes == hashes


def test_lower_tiers_publish_their_stores_and_removals_as_host_and_disk(evented, tmp_path):
    engine, _ = evented(kv_cache_blocks=16, kv_host_blocks=12, kv_disk_dir=tmp_path / "kv", kv_disk_blocks=64)
    prompt = random_prompt(random.Random(1604), 50)
    checked(engine.generate(prompt, ONE_TOKEN))
    hashes = committed_hashes(engine, prompt)
    push_down(engine, hashes, "host")
    batches = published(engine)
    assert set(hashes) <= {h for e in stored_events(batches, "HOST") for h in e.block_hashes}
    assert set(hashes) <= set(removed_hashes(batches, "CPU"))
    assert_consistent(engine, batches)

    push_down(engine, hashes, "disk")
    batches = published(engine)
    disk_stored = [e for e in stored_events(batches, "DISK") if set(e.block_hashes) & set(hashes)]
    assert {h for e in disk_stored for h in e.block_hashes} >= set(hashes)
    assert all(e.expires_at is not None and e.ttl_s == 300 for e in disk_stored)
    assert set(hashes) <= set(removed_hashes(batches, "HOST"))
    assert_consistent(engine, batches)

    engine.clock.advance(301)  # type: ignore[attr-defined]
    batches = published(engine)
    assert set(hashes) <= set(removed_hashes(batches, "DISK"))
    assert_consistent(engine, batches)
    assert checked(engine.generate(prompt, ONE_TOKEN)).usage.cached_tokens == 0


def test_a_restarted_engine_starts_at_seq_1_with_a_clear_and_the_blocks_its_disk_kept(evented, tmp_path):
    disk = {"kv_cache_blocks": 16, "kv_disk_dir": tmp_path / "kv", "kv_disk_blocks": 64}
    first, first_publisher = evented(**disk)
    prompt = random_prompt(random.Random(1605), 50)
    checked(first.generate(prompt, ONE_TOKEN))
    hashes = committed_hashes(first, prompt)
    published(first)
    first.close()  # writes its live blocks out to disk
    first_publisher.close()

    second, _ = evented(**disk)
    batches = published(second)
    assert batches[0].seq == 1 and isinstance(batches[0].events[0], AllBlocksCleared)
    assert {h for e in stored_events(batches[:1], "DISK") for h in e.block_hashes} == set(hashes)
    assert_consistent(second, batches)


def _closed_port() -> int:
    with socket.socket() as sock:
        sock.bind(("127.0.0.1", 0))
        return sock.getsockname()[1]


@pytest.mark.parametrize("reachable", [True, False])
def test_the_engine_serves_alike_whether_nats_is_reachable_or_not(evented, reachable):
    engine, publisher = evented(url=NATS_URL if reachable else f"nats://127.0.0.1:{_closed_port()}")
    rng = random.Random(1606)
    prompts = [random_prompt(rng, 50), random_prompt(rng, 40)]
    outs = [checked(engine.generate(p, GREEDY)) for p in (prompts[0], prompts[1], prompts[0])]
    assert [o.usage.cached_tokens for o in outs] == [0, 0, 48]
    assert outs[0].token_ids == outs[2].token_ids
    engine.kv_events_tick(sweep=True)
    seq = engine.kv_events.seq  # type: ignore[union-attr]
    assert seq >= 2  # the seq moves on either way: a router sees the dropped batches as a gap
    deadline = time.monotonic() + 60
    while publisher.published + publisher.dropped < seq and time.monotonic() < deadline:
        time.sleep(0.05)
    if reachable:
        assert publisher.published == seq and publisher.dropped == 0
        assert_consistent(engine, read_batches(engine.kv_events_subject, until_seq=seq))  # type: ignore[arg-type]
    else:
        assert publisher.published == 0 and publisher.dropped == seq and not publisher.connected


async def test_an_idle_async_engine_publishes_expiries_by_itself(tiny_llama_dir):
    clock = ManualClock()
    settings = EngineSettings(
        model=str(tiny_llama_dir), dtype="float32", kv_cache_gib=0.02, nats_url=NATS_URL, engine_id=unique_engine_id()
    )
    engine = AsyncEngine(settings, clock=clock)
    await engine.start()
    core = engine.core
    assert core is not None and core.kv_events is not None and core.kv_events_subject is not None
    try:
        prompt = random_prompt(random.Random(1607), 50)
        checked(await engine.generate(prompt, ONE_TOKEN))
        hashes = committed_hashes(core, prompt)
        batches = await read_batches_async(core.kv_events_subject, until_seq=core.kv_events.seq)
        assert {h for e in stored_events(batches, "CPU") for h in e.block_hashes} == set(hashes)
        assert removed_hashes(batches, "CPU") == []
        clock.advance(301)
        # No request comes: the engine thread wakes up by itself (every second) to publish the expiry.
        deadline = time.monotonic() + 60
        while set(removed_hashes(batches, "CPU")) != set(hashes):
            assert time.monotonic() < deadline, "the expiry was never published"
            await asyncio.sleep(0.2)
            batches = await read_batches_async(core.kv_events_subject, until_seq=core.kv_events.seq)
        assert replay(batches) == {}
        # It serves on between its idle wake-ups: the expired prefix is recomputed, stored and said so.
        outs = await asyncio.gather(*(engine.generate(prompt, ONE_TOKEN) for _ in range(4)))
        assert sorted(checked(o).usage.cache_write_tokens for o in outs)[-1] == 48
        batches = await read_batches_async(core.kv_events_subject, until_seq=core.kv_events.seq)
        assert set(replay(batches)) == {("CPU", h) for h in hashes}
    finally:
        await engine.shutdown()
        await purge_async(core.kv_events_subject)


def test_a_lost_nats_link_drops_batches_as_a_seq_gap_and_publishing_resumes_after_reconnecting(evented):
    proxy = CuttableProxy()
    try:
        engine, publisher = evented(url=proxy.url)
        assert engine.kv_events is not None and engine.kv_events_subject is not None
        assert publisher.wait_connected(30)
        rng = random.Random(1608)

        def commit_one() -> int:
            checked(engine.generate(random_prompt(rng, 40), ONE_TOKEN))
            engine.kv_events_tick()
            return engine.kv_events.seq  # type: ignore[union-attr]

        def settled(seq: int) -> None:
            deadline = time.monotonic() + 60
            while publisher.published + publisher.dropped < seq:
                assert time.monotonic() < deadline, "the publisher never caught up"
                time.sleep(0.05)

        first = commit_one()
        settled(first)
        assert publisher.published == first and publisher.dropped == 0

        proxy.cut()
        lost = commit_one()  # the engine serves on; its batch cannot go out
        settled(lost)
        assert publisher.dropped >= 1

        proxy.restore()
        assert publisher.wait_connected(30)  # reconnected, after backing off
        last = commit_one()
        deadline = time.monotonic() + 60
        while publisher.last_published_seq < last:
            assert time.monotonic() < deadline, "publishing never resumed"
            time.sleep(0.05)

        batches = read_batches(engine.kv_events_subject, until_seq=last)
        seqs = [b.seq for b in batches]
        assert seqs[:first] == list(range(1, first + 1)) and lost not in seqs and seqs[-1] == last
        # A router that sees the gap resyncs from the snapshot, which is the truth.
        assert set(snapshot_state(engine.kv_events.snapshot())) == live_blocks(engine)
    finally:
        proxy.close()
