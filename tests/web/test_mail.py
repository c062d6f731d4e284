"""Login links by mail (KVGATE_SMTP_URL), to a local SMTP server (aiosmtpd): the mailed link logs in."""

from __future__ import annotations

import os
import re
import subprocess
import sys
import time
from collections.abc import Iterator
from email import message_from_bytes
from email.message import Message
from typing import Any

import pytest
from aiosmtpd.controller import Controller

from kvgate import REPO_ROOT
from tests.gateway.harness import free_port
from tests.web.conftest import Dashboard
from web.settings import WebSettings

pytestmark = pytest.mark.timeout(300)


class Inbox:
    def __init__(self) -> None:
        self.messages: list[Message] = []

    async def handle_DATA(self, server: Any, session: Any, envelope: Any) -> str:
        self.messages.append(message_from_bytes(envelope.content))
        return "250 OK"

    def wait_for(self, count: int, timeout_s: float = 30) -> list[Message]:
        deadline = time.monotonic() + timeout_s
        while len(self.messages) < count:
            assert time.monotonic() < deadline, "no mail arrived"
            time.sleep(0.05)
        return self.messages


@pytest.fixture
def smtp() -> Iterator[tuple[Inbox, str]]:
    inbox = Inbox()
    port = free_port()
    controller = Controller(inbox, hostname="127.0.0.1", port=port)
    controller.start()
    try:
        yield inbox, f"smtp://127.0.0.1:{port}"
    finally:
        controller.stop()


def _link(message: Message) -> str:
    body = message.get_payload(decode=True).decode()
    found = re.search(r"(http://\S+/login/\S+)", body)
    assert found, body
    return found.group(1)


def test_the_admin_api_mails_the_link_when_smtp_is_set(dashboard: Dashboard, smtp) -> None:
    inbox, url = smtp
    tenant = dashboard.new_tenant("Mailed Co")
    quiet = dashboard.admin.post(f"/admin/v1/tenants/{tenant}/members", json={"email": "quiet@example.com"})
    assert quiet.json()["emailed"] is False and inbox.messages == []  # no SMTP: nothing sent
    with dashboard.web_settings(WebSettings(smtp_url=url, smtp_from="dash@example.com")):
        body = dashboard.admin.post(f"/admin/v1/tenants/{tenant}/members", json={"email": "Lin@Example.com"}).json()
    assert body["emailed"] is True and body["mail_error"] is None
    (message,) = inbox.wait_for(1)
    assert message["To"] == "lin@example.com" and message["From"] == "dash@example.com"
    assert "Mailed Co" in message["Subject"]
    assert _link(message) == body["login_url"]
    with dashboard.client_for(_link(message)) as client:
        assert "Mailed Co" in client.get("/").text


def test_a_failed_delivery_still_returns_the_link(dashboard: Dashboard) -> None:
    tenant = dashboard.new_tenant()
    dead = f"smtp://127.0.0.1:{free_port()}"  # nothing listens there
    with dashboard.web_settings(WebSettings(smtp_url=dead)):
        body = dashboard.admin.post(f"/admin/v1/tenants/{tenant}/members", json={"email": "x@example.com"}).json()
    assert body["emailed"] is False and body["mail_error"]
    dashboard.client_for(body["login_url"]).close()


def test_the_cli_mails_the_link_too(dashboard: Dashboard, smtp) -> None:
    inbox, url = smtp
    tenant = dashboard.new_tenant("CLI Mail")
    settings = dashboard.server.settings
    env = {
        **os.environ,
        "PYTHONPATH": str(REPO_ROOT),
        "KVGATE_DATABASE_URL": settings.database_url,
        "KVGATE_PORT": str(settings.port),
        "KVGATE_SMTP_URL": url,
    }
    result = subprocess.run(
        [sys.executable, "-m", "kvgate.cli", "members", "invite", tenant, "cli@example.com"],
        env=env,
        capture_output=True,
        text=True,
        timeout=300,
        check=False,
    )
    assert result.returncode == 0, result.stderr
    assert "mailed the link to cli@example.com" in result.stderr
    (message,) = inbox.wait_for(1)
    assert _link(message) == result.stdout.strip()
