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

from gateway.backends.engine_list import EngineSpec
from gateway.backends.http import EngineMismatchError, HttpEngine
from gateway.backends.http_wire import (
    WireError,
    completion_body,
    kvgate_usage,
    parse_chunk,
    published_block_size,
    vllm_block_size,
    vllm_start_usage,
    vllm_usage,
    vllm_writes,
)
from gateway.backends.pool import EnginePool
from gateway.backends.served_model import ServedModel
from inference.types import CacheRegion, CacheSpec, SamplingParams, StructuredOutput
from tests.gateway.backends.fake_vllm import fake_vllm

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
    # Before the end vLLM says nothing of its cache: the stream starts with the router's prediction (none here:
    # no reads, so every full block before the last token is a write), the end with vLLM's counts.
    assert firsts[0][1] is not None and (firsts[0][1].cached_tokens, firsts[0][1].cache_write_tokens) == (0, 64)
    assert output.text == " Paris is big" and output.finish_reason == "length"
    assert (output.usage.cached_tokens, output.usage.cache_write_tokens, output.usage.completion_tokens) == (32, 32, 3)
    assert handle.placement is not None and handle.placement.backend == "vllm"
    assert seen[0]["cache_salt"] == "salt" and "cache_regions" not in seen[0]


# -- a vLLM engine's block size, from its /metrics ------------------------------------------------


def test_the_block_size_is_read_from_vllm_metrics() -> None:
    with fake_vllm("tiny", block_size=128) as fake:
        text = httpx.get(f"{fake.url}/metrics").text
    assert published_block_size(text) == 128
    # Nothing published (an older vLLM, or no /metrics): None, not a guess.
    assert published_block_size('vllm:num_requests_running{engine="0"} 0.0\n') is None
    assert published_block_size("") is None
    # Engines of different block sizes behind one URL cannot be billed in one unit.
    two = 'vllm:cache_config_info{block_size="16",engine="0"} 1.0\n' + 'vllm:cache_config_info{block_size="32"} 1.0'
    with pytest.raises(WireError, match=r"several block sizes in its /metrics: \[16, 32\]"):
        published_block_size(two)


@pytest.mark.parametrize(
    ("published", "configured", "expected"),
    [(128, None, 128), (128, 128, 128), (None, None, 16), (None, 64, 64)],
)
def test_the_published_block_size_wins_and_a_configured_one_must_match(
    published: int | None, configured: int | None, expected: int
) -> None:
    assert vllm_block_size(published=published, configured=configured) == expected


def test_a_configured_block_size_that_differs_is_refused() -> None:
    with pytest.raises(WireError, match=r"publishes block_size=128 .* KVGATE_VLLM_BLOCK_SIZE is 16"):
        vllm_block_size(published=128, configured=16)


async def _started(fake_url: str, served_model: ServedModel, configured: int | None) -> HttpEngine:
    engine = HttpEngine(fake_url, model=ServedModel("tiny", served_model.tokenizer), vllm_block_size=configured)
    try:
        await engine.start()
    finally:
        await engine.shutdown()
    return engine


async def test_a_vllm_engine_is_described_with_its_published_block_size(served_model: ServedModel) -> None:
    with fake_vllm("tiny", block_size=128) as fake:
        unset = await _started(fake.url, served_model, None)
        matching = await _started(fake.url, served_model, 128)
    assert unset.info is not None and (unset.info.flavour, unset.info.block_size) == ("vllm", 128)
    assert matching.info is not None and matching.info.block_size == 128
    with fake_vllm("tiny", block_size=None) as fake:  # publishes nothing: the setting, else 16
        assert (await _started(fake.url, served_model, 64)).info.block_size == 64  # type: ignore[union-attr]
        assert (await _started(fake.url, served_model, None)).info.block_size == 16  # type: ignore[union-attr]


async def test_the_gateway_refuses_to_start_on_a_block_size_mismatch(served_model: ServedModel) -> None:
    model = ServedModel("tiny", served_model.tokenizer)
    with fake_vllm("tiny", block_size=128) as fake:
        with pytest.raises(EngineMismatchError) as refused:
            await _started(fake.url, served_model, 16)
        pool = EnginePool([EngineSpec(fake.url)], model=model, vllm_block_size=16, start_wait_s=5)
        with pytest.raises(EngineMismatchError, match="KVGATE_VLLM_BLOCK_SIZE is 16"):
            await pool.start()
        await pool.shutdown()
        # The same pool with the setting unset starts, in the engine's unit.
        good = EnginePool([EngineSpec(fake.url)], model=model, start_wait_s=5)
        await good.start()
        assert good.hasher is not None and good.hasher.block_size == 128
        await good.shutdown()
    message = str(refused.value)
    assert fake.url in message and "block_size=128" in message and "KVGATE_VLLM_BLOCK_SIZE is 16" in message


def test_a_vllm_stream_starts_with_the_predicted_counts() -> None:
    cache = CacheSpec("salt")
    cold = vllm_start_usage(prompt_tokens=70, predicted_cached=0, cache=cache, block_size=16)
    assert (cold.cached_tokens, cold.cache_write_tokens, cold.cache_write_tokens_by_ttl) == (0, 64, {300: 64})
    # A predicted hit reads whole blocks, never the block of the last prompt token, and writes the rest.
    warm = vllm_start_usage(prompt_tokens=70, predicted_cached=70, cache=cache, block_size=16)
    assert (warm.cached_tokens, warm.cache_write_tokens) == (64, 0)
    partial = vllm_start_usage(prompt_tokens=70, predicted_cached=40, cache=cache, block_size=16)
    assert (partial.cached_tokens, partial.cache_write_tokens) == (32, 32)
    assert partial.uncached_tokens == 70 - 32 - 32
