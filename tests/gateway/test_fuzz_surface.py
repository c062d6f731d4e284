"""Fuzzing the whole HTTP surface: at least 10,000 generated requests, no 5xx, and the server healthy after.

Two sources of requests, against one real gateway (tiny model, real billing, SQLite):

- schemathesis, from the app's own OpenAPI schema: every operation (Anthropic and OpenAI APIs, the
  gateway's admin API, billing's admin API), positive and negative cases;
- hypothesis strategies aimed at what a schema does not describe, sent as raw JSON bodies: numbers at
  and past their bounds (int64 edges, 2**64, huge floats, NaN and Infinity literals), unicode (lone
  surrogates, NUL, astral and bidi characters), and sizes (long texts, many messages, deep nesting).

Cases that name the served model and would generate are capped at a few output tokens, so the run is
bounded by the number of requests, not by decoding. KVGATE_FUZZ_REQUESTS sets the total (default 10,000).
"""

from __future__ import annotations

import json
import math
import os
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import httpx
import pytest
import schemathesis
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st
from hypothesis.errors import Unsatisfiable
from schemathesis import GenerationMode

from tests.gateway.harness import ADMIN_TOKEN, GatewayServer, Key

TOTAL_REQUESTS = int(os.environ.get("KVGATE_FUZZ_REQUESTS", "10000"))
# Examples per schema operation and mode; hypothesis stops early where an operation has few distinct
# inputs. The raw-JSON tests, which run last and cost less per request, make up the rest of the total.
SCHEMA_EXAMPLES = int(os.environ.get("KVGATE_FUZZ_SCHEMA_EXAMPLES", "25"))
MIN_RAW_EXAMPLES = 200
MAX_GENERATED_TOKENS = 4
HYPOTHESIS = settings(deadline=None, database=None, suppress_health_check=list(HealthCheck), print_blob=True)

sent: dict[str, int] = {}  # requests sent, by test id


def _operations() -> list[tuple[str, str]]:
    from gateway.settings import GatewaySettings
    from kvgate.app import create_app

    app = create_app(GatewaySettings(database_url="sqlite:///:memory:"))
    schema = schemathesis.openapi.from_dict(app.openapi())
    return [(op.ok().path, op.ok().method.upper()) for op in schema.get_all_operations()]


OPERATIONS = _operations()
SCHEMA_CASES = [
    pytest.param(path, method, mode, id=f"{method} {path} {mode.value}")
    for path, method in OPERATIONS
    for mode in (GenerationMode.POSITIVE, GenerationMode.NEGATIVE)
]
RAW_ENDPOINTS = [
    "/v1/messages",
    "/v1/messages/count_tokens",
    "/v1/chat/completions",
    "/v1/responses",
    "/v1/completions",
]


@pytest.fixture(scope="module")
def fuzz_gateway(tiny_llama_dir: Path, tmp_path_factory: pytest.TempPathFactory) -> Iterator[GatewayServer]:
    url = f"sqlite:///{tmp_path_factory.mktemp('fuzz-surface') / 'kvgate.db'}"
    server = GatewayServer(
        model_dir=tiny_llama_dir,
        database_url=url,
        discover_billing=True,
        engine_overrides={"max_model_len": 160},
        min_cacheable_tokens=16,
    ).start()
    try:
        yield server
    finally:
        server.stop()


@pytest.fixture(scope="module")
def fuzz_key(fuzz_gateway: GatewayServer) -> Key:
    return fuzz_gateway.new_key()


@pytest.fixture(scope="module")
def client(fuzz_gateway: GatewayServer) -> Iterator[httpx.Client]:
    with httpx.Client(base_url=fuzz_gateway.base_url, timeout=60) as c:
        yield c


def _headers(key: Key) -> dict[str, str]:
    # Both credentials on every request: API routes read x-api-key, admin routes the bearer token.
    return {"x-api-key": key.key, "authorization": f"Bearer {ADMIN_TOKEN}", "anthropic-version": "2023-06-01"}


def _check_response(response: httpx.Response, what: str) -> None:
    assert response.status_code < 500, (what, response.status_code, response.text[:2000])
    assert "request-id" in response.headers
    if response.status_code >= 400 and response.headers.get("content-type", "").startswith("application/json"):
        body = response.json()
        assert "error" in body, body
        assert body.get("type") == "error" or "code" in body["error"], body


def _cap_generation(body: Any, model: str) -> None:
    """Point a body at the served model, with a small output budget, so that it really runs."""
    if not isinstance(body, dict):
        return
    body["model"] = model
    for field in ("max_tokens", "max_completion_tokens", "max_output_tokens"):
        if isinstance(body.get(field), int) and body[field] > MAX_GENERATED_TOKENS:
            body[field] = MAX_GENERATED_TOKENS


@pytest.mark.parametrize(("path", "method", "mode"), SCHEMA_CASES)
def test_schema_generated_requests_get_no_server_error(
    request: pytest.FixtureRequest,
    fuzz_gateway: GatewayServer,
    fuzz_key: Key,
    path: str,
    method: str,
    mode: GenerationMode,
) -> None:
    schema = schemathesis.openapi.from_dict(fuzz_gateway.app.openapi())
    strategy = schema[path][method].as_strategy(generation_mode=mode)
    headers = _headers(fuzz_key)
    count = 0

    @settings(HYPOTHESIS, max_examples=SCHEMA_EXAMPLES)
    @given(case=strategy, use_real_model=st.booleans())
    def check(case: schemathesis.Case, use_real_model: bool) -> None:
        nonlocal count
        if use_real_model and isinstance(case.body, dict) and "model" in case.body:
            _cap_generation(case.body, fuzz_gateway.model)
        response = case.call(base_url=fuzz_gateway.base_url, headers=headers, timeout=60)
        count += 1
        assert response.status_code < 500, (case.as_curl_command(), response.status_code, response.text[:2000])
        assert "request-id" in response.headers

    try:
        check()
    except Unsatisfiable:
        # Nothing in this operation can be made invalid (no body, only free-form string parameters).
        assert mode is GenerationMode.NEGATIVE
    sent[request.node.name] = count


# -- raw JSON: bounds, unicode, sizes -----------------------------------------------------------------

INT64 = 2**63
edge_ints = (
    st.sampled_from(
        [0, 1, -1, 2**31 - 1, 2**31, 2**32, INT64 - 1, INT64, -INT64, -INT64 - 1, 2**64, 2**64 + 1, -(2**64), 10**30]
    )
    | st.integers()
)
edge_floats = st.sampled_from([0.0, -0.0, 1e-320, 1e308, -1e308, 2.0000001, -1.0]) | st.floats(allow_nan=False)
# Python's json module writes these as the non-standard literals NaN and Infinity.
special_floats = st.sampled_from([math.nan, math.inf, -math.inf])
numbers = edge_ints | edge_floats | special_floats
odd_chars = st.sampled_from(["\ud800", "\udfff", "\x00", "\u202e", "\ufeff", "\U0001f600", "\u0301", "\uffff"])
texts = st.one_of(
    st.text(max_size=64),
    st.lists(st.one_of(st.text(max_size=8), odd_chars), max_size=16).map("".join),
    st.integers(min_value=1_000, max_value=200_000).map(lambda n: "ab " * n),
)
json_scalars = st.one_of(st.none(), st.booleans(), numbers, texts)
json_values = st.recursive(
    json_scalars, lambda inner: st.lists(inner, max_size=4) | st.dictionaries(st.text(max_size=8), inner, max_size=4)
)


def _many(message: st.SearchStrategy[Any]) -> st.SearchStrategy[list[Any]]:
    """A long conversation, cheaply: one drawn message repeated 300-400 times."""
    return st.builds(lambda m, n: [m] * n, message, st.integers(min_value=300, max_value=400))


def _deep(depth: int) -> Any:
    value: Any = "x"
    for _ in range(depth):
        value = [value]
    return value


def _with_hostile_fields(draw: st.DrawFn, body: dict[str, Any], hostile: dict[str, st.SearchStrategy[Any]]) -> dict:
    """A valid body, then (three times in four) one to three fields replaced by hostile values."""
    if draw(st.integers(min_value=0, max_value=3)) == 0:
        return body
    for name in draw(st.lists(st.sampled_from(sorted(hostile)), min_size=1, max_size=3, unique=True)):
        body[name] = draw(hostile[name])
    return body


@st.composite
def anthropic_bodies(draw: st.DrawFn, *, count_tokens: bool) -> dict[str, Any]:
    body: dict[str, Any] = {
        "model": "__served__",
        "messages": [{"role": "user", "content": draw(st.text(min_size=1, max_size=40))}],
    }
    if not count_tokens:
        body["max_tokens"] = draw(st.integers(min_value=1, max_value=MAX_GENERATED_TOKENS))
    text_block = st.fixed_dictionaries(
        {"type": st.just("text"), "text": texts},
        optional={"cache_control": st.fixed_dictionaries({"type": st.just("ephemeral")}, optional={"ttl": texts})},
    )
    content = st.one_of(texts, st.lists(text_block | json_values, max_size=3))
    message = st.fixed_dictionaries(
        {"role": st.sampled_from(["user", "assistant", "system"]) | texts, "content": content}
    )
    hostile = {
        "model": texts,
        "messages": st.lists(message, max_size=3) | _many(message),
        "system": texts | st.lists(text_block, max_size=2) | json_values,
        "max_tokens": numbers,
        "temperature": numbers,
        "top_p": numbers,
        "top_k": numbers,
        "stop_sequences": st.lists(texts, max_size=20),
        "metadata": json_values,
        "tools": st.lists(json_values, max_size=3),
        "cache_control": json_values,
        "cache_salt": texts | numbers,
        "stream": json_values,
        "nested": st.integers(min_value=1, max_value=900).map(_deep),
    }
    return _with_hostile_fields(draw, body, hostile)


def _response_format(schema: Any) -> dict[str, Any]:
    return {"type": "json_schema", "json_schema": {"name": "out", "schema": schema}}


# Schemas that froze the gateway or got 500s from the engine (issue 25): each is a 400 or served.
HOSTILE_SCHEMAS = [
    {"type": "object", "properties": {"a": {"$ref": "#"}}, "required": ["a"]},
    {"anyOf": [{"const": f"v{i}"} for i in range(5000)]},
    {"type": "string", "pattern": "^(a{1000}){1000}$"},
    {"type": "string", "pattern": "^a{100000}$"},
    {"type": "object", "properties": {f"p{i}": {"type": "string"} for i in range(10_000)}},
    {"$ref": "#/$defs/missing"},
]
response_formats = st.sampled_from(HOSTILE_SCHEMAS).map(_response_format) | json_values


@st.composite
def openai_bodies(draw: st.DrawFn) -> dict[str, Any]:
    body: dict[str, Any] = {
        "model": "__served__",
        "messages": [{"role": "user", "content": draw(st.text(min_size=1, max_size=40))}],
        "max_tokens": draw(st.integers(min_value=1, max_value=MAX_GENERATED_TOKENS)),
    }
    part = st.fixed_dictionaries({"type": st.just("text"), "text": texts}) | json_values
    message = st.fixed_dictionaries(
        {
            "role": st.sampled_from(["system", "developer", "user", "assistant", "tool"]) | texts,
            "content": texts | st.lists(part, max_size=3) | st.none(),
        }
    )
    hostile = {
        "model": texts,
        "messages": st.lists(message, max_size=3) | _many(message),
        "max_tokens": numbers,
        "max_completion_tokens": numbers,
        "seed": numbers,
        "temperature": numbers,
        "top_p": numbers,
        "n": numbers,
        "stop": texts | st.lists(texts, max_size=6),
        "logit_bias": st.dictionaries(texts, numbers, max_size=3),
        "top_logprobs": numbers,
        "frequency_penalty": numbers,
        "presence_penalty": numbers,
        "prompt_cache_retention": texts,
        "response_format": response_formats,
        "cache_salt": texts | numbers,
        "stream": json_values,
        "stream_options": json_values,
        "user": texts,
        "nested": st.integers(min_value=1, max_value=900).map(_deep),
    }
    return _with_hostile_fields(draw, body, hostile)


@st.composite
def responses_bodies(draw: st.DrawFn) -> dict[str, Any]:
    body: dict[str, Any] = {
        "model": "__served__",
        "input": draw(st.text(min_size=1, max_size=40)),
        "max_output_tokens": draw(st.integers(min_value=1, max_value=MAX_GENERATED_TOKENS)),
        "store": False,
    }
    part = st.fixed_dictionaries({"type": st.sampled_from(["input_text", "output_text"]), "text": texts}) | json_values
    item = st.fixed_dictionaries(
        {
            "role": st.sampled_from(["system", "developer", "user", "assistant"]) | texts,
            "content": texts | st.lists(part, max_size=3),
        },
        optional={"type": st.sampled_from(["message", "function_call", "function_call_output"]) | texts},
    )
    hostile = {
        "model": texts,
        "input": texts | st.lists(item | json_values, max_size=3) | _many(item),
        "instructions": texts | json_values,
        "max_output_tokens": numbers,
        "temperature": numbers,
        "top_p": numbers,
        "metadata": json_values,
        "previous_response_id": texts | numbers,
        "text": json_values,
        "store": json_values,
        "stream": json_values,
        "truncation": texts,
        "nested": st.integers(min_value=1, max_value=900).map(_deep),
    }
    return _with_hostile_fields(draw, body, hostile)


@st.composite
def completion_bodies(draw: st.DrawFn) -> dict[str, Any]:
    body: dict[str, Any] = {
        "model": "__served__",
        "prompt": draw(st.text(min_size=1, max_size=40)),
        "max_tokens": draw(st.integers(min_value=1, max_value=MAX_GENERATED_TOKENS)),
    }
    hostile = {
        "prompt": texts | st.lists(texts, max_size=3) | st.lists(numbers, max_size=5) | json_values,
        "max_tokens": numbers,
        "seed": numbers,
        "temperature": numbers,
        "stop": texts | st.lists(texts, max_size=6),
        "echo": json_values,
        "logprobs": numbers,
        "suffix": texts,
        "stream": json_values,
        "stream_options": json_values,
        "nested": st.integers(min_value=1, max_value=900).map(_deep),
    }
    return _with_hostile_fields(draw, body, hostile)


RAW_STRATEGIES = {
    "/v1/messages": anthropic_bodies(count_tokens=False),
    "/v1/messages/count_tokens": anthropic_bodies(count_tokens=True),
    "/v1/chat/completions": openai_bodies(),
    "/v1/responses": responses_bodies(),
    "/v1/completions": completion_bodies(),
}


def _encode(body: dict[str, Any]) -> bytes:
    # ensure_ascii writes lone surrogates as \\ud800 escapes, which is how they arrive in real JSON.
    return json.dumps(body, ensure_ascii=True, allow_nan=True).encode()


@pytest.mark.parametrize("path", RAW_ENDPOINTS)
def test_bounds_unicode_and_sizes_get_no_server_error(
    request: pytest.FixtureRequest,
    fuzz_gateway: GatewayServer,
    fuzz_key: Key,
    client: httpx.Client,
    path: str,
) -> None:
    headers = {**_headers(fuzz_key), "content-type": "application/json"}
    statuses: dict[int, int] = {}
    raw_left = len(RAW_ENDPOINTS) - sum(1 for name in sent if name.startswith(request.node.originalname))
    examples = max(MIN_RAW_EXAMPLES, math.ceil((TOTAL_REQUESTS - sum(sent.values())) / raw_left))

    @settings(HYPOTHESIS, max_examples=examples)
    @given(body=RAW_STRATEGIES[path])
    def check(body: dict[str, Any]) -> None:
        if body.get("model") == "__served__":
            _cap_generation(body, fuzz_gateway.model)
        response = client.post(path, content=_encode(body), headers=headers)
        statuses[response.status_code] = statuses.get(response.status_code, 0) + 1
        _check_response(response, json.dumps(body)[:500])

    check()
    sent[request.node.name] = sum(statuses.values())
    # The strategies reach both sides of the bounds: some bodies are refused, some are served.
    assert any(s < 300 for s in statuses), statuses
    assert any(400 <= s < 500 for s in statuses), statuses


def test_at_least_the_promised_number_of_requests_and_the_server_is_healthy(
    fuzz_gateway: GatewayServer, client: httpx.Client
) -> None:
    expected = len(SCHEMA_CASES) + len(RAW_ENDPOINTS)
    if len(sent) < expected:
        pytest.skip(f"only {len(sent)} of {expected} fuzz tests ran in this session")
    assert sum(sent.values()) >= TOTAL_REQUESTS, sent
    health = client.get("/healthz")
    assert health.status_code == 200, health.text
    key = fuzz_gateway.new_key()
    reply = fuzz_gateway.anthropic(key).messages.create(
        model=fuzz_gateway.model, max_tokens=2, messages=[{"role": "user", "content": "still there?"}]
    )
    assert reply.usage.output_tokens >= 1
