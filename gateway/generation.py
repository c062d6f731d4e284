"""One request's trip through the engine: admission, submission, and the bookkeeping when it ends.

Both APIs call start_generation() with a rendered prompt and cache regions, then
either stream the handle's deltas or await its result. finish() turns the engine's
final counts into the usage record, billing's settlement and the rate-limit
settlement, exactly once per request, even when the client went away mid-stream.
"""

from __future__ import annotations

import asyncio
import json
import time
from dataclasses import dataclass, field
from datetime import datetime
from decimal import Decimal
from typing import Any

import structlog

from gateway.backends.base import EMBEDDED, Handle, Placement
from gateway.billing_hooks import Admission
from gateway.cache_fingerprints import Fingerprint
from gateway.cache_probe import CacheProbe, probe_prompt
from gateway.logs import log_failure
from gateway.prompt import RenderedPrompt
from gateway.ratelimit import Decision, Limits
from gateway.request_journal import OVERLOADED_RETRY_S, journal_begin, journal_end
from gateway.security import tenant_salt
from gateway.services.keys import Principal
from gateway.state import Gateway
from gateway.tools.parse import ToolParsing
from gateway.usage import counts_from_usage
from inference.types import (
    CacheRegion,
    CacheSpec,
    EngineError,
    EngineOverloadedError,
    FairShare,
    RequestOutput,
    SamplingParams,
)
from inference.types import EngineUnavailableError as EngineUnavailable
from inference.types import InvalidRequestError as EngineInvalidRequest
from kvgate.errors import (
    ApiError,
    EngineUnavailableError,
    InvalidRequestError,
    KvgateError,
    OverloadedError,
    PromptTooLongError,
    RateLimitError,
)
from kvgate.usage import Endpoint, TokenCounts, UsageEvent, UsageStatus

log = structlog.get_logger("kvgate.gateway")

# A dead engine does not come back by itself (a supervisor restarts the process): retry later.
UNAVAILABLE_RETRY_S = 10.0


def engine_unavailable(reason: str) -> EngineUnavailableError:
    return EngineUnavailableError(
        f"the inference engine is unavailable ({reason}); retry later", retry_after_s=UNAVAILABLE_RETRY_S
    )


async def check_engine(gw: Gateway) -> None:
    """503/529 at once, before any admission work, when the engine cannot serve."""
    try:
        await gw.engine.check_health()
    except EngineError as exc:
        raise engine_unavailable(str(exc)) from exc


def output_error(output: RequestOutput) -> KvgateError:
    """The error a request the engine finished with finish_reason "error" gets, by what went wrong."""
    message = output.error or "the engine failed while generating"
    if output.error_kind == "invalid_request":
        return InvalidRequestError(message)
    if output.error_kind == "unavailable":
        return engine_unavailable(message)
    return ApiError(message)


@dataclass(frozen=True)
class RequestContext:
    """Per-request facts the middleware and auth established."""

    request_id: str
    principal: Principal
    started_at: datetime
    t0: float  # perf_counter at arrival
    log: dict[str, Any] = field(default_factory=dict)  # extra fields for the request's log line


@dataclass(frozen=True)
class Prepared:
    """A request reduced to what the engine needs."""

    model: str
    prompt: RenderedPrompt
    sampling: SamplingParams
    regions: tuple[CacheRegion, ...]
    client_salt: str | None
    tools: ToolParsing | None = None  # tool calls to parse from the output, if any


@dataclass(frozen=True)
class Finished:
    output: RequestOutput
    counts: TokenCounts
    status: UsageStatus
    cost_usd: Decimal | None
    cache_explanation: dict[str, Any] | None = None  # gateway.cache_explanation


def output_budget(max_model_len: int, *, prompt_tokens: int, requested: int | None) -> int:
    """max_tokens clipped to the context left after the prompt; 400 if there is none."""
    limit = max_model_len
    room = limit - prompt_tokens
    if room <= 0:
        raise PromptTooLongError(f"prompt is too long: {prompt_tokens} tokens > {limit - 1} maximum")
    return room if requested is None else min(requested, room)


class Generation:
    def __init__(
        self,
        gw: Gateway,
        *,
        ctx: RequestContext,
        model: str,
        endpoint: Endpoint,
        handle: Handle,
        prompt_tokens: int,
        limits: Limits,
        reserved_input: int,
        decision: Decision | None,
        submitted_at: float,
        probe: CacheProbe | None = None,
    ) -> None:
        self.gw = gw
        self.ctx = ctx
        self.model = model
        self.endpoint = endpoint
        self.handle = handle
        self.prompt_tokens = prompt_tokens
        self.limits = limits
        self.reserved_input = reserved_input
        self.decision = decision
        self.submitted_at = submitted_at
        self.probe = probe
        self._bookkeeping_task: asyncio.Task[Finished] | None = None

    @property
    def rate_limit_headers(self) -> dict[str, str]:
        """The headers every response of the request carries: rate limits, and the cache layout findings."""
        headers = self.decision.headers() if self.decision else {}
        return {**headers, **self.probe.headers} if self.probe is not None else headers

    def early_counts(self) -> TokenCounts:
        """The prompt-side counts as soon as prefill is done (for a stream's first event)."""
        usage = self.handle.prompt_usage
        if usage is not None:
            return counts_from_usage(usage)
        return TokenCounts(input=self.prompt_tokens)

    async def complete_or_raise(self) -> tuple[Finished, dict[str, str]]:
        """The finished request and its response headers; a 500 if the engine failed it."""
        finished = await self.complete()
        if finished.status == "error":
            raise output_error(finished.output)
        headers = self.rate_limit_headers
        if finished.cost_usd is not None:
            headers["kvgate-cost-usd"] = str(finished.cost_usd)
        return finished, headers

    async def complete(self) -> Finished:
        """Wait for the engine's result and do the bookkeeping (non-streaming path)."""
        try:
            output = await self.handle.result()
        except asyncio.CancelledError:
            self.abandon()
            raise
        return await self.finish(output)

    def abandon(self) -> None:
        """The client went away: stop generating and record what was done, in the background."""
        if self._bookkeeping_task is not None:
            return
        self.handle.cancel()

        async def settle_abandoned() -> None:
            await self.finish(await self.handle.result())

        self.gw.spawn(settle_abandoned())

    async def finish(self, output: RequestOutput) -> Finished:
        if self._bookkeeping_task is None:
            self._bookkeeping_task = self.gw.spawn(self._bookkeeping(output))
        # Shielded: a caller cancelled now must not leave the request unrecorded.
        return await asyncio.shield(self._bookkeeping_task)

    async def _bookkeeping(self, output: RequestOutput) -> Finished:
        counts = counts_from_usage(output.usage)
        status: UsageStatus = {"cancelled": "cancelled", "error": "error"}.get(output.finish_reason, "ok")  # type: ignore[assignment]
        now = time.perf_counter()
        ttft_ms = None
        if output.ttft_s is not None:
            ttft_ms = round((self.submitted_at - self.ctx.t0 + output.ttft_s) * 1000)
        # A remote backend's handle says where it ran (None if no engine took it); the embedded one's has none.
        placement: Placement | None = getattr(self.handle, "placement", EMBEDDED)
        explained = self.probe.finish(output.usage, ran=status == "ok") if self.probe is not None else None
        event = UsageEvent(
            request_id=self.ctx.request_id,
            tenant_id=self.ctx.principal.tenant_id,
            api_key_id=self.ctx.principal.api_key_id,
            model=self.model,
            endpoint=self.endpoint,
            started_at=self.ctx.started_at,
            counts=counts,
            ttft_ms=ttft_ms,
            latency_ms=round((now - self.ctx.t0) * 1000),
            status=status,
            backend=placement.backend if placement else None,
            engine_id=placement.engine_id if placement else None,
            predicted_cached_tokens=placement.predicted_cached_tokens if placement else None,
            cache_miss_reason=(explained.get("miss") or {}).get("reason") if explained else None,
            cache_explanation=json.dumps(explained, separators=(",", ":")) if explained else None,
        )
        cost: Decimal | None = None
        try:
            if await self.gw.recorder.record(event):
                cost = await self.gw.billing.settle(event)
            # Only now: until the record and its settlement are in, a crash must leave the request open.
            journal_end(self.gw, event.request_id)
        except Exception as error:
            if self.gw.db_health.observe(error):  # logged once per outage, not per request
                log.debug("usage_record_failed", request_id=event.request_id, error=str(error))
            else:
                log_failure(log, "usage_record_failed", request_id=event.request_id)
        if self.limits.input_tokens_per_minute is not None:
            try:
                # Cache reads do not count toward the input-token limit.
                await self.gw.limiter.adjust(
                    key_id=self.ctx.principal.api_key_id,
                    limits=self.limits,
                    requests=0,
                    input_tokens=self.reserved_input - (counts.prompt_tokens - counts.cache_read),
                )
            except Exception:
                log_failure(log, "rate_limit_settle_failed", request_id=event.request_id)
        self.gw.metrics.observe_usage(model=self.model, status=status, counts=counts, output=output)
        self.ctx.log.update(
            status_detail=status,
            prompt_tokens=counts.prompt_tokens,
            input_tokens=counts.input,
            cache_read_tokens=counts.cache_read,
            cache_write_tokens=counts.cache_writes,
            output_tokens=counts.output,
            ttft_ms=ttft_ms,
        )
        return Finished(output=output, counts=counts, status=status, cost_usd=cost, cache_explanation=explained)


@dataclass(frozen=True)
class RateAdmission:
    """A key's limits and the request unit taken for one request before its body was read."""

    limits: Limits
    decision: Decision | None

    @property
    def headers(self) -> dict[str, str]:
        return self.decision.headers() if self.decision else {}


async def admit_rate(gw: Gateway, *, ctx: RequestContext, counts_input_tokens: bool = True) -> RateAdmission:
    """Take one request unit before any parsing or rendering: a key over its limit gets a 429 for free.

    count_tokens passes counts_input_tokens=False: it takes a request unit from the same
    bucket and reserves no input tokens (as at Anthropic, counting tokens does not count
    toward input tokens per minute), so an exhausted input-token bucket does not refuse it.
    """
    limits = gw.limits_for(ctx.principal)
    if not counts_input_tokens:
        limits = Limits(requests_per_minute=limits.requests_per_minute)
    if not limits.enabled:
        return RateAdmission(limits, None)
    decision = await gw.limiter.acquire(key_id=ctx.principal.api_key_id, limits=limits, input_tokens=0)
    if not decision.allowed:
        raise RateLimitError(
            "rate limit exceeded for this API key; retry after the time in the retry-after header",
            retry_after_s=decision.retry_after_s,
            headers=decision.headers(),
        )
    return RateAdmission(limits, decision)


async def start_generation(
    gw: Gateway,
    *,
    ctx: RequestContext,
    endpoint: Endpoint,
    prepared: Prepared,
    rate: RateAdmission,
    fingerprint: Fingerprint | None = None,
) -> Generation:
    """Reserve the prompt's input tokens, admit the request to billing and hand it to the engine."""
    model, prompt, sampling = prepared.model, prepared.prompt, prepared.sampling
    ctx.log.update(model=model, prompt_tokens=len(prompt.token_ids))  # a refusal's record names the model
    await check_engine(gw)
    principal = ctx.principal
    share = FairShare(key=principal.tenant_id, weight=principal.scheduling_weight)
    try:  # a schema's grammar compiles on a thread, before anything is reserved: a 400 costs nothing
        await gw.engine.prepare(sampling, share=share)
    except EngineInvalidRequest as exc:
        raise InvalidRequestError(str(exc)) from exc
    limits, decision = rate.limits, rate.decision
    prompt_tokens = len(prompt.token_ids)
    reserved_input = 0
    if decision is not None and limits.input_tokens_per_minute is not None:
        decision = await gw.limiter.reserve(key_id=principal.api_key_id, limits=limits, input_tokens=prompt_tokens)
        reserved_input = decision.reserved_input_tokens

    async def refund() -> None:
        if decision is not None:
            await gw.limiter.adjust(key_id=principal.api_key_id, limits=limits, requests=1, input_tokens=reserved_input)

    admission = Admission(
        request_id=ctx.request_id,
        tenant_id=principal.tenant_id,
        api_key_id=principal.api_key_id,
        model=model,
        endpoint=endpoint,
        prompt_tokens=prompt_tokens,
        max_output_tokens=sampling.max_tokens,
        write_ttls_s=tuple(sorted({region.ttl_s for region in prepared.regions})),
    )
    try:
        await gw.billing.admit(admission)
    except BaseException:
        await refund()
        raise
    try:
        await journal_begin(gw, started_at=ctx.started_at, admission=admission)
    except BaseException:
        await refund()
        await gw.billing.release(admission)
        raise
    probe = probe_prompt(gw, tenant_id=principal.tenant_id, prepared=prepared, fingerprint=fingerprint)
    cache = CacheSpec(salt=tenant_salt(gw.secret, principal.tenant_id, prepared.client_salt), regions=prepared.regions)
    submitted_at = time.perf_counter()
    try:
        handle = gw.engine.submit(prompt.token_ids, sampling, cache, request_id=ctx.request_id, share=share)
    except BaseException as exc:
        journal_end(gw, ctx.request_id)
        await refund()
        await gw.billing.release(admission)
        if isinstance(exc, EngineOverloadedError):
            raise OverloadedError("Overloaded", retry_after_s=OVERLOADED_RETRY_S) from exc
        if isinstance(exc, EngineUnavailable):
            raise engine_unavailable(str(exc)) from exc
        if isinstance(exc, EngineInvalidRequest):
            raise InvalidRequestError(str(exc)) from exc
        raise
    return Generation(
        gw,
        ctx=ctx,
        model=model,
        endpoint=endpoint,
        handle=handle,
        prompt_tokens=prompt_tokens,
        limits=limits,
        reserved_input=reserved_input,
        decision=decision,
        submitted_at=submitted_at,
        probe=probe,
    )
