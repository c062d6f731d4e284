"""A lean HTTP/1.1 load generator for the gateway benchmark: keep-alive connections, one request in flight on each.

httpx spends more CPU per request than the gateway it measures (about 2 ms on the 2-core
benchmark machine, where the gateway and the client share the cores), so at concurrency 32
the client, not the server, set the requests/s. This client writes a pre-built request and
parses the response with httptools (llhttp, as uvicorn does), on uvloop: a few tens of
microseconds per request. It is still a real HTTP round trip over TCP, so the latency it
sees includes the kernel's and the server's whole HTTP handling.
"""

from __future__ import annotations

import asyncio
import time
from collections.abc import Awaitable, Callable
from typing import Any, TypeVar

import httptools
import uvloop

T = TypeVar("T")


def run(main: Callable[[], Awaitable[T]]) -> T:
    """Run a load coroutine on uvloop (the client's own event loop costs less CPU too)."""
    with asyncio.Runner(loop_factory=uvloop.new_event_loop) as runner:
        return runner.run(main())


def build_request(host: str, port: int, path: str, headers: dict[str, str], body: bytes) -> bytes:
    lines = [f"POST {path} HTTP/1.1", f"host: {host}:{port}", "content-type: application/json"]
    lines += [f"content-length: {len(body)}", *(f"{name}: {value}" for name, value in headers.items())]
    return ("\r\n".join(lines) + "\r\n\r\n").encode() + body


class _Connection(asyncio.Protocol):
    """One keep-alive connection; request() sends a whole request and waits for the whole response."""

    def __init__(self) -> None:
        self.transport: asyncio.Transport | None = None
        self.parser = httptools.HttpResponseParser(self)
        self.waiter: asyncio.Future[int] | None = None
        self.reusable = True

    def connection_made(self, transport: Any) -> None:
        self.transport = transport

    def data_received(self, data: bytes) -> None:
        try:
            self.parser.feed_data(data)
        except httptools.HttpParserError as exc:
            self._fail(ConnectionError(f"bad response: {exc}"))

    def on_message_complete(self) -> None:
        self.reusable = self.parser.should_keep_alive()
        if self.waiter is not None and not self.waiter.done():
            self.waiter.set_result(self.parser.get_status_code())

    def connection_lost(self, exc: Exception | None) -> None:
        self.reusable = False
        self._fail(ConnectionError("the server closed the connection"))

    def _fail(self, error: Exception) -> None:
        if self.waiter is not None and not self.waiter.done():
            self.waiter.set_exception(error)

    async def request(self, payload: bytes) -> int:
        assert self.transport is not None
        self.waiter = asyncio.get_running_loop().create_future()
        self.transport.write(payload)
        return await self.waiter

    def close(self) -> None:
        if self.transport is not None:
            self.transport.close()


class Client:
    """`concurrency` connections to host:port, each sending `payload` one request at a time."""

    def __init__(self, host: str, port: int, payload: bytes) -> None:
        self.host, self.port, self.payload = host, port, payload

    async def _connect(self) -> _Connection:
        _, connection = await asyncio.get_running_loop().create_connection(_Connection, self.host, self.port)
        return connection

    async def _send(self, connection: _Connection) -> tuple[_Connection, int]:
        """Send once; on a connection the server had closed (keep-alive timeout), once more on a new one."""
        if connection.reusable:
            try:
                return connection, await connection.request(self.payload)
            except ConnectionError:
                connection.close()
        connection = await self._connect()
        return connection, await connection.request(self.payload)

    async def run(self, total: int, *, concurrency: int, warmup: int = 0) -> tuple[float, list[float]]:
        """(seconds for `total` requests, each request's latency in seconds); `warmup` requests on
        each connection first, not counted. Any status but 200 is an error."""
        connections = [await self._connect() for _ in range(concurrency)]
        remaining = total
        latencies: list[float] = []

        async def send(index: int) -> None:
            connections[index], status = await self._send(connections[index])
            if status != 200:
                raise RuntimeError(f"the gateway answered {status}")

        async def worker(index: int) -> None:
            nonlocal remaining
            while remaining > 0:
                remaining -= 1
                started = time.perf_counter()
                await send(index)
                latencies.append(time.perf_counter() - started)

        try:
            for _ in range(warmup):
                await asyncio.gather(*(send(i) for i in range(concurrency)))
            started = time.perf_counter()
            await asyncio.gather(*(worker(i) for i in range(concurrency)))
            return time.perf_counter() - started, latencies
        finally:
            for connection in connections:
                connection.close()
