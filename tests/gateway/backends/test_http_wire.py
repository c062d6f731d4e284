"""The wire format against recorded shapes: vLLM's streamed completions (no vLLM runs on this machine) and ours.

The vLLM chunks below are the shapes vLLM's OpenAI server (v1 engine, serving_completion.py) sends
for `stream=True, stream_options={"include_usage": true, "continuous_usage_stats": true}`, with
`--enable-prompt-tokens-details`: usage on every chunk without cache details, then a final chunk
with no choices and `prompt_tokens_details.cached_tokens` (null details when nothing hit).
"""

from __future__ import annotations

import json

import httpx
import pytest

from gateway.backends.http import HttpEngine
from gateway.backends.http_wire import (
    WireError,
    completion_body,
    kvgate_usage,
    parse_chunk,
    vllm_usage,
    vllm_writes,
)
from gateway.backends.served_model import ServedModel
from inference.types import CacheRegion, CacheSpec, SamplingParams, StructuredOutput

VLLM_MODELS = {
    "object": "list",
    "data": [
        {
            "id": "tiny",
            "object": "model",
            "created": 1733000000,
            "owned_by": "vllm",
            "root": "/models/tiny",
            "parent": None,
            "max_model_len": 4096,
            "permission": [{"id": "modelperm-1", "object": "model_permission", "allow_sampling": True}],
        }
    ],
}


def vllm_chunk(text: str | None, *, completion: int, prompt: int, finish: str | None = None, details=None) -> str:
    choices = (
        []
        if text is None
        else [{"index": 0, "text": text, "logprobs": None, "finish_reason": finish, "stop_reason": None}]
    )
    usage = {"prompt_tokens": prompt, "total_tokens": prompt + completion, "completion_tokens": completion}
    usage["prompt_tokens_details"] = details
    body = {"id": "cmpl-1", "object": "text_completion", "created": 1733000000, "model": "tiny", "choices": choices}
    return json.dumps({**body, "usage": usage})


def vllm_stream(prompt: int, cached: int | None) -> bytes:
    lines = [
        vllm_chunk(" Paris", completion=1, prompt=prompt),
        vllm_chunk(" is", completion=2, prompt=prompt),
        vllm_chunk(" big", completion=3, prompt=prompt, finish="length"),
        vllm_chunk(None, completion=3, prompt=prompt, details=None if cached is None else {"cached_tokens": cached}),
        "[DONE]",
    ]
    return "".join(f"data: {line}\n\n" for line in lines).encode()


def test_the_request_carries_salt_regions_and_structured_output() -> None:
    regions = (CacheRegion(end=64, ttl_s=3600),)
    params = SamplingParams(
        max_tokens=5, temperature=0, seed=7, stop=("x",), structured=StructuredOutput("json_object")
    )
    kvgate = completion_body(
        model="m", prompt_token_ids=[1, 2], params=params, cache=CacheSpec("s", regions), flavour="kvgate"
    )
    assert kvgate["prompt"] == [1, 2] and kvgate["cache_salt"] == "s" and kvgate["seed"] == 7
    assert kvgate["cache_regions"] == [{"end": 64, "ttl_s": 3600}]
    assert kvgate["stream_options"] == {"include_usage": True, "continuous_usage_stats": True}
    assert kvgate["response_format"] == {"type": "json_object"} and kvgate["top_k"] == -1
    vllm = completion_body(
        model="m", prompt_token_ids=[1, 2], params=SamplingParams(), cache=CacheSpec("s", regions), flavour="vllm"
    )
    assert vllm["cache_salt"] == "s" and "cache_regions" not in vllm and "seed" not in vllm
    grammar = SamplingParams(structured=StructuredOutput("grammar", "start: /a+/"))
    body = completion_body(model="m", prompt_token_ids=[1], params=grammar, cache=CacheSpec(), flavour="vllm")
    assert body["structured_outputs"] == {"grammar": "start: /a+/"} and "cache_salt" not in body


def test_parses_vllm_chunks() -> None:
    text = parse_chunk(vllm_chunk(" Paris", completion=1, prompt=70))
    assert (text.text, text.finish_reason, text.final_usage) == (" Paris", None, False)
    assert text.usage is not None and text.usage["completion_tokens"] == 1
    last = parse_chunk(vllm_chunk(None, completion=3, prompt=70, details={"cached_tokens": 64}))
    assert last.final_usage and last.text == "" and last.usage["prompt_tokens_details"] == {"cached_tokens": 64}
    new_error = parse_chunk(json.dumps({"error": {"message": "boom", "type": "BadRequestError", "code": 400}}))
    old_error = parse_chunk(json.dumps({"object": "error", "message": "gone", "type": "x", "code": 503}))
    assert (new_error.error, new_error.error_status) == ("boom", 400)
    assert (old_error.error, old_error.error_status) == ("gone", 503)
    for bad in ("not json", "[1]", json.dumps({"choices": [{}, {}]}), json.dumps({"choices": [{"text": 3}]})):
        with pytest.raises(WireError):
            parse_chunk(bad)


def test_vllm_usage_bills_its_reads_and_derives_writes() -> None:
    cache = CacheSpec("s")
    final = json.loads(vllm_chunk(None, completion=8, prompt=70, details={"cached_tokens": 32}))["usage"]
    usage = vllm_usage(final, prompt_tokens=70, cache=cache, block_size=16)
    # Full blocks below the last token: 4 (64 tokens); 2 were read, 2 are written.
    assert (usage.cached_tokens, usage.cache_write_tokens, usage.uncached_tokens) == (32, 32, 6)
    assert usage.cache_write_tokens_by_ttl == {300: 32} and usage.completion_tokens == 8
    assert usage.cached_tokens_by_tier == {"device": 32}
    no_details = json.loads(vllm_chunk(None, completion=8, prompt=70))["usage"]
    cold = vllm_usage(no_details, prompt_tokens=70, cache=cache, block_size=16)
    assert (cold.cached_tokens, cold.cache_write_tokens) == (0, 64)
    wrong_prompt = json.loads(vllm_chunk(None, completion=8, prompt=71))["usage"]
    with pytest.raises(WireError, match="71 prompt tokens"):
        vllm_usage(wrong_prompt, prompt_tokens=70, cache=cache, block_size=16)
    everything = json.loads(vllm_chunk(None, completion=8, prompt=70, details={"cached_tokens": 70}))["usage"]
    with pytest.raises(WireError):
        vllm_usage(everything, prompt_tokens=70, cache=cache, block_size=16)


@pytest.mark.parametrize(
    ("prompt", "cached", "regions", "expected"),
    [
        (64, 0, None, {300: 48}),  # the block holding the last token is never a write
        (65, 0, None, {300: 64}),
        (65, 64, None, {}),
        (100, 16, (CacheRegion(48, 3600), CacheRegion(80, 300)), {3600: 32, 300: 32}),
        (100, 48, (CacheRegion(48, 3600), CacheRegion(80, 300)), {300: 32}),
        (100, 0, (), {}),  # nothing cacheable: nothing written (vLLM may still cache, and later reads count)
        (100, 96, (CacheRegion(48, 3600),), {}),  # reads past the regions are reads, never negative writes
        (40, 0, None, {300: 32}),
    ],
)
def test_vllm_writes_are_the_cacheable_full_blocks_past_the_reads(prompt, cached, regions, expected) -> None:
    cache = CacheSpec("s", regions)
    assert vllm_writes(prompt_tokens=prompt, cached_tokens=cached, cache=cache, block_size=16) == expected


def test_vllm_block_size_is_the_unit() -> None:
    assert vllm_writes(prompt_tokens=300, cached_tokens=128, cache=CacheSpec(), block_size=128) == {300: 128}
    assert vllm_writes(prompt_tokens=300, cached_tokens=0, cache=CacheSpec(), block_size=128) == {300: 256}


def test_kvgate_usage_is_checked() -> None:
    details = {
        "cached_tokens": 32,
        "cache_write_tokens": 16,
        "cached_tokens_by_tier": {"device": 32, "host": 0, "disk": 0},
        "cache_write_tokens_by_ttl": {"3600": 16},
    }
    usage = kvgate_usage(
        {"prompt_tokens": 60, "completion_tokens": 4, "prompt_tokens_details": details}, prompt_tokens=60
    )
    assert usage is not None and usage.cache_write_tokens_by_ttl == {3600: 16} and usage.completion_tokens == 4
    assert kvgate_usage({"prompt_tokens": 60, "completion_tokens": 1}, prompt_tokens=60) is None
    for broken in (
        {**details, "cache_write_tokens": 17},  # the split does not add up
        {**details, "cached_tokens": 50},  # more than the prompt
        {**details, "cached_tokens": -1},
        {**details, "cache_write_tokens_by_ttl": {"forever": 16}},
    ):
        with pytest.raises(WireError):
            kvgate_usage(
                {"prompt_tokens": 60, "completion_tokens": 4, "prompt_tokens_details": broken}, prompt_tokens=60
            )


def _vllm_transport(stream: bytes, seen: list[dict]) -> httpx.MockTransport:
    """Replays a vLLM server's recorded answers (vLLM cannot run here): /v1/models, no /kv/info, one stream."""

    def handler(request: httpx.Request) -> httpx.Response:
        if request.url.path == "/v1/models":
            return httpx.Response(200, json=VLLM_MODELS)
        if request.url.path == "/v1/completions":
            seen.append(json.loads(request.content))
            return httpx.Response(200, content=stream, headers={"content-type": "text/event-stream"})
        return httpx.Response(404, json={"detail": "Not Found"})

    return httpx.MockTransport(handler)


async def test_a_vllm_engine_through_http_engine(served_model: ServedModel) -> None:
    seen: list[dict] = []
    client = httpx.AsyncClient(transport=_vllm_transport(vllm_stream(70, 32), seen))
    engine = HttpEngine("http://vllm:8000", model=ServedModel("tiny", served_model.tokenizer), client=client)
    await engine.start()
    assert engine.info is not None and engine.info.flavour == "vllm"
    assert (engine.engine_id, engine.max_model_len, engine.info.block_size) == ("http://vllm:8000", 4096, 16)
    handle = engine.submit(list(range(100, 170)), SamplingParams(max_tokens=3), CacheSpec("salt"))
    firsts = []
    async for delta in handle:
        firsts.append((delta.text, handle.prompt_usage))
    output = await handle.result()
    await client.aclose()
    # Before the end vLLM says nothing of its cache: the stream starts with the prompt as input.
    assert firsts[0][1] is not None and (firsts[0][1].cached_tokens, firsts[0][1].cache_write_tokens) == (0, 0)
    assert output.text == " Paris is big" and output.finish_reason == "length"
    assert (output.usage.cached_tokens, output.usage.cache_write_tokens, output.usage.completion_tokens) == (32, 32, 3)
    assert handle.placement is not None and handle.placement.backend == "vllm"
    assert seen[0]["cache_salt"] == "salt" and "cache_regions" not in seen[0]
