"""Logging in to the dashboard in a real browser: a magic link, a spent link, the operator's form."""

from __future__ import annotations

import pytest

from tests.web.conftest import Dashboard

pytestmark = [pytest.mark.browser, pytest.mark.timeout(300)]


def test_a_magic_link_logs_in_and_lands_on_the_overview(dashboard: Dashboard, page) -> None:
    member = dashboard.new_member("Acme Widgets")
    dashboard.login(page, member.login_url)
    assert page.url == f"{dashboard.base_url}/"
    assert page.locator(".tenant-name").inner_text() == "Acme Widgets"
    assert "Acme Widgets" in page.locator("h1").inner_text()
    cookies = {c["name"]: c for c in page.context.cookies()}
    assert cookies["kvgate_session"]["httpOnly"] and cookies["kvgate_session"]["sameSite"] == "Lax"


def test_a_used_link_is_refused_with_a_clear_page(dashboard: Dashboard, browser) -> None:
    member = dashboard.new_member()
    first, second = browser.new_context(), browser.new_context()
    try:
        page = first.new_page()
        dashboard.login(page, member.login_url)  # the link works once...
        other = second.new_page()
        response = other.goto(member.login_url)  # ...and not again, in another browser
        assert response.status == 400
        assert "already been used" in other.inner_text("main")
        other.goto(f"{dashboard.base_url}/")
        assert other.url == f"{dashboard.base_url}/login"
    finally:
        first.close()
        second.close()


def test_the_operator_logs_in_with_the_admin_token_and_views_as_a_tenant(dashboard: Dashboard, page) -> None:
    tenant = dashboard.new_tenant("Viewed Tenant")
    page.goto(f"{dashboard.base_url}/login")
    page.fill("input[name=admin_token]", "not the token")
    page.click("text=Log in as operator")
    assert "not the admin token" in page.inner_text("main")
    dashboard.operator_login(page)
    row = page.locator(f"tr[data-tenant-id='{tenant}']")
    row.locator("button").click()
    page.wait_for_url(f"{dashboard.base_url}/")
    assert page.locator(".tenant-name").inner_text() == "Viewed Tenant"


def test_members_get_403_on_admin(dashboard: Dashboard, page) -> None:
    member = dashboard.new_member(role="admin")
    dashboard.login(page, member.login_url)
    response = page.goto(f"{dashboard.base_url}/admin")
    assert response.status == 403
    assert page.locator("tr[data-tenant-id]").count() == 0
    # Paired: the page itself renders (for the operator, in test_the_operator_logs_in...).
