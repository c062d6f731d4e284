"""The wire between gateway.backends.http and a remote engine: vLLM's streamed /v1/completions.

Both flavours take the same request: the prompt as token ids (the gateway renders and tokenizes),
`stream_options` with `include_usage` and `continuous_usage_stats` (vLLM's options: every chunk
carries the usage so far), `cache_salt` (vLLM's), and, for kvgate engines only, kvgate's
`cache_regions` extension. Usage comes back in `usage.prompt_tokens_details`:

- a kvgate engine (`kvgate engine serve`) reports reads and writes (`cached_tokens`,
  `cache_write_tokens`, `cache_write_tokens_by_ttl`, `cached_tokens_by_tier`), already on the
  first text chunk: its prefill is done by then;
- a vLLM engine reports reads only (`cached_tokens`, with `--enable-prompt-tokens-details`, in the
  final usage chunk). The writes billed for it are derived by vllm_writes() below.
"""

from __future__ import annotations

import json
import re
from collections.abc import Sequence
from typing import Any, Literal, NamedTuple

from inference.types import DEFAULT_TTL_S, CacheRegion, CacheSpec, FairShare, SamplingParams, Usage

# "kvgate": kvgate's engine server, which counts writes itself; "vllm": vLLM's OpenAI server (or any
# OpenAI-compatible completions server), which reports reads only.
Flavour = Literal["kvgate", "vllm"]


class WireError(ValueError):
    """The engine answered something that is not the protocol (a bad chunk, impossible counts)."""


def completion_body(
    *,
    model: str,
    prompt_token_ids: Sequence[int],
    params: SamplingParams,
    cache: CacheSpec,
    flavour: Flavour,
    share: FairShare | None = None,
) -> dict[str, Any]:
    """The /v1/completions request for one submitted request, streamed with usage on every chunk."""
    body: dict[str, Any] = {
        "model": model,
        "prompt": list(prompt_token_ids),
        "max_tokens": params.max_tokens,
        "temperature": params.temperature,
        "top_p": params.top_p,
        "top_k": params.top_k or -1,  # vLLM spells "off" -1
        "stop": list(params.stop),
        "stop_token_ids": list(params.stop_token_ids),
        "ignore_eos": params.ignore_eos,
        "stream": True,
        "stream_options": {"include_usage": True, "continuous_usage_stats": True},
    }
    if params.seed is not None:
        body["seed"] = params.seed
    if cache.salt is not None:
        body["cache_salt"] = cache.salt
    if cache.regions is not None and flavour == "kvgate":
        body["cache_regions"] = [{"end": r.end, "ttl_s": r.ttl_s} for r in cache.regions]
    if share is not None and flavour == "kvgate":
        body["fair_share"] = {"key": share.key, "weight": share.weight}
    structured = params.structured
    if structured is not None:
        if structured.kind == "json_object":
            body["response_format"] = {"type": "json_object"}
        elif structured.kind == "json_schema":
            schema = json.loads(structured.value)
            body["response_format"] = {"type": "json_schema", "json_schema": {"name": "output", "schema": schema}}
        else:
            body["structured_outputs"] = {"grammar": structured.value}
    return body


class Chunk(NamedTuple):
    """One parsed SSE data line of a streamed completion."""

    text: str
    finish_reason: str | None
    stop_reason: int | str | None
    usage: dict[str, Any] | None
    error: str | None  # the engine's message when the chunk is an error
    error_status: int | None
    final_usage: bool = False  # the usage chunk at the end (no choices): the request's whole usage


def parse_chunk(data: str) -> Chunk:
    """A `data:` payload (without the prefix); WireError for anything else than a completion chunk or an error."""
    try:
        body = json.loads(data)
    except ValueError as exc:
        raise WireError(f"the engine sent a chunk that is not JSON: {data[:200]!r}") from exc
    if not isinstance(body, dict):
        raise WireError(f"the engine sent a chunk that is not an object: {data[:200]!r}")
    if "error" in body or body.get("object") == "error":
        # vLLM's and ours: {"error": {"message", "type", "code"}}; older vLLM: {"object": "error", "message", ...}.
        info = body["error"] if isinstance(body.get("error"), dict) else body
        code = info.get("code")
        return Chunk("", None, None, None, str(info.get("message") or "the engine failed"), _int_or_none(code))
    choices = body.get("choices") or []
    if not isinstance(choices, list) or len(choices) > 1:
        raise WireError("the engine sent a chunk with more than one choice")
    usage = body.get("usage")
    if usage is not None and not isinstance(usage, dict):
        raise WireError("the engine sent a usage that is not an object")
    if not choices:
        return Chunk("", None, None, usage, None, None, final_usage=usage is not None)
    choice = choices[0]
    text = choice.get("text") or ""
    if not isinstance(text, str):
        raise WireError("the engine sent a choice whose text is not a string")
    return Chunk(text, choice.get("finish_reason"), choice.get("stop_reason"), usage, None, None)


def _int_or_none(value: Any) -> int | None:
    return value if isinstance(value, int) and not isinstance(value, bool) else None


def _count(mapping: dict[str, Any], name: str, *, default: int | None = None) -> int:
    value = mapping.get(name, default)
    if value is None and default is not None:
        value = default
    if not isinstance(value, int) or isinstance(value, bool) or value < 0:
        raise WireError(f"the engine's usage has {name}={value!r}, not a count")
    return value


def kvgate_usage(usage: dict[str, Any], *, prompt_tokens: int, completion: bool = True) -> Usage | None:
    """A kvgate engine's usage, or None when this chunk's usage lacks the prompt details (not yet known).

    completion=False: the prompt side only (completion_tokens 0), as a handle's prompt_usage."""
    details = usage.get("prompt_tokens_details")
    if not isinstance(details, dict):
        return None
    _check_prompt(usage, prompt_tokens)
    by_tier = details.get("cached_tokens_by_tier") or {}
    by_ttl = details.get("cache_write_tokens_by_ttl") or {}
    if not isinstance(by_tier, dict) or not isinstance(by_ttl, dict):
        raise WireError("the engine's usage splits are not objects")
    try:
        writes_by_ttl = {int(ttl): _count(by_ttl, ttl) for ttl in by_ttl}
    except ValueError as exc:
        raise WireError(f"the engine's usage has a TTL that is not a number: {exc}") from exc
    result = Usage(
        prompt_tokens=prompt_tokens,
        cached_tokens=_count(details, "cached_tokens", default=0),
        cache_write_tokens=_count(details, "cache_write_tokens", default=0),
        completion_tokens=_count(usage, "completion_tokens", default=0) if completion else 0,
        cached_tokens_by_tier={str(name): _count(by_tier, name) for name in by_tier},
        cache_write_tokens_by_ttl=writes_by_ttl,
    )
    if result.uncached_tokens < 0 or sum(writes_by_ttl.values()) != result.cache_write_tokens:
        raise WireError(f"the engine's usage does not add up: {usage}")
    return result


def vllm_usage(usage: dict[str, Any], *, prompt_tokens: int, cache: CacheSpec, block_size: int) -> Usage:
    """A vLLM engine's final usage: its reads (0 where it reports none), and the writes vllm_writes derives.

    vLLM puts `prompt_tokens_details.cached_tokens` in the final usage chunk only, and only when
    it runs with `--enable-prompt-tokens-details` (without it every read is billed as a write:
    run vLLM with that flag). Its earlier chunks carry no cache counts, so the prompt usage a
    vLLM stream starts with (gateway.backends.http) is provisional: the whole prompt as input.
    """
    _check_prompt(usage, prompt_tokens)
    details = usage.get("prompt_tokens_details")
    cached = _count(details, "cached_tokens", default=0) if isinstance(details, dict) else 0
    if cached >= prompt_tokens and prompt_tokens > 0:
        raise WireError(f"the engine reports {cached} cached tokens of a {prompt_tokens}-token prompt")
    writes = vllm_writes(prompt_tokens=prompt_tokens, cached_tokens=cached, cache=cache, block_size=block_size)
    return Usage(
        prompt_tokens=prompt_tokens,
        cached_tokens=cached,
        cache_write_tokens=sum(writes.values()),
        completion_tokens=_count(usage, "completion_tokens", default=0),
        cached_tokens_by_tier={"device": cached},  # vLLM does not say where a hit came from
        cache_write_tokens_by_ttl=writes,
    )


def vllm_start_usage(*, prompt_tokens: int, predicted_cached: int, cache: CacheSpec, block_size: int) -> Usage:
    """What a vLLM stream starts with, before its final usage: the router's predicted reads (whole blocks, never
    the last prompt token's) and the writes vllm_writes derives from them. Shown, never billed."""
    cached = min(predicted_cached, max(prompt_tokens - 1, 0)) // block_size * block_size
    writes = vllm_writes(prompt_tokens=prompt_tokens, cached_tokens=cached, cache=cache, block_size=block_size)
    return Usage(prompt_tokens, cached, sum(writes.values()), 0, {"device": cached}, writes)


def vllm_writes(*, prompt_tokens: int, cached_tokens: int, cache: CacheSpec, block_size: int) -> dict[int, int]:
    """The cache writes billed for a vLLM request, by TTL: the full blocks of the cacheable region, past the reads.

    As kvgate's engine counts its own: a block counts as written when it is a full block
    (`block_size`, vLLM's `--block-size`) inside the request's cacheable regions (automatic
    caching, regions None: the whole prompt with the default TTL; an empty tuple: nothing), that
    is not the block holding the last prompt token (a repeat must recompute that token, so it
    could never be read), and that the engine did not read. Its TTL is the first (longest)
    region covering it. vLLM itself caches every full block and evicts by LRU, with no TTL: a
    block it still holds after the TTL is read (and billed as a read, its prefill was skipped);
    one it evicted earlier is recomputed and billed as a write again.
    """
    regions: Sequence[CacheRegion] = (
        (CacheRegion(end=prompt_tokens, ttl_s=DEFAULT_TTL_S),) if cache.regions is None else cache.regions
    )
    limit = min(max((r.end for r in regions), default=0), prompt_tokens - 1)
    first = -(-cached_tokens // block_size)  # vLLM reads whole blocks; a partial one is not written again
    writes: dict[int, int] = {}
    for block in range(first, max(limit, 0) // block_size):
        end = (block + 1) * block_size
        ttl = next(r.ttl_s for r in regions if r.end >= end)
        writes[ttl] = writes.get(ttl, 0) + block_size
    return writes


# vLLM's gauge of its cache configuration, one sample per engine: vllm:cache_config_info{block_size="16",...} 1.0
_CACHE_CONFIG = re.compile(r"^vllm:cache_config_info\{(?P<labels>[^}]*)\}", re.MULTILINE)
_BLOCK_SIZE = re.compile(r'(?:^|,)\s*block_size="(?P<size>\d+)"')


def published_block_size(metrics: str) -> int | None:
    """The block size in a vLLM engine's /metrics text (vllm:cache_config_info); None when it publishes none.

    WireError when its samples disagree (engines of different block sizes behind one URL)."""
    sizes = {
        int(found["size"])
        for sample in _CACHE_CONFIG.finditer(metrics)
        if (found := _BLOCK_SIZE.search(sample["labels"])) is not None
    }
    if len(sizes) > 1:
        raise WireError(f"publishes several block sizes in its /metrics: {sorted(sizes)}")
    return sizes.pop() if sizes else None


DEFAULT_VLLM_BLOCK_SIZE = 16  # vLLM's default --block-size (on GPUs; vLLM-CPU's is 128)


def vllm_block_size(*, published: int | None, configured: int | None) -> int:
    """A vLLM engine's block size: what it publishes, else KVGATE_VLLM_BLOCK_SIZE, else vLLM's default 16.

    A configured size that differs from the published one would bill every write in the wrong unit:
    WireError naming both (the engine is refused: gateway.backends.http raises EngineMismatchError)."""
    if published is None:
        return configured or DEFAULT_VLLM_BLOCK_SIZE
    if configured is not None and configured != published:
        raise WireError(
            f"publishes block_size={published} in its /metrics, but KVGATE_VLLM_BLOCK_SIZE is {configured}: "
            f"set KVGATE_VLLM_BLOCK_SIZE={published}, or unset it to use what the engine publishes"
        )
    return published


def _check_prompt(usage: dict[str, Any], prompt_tokens: int) -> None:
    reported = _count(usage, "prompt_tokens")
    if reported != prompt_tokens:
        raise WireError(f"the engine counted {reported} prompt tokens, the gateway sent {prompt_tokens}")
