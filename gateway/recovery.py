"""Start-up recovery: the requests a crashed process was running become `interrupted` usage records.

The lifespan runs this before the gateway serves. For every request begun in a dead
process's in-flight journal (gateway/inflight.py) and never ended:

1. its usage record is written with status `interrupted` through the app's recorder,
   insert-or-ignore by request id, so a request whose record did make it before the
   crash keeps that record and is not counted twice (billing's recorder spools it when
   the database is away);
2. billing settles the record that won (the new one, or the one already there): one
   ledger entry by request id, and the budget reservation made at admission released.

Both steps are idempotent, so recovery that dies half way is simply run again; the dead
segments are deleted only once every entry went through. If any entry fails, they are
kept and the next start-up tries again.
"""

from __future__ import annotations

import asyncio
from dataclasses import dataclass
from pathlib import Path

import structlog
from sqlalchemy.ext.asyncio import AsyncSession, async_sessionmaker

from gateway.billing_hooks import BillingHooks
from gateway.inflight import InflightEntry, dead_segments
from gateway.logs import log_failure
from gateway.metrics import GatewayMetrics
from gateway.usage import UsageRecorder, load_usage_event
from kvgate.usage import TokenCounts, UsageEvent

log = structlog.get_logger("kvgate.gateway")


@dataclass(frozen=True)
class RecoveryResult:
    segments: int = 0
    unfinished: int = 0
    recorded: int = 0  # newly recorded as interrupted
    already_recorded: int = 0  # the crash came after the record, before the journal's end entry
    failed: int = 0
    corrupt_lines: int = 0


async def recover_interrupted(
    *,
    directory: Path,
    recorder: UsageRecorder,
    billing: BillingHooks,
    sessions: async_sessionmaker[AsyncSession],
    metrics: GatewayMetrics | None = None,
) -> RecoveryResult:
    """Record and settle every unfinished request of the dead journals in `directory`, then delete them."""
    with dead_segments(directory) as dead:
        if not dead.paths:
            return RecoveryResult()
        contents = await asyncio.to_thread(dead.contents)
        entries = contents.unfinished()
        # Concurrently, so the recorder's group commit writes them in one transaction.
        outcomes = await asyncio.gather(
            *(recorder.record(entry.interrupted_event()) for entry in entries), return_exceptions=True
        )
        recorded = already = failed = 0
        for entry, outcome in zip(entries, outcomes, strict=True):
            if isinstance(outcome, BaseException):
                failed += 1
                log.error("recovery.record_failed", request_id=entry.request_id, error=repr(outcome))
                continue
            try:
                await _settle(entry, newly_recorded=outcome, billing=billing, sessions=sessions)
            except Exception:
                failed += 1
                log_failure(log, "recovery.settle_failed", request_id=entry.request_id)
                continue
            if outcome:
                recorded += 1
                if metrics is not None:
                    metrics.observe_usage(model=entry.model, status="interrupted", counts=_counts(entry))
            else:
                already += 1
        if not failed:
            await asyncio.to_thread(dead.remove)
        result = RecoveryResult(
            segments=len(dead.paths),
            unfinished=len(entries),
            recorded=recorded,
            already_recorded=already,
            failed=failed,
            corrupt_lines=contents.corrupt,
        )
    fields = {**result.__dict__, "directory": str(directory)}
    if failed:
        log.error("recovery.incomplete", **fields)
    else:
        log.info("recovery.done", **fields)
    return result


async def _settle(
    entry: InflightEntry,
    *,
    newly_recorded: bool,
    billing: BillingHooks,
    sessions: async_sessionmaker[AsyncSession],
) -> None:
    event: UsageEvent = entry.interrupted_event()
    if not newly_recorded:
        # The request's own record is there: settle that one (a no-op if it was settled already).
        event = await load_usage_event(sessions, entry.request_id) or event
    await billing.settle(event)


def _counts(entry: InflightEntry) -> TokenCounts:
    return TokenCounts(input=entry.prompt_tokens)
