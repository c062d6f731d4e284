"""`kvgate serve` checks KVGATE_ENGINES before loading anything: one line naming the engine and the fix."""

from __future__ import annotations

import pytest

from gateway.backends.engine_list import EngineSpec
from gateway.backends.preflight import check_engines
from gateway.serve import preflight
from gateway.settings import GatewaySettings
from kvgate.preflight import StartupError
from tests.gateway.harness import free_port
from tests.inference.server.conftest import RunningServer


def test_an_engine_with_our_model_passes(engine_a: RunningServer) -> None:
    nobody = f"http://127.0.0.1:{free_port()}"
    specs = [EngineSpec(nobody), EngineSpec(engine_a.url)]
    assert check_engines(specs, engine_a.engine.model_id, wait_s=0) == [engine_a.url]


def test_an_engine_with_another_model_fails_start_up(engine_a: RunningServer) -> None:
    with pytest.raises(StartupError) as caught:
        check_engines([EngineSpec(engine_a.url)], "SmolLM2-135M-Instruct", wait_s=0)
    message = str(caught.value)
    assert engine_a.url in message and engine_a.engine.model_id in message and "KVGATE_MODEL" in message
    assert "\n" not in message


def test_no_engine_answering_fails_start_up(tmp_path, monkeypatch: pytest.MonkeyPatch) -> None:
    url = f"http://127.0.0.1:{free_port()}"
    with pytest.raises(StartupError, match="no engine of KVGATE_ENGINES answers"):
        check_engines([EngineSpec(url)], "m", wait_s=0)
    settings = GatewaySettings(
        database_url=f"sqlite:///{tmp_path / 'k.db'}", port=free_port(), engines=url, engines_start_wait_s=0
    )
    monkeypatch.setenv("KVGATE_KV_DISK_DIR", "/proc/not-a-place")  # a remote gateway has no disk tier to check
    with pytest.raises(StartupError, match=url):
        preflight(settings, wait_for_db_s=0)
