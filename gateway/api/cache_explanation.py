"""The `kvgate` field a response carries when its request asked for a cache explanation.

A request asks with the header `kvgate-cache-explain: true` (the SDKs send it with
`extra_headers`); the explanation (gateway/cache_explanation.py) is then a top-level
`kvgate.cache_explanation` object, which both SDKs keep as an extra field and otherwise
ignore. Every request's explanation is in its usage record whether it asked or not.
"""

from __future__ import annotations

from typing import Any

from starlette.requests import Request

from gateway.generation import Finished

EXPLAIN_HEADER = "kvgate-cache-explain"
_YES = frozenset({"1", "true", "yes"})


def wants_explanation(request: Request) -> bool:
    return request.headers.get(EXPLAIN_HEADER, "").strip().lower() in _YES


def explanation_field(request: Request, finished: Finished) -> dict[str, Any] | None:
    """{"kvgate": {"cache_explanation": ...}} when the request asked for it and it was made; else None."""
    if not wants_explanation(request) or finished.cache_explanation is None:
        return None
    return {"kvgate": {"cache_explanation": finished.cache_explanation}}
