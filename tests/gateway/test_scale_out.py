"""Scale-out end to end: 2 gateways, 3 engine servers, NATS and Redis, all real processes on loopback.

The test starts its own nats-server (JetStream, a store in its directory) and redis-server on free
ports, three `kvgate engine serve` (the tiny model; KV events to that NATS, the shared KV tier in
that Redis; ids host:port) and two `kvgate serve` (KVGATE_ENGINES = the three, routing fed by the
events, one fresh PostgreSQL database). A tenant talks to them with the anthropic SDK, its cache
breakpoints on its first message (the prefix) and, once, on a later one. Counts come from the
engines: the API's usage, the usage records and the ledger.

One test, one set of processes, in order (each step builds on the previous one):
1. turn 1 through gateway one writes the prefix on some engine E;
2. turn 2 through gateway two (which routed nothing yet: it knows E holds the prefix from E's
   events alone) lands on E and reads the prefix; another tenant's identical prompt reads nothing;
3. NATS stops; turn 3 (gateway one, to E) writes more blocks while E's event batches are dropped
   (a seq gap); NATS restarts, the gateways' consumers reconnect and resync from /kv/snapshot;
   turn 4 through gateway two predicts and reads the blocks only the snapshot told it of, on E;
4. E is killed; turn 5 is served by another engine, which reads the whole prefix from Redis;
5. the ledger: each block written once, every other cached token a read.
"""

from __future__ import annotations

import asyncio
import shutil
import uuid
from collections.abc import Iterator
from concurrent.futures import ThreadPoolExecutor
from pathlib import Path
from typing import Any, NamedTuple

import anthropic
import httpx
import nats
import pytest
import redis
import sqlalchemy as sa

from kvgate import kv_events
from kvgate.db import sync_url
from tests.gateway.harness import pg_reachable, postgres_database
from tests.gateway.loopback_services import (
    NATS_SERVER,
    ROOT,
    EngineServer,
    NatsServer,
    RedisServer,
    metric,
    wait_for,
)
from tests.gateway.serve_process import Serve

BLOCK = 16
PRICES = """
[[prices]]
model = "*"
effective_from = 2026-01-01T00:00:00Z
input_usd_per_mtok = 3
output_usd_per_mtok = 15
"""
PREFIX = (
    "You are the archivist of a lighthouse on a northern coast. Keep the logbook: the weather at dawn, "
    "the ships that pass, the state of the lamp and its lenses, the oil that is left, the tides and the "
    "birds. Answer every question in the voice of someone who has kept this light for forty winters, "
    "briefly, and never invent a ship that is not in the log. The log so far: the schooner Marta passed "
    "northbound at six bells, the wind backed westerly, the second lens has a hairline crack, and the "
    "keeper's cat has taken to sleeping on the oil drums."
)
CACHED = {"type": "ephemeral"}


class Cluster(NamedTuple):
    nats: NatsServer
    redis: RedisServer
    engines: list[EngineServer]
    one: Serve
    two: Serve
    database_url: str
    model: str


pytestmark = pytest.mark.postgres


def _skip_without_services() -> None:
    if not pg_reachable():
        pytest.skip("PostgreSQL is not reachable at 127.0.0.1:5432")
    if not NATS_SERVER.exists():
        pytest.skip(f"{NATS_SERVER} is not installed")
    if shutil.which("redis-server") is None:
        pytest.skip("redis-server is not installed")


@pytest.fixture(scope="module")
def cluster(tiny_llama_dir: Path, tmp_path_factory: pytest.TempPathFactory) -> Iterator[Cluster]:
    _skip_without_services()
    root = tmp_path_factory.mktemp("scale_out")
    prices = root / "prices.toml"
    prices.write_text(PRICES)
    started: list[Any] = []  # everything started so far, stopped in reverse order whatever happens
    try:
        nats = NatsServer(root)
        started.append(nats)
        redis_server = RedisServer(root)
        started.append(redis_server)
        engine_settings = {
            "KVGATE_NATS_URL": nats.url,
            "KVGATE_KV_REDIS_URL": redis_server.url,
            "KVGATE_KV_REDIS_TIMEOUT_MS": "10000",  # a loaded machine: a slow reply must not be a miss
            # One tier key for all three: each process's own random key would share nothing.
            "KVGATE_KV_TIER_KEY": "scale-out-test-tier-key-0123456789",
        }
        engines = [EngineServer(f"engine-{i}", tiny_llama_dir, root, **engine_settings) for i in range(3)]
        started.extend(engines)
        with ThreadPoolExecutor(3) as pool:
            list(pool.map(lambda e: e.wait_ready(), engines))
        with postgres_database("kvgate_scale_out") as url:
            gateway_env: dict[str, str | None] = {
                "PYTHONPATH": str(ROOT),
                "KVGATE_ENGINES": ",".join(e.url for e in engines),
                "KVGATE_NATS_URL": nats.url,
                "KVGATE_REDIS_URL": redis_server.url,
                "KVGATE_MIN_CACHEABLE_TOKENS": "32",
                "KVGATE_PRICES_FILE": str(prices),
            }

            def start(name: str) -> Serve:
                workdir = root / name
                workdir.mkdir()
                return Serve(database_url=url, model_dir=tiny_llama_dir, workdir=workdir, env=gateway_env)

            gateways: list[Serve] = []
            try:
                with ThreadPoolExecutor(2) as pool:
                    futures = [pool.submit(start, name) for name in ("gateway-one", "gateway-two")]
                    for future in futures:
                        if future.exception() is None:
                            gateways.append(future.result())
                    for future in futures:
                        future.result()  # raises the first start-up failure, after keeping the others
                one, two = gateways
                model = one.admin.get("/healthz").json()["model"]
                yield Cluster(nats, redis_server, engines, one, two, url, model)
            finally:
                for gateway in gateways:
                    gateway.stop()
    finally:
        for process in reversed(started):
            process.stop()


def new_tenant(gateway: Serve) -> tuple[str, str]:
    """(tenant id, API key) of a new tenant, made through the gateway's admin API."""
    tenant = gateway.admin.post("/admin/v1/tenants", json={"name": f"t-{uuid.uuid4().hex[:8]}"})
    assert tenant.status_code == 201, tenant.text
    tenant_id = tenant.json()["id"]
    key = gateway.admin.post(f"/admin/v1/tenants/{tenant_id}/keys", json={"name": "k"})
    assert key.status_code == 201, key.text
    return tenant_id, key.json()["key"]


def client(gateway: Serve, key: str) -> anthropic.Anthropic:
    return anthropic.Anthropic(base_url=gateway.base_url, api_key=key, max_retries=0, timeout=300)


def conversation(turn: int, *, second_breakpoint: bool = False) -> list[dict[str, Any]]:
    """Turn n's messages: the prefix (a breakpoint), then n-1 exchanges; optionally a breakpoint on turn 3's
    question too (so that turn writes blocks past the prefix, and later turns read them)."""
    messages: list[dict[str, Any]] = [
        {"role": "user", "content": [{"type": "text", "text": PREFIX, "cache_control": CACHED}]}
    ]
    for n in range(2, turn + 1):
        messages.append({"role": "assistant", "content": f"Logged, entry {n - 1}."})
        question = f"Question {n}: what did the log say about the lamp, the ships and the weather on day {n}?"
        block: dict[str, Any] = {"type": "text", "text": question}
        if n == 3 and second_breakpoint:
            block["cache_control"] = CACHED
        messages.append({"role": "user", "content": [block]})
    return messages


def ask(cluster: Cluster, gateway: Serve, key: str, messages: list[dict[str, Any]]) -> Any:
    reply = client(gateway, key).messages.create(model=cluster.model, max_tokens=4, messages=messages)  # type: ignore[arg-type]
    return reply.usage


def usage_records(cluster: Cluster, tenant_id: str, count: int) -> list[dict[str, Any]]:
    """The tenant's usage records, oldest first, once `count` of them are written."""
    sql = "SELECT * FROM usage_records WHERE tenant_id = :t ORDER BY started_at"
    return rows_once(cluster, sql, tenant_id, count, "usage records")


def ledger(cluster: Cluster, tenant_id: str, count: int) -> list[dict[str, Any]]:
    """The tenant's usage ledger entries, oldest first, once `count` of them are settled."""
    sql = "SELECT * FROM ledger_entries WHERE tenant_id = :t AND kind = 'usage' ORDER BY started_at"
    return rows_once(cluster, sql, tenant_id, count, "ledger entries")


def rows_once(cluster: Cluster, sql: str, tenant_id: str, count: int, what: str) -> list[dict[str, Any]]:
    """The rows `sql` selects for the tenant, once there are `count` of them."""
    engine = sa.create_engine(sync_url(cluster.database_url))
    rows: list[dict[str, Any]] = []

    def fetch() -> bool:
        nonlocal rows
        with engine.connect() as conn:
            rows = [dict(row._mapping) for row in conn.execute(sa.text(sql), {"t": tenant_id})]
        return len(rows) >= count

    try:
        wait_for(fetch, f"{count} {what} of tenant {tenant_id}", every_s=0.2)
    finally:
        engine.dispose()
    return rows


def writes(row: dict[str, Any]) -> int:
    return sum(row[f"cache_write_{ttl}_tokens"] for ttl in ("5m", "30m", "1h", "12h", "24h"))


def gateway_metrics(gateway: Serve) -> str:
    return gateway.admin.get("/metrics").text


async def _published_seqs(nats_url: str, subject: str, until_seq: int) -> list[int]:
    nc = await nats.connect(nats_url)
    try:
        sub = await nc.jetstream().subscribe(subject, ordered_consumer=True)
        seqs = [0]
        while seqs[-1] < until_seq:
            seqs.append(kv_events.decode_batch((await sub.next_msg(timeout=60)).data).seq)
        await sub.unsubscribe()
        return seqs[1:]
    finally:
        await nc.close()


def published_seqs(cluster: Cluster, engine: EngineServer) -> tuple[list[int], int]:
    """(the seqs of the engine's batches that reached the stream, its last seq): a dropped batch's seq is
    missing. A request straight to the engine makes a batch now, published, so that a gap is never last."""
    body = {"model": cluster.model, "prompt": PREFIX[:200], "max_tokens": 1, "cache_salt": uuid.uuid4().hex}
    assert httpx.post(f"{engine.url}/v1/completions", json=body, timeout=300).status_code == 200
    last = httpx.get(f"{engine.url}/kv/snapshot", timeout=60).json()["seq"]
    subject = httpx.get(f"{engine.url}/kv/info", timeout=30).json()["kv_events_subject"]
    return asyncio.run(_published_seqs(cluster.nats.url, subject, last)), last


def engine_by_id(cluster: Cluster, engine_id: str) -> EngineServer:
    return next(e for e in cluster.engines if e.engine_id == engine_id)


def test_prefix_routing_events_resync_failover_to_redis_and_billing_across_two_gateways(cluster: Cluster) -> None:
    one, two = cluster.one, cluster.two
    tenant, key = new_tenant(one)

    # 1. The first turn writes the prefix on whichever engine gateway one picks.
    first = ask(cluster, one, key, conversation(1))
    assert first.cache_creation_input_tokens > 0 and first.cache_read_input_tokens == 0
    prefix_tokens = first.cache_creation_input_tokens
    assert prefix_tokens % BLOCK == 0
    (record,) = usage_records(cluster, tenant, 1)
    holder = engine_by_id(cluster, record["engine_id"])
    assert record["backend"] == "kvgate" and record["predicted_cached_tokens"] == 0
    assert record["cache_write_5m_tokens"] == prefix_tokens

    # 2. Gateway two routed nothing yet: it learns where the prefix is from the holder's events
    # (its device copy and the shared tier's: two index entries per block).
    wait_for(
        lambda: metric(gateway_metrics(two), "kvgate:router_index_entries") >= 2 * prefix_tokens // BLOCK,
        "gateway two's index to hold the prefix",
    )
    second = ask(cluster, two, key, conversation(2))
    assert second.cache_read_input_tokens == prefix_tokens and second.cache_creation_input_tokens == 0
    records = usage_records(cluster, tenant, 2)
    assert records[1]["engine_id"] == holder.engine_id
    assert records[1]["predicted_cached_tokens"] == prefix_tokens  # the router expected exactly this read
    assert metric(gateway_metrics(two), "kvgate:router_actual_hit_tokens", engine=holder.engine_id) == prefix_tokens

    # Another tenant's identical prompt reads nothing, on any engine, in any tier: its salt differs.
    other, other_key = new_tenant(two)
    stranger = ask(cluster, one, other_key, conversation(2))
    assert stranger.cache_read_input_tokens == 0 and stranger.cache_creation_input_tokens == prefix_tokens
    (stranger_record,) = usage_records(cluster, other, 1)
    assert stranger_record["cache_read_tokens"] == 0 and stranger_record["engine_id"] is not None

    # 3. A gap in the holder's events: NATS goes away while the holder commits new blocks.
    resyncs_before = metric(gateway_metrics(two), "kvgate:router_resyncs", engine=holder.engine_id, outcome="ok")
    cluster.nats.stop()
    # Its publisher has seen the loss (so the next batches are dropped, their seqs used up).
    wait_for(lambda: holder.proc.logged("kv_events_nats_unreachable"), "the holder to find NATS unreachable")
    third = ask(cluster, one, key, conversation(3, second_breakpoint=True))
    assert third.cache_read_input_tokens == prefix_tokens
    extra_tokens = third.cache_creation_input_tokens
    assert extra_tokens > 0 and extra_tokens % BLOCK == 0
    assert usage_records(cluster, tenant, 3)[2]["engine_id"] == holder.engine_id
    cluster.nats.start()
    wait_for(
        lambda: (
            metric(gateway_metrics(two), "kvgate:router_resyncs", engine=holder.engine_id, outcome="ok")
            > resyncs_before
        ),
        "gateway two to resync the holder after NATS came back",
        timeout_s=180,
    )
    # Gateway two did not route turn 3, and the holder's batches of it were dropped: what gateway two
    # knows of those blocks came from the resync.
    fourth = ask(cluster, two, key, conversation(4, second_breakpoint=True))
    assert fourth.cache_read_input_tokens == prefix_tokens + extra_tokens
    records = usage_records(cluster, tenant, 4)
    assert records[3]["engine_id"] == holder.engine_id
    assert records[3]["predicted_cached_tokens"] == prefix_tokens + extra_tokens
    # The gap was real: some of the holder's batches never reached the stream.
    seqs, last = published_seqs(cluster, holder)
    assert set(range(1, last + 1)) - set(seqs), seqs

    # 4. The holder dies. Its blocks were written through to Redis (the other tenant's too).
    store = redis.Redis.from_url(cluster.redis.url)
    try:
        wait_for(
            lambda: (
                len(list(store.scan_iter(match="kvg:v2:*", count=1000))) >= (2 * prefix_tokens + extra_tokens) // BLOCK
            ),
            "the blocks to be in Redis",
        )
    finally:
        store.close()
    holder.kill()
    fifth = ask(cluster, one, key, conversation(5, second_breakpoint=True))
    assert fifth.cache_read_input_tokens == prefix_tokens + extra_tokens and fifth.cache_creation_input_tokens == 0
    records = usage_records(cluster, tenant, 5)
    survivor = engine_by_id(cluster, records[4]["engine_id"])
    assert survivor is not holder
    redis_hits = metric(survivor.metrics(), "kvgate:kv_tier_hit_tokens", tier="redis")
    assert redis_hits >= prefix_tokens + extra_tokens

    # 5. The ledger: every block written once (the prefix, then turn 3's blocks), everything else read.
    entries = ledger(cluster, tenant, 5)
    assert [writes(e) for e in entries] == [prefix_tokens, 0, extra_tokens, 0, 0]
    assert [e["cache_read_tokens"] for e in entries] == [
        0,
        prefix_tokens,
        prefix_tokens,
        prefix_tokens + extra_tokens,
        prefix_tokens + extra_tokens,
    ]
    assert sum(writes(e) for e in entries) == prefix_tokens + extra_tokens
    # Billed from the engines' counts, which the API reported: the same numbers, record by record.
    for entry, usage in zip(entries, (first, second, third, fourth, fifth), strict=True):
        assert entry["cache_read_tokens"] == usage.cache_read_input_tokens
        assert writes(entry) == usage.cache_creation_input_tokens
    assert [r["engine_id"] for r in records][:4] == [holder.engine_id] * 4
    # Both gateways export predicted and actual hits side by side.
    for gateway in (one, two):
        text = gateway_metrics(gateway)
        assert metric(text, "kvgate:router_predicted_hit_tokens") > 0
        assert metric(text, "kvgate:router_actual_hit_tokens") > 0
    assert httpx.get(f"{two.base_url}/healthz", timeout=30).status_code == 200
