"""JSON responses serialized by pydantic directly (no second validation pass)."""

from __future__ import annotations

import json
from typing import Any

from pydantic import BaseModel
from starlette.responses import Response


def json_response(
    model: BaseModel,
    *,
    status_code: int = 200,
    headers: dict[str, str] | None = None,
    extra: dict[str, Any] | None = None,
) -> Response:
    """`extra`: top-level fields beside the model's (kvgate's extensions, which the SDKs ignore)."""
    content = model.model_dump_json()
    if extra:
        content = json.dumps({**model.model_dump(mode="json"), **extra}, separators=(",", ":"))
    return Response(content=content, status_code=status_code, media_type="application/json", headers=headers)
