"""The engine-client seam: the embedded engine and the benchmark's stand-in are both EngineClients,
the gateway's /healthz asks the client, and /metrics reads the client's stats() snapshot."""

from __future__ import annotations

import asyncio
import inspect
from pathlib import Path
from types import SimpleNamespace
from typing import Any

import httpx
from fastapi import FastAPI

from bench.instant_engine import InstantEngine
from gateway.api.errors import install_error_handlers
from gateway.api.routes import health
from gateway.backends.base import EngineClient, Handle
from gateway.backends.embedded import EmbeddedEngine
from gateway.metrics import GatewayMetrics
from inference.async_engine import AsyncEngine, RequestHandle
from inference.settings import EngineSettings
from inference.stats import EngineStats


def members(protocol: type) -> dict[str, bool]:
    """A Protocol's attributes and methods, each with whether it must be a coroutine function."""
    names = dict.fromkeys(getattr(protocol, "__annotations__", {}), False)
    for name, value in vars(protocol).items():
        if not name.startswith("_") and callable(value):
            names[name] = inspect.iscoroutinefunction(value)
    return names


def missing(candidate: Any, protocol: type) -> list[str]:
    """What `candidate` (a class or an instance) lacks of `protocol`, or has as sync where it must be async."""
    wrong = []
    for name, is_async in members(protocol).items():
        if not hasattr(candidate, name):
            wrong.append(name)
        elif is_async and not inspect.iscoroutinefunction(getattr(candidate, name)):
            wrong.append(f"{name} (must be async)")
    return wrong


def test_the_protocol_lists_what_the_gateway_uses() -> None:
    expected = {"model_id", "max_model_len", "tokenizer", "start", "shutdown", "apply_chat_template", "submit"}
    expected |= {"abort", "check_health", "stats", "prepare"}
    assert set(members(EngineClient)) == expected
    assert members(EngineClient)["check_health"] and not members(EngineClient)["submit"]
    assert members(EngineClient)["prepare"]  # awaited: a grammar compiles off the loop
    assert {"request_id", "prompt_usage", "result", "cancel"} <= set(members(Handle))


async def test_embedded_and_instant_engines_are_engine_clients(tiny_llama_dir: Path) -> None:
    assert missing(EmbeddedEngine, EngineClient) == []
    assert missing(RequestHandle("req", None, asyncio.get_running_loop()), Handle) == []  # type: ignore[arg-type]
    instant = InstantEngine(tiny_llama_dir)
    assert missing(instant, EngineClient) == []
    assert missing(instant.submit([1, 2], None, None), Handle) == []  # type: ignore[arg-type]


def test_the_conformance_check_can_fail() -> None:
    class NoStats:
        model_id = "m"
        max_model_len = 8
        tokenizer = None

        async def start(self) -> None: ...

        def shutdown(self) -> None: ...  # not async

    wrong = missing(NoStats, EngineClient)
    assert "stats" in wrong and "submit" in wrong and "shutdown (must be async)" in wrong
    assert "model_id" not in wrong and "start" not in wrong


async def _healthz(engine: Any) -> httpx.Response:
    app = FastAPI()
    app.include_router(health.router)
    install_error_handlers(app)
    app.state.gateway = SimpleNamespace(engine=engine)
    async with httpx.AsyncClient(transport=httpx.ASGITransport(app=app), base_url="http://test") as client:
        return await client.get("/healthz")


async def test_healthz_asks_the_engine_client(tiny_llama_dir: Path) -> None:
    stopped = EmbeddedEngine(AsyncEngine(EngineSettings(model=str(tiny_llama_dir))))  # never started
    response = await _healthz(stopped)
    assert response.status_code == 503
    assert response.json()["error"] == {"type": "api_error", "message": "the engine is not running"}
    running = await _healthz(InstantEngine(tiny_llama_dir))
    assert running.status_code == 200 and running.json() == {"status": "ok", "model": "instant"}


class SnapshotEngine(SimpleNamespace):
    """An engine client with no internals at all: only a model id and a stats() snapshot."""

    def stats(self) -> EngineStats:
        return EngineStats(
            model_id=self.model_id,
            prefix_cache_queries=100,
            prefix_cache_hits=48,
            hit_tokens_by_tier={"device": 32, "host": 16, "disk": 0},
            blocks_used=3,
            blocks_total=12,
            evictions=5,
            preemptions=0,
            running=1,
            waiting=2,
            tiers=(),
            offload_pending=None,
        )


def test_engine_metrics_come_from_the_stats_snapshot() -> None:
    body = GatewayMetrics(SnapshotEngine(model_id="snap")).render()[0].decode()  # type: ignore[arg-type]
    assert 'vllm:prefix_cache_hits_total{model_name="snap"} 48.0' in body
    assert 'vllm:kv_cache_usage_perc{model_name="snap"} 0.25' in body
    assert 'kvgate:kv_tier_hit_tokens_total{model_name="snap",tier="host"} 16.0' in body
    assert 'vllm:num_requests_waiting{model_name="snap"} 2.0' in body
    # An engine without stats (the instant stand-in) has no engine-state metrics, only request ones.
    bare = GatewayMetrics(SnapshotEngine(model_id="bare", stats=lambda: None)).render()[0].decode()  # type: ignore[arg-type]
    assert "vllm:prefix_cache_hits" not in bare and "vllm:time_to_first_token_seconds" in bare
