"""Token categories and the counts one request is billed for."""

from __future__ import annotations

from dataclasses import dataclass, fields
from enum import StrEnum


class Category(StrEnum):
    """What a token was used for; each category has its own per-token rate."""

    INPUT = "input"
    CACHE_WRITE_5M = "cache_write_5m"
    CACHE_WRITE_1H = "cache_write_1h"
    CACHE_WRITE_24H = "cache_write_24h"
    CACHE_READ = "cache_read"
    OUTPUT = "output"


CATEGORY_LABELS: dict[Category, str] = {
    Category.INPUT: "Input",
    Category.CACHE_WRITE_5M: "Cache write (5m)",
    Category.CACHE_WRITE_1H: "Cache write (1h)",
    Category.CACHE_WRITE_24H: "Cache write (24h)",
    Category.CACHE_READ: "Cache read",
    Category.OUTPUT: "Output",
}

# The write category for each TTL class name used in the price catalog and the gateway.
WRITE_CATEGORY_BY_TTL: dict[str, Category] = {
    "5m": Category.CACHE_WRITE_5M,
    "1h": Category.CACHE_WRITE_1H,
    "24h": Category.CACHE_WRITE_24H,
}


@dataclass(frozen=True)
class TokenCounts:
    """Disjoint token counts of one request (or a sum of requests).

    input is prompt tokens neither read from nor written to the cache, as in
    Anthropic's usage, so the prompt is input + all writes + cache_read.
    """

    input: int = 0
    cache_write_5m: int = 0
    cache_write_1h: int = 0
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
        return self.cache_write_5m + self.cache_write_1h + self.cache_write_24h

    def by_category(self) -> dict[Category, int]:
        return {Category(f.name): getattr(self, f.name) for f in fields(self)}

    def is_non_negative(self) -> bool:
        return all(v >= 0 for v in self.by_category().values())

    def __add__(self, other: TokenCounts) -> TokenCounts:
        return TokenCounts(**{f.name: getattr(self, f.name) + getattr(other, f.name) for f in fields(self)})

    def __neg__(self) -> TokenCounts:
        return TokenCounts(**{f.name: -getattr(self, f.name) for f in fields(self)})


# Statuses billed nothing. `interrupted`: the gateway process died while the request ran (the
# record comes from its in-flight journal at the next start-up). The client got no response and
# no usage, as with a provider's failed request, and will retry; so it is free. Its ledger entry
# is still written, once, with zero billed tokens; the usage record keeps the prompt counts.
UNBILLED_STATUSES = frozenset({"interrupted"})


def billed_counts(counts: TokenCounts, *, status: str) -> TokenCounts:
    """What a request with this status is charged for: its counts, or nothing."""
    return TokenCounts() if status in UNBILLED_STATUSES else counts
