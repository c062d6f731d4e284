"""Parsing and validating a JSON request body exactly as FastAPI would, for routes that read their own.

The errors are FastAPI's, to the letter (the same JSON decoding, the same pydantic
validation, locations under "body"), so validation_message words them as before.
Lone surrogates, which JSON can spell and UTF-8 cannot, are refused here too.
"""

from __future__ import annotations

import email.message
import json
from typing import Any, TypeVar

from fastapi.exceptions import RequestValidationError
from pydantic import BaseModel, ValidationError

from gateway.unicode_text import lone_surrogate, lone_surrogate_message, may_hold_surrogate
from kvgate.errors import InvalidRequestError

M = TypeVar("M", bound=BaseModel)

# FastAPI's words for a body its JSON reader could not read at all.
UNREADABLE = "There was an error parsing the body"


def decode_body(raw: bytes, *, content_type: str | None, model: type[M]) -> M:
    """The body as `model`; RequestValidationError or InvalidRequestError (400) if it is not one."""
    value: Any = raw
    if not raw:
        raise RequestValidationError([{"type": "missing", "loc": ("body",), "msg": "Field required", "input": None}])
    if is_json(content_type):
        try:
            value = json.loads(raw)
        except json.JSONDecodeError as exc:
            error = {"type": "json_invalid", "loc": ("body", exc.pos), "msg": "JSON decode error", "input": {}}
            raise RequestValidationError([{**error, "ctx": {"error": exc.msg}}]) from exc
        except (ValueError, RecursionError) as exc:  # not UTF-8, or nested too deeply
            raise InvalidRequestError(UNREADABLE) from exc
        if may_hold_surrogate(raw):
            found = lone_surrogate(value)
            if found is not None:
                where, code_point = found
                raise InvalidRequestError(lone_surrogate_message(where, code_point), param=where or None)
    try:
        return model.model_validate(value, from_attributes=True)
    except ValidationError as exc:
        raise RequestValidationError(
            [{**e, "loc": ("body", *e["loc"])} for e in exc.errors(include_url=False)]
        ) from exc


def is_json(content_type: str | None) -> bool:
    """FastAPI's strict content type: application/json or application/*+json; no header is not JSON."""
    if not content_type:
        return False
    message = email.message.Message()
    message["content-type"] = content_type
    subtype = message.get_content_subtype()
    return message.get_content_maintype() == "application" and (subtype == "json" or subtype.endswith("+json"))
