"""The operator's /login form slows down wrong admin tokens per client address (issue 25).

The guesser connects from 127.0.0.2 and the real operator from 127.0.0.1 (both loopback on
Linux, two client addresses to the server): the guesser is locked out, the operator is not.
"""

from __future__ import annotations

import time

import httpx

from gateway.admin_attempts import FREE_FAILURES
from tests.gateway.harness import ADMIN_TOKEN
from tests.web.conftest import Dashboard, csrf_token


def _client_from(dashboard: Dashboard, address: str) -> httpx.Client:
    transport = httpx.HTTPTransport(local_address=address)
    return httpx.Client(base_url=dashboard.base_url, timeout=60, follow_redirects=False, transport=transport)


def test_wrong_admin_tokens_lock_out_their_address_on_login_and_not_the_operators(dashboard: Dashboard) -> None:
    with _client_from(dashboard, "127.0.0.2") as guesser, _client_from(dashboard, "127.0.0.1") as operator:
        form = {"csrf_token": csrf_token(guesser.get("/login").text)}
        for attempt in range(FREE_FAILURES + 1):
            wrong = guesser.post("/login", data={**form, "admin_token": f"guess-{attempt}"})
            assert wrong.status_code == 401, (attempt, wrong.text)
        locked = guesser.post("/login", data={**form, "admin_token": "guess-again"})
        assert locked.status_code == 429 and int(locked.headers["retry-after"]) >= 1
        assert "too many wrong admin tokens" in locked.text
        # While locked, not even the right token is tried from that address: a guess cannot be confirmed.
        right_but_locked = guesser.post("/login", data={**form, "admin_token": ADMIN_TOKEN})
        assert right_but_locked.status_code == 429 and "kvgate_session" not in right_but_locked.headers.get(
            "set-cookie", ""
        )

        # The operator, from another address, is neither slowed nor locked out.
        operator_form = {"csrf_token": csrf_token(operator.get("/login").text), "admin_token": ADMIN_TOKEN}
        started = time.monotonic()
        logged_in = operator.post("/login", data=operator_form)
        assert logged_in.status_code == 303 and logged_in.headers["location"] == "/admin"
        assert time.monotonic() - started < 5

        # Once the lock-out has passed, the right token works from the guesser's address too (and clears it).
        time.sleep(int(locked.headers["retry-after"]) + 0.2)
        cleared = guesser.post("/login", data={**form, "admin_token": ADMIN_TOKEN})
        assert cleared.status_code == 303, cleared.text
        assert guesser.post("/login", data={**form, "admin_token": "one-more-guess"}).status_code == 401
