"""The dashboard mounted on the kvgate app: its pages, its static files, and its two redirects."""

from __future__ import annotations

from fastapi import FastAPI, Request
from starlette.responses import RedirectResponse, Response

from gateway.api.deps import AdminDep
from web.admin_api import router as admin_router
from web.deps import LoginRequired, NotAllowed, PageNotFound
from web.pages import router as pages_router
from web.rendering import WEB_DIR, StaticAssets, page
from web.settings import WebSettings


def install(app: FastAPI, settings: WebSettings | None = None) -> None:
    """Serve the dashboard from `app`: / and the pages under it, /static for its assets, and the
    members' admin API under /admin/v1 (behind the admin token)."""
    app.state.web_settings = settings or WebSettings()
    app.include_router(pages_router)
    app.include_router(admin_router, prefix="/admin/v1", dependencies=[AdminDep])
    app.mount("/static", StaticAssets(directory=WEB_DIR / "static"), name="static")
    app.add_exception_handler(LoginRequired, _login_required)
    app.add_exception_handler(NotAllowed, _not_allowed)
    app.add_exception_handler(PageNotFound, _not_found)


async def _login_required(request: Request, exc: Exception) -> Response:
    if request.headers.get("hx-request") or request.url.path.startswith("/dashboard-api/"):
        return Response(status_code=401)
    return RedirectResponse("/login", status_code=303)


async def _not_allowed(request: Request, exc: Exception) -> Response:
    return page(request, "error.html", status_code=403, title="Not allowed", message=str(exc) or "not allowed")


async def _not_found(request: Request, exc: Exception) -> Response:
    return page(request, "error.html", status_code=404, title="Not found", message=str(exc) or "not found")
