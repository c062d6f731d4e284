"""Real processes on loopback for the scale-out test: its own NATS and Redis servers, and engine servers.

Each binds 127.0.0.1 on a free port, logs to a file in the test's directory (a pipe nobody
reads would block it), and is stopped by `stop()`; waits poll, with generous deadlines.
"""

from __future__ import annotations

import os
import re
import signal
import socket
import subprocess
import sys
import time
from collections.abc import Callable
from pathlib import Path

import httpx

from tests.gateway.harness import free_port

ROOT = Path(__file__).resolve().parents[2]
NATS_SERVER = Path("/usr/sbin/nats-server")


def wait_for(condition: Callable[[], object], what: str, *, timeout_s: float = 120.0, every_s: float = 0.1) -> None:
    """Poll until condition() is truthy; AssertionError naming `what` after timeout_s."""
    deadline = time.monotonic() + timeout_s
    while not condition():
        assert time.monotonic() < deadline, f"timed out after {timeout_s:g} s waiting for {what}"
        time.sleep(every_s)


def _accepts(port: int) -> bool:
    try:
        with socket.create_connection(("127.0.0.1", port), timeout=1):
            return True
    except OSError:
        return False


class Process:
    """A child process whose output goes to a log file."""

    def __init__(self, name: str, command: list[str], *, workdir: Path, env: dict[str, str] | None = None) -> None:
        self.name = name
        self.log_path = workdir / f"{name}.log"
        with self.log_path.open("ab") as log:
            self.process = subprocess.Popen(command, env=env, stdout=log, stderr=log, cwd=workdir)

    def log(self, tail: int = 4000) -> str:
        return self.log_path.read_text(errors="replace")[-tail:]

    def logged(self, text: str) -> bool:
        return text in self.log_path.read_text(errors="replace")

    def alive(self) -> bool:
        return self.process.poll() is None

    def stop(self, sig: int = signal.SIGTERM, timeout_s: float = 60.0) -> None:
        if self.process.poll() is None:
            os.kill(self.process.pid, sig)
            try:
                self.process.wait(timeout=timeout_s)
            except subprocess.TimeoutExpired:
                self.process.kill()
                self.process.wait(timeout=30)


class NatsServer:
    """nats-server with JetStream, its store in `store_dir`; stop() and start() again keep port and store."""

    def __init__(self, workdir: Path) -> None:
        self.workdir = workdir
        self.port = free_port()
        self.url = f"nats://127.0.0.1:{self.port}"
        self.store_dir = workdir / "nats-store"
        self.proc: Process | None = None
        self.start()

    def start(self) -> None:
        command = [str(NATS_SERVER), "-a", "127.0.0.1", "-p", str(self.port), "-js", "-sd", str(self.store_dir)]
        self.proc = Process("nats", command, workdir=self.workdir)
        proc = self.proc
        wait_for(lambda: _accepts(self.port) or not proc.alive(), "nats-server to listen")
        assert proc.alive(), proc.log()

    def stop(self) -> None:
        if self.proc is not None:
            self.proc.stop()


class RedisServer:
    def __init__(self, workdir: Path) -> None:
        self.port = free_port()
        self.url = f"redis://127.0.0.1:{self.port}/0"
        command = ["redis-server", "--port", str(self.port), "--bind", "127.0.0.1", "--save", "", "--appendonly", "no"]
        self.proc = Process("redis", command, workdir=workdir)
        wait_for(lambda: _accepts(self.port) or not self.proc.alive(), "redis-server to listen")
        assert self.proc.alive(), self.proc.log()

    def stop(self) -> None:
        self.proc.stop()


class EngineServer:
    """`kvgate engine serve` with the tiny model; its engine id is its default, host:port."""

    def __init__(self, name: str, model_dir: Path, workdir: Path, **settings: str) -> None:
        self.port = free_port()
        self.url = f"http://127.0.0.1:{self.port}"
        self.engine_id = f"127.0.0.1:{self.port}"
        env = {k: v for k, v in os.environ.items() if not k.startswith("KVGATE_")}
        env.update(
            PYTHONPATH=str(ROOT),
            KVGATE_MODEL=str(model_dir),
            KVGATE_DTYPE="float32",
            KVGATE_KV_CACHE_GIB="0.05",
            KVGATE_NUM_THREADS="1",
            **settings,
        )
        command = [
            sys.executable,
            "-c",
            "from kvgate.cli import app; app()",
            "engine",
            "serve",
            "--port",
            str(self.port),
        ]
        self.proc = Process(name, command, workdir=workdir, env=env)

    def wait_ready(self, timeout_s: float = 240.0) -> None:
        def healthy() -> bool:
            assert self.proc.alive(), self.proc.log()
            try:
                return httpx.get(f"{self.url}/health", timeout=2).status_code == 200
            except httpx.TransportError:
                return False

        wait_for(healthy, f"{self.proc.name} to be healthy", timeout_s=timeout_s, every_s=0.2)

    def metrics(self) -> str:
        return httpx.get(f"{self.url}/metrics", timeout=30).text

    def kill(self) -> None:
        self.proc.stop(signal.SIGKILL)

    def stop(self) -> None:
        self.proc.stop(signal.SIGINT, timeout_s=90)


def metric(text: str, name: str, **labels: str) -> float:
    """The sum of the samples of `name` (with or without `_total`) whose labels include `labels`."""
    total = 0.0
    pattern = re.compile(rf"^{re.escape(name)}(?:_total)?(?:\{{(.*)\}})? (\S+)$")
    for line in text.splitlines():
        match = pattern.match(line)
        if match is None:
            continue
        found = dict(re.findall(r'(\w+)="((?:[^"\\]|\\.)*)"', match.group(1) or ""))
        if all(found.get(k) == v for k, v in labels.items()):
            total += float(match.group(2))
    return total
