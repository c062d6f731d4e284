"""Checks a server runs before it loads its model: is the port free, is the database there.

Each failure is a StartupError whose message is one line saying the cause and the fix; the
commands print it and exit non-zero, without a traceback.
"""

from __future__ import annotations

import errno
import socket
import sys
import time
from collections.abc import Callable

import structlog

log = structlog.get_logger("kvgate.preflight")

# Backoff between database attempts under --wait-for-db: doubling from the first to the cap.
FIRST_RETRY_S = 0.5
MAX_RETRY_S = 5.0


class StartupError(Exception):
    """A start-up check failed; str() is one line with the cause and the fix."""


def report_failure(message: str) -> int:
    """A failed start in one line on stderr: plain on a terminal, one JSON `startup_failed` event otherwise
    (stderr is then the log stream). Returns the exit status, 1."""
    if sys.stderr.isatty():
        print(f"kvgate: error: {message}", file=sys.stderr, flush=True)
    else:
        log.error("startup_failed", error=message)
    return 1


def check_port(host: str, port: int, *, port_setting: str = "--port or KVGATE_PORT") -> None:
    """Bind host:port the way uvicorn will (SO_REUSEADDR), then let go; StartupError if it cannot."""
    family = socket.AF_INET6 if ":" in host else socket.AF_INET
    sock = socket.socket(family, socket.SOCK_STREAM)
    try:
        sock.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEADDR, 1)
        sock.bind((host, port))
    except OSError as exc:
        raise StartupError(_bind_failure(host, port, exc, port_setting)) from None
    finally:
        sock.close()


def _bind_failure(host: str, port: int, exc: OSError, port_setting: str) -> str:
    where = f"{host}:{port}"
    if exc.errno == errno.EADDRINUSE:
        return (
            f"port {port} is already in use on {host} (another kvgate?): "
            f"stop that process or pick another port with {port_setting}"
        )
    if exc.errno == errno.EACCES:
        return (
            f"not allowed to listen on {where} (ports below 1024 need privileges): "
            f"pick another port with {port_setting}"
        )
    if exc.errno == errno.EADDRNOTAVAIL or isinstance(exc, socket.gaierror):
        return (
            f"cannot listen on {where}: {host!r} is not an address of this machine; "
            "pass --host (or KVGATE_HOST), e.g. 127.0.0.1 or 0.0.0.0"
        )
    return f"cannot listen on {where}: {exc.strerror or exc}; pick another address with --host/--port"


def describe_url(url: str) -> str:
    """The URL with its password hidden; for something that is not a URL, only what looks like its scheme."""
    from sqlalchemy.engine import make_url
    from sqlalchemy.exc import ArgumentError

    try:
        return make_url(url).render_as_string(hide_password=True)
    except ArgumentError:
        return url.split("://", 1)[0] + "://..." if "://" in url else "(not a URL)"


def check_database_url(url: str) -> None:
    """A URL kvgate can use: sqlite:///... or postgresql://...; StartupError otherwise."""
    from sqlalchemy.exc import ArgumentError

    from kvgate.db import sync_url

    fix = "set KVGATE_DATABASE_URL to sqlite:///path/to/kvgate.db or postgresql://user@host:5432/dbname"
    try:
        sync_url(url)
    except ArgumentError:
        raise StartupError(f"KVGATE_DATABASE_URL {describe_url(url)} is not a database URL: {fix}") from None
    except ValueError as exc:
        raise StartupError(f"KVGATE_DATABASE_URL {describe_url(url)}: {exc}; {fix}") from None


def reach_database(url: str) -> None:
    """Open a connection and run SELECT 1; the driver's error if that fails."""
    import sqlalchemy as sa

    from kvgate.db import create_sync_engine

    engine = create_sync_engine(url, poolclass=sa.pool.NullPool)
    try:
        with engine.connect() as conn:
            conn.execute(sa.text("SELECT 1"))
    finally:
        engine.dispose()


def one_line(exc: BaseException) -> str:
    """A driver's error message, which may span lines (psycopg's hints), as one line."""
    orig = getattr(exc, "orig", None) or exc
    return " ".join(str(orig).split()) or type(orig).__name__


def check_database(
    url: str,
    *,
    wait_s: float = 0.0,
    reach: Callable[[str], None] = reach_database,
    sleep: Callable[[float], None] = time.sleep,
) -> None:
    """The database URL is valid and the database answers; with wait_s > 0, retry with backoff until then.

    Each retry is logged once (`database_unreachable`); past the wait, StartupError.
    """
    check_database_url(url)
    deadline = time.monotonic() + wait_s
    delay = FIRST_RETRY_S
    attempt = 0
    while True:
        attempt += 1
        try:
            reach(url)
            if attempt > 1:
                log.info("database_reachable", url=describe_url(url), attempts=attempt)
            return
        except Exception as exc:  # every driver error becomes the one line
            cause = one_line(exc)
        left = deadline - time.monotonic()
        if left <= 0:
            break
        pause = min(delay, left)
        log.warning(
            "database_unreachable", url=describe_url(url), attempt=attempt, retry_in_s=round(pause, 1), error=cause
        )
        sleep(pause)
        delay = min(delay * 2, MAX_RETRY_S)
    waited = f" (waited {wait_s:g} s)" if wait_s > 0 else ""
    if url.startswith("sqlite"):
        fix = "check that its directory exists and is writable, or point KVGATE_DATABASE_URL elsewhere"
    else:
        fix = "start it or fix KVGATE_DATABASE_URL" + ("" if wait_s > 0 else " (--wait-for-db SECONDS waits for it)")
    raise StartupError(f"cannot reach the database {describe_url(url)}{waited}: {cause}; {fix}")
