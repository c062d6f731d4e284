"""/v1/completions through the openai SDK: whole and streamed, and the sampling fields."""

from __future__ import annotations

import httpx
import openai
import pytest

from inference.types import CacheSpec, SamplingParams
from tests.inference.server.conftest import RunningServer
from tests.inference.server.helpers import token_prompt, unique_salt

GREEDY = {"temperature": 0, "max_tokens": 6}


def test_models_and_health(tiny_server: RunningServer, client: openai.OpenAI) -> None:
    models = client.models.list().data
    assert [m.id for m in models] == [tiny_server.engine.model_id]
    assert models[0].model_extra["max_model_len"] == tiny_server.engine.max_model_len
    assert httpx.get(f"{tiny_server.url}/health").status_code == 200


def test_whole_completion_of_text(tiny_server: RunningServer, client: openai.OpenAI) -> None:
    prompt = "The quick brown fox jumps over"
    out = client.completions.create(model=tiny_server.engine.model_id, prompt=prompt, **GREEDY)
    assert out.object == "text_completion"
    assert out.id.startswith("cmpl-")
    assert out.model == tiny_server.engine.model_id
    [choice] = out.choices
    assert choice.finish_reason == "length"
    assert choice.text
    usage = out.usage
    assert usage is not None
    assert usage.prompt_tokens == len(tiny_server.engine.encode(prompt))
    assert usage.completion_tokens == 6
    assert usage.total_tokens == usage.prompt_tokens + 6
    details = usage.prompt_tokens_details
    assert details is not None
    assert details.cached_tokens is not None
    assert details.cache_write_tokens is not None
    by_tier = details.model_extra["cached_tokens_by_tier"]
    assert by_tier == {"device": details.cached_tokens, "host": 0, "disk": 0, "redis": 0}


def test_streamed_completion_matches_whole(tiny_server: RunningServer, client: openai.OpenAI) -> None:
    model = tiny_server.engine.model_id
    prompt = token_prompt(20, seed=1)
    whole = client.completions.create(model=model, prompt=prompt, **GREEDY)
    chunks = list(
        client.completions.create(
            model=model, prompt=prompt, stream=True, stream_options={"include_usage": True}, **GREEDY
        )
    )
    *content, last = chunks
    assert last.choices == []
    assert last.usage is not None
    assert last.usage.prompt_tokens == 20
    assert last.usage.completion_tokens == 6
    assert all(c.usage is None for c in content)
    assert "".join(c.choices[0].text for c in content) == whole.choices[0].text
    assert content[-1].choices[0].finish_reason == "length"
    assert all(c.choices[0].finish_reason is None for c in content[:-1])
    assert len({c.id for c in chunks}) == 1


def test_stream_without_include_usage_has_no_usage_chunk(tiny_server: RunningServer, client: openai.OpenAI) -> None:
    chunks = list(client.completions.create(model=tiny_server.engine.model_id, prompt="Hello", stream=True, **GREEDY))
    assert all(c.usage is None and len(c.choices) == 1 for c in chunks)
    assert chunks[-1].choices[0].finish_reason == "length"


def test_single_prompt_in_a_list_is_served(tiny_server: RunningServer, client: openai.OpenAI) -> None:
    model = tiny_server.engine.model_id
    flat = client.completions.create(model=model, prompt=token_prompt(10, seed=2), **GREEDY)
    nested = client.completions.create(model=model, prompt=[token_prompt(10, seed=2)], **GREEDY)
    text = client.completions.create(model=model, prompt=["Hello there"], **GREEDY)
    assert nested.choices[0].text == flat.choices[0].text
    assert text.usage is not None and text.usage.prompt_tokens == len(tiny_server.engine.encode("Hello there"))


def test_stop_string_ends_with_stop(tiny_server: RunningServer, client: openai.OpenAI) -> None:
    model = tiny_server.engine.model_id
    prompt = token_prompt(12, seed=3)
    free = client.completions.create(model=model, prompt=prompt, temperature=0, max_tokens=12).choices[0]
    assert free.finish_reason == "length"
    stop = free.text[len(free.text) // 2 :][:3]
    stopped = client.completions.create(model=model, prompt=prompt, temperature=0, max_tokens=12, stop=[stop])
    choice = stopped.choices[0]
    assert choice.finish_reason == "stop"
    assert choice.model_extra["stop_reason"] == stop
    assert choice.text == free.text[: free.text.find(stop)]


def test_stop_token_id_ends_with_stop(tiny_server: RunningServer, client: openai.OpenAI) -> None:
    prompt = token_prompt(12, seed=4)
    reference = tiny_server.run(
        tiny_server.engine.generate(prompt, SamplingParams(max_tokens=8, temperature=0), CacheSpec(unique_salt()))
    )
    stop_id = reference.token_ids[3]
    out = client.completions.create(
        model=tiny_server.engine.model_id,
        prompt=prompt,
        temperature=0,
        max_tokens=8,
        extra_body={"stop_token_ids": [stop_id]},
    )
    choice = out.choices[0]
    assert choice.finish_reason == "stop"
    assert choice.model_extra["stop_reason"] == stop_id
    assert out.usage is not None
    assert out.usage.completion_tokens == reference.token_ids.index(stop_id) + 1


def test_seed_repeats_and_other_seed_differs(tiny_server: RunningServer, client: openai.OpenAI) -> None:
    def sample(seed: int) -> str:
        out = client.completions.create(
            model=tiny_server.engine.model_id,
            prompt="Once upon a time",
            max_tokens=8,
            temperature=1.0,
            seed=seed,
            extra_body={"top_k": 50, "ignore_eos": True},
        )
        return out.choices[0].text

    first = sample(7)
    assert sample(7) == first
    assert sample(8) != first


def test_null_means_the_default(tiny_server: RunningServer) -> None:
    body = {"prompt": "Hi", "max_tokens": 2, "n": None, "stream": None, "ignore_eos": None, "temperature": None}
    response = httpx.post(f"{tiny_server.url}/v1/completions", json={**body, "stop": None, "echo": None})
    assert response.status_code == 200, response.text
    assert response.json()["usage"]["completion_tokens"] <= 2


def test_continuous_usage_carries_the_prompt_cache_counts_from_the_first_chunk(
    tiny_server: RunningServer, client: openai.OpenAI
) -> None:
    model, prompt, salt = tiny_server.engine.model_id, token_prompt(50, seed=31), unique_salt()
    client.completions.create(model=model, prompt=prompt, extra_body={"cache_salt": salt}, **GREEDY)
    chunks = list(
        client.completions.create(
            model=model,
            prompt=prompt,
            stream=True,
            stream_options={"include_usage": True, "continuous_usage_stats": True},  # type: ignore[typeddict-unknown-key]
            extra_body={"cache_salt": salt, "ignore_eos": True},
            **GREEDY,
        )
    )
    *content, last = chunks
    assert content and all(c.usage is not None for c in content)
    first = content[0].usage
    assert first.prompt_tokens_details is not None and first.prompt_tokens_details.cached_tokens == 48
    assert first.completion_tokens >= 1
    # completion_tokens counts the tokens sent so far, ending at the final count.
    counts = [c.usage.completion_tokens for c in content]
    assert counts == sorted(counts) and counts[-1] == last.usage.completion_tokens == 6
    plain = list(
        client.completions.create(
            model=model, prompt=prompt, stream=True, stream_options={"include_usage": True}, **GREEDY
        )
    )
    assert all(c.usage is None for c in plain[:-1])


def test_structured_outputs_on_completions(tiny_server: RunningServer, client: openai.OpenAI) -> None:
    model = tiny_server.engine.model_id
    grammar = client.completions.create(
        model=model,
        prompt="Say a:",
        extra_body={"structured_outputs": {"grammar": 'start: "a" "b"*'}},
        temperature=0,
        max_tokens=5,
    )
    text = grammar.choices[0].text
    assert text.startswith("a") and set(text) <= {"a", "b"}
    as_json = client.completions.create(
        model=model,
        prompt="JSON:",
        extra_body={"response_format": {"type": "json_object"}},
        temperature=0,
        max_tokens=40,
    )
    assert as_json.choices[0].text.lstrip().startswith("{")
    with pytest.raises(openai.BadRequestError, match="structured_outputs"):
        client.completions.create(
            model=model, prompt="x", extra_body={"structured_outputs": {"grammar": "x", "json": {}}}, max_tokens=2
        )
