"""Rendering pages: one Jinja2 environment, and the security headers every dashboard response carries.

The CSP admits only this server's own scripts, styles and images: htmx and uPlot are vendored
under web/static, so there is no CDN and no inline script.
"""

from __future__ import annotations

from pathlib import Path
from typing import Any

from fastapi import Request
from fastapi.templating import Jinja2Templates
from starlette.responses import Response
from starlette.staticfiles import StaticFiles
from starlette.types import Scope

from kvgate.usage import TTL_CLASSES
from web.chart_text import amount_summary, rate_summary
from web.formatting import FILTERS, integer, percent, usd

WEB_DIR = Path(__file__).resolve().parent
TEMPLATES = Jinja2Templates(directory=WEB_DIR / "templates")
TEMPLATES.env.filters.update(FILTERS)
# The write columns of every view, from the one TTL table.
TEMPLATES.env.globals["ttl_classes"] = TTL_CLASSES
# Each chart's one-sentence summary (web/chart_text.py), with the formatters it writes numbers in.
TEMPLATES.env.globals.update(
    amount_summary=amount_summary, rate_summary=rate_summary, as_usd=usd, as_integer=integer, as_percent=percent
)

SECURITY_HEADERS = {
    "content-security-policy": (
        "default-src 'none'; script-src 'self'; style-src 'self'; img-src 'self' data:; "
        "connect-src 'self'; frame-src 'self'; form-action 'self'; frame-ancestors 'none'; "
        "base-uri 'none'"
    ),
    "x-content-type-options": "nosniff",
    "referrer-policy": "same-origin",
    "x-frame-options": "DENY",
    "cache-control": "no-store",
}

# A billing document (invoice, credit note) as HTML: its CSS is inline (the same HTML prints the PDF), it runs
# no script, and only the dashboard's own pages may frame it.
DOCUMENT_HEADERS = {
    **SECURITY_HEADERS,
    "content-security-policy": (
        "default-src 'none'; style-src 'unsafe-inline'; img-src data:; form-action 'none'; "
        "frame-ancestors 'self'; base-uri 'none'"
    ),
    "x-frame-options": "SAMEORIGIN",
}


def page(request: Request, template: str, status_code: int = 200, **context: Any) -> Response:
    """A rendered page with the dashboard's security headers."""
    response = TEMPLATES.TemplateResponse(request, template, context, status_code=status_code)
    response.headers.update(SECURITY_HEADERS)
    return response


class StaticAssets(StaticFiles):
    """web/static, served with the same CSP (and cacheable: the files are versioned in their names)."""

    async def get_response(self, path: str, scope: Scope) -> Response:
        response = await super().get_response(path, scope)
        response.headers.update({**SECURITY_HEADERS, "cache-control": "public, max-age=3600"})
        return response
