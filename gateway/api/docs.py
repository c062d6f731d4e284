"""/docs (Swagger UI) and /redoc (ReDoc) from assets this server serves itself, not a CDN.

FastAPI's own pages load their JavaScript and CSS from cdn.jsdelivr.net, and its favicon
from fastapi.tiangolo.com: an operator's browser would run third-party code against the
admin API, and the pages break on a network without the internet. The assets here come
from the fastapi-offline package (Swagger UI 5 and ReDoc 2, pinned in pyproject.toml),
served under /docs/assets. Only the pages are used, not its FastAPI factory. Swagger UI's
validator badge (an image from validator.swagger.io) is turned off.

Installed only when KVGATE_EXPOSE_DOCS is set (gateway.settings): off, all of it is a 404.
"""

from __future__ import annotations

from importlib.resources import files
from pathlib import Path

from fastapi import FastAPI, Request
from fastapi.openapi.docs import get_redoc_html, get_swagger_ui_html
from fastapi.staticfiles import StaticFiles
from starlette.responses import HTMLResponse

ASSETS_URL = "/docs/assets"


def assets_dir() -> Path:
    """The directory of Swagger UI's and ReDoc's files (swagger-ui-bundle.js, swagger-ui.css,
    redoc.standalone.js, favicon.png)."""
    return Path(str(files("fastapi_offline") / "static"))


def install_docs(app: FastAPI, *, openapi_url: str = "/openapi.json") -> None:
    """Serve /docs, /redoc and their assets on `app` (whose schema is at `openapi_url`)."""
    app.mount(ASSETS_URL, StaticFiles(directory=assets_dir()), name="docs-assets")

    @app.get("/docs", include_in_schema=False)
    async def swagger_ui(request: Request) -> HTMLResponse:
        root = request.scope.get("root_path", "")
        return get_swagger_ui_html(
            openapi_url=root + openapi_url,
            title=f"{app.title} - API docs",
            swagger_js_url=f"{root}{ASSETS_URL}/swagger-ui-bundle.js",
            swagger_css_url=f"{root}{ASSETS_URL}/swagger-ui.css",
            swagger_favicon_url=f"{root}{ASSETS_URL}/favicon.png",
            swagger_ui_parameters={"validatorUrl": None},
        )

    @app.get("/redoc", include_in_schema=False)
    async def redoc(request: Request) -> HTMLResponse:
        root = request.scope.get("root_path", "")
        return get_redoc_html(
            openapi_url=root + openapi_url,
            title=f"{app.title} - API reference",
            redoc_js_url=f"{root}{ASSETS_URL}/redoc.standalone.js",
            redoc_favicon_url=f"{root}{ASSETS_URL}/favicon.png",
            with_google_fonts=False,
        )
