"""The charts in Chromium, on a page of their own (no server): a lone point between empty buckets is drawn,
and without JavaScript a chart takes no blank space while its summary and collapsed table remain."""

from __future__ import annotations

from typing import Any

from web.rendering import WEB_DIR

STATIC = WEB_DIR / "static"
FIGURE = """<link rel="stylesheet" href="dashboard.css">
<figure data-chart="lines" id="rates" data-unit="percent" data-x-label="Day">
  <div class="chart-canvas"></div>
  <p class="chart-summary">summary</p>
  <details class="chart-table"><summary>The numbers</summary>
  <table class="chart-data"><thead><tr><th>Day</th><th data-series>Hit rate (%)</th></tr></thead><tbody>
    {rows}
  </tbody></table></details>
</figure>"""


def lone_point_page(values: list[str]) -> str:
    rows = "".join(f'<tr><th>2026-10-{i + 1:02d}</th><td data-value="{v}">{v}</td></tr>' for i, v in enumerate(values))
    return FIGURE.format(rows=rows)


def ink_at_point(page: Any, index: int, value: float) -> int:
    """How many non-white pixels the canvas has within 3 px of the point (index, value)."""
    return page.evaluate(
        """([index, value]) => {
          const u = document.getElementById("rates").uplot;
          const canvas = u.ctx.canvas, ratio = canvas.width / canvas.clientWidth;
          const x = (u.valToPos(index, "x") + u.bbox.left / ratio) * ratio;
          const y = (u.valToPos(value, "y") + u.bbox.top / ratio) * ratio;
          const d = u.ctx.getImageData(Math.round(x - 3 * ratio), Math.round(y - 3 * ratio),
                                       Math.round(6 * ratio), Math.round(6 * ratio)).data;
          let ink = 0;
          for (let i = 0; i < d.length; i += 4) if (d[i + 3] > 160 && (d[i] < 200 || d[i + 1] < 200)) ink++;
          return ink;
        }""",
        [index, value],
    )


def draw(page: Any, values: list[str]) -> None:
    page.set_content(lone_point_page(values))
    page.add_script_tag(path=str(STATIC / "vendor" / "uPlot-1.6.32.iife.min.js"))
    page.add_style_tag(path=str(STATIC / "vendor" / "uPlot-1.6.32.min.css"))
    page.add_script_tag(path=str(STATIC / "charts.js"))
    page.evaluate("document.dispatchEvent(new Event('DOMContentLoaded'))")
    page.wait_for_function("document.getElementById('rates').uplot !== undefined")


def test_a_lone_point_is_drawn(page: Any) -> None:
    draw(page, ["", "", "42", "", ""])
    assert ink_at_point(page, 2, 42.0) > 0
    # Positive and negative beside it: an empty bucket at the same height has nothing drawn.
    assert ink_at_point(page, 0, 42.0) == 0


def test_without_javascript_a_chart_takes_no_blank_space(browser: Any) -> None:
    context = browser.new_context(java_script_enabled=False)
    try:
        page = context.new_page()
        css = (STATIC / "dashboard.css").read_text()
        page.set_content(
            lone_point_page(["1", "2"]).replace('<link rel="stylesheet" href="dashboard.css">', f"<style>{css}</style>")
        )
        assert page.locator(".chart-canvas").bounding_box()["height"] == 0  # type: ignore[index]
        assert page.locator(".chart-summary").is_visible()
        assert not page.locator("table.chart-data").is_visible()  # collapsed until opened
        page.click("details.chart-table > summary")
        assert page.locator("table.chart-data").is_visible()
    finally:
        context.close()
