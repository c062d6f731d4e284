"""`kvgate engine ...`: commands of the inference package."""

from __future__ import annotations

import argparse
import os


def register(subparsers: argparse._SubParsersAction) -> None:
    engine = subparsers.add_parser("engine", help="The embedded inference engine.")
    commands = engine.add_subparsers(dest="engine_command", required=True)
    serve = commands.add_parser(
        "serve",
        help="Serve the engine alone over vLLM's OpenAI-compatible HTTP API (settings from KVGATE_* env).",
    )
    serve.add_argument("--host", default="127.0.0.1")
    serve.add_argument("--port", type=int, default=8001)
    serve.add_argument("--log-level", default="info", choices=["debug", "info", "warning", "error"])
    serve.add_argument(
        "--shutdown-grace-s",
        type=float,
        help="after SIGTERM, exit within this many seconds: requests in flight get two thirds of it, "
        "stopping the engine the rest (default KVGATE_SHUTDOWN_GRACE_S or 30)",
    )
    serve.set_defaults(handler=_serve)


def _serve(args: argparse.Namespace) -> int:
    # Imported here so that `kvgate --help` does not pay for torch and transformers.
    import uvicorn

    from inference.async_engine import AsyncEngine
    from inference.preflight import check_engine_start
    from inference.server import create_app
    from inference.settings import EngineSettings
    from kvgate.logs import configure_logging
    from kvgate.preflight import StartupError, report_failure

    configure_logging(args.log_level)
    settings = EngineSettings()
    try:  # before the model loads: a taken port or a bad disk tier is one line, not a traceback after it
        check_engine_start(args.host, args.port, settings)
    except StartupError as exc:
        return report_failure(str(exc))
    grace = args.shutdown_grace_s or float(os.environ.get("KVGATE_SHUTDOWN_GRACE_S", "30"))
    app = create_app(AsyncEngine(settings), shutdown_timeout_s=grace / 3)
    # log_config=None leaves uvicorn's loggers (levels included) as configure_logging set them.
    uvicorn.run(
        app,
        host=args.host,
        port=args.port,
        log_config=None,
        timeout_graceful_shutdown=grace * 2 / 3,  # type: ignore[arg-type]
    )
    return 0
