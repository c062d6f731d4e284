"""OpenAI's prompt-caching controls, mapped onto kvgate's cache regions and TTL classes.

Two generations of controls exist (openai SDK 3.57, types/chat/completion_create_params.py):

- `prompt_cache_retention` ("in_memory", "in-memory", "24h"; deprecated): automatic caching of
  the whole prompt, 5m or (where billing prices it) 24h. What kvgate did before the others existed.
- `prompt_cache_options` {mode: "implicit" | "explicit", ttl: "30m" | "12h"} and, on a content
  part, `prompt_cache_breakpoint` {mode: "explicit", ttl?: "30m" | "12h"}: as soon as either is
  in a request, it is cached the new way. The request's TTL is `prompt_cache_options.ttl` (30m by
  default); a breakpoint without a ttl inherits it. In `implicit` mode (the default) the request
  writes one implicit breakpoint (kvgate puts it at the end of the prompt) and the latest three
  explicit ones; in `explicit` mode the latest four explicit ones and no implicit one, so a request
  without breakpoints writes nothing. OpenAI documents no count limit or TTL order, so neither is
  a 400: earlier breakpoints past the limit are simply not written.

Breakpoints shorter than the minimum cacheable length have no effect, as on Anthropic's API
(gateway.cache_regions). `prompt_cache_retention` is a maximum retention, `prompt_cache_options.ttl`
a minimum lifetime, and OpenAI says they do not interact: with the new controls, a retention is
validated (and 24h must be priced) but does not change the TTL of what is written.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Literal

from gateway.cache_regions import automatic_region, breakpoint_regions
from gateway.prompt import Breakpoint
from gateway.protocols.common import Strict
from inference.types import CacheRegion
from kvgate.usage import CACHE_5M, CACHE_24H, CACHE_30M, TTL_BY_NAME

# prompt_cache_retention as OpenAI spells it, to our TTL classes.
RETENTION_TTL_S = {"in_memory": CACHE_5M.seconds, "in-memory": CACHE_5M.seconds, "24h": CACHE_24H.seconds}
DEFAULT_TTL = CACHE_30M.name
# How many explicit breakpoints a request writes, by mode (the implicit one takes a slot).
EXPLICIT_WRITES = {"implicit": 3, "explicit": 4}

OpenAITtl = Literal["30m", "12h"]


class PromptCacheBreakpoint(Strict):
    """Marks the exact end of a reusable prompt prefix (on a content part)."""

    mode: Literal["explicit"] = "explicit"
    ttl: OpenAITtl | None = None


class PromptCacheOptions(Strict):
    mode: Literal["implicit", "explicit"] = "implicit"
    # The Chat Completions SDK types allow only "30m" today; the Responses API also takes "12h",
    # which every deployment prices, so it is accepted here too.
    ttl: OpenAITtl = DEFAULT_TTL


def request_ttl(options: PromptCacheOptions | None) -> str:
    return options.ttl if options is not None else DEFAULT_TTL


def breakpoint_ttl_s(part_breakpoint: PromptCacheBreakpoint | None, options: PromptCacheOptions | None) -> int | None:
    """The TTL of a content part's breakpoint in seconds (it inherits the request's), or None."""
    if part_breakpoint is None:
        return None
    return TTL_BY_NAME[part_breakpoint.ttl or request_ttl(options)].seconds


@dataclass(frozen=True)
class CachePlan:
    """What a Chat Completions request asked of the cache, before its prompt is rendered."""

    options: PromptCacheOptions | None
    retention: str | None

    @property
    def legacy(self) -> bool:
        """Automatic caching as before prompt_cache_options (decided per request with its breakpoints)."""
        return self.options is None

    def regions(self, breakpoints: list[Breakpoint], *, prompt_tokens: int, min_tokens: int) -> tuple[CacheRegion, ...]:
        """The engine's cache regions for a rendered prompt and its explicit breakpoints (in prompt order)."""
        if self.legacy and not breakpoints:
            ttl_s = RETENTION_TTL_S[self.retention or "in_memory"]
            return automatic_region(prompt_tokens, ttl_s=ttl_s, min_tokens=min_tokens)
        mode = self.options.mode if self.options is not None else "implicit"
        written = breakpoints[-EXPLICIT_WRITES[mode] :] if breakpoints else []
        if mode == "implicit":
            implicit_ttl_s = TTL_BY_NAME[request_ttl(self.options)].seconds
            written = [*written, Breakpoint(token_end=prompt_tokens, ttl_s=implicit_ttl_s)]
        return breakpoint_regions(written, min_tokens=min_tokens)
