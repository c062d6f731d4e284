"""The `kvgate` command as a user runs it: --version, -v, reads that never create a database, .env,
`kvgate config`."""

from __future__ import annotations

import csv
import io
import json
import os
import subprocess
import sys
from importlib.metadata import version
from pathlib import Path

import pytest
from typer.testing import CliRunner, Result

from kvgate.cli import app
from kvgate.cli_database import masked_url


@pytest.fixture
def workdir(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> Path:
    """A fresh working directory with no KVGATE_* variables set: only the defaults and .env apply."""
    for name in list(os.environ):
        if name.upper().startswith("KVGATE_") or name.upper().startswith("STRIPE_"):
            monkeypatch.delenv(name)
    monkeypatch.chdir(tmp_path)
    return tmp_path


def kvgate(*argv: str) -> Result:
    return CliRunner().invoke(app, list(argv))


def test_version_is_the_installed_packages() -> None:
    result = kvgate("--version")
    assert result.exit_code == 0 and result.stdout.strip() == f"kvgate {version('kvgate')}"


def test_a_read_never_creates_the_database_and_a_write_does(workdir: Path) -> None:
    database = workdir / "kvgate.db"
    for argv in (["tenants", "list"], ["keys", "list", "ten_x"], ["members", "list", "ten_x"]):
        result = kvgate(*argv)
        assert result.exit_code == 1, (argv, result.output)
        lines = result.stderr.strip().splitlines()
        assert len(lines) == 1 and lines[0].startswith(f"error: no database at {database} ")
        assert "KVGATE_DATABASE_URL" in lines[0] and ".env" in lines[0] and result.stdout == ""
        assert not database.exists() and list(workdir.iterdir()) == []

    created = kvgate("-v", "tenants", "create", "First")
    assert created.exit_code == 0, created.output
    assert database.exists()
    # -v says which database the command opened, on stderr (stdout stays the command's own output).
    assert f"kvgate: database sqlite:///./kvgate.db ({database})" in created.stderr
    assert "kvgate: database" not in created.stdout

    listed = kvgate("-v", "tenants", "list")
    assert listed.exit_code == 0 and "First" in listed.stdout and "kvgate: database" in listed.stderr
    assert "kvgate: database" not in kvgate("tenants", "list").stderr  # only when asked


def test_an_empty_listing_says_none_in_a_table_and_stays_parseable_otherwise(workdir: Path) -> None:
    from kvgate.db import migrate

    migrate("sqlite:///kvgate.db")
    assert kvgate("tenants", "list").stdout == "(none)\n"
    assert json.loads(kvgate("tenants", "list", "-o", "json").stdout) == []
    assert kvgate("tenants", "list", "-o", "csv").stdout == "id,name,status,created_at,scheduling_weight\n"
    kvgate("tenants", "create", "Only")
    assert "(none)" not in kvgate("tenants", "list").stdout


def test_masked_url_hides_the_password_only() -> None:
    assert masked_url("postgresql://kv:s3cret@db.example:5432/kvgate") == "postgresql://kv:***@db.example:5432/kvgate"
    assert masked_url("sqlite:///./kvgate.db") == "sqlite:///./kvgate.db"


def test_dotenv_is_read_and_the_environment_wins(workdir: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    from gateway.settings import GatewaySettings
    from inference.settings import EngineSettings
    from kvgate.db_settings import DatabaseSettings

    (workdir / ".env").write_text(
        "KVGATE_DATABASE_URL=sqlite:///from-dotenv.db\nKVGATE_PORT=9001\nKVGATE_DB_POOL_TIMEOUT_S=7\n"
        "KVGATE_KV_CACHE_GIB=0.25\nOTHER_TOOL_SETTING=ignored\n"
    )
    assert GatewaySettings().port == 9001 and DatabaseSettings().pool_timeout_s == 7
    assert EngineSettings().kv_cache_gib == 0.25
    assert kvgate("tenants", "create", "Dotenv Co").exit_code == 0
    assert (workdir / "from-dotenv.db").exists() and not (workdir / "kvgate.db").exists()

    monkeypatch.setenv("KVGATE_PORT", "9002")
    monkeypatch.setenv("KVGATE_DATABASE_URL", "sqlite:///from-env.db")
    assert GatewaySettings().port == 9002
    assert "Dotenv Co" not in kvgate("tenants", "list").stdout + kvgate("tenants", "list").stderr
    assert "no database at" in kvgate("tenants", "list").stderr  # from-env.db: the environment's, absent


def test_config_shows_settings_with_their_source_and_masks_secrets(
    workdir: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    (workdir / ".env").write_text(
        "KVGATE_ADMIN_TOKEN=tok-from-dotenv-123\nKVGATE_PORT=9001\n"
        "KVGATE_REDIS_URL=redis://:hunter2@cache.example:6379/0\n"
    )
    monkeypatch.setenv("KVGATE_DATABASE_URL", "postgresql://kv:pg-secret-456@db.example:5432/kvgate")
    monkeypatch.setenv("STRIPE_API_KEY", "sk_test_abcdef")
    monkeypatch.setenv("KVGATE_PORT", "9003")  # wins over .env's 9001

    result = kvgate("config", "-o", "json")
    assert result.exit_code == 0, result.output
    rows = {row["setting"]: row for row in json.loads(result.stdout)}
    assert rows["KVGATE_ADMIN_TOKEN"] == {
        "setting": "KVGATE_ADMIN_TOKEN",
        "part": "gateway",
        "value": "***",
        "source": ".env",
    }
    assert rows["STRIPE_API_KEY"]["value"] == "***" and rows["STRIPE_API_KEY"]["source"] == "environment"
    assert rows["KVGATE_DATABASE_URL"]["value"] == "postgresql://kv:***@db.example:5432/kvgate"
    assert rows["KVGATE_REDIS_URL"]["value"] == "redis://:***@cache.example:6379/0"
    assert rows["KVGATE_PORT"]["value"] == "9003" and rows["KVGATE_PORT"]["source"] == "environment"
    assert rows["KVGATE_HOST"]["value"] == "127.0.0.1" and rows["KVGATE_HOST"]["source"] == "default"
    assert rows["KVGATE_SECRET"]["value"] is None

    for fmt in ("table", "csv"):
        out = kvgate("config", "-o", fmt).stdout
        for secret in ("tok-from-dotenv-123", "pg-secret-456", "hunter2", "sk_test_abcdef"):
            assert secret not in out, (fmt, secret)
        assert "9003" in out and "127.0.0.1" in out
    table = kvgate("config").stdout.splitlines()
    assert table[0].split() == ["setting", "part", "value", "source"]
    assert any(line.split() == ["KVGATE_ADMIN_TOKEN", "gateway", "***", ".env"] for line in table)
    records = list(csv.DictReader(io.StringIO(kvgate("config", "-o", "csv").stdout)))
    assert {r["setting"]: r["value"] for r in records}["KVGATE_ADMIN_TOKEN"] == "***"
    assert set(records[0]) == {"setting", "part", "value", "source"}


def test_user_errors_are_one_line(workdir: Path) -> None:
    kvgate("tenants", "create", "X")
    result = kvgate("keys", "create", "ten_missing")
    assert result.exit_code == 1 and result.stderr == "error: tenant 'ten_missing' not found\n"
    assert "Traceback" not in result.output
    ok = kvgate("keys", "list", "ten_missing")
    assert ok.exit_code == 1 and ok.stderr.startswith("error: ")


def test_shell_completion_completes_commands_and_options(workdir: Path) -> None:
    """What the script `kvgate --install-completion` installs asks the command itself for the words."""

    def complete(words: str) -> list[str]:
        env = {
            **os.environ,
            "_KVGATE_COMPLETE": "complete_bash",
            "COMP_WORDS": words,
            "COMP_CWORD": str(len(words.split()) - 1),
        }
        done = subprocess.run(
            [sys.executable, "-c", "import sys; from kvgate.cli import main; sys.exit(main())"],
            env=env,
            capture_output=True,
            text=True,
            timeout=300,
            check=True,
        )
        return done.stdout.split()

    assert complete("kvgate ten") == ["tenants"]
    assert "--output" in complete("kvgate tenants list --o")
    assert complete("kvgate nosuchcommand") == []
    assert list(workdir.iterdir()) == []  # completing creates no database


def test_an_unreachable_or_malformed_database_is_one_line(workdir: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    # Port 1 on this machine refuses at once; the password must not be printed.
    monkeypatch.setenv("KVGATE_DATABASE_URL", "postgresql://kv:pw-not-shown@127.0.0.1:1/kvgate")
    for argv in (["tenants", "create", "X"], ["tenants", "list"]):
        result = kvgate(*argv)
        assert result.exit_code == 1 and len(result.stderr.splitlines()) == 1, result.output
        assert result.stderr.startswith("error: cannot reach the database at postgresql://kv:***@127.0.0.1:1/kvgate")
        assert "pw-not-shown" not in result.output and "Traceback" not in result.output
    monkeypatch.setenv("KVGATE_DATABASE_URL", "not a url")
    result = kvgate("tenants", "list")
    assert result.exit_code == 1 and result.stderr.startswith("error: KVGATE_DATABASE_URL is not a database URL")
    monkeypatch.setenv("KVGATE_DATABASE_URL", f"sqlite:///{workdir / 'ok.db'}")
    assert kvgate("tenants", "create", "X").exit_code == 0  # the same command on a good URL
