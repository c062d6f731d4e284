"""The spool: durable appends, torn lines set aside, replay exactly once when the database returns."""

from __future__ import annotations

import asyncio
import os
import stat
from datetime import UTC, datetime

import pytest
from sqlalchemy import func, select
from sqlalchemy.engine import make_url

from billing.ledger import UsageCharge
from billing.models import LedgerEntry
from billing.service import BillingService, BudgetUnavailableError
from billing.settings import BillingSettings
from billing.spool import Spool, decode_line, encode_line
from billing.spool_records import parse_spool_record, spool_record
from kvgate.db import create_engine, session_factory
from kvgate.usage import TokenCounts
from tests.billing.conftest import make_tenant
from tests.billing.tcp_proxy import CuttableProxy

NOW = datetime(2026, 3, 10, 12, tzinfo=UTC)


def charge(tenant, key, i) -> UsageCharge:
    return UsageCharge(
        request_id=f"r{i}-{tenant}",
        tenant_id=tenant,
        api_key_id=key,
        model="m-test",
        endpoint="chat.completions",
        status="ok",
        started_at=NOW,
        counts=TokenCounts(input=i, cache_write_5m=10, cache_read=100 + i, output=7),
        ttft_ms=3,
        latency_ms=9,
    )


def test_line_format_detects_torn_and_altered_lines():
    line = encode_line({"a": 1, "b": "x"})
    assert decode_line(line) == {"a": 1, "b": "x"}
    assert decode_line(line[:-1]) is None  # no newline: torn
    assert decode_line(line[:-5] + b"}\n") is None  # truncated body
    assert decode_line(line.replace(b'"x"', b'"y"')) is None  # checksum mismatch
    assert decode_line(b"garbage\n") is None


async def test_replay_applies_each_record_once_and_sets_aside_a_torn_tail(tmp_path):
    spool = Spool(tmp_path / "spool.jsonl")
    for i in range(5):
        spool.append({"i": i})
    with open(spool.path, "ab") as fh:  # a crash in the middle of a sixth append
        fh.write(encode_line({"i": 5})[:-7])
    assert spool.pending() == 6 and spool.has_pending()
    seen: list[int] = []

    async def apply(batch):
        seen.extend(r["i"] for r in batch)
        return len(batch)

    result = await spool.replay(apply, batch_size=2)
    assert (result.records, result.applied, result.corrupt) == (5, 5, 1)
    assert seen == [0, 1, 2, 3, 4] and not spool.has_pending()
    assert (tmp_path / "spool.jsonl.corrupt").exists()
    assert (await spool.replay(apply)).records == 0 and seen == [0, 1, 2, 3, 4]


async def test_a_failed_replay_leaves_the_file_for_the_next_one(tmp_path):
    spool = Spool(tmp_path / "spool.jsonl")
    spool.append({"i": 0})

    async def fail(batch):
        raise ConnectionError("database still down")

    with pytest.raises(ConnectionError):
        await spool.replay(fail)
    spool.append({"i": 1})  # appends go on to a fresh live file meanwhile
    assert spool.pending() == 2
    seen: list[int] = []

    async def apply(batch):
        seen.extend(r["i"] for r in batch)
        return len(batch)

    assert (await spool.replay(apply)).records == 2 and sorted(seen) == [0, 1]


def test_appends_are_fsynced(tmp_path, monkeypatch):
    synced: list[int] = []
    real_fsync = os.fsync
    monkeypatch.setattr(os, "fsync", lambda fd: (synced.append(fd), real_fsync(fd)))
    Spool(tmp_path / "spool.jsonl").append({"i": 0})
    assert len(synced) >= 1


def test_spool_record_round_trip():
    c = charge("t", "k", 3)

    class V:
        id = 42

    parsed, version_id = parse_spool_record(spool_record(c, V()))
    assert parsed == c and version_id == 42


async def test_database_outage_spools_then_replays_exactly_once(db_url, pricebook, tmp_path):
    """Cut the connection to the database mid-run: settlements spool; restored, they replay once."""
    proxy = None
    if db_url.startswith("postgresql"):
        url = make_url(db_url)
        proxy = CuttableProxy(url.host or "127.0.0.1", url.port or 5432)
        await proxy.start()
        outage_url = url.set(port=proxy.port).render_as_string(hide_password=False)
    else:
        outage_url = db_url
    engine = create_engine(outage_url, pool_size=5, max_overflow=0) if proxy else create_engine(outage_url)
    real_sessions = session_factory(engine)
    down = asyncio.Event()

    def sessions():
        if proxy is None and down.is_set():  # SQLite has no socket to cut: refuse like a missing database
            from sqlalchemy.exc import OperationalError

            raise OperationalError("connect", {}, Exception("unable to open database file"))
        return real_sessions()

    settings = BillingSettings(spool_path=tmp_path / "spool.jsonl")
    svc = BillingService(sessions=sessions, settings=settings, pricebook=pricebook, clock=lambda: NOW)
    try:
        tenant, (key,) = await make_tenant(real_sessions)
        charges = [charge(tenant, key, i) for i in range(30)]
        live = [await svc.settle(c) for c in charges[:10]]
        assert not any(o.spooled for o in live)
        admit = {"tenant_id": tenant, "api_key_id": key, "model": "m-test", "prompt_tokens": 1, "max_output_tokens": 1}
        assert await svc.admit(request_id="x0", **admit) is None  # no limits; its budget state is now known
        stranger, (stranger_key,) = await make_tenant(real_sessions)
        down.set()
        if proxy:
            proxy.cut()
        spooled = [await svc.settle(c) for c in charges[10:25]]
        assert all(o.spooled for o in spooled) and svc.spool.pending() == 15
        # A request that was admitted before the outage and is retried during it spools again: still one entry.
        assert (await svc.settle(charges[3])).spooled
        assert await svc.admit(request_id="x", **admit) is None  # admitted from memory: it has no limits
        with pytest.raises(BudgetUnavailableError):  # never admitted online: its budget is unknown
            await svc.admit(request_id="y", **{**admit, "tenant_id": stranger, "api_key_id": stranger_key})
        with pytest.raises(Exception):  # noqa: B017 - replay during the outage fails and keeps the file
            await svc.replay_spool()
        assert svc.spool.pending() == 16
        down.clear()
        if proxy:
            proxy.restore()
        result = await svc.replay_spool()
        assert (result.records, result.applied) == (16, 15)
        assert (await svc.replay_spool()).records == 0
        rest = [await svc.settle(c) for c in charges[25:]]
        assert not any(o.spooled for o in rest)
        expected = sum(pricebook.price_for("m-test", NOW).cost_pico(c.counts) for c in charges)
        async with real_sessions() as session:
            n = await session.scalar(select(func.count()).where(LedgerEntry.tenant_id == tenant))
            total = await session.scalar(select(func.sum(LedgerEntry.cost_pico)).where(LedgerEntry.tenant_id == tenant))
            reads = await session.scalar(
                select(func.sum(LedgerEntry.cache_read_tokens)).where(LedgerEntry.tenant_id == tenant)
            )
            sources = dict(
                (
                    await session.execute(
                        select(LedgerEntry.source, func.count())
                        .where(LedgerEntry.tenant_id == tenant)
                        .group_by(LedgerEntry.source)
                    )
                ).all()
            )
        assert n == 30 and total == expected and reads == sum(c.counts.cache_read for c in charges)
        assert sources == {"live": 15, "spool": 15}
        assert sum(o.cost_pico for o in live + spooled + rest) == expected
    finally:
        await engine.dispose()
        if proxy:
            await proxy.stop()


def test_spool_files_are_readable_by_their_owner_only(tmp_path):
    previous = os.umask(0o022)  # a permissive umask, as many systems have
    try:
        spool = Spool(tmp_path / "spool" / "usage.jsonl")
        spool.append({"i": 0})
        spool.set_aside([{"i": 1}], "refused")
        spool._set_aside_lines([b"torn"])
    finally:
        os.umask(previous)
    modes = {p.name: stat.S_IMODE(p.stat().st_mode) for p in (tmp_path / "spool").iterdir()}
    assert {"usage.jsonl", "usage.jsonl.lock", "usage.jsonl.rejected", "usage.jsonl.corrupt"} <= set(modes)
    assert all(mode == 0o600 for mode in modes.values()), {k: oct(v) for k, v in modes.items()}
    assert stat.S_IMODE((tmp_path / "spool").stat().st_mode) == 0o700
