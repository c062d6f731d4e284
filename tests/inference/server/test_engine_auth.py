"""An engine server trusts only its gateways: KVGATE_ENGINE_TOKEN on every route but /health (issue 25).

Without a token it may only listen on loopback; with one, every call without it is a 401
and every call with it goes through. Each refusal is paired with the same call accepted.
"""

from __future__ import annotations

import asyncio
import json
import subprocess
import sys
from collections.abc import Iterator
from pathlib import Path

import httpx
import pytest

from gateway.backends.http import EngineMismatchError, HttpEngine
from gateway.backends.served_model import ServedModel
from inference.preflight import check_engine_exposure
from inference.settings import EngineSettings
from inference.types import CacheSpec, SamplingParams
from kvgate.preflight import StartupError
from tests.gateway.harness import free_port
from tests.inference.server.conftest import RunningServer, serve, tiny_settings

TOKEN = "engine-token-for-the-auth-tests-0123456789"
KVGATE = Path(sys.executable).with_name("kvgate")


@pytest.fixture(scope="module")
def guarded(tiny_llama_dir: Path) -> Iterator[RunningServer]:
    with serve(tiny_settings(tiny_llama_dir, engine_token=TOKEN)) as server:
        yield server


CALLS = [
    (
        "POST",
        "/v1/completions",
        {"prompt": [5, 6, 7], "max_tokens": 2, "cache_salt": "x", "cache_regions": [{"end": 3, "ttl_s": 2592000}]},
    ),
    ("POST", "/v1/chat/completions", {"messages": [{"role": "user", "content": "hi"}], "max_tokens": 2}),
    ("GET", "/v1/models", None),
    ("GET", "/kv/info", None),
    ("GET", "/kv/snapshot", None),
    ("GET", "/metrics", None),
    ("GET", "/health?detail=true", None),
]


@pytest.mark.parametrize(("method", "path", "body"), CALLS, ids=[f"{m} {p}" for m, p, _ in CALLS])
def test_every_route_but_health_needs_the_token(
    guarded: RunningServer, method: str, path: str, body: dict | None
) -> None:
    for headers in ({}, {"authorization": "Bearer wrong-token"}, {"authorization": f"Basic {TOKEN}"}):
        refused = httpx.request(method, guarded.url + path, json=body, headers=headers, timeout=60)
        assert refused.status_code == 401, (headers, refused.text)
        assert "KVGATE_ENGINE_TOKEN" in refused.json()["error"]["message"]
    accepted = httpx.request(
        method, guarded.url + path, json=body, headers={"authorization": f"Bearer {TOKEN}"}, timeout=60
    )
    assert accepted.status_code != 401 and accepted.status_code < 500, accepted.text  # (/kv/snapshot: 404 without NATS)


def test_health_answers_without_the_token_and_drain_keeps_its_own_check(guarded: RunningServer) -> None:
    assert httpx.get(guarded.url + "/health").status_code == 200
    # /drain: the engine token (a gateway), or its own rule (loopback without KVGATE_DRAIN_TOKEN).
    assert httpx.get(guarded.url + "/drain", headers={"authorization": f"Bearer {TOKEN}"}).status_code == 200


def test_the_gateway_sends_the_token_and_without_it_gets_nothing(guarded: RunningServer) -> None:
    model = ServedModel.load(guarded.engine.settings)

    async def generate(engine: HttpEngine) -> str:
        await engine.start()
        try:
            handle = engine.submit([5, 6, 7, 8], SamplingParams(max_tokens=3, temperature=0), CacheSpec(salt="t"))
            return (await handle.result()).finish_reason
        finally:
            await engine.shutdown()

    assert asyncio.run(generate(HttpEngine(guarded.url, model=model, token=TOKEN))) == "length"
    with pytest.raises((EngineMismatchError, Exception)):
        asyncio.run(generate(HttpEngine(guarded.url, model=model)))


def test_without_a_token_only_loopback_addresses_may_be_served() -> None:
    bare = EngineSettings()
    for host in ("127.0.0.1", "::1", "localhost"):
        check_engine_exposure(host, bare)
    for host in ("0.0.0.0", "::", "10.0.0.5"):
        with pytest.raises(StartupError, match="KVGATE_ENGINE_TOKEN"):
            check_engine_exposure(host, bare)
        check_engine_exposure(host, EngineSettings(engine_token=TOKEN))
    with pytest.raises(ValueError):
        EngineSettings(engine_token="short")  # a token too short to be one


def test_kvgate_engine_serve_refuses_0_0_0_0_without_a_token(tmp_path: Path) -> None:
    import os

    env = {k: v for k, v in os.environ.items() if not k.startswith("KVGATE_")}
    env.update(KVGATE_MODEL=str(tmp_path / "no-such-model"))
    result = subprocess.run(
        [str(KVGATE), "engine", "serve", "--host", "0.0.0.0", "--port", str(free_port())],
        env=env,
        capture_output=True,
        text=True,
        timeout=120,
    )
    assert result.returncode == 1, result.stderr
    (line,) = [line for line in result.stderr.splitlines() if line.strip()]
    event = json.loads(line)
    assert event["event"] == "startup_failed" and "KVGATE_ENGINE_TOKEN" in event["error"]
    # The same command on loopback gets past this check (and fails on the missing model instead).
    loopback = subprocess.run(
        [str(KVGATE), "engine", "serve", "--host", "127.0.0.1", "--port", str(free_port())],
        env=env,
        capture_output=True,
        text=True,
        timeout=120,
    )
    assert loopback.returncode != 0 and "KVGATE_ENGINE_TOKEN" not in loopback.stderr
