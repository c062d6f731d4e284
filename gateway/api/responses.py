"""JSON responses serialized by pydantic directly (no second validation pass)."""

from __future__ import annotations

from pydantic import BaseModel
from starlette.responses import Response


def json_response(model: BaseModel, *, status_code: int = 200, headers: dict[str, str] | None = None) -> Response:
    return Response(
        content=model.model_dump_json(), status_code=status_code, media_type="application/json", headers=headers
    )
