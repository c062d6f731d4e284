"""Bad input reaches the SDK as the right exception with an OpenAI-shaped body, never a 500,
and the server keeps serving afterwards."""

from __future__ import annotations

import time
from collections.abc import Callable, Iterator
from pathlib import Path
from typing import Any

import httpx
import openai
import pytest

from tests.inference.server.conftest import RunningServer, serve, tiny_settings
from tests.inference.server.helpers import token_prompt

Call = Callable[[openai.OpenAI, str], Any]


def _completion(**kwargs: Any) -> Call:
    def call(client: openai.OpenAI, model: str) -> Any:
        return client.completions.create(**{"model": model, "prompt": "Hello", "max_tokens": 2, **kwargs})

    return call


def _chat(**kwargs: Any) -> Call:
    def call(client: openai.OpenAI, model: str) -> Any:
        body = {"model": model, "messages": [{"role": "user", "content": "Hi"}], "max_tokens": 2, **kwargs}
        return client.chat.completions.create(**body)

    return call


BAD_REQUESTS: dict[str, tuple[Call, type[openai.APIStatusError], int, str | None]] = {
    "unknown model": (_completion(model="no-such-model"), openai.BadRequestError, 400, "model"),
    "unknown model, streaming": (_completion(model="no-such-model", stream=True), openai.BadRequestError, 400, "model"),
    "unknown model, chat": (_chat(model="no-such-model"), openai.BadRequestError, 400, "model"),
    "prompt longer than the context": (_completion(prompt=token_prompt(5000, 0)), openai.BadRequestError, 400, None),
    "negative max_tokens": (_completion(max_tokens=-1), openai.BadRequestError, 400, "max_tokens"),
    "negative max_tokens, chat": (_chat(max_tokens=-5), openai.BadRequestError, 400, "max_tokens"),
    "wrong type": (_completion(temperature="hot"), openai.BadRequestError, 400, "temperature"),
    "wrong prompt type": (_completion(prompt={"text": "Hi"}), openai.BadRequestError, 400, "prompt"),
    "token id out of range": (_completion(prompt=[1, 2, 10**9]), openai.BadRequestError, 400, None),
    "empty prompt": (_completion(prompt=""), openai.BadRequestError, 400, None),
    "empty cache_salt": (_completion(extra_body={"cache_salt": ""}), openai.BadRequestError, 400, "cache_salt"),
    "bad cache region": (
        _completion(extra_body={"cache_regions": [{"end": -1, "ttl_s": 60}]}),
        openai.BadRequestError,
        400,
        "cache_regions.0.end",
    ),
    "n above 1": (_completion(n=2), openai.BadRequestError, 400, "n"),
    "several prompts": (_completion(prompt=["a", "b"]), openai.BadRequestError, 400, "prompt"),
    "top_p 0": (_completion(top_p=0), openai.BadRequestError, 400, "top_p"),
    "logprobs": (_completion(logprobs=2), openai.BadRequestError, 400, "logprobs"),
    "stream_options without stream": (
        _completion(stream_options={"include_usage": True}),
        openai.BadRequestError,
        400,
        "stream_options",
    ),
    "stream_options of a wrong type": (
        _completion(stream=True, stream_options={"include_usage": "maybe"}),
        openai.BadRequestError,
        400,
        "stream_options.include_usage",
    ),
    "empty messages": (_chat(messages=[]), openai.BadRequestError, 400, "messages"),
    "image content": (
        _chat(messages=[{"role": "user", "content": [{"type": "image_url", "image_url": {"url": "x"}}]}]),
        openai.BadRequestError,
        400,
        "messages.0.content.0.type",
    ),
    "unknown role": (
        _chat(messages=[{"role": "wizard", "content": "Hi"}]),
        openai.BadRequestError,
        400,
        "messages.0.role",
    ),
    "tools": (
        _chat(tools=[{"type": "function", "function": {"name": "f", "parameters": {}}}]),
        openai.BadRequestError,
        400,
        "tool_choice",
    ),
}


def _still_serving(client: openai.OpenAI, model: str) -> None:
    out = client.completions.create(model=model, prompt="Still there?", max_tokens=1)
    assert out.choices[0].finish_reason in ("stop", "length")


@pytest.mark.parametrize("case", list(BAD_REQUESTS))
def test_bad_request_is_an_openai_error(tiny_server: RunningServer, client: openai.OpenAI, case: str) -> None:
    call, exc_class, status, param = BAD_REQUESTS[case]
    model = tiny_server.engine.model_id
    with pytest.raises(exc_class) as raised:
        result = call(client, model)
        if isinstance(result, openai.Stream):
            list(result)
    err = raised.value
    assert err.status_code == status
    body = err.body
    assert isinstance(body, dict)
    assert body["code"] == status
    assert body["type"] == exc_class.__name__
    assert body["message"]
    if param is not None:
        assert body["param"] == param
    _still_serving(client, model)


RAW_BODIES = {
    "malformed JSON": b'{"prompt": "Hi", ',
    "missing prompt": b'{"max_tokens": 2}',
    "not an object": b"[1, 2, 3]",
    "empty body": b"",
}


@pytest.mark.parametrize("case", list(RAW_BODIES))
def test_unparseable_body_is_a_400(tiny_server: RunningServer, client: openai.OpenAI, case: str) -> None:
    response = httpx.post(
        f"{tiny_server.url}/v1/completions", content=RAW_BODIES[case], headers={"content-type": "application/json"}
    )
    assert response.status_code == 400
    error = response.json()["error"]
    assert set(error) == {"message", "type", "param", "code"}
    assert error["type"] == "BadRequestError"
    _still_serving(client, tiny_server.engine.model_id)


def test_unknown_route_and_method_are_openai_errors(tiny_server: RunningServer) -> None:
    missing = httpx.get(f"{tiny_server.url}/v1/nothing")
    assert missing.status_code == 404
    assert missing.json()["error"]["type"] == "NotFoundError"
    wrong_method = httpx.get(f"{tiny_server.url}/v1/completions")
    assert wrong_method.status_code == 405
    assert wrong_method.json()["error"]["code"] == 405


@pytest.fixture(scope="module")
def full_server(tiny_llama_dir: Path) -> Iterator[RunningServer]:
    # A waiting queue of capacity 0: every request is refused as overloaded.
    with serve(tiny_settings(tiny_llama_dir, max_waiting=0)) as server:
        yield server


@pytest.mark.parametrize("stream", [False, True])
def test_overloaded_engine_is_an_immediate_503(full_server: RunningServer, stream: bool) -> None:
    client = full_server.client()
    started = time.monotonic()
    with pytest.raises(openai.InternalServerError) as raised:
        client.completions.create(model=full_server.engine.model_id, prompt="Hi", max_tokens=2, stream=stream)
    assert time.monotonic() - started < 2
    assert raised.value.status_code == 503
    assert raised.value.response.headers["retry-after"] == "1"
    assert isinstance(raised.value.body, dict) and raised.value.body["type"] == "ServiceUnavailableError"
    assert httpx.get(f"{full_server.url}/health").status_code == 200
