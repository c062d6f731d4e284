"""Dashboard queries over a month of 1,000,000 requests: the hourly rollups against the raw ledger.

Run: .venv/bin/python bench/dashboard_queries.py [--requests 1000000] [--backends sqlite,postgres] [--write-docs]

For each backend, a fresh database migrated to head gets one tenant's month of ledger entries (five keys,
three models, both APIs, a few errors and cancellations, a day/night rhythm, cache reads on most requests),
bulk-loaded (sqlite3 executemany in batches; PostgreSQL COPY). The rollups are then built with one
INSERT ... SELECT ... GROUP BY, the same sums billing.usage_rollups.add_entry keeps entry by entry (and
the migration's backfill computes), and every timed query is checked to give the same answer from both.
Each query is billing.usage_buckets' own, once against the rollups and once with from_ledger=True (the
same GROUP BY over ledger_entries), through the async engine the server uses; the median of 5 runs after
one warm-up.

Then the pages themselves: the real app (kvgate.app.create_app, billing's own hooks, the instant engine
stand-in) serves the same database from uvicorn in a subprocess on 127.0.0.1, and an admin member of the
tenant (a web_sessions row and its kvgate_session cookie) GETs the Overview, Usage (by model, by key),
its CSV, Cache, Requests and Keys pages over the month: the median of 5 full HTTP GETs after a warm-up,
each response checked for status 200 and the month's content (day rows, totals).

The month is the current one, so the Overview's month to date (the real clock) covers the generated
requests. Prints two tables, and with --write-docs rewrites the "Dashboard queries" section of
docs/benchmarks.md. Not a test: nothing here asserts beyond the answers agreeing and the pages' checks.
"""

from __future__ import annotations

import argparse
import asyncio
import csv
import io
import os
import platform
import random
import re
import secrets
import sqlite3
import statistics
import subprocess
import sys
import tempfile
import time
import uuid
from collections.abc import Awaitable, Callable, Iterator
from datetime import UTC, datetime, timedelta
from pathlib import Path
from typing import Any

sys.path.insert(0, str(Path(__file__).resolve().parent.parent))

import httpx
import sqlalchemy as sa

from bench.report import machine_description, write_section
from billing import catalog
from billing.periods import month_bounds, month_start
from billing.prices import load_price_file
from billing.usage_buckets import usage_breakdown, usage_buckets, usage_totals
from billing.usage_rollups import ROLLUP_SUMS
from gateway.security import hash_secret
from kvgate.db import create_engine, migrate, session_factory, sync_url
from kvgate.tenancy import Member
from web.deps import SESSION_COOKIE
from web.models import WebSession

REPO = Path(__file__).resolve().parent.parent
# The current month, so the Overview (month to date, by the real clock) shows the generated requests.
MONTH, MONTH_END = month_bounds(month_start(datetime.now(UTC)))
DAYS = (MONTH_END - MONTH).days
TENANT = "ten_bench_dashboard"
KEYS = [(f"key_bench_{i}", weight) for i, weight in enumerate((50, 25, 12, 8, 5))]
MODELS = [("HuggingFaceTB/SmolLM2-135M-Instruct", 70), ("m-large", 20), ("m-small", 10)]
STATUSES = [("ok", 970), ("error", 20), ("cancelled", 10)]
# Requests per hour of the day, relative: busy office hours, quiet nights.
HOURLY = [2, 1, 1, 1, 1, 2, 4, 7, 10, 12, 12, 11, 10, 11, 12, 12, 11, 9, 7, 6, 5, 4, 3, 2]
COLUMNS = [
    "request_id",
    "kind",
    "tenant_id",
    "api_key_id",
    "model",
    "endpoint",
    "status",
    "started_at",
    "recorded_at",
    "billing_month",
    "price_version_id",
    "input_tokens",
    "cache_write_5m_tokens",
    "cache_write_1h_tokens",
    "cache_write_24h_tokens",
    "cache_read_tokens",
    "output_tokens",
    "cost_pico",
    "uncached_cost_pico",
    "ttft_ms",
    "latency_ms",
    "source",
    "reason",
]
PG_BASE = os.environ.get("KVGATE_BENCH_PG", "postgresql://postgres@127.0.0.1:5432")


def rows(n: int, rates: dict[str, dict[str, int]], version_ids: dict[str, int], seed: int = 11) -> Iterator[tuple]:
    """n ledger entries (tuples in COLUMNS order; timestamps as text) spread over the month."""
    rng = random.Random(seed)
    keys = rng.choices([k for k, _ in KEYS], [w for _, w in KEYS], k=n)
    models = rng.choices([m for m, _ in MODELS], [w for _, w in MODELS], k=n)
    statuses = rng.choices([s for s, _ in STATUSES], [w for _, w in STATUSES], k=n)
    hours = rng.choices(range(24), HOURLY, k=n)
    billing_month = MONTH.date().isoformat()
    for i in range(n):
        started = MONTH + timedelta(days=rng.randrange(DAYS), hours=hours[i], seconds=rng.random() * 3600)
        stamp = started.strftime("%Y-%m-%d %H:%M:%S.%f")
        model = models[i]
        read = rng.randrange(2_000, 30_000) if rng.random() < 0.73 else 0
        write_5m = rng.randrange(500, 4_000) if rng.random() < 0.25 else 0
        write_1h = rng.randrange(500, 4_000) if rng.random() < 0.08 else 0
        uncached = rng.randrange(20, 2_000)
        output = rng.randrange(10, 800)
        r = rates[model]
        cost = (
            uncached * r["input"]
            + write_5m * r["cache_write_5m"]
            + write_1h * r["cache_write_1h"]
            + read * r["cache_read"]
            + output * r["output"]
        )
        full = (uncached + write_5m + write_1h + read) * r["input"] + output * r["output"]
        yield (
            f"req_bench_{i:08d}",
            "usage",
            TENANT,
            keys[i],
            model,
            "messages" if i % 5 < 3 else "chat.completions",
            statuses[i],
            stamp,
            stamp,
            billing_month,
            version_ids[model],
            uncached,
            write_5m,
            write_1h,
            0,
            read,
            output,
            cost,
            full,
            rng.randrange(30, 400),
            rng.randrange(200, 6_000),
            "live",
            None,
        )


async def prepare(url: str) -> tuple[dict[str, dict[str, int]], dict[str, int]]:
    """The tenant, its keys and the prices: the rows every ledger entry refers to."""
    engine = create_engine(url)
    try:
        async with session_factory(engine)() as session:
            await catalog.seed_prices(session=session, specs=load_price_file(), source="bench")
            await session.commit()
            book = await catalog.load_pricebook(session=session)
            now = datetime.now(UTC)
            await session.execute(
                sa.text("INSERT INTO tenants (id, name, status, created_at) VALUES (:t, 'Bench', 'active', :c)"),
                {"t": TENANT, "c": now},
            )
            for key, _ in KEYS:
                await session.execute(
                    sa.text(
                        "INSERT INTO api_keys (id, tenant_id, name, key_hash, prefix, created_at)"
                        " VALUES (:k, :t, :k, :h, 'kvg-bench', :c)"
                    ),
                    {"k": key, "t": TENANT, "h": uuid.uuid4().hex * 2, "c": now},
                )
            await session.commit()
    finally:
        await engine.dispose()
    rates, ids = {}, {}
    for model, _ in MODELS:
        version = book.price_for(model, MONTH)
        rates[model] = {name: getattr(version.rates, name) or 0 for name in version.rates.__dataclass_fields__}
        ids[model] = version.id
    return rates, ids


def load_sqlite(path: str, entries: Iterator[tuple], batch: int = 20_000) -> None:
    conn = sqlite3.connect(path)
    try:
        conn.execute("PRAGMA journal_mode=WAL")
        conn.execute("PRAGMA synchronous=NORMAL")
        marks = ", ".join("?" * len(COLUMNS))
        statement = f"INSERT INTO ledger_entries ({', '.join(COLUMNS)}) VALUES ({marks})"
        chunk: list[tuple] = []
        for entry in entries:
            chunk.append(entry)
            if len(chunk) == batch:
                conn.executemany(statement, chunk)
                chunk.clear()
        conn.executemany(statement, chunk)
        conn.commit()
    finally:
        conn.close()


def load_postgres(url: str, entries: Iterator[tuple]) -> None:
    import psycopg

    with psycopg.connect(sync_url(url).replace("postgresql+psycopg", "postgresql")) as conn:
        with conn.cursor() as cursor, cursor.copy(f"COPY ledger_entries ({', '.join(COLUMNS)}) FROM STDIN") as copy:
            for entry in entries:
                # The text timestamps are UTC: say so, or PostgreSQL reads them in the session's zone.
                copy.write_row((*entry[:7], entry[7] + "+00", entry[8] + "+00", *entry[9:]))
        conn.commit()


def build_rollups(url: str) -> int:
    """The rollups of the whole ledger in one statement: usage_rollups.add_entry's sums, grouped."""
    engine = sa.create_engine(sync_url(url))
    try:
        hour = (
            "date_trunc('hour', started_at AT TIME ZONE 'UTC') AT TIME ZONE 'UTC'"
            if engine.dialect.name == "postgresql"
            else "substr(started_at, 1, 13) || ':00:00.000000'"
        )
        sums = ROLLUP_SUMS
        with engine.begin() as conn:
            conn.execute(
                sa.text(
                    f"INSERT INTO usage_rollups (tenant_id, hour, api_key_id, model, endpoint, status, requests,"
                    f" {', '.join(sums)}) SELECT tenant_id, {hour}, COALESCE(api_key_id, ''), model, endpoint,"
                    f" status, SUM(CASE WHEN kind = 'usage' THEN 1 ELSE 0 END), {', '.join(f'SUM({s})' for s in sums)}"
                    f" FROM ledger_entries GROUP BY tenant_id, {hour}, COALESCE(api_key_id, ''), model, endpoint,"
                    " status"
                )
            )
            conn.execute(sa.text("ANALYZE"))
            return conn.execute(sa.text("SELECT count(*) FROM usage_rollups")).scalar_one()
    finally:
        engine.dispose()


Query = Callable[[Any, bool], Awaitable[Any]]


def queries() -> dict[str, Query]:
    last_48h = MONTH_END - timedelta(hours=48)
    common = {"tenant_id": TENANT}
    return {
        f"month by day, split by model ({DAYS} x 3)": lambda s, led: usage_buckets(
            session=s, start=MONTH, end=MONTH_END, width="1d", group_by=["model"], from_ledger=led, **common
        ),
        f"month by day, split by key ({DAYS} x 5)": lambda s, led: usage_buckets(
            session=s, start=MONTH, end=MONTH_END, width="1d", group_by=["api_key_id"], from_ledger=led, **common
        ),
        "last 48 h by hour": lambda s, led: usage_buckets(
            session=s, start=last_48h, end=MONTH_END, width="1h", from_ledger=led, **common
        ),
        "month totals": lambda s, led: usage_totals(session=s, start=MONTH, end=MONTH_END, from_ledger=led, **common),
        "month totals per key": lambda s, led: usage_breakdown(
            session=s, start=MONTH, end=MONTH_END, group_by=["api_key_id"], from_ledger=led, **common
        ),
    }


async def time_queries(url: str, runs: int = 5) -> dict[str, tuple[float, float]]:
    """Per query: median milliseconds from the rollups and from the ledger (answers checked equal)."""
    engine = create_engine(url)
    sessions = session_factory(engine)
    timings: dict[str, tuple[float, float]] = {}
    try:
        for name, query in queries().items():
            medians = []
            answers = []
            for from_ledger in (False, True):
                async with sessions() as session:
                    answers.append(await query(session, from_ledger))  # warm-up
                    samples = []
                    for _ in range(runs):
                        start = time.perf_counter()
                        await query(session, from_ledger)
                        samples.append((time.perf_counter() - start) * 1000)
                medians.append(statistics.median(samples))
            if answers[0] != answers[1]:
                raise SystemExit(f"{name}: the rollups and the ledger disagree")
            timings[name] = (medians[0], medians[1])
            print(f"  {name}: rollups {medians[0]:.1f} ms, ledger {medians[1]:.1f} ms", flush=True)
    finally:
        await engine.dispose()
    return timings


# -- the dashboard's pages, served by the real app ------------------------------------------------

ADMIN_TOKEN = "bench-admin-token-0123"
MEMBER = "mem_bench_dashboard"


class PageCheckFailed(RuntimeError):
    """A page answered, but not with the content the generated month must give."""


async def sign_in(url: str) -> str:
    """An admin Member of the bench tenant and a live web session for it: the session cookie's token."""
    token = secrets.token_urlsafe(32)
    engine = create_engine(url)
    try:
        async with session_factory(engine)() as session:
            session.add(Member(id=MEMBER, tenant_id=TENANT, email="bench@example.com", role="admin"))
            session.add(
                WebSession(
                    token_hash=hash_secret(token),
                    member_id=MEMBER,
                    csrf_token=secrets.token_urlsafe(32),
                    expires_at=datetime.now(UTC) + timedelta(days=1),
                )
            )
            await session.commit()
    finally:
        await engine.dispose()
    return token


def serve(url: str, port: int, tokenizer: str) -> None:
    """The server subprocess: the kvgate app as `kvgate serve` builds it, on the instant engine stand-in."""
    import logging

    import structlog
    import uvicorn

    from bench.instant_engine import InstantEngine
    from gateway.settings import GatewaySettings
    from kvgate.app import create_app

    # No billing argument: billing's own hooks are built in the lifespan, as `kvgate serve` does.
    app = create_app(
        GatewaySettings(database_url=url, admin_token=ADMIN_TOKEN),
        engine_factory=lambda: InstantEngine(Path(tokenizer)),
    )
    logging.getLogger().setLevel(logging.WARNING)
    structlog.configure(wrapper_class=structlog.make_filtering_bound_logger(logging.WARNING))
    uvicorn.run(app, host="127.0.0.1", port=port, log_level="warning", access_log=False)


class PageServer:
    """uvicorn serving the app over `url` in a subprocess, on a free port of 127.0.0.1."""

    def __init__(self, url: str) -> None:
        from tests.gateway.harness import free_port
        from tests.model_fixtures import build_tiny_model

        self.port = free_port()
        self.base = f"http://127.0.0.1:{self.port}"
        command = [sys.executable, __file__, "--serve", url, "--port", str(self.port)]
        command += ["--tokenizer", str(build_tiny_model("llama"))]
        self.process = subprocess.Popen(command, cwd=REPO, stdout=subprocess.DEVNULL, stderr=subprocess.PIPE)

    def __enter__(self) -> PageServer:
        deadline = time.monotonic() + 300
        while True:
            try:
                httpx.get(f"{self.base}/healthz", timeout=2).raise_for_status()
                return self
            except httpx.TransportError:
                if self.process.poll() is not None or time.monotonic() > deadline:
                    raise RuntimeError(self.process.stderr.read().decode() if self.process.stderr else "") from None
                time.sleep(0.3)

    def __exit__(self, *exc: object) -> None:
        self.process.terminate()
        self.process.wait(timeout=60)


def rows_in(html: str, table_id: str) -> int:
    """How many rows the body of the table with this id has."""
    match = re.search(rf'id="{table_id}".*?<tbody>(.*?)</tbody>', html, re.S)
    if match is None:
        raise PageCheckFailed(f"no table #{table_id}")
    return match.group(1).count("<tr")


def number_at(html: str, element_id: str) -> int:
    match = re.search(rf'id="{element_id}"[^>]*>([\d,]+)<', html)
    if match is None:
        raise PageCheckFailed(f"no number in #{element_id}")
    return int(match.group(1).replace(",", ""))


def expect(what: str, found: object, wanted: object) -> None:
    if found != wanted:
        raise PageCheckFailed(f"{what}: {found!r}, expected {wanted!r}")


Check = Callable[[str], None]


def pages(n: int) -> list[tuple[str, str, str, Check]]:
    """(name, path, what is checked, check of the body) per dashboard page over the generated month."""
    month = f"preset=custom&start={MONTH:%Y-%m-%d}&end={MONTH_END - timedelta(days=1):%Y-%m-%d}"

    def overview(html: str) -> None:
        expect("month label", f"{MONTH:%B %Y}, month to date" in html, True)
        requests = number_at(html, "requests")
        expect("some of the month's requests so far", 0 < requests <= n, True)
        expect("budget bars (the tenant's and each key's)", html.count('class="budget"'), len(KEYS) + 1)

    def usage(split_rows: int) -> Check:
        def check(html: str) -> None:
            expect("day rows", rows_in(html, "usage-buckets"), DAYS)
            expect("detail rows", rows_in(html, "usage-detail"), DAYS * split_rows)
            expect("total requests", number_at(html, "total-requests"), n)

        return check

    def usage_csv(text: str) -> None:
        lines = list(csv.reader(io.StringIO(text)))
        expect("CSV header", lines[0][:3], ["bucket", "model", "requests"])
        expect("CSV rows", len(lines) - 1, DAYS * len(MODELS))
        expect("CSV requests", sum(int(line[2]) for line in lines[1:]), n)

    def cache(html: str) -> None:
        expect("day rows", rows_in(html, "hit-rate-data"), DAYS)
        expect("model rows", rows_in(html, "cache-by-model"), len(MODELS))
        expect("key rows", rows_in(html, "cache-by-key"), len(KEYS))

    def requests(html: str) -> None:
        expect("ledger rows", rows_in(html, "ledger"), 50)
        expect("newest request first", f"req_bench_{n - 1:08d}" in html, True)

    def keys(html: str) -> None:
        expect("key rows", html.count("data-key-name="), len(KEYS))

    return [
        ("Overview `/` (month to date)", "/", "month label, requests so far, every key's bar", overview),
        (
            "Usage `/usage`, month by day, split by model",
            f"/usage?{month}&split=model",
            f"{DAYS} day rows, {DAYS * len(MODELS)} detail rows, total {n:,} requests",
            usage(len(MODELS)),
        ),
        (
            "Usage `/usage`, month by day, split by key",
            f"/usage?{month}&split=key",
            f"{DAYS} day rows, {DAYS * len(KEYS)} detail rows, total {n:,} requests",
            usage(len(KEYS)),
        ),
        (
            "Usage export `/usage.csv`, month by day and model",
            f"/usage.csv?{month}&split=model",
            f"{DAYS * len(MODELS)} lines, summing to {n:,} requests",
            usage_csv,
        ),
        ("Cache `/cache`, month by day", f"/cache?{month}", f"{DAYS} day rows, 3 model and 5 key rows", cache),
        ("Requests `/requests` (first page)", "/requests", "50 rows, newest first", requests),
        ("Keys `/keys` (spend this month)", "/keys", "5 key rows", keys),
    ]


def time_pages(url: str, n: int, runs: int = 5) -> dict[str, float]:
    """Per page: median milliseconds of a full HTTP GET (status and content checked on every one)."""
    token = asyncio.run(sign_in(url))
    timings: dict[str, float] = {}
    with (
        PageServer(url) as server,
        httpx.Client(base_url=server.base, cookies={SESSION_COOKIE: token}, timeout=300) as client,
    ):
        for name, path, _, check in pages(n):
            samples = []
            for i in range(runs + 1):  # the first is a warm-up
                start = time.perf_counter()
                response = client.get(path)
                elapsed = (time.perf_counter() - start) * 1000
                if response.status_code != 200:
                    raise PageCheckFailed(f"{path}: status {response.status_code}: {response.text[:300]}")
                check(response.text)
                if i:
                    samples.append(elapsed)
            timings[name] = statistics.median(samples)
            print(f"  {name}: {timings[name]:.1f} ms ({len(response.content) // 1024} KiB)", flush=True)
    return timings


def run_backend(backend: str, n: int, workdir: Path) -> dict[str, Any]:
    if backend == "sqlite":
        path = str(workdir / "dashboard.db")
        url = f"sqlite:///{path}"
        return measure(url, n, lambda entries: load_sqlite(path, entries))
    import psycopg

    name = f"kvgate_bench_dashboard_{os.getpid()}"
    with psycopg.connect(f"{PG_BASE}/postgres", autocommit=True) as admin:
        admin.execute(f'CREATE DATABASE "{name}"')
    url = f"{PG_BASE}/{name}"
    try:
        return measure(url, n, lambda entries: load_postgres(url, entries))
    finally:
        with psycopg.connect(f"{PG_BASE}/postgres", autocommit=True) as admin:
            admin.execute(f'DROP DATABASE IF EXISTS "{name}" WITH (FORCE)')


def measure(url: str, n: int, load: Callable[[Iterator[tuple]], None]) -> dict[str, Any]:
    migrate(url)
    rates, ids = asyncio.run(prepare(url))
    start = time.perf_counter()
    load(rows(n, rates, ids))
    load_s = time.perf_counter() - start
    start = time.perf_counter()
    rollup_rows = build_rollups(url)
    rollup_s = time.perf_counter() - start
    print(f"  loaded {n:,} entries in {load_s:.0f} s; {rollup_rows:,} rollup rows in {rollup_s:.1f} s", flush=True)
    timings = asyncio.run(time_queries(url))
    load_average = os.getloadavg()[0]
    return {
        "load_s": load_s,
        "rollup_s": rollup_s,
        "rollup_rows": rollup_rows,
        "timings": timings,
        "load_average": load_average,
        "pages": time_pages(url, n),
    }


NAMES = {"sqlite": "SQLite", "postgres": "PostgreSQL"}


def table(results: dict[str, dict[str, Any]]) -> list[str]:
    header = ["query"]
    for backend in results:
        header += [f"{NAMES[backend]} rollups (ms)", f"{NAMES[backend]} ledger (ms)", "speed-up"]
    lines = ["| " + " | ".join(header) + " |", "|" + "---|" * len(header)]
    for query in queries():
        cells = [query]
        for result in results.values():
            rollups, ledger = result["timings"][query]
            cells += [f"{rollups:.1f}", f"{ledger:.1f}", f"{ledger / rollups:.0f}x"]
        lines.append("| " + " | ".join(cells) + " |")
    return lines


def page_table(results: dict[str, dict[str, Any]], n: int) -> list[str]:
    header = ["page (full HTTP GET)", *(f"{NAMES[backend]} (ms)" for backend in results), "checked on every response"]
    lines = ["| " + " | ".join(header) + " |", "|" + "---|" * len(header)]
    for name, _, checked, _ in pages(n):
        cells = [name, *(f"{result['pages'][name]:.1f}" for result in results.values()), f"200, {checked}"]
        lines.append("| " + " | ".join(cells) + " |")
    return lines


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--requests", type=int, default=1_000_000)
    parser.add_argument("--backends", default="sqlite,postgres")
    parser.add_argument("--write-docs", action="store_true")
    parser.add_argument("--serve", metavar="DATABASE_URL", help=argparse.SUPPRESS)  # the page server subprocess
    parser.add_argument("--port", type=int, help=argparse.SUPPRESS)
    parser.add_argument("--tokenizer", help=argparse.SUPPRESS)
    args = parser.parse_args()
    if args.serve:
        serve(args.serve, args.port, args.tokenizer)
        return
    start_load = os.getloadavg()[0]
    results: dict[str, dict[str, Any]] = {}
    with tempfile.TemporaryDirectory(prefix="kvgate-bench-dashboard-") as workdir:
        for backend in args.backends.split(","):
            print(f"{backend}:", flush=True)
            results[backend] = run_backend(backend, args.requests, Path(workdir))
    lines = table(results)
    page_lines = page_table(results, args.requests)
    print("\n".join([*lines, "", *page_lines]))
    load_averages = ", ".join(
        [f"{start_load:.1f} at the start"]
        + [f"{r['load_average']:.1f} before the {NAMES[b]} pages" for b, r in results.items()]
    )
    loads = "; ".join(
        f"{b}: loaded in {r['load_s']:.0f} s, {r['rollup_rows']:,} rollup rows built in {r['rollup_s']:.1f} s"
        for b, r in results.items()
    )
    slowest = {b: max(r["pages"].items(), key=lambda item: item[1]) for b, r in results.items()}
    verdict = "; ".join(f"{NAMES[b]}: {ms:.0f} ms ({name.split(' `')[0]})" for b, (name, ms) in slowest.items())
    under = all(ms < 1000 for _, ms in slowest.values())
    rollup_rows = " and ".join(sorted({f"{r['rollup_rows']:,}" for r in results.values()}))
    doc = [
        f"`.venv/bin/python bench/dashboard_queries.py --write-docs`, measured {time.strftime('%Y-%m-%d')} on "
        f"{machine_description()}: a shared 2-core box, with other work running (load average {load_averages}; "
        f"the figures are upper bounds). Python {platform.python_version()}, SQLite {sqlite3.sqlite_version}, "
        "PostgreSQL on the same machine.",
        "",
        f"One tenant's month ({MONTH:%B %Y}, the current month, so that the Overview's month to date by the real "
        f"clock covers it) of {args.requests:,} requests (5 keys, 3 models, both APIs, 3% errors and "
        "cancellations, office-hours rhythm, cache reads on 73% of requests), bulk-loaded into `ledger_entries`; "
        "the hourly `usage_rollups` built from it with one INSERT ... SELECT ... GROUP BY (the sums "
        "`billing.usage_rollups.add_entry` keeps per entry). Each query is `billing.usage_buckets`' own, against "
        "the rollups and, with `from_ledger=True`, the same GROUP BY over the ledger (its tenant/start index); "
        "both answers are checked equal. Median of 5 runs after a warm-up, through the async engine the server "
        f"uses. {loads}.",
        "",
        *lines,
        "",
        "The pages, rendered whole: the same database served by the real app (`kvgate.app.create_app`, billing's "
        "own hooks, the instant engine stand-in `bench/instant_engine.py`) in uvicorn in a subprocess on "
        "127.0.0.1, signed in as an admin member of the tenant (a `web_sessions` row and its `kvgate_session` "
        "cookie). Each figure is the median of 5 full HTTP GETs (httpx, a keep-alive connection, body read) "
        "after a warm-up: session lookup, queries, folding and template rendering. Month views use "
        f"`preset=custom&start={MONTH:%Y-%m-%d}&end={MONTH_END - timedelta(days=1):%Y-%m-%d}`; every response is "
        "checked for status 200 and the content listed.",
        "",
        *page_lines,
        "",
        f"Slowest page per backend: {verdict}. "
        + (
            f"Every page of a month of {args.requests:,} requests renders in under the issue's one second on both "
            f"backends: the month views read the rollups ({rollup_rows} rows for the month, where the raw ledger "
            "takes seconds), by day, and the Requests page one range of the ledger's (tenant_id, id) index."
            if under
            else "Some page takes longer than the issue's one second: see the table."
        )
        + " Minute buckets (`bucket_width=1m`, at most a day a page) read the ledger itself.",
    ]
    if args.write_docs:
        write_section("dashboard_queries", "Dashboard queries (bench/dashboard_queries.py)", doc)


if __name__ == "__main__":
    main()
