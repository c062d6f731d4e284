"""`kvgate engine ...`: commands of the inference package."""

from __future__ import annotations

import argparse


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
    serve.set_defaults(handler=_serve)


def _serve(args: argparse.Namespace) -> int:
    # Imported here so that `kvgate --help` does not pay for torch and transformers.
    import uvicorn

    from inference.async_engine import AsyncEngine
    from inference.server import create_app
    from inference.settings import EngineSettings
    from kvgate.logs import configure_logging

    configure_logging(args.log_level)
    app = create_app(AsyncEngine(EngineSettings()))
    # log_config=None leaves uvicorn's loggers (levels included) as configure_logging set them.
    uvicorn.run(app, host=args.host, port=args.port, log_config=None)
    return 0
