"""How a `kvgate` command opens the database: `run_on_database(action, write=...)`.

- With `kvgate -v ...`, every command says on stderr which database it opened (password masked).
- A command that writes migrates the database first, creating a SQLite file if there is none.
- A command that only reads (`write=False`) never creates one: when the SQLite file is missing it
  stops with one line saying where it looked and how to point kvgate elsewhere (KVGATE_DATABASE_URL,
  in the environment or in .env), exit 1. An existing database is still migrated, so a read works
  after an upgrade.
"""

from __future__ import annotations

import asyncio
import sys
from collections.abc import Awaitable, Callable
from pathlib import Path
from typing import TypeVar

from sqlalchemy.engine import make_url
from sqlalchemy.ext.asyncio import AsyncSession, async_sessionmaker

from kvgate.db import migrate, open_database
from kvgate.errors import KvgateError
from kvgate.settings import KvgateSettings

T = TypeVar("T")
Sessions = async_sessionmaker[AsyncSession]


class DatabaseMissingError(KvgateError):
    """A read-only command found no database where the settings point."""


class _State:
    verbose = False


def set_verbose(verbose: bool) -> None:
    """Set by the root's `-v/--verbose`, for every command of this invocation."""
    _State.verbose = verbose


def is_verbose() -> bool:
    return _State.verbose


def masked_url(url: str) -> str:
    """The URL as it may be shown: the password, if any, replaced by ***."""
    try:
        return make_url(url).render_as_string(hide_password=True)
    except Exception:  # a URL SQLAlchemy cannot parse has no password it could find either
        return url


def sqlite_path(url: str) -> Path | None:
    """The file a SQLite URL names (absolute), or None for another database or an in-memory one."""
    parsed = make_url(url)
    database = parsed.database
    if parsed.get_backend_name() != "sqlite" or not database or database == ":memory:":
        return None
    if database.startswith("file:") or parsed.query.get("mode") == "memory":
        return None
    return Path(database).expanduser().absolute()


def database_url(*, write: bool) -> str:
    """The configured database URL (KVGATE_DATABASE_URL, .env, or the default), checked for a read."""
    url = KvgateSettings().database_url
    path = sqlite_path(url)
    if not write and path is not None and not path.exists():
        raise DatabaseMissingError(
            f"no database at {path} (KVGATE_DATABASE_URL={masked_url(url)}); run kvgate where it is, or set "
            "KVGATE_DATABASE_URL in the environment or in .env"
        )
    if is_verbose():
        print(f"kvgate: database {masked_url(url)}" + (f" ({path})" if path else ""), file=sys.stderr)
    return url


def run_on_database(action: Callable[[Sessions], Awaitable[T]], *, write: bool) -> T:
    """Open the database (see the module's docstring) and run `action(sessions)` to completion."""
    url = database_url(write=write)
    migrate(url)

    async def run() -> T:
        async with open_database(url) as sessions:
            return await action(sessions)

    return asyncio.run(run())
