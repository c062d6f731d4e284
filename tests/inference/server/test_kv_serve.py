"""`kvgate engine serve` as a real process with KV events: its default engine id and its events on NATS."""

from __future__ import annotations

import signal
import subprocess
import time
from pathlib import Path

import httpx
import pytest

from inference.cli import served_engine_id
from inference.hashing import BlockHasher
from inference.preflight import check_nats_url
from inference.settings import EngineSettings
from kvgate import kv_events
from kvgate.preflight import StartupError
from tests.gateway.harness import free_port
from tests.inference.kv_event_helpers import NATS_URL, purge, read_batches, replay, unique_engine_id
from tests.inference.server.helpers import token_prompt, unique_salt
from tests.inference.server.test_startup_checks import KVGATE, _env


def test_default_engine_ids() -> None:
    assert served_engine_id("127.0.0.1", 8001) == "127.0.0.1:8001"
    assert served_engine_id("0.0.0.0", 8001).endswith(":8001") and not served_engine_id("::", 1).startswith(":")
    assert EngineSettings(engine_id="e-7").resolved_engine_id() == "e-7"
    assert EngineSettings().resolved_engine_id() != EngineSettings(engine_id="x").resolved_engine_id()


def test_a_served_engine_is_known_by_host_and_port_and_publishes_its_blocks(tmp_path: Path, tiny_llama_dir: Path):
    port = free_port()
    # A model id of its own, so that its subject is this test's alone.
    model_id = unique_engine_id()
    env = _env(tiny_llama_dir, KVGATE_NATS_URL=NATS_URL, KVGATE_SERVED_MODEL_NAME=model_id)
    subject = kv_events.subject(model_id, f"127.0.0.1:{port}")
    log_path = tmp_path / "engine.log"
    with log_path.open("wb") as log:
        process = subprocess.Popen(
            [str(KVGATE), "engine", "serve", "--port", str(port)], env=env, stdout=log, stderr=log
        )
    url = f"http://127.0.0.1:{port}"
    try:
        deadline = time.monotonic() + 240
        while True:
            try:
                if httpx.get(f"{url}/health", timeout=2).status_code == 200:
                    break
            except httpx.TransportError:
                pass
            assert process.poll() is None, log_path.read_text()
            assert time.monotonic() < deadline, log_path.read_text()
            time.sleep(0.2)
        info = httpx.get(f"{url}/kv/info").json()
        assert info["engine_id"] == f"127.0.0.1:{port}" and info["kv_events_subject"] == subject
        salt, prompt = unique_salt(), token_prompt(40, seed=1621)
        body = {"model": model_id, "prompt": prompt, "max_tokens": 2, "cache_salt": salt}
        assert httpx.post(f"{url}/v1/completions", json=body, timeout=60).status_code == 200
        seq = httpx.get(f"{url}/kv/snapshot").json()["seq"]
        hasher = BlockHasher(model_id=info["model_id"], block_size=info["block_size"], algo=info["hash_algo"])
        expected = {("CPU", h) for h in hasher.hash_blocks(prompt, salt)[:2]}
        assert set(replay(read_batches(subject, until_seq=seq))) == expected
    finally:
        process.send_signal(signal.SIGINT)
        process.wait(timeout=120)
        purge(subject)


def test_a_malformed_nats_url_fails_the_start_in_one_line_and_a_good_or_unreachable_one_passes() -> None:
    for good in (None, "nats://127.0.0.1:4222", "nats://a:1, tls://b:2", "nats://127.0.0.1:1"):
        check_nats_url(EngineSettings(nats_url=good))
    for bad in ("127.0.0.1:4222", "http://127.0.0.1:4222", "nats://"):
        with pytest.raises(StartupError, match="is not a NATS URL"):
            check_nats_url(EngineSettings(nats_url=bad))
