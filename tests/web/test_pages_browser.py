"""The Overview, Keys and Admin pages in a real browser, on the real ledger (real billing, tiny model).

Isolation is checked on every page and by id guessing: each refusal is paired with the owner succeeding.
"""

from __future__ import annotations

import re
from decimal import Decimal
from fractions import Fraction

import anthropic
import pytest

from kvgate.tenancy import KEY_SCOPES
from tests.web.conftest import Dashboard, csrf_token
from web.formatting import percent, usd

pytestmark = [pytest.mark.browser, pytest.mark.timeout(600)]


def test_the_overview_shows_the_ledgers_numbers(dashboard: Dashboard, page) -> None:
    member = dashboard.new_member("Numbers Inc")
    key = dashboard.new_key(member.tenant_id, name="production")
    for turn in range(3):  # a cache write, then reads
        dashboard.ask(key, f"Question {turn}?")
    ledger = dashboard.wait_for_ledger(member.tenant_id, 3)
    assert ledger["cache_read_tokens"] > 0 and ledger["cache_write_5m_tokens"] > 0
    dashboard.login(page, member.login_url)
    assert page.inner_text("#requests") == "3"
    assert page.inner_text("#spend") == usd(ledger["cost_pico"])
    prompt = sum(
        ledger[c]
        for c in (
            "input_tokens",
            "cache_write_5m_tokens",
            "cache_write_30m_tokens",
            "cache_write_1h_tokens",
            "cache_write_12h_tokens",
            "cache_write_24h_tokens",
            "cache_read_tokens",
        )
    )
    assert page.inner_text("#hit-rate") == percent(Fraction(ledger["cache_read_tokens"], prompt))
    saved = ledger["uncached_cost_pico"] - ledger["cost_pico"]
    assert saved > 0 and page.inner_text("#saved") == usd(saved)
    assert page.locator("#saved-negative").count() == 0  # the note is for savings below zero only
    assert re.fullmatch(r"\$\d[\d,]*\.\d\d", page.inner_text("#forecast"))  # an estimate, to the cent
    assert page.inner_text("#saved-percent") == percent(Fraction(saved, ledger["uncached_cost_pico"]))
    # The key appears by its name, never its id.
    assert page.locator("#key-budgets .budget[data-label='production']").count() == 1
    assert key.key_id not in page.content()
    assert "no budget set" in page.inner_text("#tenant-budget")


def test_the_budget_bar_after_a_refusal(dashboard: Dashboard, page) -> None:
    member = dashboard.new_member("Tight Budget")
    key = dashboard.new_key(member.tenant_id, name="worker")
    dashboard.ask(key)
    ledger = dashboard.wait_for_ledger(member.tenant_id, 1)
    spent = ledger["cost_pico"]
    assert spent > 10**6
    dashboard.set_budget(member.tenant_id, "0.000001")  # below what was spent already
    with pytest.raises(anthropic.APIStatusError) as refused:
        dashboard.ask(key)
    assert refused.value.status_code == 402 and refused.value.body["error"]["type"] == "billing_error"
    dashboard.login(page, member.login_url)
    bar = page.locator("#tenant-budget .budget")
    assert bar.get_attribute("data-level") == "over"
    shown = bar.get_attribute("data-percent")
    assert shown == percent(Fraction(spent, 10**6)) and float(shown.rstrip("%")) >= 100
    assert page.locator(".fill.w100").count() >= 1
    alert = page.locator("[data-alert=over]")
    assert alert.count() == 1 and "used all of its monthly budget" in alert.inner_text()
    assert "× the monthly budget of $0.00" in page.inner_text("#forecast-warning")
    # One request that wrote the cache and read nothing: caching cost more so far, and the page says why.
    assert ledger["cost_pico"] > ledger["uncached_cost_pico"]
    assert "Below zero" in page.inner_text("#saved-negative")
    # Paired: with room in the budget there is no alert and the bar is below 80%.
    dashboard.set_budget(member.tenant_id, "1000")
    page.reload()
    assert page.locator("[data-alert]").count() == 0 and page.locator("#forecast-warning").count() == 0
    assert page.locator("#tenant-budget .budget").get_attribute("data-level") == "ok"


def test_the_80_percent_alert(dashboard: Dashboard, page) -> None:
    member = dashboard.new_member()
    key = dashboard.new_key(member.tenant_id)
    dashboard.ask(key)
    spent = dashboard.wait_for_ledger(member.tenant_id, 1)["cost_pico"]
    limit_pico = spent * 10 // 9  # spent is 90% of the limit
    dashboard.set_budget(member.tenant_id, str(Decimal(limit_pico).scaleb(-12)))
    dashboard.login(page, member.login_url)
    assert page.locator("#tenant-budget .budget").get_attribute("data-level") == "warning"
    assert "over 80%" in page.locator("[data-alert=warning]").inner_text()


def test_pages_show_only_the_members_tenant(dashboard: Dashboard, page) -> None:
    mine, theirs = dashboard.new_member("Mine Ltd"), dashboard.new_member("Theirs Ltd")
    dashboard.new_key(mine.tenant_id, name="my-key")
    their_key = dashboard.new_key(theirs.tenant_id, name="their-secret-key")
    dashboard.ask(their_key)
    dashboard.wait_for_ledger(theirs.tenant_id, 1)
    dashboard.login(page, mine.login_url)
    for path in ("/", "/keys"):
        page.goto(f"{dashboard.base_url}{path}")
        text = page.content()
        assert "Mine Ltd" in text and "Theirs Ltd" not in text and "their-secret-key" not in text, path
    assert page.locator("tr[data-key-name='my-key']").count() == 1
    # A member cannot view as another tenant by setting the operator's cookie themselves.
    page.context.add_cookies([{"name": "kvgate_view_as", "value": theirs.tenant_id, "url": dashboard.base_url}])
    page.goto(f"{dashboard.base_url}/")
    assert page.locator(".tenant-name").inner_text() == "Mine Ltd"
    assert page.inner_text("#requests") == "0"
    assert page.goto(f"{dashboard.base_url}/admin").status == 403


def test_an_admin_creates_a_key_shown_once_and_revokes_it(dashboard: Dashboard, page) -> None:
    member = dashboard.new_member(role="admin")
    dashboard.login(page, member.login_url)
    page.goto(f"{dashboard.base_url}/keys")
    help_text = page.inner_text("form.create-key fieldset")
    assert all(f"{scope}:" in help_text for scope in KEY_SCOPES)  # invoices:read too
    page.fill("form.create-key input[name=name]", "made-in-browser")
    page.click("form.create-key button")
    plaintext = page.inner_text("#new-key")
    assert plaintext.startswith("kvg-")
    made = dashboard.server.anthropic(plaintext).messages.create(
        model=dashboard.server.model, max_tokens=2, messages=[{"role": "user", "content": "hi"}]
    )
    assert made.usage.output_tokens >= 1
    page.goto(f"{dashboard.base_url}/keys")
    assert page.locator("#new-key").count() == 0 and plaintext not in page.content()
    row = page.locator("tr[data-key-name='made-in-browser']")
    assert row.count() == 1
    # Revoking asks first: the button is behind a disclosure that says what it does.
    assert not row.locator("form.revoke button").is_visible()
    row.locator("details.revoke summary").click()
    assert "cannot be undone" in row.locator("form.revoke").inner_text()
    row.locator("form.revoke button").click()
    page.wait_for_url(f"{dashboard.base_url}/keys")
    assert "revoked" in page.locator("tr[data-key-name='made-in-browser']").inner_text()
    with pytest.raises(anthropic.AuthenticationError):
        dashboard.server.anthropic(plaintext).messages.create(
            model=dashboard.server.model, max_tokens=2, messages=[{"role": "user", "content": "hi"}]
        )


def test_viewers_see_keys_but_cannot_manage_them(dashboard: Dashboard, page) -> None:
    member = dashboard.new_member(role="viewer")
    dashboard.new_key(member.tenant_id, name="seen")
    dashboard.login(page, member.login_url)
    page.goto(f"{dashboard.base_url}/keys")
    assert page.locator("tr[data-key-name='seen']").count() == 1
    assert page.locator("form.create-key").count() == 0 and page.locator("form.revoke").count() == 0
    with dashboard.client_for(dashboard.new_link(member)) as client:
        token = csrf_token(client.get("/").text)
        assert client.post("/keys", data={"csrf_token": token, "name": "nope"}).status_code == 403


def test_the_operator_sees_every_tenant_and_views_as_one(dashboard: Dashboard, page) -> None:
    member = dashboard.new_member("Operated Co")
    key = dashboard.new_key(member.tenant_id, name="op-key")
    dashboard.ask(key)
    ledger = dashboard.wait_for_ledger(member.tenant_id, 1)
    dashboard.operator_login(page)
    row = page.locator(f"tr[data-tenant-id='{member.tenant_id}']")
    assert row.locator(".spend").inner_text() == usd(ledger["cost_pico"])
    assert page.locator("#spool").get_attribute("data-pending") == "0"
    row.locator("button").click()
    page.wait_for_url(f"{dashboard.base_url}/")
    assert page.locator(".tenant-name").inner_text() == "Operated Co"
    assert page.inner_text("#spend") == usd(ledger["cost_pico"])
    page.goto(f"{dashboard.base_url}/keys")
    assert page.locator("tr[data-key-name='op-key']").count() == 1
    page.goto(f"{dashboard.base_url}/admin")
    page.click("text=Stop viewing as")
    page.wait_for_url(f"{dashboard.base_url}/admin")
    assert page.goto(f"{dashboard.base_url}/").status == 403  # no tenant chosen
