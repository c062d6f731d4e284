"""The database foundation shared by every package: declarative Base, URLs, engines, sessions, migrations.

One database holds the gateway's and billing's tables. The application talks to it
through SQLAlchemy's asyncio layer (aiosqlite, asyncpg); Alembic migrations run
through the matching synchronous drivers (sqlite3, psycopg).
"""

from __future__ import annotations

import os
from collections.abc import AsyncIterator
from contextlib import asynccontextmanager, suppress
from datetime import UTC, datetime
from typing import Any

from sqlalchemy import DateTime, MetaData, event
from sqlalchemy import create_engine as sa_create_engine
from sqlalchemy.engine import Dialect, Engine, make_url
from sqlalchemy.ext.asyncio import AsyncEngine, AsyncSession, async_sessionmaker, create_async_engine
from sqlalchemy.orm import DeclarativeBase
from sqlalchemy.types import TypeDecorator

from kvgate import REPO_ROOT
from kvgate.db_settings import DatabaseSettings

# Stable constraint names make migrations reproducible across SQLite and PostgreSQL.
NAMING_CONVENTION = {
    "ix": "ix_%(column_0_label)s",
    "uq": "uq_%(table_name)s_%(column_0_name)s",
    "ck": "ck_%(table_name)s_%(constraint_name)s",
    "fk": "fk_%(table_name)s_%(column_0_name)s_%(referred_table_name)s",
    "pk": "pk_%(table_name)s",
}


class Base(DeclarativeBase):
    metadata = MetaData(naming_convention=NAMING_CONVENTION)


class UTCDateTime(TypeDecorator[datetime]):
    """A timezone-aware UTC timestamp on every backend (SQLite drops the offset otherwise)."""

    impl = DateTime(timezone=True)
    cache_ok = True

    def process_bind_param(self, value: datetime | None, dialect: Dialect) -> datetime | None:
        if value is None:
            return None
        if value.tzinfo is None:
            raise ValueError("naive datetimes are ambiguous; pass an aware UTC datetime")
        return value.astimezone(UTC)

    def process_result_value(self, value: datetime | None, dialect: Dialect) -> datetime | None:
        if value is None:
            return None
        return value.replace(tzinfo=UTC) if value.tzinfo is None else value.astimezone(UTC)


def utcnow() -> datetime:
    return datetime.now(UTC)


_ASYNC_DRIVERS = {"sqlite": "sqlite+aiosqlite", "postgresql": "postgresql+asyncpg"}
_SYNC_DRIVERS = {"sqlite": "sqlite", "postgresql": "postgresql+psycopg"}


def _with_driver(url: str, drivers: dict[str, str]) -> str:
    parsed = make_url(url)
    backend = parsed.get_backend_name()
    if backend not in drivers:
        raise ValueError(f"unsupported database {backend!r}: use sqlite or postgresql")
    return parsed.set(drivername=drivers[backend]).render_as_string(hide_password=False)


def async_url(url: str) -> str:
    """The URL with the asyncio driver, whatever driver the user wrote."""
    return _with_driver(url, _ASYNC_DRIVERS)


def sync_url(url: str) -> str:
    """The URL with the synchronous driver Alembic uses."""
    return _with_driver(url, _SYNC_DRIVERS)


def _sqlite_pragmas(busy_timeout_ms: int) -> Any:
    def apply(dbapi_connection: Any, _record: Any) -> None:
        # WAL lets readers proceed during a write; busy_timeout turns lock contention
        # between pooled connections into a short wait instead of "database is locked".
        cursor = dbapi_connection.cursor()
        cursor.execute("PRAGMA journal_mode=WAL")
        cursor.execute(f"PRAGMA busy_timeout={busy_timeout_ms}")
        cursor.execute("PRAGMA synchronous=NORMAL")
        cursor.execute("PRAGMA foreign_keys=ON")
        cursor.close()

    return apply


def ensure_private_sqlite_file(url: str) -> None:
    """Create a SQLite database file readable by its owner only (0600), if it does not exist yet.

    SQLite gives the -wal and -shm files it creates beside it the database file's mode.
    """
    parsed = make_url(url)
    if parsed.get_backend_name() != "sqlite" or not parsed.database or parsed.database == ":memory:":
        return
    if parsed.database.startswith("file:") or parsed.query.get("mode") == "memory":
        return
    path = os.path.abspath(parsed.database)
    if os.path.exists(path) or not os.path.isdir(os.path.dirname(path)):
        return  # a missing directory stays SQLite's error to report
    with suppress(FileExistsError):
        os.close(os.open(path, os.O_WRONLY | os.O_CREAT | os.O_EXCL, 0o600))


def _is_memory(url: Any) -> bool:
    return url.get_backend_name() == "sqlite" and (not url.database or url.database == ":memory:")


def create_engine(url: str, *, timeouts: DatabaseSettings | None = None, **kwargs: Any) -> AsyncEngine:
    """An asyncio engine (aiosqlite, asyncpg) whose connects and statements time out (KVGATE_DB_*)."""
    timeouts = timeouts or DatabaseSettings()
    parsed = make_url(async_url(url))
    connect_args: dict[str, Any] = dict(kwargs.pop("connect_args", {}))
    if parsed.get_backend_name() == "postgresql":
        connect_args.setdefault("timeout", timeouts.connect_timeout_s)
        # Client-side: the only timeout that works when the server (or the path to it) stops answering.
        # Half a second later than the server's own, so a server that is merely slow cancels the
        # statement itself and the connection stays usable.
        connect_args.setdefault("command_timeout", timeouts.statement_timeout_s + 0.5)
        server_settings = dict(connect_args.get("server_settings", {}))
        server_settings.setdefault("statement_timeout", str(round(timeouts.statement_timeout_s * 1000)))
        connect_args["server_settings"] = server_settings
    else:
        connect_args.setdefault("timeout", timeouts.statement_timeout_s)
    if not _is_memory(parsed) and "poolclass" not in kwargs:
        kwargs.setdefault("pool_timeout", timeouts.pool_timeout_s)
    ensure_private_sqlite_file(url)
    engine = create_async_engine(parsed.render_as_string(hide_password=False), connect_args=connect_args, **kwargs)
    if engine.dialect.name == "sqlite":
        event.listen(engine.sync_engine, "connect", _sqlite_pragmas(round(timeouts.statement_timeout_s * 1000)))
    return engine


def create_sync_engine(url: str, *, timeouts: DatabaseSettings | None = None, **kwargs: Any) -> Engine:
    """A synchronous engine (sqlite3, psycopg) for work done in a thread (batch writers), with the same
    timeouts. psycopg has no client-side statement timeout: callers bound their wait on the thread."""
    timeouts = timeouts or DatabaseSettings()
    parsed = make_url(sync_url(url))
    connect_args: dict[str, Any] = dict(kwargs.pop("connect_args", {}))
    if parsed.get_backend_name() == "postgresql":
        connect_args.setdefault("connect_timeout", max(1, round(timeouts.connect_timeout_s)))
        options = f"-c statement_timeout={round(timeouts.statement_timeout_s * 1000)}"
        connect_args["options"] = f"{connect_args['options']} {options}" if "options" in connect_args else options
    else:
        connect_args.setdefault("timeout", timeouts.statement_timeout_s)
    if not _is_memory(parsed) and "poolclass" not in kwargs:
        kwargs.setdefault("pool_timeout", timeouts.pool_timeout_s)
    ensure_private_sqlite_file(url)
    engine = sa_create_engine(parsed.render_as_string(hide_password=False), connect_args=connect_args, **kwargs)
    if engine.dialect.name == "sqlite":
        event.listen(engine, "connect", _sqlite_pragmas(round(timeouts.statement_timeout_s * 1000)))
    return engine


def session_factory(engine: AsyncEngine) -> async_sessionmaker[AsyncSession]:
    return async_sessionmaker(engine, expire_on_commit=False)


@asynccontextmanager
async def open_database(url: str) -> AsyncIterator[async_sessionmaker[AsyncSession]]:
    """A session factory on a fresh engine, disposed on exit (for the CLI and scripts)."""
    engine = create_engine(url)
    try:
        yield session_factory(engine)
    finally:
        await engine.dispose()


def alembic_config(url: str) -> Any:
    from alembic.config import Config

    config = Config(str(REPO_ROOT / "alembic.ini"))
    config.set_main_option("script_location", str(REPO_ROOT / "migrations"))
    # ConfigParser interpolation would choke on a literal % in a password.
    config.set_main_option("sqlalchemy.url", sync_url(url).replace("%", "%%"))
    return config


def migrate(url: str, revision: str = "head") -> None:
    """Bring the database at `url` to `revision` (creating a SQLite file if needed)."""
    from alembic import command

    ensure_private_sqlite_file(url)
    command.upgrade(alembic_config(url), revision)


def dialect_insert(dialect_name: str) -> Any:
    """The INSERT construct with ON CONFLICT support for this backend."""
    if dialect_name == "postgresql":
        from sqlalchemy.dialects.postgresql import insert
    else:
        from sqlalchemy.dialects.sqlite import insert
    return insert


async def insert_ignore(
    session: AsyncSession, model: type[Base], values: dict[str, Any], conflict_columns: list[str]
) -> bool:
    """INSERT ... ON CONFLICT DO NOTHING on SQLite and PostgreSQL; True if a row was inserted."""
    insert = dialect_insert(session.bind.dialect.name if session.bind is not None else "sqlite")
    statement = insert(model).values(**values).on_conflict_do_nothing(index_elements=conflict_columns)
    result = await session.execute(statement)
    return bool(result.rowcount)  # type: ignore[attr-defined]
