"""The engine's public request and result types: what the gateway and the engine server exchange with it."""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import Literal

FinishReason = Literal["stop", "length", "cancelled", "error"]
# Why a request ended in "error": it could not be served as given (a client error), the
# engine failed on it (a bug), or the engine stopped or died under it (retry elsewhere/later).
ErrorKind = Literal["invalid_request", "internal", "unavailable"]

DEFAULT_TTL_S = 300
# The longest cache TTL the engine takes (30 days); the disk tier stores TTLs as u32.
MAX_TTL_S = 30 * 86400
# torch's generators take seeds in [-2**63, 2**64 - 1]; anything else raises deep in sampling.
SEED_MIN, SEED_MAX = -(2**63), 2**64 - 1


@dataclass(frozen=True)
class CacheRegion:
    """Prompt tokens [0, end) may be committed to the prefix cache with this TTL.

    Regions arrive ordered longest TTL first; a block takes the TTL of the first
    region that covers it, so a 1h region followed by a 5m one marks its blocks 1h.
    """

    end: int
    ttl_s: int


@dataclass(frozen=True)
class CacheSpec:
    """How a request uses the prefix cache.

    salt: partitions the cache; requests only share blocks with the same salt.
    regions: cacheable regions. None means automatic caching: the whole prompt
        is cacheable with the default TTL. An empty tuple means nothing is committed
        (the request may still read).
    """

    salt: str | None = None
    regions: tuple[CacheRegion, ...] | None = None


StructuredKind = Literal["json_object", "json_schema", "grammar"]


@dataclass(frozen=True)
class StructuredOutput:
    """Constrains decoding so the output always matches a format.

    kind "json_object": any JSON object (value is ignored, "").
    kind "json_schema": value is a JSON Schema, as JSON text; the output validates against it.
    kind "grammar": value is a grammar in llguidance's Lark syntax (`%json {...}` embeds a schema).
    """

    kind: StructuredKind
    value: str = ""


@dataclass(frozen=True)
class FairShare:
    """Whose request this is, for the engine's fair queueing (inference.scheduler).

    Requests with the same key share one queue, served first-in first-out; queues are
    served in proportion to their weights. The gateway sets key to the tenant id and
    weight to the tenant's scheduling weight; requests without one share the key "".
    """

    key: str = ""
    weight: int = 1


@dataclass(frozen=True)
class SamplingParams:
    """Decoding controls, as in vLLM. temperature 0 means greedy; top_k 0 means off."""

    max_tokens: int = 256
    temperature: float = 1.0
    top_p: float = 1.0
    top_k: int = 0
    seed: int | None = None
    stop: tuple[str, ...] = ()
    stop_token_ids: tuple[int, ...] = ()
    ignore_eos: bool = False
    structured: StructuredOutput | None = None


@dataclass(frozen=True)
class Usage:
    """What one request read from, wrote to and computed outside the prefix cache.

    Invariant: cached_tokens + cache_write_tokens + uncached_tokens == prompt_tokens.
    cached_tokens are tokens whose prefill was really skipped; cache_write_tokens
    are tokens of blocks this request newly committed; cache_write_tokens_by_ttl
    splits the writes by TTL in seconds (e.g. {300: 1024, 3600: 2048}).
    cached_tokens_by_tier splits the reads by the tier each block was found in, by
    tier name: "device", then the tiers below in order (inference.tiers.TIER_NAMES:
    "host", "disk", "redis"). An admitted request lists every name, zeros included; a missing
    name means 0, and the values sum to cached_tokens.
    """

    prompt_tokens: int
    cached_tokens: int
    cache_write_tokens: int
    completion_tokens: int
    cached_tokens_by_tier: dict[str, int] = field(default_factory=dict)
    cache_write_tokens_by_ttl: dict[int, int] = field(default_factory=dict)

    @property
    def uncached_tokens(self) -> int:
        return self.prompt_tokens - self.cached_tokens - self.cache_write_tokens


@dataclass(frozen=True)
class TokenDelta:
    """New output since the last delta: token ids and the text they completed."""

    token_ids: tuple[int, ...]
    text: str


@dataclass(frozen=True)
class RequestOutput:
    """The final result of one request."""

    request_id: str
    prompt_token_ids: tuple[int, ...]
    token_ids: tuple[int, ...]
    text: str
    finish_reason: FinishReason
    usage: Usage
    stop_sequence: str | None = None
    ttft_s: float | None = None
    latency_s: float = 0.0
    error: str | None = None
    error_kind: ErrorKind | None = None  # set when finish_reason is "error"


class EngineError(Exception):
    """Base class for errors the engine reports to its callers."""


class InvalidRequestError(EngineError):
    """The request can never be served as given (bad parameters, prompt too long...)."""


class EngineOverloadedError(EngineError):
    """The waiting queue is full; retry later."""


class EngineUnavailableError(EngineError):
    """The engine is not serving: its thread died (see AsyncEngine.dead_reason) or it is shutting down."""
