"""Simulated engines for bench/route_sim.py: a device tier and a host tier of blocks, a cost model, KV events.

Each engine mirrors what a kvgate engine does with its cache, block by block:
- a prompt reads its leading blocks from the device pool or the host tier (a host block is
  promoted back to the device) and never the block holding its last token;
- after its prefill it commits its full prompt blocks (bar that last one) to the device
  pool with the TTL; a committed or read block's expiry is renewed;
- the device pool is LRU: a victim still within its TTL moves to the host tier (LRU too,
  same expiry), an expired one is dropped; expired blocks are swept out periodically.
Every change is published as a kvgate.kv_events.KVEventBatch (BlockStored/BlockRemoved with
media "CPU" and "HOST", expires_at, seq +1 per batch), the way kvgate engines publish them,
and handed to a callback instead of NATS.

Time: prefill = a + b·uncached tokens + c·cached tokens (attention over the cached
context) + h·host tokens (the copy up); then the reply decodes at d seconds per token,
alongside other requests' decodes. Prefills run one at a time in arrival order, so
TTFT = queue wait + prefill. The constants come from bench/route_sim_calibration.json.
"""

from __future__ import annotations

import json
from collections import OrderedDict, deque
from collections.abc import Callable
from dataclasses import dataclass
from pathlib import Path

from bench.route_sim_workloads import BLOCK_SIZE, SimRequest
from inference.hashing import BlockHash
from kvgate.kv_events import BlockRemoved, BlockStored, KVEventBatch

CALIBRATION = Path(__file__).resolve().parent / "route_sim_calibration.json"
DEVICE = "CPU"  # kvgate's device pool on a CPU engine
HOST = "HOST"


@dataclass(frozen=True)
class CostModel:
    a: float  # s per prefill
    b: float  # s per uncached prompt token
    c: float  # s per cached prompt token (attention over it)
    h: float  # s per token copied up from the host tier
    d: float  # s per decoded token, per stream
    source: str = "defaults"

    def prefill_s(self, uncached: int, cached: int, host: int) -> float:
        return self.a + self.b * uncached + self.c * cached + self.h * host

    @classmethod
    def load(cls, path: Path = CALIBRATION) -> CostModel:
        data = json.loads(path.read_text())
        fit = data["fit"]
        return cls(fit["a"], fit["b"], fit["c"], fit["h"], fit["d"], source=f"{path.name}: {data['machine']}")


@dataclass(frozen=True)
class TierSizes:
    device_blocks: int = 1024  # 16k tokens, ~0.37 GB of SmolLM2 KV: a third of the 1 GiB default pool
    host_blocks: int = 4096
    ttl_s: float = 300.0


class Job:
    __slots__ = ("decision", "device_hits", "enqueued", "est_uncached", "host_hits", "request", "started", "ttft")

    def __init__(self, request: SimRequest, decision: object, enqueued: float, est_uncached: int) -> None:
        self.request = request
        self.decision = decision
        self.enqueued = enqueued
        self.started = 0.0
        self.ttft = 0.0
        self.device_hits = 0
        self.host_hits = 0
        self.est_uncached = est_uncached


EventSink = Callable[[KVEventBatch], None]


class SimEngine:
    """One engine: its tiers, its prefill queue, its in-flight count, and its event stream."""

    def __init__(self, engine_id: str, sizes: TierSizes, cost: CostModel, publish: EventSink) -> None:
        self.engine_id = engine_id
        self.sizes = sizes
        self.cost = cost
        self.publish = publish
        self.device: OrderedDict[BlockHash, float] = OrderedDict()  # hash -> expires_at, LRU first
        self.host: OrderedDict[BlockHash, float] = OrderedDict()
        self.announced: dict[BlockHash, float] = {}  # device expiry last published
        self.queue: deque[Job] = deque()
        self.prefilling: Job | None = None
        self.decoding = 0
        self.seq = 0
        self.queued_prefill_tokens = 0
        self._events: list[BlockStored | BlockRemoved] = []

    @property
    def active(self) -> int:
        return len(self.queue) + (self.prefilling is not None) + self.decoding

    # -- what a request would find here now (for the queued-token estimate; not what routers see)
    def cached_prefix(self, hashes: list[BlockHash] | tuple, now: float, limit: int) -> tuple[int, int]:
        dev = host = 0
        for h in hashes[:limit]:
            if self.device.get(h, 0.0) > now:
                dev += 1
            elif self.host.get(h, 0.0) > now:
                host += 1
            else:
                break
        return dev, host

    def enqueue(self, job: Job) -> None:
        self.queue.append(job)
        self.queued_prefill_tokens += job.est_uncached

    def start_next(self, now: float) -> float | None:
        """Begin the next prefill if idle; returns when it ends."""
        if self.prefilling is not None or not self.queue:
            return None
        job = self.queue.popleft()
        self.prefilling = job
        req = job.request
        limit = (req.prompt_tokens - 1) // BLOCK_SIZE  # the last token's block is always recomputed
        job.device_hits, job.host_hits = self.cached_prefix(req.block_hashes, now, limit)
        cached = (job.device_hits + job.host_hits) * BLOCK_SIZE
        job.started = now
        return now + self.cost.prefill_s(req.prompt_tokens - cached, cached, job.host_hits * BLOCK_SIZE)

    def finish_prefill(self, now: float) -> Job:
        job = self.prefilling
        assert job is not None
        self.prefilling = None
        self.queued_prefill_tokens -= job.est_uncached
        job.ttft = now - job.enqueued
        req = job.request
        commit = (req.prompt_tokens - 1) // BLOCK_SIZE
        self._commit(req.block_hashes[:commit], now)
        self._flush(now)
        self.decoding += 1
        return job

    def finish_decode(self) -> None:
        self.decoding -= 1

    def decode_s(self, job: Job) -> float:
        return job.request.output_tokens * self.cost.d

    # -- the tiers
    def _commit(self, hashes: list[BlockHash] | tuple, now: float) -> None:
        expires = now + self.sizes.ttl_s
        run: list[BlockHash] = []  # consecutive blocks to (re)announce, published as one BlockStored
        run_parent: BlockHash | None = None
        for i, h in enumerate(hashes):
            self.device[h] = expires
            self.device.move_to_end(h)
            # Re-announce a block whose announced expiry is less than half a TTL away: routers forget a block at
            # its expires_at, so a hot block must be re-announced, but not on every hit.
            if self.announced.get(h, 0.0) < now + self.sizes.ttl_s / 2:
                if not run:
                    run_parent = hashes[i - 1] if i else None
                run.append(h)
                self.announced[h] = expires
            elif run:
                self._events.append(self._stored(run, run_parent, expires))
                run = []
        if run:
            self._events.append(self._stored(run, run_parent, expires))
        while len(self.device) > self.sizes.device_blocks:
            victim, at = self.device.popitem(last=False)
            self.announced.pop(victim, None)
            self._events.append(BlockRemoved([victim], medium=DEVICE))
            if at > now:
                self._to_host(victim, at)

    def _stored(self, run: list[BlockHash], parent: BlockHash | None, expires: float) -> BlockStored:
        ttl = int(self.sizes.ttl_s)
        return BlockStored(run, parent, [], BLOCK_SIZE, medium=DEVICE, ttl_s=ttl, expires_at=expires)

    def _to_host(self, block: BlockHash, expires: float) -> None:
        if self.sizes.host_blocks <= 0:
            return
        self.host[block] = expires
        self.host.move_to_end(block)
        self._events.append(BlockStored([block], None, [], BLOCK_SIZE, medium=HOST, expires_at=expires))
        while len(self.host) > self.sizes.host_blocks:
            victim, _ = self.host.popitem(last=False)
            self._events.append(BlockRemoved([victim], medium=HOST))

    def sweep(self, now: float) -> None:
        """Drop expired blocks and publish their removal (as kvgate's engines do on TTL expiry).

        One TTL for all blocks, and every use moves a block to the end: the LRU head expires first."""
        for tier, medium in ((self.device, DEVICE), (self.host, HOST)):
            gone = []
            while tier and next(iter(tier.values())) <= now:
                h, _ = tier.popitem(last=False)
                gone.append(h)
                if medium == DEVICE:
                    self.announced.pop(h, None)
            if gone:
                self._events.append(BlockRemoved(gone, medium=medium))
        self._flush(now)

    def _flush(self, now: float) -> None:
        if self._events:
            self.seq += 1
            self.publish(KVEventBatch(ts=now, events=self._events, seq=self.seq, engine_id=self.engine_id))
            self._events = []
