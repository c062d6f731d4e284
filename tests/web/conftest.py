"""Dashboard fixtures: a running kvgate server with real billing, a Chromium driven by Playwright, and helpers.

- `dashboard`: one server for the session (kvgate.app.create_app, so web/ is mounted; billing's real hooks;
  SQLite, tiny Llama). `pg_dashboard` is the same on PostgreSQL; `any_dashboard` runs a test on both.
  Tests isolate by making their own tenants, members and keys.
- `browser`: Debian's chromium (/usr/bin/chromium, or KVGATE_TEST_CHROMIUM) launched by Playwright from PyPI
  through its executable path; Playwright never downloads a browser here. Where Chromium is missing, every
  test that needs it skips with a loud message (and the run ends with a banner saying so).
- `page`: a fresh browser context (its own cookies) per test.
- helpers on the Dashboard: new_tenant, new_key, invite / new_member (a member and its login link), new_link,
  login(page, link), operator_login(page), client_for(link) / operator_client() (logged-in httpx clients),
  ask(key) (a request with a cached system prompt), ledger / wait_for_ledger (the ledger's sums), set_budget,
  web_settings(...) (swap the server's dashboard settings); and csrf_token(html).
"""

from __future__ import annotations

import asyncio
import os
import re
import shutil
import time
import uuid
from collections.abc import Iterator
from contextlib import contextmanager
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import httpx
import pytest
import sqlalchemy as sa

from tests.gateway.harness import ADMIN_TOKEN, GatewayServer, Key, pg_reachable, postgres_database
from web.settings import WebSettings

CHROMIUM_CANDIDATES = ("/usr/bin/chromium", "/usr/bin/chromium-browser")
NO_CHROMIUM = (
    "\n" + "!" * 100 + "\n"
    "BROWSER TESTS SKIPPED: Chromium is not installed, so the dashboard was NOT tested in a browser.\n"
    "Install it with `apt-get install -y chromium` (`make test` does when it may), or point KVGATE_TEST_CHROMIUM\n"
    "at a Chromium binary. Playwright's own browser download is not used.\n" + "!" * 100
)
# Long enough to cache (the test server's minimum is 64 tokens): a write on first use, then reads.
SYSTEM = "You are a careful assistant who answers briefly. " * 30
LEDGER_SUMS = (
    "input_tokens",
    "cache_write_5m_tokens",
    "cache_write_30m_tokens",
    "cache_write_1h_tokens",
    "cache_write_12h_tokens",
    "cache_write_24h_tokens",
    "cache_read_tokens",
    "output_tokens",
    "cost_pico",
    "uncached_cost_pico",
)
_CSRF_FIELD = re.compile(r'name="csrf_token" value="([^"]+)"')
_skipped_for_chromium: list[str] = []


def chromium_path() -> str | None:
    configured = os.environ.get("KVGATE_TEST_CHROMIUM")
    if configured:
        return configured if os.access(configured, os.X_OK) else None
    for candidate in CHROMIUM_CANDIDATES:
        if os.access(candidate, os.X_OK):
            return candidate
    return shutil.which("chromium")


def pytest_terminal_summary(terminalreporter: Any) -> None:
    if _skipped_for_chromium:
        terminalreporter.write_line(NO_CHROMIUM, red=True, bold=True)


@dataclass
class Member:
    tenant_id: str
    member_id: str
    email: str
    role: str
    login_url: str


class Dashboard:
    """A running kvgate (gateway + billing + dashboard) and what tests do with it."""

    def __init__(self, server: GatewayServer) -> None:
        self.server = server
        self.base_url = server.base_url
        self.admin = server.admin

    def new_tenant(self, name: str | None = None) -> str:
        return self.server.new_tenant(name or f"Tenant {uuid.uuid4().hex[:6]}")

    def new_key(self, tenant_id: str, **body: Any) -> Key:
        return self.server.new_key(tenant_id, **body)

    def invite(self, tenant_id: str, *, email: str | None = None, role: str = "admin") -> Member:
        email = email or f"m{uuid.uuid4().hex[:8]}@example.com"
        response = self.admin.post(f"/admin/v1/tenants/{tenant_id}/members", json={"email": email, "role": role})
        response.raise_for_status()
        data = response.json()
        return Member(tenant_id, data["id"], data["email"], data["role"], data["login_url"])

    def new_link(self, member: Member) -> str:
        response = self.admin.post(f"/admin/v1/tenants/{member.tenant_id}/members/{member.member_id}/login-links")
        response.raise_for_status()
        return response.json()["login_url"]

    def new_member(self, name: str | None = None, *, role: str = "admin") -> Member:
        """A fresh tenant with one member."""
        return self.invite(self.new_tenant(name), role=role)

    @contextmanager
    def web_settings(self, settings: WebSettings) -> Iterator[None]:
        """The running server's dashboard settings swapped for a test (as if KVGATE_PUBLIC_URL etc. were set)."""
        state = self.server.app.state
        previous = state.web_settings
        state.web_settings = settings
        try:
            yield
        finally:
            state.web_settings = previous

    # -- usage ---------------------------------------------------------------------------------

    def ask(self, key: Key, question: str = "Hi?", *, max_tokens: int = 4) -> Any:
        """One Anthropic request with a cached system prompt (the tenant's first writes it, later ones read)."""
        system = [{"type": "text", "text": SYSTEM, "cache_control": {"type": "ephemeral"}}]
        return self.server.anthropic(key).messages.create(
            model=self.server.model,
            max_tokens=max_tokens,
            system=system,
            messages=[{"role": "user", "content": question}],
        )

    def ledger(self, tenant_id: str) -> dict[str, int]:
        """The tenant's ledger summed: requests (its usage entries; a reversal corrects one, it does not undo it),
        every token column and the costs."""
        sums = ", ".join(f"COALESCE(SUM({c}), 0) AS {c}" for c in LEDGER_SUMS)
        query = (
            f"SELECT COALESCE(SUM(CASE kind WHEN 'usage' THEN 1 ELSE 0 END), 0) AS requests, "
            f"{sums} FROM ledger_entries WHERE tenant_id = :t"
        )
        with self.server.db.connect() as conn:
            row = conn.execute(sa.text(query), {"t": tenant_id}).mappings().one()
        return {name: int(value) for name, value in row.items()}

    def wait_for_ledger(self, tenant_id: str, requests: int, timeout_s: float = 60) -> dict[str, int]:
        """The ledger once it holds `requests` requests (usage is written in the background)."""
        deadline = time.monotonic() + timeout_s
        while (sums := self.ledger(tenant_id))["requests"] < requests:
            assert time.monotonic() < deadline, f"the ledger has {sums['requests']} of {requests} requests"
            time.sleep(0.1)
        return sums

    def set_budget(self, tenant_id: str, monthly_limit_usd: str | None) -> None:
        response = self.admin.put(
            f"/admin/v1/tenants/{tenant_id}/budget", json={"monthly_limit_usd": monthly_limit_usd}
        )
        response.raise_for_status()

    # -- browsers ---------------------------------------------------------------------------

    def login(self, page: Any, link: str) -> None:
        """Open a login link in `page`; it lands on the Overview."""
        page.goto(link)
        page.wait_for_url(f"{self.base_url}/")

    def operator_login(self, page: Any) -> None:
        page.goto(f"{self.base_url}/login")
        page.fill("input[name=admin_token]", ADMIN_TOKEN)
        page.click("text=Log in as operator")
        page.wait_for_url(f"{self.base_url}/admin")

    # -- plain HTTP ---------------------------------------------------------------------------

    def client(self, cookies: dict[str, str] | None = None) -> httpx.Client:
        """A cookie-keeping client that does not follow redirects (tests look at them)."""
        return httpx.Client(base_url=self.base_url, timeout=60, follow_redirects=False, cookies=cookies)

    def client_for(self, link: str) -> httpx.Client:
        """A new client logged in by `link` (a member): its session cookie set, not yet opened."""
        with self.client() as opener:
            response = opener.get(link.removeprefix(self.base_url))
            assert response.status_code == 303 and response.headers["location"] == "/", response.text
            cookies = dict(opener.cookies)
        return self.client(cookies)

    def operator_client(self) -> httpx.Client:
        with self.client() as opener:
            token = csrf_token(opener.get("/login").text)
            response = opener.post("/login", data={"admin_token": ADMIN_TOKEN, "csrf_token": token})
            assert response.status_code == 303, response.text
            cookies = {"kvgate_session": opener.cookies["kvgate_session"]}
        return self.client(cookies)


def csrf_token(html: str) -> str:
    """The CSRF token in a page's forms."""
    found = _CSRF_FIELD.search(html)
    assert found, "the page has no form with a CSRF token"
    return found.group(1)


def _start(model_dir: Path, database_url: str, spool_dir: Path) -> GatewayServer:
    with pytest.MonkeyPatch.context() as mp:
        mp.setenv("KVGATE_SPOOL_PATH", str(spool_dir / "spool.jsonl"))
        # Invoices are made by the tests that want them, not by the background finalizer.
        mp.setenv("KVGATE_AUTO_FINALIZE_INVOICES", "false")
        mp.delenv("KVGATE_PUBLIC_URL", raising=False)
        mp.delenv("KVGATE_SMTP_URL", raising=False)
        return GatewayServer(model_dir=model_dir, database_url=database_url, discover_billing=True).start()


@pytest.fixture(scope="session")
def dashboard(tiny_llama_dir: Path, tmp_path_factory: pytest.TempPathFactory) -> Iterator[Dashboard]:
    root = tmp_path_factory.mktemp("dashboard")
    server = _start(tiny_llama_dir, f"sqlite:///{root / 'kvgate.db'}", root)
    try:
        yield Dashboard(server)
    finally:
        server.stop()


@pytest.fixture(scope="session")
def pg_dashboard(tiny_llama_dir: Path, tmp_path_factory: pytest.TempPathFactory) -> Iterator[Dashboard]:
    if not pg_reachable():
        pytest.skip("PostgreSQL is not reachable at 127.0.0.1:5432")
    with postgres_database(prefix="kvgate_web_test") as url:
        server = _start(tiny_llama_dir, url, tmp_path_factory.mktemp("pg-dashboard"))
        try:
            yield Dashboard(server)
        finally:
            server.stop()


@pytest.fixture(scope="session", params=["sqlite", pytest.param("postgres", marks=pytest.mark.postgres)])
def any_dashboard(request: pytest.FixtureRequest) -> Dashboard:
    """The dashboard on each database backend (for the plain-HTTP tests)."""
    return request.getfixturevalue("dashboard" if request.param == "sqlite" else "pg_dashboard")


@dataclass
class _Playwright:
    manager: Any
    browser: Any

    def resume(self) -> None:
        """Between its calls, Playwright's sync API leaves its event loop marked as this thread's running loop;
        that would stop every async test after it (pytest-asyncio cannot run a loop inside another). Browser
        tests mark it again before they start, and unmark it when they end (see `browser`)."""
        asyncio._set_running_loop(self.manager._loop)

    @staticmethod
    def pause() -> None:
        asyncio._set_running_loop(None)


@pytest.fixture(scope="session")
def _playwright() -> Iterator[_Playwright]:
    path = chromium_path()
    if path is None:
        _skipped_for_chromium.append("browser")
        pytest.skip(NO_CHROMIUM)
    os.environ.setdefault("PLAYWRIGHT_SKIP_BROWSER_DOWNLOAD", "1")
    from playwright.sync_api import sync_playwright

    # Chromium's sandbox needs user namespaces, which containers (and root) often lack.
    args = ["--no-sandbox"] if os.geteuid() == 0 or os.environ.get("CI") else []
    manager = sync_playwright()
    playwright = manager.start()
    state = _Playwright(manager, None)
    try:
        state.browser = playwright.chromium.launch(executable_path=path, args=args)
        state.pause()
        yield state
        state.resume()
        state.browser.close()
    finally:
        state.resume()
        manager.__exit__()
        state.pause()


@pytest.fixture
def browser(_playwright: _Playwright) -> Iterator[Any]:
    """The session's Chromium (Debian's, driven by Playwright's sync API), for this test."""
    _playwright.resume()
    try:
        yield _playwright.browser
    finally:
        _playwright.pause()


@pytest.fixture
def page(browser: Any) -> Iterator[Any]:
    """A page in a fresh context: no cookies from other tests."""
    context = browser.new_context()
    context.set_default_timeout(60_000)
    try:
        yield context.new_page()
    finally:
        context.close()
