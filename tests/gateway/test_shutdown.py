"""SIGTERM stops a real `kvgate serve` within KVGATE_SHUTDOWN_GRACE_S, whatever its engine is doing.

Faults are injected test-only: tests/gateway/engine_faults/sitecustomize.py goes first on
the subprocess's PYTHONPATH and wraps Engine.step (slow, dies, or hangs on a trigger file).
"""

from __future__ import annotations

import os
import signal
import subprocess
import sys
import threading
import time
from collections.abc import Iterator
from contextlib import contextmanager, suppress
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import httpx
import pytest
import sqlalchemy as sa

from tests.gateway.harness import free_port

FAULTS = Path(__file__).resolve().parent / "engine_faults"
ADMIN = "shutdown-test-admin"
GRACE_S = 6.0
# Process exit after the lifespan (interpreter and torch teardown): 12 s was seen on a 2-core
# machine at load average 5. Still far below the 60 s a wedged server would take to be killed.
EXIT_MARGIN_S = 10.0
MESSAGES = [{"role": "user", "content": "Hi"}]


@dataclass
class Served:
    process: subprocess.Popen[str]
    base_url: str
    database: Path
    trigger: Path
    key: str
    stderr_lines: list[str] = field(default_factory=list)

    def stream(self, result: dict[str, Any], started: threading.Event) -> None:
        """A long streamed generation: records the body it got, sets `started` at the first text."""
        body = {"model": "tiny-llama-v1", "max_tokens": 4000, "stream": True, "messages": MESSAGES}
        headers = {"x-api-key": self.key, "anthropic-version": "2023-06-01"}
        text = []
        try:
            with httpx.stream("POST", f"{self.base_url}/v1/messages", json=body, headers=headers, timeout=60) as r:
                result["request_id"] = r.headers.get("request-id")
                for chunk in r.iter_text():
                    text.append(chunk)
                    if "content_block_delta" in chunk:
                        started.set()
        except httpx.HTTPError as exc:
            result["error"] = repr(exc)
        finally:
            result["body"] = "".join(text)
            started.set()

    def record(self, request_id: str) -> dict[str, Any] | None:
        db = sa.create_engine(f"sqlite:///{self.database}")
        try:
            with db.connect() as conn:
                row = conn.execute(sa.text("SELECT * FROM usage_records WHERE request_id = :r"), {"r": request_id})
                found = row.mappings().first()
                return dict(found) if found is not None else None
        finally:
            db.dispose()

    def leftovers(self) -> str:
        return f"a child still holds its stderr:\n{self.group()}\n{''.join(self.stderr_lines[-15:])}"

    def group(self) -> str:
        """What is left of the server's process group, as ps shows it."""
        listing = subprocess.run(
            ["ps", "-o", "pid,ppid,stat,etime,args", "-g", str(self.process.pid)], capture_output=True
        )
        return listing.stdout.decode(errors="replace")

    def stderr_closes_within(self, seconds: float) -> bool:
        """Whether the server's stderr reaches end of file (every holder has closed it) in time."""
        assert self.process.stderr is not None
        reader = threading.Thread(target=lambda: self.stderr_lines.extend(self.process.stderr), daemon=True)
        reader.start()
        reader.join(seconds)
        return not reader.is_alive()

    def stop_and_time(self) -> float:
        """SIGTERM, then the seconds until the process has exited."""
        began = time.monotonic()
        self.process.send_signal(signal.SIGTERM)
        try:
            self.process.wait(timeout=GRACE_S + 60)
        except subprocess.TimeoutExpired:
            pytest.fail(f"kvgate serve was still running {GRACE_S + 60:.0f} s after SIGTERM")
        return time.monotonic() - began


@contextmanager
def kvgate_serve(tiny_llama_dir: Path, tmp_path: Path, fault: str) -> Iterator[Served]:
    port = free_port()
    trigger = tmp_path / "trigger"
    env = {
        **os.environ,
        "PYTHONPATH": os.pathsep.join([str(FAULTS), os.environ.get("PYTHONPATH", "")]),
        "KVGATE_TEST_ENGINE_FAULT": fault,
        "KVGATE_TEST_FAULT_TRIGGER": str(trigger),
        "KVGATE_DATABASE_URL": f"sqlite:///{tmp_path / 'kvgate.db'}",
        "KVGATE_ADMIN_TOKEN": ADMIN,
        "KVGATE_MODEL": str(tiny_llama_dir),
        "KVGATE_DTYPE": "float32",
        "KVGATE_KV_CACHE_GIB": "0.02",
        "KVGATE_NUM_THREADS": "1",
        "KVGATE_SHUTDOWN_GRACE_S": str(GRACE_S),
    }
    process = subprocess.Popen(
        [str(Path(sys.executable).with_name("kvgate")), "serve", "--port", str(port)],
        env=env,
        stdout=subprocess.DEVNULL,
        stderr=subprocess.PIPE,
        text=True,
        # Its own process group, so that whatever it leaves behind after a failed test is killed below.
        start_new_session=True,
    )
    base = f"http://127.0.0.1:{port}"
    try:
        deadline = time.monotonic() + 180
        while True:
            try:
                httpx.get(f"{base}/healthz", timeout=1)
                break
            except httpx.TransportError:
                assert process.poll() is None, process.stderr.read() if process.stderr else ""
                assert time.monotonic() < deadline, "kvgate serve did not come up"
                time.sleep(0.2)
        admin = {"authorization": f"Bearer {ADMIN}"}
        tenant = httpx.post(f"{base}/admin/v1/tenants", json={"name": "t"}, headers=admin).json()["id"]
        key = httpx.post(f"{base}/admin/v1/tenants/{tenant}/keys", json={"name": "k"}, headers=admin).json()["key"]
        yield Served(process, base, tmp_path / "kvgate.db", trigger, key)
    finally:
        if process.poll() is None:
            process.kill()
        with suppress(ProcessLookupError):
            os.killpg(process.pid, signal.SIGKILL)
        process.communicate(timeout=30)


def start_stream(served: Served) -> tuple[threading.Thread, dict[str, Any]]:
    result: dict[str, Any] = {}
    started = threading.Event()
    thread = threading.Thread(target=served.stream, args=(result, started), daemon=True)
    thread.start()
    assert started.wait(60) and "content_block_delta" in result.get("body", "content_block_delta"), result
    return thread, result


def test_sigterm_stops_serve_in_time_with_a_generation_in_flight_and_records_it(
    tiny_llama_dir: Path, tmp_path: Path
) -> None:
    with kvgate_serve(tiny_llama_dir, tmp_path, "slow") as served:
        thread, result = start_stream(served)
        took = served.stop_and_time()
        thread.join(30)
        assert served.process.returncode in (0, -signal.SIGTERM)  # uvicorn re-raises the signal it caught
        # Nothing it started (its request workers, their fork server) still holds its stderr open.
        assert served.stderr_closes_within(10), served.leftovers()
    assert took < GRACE_S + EXIT_MARGIN_S, took
    record = served.record(result["request_id"])
    assert record is not None and record["status"] == "cancelled", record
    assert record["output_tokens"] > 0 and record["input_tokens"] > 0


def test_sigterm_stops_serve_in_time_after_its_engine_thread_died(tiny_llama_dir: Path, tmp_path: Path) -> None:
    with kvgate_serve(tiny_llama_dir, tmp_path, "die") as served:
        thread, result = start_stream(served)
        served.trigger.touch()
        thread.join(30)
        assert not thread.is_alive() and '"type":"overloaded_error"' in result["body"], result
        assert httpx.get(f"{served.base_url}/healthz").status_code == 503
        # The failed request is recorded; a new one is refused at once.
        headers = {"x-api-key": served.key, "anthropic-version": "2023-06-01"}
        body = {"model": "tiny-llama-v1", "max_tokens": 4, "messages": MESSAGES}
        assert httpx.post(f"{served.base_url}/v1/messages", json=body, headers=headers, timeout=10).status_code == 529
        took = served.stop_and_time()
        assert served.process.returncode in (0, -signal.SIGTERM)  # uvicorn re-raises the signal it caught
    assert took < GRACE_S + EXIT_MARGIN_S, took
    record = served.record(result["request_id"])
    assert record is not None and record["status"] == "error", record


def test_sigterm_stops_serve_in_time_when_its_engine_is_stuck(tiny_llama_dir: Path, tmp_path: Path) -> None:
    with kvgate_serve(tiny_llama_dir, tmp_path, "stuck") as served:
        thread, result = start_stream(served)
        served.trigger.touch()
        time.sleep(0.5)  # the engine thread is now inside a step that never returns
        took = served.stop_and_time()
        thread.join(30)
        assert served.process.returncode in (0, -signal.SIGTERM)  # uvicorn re-raises the signal it caught
    assert took < GRACE_S + EXIT_MARGIN_S, took
    record = served.record(result["request_id"])
    assert record is not None and record["status"] == "error" and record["output_tokens"] > 0, record
