"""Slow and idle clients cannot hold connections: header, body and keep-alive timeouts, over raw sockets.

The server here has 1-second timeouts; each negative case is paired with a client
that is slow but within them, and is served.
"""

from __future__ import annotations

import json
import socket
import threading
import time
from collections.abc import Iterator
from pathlib import Path

import httpx
import pytest

from tests.gateway.harness import GatewayServer

TIMEOUT_S = 1.0


@pytest.fixture(scope="module")
def server(tiny_llama_dir: Path, tmp_path_factory: pytest.TempPathFactory) -> Iterator[GatewayServer]:
    url = f"sqlite:///{tmp_path_factory.mktemp('timeouts') / 'kvgate.db'}"
    gateway = GatewayServer(
        model_dir=tiny_llama_dir,
        database_url=url,
        header_timeout_s=TIMEOUT_S,
        body_timeout_s=TIMEOUT_S,
        keep_alive_timeout_s=TIMEOUT_S,
    ).start()
    try:
        yield gateway
    finally:
        gateway.stop()


def connect(server: GatewayServer) -> socket.socket:
    return socket.create_connection(("127.0.0.1", server.port), timeout=10)


def seconds_until_closed(
    sock: socket.socket, *, trickle: bytes = b"", every_s: float = 0.2, limit_s: float = 8
) -> float:
    """Send `trickle` a byte at a time (then nothing) until the server closes the connection."""
    started = time.monotonic()
    sock.settimeout(every_s)
    pending = iter(trickle)
    while time.monotonic() - started < limit_s:
        try:
            byte = next(pending, None)
            if byte is not None:
                sock.sendall(bytes([byte]))
            if sock.recv(65536) == b"":
                return time.monotonic() - started
        except TimeoutError:
            continue
        except (ConnectionResetError, BrokenPipeError):
            return time.monotonic() - started
    return float("inf")


def read_response(sock: socket.socket) -> bytes:
    sock.settimeout(10)
    data = b""
    while b"\r\n\r\n" not in data:
        chunk = sock.recv(65536)
        if not chunk:
            break
        data += chunk
    head, _, rest = data.partition(b"\r\n\r\n")
    length = next(
        (int(line.split(b":")[1]) for line in head.split(b"\r\n") if line.lower().startswith(b"content-length")), 0
    )
    while len(rest) < length:
        chunk = sock.recv(65536)
        if not chunk:
            break
        rest += chunk
    return head + b"\r\n\r\n" + rest


def test_a_client_sending_headers_slowly_is_cut_while_others_are_served(server: GatewayServer) -> None:
    endless = b"GET /healthz HTTP/1.1\r\n" + b"x-slow: " + b"a" * 1000
    result: list[float] = []
    slow = threading.Thread(target=lambda: result.append(seconds_until_closed(connect(server), trickle=endless)))
    slow.start()
    time.sleep(0.3)
    assert httpx.get(f"{server.base_url}/healthz").status_code == 200  # everyone else is served meanwhile
    slow.join()
    assert TIMEOUT_S * 0.8 <= result[0] < TIMEOUT_S + 3, result
    # Slow, but complete within the timeout: served.
    with connect(server) as sock:
        for piece in (b"GET /healthz HTTP/1.1\r\n", b"host: x\r\n", b"\r\n"):
            sock.sendall(piece)
            time.sleep(0.2)
        assert read_response(sock).startswith(b"HTTP/1.1 200")


def test_a_connection_that_never_sends_is_closed(server: GatewayServer) -> None:
    with connect(server) as sock:
        assert seconds_until_closed(sock) < TIMEOUT_S + 3


def test_a_stalled_body_gets_408_and_a_slow_complete_one_is_served(server: GatewayServer) -> None:
    key = server.new_key()
    body = json.dumps({"model": server.model, "messages": [{"role": "user", "content": "Hello"}]}).encode()
    head = (
        f"POST /v1/messages/count_tokens HTTP/1.1\r\nhost: x\r\nx-api-key: {key.key}\r\n"
        f"content-type: application/json\r\ncontent-length: {len(body)}\r\n\r\n"
    ).encode()
    with connect(server) as sock:
        sock.sendall(head + body[:10])  # and then nothing
        started = time.monotonic()
        response = read_response(sock)
        assert response.startswith(b"HTTP/1.1 408"), response
        assert time.monotonic() - started < TIMEOUT_S + 3
        assert b"connection: close" in response.lower()
        assert b"did not arrive within 1 seconds" in response
        assert sock.recv(65536) == b""  # closed
    with connect(server) as sock:
        sock.sendall(head + body[:10])
        time.sleep(TIMEOUT_S / 3)
        sock.sendall(body[10:])
        response = read_response(sock)
        assert response.startswith(b"HTTP/1.1 200") and b"input_tokens" in response, response


def test_a_stalled_admin_body_is_cut_too(server: GatewayServer) -> None:
    with connect(server) as sock:
        sock.sendall(
            b"POST /admin/v1/tenants HTTP/1.1\r\nhost: x\r\nauthorization: Bearer test-admin-token\r\n"
            b'content-type: application/json\r\ncontent-length: 50\r\n\r\n{"name"'
        )
        assert read_response(sock).startswith(b"HTTP/1.1 408")


def test_idle_keep_alive_connections_are_closed(server: GatewayServer) -> None:
    request = b"GET /healthz HTTP/1.1\r\nhost: x\r\n\r\n"
    with connect(server) as sock:
        sock.sendall(request)
        assert read_response(sock).startswith(b"HTTP/1.1 200")
        time.sleep(TIMEOUT_S / 3)
        sock.sendall(request)  # reused within the timeout: served
        assert read_response(sock).startswith(b"HTTP/1.1 200")
        assert seconds_until_closed(sock) < TIMEOUT_S + 2
    with connect(server) as sock:
        # Stray bytes between requests do not keep a connection open.
        sock.sendall(request)
        assert read_response(sock).startswith(b"HTTP/1.1 200")
        assert seconds_until_closed(sock, trickle=b"\r\n" * 40) < TIMEOUT_S + 3
