"""Cache breakpoints to the engine's cacheable regions.

A breakpoint whose prefix is shorter than the minimum cacheable length has no
effect. Of the rest, the engine gets one region per TTL class, longest TTL first,
each ending at the last breakpoint of that TTL or later (a prefix a longer TTL
already covers is not written again): for Anthropic's 5m and 1h, (end of the last
1h breakpoint, 3600 s) then (end of the last breakpoint, 300 s); OpenAI's 30m and
12h breakpoints (gateway.protocols.openai_caching) the same way.
Tokens after the last breakpoint are never committed, and an empty tuple means
the request writes nothing (it may still read what its tenant cached before).
"""

from __future__ import annotations

from collections.abc import Sequence

from gateway.prompt import Breakpoint
from inference.types import CacheRegion


def breakpoint_regions(breakpoints: Sequence[Breakpoint], *, min_tokens: int) -> tuple[CacheRegion, ...]:
    effective = [b for b in breakpoints if b.token_end >= max(min_tokens, 1)]
    if not effective:
        return ()
    by_ttl: dict[int, int] = {}
    for b in effective:
        by_ttl[b.ttl_s] = max(by_ttl.get(b.ttl_s, 0), b.token_end)
    regions: list[CacheRegion] = []
    covered = 0
    for ttl in sorted(by_ttl, reverse=True):
        end = max(by_ttl[ttl], covered)
        # A shorter-TTL region that ends where a longer one does adds nothing.
        if end > covered:
            regions.append(CacheRegion(end=end, ttl_s=ttl))
            covered = end
    return tuple(regions)


def automatic_region(prompt_tokens: int, *, ttl_s: int, min_tokens: int) -> tuple[CacheRegion, ...]:
    """OpenAI-style automatic caching: the whole prompt, if it is long enough."""
    if prompt_tokens < max(min_tokens, 1):
        return ()
    return (CacheRegion(end=prompt_tokens, ttl_s=ttl_s),)
