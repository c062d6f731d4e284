"""Every dashboard page fits a phone (390 px) and a desktop (1440 px) in Chromium: no horizontal overflow
of the page (wide tables scroll inside their own box), and the header's links stay on its dark background."""

from __future__ import annotations

from typing import Any

import pytest

from tests.web.pages_setup import SeededTenant, finalize_month, seed_tenant

pytestmark = pytest.mark.browser

OCTOBER = "preset=custom&start=2026-10-01&end=2026-10-31"
PAGES = (
    "/",
    f"/usage?{OCTOBER}",
    f"/usage?{OCTOBER}&split=key",
    f"/cache?{OCTOBER}",
    "/requests",
    "/keys",
    "/invoices",
    "/invoices/{invoice}",
    "/billing-profile",
)
WIDTHS = (390, 1440)


@pytest.fixture(scope="module")
def seeded(dashboard: Any) -> tuple[SeededTenant, int]:
    tenant = seed_tenant(dashboard.server, "Layout GmbH", key_names=("production-eu-west", "staging"))
    return tenant, finalize_month(tenant)["id"]


# How far the page scrolls sideways, and each header link's box against the header's.
MEASURE = """() => {
  const header = document.querySelector("header").getBoundingClientRect();
  const links = [...document.querySelectorAll("header a, header button")].map(e => e.getBoundingClientRect());
  return {
    overflow: document.documentElement.scrollWidth - window.innerWidth,
    outside: links.filter(r => r.bottom > header.bottom + 0.5 || r.right > header.right + 0.5).length,
    links: links.length,
  };
}"""


@pytest.mark.parametrize("width", WIDTHS)
def test_no_page_overflows_and_the_header_holds_its_links(
    page: Any, seeded: tuple[SeededTenant, int], width: int
) -> None:
    tenant, invoice = seeded
    page.context.add_cookies(tenant.browser_cookies())
    page.set_viewport_size({"width": width, "height": 900})
    for path in PAGES:
        response = page.goto(tenant.server.base_url + path.format(invoice=invoice))
        assert response is not None and response.status == 200, path
        measured = page.evaluate(MEASURE)
        assert measured["links"] >= 7, path
        assert measured["overflow"] <= 0, (width, path, measured)
        assert measured["outside"] == 0, (width, path, measured)
