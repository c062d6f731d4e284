"""The real gateway with billing for billing's end-to-end tests: uvicorn in a thread, the real engine
(a tiny model) behind a gate the test can close, so requests can be held in flight while the
database is taken away."""

from __future__ import annotations

import asyncio
import socket
import threading
import time
from collections.abc import AsyncIterator, Sequence
from pathlib import Path
from typing import Any

import anthropic
import httpx
import openai
import uvicorn

from gateway.app import create_app
from gateway.settings import GatewaySettings
from inference.async_engine import AsyncEngine
from inference.clock import ManualClock
from inference.settings import EngineSettings

ADMIN_TOKEN = "billing-e2e-admin"


def free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


class Gate:
    def __init__(self) -> None:
        self.open = threading.Event()
        self.open.set()
        self._lock = threading.Lock()
        self.held = 0

    async def pass_(self) -> None:
        if self.open.is_set():
            return
        with self._lock:
            self.held += 1
        try:
            while not self.open.is_set():
                await asyncio.sleep(0.01)
        finally:
            with self._lock:
                self.held -= 1


class GatedHandle:
    def __init__(self, inner: Any, gate: Gate) -> None:
        self._inner = inner
        self._gate = gate

    def __getattr__(self, name: str) -> Any:
        return getattr(self._inner, name)

    def __aiter__(self) -> AsyncIterator[Any]:
        return self._inner.__aiter__()

    async def result(self) -> Any:
        await self._gate.pass_()
        return await self._inner.result()


class GatedEngine:
    def __init__(self, inner: Any, gate: Gate) -> None:
        self._inner = inner
        self._gate = gate

    def __getattr__(self, name: str) -> Any:
        return getattr(self._inner, name)

    def submit(self, prompt_token_ids: Sequence[int], params: Any, cache: Any, request_id: str | None = None) -> Any:
        return GatedHandle(self._inner.submit(prompt_token_ids, params, cache, request_id=request_id), self._gate)


class BillingGateway:
    def __init__(self, *, model_dir: Path, database_url: str) -> None:
        self.port = free_port()
        self.base_url = f"http://127.0.0.1:{self.port}"
        self.gate = Gate()
        engine_settings = EngineSettings(model=str(model_dir), dtype="float32", kv_cache_gib=0.05, num_threads=1)
        settings = GatewaySettings(
            database_url=database_url, admin_token=ADMIN_TOKEN, port=self.port, min_cacheable_tokens=64
        )
        clock = ManualClock(start=1_000_000.0)
        self.app = create_app(
            settings,
            engine_factory=lambda: GatedEngine(AsyncEngine.from_settings(engine_settings, clock=clock), self.gate),
        )
        self._server = uvicorn.Server(
            uvicorn.Config(self.app, host="127.0.0.1", port=self.port, log_level="warning", lifespan="on")
        )
        self._thread = threading.Thread(target=self._server.run, name="billing-gateway", daemon=True)

    def start(self) -> BillingGateway:
        self._thread.start()
        deadline = time.monotonic() + 300
        while not self._server.started:
            if not self._thread.is_alive() or time.monotonic() > deadline:
                raise RuntimeError("the gateway did not start")
            time.sleep(0.05)
        self.admin = httpx.Client(
            base_url=self.base_url, headers={"authorization": f"Bearer {ADMIN_TOKEN}"}, timeout=60
        )
        self.model = self.admin.get("/healthz").json()["model"]
        return self

    def stop(self) -> None:
        self._server.should_exit = True
        self._thread.join(timeout=60)
        self.admin.close()

    @property
    def billing(self) -> Any:
        return self.app.state.gateway.billing

    def new_key(self) -> tuple[str, str, str]:
        tenant = self.admin.post("/admin/v1/tenants", json={"name": "billing-e2e"}).json()["id"]
        key = self.admin.post(f"/admin/v1/tenants/{tenant}/keys", json={"name": "k"}).json()
        return tenant, key["id"], key["key"]

    def anthropic(self, key: str) -> anthropic.Anthropic:
        return anthropic.Anthropic(base_url=self.base_url, api_key=key, max_retries=0, timeout=120)

    def openai(self, key: str) -> openai.OpenAI:
        return openai.OpenAI(base_url=f"{self.base_url}/v1", api_key=key, max_retries=0, timeout=120)
