"""A stream starts as soon as its request is admitted, not when the first token is out.

The engine's tokens are held behind a gate, as a long cold prefill would hold them: the
client must receive bytes at once (Anthropic: a ping event; OpenAI: the role chunk) and
keep-alives every few seconds after, then the usual stream when the tokens come.
"""

from __future__ import annotations

import asyncio
import json
import threading
import time
from collections.abc import AsyncIterator, Iterator
from pathlib import Path
from typing import Any

import httpx
import pytest

from gateway import sse
from tests.gateway.harness import GatewayServer

SYSTEM = "You answer questions about trains, timetables and tickets, briefly and politely. " * 12


class HeldHandle:
    """The engine's handle with its token deltas held until the gate opens."""

    def __init__(self, inner: Any, gate: threading.Event) -> None:
        self._inner = inner
        self._gate = gate

    def __getattr__(self, name: str) -> Any:
        return getattr(self._inner, name)

    async def __aiter__(self) -> AsyncIterator[Any]:
        while not self._gate.is_set():
            await asyncio.sleep(0.01)
        async for delta in self._inner:
            yield delta


class HeldEngine:
    def __init__(self, inner: Any, gate: threading.Event) -> None:
        self._inner = inner
        self._gate = gate

    def __getattr__(self, name: str) -> Any:
        return getattr(self._inner, name)

    def submit(self, *args: Any, **kwargs: Any) -> HeldHandle:
        return HeldHandle(self._inner.submit(*args, **kwargs), self._gate)


GATE = threading.Event()


@pytest.fixture(scope="module")
def held(tiny_llama_dir: Path, tmp_path_factory: pytest.TempPathFactory) -> Iterator[GatewayServer]:
    url = f"sqlite:///{tmp_path_factory.mktemp('held') / 'kvgate.db'}"
    server = GatewayServer(
        model_dir=tiny_llama_dir, database_url=url, wrap_engine=lambda engine: HeldEngine(engine, GATE)
    ).start()
    try:
        yield server
    finally:
        server.stop()


@pytest.fixture(autouse=True)
def fast_keepalive(monkeypatch: pytest.MonkeyPatch) -> Iterator[None]:
    monkeypatch.setattr(sse, "KEEPALIVE_S", 0.2)
    GATE.clear()
    yield
    GATE.set()


def read_until(lines: Iterator[str], stop: Any, *, seconds: float) -> list[str]:
    """Lines (blank ones left out) until one satisfies `stop`, which is included."""
    seen: list[str] = []
    deadline = time.monotonic() + seconds
    for line in lines:
        if line:
            seen.append(line)
            if stop(line):
                return seen
        assert time.monotonic() < deadline, f"still waiting after {seconds} s: {seen}"
    raise AssertionError(f"the stream ended: {seen}")


def test_anthropic_pings_before_the_first_token(held: GatewayServer) -> None:
    key = held.new_key()
    body = {
        "model": held.model,
        "max_tokens": 4,
        "system": SYSTEM,
        "messages": [{"role": "user", "content": "When is the next train?"}],
        "stream": True,
    }
    # A read timeout shorter than the wait: the keep-alives are what keep the client reading.
    timeout = httpx.Timeout(60, read=1.0)
    with httpx.stream(
        "POST", f"{held.base_url}/v1/messages", json=body, headers={"x-api-key": key.key}, timeout=timeout
    ) as response:
        assert response.status_code == 200
        lines = response.iter_lines()
        started = time.monotonic()
        early = read_until(lines, lambda line: line == "event: ping", seconds=1.0)
        assert time.monotonic() - started < 1.0 and early == ["event: ping"]
        # Held for a while: pings keep coming, and nothing else does.
        held_lines = read_until(lines, lambda line: time.monotonic() - started > 1.5, seconds=3.0)
        assert set(held_lines) == {"event: ping", 'data: {"type":"ping"}'}
        assert held_lines.count("event: ping") >= 4
        GATE.set()
        rest = read_until(lines, lambda line: line == 'data: {"type":"message_stop"}', seconds=30)
    names = [line.removeprefix("event: ") for line in rest if line.startswith("event: ")]
    names = names[next(i for i, n in enumerate(names) if n != "ping") :]
    assert names[:3] == ["message_start", "content_block_start", "ping"]
    assert names[-3:] == ["content_block_stop", "message_delta", "message_stop"]
    start = json.loads(next(line for line in rest if '"message_start"' in line).removeprefix("data: "))
    assert start["message"]["usage"]["input_tokens"] > 0


def test_the_sdk_skips_the_early_pings(held: GatewayServer) -> None:
    GATE.set()
    client = held.anthropic(held.new_key())
    with client.messages.stream(
        model=held.model, max_tokens=4, system=SYSTEM, messages=[{"role": "user", "content": "Hi"}]
    ) as stream:
        final = stream.get_final_message()
    assert final.usage.output_tokens == 4 and final.usage.input_tokens > 0


def test_openai_sends_the_role_chunk_then_comments_before_the_first_token(held: GatewayServer) -> None:
    key = held.new_key()
    body = {
        "model": held.model,
        "max_tokens": 4,
        "messages": [{"role": "system", "content": SYSTEM}, {"role": "user", "content": "Hi"}],
        "stream": True,
    }
    timeout = httpx.Timeout(60, read=1.0)
    with httpx.stream(
        "POST",
        f"{held.base_url}/v1/chat/completions",
        json=body,
        headers={"authorization": f"Bearer {key.key}"},
        timeout=timeout,
    ) as response:
        lines = response.iter_lines()
        started = time.monotonic()
        first = read_until(lines, lambda line: line.startswith("data: "), seconds=1.0)
        assert json.loads(first[0].removeprefix("data: "))["choices"][0]["delta"]["role"] == "assistant"
        held_lines = read_until(lines, lambda line: time.monotonic() - started > 1.5, seconds=3.0)
        assert set(held_lines) == {": keepalive"} and len(held_lines) >= 4
        GATE.set()
        rest = read_until(lines, lambda line: line == "data: [DONE]", seconds=30)
    assert any('"finish_reason":"length"' in line for line in rest)


def test_a_client_that_leaves_while_held_is_recorded_once(held: GatewayServer) -> None:
    key = held.new_key()
    body = {
        "model": held.model,
        "max_tokens": 3000,
        "messages": [{"role": "user", "content": "Hi"}],
        "stream": True,
    }
    with httpx.stream(
        "POST", f"{held.base_url}/v1/messages", json=body, headers={"x-api-key": key.key}, timeout=30
    ) as response:
        request_id = response.headers["request-id"]
        read_until(response.iter_lines(), lambda line: line == "event: ping", seconds=1.0)
    row = held.usage_record(request_id, wait_s=30)
    assert row is not None and row["status"] == "cancelled" and row["output_tokens"] < 3000
    assert held.count_usage_records(request_id) == 1
    assert not held.gateway.engine.engine.core.has_unfinished()
