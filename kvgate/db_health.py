"""Whether the database is there: one shared view per database engine.

Everything on the request path that touches the database (authentication, budget
admission, usage records, settlement, the admin API) reports here. While the database
is away:

- exactly one line is logged when it goes (`database_unavailable`) and one when it is
  back (`database_available`), instead of a traceback per request;
- callers skip it and take their outage path at once (the last-known-good auth cache,
  in-memory budgets, the spool), except for one probe per `retry_interval_s`, so a
  stalled database costs one request a timeout, not every request;
- when it is back, recovery hooks drop the connections pooled before (they may have died
  with it, and the first request to use one would report a new outage).
"""

from __future__ import annotations

import errno
import socket
import threading
import time
import weakref
from collections.abc import Callable
from typing import Any

import structlog
from sqlalchemy import exc as sa_exc

log = structlog.get_logger("kvgate.database")

# Socket errors that mean the server cannot be reached, as opposed to a local file problem.
_NETWORK_ERRNOS = frozenset(
    {
        errno.ECONNREFUSED,
        errno.ECONNRESET,
        errno.ECONNABORTED,
        errno.ETIMEDOUT,
        errno.EHOSTUNREACH,
        errno.EHOSTDOWN,
        errno.ENETUNREACH,
        errno.ENETDOWN,
        errno.EPIPE,
    }
)


# PostgreSQL SQLSTATE classes meaning "not now" rather than "not this": connection exceptions,
# insufficient resources (too many connections, disk full) and operator intervention (a
# statement_timeout cancel, a shutdown, a server still starting).
_TRANSIENT_SQLSTATE_CLASSES = frozenset({"08", "53", "57"})


def _sqlstate(error: sa_exc.DBAPIError) -> str | None:
    orig = error.orig
    driver = getattr(orig, "driver_exception", None)  # asyncpg, as SQLAlchemy adapts it
    code = getattr(orig, "sqlstate", None) or getattr(driver, "sqlstate", None)
    return code if isinstance(code, str) else None


# PostgreSQL SQLSTATEs of a transaction that lost to a concurrent one: deadlock_detected and
# serialization_failure. The server rolled it back; the same transaction run again can succeed.
TRANSACTION_CONFLICT_SQLSTATES = frozenset({"40P01", "40001"})


def is_transaction_conflict(error: BaseException) -> bool:
    """A deadlock or serialization failure (PostgreSQL), or SQLite's write lock still taken when its
    busy timeout ran out: the transaction lost a race, the database is there. Retry it."""
    if not isinstance(error, sa_exc.DBAPIError):
        return False
    if _sqlstate(error) in TRANSACTION_CONFLICT_SQLSTATES:
        return True
    message = str(error.orig).lower()
    return isinstance(error, sa_exc.OperationalError) and (
        "database is locked" in message or "database table is locked" in message
    )


def is_database_unavailable(error: BaseException) -> bool:
    """Errors that mean 'the database is not there right now' (retry later), not 'this statement is wrong'."""
    if isinstance(error, sa_exc.DBAPIError):
        if error.connection_invalidated:
            return True
        code = _sqlstate(error)
        if code is not None and code[:2] in _TRANSIENT_SQLSTATE_CLASSES:
            return True
    if isinstance(
        error,
        sa_exc.OperationalError | sa_exc.InterfaceError | sa_exc.DisconnectionError | sa_exc.TimeoutError,
    ):
        return True
    # Raised unwrapped by asyncpg: connect failures and its client-side timeouts.
    if isinstance(error, TimeoutError | ConnectionError | socket.gaierror):
        return True
    return isinstance(error, OSError) and error.errno in _NETWORK_ERRNOS


class DatabaseHealth:
    """The database's state as the last call found it, with a pause between probes while it is down."""

    def __init__(self, *, retry_interval_s: float = 1.0, clock: Callable[[], float] = time.monotonic) -> None:
        self.retry_interval_s = retry_interval_s
        self._clock = clock
        self._lock = threading.Lock()
        self._available = True
        self._down_since = 0.0
        self._next_probe = 0.0
        self._recovery_hooks: list[Callable[[], None]] = []
        self.outages = 0

    def add_recovery_hook(self, hook: Callable[[], None]) -> None:
        """Run `hook` whenever the database is found again (e.g. to drop pooled connections that died)."""
        self._recovery_hooks.append(hook)

    def clear_recovery_hooks(self) -> None:
        # Hooks usually hold the engine this health is registered under: drop them at shutdown.
        self._recovery_hooks.clear()

    @property
    def available(self) -> bool:
        return self._available

    def should_try(self) -> bool:
        """True while the database is up; while it is down, True once per retry interval (a probe)."""
        if self._available:
            return True
        with self._lock:
            now = self._clock()
            if now < self._next_probe:
                return False
            self._next_probe = now + self.retry_interval_s
            return True

    def succeeded(self) -> None:
        if self._available:
            return
        with self._lock:
            if self._available:
                return
            self._available = True
            outage_s = round(self._clock() - self._down_since, 3)
        log.warning("database_available", outage_s=outage_s)
        for hook in self._recovery_hooks:
            hook()

    def failed(self, error: BaseException) -> None:
        if not self._available:
            return
        with self._lock:
            if not self._available:
                return
            self._available = False
            self._down_since = self._clock()
            self._next_probe = self._down_since + self.retry_interval_s
            self.outages += 1
        log.warning("database_unavailable", error=_describe(error))

    def observe(self, error: BaseException) -> bool:
        """Note the error if it means the database is away; True if it does."""
        if is_database_unavailable(error):
            self.failed(error)
            return True
        return False


def _describe(error: BaseException) -> str:
    text = str(error).strip().splitlines()
    first = text[0] if text else ""
    return f"{type(error).__name__}: {first}"[:300] if first else type(error).__name__


_REGISTRY: weakref.WeakKeyDictionary[Any, DatabaseHealth] = weakref.WeakKeyDictionary()
_REGISTRY_LOCK = threading.Lock()


def health_of(target: Any) -> DatabaseHealth:
    """The shared DatabaseHealth of an engine, or of the engine a session factory is bound to.

    The gateway and billing hold the same session factory, so they share one view (and
    one log line per change). Anything else (a stand-in callable in tests) gets its own.
    """
    bind = getattr(target, "kw", {}).get("bind", target) if hasattr(target, "kw") else target
    key = getattr(bind, "sync_engine", bind)
    try:
        with _REGISTRY_LOCK:
            health = _REGISTRY.get(key)
            if health is None:
                health = _REGISTRY[key] = DatabaseHealth()
            return health
    except TypeError:  # not weakly referenceable
        return DatabaseHealth()
