"""Refused requests as usage records (issue 27): a key over its rate limit (429) or a request whose worst-case
cost does not fit a budget (402, or 429 insufficient_quota on OpenAI's API) leaves a row in usage_records with
status "refused", the limit that refused it and, for a budget, the reserve that did not fit.

The row is written after the error response has gone (a background task of the response), so a refusal is
as fast as before. It carries no tokens, is billed nothing and never reaches the ledger; while the database
is away it is dropped, not spooled (billing.hooks.SpoolingUsageRecorder), since nothing was used.
"""

from __future__ import annotations

import time
from typing import Any

import structlog
from starlette.background import BackgroundTask
from starlette.requests import Request
from starlette.responses import Response

from gateway.state import Gateway
from kvgate.errors import KvgateError
from kvgate.usage import REFUSED, TokenCounts, UsageEvent

log = structlog.get_logger("kvgate.gateway")

# The usage record's endpoint for the inference routes; any other route is recorded by its path.
ENDPOINTS = {
    "/v1/messages": "messages",
    "/v1/chat/completions": "chat.completions",
    "/v1/completions": "completions",
    "/v1/responses": "responses",
}
MAX_ENDPOINT = 64


def refusal_event(state: dict[str, Any], error: KvgateError, *, path: str) -> UsageEvent | None:
    """The record of a refused tenant request; None for an error that is not a refusal, or a caller that is
    not a tenant's key (the admin API's lockout is a 429 too)."""
    fields = state.get("log")
    if error.refusal is None or not isinstance(fields, dict) or "request_id" not in state:
        return None
    tenant_id, api_key_id = fields.get("tenant_id"), fields.get("api_key_id")
    if not tenant_id or not api_key_id:
        return None
    return UsageEvent(
        request_id=state["request_id"],
        tenant_id=tenant_id,
        api_key_id=api_key_id,
        model=str(fields.get("model") or "")[:200],  # "" for a rate refusal: the body is not read before it
        endpoint=ENDPOINTS.get(path, path[:MAX_ENDPOINT]),  # type: ignore[arg-type]  # other routes by path
        started_at=state["started_at"],
        counts=TokenCounts(),
        ttft_ms=None,
        latency_ms=round((time.perf_counter() - state["t0"]) * 1000),
        status=REFUSED,
        refusal_reason=error.refusal,
        refusal_reserve_pico=error.refusal_reserve_pico,
    )


async def record_refusal(gw: Gateway, event: UsageEvent) -> None:
    try:
        await gw.recorder.record(event)
    except Exception as exc:  # a refusal is no usage: losing its record loses no money
        log.warning("refusal_not_recorded", request_id=event.request_id, error=str(exc))


def attach_refusal(request: Request, error: KvgateError, response: Response) -> None:
    """Record a refusal once `response` is sent."""
    gw = getattr(request.app.state, "gateway", None)
    event = refusal_event(request.scope.get("state", {}), error, path=request.url.path) if gw else None
    if event is not None:
        response.background = BackgroundTask(record_refusal, gw, event)
