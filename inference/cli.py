"""`kvgate engine ...`: commands of the inference package."""

from __future__ import annotations

import os
import sys
from enum import StrEnum
from typing import Annotated

import typer


class LogLevel(StrEnum):
    debug = "debug"
    info = "info"
    warning = "warning"
    error = "error"


def register(app: typer.Typer) -> None:
    """Add `engine serve` and `engine drain` to the `kvgate` command."""
    engine = typer.Typer(help="The embedded inference engine.", no_args_is_help=True)
    app.add_typer(engine, name="engine")
    engine.command("serve")(serve)
    engine.command("drain")(drain)


def serve(
    host: Annotated[str, typer.Option(help="address to listen on")] = "127.0.0.1",
    port: Annotated[int, typer.Option(help="port to listen on")] = 8001,
    log_level: Annotated[LogLevel, typer.Option(case_sensitive=False)] = LogLevel.info,
    shutdown_grace_s: Annotated[
        float | None,
        typer.Option(
            help="after SIGTERM, exit within this many seconds: requests in flight get two thirds of it, "
            "stopping the engine the rest (default KVGATE_SHUTDOWN_GRACE_S or 30)"
        ),
    ] = None,
) -> None:
    """Serve the engine alone over vLLM's OpenAI-compatible HTTP API (settings from KVGATE_* env)."""
    # Imported here so that `kvgate --help` does not pay for torch and transformers.
    import uvicorn

    from inference.async_engine import AsyncEngine
    from inference.preflight import check_engine_start
    from inference.server import create_app
    from inference.settings import EngineSettings
    from kvgate.logs import configure_logging
    from kvgate.preflight import StartupError, report_failure

    configure_logging(log_level.value)
    settings = EngineSettings()
    if settings.engine_id is None:  # routers know a served engine by where it listens
        settings = settings.model_copy(update={"engine_id": served_engine_id(host, port)})
    try:  # before the model loads: a taken port or a bad disk tier is one line, not a traceback after it
        check_engine_start(host, port, settings)
    except StartupError as exc:
        raise typer.Exit(report_failure(str(exc))) from None
    grace = shutdown_grace_s or float(os.environ.get("KVGATE_SHUTDOWN_GRACE_S", "30"))
    app = create_app(AsyncEngine(settings), shutdown_timeout_s=grace / 3)
    # log_config=None leaves uvicorn's loggers (levels included) as configure_logging set them.
    config = uvicorn.Config(
        app,
        host=host,
        port=port,
        log_config=None,
        timeout_graceful_shutdown=grace * 2 / 3,  # type: ignore[arg-type]
    )
    server = uvicorn.Server(config)
    # A finished drain (POST /drain) exits as SIGTERM does: the engine stops and its KV is written out.
    app.state.kvgate.drain.exit = lambda: setattr(server, "should_exit", True)
    server.run()
    if not server.started:
        raise typer.Exit(3)  # as uvicorn.run: it could not start (its log says why)


def drain(
    url: Annotated[str, typer.Argument(help="the engine server's base URL, e.g. http://127.0.0.1:8001")],
    timeout_s: Annotated[
        float | None,
        typer.Option(help="exit this long after the drain began even if requests are still in flight"),
    ] = None,
    token: Annotated[
        str | None, typer.Option(envvar="KVGATE_DRAIN_TOKEN", help="the engine's drain token, if it has one")
    ] = None,
) -> None:
    """Drain an engine server: /health turns 503 "draining" (gateways stop routing to it), new requests
    get 503, those in flight finish, then it exits, writing its KV out to its disk tier."""
    from inference.drain_client import DrainFailed, drain_engine

    try:
        drain_engine(url, timeout_s=timeout_s, token=token, say=print)
    except DrainFailed as exc:
        print(f"error: {exc}", file=sys.stderr)
        raise typer.Exit(1) from None


def served_engine_id(host: str, port: int) -> str:
    """The default engine id of `kvgate engine serve`: host:port (the hostname when listening on all addresses)."""
    import socket

    if host in ("", "0.0.0.0", "::"):
        host = socket.gethostname()
    return f"{host}:{port}"
