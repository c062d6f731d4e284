"""The engine's per-request state."""

from __future__ import annotations

import enum
from dataclasses import dataclass, field

from inference.block_pool import KVBlock
from inference.hashing import BlockHash
from inference.types import CacheSpec, FairShare, SamplingParams


class RequestStatus(enum.Enum):
    WAITING = "waiting"
    RUNNING = "running"
    FINISHED = "finished"


@dataclass(eq=False)
class Request:
    request_id: str
    prompt_token_ids: list[int]
    params: SamplingParams
    cache: CacheSpec
    arrival_time: float
    block_size: int
    # Hashes of the prompt's full blocks, and the TTL each committable block gets
    # (len(commit_ttls) <= len(block_hashes): blocks past it are never committed).
    block_hashes: list[BlockHash]
    commit_ttls: list[int]
    # Token offsets where prefill passes end (ascending): each region's last full block and
    # the commit boundary. See Scheduler.chunk_len.
    split_points: list[int]
    status: RequestStatus = RequestStatus.WAITING
    output_token_ids: list[int] = field(default_factory=list)
    blocks: list[KVBlock] = field(default_factory=list)
    num_computed_tokens: int = 0
    # Cache accounting, fixed at the first admission (reads) or accumulated (writes).
    num_cached_tokens: int | None = None
    cached_by_tier: dict[str, int] = field(default_factory=dict)  # tier name -> tokens read
    num_committed_blocks: int = 0  # blocks [0, n) are committed or hits, in this admission
    num_accounted_blocks: int = 0  # blocks [0, n) were counted as a read, a write or neither
    write_tokens_by_ttl: dict[int, int] = field(default_factory=dict)
    first_token_time: float | None = None
    num_preemptions: int = 0
    share: FairShare = field(default_factory=FairShare)  # whose queue it waits in (inference.scheduler)

    @property
    def num_prompt_tokens(self) -> int:
        return len(self.prompt_token_ids)

    @property
    def num_tokens(self) -> int:
        return len(self.prompt_token_ids) + len(self.output_token_ids)

    def token_id(self, position: int) -> int:
        n = len(self.prompt_token_ids)
        return self.prompt_token_ids[position] if position < n else self.output_token_ids[position - n]

    def token_slice(self, start: int, end: int) -> list[int]:
        n = len(self.prompt_token_ids)
        if end <= n:
            return self.prompt_token_ids[start:end]
        return (self.prompt_token_ids + self.output_token_ids)[start:end]
