"""One request's cache explanation: the index looked up before it runs, the explanation and record after.

`probe_prompt` (start_generation, on the event loop) hashes the prompt's blocks with the tenant's
seed, takes what the tenant's earlier requests left (gateway.cache_block_index.Match) and the
layout findings, which can go out as a header before the first byte of a stream. `finish`
(the request's bookkeeping, once) builds the explanation from the engine's read count and
records what this request read and wrote, so the next request can be explained against it.
"""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import TYPE_CHECKING, Any

import xxhash

from gateway.cache_block_index import CacheBlockIndex, Match, PromptRef
from gateway.cache_explanation import explanation
from gateway.cache_fingerprints import Fingerprint, tenant_key
from gateway.cache_layout import HEADER, Finding, region_name, tool_order, volatile_prefix
from gateway.prompt_blocks import PromptBlocks, prompt_blocks, tenant_seed
from inference.clock import Clock, SystemClock
from inference.types import CacheRegion, Usage

if TYPE_CHECKING:
    from gateway.generation import Prepared
    from gateway.state import Gateway

DEFAULT_BLOCK_SIZE = 16


@dataclass(frozen=True)
class EngineCacheFacts:
    block_size: int
    clock: Clock
    lowest_tier: str  # where an evicted block was held last


def engine_cache_facts(gw: Gateway) -> EngineCacheFacts:
    """The engine's block size, TTL clock and lowest tier (remote engines: their hasher's block size, wall time)."""
    engine = getattr(gw.engine, "engine", None)  # the embedded backend's AsyncEngine
    block_size = getattr(engine, "block_size", None) or getattr(getattr(gw.engine, "hasher", None), "block_size", None)
    clock = getattr(engine, "clock", None) or SystemClock()
    stats = gw.engine.stats() if engine is not None else None
    lowest = stats.tiers[-1].name if stats is not None and stats.tiers else "device"
    return EngineCacheFacts(block_size or DEFAULT_BLOCK_SIZE, clock, lowest)


def _unwritten_cause(prepared: Prepared, min_tokens: int) -> str:
    """Why a request with no cacheable region writes nothing."""
    if prepared.prompt.breakpoints or len(prepared.prompt.token_ids) < min_tokens:
        return "below_minimum"
    return "no_breakpoint"


@dataclass
class CacheProbe:
    index: CacheBlockIndex
    tenant_id: str
    blocks: PromptBlocks
    partition: bytes
    match: Match
    findings: list[Finding]
    fingerprint: Fingerprint | None
    prompt_tokens: int
    regions: tuple[CacheRegion, ...]
    unwritten_cause: str
    facts: EngineCacheFacts
    looked_up_at: float
    explanation: dict[str, Any] | None = field(default=None)

    @property
    def headers(self) -> dict[str, str]:
        if not self.findings:
            return {}
        return {HEADER: ", ".join(f.as_header() for f in self.findings)}

    def finish(self, usage: Usage, *, ran: bool) -> dict[str, Any]:
        """The explanation (kept on the probe); what the request read and wrote is recorded when it ran."""
        if self.explanation is not None:
            return self.explanation
        reference = self.match.reference
        size = self.blocks.block_size
        self.explanation = explanation(
            self.match,
            block_size=size,
            prompt_tokens=self.prompt_tokens,
            read_tokens=usage.cached_tokens,
            written_tokens=usage.cache_write_tokens,
            total_blocks=len(self.blocks),
            compared=reference is not None,
            region=region_name(reference.fingerprint if reference else None, self.fingerprint),
            now=self.looked_up_at,
            lowest_tier=self.facts.lowest_tier,
            findings=self.findings,
        )
        if ran:
            tools = (self.fingerprint.tool_items, self.fingerprint.tool_shapes) if self.fingerprint else None
            self.index.record(
                self.tenant_id,
                self.blocks,
                self.partition,
                read_blocks=usage.cached_tokens // size,
                regions=self.regions,
                unwritten_cause=self.unwritten_cause,
                now=self.facts.clock.now(),
                prompt=PromptRef(self.fingerprint),
                tools=tools,
            )
        return self.explanation


def probe_prompt(gw: Gateway, *, tenant_id: str, prepared: Prepared, fingerprint: Fingerprint | None) -> CacheProbe:
    facts = gw.cache_facts
    if facts is None:
        facts = gw.cache_facts = engine_cache_facts(gw)
    seed = tenant_seed(tenant_key(gw.secret, tenant_id))
    blocks = prompt_blocks(prepared.prompt.token_ids, block_size=facts.block_size, seed=seed)
    # The partition as the fingerprint seals it, or (no fingerprint: Chat Completions) a seeded hash of the salt.
    partition = fingerprint.partition if fingerprint is not None else _partition(prepared.client_salt, seed)
    match = gw.cache_index.match(tenant_id, blocks, partition)
    # Reordered tools shift nothing after them, so they look like a volatile prefix too: say the cause only.
    tools = tool_order(gw.cache_index.last_tools(tenant_id), fingerprint)
    volatile = volatile_prefix(match, blocks, fingerprint) if tools is None else None
    findings = [f for f in (tools, volatile) if f is not None]
    return CacheProbe(
        index=gw.cache_index,
        tenant_id=tenant_id,
        blocks=blocks,
        partition=partition,
        match=match,
        findings=findings,
        fingerprint=fingerprint,
        prompt_tokens=len(prepared.prompt.token_ids),
        regions=prepared.regions,
        unwritten_cause=_unwritten_cause(prepared, gw.settings.min_cacheable_tokens),
        facts=facts,
        looked_up_at=facts.clock.now(),
    )


def _partition(client_salt: str | None, seed: int) -> bytes:
    return xxhash.xxh3_128_digest(b"\x00" if client_salt is None else b"\x01" + client_salt.encode(), seed)
