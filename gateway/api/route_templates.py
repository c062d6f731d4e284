"""The full template of the route that served a request: the `route` label of the request metrics.

FastAPI keeps an included router's routes as they were declared and matches them under the
router's prefix, so the route left in the request's scope has its own path only: billing's
`/usage` where the client asked for `/admin/v1/usage`. The full templates are read once from the
app's routes (fastapi.routing.iter_route_contexts, as the OpenAPI schema does) and looked up by
the matched route.
"""

from __future__ import annotations

import re
from collections.abc import Sequence

from fastapi.routing import iter_route_contexts
from starlette.routing import BaseRoute, Mount, compile_path

UNMATCHED = "unmatched"


class RouteTemplates:
    """Maps each route of an app to its full template (with every including router's prefix)."""

    def __init__(self, routes: Sequence[BaseRoute]) -> None:
        # By id: starlette's routes define __eq__ (by path and endpoint), so they are not hashable.
        # A router included twice under different prefixes gives its routes several templates.
        self._templates: dict[int, list[tuple[str, re.Pattern[str]]]] = {}
        for context in iter_route_contexts(routes):
            path = context.path
            if path is None:
                continue
            if isinstance(context.original_route, Mount):
                path = path.rstrip("/") + "/{path}"
            self._templates.setdefault(id(context.original_route), []).append((path, compile_path(path)[0]))

    def label(self, route: BaseRoute | None, path: str) -> str:
        """The template of `route`, the route that matched `path`; 'unmatched' when none did."""
        if route is None:
            return UNMATCHED
        candidates = self._templates.get(id(route))
        if not candidates:  # added after start-up: its own path is the best there is
            return getattr(route, "path", None) or UNMATCHED
        if len(candidates) == 1:
            return candidates[0][0]
        return next((template for template, regex in candidates if regex.match(path)), candidates[0][0])
