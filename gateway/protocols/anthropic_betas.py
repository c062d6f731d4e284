"""The `anthropic-beta` header: the betas kvgate takes, and a 400 for any other, as at Anthropic.

Each value named here is something kvgate does (prompt caching, the 1h TTL, count_tokens, batches,
structured outputs) or something that changes nothing here (a longer output allowance: max_tokens is
clipped to the context anyway; tool streaming and token-efficient tools: tool calls stream as they
do). A beta for a feature kvgate does not have (computer use, files, MCP, 1M context...) is refused
rather than silently ignored, so that a client relying on it learns at once.
"""

from __future__ import annotations

from collections.abc import Iterable

from kvgate.errors import InvalidRequestError

HEADER = "anthropic-beta"

ACCEPTED_BETAS = frozenset(
    {
        "prompt-caching-2024-07-31",
        "extended-cache-ttl-2025-04-11",
        "token-counting-2024-11-01",
        "message-batches-2024-09-24",
        "output-128k-2025-02-19",
        "structured-outputs-2025-11-13",
        "fine-grained-tool-streaming-2025-05-14",
        "token-efficient-tools-2025-02-19",
        # Cache diagnostics (`diagnostics`, gateway.protocols.cache_diagnostics): answered with or without
        # the header, as Anthropic does now that the feature is generally available.
        "cache-diagnosis-2026-04-07",
    }
)


def check_betas(headers: Iterable[str]) -> None:
    """A 400 naming the values of `anthropic-beta` headers (comma-separated, possibly repeated) kvgate does not take."""
    values = [value.strip() for header in headers for value in header.split(",") if value.strip()]
    unknown = [value for value in values if value not in ACCEPTED_BETAS]
    if unknown:
        named = ", ".join(f"`{value}`" for value in unknown)
        accepted = ", ".join(sorted(ACCEPTED_BETAS))
        raise InvalidRequestError(f"Unexpected value(s) {named} for the `{HEADER}` header. kvgate accepts: {accepted}")
