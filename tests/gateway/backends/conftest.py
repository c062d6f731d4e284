"""Remote engines for the backend tests: `kvgate engine serve`'s app with the tiny model, on real sockets.

In-process servers (uvicorn in a thread, tests.inference.server.conftest.serve) for most tests; a
real `kvgate engine serve` process where a test kills it.
"""

from __future__ import annotations

import os
import signal
import subprocess
import sys
import time
from collections.abc import Iterator
from contextlib import contextmanager
from pathlib import Path

import httpx
import pytest

from gateway.backends.served_model import ServedModel
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
