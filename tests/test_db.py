"""The database foundation's outage handling: timeouts on every engine, what counts as 'away',
one log line per change of state, paced probes, and owner-only SQLite files."""

from __future__ import annotations

import errno
import os
import stat

import pytest
import structlog
from sqlalchemy import exc as sa_exc
from sqlalchemy import text

from kvgate.db import create_engine, create_sync_engine
from kvgate.db_health import DatabaseHealth, is_database_unavailable
from kvgate.db_settings import DatabaseSettings
from tests.gateway.harness import pg_reachable


class Ticker:
    def __init__(self) -> None:
        self.now = 100.0

    def __call__(self) -> float:
        return self.now


def test_what_counts_as_the_database_being_away() -> None:
    away = [
        ConnectionRefusedError(errno.ECONNREFUSED, "refused"),
        TimeoutError(),
        sa_exc.OperationalError("select 1", {}, Exception("server closed the connection")),
        sa_exc.TimeoutError("QueuePool limit reached"),
        OSError(errno.EHOSTUNREACH, "no route to host"),
    ]
    not_away = [
        sa_exc.IntegrityError("insert", {}, Exception("duplicate key")),
        OSError(errno.ENOSPC, "No space left on device"),
        ValueError("bad"),
    ]
    assert all(is_database_unavailable(e) for e in away)
    assert not any(is_database_unavailable(e) for e in not_away)


def test_one_log_line_per_change_and_one_probe_per_interval() -> None:
    tick = Ticker()
    health = DatabaseHealth(retry_interval_s=1.0, clock=tick)
    recovered: list[bool] = []
    health.add_recovery_hook(lambda: recovered.append(True))
    with structlog.testing.capture_logs() as logs:
        assert health.should_try()
        for _ in range(100):  # a hundred requests fail during one outage
            assert health.observe(ConnectionRefusedError(errno.ECONNREFUSED, "refused"))
        assert not health.observe(ValueError("not an outage"))
        assert not health.available and not health.should_try()  # no probe due yet
        tick.now += 1.0
        assert health.should_try() and not health.should_try()  # one probe, then wait again
        for _ in range(5):
            health.succeeded()
    assert [e["event"] for e in logs] == ["database_unavailable", "database_available"]
    assert logs[0]["error"].startswith("ConnectionRefusedError") and logs[1]["outage_s"] == 1.0
    assert health.available and health.should_try() and recovered == [True] and health.outages == 1


async def test_sqlite_engines_have_a_busy_timeout_and_owner_only_files(tmp_path) -> None:
    previous = os.umask(0o022)
    try:
        engine = create_sync_engine(f"sqlite:///{tmp_path / 'a.db'}", timeouts=DatabaseSettings(statement_timeout_s=2))
        with engine.begin() as conn:
            assert conn.execute(text("PRAGMA busy_timeout")).scalar() == 2000
            conn.execute(text("CREATE TABLE t (x INTEGER)"))
        aengine = create_engine(f"sqlite:///{tmp_path / 'b.db'}", timeouts=DatabaseSettings(statement_timeout_s=3))
        async with aengine.connect() as conn:
            assert (await conn.execute(text("PRAGMA busy_timeout"))).scalar() == 3000
            # Read while the pooled connections keep the -wal and -shm files in place.
            modes = {p.name: stat.S_IMODE(p.stat().st_mode) for p in tmp_path.iterdir()}
        await aengine.dispose()
        engine.dispose()
    finally:
        os.umask(previous)
    assert {"a.db", "a.db-wal", "a.db-shm", "b.db"} <= set(modes)
    assert all(mode == 0o600 for mode in modes.values()), {k: oct(v) for k, v in modes.items()}


@pytest.mark.postgres
async def test_postgres_engines_carry_statement_timeouts() -> None:
    if not pg_reachable():
        pytest.skip("PostgreSQL is not reachable at 127.0.0.1:5432")
    url = "postgresql://postgres@127.0.0.1:5432/postgres"
    timeouts = DatabaseSettings(statement_timeout_s=2.5)
    engine = create_engine(url, timeouts=timeouts)
    async with engine.connect() as conn:
        assert (await conn.execute(text("SHOW statement_timeout"))).scalar() == "2500ms"
        with pytest.raises(Exception) as slow:
            await conn.execute(text("SELECT pg_sleep(5)"))
        assert is_database_unavailable(slow.value)
    await engine.dispose()
    sync = create_sync_engine(url, timeouts=timeouts)
    with sync.connect() as conn:
        assert conn.execute(text("SHOW statement_timeout")).scalar() == "2500ms"
    sync.dispose()
