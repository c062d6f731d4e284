"""The charts' palette: every series colour contrasts with the white page (WCAG 1.4.11: 3:1 for graphics),
and stacked bars are outlined in white so that neighbours of similar lightness stay apart."""

from __future__ import annotations

import re

from web.rendering import WEB_DIR

CHARTS = (WEB_DIR / "static" / "charts.js").read_text()


def luminance(hex_colour: str) -> float:
    channels = [int(hex_colour[i : i + 2], 16) / 255 for i in (1, 3, 5)]
    linear = [c / 12.92 if c <= 0.03928 else ((c + 0.055) / 1.055) ** 2.4 for c in channels]
    return 0.2126 * linear[0] + 0.7152 * linear[1] + 0.0722 * linear[2]


def contrast(a: str, b: str) -> float:
    high, low = sorted((luminance(a), luminance(b)), reverse=True)
    return (high + 0.05) / (low + 0.05)


def test_every_series_colour_contrasts_with_the_page() -> None:
    found = re.search(r"var COLORS = \[([^\]]+)\]", CHARTS)
    assert found is not None
    colours = re.findall(r'"(#[0-9a-fA-F]{6})"', found.group(1))
    assert len(colours) >= 6
    assert all(contrast(c, "#ffffff") >= 3.0 for c in colours), [(c, round(contrast(c, "#ffffff"), 2)) for c in colours]
    # The check can fail: the old palette's yellow and teal were below it.
    assert contrast("#edc948", "#ffffff") < 3.0 and contrast("#76b7b2", "#ffffff") < 3.0


def test_stacked_bars_are_outlined_in_white() -> None:
    assert 'var SEPARATOR = "#ffffff"' in CHARTS
    assert "stroke: stacked ? SEPARATOR : color" in CHARTS and "width: stacked ? 1 : 2" in CHARTS
