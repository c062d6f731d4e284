"""The browser fixtures leave the session usable: an async test between two browser tests still runs.

(Playwright's sync API marks its loop as the thread's running loop between calls; the fixtures undo that
after each browser test, or pytest-asyncio could not run any async test after the first browser test.)
"""

from __future__ import annotations

import asyncio
from typing import Any

import pytest


def _render(browser: Any, text: str) -> str:
    context = browser.new_context()
    try:
        page = context.new_page()
        page.set_content(f"<p>{text}</p>")
        return page.inner_text("p")
    finally:
        context.close()


@pytest.mark.browser
def test_a_browser_test(browser: Any) -> None:
    assert _render(browser, "first") == "first"


async def test_an_async_test_after_it() -> None:
    assert await asyncio.sleep(0, result="ran") == "ran"


@pytest.mark.browser
def test_another_browser_test_after_that(browser: Any) -> None:
    assert _render(browser, "second") == "second"
