"""KVEventConsumer against the real NATS JetStream at 127.0.0.1:4222 and a real HTTP snapshot server.

Each test publishes crafted KVEventBatch messages on a model id of its own (so tests running side by
side never see each other's events), and purges its subjects afterwards.
"""

from __future__ import annotations

import asyncio
import math
import socket
import uuid
from collections.abc import AsyncIterator, Callable
from dataclasses import dataclass, field
from typing import TYPE_CHECKING

import msgspec
import nats
import pytest
import uvicorn
from prometheus_client import CollectorRegistry
from starlette.applications import Starlette
from starlette.requests import Request
from starlette.responses import Response
from starlette.routing import Route

from gateway.routing import event_consumer
from gateway.routing.cache_aware import CacheAwareRouter, RouteWeights
from gateway.routing.event_consumer import KVEventConsumer, decode_snapshot, ensure_stream
from gateway.routing.index import BlockIndex
from gateway.routing.metrics import RoutingMetrics
from gateway.routing.types import EngineLoad, PrefixMatch
from inference.hashing import BlockHasher
from kvgate.kv_events import (
    STREAM_NAME,
    AllBlocksCleared,
    BlockRemoved,
    BlockStored,
    KVEventBatch,
    KVSnapshot,
    SnapshotBlock,
    encode_batch,
    model_subjects,
    subject,
)

if TYPE_CHECKING:
    from nats.js import JetStreamContext

NATS_URL = "nats://127.0.0.1:4222"
HASHES = BlockHasher(model_id="m", block_size=4).hash_blocks(list(range(40)), "salt")  # 10 blocks
FAR = 4_000_000_000.0  # an expiry these tests never reach (epoch seconds, year 2096)


async def until(condition: Callable[[], bool], what: str, timeout: float = 60.0) -> None:
    """Polls a condition (the consumer works in the background); generous for a loaded machine."""
    deadline = asyncio.get_running_loop().time() + timeout
    while not condition():
        if asyncio.get_running_loop().time() > deadline:
            raise AssertionError(f"timed out waiting for {what}")
        await asyncio.sleep(0.02)


def stored(hashes: list[bytes], medium: str = "CPU") -> BlockStored:
    return BlockStored(hashes, None, [], 4, medium=medium, ttl_s=300, expires_at=FAR)


def snapshot(engine_id: str, seq: int, hashes: list[bytes]) -> KVSnapshot:
    return KVSnapshot(engine_id, seq, [SnapshotBlock(h.hex(), "CPU", FAR) for h in hashes])


@dataclass
class SnapshotServer:
    """Serves GET /<engine>/kv/snapshot from `snapshots[engine]`; `fail` (or no snapshot) answers 500."""

    port: int
    snapshots: dict[str, KVSnapshot] = field(default_factory=dict)
    requests: int = 0
    fail: bool = False

    def url(self) -> str:
        return f"http://127.0.0.1:{self.port}"


@pytest.fixture
async def snapshot_server() -> AsyncIterator[SnapshotServer]:
    sock = socket.socket()
    sock.bind(("127.0.0.1", 0))
    state = SnapshotServer(port=sock.getsockname()[1])

    async def kv_snapshot(request: Request) -> Response:
        # One server stands for several engines: each engine's base URL is the server's URL + "/<engine>".
        state.requests += 1
        engine = request.path_params["engine"]
        if state.fail or engine not in state.snapshots:
            return Response("no snapshot", status_code=500)
        return Response(msgspec.json.encode(state.snapshots[engine]), media_type="application/json")

    app = Starlette(routes=[Route("/{engine}/kv/snapshot", kv_snapshot)])
    server = uvicorn.Server(uvicorn.Config(app, log_config=None, lifespan="off"))
    task = asyncio.create_task(server.serve(sockets=[sock]))
    await until(lambda: server.started, "the snapshot server")
    try:
        yield state
    finally:
        server.should_exit = True
        await asyncio.wait_for(task, 60)
        sock.close()


@pytest.fixture
async def publisher() -> AsyncIterator[Publisher]:
    nc = await nats.connect(NATS_URL)
    js = nc.jetstream()
    await ensure_stream(js)
    pub = Publisher(js, model_id=f"test-router-{uuid.uuid4().hex[:12]}")
    try:
        yield pub
    finally:
        await js.purge_stream(STREAM_NAME, subject=model_subjects(pub.model_id))
        await nc.close()


@dataclass
class Publisher:
    js: JetStreamContext
    model_id: str

    async def batch(self, engine: str, seq: int, *events: object) -> None:
        batch = KVEventBatch(ts=0.0, events=list(events), seq=seq, engine_id=engine)
        await self.js.publish(subject(self.model_id, engine), encode_batch(batch))

    async def raw(self, engine: str, data: bytes) -> None:
        await self.js.publish(subject(self.model_id, engine), data)


def matched(index: BlockIndex, engine: str) -> PrefixMatch:
    return index.match(HASHES, [engine], now=1_000_000.0)[engine]


def sample(registry: CollectorRegistry, name: str, **labels: str) -> float:
    return registry.get_sample_value(name, labels) or 0.0


async def test_events_feed_the_index_and_gaps_and_restarts_resync(publisher, snapshot_server, monkeypatch):
    monkeypatch.setattr(event_consumer, "SNAPSHOT_SLICE", 2)  # snapshots go into the index in several slices
    registry = CollectorRegistry(auto_describe=False)
    index = BlockIndex()
    metrics = RoutingMetrics(registry, index_size=index.__len__)
    engines = {"e1": f"{snapshot_server.url()}/e1"}
    snapshot_server.snapshots["e1"] = snapshot("e1", 0, [])
    consumer = KVEventConsumer(
        index, nats_url=NATS_URL, model_id=publisher.model_id, engines=engines, metrics=metrics, backoff_s=0.05
    )
    await consumer.start()
    try:
        # At start every known engine is resynced from its snapshot.
        await until(lambda: consumer.subscribed and consumer.last_seq("e1") == 0, "the start-up resync")
        assert consumer.covers("e1") and not consumer.covers("unknown-engine")

        await publisher.batch("e1", 1, stored(HASHES[:3]), stored(HASHES[3:4], "HOST"))
        await until(lambda: matched(index, "e1") == PrefixMatch(3, 1, 0), "batch 1")

        # Batches 2-3 are lost: batch 4 shows the gap, and the snapshot (as of batch 4) replaces the entries.
        snapshot_server.snapshots["e1"] = snapshot("e1", 4, HASHES[:6])
        await publisher.batch("e1", 4, stored(HASHES[5:6]))
        await until(lambda: consumer.last_seq("e1") == 4, "the resync after the gap")
        assert matched(index, "e1") == PrefixMatch(6, 0, 0)
        assert sample(registry, "kvgate:router_event_gaps_total", engine="e1") == 1
        assert sample(registry, "kvgate:router_resyncs_total", engine="e1", outcome="ok") == 2

        # A message that is not a batch is skipped; the next batch still applies.
        await publisher.raw("e1", b"\x93not a batch")
        await publisher.batch("e1", 5, BlockRemoved(HASHES[4:5], "CPU"))
        await until(lambda: consumer.last_seq("e1") == 5, "batch 5")
        assert matched(index, "e1") == PrefixMatch(4, 0, 0)
        assert sample(registry, "kvgate:router_bad_event_messages_total") == 1
        assert sample(registry, "kvgate:router_event_gaps_total", engine="e1") == 1  # no gap for the bad one

        # The engine restarts: seq 1 again, AllBlocksCleared first. A resync follows.
        snapshot_server.snapshots["e1"] = snapshot("e1", 1, HASHES[:2])
        await publisher.batch("e1", 1, AllBlocksCleared(), stored(HASHES[:2]))
        await until(lambda: consumer.last_seq("e1") == 1, "the resync after the restart")
        assert matched(index, "e1") == PrefixMatch(2, 0, 0)
        assert sample(registry, "kvgate:router_resyncs_total", engine="e1", outcome="ok") == 3

        # Events arriving after the snapshot's seq still apply in order.
        await publisher.batch("e1", 2, stored(HASHES[2:3]))
        await until(lambda: matched(index, "e1") == PrefixMatch(3, 0, 0), "batch 2 after the restart")
    finally:
        await consumer.close()


async def test_batches_arriving_during_a_resync_are_buffered(publisher, snapshot_server):
    index = BlockIndex()
    engines = {"e2": f"{snapshot_server.url()}/e2"}
    # No snapshot yet: the start-up resync keeps retrying (with backoff) while batches arrive.
    consumer = KVEventConsumer(
        index,
        nats_url=NATS_URL,
        model_id=publisher.model_id,
        engines=engines,
        backoff_s=0.05,
        max_backoff_s=0.5,
        resync_attempts=1000,
    )
    await consumer.start()
    try:
        await until(lambda: consumer.subscribed and snapshot_server.requests >= 1, "the first resync attempt")
        await publisher.batch("e2", 3, stored(HASHES[:1]))  # reflected in the snapshot below (seq 3)
        await publisher.batch("e2", 4, stored(HASHES[1:2]))  # newer: applied after it
        await until(lambda: consumer.buffered("e2") == 2, "the batches to be buffered")
        snapshot_server.snapshots["e2"] = snapshot("e2", 3, HASHES[:1])
        await until(lambda: consumer.last_seq("e2") == 4, "the resync and the buffered batch")
        assert matched(index, "e2") == PrefixMatch(2, 0, 0)
    finally:
        await consumer.close()


async def test_a_resync_that_keeps_failing_leaves_the_engine_to_the_fallback(publisher, snapshot_server):
    registry = CollectorRegistry(auto_describe=False)
    index = BlockIndex()
    index.insert_routed("e3", HASHES[:4], 300, now=1_000_000.0)  # stale entries of an engine we cannot read
    engines = {"e3": f"{snapshot_server.url()}/e3"}
    snapshot_server.fail = True
    consumer = KVEventConsumer(
        index,
        nats_url=NATS_URL,
        model_id=publisher.model_id,
        engines=engines,
        metrics=RoutingMetrics(registry),
        backoff_s=0.05,
        resync_attempts=2,
    )
    await consumer.start()
    try:
        await until(
            lambda: sample(registry, "kvgate:router_resyncs_total", engine="e3", outcome="failed") == 1, "the failure"
        )
        assert not consumer.covers("e3")
        assert matched(index, "e3") == PrefixMatch(0, 0, 0)
        # The next batch tries again, and now the engine answers.
        snapshot_server.fail = False
        snapshot_server.snapshots["e3"] = snapshot("e3", 7, HASHES[:3])
        await publisher.batch("e3", 7, stored(HASHES[2:3]))
        await until(lambda: consumer.last_seq("e3") == 7, "the second resync")
        assert consumer.covers("e3") and matched(index, "e3") == PrefixMatch(3, 0, 0)
    finally:
        await consumer.close()


async def test_without_nats_the_router_falls_back_to_its_own_choices():
    sock = socket.socket()
    sock.bind(("127.0.0.1", 0))  # a port nothing listens on (bound, never listening: connections are refused)
    index = BlockIndex()
    consumer = KVEventConsumer(
        index,
        nats_url=f"nats://127.0.0.1:{sock.getsockname()[1]}",
        model_id="unreachable",
        engines={"a": "http://127.0.0.1:9", "b": "http://127.0.0.1:9"},
        backoff_s=0.05,
    )
    await consumer.start()
    try:
        assert not consumer.covers("a")
        router = CacheAwareRouter(index, RouteWeights(w_load=2.0), has_events=consumer.covers)
        loads = {"a": EngineLoad(0, 0), "b": EngineLoad(0, 0)}
        first = router.choose(HASHES[:5], loads, ttl_s=300, now=1_000_000.0)
        busier = {**loads, first.engine: EngineLoad(1, 0)}
        assert router.choose(HASHES, busier, ttl_s=300, now=1_000_001.0) == (first.engine, 5, "prefix")
    finally:
        await asyncio.wait_for(consumer.close(), 60)
        sock.close()


async def test_an_engine_the_pool_has_not_met_is_followed_until_it_can_be_resynced(publisher, snapshot_server):
    index = BlockIndex()
    engines: dict[str, str] = {}
    consumer = KVEventConsumer(index, nats_url=NATS_URL, model_id=publisher.model_id, engines=engines, backoff_s=0.05)
    await consumer.start()
    try:
        await until(lambda: consumer.subscribed, "the subscription")
        await publisher.batch("e4", 3, stored(HASHES[:2]))
        await until(lambda: consumer.last_seq("e4") == 3, "batch 3 of an unknown engine")
        assert matched(index, "e4") == PrefixMatch(2, 0, 0) and not consumer.covers("e4")
        # A gap with no URL to resync from: what may be stale is dropped, the new batch kept.
        await publisher.batch("e4", 6, stored(HASHES[5:6]))
        await until(lambda: consumer.last_seq("e4") == 6, "batch 6")
        assert matched(index, "e4") == PrefixMatch(0, 0, 0) and len(index) == 1
        assert snapshot_server.requests == 0
        # The pool meets it: a resync, and from then on it is covered.
        snapshot_server.snapshots["e4"] = snapshot("e4", 6, HASHES[:4])
        engines["e4"] = f"{snapshot_server.url()}/e4"
        consumer.resync("e4")
        await until(lambda: matched(index, "e4") == PrefixMatch(4, 0, 0), "the resync")
        assert consumer.covers("e4")
    finally:
        await consumer.close()


async def test_the_router_built_from_settings_follows_the_events(publisher, snapshot_server):
    from gateway.routing.setup import build_routing
    from gateway.settings import GatewaySettings

    engines = {"x": f"{snapshot_server.url()}/x", "y": f"{snapshot_server.url()}/y"}
    snapshot_server.snapshots.update(x=snapshot("x", 0, []), y=snapshot("y", 0, []))
    registry = CollectorRegistry(auto_describe=False)
    settings = GatewaySettings(_env_file=None, nats_url=NATS_URL, route_w_load=2.0)
    stack = build_routing(settings, registry=registry, model_id=publisher.model_id, block_size=4, event_engines=engines)
    assert stack.consumer is not None
    await stack.consumer.start()
    try:
        await until(lambda: stack.consumer.last_seq("x") == 0 and stack.consumer.last_seq("y") == 0, "the resyncs")
        await publisher.batch("y", 1, stored(HASHES[:6]))
        await until(lambda: matched(stack.router.index, "y").total == 6, "y's batch")
        loads = {"x": EngineLoad(0, 0), "y": EngineLoad(1, 0)}
        decision = stack.router.choose(HASHES, loads, ttl_s=300, now=1_000_000.0)
        assert decision == ("y", 6, "prefix")
        # Event-fed engines get no lasting insertion: a new prefix sent to x counts as there only until x's
        # own events could say so (KVGATE_ROUTE_PENDING_S).
        other = BlockHasher(model_id="m", block_size=4).hash_blocks(list(range(40)), "other salt")
        assert stack.router.choose(other, loads, ttl_s=300, now=1_000_000.0).engine == "x"
        pending_until = 1_000_000.0 + settings.route_pending_s
        assert stack.router.index.match(other, ["x"], now=pending_until - 1)["x"].total == 10
        assert stack.router.index.match(other, ["x"], now=pending_until + 1)["x"].total == 0
        stack.router.record_actual(decision, 6)
        assert sample(registry, "kvgate:router_actual_hit_tokens_total", engine="y") == 24
    finally:
        await stack.consumer.close()
    # Without KVGATE_NATS_URL there is no consumer, and every engine gets fallback insertions.
    plain = build_routing(
        GatewaySettings(_env_file=None, nats_url=None, route_w_load=2.0),
        registry=CollectorRegistry(),
        model_id="m",
        block_size=4,
        event_engines={},
    )
    assert plain.consumer is None
    assert plain.router.index.max_entries == GatewaySettings.model_fields["route_index_max_entries"].default
    plain.router.choose(HASHES, {"x": EngineLoad(0, 0), "y": EngineLoad(0, 0)}, ttl_s=300, now=1_000_000.0)
    assert len(plain.router.index) == 10


def test_snapshot_json_reads_the_engines_shape_and_unending_blocks():
    engine_side = KVSnapshot("e", 3, [SnapshotBlock("ab01", "CPU", 1e9), SnapshotBlock("cd02", "HOST", math.inf)])
    data = msgspec.json.encode(engine_side)
    assert b'"expires_at":null' in data  # what an unending block looks like in JSON
    assert decode_snapshot(data) == engine_side
    with pytest.raises(msgspec.DecodeError):
        decode_snapshot(b'{"engine_id": "e", "seq": "three", "blocks": []}')


async def test_a_lost_connection_is_replaced_and_every_engine_resynced(publisher, snapshot_server):
    index = BlockIndex()
    engines = {"e5": f"{snapshot_server.url()}/e5"}
    snapshot_server.snapshots["e5"] = snapshot("e5", 0, [])
    consumer = KVEventConsumer(index, nats_url=NATS_URL, model_id=publisher.model_id, engines=engines, backoff_s=0.05)
    await consumer.start()
    try:
        await until(lambda: consumer.subscribed and consumer.last_seq("e5") == 0, "the start-up resync")
        requests = snapshot_server.requests
        # The connection goes away (as when the NATS server restarts): events published meanwhile are
        # not delivered to a new-messages-only subscription, so the consumer resyncs once back.
        snapshot_server.snapshots["e5"] = snapshot("e5", 2, HASHES[:3])
        await consumer._nc.close()
        await until(lambda: consumer.subscribed and snapshot_server.requests > requests, "the new subscription")
        await until(lambda: consumer.last_seq("e5") == 2, "the resync")
        assert matched(index, "e5") == PrefixMatch(3, 0, 0) and consumer.covers("e5")
        await publisher.batch("e5", 3, stored(HASHES[3:4]))
        await until(lambda: matched(index, "e5") == PrefixMatch(4, 0, 0), "a batch on the new subscription")
    finally:
        await consumer.close()


async def test_a_nats_restart_ends_in_a_fresh_subscription_and_a_resync(snapshot_server, tmp_path):
    """Whether nats-py's one reconnection attempt succeeds (a quick restart) or not, batches the consumer
    may have missed are made up by resyncing, and batches after the restart are applied."""
    from tests.gateway.loopback_services import NATS_SERVER, NatsServer

    if not NATS_SERVER.exists():
        pytest.skip(f"{NATS_SERVER} is not installed")
    server = await asyncio.to_thread(NatsServer, tmp_path)
    registry = CollectorRegistry(auto_describe=False)
    index = BlockIndex()
    model_id = f"test-router-{uuid.uuid4().hex[:12]}"
    snapshot_server.snapshots["e1"] = snapshot("e1", 0, [])
    consumer = KVEventConsumer(
        index,
        nats_url=server.url,
        model_id=model_id,
        engines={"e1": f"{snapshot_server.url()}/e1"},
        metrics=RoutingMetrics(registry),
        backoff_s=0.05,
    )
    await consumer.start()
    try:
        await until(lambda: consumer.subscribed and consumer.last_seq("e1") == 0, "the start-up resync")
        ok = sample(registry, "kvgate:router_resyncs_total", engine="e1", outcome="ok")
        # The engine made batches 1-2 while NATS was away: only the snapshot knows of them.
        snapshot_server.snapshots["e1"] = snapshot("e1", 2, HASHES[:2])
        await asyncio.to_thread(server.stop)
        await asyncio.to_thread(server.start)
        await until(
            lambda: sample(registry, "kvgate:router_resyncs_total", engine="e1", outcome="ok") > ok,
            "a resync after the restart",
        )
        await until(lambda: consumer.subscribed and consumer.last_seq("e1") == 2, "the resynced seq")
        assert matched(index, "e1") == PrefixMatch(2, 0, 0)
        nc = await nats.connect(server.url)
        try:
            js = nc.jetstream()
            await ensure_stream(js)
            await Publisher(js, model_id).batch("e1", 3, stored(HASHES[2:3]))
        finally:
            await nc.close()
        await until(lambda: matched(index, "e1") == PrefixMatch(3, 0, 0), "batch 3, after the restart")
    finally:
        await consumer.close()
        await asyncio.to_thread(server.stop)
