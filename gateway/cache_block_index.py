"""What each tenant's recent prompts held, block by block: the index cache explanations are read from.

Per tenant, bounded (least recently used out): for each chained block hash
(gateway.prompt_blocks) and each cache partition it was seen under, whether a request wrote
it, with which TTL and until when (on the engine's clock), or why it was never written; and
for each (offset, content hash), the latest prompt that had those tokens there. A lookup is
taken before the request runs (`match`: what the tenant's earlier requests left), the record
after it ends (`record`: what this one read and wrote), so a request never explains itself.

Nothing here is shared with other processes: a gateway explains from the requests it served.
Expiry follows the engine's rule (inference.block_pool): a block lives until a TTL after its
last use, the longest TTL any user gave it.
"""

from __future__ import annotations

from collections import OrderedDict
from collections.abc import Sequence
from dataclasses import dataclass, field

from gateway.cache_fingerprints import Fingerprint
from gateway.prompt_blocks import PromptBlocks
from inference.types import DEFAULT_TTL_S, CacheRegion

DEFAULT_BLOCKS_PER_TENANT = 8192
DEFAULT_TENANTS = 512


@dataclass(frozen=True)
class PromptRef:
    """The request a block was last seen in: its fingerprint (to name the section that changed), if it had one."""

    fingerprint: Fingerprint | None


@dataclass
class BlockState:
    written: bool
    ttl_s: int  # the longest TTL it was written or read with (0: never written)
    expires_at: float  # engine-clock seconds; meaningless while not written
    cause: str | None  # why never written: "below_minimum", "no_breakpoint", "after_last_breakpoint", "partial_block"
    prompt: PromptRef

    def copy(self) -> BlockState:
        return BlockState(self.written, self.ttl_s, self.expires_at, self.cause, self.prompt)


@dataclass(frozen=True)
class Match:
    """What the tenant's earlier requests left for a prompt, taken before it runs."""

    shared_blocks: int  # the longest chained prefix seen before, in any partition
    same_partition_blocks: int  # the same, in this request's partition
    states: tuple[BlockState, ...]  # copies, for blocks < same_partition_blocks
    # The prompt sharing the longest prefix, else one repeating later blocks, else the latest one.
    reference: PromptRef | None
    repeated_after: int  # blocks after shared_blocks whose tokens were seen at the same offset before


@dataclass
class _Tenant:
    chain: OrderedDict[bytes, dict[bytes, BlockState]] = field(default_factory=OrderedDict)
    content: OrderedDict[tuple[int, bytes], PromptRef] = field(default_factory=OrderedDict)
    tools: tuple[tuple[bytes, ...], tuple[bytes, ...]] | None = None  # the last tool list: items, shapes
    last: PromptRef | None = None  # the latest prompt recorded


class CacheBlockIndex:
    def __init__(self, *, blocks_per_tenant: int = DEFAULT_BLOCKS_PER_TENANT, tenants: int = DEFAULT_TENANTS) -> None:
        assert blocks_per_tenant > 0 and tenants > 0
        self.blocks_per_tenant = blocks_per_tenant
        self.max_tenants = tenants
        self._tenants: OrderedDict[str, _Tenant] = OrderedDict()

    def _tenant(self, tenant_id: str, *, create: bool) -> _Tenant | None:
        tenant = self._tenants.get(tenant_id)
        if tenant is None and create:
            tenant = self._tenants[tenant_id] = _Tenant()
            while len(self._tenants) > self.max_tenants:
                self._tenants.popitem(last=False)
        if tenant is not None:
            self._tenants.move_to_end(tenant_id)
        return tenant

    def match(self, tenant_id: str, blocks: PromptBlocks, partition: bytes) -> Match:
        tenant = self._tenant(tenant_id, create=False)
        if tenant is None:
            return Match(0, 0, (), None, 0)
        shared = same = 0
        states: list[BlockState] = []
        last: dict[bytes, BlockState] = {}
        for i, digest in enumerate(blocks.chain):
            seen = tenant.chain.get(digest)
            if not seen:
                break
            shared, last = i + 1, seen
            mine = seen.get(partition)
            if mine is not None and same == i:
                same = i + 1
                states.append(mine.copy())
        reference: PromptRef | None = None
        if last:
            reference = (last.get(partition) or next(iter(last.values()))).prompt
        repeated = 0
        for j in range(shared + 1, len(blocks)):
            ref = tenant.content.get((j, blocks.content[j]))
            if ref is not None:
                repeated += 1
                if reference is None:
                    reference = ref
        return Match(shared, same, tuple(states), reference or tenant.last, repeated)

    def last_tools(self, tenant_id: str) -> tuple[tuple[bytes, ...], tuple[bytes, ...]] | None:
        tenant = self._tenant(tenant_id, create=False)
        return tenant.tools if tenant is not None else None

    def record(
        self,
        tenant_id: str,
        blocks: PromptBlocks,
        partition: bytes,
        *,
        read_blocks: int,
        regions: Sequence[CacheRegion],
        unwritten_cause: str,
        now: float,
        prompt: PromptRef,
        tools: tuple[tuple[bytes, ...], tuple[bytes, ...]] | None,
    ) -> None:
        """What a finished request read (its first read_blocks blocks) and wrote (the blocks its regions cover)."""
        tenant = self._tenant(tenant_id, create=True)
        assert tenant is not None
        if tools is not None and tools[0]:
            tenant.tools = tools
        tenant.last = prompt
        size = blocks.block_size
        for i, digest in enumerate(blocks.chain):
            end = (i + 1) * size
            # Regions come longest TTL first; a block takes the first that covers it (inference.types).
            ttl = next((r.ttl_s for r in regions if end <= r.end), 0)
            seen = tenant.chain.get(digest)
            if seen is None:
                seen = tenant.chain[digest] = {}
            else:
                tenant.chain.move_to_end(digest)
            state = seen.get(partition)
            if i < read_blocks and state is not None and state.written:
                state.ttl_s = max(state.ttl_s, ttl)
                state.expires_at = max(state.expires_at, now + state.ttl_s)
                state.prompt = prompt
            elif ttl or i < read_blocks:
                # Read but unknown here (another gateway wrote it): at least the default TTL.
                ttl = ttl or DEFAULT_TTL_S
                seen[partition] = BlockState(True, ttl, now + ttl, None, prompt)
            elif state is None or not state.written:
                last_end = max((r.end for r in regions), default=0)
                # The block holding the last breakpoint holds tokens after it too; the engine caches whole blocks.
                cause = "partial_block" if end - size < last_end else "after_last_breakpoint"
                seen[partition] = BlockState(False, 0, 0.0, cause if regions else unwritten_cause, prompt)
            key = (i, blocks.content[i])
            tenant.content[key] = prompt
            tenant.content.move_to_end(key)
        while len(tenant.chain) > self.blocks_per_tenant:
            tenant.chain.popitem(last=False)
        while len(tenant.content) > self.blocks_per_tenant:
            tenant.content.popitem(last=False)

    def forget(self, tenant_id: str) -> None:
        """Drop the tenant's entries (its cache was purged: nothing it held before can be read)."""
        self._tenants.pop(tenant_id, None)
