"""What a durable trace of one admission costs: the in-flight journal against a database row per request.

Used by bench/gateway.py (--journal-only runs just this and the on/off comparison). Each
measurement is sequential (one admission at a time, the worst case for group commit),
then with 32 admissions arriving together.

- journal: `InflightJournal.begin` (a hop to the journal's thread, pwrite, fdatasync) and `end`.
- database row, the alternative: INSERT a row and COMMIT at admission, DELETE it and COMMIT
  when the request is recorded, through the plain synchronous drivers (a lower bound: the
  gateway would go through SQLAlchemy's asyncio drivers). SQLite in WAL mode with
  synchronous=NORMAL (the gateway's setting, which does not sync a commit: durable against a
  process crash, not a power cut) and with synchronous=FULL (durable like the journal), and
  PostgreSQL on this machine (synchronous_commit on).
"""

from __future__ import annotations

import asyncio
import sqlite3
import statistics
import time
from collections.abc import Callable
from datetime import UTC, datetime
from pathlib import Path
from typing import Any

from gateway.inflight import InflightEntry, InflightJournal


def _entry(i: int) -> InflightEntry:
    return InflightEntry(
        request_id=f"req_{i:024x}",
        tenant_id="ten_0123456789abcdef",
        api_key_id="key_0123456789abcdef",
        model="SmolLM2-135M-Instruct",
        endpoint="messages",
        started_at=datetime.now(UTC),
        prompt_tokens=220,
    )


def _ms(values: list[float]) -> dict[str, float]:
    ordered = sorted(v * 1000 for v in values)
    return {
        "p50": ordered[len(ordered) // 2],
        "p99": ordered[min(len(ordered) - 1, round(0.99 * (len(ordered) - 1)))],
        "mean": statistics.fmean(ordered),
    }


async def _journal(directory: Path, n: int, concurrency: int) -> tuple[dict[str, float], float]:
    """Begin latency, and begins per fdatasync."""
    journal = InflightJournal.open(directory)
    timings: list[float] = []

    async def one(i: int) -> None:
        started = time.perf_counter()
        await journal.begin(_entry(i))
        timings.append(time.perf_counter() - started)
        journal.end(_entry(i).request_id)

    try:
        for start in range(0, n, concurrency):
            await asyncio.gather(*(one(i) for i in range(start, min(n, start + concurrency))))
        syncs = journal.syncs
    finally:
        await journal.aclose()
    return _ms(timings), n / max(1, syncs)


def journal_costs(workdir: Path, n: int) -> dict[str, Any]:
    sequential, _ = asyncio.run(_journal(workdir / "seq", n, 1))
    together, per_sync = asyncio.run(_journal(workdir / "c32", n, 32))
    return {"sequential": sequential, "concurrent": together, "begins_per_sync": per_sync}


def _row_timings(execute: Callable[[str, tuple[Any, ...]], None], commit: Callable[[], None], n: int) -> dict[str, Any]:
    begin: list[float] = []
    both: list[float] = []
    for i in range(n):
        started = time.perf_counter()
        execute("INSERT INTO inflight (request_id, body) VALUES ({p}, {p})", (f"req_{i}", "x" * 200))
        commit()
        admitted = time.perf_counter()
        execute("DELETE FROM inflight WHERE request_id = {p}", (f"req_{i}",))
        commit()
        begin.append(admitted - started)
        both.append(time.perf_counter() - started)
    return {"admission": _ms(begin), "request": _ms(both)}


def sqlite_row_costs(workdir: Path, n: int, synchronous: str) -> dict[str, Any]:
    conn = sqlite3.connect(workdir / f"rows-{synchronous}.db", isolation_level=None)
    conn.execute("PRAGMA journal_mode=WAL")
    conn.execute(f"PRAGMA synchronous={synchronous}")
    conn.execute("CREATE TABLE inflight (request_id TEXT PRIMARY KEY, body TEXT)")

    def execute(sql: str, args: tuple[Any, ...]) -> None:
        if not conn.in_transaction:
            conn.execute("BEGIN")
        conn.execute(sql.format(p="?"), args)

    try:
        return _row_timings(execute, lambda: conn.execute("COMMIT"), n)
    finally:
        conn.close()


def postgres_row_costs(n: int) -> dict[str, Any] | None:
    """None when no PostgreSQL answers at 127.0.0.1:5432."""
    from tests.gateway.harness import pg_reachable, postgres_database

    if not pg_reachable():
        return None
    import psycopg

    with postgres_database(prefix="kvgate_bench") as url, psycopg.connect(url) as conn:
        conn.execute("CREATE TABLE inflight (request_id TEXT PRIMARY KEY, body TEXT)")
        conn.commit()
        return _row_timings(lambda sql, args: conn.execute(sql.format(p="%s"), args), conn.commit, n)


def table(workdir: Path, n: int = 300) -> list[str]:
    """The section's micro-benchmark table (Markdown lines)."""
    journal = journal_costs(workdir, n)
    rows = [
        "| durable trace of one admission | p50 ms | p99 ms |",
        "|---|---:|---:|",
        _row("**journal** `begin` (group commit), one admission at a time", journal["sequential"]),
        _row(
            f"**journal** `begin`, 32 admissions together ({journal['begins_per_sync']:.0f} begins per fdatasync)",
            journal["concurrent"],
        ),
    ]
    for label, costs in (
        ("SQLite row, WAL + synchronous=NORMAL (no sync per commit)", sqlite_row_costs(workdir, n, "NORMAL")),
        ("SQLite row, WAL + synchronous=FULL (synced like the journal)", sqlite_row_costs(workdir, n, "FULL")),
        ("PostgreSQL row (local, synchronous_commit on)", postgres_row_costs(n)),
    ):
        if costs is None:
            continue
        rows.append(_row(f"{label}: INSERT + COMMIT", costs["admission"]))
        rows.append(_row(f"{label}: INSERT + COMMIT, then DELETE + COMMIT", costs["request"]))
    return rows


def _row(label: str, values: dict[str, float]) -> str:
    return f"| {label} | {values['p50']:.3f} | {values['p99']:.3f} |"
