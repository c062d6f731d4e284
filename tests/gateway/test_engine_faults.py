"""No request can stop the engine: bounded numbers, per-request failures, and a dead engine thread.

Out-of-range numbers get a 400 naming the field, in each API's shape. A request whose
processing raises inside the engine fails alone (500 in the API's shape, or an error
event), and is recorded. If the engine thread dies anyway, /healthz says 503, the
requests in flight fail at once and new ones get 529 / 503 with retry-after.
Faults are injected into one test server's engine instance, never into production code.
"""

from __future__ import annotations

import threading
import time
from collections.abc import Iterator
from concurrent.futures import ThreadPoolExecutor
from pathlib import Path
from typing import Any

import httpx
import pytest

from tests.gateway.harness import GatewayServer, Key

MESSAGES = [{"role": "user", "content": "Hello"}]
POISON_SEED = 424242  # OpenAI requests with this seed fail inside the engine (fault_gateway only)
POISON_TOP_K = 4242  # and Anthropic requests with this top_k


def post_openai(server: GatewayServer, key: Key, *, timeout: float = 60, **body: Any) -> httpx.Response:
    payload = {"model": server.model, "max_tokens": 4, "messages": MESSAGES, **body}
    headers = {"authorization": f"Bearer {key.key}"}
    return httpx.post(f"{server.base_url}/v1/chat/completions", json=payload, headers=headers, timeout=timeout)


def post_anthropic(server: GatewayServer, key: Key, *, timeout: float = 60, **body: Any) -> httpx.Response:
    payload = {"model": server.model, "max_tokens": 4, "messages": MESSAGES, **body}
    headers = {"x-api-key": key.key, "anthropic-version": "2023-06-01"}
    return httpx.post(f"{server.base_url}/v1/messages", json=payload, headers=headers, timeout=timeout)


def openai_error(response: httpx.Response, status: int) -> dict[str, Any]:
    assert response.status_code == status, response.text
    error = response.json()["error"]
    assert set(error) == {"message", "type", "param", "code"}, error
    return error


def anthropic_error(response: httpx.Response, status: int, kind: str) -> str:
    assert response.status_code == status, response.text
    body = response.json()
    assert body["type"] == "error" and body["error"]["type"] == kind, body
    assert body["request_id"] == response.headers["request-id"]
    return body["error"]["message"]


# -- bounds ---------------------------------------------------------------------------------------


@pytest.mark.parametrize(
    ("field", "value"),
    [
        ("seed", 2**64),
        ("seed", -(2**63) - 1),
        ("seed", 10**40),
        ("max_tokens", 10**12),
        ("max_completion_tokens", 0),
        ("max_completion_tokens", 2**63),
        ("n", 10**20),
        ("top_logprobs", 21),
        ("logit_bias", {"42": 101}),
        ("logit_bias", {"42": -(2**70)}),
        ("temperature", 1e308),
        ("top_p", -1),
        ("presence_penalty", 3),
        ("metadata", {f"k{i}": "v" for i in range(17)}),
        ("cache_salt", "s" * 257),
    ],
)
def test_openai_out_of_range_numbers_are_400_naming_the_field(gateway: GatewayServer, field: str, value: Any) -> None:
    key = gateway.new_key()
    error = openai_error(post_openai(gateway, key, timeout=30, **{field: value}), 400)
    assert error["type"] == "invalid_request_error"
    assert error["param"].startswith(field) and error["message"].startswith(field), error


@pytest.mark.parametrize(
    ("field", "value"),
    [
        ("max_tokens", 10**12),
        ("max_tokens", 2**64),
        ("top_k", 2**31),
        ("top_k", -1),
        ("temperature", 1.5),
        ("top_p", 0),
        ("metadata", {"user_id": "u" * 257}),
        ("cache_salt", ""),
    ],
)
def test_anthropic_out_of_range_numbers_are_400_naming_the_field(
    gateway: GatewayServer, field: str, value: Any
) -> None:
    key = gateway.new_key()
    message = anthropic_error(post_anthropic(gateway, key, timeout=30, **{field: value}), 400, "invalid_request_error")
    assert message.startswith(field), message


def test_the_widest_valid_seeds_work_and_the_engine_serves_after_a_refused_one(gateway: GatewayServer) -> None:
    key = gateway.new_key()
    openai_error(post_openai(gateway, key, timeout=30, seed=2**64), 400)
    for seed in (2**63 - 1, -(2**63)):
        ok = post_openai(gateway, key, seed=seed, temperature=1.0)
        assert ok.status_code == 200, ok.text
        assert ok.json()["usage"]["completion_tokens"] >= 1
    # Sampling with the same extreme seed repeats exactly.
    a, b = (post_openai(gateway, key, seed=2**63 - 1, temperature=1.0, max_tokens=8) for _ in range(2))
    assert a.json()["choices"][0]["message"]["content"] == b.json()["choices"][0]["message"]["content"]
    after = post_anthropic(gateway, key, top_k=2**31 - 1, max_tokens=3)
    assert after.status_code == 200 and after.json()["usage"]["output_tokens"] >= 1
    assert httpx.get(f"{gateway.base_url}/healthz").status_code == 200


# -- one request fails inside the engine ------------------------------------------------------------


@pytest.fixture(scope="module")
def fault_gateway(tiny_llama_dir: Path, tmp_path_factory: pytest.TempPathFactory) -> Iterator[GatewayServer]:
    """A gateway whose engine raises while producing any token of a poisoned request."""
    url = f"sqlite:///{tmp_path_factory.mktemp('faults') / 'kvgate.db'}"
    server = GatewayServer(model_dir=tiny_llama_dir, database_url=url).start()
    core = server.gateway.engine.engine.core
    append_token = core._append_token

    def faulty(tracked: Any, token: int) -> Any:
        params = tracked.request.params
        if params.seed == POISON_SEED or params.top_k == POISON_TOP_K:
            raise RuntimeError("injected fault in this request's processing")
        return append_token(tracked, token)

    core._append_token = faulty
    try:
        yield server
    finally:
        server.stop()


def test_a_request_that_raises_in_the_engine_fails_alone_and_is_recorded(fault_gateway: GatewayServer) -> None:
    server, key = fault_gateway, fault_gateway.new_key()
    with ThreadPoolExecutor(2) as pool:
        normal = pool.submit(post_openai, server, key, max_tokens=48, temperature=0)
        time.sleep(0.05)
        failing = pool.submit(post_openai, server, key, seed=POISON_SEED, temperature=1.0)
        bad, good = failing.result(), normal.result()
    error = openai_error(bad, 500)
    assert error["type"] == "server_error" and "injected fault" in error["message"]
    assert good.status_code == 200, good.text
    assert good.json()["usage"]["completion_tokens"] >= 1
    record = server.usage_record(bad.headers["request-id"])
    assert record is not None and record["status"] == "error" and record["input_tokens"] > 0
    assert server.usage_record(good.headers["request-id"])["status"] == "ok"  # type: ignore[index]

    anthropic = post_anthropic(server, key, top_k=POISON_TOP_K)
    assert "injected fault" in anthropic_error(anthropic, 500, "api_error")
    assert server.usage_record(anthropic.headers["request-id"])["status"] == "error"  # type: ignore[index]
    assert post_anthropic(server, key, top_k=5).status_code == 200
    assert httpx.get(f"{server.base_url}/healthz").status_code == 200


@pytest.mark.parametrize("api", ["anthropic", "openai"])
def test_a_stream_whose_request_fails_in_the_engine_ends_with_an_error_event(
    fault_gateway: GatewayServer, api: str
) -> None:
    server, key = fault_gateway, fault_gateway.new_key()
    with ThreadPoolExecutor(2) as pool:
        normal = pool.submit(post_anthropic, server, key, max_tokens=48, stream=True)
        time.sleep(0.05)
        if api == "anthropic":
            failing = pool.submit(post_anthropic, server, key, top_k=POISON_TOP_K, stream=True)
            error_line = '"type":"error","error":{"type":"api_error"'
        else:
            failing = pool.submit(post_openai, server, key, seed=POISON_SEED, temperature=1.0, stream=True)
            error_line = '"type":"server_error"'
        response, other = failing.result(), normal.result()
    # The stream next to it ran to its end.
    assert "event: message_stop" in other.text and "event: error" not in other.text, other.text
    assert response.status_code == 200
    assert error_line in response.text and "injected fault" in response.text, response.text
    assert server.usage_record(response.headers["request-id"])["status"] == "error"  # type: ignore[index]


# -- the engine thread dies -------------------------------------------------------------------------


class EngineThreadKilled(BaseException):
    """Not an Exception: only the engine thread's last-resort handler sees it."""


@pytest.fixture
def dying_gateway(tiny_llama_dir: Path, tmp_path: Path) -> Iterator[tuple[GatewayServer, threading.Event]]:
    """A gateway whose engine loop raises a BaseException once the returned event is set."""
    server = GatewayServer(model_dir=tiny_llama_dir, database_url=f"sqlite:///{tmp_path / 'kvgate.db'}").start()
    core = server.gateway.engine.engine.core
    step, kill = core.step, threading.Event()

    def faulty() -> Any:
        if kill.is_set():
            raise EngineThreadKilled("injected: the engine loop broke")
        return step()

    core.step = faulty
    try:
        yield server, kill
    finally:
        server.stop()


def test_a_dead_engine_thread_fails_waiting_requests_at_once_and_health_says_503(
    dying_gateway: tuple[GatewayServer, threading.Event],
) -> None:
    server, kill = dying_gateway
    key = server.new_key()
    assert httpx.get(f"{server.base_url}/healthz").status_code == 200
    with ThreadPoolExecutor(1) as pool:
        waiting = pool.submit(post_anthropic, server, key, max_tokens=4000, timeout=30)
        while not server.gateway.engine.engine.core.has_unfinished():
            time.sleep(0.01)
        killed_at = time.monotonic()
        kill.set()
        response = waiting.result()
        waited = time.monotonic() - killed_at
    assert waited < 5, waited  # at once: one engine step, not a hang
    assert "the engine loop broke" in anthropic_error(response, 529, "overloaded_error")
    assert server.usage_record(response.headers["request-id"])["status"] == "error"  # type: ignore[index]

    health = httpx.get(f"{server.base_url}/healthz")
    assert health.status_code == 503 and "EngineThreadKilled" in health.json()["error"]["message"]
    assert health.headers["retry-after"]

    began = time.monotonic()
    refused = post_anthropic(server, key, timeout=10)
    assert "unavailable" in anthropic_error(refused, 529, "overloaded_error")
    assert int(refused.headers["retry-after"]) >= 1
    error = openai_error(post_openai(server, key, timeout=10), 503)
    assert error["code"] == "overloaded"
    streamed = post_openai(server, key, stream=True, timeout=10)
    assert streamed.status_code == 503 and streamed.headers["retry-after"]
    assert time.monotonic() - began < 10
