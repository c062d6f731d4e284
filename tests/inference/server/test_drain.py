"""Draining an engine server (inference/server/drain.py): a real `kvgate engine serve` process with the tiny
model and a disk tier, drained by `kvgate engine drain` while a long generation is in flight."""

from __future__ import annotations

import json
import os
import subprocess
import sys
import threading
import time
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import httpx
import pytest

from inference.server.drain import is_loopback, may_drain
from tests.gateway.harness import free_port

KVGATE = Path(sys.executable).with_name("kvgate")
PROMPT = list(range(100, 164))  # 64 tokens: four full blocks, cached on their way through


def test_who_may_drain() -> None:
    assert may_drain(client_host="127.0.0.1", authorization=None, token=None)
    assert may_drain(client_host="::1", authorization=None, token=None)
    assert not may_drain(client_host="10.1.2.3", authorization=None, token=None)
    assert not may_drain(client_host=None, authorization=None, token=None)
    # With a token, the token decides, from anywhere (loopback too).
    assert may_drain(client_host="10.1.2.3", authorization="Bearer s3cret", token="s3cret")
    assert not may_drain(client_host="127.0.0.1", authorization=None, token="s3cret")
    assert not may_drain(client_host="127.0.0.1", authorization="Bearer wrong", token="s3cret")
    assert is_loopback("127.0.0.5") and not is_loopback("localhost") and not is_loopback("192.168.0.1")


class EngineProcess:
    def __init__(self, model_dir: Path, workdir: Path, **env: str) -> None:
        self.port = free_port()
        self.url = f"http://127.0.0.1:{self.port}"
        self.disk = workdir / "kv-disk"
        self.log_path = workdir / f"engine-{self.port}.log"
        environment = {
            **os.environ,
            "KVGATE_MODEL": str(model_dir),
            "KVGATE_DTYPE": "float32",
            "KVGATE_KV_CACHE_GIB": "0.05",
            "KVGATE_NUM_THREADS": "1",
            "KVGATE_KV_DISK_DIR": str(self.disk),
            "KVGATE_KV_DISK_GIB": "0.05",
            **env,
        }
        with self.log_path.open("ab") as log:
            self.process = subprocess.Popen(
                [str(KVGATE), "engine", "serve", "--port", str(self.port), "--log-level", "info"],
                env=environment,
                stdout=log,
                stderr=log,
            )
        deadline = time.monotonic() + 240
        while True:
            try:
                if httpx.get(f"{self.url}/health", timeout=2).status_code == 200:
                    return
            except httpx.TransportError:
                pass
            assert self.process.poll() is None, self.log()
            assert time.monotonic() < deadline, "the engine server did not come up:\n" + self.log()
            time.sleep(0.2)

    def log(self) -> str:
        return self.log_path.read_text(errors="replace")

    def events(self) -> list[dict[str, Any]]:
        out = []
        for line in self.log().splitlines():
            try:
                out.append(json.loads(line))
            except ValueError:
                continue
        return out


@pytest.fixture
def engine(tiny_llama_dir: Path, tmp_path: Path) -> Iterator[EngineProcess]:
    server = EngineProcess(tiny_llama_dir, tmp_path)
    try:
        yield server
    finally:
        if server.process.poll() is None:
            server.process.kill()
            server.process.wait(30)


class LongStream(threading.Thread):
    """A streaming completion of thousands of tokens, read to its end."""

    def __init__(self, url: str, model: str) -> None:
        super().__init__(daemon=True)
        self.url, self.model = url, model
        self.first_token = threading.Event()
        self.tokens = 0  # as the final usage chunk counts them
        self.finish_reason: str | None = None
        self.error: str | None = None

    def run(self) -> None:
        body = {
            "model": self.model,
            "prompt": PROMPT,
            "max_tokens": 3500,
            "ignore_eos": True,
            "stream": True,
            "stream_options": {"include_usage": True},
        }
        try:
            with (
                httpx.Client(timeout=300) as client,
                client.stream("POST", f"{self.url}/v1/completions", json=body) as response,
            ):
                if response.status_code != 200:
                    self.error = f"{response.status_code} {response.read()!r}"
                for line in response.iter_lines() if self.error is None else ():
                    if not line.startswith("data: {"):
                        continue
                    chunk = json.loads(line[6:])
                    if chunk.get("usage"):
                        self.tokens = chunk["usage"]["completion_tokens"]
                    for choice in chunk["choices"]:
                        self.first_token.set()
                        self.finish_reason = choice.get("finish_reason") or self.finish_reason
        except httpx.HTTPError as exc:
            self.error = repr(exc)
        finally:
            self.first_token.set()  # or it never will: the waiter looks at error


def test_a_drain_finishes_in_flight_work_refuses_new_work_and_writes_the_kv_out(engine: EngineProcess) -> None:
    model = httpx.get(f"{engine.url}/v1/models").json()["data"][0]["id"]
    stream = LongStream(engine.url, model)
    stream.start()
    assert stream.first_token.wait(120) and stream.error is None, stream.error

    drain = subprocess.Popen(
        [str(KVGATE), "engine", "drain", engine.url], stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True
    )
    # Draining: /health says so (gateways stop routing here), new requests are refused with 503...
    deadline = time.monotonic() + 60
    while (health := httpx.get(f"{engine.url}/health", timeout=30)).status_code == 200:
        assert time.monotonic() < deadline, "the drain never began"
        time.sleep(0.05)
    assert health.status_code == 503 and health.json()["error"]["message"] == "draining"
    refused = httpx.post(f"{engine.url}/v1/completions", json={"model": model, "prompt": PROMPT, "max_tokens": 2})
    assert refused.status_code == 503 and "draining" in refused.json()["error"]["message"]
    status = httpx.get(f"{engine.url}/drain", timeout=30).json()
    assert status["draining"] and (status["in_flight"] == 1 or status["drained"])

    # ...while the request in flight runs to its end, untouched.
    stream.join(300)
    assert not stream.is_alive() and stream.error is None, stream.error
    assert (stream.finish_reason, stream.tokens) == ("length", 3500)

    # Then the server exits by itself, cleanly, having written its blocks out to the disk tier.
    out, err = drain.communicate(timeout=180)
    assert drain.returncode == 0, (out, err)
    assert "draining" in out and "has exited" in out
    assert engine.process.wait(120) == 0, engine.log()
    events = {e.get("event"): e for e in engine.events()}
    assert "engine_drained" in events, engine.log()
    assert events["kv_write_out_on_close"]["blocks"] > 0, engine.log()
    assert any(engine.disk.rglob("*")), "nothing on the disk tier"


def test_a_drain_needs_the_token_when_one_is_set(tiny_llama_dir: Path, tmp_path: Path) -> None:
    server = EngineProcess(tiny_llama_dir, tmp_path, KVGATE_DRAIN_TOKEN="s3cret")
    try:
        refused = subprocess.run(
            [str(KVGATE), "engine", "drain", server.url], capture_output=True, text=True, timeout=120
        )
        assert refused.returncode == 1 and "403" in refused.stderr and "KVGATE_DRAIN_TOKEN" in refused.stderr
        assert httpx.get(f"{server.url}/health").status_code == 200  # not draining
        drained = subprocess.run(
            [str(KVGATE), "engine", "drain", server.url, "--token", "s3cret"],
            capture_output=True,
            text=True,
            timeout=300,
        )
        assert drained.returncode == 0, drained.stderr
        assert server.process.wait(120) == 0
    finally:
        if server.process.poll() is None:
            server.process.kill()
            server.process.wait(30)
