"""`kvgate tenants|keys ...` on the database directly, and `kvgate serve` as a real process."""

from __future__ import annotations

import json
import os
import re
import signal
import stat
import subprocess
import sys
import time
from pathlib import Path

import httpx
import pytest

from kvgate.cli import main
from tests.gateway.harness import free_port


@pytest.fixture
def cli_db(gw_db_url: str, monkeypatch: pytest.MonkeyPatch) -> str:
    monkeypatch.setenv("KVGATE_DATABASE_URL", gw_db_url)
    return gw_db_url


def run(capsys: pytest.CaptureFixture[str], *argv: str) -> tuple[int, str, str]:
    code = main(list(argv))
    out, err = capsys.readouterr()
    return code, out, err


def test_tenants_and_keys_commands(cli_db: str, capsys: pytest.CaptureFixture[str]) -> None:
    code, out, _ = run(capsys, "tenants", "create", "Night Shift")
    assert code == 0
    tenant_id = re.search(r"created tenant (ten_\w+)", out).group(1)  # type: ignore[union-attr]

    code, out, _ = run(capsys, "keys", "create", tenant_id, "--name", "laptop", "--requests-per-minute", "5")
    assert code == 0
    key = out.strip().splitlines()[-1]
    key_id = re.search(r"created key (key_\w+)", out).group(1)  # type: ignore[union-attr]
    assert re.fullmatch(r"kvg-[A-Za-z0-9_-]{40,}", key)

    code, out, _ = run(capsys, "keys", "list", tenant_id)
    assert code == 0 and key_id in out and "active" in out and "laptop" in out and key not in out

    code, out, _ = run(capsys, "keys", "revoke", key_id)
    assert code == 0 and "revoked" in out
    assert "revoked" in run(capsys, "keys", "list", tenant_id)[1]

    assert tenant_id in run(capsys, "tenants", "list")[1]
    assert run(capsys, "tenants", "suspend", tenant_id)[1].strip().endswith("suspended")


def test_key_scopes_from_the_cli(cli_db: str, capsys: pytest.CaptureFixture[str]) -> None:
    tenant_id = re.search(r"created tenant (ten_\w+)", run(capsys, "tenants", "create", "Scoped")[1]).group(1)  # type: ignore[union-attr]
    code, out, _ = run(capsys, "keys", "create", tenant_id, "--name", "plain")
    assert code == 0 and "(scopes: inference)" in out
    plain_id = re.search(r"created key (key_\w+)", out).group(1)  # type: ignore[union-attr]
    code, out, _ = run(capsys, "keys", "create", tenant_id, "--scope", "usage:read", "--scope", "inference")
    assert code == 0 and "(scopes: inference usage:read)" in out
    code, out, _ = run(capsys, "keys", "scopes", plain_id, "--scope", "usage:read")
    assert code == 0 and out.strip().endswith("now has scopes: usage:read")
    listed = {key["id"]: key["scopes"] for key in json.loads(run(capsys, "keys", "list", tenant_id, "-o", "json")[1])}
    assert listed[plain_id] == ["usage:read"] and sorted(listed.values()) == [
        ["inference", "usage:read"],
        ["usage:read"],
    ]
    # An unknown scope is a message and exit status 1, on creation and on change.
    code, _, err = run(capsys, "keys", "create", tenant_id, "--scope", "admin")
    assert code == 1 and "unknown scope 'admin'" in err
    code, _, err = run(capsys, "keys", "scopes", plain_id, "--scope", "everything")
    assert code == 1 and "unknown scope" in err


def test_cli_creates_the_database_readable_by_its_owner_only(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch, capsys: pytest.CaptureFixture[str]
) -> None:
    monkeypatch.setenv("KVGATE_DATABASE_URL", f"sqlite:///{tmp_path / 'fresh.db'}")
    previous = os.umask(0o022)  # a permissive umask, as many systems have
    try:
        code, out, _ = run(capsys, "tenants", "create", "Private Co")
    finally:
        os.umask(previous)
    assert code == 0 and "created tenant" in out
    files = {p.name: stat.S_IMODE(p.stat().st_mode) for p in tmp_path.glob("fresh.db*")}
    assert "fresh.db" in files and all(mode == 0o600 for mode in files.values()), files


def test_cli_errors_are_messages_not_tracebacks(cli_db: str, capsys: pytest.CaptureFixture[str]) -> None:
    code, _, err = run(capsys, "keys", "create", "ten_missing")
    assert code == 1 and "tenant 'ten_missing' not found" in err
    code, _, err = run(capsys, "keys", "revoke", "key_missing")
    assert code == 1 and "not found" in err


def test_serve_migrates_logs_first_start_help_and_serves(tiny_llama_dir: Path, tmp_path: Path) -> None:
    port = free_port()
    env = {
        **os.environ,
        "KVGATE_DATABASE_URL": f"sqlite:///{tmp_path / 'kvgate.db'}",
        "KVGATE_MODEL": str(tiny_llama_dir),
        "KVGATE_DTYPE": "float32",
        "KVGATE_KV_CACHE_GIB": "0.02",
        "KVGATE_NUM_THREADS": "1",
    }
    env.pop("KVGATE_ADMIN_TOKEN", None)
    kvgate = Path(sys.executable).with_name("kvgate")
    process = subprocess.Popen(
        [str(kvgate), "-v", "serve", "--port", str(port)],
        env=env,
        stderr=subprocess.PIPE,
        stdout=subprocess.DEVNULL,
        text=True,
        # A permissive umask, as many systems have: kvgate must not leave world-readable files.
        preexec_fn=lambda: os.umask(0o022),
    )
    try:
        deadline = time.monotonic() + 180
        while True:
            try:
                health = httpx.get(f"http://127.0.0.1:{port}/healthz", timeout=1)
                break
            except httpx.TransportError:
                assert process.poll() is None, process.stderr.read() if process.stderr else ""
                assert time.monotonic() < deadline, "kvgate serve did not come up"
                time.sleep(0.2)
        assert health.json()["model"] == "tiny-llama-v1"
        # The database and its WAL files hold keys' hashes, the salt secret and usage: owner only.
        # Directories beside it (the in-flight journal) are owner only too: 0700.
        files = {p.name: stat.S_IMODE(p.stat().st_mode) for p in tmp_path.glob("kvgate.db*")}
        dirs = {p.name for p in tmp_path.glob("kvgate.db*") if p.is_dir()}
        assert {"kvgate.db", "kvgate.db-wal", "kvgate.db-shm"} <= set(files), files
        expected = {name: 0o700 if name in dirs else 0o600 for name in files}
        assert files == expected, {k: oct(v) for k, v in files.items()}
        for path in ("/docs", "/openapi.json"):  # off unless KVGATE_EXPOSE_DOCS is set
            assert httpx.get(f"http://127.0.0.1:{port}{path}", timeout=10).status_code == 404
        process.send_signal(signal.SIGINT)
        _, stderr = process.communicate(timeout=60)
    finally:
        if process.poll() is None:
            process.kill()
            process.wait()
    assert process.returncode == 0, stderr
    # Without a terminal stderr is the JSON log: the first-start help is an event, the banners (the
    # dashboard's, on a terminal: tests/gateway/test_readme_startup.py) and the token stay out of it.
    events = {e["event"]: e for e in map(json.loads, stderr.splitlines())}
    assert "kvgate tenants create" in events["no_tenants"]["hint"]
    assert "dashboard is at" not in stderr and "kvgadm-" not in stderr
    token_file = Path(events["admin_token_generated"]["path"])
    assert token_file == tmp_path / "kvgate.db.admin-token"
    assert re.fullmatch(r"kvgadm-\S+\n", token_file.read_text())
    assert (tmp_path / "kvgate.db").exists()
    # In JSON mode the log stream names the database (-v's plain line is for a terminal).
    assert str(tmp_path / "kvgate.db") in events["database_migrated"]["url"]
