"""Why a request read what it read: the engine-precision explanation kvgate adds to a response and its record.

Compared with the tenant's earlier prompt that shares the longest block prefix
(gateway.cache_block_index, no provider id needed):

- `divergence`: the first block (and its first token) where this prompt parts from every earlier
  one, and the region it falls in (`tools[i]`, `system`, `messages[k]`: messages counted after the
  system prompt, as in Anthropic's `messages`), or null when the whole prompt was seen before;
- `miss`: for blocks that matched an earlier prompt but were not read, why, from the first of them:
  - `expired` (`expired_at`: its TTL ran out after its last use),
  - `evicted` (`tier`: the last tier that held it; kvgate keeps an evicted live block in the tiers
    below, so it left from the lowest one),
  - `never_written` (`cause`: `below_minimum` under KVGATE_MIN_CACHEABLE_TOKENS, `no_breakpoint`,
    `after_last_breakpoint`; the one block a breakpoint ends inside, never whole, is not counted),
  - `other_partition` (seen only under another `cache_salt`),

  with `tokens`, how many matched tokens were not read, and `block`, the first of them.
"""

from __future__ import annotations

from datetime import UTC, datetime
from typing import Any

from gateway.cache_block_index import Match
from gateway.cache_layout import Finding


def _iso(seconds: float) -> str:
    return datetime.fromtimestamp(seconds, UTC).isoformat(timespec="seconds").replace("+00:00", "Z")


def miss_reason(
    match: Match, *, read_blocks: int, block_size: int, now: float, lowest_tier: str
) -> dict[str, Any] | None:
    if read_blocks >= match.shared_blocks:
        return None
    if read_blocks >= match.same_partition_blocks:
        tokens = (match.shared_blocks - read_blocks) * block_size
        return {"reason": "other_partition", "tokens": tokens, "block": read_blocks}
    first = read_blocks
    if match.states[first].cause == "partial_block":
        # The block a breakpoint ends in is never whole: not a miss the prompt's layout could avoid.
        first += 1
        if first >= match.same_partition_blocks:
            return None
    state = match.states[first]
    read_blocks = first
    miss: dict[str, Any] = {"tokens": (match.same_partition_blocks - read_blocks) * block_size, "block": read_blocks}
    if not state.written:
        return {"reason": "never_written", "cause": state.cause, **miss}
    if state.expires_at <= now:
        return {"reason": "expired", "expired_at": _iso(state.expires_at), **miss}
    return {"reason": "evicted", "tier": lowest_tier, **miss}


def explanation(
    match: Match,
    *,
    block_size: int,
    prompt_tokens: int,
    read_tokens: int,
    written_tokens: int,
    total_blocks: int,
    compared: bool,
    region: str | None,
    now: float,
    lowest_tier: str,
    findings: list[Finding],
) -> dict[str, Any]:
    divergence = None
    if compared and match.shared_blocks < total_blocks:
        block = match.shared_blocks
        divergence = {"token": block * block_size, "block": block, "region": region}
    return {
        "block_size": block_size,
        "prompt_tokens": prompt_tokens,
        "read_tokens": read_tokens,
        "written_tokens": written_tokens,
        "compared_with_earlier": compared,
        "shared_prefix_tokens": match.shared_blocks * block_size,
        "divergence": divergence,
        "miss": miss_reason(
            match, read_blocks=read_tokens // block_size, block_size=block_size, now=now, lowest_tier=lowest_tier
        ),
        "warnings": [f.as_dict() for f in findings],
    }
