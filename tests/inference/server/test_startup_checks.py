"""`kvgate engine serve` checks its port and its disk KV tier before it loads the model: one line each."""

from __future__ import annotations

import json
import os
import signal
import socket
import subprocess
import sys
import time
from pathlib import Path

import httpx

from tests.gateway.harness import free_port

KVGATE = Path(sys.executable).with_name("kvgate")


def _env(model: Path, **extra: str) -> dict[str, str]:
    env = {k: v for k, v in os.environ.items() if not k.startswith("KVGATE_")}
    env.update(KVGATE_MODEL=str(model), KVGATE_DTYPE="float32", KVGATE_KV_CACHE_GIB="0.05", KVGATE_NUM_THREADS="1")
    return {**env, **extra}


def _failed(env: dict[str, str], port: int) -> str:
    result = subprocess.run(
        [str(KVGATE), "engine", "serve", "--port", str(port)], env=env, capture_output=True, text=True, timeout=120
    )
    assert result.returncode == 1, result.stderr
    (line,) = [line for line in result.stderr.splitlines() if line.strip()]
    event = json.loads(line)
    assert event["event"] == "startup_failed"
    return event["error"]


def test_taken_port_and_bad_disk_tier_fail_in_one_line_before_the_model(tmp_path: Path) -> None:
    # The model path does not exist: had the engine started loading it, the error would be another one.
    env = _env(tmp_path / "no-such-model")
    with socket.socket() as holder:
        holder.bind(("127.0.0.1", 0))
        holder.listen()
        port = holder.getsockname()[1]
        assert f"port {port} is already in use" in _failed(env, port)
    afile = tmp_path / "a-file"
    afile.write_text("")
    message = _failed({**env, "KVGATE_KV_DISK_DIR": str(afile / "kv")}, free_port())
    assert "the disk KV tier directory" in message and "is not writable" in message


def test_a_good_config_starts(tmp_path: Path, tiny_llama_dir: Path) -> None:
    port = free_port()
    env = _env(tiny_llama_dir, KVGATE_KV_DISK_DIR=str(tmp_path / "kv"), KVGATE_KV_DISK_GIB="0.01")
    log_path = tmp_path / "engine.log"
    with log_path.open("wb") as log:
        process = subprocess.Popen(
            [str(KVGATE), "engine", "serve", "--port", str(port)], env=env, stdout=log, stderr=log
        )
    try:
        deadline = time.monotonic() + 240
        while True:
            try:
                if httpx.get(f"http://127.0.0.1:{port}/health", timeout=2).status_code == 200:
                    break
            except httpx.TransportError:
                pass
            assert process.poll() is None, log_path.read_text()
            assert time.monotonic() < deadline, log_path.read_text()
            time.sleep(0.2)
        assert "model_progress" in log_path.read_text()
    finally:
        process.send_signal(signal.SIGINT)
        process.wait(timeout=120)


def test_kernel_settings_this_cpu_cannot_plan_fail_in_one_line(monkeypatch) -> None:
    import pytest

    from inference import preflight
    from inference.platform import CpuInfo
    from inference.settings import EngineSettings
    from kvgate.preflight import StartupError
    from tests.inference.test_platform import MACHINES

    monkeypatch.setattr(preflight, "this_cpu", lambda: MACHINES["AVX2-only EPYC (Zen3)"])
    with pytest.raises(
        StartupError, match="KVGATE_KERNEL_ISA=amx: this CPU does not run it \\(it runs: generic, avx2\\)"
    ):
        preflight.check_kernel_settings(EngineSettings(kernel_isa="amx"))
    for fine in ("auto", "generic", "avx2"):  # paired positives: what the CPU runs passes
        preflight.check_kernel_settings(EngineSettings(kernel_isa=fine))
    preflight.check_kernel_settings(EngineSettings(attention_backend="cpu_kernel"))
    monkeypatch.setattr(preflight, "have_compiler", lambda: False)
    with pytest.raises(StartupError, match="no C compiler"):
        preflight.check_kernel_settings(EngineSettings(attention_backend="cpu_kernel"))
    monkeypatch.setattr(preflight, "this_cpu", lambda: CpuInfo("aarch64", frozenset()))
    with pytest.raises(StartupError, match="an aarch64 CPU"):
        preflight.check_kernel_settings(EngineSettings(attention_backend="cpu_kernel", device="cpu"))
    preflight.check_kernel_settings(EngineSettings())  # auto on aarch64: torch's kernels, nothing to refuse
