"""`kvgate serve`: start-up (database, first-start hints, banners) and the gateway's HTTP server."""

from __future__ import annotations

import asyncio
import logging
import sys
from collections.abc import Callable, Sequence
from typing import Any

from sqlalchemy.engine import make_url

from gateway.settings import GatewaySettings
from kvgate.db import migrate, open_database

# Builds the app `kvgate serve` runs (kvgate.app.create_app: the gateway with billing wired in).
AppFactory = Callable[[GatewaySettings], Any]
# What other packages say at start-up (the dashboard's address), given the settings serve runs with.
Banner = Callable[[GatewaySettings], str]


async def _has_tenants(url: str) -> bool:
    from sqlalchemy import func, select

    from kvgate.tenancy import Tenant

    async with open_database(url) as sessions, sessions() as session:
        return bool(await session.scalar(select(func.count()).select_from(Tenant)))


FIRST_START = """
kvgate: no tenants yet. Create one and a key for it:

  kvgate tenants create my-team
  kvgate keys create <tenant id printed above>

then point an SDK at http://{host}:{port}:

  anthropic.Anthropic(base_url="http://{host}:{port}", api_key="kvg-...")
  openai.OpenAI(base_url="http://{host}:{port}/v1", api_key="kvg-...")

(The admin API under /admin/v1 does the same over HTTP.)
"""


def run_serve(
    *,
    host: str | None,
    port: int | None,
    wait_for_db_s: float,
    app_factory: AppFactory,
    banners: Sequence[Banner] = (),
) -> int:
    """`kvgate serve`: migrate, say what to do first, run the gateway until SIGTERM; the exit status.

    `host`/`port` override the settings; `wait_for_db_s` is how long to retry an unreachable database.
    """
    import uvicorn

    from gateway.connections import uvicorn_options
    from gateway.shutdown import request_grace_s
    from kvgate.logs import configure_logging

    overrides = {k: v for k, v in (("host", host), ("port", port)) if v is not None}
    settings = GatewaySettings(**overrides)
    configure_logging(settings.log_level)
    # Alembic narrates every plugin it loads at INFO; one line of our own says what matters.
    logging.getLogger("alembic").setLevel(logging.WARNING)
    migrate(settings.database_url)
    print(f"kvgate: database {make_url(settings.database_url)!r} is migrated", file=sys.stderr, flush=True)
    if not asyncio.run(_has_tenants(settings.database_url)):
        print(FIRST_START.format(host=settings.host, port=settings.port), file=sys.stderr, flush=True)
    for banner in banners:
        print(banner(settings), file=sys.stderr, flush=True)
    uvicorn.run(
        app_factory(settings, prewarm_workers=True),
        host=settings.host,
        port=settings.port,
        log_config=None,
        access_log=False,
        **uvicorn_options(settings),
        timeout_graceful_shutdown=request_grace_s(settings.shutdown_grace_s),  # type: ignore[arg-type]
    )
    return 0
