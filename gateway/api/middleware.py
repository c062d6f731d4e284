"""Per-request context: request id, body size and time limits, catch-all errors, one canonical log line."""

from __future__ import annotations

import asyncio
import json
import secrets
import time

import structlog
from starlette.datastructures import Headers
from starlette.requests import ClientDisconnect
from starlette.types import ASGIApp, Message, Receive, Scope, Send

from gateway.api.errors import dialect_for, render_error
from gateway.logs import log_failure
from gateway.ratelimit import openai_rate_headers
from gateway.unicode_text import lone_surrogate, lone_surrogate_message, may_hold_surrogate
from kvgate.db import utcnow
from kvgate.db_health import is_database_unavailable
from kvgate.errors import (
    ApiError,
    InvalidRequestError,
    KvgateError,
    RequestTimeoutError,
    RequestTooLargeError,
    database_unavailable_error,
)

log = structlog.get_logger("kvgate.request")


class _BodyTooLarge(Exception):
    pass


class _NulByte(Exception):
    pass


class _BodyTimeout(Exception):
    pass


class _BadText(Exception):
    def __init__(self, message: str) -> None:
        super().__init__(message)
        self.message = message


# PostgreSQL text cannot hold NUL, so a NUL reaching a query is a database error (a 500).
# It is refused up front in paths and query strings, and in admin bodies (JSON \u0000),
# where strings are stored; API bodies may carry it in prompt text, which is never stored.
_JSON_NUL = b"\\u0000"

# Admin bodies are a name and a few numbers. FastAPI parses them on the event loop
# before the admin token is checked, so their size is capped well below the API's.
ADMIN_MAX_BODY_BYTES = 1024 * 1024


def _has_nul(scope: Scope) -> bool:
    return "\x00" in scope["path"] or b"%00" in scope.get("query_string", b"").lower()


def new_request_id() -> str:
    return "req_" + secrets.token_hex(12)


def _observe(scope: Scope, status: int, seconds: float) -> None:
    gw = getattr(scope["app"].state, "gateway", None)
    if gw is not None:
        # The route's full template, never the raw path: label values stay few.
        route = gw.metrics.route_label(scope.get("route"), scope["path"])
        gw.metrics.observe_request(route=route, status=status, seconds=seconds)


def _admin_text_problem(body: bytes) -> str | None:
    """Why an admin body's text cannot be stored (a lone surrogate), or None."""
    if not may_hold_surrogate(body):
        return None
    try:
        found = lone_surrogate(json.loads(body))
    except (ValueError, RecursionError):
        return None  # not JSON (or too deep for it): FastAPI says so
    return lone_surrogate_message(*found) if found else None


# Paths that carry a credential: a login link's token is as good as a session until spent.
SECRET_PATH_PREFIXES = ("/login/",)


def logged_path(path: str) -> str:
    """The path as the logs show it: a credential in it replaced by ***."""
    for prefix in SECRET_PATH_PREFIXES:
        if path.startswith(prefix) and len(path) > len(prefix):
            return prefix + "***"
    return path


def _database_unavailable(scope: Scope, error: BaseException) -> bool:
    gw = getattr(scope["app"].state, "gateway", None)
    if gw is not None:
        return gw.db_health.observe(error)
    return is_database_unavailable(error)


class RequestContextMiddleware:
    """Request id, log line and catch-all 500 for every request; and the body's limits.

    A body larger than max_body_bytes (1 MiB on /admin) is a 413. A body still
    incomplete body_timeout_s after the request's headers is a 408 with
    `connection: close`, as soon as the app waits for the rest of it.
    """

    def __init__(self, app: ASGIApp, *, max_body_bytes: int, body_timeout_s: float | None = None) -> None:
        self.app = app
        self.max_body_bytes = max_body_bytes
        self.body_timeout_s = body_timeout_s

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
        timed_out = False
        limit = min(self.max_body_bytes, ADMIN_MAX_BODY_BYTES) if path.startswith("/admin/") else self.max_body_bytes
        deadline = None if self.body_timeout_s is None else asyncio.get_running_loop().time() + self.body_timeout_s
        body_done = False
        admin_body: list[bytes] = []
        bad_text: str | None = None

        async def send_with_id(message: Message) -> None:
            nonlocal status, started
            if message["type"] == "http.response.start":
                started = True
                status = message["status"]
                # request-id is Anthropic's header, x-request-id OpenAI's (the SDKs' `_request_id`); both, everywhere.
                rid = request_id.encode()
                message["headers"] = [*message.get("headers", []), (b"request-id", rid), (b"x-request-id", rid)]
                if dialect_for(path, headers) == "openai":  # rate limits under OpenAI's names there
                    message["headers"] = openai_rate_headers(message["headers"], now=time.time())
            await send(message)

        received = 0
        check_nul = path.startswith("/admin/")
        tail = b""
        nul = False

        async def timed_receive() -> Message:
            nonlocal timed_out
            if body_done or deadline is None:
                return await receive()  # after the body: only a disconnect can come, whenever it does
            try:
                async with asyncio.timeout_at(deadline):
                    return await receive()
            except TimeoutError:
                timed_out = True
                raise _BodyTimeout from None

        async def limited_receive() -> Message:
            nonlocal received, too_large, tail, nul, body_done, bad_text
            message = await timed_receive()
            if message["type"] == "http.request":
                body = message.get("body", b"")
                body_done = not message.get("more_body", False)
                received += len(body)
                if received > limit:
                    too_large = True
                    raise _BodyTooLarge
                if check_nul:
                    window = tail + body
                    if _JSON_NUL in window.lower() or b"\x00" in body:
                        nul = True
                        raise _NulByte
                    tail = window[-(len(_JSON_NUL) - 1) :]
                    admin_body.append(body)
                    if body_done:
                        bad_text = _admin_text_problem(b"".join(admin_body))
                        if bad_text is not None:
                            raise _BadText(bad_text)
            return message

        async def app_send(message: Message) -> None:
            # The framework turns a failed body read into its own 400; ours wins.
            if not too_large and not nul and not timed_out and bad_text is None:
                await send_with_id(message)

        async def fail(error: KvgateError) -> None:
            fields["error_type"] = error.anthropic_type
            response = render_error(error, dialect=dialect_for(path, headers), request_id=request_id)
            await response(scope, receive, send_with_id)

        with structlog.contextvars.bound_contextvars(request_id=request_id):
            try:
                declared = headers.get("content-length")
                if declared and declared.isdigit() and int(declared) > limit:
                    raise _BodyTooLarge
                if _has_nul(scope):
                    raise _NulByte
                await self.app(scope, limited_receive, app_send)
                if too_large:
                    raise _BodyTooLarge
                if nul:
                    raise _NulByte
                if timed_out:
                    raise _BodyTimeout
                if bad_text is not None:
                    raise _BadText(bad_text)
            except _BodyTooLarge:
                if not started:
                    # Closing spares reading the rest; clients still get the answer (see gateway.api.body).
                    await fail(
                        RequestTooLargeError(f"request body exceeds {limit} bytes", headers={"connection": "close"})
                    )
            except _NulByte:
                if not started:
                    await fail(InvalidRequestError("NUL characters are not allowed here"))
            except _BadText as exc:
                if not started:
                    await fail(InvalidRequestError(exc.message))
            except _BodyTimeout:
                if not started:
                    # The rest of the body may still be on its way: the connection cannot be reused.
                    await fail(
                        RequestTimeoutError(
                            f"the request body did not arrive within {self.body_timeout_s:g} seconds",
                            headers={"connection": "close"},
                        )
                    )
            except ClientDisconnect:
                status = 499  # the client left while sending its body: nobody to answer
            except Exception as error:
                if _database_unavailable(scope, error):
                    # Logged once per outage by the database's health, not once per request.
                    if not started:
                        await fail(database_unavailable_error(path))
                else:
                    log_failure(log, "unhandled_error", path=logged_path(path))
                    if not started:
                        await fail(ApiError("Internal server error"))
            finally:
                seconds = time.perf_counter() - state["t0"]
                log.info(
                    "request",
                    method=scope["method"],
                    path=logged_path(path),
                    status=status,
                    duration_ms=round(seconds * 1000, 2),
                    **fields,
                )
                _observe(scope, status, seconds)
