"""`kvgate serve`: checks before the model loads, migration, what to do first, then the HTTP server.

What the operator reads goes to the terminal only. On a terminal: plain lines, a progress bar while
the model converts and loads (inference/load_progress.py), the generated admin token, and, once the
server is ready, the first-start hints and the banners. Without a terminal stderr is the JSON log
stream: the same facts come as log events, and neither a banner nor the token is written to it
(the token goes to a 0600 file, gateway/admin_token_notice.py).
"""

from __future__ import annotations

import asyncio
import logging
import os
import sys
from collections.abc import AsyncIterator, Callable, Sequence
from contextlib import asynccontextmanager
from dataclasses import dataclass
from typing import Any

import structlog

from gateway.settings import GatewaySettings
from kvgate.preflight import StartupError, check_database, check_port, describe_url, one_line, report_failure

# Builds the app `kvgate serve` runs (kvgate.app.create_app: the gateway with billing wired in).
AppFactory = Callable[..., Any]
# What other packages say at start-up (the dashboard's address), given the settings serve runs with.
Banner = Callable[[GatewaySettings], str]

log = structlog.get_logger("kvgate.serve")

FIRST_START = """
kvgate: no tenants yet. Create one and a key for it:

  kvgate tenants create my-team
  kvgate keys create <tenant id printed above>

then point an SDK at http://{host}:{port}:

  anthropic.Anthropic(base_url="http://{host}:{port}", api_key="kvg-...")
  openai.OpenAI(base_url="http://{host}:{port}/v1", api_key="kvg-...")

(The admin API under /admin/v1 does the same over HTTP.)
"""


@dataclass(frozen=True)
class DatabaseState:
    has_tenants: bool
    has_admin_token: bool


async def _database_state(url: str) -> DatabaseState:
    from sqlalchemy import func, select

    from gateway.services.server_state import ADMIN_TOKEN_HASH_KEY
    from kvgate.db import open_database
    from kvgate.tenancy import ServerState, Tenant

    async with open_database(url) as sessions, sessions() as session:
        tenants = await session.scalar(select(func.count()).select_from(Tenant))
        token = await session.get(ServerState, ADMIN_TOKEN_HASH_KEY)
        return DatabaseState(has_tenants=bool(tenants), has_admin_token=token is not None)


def _invalid_settings(exc: Any) -> str:
    errors = "; ".join(f"KVGATE_{'_'.join(map(str, e['loc'])).upper()}: {e['msg']}" for e in exc.errors())
    return f"invalid settings: {errors}"


def preflight(settings: GatewaySettings, *, wait_for_db_s: float) -> None:
    """Everything that can be checked before the model loads, quickest first: port, database, disk tier
    (or, with KVGATE_ENGINES, that an engine answers with our model)."""
    from inference.preflight import check_disk_tier, check_kernel_settings
    from inference.settings import EngineSettings

    check_port(settings.host, settings.port)
    check_database(settings.database_url, wait_s=wait_for_db_s)
    specs = settings.engine_specs
    if specs is None:
        check_kernel_settings(EngineSettings())
        check_disk_tier(EngineSettings())
    else:  # remote engines check their own tiers; the gateway checks that they serve its model
        from gateway.backends.preflight import check_engines
        from inference.tokenizer_loader import served_model_id

        check_engines(specs, served_model_id(EngineSettings()), wait_s=settings.engines_start_wait_s)


def _migrate(settings: GatewaySettings) -> DatabaseState:
    from sqlalchemy.exc import SQLAlchemyError

    from kvgate.db import migrate

    try:
        migrate(settings.database_url)
        return asyncio.run(_database_state(settings.database_url))
    except (SQLAlchemyError, OSError) as exc:
        raise StartupError(
            f"cannot migrate the database {describe_url(settings.database_url)}: {one_line(exc)}; "
            "check that kvgate's user may create tables there"
        ) from None


def _check_token_file(settings: GatewaySettings) -> None:
    """Without a terminal a new admin token goes to a file: make sure it can be written before it is generated."""
    from gateway.admin_token_notice import token_file

    path = token_file(settings).absolute()
    try:
        path.parent.mkdir(parents=True, exist_ok=True, mode=0o700)
    except OSError as exc:
        raise StartupError(
            f"cannot create {path.parent} for the generated admin token ({exc.strerror}): "
            "set KVGATE_ADMIN_TOKEN_FILE to a writable path, or KVGATE_ADMIN_TOKEN to a token of your own"
        ) from None
    if not os.access(path.parent, os.W_OK):
        raise StartupError(
            f"cannot write the generated admin token to {path.parent}: set KVGATE_ADMIN_TOKEN_FILE to a "
            "writable path, or KVGATE_ADMIN_TOKEN to a token of your own"
        )


def _announce_when_ready(app: Any, announce: Callable[[], None]) -> None:
    """Call `announce` once the app's lifespan has started (model loaded), before uvicorn starts listening."""
    inner = app.router.lifespan_context

    @asynccontextmanager
    async def lifespan(a: Any) -> AsyncIterator[Any]:
        async with inner(a) as state:
            announce()
            yield state

    app.router.lifespan_context = lifespan


def _ready_notices(
    settings: GatewaySettings, state: DatabaseState, banners: Sequence[Banner], *, terminal: bool
) -> Callable[[], None]:
    def announce() -> None:
        if not terminal:
            if not state.has_tenants:
                log.info("no_tenants", hint="kvgate tenants create <name>, then kvgate keys create <tenant id>")
            return
        if not state.has_tenants:
            print(FIRST_START.format(host=settings.host, port=settings.port), file=sys.stderr, flush=True)
        for banner in banners:
            print(banner(settings), file=sys.stderr, flush=True)

    return announce


def run_serve(
    *,
    host: str | None,
    port: int | None,
    wait_for_db_s: float,
    app_factory: AppFactory,
    banners: Sequence[Banner] = (),
) -> int:
    """`kvgate serve`: check, migrate, load the model, run the gateway until SIGTERM; the exit status.

    `host`/`port` override the settings; `wait_for_db_s` is how long to retry an unreachable database.
    A failed check is one line on stderr (cause and fix) and exit status 1, before the model loads.
    """
    from pydantic import ValidationError

    from kvgate.logs import configure_logging

    terminal = sys.stderr.isatty()
    overrides = {k: v for k, v in (("host", host), ("port", port)) if v is not None}
    try:
        settings = GatewaySettings(**overrides)
    except ValidationError as exc:
        configure_logging()  # the failure is a log event too when stderr is the JSON stream
        return report_failure(_invalid_settings(exc))
    configure_logging(settings.log_level)
    # Alembic narrates every plugin it loads at INFO; one line of our own says what matters.
    logging.getLogger("alembic").setLevel(logging.WARNING)
    try:
        preflight(settings, wait_for_db_s=wait_for_db_s)
        state = _migrate(settings)
        configured = settings.admin_token is not None and settings.admin_token.get_secret_value()
        if not terminal and not configured and not state.has_admin_token:
            _check_token_file(settings)
    except StartupError as exc:
        return report_failure(str(exc))
    except ValidationError as exc:  # the engine's settings, read by the disk tier check
        return report_failure(_invalid_settings(exc))
    if terminal:
        print(f"kvgate: database {describe_url(settings.database_url)} is migrated", file=sys.stderr, flush=True)
    else:
        log.info("database_migrated", url=describe_url(settings.database_url))
    # Imported only now: a failed check should cost as little start-up as it can.
    import uvicorn

    from gateway.connections import uvicorn_options
    from gateway.shutdown import request_grace_s

    app = app_factory(settings, prewarm_workers=True)
    _announce_when_ready(app, _ready_notices(settings, state, banners, terminal=terminal))
    uvicorn.run(
        app,
        host=settings.host,
        port=settings.port,
        log_config=None,
        access_log=False,
        **uvicorn_options(settings),
        timeout_graceful_shutdown=request_grace_s(settings.shutdown_grace_s),  # type: ignore[arg-type]
    )
    return 0
