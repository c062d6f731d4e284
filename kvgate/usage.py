"""The usage vocabulary every package shares: TTL classes, token categories and counts, usage events.

The engine reports a request's cache accounting in its own terms (inference.types.Usage);
the gateway turns that into TokenCounts once (gateway.usage.counts_from_usage), and from
there the same six counts, under the same names, reach the usage record, billing's ledger,
the invoices and the metrics. The database columns are the field names plus "_tokens".
"""

from __future__ import annotations

from collections.abc import Mapping
from dataclasses import dataclass, fields
from datetime import datetime
from enum import StrEnum
from typing import Any, Literal


class Category(StrEnum):
    """What a token was used for; each category has its own per-token rate."""

    INPUT = "input"
    CACHE_WRITE_5M = "cache_write_5m"
    CACHE_WRITE_30M = "cache_write_30m"
    CACHE_WRITE_1H = "cache_write_1h"
    CACHE_WRITE_12H = "cache_write_12h"
    CACHE_WRITE_24H = "cache_write_24h"
    CACHE_READ = "cache_read"
    OUTPUT = "output"


CATEGORY_LABELS: dict[Category, str] = {
    Category.INPUT: "Input",
    Category.CACHE_WRITE_5M: "Cache write (5m)",
    Category.CACHE_WRITE_30M: "Cache write (30m)",
    Category.CACHE_WRITE_1H: "Cache write (1h)",
    Category.CACHE_WRITE_12H: "Cache write (12h)",
    Category.CACHE_WRITE_24H: "Cache write (24h)",
    Category.CACHE_READ: "Cache read",
    Category.OUTPUT: "Output",
}


@dataclass(frozen=True)
class TtlClass:
    """A cache TTL a request may ask for: its length, its name in prices and APIs, its write category."""

    seconds: int
    name: str
    category: Category
    # Offered by every deployment; the others only where billing's price catalog prices them.
    standard: bool


CACHE_5M = TtlClass(300, "5m", Category.CACHE_WRITE_5M, standard=True)  # Anthropic's default
CACHE_30M = TtlClass(1800, "30m", Category.CACHE_WRITE_30M, standard=True)  # OpenAI's prompt_cache_options default
CACHE_1H = TtlClass(3600, "1h", Category.CACHE_WRITE_1H, standard=True)  # Anthropic's ttl "1h"
CACHE_12H = TtlClass(43200, "12h", Category.CACHE_WRITE_12H, standard=True)  # OpenAI's prompt_cache_breakpoint "12h"
CACHE_24H = TtlClass(86400, "24h", Category.CACHE_WRITE_24H, standard=False)  # OpenAI's deprecated 24h retention
TTL_CLASSES = (CACHE_5M, CACHE_30M, CACHE_1H, CACHE_12H, CACHE_24H)
DEFAULT_TTL = CACHE_5M
"""Writes under a TTL outside the table (an engine's own default) are counted in this class."""
TTL_BY_SECONDS = {t.seconds: t for t in TTL_CLASSES}
TTL_BY_NAME = {t.name: t for t in TTL_CLASSES}
STANDARD_TTLS_S = frozenset(t.seconds for t in TTL_CLASSES if t.standard)


@dataclass(frozen=True)
class TokenCounts:
    """Disjoint token counts of one request (or a sum of requests).

    input is prompt tokens neither read from nor written to the cache, as in
    Anthropic's usage, so the prompt is input + all writes + cache_read. The field
    names are the Category values, in Category order.
    """

    input: int = 0
    cache_write_5m: int = 0
    cache_write_30m: int = 0
    cache_write_1h: int = 0
    cache_write_12h: int = 0
    cache_write_24h: int = 0
    cache_read: int = 0
    output: int = 0

    def __post_init__(self) -> None:
        for f in fields(self):
            value = getattr(self, f.name)
            if type(value) is not int:
                raise TypeError(f"{f.name} must be an int, got {type(value).__name__}")

    @property
    def prompt_tokens(self) -> int:
        return self.input + self.cache_writes + self.cache_read

    @property
    def cache_writes(self) -> int:
        return sum(getattr(self, t.category.value) for t in TTL_CLASSES)

    def by_category(self) -> dict[Category, int]:
        return {Category(f.name): getattr(self, f.name) for f in fields(self)}

    def is_non_negative(self) -> bool:
        return all(v >= 0 for v in self.by_category().values())

    def as_columns(self) -> dict[str, int]:
        """The counts under their database column names (usage_records, ledger_entries, the usage API)."""
        return {f"{f.name}_tokens": getattr(self, f.name) for f in fields(self)}

    @classmethod
    def from_columns(cls, row: Any) -> TokenCounts:
        """The counts of a row (or a mapping) with the *_tokens columns."""
        get = row.get if isinstance(row, Mapping) else lambda name: getattr(row, name)
        return cls(**{f.name: get(f"{f.name}_tokens") for f in fields(cls)})

    def __add__(self, other: TokenCounts) -> TokenCounts:
        return TokenCounts(**{f.name: getattr(self, f.name) + getattr(other, f.name) for f in fields(self)})

    def __neg__(self) -> TokenCounts:
        return TokenCounts(**{f.name: -getattr(self, f.name) for f in fields(self)})


# interrupted: the process died while the request ran; start-up records it from the in-flight journal.
# "refused": a key over its rate limit or a request over a budget (gateway/refusals.py), never run nor billed.
UsageStatus = Literal["ok", "cancelled", "error", "interrupted", "refused"]
REFUSED: UsageStatus = "refused"
Endpoint = Literal["messages", "chat.completions", "completions", "responses"]


@dataclass(frozen=True)
class UsageEvent:
    """What one finished or abandoned request consumed. Token counts are the engine's, never estimates."""

    request_id: str
    tenant_id: str
    api_key_id: str
    model: str
    endpoint: Endpoint
    started_at: datetime
    counts: TokenCounts
    ttft_ms: int | None
    latency_ms: int
    status: UsageStatus
    # Where it ran (gateway.backends.base.Placement): "embedded", "kvgate" or "vllm", and the engine's id;
    # None when no engine took it (recovered from the in-flight journal, or refused by every engine).
    backend: str | None = None
    engine_id: str | None = None
    # The router's expectation of cache_read; recorded to compare with it, never billed.
    predicted_cached_tokens: int | None = None
    # A batch item's request (gateway/batches): priced at the batch rates.
    batch: bool = False
    # A refused request's limit (kvgate.errors.KvgateError.refusal) and the reserve that did not fit it.
    refusal_reason: str | None = None
    refusal_reserve_pico: int | None = None
    # The cache explanation (gateway/cache_explanation.py): its miss reason, and the whole as JSON text.
    cache_miss_reason: str | None = None
    cache_explanation: str | None = None

    def as_row(self) -> dict[str, Any]:
        """The event as a usage_records row."""
        return {
            "request_id": self.request_id,
            "tenant_id": self.tenant_id,
            "api_key_id": self.api_key_id,
            "model": self.model,
            "endpoint": self.endpoint,
            "started_at": self.started_at,
            **self.counts.as_columns(),
            "ttft_ms": self.ttft_ms,
            "latency_ms": self.latency_ms,
            "status": self.status,
            "backend": self.backend,
            "engine_id": self.engine_id,
            "predicted_cached_tokens": self.predicted_cached_tokens,
            "batch": self.batch,
            "refusal_reason": self.refusal_reason,
            "refusal_reserve_pico": self.refusal_reserve_pico,
            "cache_miss_reason": self.cache_miss_reason,
            "cache_explanation": self.cache_explanation,
        }


# Statuses billed nothing. `interrupted`: the gateway process died while the request ran (the
# record comes from its in-flight journal at the next start-up). The client got no response and
# no usage, as with a provider's failed request, and will retry; so it is free. Its ledger entry
# is still written, once, with zero billed tokens; the usage record keeps the prompt counts.
UNBILLED_STATUSES = frozenset({"interrupted"})


def billed_counts(counts: TokenCounts, *, status: str) -> TokenCounts:
    """What a request with this status is charged for: its counts, or nothing."""
    return TokenCounts() if status in UNBILLED_STATUSES else counts


class EntryKind(StrEnum):
    """A ledger entry's kind: one usage entry per request id, corrected by a reversal entry."""

    USAGE = "usage"
    REVERSAL = "reversal"
