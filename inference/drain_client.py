"""`kvgate engine drain URL`: start an engine server's drain and follow it until the server is gone."""

from __future__ import annotations

import time
from collections.abc import Callable

import httpx

POLL_S = 0.5
# Once drained, a server exits within its shutdown grace (KV write-out included); beyond this, say so.
EXIT_WAIT_S = 120.0


class DrainFailed(Exception):
    pass


def _error(response: httpx.Response) -> str:
    try:
        return str(response.json()["error"]["message"])
    except (ValueError, KeyError, TypeError):
        return response.text[:200] or response.reason_phrase


def drain_engine(
    url: str, *, timeout_s: float | None = None, token: str | None = None, say: Callable[[str], None] = print
) -> None:
    """Drain the engine server at `url` and return once it has exited; DrainFailed if it could not."""
    headers = {"authorization": f"Bearer {token}"} if token else {}
    body = {"timeout_s": timeout_s} if timeout_s is not None else {}
    with httpx.Client(base_url=url.rstrip("/"), headers=headers, timeout=30) as client:
        try:
            response = client.post("/drain", json=body)
        except httpx.TransportError as exc:
            raise DrainFailed(f"cannot reach the engine server at {url}: {exc}") from None
        if response.status_code != 202:
            raise DrainFailed(f"the engine server refused to drain ({response.status_code}): {_error(response)}")
        say(f"draining {url}: {response.json()['in_flight']} request(s) in flight; /health now answers 503")
        last_in_flight: int | None = None
        drained_at: float | None = None
        while True:
            time.sleep(POLL_S)
            try:
                status = client.get("/drain").json()
            except (httpx.TransportError, ValueError):
                say(f"{url} has exited (its KV written out to its disk tier, if it has one)")
                return
            if status["in_flight"] != last_in_flight and not status["drained"]:
                last_in_flight = status["in_flight"]
                say(f"  {last_in_flight} request(s) in flight")
            if status["drained"]:
                drained_at = drained_at or time.monotonic()
                if time.monotonic() - drained_at > EXIT_WAIT_S:
                    raise DrainFailed(f"{url} is drained but still answering after {EXIT_WAIT_S:.0f} s")
