"""Recovery of a crashed gateway's in-flight requests, against real billing on SQLite and PostgreSQL.

Each request of the journal below is left in a different state by the "crash" (the
journal's descriptor dropped without clean-up, as SIGKILL leaves it); recovery must give
each exactly one usage record, one ledger entry and no reservation, with the database up,
down (through the spool), and run twice.
"""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass
from decimal import Decimal
from pathlib import Path
from typing import Any

from sqlalchemy import select
from sqlalchemy.engine import make_url
from sqlalchemy.exc import OperationalError
from sqlalchemy.ext.asyncio import AsyncSession, async_sessionmaker

from billing import budget_limits
from billing.hooks import GatewayBilling
from billing.models import BudgetCounter, BudgetReservation, LedgerEntry
from billing.pricebook import PriceBook
from billing.service import BillingService
from billing.settings import BillingSettings
from gateway.billing_hooks import Admission
from gateway.inflight import InflightEntry, InflightJournal
from gateway.recovery import recover_interrupted
from gateway.usage import DatabaseUsageRecorder, UsageRecorder
from kvgate.db import create_engine, session_factory, utcnow
from kvgate.tenancy import UsageRecord
from kvgate.usage import TokenCounts, UsageEvent
from tests.billing.conftest import make_tenant
from tests.billing.tcp_proxy import CuttableProxy
from tests.gateway.test_inflight import crash

MODEL = "m-test"  # $3 / $15 per Mtok in the billing fixtures
PROMPT = {"A": 1200, "B": 800, "C": 500, "D": 300, "E": 700}


@dataclass
class Billing:
    hooks: GatewayBilling
    recorder: UsageRecorder
    inner: DatabaseUsageRecorder

    async def aclose(self) -> None:
        await self.inner.aclose()


def billing_for(url: str, sessions: Any, pricebook: PriceBook, spool: Path) -> Billing:
    service = BillingService(sessions=sessions, settings=BillingSettings(spool_path=spool), pricebook=pricebook)
    hooks = GatewayBilling(service)
    inner = DatabaseUsageRecorder(url)
    return Billing(hooks=hooks, recorder=hooks.wrap_recorder(inner), inner=inner)


class Requests:
    """Five requests of one tenant with a budget, admitted (a reservation each) and journaled."""

    def __init__(self, tenant: str, key: str) -> None:
        self.tenant, self.key = tenant, key
        self.started_at = utcnow()

    def rid(self, name: str) -> str:
        return f"req_{name}_{self.tenant}"

    def entry(self, name: str) -> InflightEntry:
        return InflightEntry(
            request_id=self.rid(name),
            tenant_id=self.tenant,
            api_key_id=self.key,
            model=MODEL,
            endpoint="messages",
            started_at=self.started_at,
            prompt_tokens=PROMPT[name],
        )

    def admission(self, name: str) -> Admission:
        return Admission(
            request_id=self.rid(name),
            tenant_id=self.tenant,
            api_key_id=self.key,
            model=MODEL,
            endpoint="messages",
            prompt_tokens=PROMPT[name],
            max_output_tokens=1000,
        )

    def finished(self, name: str) -> UsageEvent:
        """The record the request would have had if it had finished: some cache reads, 40 output tokens."""
        return UsageEvent(
            request_id=self.rid(name),
            tenant_id=self.tenant,
            api_key_id=self.key,
            model=MODEL,
            endpoint="messages",
            started_at=self.started_at,
            counts=TokenCounts(input=PROMPT[name] - 256, cache_read=256, output=40),
            ttft_ms=12,
            latency_ms=90,
            status="ok",
        )


async def new_requests(sessions: async_sessionmaker[AsyncSession]) -> Requests:
    tenant, (key,) = await make_tenant(sessions)
    async with sessions() as session:
        await budget_limits.set_tenant_budget(session=session, tenant_id=tenant, monthly_limit_pico=10 * 10**12)
        await session.commit()
    return Requests(tenant, key)


async def state(sessions: async_sessionmaker[AsyncSession], reqs: Requests) -> dict[str, Any]:
    """Everything recovery may touch for this tenant."""
    async with sessions() as session:
        records = {
            r.request_id: (r.status, r.input_tokens, r.cache_read_tokens, r.output_tokens)
            for r in await session.scalars(select(UsageRecord).where(UsageRecord.tenant_id == reqs.tenant))
        }
        entries = [
            (e.request_id, e.kind, e.status, e.input_tokens, e.output_tokens, e.cost_pico)
            for e in await session.scalars(
                select(LedgerEntry).where(LedgerEntry.tenant_id == reqs.tenant).order_by(LedgerEntry.request_id)
            )
        ]
        reservations = list(
            await session.scalars(
                select(BudgetReservation.request_id).where(BudgetReservation.tenant_id == reqs.tenant)
            )
        )
        counters = {
            c.scope: (c.spent_pico, c.reserved_pico)
            for c in await session.scalars(select(BudgetCounter).where(BudgetCounter.owner_id == reqs.tenant))
        }
    return {"records": records, "entries": entries, "reservations": reservations, "counters": counters}


def cost(pricebook: PriceBook, event: UsageEvent) -> int:
    return pricebook.price_for(MODEL, event.started_at).cost_pico(event.counts)


def assert_recovered(after: dict[str, Any], reqs: Requests, pricebook: PriceBook, *, interrupted: set[str]) -> None:
    """Exactly one record and one ledger entry per request; interrupted ones free with the prompt as input."""
    names = set(PROMPT) & {n for n in PROMPT if reqs.rid(n) in after["records"]}
    ledger = {e[0]: e for e in after["entries"]}
    assert len(after["entries"]) == len(ledger)  # one entry per request id
    assert set(ledger) == {reqs.rid(n) for n in names} == set(after["records"])
    for name in names:
        status, input_tokens, read, output = after["records"][reqs.rid(name)]
        _, kind, entry_status, entry_input, entry_output, entry_cost = ledger[reqs.rid(name)]
        assert kind == "usage" and entry_status == status
        if name in interrupted:
            assert (status, input_tokens, read, output) == ("interrupted", PROMPT[name], 0, 0)
            assert (entry_input, entry_output, entry_cost) == (0, 0, 0)
        else:
            finished = reqs.finished(name)
            assert status == "ok" and (input_tokens, read, output) == (finished.counts.input, 256, 40)
            assert entry_cost == cost(pricebook, finished) > 0
    assert after["reservations"] == []
    spent = sum(e[5] for e in after["entries"])
    assert after["counters"]["tenant_month"] == (spent, 0)  # budget spend agrees with the ledger


async def test_recovery_records_settles_and_releases_each_request_once(
    db_url: str, sessions: async_sessionmaker[AsyncSession], pricebook: PriceBook, tmp_path: Path
) -> None:
    billing = billing_for(db_url, sessions, pricebook, tmp_path / "spool.jsonl")
    reqs = await new_requests(sessions)
    journal = InflightJournal.open(tmp_path / "journal")
    for name in "ABCD":
        await billing.hooks.admit(reqs.admission(name))
        await journal.begin(reqs.entry(name))
    # A: running when the process died. B: its record was in, its settlement not yet.
    assert await billing.recorder.record(reqs.finished("B"))
    # C: finished normally. D: finished, but the crash came before its end entry reached the file.
    for name in "CD":
        assert await billing.recorder.record(reqs.finished(name))
        await billing.hooks.settle(reqs.finished(name))
    journal.end(reqs.rid("C"))
    await journal.flush()
    crash(journal)
    before = await state(sessions, reqs)
    assert sorted(before["reservations"]) == sorted([reqs.rid("A"), reqs.rid("B")])  # what today's code leaves held
    segments = {p: p.read_bytes() for p in (tmp_path / "journal").glob("seg-*.jnl")}

    result = await recover_interrupted(
        directory=tmp_path / "journal", recorder=billing.recorder, billing=billing.hooks, sessions=sessions
    )
    assert (result.unfinished, result.recorded, result.already_recorded, result.failed) == (3, 1, 2, 0)
    assert list((tmp_path / "journal").glob("seg-*.jnl")) == []  # compacted away
    after = await state(sessions, reqs)
    assert_recovered(after, reqs, pricebook, interrupted={"A"})
    assert set(after["records"]) == {reqs.rid(n) for n in "ABCD"}

    # A second run over the same journal (a crash during recovery, before the delete) changes nothing.
    for path, data in segments.items():
        path.write_bytes(data)
    again = await recover_interrupted(
        directory=tmp_path / "journal", recorder=billing.recorder, billing=billing.hooks, sessions=sessions
    )
    assert (again.unfinished, again.recorded, again.already_recorded, again.failed) == (3, 0, 3, 0)
    assert await state(sessions, reqs) == after
    await billing.aclose()


class Outage:
    """The database going away: a cuttable proxy for PostgreSQL; for SQLite a path that cannot be opened."""

    def __init__(self, db_url: str, tmp_path: Path) -> None:
        self.db_url = db_url
        self.tmp_path = tmp_path
        self.proxy: CuttableProxy | None = None
        self.down = False

    async def __aenter__(self) -> Outage:
        if self.db_url.startswith("postgresql"):
            url = make_url(self.db_url)
            self.proxy = CuttableProxy(url.host or "127.0.0.1", url.port or 5432)
            await self.proxy.start()
            self.url = url.set(port=self.proxy.port).render_as_string(hide_password=False)
        else:
            self.url = f"sqlite:///{self.tmp_path / 'missing-dir' / 'kvgate.db'}"
        self._engine = create_engine(self.url if self.proxy else self.db_url)
        real = session_factory(self._engine)

        def sessions() -> AsyncSession:
            if self.proxy is None and self.down:  # SQLite has no socket to cut
                raise OperationalError("connect", {}, Exception("unable to open database file"))
            return real()

        self.sessions: Callable[[], AsyncSession] = sessions
        return self

    def recorder_url(self) -> str:
        return self.url

    def cut(self) -> None:
        self.down = True
        if self.proxy:
            self.proxy.cut()

    async def __aexit__(self, *exc: object) -> None:
        await self._engine.dispose()
        if self.proxy:
            await self.proxy.stop()


async def test_recovery_with_the_database_down_goes_through_the_spool_in_order(
    db_url: str, sessions: async_sessionmaker[AsyncSession], pricebook: PriceBook, tmp_path: Path
) -> None:
    """A: running at the crash. B: its record was written, then the database went away before its settlement.
    E: finished during the outage, record spooled, end entry lost. The restart finds the database still down, so
    recovery spools too. Once it is back the spool replays exactly once: B and E keep their own records and
    costs (the interrupted ones recovery spooled after them lose, and are not billed), A is interrupted."""
    reqs = await new_requests(sessions)
    spool = tmp_path / "spool.jsonl"
    async with Outage(db_url, tmp_path) as outage:
        recorder_url = outage.recorder_url() if outage.proxy else db_url
        billing = billing_for(recorder_url, outage.sessions, pricebook, spool)
        journal = InflightJournal.open(tmp_path / "journal")
        for name in "ABE":
            await billing.hooks.admit(reqs.admission(name))
            await journal.begin(reqs.entry(name))
        assert await billing.recorder.record(reqs.finished("B"))
        outage.cut()
        if outage.proxy is None:  # the SQLite recorder loses its file the same way
            await billing.aclose()
            billing = billing_for(outage.url, outage.sessions, pricebook, spool)
        assert await billing.recorder.record(reqs.finished("E"))  # spooled
        await billing.hooks.settle(reqs.finished("E"))
        crash(journal)

        result = await recover_interrupted(
            directory=tmp_path / "journal", recorder=billing.recorder, billing=billing.hooks, sessions=outage.sessions
        )
        assert (result.unfinished, result.recorded, result.failed) == (3, 3, 0)  # all spooled
        assert billing.hooks.service.spool.pending() == 4  # E's own record, then the three interrupted ones
        await billing.aclose()

    # The database is back (the next start-up, or the upkeep task): the spool replays.
    restarted = billing_for(db_url, sessions, pricebook, spool)
    await restarted.hooks.replay_pending()
    after = await state(sessions, reqs)
    assert_recovered(after, reqs, pricebook, interrupted={"A"})
    assert set(after["records"]) == {reqs.rid(n) for n in "ABE"}
    await restarted.aclose()


async def test_at_start_up_the_spool_is_replayed_before_recovery(
    db_url: str, sessions: async_sessionmaker[AsyncSession], pricebook: PriceBook, tmp_path: Path
) -> None:
    """E's record went to the spool during an outage, then the process died before its end entry. At the restart
    the database is up: the lifespan replays the spool first, so E keeps its `ok` record and its cost."""
    from gateway.app import recover_after_crash

    reqs = await new_requests(sessions)
    spool = tmp_path / "spool.jsonl"
    async with Outage(db_url, tmp_path) as outage:
        billing = billing_for(outage.url if outage.proxy else db_url, outage.sessions, pricebook, spool)
        journal = InflightJournal.open(tmp_path / "journal")
        await billing.hooks.admit(reqs.admission("E"))
        await journal.begin(reqs.entry("E"))
        outage.cut()
        if outage.proxy is None:
            await billing.aclose()
            billing = billing_for(outage.url, outage.sessions, pricebook, spool)
        assert await billing.recorder.record(reqs.finished("E"))
        crash(journal)
        await billing.aclose()

    restarted = billing_for(db_url, sessions, pricebook, spool)

    await recover_after_crash(
        hooks=restarted.hooks, recorder=restarted.recorder, sessions=sessions, journal_dir=tmp_path / "journal"
    )
    after = await state(sessions, reqs)
    assert_recovered(after, reqs, pricebook, interrupted=set())
    assert after["records"][reqs.rid("E")][0] == "ok"
    assert Decimal(after["entries"][0][5]) > 0
    await restarted.aclose()


def test_interrupted_requests_are_billed_nothing_but_keep_their_prompt() -> None:
    from billing.hooks import charge_from_event

    reqs = Requests("ten_x", "key_x")
    event = reqs.entry("A").interrupted_event()
    assert event.status == "interrupted" and event.counts.prompt_tokens == PROMPT["A"]
    assert charge_from_event(event).counts == TokenCounts()
    assert charge_from_event(reqs.finished("A")).counts.prompt_tokens == PROMPT["A"]
