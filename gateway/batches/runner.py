"""The batch runner: claims items from the database and runs each through the interactive path
(gateway.services.completions' jobs, gateway.generation's start_generation and bookkeeping), at most
`concurrency` at a time per gateway, at the tenant's low-weight batch share (gateway/batches/wrappers.py).

Durability: an item's attempt gets its request id before the engine starts on it (the usage record's and the
ledger entry's id). Its result is stored before its usage is recorded, so a crash in between leaves a result
and, from the in-flight journal, an `interrupted` (free) record. At start-up, batches in progress resume: an
item left running by a stopped runner is waiting again, one whose runner died is claimed when its lease runs
out, and an attempt whose usage was recorded (not `interrupted`) is never run again.
"""

from __future__ import annotations

import asyncio
import contextlib
import json
import time
from dataclasses import dataclass
from datetime import timedelta
from typing import Any

import structlog
from fastapi.exceptions import RequestValidationError

from gateway.api.body import run_job
from gateway.api.errors import validation_message
from gateway.batches import store
from gateway.batches.models import ERRORED, SUCCEEDED
from gateway.batches.shapes import errored_result, openai_response
from gateway.batches.wrappers import Abandoned, BatchGateway
from gateway.generation import Finished, Generation, RateAdmission, RequestContext, start_generation
from gateway.logs import log_failure
from gateway.protocols.anthropic_stream import message_of
from gateway.protocols.openai_stream import completion_of
from gateway.ratelimit import Limits
from gateway.services.completions import chat_job, check_retention, message_job
from gateway.services.keys import Principal
from gateway.state import Gateway
from gateway.usage import counts_from_usage
from kvgate.db import utcnow
from kvgate.errors import (
    ApiError,
    DatabaseUnavailableError,
    InvalidRequestError,
    KvgateError,
    OverloadedError,
    PermissionDeniedError,
)
from kvgate.tenancy import Tenant

log = structlog.get_logger("kvgate.batches")

RETRY_S = 1.0  # an item the engine was too busy for waits this long before it is claimed again


class _Skip(Exception):
    """This turn does nothing (the database is known to be away)."""


@dataclass
class Running:
    claim: store.Claim
    task: asyncio.Task[None]
    generating: bool = False  # the engine is on it: stopping it now makes the attempt interrupted (free)


class BatchRunner:
    def __init__(self, gw: Gateway, *, concurrency: int, lease_s: float = 300.0, poll_s: float = 2.0) -> None:
        self.gw = gw
        self.concurrency = concurrency
        self.lease_s = lease_s
        self.poll_s = poll_s
        self.abandoned = Abandoned()
        self.bgw: Any = BatchGateway(gw, self.abandoned)
        self._running: dict[str, Running] = {}
        self._wake = asyncio.Event()
        self._loop_task: asyncio.Task[None] | None = None
        self._stopping = False
        self._busy_until = 0.0

    def start(self) -> None:
        if self.concurrency > 0 and self._loop_task is None:
            self._loop_task = asyncio.get_running_loop().create_task(self._loop())

    def wake(self) -> None:
        self._wake.set()

    async def stop(self) -> None:
        """Stop claiming; items in flight are stopped (recorded `interrupted`, free) and handed back."""
        self._stopping = True
        if self._loop_task is not None:
            self._loop_task.cancel()
            with contextlib.suppress(asyncio.CancelledError, Exception):
                await self._loop_task
        running = list(self._running.values())
        for entry in running:
            if entry.generating:
                self.abandoned.ids.add(entry.claim.request_id)
            entry.task.cancel()
        if running:
            await asyncio.gather(*(entry.task for entry in running), return_exceptions=True)
            await self.gw.drain()  # the stopped generations' records (interrupted) are written
            try:
                await store.release(self.gw.sessions, [entry.claim for entry in running])
            except Exception:
                log_failure(log, "batch_release_failed")

    async def _loop(self) -> None:
        last_renewal = time.monotonic()
        try:
            await store.reclaim_interrupted(self.gw.sessions)
        except Exception as error:
            if not self.gw.db_health.observe(error):
                log_failure(log, "batch_runner_failed")
        while not self._stopping:
            try:
                if not self.gw.db_health.should_try():  # the database is away: no wait for a timeout each turn
                    raise _Skip
                await store.settle_batches(self.gw.sessions, utcnow())
                free = self.concurrency - len(self._running)
                if free > 0 and time.monotonic() >= self._busy_until:
                    claims = await store.claim_items(self.gw.sessions, limit=free, now=utcnow(), lease_s=self.lease_s)
                    for claim in claims:
                        task = asyncio.get_running_loop().create_task(self._run(claim))
                        self._running[claim.request_id] = Running(claim, task)
                        task.add_done_callback(lambda _, rid=claim.request_id: self._done(rid))
                if time.monotonic() - last_renewal > self.lease_s / 3 and self._running:
                    until = utcnow() + timedelta(seconds=self.lease_s)
                    await store.renew_leases(self.gw.sessions, [r.claim for r in self._running.values()], until)
                    last_renewal = time.monotonic()
                self.gw.db_health.succeeded()
            except asyncio.CancelledError:
                raise
            except _Skip:
                pass
            except Exception as error:
                if not self.gw.db_health.observe(error):
                    log_failure(log, "batch_runner_failed")
            self._wake.clear()
            with contextlib.suppress(TimeoutError):
                await asyncio.wait_for(self._wake.wait(), self.poll_s)

    def _done(self, request_id: str) -> None:
        self._running.pop(request_id, None)
        self._wake.set()

    async def _run(self, claim: store.Claim) -> None:
        try:
            await self._run_item(claim)
        except asyncio.CancelledError:
            raise
        except Exception:
            log_failure(log, "batch_item_failed", request_id=claim.request_id)
            with contextlib.suppress(Exception):  # else the item waits for its lease to run out, and is retried
                error = ApiError("the server failed while running this request")
                result = errored_result(claim.api, error, claim.request_id)
                await store.save_result(self.gw.sessions, claim, status=ERRORED, result=result)

    async def _run_item(self, claim: store.Claim) -> None:
        sessions = self.gw.sessions
        if claim.previous_request_id is not None:
            status = await store.recorded_status(sessions, claim.previous_request_id)
            if status is not None and status != "interrupted":
                # That attempt ran and was recorded, but its result was not stored: never run (or bill) it twice.
                error = ApiError("this request ran, but its result was lost when the server stopped")
                result = errored_result(claim.api, error, claim.previous_request_id)
                await store.save_result(sessions, claim, status=ERRORED, result=result)
                return
        ctx = await self._context(claim)
        if isinstance(ctx, KvgateError):
            await store.save_result(
                sessions, claim, status=ERRORED, result=errored_result(claim.api, ctx, claim.request_id)
            )
            return
        try:
            gen, model, tools = await self._start(claim, ctx)
        except (OverloadedError, DatabaseUnavailableError):
            self._busy_until = time.monotonic() + RETRY_S
            await store.release(sessions, [claim])
            return
        except KvgateError as error:
            await store.save_result(
                sessions, claim, status=ERRORED, result=errored_result(claim.api, error, claim.request_id)
            )
            return
        entry = self._running.get(claim.request_id)
        if entry is not None:
            entry.generating = True
        try:
            output = await gen.handle.result()
        except asyncio.CancelledError:
            gen.abandon()
            raise
        if entry is not None:
            entry.generating = False
        counts = counts_from_usage(output.usage)
        status = {"cancelled": "cancelled", "error": "error"}.get(output.finish_reason, "ok")
        finished = Finished(output=output, counts=counts, status=status, cost_usd=None)  # type: ignore[arg-type]
        try:
            item_status, result = self._result(claim, finished, model=model, tools=tools)
            await store.save_result(sessions, claim, status=item_status, result=result)
        finally:
            await gen.finish(output)  # the usage record and the ledger entry, as for an interactive request

    async def _context(self, claim: store.Claim) -> RequestContext | KvgateError:
        async with self.gw.sessions() as session:
            tenant = await session.get(Tenant, claim.tenant_id)
        if tenant is None or tenant.status != "active":
            return PermissionDeniedError("this organization is suspended")
        principal = Principal(
            tenant_id=claim.tenant_id, api_key_id=claim.api_key_id, scheduling_weight=tenant.scheduling_weight
        )
        return RequestContext(
            request_id=claim.request_id, principal=principal, started_at=utcnow(), t0=time.perf_counter(), log={}
        )

    async def _start(self, claim: store.Claim, ctx: RequestContext) -> tuple[Generation, str, Any]:
        try:
            return await self._start_item(claim, ctx)
        except RequestValidationError as exc:  # what the interactive routes render as a 400
            message, param = validation_message(list(exc.errors()))
            raise InvalidRequestError(message, param=param) from None

    async def _start_item(self, claim: store.Claim, ctx: RequestContext) -> tuple[Generation, str, Any]:
        raw = claim.params_json.encode()
        rate = RateAdmission(Limits(), None)  # batch items do not draw on the key's per-minute limits
        if claim.api == "anthropic":
            job = await run_job(self.bgw, ctx=ctx, job=message_job, raw=raw, content_type="application/json")
            endpoint = "messages"
        else:
            job = await run_job(self.bgw, ctx=ctx, job=chat_job, raw=raw, content_type="application/json")
            check_retention(self.gw, model=job.prepared.model, retention=job.retention)
            endpoint = "chat.completions"
        if job.stream:
            raise InvalidRequestError("stream: streaming is not supported inside a batch", param="stream")
        prepared = job.prepared
        gen = await start_generation(self.bgw, ctx=ctx, endpoint=endpoint, prepared=prepared, rate=rate)
        return gen, prepared.model, prepared.tools

    def _result(self, claim: store.Claim, finished: Finished, *, model: str, tools: Any) -> tuple[str, dict[str, Any]]:
        if finished.status == "error":
            from gateway.generation import output_error

            return ERRORED, errored_result(claim.api, output_error(finished.output), claim.request_id)
        if claim.api == "anthropic":
            message = message_of(finished, request_id=claim.request_id, model=model, tools=tools)
            return SUCCEEDED, {"type": SUCCEEDED, "message": json.loads(message.model_dump_json())}
        completion = completion_of(
            finished, request_id=claim.request_id, model=model, created=int(time.time()), tools=tools
        )
        return SUCCEEDED, openai_response(200, claim.request_id, json.loads(completion.model_dump_json()))


def wake_runner(gw: Gateway) -> None:
    """A batch was created or cancelled here: the runner looks at once rather than at its next poll."""
    runner = getattr(gw, "batch_runner", None)
    if runner is not None:
        runner.wake()
