"""A real gateway for tests: uvicorn on 127.0.0.1 (a free port) in a thread, the real engine inside.

The server thread has its own event loop, where the app's lifespan builds and starts
the engine; tests talk to it over the socket with the official SDKs and httpx.
"""

from __future__ import annotations

import os
import socket
import threading
import time
import uuid
from collections.abc import Callable, Iterator
from contextlib import contextmanager
from dataclasses import dataclass
from decimal import Decimal
from pathlib import Path
from typing import Any

import anthropic
import httpx
import openai
import sqlalchemy as sa
import uvicorn

from gateway.backends.embedded import EmbeddedEngine
from gateway.billing_hooks import Admission
from gateway.connections import uvicorn_options
from gateway.settings import GatewaySettings
from inference.async_engine import AsyncEngine
from inference.clock import ManualClock
from inference.settings import EngineSettings
from kvgate.app import create_app
from kvgate.db import migrate, sync_url
from kvgate.errors import BillingError
from kvgate.usage import STANDARD_TTLS_S, UsageEvent

ADMIN_TOKEN = "test-admin-token"
PG_ADMIN_DSN = os.environ.get("KVGATE_TEST_PG_DSN", "host=127.0.0.1 port=5432 user=postgres dbname=postgres")
PG_URL_BASE = os.environ.get("KVGATE_TEST_PG_URL", "postgresql://postgres@127.0.0.1:5432")


def _pg_admin() -> Any:
    import psycopg

    return psycopg.connect(PG_ADMIN_DSN, connect_timeout=3, autocommit=True)


def pg_reachable() -> bool:
    try:
        _pg_admin().close()
    except Exception:
        return False
    return True


@contextmanager
def postgres_database(prefix: str = "kvgate_gw_test") -> Iterator[str]:
    """A fresh PostgreSQL database for one test session, dropped afterwards."""
    name = f"{prefix}_{os.getpid()}_{uuid.uuid4().hex[:8]}"
    with _pg_admin() as conn:
        conn.execute(f'CREATE DATABASE "{name}"')
    try:
        yield f"{PG_URL_BASE}/{name}"
    finally:
        with _pg_admin() as conn:
            conn.execute(f'DROP DATABASE IF EXISTS "{name}" WITH (FORCE)')


def free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


class ScriptedBilling:
    """A BillingHooks for tests: admits and prices nothing unless told to, per tenant."""

    def __init__(self) -> None:
        self.refuse: set[str] = set()
        self.crash: set[str] = set()
        self.price: dict[str, Decimal] = {}
        self.admitted: list[Admission] = []
        self.released: list[str] = []
        self.settled: list[UsageEvent] = []

    async def admit(self, admission: Admission) -> None:
        if admission.tenant_id in self.crash:
            raise RuntimeError("billing blew up")
        if admission.tenant_id in self.refuse:
            raise BillingError("this organization's credit balance is too low")
        self.admitted.append(admission)

    async def release(self, admission: Admission) -> None:
        self.released.append(admission.request_id)

    async def settle(self, event: UsageEvent) -> Decimal | None:
        self.settled.append(event)
        return self.price.get(event.tenant_id)

    def allows_ttl(self, *, model: str, ttl_s: int) -> bool:
        return ttl_s in STANDARD_TTLS_S


@dataclass
class Key:
    tenant_id: str
    key_id: str
    key: str


class GatewayServer:
    def __init__(
        self,
        *,
        model_dir: Path,
        database_url: str,
        engine_overrides: dict[str, Any] | None = None,
        billing: Any = None,
        discover_billing: bool = False,
        wrap_engine: Callable[[Any], Any] | None = None,
        engine_factory: Callable[[GatewaySettings, EngineSettings], Any] | None = None,
        **settings: Any,
    ) -> None:
        """`billing`: the hooks to use (a ScriptedBilling by default); `discover_billing`: none, so the
        app builds billing's real hooks as `kvgate serve` does; `wrap_engine`: applied to the engine the
        app builds (for tests that need to hold requests in flight); `engine_factory(settings, engine_settings)`:
        the engine client instead of the embedded engine (gateway.backends.factory.engine_client for KVGATE_ENGINES)."""
        self.database_url = database_url
        self.port = free_port()
        self.base_url = f"http://127.0.0.1:{self.port}"
        self.clock = ManualClock(start=1_000_000.0)
        engine_settings = EngineSettings(
            model=str(model_dir),
            **{"dtype": "float32", "kv_cache_gib": 0.05, "num_threads": 1, **(engine_overrides or {})},
        )
        self.settings = GatewaySettings(
            database_url=database_url,
            admin_token=ADMIN_TOKEN,
            port=self.port,
            **{"min_cacheable_tokens": 64, **settings},
        )
        # Billing's own hooks are tested by billing; here the seam gets a scripted one unless a test passes one.
        self._billing = None if discover_billing else billing if billing is not None else ScriptedBilling()
        wrap = wrap_engine or (lambda engine: engine)

        def make_engine() -> Any:
            if engine_factory is not None:
                return wrap(engine_factory(self.settings, engine_settings))
            return wrap(EmbeddedEngine(AsyncEngine.from_settings(engine_settings, clock=self.clock)))

        self.app = create_app(self.settings, engine_factory=make_engine, billing=self._billing)
        self._server = uvicorn.Server(
            uvicorn.Config(
                self.app,
                host="127.0.0.1",
                port=self.port,
                log_level="warning",
                lifespan="on",
                **uvicorn_options(self.settings),
            )
        )
        self._thread = threading.Thread(target=self._server.run, name="gateway-under-test", daemon=True)
        self.db = sa.create_engine(sync_url(database_url))

    def start(self) -> GatewayServer:
        migrate(self.database_url)
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
        self.db.dispose()

    @property
    def gateway(self) -> Any:
        return self.app.state.gateway

    @property
    def billing(self) -> Any:
        """The billing hooks: the ones passed in, or (discovered) the running app's."""
        return self._billing if self._billing is not None else self.gateway.billing

    # -- helpers for tests ------------------------------------------------------------------

    def new_tenant(self, name: str = "t") -> str:
        response = self.admin.post("/admin/v1/tenants", json={"name": name})
        response.raise_for_status()
        return response.json()["id"]

    def new_key(self, tenant_id: str | None = None, **body: Any) -> Key:
        tenant_id = tenant_id or self.new_tenant()
        response = self.admin.post(f"/admin/v1/tenants/{tenant_id}/keys", json={"name": "k", **body})
        response.raise_for_status()
        data = response.json()
        return Key(tenant_id=tenant_id, key_id=data["id"], key=data["key"])

    def anthropic(self, key: Key | str, **kwargs: Any) -> anthropic.Anthropic:
        api_key = key.key if isinstance(key, Key) else key
        return anthropic.Anthropic(base_url=self.base_url, api_key=api_key, max_retries=0, timeout=120, **kwargs)

    def openai(self, key: Key | str, **kwargs: Any) -> openai.OpenAI:
        api_key = key.key if isinstance(key, Key) else key
        return openai.OpenAI(base_url=f"{self.base_url}/v1", api_key=api_key, max_retries=0, timeout=120, **kwargs)

    def usage_record(self, request_id: str, *, wait_s: float = 10.0) -> dict[str, Any] | None:
        """The usage_records row for a request, waiting briefly for background writes."""
        deadline = time.monotonic() + wait_s
        while True:
            with self.db.connect() as conn:
                row = (
                    conn.execute(sa.text("SELECT * FROM usage_records WHERE request_id = :r"), {"r": request_id})
                    .mappings()
                    .first()
                )
            if row is not None or time.monotonic() > deadline:
                return dict(row) if row is not None else None
            time.sleep(0.05)

    def count_usage_records(self, request_id: str) -> int:
        with self.db.connect() as conn:
            return conn.execute(
                sa.text("SELECT count(*) FROM usage_records WHERE request_id = :r"), {"r": request_id}
            ).scalar_one()


ServerFactory = Callable[..., GatewayServer]
