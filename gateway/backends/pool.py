"""EnginePool: several remote engines (KVGATE_ENGINES) as one EngineClient.

Each request is routed by a gateway.routing.types.Router over the engines that are known and
healthy, with the loads this gateway put on them: the cache-aware router when the pool has a
PoolRouting (gateway.backends.pool_routing: what `kvgate serve` gives it), else the router_factory's
(weighted least-loaded by default). A background task probes every engine: GET /health every interval while it
answers; when it does not, with exponential backoff (capped); an engine that has never answered
is described (GET /v1/models, GET /kv/info) once it does, and joins. An engine whose connection
fails under a request is taken out at once, and probed back in. A request whose engine fails
before its first token is sent goes to another engine (gateway.backends.pool_handle); with no
engine left, submit() and check_health() raise EngineUnavailableError (the gateway's 503/529).
"""

from __future__ import annotations

import asyncio
import contextlib
import time
import uuid
from collections.abc import Callable, Mapping, Sequence
from typing import TYPE_CHECKING, Any

import structlog

from gateway.backends.engine_health import HealthPolicy, Member
from gateway.backends.engine_list import EngineSpec
from gateway.backends.http import EngineMismatchError, HttpEngine
from gateway.backends.pool_handle import PoolHandle
from gateway.backends.served_model import ServedModel
from gateway.routing.least_loaded import LeastLoadedRouter
from gateway.routing.types import RouteDecision, Router
from inference.hashing import BlockHash, BlockHasher
from inference.stats import EngineStats
from inference.types import DEFAULT_TTL_S, CacheSpec, EngineError, EngineUnavailableError, FairShare, SamplingParams

if TYPE_CHECKING:
    from prometheus_client import CollectorRegistry

    from gateway.backends.pool_routing import PoolRouting

log = structlog.get_logger("kvgate.gateway.pool")

# Builds the pool's router once the first engines are known. `weights` maps engine id to weight and
# is kept current by the pool as engines join: read it at each choice, do not copy it.
RouterFactory = Callable[[Mapping[str, float]], Router]


class EnginePool:
    """EngineClient over HttpEngines; `engines` are (URL, weight)."""

    def __init__(
        self,
        engines: Sequence[EngineSpec],
        *,
        model: ServedModel,
        router_factory: RouterFactory = LeastLoadedRouter,
        routing: PoolRouting | None = None,
        health: HealthPolicy | None = None,
        start_wait_s: float = 60.0,
        vllm_block_size: int | None = None,
        read_timeout_s: float = 600.0,
        engine_token: str | None = None,
    ) -> None:
        if not engines:
            raise ValueError("an engine pool needs at least one engine")
        self.model = model
        self.policy = health or HealthPolicy()
        self.members = [
            Member(
                HttpEngine(
                    spec.url,
                    model=model,
                    vllm_block_size=vllm_block_size,
                    read_timeout_s=read_timeout_s,
                    token=engine_token,
                ),
                spec.weight,
            )
            for spec in engines
        ]
        self.weights: dict[str, float] = {}
        self.router: Router | None = None
        self.hasher: BlockHasher | None = None
        self._router_factory = router_factory
        self.routing = routing  # when set, it builds the router (router_factory is unused) and follows joins
        self._start_wait_s = start_wait_s
        self._max_model_len = 0
        self._handles: dict[str, PoolHandle] = {}
        self._health_task: asyncio.Task[None] | None = None
        self._wake = asyncio.Event()

    # -- EngineClient -----------------------------------------------------------------------

    @property
    def model_id(self) -> str:
        return self.model.model_id

    @property
    def tokenizer(self) -> Any:
        return self.model.tokenizer

    @property
    def max_model_len(self) -> int:
        return self._max_model_len

    def apply_chat_template(self, messages: list[dict[str, Any]], *, tools: list[dict[str, Any]] | None = None) -> str:
        return self.model.apply_chat_template(messages, tools=tools)

    async def start(self) -> None:
        """Wait (up to start_wait_s) for an engine to answer with our model, then probe in the background.

        EngineMismatchError at once if an engine serves another model; EngineUnavailableError naming
        each engine and why if none answers in time.
        """
        loop = asyncio.get_running_loop()
        deadline = loop.time() + self._start_wait_s
        while True:
            await self._probe_due()
            wrong = [m for m in self.members if m.mismatched]
            if wrong:
                raise EngineMismatchError("; ".join(m.reason for m in wrong))
            if any(m.known for m in self.members) or loop.time() >= deadline:
                break
            next_at = min(m.next_probe_at for m in self.members)
            await asyncio.sleep(min(max(next_at - loop.time(), 0.05), max(deadline - loop.time(), 0.0)))
        known = [m for m in self.members if m.known]
        if not known:
            raise EngineUnavailableError(
                f"no engine answered within {self._start_wait_s:g} s: "
                + "; ".join(f"{m.url}: {m.reason}" for m in self.members)
            )
        first = known[0].engine.info
        assert first is not None
        self._max_model_len = min(m.engine.max_model_len for m in known)
        self.hasher = BlockHasher(model_id=first.model_id, block_size=first.block_size, algo=first.hash_algo)  # type: ignore[arg-type]
        if self.routing is not None:
            self.router = await self.routing.build(
                self.members, model_id=first.model_id, block_size=first.block_size, weights=self.weights
            )
        else:
            self.router = self._router_factory(self.weights)
        self._health_task = loop.create_task(self._health_loop(), name="engine-pool-health")

    async def shutdown(self, timeout_s: float | None = None) -> None:
        if self._health_task is not None:
            self._health_task.cancel()
            with contextlib.suppress(asyncio.CancelledError):
                await self._health_task
        for handle in list(self._handles.values()):
            handle.cancel()
        await asyncio.gather(*(m.engine.shutdown(timeout_s) for m in self.members), return_exceptions=True)
        if self.routing is not None:
            await self.routing.close()

    def attach_metrics(self, registry: CollectorRegistry) -> None:
        """Put the router's metrics on the app's registry (called by the app's lifespan before start())."""
        if self.routing is not None:
            self.routing.attach_metrics(registry)

    async def prepare(self, params: SamplingParams, *, share: FairShare | None = None) -> None:
        """Nothing here: each remote engine compiles the request's grammar itself, off its loop."""

    def submit(
        self,
        prompt_token_ids: Sequence[int],
        params: SamplingParams,
        cache: CacheSpec,
        request_id: str | None = None,
        share: FairShare | None = None,
    ) -> PoolHandle:
        if not any(m.routable for m in self.members):
            raise EngineUnavailableError(self.unavailable_reason())
        request_id = request_id or f"pool-{uuid.uuid4().hex}"
        handle = PoolHandle(self, request_id, tuple(prompt_token_ids), params, cache, share)
        self._handles[request_id] = handle
        handle.start()
        return handle

    def abort(self, request_id: str) -> None:
        handle = self._handles.get(request_id)
        if handle is not None:
            handle.cancel()

    async def check_health(self) -> None:
        if not any(m.routable for m in self.members):
            raise EngineUnavailableError(self.unavailable_reason())

    def stats(self) -> EngineStats | None:
        return None  # each engine serves its own /metrics

    # -- what PoolHandle uses ---------------------------------------------------------------

    def unavailable_reason(self) -> str:
        return "no engine is available: " + "; ".join(f"{m.url}: {m.reason or 'not answering'}" for m in self.members)

    def block_hashes(self, prompt_token_ids: Sequence[int], salt: str | None) -> list[BlockHash]:
        """The request's salted chained block hashes, as the engines compute them (for the router): those an
        engine can hold, so never the block of the last prompt token (always recomputed, never committed)."""
        if self.hasher is None or not getattr(self.router, "uses_block_hashes", True):
            return []
        return self.hasher.hash_blocks(prompt_token_ids[: max(len(prompt_token_ids) - 1, 0)], salt)

    def choose(
        self, block_hashes: Sequence[BlockHash], cache: CacheSpec, *, exclude: set[str]
    ) -> tuple[Member, RouteDecision] | None:
        """The engine for a request among the routable ones not in `exclude` (URLs), or None."""
        candidates = {m.engine_id: m for m in self.members if m.routable and m.url not in exclude}
        if not candidates or self.router is None:
            return None
        loads = {engine_id: m.load() for engine_id, m in candidates.items()}
        # Wall-clock epoch seconds: the clock of the events' expiries in the router's index.
        decision = self.router.choose(block_hashes, loads, ttl_s=request_ttl_s(cache), now=time.time())
        member = candidates.get(decision.engine)
        if member is None:  # a router naming an engine it was not offered: take the least loaded
            member = min(candidates.values(), key=lambda m: (m.active / m.weight, m.url))
            decision = RouteDecision(member.engine_id, 0, "fallback")
        return member, decision

    def record_actual(self, decision: RouteDecision, actual_hit_blocks: int) -> None:
        """Tell the router the engine's real count; a router's failure here never fails the request."""
        if self.router is None:
            return
        try:
            self.router.record_actual(decision, actual_hit_blocks)
        except Exception:
            log.exception("router_record_actual_failed", engine=decision.engine)

    def connection_failed(self, member: Member, reason: str) -> None:
        """A request's connection to this engine failed: no traffic until a probe answers."""
        if member.failed(reason, asyncio.get_running_loop().time(), self.policy):
            log.warning("engine_down", engine=member.url, engine_id=member.engine_id, reason=reason)
        self._wake.set()

    def forget(self, request_id: str) -> None:
        self._handles.pop(request_id, None)

    # -- health -----------------------------------------------------------------------------

    async def _health_loop(self) -> None:
        loop = asyncio.get_running_loop()
        while True:
            try:
                await self._probe_due()
            except Exception:  # never let the prober die: engines would stay out for good
                log.exception("engine_probe_failed")
            self._wake.clear()
            next_at = min(m.next_probe_at for m in self.members)
            # asyncio.timeout, not wait_for: 3.11's wait_for can swallow the cancel of shutdown()
            # when the event is set at the same moment, and the prober would outlive the pool.
            with contextlib.suppress(TimeoutError):
                async with asyncio.timeout(max(next_at - loop.time(), 0.01)):
                    await self._wake.wait()

    async def _probe_due(self) -> None:
        now = asyncio.get_running_loop().time()
        due = [m for m in self.members if m.next_probe_at <= now]
        await asyncio.gather(*(self._probe(m) for m in due))

    async def _probe(self, member: Member) -> None:
        loop = asyncio.get_running_loop()
        try:
            if member.known:
                await member.engine.check_health()
            else:
                await member.engine.start()
                self._adopt(member)
        except EngineMismatchError as exc:
            member.mismatched = True
            member.failed(str(exc), loop.time(), self.policy)
            log.error("engine_mismatch", engine=member.url, reason=str(exc))
        except EngineError as exc:
            if member.failed(str(exc), loop.time(), self.policy):
                log.warning("engine_down", engine=member.url, engine_id=member.engine_id, reason=str(exc))
        else:
            member.mismatched = False
            if member.succeeded(loop.time(), self.policy):
                log.info("engine_up", engine=member.url, engine_id=member.engine_id)

    def _adopt(self, member: Member) -> None:
        """A newly described engine joins: its id must be unique, its layout the pool's."""
        info = member.engine.info
        assert info is not None
        others = {m.engine_id: m for m in self.members if m.known and m is not member}
        if info.engine_id in others:
            member.engine.info = None
            raise EngineMismatchError(
                f"the engine at {member.url} has the id {info.engine_id!r} of {others[info.engine_id].url}: "
                "give each engine its own KVGATE_ENGINE_ID"
            )
        if self.hasher is not None and (info.block_size, info.hash_algo) != (self.hasher.block_size, self.hasher.algo):
            log.warning("engine_layout_differs", engine=member.url, block_size=info.block_size, hash=info.hash_algo)
        if self._max_model_len and info.max_model_len < self._max_model_len:
            log.warning("engine_context_shorter", engine=member.url, max_model_len=info.max_model_len)
        member.known = True
        self.weights[info.engine_id] = member.weight
        if self.routing is not None:
            self.routing.engine_joined(member)


def request_ttl_s(cache: CacheSpec) -> int:
    """The TTL the request caches for: its longest region's, the default for automatic caching, 0 for none."""
    if cache.regions is None:
        return DEFAULT_TTL_S
    return max((r.ttl_s for r in cache.regions), default=0)
