"""An engine server on a real socket, in a background thread, for the openai SDK to talk to."""

from __future__ import annotations

import asyncio
import socket
import threading
import time
from collections.abc import Coroutine, Iterator
from contextlib import contextmanager
from dataclasses import dataclass
from pathlib import Path
from typing import Any, TypeVar

import httpx
import openai
import pytest
import uvicorn
from prometheus_client.parser import text_string_to_metric_families

from inference.async_engine import AsyncEngine
from inference.server import create_app
from inference.settings import EngineSettings

T = TypeVar("T")


@dataclass
class RunningServer:
    url: str
    engine: AsyncEngine
    loop: asyncio.AbstractEventLoop

    def client(self, **kwargs: Any) -> openai.OpenAI:
        # No retries: a test must see the first answer, 503s included.
        return openai.OpenAI(base_url=f"{self.url}/v1", api_key="unused", max_retries=0, timeout=60, **kwargs)

    def run(self, coro: Coroutine[Any, Any, T]) -> T:
        """Run a coroutine on the server's loop, where the engine's handles live."""
        return asyncio.run_coroutine_threadsafe(coro, self.loop).result(timeout=60)

    def metrics(self) -> dict[str, float]:
        """Every sample of /metrics, keyed by name and labels except model_name."""
        text = httpx.get(f"{self.url}/metrics").text
        samples = {}
        for family in text_string_to_metric_families(text):
            for s in family.samples:
                labels = ",".join(f"{k}={v}" for k, v in sorted(s.labels.items()) if k != "model_name")
                samples[f"{s.name}{{{labels}}}" if labels else s.name] = s.value
        return samples


@contextmanager
def serve(settings: EngineSettings) -> Iterator[RunningServer]:
    sock = socket.socket()
    sock.bind(("127.0.0.1", 0))  # a free port, held so nothing can take it before uvicorn listens
    if settings.engine_id is None:
        # As `kvgate engine serve` names itself (host:port): in-process engines would otherwise all
        # share this process's hostname-pid, and a pool refuses two engines with one id.
        settings = settings.model_copy(update={"engine_id": f"127.0.0.1:{sock.getsockname()[1]}"})
    engine = AsyncEngine(settings)
    server = uvicorn.Server(uvicorn.Config(create_app(engine), log_config=None, lifespan="on"))
    loop = asyncio.new_event_loop()
    thread = threading.Thread(
        target=lambda: loop.run_until_complete(server.serve(sockets=[sock])), name="test-server", daemon=True
    )
    thread.start()
    deadline = time.monotonic() + 120
    while not server.started:
        if not thread.is_alive() or time.monotonic() > deadline:
            raise RuntimeError("the engine server did not start")
        time.sleep(0.05)
    try:
        yield RunningServer(f"http://127.0.0.1:{sock.getsockname()[1]}", engine, loop)
    finally:
        server.should_exit = True
        thread.join(timeout=60)
        loop.close()
        sock.close()


def tiny_settings(model_dir: Path, **overrides: Any) -> EngineSettings:
    return EngineSettings(**{"model": str(model_dir), "dtype": "float32", "kv_cache_gib": 0.05, **overrides})


@pytest.fixture(scope="module")
def tiny_server(tiny_llama_dir: Path) -> Iterator[RunningServer]:
    with serve(tiny_settings(tiny_llama_dir)) as server:
        yield server


@pytest.fixture
def client(tiny_server: RunningServer) -> openai.OpenAI:
    return tiny_server.client()
