"""The Usage, Cache, Requests and Invoices pages in Chromium: charts drawn from their tables (a point per day,
or per hour up to 48 hours), no Content-Security-Policy violation on any page, the CSV download equal to
the table, and a screenshot of each dashboard page.

Screenshots go to a temporary directory, or to docs/images/ when KVGATE_WRITE_SCREENSHOTS=1
(`make screenshots`), so a test run never changes the tree.
"""

from __future__ import annotations

import csv
import os
import time
from datetime import UTC, datetime, timedelta
from pathlib import Path
from typing import Any

import pytest
import sqlalchemy as sa

from kvgate import REPO_ROOT
from tests.web.html_tables import plain
from tests.web.pages_setup import SeededTenant, finalize_month, seed_tenant, seed_this_month

pytestmark = pytest.mark.browser

OCTOBER = "preset=custom&start=2026-10-01&end=2026-10-31"
SCREENSHOT_SIZE = {"width": 1280, "height": 800}


def live_requests(seeded: SeededTenant, count: int = 3) -> None:
    """Some usage today through the real gateway (tiny model), billed by billing's live hooks."""
    server = seeded.server
    key = server.new_key(seeded.tenant_id, name="production")
    client = server.openai(key)
    for i in range(count):
        client.chat.completions.create(
            model=server.model, messages=[{"role": "user", "content": f"hello number {i}"}], max_tokens=4
        )
    deadline = time.monotonic() + 60
    query = sa.text("SELECT count(*) FROM ledger_entries WHERE api_key_id = :k")
    while True:
        with server.db.connect() as conn:
            if conn.execute(query, {"k": key.key_id}).scalar_one() >= count:
                return
        assert time.monotonic() < deadline, "the gateway's requests never reached the ledger"
        time.sleep(0.2)


@pytest.fixture(scope="module")
def acme(dashboard: Any) -> SeededTenant:
    seeded = seed_tenant(dashboard.server)
    live_requests(seeded)
    return seeded


@pytest.fixture
def acme_page(page: Any, acme: SeededTenant) -> Any:
    page.context.add_cookies(acme.browser_cookies())
    page.set_viewport_size(SCREENSHOT_SIZE)
    return page


def chart(page: Any, selector: str) -> dict[str, Any]:
    """What charts.js drew: its data-points, uPlot's x values and series count, and the table's rows."""
    page.wait_for_selector(f"{selector}[data-points]")
    return page.eval_on_selector(
        selector,
        """figure => ({
            points: Number(figure.dataset.points),
            uplotPoints: figure.uplot.data[0].length,
            series: figure.uplot.series.length - 1,
            rows: figure.querySelectorAll("table.chart-data tbody tr").length,
            canvas: figure.querySelectorAll("canvas").length,
        })""",
    )


def test_usage_chart_has_a_point_per_day_or_per_hour(acme_page: Any, acme: SeededTenant) -> None:
    base = acme.server.base_url
    today = datetime.now(UTC).date()
    last_month_end = today.replace(day=1) - timedelta(days=1)
    expected = {
        OCTOBER: 31,
        "preset=7d": 7,
        "preset=mtd": today.day if today.day > 2 else 24 * today.day,
        "preset=last_month": last_month_end.day,
        "preset=today": 24,
        "start=2026-10-05&end=2026-10-05&unit=usd": 24,
        "start=2026-10-05&end=2026-10-06": 48,
        "start=2026-10-05&end=2026-10-07&split=key": 3,
    }
    for query, points in expected.items():
        acme_page.goto(f"{base}/usage?{query}")
        drawn = chart(acme_page, "#usage-chart")
        # One series per billing category: input, the five write classes (5m, 30m, 1h, 12h, 24h), read, output.
        assert drawn == {"points": points, "uplotPoints": points, "series": 8, "rows": points, "canvas": 1}, query
    # The live requests of today are on today's chart.
    acme_page.goto(f"{base}/usage?preset=today")
    today_total = acme_page.inner_text("#total-requests")
    assert int(plain(today_total)) >= 3


def test_toggles_swap_the_view_in_place_and_redraw_the_chart(acme_page: Any, acme: SeededTenant) -> None:
    """The presets, unit and split are htmx-boosted links: the page is swapped without a reload, the URL
    follows (filters live in it), and the new chart is drawn from its new table."""
    base = acme.server.base_url
    acme_page.goto(f"{base}/usage?{OCTOBER}")
    assert chart(acme_page, "#usage-chart")["points"] == 31
    acme_page.evaluate("window.notReloaded = true")
    acme_page.click("nav[aria-label=Unit] >> text=$")
    acme_page.wait_for_url("**unit=usd**")
    acme_page.wait_for_selector("#usage-chart[data-unit=usd][data-points]")
    acme_page.click("text=7 days")
    acme_page.wait_for_url("**preset=7d**")
    drawn = chart(acme_page, "#usage-chart[data-unit=usd]")
    assert drawn["points"] == drawn["rows"] == 7
    assert "unit=usd" in acme_page.url and acme_page.evaluate("window.notReloaded") is True
    acme_page.select_option("select[name=key]", label="beta")
    acme_page.fill("input[name=start]", "2026-10-05")
    acme_page.fill("input[name=end]", "2026-10-05")
    acme_page.click("text=Apply")
    acme_page.wait_for_url(f"**key={acme.key_ids['beta']}**")
    assert chart(acme_page, "#usage-chart")["points"] == 24
    where = "AND api_key_id = :k AND started_at >= :s AND started_at < :e"
    beta = acme.ledger_sums(where, k=acme.key_ids["beta"], s="2026-10-05", e="2026-10-06")
    assert int(acme_page.get_attribute("#total-cost", "data-pico")) == beta["cost_pico"]
    assert acme_page.evaluate("window.notReloaded") is True


def test_cache_charts_have_a_point_per_day(acme_page: Any, acme: SeededTenant) -> None:
    acme_page.goto(f"{acme.server.base_url}/cache?{OCTOBER}")
    for selector, series in (("#hit-rate-chart", 1), ("#savings-chart", 3), ("#ttl-mix-chart", 5)):
        drawn = chart(acme_page, selector)
        assert drawn == {"points": 31, "uplotPoints": 31, "series": series, "rows": 31, "canvas": 1}, selector


def test_csv_download_equals_the_table(acme_page: Any, acme: SeededTenant, tmp_path: Path) -> None:
    acme_page.goto(f"{acme.server.base_url}/usage?{OCTOBER}&split=key&unit=usd")
    with acme_page.expect_download() as download:
        acme_page.click("text=Export CSV")
    path = tmp_path / "usage.csv"
    download.value.save_as(path)
    with path.open(newline="") as f:
        header, *lines = list(csv.reader(f))
    table = acme_page.eval_on_selector_all(
        "#usage-detail tbody tr", "rows => rows.map(r => [...r.cells].map(c => c.innerText.trim()))"
    )
    assert header[:3] == ["bucket", "key", "requests"]
    # The total the browser shows is the ledger's, to the pico-dollar.
    october = acme.ledger_sums("AND started_at >= :s AND started_at < :e", s="2026-10-01", e="2026-11-01")
    assert int(acme_page.get_attribute("#total-cost", "data-pico")) == october["cost_pico"]
    assert lines == [[plain(c) for c in row] for row in table] and len(lines) >= 31


def dashboard_pages(acme: SeededTenant, invoice_id: int) -> dict[str, str]:
    """Every dashboard page a tenant member sees, by screenshot name."""
    return {
        "overview": "/",
        "usage": f"/usage?{OCTOBER}",
        "usage-hourly-usd": "/usage?start=2026-10-05&end=2026-10-05&unit=usd&split=key",
        "cache": f"/cache?{OCTOBER}",
        "requests": "/requests",
        "keys": "/keys",
        "invoices": "/invoices",
        "invoice": f"/invoices/{invoice_id}",
    }


def watch_for_csp_violations(page: Any) -> list[str]:
    """Console errors and securitypolicyviolation events of every page `page` loads from now on."""
    problems: list[str] = []
    page.on("console", lambda message: problems.append(message.text) if message.type == "error" else None)
    page.on("pageerror", lambda error: problems.append(str(error)))
    page.add_init_script(
        """document.addEventListener("securitypolicyviolation", e =>
            console.error("CSP violation: " + e.violatedDirective + " " + e.blockedURI));"""
    )
    return problems


def test_no_csp_violations_and_every_chart_drawn(acme_page: Any, acme: SeededTenant) -> None:
    invoice = finalize_month(acme)
    problems = watch_for_csp_violations(acme_page)
    charts = 0
    for name, path in dashboard_pages(acme, invoice["id"]).items():
        acme_page.goto(f"{acme.server.base_url}{path}")
        acme_page.wait_for_load_state("networkidle")
        for figure in acme_page.query_selector_all("figure[data-chart]"):
            assert figure.get_attribute("data-points"), f"{name}: a chart was not drawn"
            charts += 1
        assert problems == [], f"{name}: {problems}"
    assert charts >= 4
    # The check can fail: an inline script is refused by the policy and reported.
    acme_page.evaluate(
        """() => { const s = document.createElement("script"); s.textContent = "1"; document.body.append(s); }"""
    )
    acme_page.wait_for_timeout(500)
    assert any("CSP violation: script-src" in p for p in problems), problems


def screenshot(page: Any, url: str, file: Path) -> None:
    page.goto(url)
    page.wait_for_load_state("networkidle")
    page.screenshot(path=str(file), full_page=False)
    assert file.read_bytes().startswith(b"\x89PNG"), file.name


def test_screenshot_of_each_page(
    acme_page: Any, acme: SeededTenant, dashboard: Any, browser: Any, tmp_path: Path
) -> None:
    invoice = finalize_month(acme)
    # This month so far too, with budgets, for the Overview (after the tests that count on today's usage).
    seed_this_month(acme, tenant_budget_usd="1.10", key_budget_usd="0.40")
    write = os.environ.get("KVGATE_WRITE_SCREENSHOTS") == "1"
    target = REPO_ROOT / "docs" / "images" if write else tmp_path
    target.mkdir(parents=True, exist_ok=True)
    for name, path in dashboard_pages(acme, invoice["id"]).items():
        screenshot(acme_page, f"{acme.server.base_url}{path}", target / f"dashboard-{name}.png")
    # The operator's Admin page, in a browser of its own.
    context = browser.new_context(viewport=SCREENSHOT_SIZE)
    try:
        operator = context.new_page()
        dashboard.operator_login(operator)
        screenshot(operator, f"{acme.server.base_url}/admin", target / "dashboard-admin.png")
        assert "Acme Robotics" in operator.inner_text("main")
    finally:
        context.close()
    taken = sorted(p.name for p in target.glob("dashboard-*.png"))
    assert len(taken) >= len(dashboard_pages(acme, invoice["id"])) + 1, taken
