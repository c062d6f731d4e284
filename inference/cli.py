"""`kvgate engine ...`: commands of the inference package."""

from __future__ import annotations

import os
from enum import StrEnum
from typing import Annotated

import typer


class LogLevel(StrEnum):
    debug = "debug"
    info = "info"
    warning = "warning"
    error = "error"


def register(app: typer.Typer) -> None:
    """Add `engine serve` to the `kvgate` command."""
    engine = typer.Typer(help="The embedded inference engine.", no_args_is_help=True)
    app.add_typer(engine, name="engine")
    engine.command("serve")(serve)


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
    uvicorn.run(
        app,
        host=host,
        port=port,
        log_config=None,
        timeout_graceful_shutdown=grace * 2 / 3,  # type: ignore[arg-type]
    )


def served_engine_id(host: str, port: int) -> str:
    """The default engine id of `kvgate engine serve`: host:port (the hostname when listening on all addresses)."""
    import socket

    if host in ("", "0.0.0.0", "::"):
        host = socket.gethostname()
    return f"{host}:{port}"
