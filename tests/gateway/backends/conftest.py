"""Remote engines for the backend tests: `kvgate engine serve`'s app with the tiny model, on real sockets.

In-process servers (uvicorn in a thread, tests.inference.server.conftest.serve) for most tests; a
real `kvgate engine serve` process where a test kills it.
"""

from __future__ import annotations

import asyncio
import os
import signal
import socket
import subprocess
import sys
import threading
import time
from collections.abc import Iterator
from contextlib import contextmanager
from pathlib import Path

import httpx
import pytest
import uvicorn

from gateway.backends.served_model import ServedModel
from inference.async_engine import AsyncEngine
from inference.server import create_app
from inference.settings import EngineSettings
from tests.gateway.harness import free_port
from tests.inference.server.conftest import RunningServer, serve, tiny_settings

ROOT = Path(__file__).resolve().parents[3]


@pytest.fixture(scope="module")
def engine_a(tiny_llama_dir: Path) -> Iterator[RunningServer]:
    with serve(tiny_settings(tiny_llama_dir, num_threads=1)) as server:
        yield server


@pytest.fixture(scope="module")
def engine_b(tiny_llama_dir: Path) -> Iterator[RunningServer]:
    with serve(tiny_settings(tiny_llama_dir, num_threads=1)) as server:
        yield server


@pytest.fixture(scope="session")
def served_model(tiny_llama_dir: Path) -> ServedModel:
    return ServedModel.load(EngineSettings(model=str(tiny_llama_dir)))


@contextmanager
def serve_on(model_dir: Path, port: int, **overrides: object) -> Iterator[str]:
    """An in-process engine server on a given port (to stop one and bring it back where the pool knows it)."""
    engine = AsyncEngine(tiny_settings(model_dir, **{"num_threads": 1, "engine_id": f"127.0.0.1:{port}", **overrides}))
    server = uvicorn.Server(uvicorn.Config(create_app(engine), log_config=None, lifespan="on"))
    sock = socket.socket()
    sock.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEADDR, 1)
    sock.bind(("127.0.0.1", port))
    loop = asyncio.new_event_loop()
    thread = threading.Thread(
        target=lambda: loop.run_until_complete(server.serve(sockets=[sock])), name="engine-on-port", daemon=True
    )
    thread.start()
    deadline = time.monotonic() + 120
    while not server.started:
        if not thread.is_alive() or time.monotonic() > deadline:
            raise RuntimeError("the engine server did not start")
        time.sleep(0.05)
    try:
        yield f"http://127.0.0.1:{port}"
    finally:
        server.should_exit = True
        thread.join(timeout=60)
        loop.close()
        sock.close()


@contextmanager
def engine_process(model_dir: Path) -> Iterator[tuple[str, subprocess.Popen[bytes]]]:
    """A real `kvgate engine serve` on a free port; stopped (or found killed) at the end."""
    port = free_port()
    env = {
        **os.environ,
        "PYTHONPATH": str(ROOT),
        "KVGATE_MODEL": str(model_dir),
        "KVGATE_DTYPE": "float32",
        "KVGATE_KV_CACHE_GIB": "0.05",
        "KVGATE_NUM_THREADS": "1",
    }
    command = [sys.executable, "-c", "from kvgate.cli import app; app()", "engine", "serve", "--port", str(port)]
    process = subprocess.Popen(command, env=env, stdout=subprocess.DEVNULL, stderr=subprocess.PIPE)
    url = f"http://127.0.0.1:{port}"
    try:
        deadline = time.monotonic() + 180
        while True:
            if process.poll() is not None:
                raise RuntimeError(f"kvgate engine serve exited: {process.stderr.read().decode()[-2000:]}")
            try:
                if httpx.get(f"{url}/health", timeout=2).status_code == 200:
                    break
            except httpx.HTTPError:
                pass
            if time.monotonic() > deadline:
                raise RuntimeError("kvgate engine serve did not become healthy")
            time.sleep(0.2)
        yield url, process
    finally:
        if process.poll() is None:
            process.send_signal(signal.SIGTERM)
            try:
                process.wait(timeout=60)
            except subprocess.TimeoutExpired:
                process.kill()
                process.wait()
        if process.stderr is not None:
            process.stderr.close()
