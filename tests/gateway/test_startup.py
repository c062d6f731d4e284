"""`kvgate serve`'s start-up, as a real subprocess: checks before the model loads, --wait-for-db, and
what reaches the JSON log stream (no banner, no admin token, no progress bar).

Each failed check is one line on stderr (a JSON event without a terminal) naming the cause and the
fix, exit status 1, no traceback, and the model never started loading; each is paired with a start
that succeeds once the fault is gone.
"""

from __future__ import annotations

import asyncio
import json
import os
import socket
import stat
import subprocess
import sys
import threading
import time
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import httpx
import pytest

from tests.billing.tcp_proxy import CuttableProxy
from tests.gateway.harness import free_port, pg_reachable, postgres_database
from tests.gateway.serve_process import Serve

KVGATE = Path(sys.executable).with_name("kvgate")
# Loose: the port check runs before anything heavy, but the interpreter and imports of a
# loaded 2-core machine take their time. The real guarantee is that the model never loads.
FAILURE_WALL_S = 120
# Events that mean start-up went past the checks.
PAST_CHECKS = ("database_migrated", "model_progress", "converting_gguf", "Started server process")


def _env(tmp_path: Path, model_dir: Path, **overrides: str | None) -> dict[str, str]:
    env = {
        **os.environ,
        "KVGATE_DATABASE_URL": f"sqlite:///{tmp_path / 'kvgate.db'}",
        "KVGATE_MODEL": str(model_dir),
        "KVGATE_DTYPE": "float32",
        "KVGATE_KV_CACHE_GIB": "0.05",
        "KVGATE_NUM_THREADS": "1",
        "KVGATE_SPOOL_PATH": str(tmp_path / "usage-spool.jsonl"),
        "KVGATE_INFLIGHT_JOURNAL_DIR": str(tmp_path / "inflight"),
        **overrides,
    }
    return {k: v for k, v in env.items() if v is not None}


def failed_start(env: dict[str, str], *args: str, port: int | None = None) -> dict[str, Any]:
    """Run `kvgate serve` expecting it to fail; its one stderr line, parsed, after the common checks."""
    port = port or free_port()
    result = subprocess.run(
        [str(KVGATE), "serve", "--port", str(port), *args],
        env=env,
        capture_output=True,
        text=True,
        timeout=FAILURE_WALL_S,
    )
    lines = [line for line in result.stderr.splitlines() if line.strip()]
    assert result.returncode == 1, result.stderr
    assert "Traceback" not in result.stderr
    assert not any(event in result.stderr for event in PAST_CHECKS), result.stderr
    events = [json.loads(line) for line in lines]
    assert events[-1]["event"] == "startup_failed" and events[-1]["level"] == "error"
    assert all(e["event"] == "database_unreachable" for e in events[:-1]), result.stderr
    message = events[-1]["error"]
    assert "\n" not in message
    return {"message": message, "events": events}


@pytest.fixture
def good_env(tmp_path: Path, tiny_llama_dir: Path) -> dict[str, str]:
    return _env(tmp_path, tiny_llama_dir)


# -- one-line failures --------------------------------------------------------------------------


def test_taken_port_fails_before_the_model_loads(tmp_path: Path, good_env: dict[str, str]) -> None:
    with socket.socket() as holder:
        holder.bind(("127.0.0.1", 0))
        holder.listen()
        port = holder.getsockname()[1]
        # A model that cannot load: had start-up got that far, the error would be another one.
        env = {**good_env, "KVGATE_MODEL": str(tmp_path / "no-such-model")}
        failure = failed_start(env, port=port)
    assert f"port {port} is already in use" in failure["message"]
    assert "--port or KVGATE_PORT" in failure["message"]
    assert len(failure["events"]) == 1


@pytest.mark.parametrize(
    ("url", "expected"),
    [
        ("not a url", "is not a database URL"),
        ("mysql://kvgate@localhost/kvgate", "unsupported database 'mysql'"),
    ],
)
def test_bad_database_url_is_one_line(good_env: dict[str, str], url: str, expected: str) -> None:
    failure = failed_start({**good_env, "KVGATE_DATABASE_URL": url})
    assert expected in failure["message"]
    assert "set KVGATE_DATABASE_URL to sqlite:///" in failure["message"]


@pytest.mark.parametrize("name", ["KVGATE_SHUTDOWN_GRACE_S", "KVGATE_KV_DISK_GIB"])  # gateway's, engine's
def test_an_invalid_setting_is_one_line(good_env: dict[str, str], name: str) -> None:
    failure = failed_start({**good_env, name: "-1"})
    assert failure["message"].startswith(f"invalid settings: {name}: Input should be greater than 0")


def test_database_down_is_one_line(good_env: dict[str, str]) -> None:
    down = f"postgresql://postgres:hunter2@127.0.0.1:{free_port()}/kvgate"
    failure = failed_start({**good_env, "KVGATE_DATABASE_URL": down})
    message = failure["message"]
    assert message.startswith("cannot reach the database postgresql://postgres:***@127.0.0.1:")
    assert "Connection refused" in message and "--wait-for-db SECONDS" in message
    assert "hunter2" not in message


def test_sqlite_in_a_missing_directory_is_one_line(tmp_path: Path, good_env: dict[str, str]) -> None:
    url = f"sqlite:///{tmp_path / 'missing' / 'kvgate.db'}"
    failure = failed_start({**good_env, "KVGATE_DATABASE_URL": url})
    assert "unable to open database file" in failure["message"]
    assert "check that its directory exists" in failure["message"]


def test_disk_tier_that_cannot_be_written_is_one_line(tmp_path: Path, good_env: dict[str, str]) -> None:
    afile = tmp_path / "a-file"
    afile.write_text("")
    failure = failed_start({**good_env, "KVGATE_KV_DISK_DIR": str(afile / "kv")})
    assert f"the disk KV tier directory {afile / 'kv'} is not writable" in failure["message"]
    assert "KVGATE_KV_DISK_DIR" in failure["message"]


def test_disk_tier_without_room_is_one_line(tmp_path: Path, good_env: dict[str, str]) -> None:
    env = {**good_env, "KVGATE_KV_DISK_DIR": str(tmp_path / "kv"), "KVGATE_KV_DISK_GIB": "1000000"}
    failure = failed_start(env)
    assert "the disk KV tier needs 1e+06 GiB" in failure["message"]
    assert "lower KVGATE_KV_DISK_GIB" in failure["message"]


def test_wait_for_db_gives_up_after_the_wait(good_env: dict[str, str]) -> None:
    down = f"postgresql://postgres@127.0.0.1:{free_port()}/kvgate"
    failure = failed_start({**good_env, "KVGATE_DATABASE_URL": down}, "--wait-for-db", "3")
    retries = failure["events"][:-1]
    assert retries, "each retry is logged"
    assert [e["attempt"] for e in retries] == list(range(1, len(retries) + 1))
    assert "(waited 3 s)" in failure["message"]


# -- the positive side: the same set-up, fault removed, starts --------------------------------


def _log_events(path: Path) -> list[dict[str, Any]]:
    return [json.loads(line) for line in path.read_text().splitlines() if line.strip()]


def test_good_start_keeps_the_token_and_banners_out_of_the_json_log(tmp_path: Path, tiny_llama_dir: Path) -> None:
    """Port free, SQLite, a writable disk tier with room: it starts. Without a terminal the log is JSON
    lines only: no banner, no admin token (it is in a 0600 file the log names), no progress bar."""
    server = Serve(
        database_url=f"sqlite:///{tmp_path / 'kvgate.db'}",
        model_dir=tiny_llama_dir,
        workdir=tmp_path,
        env={"KVGATE_ADMIN_TOKEN": None, "KVGATE_KV_DISK_DIR": str(tmp_path / "kv"), "KVGATE_KV_DISK_GIB": "0.01"},
    )
    try:
        text = server.log_path.read_text()
        events = _log_events(server.log_path)  # every line is JSON
        names = [e["event"] for e in events]
        for name in ("database_migrated", "admin_token_generated", "model_progress", "no_tenants"):
            assert name in names, names
        assert "kvgadm-" not in text
        for banner_text in ("no tenants yet", "dashboard is at", "Generated the admin token"):
            assert banner_text not in text
        for bar in ("\r", "it/s", "━", "%|"):
            assert bar not in text
        (notice,) = [e for e in events if e["event"] == "admin_token_generated"]
        token_file = Path(notice["path"])
        assert token_file == tmp_path / "kvgate.db.admin-token"
        assert stat.S_IMODE(token_file.stat().st_mode) == 0o600
        token = token_file.read_text().strip()
        assert token.startswith("kvgadm-")
        listed = httpx.get(f"{server.base_url}/admin/v1/tenants", headers={"authorization": f"Bearer {token}"})
        assert listed.status_code == 200
        refused = httpx.get(f"{server.base_url}/admin/v1/tenants", headers={"authorization": "Bearer kvgadm-wrong"})
        assert refused.status_code == 401
    finally:
        assert server.stop() == 0


class _ProxyOn(CuttableProxy):
    """The test's PostgreSQL behind a chosen port, started when the test says so (in its own thread)."""

    def __init__(self, port: int) -> None:
        super().__init__("127.0.0.1", 5432)
        self.wanted = port
        self.loop = asyncio.new_event_loop()
        self.thread = threading.Thread(target=self.loop.run_forever, daemon=True)

    async def start(self) -> None:
        self._server = await asyncio.start_server(self._handle, "127.0.0.1", self.wanted)
        self.port = self.wanted

    def start_now(self) -> None:
        self.thread.start()
        asyncio.run_coroutine_threadsafe(self.start(), self.loop).result(timeout=30)

    def close(self) -> None:
        if self.thread.is_alive():
            asyncio.run_coroutine_threadsafe(self.stop(), self.loop).result(timeout=30)
            self.loop.call_soon_threadsafe(self.loop.stop)
            self.thread.join(timeout=30)


@pytest.fixture
def pg_database() -> Iterator[str]:
    if not pg_reachable():
        pytest.skip("PostgreSQL is not reachable at 127.0.0.1:5432")
    with postgres_database("kvgate_startup_test") as url:
        yield url


@pytest.mark.postgres
def test_wait_for_db_starts_once_the_database_appears(tmp_path: Path, tiny_llama_dir: Path, pg_database: str) -> None:
    """The database comes up (a proxy to PostgreSQL starts listening) after serve has retried it."""
    port = free_port()
    proxy = _ProxyOn(port)
    url = pg_database.replace("127.0.0.1:5432", f"127.0.0.1:{port}")
    assert url != pg_database
    appeared = threading.Event()

    def bring_up_after_a_retry() -> None:
        deadline = time.monotonic() + 240
        while time.monotonic() < deadline:
            logs = list(tmp_path.glob("serve-*.log"))  # Serve's log, before Serve() returns
            if logs and "database_unreachable" in logs[0].read_text():
                proxy.start_now()
                appeared.set()
                return
            time.sleep(0.1)

    watcher = threading.Thread(target=bring_up_after_a_retry, daemon=True)
    watcher.start()
    try:
        server = Serve(database_url=url, model_dir=tiny_llama_dir, workdir=tmp_path, args=("--wait-for-db", "240"))
        try:
            assert appeared.is_set()
            events = _log_events(server.log_path)
            names = [e["event"] for e in events]
            assert "database_unreachable" in names
            assert names.index("database_reachable") < names.index("database_migrated")
            assert server.admin.get("/admin/v1/tenants").status_code == 200
        finally:
            assert server.stop() == 0
    finally:
        watcher.join(timeout=10)
        proxy.close()
