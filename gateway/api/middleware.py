"""Per-request context: request id, body-size limit, catch-all errors, one canonical log line."""

from __future__ import annotations

import secrets
import time

import structlog
from starlette.datastructures import Headers
from starlette.types import ASGIApp, Message, Receive, Scope, Send

from gateway.api.errors import dialect_for, render_error
from gateway.logs import log_failure
from kvgate.db import utcnow
from kvgate.errors import ApiError, InvalidRequestError, KvgateError, RequestTooLargeError

log = structlog.get_logger("kvgate.request")


class _BodyTooLarge(Exception):
    pass


class _NulByte(Exception):
    pass


# PostgreSQL text cannot hold NUL, so a NUL reaching a query is a database error (a 500).
# It is refused up front in paths and query strings, and in admin bodies (JSON \u0000),
# where strings are stored; API bodies may carry it in prompt text, which is never stored.
_JSON_NUL = b"\\u0000"


def _has_nul(scope: Scope) -> bool:
    return "\x00" in scope["path"] or b"%00" in scope.get("query_string", b"").lower()


def new_request_id() -> str:
    return "req_" + secrets.token_hex(12)


def _observe(scope: Scope, status: int, seconds: float) -> None:
    gw = getattr(scope["app"].state, "gateway", None)
    if gw is not None:
        # The route template, never the raw path: label values stay few.
        route = getattr(scope.get("route"), "path", "unmatched")
        gw.metrics.observe_request(route=route, status=status, seconds=seconds)


class RequestContextMiddleware:
    def __init__(self, app: ASGIApp, *, max_body_bytes: int) -> None:
        self.app = app
        self.max_body_bytes = max_body_bytes

    async def __call__(self, scope: Scope, receive: Receive, send: Send) -> None:
        if scope["type"] != "http":
            await self.app(scope, receive, send)
            return
        request_id = new_request_id()
        fields: dict[str, object] = {}
        state = scope.setdefault("state", {})
        state.update(request_id=request_id, t0=time.perf_counter(), started_at=utcnow(), log=fields)
        headers = Headers(scope=scope)
        path: str = scope["path"]
        status = 500
        started = False
        too_large = False

        async def send_with_id(message: Message) -> None:
            nonlocal status, started
            if message["type"] == "http.response.start":
                started = True
                status = message["status"]
                message["headers"] = [*message.get("headers", []), (b"request-id", request_id.encode())]
            await send(message)

        received = 0
        check_nul = path.startswith("/admin/")
        tail = b""
        nul = False

        async def limited_receive() -> Message:
            nonlocal received, too_large, tail, nul
            message = await receive()
            if message["type"] == "http.request":
                body = message.get("body", b"")
                received += len(body)
                if received > self.max_body_bytes:
                    too_large = True
                    raise _BodyTooLarge
                if check_nul:
                    window = tail + body
                    if _JSON_NUL in window.lower() or b"\x00" in body:
                        nul = True
                        raise _NulByte
                    tail = window[-(len(_JSON_NUL) - 1) :]
            return message

        async def app_send(message: Message) -> None:
            # The framework turns a failed body read into its own 400; ours wins.
            if not too_large and not nul:
                await send_with_id(message)

        async def fail(error: KvgateError) -> None:
            fields["error_type"] = error.anthropic_type
            response = render_error(error, dialect=dialect_for(path, headers), request_id=request_id)
            await response(scope, receive, send_with_id)

        with structlog.contextvars.bound_contextvars(request_id=request_id):
            try:
                declared = headers.get("content-length")
                if declared and declared.isdigit() and int(declared) > self.max_body_bytes:
                    raise _BodyTooLarge
                if _has_nul(scope):
                    raise _NulByte
                await self.app(scope, limited_receive, app_send)
                if too_large:
                    raise _BodyTooLarge
                if nul:
                    raise _NulByte
            except _BodyTooLarge:
                if not started:
                    await fail(RequestTooLargeError(f"request body exceeds {self.max_body_bytes} bytes"))
            except _NulByte:
                if not started:
                    await fail(InvalidRequestError("NUL characters are not allowed here"))
            except Exception:
                log_failure(log, "unhandled_error", path=path)
                if not started:
                    await fail(ApiError("Internal server error"))
            finally:
                seconds = time.perf_counter() - state["t0"]
                log.info(
                    "request",
                    method=scope["method"],
                    path=path,
                    status=status,
                    duration_ms=round(seconds * 1000, 2),
                    **fields,
                )
                _observe(scope, status, seconds)
